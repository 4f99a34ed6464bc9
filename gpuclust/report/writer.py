"""One analysis' results written where it was finalized: on the dask worker that holds its merged
partial, so that the client of a ``gpuclust analyze --out DIR`` run on a cluster never holds the
result rows (a row per task, per job: they grow with the data).

:class:`AnalysisWriter` (made by :meth:`gpuclust.report.ResultsFolder.writer`) travels in the
task graph to the workers; there it writes the analysis' tables and plot into the results
folder's temporary sibling, as the client would (:func:`gpuclust.report.render_analysis`: the
same files, and they become visible only when the client commits the whole folder), and returns
handles on the files (:class:`WrittenTable`, :class:`gpuclust.parted.PartedTable`) and a
:class:`Rendered` (the files and the analysis' paragraph of ``summary.txt``).  The client keeps
the :class:`Rendered` (:meth:`AnalysisWriter.keep`) and writes ``summary.txt`` and ``_run.json``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuclust.errors import OutputError
from gpuclust.report.rendering import Rendered, render_analysis

__all__ = ["AnalysisWriter", "WrittenTable"]


@dataclass
class WrittenTable:
    """A result table already written to one Parquet file, ``path`` (by the worker that
    finalized it); read it whole or by row groups."""

    path: Path
    num_rows: int = 0

    def read(self, columns: Sequence[str] | None = None) -> Any:
        """The table as a pandas DataFrame (memory grows with it)."""
        from gpuclust.tables import as_pandas

        return as_pandas(self.arrow(columns))

    def arrow(self, columns: Sequence[str] | None = None) -> Any:
        """The table as a ``pyarrow.Table``."""
        import pyarrow.parquet as pq

        return pq.read_table(self.path, columns=None if columns is None else list(columns))

    def batches(self, columns: Sequence[str] | None = None) -> Iterator[Any]:
        """The table, a row group at a time, as DataFrames."""
        import pyarrow.parquet as pq

        from gpuclust.tables import as_pandas

        pf = pq.ParquetFile(self.path)
        for i in range(pf.num_row_groups):
            yield as_pandas(pf.read_row_group(i, columns=None if columns is None else list(columns)))

    def __len__(self) -> int:
        return self.num_rows

    def relocated(self, old: str | Path, new: str | Path) -> WrittenTable:
        """The same table once the folder ``old`` it was written under is renamed to ``new``."""
        return WrittenTable(Path(new) / self.path.relative_to(old), self.num_rows)


class AnalysisWriter:
    """Writes an analysis' finalized tables into ``folder`` (the temporary sibling of the results
    folder ``out``) where it is called: ``writer(key, analysis, tables) -> (handles, rendered)``.

    ``plots``, ``subject`` and ``selection`` are those of :func:`gpuclust.report.render`.  The
    client's instance collects each analysis' :class:`Rendered` (:meth:`keep`, :attr:`rendered`)
    for :meth:`gpuclust.report.ResultsFolder.write`."""

    def __init__(
        self,
        folder: Path,
        *,
        out: Path | None = None,
        plots: bool = True,
        subject: str | None = None,
        selection: Mapping[str, Any] | None = None,
    ):
        self.folder = Path(folder)
        self.out = Path(folder) if out is None else Path(out)
        self.plots = plots
        self.subject = subject
        self.selection = None if selection is None else dict(selection)
        self.rendered: dict[str, Rendered] = {}

    def __call__(self, key: str, a: Any, tables: Mapping[str, Any]) -> tuple[dict[str, Any], Rendered]:
        from gpuclust.parted import PartedTable

        try:
            done = render_analysis(
                key, a, tables, self.folder, plots=self.plots, subject=self.subject, selection=self.selection
            )
        except OSError as e:  # one line naming the results folder, as the client's writing says it
            raise OutputError(self.out, e) from None
        handles: dict[str, Any] = {}
        for t, v in tables.items():
            if isinstance(v, PartedTable):
                handles[t] = v
            elif t in getattr(a, "parted", ()):
                parts = [f.rsplit("/", 1)[1] for f in done.files if f.startswith(f"{key}/{t}/")]
                handles[t] = PartedTable(self.folder / key / t, parts, done.rows[t])
            else:
                handles[t] = WrittenTable(self.folder / key / f"{t}.parquet", done.rows[t])
        return handles, done

    def keep(self, key: str, rendered: Rendered) -> None:
        """On the client: what the worker wrote for ``key``."""
        self.rendered[key] = rendered

    def __getstate__(self) -> dict[str, Any]:  # the workers need not what the client collected
        return {**self.__dict__, "rendered": {}}
