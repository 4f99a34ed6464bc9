"""Ingest progress, without dependencies.

On a terminal: one line, redrawn at most 5 times a second, with files done, rows, rows/s and
MB/s of input.  Elsewhere (logs, CI): a plain line per finished file and a status line about
every 10 seconds.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import Any, TextIO


def _si(x: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.1f}{unit}"
    return f"{x:.0f}"


def _mb(b: float) -> str:
    return f"{b / 1e6:,.1f} MB"


class Progress:
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
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(tty if tty is not None else getattr(self.stream, "isatty", lambda: False)())
        self.min_interval = min_interval
        self.log_interval = log_interval
        self.files_total = 0
        self.bytes_total = 0
        self.files_done = 0
        self._rows: dict[str, int] = {}
        self._bytes: dict[str, int] = {}
        self._t0 = time.monotonic()
        self._last = 0.0
        self._width = 0

    # -- events ------------------------------------------------------------------------------
    def start(self, files: int, total_bytes: int) -> None:
        self.files_total = files
        self.bytes_total = total_bytes
        self._t0 = time.monotonic()
        self._last = self._t0
        if not self.tty:
            self._line(f"ingest: {files} file(s), {_mb(total_bytes)} to read")

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
        if self.tty:
            self._clear()
            self._line(msg)
            self._draw(force=True)
        else:
            self._line(msg)

    def warn(self, msg: str) -> None:
        if self.tty:
            self._clear()
        self._line(f"ingest: warning: {msg}")

    def close(self) -> None:
        if self.tty:
            self._clear()
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
        self._line(
            f"ingest: {self.files_done}/{self.files_total} files, {rows:,} rows, {_mb(done)} of {_mb(self.bytes_total)}, "
            f"{_si(rows / dt)} rows/s, {done / dt / 1e6:.1f} MB/s"
        )

    def _draw(self, force: bool = False) -> None:
        rows, done, dt = self._rates()
        self._last = time.monotonic()
        frac = min(1.0, done / self.bytes_total) if self.bytes_total else 0.0
        width = 24
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        eta = ""
        if 0 < frac < 1:
            left = dt * (1 - frac) / frac
            eta = f" ETA {int(left // 60)}:{int(left % 60):02d}"
        text = (
            f"[{bar}] {frac * 100:5.1f}% {self.files_done}/{self.files_total} files "
            f"{_si(rows)} rows {_si(rows / dt)} rows/s {done / dt / 1e6:.1f} MB/s{eta}"
        )
        cols = shutil.get_terminal_size((100, 20)).columns
        text = text[: max(10, cols - 1)]
        pad = max(0, self._width - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._width = len(text)

    def _clear(self) -> None:
        if self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()
