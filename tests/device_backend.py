"""A backend whose arrays pose as device arrays: NumPy arrays wrapped so that, like CuPy's, they
refuse to mix with host arrays and to convert to NumPy implicitly.  The analyses' generic code run
on it fails where it would fail on a device because a host array met a device one, which the
CuPy-shaped module of ``tests/generic_backend.py`` alone cannot see (its arrays are NumPy's).

What a :class:`DeviceArray` refuses, as ``cupy.ndarray`` does:

* ``numpy.asarray(a)`` / ``numpy.array(a)`` (CuPy: "Implicit conversion to a NumPy array is not
  allowed"); ``a.get()`` is the explicit copy;
* a host array (``numpy.ndarray`` of one or more dimensions) as an operand of a ufunc or an
  array function beside device arrays (CuPy: "Unsupported type <class 'numpy.ndarray'>");
* a Python scalar of a subclass of ``int`` / ``float`` (an ``IntEnum`` member such as
  ``EventType.SUBMIT``) as a ufunc operand: CuPy takes only the exact scalar types ("operand
  type(s) all returned NotImplemented from __array_ufunc__"; found on an H200, 2026-11-27);
* the ufunc methods the CuPy-shaped module refuses.

Host scalars and 0-d arrays mix, as on CuPy; indexing with host arrays and assigning host arrays
into device arrays are allowed here (CuPy converts some of those), so this errs towards passing.
The backend's ``ops`` are the cpu backend's, fed the wrapped arrays' data (on a device they are
kernels), and ``stage`` / ``asarray`` copy host arrays to "the device" (wrap them).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import threading
import time
import types
import weakref
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
from generic_backend import CPU, SHAPED_XP, check_ufunc_method

from gpuclust.backends import Backend

__all__ = [
    "DEVICE",
    "DEVICE_GPU",
    "MEMORY",
    "OPS_CALLED",
    "WORK",
    "DeviceArray",
    "DeviceOutOfMemoryError",
    "column_bytes",
    "counting_device_work",
    "device_memory",
    "mark_partials_gpu",
    "result_bytes",
]

#: Device work counted inside :func:`counting_device_work`: ``ops``, the device-array operations
#: (ufuncs, array functions and methods, array creation, gathers and scatters: each one kernel
#: launch or more on CuPy, ~10 us of host time apiece); ``kernels``, the backend's ops (gpuclust's
#: kernels and CuPy-composed ops, :data:`OPS_CALLED` by name); ``syncs``, device values read on the host (``bool`` / ``int`` / ``float`` / an index
#: of a device array, ``get``: each waits for the device), and operations whose result is sized
#: by the data (``nonzero``, ``flatnonzero``, ``argwhere``, ``unique``, ``compress``, ``extract``,
#: a boolean mask as an index: CuPy reads a count back to size it); ``device_s``, the seconds spent
#: inside those operations here (on NumPy: what a device would do, the copies included), so that
#: the rest of a run's time is what stays on the host; ``h2d_bytes``, host arrays copied to the
#: device (``asarray`` / ``stage`` of a host array, a host array assigned into a device one, used
#: as an index or given to a kernel); and ``d2h_bytes``, device bytes read on the host (``get`` /
#: ``to_host`` and the scalar syncs).
WORK: Counter[str] = Counter()
#: The backend's ops called inside :func:`counting_device_work`, by name (cleared with
#: :data:`WORK`), and ``bincount``: every ``xp.bincount`` of device arrays, which on CuPy is
#: :func:`gpuclust._xp.bincount`'s kernel (the code rules keep bare calls out).
OPS_CALLED: Counter[str] = Counter()
_counting = [False]
_nesting = threading.local()


@contextlib.contextmanager
def counting_device_work() -> Iterator[Counter[str]]:
    """Count the device work done inside (:data:`WORK`, cleared first)."""
    WORK.clear()
    OPS_CALLED.clear()
    _counting[0] = True
    try:
        yield WORK
    finally:
        _counting[0] = False


@contextlib.contextmanager
def _op(kind: str) -> Iterator[None]:
    """One device operation of ``kind``: counted, and timed into ``device_s`` unless it runs
    inside another (an array function calling methods of its arguments)."""
    if not _counting[0]:
        yield
        return
    WORK[kind] += 1
    depth = getattr(_nesting, "depth", 0)
    _nesting.depth = depth + 1
    start = time.perf_counter()
    try:
        yield
    finally:
        _nesting.depth = depth
        if depth == 0:
            WORK["device_s"] += time.perf_counter() - start


def _count(kind: str, n: int = 1) -> None:
    if _counting[0]:
        WORK[kind] += n


#: Device memory inside :func:`device_memory`: ``live_bytes``, the bytes of the device buffers
#: alive now (each NumPy buffer a :class:`DeviceArray` wraps counted once, from its wrapping to
#: its release, whatever views of it there are), and ``peak_live_bytes``, the most there were;
#: ``cap``, a limit (0: none) beyond which an allocation raises :class:`DeviceOutOfMemoryError`,
#: as CuPy's pool does past ``set_limit``.  Buffers wrapped before :func:`device_memory` began
#: are not counted.  Temporaries inside one operation (a sort's scratch) are not seen.
MEMORY: Counter[str] = Counter()
_live: dict[int, int] = {}  # id of a base buffer -> its bytes
_live_lock = threading.Lock()
_tracking = [False]


class DeviceOutOfMemoryError(MemoryError):
    """An allocation past :data:`MEMORY`'s cap (CuPy: ``cupy.cuda.memory.OutOfMemoryError``)."""


@contextlib.contextmanager
def device_memory(cap: int = 0) -> Iterator[Counter[str]]:
    """Count the device bytes alive and their peak (:data:`MEMORY`, cleared first); with ``cap``
    (bytes), raise :class:`DeviceOutOfMemoryError` for an allocation that would pass it."""
    with _live_lock:
        MEMORY.clear()
        _live.clear()
        MEMORY["cap"] = int(cap)
        _tracking[0] = True
    try:
        yield MEMORY
    finally:
        with _live_lock:
            _tracking[0] = False
            _live.clear()
            MEMORY["live_bytes"] = 0  # untracked from here: arrays still alive would stay counted


def _freed(key: int) -> None:
    with _live_lock:
        n = _live.pop(key, None)
        if n is not None:
            MEMORY["live_bytes"] -= n


def _base(a: np.ndarray) -> np.ndarray:
    """The array owning ``a``'s buffer (``a`` itself if it owns it, or views a foreign one)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _allocated(a: np.ndarray) -> None:
    """Count ``a``'s buffer as device memory (once: a view of a counted buffer adds nothing)."""
    if not _tracking[0]:
        return
    base = _base(a)
    key = id(base)
    with _live_lock:
        if not _tracking[0] or key in _live:
            return
        n = int(base.nbytes)
        live, cap = MEMORY["live_bytes"], MEMORY["cap"]
        if cap and live + n > cap:
            raise DeviceOutOfMemoryError(
                f"Out of memory allocating {n:,} bytes (allocated so far: {live:,} bytes, limit set to: {cap:,} bytes)."
            )
        _live[key] = n
        MEMORY["live_bytes"] = live + n
        MEMORY["peak_live_bytes"] = max(MEMORY["peak_live_bytes"], live + n)
    weakref.finalize(base, _freed, key)


def _host_bytes(x: Any) -> int:
    """The bytes of the host arrays (one or more dimensions) in ``x``: what a device copies in."""
    if isinstance(x, np.ndarray):
        return x.nbytes if x.ndim > 0 else 0
    if isinstance(x, (list, tuple)):
        return sum(_host_bytes(v) for v in x)
    if isinstance(x, dict):
        return sum(_host_bytes(v) for v in x.values())
    return 0


#: Operations whose result's size depends on the data: CuPy reads a count back to size it (a sync).
_SIZED_BY_DATA = frozenset(("nonzero", "flatnonzero", "argwhere", "unique", "compress", "extract"))


def _sized_by_data() -> None:
    """An operation sized by the data: its size (a count) read on the host first, as CuPy does."""
    _count("syncs")
    _count("d2h_bytes", 8)


def _has_mask(key: Any) -> bool:
    """Whether an index holds a boolean device array (a selection sized by its true values)."""
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, DeviceArray) and k.data.dtype == np.bool_ for k in keys)


def _basic(key: Any) -> bool:
    """Whether an index is basic (a view, no kernel): ints, slices, None, Ellipsis, tuples of them."""
    if isinstance(key, tuple):
        return all(_basic(k) for k in key)
    return key is None or key is Ellipsis or isinstance(key, (int, slice))


def _dev(x: Any) -> Any:
    """Wrap NumPy results (arrays, scalars of a reduction, tuples / lists of them, the arrays of a
    dataclass such as :class:`gpuclust.partials.Moments`) as device ones."""
    if isinstance(x, np.ndarray):
        return DeviceArray(x)
    if isinstance(x, np.generic):
        return DeviceArray(np.asarray(x))
    if isinstance(x, tuple):
        return tuple(_dev(v) for v in x)
    if isinstance(x, list):
        return [_dev(v) for v in x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):  # e.g. Moments: a kernel's arrays
        return dataclasses.replace(x, **{f.name: _dev(getattr(x, f.name)) for f in dataclasses.fields(x)})
    return x


_SCALARS = (int, float, bool)


def _data(x: Any, where: str | None = None) -> Any:
    """The NumPy data of the device arrays in ``x`` (nested lists, tuples, dicts).  With ``where``
    (an operation on device arrays) a host array of one or more dimensions is refused, as CuPy
    does; without it (the ops: kernels fed the data) anything passes."""
    if isinstance(x, DeviceArray):
        return x.data
    if where is not None and isinstance(x, np.ndarray) and x.ndim > 0:
        raise TypeError(
            f"Unsupported type {type(x)} (a host array given to {where} beside device arrays; "
            "copy it with xp.asarray / backend.stage first)"
        )
    if isinstance(x, (list, tuple)):
        return type(x)(_data(v, where) for v in x)
    if isinstance(x, dict):
        return {k: _data(v, where) for k, v in x.items()}
    return x


class DeviceArray(np.lib.mixins.NDArrayOperatorsMixin):
    """A NumPy array posing as a CuPy one (see the module docstring)."""

    __slots__ = ("data",)

    def __init__(self, data: np.ndarray):
        _allocated(data)
        self.data = data

    # ---- what CuPy arrays have and NumPy ones lack
    def get(self) -> np.ndarray:
        _count("d2h_bytes", self.data.nbytes)
        with _op("syncs"):
            return self.data.copy()

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The buffer's address is its "device pointer" (:data:`XP`'s ``cuda.runtime.memcpyAsync``
        writes there)."""
        return {
            "shape": self.data.shape,
            "typestr": self.data.dtype.str,
            "data": (int(self.data.ctypes.data), False),
            "version": 3,
        }

    def __array__(self, *args: Any, **kw: Any) -> np.ndarray:
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a "
            "NumPy array explicitly."
        )

    # ---- NumPy's protocols: refuse host operands, then compute on the data
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kw: Any) -> Any:
        check_ufunc_method(ufunc, method)
        where = f"{ufunc.__name__}.{method}"
        for x in inputs:
            if isinstance(x, (int, float)) and type(x) not in _SCALARS:
                raise TypeError(
                    f"operand type(s) all returned NotImplemented from __array_ufunc__ ({where} of a "
                    f"{type(x).__name__} scalar: CuPy takes int / float / bool only; pass int(...))"
                )
        with _op("ops"):
            args = _data(inputs, where)
            if "out" in kw:
                kw["out"] = _data(kw["out"], where)
            return _dev(getattr(ufunc, method)(*args, **kw))

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        where = getattr(func, "__name__", str(func))
        if where in _SIZED_BY_DATA:
            _sized_by_data()
        if where == "bincount" and _counting[0]:
            OPS_CALLED[where] += 1
        with _op("ops"):
            return _dev(func(*_data(args, where), **_data(kwargs, where)))

    # ---- the ndarray surface
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # NumPy's __array_interface__ / __array_struct__: no host view
            raise AttributeError(name)
        attr = getattr(self.data, name)
        if callable(attr):

            def method(*args: Any, **kw: Any) -> Any:
                if name in _SIZED_BY_DATA:
                    _sized_by_data()
                with _op("ops"):
                    return _dev(attr(*_data(args), **_data(kw)))

            return method
        return _dev(attr)

    def __getitem__(self, key: Any) -> Any:
        if _basic(key):  # a view
            return _dev(self.data[_data(key)])
        _count("h2d_bytes", _host_bytes(key))
        if _has_mask(key):
            _sized_by_data()
        with _op("ops"):  # a gather
            return _dev(self.data[_data(key)])

    def __setitem__(self, key: Any, value: Any) -> None:
        _count("h2d_bytes", _host_bytes(key) + _host_bytes(value))
        with _op("ops"):
            self.data[_data(key)] = _data(value)

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Any:
        return (_dev(v) for v in self.data)

    def __bool__(self) -> bool:
        _count("syncs")
        _count("d2h_bytes", self.data.itemsize)
        return bool(self.data)

    def __int__(self) -> int:
        _count("syncs")
        _count("d2h_bytes", self.data.itemsize)
        return int(self.data)

    def __float__(self) -> float:
        _count("syncs")
        _count("d2h_bytes", self.data.itemsize)
        return float(self.data)

    def __index__(self) -> int:
        _count("syncs")
        _count("d2h_bytes", self.data.itemsize)
        return self.data.__index__()

    def __repr__(self) -> str:
        return f"DeviceArray({self.data!r})"


def _creation(f: Any) -> Any:
    def make(*args: Any, **kw: Any) -> Any:
        with _op("ops"):
            return _dev(f(*_data(args), **_data(kw)))

    return make


def _asarray(a: Any, dtype: Any = None, **kw: Any) -> Any:
    """``cupy.asarray``: a device array as it is (or cast), a host one copied to the device."""
    if isinstance(a, DeviceArray):
        if dtype is None or a.data.dtype == np.dtype(dtype):
            return a
        with _op("ops"):
            return DeviceArray(a.data.astype(dtype))
    with _op("ops"):  # a host-to-device copy
        out = DeviceArray(np.array(_data(a), dtype=dtype, **kw))
    _count("h2d_bytes", out.data.nbytes)
    return out


XP = types.ModuleType("device_shaped", "The CuPy-shaped module, its results device arrays.")
XP.__dict__.update(vars(SHAPED_XP))
XP.__dict__.update(
    {
        k: _creation(getattr(np, k))
        for k in ("zeros", "ones", "empty", "full", "arange", "linspace", "eye", "fromiter", "frombuffer")
    }
)
XP.__dict__.update(asarray=_asarray, array=_asarray, ascontiguousarray=_creation(np.ascontiguousarray))


class _Pinned(np.ndarray):
    """Page-locked host memory (``cupy.cuda.alloc_pinned_memory``): a buffer with its ``ptr``."""

    @property
    def ptr(self) -> int:
        return int(self.ctypes.data)


class _Stream:
    """A CUDA stream: the copies here are done when issued, so there is nothing to wait for."""

    ptr = 0

    def __init__(self, non_blocking: bool = False):
        self.non_blocking = non_blocking

    def synchronize(self) -> None:
        _count("syncs")


class _Event:
    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _Device:
    """``cupy.cuda.Device``: device 0 of 16 GiB, its free memory what is not live inside
    :func:`device_memory`."""

    def __init__(self, device: int = 0):
        self.id = int(device)

    def __enter__(self) -> _Device:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    @property
    def mem_info(self) -> tuple[int, int]:
        total = 16 << 30
        return max(0, total - int(MEMORY["live_bytes"])), total


class _MemoryPool:
    """``cupy.get_default_memory_pool()``: its limit :data:`MEMORY`'s cap inside
    :func:`device_memory` (as ``set_limit``), its used bytes the live ones; it caches nothing."""

    def get_limit(self) -> int:
        return int(MEMORY["cap"]) if _tracking[0] else 0

    def used_bytes(self) -> int:
        return int(MEMORY["live_bytes"])

    def free_bytes(self) -> int:
        return 0

    def free_all_blocks(self) -> None:
        POOL_RELEASES[0] += 1  # (nothing cached to give back)


def _memcpy_async(dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
    """``cudaMemcpyAsync`` host to device: the bytes at ``src`` written at ``dst`` (a device
    array's buffer, by its ``__cuda_array_interface__`` address), counted as copied in."""
    assert kind == _RUNTIME.memcpyHostToDevice
    ctypes.memmove(dst, src, nbytes)
    _count("h2d_bytes", nbytes)


_RUNTIME = types.SimpleNamespace(memcpyHostToDevice=1, memcpyAsync=_memcpy_async)
_STREAM = type("Stream", (_Stream,), {"null": _Stream()})
#: What the engine's gpu load path (gpuclust/engine/staging.py) uses of ``cupy.cuda``: devices,
#: streams, events, pinned buffers and the runtime's asynchronous copy.
_POOL = _MemoryPool()
#: Calls of the pool's ``free_all_blocks`` (what the engine gives back after running out of memory).
POOL_RELEASES = [0]
XP.get_default_memory_pool = lambda: _POOL
XP.cuda = types.SimpleNamespace(
    Device=_Device,
    Stream=_STREAM,
    Event=_Event,
    alloc_pinned_memory=lambda nbytes: np.zeros(int(nbytes), np.uint8).view(_Pinned),
    runtime=_RUNTIME,
)


class _DeviceOps:
    """The cpu backend's ops on the arrays' data ("kernels"), without ``lookup_slot_tables`` and
    ``lookup_block_rows`` (as the gpu's); array results come back as device arrays."""

    def __init__(self, ops: Any):
        self._ops = ops

    def __getattr__(self, name: str) -> Any:
        if name == "lookup_slot_tables":
            return False
        if name == "lookup_block_rows":  # as the gpu ops: a lookup is one launch over all rows
            return None
        op = getattr(self._ops, name)
        if not callable(op):
            return op

        def call(*args: Any, **kw: Any) -> Any:
            if _counting[0]:
                OPS_CALLED[name] += 1
            _count("h2d_bytes", _host_bytes(args) + _host_bytes(kw))
            with _op("kernels"):
                return _dev(op(*_data(args), **_data(kw)))

        return call


@dataclasses.dataclass(frozen=True)
class _DeviceBackend(Backend):
    def stage(self, a: np.ndarray) -> Any:
        """As the gpu's: the device copy of a host array made once for the life of that array."""
        from gpuclust.backends import _staged

        if isinstance(a, DeviceArray):
            return a
        return _staged.get(a, _asarray, ("device-shaped",))

    def to_host(self, a: Any) -> np.ndarray:
        return a.get() if isinstance(a, DeviceArray) else np.asarray(a)


DEVICE = _DeviceBackend("cpu", XP, _DeviceOps(CPU.ops))
#: :data:`DEVICE` under the gpu backend's name, what :func:`resolve_gpu_to_device` makes the gpu
#: backend, so that code choosing by the name (a finalize's chunk sizes, the mixture inversion)
#: takes the gpu's way.  Studies and runs keep :data:`DEVICE`: their load path is CuPy's under
#: that name (pinned buffers, streams); :func:`mark_partials_gpu` marks their partials instead.
DEVICE_GPU = dataclasses.replace(DEVICE, name="gpu")


def mark_partials_gpu(monkeypatch: Any) -> None:
    """Mark the partials of every registered analysis as computed on the gpu (their ``backend``
    entry), as a gpu run's are, so that with :func:`resolve_gpu_to_device` a study or run on
    :data:`DEVICE` finalizes them on the device-shaped backend, as a gpu run does on the device."""
    from gpuclust.analyses.registry import create, names

    for cls in {type(create(n)) for n in names()}:

        def partial(self: Any, cols: Any, ctx: Any, backend: Any, real: Any = cls.partial) -> Any:
            out = real(self, cols, ctx, backend)
            if isinstance(out, dict) and "backend" in out:
                out["backend"] = "gpu"
            return out

        monkeypatch.setattr(cls, "partial", partial)


def resolve_gpu_to_device(monkeypatch: Any) -> None:
    """Make the gpu backend :data:`DEVICE_GPU` for the rest of a test: ``get_backend("gpu")`` (and
    so ``backend_of`` of a device array), ``available_backend("gpu")`` and ``finalize_backend("gpu")``
    (so partials marked as computed on the gpu finalize on it)."""
    import gpuclust.backends as backends
    from gpuclust.engine import study_workers, tasks

    real, real_available = backends.get_backend, backends.available_backend

    def get_backend(name: Any = "auto") -> Backend:
        return DEVICE_GPU if name == "gpu" else real(name)

    def available_backend(name: str) -> Backend | None:
        return DEVICE_GPU if name == "gpu" else real_available(name)

    monkeypatch.setattr(backends, "get_backend", get_backend)
    monkeypatch.setattr(backends, "available_backend", available_backend)
    # the dask paths' tasks name their backend ("gpu": a worker resolves it itself)
    monkeypatch.setattr(tasks, "get_backend", get_backend)
    monkeypatch.setattr(study_workers, "get_backend", get_backend)


def column_bytes(ds: Any, analysis: Any) -> int:
    """Bytes in backend memory of the columns ``analysis`` reads from its table, every row of
    dataset ``ds`` (what its load must copy to a device at the least)."""
    from gpuclust.engine.staging import column_dtypes

    cols = sorted(set(analysis.columns) | set(analysis.context_columns))
    rows = ds.num_rows(analysis.table)
    return int(sum(rows * dt.itemsize for dt in column_dtypes(analysis.table, cols).values()))


def result_bytes(res: dict[str, Any]) -> int:
    """Bytes of an analysis' result tables (pandas or Arrow)."""
    total = 0
    for t in res.values():
        if hasattr(t, "nbytes"):  # Arrow
            total += int(t.nbytes)
        elif hasattr(t, "memory_usage"):
            total += int(t.memory_usage(index=False, deep=False).sum())
    return total
