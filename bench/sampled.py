"""Run a Python module as ``python -m`` would, sampling where its threads spend their time.

    python bench/sampled.py --out samples.json --hz 20 -m gpuclust analyze DS ... --backend gpu

A thread wakes ``--hz`` times a second and records every other thread's stack
(``sys._current_frames``): per thread kind (``main``, ``other``), how many samples each function
was on the stack (``inclusive``) and on top of it (``exclusive``), as ``file:line function``
(the line of its ``def``; paths shortened to ``gpuclust/...``, ``site/<package>/...``), which
line of gpuclust's own code ran (``lines``: the innermost ``gpuclust/`` frame's current line:
under ``CUDA_LAUNCH_BLOCKING=1`` a kernel's time lands on the line that launched it), and the
most frequent innermost stacks (``stacks``: who called a library function that took the time).  At 20 Hz
the sampler costs well under 1% of a run: it takes the GIL 20 times a second for a few hundred
microseconds.  A sample of a thread waiting in C (a CUDA synchronize, a Parquet decode, a lock)
lands on the Python frame that called it, so ``exclusive`` says which call waited.  The summary
(top ``--top`` functions of each) is written at exit, whatever the module's exit status, and the
module's status is kept.  ``--stop-after S``: after ``S`` seconds the sampler writes the summary so
far (``cut_after_s``) and ends the process with status 124, so that a run cut by a deadline still
says where its time went (a ``kill -9`` from outside would lose it).  The device check (bench/gpu_check.py ``cli``) runs the gpu command
this way, so a device run says where its host time went without a profiler on the device.
"""

from __future__ import annotations

import _thread
import argparse
import atexit
import json
import os
import runpy
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any


def where(code: Any, line: int | None = None) -> str:
    """``file:line function`` of a code object (``line``: the line it is at, else that of its
    ``def``), its path shortened."""
    path = code.co_filename
    for mark, keep in (("/gpuclust/", "gpuclust/"), ("/site-packages/", "site/"), ("/bench/", "bench/")):
        i = path.rfind(mark)
        if i >= 0:
            path = keep + path[i + len(mark) :]
            break
    else:
        path = os.path.basename(path)
    return f"{path}:{code.co_firstlineno if line is None else line} {code.co_name}"


#: Frames of a sample's stack kept in ``stacks``.
STACK_DEPTH = 8


class Sampler:
    """Samples the stacks of every thread but its own, ``hz`` times a second, until :meth:`stop`."""

    def __init__(self, hz: float = 20.0, stop_after: float = 0.0, on_deadline: Any = None):
        self.period = 1.0 / hz
        #: seconds after :meth:`start` at which the sampler stops and calls ``on_deadline`` (0: never)
        self.stop_after, self.on_deadline = stop_after, on_deadline
        self.samples = Counter()  # type: Counter[str]
        self.inclusive: dict[str, Counter[str]] = {"main": Counter(), "other": Counter()}
        self.exclusive: dict[str, Counter[str]] = {"main": Counter(), "other": Counter()}
        self.lines: dict[str, Counter[str]] = {"main": Counter(), "other": Counter()}
        #: the innermost :data:`STACK_DEPTH` frames (``file:line function``, innermost first): who
        #: called what the time went to (a library function's ``exclusive`` samples name no caller)
        self.stacks: dict[str, Counter[str]] = {"main": Counter(), "other": Counter()}
        self._stop, self._done = threading.Event(), threading.Event()
        self._main = threading.main_thread().ident
        self.seconds = 0.0

    def start(self) -> Sampler:
        """Sample from now, on a bare thread (``_thread``): ``threading`` does not count it, so a
        command that ends the process early when it is alone (``gpuclust analyze``) still does."""
        self.started = time.perf_counter()
        _thread.start_new_thread(self._run, ())
        return self

    def _run(self) -> None:
        try:
            self._sample()
        finally:
            self._done.set()

    def _sample(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.period):
            if self.stop_after and time.perf_counter() - self.started >= self.stop_after:
                self.seconds = time.perf_counter() - self.started
                self._stop.set()
                if self.on_deadline is not None:
                    self.on_deadline()
                return
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                kind = "main" if ident == self._main else "other"
                self.samples[kind] += 1
                self.exclusive[kind][where(frame.f_code)] += 1
                seen, line, stack = set(), None, []
                f: Any = frame
                while f is not None:
                    seen.add(where(f.f_code))
                    if len(stack) < STACK_DEPTH:
                        stack.append(where(f.f_code, f.f_lineno))
                    if line is None and "/gpuclust/" in f.f_code.co_filename:
                        line = where(f.f_code, f.f_lineno)
                    f = f.f_back
                self.inclusive[kind].update(seen)
                self.lines[kind][line or "(no gpuclust frame)"] += 1
                self.stacks[kind][" < ".join(stack)] += 1

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._done.wait()
            self.seconds = time.perf_counter() - self.started

    def summary(self, top: int = 40) -> dict[str, Any]:
        """Samples per thread kind and the ``top`` functions of each, with their share of it."""
        out: dict[str, Any] = {"hz": round(1.0 / self.period, 3), "seconds": round(self.seconds, 3)}
        for kind in ("main", "other"):
            n = self.samples[kind]
            out[kind] = {
                "samples": n,
                **{
                    what: [[f, c, round(c / n, 4)] for f, c in table[kind].most_common(top)] if n else []
                    for what, table in (
                        ("inclusive", self.inclusive),
                        ("exclusive", self.exclusive),
                        ("lines", self.lines),
                        ("stacks", self.stacks),
                    )
                },
            }
        return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-m" not in argv:
        raise SystemExit("usage: sampled.py [--out F] [--hz N] [--top K] [--stop-after S] -m MODULE ARGS...")
    i = argv.index("-m")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("samples.json"))
    p.add_argument("--hz", type=float, default=20.0)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--stop-after", type=float, default=0.0, help="end the run after this many seconds (0: never)")
    a = p.parse_args(argv[:i])
    module, rest = argv[i + 1], argv[i + 2 :]

    def cut() -> None:  # on the sampler's thread, at the deadline: the summary so far, then the end
        a.out.write_text(json.dumps({**sampler.summary(a.top), "cut_after_s": round(sampler.seconds, 3)}))
        os._exit(124)

    sampler = Sampler(a.hz, a.stop_after, cut).start()

    def write() -> None:  # at exit, also one that skips the interpreter's teardown (os._exit after atexit)
        if not sampler._stop.is_set():
            sampler.stop()
            a.out.write_text(json.dumps(sampler.summary(a.top)))

    atexit.register(write)
    status = 0
    sys.argv = [module, *rest]
    sys.path[0] = os.getcwd()  # as ``python -m`` has it (not this script's folder)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        write()
    return status


if __name__ == "__main__":
    sys.exit(main())
