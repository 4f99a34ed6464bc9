"""Compile kernels/grouped_moments.cu with nvcc for sm_80 and sm_90 (the compile tests are marked ``nvcc``).

The translation unit is the source exactly as NVRTC sees it (``_kernels.load_source`` inlines the
local headers) followed by one *explicit instantiation* per declared name expression
(``moments_gpu.INSTANTIATIONS``), written from the declared C signatures, so a template that
fails to instantiate, or a signature that drifted from the wrapper's parameter list, is a build
error here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuclust import _kernels
from gpuclust.backends import moments_gpu

NVCC = shutil.which("nvcc")


def _instantiation_lines() -> list[str]:
    lines = []
    for template, arglist in moments_gpu.INSTANTIATIONS.items():
        family = re.sub(r"_(shared|global)$", "", template.split("::")[-1])
        sig = moments_gpu.C_SIGNATURES[family]
        for args in arglist:
            t, c, _d = args
            expr = _kernels.name_expression(template, args)
            lines.append(f"template __global__ void {expr}({sig.format(T=t, C=c)});")
    return lines


def test_instantiations_cover_wrapper_choices() -> None:
    # every (T, C, D) the wrapper can pick exists for all four kernels
    for arglist in moments_gpu.INSTANTIATIONS.values():
        assert len(arglist) == 2 * 2 * moments_gpu.MAX_D
    sigs = moments_gpu.C_SIGNATURES
    assert sigs["comoments_sums"].count(",") + 1 == len(moments_gpu.SUMS_PARAMS)
    assert sigs["comoments_centered"].count(",") + 1 == len(moments_gpu.CENTERED_PARAMS)


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_grouped_moments_compiles(arch: str, tmp_path: Path) -> None:
    src = _kernels.load_source(moments_gpu.KERNEL_FILE)
    tu = tmp_path / "grouped_moments_inst.cu"
    tu.write_text(src + "\n// ---- explicit instantiations (generated)\n" + "\n".join(_instantiation_lines()) + "\n")
    cmd = [NVCC, "-std=c++17", f"-arch={arch}", "-c", str(tu), "-o", str(tmp_path / "out.o")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"nvcc failed ({' '.join(cmd)}):\n{res.stdout}\n{res.stderr}"
    # warnings about our source fail too (toolkit-level notices, e.g. arch deprecations, do not)
    ours = [ln for ln in res.stderr.splitlines() if tu.name in ln and "warning" in ln.lower()]
    assert not ours, res.stderr
