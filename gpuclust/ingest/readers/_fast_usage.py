"""A compiled, schema-specialised JSON -> columns reader for clean v3 InstanceUsage pieces.

:func:`parse` turns one line-aligned piece of the InstanceUsage export into the same *raw* table
``pyarrow.json.read_json`` makes of it (:func:`gpuclust.ingest.readers.v3_json.raw_schema`),
except that INT64 fields arrive as ``int64`` instead of text; :func:`~gpuclust.ingest.readers.
v3_json.to_canonical` then flattens and validates it exactly as before.  The reader is a single
pass over the bytes, compiled with numba (``nogil``, so it runs beside the inflate, flatten and
writer threads; ``cache=True``, compiled on the first InstanceUsage piece only).

It accepts only a strict subset of JSON, on which the result is the Arrow path's value for value:

* one object per line, the export's 18 keys (and ``cpus``/``memory`` inside the three usage
  objects) in any order, each at most once, no escapes in keys; spaces, tabs and CR between
  tokens and around the object; ``null`` or an omitted key = NULL;
* INT64 fields: a quoted ``-?[0-9]{1,19}`` (leading zeros allowed, as Arrow's cast allows them)
  or an unquoted JSON integer, within int64 -- parsed exactly in integer arithmetic, never through
  float64 (2^63-1 and ids above 2^53 survive);
* floats: JSON numbers with at most 19 significant digits, converted to the correctly rounded
  double (Clinger's exact fast path when the digits fit in 53 bits and the power of ten is exact,
  else the Eisel-Lemire algorithm on a 128-bit power-of-ten table built here with exact integer
  arithmetic) -- the value ``float()`` and Arrow's parser give;
* the two percentile arrays: numbers, any length (the length rules stay in ``to_canonical``).

Anything else in a piece -- a blank line, an unknown or repeated key, an escape, a quoted float, an
enum name, ``NaN``, a ``null`` inside an array, a number Eisel-Lemire cannot decide (or out of the
normal double range), a malformed line -- makes :func:`parse` return ``None`` and the caller parses
the piece the old way (Arrow, then per-line isolation), so results and rejects are unchanged.

``GPUCLUST_FAST_JSON=0`` turns the reader off; where numba cannot be imported it is off too.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["available", "parse", "parse_numbers"]

#: The InstanceUsage source fields, in the order of the kernel's field numbers.
INT_KEYS = (
    "start_time",
    "end_time",
    "collection_id",
    "instance_index",
    "machine_id",
    "alloc_collection_id",
    "alloc_instance_index",
    "collection_type",
)
RES_KEYS = ("average_usage", "maximum_usage", "random_sample_usage")
FLOAT_KEYS = (
    "assigned_memory",
    "page_cache_memory",
    "cycles_per_instruction",
    "memory_accesses_per_instruction",
    "sample_rate",
)
LIST_KEYS = ("cpu_usage_distribution", "tail_cpu_usage_distribution")
KEYS = INT_KEYS + RES_KEYS + FLOAT_KEYS + LIST_KEYS
_N_INT, _N_RES, _N_FLOAT = len(INT_KEYS), len(RES_KEYS), len(FLOAT_KEYS)
#: Values per row each list is given room for (longer rows still fit while the piece has room).
_LIST_ROOM = (11, 9)

_lock = threading.Lock()
_kernel: Any = None
_tables: tuple[np.ndarray, ...] | None = None
_failed = False


def available() -> bool:
    """Whether the fast reader is on (``GPUCLUST_FAST_JSON`` not ``0``) and numba imports."""
    if os.environ.get("GPUCLUST_FAST_JSON", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return _load() is not None


def _key_table() -> tuple[np.ndarray, np.ndarray]:
    width = max(len(k) for k in KEYS)
    keys = np.zeros((len(KEYS), width), dtype=np.uint8)
    lens = np.zeros(len(KEYS), dtype=np.int64)
    for i, k in enumerate(KEYS):
        b = k.encode()
        keys[i, : len(b)] = np.frombuffer(b, np.uint8)
        lens[i] = len(b)
    return keys, lens


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


def _load() -> Any:
    """The compiled kernel (compiled, or loaded from numba's cache, on first use), or None."""
    global _kernel, _tables, _failed
    if _kernel is not None or _failed:
        return _kernel
    with _lock:
        if _kernel is None and not _failed:
            try:
                from gpuclust.ingest.readers import _fast_usage_kernel as k
            except ImportError:  # no numba: the Arrow path reads every piece
                _failed = True
                return None
            keys, lens = _key_table()
            hi, lo = pow10_table()
            _tables = (keys, lens, hi, lo)
            _kernel = k.parse_usage
    return _kernel


def parse(data: memoryview | bytes | bytearray, n_lines: int) -> pa.Table | None:
    """The raw InstanceUsage table of a piece of ``n_lines`` lines, or None (use the Arrow path).

    ``n_lines`` counts the piece's lines (its newlines, plus one for a last line without one);
    a piece whose lines are not all clean records returns None.
    """
    kernel = _load()
    if kernel is None:
        return None
    assert _tables is not None
    buf = np.frombuffer(data, dtype=np.uint8)
    cap = max(n_lines, 1)
    ints = np.zeros((_N_INT, cap), dtype=np.int64)
    int_ok = np.zeros((_N_INT, cap), dtype=np.uint8)
    res = np.zeros((2 * _N_RES, cap), dtype=np.float64)
    res_ok = np.zeros((2 * _N_RES, cap), dtype=np.uint8)
    obj_ok = np.zeros((_N_RES, cap), dtype=np.uint8)
    flt = np.zeros((_N_FLOAT, cap), dtype=np.float64)
    flt_ok = np.zeros((_N_FLOAT, cap), dtype=np.uint8)
    lvals = np.zeros((len(LIST_KEYS), cap * max(_LIST_ROOM)), dtype=np.float64)
    loffs = np.zeros((len(LIST_KEYS), cap + 1), dtype=np.int32)
    list_ok = np.zeros((len(LIST_KEYS), cap), dtype=np.uint8)
    hard = np.zeros((5, max(1024, cap // 4)), dtype=np.int64)
    hn = np.zeros(1, dtype=np.int64)
    keys, lens, hi, lo = _tables
    status, rows = kernel(
        buf, keys, lens, hi, lo, ints, int_ok, res, res_ok, obj_ok, flt, flt_ok, lvals, loffs, list_ok, hard, hn
    )
    if status != 0 or rows != n_lines:
        return None
    if hn[0] and not _convert_hard(buf, hard[:, : hn[0]], (res, flt, lvals)):
        return None
    return _table(rows, ints, int_ok, res, res_ok, obj_ok, flt, flt_ok, lvals, loffs, list_ok)


def _convert_hard(buf: np.ndarray, hard: np.ndarray, targets: tuple[np.ndarray, ...]) -> bool:
    """Convert the numbers the kernel left (more than 19 significant digits, or an Eisel-Lemire
    undecided case such as an exact or halfway value) with Python's correctly rounded ``float``;
    False (use the Arrow path) for a result outside the normal double range."""
    for start, end, kind, i, j in hard.T.tolist():
        v = float(buf[start:end].tobytes())
        if not (v == 0.0 or 2.2250738585072014e-308 <= abs(v) < math.inf):
            return False
        targets[kind][i, j] = v
    return True


def parse_numbers(texts: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(values, ok) of JSON numbers converted as :func:`parse` converts them; ``ok`` is False
    where the reader would hand the piece to Arrow instead.  For tests and measurements."""
    if _load() is None:
        raise RuntimeError("the fast JSON reader is not available (numba did not import)")
    from gpuclust.ingest.readers import _fast_usage_kernel as k

    assert _tables is not None
    lens = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    ends = np.cumsum(lens)
    starts = ends - lens
    out = np.zeros(len(texts), dtype=np.float64)
    ok = np.zeros(len(texts), dtype=np.uint8)
    _, _, hi, lo = _tables
    k.parse_numbers(np.frombuffer(b"".join(texts) or b" ", dtype=np.uint8), starts, ends, hi, lo, out, ok)
    return out, ok.astype(bool)


def _masked(values: np.ndarray, ok: np.ndarray, typ: pa.DataType) -> pa.Array:
    if ok.all():
        return pa.array(values, typ)
    return pa.array(values, typ, mask=ok == 0)


def _table(
    n: int,
    ints: np.ndarray,
    int_ok: np.ndarray,
    res: np.ndarray,
    res_ok: np.ndarray,
    obj_ok: np.ndarray,
    flt: np.ndarray,
    flt_ok: np.ndarray,
    lvals: np.ndarray,
    loffs: np.ndarray,
    list_ok: np.ndarray,
) -> pa.Table:
    cols: dict[str, pa.Array] = {}
    for i, k in enumerate(INT_KEYS):
        cols[k] = _masked(ints[i, :n], int_ok[i, :n], pa.int64())
    for i, k in enumerate(RES_KEYS):
        cpus = _masked(res[2 * i, :n], res_ok[2 * i, :n], pa.float64())
        mem = _masked(res[2 * i + 1, :n], res_ok[2 * i + 1, :n], pa.float64())
        ok = obj_ok[i, :n]
        mask = None if ok.all() else pa.array(ok == 0)
        cols[k] = pa.StructArray.from_arrays([cpus, mem], names=["cpus", "memory"], mask=mask)
    for i, k in enumerate(FLOAT_KEYS):
        cols[k] = _masked(flt[i, :n], flt_ok[i, :n], pa.float64())
    for i, k in enumerate(LIST_KEYS):
        offs = loffs[i, : n + 1]
        values = pa.array(lvals[i, : int(offs[-1])], pa.float64())
        ok = list_ok[i, :n]
        mask = None if ok.all() else pa.array(ok == 0)
        cols[k] = pa.ListArray.from_arrays(pa.array(offs, pa.int32()), values, mask=mask)
    return pa.table(cols)
