"""Array-module calls that behave alike on NumPy and CuPy where the modules themselves differ.

Analyses and shared helpers write ``xp.<function>`` for the backend's array module; the few
functions whose CuPy form refuses an input NumPy accepts go through here instead (a code rule,
``tests/test_code_rules.py``, keeps the bare calls out).  ``tests/cupy_shaped.py`` is a NumPy
shaped like CuPy in these respects, so CI runs the analyses into them without a device.
"""

from __future__ import annotations

from typing import Any

__all__ = ["bincount"]


def bincount(xp: Any, x: Any, weights: Any = None, minlength: int = 0, bounded: bool = False) -> Any:
    """``xp.bincount(x, weights, minlength)``, an empty ``x`` included: CuPy sizes its output by
    ``int(x.max()) + 1``, and the maximum of an empty array raises, where NumPy returns
    ``minlength`` zeros (int64; float64 with weights), as this does on both.  On CuPy the sums are
    :func:`gpuclust._kernels.bincount`'s (the same result; many times faster where many rows
    share a bin).  ``bounded``: the caller's word that every code is in ``[0, minlength)`` (codes
    made so), which spares CuPy the read of their range (a sync); NumPy checks it.

    >>> import numpy as np
    >>> bincount(np, np.zeros(0, np.int64), minlength=3).tolist()
    [0, 0, 0]
    >>> bincount(np, np.array([2, 0, 2]), weights=np.array([1.0, 2.0, 3.0])).tolist()
    [2.0, 0.0, 4.0]
    """
    if int(x.shape[0]) == 0:
        return xp.zeros(int(minlength), dtype=xp.float64 if weights is not None else xp.int64)
    if getattr(xp, "__name__", None) == "cupy":  # (our kernels: CuPy's adds a global atomic a row)
        from gpuclust._kernels import bincount as device_bincount

        return device_bincount(x, weights, minlength, bounded)
    out = xp.bincount(x, weights=weights, minlength=minlength)
    if bounded and int(out.shape[0]) > int(minlength):  # (the word checked where it costs nothing)
        raise ValueError(f"bincount: bounded by minlength {minlength}, got a code {int(out.shape[0]) - 1}")
    return out
