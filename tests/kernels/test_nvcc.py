"""Compile every kernels/*.cu with nvcc for sm_80 and sm_90, instantiating exactly the template list
the loader hands to NVRTC.  Needs no GPU; skipped when nvcc is absent.

The translation unit is the inlined source (as NVRTC sees it) plus a table that takes the address of
every declared name expression.  That instantiates exactly those specialisations -- it is how NVRTC
itself handles ``name_expressions`` -- without restating each kernel's parameter list (which an
explicit ``template __global__ void k<T>(...);`` would need, and which could drift).  The cubin is
then checked to contain every kernel.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gpuclust import _kernels

NVCC = shutil.which("nvcc")

pytestmark = [pytest.mark.nvcc, pytest.mark.skipif(NVCC is None, reason="nvcc not found")]


def translation_unit(filename: str) -> str:
    """The inlined source plus a table taking the address of every declared instantiation."""
    exprs = _kernels.name_expressions(filename)
    table = "".join(f"    (void*)&{e},\n" for e in exprs)
    return (
        _kernels.load_source(filename)
        + "\n// gpuclust test: force the declared instantiations\n"
        + "static void* const gpuclust_instances[] = {\n"
        + table
        + "};\n"
        + "void* gpuclust_keep_instances() { return (void*)gpuclust_instances; }\n"
    )


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("filename", _kernels.kernel_files())
def test_kernel_compiles(tmp_path, filename, arch):
    tu = tmp_path / filename
    tu.write_text(translation_unit(filename))
    cubin = tmp_path / (filename + f".{arch}.cubin")
    cmd = [
        NVCC,
        *_kernels.NVRTC_OPTIONS,
        f"-arch={arch}",
        "--cubin",
        "-Werror",
        "all-warnings",
        "-o",
        str(cubin),
        str(tu),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    data = cubin.read_bytes()
    for e in _kernels.name_expressions(filename):
        bare = e.split("<")[0].split("::")[-1]
        assert bare.encode() in data, f"{e} missing from the cubin"
