"""Several cells in one run: each cell's analyses, result tables keyed by a leading ``cell`` column.

A multi-cell study ("Borg: the Next Generation" compares cells a-h) is a folder holding one
canonical dataset per cell::

    cells/
      a/manifest.json ...        (gpuclust ingest ... --out cells/a --cell a)
      b/manifest.json ...

A sub-folder's cell is its manifest's ``cell`` (else the folder name).  :func:`run_cells` runs the
same analyses over each cell (one :func:`gpuclust.engine.run` per cell, so every cell gets exactly
the result of a run over it alone) and concatenates each result table across cells, with the cell
as the first column; :func:`analyze_cells` is ``gpuclust analyze FOLDER NAME... --cells a,b``.

A time selection given as wall-clock is read in **each** cell's own time zone (``2019-05-02`` is
local midnight in every cell); trace time is the same instant everywhere.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["analyze_cells", "combine", "find_cells", "parse_cells", "run_cells"]


def parse_cells(cells: str | Sequence[str]) -> list[str] | None:
    """``"a,b"`` / ``["a", "b"]`` -> ``["a", "b"]``; ``"all"`` -> ``None`` (every cell found)."""
    items = [s.strip() for s in cells.split(",")] if isinstance(cells, str) else [str(c).strip() for c in cells]
    items = [s for s in items if s]
    if not items:
        raise ValueError("--cells: no cells given (a,b,... or all)")
    if items == ["all"]:
        return None
    if len(set(items)) != len(items):
        raise ValueError(f"--cells: a cell is named twice: {','.join(items)}")
    return items


def find_cells(folder: str | Path, cells: str | Sequence[str] = "all") -> dict[str, Path]:
    """``{cell: dataset folder}`` of the datasets directly inside ``folder``, in the order of
    ``cells`` (``"all"``: every cell found, sorted).  Errors (:class:`~gpuclust.dataset.DatasetError`)
    name what was found."""
    from gpuclust.dataset import MANIFEST, DatasetError

    folder = Path(folder)
    if (folder / MANIFEST).is_file():
        raise DatasetError(f"{folder} is one dataset; --cells needs a folder holding one dataset per cell "
                           "(e.g. cells/a, cells/b)")
    if not folder.is_dir():
        raise DatasetError(f"{folder}: no such folder")
    found: dict[str, Path] = {}
    for d in sorted(p for p in folder.iterdir() if p.is_dir()):
        if not (d / MANIFEST).is_file():
            continue
        try:
            cell = json.loads((d / MANIFEST).read_text()).get("cell") or d.name
        except (json.JSONDecodeError, AttributeError):
            raise DatasetError(f"{d / MANIFEST}: unreadable manifest") from None
        cell = str(cell)
        if cell in found:
            raise DatasetError(f"{folder}: cell {cell} is in two datasets, {found[cell].name} and {d.name}")
        found[cell] = d
    want = parse_cells(cells)
    if want is None:
        if not found:
            raise DatasetError(f"{folder}: no datasets (sub-folders with a {MANIFEST}) found")
        return dict(sorted(found.items()))
    missing = [c for c in want if c not in found]
    if missing:
        raise DatasetError(f"{folder}: no dataset for cell(s) {','.join(missing)}; found: "
                           f"{','.join(sorted(found)) or 'none'}")
    return {c: found[c] for c in want}


def combine(per_cell: Mapping[str, Mapping[str, Mapping[str, pd.DataFrame]]]) -> dict[str, dict[str, pd.DataFrame]]:
    """Concatenate each result table across cells with ``cell`` as its first column (a table that
    already has a ``cell`` column, e.g. ``by=cell``, gets the cell's name there)."""
    out: dict[str, dict[str, pd.DataFrame]] = {}
    for cell, res in per_cell.items():
        for key, tables in res.items():
            dst = out.setdefault(key, {})
            for tname, df in tables.items():
                d = df.drop(columns="cell") if "cell" in df.columns else df
                d = d.copy()
                d.insert(0, "cell", pd.Series([cell] * len(d), index=d.index, dtype=object))
                dst.setdefault(tname, []).append(d)  # type: ignore[arg-type]
    return {key: {t: pd.concat(parts, ignore_index=True) for t, parts in tables.items()}  # type: ignore[misc]
            for key, tables in out.items()}


def run_cells(sources: Mapping[str, Any], analyses: Any, **run_kw: Any) -> dict[str, dict[str, pd.DataFrame]]:
    """Run ``analyses`` over each cell's source (``{cell: dataset path / Dataset / tables}``) and
    :func:`combine` the results; ``run_kw`` as :func:`gpuclust.engine.run` (``time_from`` /
    ``time_to`` included).

    Examples
    --------
    >>> res = run_cells({"a": "cells/a", "b": "cells/b"}, ["cell-usage"])   # doctest: +SKIP
    >>> res["cell-usage"]["usage"].columns[0]                                 # doctest: +SKIP
    'cell'
    """
    from gpuclust.engine.local import run

    if not sources:
        raise ValueError("no cells given")
    return combine({str(c): run(src, analyses, **run_kw) for c, src in sources.items()})


class _CellSummaries:
    """Stands for one result key in the report: its summary is each cell's summary, in turn."""

    def __init__(self, by_cell: dict[str, Any]):
        self.by_cell = by_cell
        first = next(iter(by_cell.values()))
        self.name, self.label, self.parted = first.name, first.label, first.parted

    def summary(self, tables: Mapping[str, pd.DataFrame]) -> str:
        parts = []
        for cell, a in self.by_cell.items():
            sub = {t: df[df["cell"] == cell].drop(columns="cell").reset_index(drop=True) for t, df in tables.items()}
            parts.append(f"cell {cell}: " + textwrap.indent(a.summary(sub), "  ").lstrip())
        return "\n".join(parts)


def analyze_cells(folder: str | Path, names: Any, *, cells: str | Sequence[str] = "all", out: Any = None,
                  backend: Any = "cpu", scheduler: Any = None, partitions: Any = 1, tier_map: str | None = None,
                  mode: str | None = None, plots: bool = True, workers: int | None = None, progress: Any = None,
                  note: Callable[[str], None] | None = None, time_from: Any = None,
                  time_to: Any = None, memory_limit: Any = None) -> dict[str, dict[str, pd.DataFrame]]:
    """:func:`gpuclust.engine.analyze` over the datasets of ``cells`` in ``folder`` (see
    :func:`find_cells`): every cell is checked (and its selection resolved) before anything is
    computed; results have a leading ``cell`` column; ``summary.txt`` has each cell's summary
    lines; ``_run.json`` records each cell's dataset and selection.  No plots are drawn (the
    per-analysis plots show one cell; run a cell alone for its plots)."""
    import logging

    from gpuclust.engine import selection as _selection
    from gpuclust.engine.local import run
    from gpuclust.engine.run_info import prepare

    say = note if note is not None else logging.getLogger("gpuclust").warning
    paths = find_cells(folder, cells)
    prepared = {}
    for cell, path in paths.items():
        plan = prepare(path, names, backend=backend, tier_map=tier_map, mode=mode,
                       note=lambda m, c=cell: say(f"cell {c}: {m}"))
        src, plan.analyses = _selection.attach(plan.source, plan.analyses, time_from, time_to)
        prepared[cell] = (plan, src)
    if plots:
        say("note: --cells draws no plots (each plot shows one cell; run a cell alone for its plots)")
    folder_out = None
    if out is not None:
        from gpuclust.report import ResultsFolder

        folder_out = ResultsFolder(out).open()
    try:
        per_cell = {}
        for cell, (plan, src) in prepared.items():
            if progress is not None:
                progress.phase(f"cell {cell}: {plan.source.path}")
            per_cell[cell] = run(src, plan.analyses, backend=plan.backend, partitions=partitions, scheduler=scheduler,
                                 workers=workers, progress=progress, memory_limit=memory_limit)
        res = combine(per_cell)
        if folder_out is not None:
            first_plan = next(iter(prepared.values()))[0]
            keys = list(res)
            shims = {k: _CellSummaries({c: pl.analyses[j] for c, (pl, _) in prepared.items()})
                     for j, k in enumerate(keys)}
            info = first_plan.info(scheduler=scheduler, partitions=partitions, workers=workers)
            info["dataset"] = str(Path(folder).absolute())
            info["cells"] = {c: {"dataset": str(pl.source.path.absolute()), "trace_version": pl.source.trace_version,
                                 "notes": pl.notes, **_selection.run_info(src)}
                             for c, (pl, src) in prepared.items()}
            folder_out.write(res, shims, plots=False, run_info=info)
            folder_out.commit()
            if progress is not None:
                progress.phase(f"wrote {out}")
    finally:
        if folder_out is not None:
            folder_out.abort()
    return res
