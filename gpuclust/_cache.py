"""A cache of values derived from an array, kept while that array lives (keyed by identity)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any

__all__ = ["PerArrayCache", "forget"]

#: Every cache made, so that :func:`forget` reaches them all.
_ALL: weakref.WeakSet[PerArrayCache] = weakref.WeakSet()


class PerArrayCache:
    """``get(a, make)`` returns ``make(a)``, computed once per live array object ``a``.

    Used for what analyses' read-only context arrays turn into on every partition: their device
    copies (``Backend.stage``), hash tables (``backends.cpu.hash_index``) and dtype views.  An
    entry goes when its array is garbage-collected; objects that cannot be weakly referenced are
    not cached.  Thread-safe (``make`` runs under the cache's lock).

    Examples
    --------
    >>> import numpy as np
    >>> c = PerArrayCache()
    >>> a = np.arange(3)
    >>> c.get(a, lambda x: x.sum()) is c.get(a, lambda x: -1)
    True
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[Hashable, ...], tuple[Any, Any]] = {}
        _ALL.add(self)

    def __contains__(self, a: Any) -> bool:
        """Whether something made of ``a`` is kept."""
        with self._lock:
            return any(ref() is a for k, (ref, _) in self._entries.items() if k[0] == id(a))

    def forget(self, arrays: Iterable[Any]) -> None:
        """Drop what was made of ``arrays`` (made again on the next :meth:`get`)."""
        ids: dict[Any, Any] = {id(a): a for a in arrays}
        with self._lock:
            for key in [k for k, (ref, _) in self._entries.items() if ref() is ids.get(k[0], self)]:
                del self._entries[key]

    def get(self, a: Any, make: Callable[[Any], Any], extra_key: tuple[Hashable, ...] = ()) -> Any:
        key = (id(a), *extra_key)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and hit[0]() is a:
                return hit[1]
            value = make(a)
            entries = self._entries  # the callback must not keep the cache itself alive

            def forget(_ref: object) -> None:
                entries.pop(key, None)

            try:
                ref = weakref.ref(a, forget)
            except TypeError:  # not weak-referenceable: do not cache
                return value
            self._entries[key] = (ref, value)
            return value


def forget(arrays: Iterable[Any]) -> None:
    """Drop what every cache made of ``arrays``: e.g. the device copies of a study's contexts not
    in its next run (:meth:`gpuclust.backends.Backend.stage`), so that their device memory is freed."""
    arrays = list(arrays)
    for cache in list(_ALL):
        cache.forget(arrays)
