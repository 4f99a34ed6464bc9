"""The engine: partitions -> arrays on the chosen backend -> partials -> merge tree -> finalize.

Imports neither dask nor CuPy at import time (dask is imported when a scheduler is used, CuPy
when the gpu backend is).
"""

from __future__ import annotations

from gpuclust.engine.local import run
from gpuclust.engine.partition import PartitionSpec, TableSource, plan_partitions
from gpuclust.engine.reading import read_partition

__all__ = ["PartitionSpec", "TableSource", "analyze", "plan_partitions", "read_partition", "run"]


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
        cell and the results are keyed by cell (:func:`gpuclust.engine.cells.analyze_cells`).

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
    if cells is not None:  # several cells, one dataset each (--cells)
        from gpuclust.engine.cells import analyze_cells

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
    from gpuclust.engine.run_info import prepare
    from gpuclust.parted import relocated

    plan = prepare(dataset, names, backend=backend, tier_map=tier_map, mode=mode, note=note)
    src, plan.analyses = _selection.attach(plan.source, plan.analyses, time_from, time_to)  # --from/--to
    folder = None
    if out is not None:
        from gpuclust.report import ResultsFolder

        folder = ResultsFolder(out).open()
        folder_tmp = folder.tmp
    try:
        limit = _memory.parse_size(memory_limit) or _memory.default_limit()
        # a caller who takes the tables as finalized (the command line) gets, on a distributed
        # scheduler, handles on the files the workers wrote (gpuclust.report.writer): the client
        # never holds the result rows
        writer = None
        if folder is not None and tables == "native":
            writer = folder.writer(
                plots=plots, run_info=plan.info(), selection=_plot_selection(src, plan.analyses) if plots else None
            )
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
            folder.write(
                res,
                plan.by_key(),
                plots=plots,
                run_info=plan.info(
                    scheduler=scheduler,
                    partitions=partitions,
                    workers=workers,
                    memory_limit=limit,
                    **_selection.run_info(src),
                ),
                rendered=None if writer is None else writer.rendered,
            )
            final = folder.commit()
            res = relocated(res, folder_tmp, final)
            if progress is not None:
                progress.phase(f"wrote {out}")
    finally:
        if folder is not None:
            folder.abort()
    return convert(res, tables)


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
