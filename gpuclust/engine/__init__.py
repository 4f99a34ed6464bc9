"""The engine: partitions -> arrays on the chosen backend -> partials -> merge tree -> finalize.

Imports neither dask nor CuPy at import time (dask is imported when a scheduler is used, CuPy
when the gpu backend is).
"""

from __future__ import annotations

from gpuclust.engine.local import run
from gpuclust.engine.partition import PartitionSpec, TableSource, plan_partitions, read_partition

__all__ = ["PartitionSpec", "TableSource", "analyze", "plan_partitions", "read_partition", "run"]


def analyze(dataset, names, *, out=None, backend="cpu", scheduler=None, partitions=1, tier_map=None,
            mode=None, plots=True, workers=None, progress=None):
    """Run registered analyses by name, optionally writing results to ``out``.

    Parameters
    ----------
    dataset
        Dataset path, :class:`~gpuclust.dataset.Dataset` or dict of canonical Arrow tables.
    names
        Analysis names (``gpuclust.analyses.names()``) or analysis instances.
    out
        Folder for ``<analysis>/<table>.parquet``, ``summary.txt`` and plots; nothing is
        written when ``None``.
    tier_map, mode
        Options passed to every analysis that declares them.
    backend, scheduler, partitions, workers, progress
        As :func:`run`.

    Returns
    -------
    dict
        As :func:`run`.

    Examples
    --------
    >>> res = analyze("cell", ["machine-shapes"], out="results")   # doctest: +SKIP
    """
    from gpuclust.analyses.registry import create
    from gpuclust.engine.local import resolve_analyses, result_keys

    if isinstance(names, str):
        names = [names]
    opts = {"tier_map": tier_map, "mode": mode}
    ans = []
    for n in names:
        if isinstance(n, str):
            from gpuclust.analyses.registry import REGISTRY

            entry = REGISTRY.get(n)
            known = {o.name for o in entry.options} if entry else set()
            ans.append(create(n, **{k: v for k, v in opts.items() if k in known}))
        else:
            ans.append(n)
    ans = resolve_analyses(ans)
    res = run(dataset, ans, backend=backend, partitions=partitions, scheduler=scheduler, workers=workers,
              progress=progress)
    if out is not None:
        from gpuclust.report import write_results

        write_results(res, dict(zip(result_keys(ans), ans, strict=False)), out, plots=plots)
        if progress is not None:
            progress.phase(f"wrote {out}")
    return res
