"""Working out what an input file is: its format, source table, compression and trace version.

Content decides, names only hint: gzip and Parquet are recognised by their magic bytes (the real
2019 ``*.parquet.gz`` export shards are plain Parquet files), JSON by its first character, the
Kaggle layout by its header line.  The source table comes from the file name or, failing that,
from the name of the folder holding the file.  ``format=`` and ``table=`` override detection.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Iterable
from pathlib import Path

from gpuclust.ingest.base import FORMATS, SourceFile
from gpuclust.ingest.sniff import (
    FORMAT_KIND,
    KAGGLE_HEADER,
    content_kind,
    describe,
    kind_from_name,
    mismatch,
    non_table_reason,
)

GZIP_MAGIC = b"\x1f\x8b"
PARQUET_MAGIC = b"PAR1"

#: Source tables of the v3 (2019) BigQuery exports.  v3 has no separate constraints table: the
#: constraints are a repeated field of InstanceEvents.
V3_TABLES = ("instance_usage", "instance_events", "collection_events", "machine_events", "machine_attributes")
#: Source tables of the v2 (2011) trace.
V2_TABLES = ("task_usage", "task_events", "job_events", "machine_events", "machine_attributes", "task_constraints")
#: The one "table" of the Kaggle layout.
KAGGLE_TABLE = "borg_traces_data"

FORMAT_TABLES: dict[str, tuple[str, ...]] = {
    "v3-json": V3_TABLES,
    "v3-parquet": V3_TABLES,
    "v2-csv": V2_TABLES,
    "kaggle-csv": (KAGGLE_TABLE,),
}
FORMAT_TRACE_VERSION = {"v3-json": "v3", "v3-parquet": "v3", "v2-csv": "v2", "kaggle-csv": "v3"}

_HEAD_BYTES = 64 << 10


class DetectError(ValueError):
    """An input file's format or table could not be determined (or contradicts the flags)."""


def _table_from_name(name: str, tables: Iterable[str]) -> str | None:
    """The table whose name the file name starts with (``instance_usage-000000000000.json.gz``)."""
    low = name.lower()
    for t in sorted(tables, key=len, reverse=True):
        if low == t or re.match(rf"^{re.escape(t)}(?:[-_.].*)?$", low):
            return t
    return None


def read_head(path: Path, compression: str | None, n: int = _HEAD_BYTES) -> bytes:
    """Up to ``n`` bytes of the (decompressed) content of ``path``; a damaged stream gives what it can."""
    with open(path, "rb") as f:
        if compression != "gzip":
            return f.read(n)
        d = zlib.decompressobj(wbits=31)
        out = bytearray()
        while len(out) < n:
            block = f.read(1 << 16)
            if not block:
                break
            try:
                out += d.decompress(block, n - len(out))
            except zlib.error:
                break
            if d.eof:
                break
        return bytes(out)


def _is_kaggle_header(first_line: str) -> bool:
    cells = [c.strip().strip('"') for c in first_line.split(",")]
    if cells and cells[0] in ("", "Unnamed: 0", "index"):
        cells = cells[1:]
    return tuple(cells[: len(KAGGLE_HEADER)]) == KAGGLE_HEADER


def _check_path(p: Path, format: str | None) -> None:
    """Raise if ``p`` is missing or not a regular file, or ``format`` is not a known format."""
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file")
    if not p.is_file():
        raise DetectError(f"{p}: not a regular file")
    if format is not None and format not in FORMATS:
        raise DetectError(f"{p}: unknown format {format!r}; formats are {list(FORMATS)}")


def _read_start(p: Path) -> tuple[int, str | None, bytes, str | None]:
    """Size, compression and (decompressed) head of ``p``, and why it cannot be read (None when it can)."""
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            magic = f.read(4)
        compression = "gzip" if magic[:2] == GZIP_MAGIC else None
        head = read_head(p, compression) if magic[:4] != PARQUET_MAGIC else PARQUET_MAGIC
    except OSError as e:
        return -1, None, b"", f"cannot read: {e.strerror or e}"
    return size, compression, head, None


def _format_of(p: Path, head: bytes, kind: str, named: str | None, size: int, unreadable: str | None) -> str:
    """The format the content (then the name, the Kaggle header, a v2 table name) says ``p`` is in."""
    name = p.name
    parent = p.parent.name.lower()
    first_line = head.split(b"\n", 1)[0].decode("utf-8", "replace").lstrip("\ufeff")
    if kind == "parquet":
        return "v3-parquet"
    if head.lstrip()[:1] == b"{" or (kind == "json" and named != "csv"):
        return "v3-json"
    if named == "json":
        return "v3-json"  # damaged or empty: the problem is named below
    if named == "parquet":
        return "v3-parquet"
    if name.lower().startswith(KAGGLE_TABLE) or _is_kaggle_header(first_line):
        return "kaggle-csv"
    if parent in V2_TABLES or _table_from_name(name, V2_TABLES):
        return "v2-csv"
    what = unreadable or (
        "empty file"
        if size == 0
        else f"it holds {describe(kind, head)}, which is neither a v3 JSON or Parquet export, v2 CSV nor the Kaggle CSV layout"
    )
    raise DetectError(f"{p}: cannot detect the format ({what}); pass --format and --table")


def _table_of(p: Path, fmt: str, table: str | None, problem: str | None) -> str:
    """The source table: ``table`` checked against the format's tables, else from the file or folder name."""
    tables = FORMAT_TABLES[fmt]
    if table is not None:
        if table not in tables:
            raise DetectError(f"{p}: table {table!r} is not a {fmt} table; choose one of {list(tables)}")
        return table
    if fmt == "kaggle-csv":
        return KAGGLE_TABLE
    parent = p.parent.name.lower()
    tbl = _table_from_name(p.name, tables) or (parent if parent in tables else None)
    if tbl is None and problem is not None:
        raise DetectError(f"{p}: {problem}; pass --format and --table if it is a trace table")
    if tbl is None:
        raise DetectError(
            f"{p}: cannot tell which {fmt} table this is from its name or folder; pass --table (one of {list(tables)})"
        )
    return tbl


def detect(path: str | os.PathLike[str], *, format: str | None = None, table: str | None = None) -> SourceFile:
    """Detect the format, source table and compression of one input file.

    A file whose name (or folder) says what it is but whose content cannot be that -- empty
    (0 bytes), unreadable, CSV in a ``.json.gz``, no Parquet magic in a ``.parquet`` -- is
    returned with :attr:`SourceFile.problem` set: ingest records it as a failed input without
    reading it.  Content that decides against the name (a ``.parquet`` file holding JSON lines)
    is read as what it is, with :attr:`SourceFile.note` saying so.

    Parameters
    ----------
    path
        An input file.
    format
        Override the detected format (one of ``gpuclust.ingest.base.FORMATS``).
    table
        Override the detected source table.

    Returns
    -------
    SourceFile

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    DetectError
        The format or table cannot be determined, or the override is invalid.

    Examples
    --------
    >>> detect("cell-a/machine_events-000000000000.parquet.gz").format  # doctest: +SKIP
    'v3-parquet'
    """
    p = Path(path)
    _check_path(p, format)
    size, compression, head, unreadable = _read_start(p)
    kind = content_kind(head)
    named = kind_from_name(p.name)
    fmt = format if format is not None else _format_of(p, head, kind, named, size, unreadable)
    problem = unreadable
    if problem is None and size == 0:
        problem = "empty file (0 bytes: an interrupted download?)"
    if problem is None:
        problem = mismatch(fmt, kind, head)
    tbl = _table_of(p, fmt, table, problem)
    note = None
    if problem is None and named is not None and named != FORMAT_KIND[fmt] and kind != "nothing":
        note = f"{p}: named like {named} but holds {describe(kind, head)}; read as {fmt}"
    return SourceFile(
        path=p,
        format=fmt,
        source_table=tbl,
        compression=compression,
        trace_version=FORMAT_TRACE_VERSION[fmt],
        problem=None if problem is None else f"{p}: {problem}",
        note=note,
    )


def expand_sources(sources: Iterable[str | os.PathLike[str]], notes: list[str] | None = None) -> list[Path]:
    """Files named by ``sources``: files as given, folders expanded recursively (sorted).

    Files that are not trace tables (documentation, checksum lists, ``_SUCCESS`` and other job
    markers, ``synth_truth.json``, manifests, dotfiles; :func:`~gpuclust.ingest.sniff.non_table_reason`)
    are skipped, named or found in a folder, with a one-line note appended to ``notes``; hidden
    folders are not entered.  A source that does not exist raises :class:`FileNotFoundError`.
    """
    out: list[Path] = []

    def note(msg: str) -> None:
        if notes is not None:
            notes.append(msg)

    def take(f: Path) -> None:
        why = non_table_reason(f)
        if why is None:
            out.append(f)
        else:
            note(f"{f}: skipped, not a trace table ({why})")

    for s in sources:
        p = Path(s)
        if p.is_dir():
            found: list[Path] = []
            for root, dirs, files in os.walk(p):
                for d in sorted(dirs):
                    if d.startswith("."):
                        note(f"{Path(root) / d}: hidden folder skipped")
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                found.extend(Path(root) / f for f in files)
            for f in sorted(found):
                if f.is_file():
                    take(f)
        elif p.exists():
            take(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    return out
