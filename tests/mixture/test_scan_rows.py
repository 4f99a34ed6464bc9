"""The mixture inversion's row scans (``mixture_cpu._scan_rows``): the bits of NumPy's
``accumulate(axis=1)``, and the GIL released while a few long rows are scanned, so that the
engine's other partition threads run meanwhile."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

from gpuclust.backends import mixture_cpu
from gpuclust.backends.mixture_cpu import _scan_rows


@pytest.mark.parametrize("rows", [1, 3, mixture_cpu._ROW_SCAN_MAX_ROWS, mixture_cpu._ROW_SCAN_MAX_ROWS + 1])
@pytest.mark.parametrize("ufunc", [np.add, np.maximum])
def test_the_bits_of_accumulate_along_the_rows(rows, ufunc):
    rng = np.random.default_rng(rows)
    ev = rng.standard_normal((rows, 700, 4)) * 10.0 ** rng.integers(-8, 8, (rows, 700, 1))
    a = ev[..., 1]  # a strided view, as the inversion's event records give it
    want = ufunc.accumulate(a, axis=1)
    assert np.array_equal(_scan_rows(ufunc, a), want)
    out = np.full(a.shape, np.nan)
    assert _scan_rows(ufunc, a, out=out) is out and np.array_equal(out, want)
    inplace = np.ascontiguousarray(a)
    assert _scan_rows(ufunc, inplace, out=inplace) is inplace and np.array_equal(inplace, want)


def test_a_few_long_rows_are_scanned_without_the_gil():
    """While one thread scans a long row (in place, as the inversion's second scan does), another
    Python thread keeps running: it is held up only between the scans, not for their length."""
    a = np.random.default_rng(0).random((1, 1 << 23))
    _scan_rows(np.add, a.copy(), out=None)  # (pages touched once)
    busy = threading.Event()
    scanning = [0.0]

    def scan():
        busy.set()
        t0 = time.perf_counter()
        for _ in range(6):
            _scan_rows(np.add, a, out=a)
        scanning[0] = time.perf_counter() - t0

    th = threading.Thread(target=scan)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # (between two scans this thread soon hands the GIL back)
    try:
        th.start()
        busy.wait()
        ticks, t0 = 0, time.perf_counter()
        while th.is_alive():
            ticks += 1
        spun = time.perf_counter() - t0
        th.join()
    finally:
        sys.setswitchinterval(switch)
    ticks_alone, t1 = 0, time.perf_counter()
    while time.perf_counter() - t1 < spun:
        ticks_alone += 1
    # with the GIL held through each scan this thread ticks only between scans: 0.2-0.3% of its
    # ticks alone on the dev VM (checked with the 2-D scan); released, 40-43%
    assert scanning[0] > 0.05 and ticks > 0.1 * ticks_alone, (ticks, ticks_alone, scanning[0])
