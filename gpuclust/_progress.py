"""What the progress reporters of ingest, optimize and analyze share, without dependencies: the
status line they write to (a line redrawn in place on a terminal, plain lines elsewhere) and the
number formats of their lines.

A reporter subclasses :class:`StatusLine` and says *what* to show; how a terminal's line is
redrawn, cut to the terminal's width and cleared before a permanent line is written is here.
"""

from __future__ import annotations

import shutil
import sys
from typing import TextIO

__all__ = ["StatusLine", "bar", "mb", "si"]


def si(x: float) -> str:
    """``x`` with an SI suffix and one decimal: ``1.2M``, ``340.0k``, ``17``."""
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.1f}{unit}"
    return f"{x:.0f}"


def mb(b: float) -> str:
    """Bytes as megabytes: ``12.3 MB``."""
    return f"{b / 1e6:,.1f} MB"


def bar(frac: float, width: int = 24) -> str:
    """A text bar ``[####....]`` filled to ``frac`` (clipped to [0, 1])."""
    n = int(min(1.0, max(0.0, frac)) * width)
    return "[" + "#" * n + "." * (width - n) + "]"


class StatusLine:
    """The line a reporter writes to ``stream`` (default ``sys.stderr``).

    On a terminal (``tty``; default ``stream.isatty()``) :meth:`redraw` rewrites one line in place,
    cut to the terminal's width; :meth:`line` writes a permanent line, clearing the redrawn one
    first; :meth:`clear` erases the redrawn one.  Elsewhere (logs, batch jobs) only :meth:`line`
    writes (a reporter says what to log)."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(tty if tty is not None else getattr(self.stream, "isatty", lambda: False)())
        self._width = 0

    def redraw(self, text: str) -> None:
        text = text[: max(10, shutil.get_terminal_size((100, 20)).columns - 1)]
        self.stream.write("\r" + text + " " * max(0, self._width - len(text)))
        self.stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        if self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    def line(self, text: str) -> None:
        self.clear()
        self.stream.write(text + "\n")
        self.stream.flush()
