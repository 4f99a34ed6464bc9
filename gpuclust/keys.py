"""Integer keys: the one 64-bit hash of integer key columns and the packing of several integers
into one int64 key, on NumPy or CuPy arrays (every function takes or works on the ``xp``
namespace of its arrays).  Every hash and every packed key in gpuclust comes from here
(``tests/test_code_rules.py`` fails on a hash constant or an inline packing elsewhere).

**The hash** (:func:`hash64`) is the splitmix64 chain ``h = mix(c0 ^ seed); h = mix(h ^ c1); ...``
over the key columns, each taken as its int64 two's complement bit pattern, ``mix`` being
splitmix64's finaliser (:func:`mix64`).  With the default seed it is the bucket hash of a bucketed
dataset (:func:`gpuclust.layout.bucket_ids`, manifest name ``splitmix64-chain-v1``): it decides
which bucket file a row lands in, so it never changes.  :func:`splitmix64` is the same hash of one
column shifted by the golden-ratio increment with seed 0, that is the reference splitmix64 output
of a 64-bit value: the hash of an ingest sample (:func:`gpuclust.ingest.sampling.sample_hash`,
``splitmix64-v1``), which decides which ids a sample keeps.

**Packing**: a key of a ``code`` (machine, group) and a ``bucket`` (time step, tier) in
``[0, span)`` is ``code * span + bucket`` (:func:`pack` / :func:`unpack`: keys sort by code, then
bucket, and a range of codes is a range of keys); two integers in fixed bit fields are
``hi << bits | lo`` (:func:`pack_bits` / :func:`unpack_bits`).

Examples
--------
>>> import numpy as np
>>> int(splitmix64(np, np.array([0]))[0]) == 0xE220A8397B1DCDAF  # splitmix64's first output for seed 0
True
>>> h = hash64(np, [np.array([7, 7, 8]), np.array([0, 0, 1], np.int32)])
>>> h.dtype.name, bool(h[0] == h[1]), bool(h[0] != h[2])
('uint64', True, True)
>>> key = pack(np.array([0, 2]), np.array([5, 1]), 10)
>>> key.tolist(), [a.tolist() for a in unpack(key, 10)]
([5, 21], [[0, 2], [5, 1]])
>>> [a.tolist() for a in unpack_bits(pack_bits(np.array([3]), np.array([9]), 32), 32)]
[[3], [9]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "GOLDEN",
    "SEED",
    "hash64",
    "mix64",
    "pack",
    "pack_bits",
    "splitmix64",
    "unpack",
    "unpack_bits",
]

#: 2^64 / golden ratio: splitmix64's increment (and Fibonacci hashing's multiplier).
GOLDEN = 0x9E3779B97F4A7C15
#: The default seed of :func:`hash64` (the bucket hash's).
SEED = 0x2545F4914F6CDD1D
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(xp: Any, x: Any) -> Any:
    """splitmix64's finaliser, in place on the uint64 array ``x`` (one temporary); returns ``x``:
    ``x ^= x >> 30; x *= 0xBF58476D1CE4E5B9; x ^= x >> 27; x *= 0x94D049BB133111EB; x ^= x >> 31``
    (mod 2^64)."""
    with np.errstate(over="ignore"):
        t = x >> xp.uint64(30)
        x ^= t
        x *= _M1
        xp.right_shift(x, xp.uint64(27), out=t)
        x ^= t
        x *= _M2
        xp.right_shift(x, xp.uint64(31), out=t)
        x ^= t
    return x


def _bits(xp: Any, a: Any, copy: bool) -> Any:
    """``a`` (integers) as its int64 two's complement bit pattern, as uint64 (a copy when ``copy``)."""
    a = xp.asarray(a)
    if a.dtype == xp.uint64:
        return a.copy() if copy else a
    return a.astype(xp.int64, copy=copy).view(xp.uint64)


def hash64(xp: Any, columns: Sequence[Any], seed: int = SEED) -> Any:
    """The uint64 hash of each row of the integer key ``columns`` (of one length; int32, int64 or
    uint64): ``h = mix(c0 ^ seed); h = mix(h ^ c1); ...`` (see the module docstring).  Every output
    bit depends on every bit of every column, so a hash's top bits make a slot number.  A NULL
    (the dtype's minimum, as the engine hands NULLs over) hashes like any value."""
    if not columns:
        raise ValueError("hash64 needs at least one key column")
    h = _bits(xp, columns[0], copy=True)
    h ^= xp.uint64(seed)
    mix64(xp, h)
    for c in columns[1:]:
        h ^= _bits(xp, c, copy=False)
        mix64(xp, h)
    return h


def splitmix64(xp: Any, x: Any) -> Any:
    """splitmix64's output for each 64-bit value ``x`` (int64 or uint64): ``mix(x + GOLDEN)``, the
    generator's first output when seeded with ``x`` (and its ``k+1``-th when seeded with
    ``x - k * GOLDEN``); :func:`hash64` of ``x + GOLDEN`` with seed 0.  As uint64."""
    with np.errstate(over="ignore"):
        z = _bits(xp, x, copy=False) + xp.uint64(GOLDEN)
    return hash64(xp, [z], seed=0)


def pack(code: Any, bucket: Any, span: int, *, inplace: bool = False) -> Any:
    """The int64 key ``code * span + bucket`` of a code and a bucket in ``[0, span)`` (arrays or
    ints; the caller checks that ``codes x span`` fits an int64); ``inplace``: into the int64
    array ``code`` (no temporary)."""
    if inplace:
        code *= span
        code += bucket
        return code
    return code * span + bucket


def unpack(key: Any, span: int) -> tuple[Any, Any]:
    """``(code, bucket)`` of keys made by :func:`pack`."""
    return key // span, key % span


def pack_bits(hi: Any, lo: Any, bits: int, *, inplace: bool = False) -> Any:
    """``hi << bits | lo`` for non-negative ``lo < 2**bits`` (``hi`` and ``lo`` of one integer
    dtype, or ints); ``inplace``: into the array ``hi`` (no temporary)."""
    if inplace:
        hi <<= bits
        hi |= lo
        return hi
    return (hi << bits) | lo


def unpack_bits(key: Any, bits: int, *, inplace: bool = False) -> tuple[Any, Any]:
    """``(hi, lo)`` of keys made by :func:`pack_bits`; ``inplace``: ``hi`` into the array ``key``."""
    lo = key & ((1 << bits) - 1)
    if inplace:
        key >>= bits
        return key, lo
    return key >> bits, lo
