"""``engine.tasks.DeviceHold``: the bound on what a run's merge trees hold in device memory, over
the trees of several tables (one hold serves them, one table after another), on the device-shaped
backend (tests/device_backend.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from device_backend import DEVICE

from gpuclust.analyses.base import to_host
from gpuclust.engine.local import merge_local
from gpuclust.engine.tasks import DeviceHold

N = 100  # float64s in a partial: 800 device bytes


def _analysis(label: str) -> Any:
    """What a merge tree and the hold ask of an analysis: a label and an elementwise merge."""
    return SimpleNamespace(label=label, kinds=SimpleNamespace(merge=lambda x, y: x + y))


def _run(hold: DeviceHold, parts: int = 4) -> tuple[list[Any], list[Any]]:
    """Two tables of ``parts`` partitions, each read by one analysis whose partials are device
    arrays, merged by :func:`merge_local` under ``hold``; the merged partials and the analyses."""
    a, b = _analysis("a"), _analysis("b")
    hold.ids = {id(a), id(b)}
    specs = {t: [SimpleNamespace(table=t, index=i, num_rows=1) for i in range(parts)] for t in ("ta", "tb")}
    plans = {"ta": ([0], specs["ta"]), "tb": ([1], specs["tb"])}

    def partials(spec: Any, sub: Any, ctxs: Any, spills: Any) -> list[Any]:
        return [hold.admit(x, DEVICE.xp.full(N, float(spec.index + 1))) for x in sub]

    merged = merge_local(plans, [a, b], [None, None], DEVICE, 1, None, partials, hold=hold)
    return merged, [a, b]


def test_a_finished_trees_merged_partials_count_against_the_next_trees() -> None:
    """Table ``ta``'s merged partial stays on the device until finalize, so the tree of ``tb``
    has the allowance less it: with room for two partials and a half (a tree of fan 8 holds one
    fold here, and a partial made waits beside it), ``tb``'s second partial does not fit beside
    ``ta``'s result and ``tb``'s fold, and ``b`` moves to the host; the sums are the same."""
    one = N * 8
    hold = DeviceHold(set(), 2 * one + one // 2)
    merged, (a, b) = _run(hold)
    assert hold.moved == ["b"]
    assert hold.peak <= hold.allowance() == 2 * one + one // 2
    assert hasattr(merged[0], "__cuda_array_interface__")  # a's merges stayed on the device
    assert isinstance(merged[1], np.ndarray)  # b's on the host
    want = np.full(N, float(1 + 2 + 3 + 4))
    np.testing.assert_array_equal(to_host(merged[0]), want)
    np.testing.assert_array_equal(merged[1], want)
    # with room for both trees' results and a partial on its way, nothing moves
    roomy = DeviceHold(set(), 3 * one)
    merged, _ = _run(roomy)
    assert roomy.moved == [] and all(hasattr(m, "__cuda_array_interface__") for m in merged)
    assert roomy.peak == 2 * one  # both results held at the end
    assert roomy.summary() == {"allowance": 3 * one, "peak": 2 * one, "merged_on_host": []}
