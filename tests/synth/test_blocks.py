"""The synthesizer's usage blocks (gpuclust/synth/blocks.py): a block holds at most
``BLOCK_WINDOWS`` usage windows (unless one grid cell has more), so a bigger cell gets shorter
blocks and synth's memory stays flat (bench/results/synth.md); small cells keep the fixed
``block_cells``-long blocks, so their shards do not change."""

from __future__ import annotations

import numpy as np
import pytest

from gpuclust.schema import TRACE_OFFSET_US
from gpuclust.synth import SynthConfig
from gpuclust.synth import model as M
from gpuclust.synth import usage as U
from gpuclust.synth.blocks import block_starts, windows_per_cell


@pytest.fixture(scope="module")
def cell():
    md = M.Model(SynthConfig(machines=20, hours=1, seed=11), np.random.default_rng(11))
    md.run()
    g_first, g_last = TRACE_OFFSET_US // U.CELL_US, -(-md.t_end // U.CELL_US)
    return md, g_first, g_last


def test_windows_per_cell_bounds_the_windows_of_each_cell(cell):
    md, g_first, g_last = cell
    iv = md.intervals()
    w = U.enumerate_windows(iv, g_first, g_last, md.t_end)
    got = np.bincount(w["cell"] - g_first, minlength=g_last - g_first)
    bound = windows_per_cell(iv, g_first, g_last, md.t_end)
    assert got.sum() > 1000 and (bound >= got).all() and bound.sum() <= 1.05 * got.sum()
    for g in (g_first, g_first + 3, g_last - 1):  # and cell by cell, as a block of one cell sees it
        assert U.enumerate_windows(iv, g, g + 1, md.t_end)["cell"].size == got[g - g_first] <= bound[g - g_first]


def test_blocks_are_at_most_the_limit_and_the_longest():
    per = np.array([10, 10, 10, 50, 5, 5, 5, 5, 5, 100, 1, 1])
    assert block_starts(per, 7, longest=4, limit=10**6) == [7, 11, 15]  # no limit reached: fixed blocks
    starts = block_starts(per, 7, longest=4, limit=30)
    assert starts == [7, 10, 11, 15, 16, 17]
    ends = [*starts[1:], 7 + per.size]
    for a, b in zip(starts, ends, strict=True):
        assert 1 <= b - a <= 4 and (per[a - 7 : b - 7].sum() <= 30 or b - a == 1)


def test_small_cells_keep_fixed_blocks(cell):
    md, g_first, g_last = cell
    per = windows_per_cell(md.intervals(), g_first, g_last, md.t_end)
    assert block_starts(per, g_first, 12) == list(range(g_first, g_last, 12))
    assert block_starts(per, g_first, 12, limit=int(per.max())) != list(range(g_first, g_last, 12))
