"""Ingest progress, without dependencies.

On a terminal: one line, redrawn at most 5 times a second, with files done, rows, rows/s and
MB/s of input.  Elsewhere (logs, CI): a plain line per finished file and a status line about
every 10 seconds.
"""

from __future__ import annotations

import time
from typing import Any, TextIO

from gpuclust._progress import StatusLine, bar, mb, si


class Progress(StatusLine):
    """Progress reporter for :func:`gpuclust.ingest.ingest`.

    Parameters
    ----------
    stream
        Where to write (default ``sys.stderr``).
    tty
        Force terminal (bar) or log mode; default: ``stream.isatty()``.
    min_interval
        Seconds between bar redraws (terminal mode).
    log_interval
        Seconds between status lines (log mode).

    Examples
    --------
    >>> from gpuclust.ingest import ingest
    >>> from gpuclust.ingest.progress import Progress
    >>> ingest(["cell-a/"], "out", progress=Progress())  # doctest: +SKIP
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
        self.files_total = 0
        self.bytes_total = 0
        self.files_done = 0
        self._rows: dict[str, int] = {}
        self._bytes: dict[str, int] = {}
        self._t0 = time.monotonic()
        self._last = 0.0

    # -- events ------------------------------------------------------------------------------
    def start(self, files: int, total_bytes: int) -> None:
        self.files_total = files
        self.bytes_total = total_bytes
        self._t0 = time.monotonic()
        self._last = self._t0
        if not self.tty:
            self.line(f"ingest: {files} file(s), {mb(total_bytes)} to read")

    def update(self, path: str, rows: int, bytes_done: int) -> None:
        self._rows[path] = rows
        self._bytes[path] = bytes_done
        self._tick()

    def file_done(self, result: Any) -> None:
        self.files_done += 1
        self._rows[result.path] = result.rows_read
        self._bytes[result.path] = result.size
        status = "done" if result.status == "done" else f"FAILED: {result.error}"
        msg = (
            f"ingest: [{self.files_done}/{self.files_total}] {result.path}: {result.rows_read:,} read, "
            f"{sum(result.rows_written.values()):,} written, {result.rows_rejected:,} rejected ({status})"
        )
        self.line(msg)
        if self.tty:
            self._draw()

    def warn(self, msg: str) -> None:
        self.line(f"ingest: warning: {msg}")

    def close(self) -> None:
        if self.tty:
            self.clear()
        else:
            self._status()

    # -- rendering -----------------------------------------------------------------------------
    def _rates(self) -> tuple[int, int, float]:
        rows = sum(self._rows.values())
        done = sum(self._bytes.values())
        return rows, done, max(time.monotonic() - self._t0, 1e-9)

    def _tick(self) -> None:
        now = time.monotonic()
        if self.tty:
            if now - self._last >= self.min_interval:
                self._draw()
        elif now - self._last >= self.log_interval:
            self._status()

    def _status(self) -> None:
        rows, done, dt = self._rates()
        self._last = time.monotonic()
        self.line(
            f"ingest: {self.files_done}/{self.files_total} files, {rows:,} rows, {mb(done)} of {mb(self.bytes_total)}, "
            f"{si(rows / dt)} rows/s, {done / dt / 1e6:.1f} MB/s"
        )

    def _draw(self) -> None:
        rows, done, dt = self._rates()
        self._last = time.monotonic()
        frac = min(1.0, done / self.bytes_total) if self.bytes_total else 0.0
        eta = ""
        if 0 < frac < 1:
            left = dt * (1 - frac) / frac
            eta = f" ETA {int(left // 60)}:{int(left % 60):02d}"
        self.redraw(
            f"{bar(frac)} {frac * 100:5.1f}% {self.files_done}/{self.files_total} files "
            f"{si(rows)} rows {si(rows / dt)} rows/s {done / dt / 1e6:.1f} MB/s{eta}"
        )
