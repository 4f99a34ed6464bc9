"""bench/sampled.py: a module run as ``python -m`` would, its threads' stacks sampled; the
samples land on the functions that took the time, and the module's exit status is kept."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

SAMPLED = Path(__file__).resolve().parents[2] / "bench" / "sampled.py"

BUSY = """
import sys, threading, time

def spin(s):
    end = time.perf_counter() + s
    while time.perf_counter() < end:
        pass

def sleepy():
    time.sleep(0.6)

t = threading.Thread(target=sleepy)
t.start()
spin(0.8)
t.join()
sys.exit(3)
"""


def test_samples_land_on_the_busy_function_and_the_status_is_kept(tmp_path):
    (tmp_path / "busymod.py").write_text(BUSY)
    out = tmp_path / "s.json"
    cmd = [sys.executable, str(SAMPLED), "--out", str(out), "--hz", "50", "-m", "busymod"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr
    d = json.loads(out.read_text())
    assert d["hz"] == 50.0 and d["seconds"] >= 0.8
    main = {f.split(" ", 1)[1]: share for f, _, share in d["main"]["exclusive"]}
    assert main.get("spin", 0) >= 0.6, d["main"]  # ~0.8 s of a ~0.85 s run spinning
    other = {f.split(" ", 1)[1] for f, _, _ in d["other"]["inclusive"]}
    assert "sleepy" in other, d["other"]  # the other thread, waiting in C, on the frame that called
    assert 20 <= d["main"]["samples"] <= 60
    # stacks: the innermost frames, innermost first: spin's own line, called from the module
    top, n, _ = d["main"]["stacks"][0]
    frames = top.split(" < ")
    assert frames[0].endswith(" spin") and frames[1].endswith(" <module>") and n >= 0.6 * d["main"]["samples"], top


def test_a_run_past_its_deadline_is_ended_with_its_samples_written(tmp_path):
    """``--stop-after``: the sampler writes what it saw and ends the process with status 124 (a run
    cut from outside with SIGKILL would write nothing)."""
    (tmp_path / "forever.py").write_text(
        "import time\ndef spin():\n    while True:\n        time.perf_counter()\nspin()\n"
    )
    out = tmp_path / "s.json"
    cmd = [sys.executable, str(SAMPLED), "--out", str(out), "--hz", "50", "--stop-after", "0.6", "-m", "forever"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 124 and time.perf_counter() - t0 < 30, r.stderr
    d = json.loads(out.read_text())
    assert d["cut_after_s"] >= 0.6 and d["seconds"] >= 0.6
    main = {f.split(" ", 1)[1]: share for f, _, share in d["main"]["exclusive"]}
    assert main.get("spin", 0) >= 0.6, d["main"]


def test_lines_name_the_gpuclust_line_that_ran(monkeypatch):
    """``lines``: the innermost frame of gpuclust's own code, at its current line (a NumPy call
    made there counts for that line)."""
    import numpy as np

    monkeypatch.syspath_prepend(str(SAMPLED.parent))
    from sampled import Sampler

    from gpuclust.backends.mixture_cpu import _radix_argsort

    x = np.random.default_rng(0).random(2_000_000)
    s = Sampler(200).start()
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:
        _radix_argsort(x)
    s.stop()
    lines = s.summary(5)["main"]["lines"]
    ours = [(line, share) for line, _, share in lines if line.endswith(" _radix_argsort")]
    assert all(line.startswith("gpuclust/backends/mixture_cpu.py:") for line, _ in ours), lines
    assert all(int(line.split(":")[1].split()[0]) > 454 for line, _ in ours), lines  # lines inside it, not its def
    assert sum(share for _, share in ours) >= 0.8, lines
