"""The linters the project keeps clean, run as tests so CI holds every change to them: ruff over
the sources, tests and benchmarks, checked and formatted (settings in pyproject.toml), and mypy over the package."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec(module) is None:  # a failure, not a skip: the README's test command installs it
        pytest.fail(f"{module} is missing: it is in the test extra (pip install -e '.[test]')")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_is_clean() -> None:
    r = _run("ruff", "check", "gpuclust", "tests", "bench")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_is_clean() -> None:
    """The code is laid out by `ruff format` (settings in pyproject.toml): run it before committing."""
    r = _run("ruff", "format", "--check", "gpuclust", "tests", "bench")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_is_clean(tmp_path: Path) -> None:
    r = _run("mypy", "--cache-dir", str(tmp_path / "cache"), "gpuclust")
    assert r.returncode == 0, r.stdout + r.stderr
