"""Rendering results: Parquet tables, a readable summary and plots, all written atomically."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["write_results"]


def _write_bytes_atomic(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_results(results: Mapping[str, Mapping[str, pd.DataFrame]], analyses: Mapping[str, Any],
                  out: str | os.PathLike[str], *, plots: bool = True) -> list[Path]:
    """Write ``OUT/<analysis>/<table>.parquet``, ``OUT/summary.txt`` and ``OUT/<analysis>/<analysis>.png``.

    Parameters
    ----------
    results
        As returned by :func:`gpuclust.engine.run`.
    analyses
        Result key -> the analysis instance that produced it (for summaries and plots).

    Returns
    -------
    list of pathlib.Path
        Every file written.
    """
    from gpuclust.report.plots import plot_result

    out = Path(out)
    written: list[Path] = []
    summary: list[str] = []
    for key, tables in results.items():
        d = out / key
        for tname, df in tables.items():
            p = d / f"{tname}.parquet"
            table = pa.Table.from_pandas(df, preserve_index=False)
            _write_bytes_atomic(p, lambda tmp, t=table: pq.write_table(t, tmp))
            written.append(p)
        a = analyses.get(key)
        summary.append(a.summary(tables) if a is not None else f"{key}: {list(tables)}")
        if plots and a is not None:
            png = d / f"{key}.png"
            if plot_result(a.name, tables, png, title=getattr(a, "label", key)):
                written.append(png)
    sp = out / "summary.txt"
    text = "\n\n".join(summary) + "\n"
    _write_bytes_atomic(sp, lambda tmp: Path(tmp).write_text(text))
    written.append(sp)
    return written
