"""bench/host_floor.py runs end to end on a tiny dataset and its split adds up."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_host_floor_tiny(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import _harness
    from gen_canonical import make_dataset

    monkeypatch.setattr(_harness, "RESULTS", tmp_path)
    ds = make_dataset(tmp_path / "ds", 20_000, seed=1)
    try:
        import host_floor

        monkeypatch.setattr(host_floor, "bench_dataset", lambda size: ds)
        assert host_floor.main(["--sizes", "2e4", "--repeat", "1", "--analyses", "cell-usage,overcommit",
                                "--name", "hf"]) == 0
    finally:
        sys.modules.pop("host_floor", None)
    res = json.loads((tmp_path / "hf.json").read_text())
    rows = {r["analysis"]: r for r in res["rows"]}
    assert set(rows) == {"cell-usage", "overcommit"}
    for r in rows.values():
        assert 0 < r["device_s"] < r["wall_s"] and r["host_s"] == pytest.approx(r["wall_s"] - r["device_s"])
        assert r["ops"] > 0 and r["cpu_s"] > 0 and r["cpu_over_host"] == pytest.approx(r["cpu_s"] / r["host_s"])
        assert set(r["phases"]) == {"contexts", "partials", "merge", "finalize", "convert"}
    md = (tmp_path / "hf.md").read_text()
    assert "| 20,000 | overcommit |" in md and "cpu / host" in md and "Environment:" in md
