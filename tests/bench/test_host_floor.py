"""bench/host_floor.py runs end to end on a tiny dataset and its split adds up."""

from __future__ import annotations

import pytest


def test_host_floor_tiny(tiny_bench):
    res, md = tiny_bench("host_floor", ["--sizes", "2e4", "--repeat", "1", "--analyses", "cell-usage,overcommit"])
    rows = {r["analysis"]: r for r in res["rows"]}
    assert set(rows) == {"cell-usage", "overcommit"}
    for r in rows.values():
        assert 0 < r["device_s"] < r["wall_s"] and r["host_s"] == pytest.approx(r["wall_s"] - r["device_s"])
        assert r["ops"] > 0 and r["cpu_s"] > 0 and r["cpu_over_host"] == pytest.approx(r["cpu_s"] / r["host_s"])
        assert set(r["phases"]) == {"contexts", "partials", "merge", "finalize", "convert"}
    assert "| 20,000 | overcommit |" in md and "cpu / host" in md and "Environment:" in md
