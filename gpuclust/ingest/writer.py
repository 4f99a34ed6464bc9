"""Writing one input file's chunks into the dataset: atomic parts, a rejects file, file statistics.

Runs inside a worker process (or in the calling process); it never touches ``manifest.json``,
which the parent process owns (:mod:`gpuclust.ingest.api`).  Every file it writes goes to the
staging folder ``OUT/_staging/`` (a temporary name, fsync, rename there), never straight into a
table folder: the parent moves an input's files into the table folders by rename in the same step
that the manifest starts listing them, so a glob over ``OUT/<table>/*.parquet`` (DuckDB, Spark)
only ever sees listed, complete parts.  Whatever a crash leaves in ``_staging`` is removed by the
next ingest.

Output names (final; staged under ``OUT/_staging/`` with the same relative path)::

    OUT/<table>/part-<first 16 hex of the input's content hash>-<chunk:05d>.parquet
    OUT/_rejects/part-<first 16 hex of the input's content hash>.jsonl
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from gpuclust.dataset import REJECTS_DIR, fsync_dir
from gpuclust.ingest import content_hash
from gpuclust.ingest.base import ReadOptions, Reject, SourceError, SourceFile
from gpuclust.ingest.readers import get_reader

#: Parquet compression of the dataset's parts.
PART_COMPRESSION = "zstd"
#: Test hook: SIGKILL the whole ingest (main process and this one) after this many published parts.
KILL_AFTER_PARTS_ENV = "GPUCLUST_TEST_KILL_AFTER_PARTS"
#: Where a worker writes an input's parts and rejects until the manifest lists them.
STAGING_DIR = "_staging"
#: Threads encoding and publishing parts (Parquet encoding releases the GIL).  Two: at the end of
#: an input the last parts are encoded at once instead of one after the other (on the 1 GB plain
#: benchmark shard the single writer was still encoding two parts ~0.1 s after the last parse).
WRITE_THREADS = 2
#: How many reject reasons a file's result keeps for the summary.
FIRST_REASONS = 5

ProgressFn = Callable[[str, int, int], None]


def stem(key: str) -> str:
    """The name stem of every output of the input with this content hash."""
    return f"part-{key[:16]}"


@dataclass
class FileResult:
    """What ingesting one input file produced (also the manifest's ``inputs`` entry)."""

    #: The hash of the input's content (the algorithm: the manifest's ``content_hash``).
    content_hash: str
    path: str
    size: int
    format: str
    source_table: str
    trace_version: str
    status: str = "failed"  # "done" | "failed"
    #: The input's modification time when it was read (with ``path`` and ``size``: a re-run
    #: trusts these instead of hashing the file again).
    mtime_ns: int | None = None
    rows_read: int = 0
    rows_written: dict[str, int] = field(default_factory=dict)
    rows_rejected: int = 0
    rows_deduplicated: int = 0
    #: Rows outside the ingest selection (sample / time range): raw records dropped before
    #: validation plus canonical rows dropped after it.
    rows_skipped: int = 0
    outputs: list[str] = field(default_factory=list)
    rejects_file: str | None = None
    error: str | None = None
    first_reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def manifest_entry(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("trace_version")
        return d


# --------------------------------------------------------------------------------------------
# Worker-process plumbing
# --------------------------------------------------------------------------------------------
_MAIN_PID: int | None = None
_QUEUE: Any = None
_parts_published = 0


def _set_parent_death_signal() -> None:
    """Linux: have the kernel SIGKILL this worker when its parent dies (no orphan keeps writing)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def init_worker(queue: Any, main_pid: int) -> None:
    """ProcessPoolExecutor initializer: remember the parent and the progress queue."""
    global _MAIN_PID, _QUEUE
    _MAIN_PID = main_pid
    _QUEUE = queue
    _set_parent_death_signal()
    if os.getppid() != main_pid:  # parent already gone
        os._exit(70)


def _check_parent() -> None:
    if _MAIN_PID is not None and os.getpid() != _MAIN_PID and os.getppid() != _MAIN_PID:
        os._exit(70)


def _kill_hook() -> None:
    global _parts_published
    _parts_published += 1
    limit = os.environ.get(KILL_AFTER_PARTS_ENV)
    if limit and _parts_published >= int(limit):
        if _MAIN_PID is not None and _MAIN_PID != os.getpid():
            os.kill(_MAIN_PID, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------------------------
# Atomic files
# --------------------------------------------------------------------------------------------
def _tmp_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.{os.getpid()}.tmp")


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    """Columns worth dictionary-encoding: all but the floating-point ones.

    Usage floats are nearly all distinct, so a dictionary for them is built only to be thrown
    away when the page falls back to plain encoding; skipping it cuts the Parquet writer's CPU
    time about threefold and makes the parts slightly smaller (the values are the same).
    """
    return [f.name for f in schema if not pa.types.is_floating(f.type)]


def write_part(table: pa.Table, final: Path) -> None:
    """Write ``table`` to ``final`` atomically (temp file in the same folder, fsync, rename)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(final)
    try:
        with open(tmp, "wb") as f:
            pq.write_table(
                table,
                f,
                compression=PART_COMPRESSION,
                row_group_size=1 << 20,
                use_dictionary=_dictionary_columns(table.schema),
            )
            f.flush()
            os.fsync(f.fileno())
        _check_parent()
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(final.parent)


class _RejectSink:
    """Appends rejects as JSON lines to a temporary file; publishes it atomically at the end."""

    def __init__(self, final: Path):
        self.final = final
        self.tmp = _tmp_name(final)
        self.f: Any = None
        self.count = 0
        self.first: list[str] = []

    def add(self, rejects: list[Reject]) -> None:
        if not rejects:
            return
        if self.f is None:
            self.final.parent.mkdir(parents=True, exist_ok=True)
            self.f = open(self.tmp, "w", encoding="utf-8")
        for r in rejects:
            self.f.write(
                json.dumps(
                    {"file": r.file, "line": r.line, "row": r.row, "reason": r.reason, "raw": r.raw}, ensure_ascii=False
                )
            )
            self.f.write("\n")
            if len(self.first) < FIRST_REASONS:
                where = f"line {r.line}" if r.line is not None else f"row {r.row}"
                self.first.append(f"{where}: {r.reason}")
        self.count += len(rejects)

    def publish(self) -> bool:
        if self.f is None:
            return False
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        self.f = None
        _check_parent()
        os.replace(self.tmp, self.final)
        fsync_dir(self.final.parent)
        return True

    def discard(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------------------------
# One input file
# --------------------------------------------------------------------------------------------
def _queue_progress() -> ProgressFn | None:
    """In a worker process, a progress callback that sends ``(path, rows, bytes done)`` to the parent's queue."""
    if _QUEUE is None:
        return None
    queue = _QUEUE

    def progress(path: str, rows: int, done: int) -> None:
        queue.put((path, rows, done))

    return progress


def _write_chunks(
    src: SourceFile,
    opts: ReadOptions,
    stage: Path,
    st: str,
    res: FileResult,
    sink: _RejectSink,
    progress: ProgressFn | None,
) -> None:
    """Read ``src`` chunk by chunk, staging each table's rows as part ``<table>/<st>-<chunk>.parquet``
    and its rejects in ``sink``; ``res`` counts them (and says done or failed, with the error)."""
    # Parts are written by one background thread (Parquet encoding releases the GIL) while the
    # reader parses the next chunk; at most two parts wait in memory.
    pool = ThreadPoolExecutor(max_workers=WRITE_THREADS, thread_name_prefix="gpuclust-write")
    pending: deque[tuple[Future[None], str, str, int]] = deque()

    def settle(keep: int) -> None:
        while len(pending) > keep:
            fut, rel, tname, n = pending.popleft()
            fut.result()
            res.outputs.append(rel)
            res.rows_written[tname] = res.rows_written.get(tname, 0) + n

    def publish(tbl: pa.Table, rel: str) -> None:
        write_part(tbl, stage / rel)
        _kill_hook()

    try:
        try:
            reader = get_reader(src.format)
            for i, chunk in enumerate(reader(src, opts)):
                res.rows_skipped += chunk.rows_skipped
                for tname in sorted(chunk.tables):
                    tbl = chunk.tables[tname]
                    if opts.select is not None:
                        tbl, dropped = opts.select.filter_table(tname, tbl)
                        res.rows_skipped += dropped
                    if tbl.num_rows == 0:
                        continue
                    rel = f"{tname}/{st}-{i:05d}.parquet"
                    pending.append((pool.submit(publish, tbl, rel), rel, tname, tbl.num_rows))
                    settle(2)
                sink.add(chunk.rejects)
                res.rows_read += chunk.rows_read
                res.rows_deduplicated += chunk.rows_deduplicated
                if progress is not None:
                    progress(res.path, res.rows_read, chunk.bytes_done)
            res.status = "done"
        finally:
            try:
                settle(0)
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
    except SourceError as e:
        res.status = "failed"
        res.error = str(e)
    except Exception as e:  # a reader bug or an OS error: the file fails, the run goes on
        res.status = "failed"
        res.error = f"{type(e).__name__}: {e}"


def _publish_rejects(res: FileResult, sink: _RejectSink, st: str) -> None:
    """Publish the staged rejects file under stem ``st``; failing to write it fails the input."""
    try:
        if sink.publish():
            res.rejects_file = f"{REJECTS_DIR}/{st}.jsonl"
    except OSError as e:
        sink.discard()
        res.status = "failed"
        res.error = (res.error + "; " if res.error else "") + f"cannot write rejects: {e}"


def ingest_file(
    src: SourceFile,
    key: str | None,
    out: Path,
    opts: ReadOptions,
    progress: ProgressFn | None = None,
    algorithm: str = content_hash.LEGACY,
) -> FileResult:
    """Read ``src`` and publish its canonical parts and rejects under ``out``.

    Everything is written under ``out/_staging/`` (see the module docstring); the result's
    ``outputs`` and ``rejects_file`` are the final paths relative to ``out``.  Never raises for
    bad input: an unreadable or truncated file gives ``status="failed"`` with ``error`` set,
    keeping the parts written before the failure.

    ``key`` is the input's content hash, or None when it is not known yet: the file is then
    hashed (with ``algorithm``) as the reader reads it (:class:`content_hash.StreamHash`), its
    parts are staged under a provisional name and renamed to the hash's once it is known.
    """
    t0 = time.perf_counter()
    out = Path(out)
    info = os.stat(src.path)
    digest = content_hash.StreamHash(src.path, algorithm) if key is None else None
    res = FileResult(
        content_hash=key or "",
        path=str(src.path),
        size=info.st_size,
        mtime_ns=info.st_mtime_ns,
        format=src.format,
        source_table=src.source_table,
        trace_version=src.trace_version,
    )
    if src.problem is not None:  # empty, unreadable, another format inside: not read at all
        res.error = src.problem
        res.seconds = time.perf_counter() - t0
        return res
    # Unknown hash: a provisional stem, unique among the run's inputs (their paths differ).
    st = stem(key) if key is not None else f"part-new-{hashlib.sha256(os.fsencode(src.path)).hexdigest()[:16]}"
    if digest is not None:
        opts = replace(opts, digest=digest)
    stage = out / STAGING_DIR
    sink = _RejectSink(stage / REJECTS_DIR / f"{st}.jsonl")
    if progress is None:
        progress = _queue_progress()
    _write_chunks(src, opts, stage, st, res, sink, progress)
    res.rows_rejected = sink.count
    res.first_reasons = sink.first
    if digest is not None:
        st = _name_by_hash(res, digest, stage, st, sink)
    _publish_rejects(res, sink, st)
    if progress is not None:
        progress(res.path, res.rows_read, res.size)
    res.seconds = time.perf_counter() - t0
    return res


def _name_by_hash(res: FileResult, digest: content_hash.StreamHash, stage: Path, st: str, sink: _RejectSink) -> str:
    """Finish the input's hash and rename its staged parts from the provisional stem ``st`` to
    the hash's; returns the new stem.  A file that cannot be read to its end fails, keyed by
    its path."""
    try:
        res.content_hash = digest.finish()
    except OSError as e:
        res.content_hash = hashlib.sha256(b"unreadable\0" + os.fsencode(res.path)).hexdigest()
        res.status = "failed"
        res.error = (res.error + "; " if res.error else "") + f"{res.path}: cannot read to hash it: {e.strerror or e}"
    new = stem(res.content_hash)
    renamed = []
    try:
        for rel in res.outputs:
            table, name = rel.split("/", 1)
            to = f"{table}/{new}{name[len(st) :]}"
            os.replace(stage / rel, stage / to)
            renamed.append(to)
        for folder in {(stage / rel).parent for rel in renamed}:
            fsync_dir(folder)
    except OSError as e:  # the input fails, listing no parts (the staging folder goes at the end)
        res.status = "failed"
        res.error = (res.error + "; " if res.error else "") + f"cannot name its parts: {e.strerror or e}"
        renamed, res.rows_written = [], {}
    res.outputs = renamed
    sink.final = stage / REJECTS_DIR / f"{new}.jsonl"
    return new


def ingest_file_task(
    src: SourceFile, key: str | None, out: str, opts: ReadOptions, algorithm: str = content_hash.LEGACY
) -> FileResult:
    """Entry point for worker processes."""
    return ingest_file(src, key, Path(out), opts, algorithm=algorithm)
