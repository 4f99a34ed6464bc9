"""The files and the two passes of ``gpuclust optimize`` (:mod:`gpuclust.optimize`): leftovers of
an interrupted run removed (:func:`remove_unlisted`), *spill* (each input part's rows appended to
per-bucket Arrow IPC files, :class:`Spill`, :func:`spill_table`) and *sort and write* (per
bucket, its spill sorted by time and written as one Parquet part, :func:`write_buckets`), and
the test hook that kills the process at a chosen point (:data:`KILL_ENV`).
"""

from __future__ import annotations

import os
import shutil
import signal
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gpuclust.arrow_numpy import array as arrow_array
from gpuclust.arrow_numpy import to_numpy
from gpuclust.dataset import Dataset, open_parquet, reading
from gpuclust.layout import BUCKET_COLUMN, KEYS, ORDER, bucket_ids
from gpuclust.schema import SCHEMAS, TABLES

if TYPE_CHECKING:
    from gpuclust.optimize import Progress

#: Rows per batch streamed from an input part in the spill pass.
SPILL_BATCH_ROWS = 1 << 16
#: Parquet compression of the parts (as ingest writes them).
PART_COMPRESSION = "zstd"
#: Where staged files live until the manifest lists them (the ingest convention).
STAGING_DIR = "_staging"
#: Test hook: ``<stage>:<n>`` SIGKILLs the process at the n-th event of ``stage``: ``spill``
#: (a batch spilled), ``part`` (a bucket part staged), ``move`` (a part renamed into place,
#: before the manifest swap), ``swap`` (right after the new manifest is in place, before the old
#: parts are deleted).
KILL_ENV = "GPUCLUST_TEST_KILL_OPTIMIZE"


# --------------------------------------------------------------------------------------------
# Test hook
# --------------------------------------------------------------------------------------------
_kill_counts: dict[str, int] = {}


def kill_point(stage: str) -> None:
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    want, _, n = spec.partition(":")
    if want != stage:
        return
    _kill_counts[stage] = _kill_counts.get(stage, 0) + 1
    if _kill_counts[stage] >= int(n or 1):
        os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------
def listed(manifest: dict[str, Any]) -> set[str]:
    keep: set[str] = set()
    for entry in manifest.get("tables", {}).values():
        keep.update(entry.get("files", []))
    for inp in manifest.get("inputs", {}).values():
        if inp.get("rejects_file"):
            keep.add(inp["rejects_file"])
    return keep


def _leftover(name: str) -> bool:
    return name.startswith("part-") or name.startswith(".")


def remove_unlisted(root: Path, manifest: dict[str, Any] | None) -> list[str]:
    """Delete the staging folder and every part / temp file of a table folder (and its
    ``bucket=<k>`` folders) that ``manifest`` does not list; empty bucket folders go too."""
    keep = listed(manifest or {})
    removed: list[str] = []
    if (root / STAGING_DIR).exists():
        shutil.rmtree(root / STAGING_DIR)
        removed.append(STAGING_DIR)
    for t in TABLES:
        folder = root / t
        if not folder.is_dir():
            continue
        for f in sorted(folder.iterdir()):
            if f.is_dir() and f.name.startswith(f"{BUCKET_COLUMN}="):
                for g in sorted(f.iterdir()):
                    rel = f"{t}/{f.name}/{g.name}"
                    if g.is_file() and _leftover(g.name) and rel not in keep:
                        g.unlink()
                        removed.append(rel)
                if not any(f.iterdir()):
                    f.rmdir()
            elif f.is_file() and _leftover(f.name) and f"{t}/{f.name}" not in keep:
                f.unlink()
                removed.append(f"{t}/{f.name}")
    return removed


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    """All but the floating-point columns (as ingest: float dictionaries only cost time)."""
    return [f.name for f in schema if not pa.types.is_floating(f.type)]


def fsync_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        shutil.copyfileobj(fi, fo, 4 << 20)
        fo.flush()
        os.fsync(fo.fileno())


# --------------------------------------------------------------------------------------------
# Pass 1: spill rows to per-bucket files
# --------------------------------------------------------------------------------------------
class Spill:
    """Per-bucket Arrow IPC spill files of one table, at most ``max_open`` open at once (a bucket
    whose writer was closed continues in a new file)."""

    def __init__(self, folder: Path, schema: pa.Schema, n: int, max_open: int):
        self.folder = folder
        self.schema = schema
        self.files: list[list[Path]] = [[] for _ in range(n)]
        self.rows = np.zeros(n, np.int64)
        self.max_open = max(1, max_open)
        self.open: OrderedDict[int, tuple[Any, Any]] = OrderedDict()
        self.options = pa.ipc.IpcWriteOptions(compression="lz4")
        folder.mkdir(parents=True, exist_ok=True)

    def write(self, k: int, batch: pa.RecordBatch) -> None:
        w = self.open.get(k)
        if w is None:
            while len(self.open) >= self.max_open:
                self._close(next(iter(self.open)))
            path = self.folder / f"{k}-{len(self.files[k])}.arrow"
            sink = pa.OSFile(str(path), "wb")
            w = (sink, pa.ipc.new_stream(sink, self.schema, options=self.options))
            self.files[k].append(path)
            self.open[k] = w
        else:
            self.open.move_to_end(k)
        w[1].write_batch(batch)
        self.rows[k] += batch.num_rows

    def _close(self, k: int) -> None:
        sink, writer = self.open.pop(k)
        writer.close()
        sink.close()

    def close(self) -> None:
        for k in list(self.open):
            self._close(k)

    def read(self, k: int) -> pa.Table:
        parts = []
        for p in self.files[k]:
            with pa.OSFile(str(p), "rb") as f:
                parts.append(pa.ipc.open_stream(f).read_all())
        return pa.concat_tables(parts) if parts else self.schema.empty_table()

    def drop(self, k: int) -> None:
        for p in self.files[k]:
            p.unlink()
        self.files[k] = []


def _key_arrays(batch: pa.RecordBatch, key: tuple[str, ...]) -> list[np.ndarray]:
    # NULL keys hash as the dtype minimum, as the engine hands NULLs over (arrow_numpy.to_numpy:
    # a view where there are none, and no pandas import, which Arrow's own to_numpy may make)
    return [to_numpy(batch.column(c)) for c in key]


def _file_batches(f: Path, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """The batches of one part file.  One row group at a time: iter_batches over the whole file
    reads ahead into the next row group (measured: twice the peak of the spill loop on 1 Mi-row
    groups).  A file that cannot be read is a :class:`DatasetError` naming it."""
    pf = open_parquet(f)
    for g in range(pf.num_row_groups):
        it = pf.iter_batches(batch_size=SPILL_BATCH_ROWS, row_groups=[g], columns=columns)
        while True:
            with reading(f):
                b = next(it, None)
            if b is None:
                break
            yield b


def spill_table(ds: Dataset, table: str, spill: Spill, prog: Progress | None) -> int:
    schema = SCHEMAS[table]
    key = KEYS[table]
    rows = 0
    for f in ds.files(table):
        for batch in _file_batches(f, schema.names):
            if batch.num_rows == 0:
                continue
            batch = pa.Table.from_batches([batch]).cast(schema).combine_chunks().to_batches()[0]
            b = bucket_ids(np, _key_arrays(batch, key), len(spill.files))
            order = np.argsort(b, kind="stable")
            sb = b[order]
            batch = batch.take(arrow_array(order))  # (pa.array of NumPy imports pandas)
            ks, starts = np.unique(sb, return_index=True)
            ends = [*starts[1:], len(sb)]
            for k, s, e in zip(ks.tolist(), starts.tolist(), ends, strict=True):
                spill.write(k, batch.slice(s, e - s))
            rows += batch.num_rows
            if prog is not None:
                prog.advance(batch.num_rows)
            kill_point("spill")
    spill.close()
    return rows


# --------------------------------------------------------------------------------------------
# Pass 2: sort each bucket, write its part
# --------------------------------------------------------------------------------------------
def _sort_indices(tbl: pa.Table, table: str) -> pa.Array:
    keys = [(ORDER[table], "ascending")] + [(c, "ascending") for c in KEYS[table]]
    return pc.sort_indices(tbl, sort_keys=keys)  # Arrow's sort is stable


def _write_sorted(tbl: pa.Table, idx: pa.Array, final: Path, row_group_rows: int) -> None:
    """Write ``tbl.take(idx)`` to ``final`` (atomic: temp name, fsync, rename), one row group of at
    most ``row_group_rows`` rows at a time, so only one row group is materialised besides ``tbl``."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            w = pq.ParquetWriter(
                f, tbl.schema, compression=PART_COMPRESSION, use_dictionary=_dictionary_columns(tbl.schema)
            )
            try:
                for s in range(0, len(idx), row_group_rows):
                    w.write_table(tbl.take(idx.slice(s, row_group_rows)), row_group_size=row_group_rows)
            finally:
                w.close()
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def part_name(table: str, k: int, tag: str, i: int = 0) -> str:
    """Relative path of part ``i`` of bucket ``k`` of ``table``."""
    return f"{table}/{BUCKET_COLUMN}={k}/part-{tag}-{i:05d}.parquet"


def write_buckets(
    table: str, spill: Spill, stage: Path, tag: str, row_group_rows: int, prog: Progress | None
) -> list[str]:
    rels = []
    for k in range(len(spill.files)):
        if not spill.files[k]:
            continue
        tbl = spill.read(k)
        spill.drop(k)
        idx = _sort_indices(tbl, table)
        rel = part_name(table, k, tag)
        _write_sorted(tbl, idx, stage / rel, row_group_rows)
        rels.append(rel)
        if prog is not None:
            prog.advance(tbl.num_rows)
        del tbl, idx
        kill_point("part")
    return rels


def default_max_open() -> int:
    """Spill writers kept open: raise the soft file limit towards the hard one, keep a margin."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else 1 << 16
        if soft != resource.RLIM_INFINITY and soft < want:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
                soft = want
            except (ValueError, OSError):
                pass
        limit = soft if soft != resource.RLIM_INFINITY else 1 << 16
    except ImportError:  # pragma: no cover - not POSIX
        limit = 512
    return max(8, min(4096, int(limit) - 128))
