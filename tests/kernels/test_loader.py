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
