"""Compile kernels/mixture.cu with nvcc for sm_80 and sm_90 (marked ``nvcc``; no GPU needed).

The translation unit is the source exactly as NVRTC sees it (``_kernels.load_source`` inlines the
local ``mixture_dd.cuh``) followed by one *explicit instantiation* per declared name expression
(``mixture_gpu.INSTANTIATIONS``), written from the declared C signatures, so a template that does
not instantiate, or a signature that drifted from the wrapper's parameter lists, fails the build.
The unit also holds tests/kernels/test_nvcc.py's address table: tests/nvcc_units.py compiles it
once per arch per pytest run for both modules.
"""

from __future__ import annotations

import numpy as np
import nvcc_units
import pytest

from gpuclust import _kernels
from gpuclust.backends import mixture_gpu

pytestmark = pytest.mark.nvcc


def _param_ctypes(params: tuple[tuple[str, object], ...]) -> list[str]:
    m = {np.int64: "long long", np.int32: "int", np.float64: "double"}
    return ["ptr" if t == "ptr" else m[t] for _, t in params]  # type: ignore[index]


def test_signatures_match_param_lists() -> None:
    """Scalars in the declared C signatures sit where the wrappers' parameter lists put them."""
    pairs = {
        "gpuclust::mixture_repair": mixture_gpu.REPAIR_PARAMS,
        "gpuclust::mixture_window_means": mixture_gpu.MEANS_PARAMS,
        "gpuclust::mixture_sweep": mixture_gpu.SWEEP_PARAMS,
        "gpuclust::mixture_invert": mixture_gpu.INVERT_PARAMS,
        "gpuclust::mixture_tile_slope": mixture_gpu.TILE_SLOPE_PARAMS,
        "gpuclust::mixture_tile_carry": mixture_gpu.TILE_CARRY_PARAMS,
        "gpuclust::mixture_tile_slopes": mixture_gpu.TILE_SLOPES_PARAMS,
        "gpuclust::mixture_tile_cdf": mixture_gpu.TILE_CDF_PARAMS,
        "gpuclust::mixture_tile_max": mixture_gpu.TILE_MAX_PARAMS,
    }
    assert set(pairs) == set(mixture_gpu.INSTANTIATIONS)
    for template, params in pairs.items():
        sig = [s.strip() for s in mixture_gpu.C_SIGNATURES[template].split(",")]
        want = _param_ctypes(params)
        assert len(sig) == len(want), template
        for c, w in zip(sig, want, strict=False):
            assert c.endswith("*") if w == "ptr" else c == w, (template, c, w)


def test_name_expressions() -> None:
    assert "gpuclust::mixture_invert<double>" in mixture_gpu.name_expressions()
    assert "gpuclust::mixture_sweep<double>" in mixture_gpu.name_expressions()
    src = _kernels.load_source(mixture_gpu.KERNEL_FILE)
    assert '#include "mixture_dd.cuh"' not in src and "block_scan_dd" in src


@pytest.mark.skipif(nvcc_units.NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_mixture_compiles(tmp_path_factory, arch) -> None:  # type: ignore[no-untyped-def]
    c = nvcc_units.compiled(tmp_path_factory, mixture_gpu.KERNEL_FILE, arch)
    assert "-c" in c.cmd and f"-arch={arch}" in c.cmd and "-Werror" in c.cmd
    unit = c.tu.read_text()
    assert all(line in unit for line in nvcc_units.mixture_instantiations())
    assert c.returncode == 0, c.failure()
    assert c.obj is not None and c.obj.stat().st_size > 0
