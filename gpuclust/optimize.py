"""``gpuclust optimize``: rewrite a dataset into the key-partitioned ("bucketed") layout.

The key-partitioned tables of :data:`gpuclust.layout.KEYS` are rewritten so that every row
sits in ``<table>/bucket=<k>/part-<tag>-00000.parquet`` with ``k = bucket_ids(key) `` (one hash,
:func:`gpuclust.layout.bucket_ids`), rows time-ordered inside a bucket; every table uses the
same bucket count, so usage and events of one instance share a bucket number.  Other tables and
the rejects are left as they are (or copied, with ``out=``).

Memory is bounded by one bucket plus one batch, never a table:

1. *spill*: each input part is streamed in batches of :data:`SPILL_BATCH_ROWS` rows; each
   batch's rows are split by bucket and appended to that bucket's spill file (Arrow IPC, lz4)
   in ``DATASET/_staging/spill/``;
2. *sort and write*: per bucket, its spill is read, sorted by the table's time column (then the
   key; a stable sort, so full ties keep their input order) and written as Parquet (zstd, row
   groups of at most ``row_group_rows``) to ``DATASET/_staging/<table>/bucket=<k>/``.

Crash safety follows ingest's convention: nothing outside ``_staging`` changes until the new
manifest is written; the staged parts are renamed into place just before the manifest that lists
them replaces the old one (``write_json_atomic(..., before_replace=...)``), and the old parts are
deleted only after that.  A crash at any point leaves a dataset that reads exactly the old rows,
or the complete new layout; the next ``optimize`` (or a re-run) removes the leftovers — the
staging folder and any part the manifest does not list — and starts again.

The files and the two passes are in :mod:`gpuclust._optimize_passes`.
"""

from __future__ import annotations

import argparse
import copy
import fcntl
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from gpuclust._optimize_passes import (
    KILL_ENV,  # noqa: F401 (re-exported)
    PART_COMPRESSION,  # noqa: F401 (re-exported)
    SPILL_BATCH_ROWS,  # noqa: F401 (re-exported)
    STAGING_DIR,
    Spill,
    default_max_open,
    fsync_copy,
    kill_point,
    listed,
    part_name,  # noqa: F401 (re-exported)
    remove_unlisted,
    spill_table,
    write_buckets,
)
from gpuclust._progress import StatusLine, bar, si
from gpuclust.dataset import MANIFEST, Dataset, DatasetError, fsync_dir, write_json_atomic
from gpuclust.layout import HASH_NAME, KEYS, layout_entry
from gpuclust.schema import SCHEMAS

__all__ = ["OptimizeReport", "OptimizeUsageError", "default_buckets", "optimize", "register"]

#: Target instance_usage rows per bucket for the default bucket count.
ROWS_PER_BUCKET = 1 << 20
#: Largest row group of a bucketed part: smaller ones help time pushdown, and a reader decodes a
#: row group at once, so a partition's peak follows it (data-quality at 1.6e7 windows, 2 threads:
#: 1.10 GiB with 1 Mi-row groups, 0.80 GiB with 256 Ki; docs/user/scale.md).
ROW_GROUP_ROWS = 1 << 18
#: The same lock as ingest's: an ingest and an optimize never write one dataset at once.
LOCK_FILE = ".gpuclust-ingest.lock"
#: Marks a folder created by ``optimize --out`` (a crashed one is wiped and redone by a re-run).
OUT_MARKER = ".gpuclust-optimize-out"

_ORDER_OF_WORK = ("instance_usage", "instance_events", "machine_events", "machine_attributes", "collection_events")
assert set(_ORDER_OF_WORK) == set(KEYS)


class OptimizeUsageError(ValueError):
    """The optimize cannot be carried out as asked (bad bucket count, output folder in use, ...)."""


@dataclass
class OptimizeReport:
    """What :func:`optimize` did."""

    dataset: Path
    out: Path
    buckets: int
    noop: bool
    rows: dict[str, int] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        if self.noop:
            head = f"{self.out}: already bucketed into {self.buckets} bucket(s); nothing to do"
        else:
            head = f"optimize {self.dataset} -> {self.out}: {self.buckets} bucket(s) in {self.seconds:.1f} s"
        lines = [head]
        for t in _ORDER_OF_WORK:
            if t in self.rows:
                lines.append(f"  {t}: {self.rows[t]:,} rows in {self.files.get(t, 0)} part(s)")
        if self.removed:
            lines.append(f"removed {len(self.removed)} leftover file(s) of an interrupted run")
        return "\n".join(lines)


#: Fewest buckets of the default count: a small dataset still splits into partitions for every
#: thread of a 16-core node (the engine joins consecutive buckets into partitions; it never
#: splits one).
MIN_BUCKETS = 16


def default_buckets(usage_rows: int) -> int:
    """The default bucket count: ``ceil(instance_usage rows / 1 Mi)``, at least :data:`MIN_BUCKETS`.

    A bucket is the smallest partition the engine can make (it never splits one), so its size is
    the grain of ``--memory-limit``: 1 Mi usage rows is ~0.7 GB of partition working set for the
    heaviest analysis (usage-distribution, ``row_bytes`` 448 + columns)."""
    return max(MIN_BUCKETS, math.ceil(int(usage_rows) / ROWS_PER_BUCKET))


# --------------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------------
class Progress(StatusLine):
    """Progress of an optimize on ``stream`` (stderr): a redrawn bar on a terminal, else a line per
    table and pass and a status line about every ``log_interval`` seconds (ingest's style)."""

    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None, log_interval: float = 10.0):
        super().__init__(stream, tty)
        self.log_interval = log_interval
        self.total = 0
        self.done = 0
        self.phase = ""
        self._t0 = self._last = time.monotonic()

    def start(self, total_rows: int, buckets: int) -> None:
        self.total = 2 * total_rows  # every row is spilled once and written once
        self._t0 = self._last = time.monotonic()
        self.line(f"optimize: {total_rows:,} rows into {buckets} bucket(s) (pass 1 spills, pass 2 sorts and writes)")

    def begin(self, phase: str) -> None:
        self.phase = phase
        if not self.tty:
            self.line(f"optimize: {phase}")
        else:
            self._draw()

    def advance(self, rows: int) -> None:
        self.done += rows
        now = time.monotonic()
        if self.tty and now - self._last >= 0.2:
            self._draw()
        elif not self.tty and now - self._last >= self.log_interval:
            self._status()

    def close(self) -> None:
        self._status()

    def _status(self) -> None:
        self._last = time.monotonic()
        dt = max(self._last - self._t0, 1e-9)
        pct = 100 * self.done / self.total if self.total else 100.0
        self.line(f"optimize: {pct:5.1f}% ({self.phase}), {si(self.done / dt)} rows/s, {dt:.1f} s")

    def _draw(self) -> None:
        self._last = time.monotonic()
        frac = min(1.0, self.done / self.total) if self.total else 0.0
        self.redraw(f"{bar(frac)} {frac * 100:5.1f}% {self.phase}")


# --------------------------------------------------------------------------------------------
# The lock (the files and the two passes: gpuclust._optimize_passes)
# --------------------------------------------------------------------------------------------
@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_FILE, "a+") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OptimizeUsageError(f"{folder}: another ingest or optimize is writing into this dataset") from None
        yield


# --------------------------------------------------------------------------------------------
# The whole step
# --------------------------------------------------------------------------------------------
def _tag(manifest: dict[str, Any], n: int) -> str:
    """Name tag of the new parts: from the bucket count and the parts being replaced, so a re-run
    names its parts as a clean run would, and never as the parts it replaces."""
    src = {t: sorted(manifest.get("tables", {}).get(t, {}).get("files", [])) for t in _ORDER_OF_WORK}
    blob = json.dumps({"n": n, "hash": HASH_NAME, "files": src}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _already(ds: Dataset, n: int) -> bool:
    return all((lay := ds.layout(t)) is not None and lay["buckets"] == n for t in _ORDER_OF_WORK)


def _prepare_out(src: Path, out: Path, n: int) -> bool:
    """Check ``out`` for ``optimize --out``; True when it already holds this very optimize."""
    if not out.exists():
        return False
    if not out.is_dir():
        raise OptimizeUsageError(f"{out}: exists and is not a folder")
    if (out / MANIFEST).is_file():
        try:
            m = json.loads((out / MANIFEST).read_text())
        except json.JSONDecodeError:
            m = {}
        info = m.get("optimize") or {}
        if (out / OUT_MARKER).exists() and info.get("source") == str(src.resolve()) and info.get("buckets") == n:
            return True
        raise OptimizeUsageError(
            f"{out}: already holds a dataset; choose a new folder, or optimize that one in place (`gpuclust optimize {out}`)"
        )
    entries = {p.name for p in out.iterdir()} - {LOCK_FILE}
    if entries and OUT_MARKER not in entries:
        raise OptimizeUsageError(f"{out}: exists and is not empty; choose a new folder")
    return False


def _check_args(buckets: int | None, row_group_rows: int) -> None:
    """Raise :class:`OptimizeUsageError` for a bucket count that is not an integer >= 1 or a row group under 1 row."""
    if buckets is not None and (isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1):
        raise OptimizeUsageError(f"--buckets must be an integer >= 1, got {buckets!r}")
    if row_group_rows < 1:
        raise OptimizeUsageError(f"row_group_rows must be >= 1, got {row_group_rows!r}")


def _start_out(dst: Path) -> None:
    """Empty the ``--out`` folder ``dst`` but its lock and marker (a crashed run starts again from
    nothing), and mark it as an optimize output."""
    for p in list(dst.iterdir()):
        if p.name in (LOCK_FILE, OUT_MARKER):
            continue
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    (dst / OUT_MARKER).touch()


def optimize(
    dataset: str | os.PathLike[str],
    *,
    buckets: int | None = None,
    out: str | os.PathLike[str] | None = None,
    progress: Progress | bool | None = None,
    row_group_rows: int = ROW_GROUP_ROWS,
    max_open: int | None = None,
) -> OptimizeReport:
    """Rewrite ``dataset`` into the bucketed layout (in place, or into the new folder ``out``).

    Parameters
    ----------
    dataset
        A complete canonical dataset (flat, or bucketed with another count).
    buckets
        Bucket count of every key-partitioned table (default :func:`default_buckets`).
        A dataset already bucketed into this many buckets is left as it is.
    out
        Write the optimized dataset here (a new or empty folder) instead of in place; the other
        tables' parts and the rejects are copied.
    progress
        ``True`` for progress on stderr, or a :class:`Progress`.
    row_group_rows
        Largest row group of a written part.
    max_open
        Most spill files open at once (default: from the process' file limit).

    Raises
    ------
    gpuclust.dataset.DatasetError
        ``dataset`` is not a dataset, is incomplete, or has an unusable layout.
    OptimizeUsageError
        A bad bucket count, ``out`` holds something else, or another ingest/optimize runs.

    Examples
    --------
    >>> from gpuclust.optimize import optimize
    >>> rep = optimize("cell/ds", buckets=8)              # doctest: +SKIP
    >>> Dataset("cell/ds").layout("instance_usage")["buckets"]  # doctest: +SKIP
    8
    """
    t0 = time.perf_counter()
    _check_args(buckets, row_group_rows)
    prog: Progress | None = Progress() if progress is True else (progress or None)
    src = Path(dataset)
    Dataset(src)  # not a dataset / incomplete / bad layout: DatasetError before anything is written
    in_place = out is None or (Path(out).exists() and Path(out).resolve() == src.resolve())
    dst = src if in_place else Path(out)  # type: ignore[arg-type]
    with ExitStack() as locks:
        locks.enter_context(_locked(src))
        removed: list[str] = []
        if in_place:
            ds = Dataset(src)
            removed = remove_unlisted(src, ds.manifest)
        else:
            ds = Dataset(src)
            n0 = buckets or default_buckets(ds.num_rows("instance_usage"))
            done = _prepare_out(src, dst, n0)
            locks.enter_context(_locked(dst))
            if done:
                removed = remove_unlisted(dst, json.loads((dst / MANIFEST).read_text()))
                return OptimizeReport(src, dst, n0, True, removed=removed, seconds=time.perf_counter() - t0)
            _start_out(dst)
        n = buckets or default_buckets(ds.num_rows("instance_usage"))
        rep = OptimizeReport(src, dst, n, False, removed=removed)
        if in_place and _already(ds, n):
            rep.noop = True
            rep.rows = {t: ds.num_rows(t) for t in _ORDER_OF_WORK}
            rep.files = {t: len(ds.files(t)) for t in _ORDER_OF_WORK}
            rep.seconds = time.perf_counter() - t0
            return rep
        _rewrite(ds, dst, n, in_place, prog, row_group_rows, max_open or default_max_open(), rep)
        rep.seconds = time.perf_counter() - t0
        return rep


def _rewrite(
    ds: Dataset,
    dst: Path,
    n: int,
    in_place: bool,
    prog: Progress | None,
    row_group_rows: int,
    max_open: int,
    rep: OptimizeReport,
) -> None:
    stage = dst / STAGING_DIR
    old = ds.manifest
    tag = _tag(old, n)
    if prog is not None:
        prog.start(sum(ds.num_rows(t) for t in _ORDER_OF_WORK), n)
    new_files: dict[str, list[str]] = {}
    for table in _ORDER_OF_WORK:
        spill = Spill(stage / "spill" / table, SCHEMAS[table], n, max_open)
        if prog is not None:
            prog.begin(f"pass 1/2 (spill) {table}")
        rows = spill_table(ds, table, spill, prog)
        if prog is not None:
            prog.begin(f"pass 2/2 (sort, write) {table}")
        new_files[table] = write_buckets(table, spill, stage, tag, row_group_rows, prog)
        rep.rows[table] = rows
        rep.files[table] = len(new_files[table])
    shutil.rmtree(stage / "spill", ignore_errors=True)

    moves = [(stage / rel, dst / rel) for rels in new_files.values() for rel in rels]
    if not in_place:  # the other tables and the rejects are copied as they are
        for rel in sorted(listed(old)):
            if rel.split("/", 1)[0] in KEYS:
                continue
            fsync_copy(ds.path / rel, stage / rel)
            moves.append((stage / rel, dst / rel))
    m = copy.deepcopy(old)
    for table in _ORDER_OF_WORK:
        m["tables"][table] = {
            "rows": rep.rows[table],
            "files": sorted(new_files[table]),
            "layout": layout_entry(table, n),
        }
    # the ingest's record: these parts now hold every input's rows of those tables, which an
    # input's `outputs` no longer list (see gpuclust.ingest.api._recompute_tables)
    m["laid_out"] = {table: copy.deepcopy(m["tables"][table]) for table in _ORDER_OF_WORK}
    for inp in m.get("inputs", {}).values():
        inp["outputs"] = [o for o in inp.get("outputs") or [] if o.split("/", 1)[0] not in KEYS]
        inp["laid_out"] = sorted(set(inp.get("laid_out") or []) | (set(inp.get("rows_written") or {}) & set(KEYS)))
    m["optimize"] = {"buckets": n, "hash": HASH_NAME, "row_group_rows": row_group_rows}
    if not in_place:
        m["optimize"]["source"] = str(ds.path.resolve())
    for _, d in moves:
        d.parent.mkdir(parents=True, exist_ok=True)

    def switch() -> None:
        for s, d in moves:
            os.replace(s, d)
            kill_point("move")

    write_json_atomic(dst / MANIFEST, m, before_replace=switch)
    for d in sorted({d.parent for _, d in moves}):
        fsync_dir(d)
    kill_point("swap")
    if in_place:  # only now that the new manifest is in place do the old parts go
        keep = listed(m)
        for table in _ORDER_OF_WORK:
            for rel in old.get("tables", {}).get(table, {}).get("files", []):
                if rel not in keep:
                    try:
                        (dst / rel).unlink()
                    except FileNotFoundError:
                        pass
        remove_unlisted(dst, m)  # empty old bucket folders, the staging folder
    else:
        shutil.rmtree(stage, ignore_errors=True)
    if prog is not None:
        prog.close()


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``optimize`` sub-command to ``subparsers``."""
    p = subparsers.add_parser(
        "optimize",
        help="rewrite a dataset into the bucketed layout (instances and machines by key, time-ordered)",
        description=(
            "Rewrite the instance_usage, instance_events, machine_events and machine_attributes tables of "
            "DATASET into the key-partitioned layout: DATASET/<table>/bucket=<k>/part-*.parquet, every "
            "instance's usage and events in the same bucket, rows time-ordered inside.  Crash-safe and "
            "memory-bounded (one bucket at a time); re-run after an interruption."
        ),
    )
    p.add_argument("dataset", metavar="DATASET", help="a complete canonical dataset")
    p.add_argument(
        "--buckets",
        type=int,
        default=None,
        metavar="N",
        help=f"bucket count (default: ceil(instance_usage rows / {ROWS_PER_BUCKET:,}), at least {MIN_BUCKETS})",
    )
    p.add_argument("--out", "-o", metavar="NEW_DATASET", help="write a new dataset here instead of rewriting DATASET")
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``gpuclust optimize``; returns 0 (done or nothing to do) or 2 (an expected fault: not a
    dataset, a damaged part file, a bad option, an output or disk that cannot be written)."""
    from gpuclust.errors import EXIT_ERROR, EXIT_OK, fault_text

    try:
        rep = optimize(
            args.dataset, buckets=args.buckets, out=args.out, progress=None if args.no_progress else Progress()
        )
    except (DatasetError, OptimizeUsageError, OSError) as e:
        print(f"gpuclust optimize: error: {fault_text(e)}", file=sys.stderr)
        return EXIT_ERROR
    print(rep.summary())
    return EXIT_OK
