from __future__ import annotations

import inspect
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gpuclust.backends import OP_NAMES, BackendUnavailable, cpu, get_backend, gpu, gpu_available


def test_cpu_backend():
    be = get_backend("cpu")
    assert be.name == "cpu" and be.xp is np
    assert be.ops.bucket_overlap is cpu.bucket_overlap and be.ops.grouped_sum is cpu.grouped_sum
    with pytest.raises(AttributeError, match="not found"):
        getattr(be.ops, "no_such_op")  # noqa: B009
    assert get_backend("cpu") is be
    assert get_backend(be) is be


def test_auto_resolves_once():
    a = get_backend("auto")
    assert a.name == ("gpu" if gpu_available() else "cpu")
    assert get_backend("auto") is a


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown backend"):
        get_backend("tpu")


@pytest.mark.skipif(gpu_available(), reason="a GPU is present")
def test_gpu_without_device_raises_clearly():
    with pytest.raises(BackendUnavailable, match="backend 'gpu'"):
        get_backend("gpu")


def test_backend_pickles_by_name():
    be = get_backend("cpu")
    assert pickle.loads(pickle.dumps(be)) is be


@pytest.mark.parametrize("op", OP_NAMES)
def test_ops_twins_have_same_signature(op):
    def shape(f):
        return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]

    assert shape(getattr(cpu, op)) == shape(getattr(gpu, op))


def test_import_without_cupy():
    """`import gpuclust` (and the analyses, engine, backends, CLI parser) works with cupy blocked,
    and no cupy/cudf/dask_cuda module gets imported."""
    code = textwrap.dedent(
        """
        import sys
        for m in ("cupy", "cupyx", "cudf", "dask_cuda"):
            sys.modules[m] = None  # makes `import cupy` raise ImportError
        import gpuclust, gpuclust.analyses, gpuclust.engine, gpuclust.backends, gpuclust.report
        from gpuclust.backends import get_backend, gpu_available, BackendUnavailable
        assert not gpu_available()
        assert get_backend("auto").name == "cpu"
        try:
            get_backend("gpu")
        except BackendUnavailable:
            pass
        else:
            raise AssertionError("gpu backend without cupy")
        import pyarrow as pa
        from gpuclust.schema import SCHEMAS
        me = pa.table({"time": [0], "machine_id": [1], "type": [1], "switch_id": ["s"], "cap_cpu": [0.5],
                       "cap_mem": [0.5], "platform_id": ["p"], "missing_data_reason": [0]},
                      schema=SCHEMAS["machine_events"])
        res = gpuclust.engine.run({"machine_events": me}, ["machine-shapes"], backend="auto")
        assert int(res["machine-shapes"]["shapes"]["machines"].iloc[0]) == 1
        bad = [m for m, v in sys.modules.items() if v is not None and m.split(".")[0] in ("cupy", "cupyx", "cudf", "dask_cuda")]
        assert not bad, bad
        print("ok")
        """
    )
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


@pytest.mark.skipif(gpu_available(), reason="a GPU is present")
def test_require_gpu_env_turns_skip_into_failure():
    """With GPUCLUST_REQUIRE_GPU=1 a gpu-marked test fails on a machine without a GPU.

    (``--assert=plain``: the skip or failure comes from the gpu fixture, not from an assert; without
    a bytecode cache, rewriting the module's asserts took half of each run.)"""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "pytest", "-q", "--assert=plain", "tests/kernels/test_ops.py"]
    cmd += ["-k", "test_argument_checks and gpu"]
    env = dict(os.environ, GPUCLUST_REQUIRE_GPU="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=120)
    assert r.returncode == 1 and "GPUCLUST_REQUIRE_GPU=1" in r.stdout, r.stdout + r.stderr
    env["GPUCLUST_REQUIRE_GPU"] = "0"
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=120)
    assert r.returncode == 0 and "1 skipped" in r.stdout, r.stdout + r.stderr


def test_gpu_tests_collect_with_only_the_device_image_packages():
    """The device image has no duckdb, cuDF or dask-cuda: `pytest -m gpu` must still collect every
    test module (a module-level import of one of them stops the whole GPU run at collection).

    (``--assert=plain``: the modules import as they do under assert rewriting, which, without a
    bytecode cache (``PYTHONDONTWRITEBYTECODE``), took two thirds of the collection's time.)"""
    code = textwrap.dedent(
        """
        import sys
        for m in ("duckdb", "cudf", "dask_cudf", "dask_cuda"):
            sys.modules[m] = None  # makes `import duckdb` raise ImportError
        import pytest
        args = ["--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", "--assert=plain", "tests"]
        sys.exit(pytest.main(args))
        """
    )
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    summary = [ln for ln in r.stdout.splitlines() if ln.strip()][-1]
    assert "collected" in summary and "error" not in summary, r.stdout[-2000:]


def test_a_usable_cupy_is_checked_once_a_process(monkeypatch):
    """The mixture ops ask for CuPy on every call; the checks read every installed distribution's
    metadata (0.4 s of a 0.8 s usage-distribution run on an H200 went there)."""
    from importlib import metadata
    from types import SimpleNamespace

    scans = []
    monkeypatch.setattr(metadata, "distributions", lambda: scans.append(1) or iter(()))
    fake = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(getDeviceCount=lambda: 1)))
    monkeypatch.setattr(gpu, "_cupy", lambda: fake)
    monkeypatch.setattr(gpu, "_REQUIRED", None)
    assert gpu.require() is fake and gpu.require() is fake and len(scans) == 1


def test_two_cupy_distributions_are_refused_with_the_way_out(monkeypatch):
    from importlib import metadata

    class Dist:
        def __init__(self, name):
            self.metadata = {"Name": name}

    fake = [Dist("numpy"), Dist("cupy-cuda12x"), Dist("cupy_cuda13x"), Dist("cupyx-helpers")]
    monkeypatch.setattr(metadata, "distributions", lambda: iter(fake))
    monkeypatch.setattr(gpu, "_REQUIRED", None)  # (a usable CuPy found earlier in the process)
    assert gpu.cupy_distributions() == ["cupy-cuda12x", "cupy-cuda13x"]
    with pytest.raises(
        BackendUnavailable,
        match=r"2 CuPy distributions are installed \(cupy-cuda12x, cupy-cuda13x\).*"
        r"pip uninstall cupy-cuda12x",
    ):
        gpu.require()
