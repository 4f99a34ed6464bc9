"""Compile every kernels/*.cu with nvcc for sm_80 and sm_90, instantiating exactly the template list
the loader hands to NVRTC.  Needs no GPU; skipped when nvcc is absent.

The translation unit (tests/nvcc_units.py, compiled once per file and arch per pytest run, shared
with tests/moments/test_nvcc_moments.py) is the inlined source (as NVRTC sees it) plus a table that
takes the address of every declared name expression.  That instantiates exactly those
specialisations -- it is how NVRTC itself handles ``name_expressions`` -- without restating each
kernel's parameter list (which an explicit ``template __global__ void k<T>(...);`` would need, and
which could drift).  The cubin is then checked to contain every kernel.
"""

from __future__ import annotations

import nvcc_units
import pytest

from gpuclust import _kernels

pytestmark = [pytest.mark.nvcc, pytest.mark.skipif(nvcc_units.NVCC is None, reason="nvcc not found")]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("filename", _kernels.kernel_files())
def test_kernel_compiles(tmp_path_factory, filename, arch):
    c = nvcc_units.compiled(tmp_path_factory, filename, arch)
    assert c.returncode == 0, c.failure()
    assert f"-arch={arch}" in c.cmd and "-Werror" in c.cmd
    data = c.cubin.read_bytes()
    for e in _kernels.name_expressions(filename):
        bare = e.split("<")[0].split("::")[-1]
        assert bare.encode() in data, f"{e} missing from the {arch} cubin"
