"""A gpu study's device work per analysis run does not grow with the data.

On a device every array operation is at least one kernel launch (~10 us of host time through
CuPy) and every device value read on the host waits for the device.  An analysis that loops in
Python over rows, blocks, groups or row groups would make a 10^7-window gpu run launch-bound,
which no test without a device sees in its timings.  So the device-shaped backend
(tests/device_backend.py) counts the operations, custom kernels and host syncs of a warm study
run of each registered analysis (its partials marked as the gpu's, so the finalizes that run on
a device run on the device-shaped backend and count too), over the same cell with 4x the
windows: the counts must be the same (one resident partition each), and within a budget that
keeps the launch overhead to about ten milliseconds.  docs/gpu.md ("Launches and syncs") lists the counts.
"""

from __future__ import annotations

import pytest
from device_backend import DEVICE, counting_device_work, mark_partials_gpu, resolve_gpu_to_device
from strategies import random_cell, write_dataset

import gpuclust
from gpuclust.analyses.registry import names
from gpuclust.dataset import Dataset

#: Per analysis run: device-array operations (launches) and host syncs.  The most any analysis
#: makes today: 960 operations and 207 syncs (overcommit: its finalize's dense chunk, a column
#: and a tier column at a time, on the device).
OPS_BUDGET = 1200
SYNCS_BUDGET = 300
SIZES = (3000, 12000)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    resolve_gpu_to_device(mp)
    mark_partials_gpu(mp)  # the finalizes that run on a device run on the device-shaped backend, counted
    out: dict[int, dict[str, dict[str, int]]] = {}
    try:
        for n in SIZES:
            path = write_dataset(tmp_path_factory.mktemp(f"cell{n}"), random_cell(23, n_windows=n), files=3,
                                 row_group_size=500)
            study = gpuclust.open(Dataset(path), backend=DEVICE, workers=1).persist()
            assert all(len(g) == 1 for g in study._groups.values())  # one resident partition a table
            out[n] = {}
            for a in names():
                study.run(a)  # contexts built, then a warm run counted
                with counting_device_work() as w:
                    study.run(a)
                out[n][a] = dict(w)
            study.close()
    finally:
        mp.undo()
    return out


@pytest.mark.parametrize("analysis", names())
def test_device_work_does_not_grow_with_the_windows(work, analysis):
    small, large = (work[n][analysis] for n in SIZES)
    assert large.get("ops", 0) > 0
    for kind in ("ops", "kernels", "syncs"):
        assert large.get(kind, 0) == small.get(kind, 0), (kind, small, large)


@pytest.mark.parametrize("analysis", names())
def test_device_work_within_budget(work, analysis):
    w = work[SIZES[-1]][analysis]
    assert w.get("ops", 0) <= OPS_BUDGET and w.get("syncs", 0) <= SYNCS_BUDGET, w


def test_counting_sees_a_python_loop_over_rows():
    """The counter is not blind: a per-row loop on device arrays counts a gather and a sync a row."""
    import numpy as np

    x = DEVICE.asarray(np.arange(50.0))
    with counting_device_work() as w:
        total = sum(float(x[np.array([i])][0]) for i in range(50))
    assert total == float(np.arange(50.0).sum())
    assert w["ops"] >= 50 and w["syncs"] >= 50
