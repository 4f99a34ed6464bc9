"""The status line the progress reporters share (gpuclust/_progress.py), and optimize's reporter on
it (ingest's and analyze's have their tests beside their commands: tests/ingest/test_writer.py,
tests/engine/test_engine.py)."""

from __future__ import annotations

import io

from gpuclust._progress import StatusLine, bar, mb, si
from gpuclust.optimize import Progress as OptimizeProgress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_formats() -> None:
    assert [si(x) for x in (0, 17, 999, 1_000, 340_000, 1_234_567, 2.5e9, -4_000)] == [
        "0", "17", "999", "1.0k", "340.0k", "1.2M", "2.5G", "-4.0k",
    ]  # fmt: skip
    assert mb(12_345_678) == "12.3 MB" and mb(0) == "0.0 MB"
    assert bar(0.5, 8) == "[####....]" and bar(-1, 4) == "[....]" and bar(2, 4) == "[####]"


def test_a_terminal_line_is_redrawn_in_place_and_cleared_before_a_permanent_line() -> None:
    out = _Tty()
    s = StatusLine(out)
    assert s.tty
    s.redraw("a long status")
    s.redraw("short")  # padded over what the longer one left
    s.line("done")
    assert out.getvalue() == "\ra long status" + "\rshort" + " " * 8 + "\r" + " " * 5 + "\r" + "done\n"
    s.clear()  # nothing redrawn since: nothing written
    assert out.getvalue().endswith("done\n")


def test_a_terminal_line_is_cut_to_the_terminal(monkeypatch) -> None:
    import os
    import shutil

    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=(100, 20): os.terminal_size((20, 5)))
    out = _Tty()
    StatusLine(out).redraw("x" * 50)
    assert out.getvalue() == "\r" + "x" * 19


def test_log_mode_writes_plain_lines() -> None:
    out = io.StringIO()
    s = StatusLine(out)
    assert not s.tty
    s.line("one")
    s.line("two")
    assert out.getvalue() == "one\ntwo\n"


def test_optimize_progress_on_a_terminal_and_in_logs() -> None:
    log = io.StringIO()
    p = OptimizeProgress(log, log_interval=0.0)
    p.start(1_000, 4)
    p.begin("pass 1")
    p.advance(1_000)
    p.begin("pass 2")
    p.advance(1_000)
    p.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert lines[0] == "optimize: 1,000 rows into 4 bucket(s) (pass 1 spills, pass 2 sorts and writes)"
    assert lines[1] == "optimize: pass 1" and lines[2].startswith("optimize:  50.0% (pass 1), ")
    assert lines[-1].startswith("optimize: 100.0% (pass 2), ")

    tty = _Tty()
    p = OptimizeProgress(tty)
    p.start(1_000, 4)
    p.begin("pass 1")
    p.close()
    text = tty.getvalue()
    assert "\r[" + "." * 24 + "]   0.0% pass 1" in text  # the bar, redrawn
    assert text.endswith("\n") and text.rstrip("\n").split("\r")[-1].startswith("optimize:   0.0% (pass 1)")
