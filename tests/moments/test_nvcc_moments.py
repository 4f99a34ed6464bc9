"""Compile kernels/grouped_moments.cu with nvcc for sm_80 and sm_90 (the compile tests are marked ``nvcc``).

The translation unit is the source exactly as NVRTC sees it (``_kernels.load_source`` inlines the
local headers) followed by one *explicit instantiation* per declared name expression
(``moments_gpu.INSTANTIATIONS``), written from the declared C signatures, so a template that
fails to instantiate, or a signature that drifted from the wrapper's parameter list, is a build
error here.  The unit also holds test_nvcc.py's address table: tests/nvcc_units.py compiles it once
per arch per pytest run for both modules, with ``-c`` (host code too) and ``-Werror all-warnings``.
"""

from __future__ import annotations

import nvcc_units
import pytest

from gpuclust.backends import moments_gpu


def test_instantiations_cover_wrapper_choices() -> None:
    # every (T, C, D) the wrapper can pick exists for all four kernels
    for arglist in moments_gpu.INSTANTIATIONS.values():
        assert len(arglist) == 2 * 2 * moments_gpu.MAX_D
    sigs = moments_gpu.C_SIGNATURES
    assert sigs["comoments_sums"].count(",") + 1 == len(moments_gpu.SUMS_PARAMS)
    assert sigs["comoments_centered"].count(",") + 1 == len(moments_gpu.CENTERED_PARAMS)


@pytest.mark.nvcc
@pytest.mark.skipif(nvcc_units.NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_grouped_moments_compiles(arch: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    c = nvcc_units.compiled(tmp_path_factory, moments_gpu.KERNEL_FILE, arch)
    assert "-c" in c.cmd and f"-arch={arch}" in c.cmd  # host code too
    unit = c.tu.read_text()
    assert all(line in unit for line in nvcc_units.grouped_moments_instantiations())
    assert c.returncode == 0, f"nvcc failed ({c.failure()})"
    # warnings about our source fail too (nvcc's are errors under -Werror all-warnings; the host
    # compiler's are caught here)
    ours = [ln for ln in c.stderr.splitlines() if c.tu.name in ln and "warning" in ln.lower()]
    assert not ours, c.stderr
