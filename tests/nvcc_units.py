"""The nvcc compiles of kernels/*.cu that tests/kernels/test_nvcc.py, tests/moments/test_nvcc_moments.py
and tests/mixture/test_nvcc_mixture.py check: each file is compiled once per arch per pytest run
(:func:`run_once.once_per_run`), by whichever worker's test needs it first.

The translation unit is the inlined source (as NVRTC sees it), then, for a file whose wrapper
declares C signatures (grouped_moments.cu, mixture.cu: ``INSTANTIATIONS``/``C_SIGNATURES`` of
``moments_gpu``, ``mixture_gpu``), one
*explicit instantiation* per declared name expression written from those signatures, so a
signature that drifted from the wrapper's parameter list is a build error; then a table that takes
the address of every declared name expression.  The table instantiates exactly those
specialisations -- it is how NVRTC itself handles ``name_expressions`` -- without restating each
kernel's parameter list.  (With both, the sm_80 cubin of grouped_moments.cu is byte-identical to
that of the table alone: the two instantiate the same kernels.)

A file with explicit instantiations is compiled with ``-c`` (host code too) and ``--keep``, which
leaves the device cubin beside the object; the others with ``--cubin``.  Both with
``-Werror all-warnings``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from run_once import once_per_run

from gpuclust import _kernels

NVCC = shutil.which("nvcc")


def grouped_moments_instantiations() -> list[str]:
    """``template __global__ void <expr>(<signature>);`` for each declared grouped_moments.cu kernel."""
    from gpuclust.backends import moments_gpu

    lines = []
    for template, arglist in moments_gpu.INSTANTIATIONS.items():
        family = re.sub(r"_(shared|global)$", "", template.split("::")[-1])
        sig = moments_gpu.C_SIGNATURES[family]
        for args in arglist:
            t, c, _d = args
            expr = _kernels.name_expression(template, args)
            lines.append(f"template __global__ void {expr}({sig.format(T=t, C=c)});")
    return lines


def mixture_instantiations() -> list[str]:
    """``template __global__ void <template><T>(<signature>);`` for each declared mixture.cu kernel."""
    from gpuclust.backends import mixture_gpu

    lines = []
    for template, arglist in mixture_gpu.INSTANTIATIONS.items():
        sig = mixture_gpu.C_SIGNATURES[template]
        for (t,) in arglist:
            lines.append(f"template __global__ void {template}<{t}>({sig.format(T=t)});")
    return lines


#: The files compiled with explicit instantiations, and the function that writes them.
EXPLICIT = {"grouped_moments.cu": grouped_moments_instantiations, "mixture.cu": mixture_instantiations}


def translation_unit(filename: str) -> str:
    """The inlined source, the explicit instantiations (if any) and the address table."""
    parts = [_kernels.load_source(filename)]
    if filename in EXPLICIT:
        parts += ["\n// ---- explicit instantiations (generated)\n", "\n".join(EXPLICIT[filename]()), "\n"]
    table = "".join(f"    (void*)&{e},\n" for e in _kernels.name_expressions(filename))
    parts += [
        "\n// gpuclust test: force the declared instantiations\n",
        "static void* const gpuclust_instances[] = {\n",
        table,
        "};\n",
        "void* gpuclust_keep_instances() { return (void*)gpuclust_instances; }\n",
    ]
    return "".join(parts)


@dataclass(frozen=True)
class Compiled:
    cmd: list[str]
    returncode: int
    stdout: str
    stderr: str
    tu: Path  # the translation unit compiled
    cubin: Path  # the device code for the arch (absent when the compile failed)
    obj: Path | None  # the object file, for a file compiled with -c

    def failure(self) -> str:
        return f"{' '.join(self.cmd)}\n{self.stdout}\n{self.stderr}"


def compiled(tmp_path_factory: pytest.TempPathFactory, filename: str, arch: str) -> Compiled:
    """``filename`` compiled by nvcc for ``arch`` (``sm_80``), once per pytest run."""
    assert NVCC is not None

    def build(folder: Path) -> Path:
        tu = folder / filename
        tu.write_text(translation_unit(filename))
        cubin = folder / f"{tu.stem}.{arch}.cubin"
        obj = folder / f"{tu.stem}.o" if filename in EXPLICIT else None
        if obj is not None:
            out = ["-c", "--keep", "--keep-dir", str(folder), "-o", str(obj)]
        else:
            out = ["--cubin", "-o", str(cubin)]
        cmd = [NVCC, *_kernels.NVRTC_OPTIONS, f"-arch={arch}", *out, "-Werror", "all-warnings", str(tu)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        doc = {"cmd": cmd, "returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr}
        doc |= {"tu": str(tu), "cubin": str(cubin), "obj": obj and str(obj)}
        (folder / "result.json").write_text(json.dumps(doc))
        return folder / "result.json"

    doc = json.loads(once_per_run(tmp_path_factory, f"nvcc-{filename}-{arch}", build).read_text())
    paths = {"tu": Path(doc["tu"]), "cubin": Path(doc["cubin"]), "obj": doc["obj"] and Path(doc["obj"])}
    return Compiled(**{**doc, **paths})
