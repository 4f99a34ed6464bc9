"""Run analyses and write their results folder: :func:`analyze` (``gpuclust.analyze``, the
``gpuclust analyze`` command) and :func:`analyze_cells` (``--cells``).

The engine computes (:func:`gpuclust.engine.run`); this module checks the inputs first
(:func:`gpuclust.engine.run_info.prepare`), opens the results folder
(:class:`gpuclust.report.ResultsFolder`), has the engine write into it (parted tables; on a
distributed scheduler each analysis' tables, :class:`gpuclust.report.writer.AnalysisWriter`), writes
the rest (tables, plots, ``summary.txt``, ``_run.json``) and swaps the folder into place.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuclust._lazy import pandas as pd
from gpuclust.engine import run, timing
from gpuclust.engine.cells import combine, find_cells
from gpuclust.engine.timing import phase

__all__ = ["analyze", "analyze_cells"]


def analyze(
    dataset,
    names,
    *,
    out=None,
    backend="cpu",
    scheduler=None,
    partitions=1,
    tier_map=None,
    mode=None,
    plots=True,
    workers=None,
    progress=None,
    note=None,
    time_from=None,
    time_to=None,
    cells=None,
    memory_limit=None,
    tables="pandas",
):
    """Run registered analyses by name, optionally writing results to ``out``.

    Before anything is computed: the dataset is checked against what the analyses need
    (:func:`gpuclust.engine.checks.preflight`: a missing required table raises
    :class:`~gpuclust.engine.checks.MissingTableError`), the backend is resolved, and the output
    folder is checked and its temporary sibling created (:class:`gpuclust.report.ResultsFolder`:
    a bad path raises :class:`gpuclust.report.OutputError`).

    Parameters
    ----------
    dataset
        Dataset path, :class:`~gpuclust.dataset.Dataset` or dict of canonical Arrow tables.
    names
        Analysis names (``gpuclust.analyses.names()``) or analysis instances.
    out
        Folder for ``<analysis>/<table>.parquet``, ``summary.txt``, plots and ``_run.json``,
        written as a whole (an earlier run's folder is replaced); nothing is written when ``None``.
    tier_map, mode
        Options passed to every analysis that declares them.
    backend, scheduler, partitions, workers, progress, memory_limit
        As :func:`run`.
    note
        Called with each note / warning line (optional tables missing, a tier map of the other
        trace version, what ``backend="auto"`` chose); default: the ``gpuclust`` logger.
    time_from, time_to
        A time selection ``[time_from, time_to)`` (as :func:`run`); resolved (and checked)
        before anything is computed; ``_run.json`` records it under ``selection`` with the
        row groups and compressed bytes read.
    tables
        The kind of the returned tables, as :func:`run` (``"native"``: as the analyses built
        them; the command line asks for that, as it does not use them).  With ``out`` on a
        distributed scheduler (``"local:N"``, ``"cuda"``, an address, a client), ``"native"``
        has the workers that finalize the analyses write their tables into ``out`` and returns
        handles on the files (:class:`gpuclust.report.writer.WrittenTable`; a parted table's
        :class:`gpuclust.parted.PartedTable`), so the client never holds the result rows.
    cells
        ``"a,b"``, a list of cells or ``"all"``: ``dataset`` is a folder holding one dataset per
        cell and the results are keyed by cell (:func:`gpuclust.report.analyze.analyze_cells`).

    Returns
    -------
    dict
        As :func:`run`; with ``out``, the parted tables (overcommit's ``machine``) are
        :class:`gpuclust.parted.PartedTable` in ``out`` (read them by batches or whole).

    Examples
    --------
    >>> res = analyze("cell", ["machine-shapes"], out="results")   # doctest: +SKIP
    """
    from gpuclust.tables import check_kind, convert

    check_kind(tables)  # before anything is computed
    with timing.clock():  # the run's phases, in _run.json
        if cells is not None:  # several cells, one dataset each (--cells)
            res = analyze_cells(
                dataset,
                names,
                cells=cells,
                out=out,
                backend=backend,
                scheduler=scheduler,
                partitions=partitions,
                tier_map=tier_map,
                mode=mode,
                plots=plots,
                workers=workers,
                progress=progress,
                note=note,
                time_from=time_from,
                time_to=time_to,
                memory_limit=memory_limit,
            )
            return convert(res, tables)
        from gpuclust.engine import memory as _memory
        from gpuclust.engine import selection as _selection

        with phase("prepare"):
            plan, src = _prepared(dataset, names, backend, tier_map, mode, note, time_from, time_to)
            folder = _open_folder(out)
        try:
            with phase("prepare"):
                limit = _memory.parse_size(memory_limit) or _memory.default_limit()
                writer = _worker_writer(folder, tables, plots, plan, src)
            res = run(
                src,
                plan.analyses,
                backend=plan.backend,
                partitions=partitions,
                scheduler=scheduler,
                workers=workers,
                progress=progress,
                memory_limit=limit,
                parts_dir=None if folder is None else folder.tmp,
                tables="native",
                writer=writer,
            )
            if folder is not None:
                run_info = plan.info(
                    scheduler=scheduler,
                    partitions=partitions,
                    workers=workers,
                    memory_limit=limit,
                    **_selection.run_info(src),
                )
                res = _write_results(folder, res, plan, plots, run_info, writer, progress, out)
        finally:
            if folder is not None:
                folder.abort()
    return convert(res, tables)


def _prepared(dataset, names, backend, tier_map, mode, note, time_from, time_to):
    """The checked run plan of ``dataset`` and its source, the time selection ``[time_from, time_to)`` attached."""
    from gpuclust.engine import selection as _selection
    from gpuclust.engine.run_info import prepare

    plan = prepare(dataset, names, backend=backend, tier_map=tier_map, mode=mode, note=note)
    src, plan.analyses = _selection.attach(plan.source, plan.analyses, time_from, time_to)  # --from/--to
    return plan, src


def _open_folder(out):
    """The results folder ``out`` opened (its temporary sibling created), ``None`` without ``out``."""
    if out is None:
        return None
    from gpuclust.report import ResultsFolder

    return ResultsFolder(out).open()


def _worker_writer(folder, tables, plots, plan, src):
    """The writer the workers finalizing on a distributed scheduler write ``folder``'s tables with, or ``None``."""
    # a caller who takes the tables as finalized (the command line) gets, on a distributed
    # scheduler, handles on the files the workers wrote (gpuclust.report.writer): the client
    # never holds the result rows
    if folder is None or tables != "native":
        return None
    return folder.writer(
        plots=plots, run_info=plan.info(), selection=_plot_selection(src, plan.analyses) if plots else None
    )


def _write_results(folder, res, plan, plots, run_info, writer, progress, out):
    """Write the run's results into ``folder`` (opened at ``out``) and swap it into place; ``res`` relocated there."""
    from gpuclust.parted import relocated

    tmp = folder.tmp
    folder.write(
        res, plan.by_key(), plots=plots, run_info=run_info, rendered=None if writer is None else writer.rendered
    )
    final = folder.commit()
    res = relocated(res, tmp, final)
    if progress is not None:
        progress.phase(f"wrote {out}")
    return res


def _plot_selection(src, analyses):
    """A time selection as ``_run.json`` records it, for what an empty plot says (see
    :func:`gpuclust.report.sections.empty_reason`) where the workers plot: the selection and the
    span of each table the analyses stream (known before the run, unlike its read statistics);
    ``None`` without a selection."""
    from gpuclust.engine import selection as _selection

    if not isinstance(src, _selection.SelectedSource):
        return None
    spans = {t: _selection.data_span(src.inner, t) for t in sorted({a.table for a in analyses})}
    return {**src.selection.to_json(), "data_span_us": spans}


#: Sub-folder of the temporary results folder where each cell's run writes its parted tables.
_STAGING = ".cells"


class _CellSummaries:
    """Stands for one result key in the report: its summary is each cell's summary of that cell's
    own result, in turn (``by_cell``: cell -> (analysis, its tables))."""

    def __init__(self, by_cell: dict[str, tuple[Any, Mapping[str, Any]]]):
        self.by_cell = by_cell
        first = next(iter(by_cell.values()))[0]
        self.name, self.label, self.parted = first.name, first.label, first.parted

    def summary(self, tables: Mapping[str, Any]) -> str:
        return "\n".join(
            f"cell {cell}: " + textwrap.indent(a.summary(own), "  ").lstrip() for cell, (a, own) in self.by_cell.items()
        )


def analyze_cells(
    folder: str | Path,
    names: Any,
    *,
    cells: str | Sequence[str] = "all",
    out: Any = None,
    backend: Any = "cpu",
    scheduler: Any = None,
    partitions: Any = 1,
    tier_map: str | None = None,
    mode: str | None = None,
    plots: bool = True,
    workers: int | None = None,
    progress: Any = None,
    note: Callable[[str], None] | None = None,
    time_from: Any = None,
    time_to: Any = None,
    memory_limit: Any = None,
) -> dict[str, dict[str, pd.DataFrame]]:
    """:func:`analyze` over the datasets of ``cells`` in ``folder`` (see
    :func:`find_cells`): every cell is checked (and its selection resolved) before anything is
    computed; results have a leading ``cell`` column; ``summary.txt`` has each cell's summary
    lines; ``_run.json`` records each cell's dataset and selection.  No plots are drawn (the
    per-analysis plots show one cell; run a cell alone for its plots)."""
    import logging

    from gpuclust.parted import relocated

    say = note if note is not None else logging.getLogger("gpuclust").warning
    prepared = _prepare_cells(find_cells(folder, cells), names, backend, tier_map, mode, say, time_from, time_to)
    if plots:
        say("note: --cells draws no plots (each plot shows one cell; run a cell alone for its plots)")
    folder_out = _open_folder(out)
    tmp: Path | None = None  # the results folder's temporary folder
    if folder_out is not None:
        tmp = folder_out.tmp
        assert tmp is not None  # open() creates it
    try:
        per_cell = {}
        for cell, (plan, src) in prepared.items():
            if progress is not None:
                progress.phase(f"cell {cell}: {plan.source.path}")
            # with a results folder, each cell's parted tables stay parts in its staging area
            staging = None if tmp is None else tmp / _STAGING / cell
            per_cell[cell] = run(
                src,
                plan.analyses,
                backend=plan.backend,
                partitions=partitions,
                scheduler=scheduler,
                workers=workers,
                progress=progress,
                memory_limit=memory_limit,
                parts_dir=staging,
            )
        res = combine(per_cell, tmp)
        if folder_out is not None:
            assert tmp is not None
            shims, info = _cells_report(folder, prepared, per_cell, list(res), scheduler, partitions, workers)
            folder_out.write(res, shims, plots=False, run_info=info)
            shutil.rmtree(tmp / _STAGING)  # the cells' own parts, copied into the results above
            final = folder_out.commit()
            res = relocated(res, tmp, final)
            if progress is not None:
                progress.phase(f"wrote {out}")
    finally:
        if folder_out is not None:
            folder_out.abort()
    return res


def _prepare_cells(
    paths: dict[str, Path],
    names: Any,
    backend: Any,
    tier_map: str | None,
    mode: str | None,
    say: Callable[[str], None],
    time_from: Any,
    time_to: Any,
) -> dict[str, tuple[Any, Any]]:
    """Per cell: its checked run plan and source (see :func:`_prepared`), its notes told as the cell's."""
    prepared = {}
    for cell, path in paths.items():

        def cell_note(m: str, c: str = cell) -> None:
            say(f"cell {c}: {m}")

        prepared[cell] = _prepared(path, names, backend, tier_map, mode, cell_note, time_from, time_to)
    return prepared


def _cells_report(
    folder: str | Path,
    prepared: dict[str, tuple[Any, Any]],
    per_cell: dict[str, dict[str, Any]],
    keys: list[str],
    scheduler: Any,
    partitions: Any,
    workers: int | None,
) -> tuple[dict[str, _CellSummaries], dict[str, Any]]:
    """What the cells' results folder is written with: per result key, its cells' summaries; the
    ``_run.json`` record (each cell's dataset and selection)."""
    from gpuclust.engine import selection as _selection

    first_plan = next(iter(prepared.values()))[0]
    shims = {
        k: _CellSummaries({c: (pl.analyses[j], per_cell[c][k]) for c, (pl, _) in prepared.items()})
        for j, k in enumerate(keys)
    }
    info = first_plan.info(scheduler=scheduler, partitions=partitions, workers=workers)
    info["dataset"] = str(Path(folder).absolute())
    info["cells"] = {
        c: {
            "dataset": str(pl.source.path.absolute()),
            "trace_version": pl.source.trace_version,
            "notes": pl.notes,
            **_selection.run_info(src),
        }
        for c, (pl, src) in prepared.items()
    }
    return shims, info
