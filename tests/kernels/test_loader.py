from __future__ import annotations

import pytest

from gpuclust import _kernels


def test_kernels_dir_found_and_declared():
    d = _kernels.kernels_dir()
    on_disk = sorted(p.name for p in d.glob("*.cu"))
    assert on_disk == _kernels.kernel_files(), "every kernels/*.cu needs declared instantiations and vice versa"


@pytest.mark.parametrize("filename", _kernels.kernel_files())
def test_sources_inline_and_name_expressions(filename):
    src = _kernels.load_source(filename)
    assert '#include "' not in src
    exprs = _kernels.name_expressions(filename)
    assert exprs and len(set(exprs)) == len(exprs)
    for e in exprs:
        bare = e.split("<")[0].split("::")[-1]
        assert f"void {bare}(" in src


def test_include_inlining_recursive_once(tmp_path):
    (tmp_path / "a.cuh").write_text('#include "b.cuh"\nint a;\n')
    (tmp_path / "b.cuh").write_text("int b;\n")
    (tmp_path / "k.cu").write_text('#include "a.cuh"\n#include "b.cuh"\nint k;\n')
    src = _kernels.load_source("k.cu", tmp_path)
    assert src.count("int b;") == 1 and "int a;" in src and "int k;" in src
    (tmp_path / "bad.cu").write_text('#include "missing.cuh"\n')
    with pytest.raises(_kernels.KernelSourceError, match="missing.cuh"):
        _kernels.load_source("bad.cu", tmp_path)


def test_undeclared_instantiation_rejected():
    with pytest.raises(_kernels.KernelSourceError):
        _kernels.get_function("bucket_overlap.cu", "gpuclust::bucket_overlap_shared", ("int",))


@pytest.mark.parametrize("filename", _kernels.kernel_files())
def test_a_module_holds_the_kernels_of_one_set_of_template_arguments(filename):
    """Modules are compiled per file and template arguments: every declared instantiation is in
    exactly one, with every other template of the file declared with its arguments."""
    decl = _kernels.INSTANTIATIONS[filename]
    modules = {a: _kernels.module_expressions(filename, a) for args in decl.values() for a in args}
    got = [e for exprs in modules.values() for e in exprs]
    assert sorted(got) == sorted(_kernels.name_expressions(filename))
    for a, exprs in modules.items():
        assert exprs == [_kernels.name_expression(t, a) for t in decl if a in decl[t]]
    with pytest.raises(_kernels.KernelSourceError, match="no kernel"):
        _kernels.module_expressions(filename, ("no-such-type",))


def _cuda_params(src: str) -> dict[str, list[tuple[str, str]]]:
    """``{kernel name: [(parameter name, "ptr" or its C scalar type)]}`` of every ``__global__``
    function in ``src`` (a kernel file as NVRTC compiles it)."""
    import re

    out = {}
    for name, params in re.findall(r"__global__\s+void\s+(\w+)\s*\(([^)]*)\)", src):
        got = []
        for p in params.split(","):
            words = p.replace("*", " * ").split()
            ctype = "ptr" if "*" in words else " ".join(w for w in words[:-1] if w != "const")
            got.append((words[-1], ctype))
        out[name] = got
    return out


def test_wrapper_parameter_lists_match_the_cuda_signatures():
    """Each wrapper launches with named arguments ordered by a declared parameter list; a list that
    drifted from its kernel's signature (order, name or scalar type) would pass wrong arguments
    without any error on a device, so it is checked here against the sources."""
    import numpy as np

    from gpuclust.backends import gpu, mixture_gpu, moments_gpu

    ctype = {np.int64: "long long", np.int32: "int", np.float64: "double"}
    lists = {
        "bucket_overlap.cu": {
            "bucket_overlap_shared": gpu.BUCKET_OVERLAP_PARAMS,
            "bucket_overlap_global": gpu.BUCKET_OVERLAP_PARAMS,
        },
        "grouped_sum.cu": {
            f"{k}_{v}": _kernels.GROUPED_SUM_PARAMS
            for k in ("grouped_sum", "grouped_sum_runs", "bincount", "bincount_count")
            for v in ("shared", "global")
        },
        "grouped_moments.cu": {
            f"comoments_{p}_{v}": params
            for p, params in (("sums", moments_gpu.SUMS_PARAMS), ("centered", moments_gpu.CENTERED_PARAMS))
            for v in ("shared", "global")
        },
        "mixture.cu": {
            "mixture_repair": mixture_gpu.REPAIR_PARAMS,
            "mixture_window_means": mixture_gpu.MEANS_PARAMS,
            "mixture_sweep": mixture_gpu.SWEEP_PARAMS,
            "mixture_invert": mixture_gpu.INVERT_PARAMS,
            "mixture_tile_slope": mixture_gpu.TILE_SLOPE_PARAMS,
            "mixture_tile_carry": mixture_gpu.TILE_CARRY_PARAMS,
            "mixture_tile_slopes": mixture_gpu.TILE_SLOPES_PARAMS,
            "mixture_tile_cdf": mixture_gpu.TILE_CDF_PARAMS,
            "mixture_tile_max": mixture_gpu.TILE_MAX_PARAMS,
        },
    }
    assert sorted(lists) == _kernels.kernel_files()
    for filename, kernels in lists.items():
        found = _cuda_params(_kernels.load_source(filename))
        assert sorted(found) == sorted(kernels), filename
        for name, params in kernels.items():
            want = [(p, "ptr" if t == "ptr" else ctype[t]) for p, t in params]
            assert found[name] == want, (filename, name)
