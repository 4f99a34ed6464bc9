"""``gpuclust analyze --backend gpu`` end to end without a device: the device-shaped backend
(tests/device_backend.py) under the gpu's name, so the command takes the gpu's path (partitions
decoded on several threads and copied through pinned buffers, partials computed on "the device",
finalizes run there) and meets the device's refusals (a host array beside a device one, an
implicit conversion).  Its result folder equals ``--backend cpu``'s."""

from __future__ import annotations

import json

from device_backend import counting_device_work, resolve_gpu_to_device
from strategies import assert_results_same, random_cell, write_dataset

from gpuclust import cli, load_results
from gpuclust.analyses.registry import names
from gpuclust.parted import PartedTable


def test_analyze_backend_gpu_equals_cpu(tmp_path, monkeypatch):
    ds = write_dataset(tmp_path / "cell", random_cell(29, n_windows=6000), files=3, row_group_size=500)
    args = ["analyze", str(ds), *names(), "--partitions", "3", "--no-plots", "--quiet"]
    assert cli.main([*args, "--out", str(tmp_path / "cpu"), "--backend", "cpu"]) == 0
    resolve_gpu_to_device(monkeypatch)
    with counting_device_work() as w:
        assert cli.main([*args, "--out", str(tmp_path / "gpu"), "--backend", "gpu"]) == 0
    assert w["ops"] > 1000 and w["kernels"] > 0 and w["h2d_bytes"] > 0
    runs = {b: json.loads((tmp_path / b / "_run.json").read_text()) for b in ("cpu", "gpu")}
    assert runs["gpu"]["backend"] == "gpu"
    res = {b: _tables(load_results(tmp_path / b)) for b in ("cpu", "gpu")}
    assert res["gpu"].keys() == res["cpu"].keys() == set(names())
    for a in names():  # (a table that grows with the cell may be cut in other parts: larger shards on a device)
        assert res["gpu"][a].keys() == res["cpu"][a].keys(), a
    assert_results_same(res["cpu"], res["gpu"], rtol=1e-9)


def _tables(results: dict) -> dict:
    return {a: {t: v.read() if isinstance(v, PartedTable) else v for t, v in ts.items()} for a, ts in results.items()}
