"""A gpu run's device work and traffic per analysis do not grow with the windows.

On a device every array operation is at least one kernel launch (~10 us of host time through
CuPy) and every device value read on the host waits for the device.  An analysis that loops in
Python over rows, blocks, groups or row groups would make a 10^7-window gpu run launch-bound,
which no test without a device sees in its timings; one that copies partials or lookups back and
forth would be bound by the bus.  So the device-shaped backend (tests/device_backend.py) counts,
for each registered analysis in a fresh study (its partials marked as the gpu's, so the finalizes
that run on a device run on the device-shaped backend and count too), over the same cell with 4x
the windows:

* the cold run's host-to-device bytes (its columns loaded, its contexts staged): the bytes added
  by the extra windows are at most 1.2x what the columns it reads add (issue 34's target), and
  in all at most 1.2x its columns plus a fixed allowance for contexts;
* the warm run's operations, backend ops (``backend.ops`` calls) and host syncs: the same at both sizes (one
  resident partition each), and within a budget that keeps the launch overhead to milliseconds;
* the warm run's device-to-host bytes: growing no faster than its result tables (the results
  leave the device; partials and lookups do not).

docs/user/gpu.md ("Launches, syncs and copies") lists the counts; ``bench/device_budget.py`` measures
the same at 10^6 and 4x10^6 windows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from device_backend import (
    DEVICE,
    column_bytes,
    counting_device_work,
    mark_partials_gpu,
    resolve_gpu_to_device,
    result_bytes,
)
from run_once import once_per_run
from strategies import random_cell, write_dataset

import gpuclust
from gpuclust.analyses.registry import create, names
from gpuclust.dataset import Dataset

#: Per analysis run: device-array operations (launches) and host syncs.  The most any analysis
#: makes today: 1,710 operations and 288 syncs, 102 of them the counts that size data-sized
#: selections (overcommit: its finalize builds a flat source's running intervals on the device,
#: then the dense chunks a column and a tier column at a time).
OPS_BUDGET = 2000
SYNCS_BUDGET = 300
#: issue 34: host-to-device bytes <= 1.2x the bytes of the columns read; d2h growth <= 1.2x
COPY_RATIO = 1.2
#: bytes any run may copy whatever its size: contexts (tier maps, machine lists), constants
FIXED_BYTES = 64 << 10
SIZES = (12000, 48000)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Each analysis' counts at both sizes, counted once per pytest run (:func:`run_once.once_per_run`:
    written as JSON, which every xdist worker reads)."""

    def build(folder: Path) -> Path:
        (folder / "work.json").write_text(json.dumps(_count(folder), default=int))
        return folder / "work.json"

    counts = json.loads(once_per_run(tmp_path_factory, "device-work", build).read_text())
    return {int(n): by_analysis for n, by_analysis in counts.items()}


def _count(folder: Path) -> dict[int, dict[str, dict[str, int]]]:
    mp = pytest.MonkeyPatch()
    resolve_gpu_to_device(mp)
    mark_partials_gpu(mp)  # the finalizes that run on a device run on the device-shaped backend, counted
    out: dict[int, dict[str, dict[str, int]]] = {}
    try:
        for n in SIZES:
            ds = Dataset(
                write_dataset(
                    folder / f"cell{n}", random_cell(23, n_windows=n, measures=True), files=3, row_group_size=500
                )
            )
            out[n] = {}
            for a in names():
                study = gpuclust.open(ds, backend=DEVICE, workers=1)
                with counting_device_work() as w:
                    study.run(a)  # cold: its columns loaded, its contexts built and staged
                h2d = int(w["h2d_bytes"])
                assert all(len(g) == 1 for g in study._groups.values())  # one resident partition a table
                with counting_device_work() as w:
                    res = study.run(a)[a]
                out[n][a] = {**w, "h2d_cold": h2d, "columns": column_bytes(ds, create(a)), "result": result_bytes(res)}
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


@pytest.mark.parametrize("analysis", names())
def test_host_to_device_bytes_follow_the_columns_read(work, analysis):
    small, large = (work[n][analysis] for n in SIZES)
    for w in (small, large):
        assert w["h2d_cold"] <= COPY_RATIO * w["columns"] + FIXED_BYTES, w
    # what 3x more windows add is what their columns add, not lookups or partials copied over
    assert large["h2d_cold"] - small["h2d_cold"] <= COPY_RATIO * (large["columns"] - small["columns"]) + FIXED_BYTES, (
        small,
        large,
    )


@pytest.mark.parametrize("analysis", names())
def test_device_to_host_bytes_follow_the_results(work, analysis):
    small, large = (work[n][analysis] for n in SIZES)
    growth = max(1.0, large["result"] / max(1, small["result"]))
    assert large["d2h_bytes"] <= COPY_RATIO * growth * small["d2h_bytes"] + FIXED_BYTES, (small, large)


DOC = Path(__file__).resolve().parents[2] / "docs" / "user" / "gpu.md"
DOC_HEADER = (
    "| analysis | array operations | backend ops | host syncs | h2d / columns, bytes | d2h 12,000 | d2h 48,000 |"
)


def counts_table(work: dict[int, dict[str, dict[str, int]]]) -> list[str]:
    """The rows of docs/user/gpu.md's table of counts ("Launches, syncs and copies")."""
    rows = []
    for a in names():
        small, large = (work[n][a] for n in SIZES)
        rows.append(
            f"| {a} | {large.get('ops', 0):,} | {large.get('kernels', 0):,} | {large.get('syncs', 0):,} | "
            f"{large['h2d_cold']:,} / {large['columns']:,} | {small['d2h_bytes']:,} | {large['d2h_bytes']:,} |"
        )
    return rows


def test_the_documented_counts_are_the_measured_ones(work):
    """docs/user/gpu.md's table of counts is what this module measures (else the message is the
    table to paste there)."""
    lines = DOC.read_text().splitlines()
    at = lines.index(DOC_HEADER) + 2
    documented = lines[at : at + len(names())]
    measured = counts_table(work)
    assert documented == measured, "docs/user/gpu.md's counts, as measured now:\n" + "\n".join(measured)


def test_counting_sees_a_python_loop_over_rows():
    """The counter is not blind: a per-row loop on device arrays counts a gather and a sync a row."""
    import numpy as np

    x = DEVICE.asarray(np.arange(50.0))
    with counting_device_work() as w:
        total = sum(float(x[np.array([i])][0]) for i in range(50))
    assert total == float(np.arange(50.0).sum())
    assert w["ops"] >= 50 and w["syncs"] >= 50


def test_counting_sees_copies_both_ways():
    """The byte counters are not blind: a host array staged and indexed in, a result read out."""
    import numpy as np

    with counting_device_work() as w:
        x = DEVICE.stage(np.arange(1000.0))  # 8,000 bytes in
        y = x[np.arange(10)]  # an 80-byte host index in
        DEVICE.to_host(y)  # 80 bytes out
        float(x.sum())  # a sync: 8 bytes out
    assert w["h2d_bytes"] == 8000 + 80 and w["d2h_bytes"] == 80 + 8
