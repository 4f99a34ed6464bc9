"""The wheel ships every CUDA source, and the installed loader finds them there; the command's
process settings (OpenBLAS threads) stay out of programs that import the library."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_contains_kernels_and_loader_finds_them(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "No matching distribution found for hatchling" in proc.stderr:
        pytest.skip("cannot fetch the build backend (hatchling) here")
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = next(tmp_path.glob("gpuclust-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = sorted(p.name for p in (ROOT / "kernels").iterdir() if p.suffix in (".cu", ".cuh"))
    assert sources, "no kernel sources in kernels/"
    for s in sources:
        assert f"gpuclust/kernels/{s}" in names, s
    # Unpacked alone (no source checkout beside it), the loader finds and inlines every kernel.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import gpuclust._kernels as k, pathlib;"
        "d = k.kernels_dir(); assert pathlib.Path(d).parent.name == 'gpuclust', d;"
        "[k.load_source(f) for f in k.INSTANTIATIONS]; print(len(k.INSTANTIATIONS))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip()) == len([s for s in sources if s.endswith(".cu")])


@pytest.mark.parametrize(("orig_argv", "argv0", "program"), [
    (["python", "-m", "gpuclust.cli", "analyze"], "-m", True),
    (["python", "-m", "gpuclust", "analyze"], "-m", True),
    (["/venv/bin/python", "/venv/bin/gpuclust", "analyze"], "/venv/bin/gpuclust", True),
    (["python", "-c", "import gpuclust"], "-c", False),
    (["python", "-m", "pytest"], "-m", False),
    (["python", "notebook.py"], "notebook.py", False)])
def test_the_command_is_told_from_a_program_importing_the_library(monkeypatch: pytest.MonkeyPatch,
                                                                  orig_argv: list[str], argv0: str,
                                                                  program: bool) -> None:
    """Only the command sets ``OPENBLAS_NUM_THREADS`` (to 1, unless set: docs/scale.md, "Start-up")."""
    import gpuclust

    monkeypatch.setattr(sys, "orig_argv", orig_argv, raising=False)
    monkeypatch.setattr(sys, "argv", [argv0])
    assert gpuclust._as_program() is program


def test_the_command_runs_openblas_single_threaded_and_the_library_does_not_touch_it() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    code = "import os, gpuclust; print(os.environ.get('OPENBLAS_NUM_THREADS'))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert p.stdout.strip() == "None"
    # the command: `python -m gpuclust.cli` (what the README's commands run) sees 1, or the user's value
    code = ("import sys; sys.argv = ['gpuclust', '--version']  # as the console script's\n"
            "import gpuclust, os; print(os.environ.get('OPENBLAS_NUM_THREADS'))")
    for user, want in ((None, "1"), ("4", "4")):
        e = env if user is None else {**env, "OPENBLAS_NUM_THREADS": user}
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, check=True)
        assert p.stdout.strip() == want
