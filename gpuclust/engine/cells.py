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

Tables that grow with the cell (an analysis' ``parted`` tables, e.g. overcommit's ``machine``)
stay parts on disk when the results go to a folder: each cell's run writes its parts into the
temporary results folder, and :func:`combine` copies them, a row group at a time with the
``cell`` column added, into ``<key>/<table>/part-NNNNN.parquet`` (cells in order); nothing of
them is gathered in memory.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuclust._lazy import pandas as pd

__all__ = ["analyze_cells", "combine", "find_cells", "parse_cells", "run_cells"]

#: Sub-folder of the temporary results folder where each cell's run writes its parted tables.
_STAGING = ".cells"


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
        raise DatasetError(
            f"{folder} is one dataset; --cells needs a folder holding one dataset per cell (e.g. cells/a, cells/b)"
        )
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
        raise DatasetError(
            f"{folder}: no dataset for cell(s) {','.join(missing)}; found: {','.join(sorted(found)) or 'none'}"
        )
    return {c: found[c] for c in want}


def _with_cell(df: pd.DataFrame, cell: str) -> pd.DataFrame:
    """``df`` with ``cell`` as its first column (a ``cell`` column it has gets the cell's name)."""
    d = df.drop(columns="cell") if "cell" in df.columns else df.copy()
    d.insert(0, "cell", pd.Series([cell] * len(d), index=d.index, dtype=object))
    return d


def _file_batches(t: Any, f: str, cell: str) -> Iterator[pd.DataFrame]:
    from gpuclust.parted import PartedTable

    for df in PartedTable(t.folder, [f]).batches():
        yield _with_cell(df, cell).reset_index(drop=True)


def combine(
    per_cell: Mapping[str, Mapping[str, Mapping[str, Any]]], parts_dir: Path | None = None
) -> dict[str, dict[str, Any]]:
    """Concatenate each result table across cells with ``cell`` as its first column (a table that
    already has a ``cell`` column, e.g. ``by=cell``, gets the cell's name there).

    A table that any cell returned as a :class:`gpuclust.parted.PartedTable` is, with
    ``parts_dir``, copied part by part (a row group at a time) into
    ``parts_dir/<key>/<table>/part-NNNNN.parquet`` and returned as a ``PartedTable`` there;
    without ``parts_dir`` it is read whole."""
    from gpuclust.parted import PartedTable, write_part

    grouped: dict[str, dict[str, list[tuple[str, Any]]]] = {}
    for cell, res in per_cell.items():
        for key, tables in res.items():
            for tname, df in tables.items():
                grouped.setdefault(key, {}).setdefault(tname, []).append((cell, df))
    out: dict[str, dict[str, Any]] = {}
    for key, tables in grouped.items():
        dst = out.setdefault(key, {})
        for tname, items in tables.items():
            if parts_dir is not None and any(isinstance(df, PartedTable) for _, df in items):
                pt = PartedTable(Path(parts_dir) / key / tname)
                for cell, df in items:
                    if isinstance(df, PartedTable):  # each file's row groups, lazily
                        chunks: list[Any] = [_file_batches(df, f, cell) for f in df.files]
                    else:
                        chunks = [_with_cell(df, cell)] if len(df.columns) else []
                    for rows in chunks:
                        name, n = write_part(pt.folder, len(pt.files), rows)
                        pt.files.append(name)
                        pt.num_rows += n
                dst[tname] = pt
                continue
            frames = [_with_cell(df.read() if isinstance(df, PartedTable) else df, cell) for cell, df in items]
            dst[tname] = pd.concat(frames, ignore_index=True)
    return out


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
    """:func:`gpuclust.engine.analyze` over the datasets of ``cells`` in ``folder`` (see
    :func:`find_cells`): every cell is checked (and its selection resolved) before anything is
    computed; results have a leading ``cell`` column; ``summary.txt`` has each cell's summary
    lines; ``_run.json`` records each cell's dataset and selection.  No plots are drawn (the
    per-analysis plots show one cell; run a cell alone for its plots)."""
    import logging

    from gpuclust.engine import selection as _selection
    from gpuclust.engine.local import run
    from gpuclust.engine.run_info import prepare
    from gpuclust.parted import relocated

    say = note if note is not None else logging.getLogger("gpuclust").warning
    paths = find_cells(folder, cells)
    prepared = {}
    for cell, path in paths.items():

        def cell_note(m: str, c: str = cell) -> None:
            say(f"cell {c}: {m}")

        plan = prepare(path, names, backend=backend, tier_map=tier_map, mode=mode, note=cell_note)
        src, plan.analyses = _selection.attach(plan.source, plan.analyses, time_from, time_to)
        prepared[cell] = (plan, src)
    if plots:
        say("note: --cells draws no plots (each plot shows one cell; run a cell alone for its plots)")
    folder_out = None
    tmp: Path | None = None  # the results folder's temporary folder
    if out is not None:
        from gpuclust.report import ResultsFolder

        folder_out = ResultsFolder(out).open()
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
            first_plan = next(iter(prepared.values()))[0]
            keys = list(res)
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
