"""Progress of :func:`gpuclust.engine.run`, without dependencies.

On a terminal: one line, redrawn at most 5 times a second (phase, partitions done of total,
rows, rows/s, elapsed).  Elsewhere (logs, batch jobs): a line per phase and a status line at most
every ``log_interval`` seconds while partitions stream.
"""

from __future__ import annotations

import threading
import time
from typing import Any, TextIO

from gpuclust._progress import StatusLine, si

__all__ = ["PassProgress", "RunProgress"]


class RunProgress(StatusLine):
    """Progress reporter for :func:`gpuclust.engine.run` (``progress=RunProgress()``).

    The engine calls :meth:`phase` when it starts a context or the finalize step,
    :meth:`partitions` before streaming a table and :meth:`partition_done` after each partition
    (from worker threads: the reporter is thread-safe), then :meth:`finish`.

    Examples
    --------
    >>> import io
    >>> out = io.StringIO()
    >>> p = RunProgress(out, tty=False, log_interval=0)
    >>> p.partitions("instance_usage", 2, 1000)
    >>> p.partition_done("instance_usage", 600)
    >>> p.partition_done("instance_usage", 400)
    >>> p.finish()
    >>> print(out.getvalue().splitlines()[-1].split(" in ")[0])
    analyze: done, 1,000 rows
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        min_interval: float = 0.2,
        log_interval: float = 10.0,
    ):
        super().__init__(stream, tty)
        self.min_interval = min_interval
        self.log_interval = log_interval
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._last = 0.0
        #: table -> [partitions total, partitions done, rows total, rows done, start time]
        self._tables: dict[str, list[float]] = {}
        self._all_rows = 0

    # -- events ------------------------------------------------------------------------------
    def phase(self, text: str) -> None:
        with self._lock:
            self._emit(f"analyze: {text}", final=not self.tty)

    def partitions(self, table: str, n: int, rows: int) -> None:
        """``table`` is about to stream ``n`` partitions of ``rows`` rows (tables may interleave)."""
        with self._lock:
            self._tables[table] = [n, 0, rows, 0, time.monotonic()]
            if not self.tty:
                self._emit(f"analyze: {table}: {n} partition(s), {rows:,} rows", final=True)

    def partition_done(self, table: str, rows: int) -> None:
        with self._lock:
            st = self._tables.setdefault(table, [0, 0, 0, 0, self._t0])
            st[1] += 1
            st[3] += rows
            self._all_rows += rows
            now = time.monotonic()
            last = st[1] == st[0]
            due = now - self._last >= (self.min_interval if self.tty else self.log_interval)
            if due or last:
                self._last = now
                rate = st[3] / max(now - st[4], 1e-9)
                pct = 100.0 * st[3] / st[2] if st[2] else 100.0
                self._emit(
                    f"analyze: {table}: partition {int(st[1])}/{int(st[0])}, "
                    f"{si(st[3])} rows ({pct:.0f}%), {si(rate)} rows/s",
                    final=not self.tty,
                )

    def finish(self) -> None:
        with self._lock:
            dt = time.monotonic() - self._t0
            self._emit(f"analyze: done, {self._all_rows:,} rows in {dt:.1f} s", final=True)

    def _emit(self, text: str, final: bool) -> None:
        """A permanent line (``final``), or the terminal's redrawn one."""
        if final:
            self.line(text)
        else:
            self.redraw(text)


class PassProgress:
    """The progress of a prerequisite pass (e.g. data-quality's event-table profiles) inside a
    run: the tables it streams are reported to the run's reporter ``outer`` (so the rows it reads
    count in the run's ``done, N rows``); its own phases and its finish are not (the run has one
    end)."""

    def __init__(self, outer: Any):
        self.outer = outer

    def phase(self, text: str) -> None:
        pass

    def partitions(self, table: str, n: int, rows: int) -> None:
        self.outer.partitions(table, n, rows)

    def partition_done(self, table: str, rows: int) -> None:
        self.outer.partition_done(table, rows)

    def finish(self) -> None:
        pass
