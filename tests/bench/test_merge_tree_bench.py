"""bench/merge_tree_bench.py runs (tiny sizes) and writes what it reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_merge_tree_bench_tiny(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import _harness

    monkeypatch.setattr(_harness, "RESULTS", tmp_path)
    try:
        import merge_tree_bench

        assert merge_tree_bench.main(["--partitions", "3,20", "--keys", "5000", "--repeat", "1", "--name", "m"]) == 0
    finally:
        sys.modules.pop("merge_tree_bench", None)
    res = json.loads((tmp_path / "m.json").read_text())
    assert [r["partitions"] for r in res["rows"]] == [3, 20]
    assert all(
        r["fold_s"] > 0 and r["tree_s"] > 0 and r["fold_work_mib"] >= 0 <= r["tree_work_mib"] for r in res["rows"]
    )
    assert "| 20 | 5,000 |" in (tmp_path / "m.md").read_text()
