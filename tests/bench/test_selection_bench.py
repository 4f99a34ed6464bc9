"""bench/selection_bench.py runs end to end on two tiny time-sorted cells (one round): its figures
are the runs it recorded, and the one-day selection read fewer usage row groups than the whole
cell has, as the selection's own `_run.json` says."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_selection_bench_two_cells(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import _harness
    import selection_bench

    try:
        monkeypatch.setattr(_harness, "RESULTS", tmp_path)
        argv = ["--cells", "40000:2,80000:4", "--repeat", "1", "--name", "s", "--data", str(tmp_path / "data")]
        argv += ["--row-group", "4096"]
        assert selection_bench.main(argv) == 0
    finally:
        sys.modules.pop("selection_bench", None)
    res = json.loads((tmp_path / "s.json").read_text())
    assert [(c["windows"], c["days"]) for c in res["cells"]] == [(40_000, 2.0), (80_000, 4.0)]
    by = {(s["windows"], s["selection"]): s for s in res["summary"]}
    for (w, sel), s in by.items():
        (run,) = res["runs"][f"{w}/{sel}"]
        assert s["wall_s"] == run["wall_s"] > 0 and s["peak_rss_mib"] == run["peak_rss_mib"] > 30
        assert (s["read"] is None) == (sel == "whole cell")  # only a selection reports what it read
    for w in (40_000, 80_000):
        rd = by[w, "day 2"]["read"]
        assert 0 < rd["row_groups_read"] < rd["row_groups"] and 0 < rd["bytes_read"] < rd["bytes"]
    # the longer cell's day is a smaller share of its row groups
    small, big = by[40_000, "day 2"]["read"], by[80_000, "day 2"]["read"]
    assert big["row_groups_read"] / big["row_groups"] < small["row_groups_read"] / small["row_groups"]
    md = (tmp_path / "s.md").read_text()
    assert "| 40,000 |" in md and "peak RSS MiB" in md and "as the cell grows 2x" in md
