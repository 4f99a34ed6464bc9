"""The cpu backend as the analyses' generic (GPU-shaped) code sees it: its ops without
``lookup_slot_tables``, so the cpu-only slot-table paths are off and the code the gpu backend runs
is exercised on NumPy (tests compare the two paths bit for bit), and, as its array module, NumPy
shaped like CuPy where CuPy refuses what NumPy accepts, so that code fails here the way it would
fail on a device (CI has none).

What the CuPy-shaped module refuses, as CuPy 13/14 does (``cupy/_statistics/histogram.py``,
``cupy/_sorting/sort.py``, ``cupy/_core/_kernel.pyx``, ``cupy/_core/_routines_manipulation.pyx``):

* ``bincount`` of an empty array: CuPy sizes its output by ``int(x.max()) + 1``, and the maximum
  of an empty array raises (``gpuclust._xp.bincount`` is the call that works on both);
* ``lexsort`` of a tuple or list of keys: CuPy takes one ``(k, n)`` array;
* ``repeat`` with an array of counts (CuPy before 14);
* the ``reduceat`` of a ufunc other than ``add``, and ``accumulate`` other than ``add`` /
  ``multiply``.

Everything else is NumPy's.  Arrays stay NumPy arrays, so host calls on device arrays
(``np.asarray`` of a CuPy array) are not caught here; the GPU tests catch those.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import numpy as np

from gpuclust.backends import Backend, get_backend

__all__ = ["CPU", "GENERIC", "SHAPED_XP", "UFUNC_METHODS", "check_ufunc_method"]


class _GenericOps:
    """The cpu backend's ops without ``lookup_slot_tables``."""

    def __init__(self, ops: Any):
        self._ops = ops

    def __getattr__(self, name: str) -> Any:
        if name == "lookup_slot_tables":
            return False
        return getattr(self._ops, name)


#: The ufunc methods CuPy has only for some ufuncs: method -> the ufuncs that have it.
UFUNC_METHODS: dict[str, tuple[np.ufunc, ...]] = {"reduceat": (np.add,), "accumulate": (np.add, np.multiply)}


def check_ufunc_method(ufunc: np.ufunc, method: str) -> None:
    """Raise as CuPy does for a ufunc method it lacks (:data:`UFUNC_METHODS`)."""
    allowed = UFUNC_METHODS.get(method)
    if allowed is not None and ufunc not in allowed:
        raise NotImplementedError(f"`cupy_{ufunc.__name__}.{method}` is not supported yet")


class _UFunc:
    """A NumPy ufunc with CuPy's methods (:data:`UFUNC_METHODS`)."""

    def __init__(self, uf: np.ufunc):
        self._uf = uf

    def __call__(self, *args: Any, **kw: Any) -> Any:
        return self._uf(*args, **kw)

    def __getattr__(self, name: str) -> Any:
        if name in UFUNC_METHODS:
            check_ufunc_method(self._uf, name)
        return getattr(self._uf, name)


def _bincount(x: Any, weights: Any = None, minlength: int = 0) -> Any:
    if int(x.shape[0]) == 0:
        raise ValueError(
            "zero-size array to reduction operation cupy_max which has no identity (cupy.bincount of an empty array)"
        )
    return np.bincount(x, weights=weights, minlength=minlength)


def _lexsort(keys: Any) -> Any:
    if isinstance(keys, (tuple, list)):
        raise AttributeError(f"cupy.lexsort takes one (k, n) cupy.ndarray of keys, not a {type(keys).__name__}")
    return np.lexsort(keys)


def _repeat(a: Any, repeats: Any, axis: int | None = None) -> Any:
    if isinstance(repeats, np.ndarray) or hasattr(repeats, "__cuda_array_interface__"):
        raise ValueError("cupy.ndarray cannot be specified as `repeats` argument.")
    return np.repeat(a, repeats, axis=axis)


SHAPED_XP = types.ModuleType("cupy_shaped", "NumPy, shaped like CuPy where CuPy refuses what NumPy accepts.")
SHAPED_XP.__dict__.update({k: v for k, v in vars(np).items() if not k.startswith("__")})
SHAPED_XP.__dict__.update({k: _UFunc(v) for k, v in vars(np).items() if isinstance(v, np.ufunc)})
SHAPED_XP.__dict__.update(bincount=_bincount, lexsort=_lexsort, repeat=_repeat)


@dataclasses.dataclass(frozen=True)
class _GenericBackend(Backend):
    """The generic backend: side inputs are used as they are (host arrays), as on the cpu."""

    def stage(self, a: np.ndarray) -> Any:
        return a


CPU = get_backend("cpu")
GENERIC = _GenericBackend("cpu", SHAPED_XP, _GenericOps(CPU.ops))
