"""bench/synth_bench.py runs end to end on two tiny cells (one round): each size's figures are the
run it recorded, its windows the synthesizer's own count, its peak RSS that of a live process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_synth_bench_two_sizes(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import _harness
    import synth_bench

    try:
        monkeypatch.setattr(_harness, "RESULTS", tmp_path)
        argv = ["--machines", "6,12", "--hours", "0.5", "--workers", "1", "--repeat", "1", "--name", "s"]
        assert synth_bench.main(argv) == 0
    finally:
        sys.modules.pop("synth_bench", None)
    res = json.loads((tmp_path / "s.json").read_text())
    small, big = res["summary"]
    assert (small["machines"], big["machines"]) == (6, 12)
    assert 0 < small["usage_windows"] < big["usage_windows"]
    for s in res["summary"]:
        (run,) = res["runs"][str(s["machines"])]
        assert s["wall_s"] == run["wall_s"] > 0 and s["peak_rss_mib"] == run["peak_rss_mib"] > 30  # Python + NumPy
        assert s["windows_per_min"] == round(s["usage_windows"] / s["wall_s"] * 60)
    # the same cell as the command makes it (the bench reads the count from its synth_truth.json)
    from gpuclust.synth import SynthConfig, synthesize

    want = synthesize(SynthConfig(machines=6, hours=0.5, seed=0), tmp_path / "ref", progress=None)
    assert small["usage_windows"] == want.truth["usage"]["windows"]
    md = (tmp_path / "s.md").read_text()
    assert "| 6 | 0.5 | 1 |" in md and "peak RSS MiB" in md and "Environment:" in md
