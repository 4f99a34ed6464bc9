"""Rendering results into a folder: Parquet tables, a readable summary, plots and ``_run.json``.

:func:`render` writes every analysis' files into a folder that nobody else sees yet (the results
folder's temporary sibling, :mod:`gpuclust.report.folder`), :func:`render_analysis` one analysis'
(also on the dask worker that finalized it, :mod:`gpuclust.report.writer`), and
:func:`write_run_file` the run marker.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from gpuclust._lazy import pandas as pd
from gpuclust.engine import timing
from gpuclust.engine.timing import phase
from gpuclust.report.provenance import RUN_FILE

__all__ = ["Rendered", "render", "render_analysis", "write_run_file"]


@dataclass
class Rendered:
    """What :func:`gpuclust.report.render_analysis` wrote: ``files`` (relative to the folder),
    the analysis' ``summary`` paragraph and the rows of each table (``rows``)."""

    files: list[str]
    summary: str
    rows: dict[str, int] = field(default_factory=dict)


def render(
    results: Mapping[str, Mapping[str, pd.DataFrame]],
    analyses: Mapping[str, Any],
    folder: Path,
    *,
    plots: bool = True,
    subject: str | None = None,
    selection: Mapping[str, Any] | None = None,
    rendered: Mapping[str, Rendered] | None = None,
) -> list[str]:
    """Write ``<analysis>/<table>.parquet``, ``<analysis>/<analysis>.png`` and ``summary.txt`` into
    ``folder``; returns the paths written, relative to ``folder``.

    An analysis' ``parted`` tables (:mod:`gpuclust.parted`) are folders of parts,
    ``<analysis>/<table>/part-NNNNN.parquet``: a :class:`gpuclust.parted.PartedTable` the engine
    already wrote there is listed, a DataFrame or an Arrow table is written as one part.  ``subject`` (the dataset,
    cell and trace, :func:`gpuclust.report.provenance.subject`) goes into each plot's title; ``selection`` (the
    run's time selection, as ``_run.json`` records it) lets an empty result say where the data is.
    ``rendered``: the analyses whose files are written already (by the dask workers that
    finalized them, see :class:`gpuclust.report.writer.AnalysisWriter`), their files and summaries."""
    folder = Path(folder)
    written: list[str] = []
    summary: list[str] = []
    for key, tables in results.items():
        done = (rendered or {}).get(key)
        if done is None:
            done = render_analysis(
                key, analyses.get(key), tables, folder, plots=plots, subject=subject, selection=selection
            )
        written.extend(done.files)
        summary.append(done.summary)
    with phase("summary"):
        (folder / "summary.txt").write_text("\n\n".join(summary) + "\n")
    written.append("summary.txt")
    return written


def render_analysis(
    key: str,
    a: Any,
    tables: Mapping[str, Any],
    folder: Path,
    *,
    plots: bool = True,
    subject: str | None = None,
    selection: Mapping[str, Any] | None = None,
) -> Rendered:
    """Write one analysis' tables (``<key>/<table>.parquet``, or the parts of a parted table) and
    its plot into ``folder``; its files (relative to ``folder``) and its paragraph of
    ``summary.txt`` (see :func:`render`; run by a dask worker where it finalized, see
    :class:`gpuclust.report.writer.AnalysisWriter`)."""
    from gpuclust.parted import PartedTable, write_part
    from gpuclust.tables import as_arrow, parquet_options

    folder = Path(folder)
    written: list[str] = []
    rows: dict[str, int] = {}
    label = getattr(a, "label", key)  # as the engine's phases name it
    (folder / key).mkdir(parents=True, exist_ok=True)
    for tname, df in tables.items():
        if isinstance(df, PartedTable):
            if df.folder.resolve() != (folder / key / tname).resolve():
                raise ValueError(f"{key}/{tname}: parted table written to {df.folder}, not into {folder}")
            written.extend(f"{key}/{tname}/{f}" for f in df.files)
            rows[tname] = df.num_rows
            continue
        if tname in getattr(a, "parted", ()):  # (write_part takes a DataFrame or an Arrow table)
            with phase("tables", label):
                name, rows[tname] = write_part(folder / key / tname, 0, df)
            written.append(f"{key}/{tname}/{name}")
            continue
        rel = f"{key}/{tname}.parquet"
        with phase("tables", label):
            t = as_arrow(df)
            pq.write_table(t, folder / rel, **parquet_options(t.schema))
        written.append(rel)
        rows[tname] = t.num_rows
    with phase("summary", label):
        summary = a.summary(tables) if a is not None else f"{key}: {list(tables)}"
    title = getattr(a, "label", key) + (f" · {subject}" if subject else "")
    if plots and a is not None:
        from gpuclust.report.plots import plot_result

        with phase("plots", label):
            drawn = plot_result(a.name, dict(tables), folder / key / f"{key}.png", title=title)
        if drawn:
            written.append(f"{key}/{key}.png")
        else:  # say why there is no plot (summary.txt), instead of leaving it out silently
            from gpuclust.report.sections import empty_reason

            with phase("summary", label):
                why = empty_reason(a.name, tables, selection=selection)
            if why.removeprefix("Nothing to plot: ").rstrip(".") not in summary:  # not said already
                summary += f"\n  {why}"
    return Rendered(written, summary, rows)


def _jsonable(v: Any) -> Any:
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if hasattr(v, "item"):
        return v.item()
    return v if isinstance(v, (str, int, float, bool, type(None))) else str(v)


def write_run_file(folder: Path, files: list[str], info: Mapping[str, Any]) -> str:
    """Write ``_run.json`` (``info`` plus the list of ``files`` this run wrote; with the run's clock
    open, its start, finish, wall seconds and phases so far, :mod:`gpuclust.engine.timing`); returns its name."""
    c = timing.current()
    doc = {**_jsonable(dict(info)), **(c.record() if c is not None else {}), "files": sorted([*files, RUN_FILE])}
    (Path(folder) / RUN_FILE).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return RUN_FILE
