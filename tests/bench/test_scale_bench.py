"""bench/scale_bench.py runs end to end (tiny sizes, so it cannot rot) and reports what it measured;
its guards record a timeout / an RSS kill instead of hiding it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import _harness
    import gen_canonical
    import scale_bench

    monkeypatch.setattr(_harness, "RESULTS", tmp_path / "results")
    data = tmp_path / "data"

    def tiny_dataset(size, *, machines=None, days=None, generate=True):  # bench/data is for real sizes
        ds = data / f"{size}-{machines}-{days}"
        if generate and not (ds / "manifest.json").exists():
            gen_canonical.make_dataset(ds, size, machines=machines, days=days, seed=1)
        return ds

    monkeypatch.setattr(scale_bench, "bench_dataset", tiny_dataset)
    yield scale_bench
    for m in ("scale_bench", "gen_canonical"):
        sys.modules.pop(m, None)


@pytest.mark.slow
def test_tiny_run(bench, tmp_path):
    rc = bench.main(
        [
            "--sizes",
            "2e4,4e4",
            "--long-span",
            "2e4,60,2",
            "--repeat",
            "1",
            "--analyses",
            "cell-usage,usage-distribution[by=instance]",
            "--layout",
            "both",
            "--memory-limit",
            "1G",
            "--timeout",
            "300",
            "--name",
            "s",
        ]
    )
    assert rc == 0
    res = json.loads((tmp_path / "results" / "s.json").read_text())
    assert res["environment"]["commit"]
    runs = res["runs"]
    assert {r["analysis"] for r in runs} == {"cell-usage", "usage-distribution[by=instance]"}
    assert {r["dataset"] for r in runs} == {"2e4", "4e4", "long-span 2e4 windows, 60 machines, 2 days"}
    for r in runs:
        assert r["status"] == "ok", r
        assert r["wall_s"] > 0 and r["peak_rss_bytes"] > 50 << 20 and r["cpu_s"] > 0
    long = [r for r in runs if r["long_span"]]
    assert {r["machines"] for r in long} == {60} and {r["days"] for r in long} == {2.0}
    assert {r["layout"] for r in runs} == {"flat", "bucketed"}  # `gpuclust optimize` exists
    assert len(res["summary"]) == 12
    md = (tmp_path / "results" / "s.md").read_text()
    assert "## cell-usage (flat)" in md and "## usage-distribution[by=instance] (flat)" in md
    assert "## cell-usage (bucketed)" in md and "## usage-distribution[by=instance] (bucketed)" in md
    assert md.count("| long-span 2e4 windows, 60 machines, 2 days |") == 4
    assert "memory-limit" in md
    # --append adds further repeats (medians over all) and keeps the earlier environment
    assert bench.main(["--sizes", "2e4", "--no-long-span", "--analyses", "cell-usage", "--append", "--name", "s"]) == 0
    res2 = json.loads((tmp_path / "results" / "s.json").read_text())
    again = [
        r for r in res2["runs"] if r["dataset"] == "2e4" and r["analysis"] == "cell-usage" and r["layout"] == "bucketed"
    ]
    assert sorted(r["repeat"] for r in again) == [0, 1] and len(res2["runs"]) == len(runs) + 1
    assert res2["environment"]["earlier_environments"][0]["date"] == res["environment"]["date"]
    assert "ok (2/2)" in (tmp_path / "results" / "s.md").read_text()
    (tmp_path / "results" / "s.md").unlink()
    assert bench.main(["--render", "--name", "s"]) == 0 and "ok (2/2)" in (tmp_path / "results" / "s.md").read_text()


def test_ratio_verdict(bench):
    def row(size, rss, wall, *, long_span=False):
        return {
            "layout": "flat",
            "dataset": bench.size_label(size),
            "analysis": "a",
            "size": size,
            "windows": size,
            "long_span": long_span,
            "runs": 1,
            "ok": 1,
            "status": "ok",
            "wall_s": wall,
            "peak_rss_bytes": rss,
            "s_per_mwindows": wall / (size / 1e6),
        }

    env = {"cores": 2, "memory_gib": 24, "gpu": None, "commit": "abc", "dirty": False, "date": "today"}
    flat = bench.markdown([row(4_000_000, 1 << 30, 4.0), row(16_000_000, int(1.4 * (1 << 30)), 16.0)], env, [])
    assert "**1.40x** (pass" in flat and "1.00x; 1.0 = linear" in flat
    assert "| a | flat | 1.00 | 1.40 | 1.40x | pass |" in flat  # the summary table
    grows = bench.markdown([row(4_000_000, 1 << 30, 4.0), row(16_000_000, 3 << 30, 32.0)], env, [])
    assert "**3.00x** (FAIL" in grows and "2.00x; 1.0 = linear" in grows and "| 3.00x | **FAIL** |" in grows
    partial = bench.markdown(
        [row(4_000_000, 1 << 30, 4.0), {**row(16_000_000, 0, 0), "status": "timeout", "ok": 0}], env, []
    )
    assert "1.6e7 did not finish (timeout" in partial and "**FAIL**" in partial
    assert "**timeout**" in partial and "| a | flat | 1.00 | | | timeout |" in partial


def test_guards_record_timeout_and_rss(bench):
    import _harness

    m = _harness.run_measured([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=1.0)
    assert m.extra.get("timed_out") and m.returncode != 0 and m.wall_s < 20
    m = _harness.run_measured(
        [
            sys.executable,
            "-c",
            "import time; b = bytearray(400 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(30)",
        ],
        max_rss_bytes=200 << 20,
    )
    assert m.extra.get("rss_killed") and m.returncode != 0 and m.peak_rss_bytes > 200 << 20
    m = _harness.run_measured([sys.executable, "-c", "print('hi')"], timeout_s=60, max_rss_bytes=1 << 40)
    assert (
        m.returncode == 0 and not m.extra.get("timed_out") and not m.extra.get("rss_killed") and "hi" in m.stdout_tail
    )
