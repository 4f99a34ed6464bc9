"""The compiled part of the build: the InstanceUsage JSON reader as a C extension.

Everything else is declared in pyproject.toml.  The extension is built when the package is
built or installed (``pip install .``, ``pip install -e .``: in place, beside its source), never
at run time.  It is optional: where no C compiler works the install goes on without it, and the
reader falls back to numba's kernel (``gpuclust/ingest/readers/_fast_usage.py``), then to
Arrow's ``read_json``, with the same results.
"""

from __future__ import annotations

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

#: GCC / Clang flags: optimise, and never fuse a multiply and an add (the reader's float
#: conversion must round exactly as the numba kernel and Arrow do).
_UNIX_FLAGS = ["-O3", "-ffp-contract=off", "-fno-strict-aliasing"]


class BuildExt(build_ext):
    def build_extensions(self) -> None:
        if self.compiler.compiler_type == "unix":
            for ext in self.extensions:
                ext.extra_compile_args = [*ext.extra_compile_args, *_UNIX_FLAGS]
        super().build_extensions()


setup(
    # every gpuclust package, and the CUDA sources of kernels/ shipped as gpuclust/kernels
    # (gpuclust/_kernels.py finds them there in an installed wheel, at <repo>/kernels in a checkout)
    packages=[*find_packages(include=["gpuclust", "gpuclust.*"]), "gpuclust.kernels"],
    package_dir={"gpuclust.kernels": "kernels"},
    ext_modules=[
        Extension("gpuclust.ingest.readers._fast_usage_c", ["gpuclust/ingest/readers/_fast_usage_c.c"],
                  optional=True),
    ],
    cmdclass={"build_ext": BuildExt},
)
