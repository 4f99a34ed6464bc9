"""bench/cluster_bench.py runs end to end on a tiny dataset: the CLI on a LocalCluster and in-process,
their tables compared, the client's memory reported apart from the workers'."""

from __future__ import annotations


def test_cluster_bench_tiny(tiny_bench):
    res, md = tiny_bench("cluster_bench", ["--sizes", "2e4", "--repeat", "1"])
    (row,) = res["rows"]
    assert row["equal"] is True and row["differ"] == []
    for mode in ("local", "local:2"):
        m = row["median"][mode]
        assert m["wall_s"] > 0 and 50 < m["client_hwm_mib"] <= m["tree_peak_mib"]
    # the workers are processes of their own: the tree's peak is above the client's alone
    assert row["median"]["local:2"]["tree_peak_mib"] > row["median"]["local:2"]["client_hwm_mib"]
    assert row["client_growth"] == 1.0 and "| 20,000 | local:2 |" in md and "Environment:" in md


def test_same_results_sees_a_changed_value(tmp_path):
    import sys
    from pathlib import Path

    import pandas as pd

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from cluster_bench import same_results

    for d, v in (("a", 1.0), ("b", 1.0), ("c", 1.5)):
        (tmp_path / d / "x").mkdir(parents=True)
        pd.DataFrame({"k": [2, 1], "v": [v, 2.0]}).to_parquet(tmp_path / d / "x" / "t.parquet")
    assert same_results(tmp_path / "a", tmp_path / "b") == (True, [])
    assert same_results(tmp_path / "a", tmp_path / "c") == (False, ["x/t.parquet:v"])
