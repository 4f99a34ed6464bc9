"""Opening a canonical gpuclust dataset: a folder of per-table Parquet parts plus ``manifest.json``.

Layout (``docs/user/dataset.md`` is the full description)::

    DATASET/
      manifest.json            what is in the dataset; the only source of truth
      instance_usage/part-*.parquet
      instance_events/part-*.parquet
      ...
      _rejects/*.jsonl         rejected raw records: file, line/row, reason, raw text

A bucketed dataset (``gpuclust optimize``, :mod:`gpuclust.layout`) keeps the parts of its
key-partitioned tables in ``<table>/bucket=<k>/part-*.parquet`` and records the layout in the
table's manifest entry; :meth:`Dataset.layout` and :meth:`Dataset.bucket_files` expose it.

Only the part files the manifest lists are data.  A file in a table folder that the manifest does
not list is the leftover of a crashed run and is ignored (and removed by the next ingest or
optimize).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from gpuclust.layout import LayoutError, bucket_of_path, check_layouts
from gpuclust.schema import DATASET_FORMAT_VERSION, SCHEMAS, TABLES

MANIFEST = "manifest.json"
REJECTS_DIR = "_rejects"


class DatasetError(Exception):
    """The dataset folder is missing, incomplete, or from an incompatible format version, or one
    of its part files cannot be read."""


@contextlib.contextmanager
def reading(f: Any) -> Iterator[None]:
    """Report a failure to read the Parquet file ``f`` (damaged, truncated, replaced by something
    else, gone) as a :class:`DatasetError` naming the file and the reason: Arrow's own errors name
    no file.  Memory errors pass through as they are.

    >>> with reading("ds/instance_usage/part-00000.parquet"):  # doctest: +ELLIPSIS
    ...     pq.ParquetFile(__file__)
    Traceback (most recent call last):
    gpuclust.dataset.DatasetError: ds/instance_usage/part-00000.parquet: not a readable Parquet file (...)
    """
    try:
        yield
    except MemoryError:
        raise
    except FileNotFoundError:
        raise DatasetError(f"{f}: part file missing (the manifest lists it; re-run `gpuclust ingest`)") from None
    except (pa.ArrowException, OSError) as e:
        why = " ".join(str(e).split()) or type(e).__name__
        raise DatasetError(f"{f}: not a readable Parquet file ({why})") from None


def open_parquet(f: Any) -> pq.ParquetFile:
    """``pyarrow.parquet.ParquetFile(f)``, with a file that cannot be read reported as
    :func:`reading` does (a :class:`DatasetError` naming it)."""
    with reading(f):
        return pq.ParquetFile(f)


def write_json_atomic(
    path: Path, obj: Any, before_replace: Callable[[], None] | None = None, *, if_changed: bool = False
) -> bool:
    """Write JSON to ``path`` so that readers see either the old or the new file, never half.

    The file gets the mode of any new file under the process umask.  ``before_replace`` runs
    after the new content is written and fsynced and just before the rename that publishes it
    (ingest moves staged parts into place there, so they and the manifest listing them appear
    together).  With ``if_changed`` (and no ``before_replace``) a file that already holds exactly
    this JSON is left alone, its modification time too (``gpuclust report`` reads it to tell
    whether a dataset was written since its results).  Returns whether the file was written.
    """
    path = Path(path)
    text = json.dumps(obj, indent=1, sort_keys=True, default=_json_default) + "\n"
    if if_changed and before_replace is None:
        try:
            if path.read_text() == text:
                return False
        except (OSError, UnicodeDecodeError):
            pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, file_mode())  # mkstemp makes 0600; a dataset file gets the umask's mode
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)
    return True


def file_mode() -> int:
    """The mode ``open()`` would give a new file under the process umask (0o644 for umask 022)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)  # no /proc: read the umask by setting it (and put it back at once)
    os.umask(old)
    return 0o666 & ~old


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def new_manifest(**fields: Any) -> dict[str, Any]:
    """An empty manifest with the current format version; ``fields`` override the defaults."""
    m: dict[str, Any] = {
        "dataset_format_version": DATASET_FORMAT_VERSION,
        "trace_version": None,
        "cell": None,
        "tier_map": None,
        "complete": False,
        "inputs": {},
        "tables": {t: {"rows": 0, "files": []} for t in TABLES},
    }
    m.update(fields)
    return m


class Dataset:
    """A canonical dataset on disk.

    Parameters
    ----------
    path
        The dataset folder.
    allow_incomplete
        Open a dataset whose ingest has not finished (its manifest says ``complete: false``).
        Off by default: nothing half-written is presented as complete.

    Examples
    --------
    >>> ds = Dataset("out/cell")                          # doctest: +SKIP
    >>> ds.read("machine_events", ["machine_id", "cap_cpu"]).num_rows  # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike[str], *, allow_incomplete: bool = False):
        self.path = Path(path)
        mpath = self.path / MANIFEST
        if not self.path.exists():
            raise DatasetError(f"{self.path}: no such folder")
        if not self.path.is_dir():
            raise DatasetError(f"{self.path}: not a folder (a gpuclust dataset is a folder holding {MANIFEST})")
        if not mpath.is_file():
            raise DatasetError(f"{self.path}: not a gpuclust dataset (no {MANIFEST})")
        try:
            self.manifest: dict[str, Any] = json.loads(mpath.read_text())
        except json.JSONDecodeError as e:
            raise DatasetError(f"{mpath}: unreadable manifest: {e}") from None
        ver = self.manifest.get("dataset_format_version")
        if ver != DATASET_FORMAT_VERSION:
            raise DatasetError(f"{mpath}: dataset format version {ver!r}, this gpuclust reads {DATASET_FORMAT_VERSION}")
        if not self.manifest.get("complete") and not allow_incomplete:
            raise DatasetError(
                f"{self.path}: ingest has not completed (manifest says complete: false): re-run the same "
                "`gpuclust ingest` command to finish it (`gpuclust info` lists the failed inputs; an input over "
                "the reject threshold needs a higher --max-reject-rate)"
            )
        try:
            self._layouts = check_layouts(self.manifest.get("tables", {}))
        except LayoutError as e:
            raise DatasetError(f"{mpath}: {e}") from None

    @property
    def trace_version(self) -> str | None:
        return self.manifest.get("trace_version")

    @property
    def tier_map_name(self) -> str | None:
        tm = self.manifest.get("tier_map")
        return tm.get("name") if isinstance(tm, dict) else tm

    def files(self, table: str) -> list[Path]:
        """The Parquet parts of ``table`` listed in the manifest, in a stable order."""
        if table not in SCHEMAS:
            raise KeyError(f"unknown table {table!r}; tables are {list(TABLES)}")
        entry = self.manifest.get("tables", {}).get(table, {})
        return [self.path / f for f in sorted(entry.get("files", []))]

    def layout(self, table: str) -> dict[str, Any] | None:
        """The bucketed layout of ``table`` (``{"key", "buckets", "hash", "order"}``), or ``None``
        when its parts are not laid out by key (docs/user/dataset.md, "Bucketed layout").

        Examples
        --------
        >>> Dataset("cell/opt").layout("instance_usage")  # doctest: +SKIP
        {'buckets': 4, 'hash': 'splitmix64-chain-v1', 'key': ['collection_id', 'instance_index'], 'order': 'start_time'}
        """
        if table not in SCHEMAS:
            raise KeyError(f"unknown table {table!r}; tables are {list(TABLES)}")
        lay = self._layouts.get(table)
        return dict(lay) if lay is not None else None

    def bucket_files(self, table: str) -> list[list[Path]]:
        """The parts of a bucketed ``table`` per bucket: element ``k`` lists bucket ``k``'s parts
        (an empty list for an empty bucket).  Tables with the same key have the same number of
        buckets, and bucket ``k`` of one holds the same keys as bucket ``k`` of the other.

        Raises
        ------
        DatasetError
            ``table`` is not bucketed (:meth:`layout` is ``None``).

        Examples
        --------
        >>> ds = Dataset("cell/opt")                               # doctest: +SKIP
        >>> usage, events = ds.bucket_files("instance_usage"), ds.bucket_files("instance_events")  # doctest: +SKIP
        >>> len(usage) == len(events)                             # doctest: +SKIP
        True
        """
        lay = self.layout(table)
        if lay is None:
            raise DatasetError(f"{self.path}: table {table} is not bucketed (run `gpuclust optimize`)")
        out: list[list[Path]] = [[] for _ in range(int(lay["buckets"]))]
        entry = self.manifest.get("tables", {}).get(table, {})
        for rel in sorted(entry.get("files", [])):
            k = bucket_of_path(rel)
            assert k is not None  # checked when the dataset was opened
            out[k].append(self.path / rel)
        return out

    def num_rows(self, table: str) -> int:
        return int(self.manifest.get("tables", {}).get(table, {}).get("rows", 0))

    def read(self, table: str, columns: Sequence[str] | None = None) -> pa.Table:
        """Read ``columns`` of ``table`` (all parts) into one Arrow table with the canonical schema."""
        schema = SCHEMAS[table]
        cols = list(columns) if columns is not None else schema.names
        unknown = [c for c in cols if c not in schema.names]
        if unknown:
            raise KeyError(f"{table} has no columns {unknown}")
        files = self.files(table)
        sub = pa.schema([schema.field(c) for c in cols])
        if not files:
            return sub.empty_table()
        t = pa.concat_tables([_read_file(f, cols, schema, sub) for f in files])
        return t if t.schema.equals(sub) else t.cast(sub)  # (Table.cast imports pyarrow.compute: ~0.06 s)

    def __repr__(self) -> str:
        rows = {t: self.num_rows(t) for t in TABLES if self.num_rows(t)}
        return f"Dataset({str(self.path)!r}, trace={self.trace_version}, rows={rows})"


def _read_file(f: Any, cols: list[str], schema: pa.Schema, sub: pa.Schema) -> pa.Table:
    """``cols`` of one Parquet file as ``sub``: by the file reader when the file has them all (no
    dataset machinery to import and set up: a few ms per call, at the start of every run), else
    by ``pq.read_table`` with the canonical ``schema`` (which fills absent columns with NULLs)."""
    with reading(f):
        pf = pq.ParquetFile(f)
        if all(c in pf.schema_arrow.names for c in cols):
            t = pf.read(columns=cols)
            return t if t.schema.equals(sub) else t.cast(sub)
        return pq.read_table(f, columns=cols, schema=schema).cast(sub)
