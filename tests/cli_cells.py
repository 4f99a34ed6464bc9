"""The command line as a user runs it, for tests: ``gpuclust(*args, cwd=...)`` and a small
synthetic cell ingested as ``ds`` in a folder (``cli_cell``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def gpuclust(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m gpuclust ARGS`` in ``cwd``, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "gpuclust", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def cli_cell(d: Path, *, machines: int, hours: float, seed: int) -> Path:
    """``gpuclust synth --out raw`` then ``gpuclust ingest raw --out ds`` in ``d``; returns ``d``."""
    for args in (
        ("synth", "--out", "raw", "--machines", str(machines), "--hours", str(hours), "--seed", str(seed), "--quiet"),
        ("ingest", "raw", "--out", "ds"),
    ):
        r = gpuclust(*args, cwd=d)
        assert r.returncode == 0, r.stderr[-2000:]
    return d
