"""The generic and device-shaped test backends refuse what CuPy and its arrays refuse (so the
checks run on them can fail), and ``gpuclust._xp`` works on them."""

from __future__ import annotations

import numpy as np
import pytest
from device_backend import DEVICE, DeviceArray
from generic_backend import GENERIC, SHAPED_XP

from gpuclust._xp import bincount
from gpuclust.schema import EventType


def test_the_shaped_module_refuses_what_cupy_refuses():
    xp = SHAPED_XP
    with pytest.raises(ValueError, match="empty"):
        xp.bincount(np.zeros(0, np.int64), minlength=3)
    with pytest.raises(AttributeError):
        xp.lexsort((np.array([1, 0]), np.array([0, 0])))
    with pytest.raises(ValueError, match="repeats"):
        xp.repeat(np.arange(3), np.array([1, 0, 2]))
    for bad in (
        lambda: xp.maximum.reduceat(np.arange(4), [0, 2]),
        lambda: xp.maximum.accumulate(np.arange(4)),
        lambda: xp.minimum.accumulate(np.arange(4)),
    ):
        with pytest.raises(NotImplementedError):
            bad()
    # ... and accepts what CuPy accepts, with NumPy's results
    assert xp.bincount(np.array([1, 1]), minlength=3).tolist() == [0, 2, 0]
    assert xp.lexsort(np.array([[1, 0, 1], [0, 0, -1]])).tolist() == [2, 1, 0]
    assert xp.repeat(np.arange(2), 2).tolist() == [0, 0, 1, 1]
    assert xp.add.reduceat(np.arange(4), [0, 2]).tolist() == [1, 5]
    assert xp.add.accumulate(np.arange(4)).tolist() == [0, 1, 3, 6]
    assert xp.maximum(np.array([1, 5]), 3).tolist() == [3, 5]
    assert GENERIC.xp is xp and GENERIC.name == "cpu" and GENERIC.ops.lookup_slot_tables is False


@pytest.mark.parametrize("weights", [None, np.array([], np.float64)])
def test_xp_bincount_of_nothing(weights):
    for xp in (np, SHAPED_XP):
        out = bincount(xp, np.zeros(0, np.int64), weights, 4)
        assert out.tolist() == [0, 0, 0, 0]
        assert out.dtype == (np.int64 if weights is None else np.float64)
    x, w = np.array([3, 0, 3]), np.array([0.5, 1.0, 2.0])
    assert bincount(SHAPED_XP, x, w, 2).tolist() == np.bincount(x, w, 2).tolist() == [1.0, 0.0, 0.0, 2.5]


def test_device_arrays_refuse_host_arrays_and_implicit_conversion():
    xp = DEVICE.xp
    d = DEVICE.asarray(np.arange(4))
    assert isinstance(d, DeviceArray) and isinstance(xp.zeros(2), DeviceArray)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(d)
    for bad in (
        lambda: d + np.arange(4),
        lambda: xp.where(d > 1, np.ones(4), 0),
        lambda: xp.concatenate([d, np.arange(2)]),
        lambda: xp.searchsorted(d, np.array([1, 2])),
    ):
        with pytest.raises(TypeError, match="host array"):
            bad()
    with pytest.raises(NotImplementedError):
        np.maximum.accumulate(d)
    for bad in (lambda: d == EventType.SUBMIT, lambda: d != EventType.KILL, lambda: xp.maximum(d, EventType.FAIL)):
        with pytest.raises(TypeError, match="NotImplemented"):  # an IntEnum member is no CuPy scalar
            bad()
    with pytest.raises(ValueError, match="empty"):
        xp.bincount(d[:0])
    # what CuPy allows: scalars, device operands, explicit copies both ways, the ops on device arrays
    assert DEVICE.to_host(xp.where(d > 1, d * 2, 0)).tolist() == [0, 0, 4, 6]
    assert DEVICE.to_host(xp.concatenate([d, DEVICE.stage(np.array([9]))])).tolist() == [0, 1, 2, 3, 9]
    assert DEVICE.to_host(d == int(EventType.SCHEDULE)).tolist() == [False, False, False, True]
    assert int(d.sum()) == 6 and d.shape == (4,) and d.dtype == np.int64
    out = xp.full(3, -1)
    DEVICE.ops.scatter_max(out, DEVICE.asarray(np.array([0, 2, 2])), DEVICE.asarray(np.array([5, 1, 7])))
    assert DEVICE.to_host(out).tolist() == [5, -1, 7]
    assert DEVICE.to_host(bincount(xp, d[:0], None, 2)).tolist() == [0, 0]
