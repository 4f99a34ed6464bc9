"""``gpuclust analyze`` run as the program ends with ``os._exit`` after its exit handlers
(gpuclust/cli.py ``_exit_now``): the same files and output as an ordinary exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from strategies import random_cell, write_dataset

from gpuclust.dataset import Dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return Dataset(write_dataset(tmp_path_factory.mktemp("fast_exit"), random_cell(7, n_windows=5_000)))


def _run(dataset: Dataset, out: Path, fast: str) -> subprocess.CompletedProcess[str]:
    import os

    cmd = [
        sys.executable,
        "-m",
        "gpuclust.cli",
        "analyze",
        str(dataset.path),
        "cell-usage",
        "machine-shapes",
        "--out",
        str(out),
        "--no-plots",
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "GPUCLUST_FAST_EXIT": fast})


def test_fast_exit_writes_and_prints_what_an_ordinary_exit_does(dataset: Dataset, tmp_path: Path) -> None:
    fast, slow = _run(dataset, tmp_path / "fast", "1"), _run(dataset, tmp_path / "slow", "0")
    assert fast.returncode == slow.returncode == 0, fast.stderr + slow.stderr
    assert fast.stdout == slow.stdout and fast.stdout.strip()  # piped stdout flushed before os._exit
    files = sorted(p.relative_to(tmp_path / "fast") for p in (tmp_path / "fast").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "slow") for p in (tmp_path / "slow").rglob("*") if p.is_file())
    for f in files:
        if f.suffix == ".parquet":
            assert (tmp_path / "fast" / f).read_bytes() == (tmp_path / "slow" / f).read_bytes()
    # no temporary folder left beside the results
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fast", "slow"]


def test_a_failed_run_exits_as_before(dataset: Dataset) -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "gpuclust.cli", "analyze", str(dataset.path), "no-such-analysis"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
