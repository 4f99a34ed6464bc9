"""bench/device_budget.py runs end to end on a tiny dataset: its counts, split and verdicts add up."""

from __future__ import annotations

import pytest


def test_device_budget_tiny(tiny_bench):
    two_pass = "usage-distribution[strategy=exact-two-pass]"  # a device variant: its cpu time from the cpu child
    res, md = tiny_bench(
        "device_budget", ["--sizes", "2e4,4e4", "--repeat", "1", "--analyses", f"cell-usage,overcommit,{two_pass}"]
    )
    assert set(res["sizes"]) == {"20000", "40000"}
    for rows in res["sizes"].values():
        assert set(rows) == {"cell-usage", "overcommit", two_pass}
        for r in rows.values():
            assert 0 < r["device_s"] < r["wall_s"] and r["host_s"] == pytest.approx(r["wall_s"] - r["device_s"])
            assert r["launches"] > 0 and r["syncs"] > 0 and r["d2h_bytes"] > 0
            assert r["column_bytes"] > 0 and r["h2d_bytes"] >= r["column_bytes"]  # the load copies its columns at least
            assert r["cpu_s"] > 0 and r["cpu_over_host"] == pytest.approx(r["cpu_s"] / r["host_s"])
            assert set(r["phases"]) == {"contexts", "partials", "read", "merge", "finalize", "convert"}
    v = res["verdicts"]["cell-usage"]
    assert set(v["ok"]) == {"d2h", "h2d", "syncs", "launches"} and v["syncs_growth"] == 1.0  # (the same dataset)
    assert "| 20,000 | overcommit |" in md and "cpu / host" in md and "targets" in md and "Environment:" in md


def test_load_bench_tiny(tiny_bench, monkeypatch):
    """bench/load_bench.py: both loads decode the same bytes; the ratio is their rates'."""
    import sys

    res, md = tiny_bench("load_bench", ["--sizes", "2e4", "--repeat", "1"])
    (row,) = res["rows"]
    g, p = row["median"]["gpuclust"], row["median"]["pyarrow"]
    assert g["bytes"] > 0 and abs(g["bytes"] - p["bytes"]) <= 0.05 * p["bytes"]  # Arrow adds validity bitmaps
    assert row["ratio"] == pytest.approx(row["gb_s"]["gpuclust"] / row["gb_s"]["pyarrow"])
    assert "| 20,000 |" in md and "Environment:" in md
    assert "load_bench" not in sys.modules


def test_key_passes_bench_tiny(tiny_bench):
    """bench/key_passes_bench.py: on a device smaller than the uncapped run's peak (1,000
    machines: overcommit's dense sums ~5 MB, cpi's ~3 MB) the run takes overcommit in passes,
    spills nothing, and its tables are the uncapped run's: the target met."""
    args = ["--sizes", "2e4", "--device-mib", "8", "--partition-rows", "5000", "--shard-cells", "200"]
    res, md = tiny_bench("key_passes_bench", args, machines=1_000, days=0.04)
    (row,) = res["rows"]
    c, u = row["capped"], row["uncapped"]
    assert row["equal"] and row["partitions"] == 4
    assert c["passes"].get("overcommit", 0) >= 2 and u["passes"] == {} and c["spilled"] == u["spilled"] == 0
    assert 0 < c["device_peak_bytes"] <= 8 << 20 < u["device_peak_bytes"] and res["verdict"]["met"]
    assert c["peak_rss_bytes"] > 0 and "| 20,000 | 4 |" in md and "Environment:" in md
