"""Partial kinds: how an analysis' partial merges, splits and shards, declared as data.

An analysis declares its partial field by field (:attr:`gpuclust.analyses.base.Analysis.kinds`,
a :class:`Fields`), and the engine merges, splits and shards partials from that declaration; no
analysis writes a ``merge``.  The kinds:

:class:`Sum`, :class:`Min`, :class:`Max`
    Dense arrays (or counters) merged elementwise.
:class:`Label`
    The name of the backend a partial was computed on (``gpu`` if either was).
:class:`Concat`
    1-D arrays concatenated (a sample of keys, rows of a regression).
:class:`Keyed`
    A keyed partial, ``{"key": sorted unique int64, field: values}``, merged by
    :func:`gpuclust.partials.merge_keyed` (sums, or maxima for the fields named so); with
    ``rows``, disjoint rows with sorted (possibly repeated) keys, merged by a stable merge of
    the keys.  With ``per`` it is *sharded*: the engine spills it per partition and reduces it
    one shard at a time (:mod:`gpuclust.engine.shards`), its keys being ``coordinate x per(ctx)
    + offset`` so that a shard ``[lo, hi)`` of coordinates is the keys ``[lo x per, hi x per)``.
:class:`Merged`
    A field with a merge of its own (a mixture summary, grouped moments, distinct pairs).
:class:`Flat`
    Any of these whose arrays sit at the partial's top level under a prefix (``w_key``,
    ``w_n``, ...) instead of in one dict.

Each kind also declares its merge identity (a dense block's shape and dtype, a keyed partial's
fields and dtypes, a ``Merged`` field's ``empty``), so the empty partial is derived
(:meth:`Fields.empty`), never written by an analysis.  A sharded partial also declares where its
shards are cut (:attr:`Fields.shard_by`: :class:`Even`, :class:`Counted` or :class:`Sampled`).

Every kind but :class:`Merged` merges on the arrays' own module: two partials on a device merge
there (:attr:`Fields.merges_on_device`; a ``Merged`` says whether its function does).  A device
run or study merges such partials on the device while they fit (:func:`gpuclust.engine.tasks.merged_on_device`),
the others on the host (it moves them there first; see :mod:`gpuclust.analyses.base`);
:meth:`Fields.split` leaves the sharded keyed partials, and the fields named in ``stays``, where
they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from gpuclust.analyses.base import host_or_device, to_host
from gpuclust.backends import backend_of, merged_backend
from gpuclust.keys import pack
from gpuclust.partials import merge_keyed

__all__ = [
    "Concat",
    "Counted",
    "Even",
    "Fields",
    "Flat",
    "Keyed",
    "Kind",
    "Label",
    "Max",
    "Merged",
    "Min",
    "Sampled",
    "Shards",
    "Sum",
]

#: A partial field's value: an array, a dict of arrays, a label, ...
Value = Any


def _extreme(dtype: Any, fill: Any, top: bool) -> Any:
    """``fill``, or the largest (``top``) or smallest value of ``dtype``."""
    if fill is not None:
        return fill
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return np.inf if top else -np.inf
    info = np.iinfo(dt)
    return info.max if top else info.min


class Kind:
    """How one field of a partial merges, and its merge identity (a subclass per kind)."""

    def merge(self, a: Value, b: Value) -> Value:
        raise NotImplementedError

    def identity(self, xp: Any, backend: str) -> Value:
        """The field's value in the empty partial, its arrays made by ``xp`` (``backend``: the
        name of the backend the partial is for)."""
        raise NotImplementedError

    @property
    def keyed(self) -> Keyed | None:
        """The :class:`Keyed` this kind is (directly or stored :class:`Flat`), else None."""
        return None

    @property
    def on_device(self) -> bool:
        """Whether its merge runs on the arrays' own module (two device values merge there)."""
        return True

    def take(self, p: Mapping[str, Any], name: str) -> Value:
        """Field ``name``'s value in partial ``p``."""
        return p[name]

    def put(self, name: str, v: Value) -> dict[str, Any]:
        """The partial entries that hold value ``v`` of field ``name``."""
        return {name: v}


@dataclass(frozen=True)
class Sum(Kind):
    """Elementwise sum (dense blocks, counters); ``ragged``: arrays whose last axis may differ in
    length, the entries one lacks counted as 0 (sums over a range that grows as partitions see
    more of it)."""

    shape: tuple[int, ...] = ()
    dtype: Any = np.float64
    ragged: bool = False

    def identity(self, xp: Any, backend: str) -> Value:
        return xp.zeros(self.shape, self.dtype)

    def merge(self, a: Value, b: Value) -> Value:
        if not self.ragged:
            return a + b
        a, b = host_or_device(a), host_or_device(b)  # each on its own module (a device's stays there)
        if a.shape[-1] < b.shape[-1]:
            a, b = b, a
        if not b.shape[-1]:
            return a
        out = a.copy()
        out[..., : b.shape[-1]] += b
        return out


@dataclass(frozen=True)
class _Extreme(Kind):
    """Elementwise minimum (``top``: its identity is the largest value) or maximum."""

    shape: tuple[int, ...] = ()
    dtype: Any = np.float64
    #: the identity's value (default: the dtype's largest value for a minimum, smallest for a maximum)
    fill: Any = None
    top: ClassVar[bool] = True

    def identity(self, xp: Any, backend: str) -> Value:
        return xp.full(self.shape, _extreme(self.dtype, self.fill, top=self.top), self.dtype)

    def merge(self, a: Value, b: Value) -> Value:
        return np.minimum(a, b) if self.top else np.maximum(a, b)


@dataclass(frozen=True)
class Min(_Extreme):
    """Elementwise minimum (identity: ``fill``, by default the dtype's largest value)."""


@dataclass(frozen=True)
class Max(_Extreme):
    """Elementwise maximum (identity: ``fill``, by default the dtype's smallest value)."""

    top: ClassVar[bool] = False


@dataclass(frozen=True)
class Label(Kind):
    """The backend a partial was computed on: ``gpu`` if either was, so that its finalize runs on
    the device where there is one (:func:`gpuclust.backends.merged_backend`)."""

    def identity(self, xp: Any, backend: str) -> Value:
        return backend

    def merge(self, a: Value, b: Value) -> Value:
        return merged_backend(a, b)


@dataclass(frozen=True)
class Concat(Kind):
    """Arrays concatenated along their first axis in merge order (identity: no rows of
    ``dtype``, each row of shape ``row``)."""

    dtype: Any = np.float64
    row: tuple[int, ...] = ()

    def identity(self, xp: Any, backend: str) -> Value:
        return xp.zeros((0, *self.row), self.dtype)

    def merge(self, a: Value, b: Value) -> Value:
        a, b = host_or_device(a), host_or_device(b)
        if not a.shape[0]:  # an empty side (an identity on the host) dropped, whatever its module
            return b
        if not b.shape[0]:
            return a
        return backend_of(a).xp.concatenate([a, b])


@dataclass(frozen=True)
class Merged(Kind):
    """A field merged by ``fn(a, b)`` (associative; its own module carries the proof), whose
    identity is ``empty(xp)``."""

    fn: Callable[[Value, Value], Value]
    empty: Callable[[Any], Value] | None = None
    #: whether ``fn`` merges device arrays on the device (most such merges are host code)
    device: bool = False

    @property
    def on_device(self) -> bool:
        return self.device

    def identity(self, xp: Any, backend: str) -> Value:
        if self.empty is None:
            raise TypeError("a Merged kind without an identity (empty=)")
        return self.empty(xp)

    def merge(self, a: Value, b: Value) -> Value:
        return self.fn(a, b)


@dataclass(frozen=True)
class Keyed(Kind):
    """A keyed partial (see the module docstring).

    ``maxima``: fields merged by maximum, not summed; ``cast``: ``{field: dtype}`` each field
    is widened to before a merge (counts kept narrow in a partition); ``rows``: disjoint sorted
    rows, at most one per row read (the bound by which the engine keeps them on a device), merged
    by a stable merge of their keys; ``per``: keys per shard coordinate, from the
    context (a sharded keyed partial); ``dense``: the number of keys it can span, from the
    context, when the local engine may merge it in memory into dense accumulators instead of
    spilling it (None there, or no ``dense``: spilled); ``dense_host``: whether those
    accumulators may be in host memory too (False: only in a device's, within a share of it:
    overcommit's machines x tiers x buckets grow with the cell)."""

    fields: Mapping[str, Any] = field(default_factory=dict)
    maxima: tuple[str, ...] = ()
    cast: Mapping[str, Any] = field(default_factory=dict)
    rows: bool = False
    per: Callable[[Any], int] | None = None
    dense: Callable[[Any], int | None] | None = None
    dense_host: bool = True

    @property
    def keyed(self) -> Keyed:
        return self

    def identity(self, xp: Any, backend: str) -> Value:
        out = {"key": xp.zeros(0, np.int64)}
        for f, dt in self.fields.items():
            dtype, row = dt if isinstance(dt, tuple) else (dt, ())
            out[f] = xp.zeros((0, *row), dtype)
        return out

    def merge(self, a: Value, b: Value) -> Value:
        a, b = self._cast(a), self._cast(b)
        if not self.rows:
            key = b["key"] if isinstance(a["key"], np.ndarray) else a["key"]  # a device side's, if any
            return merge_keyed(a, b, maxima=self.maxima, xp=backend_of(key).xp)
        if not b["key"].shape[0]:
            return a
        if not a["key"].shape[0]:
            return b
        # two runs sorted by key merged as a stable sort of their concatenation orders them (a
        # key's rows of a before b's), without a sort: a row of b goes after a's rows with keys up
        # to its own, one of a after b's rows with smaller keys; on the arrays' own module, with
        # no value read on the host
        a, b = {f: host_or_device(v) for f, v in a.items()}, {f: host_or_device(v) for f, v in b.items()}
        xp = backend_of(a["key"]).xp
        na, nb = int(a["key"].shape[0]), int(b["key"].shape[0])
        to_a = xp.arange(na, dtype=xp.int64) + xp.searchsorted(b["key"], a["key"], side="left")
        to_b = xp.arange(nb, dtype=xp.int64) + xp.searchsorted(a["key"], b["key"], side="right")
        out = {}
        for f, va in a.items():
            v = xp.empty((na + nb, *va.shape[1:]), dtype=np.result_type(va.dtype, b[f].dtype))
            v[to_a], v[to_b] = va, b[f]
            out[f] = v
        return out

    def _cast(self, p: dict[str, Any]) -> dict[str, Any]:
        if not self.cast:
            return p
        return {f: host_or_device(v).astype(self.cast[f], copy=False) if f in self.cast else v for f, v in p.items()}


@dataclass(frozen=True)
class Flat(Kind):
    """Kind ``inner`` of a dict whose entries sit at the partial's top level, each named
    ``prefix + entry`` (``entries``: the entry names, ``key`` first for a keyed partial)."""

    inner: Kind
    prefix: str
    entries: tuple[str, ...]

    @property
    def keyed(self) -> Keyed | None:
        return self.inner.keyed

    @property
    def on_device(self) -> bool:
        return self.inner.on_device

    def merge(self, a: Value, b: Value) -> Value:
        return self.inner.merge(a, b)

    def identity(self, xp: Any, backend: str) -> Value:
        return self.inner.identity(xp, backend)

    def take(self, p: Mapping[str, Any], name: str) -> Value:
        return {e: p[self.prefix + e] for e in self.entries}

    def put(self, name: str, v: Value) -> dict[str, Any]:
        return {self.prefix + e: v[e] for e in self.entries}


@dataclass(frozen=True)
class Fields:
    """A partial declared field by field: ``kinds`` maps each field's name to its :class:`Kind`;
    ``stays`` names the top-level entries of the rest a split leaves where they are (on the
    device: a finalize reduces them there) instead of moving them to the host.

    The engine's operations on partials: :meth:`merge`, and for a sharded analysis :meth:`split`
    (rest and keyed partials) and its inverse :meth:`join`, :meth:`merge_rest`, :meth:`shards`, :meth:`key_range`,
    :meth:`dense_keys` and :attr:`rows`."""

    kinds: Mapping[str, Kind]
    stays: tuple[str, ...] = ()
    #: where the shards of its sharded keyed partials are cut (required when it has any)
    shard_by: Shards | None = None

    def merge(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
        """Two partials merged field by field (associative and commutative up to float rounding)."""
        return self._merge(a, b, self.kinds)

    def empty(self, backend: Any = None, *, on_backend: bool = False) -> dict[str, Any]:
        """The merge identity, labelled with ``backend``'s name (``cpu`` for None): host arrays,
        or with ``on_backend`` arrays made in ``backend``'s memory (a partial that starts from it
        there: nothing is copied to a device)."""
        xp = backend.xp if on_backend and backend is not None else np
        name = getattr(backend, "name", "cpu")
        out: dict[str, Any] = {}
        for n, kind in self.kinds.items():
            out.update(kind.put(n, kind.identity(xp, name)))
        return out

    @property
    def merges_on_device(self) -> bool:
        """Whether two partials on a device merge there, every field by a merge that runs on the
        arrays' own module (:attr:`Kind.on_device`)."""
        return all(k.on_device for k in self.kinds.values())

    @property
    def sharded(self) -> tuple[str, ...]:
        """The sharded keyed partials' names (:class:`Keyed` with ``per``), in declaration order."""
        return tuple(n for n, k in self.kinds.items() if k.keyed is not None and k.keyed.per is not None)

    @property
    def rows(self) -> tuple[str, ...]:
        """The sharded keyed partials that are disjoint rows (concatenated, not summed)."""
        return tuple(n for n in self.sharded if self._keyed(n).rows)

    def split(self, p: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """``(rest, keyed)``: the other fields (on the host, but for :attr:`stays`) and the sharded
        keyed partials, ``{name: {"key": ..., field: values}}``, left where they are."""
        rest: dict[str, Any] = {}
        keyed: dict[str, dict[str, Any]] = {}
        sharded = self.sharded
        for name, kind in self.kinds.items():
            v = kind.take(p, name)
            if name in sharded:
                keyed[name] = {f: host_or_device(x) for f, x in v.items()}
            else:
                for k, x in kind.put(name, v).items():
                    rest[k] = x if k in self.stays else to_host(x)
        return rest, keyed

    def join(self, rest: Mapping[str, Any], keyed: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """The partial :meth:`split` made ``(rest, keyed)`` of (the arrays where they are)."""
        out = dict(rest)
        for name, v in keyed.items():
            out.update(self.kinds[name].put(name, dict(v)))
        return out

    def merge_rest(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
        """Two rests of :meth:`split` merged."""
        sharded = self.sharded
        return self._merge(a, b, {n: k for n, k in self.kinds.items() if n not in sharded})

    def shards(self, ctx: Any, rest: Mapping[str, Any]) -> list[tuple[int, int]]:
        """The shards, ranges ``[lo, hi)`` of the coordinate the sharded keys are ordered by, cut
        by :attr:`shard_by` (``rest``: the merged rest of :meth:`split`; its :class:`Label` says
        whether the partials were computed on a device, where a shard may be larger)."""
        if self.shard_by is None:
            raise TypeError("a sharded partial without a shard rule (shard_by=)")
        label = next((n for n, k in self.kinds.items() if isinstance(k, Label)), None)
        on_device = label is not None and rest.get(label, "cpu") != "cpu"
        return self.shard_by.ranges(ctx, rest, on_device)

    def context_shards(self, ctx: Any, on_device: bool) -> list[tuple[int, int]] | None:
        """The shards :meth:`shards` will cut where they follow from the context alone
        (``on_device``: the partials computed on a device), before any partial; else None."""
        if self.shard_by is None or not self.shard_by.from_context:
            return None
        return self.shard_by.ranges(ctx, {}, on_device)

    def key_range(self, ctx: Any, name: str, lo: int, hi: int) -> tuple[int, int]:
        """The keys ``[first, end)`` of sharded keyed partial ``name`` in the shard of coordinates
        ``[lo, hi)``."""
        per = self._per(name, ctx)
        return int(pack(lo, 0, per)), int(pack(hi, 0, per))

    def dense_keys(self, ctx: Any, on_device: bool = True) -> dict[str, tuple[int, int]] | None:
        """``{name: (0, keys)}`` for the sharded keyed partials when every one may be merged into
        dense accumulators (see :class:`Keyed`) on a device (``on_device``) or in host memory,
        else None."""
        out = {}
        for name in self.sharded:
            kd = self._keyed(name)
            n = kd.dense(ctx) if kd.dense is not None and not kd.rows and (on_device or kd.dense_host) else None
            if n is None:
                return None
            out[name] = (0, int(n))
        return out or None

    def coordinates(self, ctx: Any) -> int:
        """How many shard coordinates the dense key ranges span (:meth:`dense_keys`, on a device):
        the most of any sharded keyed partial's keys over its keys per coordinate, rounded up."""
        ranges = self.dense_keys(ctx) or {}
        return max((-(-end // self._per(name, ctx)) for name, (_, end) in ranges.items()), default=0)

    def _keyed(self, name: str) -> Keyed:
        kd = self.kinds[name].keyed
        assert kd is not None
        return kd

    def _per(self, name: str, ctx: Any) -> int:
        per = self._keyed(name).per
        if per is None:
            raise KeyError(f"{name!r} is not a sharded keyed partial")
        return int(per(ctx))

    @staticmethod
    def _merge(a: Mapping[str, Any], b: Mapping[str, Any], kinds: Mapping[str, Kind]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, kind in kinds.items():
            out.update(kind.put(name, kind.merge(kind.take(a, name), kind.take(b, name))))
        return out


class Shards:
    """Where the engine cuts a sharded partial (:attr:`Fields.shard_by`): ranges ``[lo, hi)`` of
    the coordinate its keys are ordered by (a machine code, a key's leading component), each small
    enough to finalize in memory, at least one; ``device``: the factor a shard's size grows by
    where the partials were computed on a device (its memory and launches favour fewer, larger
    shards)."""

    device: int = 1
    #: whether :meth:`ranges` reads nothing of the rest (the shards are known from the context)
    from_context: ClassVar[bool] = False

    def ranges(self, ctx: Any, rest: Mapping[str, Any], on_device: bool) -> list[tuple[int, int]]:
        raise NotImplementedError

    def _size(self, size: int, on_device: bool) -> int:
        return size * (self.device if on_device else 1)


@dataclass(frozen=True)
class Even(Shards):
    """The coordinates ``[0, count(ctx))`` in ranges of equal size (no small last one), each of at
    most about ``size`` keys, ``weight(ctx)`` keys a coordinate (at least one coordinate a shard).

    >>> Even(lambda ctx: 10, lambda ctx: 3, size=9).ranges(None, {}, False)
    [(0, 2), (2, 5), (5, 7), (7, 10)]
    >>> Even(lambda ctx: 0, lambda ctx: 3, size=9).ranges(None, {}, False)
    [(0, 0)]
    """

    count: Callable[[Any], int]
    weight: Callable[[Any], int]
    size: int
    device: int = 1
    from_context: ClassVar[bool] = True

    def ranges(self, ctx: Any, rest: Mapping[str, Any], on_device: bool) -> list[tuple[int, int]]:
        n = int(self.count(ctx))
        per_shard = max(1, self._size(self.size, on_device) // max(int(self.weight(ctx)), 1))
        k = -(-n // per_shard)
        return [(n * i // k, n * (i + 1) // k) for i in range(k)] or [(0, 0)]


@dataclass(frozen=True)
class Counted(Shards):
    """The coordinates ``[0, count(ctx))`` in ranges of about ``size`` rows each, a coordinate
    whole, by the rows per coordinate in the rest's ``field`` (shorter than ``count``: the rest
    have none); one range when there are none.

    >>> Counted(lambda ctx: 5, "n", size=4).ranges(None, {"n": [3, 2, 0, 4]}, False)
    [(0, 1), (1, 3), (3, 5)]
    >>> Counted(lambda ctx: 4, "n", size=1).ranges(None, {"n": [1]}, False)
    [(0, 4)]
    """

    count: Callable[[Any], int]
    field: str
    size: int
    device: int = 1

    def ranges(self, ctx: Any, rest: Mapping[str, Any], on_device: bool) -> list[tuple[int, int]]:
        n, size = int(self.count(ctx)), self._size(self.size, on_device)
        counted = np.asarray(rest[self.field])[:n]
        if not n or not int(counted.sum()):
            return [(0, n)]
        rows = np.zeros(n, np.int64)
        rows[: counted.shape[0]] = counted  # the coordinates past the counted ones: none
        cum = np.cumsum(rows)
        bounds, lo = [], 0
        while lo < n:
            base = int(cum[lo - 1]) if lo else 0
            hi = min(n, max(int(np.searchsorted(cum, base + size, side="right")), lo + 1))
            bounds.append((lo, hi))
            lo = hi
        return bounds


@dataclass(frozen=True)
class Sampled(Shards):
    """The whole int64 range of the coordinate in ranges of about ``size`` keys each, cut at
    quantiles of the rest's ``sample`` of the keys (``n``: how many keys in all); one range when
    there are few, or when the rest's ``whole`` is set (a partial kept whole, nothing to cut).

    >>> Sampled(size=2).ranges(None, {"n": 6, "sample": np.array([9, 1, 5])}, False)[1:]
    [(5, 9), (9, 9223372036854775807)]
    """

    size: int
    sample: str = "sample"
    n: str = "n"
    whole: str | None = None

    def ranges(self, ctx: Any, rest: Mapping[str, Any], on_device: bool) -> list[tuple[int, int]]:
        lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
        k = -(-int(rest[self.n]) // self._size(self.size, on_device))
        if k <= 1 or (self.whole is not None and rest[self.whole] is not None):
            return [(lo, hi)]
        sample = np.sort(rest[self.sample])
        cuts = np.unique(sample[(np.arange(1, k) * sample.shape[0]) // k])
        bounds = [lo, *(int(c) for c in cuts if lo < int(c) < hi), hi]
        return list(zip(bounds[:-1], bounds[1:], strict=True))
