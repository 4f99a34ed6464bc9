"""``gpuclust.ingest.ingest``: raw trace files -> a canonical dataset, crash-safe and resumable.

The calling process owns ``manifest.json``; input files are read in parallel by worker processes
(:mod:`gpuclust.ingest.writer`), each publishing its parts atomically.  After all parts of an
input are published the manifest is rewritten atomically, listing them and marking the input
``done``; the input's files move from ``_staging/`` into the table folders by rename in that same
step, just before the new manifest replaces the old one, so a glob over a table folder sees only
parts the manifest lists.  A run that starts on an existing dataset skips inputs already done
(same content hash: :mod:`gpuclust.ingest.content_hash`), retries failed ones and deletes the staging folder and any part / reject file the
manifest does not list (leftovers of a crash), so a re-run after a kill at any point produces
exactly the rows of a clean run.

This module holds :func:`ingest` (checking the request, locking the dataset, laying it out at the
end); the run itself is :mod:`gpuclust.ingest.runner`, identifying the inputs
:mod:`gpuclust.ingest.inputs`, the manifest :mod:`gpuclust.ingest.manifest` and the reports
:mod:`gpuclust.ingest.outcome` (their public names are importable from here as well).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from gpuclust.ingest.base import ReadOptions, SourceFile
from gpuclust.ingest.detect import detect, expand_sources
from gpuclust.ingest.inputs import read_listing
from gpuclust.ingest.manifest import KILL_AFTER_MANIFESTS_ENV, KILL_MID_PUBLISH_ENV, _load_manifest
from gpuclust.ingest.outcome import FileReport, IngestReport, IngestUsageError
from gpuclust.ingest.progress import Progress
from gpuclust.ingest.runner import _run

__all__ = [
    "KILL_AFTER_MANIFESTS_ENV",
    "KILL_MID_PUBLISH_ENV",
    "LAYOUTS",
    "LOCK_FILE",
    "FileReport",
    "IngestReport",
    "IngestUsageError",
    "ingest",
    "read_listing",
]

LOCK_FILE = ".gpuclust-ingest.lock"
_RESERVED = {"dataset_format_version", "trace_version", "cell", "tier_map", "complete", "inputs", "tables", "selection"}


def _resolve_progress(progress: Any) -> Progress | None:
    if progress is None or progress is False:
        return None
    if progress is True:
        return Progress()
    return progress  # type: ignore[no-any-return,unused-ignore]


def _detect_inputs(
    sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], format: str | None, table: str | None
) -> tuple[list[SourceFile], str, list[str]]:
    """The input files of ``sources`` detected, their one trace version, and the notes on skipped or
    misnamed files; raises when there are none or they mix trace versions."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    notes: list[str] = []
    paths = [Path(os.path.abspath(p)) for p in expand_sources(sources, notes)]
    if not paths:
        raise IngestUsageError("no input files" + (f" ({len(notes)} skipped: {notes[0]} ...)" if notes else ""))
    srcs: list[SourceFile] = [detect(p, format=format, table=table) for p in paths]
    notes.extend(s.note for s in srcs if s.note)
    versions = sorted({s.trace_version for s in srcs})
    if len(versions) > 1:
        by = {v: next(str(s.path) for s in srcs if s.trace_version == v) for v in versions}
        raise IngestUsageError(f"inputs mix trace versions {versions} (e.g. {by}); one dataset holds one trace version")
    return srcs, versions[0], notes


def _check_request(extra_manifest: dict[str, Any] | None, max_reject_rate: float, layout: str) -> None:
    """Raise :class:`IngestUsageError` for reserved ``extra_manifest`` keys, a rate outside 0..1 or an unknown layout."""
    if extra_manifest:
        clash = set(extra_manifest) & _RESERVED
        if clash:
            raise IngestUsageError(f"extra_manifest may not set reserved keys {sorted(clash)}")
    if not 0 <= max_reject_rate <= 1:
        raise IngestUsageError(f"max_reject_rate must be within 0..1, got {max_reject_rate}")
    if layout not in LAYOUTS:
        raise IngestUsageError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")


@contextlib.contextmanager
def _locked_dataset(out: Path) -> Iterator[None]:
    """Create the dataset folder ``out`` and hold its ingest lock while the block runs (another
    ingest holding it is an :class:`IngestUsageError`)."""
    if out.exists() and not out.is_dir():  # mkdir's "File exists" would not say what is wrong
        raise IngestUsageError(f"{out}: exists and is not a folder (a dataset is a folder)")
    out.mkdir(parents=True, exist_ok=True)
    lock = open(out / LOCK_FILE, "a+")
    try:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IngestUsageError(f"{out}: another ingest is writing into this dataset") from None
        yield
    finally:
        lock.close()


# --------------------------------------------------------------------------------------------
def ingest(
    sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    format: str | None = None,
    table: str | None = None,
    cell: str | None = None,
    tier_map: str | None = None,
    max_reject_rate: float = 0.01,
    workers: int | None = None,
    progress: Progress | bool | None = None,
    extra_manifest: dict[str, Any] | None = None,
    opts: ReadOptions | None = None,
    prefer: str | None = None,
    sample: str | None = None,
    time_from: Any = None,
    time_to: Any = None,
    listing: str | os.PathLike[str] | None = None,
    layout: str = "bucketed",
) -> IngestReport:
    """Ingest raw trace files into a canonical dataset folder.

    Parameters
    ----------
    sources
        Input files and/or folders (folders are expanded recursively, sorted).
    out
        The dataset folder (created if needed; an existing dataset is extended / resumed).
    format, table
        Override format / source-table detection for every input.
    cell
        Cell name recorded in the manifest (e.g. ``"a"``).
    tier_map
        Name of the priority tier map recorded in the manifest (default: ``notebook`` for v3,
        ``v2`` for v2; see ``gpuclust.schema.TIER_MAPS``).
    max_reject_rate
        Largest acceptable rejected/read ratio of an input: an input over it is recorded as
        failed (the dataset is not complete, a re-run retries it) and ``exit_status`` is 1.
    workers
        Worker processes reading files in parallel (default: the CPUs this process may use); one file, or
        ``workers=1``, is read in the calling process.
    progress
        ``True`` for a progress display on stderr, or a :class:`~gpuclust.ingest.progress.Progress`.
    extra_manifest
        Extra top-level manifest keys (e.g. ``{"synthetic": {...}}``).
    opts
        Reader options (chunk size, threads).
    prefer
        ``"parquet"`` or ``"json"``: which of twin exports of one shard (same name stem, JSON
        and Parquet) to read; without it twins are an error.
    sample, time_from, time_to
        Keep only a consistent sample (``"machines=1%"``, ``"collections=0.05"``) and / or the
        usage windows overlapping ``[time_from, time_to)`` with the events before ``time_to``
        (trace time like ``"1d"`` or wall-clock in the cell's time zone); see
        :mod:`gpuclust.ingest.sampling`.  Recorded in the manifest; a dataset is only extended with
        the same selection.
    listing
        A bucket listing (``gsutil ls -l`` output, see :func:`read_listing`): an input smaller
        than its listed size fails as a truncated download without being read; one not listed is
        noted.
    layout
        ``"bucketed"`` (default): once the dataset is complete, lay its usage and event tables out
        by instance and machine (:func:`gpuclust.optimize.optimize`, in place), the layout every
        analysis holds its memory goal on at any size.  An ingest that adds files to such a
        dataset lays it out again (every key-partitioned table).  ``"flat"``: leave new parts as
        read (e.g. while adding shards one run at a time); ``gpuclust optimize`` lays the dataset
        out at the end.

    Returns
    -------
    IngestReport

    Raises
    ------
    FileNotFoundError
        A source does not exist.
    gpuclust.ingest.detect.DetectError
        A file's format or table cannot be determined.
    IngestUsageError
        Mixed trace versions, a conflicting cell or tier map, another ingest running into ``out``,
        twin exports of one shard without ``prefer``, a selection that cannot be read or differs
        from the one the dataset was ingested with.

    Examples
    --------
    >>> from gpuclust.ingest import ingest
    >>> rep = ingest(["cell-a/machine_events-000000000000.json.gz"], "out/cell-a", cell="a")  # doctest: +SKIP
    >>> rep.exit_status, rep.rows_written["machine_events"]  # doctest: +SKIP
    (0, 46219)
    """
    t0 = time.perf_counter()
    opts = opts or ReadOptions()
    prog = _resolve_progress(progress)
    srcs, version, notes = _detect_inputs(sources, format, table)
    _check_request(extra_manifest, max_reject_rate, layout)
    out = Path(out)
    with _locked_dataset(out):
        report = _run(
            srcs,
            version,
            out,
            cell,
            tier_map,
            max_reject_rate,
            workers,
            prog,
            extra_manifest,
            opts,
            t0,
            notes,
            prefer,
            (sample, time_from, time_to),
            listing,
        )
    return _lay_out(report, layout, prog)


#: What :func:`ingest` may leave: its tables laid out by key (the default), or as read.
LAYOUTS = ("bucketed", "flat")


def _laid_out(out: Path) -> bool:
    """Every key-partitioned table of the dataset at ``out`` is in its buckets (none has parts an
    ingest added since its layout step)."""
    from gpuclust.layout import KEYS

    tables = (_load_manifest(out) or {}).get("tables", {})
    return all(isinstance(tables.get(t), dict) and tables[t].get("layout") for t in KEYS)


def _lay_out(report: IngestReport, layout: str, prog: Progress | None) -> IngestReport:
    """Lay a complete dataset out by key (``layout="bucketed"``) after the ingest: the same
    in-place, crash-safe rewrite as ``gpuclust optimize`` (a crash leaves the flat dataset, and the
    next ingest run, with nothing new to read, lays it out)."""
    if _laid_out(report.out):
        report.layout = "bucketed"
        return report
    if layout == "flat" or not report.complete:
        report.layout = "flat" if report.complete else None
        return report
    from gpuclust.optimize import Progress as OptimizeProgress
    from gpuclust.optimize import optimize

    rep = optimize(report.out, progress=OptimizeProgress() if prog is not None else None)
    report.layout = "bucketed"
    report.layout_note = (
        f"laid out by instance and machine: {rep.buckets} bucket(s) in {rep.seconds:.1f} s (`--layout flat` skips this)"
    )
    report.seconds += rep.seconds
    return report
