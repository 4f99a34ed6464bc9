"""One small synthetic cell made by the command line (``cli_cells.cli_cell``: 12 machines, 1 h,
seed 4; its raw v3 shards in ``raw``, their ingest in ``ds``), built once per pytest run
(:func:`run_once.once_per_run`) and read-only, shared by the command-line tests of ``gpuclust
report``, ``gpuclust claims`` and the no-figure reasons: each links its ``ds`` into a folder of
its own (:func:`linked`) or copies the whole cell to change it (:func:`writable_copy`)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from cli_cells import cli_cell
from run_once import once_per_run

MACHINES, HOURS, SEED = 12, 1, 4


def small_cell(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cell's folder (``raw`` and ``ds``), read-only."""
    return once_per_run(
        tmp_path_factory,
        f"cli-cell-{MACHINES}x{HOURS}h-{SEED}",
        lambda d: cli_cell(d, machines=MACHINES, hours=HOURS, seed=SEED),
        read_only=True,
    )


def linked(cell: Path, folder: Path) -> Path:
    """``folder`` (made) with the cell's read-only dataset linked in as ``ds``: commands run there
    read ``ds`` and write their outputs beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ds").symlink_to(cell / "ds", target_is_directory=True)
    return folder


def writable_copy(cell: Path, folder: Path) -> Path:
    """A copy of the whole cell at ``folder`` (file times kept, as ingest's skip check reads
    them), writable by its owner."""
    shutil.copytree(cell, folder)
    for root, dirs, files in os.walk(folder):
        for n in [".", *dirs, *files]:
            p = os.path.join(root, n)
            if not os.path.islink(p):
                os.chmod(p, stat.S_IMODE(os.stat(p).st_mode) | 0o200)
    return folder
