"""Values a finalize keeps on the device for its summary's exact quantiles
(:class:`KeptValues`, :func:`kept_quantiles`): machine-utilization's utilizations, overcommit's
request / capacity ratios, peak-prediction's severities.  With them a gpu run's summary neither
reads its written table back nor copies the values to the device again; on the host, or where
the device cannot spare the memory, the summary streams the table in bounded memory
(:func:`gpuclust.stream_quantiles.backend_quantiles_many`), with the same result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import numpy as np

from gpuclust.backends import device_free_bytes
from gpuclust.stream_quantiles import backend_quantiles_many, device_quantiles_many

__all__ = ["KEEP_SHARE", "KeptValues", "kept_quantiles"]

#: Share of what the device can give that the values kept for summaries' quantiles
#: (:class:`KeptValues`, every one of the process together) may take.
KEEP_SHARE = 0.1
_kept = [0]
_kept_lock = threading.Lock()


class KeptValues:
    """Values a finalize computed, kept on the device, per stream, for the exact quantiles of its
    summary (:func:`kept_quantiles`), so that the summary does not read the written table back
    and copy them there again.  Kept only where ``be`` is a device backend (on the host the
    summary streams the table in bounded memory instead), while the kept values of the whole
    process stay within :data:`KEEP_SHARE` of what the device can give (counting them as free);
    an instance refused once keeps nothing more and frees what it held, and its summary reads
    the table.  Pickled (a shard's extra sent from a dask worker), it arrives empty: a client
    without the device never unpickles device arrays, and its summary reads the table."""

    def __init__(self, be: Any) -> None:
        self.be: Any = be if be.name != "cpu" else None
        self.parts: dict[Hashable, list[Any]] | None = {} if self.be is not None else None
        self.nbytes = 0

    @property
    def kept(self) -> bool:
        return self.parts is not None

    def add(self, key: Hashable, values: Any) -> None:
        """Keep float64 ``values`` (host or device) of stream ``key``."""
        if self.parts is None or self.be is None:
            return
        v = self.be.asarray(values).astype(self.be.xp.float64, copy=False).ravel()
        n = int(v.nbytes)
        with _kept_lock:
            ok = _kept[0] + n <= KEEP_SHARE * (device_free_bytes(self.be) + _kept[0])
            if ok:
                _kept[0] += n
        if not ok:
            self.release()
            return
        self.nbytes += n
        self.parts.setdefault(key, []).append(v)

    def extend(self, other: KeptValues) -> None:
        """Take ``other``'s values after these (nothing is kept once either kept nothing)."""
        if self.parts is None or other.parts is None:
            self.release()
            other.release()
            return
        for k, v in other.parts.items():
            self.parts.setdefault(k, []).extend(v)
        self.nbytes += other.nbytes
        other.parts, other.nbytes = {}, 0

    def release(self) -> None:
        """Free the kept values (the instance keeps nothing more)."""
        with _kept_lock:
            _kept[0] -= self.nbytes
        self.parts, self.nbytes = None, 0

    def __del__(self) -> None:
        if self.nbytes:
            self.release()

    def __getstate__(self) -> dict[str, Any]:
        return {"be": None, "parts": None, "nbytes": 0}


def kept_quantiles(
    be: Any,
    kept: Sequence[KeptValues],
    keys: Sequence[Hashable],
    batches: Callable[[], Iterable[Sequence[np.ndarray]]],
    qs: Sequence[float],
) -> np.ndarray:
    """The quantiles ``qs`` of each stream of ``keys`` (a row each; NaN rows for streams without
    values): of the values every shard kept on the device (``kept``, one :class:`KeptValues` a
    shard), one sort a stream there; else :func:`backend_quantiles_many` of ``batches()``, which
    yields per batch the streams' values in the order of ``keys`` (every stream in the same
    passes).  The same result either way."""
    every = bool(kept) and all(k.kept for k in kept)
    device = kept[0].be if every else None
    parts = [[a for k in kept for a in (k.parts or {}).get(key, ())] for key in keys] if every else []
    for k in kept:  # (what they hold lives on in ``parts``; where one was refused, freed now)
        k.release()
    if every:
        return device_quantiles_many(device, parts, qs)
    return backend_quantiles_many(be, batches, len(keys), qs)
