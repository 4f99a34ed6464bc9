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
"""

from __future__ import annotations

import concurrent.futures as cf
import fcntl
import hashlib
import json
import logging
import multiprocessing as mp
import os
import queue as queue_mod
import re
import shutil
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpuclust._parallel import usable_cores
from gpuclust.dataset import MANIFEST, REJECTS_DIR, fsync_dir, new_manifest, write_json_atomic
from gpuclust.ingest import content_hash
from gpuclust.ingest.base import ReadOptions, SourceFile
from gpuclust.ingest.detect import detect, expand_sources
from gpuclust.ingest.progress import Progress
from gpuclust.ingest.readers import _fast_usage
from gpuclust.ingest.sampling import IngestSelection, SelectionSpecError
from gpuclust.ingest.twins import TwinError, resolve_twins
from gpuclust.ingest.writer import STAGING_DIR, FileResult, ingest_file, ingest_file_task, init_worker
from gpuclust.schema import DATASET_FORMAT_VERSION, DEFAULT_TIER_MAP, TABLES
from gpuclust.schema import tier_map as get_tier_map

log = logging.getLogger("gpuclust.ingest")

#: Test hook: SIGKILL the ingest right after its N-th manifest update.
KILL_AFTER_MANIFESTS_ENV = "GPUCLUST_TEST_KILL_AFTER_MANIFESTS"
LOCK_FILE = ".gpuclust-ingest.lock"
_RESERVED = {"dataset_format_version", "trace_version", "cell", "tier_map", "complete", "inputs", "tables", "selection"}


class IngestUsageError(ValueError):
    """The request cannot be carried out as given (mixed trace versions, conflicting cell, ...)."""


@dataclass
class FileReport:
    """Per-input outcome of one ingest run."""

    path: str
    #: The hash of the input's content that keys it in the manifest (``manifest["content_hash"]``
    #: names the algorithm: :mod:`gpuclust.ingest.content_hash`).
    content_hash: str
    #: "done", "failed", "skipped" (already in the dataset) or "duplicate" (same content given twice).
    status: str
    format: str = ""
    source_table: str = ""
    rows_read: int = 0
    rows_written: dict[str, int] = field(default_factory=dict)
    rows_rejected: int = 0
    rows_deduplicated: int = 0
    #: Rows outside the ingest's sample / time range (not written, not validated).
    rows_skipped: int = 0
    rejects_file: str | None = None
    first_reasons: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    bytes: int = 0


@dataclass
class IngestReport:
    """The result of :func:`ingest`: per-file statistics, totals, failures and the exit status."""

    out: Path
    files: list[FileReport]
    rows_read: int
    rows_written: dict[str, int]
    rows_rejected: int
    rows_deduplicated: int
    max_reject_rate: float
    complete: bool
    seconds: float
    warnings: list[str] = field(default_factory=list)
    #: One line per file not read on purpose (not a trace table, a twin export not chosen) and
    #: per file read as something other than its name says.
    notes: list[str] = field(default_factory=list)
    #: The ingest's selection (:meth:`gpuclust.ingest.sampling.IngestSelection.describe`), if any.
    selection: str | None = None
    #: Rows outside the selection, over the files read.
    rows_skipped: int = 0
    #: How the dataset's key-partitioned tables are laid out after the run: ``"bucketed"`` (by
    #: instance and machine, :mod:`gpuclust.optimize`), ``"flat"``, or ``None`` (unfinished).
    layout: str | None = None
    #: One line on the layout step of this run (``None``: none ran).
    layout_note: str | None = None

    @property
    def failed(self) -> list[FileReport]:
        return [f for f in self.files if f.status == "failed"]

    @property
    def reject_rate(self) -> float:
        return self.rows_rejected / self.rows_read if self.rows_read else 0.0

    @property
    def over_threshold(self) -> bool:
        return self.reject_rate > self.max_reject_rate

    @property
    def exit_status(self) -> int:
        """0 when every file was read and rejects stayed under the threshold, else 1."""
        return 1 if (self.failed or self.over_threshold) else 0

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def summary(self) -> str:
        """A human-readable summary: per file rows read / written / rejected, first reasons."""
        lines = [f"ingest into {self.out}:"]
        if self.selection:
            lines.append(f"selection: {self.selection} ({self.rows_skipped:,} rows outside it, not written)")
        lines.extend(f"note: {n}" for n in self.notes)
        for f in self.files:
            if f.status in ("skipped", "duplicate"):
                why = ("already ingested" if f.status == "skipped"
                       else "the same content as another input of this run")
                lines.append(f"  {f.path}: skipped, {why}")
                continue
            w = sum(f.rows_written.values())
            extra = f", {f.rows_deduplicated:,} deduplicated" if f.rows_deduplicated else ""
            extra += f", {f.rows_skipped:,} outside the selection" if f.rows_skipped else ""
            lines.append(
                f"  {f.path}: {f.status}; {f.rows_read:,} read, {w:,} written, {f.rows_rejected:,} rejected{extra}"
            )
            if f.error:
                lines.append(f"    error: {f.error}")
            for r in f.first_reasons[:3]:
                lines.append(f"    reject {r}")
            if f.rejects_file:
                lines.append(f"    rejects: {self.out / f.rejects_file}")
        w = sum(self.rows_written.values())
        lines.append(
            f"total: {self.rows_read:,} read, {w:,} written, {self.rows_rejected:,} rejected "
            f"({self.reject_rate:.4%}; threshold {self.max_reject_rate:.4%}) in {self.seconds:.1f} s"
        )
        for t, n in sorted(self.rows_written.items()):
            lines.append(f"  {t}: {n:,} rows")
        for wmsg in self.warnings:
            lines.append(f"warning: {wmsg}")
        if self.failed:
            lines.append(f"FAILED: {len(self.failed)} input(s) failed (see 'error:' above)")
        if self.over_threshold:
            lines.append("FAILED: the reject rate is over the threshold (--max-reject-rate)")
        if self.layout_note:
            lines.append(self.layout_note)
        if self.complete:
            lines.append("dataset complete: true")
        else:
            lines.append(
                "dataset unfinished: analyses refuse it until every input is done; "
                "fix the failed input(s) and re-run the same command to retry them"
            )
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------
def _hash(s: SourceFile, algorithm: str) -> tuple[SourceFile, str]:
    """(source, the hash of its content); an unreadable file gets a key from its path and a problem."""
    try:
        return s, content_hash.file_hash(s.path, algorithm)
    except OSError as e:
        return replace(s, problem=s.problem or f"{s.path}: cannot read: {e.strerror or e}"), ""


def _known_inputs(manifest: dict[str, Any]) -> dict[tuple[str, int, int], str]:
    """``(path, size, mtime_ns) -> content hash`` of the inputs a manifest records as done."""
    return {(inp["path"], int(inp["size"]), int(inp["mtime_ns"])): key for key, inp in manifest["inputs"].items()
            if inp.get("status") == "done" and inp.get("mtime_ns") is not None and inp.get("size") is not None}


def _identify(
    s: SourceFile, known: dict[tuple[str, int, int], str], algorithm: str, defer: set[int]
) -> tuple[SourceFile, str | None]:
    """(source, its content key): the recorded hash of an input already ingested from the same
    path with the same size and modification time (not read again); None (hash it while it is
    read) for a readable input whose size is in ``defer``; else :func:`_hash`."""
    try:
        st = os.stat(s.path)
    except OSError:
        return _hash(s, algorithm)
    key = known.get((str(s.path), st.st_size, st.st_mtime_ns))
    if key is not None and s.problem is None:
        return s, key
    if s.problem is None and st.st_size in defer:
        return s, None
    return _hash(s, algorithm)


def _sizes_to_defer(srcs: list[SourceFile], manifest: dict[str, Any]) -> set[int]:
    """File sizes whose inputs may be hashed while they are read instead of before.

    Files of different sizes differ, so an input whose size no other input of this run and no
    input the manifest records has cannot be a duplicate, a moved file or a retry: nothing
    needs its hash before it is read.  The others are hashed first, as before, so duplicates
    and already-ingested content are still found without parsing them."""
    sizes: dict[int, int] = {}
    for s in srcs:
        try:
            n = s.path.stat().st_size
        except OSError:
            continue
        sizes[n] = sizes.get(n, 0) + 1
    recorded = {int(inp["size"]) for inp in manifest["inputs"].values() if inp.get("size") is not None}
    return {n for n, k in sizes.items() if k == 1 and n not in recorded}


_LISTING_LINE = re.compile(r"^\s*(\d+)\s+(?:\S+\s+)?(\S+)\s*$")


def read_listing(path: str | os.PathLike[str]) -> dict[str, int]:
    """``file name -> size in bytes`` from a bucket listing (``gsutil ls -l`` / ``gcloud storage
    ls -l`` output: ``SIZE  DATE  gs://bucket/name`` lines; ``SIZE  NAME`` lines work too).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "ls.txt"
    >>> _ = p.write_text("  2048  2020-03-17T20:43:08Z  gs://clusterdata_2019_a/machine_events-000000000000.json.gz\\n"
    ...                  "TOTAL: 1 objects, 2048 bytes (2 KiB)\\n")
    >>> read_listing(p)
    {'machine_events-000000000000.json.gz': 2048}
    """
    out: dict[str, int] = {}
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        raise IngestUsageError(f"--listing {path}: cannot read: {e.strerror or e}") from None
    for line in text.splitlines():
        m = _LISTING_LINE.match(line)
        if m and not line.lstrip().startswith("TOTAL"):
            out[m.group(2).rstrip("/").rsplit("/", 1)[-1]] = int(m.group(1))
    if not out:
        raise IngestUsageError(f"--listing {path}: no 'SIZE [DATE] NAME' lines (expected `gsutil ls -l` output)")
    return out


def _check_listing(s: SourceFile, listing: dict[str, int], where: str, notes: list[str]) -> SourceFile:
    """``s``, failed without reading when its size disagrees with the listing's."""
    want = listing.get(s.path.name)
    if want is None:
        notes.append(f"{s.path}: not in the listing {where}; its size is not checked")
        return s
    have = s.path.stat().st_size
    if have < want:
        why = (f"{s.path}: truncated download: {have:,} of {want:,} bytes (the listing {where}); "
               "download it again and re-run")
    elif have > want:
        why = f"{s.path}: {have:,} bytes, but the listing {where} says {want:,}: not the listed object"
    else:
        return s
    return replace(s, problem=s.problem or why)


def _problem_key(s: SourceFile, sha: str) -> str:
    """Manifest key of an input that fails before it is read: from its path and content."""
    return hashlib.sha256(b"problem\0" + os.fsencode(s.path) + b"\0" + sha.encode()).hexdigest()


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
            for src, dst in moves:
                os.replace(src, dst)

        # unchanged content (a re-ingest with nothing new) leaves the file and its mtime alone
        write_json_atomic(self.path, self.m, before_replace=switch if (moves or gone) else None, if_changed=True)
        for d in sorted({dst.parent for _, dst in moves} | {f.parent for f in gone}):
            fsync_dir(d)
        self.writes += 1
        limit = os.environ.get(KILL_AFTER_MANIFESTS_ENV)
        if limit and self.writes >= int(limit):
            os.kill(os.getpid(), signal.SIGKILL)


def _resolve_progress(progress: Any) -> Progress | None:
    if progress is None or progress is False:
        return None
    if progress is True:
        return Progress()
    return progress  # type: ignore[no-any-return,unused-ignore]


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
    version = versions[0]
    if extra_manifest:
        clash = set(extra_manifest) & _RESERVED
        if clash:
            raise IngestUsageError(f"extra_manifest may not set reserved keys {sorted(clash)}")
    if not 0 <= max_reject_rate <= 1:
        raise IngestUsageError(f"max_reject_rate must be within 0..1, got {max_reject_rate}")
    if layout not in LAYOUTS:
        raise IngestUsageError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")

    out = Path(out)
    if out.exists() and not out.is_dir():  # mkdir's "File exists" would not say what is wrong
        raise IngestUsageError(f"{out}: exists and is not a folder (a dataset is a folder)")
    out.mkdir(parents=True, exist_ok=True)
    lock = open(out / LOCK_FILE, "a+")
    try:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IngestUsageError(f"{out}: another ingest is writing into this dataset") from None
        report = _run(
            srcs, version, out, cell, tier_map, max_reject_rate, workers, prog, extra_manifest, opts, t0, notes, prefer,
            (sample, time_from, time_to), listing,
        )
    finally:
        lock.close()
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
    report.layout_note = (f"laid out by instance and machine: {rep.buckets} bucket(s) in {rep.seconds:.1f} s "
                          "(`--layout flat` skips this)")
    report.seconds += rep.seconds
    return report


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


def _run(
    srcs: list[SourceFile],
    version: str,
    out: Path,
    cell: str | None,
    tier_map: str | None,
    max_reject_rate: float,
    workers: int | None,
    prog: Progress | None,
    extra_manifest: dict[str, Any] | None,
    opts: ReadOptions,
    t0: float,
    notes: list[str],
    prefer: str | None,
    wanted: tuple[Any, Any, Any] = (None, None, None),
    listing: str | os.PathLike[str] | None = None,
) -> IngestReport:
    warnings: list[str] = []

    def warn(msg: str) -> None:
        warnings.append(msg)
        log.warning(msg)
        if prog is not None:
            prog.warn(msg)

    m = _load_manifest(out)
    if m is None:
        m = new_manifest(content_hash=content_hash.default_algorithm())
    try:
        algorithm = m["content_hash"] = content_hash.of_manifest(m)
        content_hash.hasher(algorithm)  # can this Python compute it?
    except content_hash.MissingHashError as e:
        raise IngestUsageError(f"{out}: {e}") from None
    if m.get("trace_version") not in (None, version):
        raise IngestUsageError(f"{out} holds a {m['trace_version']} dataset; these inputs are {version}")
    if cell is not None and m.get("cell") not in (None, cell):
        raise IngestUsageError(f"{out} holds cell {m['cell']!r}, not {cell!r}")
    tm_name = tier_map or (m.get("tier_map") or {}).get("name") or DEFAULT_TIER_MAP[version]
    tm = get_tier_map(tm_name)
    if tier_map is not None and m.get("tier_map") and m["tier_map"].get("name") != tier_map:
        raise IngestUsageError(f"{out} was ingested with tier map {m['tier_map'].get('name')!r}, not {tier_map!r}")
    try:
        srcs, skipped = resolve_twins(srcs, m["inputs"].values(), prefer)
    except TwinError as e:
        raise IngestUsageError(str(e)) from None
    notes.extend(skipped)
    try:
        select = IngestSelection.parse(*wanted, trace_version=version, cell=cell or m.get("cell"))
    except SelectionSpecError as e:
        raise IngestUsageError(str(e)) from None
    if m["inputs"] and not IngestSelection.same(m.get("selection"), select):
        was = (m.get("selection") or {}).get("text") or "everything (no selection)"
        now = select.describe() if select is not None else "everything (no selection)"
        raise IngestUsageError(f"{out} was ingested with selection {was!r}; this run asks for {now!r}. A dataset "
                               "holds one selection: give the same --sample / --from / --to, or use a new folder")
    if select is not None:
        m["selection"] = select.to_json()
        opts = replace(opts, select=select)
    m["trace_version"] = version
    if cell is not None:
        m["cell"] = cell
    m["tier_map"] = tm.to_json()
    if extra_manifest:
        m.update(extra_manifest)

    removed = _remove_unlisted(out, m)
    if removed:
        log.info("removed %d leftover file(s) of an interrupted ingest", len(removed))

    if listing is not None:
        sizes = read_listing(listing)
        srcs = [_check_listing(s, sizes, str(listing), notes) for s in srcs]
    # Hash inputs (threads: both hashes release the GIL); an input already done with the same path,
    # size and modification time keeps its recorded hash without being read again.
    known = _known_inputs(m)
    if (workers == 1 or len(srcs) == 1) and any(
        s.format == "v3-json" and s.source_table == "instance_usage" and s.problem is None for s in srcs
    ):
        _fast_usage.preload()  # read in this process: load the compiled JSON reader meanwhile
    defer = _sizes_to_defer(srcs, m)
    with cf.ThreadPoolExecutor(max_workers=min(4, len(srcs))) as tp:
        hashed = list(tp.map(lambda s: _identify(s, known, algorithm, defer), srcs))
    srcs = [s for s, _ in hashed]
    keys = [h for _, h in hashed]

    reports: dict[int, FileReport] = {}
    todo: list[tuple[int, SourceFile, str | None]] = []
    seen: dict[str, str] = {}
    by_path = {inp.get("path"): k for k, inp in m["inputs"].items()}
    stale: list[str] = []
    for i, (s, sha) in enumerate(zip(srcs, keys, strict=True)):
        if s.problem is not None:
            # Fails before reading (empty, unreadable, another format): one failure per file, even
            # when two such files have the same bytes (two 0-byte downloads).
            sha = _problem_key(s, sha or "")
        if sha is not None:  # None: hashed while it is read, a size no other input has (_sizes_to_defer)
            if sha in seen:
                warn(f"{s.path} has the same content as {seen[sha]} ({algorithm} {sha[:16]}...); ingested once")
                reports[i] = FileReport(str(s.path), sha, "duplicate", s.format, s.source_table)
                continue
            seen[sha] = str(s.path)
            prev = m["inputs"].get(sha)
            if prev is not None and prev.get("status") == "done":
                reports[i] = FileReport(str(s.path), sha, "skipped", s.format, s.source_table)
                continue
            if prev is not None:
                stale.append(sha)  # failed before: redo from scratch
        old = by_path.get(str(s.path))
        if old is not None and old != sha and old in m["inputs"]:
            if m["inputs"][old].get("status") == "done":
                new = "new size" if sha is None else f"new {algorithm} {sha[:16]}..."
                warn(f"{s.path} changed since it was ingested ({new}); its new content is added as a new input")
            else:
                stale.append(old)
        todo.append((i, s, sha))
    for key, inp in m["inputs"].items():
        if inp.get("status") != "done" and key not in stale and not Path(inp.get("path", "")).exists():
            stale.append(key)  # a failed input whose file is gone: the user removed it
            notes.append(f"{inp.get('path')}: forgotten, a failed input whose file no longer exists")

    # Forget failed attempts: their files go in the same step as the manifest that drops them.
    drop: list[str] = []
    for key in stale:
        inp = m["inputs"].pop(key, None)
        if inp is not None:
            drop.extend(inp.get("outputs") or [])
            if inp.get("rejects_file"):
                drop.append(inp["rejects_file"])
    if todo or stale or drop:  # work to do: the dataset is incomplete until it is done
        m["complete"] = False
    mw = _ManifestWriter(out / MANIFEST, m)
    mw.write(remove=[out / rel for rel in drop])

    if prog is not None:
        prog.start(len(todo), sum(s.path.stat().st_size for _, s, _ in todo))

    def record(i: int, res: FileResult) -> None:
        if res.status == "done" and res.rows_rejected > max_reject_rate * res.rows_read:
            res.status = "failed"
            res.error = (
                f"{res.path}: {res.rows_rejected:,} of {res.rows_read:,} rows rejected "
                f"({res.rows_rejected / res.rows_read:.2%}), over --max-reject-rate {max_reject_rate:.2%}"
            )
        if res.content_hash in m["inputs"]:  # hashed while read, and changed since it was sized
            warn(f"{res.path} has the same content as {m['inputs'][res.content_hash].get('path')} "
                 f"({algorithm} {res.content_hash[:16]}...) after all; ingested once")
            reports[i] = FileReport(res.path, res.content_hash, "duplicate", res.format, res.source_table)
            return  # its staged files are removed with the staging folder
        m["inputs"][res.content_hash] = res.manifest_entry()
        done = res.outputs + ([res.rejects_file] if res.rejects_file else [])
        mw.write(publish=[(out / STAGING_DIR / rel, out / rel) for rel in done])
        reports[i] = FileReport(
            path=res.path,
            content_hash=res.content_hash,
            status=res.status,
            format=res.format,
            source_table=res.source_table,
            rows_read=res.rows_read,
            rows_written=dict(res.rows_written),
            rows_rejected=res.rows_rejected,
            rows_deduplicated=res.rows_deduplicated,
            rows_skipped=res.rows_skipped,
            rejects_file=res.rejects_file,
            first_reasons=list(res.first_reasons),
            error=res.error,
            seconds=res.seconds,
            bytes=res.size,
        )
        if prog is not None:
            prog.file_done(res)

    nworkers = workers if workers is not None else usable_cores()
    if nworkers < 1:
        raise IngestUsageError(f"workers must be >= 1, got {nworkers}")
    todo.sort(key=lambda t: -t[1].path.stat().st_size)  # big files first balances the pool
    if nworkers == 1 or len(todo) <= 1:
        for i, s, sha in todo:
            res = ingest_file(s, sha, out, opts, progress=prog.update if prog is not None else None,
                              algorithm=algorithm)
            record(i, res)
    else:
        _run_pool(todo, out, opts, min(nworkers, len(todo)), prog, record, algorithm)

    m["complete"] = bool(m["inputs"]) and all(inp.get("status") == "done" for inp in m["inputs"].values())
    mw.write()
    if (out / STAGING_DIR).exists():  # all recorded files are published: what is left is junk
        shutil.rmtree(out / STAGING_DIR, ignore_errors=True)
    if prog is not None:
        prog.close()

    files = [reports[i] for i in sorted(reports)]
    ran = [f for f in files if f.status in ("done", "failed")]
    written: dict[str, int] = {}
    for f in ran:
        for t, n in f.rows_written.items():
            written[t] = written.get(t, 0) + n
    return IngestReport(
        out=out,
        files=files,
        rows_read=sum(f.rows_read for f in ran),
        rows_written=written,
        rows_rejected=sum(f.rows_rejected for f in ran),
        rows_deduplicated=sum(f.rows_deduplicated for f in ran),
        max_reject_rate=max_reject_rate,
        complete=m["complete"],
        seconds=time.perf_counter() - t0,
        warnings=warnings,
        notes=notes,
        selection=select.describe() if select is not None else None,
        rows_skipped=sum(f.rows_skipped for f in ran),
    )


def _run_pool(
    todo: list[tuple[int, SourceFile, str | None]],
    out: Path,
    opts: ReadOptions,
    n: int,
    prog: Progress | None,
    record: Any,
    algorithm: str,
) -> None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with cf.ProcessPoolExecutor(
        max_workers=n, mp_context=ctx, initializer=init_worker, initargs=(q, os.getpid())
    ) as pool:
        futs = {pool.submit(ingest_file_task, s, sha, str(out), opts, algorithm): (i, s, sha) for i, s, sha in todo}
        pending = set(futs)
        while pending:
            done, pending = cf.wait(pending, timeout=0.2, return_when=cf.FIRST_COMPLETED)
            _drain(q, prog)
            for fut in done:
                i, s, sha = futs[fut]
                try:
                    res = fut.result()
                except Exception as e:  # a worker died (OOM, signal) or could not start
                    if sha is None:
                        _, sha = _hash(s, algorithm)
                        sha = sha or _problem_key(s, "")
                    res = FileResult(sha, str(s.path), s.path.stat().st_size, s.format, s.source_table, s.trace_version)
                    res.error = f"worker failed: {type(e).__name__}: {e}"
                    # Its parts (if any) are not listed; the next run removes them.
                record(i, res)
        _drain(q, prog)
    q.close()
    q.join_thread()


def _drain(q: Any, prog: Progress | None) -> None:
    while True:
        try:
            key, rows, done = q.get_nowait()
        except (queue_mod.Empty, OSError, ValueError):
            return
        if prog is not None:
            prog.update(key, rows, done)
