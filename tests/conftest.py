"""Shared fixtures: the ``backend`` fixture runs a test on ``cpu`` and (marked ``gpu``) on ``gpu``.

The gpu case is skipped when CuPy or a CUDA device is missing, unless ``GPUCLUST_REQUIRE_GPU=1``,
which turns a missing GPU into a failure (set it on GPU CI machines so GPU tests cannot silently
skip).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `import strategies`


def _require_gpu() -> bool:
    return os.environ.get("GPUCLUST_REQUIRE_GPU", "") == "1"


def gpu_backend_or_skip():  # type: ignore[no-untyped-def]
    from gpuclust.backends import BackendUnavailable, get_backend

    try:
        return get_backend("gpu")
    except BackendUnavailable as e:  # the real cause (import error, warning, no device) is in e
        msg = f"gpu backend unavailable: {e}"
        if _require_gpu():
            pytest.fail(msg + " (GPUCLUST_REQUIRE_GPU=1)")
        pytest.skip(msg)


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def backend(request):  # type: ignore[no-untyped-def]
    """A :class:`gpuclust.backends.Backend`: cpu, then gpu (skipped without a device)."""
    from gpuclust.backends import get_backend

    if request.param == "gpu":
        return gpu_backend_or_skip()
    return get_backend("cpu")


@pytest.fixture
def gpu_backend():  # type: ignore[no-untyped-def]
    """The gpu backend (skipped without a device, or failing under GPUCLUST_REQUIRE_GPU=1)."""
    return gpu_backend_or_skip()
