"""bench/kernels_bench.py runs end to end (tiny sizes) and writes what it reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def kernels_bench(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import _harness
    import kernels_bench

    monkeypatch.setattr(_harness, "RESULTS", tmp_path)
    yield kernels_bench
    sys.modules.pop("kernels_bench", None)


def _run(mod, tmp_path, backend):
    rc = mod.main(["--backend", backend, "--scale", "0.0002", "--repeat", "1", "--copy-gib", "0.01", "--name", "k"])
    assert rc == 0
    res = json.loads((tmp_path / "k.json").read_text())
    assert res["copy_bytes_per_s"] > 0
    ops = {r["op"] for r in res["rows"]}
    assert ops == {"bucket_overlap", "grouped_sum", "bincount", "grouped_comoments", "sort", "mixture_quantiles"}
    for r in res["rows"]:
        assert r["seconds"] > 0 and r["bytes"] > 0
        assert r["gb_per_s"] == pytest.approx(r["bytes"] / r["seconds"] / 1e9)
        assert r["fraction_of_copy"] == pytest.approx(r["gb_per_s"] * 1e9 / res["copy_bytes_per_s"])
    md = (tmp_path / "k.md").read_text()
    assert md.count("| bucket_overlap |") == 8 and md.count("| grouped_sum |") == 8 and "Copy bandwidth" in md
    assert md.count("runs of 30") == 4 and md.count("warp runs") == 3
    assert md.count("| bincount |") == 6 and md.count("gpuclust._xp.bincount") == 3
    assert md.count("7 series") == 2 and md.count("| mixture_quantiles |") == 5
    assert md.count("global variant forced") == 3
    # the mixture's event sort against a plain sort of as many keys (issue 34: >= 25% of its rate)
    sorts = {bool(r.get("plain")): r for r in res["rows"] if r["op"] == "sort"}
    assert sorts[True]["n"] == sorts[False]["n"] == 20 * (max(1000, int(1e7 * 0.0002)) // 2)
    share = sorts[False]["items_per_s"] / sorts[True]["items_per_s"]
    assert f"runs at **{100 * share:.0f}%** of the plain sort's keys per second" in md
    return res


def test_rows_in_runs_share_their_cell(kernels_bench):
    """The layout-ordered cases: 30 consecutive rows a run, one group and consecutive 300 s windows."""
    d = kernels_bench._intervals(np, 95, 7, 100, 300 * 10**6, False, runs=30)
    for r in range(4):
        run = slice(30 * r, 30 * r + 30)
        assert len(set(d["group"][run].tolist())) == 1
        assert (np.diff(d["start"][run]) == 300 * 10**6).all() and (d["end"] - d["start"] == 300 * 10**6).all()
    assert len(set(d["group"][::30].tolist())) > 1


def test_cpu(kernels_bench, tmp_path):
    assert _run(kernels_bench, tmp_path, "cpu")["backend"] == "cpu"


@pytest.mark.gpu
def test_gpu(kernels_bench, tmp_path, gpu_backend):
    res = _run(kernels_bench, tmp_path, "gpu")
    assert res["environment"]["gpu"]
