"""One ingest run into a locked dataset folder (:func:`_run`, called by
:func:`gpuclust.ingest.api.ingest`): settle the manifest with the request, identify the inputs,
decide which to read, read them (in this process or a pool of worker processes) and record each
one in the manifest as it is done.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuclust._parallel import usable_cores
from gpuclust.dataset import MANIFEST, new_manifest
from gpuclust.ingest import content_hash
from gpuclust.ingest.base import ReadOptions, SourceFile
from gpuclust.ingest.inputs import _hash, _identify_inputs, _problem_key
from gpuclust.ingest.manifest import _load_manifest, _ManifestWriter, _remove_unlisted
from gpuclust.ingest.outcome import FileReport, IngestReport, IngestUsageError
from gpuclust.ingest.progress import Progress
from gpuclust.ingest.sampling import IngestSelection, SelectionSpecError
from gpuclust.ingest.twins import TwinError, resolve_twins
from gpuclust.ingest.writer import STAGING_DIR, FileResult, ingest_file, ingest_file_task, init_worker
from gpuclust.schema import DEFAULT_TIER_MAP
from gpuclust.schema import tier_map as get_tier_map

log = logging.getLogger("gpuclust.ingest")

#: A list of (index among the sources, source, content key or None: hashed while it is read).
_Todo = list[tuple[int, SourceFile, str | None]]


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

    m, algorithm, srcs, select, opts = _settle_manifest(
        srcs, version, out, cell, tier_map, extra_manifest, opts, notes, prefer, wanted
    )
    removed = _remove_unlisted(out, m)
    if removed:
        log.info("removed %d leftover file(s) of an interrupted ingest", len(removed))

    srcs, keys = _identify_inputs(srcs, m, algorithm, workers, listing, notes)
    reports: dict[int, FileReport] = {}
    todo, stale = _plan(srcs, keys, m, algorithm, reports, warn, notes)
    mw = _forget(out, m, todo, stale)

    if prog is not None:
        prog.start(len(todo), sum(s.path.stat().st_size for _, s, _ in todo))
    record = _recorder(out, m, mw, reports, max_reject_rate, algorithm, warn, prog)
    _read_all(todo, out, opts, workers, prog, record, algorithm)

    m["complete"] = bool(m["inputs"]) and all(inp.get("status") == "done" for inp in m["inputs"].values())
    mw.write()
    if (out / STAGING_DIR).exists():  # all recorded files are published: what is left is junk
        shutil.rmtree(out / STAGING_DIR, ignore_errors=True)
    if prog is not None:
        prog.close()
    return _report(out, reports, m, max_reject_rate, t0, warnings, notes, select)


def _settle_manifest(
    srcs: list[SourceFile],
    version: str,
    out: Path,
    cell: str | None,
    tier_map: str | None,
    extra_manifest: dict[str, Any] | None,
    opts: ReadOptions,
    notes: list[str],
    prefer: str | None,
    wanted: tuple[Any, Any, Any],
) -> tuple[dict[str, Any], str, list[SourceFile], IngestSelection | None, ReadOptions]:
    """The dataset's manifest (loaded or new) checked against the request and updated with it:
    (manifest, hash algorithm, sources with twins resolved, selection, reader options)."""
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
        raise IngestUsageError(
            f"{out} was ingested with selection {was!r}; this run asks for {now!r}. A dataset "
            "holds one selection: give the same --sample / --from / --to, or use a new folder"
        )
    if select is not None:
        m["selection"] = select.to_json()
        opts = replace(opts, select=select)
    m["trace_version"] = version
    if cell is not None:
        m["cell"] = cell
    m["tier_map"] = tm.to_json()
    if extra_manifest:
        m.update(extra_manifest)
    return m, algorithm, srcs, select, opts


def _plan(
    srcs: list[SourceFile],
    keys: list[str | None],
    m: dict[str, Any],
    algorithm: str,
    reports: dict[int, FileReport],
    warn: Callable[[str], None],
    notes: list[str],
) -> tuple[_Todo, list[str]]:
    """(inputs to read, manifest keys of inputs to forget): duplicates and inputs already done
    get their report in ``reports`` and are not read; failed and changed inputs are redone."""
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
    return todo, stale


def _forget(out: Path, m: dict[str, Any], todo: _Todo, stale: list[str]) -> _ManifestWriter:
    """Drop the ``stale`` inputs from the manifest and write it: the writer for the rest of the run."""
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
    return mw


def _recorder(
    out: Path,
    m: dict[str, Any],
    mw: _ManifestWriter,
    reports: dict[int, FileReport],
    max_reject_rate: float,
    algorithm: str,
    warn: Callable[[str], None],
    prog: Progress | None,
) -> Callable[[int, FileResult], None]:
    """``record(i, result)``: publish an input's files with a manifest that lists it, and report it."""

    def record(i: int, res: FileResult) -> None:
        if res.status == "done" and res.rows_rejected > max_reject_rate * res.rows_read:
            res.status = "failed"
            res.error = (
                f"{res.path}: {res.rows_rejected:,} of {res.rows_read:,} rows rejected "
                f"({res.rows_rejected / res.rows_read:.2%}), over --max-reject-rate {max_reject_rate:.2%}"
            )
        if res.content_hash in m["inputs"]:  # hashed while read, and changed since it was sized
            warn(
                f"{res.path} has the same content as {m['inputs'][res.content_hash].get('path')} "
                f"({algorithm} {res.content_hash[:16]}...) after all; ingested once"
            )
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

    return record


#: Bytes on disk (compressed or not) of the inputs besides the biggest (the work a pool could
#: overlap with it) below which ingest without ``--workers`` reads in this process: a spawned
#: worker costs ~0.5-1 CPU-second to start and import (docs/user/ingest.md), about what one core
#: takes to read this much gzipped JSON.
POOL_MIN_BYTES = 32 * 2**20


def _read_all(
    todo: _Todo,
    out: Path,
    opts: ReadOptions,
    workers: int | None,
    prog: Progress | None,
    record: Callable[[int, FileResult], None],
    algorithm: str,
) -> None:
    """Read the inputs, biggest first: in this process, or in a pool of worker processes (by
    default only when the inputs besides the biggest hold more than :data:`POOL_MIN_BYTES`: a
    worker's start-up costs more than it saves on less, and the biggest input is one process's
    work either way)."""
    nworkers = workers if workers is not None else usable_cores()
    if nworkers < 1:
        raise IngestUsageError(f"workers must be >= 1, got {nworkers}")
    sized = sorted(((t[1].path.stat().st_size, t) for t in todo), key=lambda x: -x[0])
    todo[:] = [t for _, t in sized]  # big files first balances the pool
    small = workers is None and sum(n for n, _ in sized[1:]) <= POOL_MIN_BYTES
    if nworkers == 1 or len(todo) <= 1 or small:
        for i, s, sha in todo:
            res = ingest_file(
                s, sha, out, opts, progress=prog.update if prog is not None else None, algorithm=algorithm
            )
            record(i, res)
    else:
        _run_pool(todo, out, opts, min(nworkers, len(todo)), prog, record, algorithm)


def _report(
    out: Path,
    reports: dict[int, FileReport],
    m: dict[str, Any],
    max_reject_rate: float,
    t0: float,
    warnings: list[str],
    notes: list[str],
    select: IngestSelection | None,
) -> IngestReport:
    """The run's :class:`IngestReport`: its inputs in the order given, totals over those read."""
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
