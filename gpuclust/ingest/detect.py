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

GZIP_MAGIC = b"\x1f\x8b"
PARQUET_MAGIC = b"PAR1"

#: Source tables of the v3 (2019) BigQuery exports.  v3 has no separate constraints table: the
#: constraints are a repeated field of InstanceEvents.
V3_TABLES = ("instance_usage", "instance_events", "collection_events", "machine_events", "machine_attributes")
#: Source tables of the v2 (2011) trace.
V2_TABLES = ("task_usage", "task_events", "job_events", "machine_events", "machine_attributes", "task_constraints")
#: The one "table" of the Kaggle layout.
KAGGLE_TABLE = "borg_traces_data"
#: The first columns of a Kaggle ``borg_traces_data.csv`` header (after an optional index column).
KAGGLE_HEADER = ("time", "instance_events_type", "collection_id")

FORMAT_TABLES: dict[str, tuple[str, ...]] = {
    "v3-json": V3_TABLES,
    "v3-parquet": V3_TABLES,
    "v2-csv": V2_TABLES,
    "kaggle-csv": (KAGGLE_TABLE,),
}
FORMAT_TRACE_VERSION = {"v3-json": "v3", "v3-parquet": "v3", "v2-csv": "v2", "kaggle-csv": "v3"}

#: Files a folder expansion skips silently: documentation, checksums, the v2 ``schema.csv``, a
#: gpuclust manifest, hidden files.
_SKIP_NAMES = {"schema.csv", "manifest.json", "sha256sums", "md5sums", "readme", "license"}
_SKIP_SUFFIXES = (".md", ".txt", ".sha256", ".md5", ".html", ".pdf", ".py", ".ipynb", ".rst")

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


def detect(path: str | os.PathLike[str], *, format: str | None = None, table: str | None = None) -> SourceFile:
    """Detect the format, source table and compression of one input file.

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
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file")
    if not p.is_file():
        raise DetectError(f"{p}: not a regular file")
    if format is not None and format not in FORMATS:
        raise DetectError(f"{p}: unknown format {format!r}; formats are {list(FORMATS)}")
    with open(p, "rb") as f:
        magic = f.read(4)
    compression = "gzip" if magic[:2] == GZIP_MAGIC else None
    head = read_head(p, compression) if magic[:4] != PARQUET_MAGIC else b""
    if compression == "gzip" and head[:4] == PARQUET_MAGIC:
        content = "parquet"
    elif magic[:4] == PARQUET_MAGIC:
        content = "parquet"
    else:
        content = "text"

    first_line = head.split(b"\n", 1)[0].decode("utf-8", "replace").lstrip("\ufeff")
    name = p.name
    parent = p.parent.name.lower()

    fmt = format
    if fmt is None:
        if content == "parquet":
            fmt = "v3-parquet"
        elif head.lstrip()[:1] == b"{" or re.search(r"\.(nd)?jsonl?(\.gz)?$", name.lower()):
            # A JSON-named file whose first line is damaged (or that is empty) is still a JSON
            # shard: its bad lines become rejects.
            fmt = "v3-json"
        elif name.lower().startswith(KAGGLE_TABLE) or _is_kaggle_header(first_line):
            fmt = "kaggle-csv"
        elif parent in V2_TABLES or _table_from_name(name, V2_TABLES):
            fmt = "v2-csv"
        else:
            what = (
                "empty file"
                if not head and content == "text"
                else "content is neither v3 JSON, Parquet, v2 CSV nor the Kaggle CSV layout"
            )
            raise DetectError(f"{p}: cannot detect the format ({what}); pass --format and --table")

    tables = FORMAT_TABLES[fmt]
    tbl = table
    if tbl is None:
        if fmt == "kaggle-csv":
            tbl = KAGGLE_TABLE
        else:
            tbl = _table_from_name(name, tables) or (parent if parent in tables else None)
        if tbl is None:
            raise DetectError(
                f"{p}: cannot tell which {fmt} table this is from its name or folder; "
                f"pass --table (one of {list(tables)})"
            )
    elif tbl not in tables:
        raise DetectError(f"{p}: table {tbl!r} is not a {fmt} table; choose one of {list(tables)}")
    return SourceFile(
        path=p, format=fmt, source_table=tbl, compression=compression, trace_version=FORMAT_TRACE_VERSION[fmt]
    )


def _skipped_in_folder(p: Path) -> bool:
    n = p.name.lower()
    return n.startswith(".") or n in _SKIP_NAMES or n.startswith("sha256sums") or n.endswith(_SKIP_SUFFIXES)


def expand_sources(sources: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Files named by ``sources``: files as given, folders expanded recursively (sorted).

    Inside folders, documentation, checksum lists, the v2 ``schema.csv``, manifests and hidden
    files are skipped.  A source that does not exist raises :class:`FileNotFoundError`.
    """
    out: list[Path] = []
    for s in sources:
        p = Path(s)
        if p.is_dir():
            found = sorted(
                f
                for f in p.rglob("*")
                if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts)
            )
            out.extend(f for f in found if not _skipped_in_folder(f))
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    return out
