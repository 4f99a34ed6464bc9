"""The wheel ships every CUDA source, and the installed loader finds them there; the command's
process settings (OpenBLAS threads) stay out of programs that import the library."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _copy_source(dst: Path) -> Path:
    """The project's source (not its venv, data, builds or caches), to build from: a build writes
    into the tree it builds (``build/``, ``*.egg-info``), which must not be the checkout others use."""
    skip = shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", "data", ".*_cache", ".hypothesis"
    )
    return Path(shutil.copytree(ROOT, dst, ignore=skip))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``pip wheel`` builds from a copy of the source (setuptools, setup.py's extension)."""
    src = _copy_source(tmp_path_factory.mktemp("src") / "gpuclust")
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0 and "No matching distribution found for setuptools" in proc.stderr:
        pytest.skip("cannot fetch the build backend (setuptools) here")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return next(out.glob("gpuclust-*.whl"))


@pytest.mark.slow
def test_wheel_contains_kernels_and_loader_finds_them(wheel: Path, tmp_path: Path) -> None:
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
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip()) == len([s for s in sources if s.endswith(".cu")])


_USAGE_LINE = (
    '{{"start_time":"{t}","end_time":"{e}","collection_id":"477319772031","instance_index":"{i}",'
    '"machine_id":"32434369549","alloc_collection_id":"0","collection_type":"0",'
    '"average_usage":{{"cpus":0.0637732,"memory":0.0095003}},"maximum_usage":{{"cpus":0.2123632,"memory":0.009551}},'
    '"random_sample_usage":{{"cpus":0.0231088}},"assigned_memory":0.018528,"page_cache_memory":0.0005518,'
    '"cycles_per_instruction":1.71071,"memory_accesses_per_instruction":0.0122081,"sample_rate":1,'
    '"cpu_usage_distribution":[0.0204756,0.0347219,0.0403137,0.0465799,0.051505,0.0580301,0.0639032,'
    '0.0702573,0.0825102,0.0993762,0.2123632],"tail_cpu_usage_distribution":[0.102765,0.1080336,0.1135926,'
    "0.1189096,0.1228147,0.1268398,0.136508,0.1444362,0.1652012]}}"
)


@pytest.mark.slow
def test_the_first_ingest_after_installing_uses_the_reader_built_at_install(wheel: Path, tmp_path: Path) -> None:
    """The InstanceUsage JSON reader is compiled when the package is built (setup.py's C
    extension), so the first ``gpuclust ingest`` after installing runs as the next ones do: it
    loads the extension, imports no numba (no compile), starts no background build and writes
    nothing into the installed package (issue 33: the first run took 23 s where the second took
    5.9, compiling numba's kernel, then building a shared library into site-packages)."""
    if not any(shutil.which(c) for c in (os.environ.get("CC", "cc"), "gcc", "clang")):
        pytest.skip("no C compiler here: the install goes on without the extension (numba's kernel stands in)")
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if re.fullmatch(r"gpuclust/ingest/readers/_fast_usage_c\..*(so|pyd)", n)], names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)

    def installed() -> list[tuple[str, int, int]]:
        return sorted((str(p.relative_to(site)), p.stat().st_size, p.stat().st_mtime_ns) for p in site.rglob("*"))

    shard = tmp_path / "instance_usage-000000000000.json.gz"
    shard.write_bytes(
        gzip.compress(
            "".join(
                _USAGE_LINE.format(
                    t=600_000_000 + 300_000_000 * (k // 7), e=900_000_000 + 300_000_000 * (k // 7), i=k % 7
                )
                + "\n"
                for k in range(5000)
            ).encode()
        )
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "PYTHONDONTWRITEBYTECODE": "1",
        "XDG_CACHE_HOME": str(tmp_path / "c"),
        "GPUCLUST_FAST_JSON": "1",
    }
    env.pop("NUMBA_CACHE_DIR", None)
    # ``python -m gpuclust.cli ingest ...``, saying at exit (its exit handlers run) which modules it imported
    cli = (
        "import atexit, json, runpy, sys\n"
        "atexit.register(lambda: print('MODULES', json.dumps([sys.modules['gpuclust'].__file__, *sys.modules]),"
        " file=sys.stderr))\n"
        "sys.argv = ['gpuclust', *sys.argv[1:]]\n"
        "runpy.run_module('gpuclust.cli', run_name='__main__', alter_sys=True)\n"
    )
    before = installed()
    for run in (1, 2):
        p = subprocess.run(
            [sys.executable, "-c", cli, "ingest", str(shard), "--out", str(tmp_path / f"ds{run}"), "--no-progress"],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=300,
        )
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
        where, *imported = json.loads(p.stderr.rsplit("MODULES ", 1)[1])
        assert Path(where).is_relative_to(site), where  # the installed wheel, not the checkout
        assert "gpuclust.ingest.readers._fast_usage_c" in imported, f"run {run}: the extension was not loaded"
        assert not [m for m in imported if m.split(".")[0] in ("numba", "llvmlite")], f"run {run} imported numba"
        assert installed() == before, f"run {run} wrote into the installed package"
    assert not (tmp_path / "c").exists()  # no cache either
    from gpuclust.dataset import Dataset

    tables = [Dataset(tmp_path / f"ds{run}").read("instance_usage") for run in (1, 2)]
    assert tables[0].num_rows == 5000 and tables[0].equals(tables[1])


@pytest.mark.parametrize(
    ("orig_argv", "argv0", "program"),
    [
        (["python", "-m", "gpuclust.cli", "analyze"], "-m", True),
        (["python", "-m", "gpuclust", "analyze"], "-m", True),
        (["/venv/bin/python", "/venv/bin/gpuclust", "analyze"], "/venv/bin/gpuclust", True),
        (["python", "-c", "import gpuclust"], "-c", False),
        (["python", "-m", "pytest"], "-m", False),
        (["python", "notebook.py"], "notebook.py", False),
    ],
)
def test_the_command_is_told_from_a_program_importing_the_library(
    monkeypatch: pytest.MonkeyPatch, orig_argv: list[str], argv0: str, program: bool
) -> None:
    """Only the command sets ``OPENBLAS_NUM_THREADS`` (to 1, unless set: docs/user/scale.md, "Start-up")."""
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
    code = (
        "import sys; sys.argv = ['gpuclust', '--version']  # as the console script's\n"
        "import gpuclust, os; print(os.environ.get('OPENBLAS_NUM_THREADS'))"
    )
    for user, want in ((None, "1"), ("4", "4")):
        e = env if user is None else {**env, "OPENBLAS_NUM_THREADS": user}
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, check=True)
        assert p.stdout.strip() == want
