"""bench/study_bench.py runs on the cpu (a tiny dataset, one round) and writes what it reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_study_bench_tiny_cpu(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import _harness
    from gen_canonical import make_dataset

    monkeypatch.setattr(_harness, "RESULTS", tmp_path)
    ds = make_dataset(tmp_path / "ds", 20_000, seed=1)
    try:
        import study_bench

        monkeypatch.setattr(study_bench, "bench_dataset", lambda size: ds)
        assert study_bench.main(["--sizes", "2e4", "--backends", "cpu,cpu+local:2", "--rounds", "1", "--repeat", "1",
                                 "--name", "s"]) == 0
    finally:
        sys.modules.pop("study_bench", None)
    res = json.loads((tmp_path / "s.json").read_text())
    assert [r["backend"] for r in res["rows"]] == ["cpu", "cpu+local:2"] and "environment" in res
    local, cluster = res["rows"]
    assert local["analyses"].keys() == cluster["analyses"].keys() and cluster["loaded_bytes"] == local["loaded_bytes"]
    md = (tmp_path / "s.md").read_text()
    assert "Environment:" in md and "Where each analysis' best run went" in md
    for r in (local, cluster):  # each analysis' phases (partials are summed over threads: not bounded by the wall)
        assert r["phases"].keys() == r["analyses"].keys()
        for a, ph in r["phases"].items():
            assert set(ph) == {"contexts", "partials", "merge", "finalize", "convert"}
            rest = ph["contexts"] + ph["merge"] + ph["finalize"] + ph["convert"]
            assert 0 < ph["partials"] and rest <= r["analyses"][a] + 1e-3, (a, ph)
