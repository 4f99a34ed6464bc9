"""Array backends: ``cpu`` (NumPy, the test oracle) and ``gpu`` (CuPy + gpuclust's CUDA kernels).

A :class:`Backend` is a name, an array module ``xp`` (``numpy`` or ``cupy``) and ``ops``, the
operations that need a custom kernel.  ``backends/cpu.py`` and ``backends/gpu.py`` expose the same
op names with the same signatures; analyses touch only ``backend.xp`` and ``backend.ops``.

``get_backend("auto")`` resolves once per process (CuPy importable and a CUDA device present
-> ``gpu``, else ``cpu``).  Asking for ``gpu`` where there is none raises
:class:`BackendUnavailable`; nothing ever falls back silently.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from gpuclust._cache import PerArrayCache
from gpuclust.errors import BackendUnavailable

__all__ = [
    "BACKEND_NAMES",
    "ENGINE_THREAD_PREFIX",
    "EXTENSION_OP_MODULES",
    "Backend",
    "Ops",
    "BackendUnavailable",
    "OP_NAMES",
    "available_backend",
    "backend_of",
    "device_free_bytes",
    "finalize_backend",
    "finalizing_on_host",
    "release_pool",
    "merged_backend",
    "get_backend",
    "gpu_available",
]

#: Name prefix of the local engine's partition threads (``gpuclust.engine.local``): ops that
#: thread themselves (the mixture ops) stay single-threaded there.  Here, not in the mixture
#: module, so that the engine names its threads without importing that module (~8 ms).
ENGINE_THREAD_PREFIX = "gpuclust-part"

#: The custom-kernel ops every backend provides (same names, same signatures).
OP_NAMES: tuple[str, ...] = ("bucket_overlap", "grouped_sum", "hash_index")
#: Further op modules per backend (other kernel families keep their twins in their own modules);
#: ``backend.ops.<name>`` looks in the backend's main module first, then in these, in order.
EXTENSION_OP_MODULES: dict[str, tuple[str, ...]] = {
    "cpu": ("gpuclust.backends.moments_cpu", "gpuclust.backends.mixture_cpu", "gpuclust.backends.array_cpu"),
    "gpu": ("gpuclust.backends.moments_gpu", "gpuclust.backends.mixture_gpu", "gpuclust.backends.array_gpu"),
}


class Ops:
    """``backend.ops``: attribute lookup over the backend's op modules (imported lazily)."""

    def __init__(self, main: ModuleType, extensions: tuple[str, ...]):
        self._main = main
        self._extensions = extensions

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if hasattr(self._main, name):
            return getattr(self._main, name)
        import importlib

        for modname in self._extensions:
            mod = importlib.import_module(modname)
            if name in getattr(mod, "__all__", ()):
                return getattr(mod, name)
        raise AttributeError(f"backend op {name!r} not found in {self._main.__name__} or {list(self._extensions)}")

    def __repr__(self) -> str:
        return f"Ops({self._main.__name__}, {list(self._extensions)})"


BACKEND_NAMES: tuple[str, ...] = ("cpu", "gpu", "auto")


@dataclass(frozen=True)
class Backend:
    """An array backend.

    Attributes
    ----------
    name
        ``"cpu"`` or ``"gpu"``.
    xp
        The array module: :mod:`numpy` or :mod:`cupy`.
    ops
        The custom-kernel operations (:data:`OP_NAMES` from ``backends/cpu.py`` or
        ``backends/gpu.py``, plus the twins in :data:`EXTENSION_OP_MODULES`).

    Examples
    --------
    >>> import numpy as np
    >>> be = get_backend("cpu")
    >>> out = be.ops.grouped_sum(np.array([0, 1, 1], dtype=np.int32), np.ones(3), n_groups=2)
    >>> out.tolist()
    [1.0, 2.0]
    """

    name: str
    xp: ModuleType = field(repr=False)
    ops: Any = field(repr=False)

    def asarray(self, a: Any) -> Any:
        """Move a host (NumPy) array onto this backend; on the cpu backend a device array too (a
        copy to the host: a partial left on a device, finalized where there is none)."""
        if self.xp is np and hasattr(a, "__cuda_array_interface__"):
            return self.to_host(a)
        return self.xp.asarray(a)

    def stage(self, a: np.ndarray) -> Any:
        """Like :meth:`asarray`, for read-only side inputs (analysis contexts): on the GPU the
        device copy is cached per host array for the life of that array, so a context used by
        many partitions is uploaded once per process."""
        if self.xp is np:
            return a
        return _staged.get(a, self.xp.asarray, (self.xp.cuda.Device().id,))

    def to_host(self, a: Any) -> np.ndarray:
        """Return ``a`` as a NumPy array (copying from the device if needed)."""
        if isinstance(a, np.ndarray):
            return a
        get = getattr(a, "get", None)
        if callable(get):
            return get()
        return np.asarray(a)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # Backends travel to dask workers by name and are re-resolved there.
        return (get_backend, (self.name,))


_lock = threading.Lock()
_staged = PerArrayCache()
_cache: dict[str, Backend] = {}
_auto: list[str] = []


def gpu_available() -> bool:
    """True when CuPy imports and at least one CUDA device is visible.  Never raises."""
    try:
        from gpuclust.backends import gpu
    except Exception:  # pragma: no cover - import of our own module without cupy is fine
        return False
    return gpu.device_count() > 0


def get_backend(name: str | Backend = "auto") -> Backend:
    """Resolve a backend by name: ``"cpu"``, ``"gpu"`` or ``"auto"``.

    Parameters
    ----------
    name
        ``"auto"`` picks ``gpu`` when CuPy is importable and a device is present, else ``cpu``;
        the choice is made once per process.  A :class:`Backend` is returned unchanged.

    Raises
    ------
    BackendUnavailable
        ``"gpu"`` was asked for and CuPy or a CUDA device is missing.
    ValueError
        Unknown name.

    Examples
    --------
    >>> get_backend("cpu").name
    'cpu'
    """
    if isinstance(name, Backend):
        return name
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {name!r}; choose one of {list(BACKEND_NAMES)}")
    with _lock:
        if name == "auto":
            if not _auto:
                _auto.append("gpu" if gpu_available() else "cpu")
            name = _auto[0]
        be = _cache.get(name)
        if be is not None:
            return be
        if name == "cpu":
            from gpuclust.backends import cpu

            be = Backend("cpu", np, Ops(cpu, EXTENSION_OP_MODULES["cpu"]))
        else:
            from gpuclust.backends import gpu

            cp = gpu.require()
            be = Backend("gpu", cp, Ops(gpu, EXTENSION_OP_MODULES["gpu"]))
        _cache[name] = be
        return be


def backend_of(a: Any) -> Backend:
    """The backend whose arrays ``a`` is one of: ``cpu`` for a NumPy array, else ``gpu`` (CuPy).
    For code that receives arrays without a backend (merges of partials, finalize helpers).

    Examples
    --------
    >>> backend_of(np.zeros(2)).name
    'cpu'
    """
    return get_backend("cpu" if isinstance(a, np.ndarray) else "gpu")


def available_backend(name: str) -> Backend | None:
    """The backend ``name`` when it can run in this process, else ``None`` (e.g. a partial
    computed on a GPU worker, finalized on a client without one)."""
    if name == "gpu" and not gpu_available():
        return None
    try:
        return get_backend(name)
    except BackendUnavailable:
        return None


def finalize_backend(name: str) -> Backend:
    """Where to finalize partials computed on backend ``name``: that backend when it can run in
    this process, else ``cpu`` (a study's gpu partials finalize on the device; the same partials
    on a client without one, on the host).

    >>> finalize_backend("cpu").name
    'cpu'
    """
    if _on_host[0]:
        return get_backend("cpu")
    return available_backend(name) or get_backend("cpu")


_on_host = [0]
_on_host_lock = threading.Lock()


@contextlib.contextmanager
def finalizing_on_host() -> Iterator[None]:
    """Inside, :func:`finalize_backend` gives the cpu backend whatever the partials were computed
    on: an out-of-core study on a device finalizes on the host what runs out of device memory,
    since some finalizes take it in proportion to the data
    (:func:`gpuclust.engine.finish.finalized_or_on_host`).  The partials keep their
    ``backend``, so the finalizes cut their work as they would on the device (the same results).
    Process-wide: a finalize running meanwhile in another thread goes to the host too."""
    with _on_host_lock:
        _on_host[0] += 1
    try:
        yield
    finally:
        with _on_host_lock:
            _on_host[0] -= 1


def merged_backend(a: str, b: str) -> str:
    """The backend name a merge of partials computed on backends ``a`` and ``b`` records: ``gpu``
    if either was, so that its finalize runs on the device where there is one.

    >>> merged_backend("cpu", "gpu"), merged_backend("cpu", "cpu")
    ('gpu', 'cpu')
    """
    return "gpu" if "gpu" in (a, b) else "cpu"


def release_pool(backend: Any) -> None:
    """Give the blocks ``backend``'s device memory pool caches back to the device (after running
    out of memory there, before another try); nothing on the cpu backend."""
    if backend.xp is not np:
        backend.xp.get_default_memory_pool().free_all_blocks()


def device_free_bytes(backend: Any) -> int:
    """Memory ``backend``'s device can still give: CUDA's free memory (``cudaMemGetInfo``) plus
    the blocks CuPy's pool holds for reuse, within the pool's limit (``CUPY_GPU_MEMORY_LIMIT`` /
    ``set_limit``) where one is set."""
    xp = backend.xp
    free, _ = xp.cuda.Device().mem_info
    pool = xp.get_default_memory_pool()
    free = int(free) + int(pool.free_bytes())
    limit = int(pool.get_limit())
    return max(0, min(free, limit - int(pool.used_bytes()))) if limit else free
