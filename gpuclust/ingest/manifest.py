"""The ingest's ``manifest.json``: loading it, rewriting it atomically together with the files
it lists (:class:`_ManifestWriter`), its ``tables`` from its inputs, and removing the files a
crash left that it does not list.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpuclust.dataset import MANIFEST, REJECTS_DIR, fsync_dir, write_json_atomic
from gpuclust.ingest.outcome import IngestUsageError
from gpuclust.ingest.writer import STAGING_DIR
from gpuclust.schema import DATASET_FORMAT_VERSION, TABLES

#: Test hook: SIGKILL the ingest right after its N-th manifest update.
KILL_AFTER_MANIFESTS_ENV = "GPUCLUST_TEST_KILL_AFTER_MANIFESTS"
#: Test hook: SIGKILL the ingest in the middle of its N-th publish (half its parts renamed into
#: the table folders, the manifest listing them not yet in place).
KILL_MID_PUBLISH_ENV = "GPUCLUST_TEST_KILL_MID_PUBLISH"


def _listed(manifest: dict[str, Any]) -> set[str]:
    keep: set[str] = set()
    for inp in manifest.get("inputs", {}).values():
        keep.update(inp.get("outputs") or [])
        if inp.get("rejects_file"):
            keep.add(inp["rejects_file"])
    return keep


def _remove_unlisted(out: Path, manifest: dict[str, Any]) -> list[str]:
    """Delete part/reject/temp files in the dataset folders that the manifest does not list."""
    keep = _listed(manifest)
    removed: list[str] = []
    if (out / STAGING_DIR).exists():
        shutil.rmtree(out / STAGING_DIR)
        removed.append(STAGING_DIR)
    for d in (*TABLES, REJECTS_DIR):
        folder = out / d
        if not folder.is_dir():
            continue
        for f in folder.iterdir():
            rel = f"{d}/{f.name}"
            if f.is_file() and (f.name.startswith("part-") or f.name.startswith(".")) and rel not in keep:
                f.unlink()
                removed.append(rel)
    return removed


def _recompute_tables(manifest: dict[str, Any]) -> None:
    """The manifest's ``tables`` from its inputs: each input's own parts and rows, and the parts a
    layout step (``gpuclust optimize``) wrote for the inputs it took in (``laid_out``: those
    tables' parts, rows and layout; such an input lists the tables in its own ``laid_out``).  A
    table with parts of both kinds is flat until the next layout step lays it out again."""
    tables: dict[str, dict[str, Any]] = {t: {"rows": 0, "files": []} for t in TABLES}
    for t, e in (manifest.get("laid_out") or {}).items():
        tables[t] = {"rows": int(e["rows"]), "files": list(e["files"]), "layout": e["layout"]}
    for inp in manifest["inputs"].values():
        done = set(inp.get("laid_out") or [])
        for t, n in (inp.get("rows_written") or {}).items():
            if t not in done:
                tables[t]["rows"] += int(n)
        for rel in inp.get("outputs") or []:
            t = rel.split("/", 1)[0]
            if t not in done:
                tables[t]["files"].append(rel)
                tables[t].pop("layout", None)
    for t in tables.values():
        t["files"].sort()
    manifest["tables"] = tables


class _ManifestWriter:
    def __init__(self, path: Path, manifest: dict[str, Any]):
        self.path = path
        self.m = manifest
        self.writes = 0

    def write(self, publish: Iterable[tuple[Path, Path]] = (), remove: Iterable[Path] = ()) -> None:
        """Rewrite the manifest.  ``remove`` (files it no longer lists) are deleted and ``publish``
        (staged path, final path) pairs renamed into place right before the new manifest
        replaces the old one, so table folders and manifest change together."""
        _recompute_tables(self.m)
        moves, gone = list(publish), list(remove)
        for _, dst in moves:
            dst.parent.mkdir(parents=True, exist_ok=True)

        def switch() -> None:
            for f in gone:
                try:
                    f.unlink()
                except FileNotFoundError:
                    pass
            mid = os.environ.get(KILL_MID_PUBLISH_ENV)
            for i, (src, dst) in enumerate(moves):
                if mid and self.writes + 1 >= int(mid) and i == max(1, len(moves) // 2):
                    os.kill(os.getpid(), signal.SIGKILL)
                os.replace(src, dst)

        # unchanged content (a re-ingest with nothing new) leaves the file and its mtime alone
        write_json_atomic(self.path, self.m, before_replace=switch if (moves or gone) else None, if_changed=True)
        for d in sorted({dst.parent for _, dst in moves} | {f.parent for f in gone}):
            fsync_dir(d)
        self.writes += 1
        limit = os.environ.get(KILL_AFTER_MANIFESTS_ENV)
        if limit and self.writes >= int(limit):
            os.kill(os.getpid(), signal.SIGKILL)


def _load_manifest(out: Path) -> dict[str, Any] | None:
    mp_ = out / MANIFEST
    if not mp_.is_file():
        return None
    try:
        m: dict[str, Any] = json.loads(mp_.read_text())
    except json.JSONDecodeError as e:
        raise IngestUsageError(f"{mp_}: unreadable manifest ({e}); move the folder away or repair it") from None
    if m.get("dataset_format_version") != DATASET_FORMAT_VERSION:
        raise IngestUsageError(
            f"{mp_}: dataset format version {m.get('dataset_format_version')!r}, this gpuclust writes {DATASET_FORMAT_VERSION}"
        )
    return m
