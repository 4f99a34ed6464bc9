"""The keyed sums of ``machine-utilization``'s partials: per machine-bucket key the float64 sums of
CPU and memory usage, the windows and the values that are not finite (:func:`keyed_sums`), summed
densely (``bincount`` over every machine-bucket) or over the used rows sorted by key, and the
counts' dtypes for spilling (:func:`narrow`) and merging (:data:`COUNTS`, which the keyed sums are
widened to before a merge: ``Keyed(cast=COUNTS)``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuclust._xp import bincount
from gpuclust.keys import pack_bits, unpack_bits

__all__ = ["COUNTS", "NULL_BITS", "keyed_sums", "narrow"]

#: The keyed sums' integer fields and their dtypes: ``windows`` and ``nulls``, the values per key
#: that are not finite (SQL NULLs; an infinite value is summed but not counted as known), CPU's
#: in the low :data:`NULL_BITS` bits and memory's above (``pack_bits(mem, cpu, NULL_BITS)``, one
#: field, not two: a field less to spill and merge; a machine-bucket holds fewer than 2^31 windows).
COUNTS = {"windows": np.int32, "nulls": np.int64}
NULL_BITS = 32
#: Largest cells / rows ratio summed densely (``bincount`` over every cell); beyond it the used
#: rows are sorted (a partition then touches few of the cells).
DENSE_RATIO = 4
ROW_BITS = 24


def narrow(xp: Any, c: Any) -> Any:
    """Counts as the narrowest of uint8 / uint16 / int32 that holds them (a smaller spill: most
    machine-buckets get one or two windows from a partition)."""
    top = int(c.max()) if int(c.shape[0]) else 0
    return c.astype(
        xp.uint8 if top < 1 << 8 else xp.uint16 if top < 1 << 16 else xp.int32 if top < 1 << 31 else xp.int64
    )


def keyed_sums(backend: Any, key: Any, cells: int, cpu: Any, mem: Any) -> dict[str, Any]:
    """The keyed partial of rows keyed in ``[0, cells]`` (``cells``: not used): sorted unique keys,
    float64 sums of ``cpu`` and ``mem`` (NaN ignored, as SQL's SUM), the windows and the values of
    each that are not finite (``nulls``, packed as :data:`COUNTS` says: SQL's SUM of only NULLs
    is NULL), counts narrowed (:func:`narrow`).  Every sum adds its rows in row order, as
    ``keyed_reduce`` does.

    Dense (``bincount`` over every cell, no sort) when the cells are at most :data:`DENSE_RATIO`
    times the rows; else the used rows are sorted by key (key and row packed in one int64: one
    sort of one array) and summed by their group."""
    xp = backend.xp
    n = int(key.shape[0])
    if cells <= DENSE_RATIO * max(n, 1 << 14):
        cnt = bincount(xp, key, minlength=cells + 1)[:cells]
        present = xp.nonzero(cnt > 0)[0]  # (a bool's nonzero: several times an int64's)
        group, n_groups, gkey = key, cells + 1, present
    else:
        rows = xp.nonzero(key < cells)[0]
        k = key[rows]
        if cells < 1 << (63 - ROW_BITS) and n < 1 << ROW_BITS:  # (key, row) in one int64, sorted in place
            pack_bits(k, xp.arange(int(rows.shape[0]), dtype=xp.int64), ROW_BITS, inplace=True)
            k.sort()
            k, order = unpack_bits(k, ROW_BITS, inplace=True)
            rows = rows[order]
            del order
        else:
            order = xp.argsort(k, kind="stable")
            k, rows = k[order], rows[order]
            del order
        new = xp.ones(int(k.shape[0]), dtype=bool)
        new[1:] = k[1:] != k[:-1]
        starts = xp.nonzero(new)[0]
        n_groups = int(starts.shape[0])
        gkey = k[starts]
        del k, starts
        group = xp.cumsum(new, dtype=xp.int64)
        group -= 1
        del new
        cpu, mem = cpu[rows], mem[rows]
        del rows
        cnt = bincount(xp, group, minlength=n_groups)
        present = slice(None)
    out = {"key": gkey.astype(xp.int64)}
    nulls = {}
    for name, v in (("cpu", cpu), ("mem", mem)):
        v = v.astype(xp.float64, copy=False)
        bad = ~xp.isfinite(v)
        if bool(bad.any()):
            total = bincount(xp, group, weights=xp.where(xp.isnan(v), 0.0, v), minlength=n_groups)
            nulls[name] = bincount(xp, group[bad], minlength=n_groups)[: cnt.shape[0]][present]
        else:
            total = bincount(xp, group, weights=v, minlength=n_groups)
        out[name] = total[: cnt.shape[0]][present]
        del total
    out["windows"] = narrow(xp, cnt[present])
    if nulls:
        out["nulls"] = narrow(xp, pack_bits(nulls.get("mem", 0), nulls.get("cpu", 0), NULL_BITS))
    else:
        out["nulls"] = xp.zeros(int(gkey.shape[0]), dtype=xp.uint8)
    return out
