"""The local engine's in-memory merge of small keyed partials (``gpuclust.engine.shards.DenseKeys``):
an analysis whose kinds declare ``dense`` keyed partials (machine-utilization) gets the same tables as when its
keyed partials are spilled to files and merged by the shards, whatever the partitioning; the
spilled path is the one whose results carry the independent references (DuckDB, slow code) of
tests/analyses/test_machine_utilization.py, and that file's random cells now run the dense path."""

from __future__ import annotations

import numpy as np
import pytest
from strategies import assert_results_same, random_cell

import gpuclust.analyses.machine_utilization as mu
from gpuclust.analyses.machine_utilization import MachineUtilization
from gpuclust.engine import run
from gpuclust.engine import shards as _shards
from gpuclust.engine.partition import TableSource


@pytest.fixture(scope="module")
def tables() -> dict:
    return random_cell(21, n_machines=30, n_windows=6000)


def _run(tables: dict, partitions: int, scheduler: str | None = None) -> dict:
    return run(
        TableSource(tables),
        [MachineUtilization(mode="notebook"), MachineUtilization(mode="time-weighted")],
        partitions=partitions,
        scheduler=scheduler,
    )


@pytest.mark.parametrize("partitions", [1, 4, 9])
def test_dense_merge_equals_the_spilled_merge(monkeypatch: pytest.MonkeyPatch, tables: dict, partitions: int) -> None:
    added: list[int] = []
    real_add = _shards.DenseKeys.add

    def spy(self: _shards.DenseKeys, keyed: dict) -> None:
        added.append(sum(int(p["key"].shape[0]) for p in keyed.values()))
        real_add(self, keyed)

    monkeypatch.setattr(_shards.DenseKeys, "add", spy)
    dense = _run(tables, partitions)
    assert len(added) == 2 * partitions and sum(added) > 0  # every partition of both modes merged in memory
    added.clear()
    monkeypatch.setattr(mu, "DENSE_CELLS", 0)  # too many machine-buckets: spilled, as before
    spilled = _run(tables, partitions)
    assert added == []
    assert_results_same(dense, spilled)
    # and a dask scheduler (always the spilled path) gives the same tables
    assert_results_same(_run(tables, partitions, scheduler="local:2"), dense)


def test_keys_outside_the_declared_range_are_refused() -> None:
    a = MachineUtilization()
    empty = a.kinds.split(a.empty())[1]["u"]
    acc = _shards.DenseKeys(a, {"u": (10, 20)})
    piece = {f: np.zeros(2, v.dtype) for f, v in empty.items()}
    piece["key"] = np.array([12, 25], np.int64)
    with pytest.raises(ValueError, match=r"keys outside \[10, 20\)"):
        acc.add({"u": piece})
