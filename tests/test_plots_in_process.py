"""Every registered analysis' plot, drawn in this process (the suite turns warnings into errors,
so a Matplotlib warning fails here), on a random cell: a PNG when it says it drew one."""

from __future__ import annotations

import pytest
from strategies import random_cell

from gpuclust.analyses import REGISTRY
from gpuclust.engine import TableSource, run
from gpuclust.report.plots import plot_result


@pytest.fixture(scope="module")
def results():
    return run(TableSource(random_cell(11, n_windows=3000)), sorted(REGISTRY))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_plot_draws_without_warnings(results, name, tmp_path):
    path = tmp_path / f"{name}.png"
    drew = plot_result(name, results[name], path, title=f"{name} (random cell)")
    assert isinstance(drew, bool)
    if drew:
        assert path.stat().st_size > 1000
    else:
        assert not path.exists()
