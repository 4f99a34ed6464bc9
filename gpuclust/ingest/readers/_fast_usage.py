"""A compiled, schema-specialised JSON -> columns reader for clean v3 InstanceUsage pieces.

:func:`parse` turns one line-aligned piece of the InstanceUsage export into the same *raw* table
``pyarrow.json.read_json`` makes of it (:func:`gpuclust.ingest.readers.v3_json.raw_schema`),
except that INT64 fields arrive as ``int64`` instead of text and floats already rounded from
the correctly rounded double to float32, their canonical type (one IEEE rounding, as Arrow's
cast in ``to_canonical`` does it); :func:`~gpuclust.ingest.readers.
v3_json.to_canonical` then flattens and validates it exactly as before.  The reader is a single
pass over the bytes, compiled when the package is built or installed: the C extension
``_fast_usage_c`` (``gpuclust/ingest/readers/_fast_usage_c.c``, built by setup.py; it releases
the GIL, so it runs beside the inflate, flatten and writer threads), loaded in a millisecond, so
the first ingest after installing is as fast as the next.  Where the extension was not built (no
C compiler at install) the same kernel in numba (``_fast_usage_kernel``, ``nogil``) stands in:
compiled on the first InstanceUsage piece, cached under the user's cache folder (never in the
installed package); where numba cannot be imported either, Arrow's reader parses every piece.
Nothing is built, and nothing written into the package, at run time.

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

``GPUCLUST_FAST_JSON=0`` turns the reader off; ``GPUCLUST_FAST_JSON=numba`` uses numba's kernel
even where the extension is built (tests, measurements).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import math
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from gpuclust.ingest import arrays
from gpuclust.ingest.readers._pow10 import pow10_table

__all__ = ["available", "compiled", "count_newlines", "parse", "parse_numbers", "preload", "ready", "wanted"]

#: The C extension (built at install by setup.py) and numba's kernel module.
_EXTENSION = "gpuclust.ingest.readers._fast_usage_c"
_NUMBA_KERNEL = "gpuclust.ingest.readers._fast_usage_kernel"

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
#: The loaded kernel module's ``parse_usage`` and ``parse_numbers`` (the extension's or numba's).
_kernel: Any = None
_numbers: Any = None
_tables: tuple[np.ndarray, ...] | None = None
_failed = False
_preloading: threading.Thread | None = None


def available() -> bool:
    """Whether the fast reader is on (``GPUCLUST_FAST_JSON`` not ``0``) and a kernel loads: the
    extension, else numba's (waits for it to load)."""
    return _enabled() and _load() is not None


def compiled() -> bool:
    """Whether the loaded kernel is the C extension built at install (not numba's stand-in)."""
    return _kernel is not None and getattr(_kernel, "__module__", None) != _NUMBA_KERNEL


def wanted() -> bool:
    """Whether the fast reader is on and a kernel can be found, without loading numba (a reader
    that wants it starts :func:`preload` and uses :func:`ready` per piece)."""
    if not _enabled() or _failed:
        return False
    return _kernel is not None or _load_extension() or importlib.util.find_spec("numba") is not None


def ready(wait: float = 0.0) -> bool:
    """Whether a piece can be parsed now: the kernel is loaded and no load is in progress, after
    waiting up to ``wait`` seconds for a load in progress (:func:`preload`).  The extension loads
    at once; numba's stand-in (no extension) takes ~0.35 s to import and load from its cache at
    the start of a process, and the readers wait up to :data:`LOAD_WAIT` for it, which costs less
    than parsing the first piece with Arrow (~0.3 CPU-s per 64 MiB), while its first-ever compile
    (~6 s) still sends the pieces read meanwhile to the Arrow path (same result) instead of
    idling."""
    t = _preloading
    if wait > 0 and t is not None and t.is_alive():
        t.join(wait)
    return _enabled() and _kernel is not None and not (t is not None and t.is_alive())


#: How long a reader waits for the compiled reader to finish loading (see :func:`ready`).
LOAD_WAIT = 1.0


def count_newlines(buf: bytes | bytearray, start: int, end: int) -> int:
    """Newlines in ``buf[start:end]`` (the pieces the fast reader parses need no positions).

    Counted 1 MiB at a time: one comparison over a whole 64 MiB piece allocates (and the kernel
    zeroes) 64 MiB of fresh pages each time, which costs more than the count (0.08 s/GB here,
    against 0.21 s for the whole-piece comparison and 0.25 s for ``bytes.count``)."""
    v = np.frombuffer(buf, np.uint8, end - start, start)
    step = 1 << 20
    return sum(int(np.count_nonzero(v[i : i + step] == 10)) for i in range(0, len(v), step))


def preload() -> threading.Thread | None:
    """Load the kernel: the extension at once (~1 ms), or numba's stand-in in a background thread
    (ingest starts it while it hashes its inputs, so the ~0.3 s of loading is off the critical
    path); the thread, or None when there is none to wait for."""
    global _preloading
    if _kernel is not None or _failed or not _enabled():
        return None
    if _preloading is not None:
        return _preloading
    if _load_extension():
        return None

    def run() -> None:
        with _without_scipy_blas():
            fn = _load()
            if fn is not None:
                with _no_gc():
                    parse(b"{}", 1)  # the first call loads the machine code from numba's cache

    t = _preloading = threading.Thread(target=run, name="gpuclust-fast-json-load", daemon=True)
    t.start()
    return t


#: The module numba's CPU target imports to see whether BLAS is there (numba.np.linalg).
_BLAS_PROBE = "scipy.linalg.cython_blas"


@contextlib.contextmanager
def _without_scipy_blas() -> Iterator[None]:
    """numba's CPU target imports ``numba.np.arraymath`` the first time it compiles or loads a
    function, and that module probes for BLAS at import by importing ``scipy.linalg`` where SciPy
    is installed: 0.14 s (a third of the cache load, measured) for a kernel that does no linear
    algebra.  While the kernel loads, the probe's import fails as if SciPy were absent; the one
    thing this changes is that numba-compiled ``np.correlate`` / ``np.convolve`` in the same
    process use numba's own loop instead of BLAS (same values).  Nothing changes where
    ``numba.np.arraymath`` or the probe module is already imported."""
    if _BLAS_PROBE in sys.modules or "numba.np.arraymath" in sys.modules:
        yield
        return
    sys.modules[_BLAS_PROBE] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        yield
    finally:
        if _BLAS_PROBE in sys.modules and sys.modules[_BLAS_PROBE] is None:
            del sys.modules[_BLAS_PROBE]


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Python's cyclic GC off while numba is imported and its cache loaded: those allocate
    ~10^5 long-lived objects, and the collections they trigger cost ~0.2 CPU-s (measured)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _setting() -> str:
    return os.environ.get("GPUCLUST_FAST_JSON", "1").strip().lower()


def _enabled() -> bool:
    return _setting() not in ("0", "false", "no", "off")


def _key_table() -> tuple[np.ndarray, np.ndarray]:
    width = max(len(k) for k in KEYS)
    keys = np.zeros((len(KEYS), width), dtype=np.uint8)
    lens = np.zeros(len(KEYS), dtype=np.int64)
    for i, k in enumerate(KEYS):
        b = k.encode()
        keys[i, : len(b)] = np.frombuffer(b, np.uint8)
        lens[i] = len(b)
    return keys, lens


def _make_tables() -> tuple[np.ndarray, ...]:
    keys, lens = _key_table()
    hi, lo = pow10_table()
    return keys, lens, hi, lo


def _load_extension() -> bool:
    """Load the C extension built at install, if it was (not with ``GPUCLUST_FAST_JSON=numba``)."""
    global _kernel, _numbers, _tables
    if _kernel is not None:
        return True
    if _setting() == "numba":
        return False
    with _lock:
        if _kernel is None and not _failed:
            try:
                ext = importlib.import_module(_EXTENSION)
            except ImportError:  # not built (no C compiler at install): numba's kernel, or Arrow
                return False
            _tables = _make_tables()
            _kernel, _numbers = ext.parse_usage, ext.parse_numbers
    return _kernel is not None


def numba_cache_dir() -> str:
    """Where numba's stand-in kernel caches its machine code: the user's cache folder
    (``$XDG_CACHE_HOME/gpuclust/numba``, else ``~/.cache/gpuclust/numba``), never the installed
    package (numba's default, beside the module); ``NUMBA_CACHE_DIR`` wins where set."""
    env = os.environ.get("NUMBA_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gpuclust", "numba")


def _import_numba_kernel() -> Any:
    """Import numba's kernel module with its cache in :func:`numba_cache_dir` (numba picks a
    function's cache folder when it is decorated, from ``numba.core.config.CACHE_DIR``)."""
    if _NUMBA_KERNEL in sys.modules:
        return sys.modules[_NUMBA_KERNEL]
    from numba.core import config

    was = getattr(config, "CACHE_DIR", "")  # (set at numba's import; not in its stubs)
    setattr(config, "CACHE_DIR", numba_cache_dir())  # noqa: B010
    try:
        return importlib.import_module(_NUMBA_KERNEL)
    finally:
        setattr(config, "CACHE_DIR", was)  # noqa: B010


def _load() -> Any:
    """The compiled kernel's ``parse_usage`` (the extension's; else numba's: compiled, or loaded
    from its cache, on first use), or None."""
    global _kernel, _numbers, _tables, _failed
    if _kernel is not None or _failed:
        return _kernel
    if _load_extension():
        return _kernel
    with _lock, _no_gc():
        if _kernel is None and not _failed:
            try:
                k = _import_numba_kernel()
            except Exception as e:  # no numba (or a broken one): the Arrow path reads every piece
                _failed = True
                if not isinstance(e, ImportError):
                    warnings.warn(f"gpuclust: the fast JSON reader is off ({type(e).__name__}: {e})", stacklevel=2)
                return None
            _tables = _make_tables()
            _kernel, _numbers = k.parse_usage, k.parse_numbers
    return _kernel


def parse(data: memoryview | bytes | bytearray, n_lines: int, threads: int = 1) -> pa.Table | None:
    """The raw InstanceUsage table of a piece of ``n_lines`` lines, or None (use the Arrow path).

    ``n_lines`` counts the piece's lines (its newlines, plus one for a last line without one);
    a piece whose lines are not all clean records returns None.  With ``threads > 2`` a big
    piece is parsed as two halves at once (the kernel releases the GIL); not with the default 2:
    the inflate, flatten and writer threads already keep two cores busy, and on this project's
    2-core VM the split only added page faults (measured: same wall, +0.1 CPU-s per 64 MiB piece).
    """
    if _load() is None:
        return None
    return parse_with(_kernel, data, n_lines, threads)


def parse_with(kernel: Any, data: memoryview | bytes | bytearray, n_lines: int, threads: int = 1) -> pa.Table | None:
    """:func:`parse` with a given kernel (the extension's ``parse_usage`` or numba's)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    buf.flags.writeable = False  # one compiled signature (read-only) for bytes and bytearrays alike
    cut = _middle_line_end(buf) if threads > 2 and len(buf) >= _SPLIT_MIN else -1
    if cut < 0:
        part = _run(buf, max(n_lines, 1), kernel)
        parts = [part] if part is not None else []
    else:
        other = _executor().submit(_run, buf[:cut], max(n_lines, 1), kernel)
        second = _run(buf[cut:], max(n_lines, 1), kernel)
        first = other.result()
        parts = [first, second] if first is not None and second is not None else []
    if not parts or sum(p[0] for p in parts) != n_lines:
        return None
    return _table(*(_join(parts) if len(parts) > 1 else _trim(parts[0])))


#: Pieces at least this big are parsed in two halves when threads > 2.
_SPLIT_MIN = 4 << 20
_pool: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuclust-fast-json")
    return _pool


def _middle_line_end(buf: np.ndarray) -> int:
    """Offset just after the first newline at or after the middle of ``buf`` (-1: none near)."""
    mid = len(buf) // 2
    hits = np.flatnonzero(buf[mid : mid + (256 << 10)] == 10)
    return mid + int(hits[0]) + 1 if len(hits) and mid + int(hits[0]) + 1 < len(buf) else -1


#: (rows, ints, int_ok, res, res_ok, obj_ok, flt, flt_ok, lvals, loffs, list_ok) of one run.
_Part = tuple[Any, ...]


def _run(buf: np.ndarray, cap: int, kernel: Any) -> _Part | None:
    """Run the kernel over ``buf`` (room for ``cap`` rows): its arrays, or None if it refused."""
    global _kernel, _numbers, _failed
    tables = _tables or _make_tables()
    ints = np.zeros((_N_INT, cap), dtype=np.int64)
    int_ok = np.zeros((_N_INT, cap), dtype=np.uint8)
    res = np.zeros((2 * _N_RES, cap), dtype=np.float32)
    res_ok = np.zeros((2 * _N_RES, cap), dtype=np.uint8)
    obj_ok = np.zeros((_N_RES, cap), dtype=np.uint8)
    flt = np.zeros((_N_FLOAT, cap), dtype=np.float32)
    flt_ok = np.zeros((_N_FLOAT, cap), dtype=np.uint8)
    lvals = np.zeros((len(LIST_KEYS), cap * max(_LIST_ROOM)), dtype=np.float32)
    loffs = np.zeros((len(LIST_KEYS), cap + 1), dtype=np.int32)
    list_ok = np.zeros((len(LIST_KEYS), cap), dtype=np.uint8)
    hard = np.zeros((5, max(1024, cap // 4)), dtype=np.int64)
    hn = np.zeros(1, dtype=np.int64)
    keys, lens, hi, lo = tables
    try:
        status, rows = kernel(
            buf, keys, lens, hi, lo, ints, int_ok, res, res_ok, obj_ok, flt, flt_ok, lvals, loffs, list_ok, hard, hn
        )
    except Exception as e:  # numba cannot compile here: say so once, then the Arrow path
        _kernel, _numbers, _failed = None, None, True
        warnings.warn(f"gpuclust: the fast JSON reader is off ({type(e).__name__}: {e})", stacklevel=2)
        return None
    if status != 0:
        return None
    if hn[0] and not _convert_hard(buf, hard[:, : hn[0]], (res, flt, lvals)):
        return None
    return (rows, ints, int_ok, res, res_ok, obj_ok, flt, flt_ok, lvals, loffs, list_ok)


def _trim(part: _Part) -> tuple[Any, ...]:
    """One run's arrays cut to its rows (lists: values and offsets per list)."""
    n, *arrays = part
    ints, int_ok, res, res_ok, obj_ok, flt, flt_ok, lvals, loffs, list_ok = arrays
    lists = [(lvals[i, : loffs[i, n]], loffs[i, : n + 1]) for i in range(len(LIST_KEYS))]
    return (n, ints[:, :n], int_ok[:, :n], res[:, :n], res_ok[:, :n], obj_ok[:, :n], flt[:, :n], flt_ok[:, :n],
            lists, list_ok[:, :n])  # fmt: skip


def _join(parts: list[_Part]) -> tuple[Any, ...]:
    """The arrays of consecutive runs, concatenated (list offsets shifted)."""
    trimmed = [_trim(p) for p in parts]
    n = sum(t[0] for t in trimmed)
    cols = [np.concatenate([t[k] for t in trimmed], axis=1) for k in range(1, 8)]
    lists = []
    for i in range(len(LIST_KEYS)):
        vals = np.concatenate([t[8][i][0] for t in trimmed])
        offs, base = [np.zeros(1, np.int32)], 0
        for t in trimmed:
            offs.append(t[8][i][1][1:] + base)
            base += int(t[8][i][1][-1])
        lists.append((vals, np.concatenate(offs)))
    list_ok = np.concatenate([t[9] for t in trimmed], axis=1)
    return (n, *cols, lists, list_ok)


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
        raise RuntimeError("the fast JSON reader is not available (no extension built, and numba did not import)")
    assert _tables is not None and _numbers is not None
    lens = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    ends = np.cumsum(lens)
    starts = ends - lens
    out = np.zeros(len(texts), dtype=np.float64)
    ok = np.zeros(len(texts), dtype=np.uint8)
    _, _, hi, lo = _tables
    _numbers(np.frombuffer(b"".join(texts) or b" ", dtype=np.uint8), starts, ends, hi, lo, out, ok)
    return out, ok.astype(bool)


def _masked(values: np.ndarray, ok: np.ndarray, typ: pa.DataType) -> pa.Array:
    return arrays.from_numpy(values, typ, None if ok.all() else ok == 0)


def _table(
    n: int,
    ints: np.ndarray,
    int_ok: np.ndarray,
    res: np.ndarray,
    res_ok: np.ndarray,
    obj_ok: np.ndarray,
    flt: np.ndarray,
    flt_ok: np.ndarray,
    lists: list[tuple[np.ndarray, np.ndarray]],
    list_ok: np.ndarray,
) -> pa.Table:
    cols: dict[str, pa.Array] = {}
    for i, k in enumerate(INT_KEYS):
        cols[k] = _masked(ints[i], int_ok[i], pa.int64())
    for i, k in enumerate(RES_KEYS):
        cpus = _masked(res[2 * i], res_ok[2 * i], pa.float32())
        mem = _masked(res[2 * i + 1], res_ok[2 * i + 1], pa.float32())
        ok = obj_ok[i]
        mask = None if ok.all() else arrays.from_numpy(ok == 0)
        cols[k] = pa.StructArray.from_arrays([cpus, mem], names=["cpus", "memory"], mask=mask)
    for i, k in enumerate(FLOAT_KEYS):
        cols[k] = _masked(flt[i], flt_ok[i], pa.float32())
    for i, k in enumerate(LIST_KEYS):
        vals, offs = lists[i]
        ok = list_ok[i]
        mask = None if ok.all() else arrays.from_numpy(ok == 0)
        offsets, values = arrays.from_numpy(offs, pa.int32()), arrays.from_numpy(vals, pa.float32())
        cols[k] = pa.ListArray.from_arrays(offsets, values, mask=mask)
    assert all(len(c) == n for c in cols.values())
    return pa.table(cols)
