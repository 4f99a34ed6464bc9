"""bench/ingest_bench.py runs end to end on two tiny shards (one round) and reports each size and
the marginal throughput between them (checked against the runs it recorded)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_ingest_bench_two_sizes(tmp_path, monkeypatch):
    pytest.importorskip("duckdb")
    monkeypatch.syspath_prepend(str(BENCH))
    import _harness
    import ingest_bench

    try:
        monkeypatch.setattr(_harness, "RESULTS", tmp_path)
        monkeypatch.setattr(ingest_bench, "DATA", tmp_path / "data")
        assert ingest_bench.main(["--windows", "24000,48000", "--repeat", "1", "--no-arrow-path", "--name", "i"]) == 0
    finally:
        sys.modules.pop("ingest_bench", None)
    res = json.loads((tmp_path / "i.json").read_text())
    assert {(r["windows"], r["input"], r["tool"]) for r in res["summary"]} == {
        (w, i, t) for w in (24000, 48000) for i in ("gzip", "plain") for t in ("gpuclust", "duckdb")
    }
    small, big = res["sizes"]
    assert 0 < small["json_bytes"] < big["json_bytes"] and small["rows"] < big["rows"]
    by = {(r["windows"], r["input"], r["tool"]): r for r in res["summary"]}
    for m in res["marginal"]:
        a, b = by[(m["from"], m["input"], m["tool"])], by[(m["to"], m["input"], m["tool"])]
        dw = b["wall_s"] - a["wall_s"]
        want = round((big["json_bytes"] - small["json_bytes"]) / 1e6 / dw, 1) if dw > 0 else None
        assert m["mb_per_wall_s"] == want
    md = (tmp_path / "i.md").read_text()
    assert "Marginal throughput between sizes" in md and "| gzip | gpuclust |" in md
