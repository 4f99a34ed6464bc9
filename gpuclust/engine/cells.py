"""Several cells in one run: each cell's analyses, result tables keyed by a leading ``cell`` column.

A multi-cell study ("Borg: the Next Generation" compares cells a-h) is a folder holding one
canonical dataset per cell::

    cells/
      a/manifest.json ...        (gpuclust ingest ... --out cells/a --cell a)
      b/manifest.json ...

A sub-folder's cell is its manifest's ``cell`` (else the folder name).  :func:`run_cells` runs the
same analyses over each cell (one :func:`gpuclust.engine.run` per cell, so every cell gets exactly
the result of a run over it alone) and concatenates each result table across cells, with the cell
as the first column; :func:`gpuclust.report.analyze.analyze_cells` is ``gpuclust analyze FOLDER
NAME... --cells a,b``.

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
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuclust._lazy import pandas as pd

__all__ = ["combine", "find_cells", "parse_cells", "run_cells"]


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
