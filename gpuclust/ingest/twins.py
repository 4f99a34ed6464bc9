"""Twin exports: the JSON and the Parquet export of the same v3 shard, found by name stem.

Google publishes each 2019 shard as JSON *and* as Parquet (``machine_events-000000000000.json.gz``
and ``machine_events-000000000000.parquet.gz`` hold the same rows).  Ingesting both doubles every
row, so twins are refused unless ``prefer`` (``--prefer parquet|json``) picks one; the other is
skipped with a note.  A twin already in the dataset counts too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpuclust.ingest.base import SourceFile
from gpuclust.ingest.sniff import shard_stem

#: ``--prefer`` choices and the format each keeps.
PREFER = {"parquet": "v3-parquet", "json": "v3-json"}


class TwinError(ValueError):
    """Twin exports of one shard without a ``prefer`` choice (or against the dataset's)."""


def _key(path: str, source_table: str) -> tuple[str, str]:
    return source_table, shard_stem(path.rsplit("/", 1)[-1])


def resolve_twins(
    srcs: list[SourceFile], dataset_inputs: Iterable[dict[str, Any]], prefer: str | None
) -> tuple[list[SourceFile], list[str]]:
    """Keep one export of each shard: ``(sources to read, notes on the twins skipped)``.

    Raises
    ------
    TwinError
        Twins and no ``prefer``; or the dataset already holds the twin that ``prefer`` drops.
    """
    if prefer is not None and prefer not in PREFER:
        raise TwinError(f"--prefer must be one of {sorted(PREFER)}, not {prefer!r}")
    groups: dict[tuple[str, str], list[SourceFile]] = {}
    for s in srcs:
        if s.format in ("v3-json", "v3-parquet"):
            groups.setdefault(_key(str(s.path), s.source_table), []).append(s)
    held: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for inp in dataset_inputs:
        if inp.get("format") in ("v3-json", "v3-parquet") and inp.get("path"):
            held.setdefault(_key(str(inp["path"]), str(inp.get("source_table"))), []).append(inp)
    drop: dict[str, str] = {}
    for key, members in groups.items():
        olds = [i for i in held.get(key, []) if not any(str(m.path) == i["path"] for m in members)]
        fmts = {m.format for m in members} | {i["format"] for i in olds}
        if len(fmts) < 2:
            continue
        named = [str(m.path) for m in members] + [f"{i['path']} (already in the dataset)" for i in olds]
        if prefer is None:
            raise TwinError(
                f"twin exports of one shard: {' and '.join(named)} hold the same table in two formats; "
                "ingesting both would double its rows. Pass --prefer parquet or --prefer json"
            )
        keep = PREFER[prefer]
        bad_old = [i for i in olds if i["format"] != keep]
        if bad_old:
            raise TwinError(
                f"{bad_old[0]['path']} (already in the dataset) is the {bad_old[0]['format']} twin of "
                f"{members[0].path}; --prefer {prefer} would double its rows. Ingest into a new dataset"
            )
        kept: list[SourceFile | dict[str, Any]] = [m for m in members if m.format == keep] or [i for i in olds]
        kept_name = str(kept[0].path) if isinstance(kept[0], SourceFile) else kept[0]["path"]
        for m in members:
            if m.format != keep:
                drop[str(m.path)] = f"{m.path}: skipped, twin of {kept_name} (--prefer {prefer})"
    return [s for s in srcs if str(s.path) not in drop], list(drop.values())
