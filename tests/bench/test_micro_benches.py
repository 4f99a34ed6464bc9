"""The in-process benchmarks of the kernels' host ops, bench/moments_bench.py and
bench/mixture_bench.py, run end to end on tiny sizes and record each contender's time and working
memory; ``bench/_harness.working_set``, which measures the latter, sees what a call holds."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_working_set_sees_what_a_call_holds(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from _harness import working_set

    def hold() -> float:
        a = np.ones(100 << 17)  # 100 MiB of float64, touched
        time.sleep(0.05)  # held while the sampler runs (it needs the GIL, which np.ones may keep)
        return float(a.sum())

    total, mib = working_set(hold)
    assert total == 100 << 17 and 95 <= mib <= 130
    _, idle = working_set(lambda: None)
    assert idle < 10


def test_moments_bench_tiny(tmp_path, monkeypatch):
    pytest.importorskip("duckdb")
    monkeypatch.syspath_prepend(str(BENCH))
    import _harness
    import moments_bench

    try:
        monkeypatch.setattr(_harness, "RESULTS", tmp_path)
        assert moments_bench.main(["--rows", "20000", "--groups", "100", "--repeat", "1", "--write"]) == 0
    finally:
        sys.modules.pop("moments_bench", None)
    res = json.loads((tmp_path / "moments.json").read_text())
    got = {r["contender"] for r in res["results"]}
    assert {"gpuclust-numpy", "pandas-wsums", "pandas-cov", "duckdb-sql"} <= got
    assert all(r["seconds"] > 0 and r["work_mib"] >= 0 and r["rows"] == 20_000 for r in res["results"])
    md = (tmp_path / "moments.md").read_text()
    assert "| 20,000 | 100 | gpuclust-numpy |" in md and "work MiB" in md and "Environment:" in md


def test_mixture_bench_two_sizes(tmp_path, monkeypatch):
    """bench/mixture_bench.py on two tiny sizes: both contenders per size, the loop slower than the
    op (its per-group Python work), each with its working set."""
    monkeypatch.syspath_prepend(str(BENCH))
    import _harness
    import mixture_bench

    try:
        monkeypatch.setattr(_harness, "RESULTS", tmp_path)
        argv = ["--windows", "3000,6000", "--groups", "50", "--grid", "65", "--repeat", "1", "--save"]
        assert mixture_bench.main(argv) == 0
    finally:
        sys.modules.pop("mixture_bench", None)
    res = json.loads((tmp_path / "mixture_bench.json").read_text())
    assert [(r["windows"], r["contender"].split(" (")[0]) for r in res["rows"]] == [
        (n, c) for n in (3000, 6000) for c in ("gpuclust numpy", "per-group loop")
    ]
    assert all(r["seconds"] > 0 and r["work_mib"] >= 0 for r in res["rows"])
    md = (tmp_path / "mixture_bench.md").read_text()
    assert "| 6,000 | gpuclust numpy (exact) |" in md and "work MiB" in md and "Environment:" in md
