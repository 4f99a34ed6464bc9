"""The powers of ten of the Eisel-Lemire float parse, shared by the fast JSON reader's kernels.

:mod:`gpuclust.ingest.readers._fast_usage` builds the table once and hands it to the C extension
or to the numba kernel (:mod:`gpuclust.ingest.readers._fast_usage_kernel`), which index it by
decimal exponent from :data:`POW_MIN` (``_fast_usage_c.c`` repeats the two bounds).
"""

from __future__ import annotations

import numpy as np

__all__ = ["POW_MAX", "POW_MIN", "pow10_table"]

#: Decimal exponents covered by the Eisel-Lemire table.
POW_MIN, POW_MAX = -342, 308


def pow10_table() -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) 64-bit halves of the 128-bit mantissa of 10^q, rounded down and normalised so the
    top bit is set, for q in POW_MIN..POW_MAX (exact integer arithmetic)."""
    hi = np.zeros(POW_MAX - POW_MIN + 1, dtype=np.uint64)
    lo = np.zeros_like(hi)
    for q in range(POW_MIN, POW_MAX + 1):
        if q >= 0:
            v = 10**q
            bl = v.bit_length()
            m = v << (128 - bl) if bl <= 128 else v >> (bl - 128)
        else:
            d = 10**-q
            m = (1 << (127 + d.bit_length())) // d
        assert m >> 127 == 1
        hi[q - POW_MIN] = m >> 64
        lo[q - POW_MIN] = m & ((1 << 64) - 1)
    return hi, lo
