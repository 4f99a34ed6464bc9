"""bench/gil_bench.py: the CLI under py-spy, the GIL's share of its busy threads and where it is held."""

from __future__ import annotations

import pytest


def test_gil_bench_tiny(tiny_bench):
    from gil_bench import py_spy

    if py_spy() is None:
        pytest.skip("py-spy is not installed (it is in gpuclust's test extras)")
    res, md = tiny_bench(
        "gil_bench", ["--sizes", "2e4", "--repeat", "1", "--rate", "200", "--analyses", "usage-distribution,cpi"]
    )
    (row,) = res["rows"]
    m = row["median"]
    # the GIL's holder is one of the busy threads: its samples are fewer (another run, so not a strict bound)
    assert 0 < m["gil"]["seconds"] < 1.5 * m["active"]["seconds"] and m["active"]["wall_s"] > 0
    assert 0 < row["gil_share"] < 1.5 and row["ceiling_cores"] == pytest.approx(1 / row["gil_share"])
    frames = dict(row["top"])
    assert frames and all(f == "-" or "(gpuclust/" in f for f in frames) and sum(frames.values()) <= 1 + 1e-9
    assert row["analyses"] == ["usage-distribution", "cpi"] and "| 20,000 |" in md and "Environment:" in md
