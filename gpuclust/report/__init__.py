"""Results folders: Parquet tables, a readable summary, plots and the run marker ``_run.json``.

:func:`write_results` writes a whole results folder atomically (see :mod:`gpuclust.report.folder`);
:func:`render` writes the files into a folder that nobody else sees yet
(:mod:`gpuclust.report.rendering`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuclust._lazy import pandas as pd
from gpuclust.report.folder import RUN_FILE, OutputError, ResultsFolder
from gpuclust.report.rendering import Rendered, render, render_analysis, write_run_file

__all__ = [
    "RUN_FILE",
    "OutputError",
    "Rendered",
    "ResultsFolder",
    "render",
    "render_analysis",
    "write_results",
    "write_run_file",
]


def write_results(
    results: Mapping[str, Mapping[str, pd.DataFrame]],
    analyses: Mapping[str, Any],
    out: str | os.PathLike[str],
    *,
    plots: bool = True,
    run_info: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Write a results folder ``out`` as a whole (replacing an earlier run's; see
    :mod:`gpuclust.report.folder`).

    Parameters
    ----------
    results
        As returned by :func:`gpuclust.engine.run`.
    analyses
        Result key -> the analysis instance that produced it (for summaries and plots).
    run_info
        What ``_run.json`` records besides the file list.

    Returns
    -------
    list of pathlib.Path
        Every file written.
    """
    folder = ResultsFolder(out).open()
    try:
        written = folder.write(results, analyses, plots=plots, run_info=dict(run_info or {}))
        folder.commit()
    finally:
        folder.abort()
    return written
