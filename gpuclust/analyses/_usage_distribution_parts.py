"""``usage-distribution``'s partial pieces (:mod:`gpuclust.analyses.usage_distribution`): the
windows a partial uses (:func:`used_windows`), the (window, bucket) pieces of ``time`` groups
(:func:`expand_pieces`), the rows' group key components (:func:`group_components`), the
per-group extras of a partial (:func:`group_extras`), the finalize of a hybrid summary where the
partials were (:func:`finalize_mixture`), the merge of two partials (:func:`merge_partials`),
their split into keyed rows of finished groups for the parted tables (:func:`split_partial`), and
the partial's kinds (:class:`UsageFields`: a :class:`~gpuclust.analyses.kinds.Fields` whose whole
partials merge and split by those two, and whose empty partial is derived from the declaration
of an open partial's fields, :func:`open_fields`).

The tunable the split reads (``SAMPLE_EVERY``) stays in :mod:`gpuclust.analyses.usage_distribution`,
which passes it in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial as bound
from typing import Any

import numpy as np

from gpuclust._xp import bincount
from gpuclust.analyses import _hybrid_summary as hs
from gpuclust.analyses import mixture_summary as ms
from gpuclust.analyses._usage_distribution_slices import in_slice
from gpuclust.analyses._usage_distribution_tables import _merge_groups
from gpuclust.analyses._usage_distribution_two_pass import merge_two_pass
from gpuclust.analyses.base import colocated, is_null_int, to_host
from gpuclust.analyses.grouping import bucket_span
from gpuclust.analyses.kinds import Fields, Label, Merged, Sum
from gpuclust.backends import backend_of, finalize_backend, merged_backend
from gpuclust.schema import CPU_PERCENTILE_COLUMNS_SORTED, TIME_AFTER_TRACE, US_PER_S

#: Most (window, bucket) pieces one partition may produce with ``time`` grouping (guards against a
#: tiny ``bucket_s`` or corrupt times; about 1.3 GB of exact partial).
MAX_PIECES = 1 << 23
#: What a partial keeps of each group it finalized itself (``local_groups``).
_DONE_FIELDS = ("key", "n_windows", "weight", "mean", "quantiles", "err_bound")


def empty_groups(xp: Any, n_components: int) -> dict[str, Any]:
    """The empty group extras (``n_components`` key components)."""
    return {
        "key": xp.zeros(0, xp.int64),
        "frac": xp.zeros(0, xp.float64),
        "wq": xp.zeros((0, 20), xp.float64),
        "kc": xp.zeros((0, n_components), xp.int64),
    }


def expand_pieces(xp: Any, s: Any, e: Any, B: int) -> tuple[Any, Any, Any]:
    """One piece per (window, bucket of ``B`` microseconds it overlaps): row index, bucket, overlap
    fraction (a zero-length window is one piece in the bucket of its start, fraction 1)."""
    b0, b1 = bucket_span(xp, s, e, B)
    span = b1 - b0 + 1
    total = int(span.sum()) if span.shape[0] else 0
    if total > MAX_PIECES:
        raise ValueError(
            f"usage-distribution: the windows of one partition cover {total} (window, bucket) "
            f"pieces (> {MAX_PIECES}); use a larger bucket_s or more partitions"
        )
    off = xp.cumsum(span)
    j = xp.arange(total, dtype=xp.int64)
    row = xp.searchsorted(off, j, side="right").astype(xp.int64)
    bucket = b0[row] + (j - (off[row] - span[row]))
    lo = xp.maximum(s[row], bucket * B)
    hi = xp.minimum(e[row], (bucket + 1) * B)
    length = e[row] - s[row]
    frac = xp.where(length > 0, (hi - lo).astype(xp.float64) / xp.where(length > 0, length, 1).astype(xp.float64), 1.0)
    return row, bucket, frac


def used_windows(
    backend: Any, cols: dict[str, Any], rows: str, slice_of: tuple[int, int] | None, stats: dict[str, int]
) -> tuple[Any, Any, Any, Any, Any, Any]:
    """The windows a partial uses: ``rows`` (``top-level``: not in an alloc), of the slice
    ``slice_of`` (:mod:`~gpuclust.analyses._usage_distribution_slices`; None: all), with valid
    times and percentiles.  Returns their rows ``idx`` in ``cols``, their rows ``use`` in the
    repaired percentiles ``qr`` (``(len(idx), 20)``), their weights ``w``, starts and ends; counts
    into ``stats``."""
    xp, ops = backend.xp, backend.ops
    start, end = cols["start_time"], cols["end_time"]
    n = int(start.shape[0])
    stats["windows_read"] = n
    keep = xp.ones(n, dtype=bool)
    if rows == "top-level":
        alloc = cols["alloc_collection_id"]
        top = (alloc == 0) | is_null_int(xp, alloc)
        stats["alloc_task_windows"] = n - int(top.sum())
        keep = top
    if slice_of is not None:
        keep &= in_slice(xp, cols["collection_id"], *slice_of)
    bad = keep & ((end == TIME_AFTER_TRACE) | (end < start))
    stats["bad_time_windows"] = int(bad.sum())
    idx = xp.flatnonzero(keep & ~bad)
    pcols = [cols[c] for c in CPU_PERCENTILE_COLUMNS_SORTED]
    # the only repair: the leaf gets repaired rows
    qr, repaired, null = ops.gather_repair_percentiles(pcols, idx)
    stats["skipped_no_percentiles"] = int(null.sum())
    stats["repaired"] = int(repaired.sum())
    use = xp.flatnonzero(~null)
    idx = idx[use]
    s, e = start[idx], end[idx]
    w = ms.window_weights((e - s).astype(xp.float64) / US_PER_S, cols["sample_rate"][idx].astype(xp.float64))
    stats["used_windows"] = int(idx.shape[0])
    stats["zero_weight_windows"] = int((w <= 0).sum())
    return idx, use, qr, w, s, e


def group_components(cols: dict[str, Any], idx: Any, by: tuple[str, ...], tier: Callable[..., Any]) -> list[Any]:
    """The key components of rows ``idx`` in ``by`` order: ``instance`` two (collection_id,
    instance_index), ``tier`` ``tier(collection_id, instance_index, machine_id)``, ``time`` None
    (its buckets are per piece, :func:`expand_pieces`), the others their column."""
    comps: list[Any] = []
    for b in by:
        if b == "instance":
            comps += [cols["collection_id"][idx], cols["instance_index"][idx]]
        elif b == "collection":
            comps.append(cols["collection_id"][idx])
        elif b == "machine":
            comps.append(cols["machine_id"][idx])
        elif b == "tier":
            comps.append(tier(cols["collection_id"][idx], cols["instance_index"][idx], cols["machine_id"][idx]))
        elif b == "time":
            comps.append(None)
    return comps


def group_extras(xp: Any, ops: Any, key: Any, kc: Any, frac: Any, w: Any, qr: Any) -> dict[str, Any]:
    """Per group: key components (verified: a hash collision raises), fractional window count
    and the sum of ``w x q`` over weighted rows (the weighted average of percentile vectors).
    Rows come sorted by ``key`` (see :meth:`UsageDistribution.partial`)."""
    if key.shape[0] == 0:
        return empty_groups(xp, int(kc.shape[1]))
    first = xp.ones(key.shape[0], dtype=bool)
    first[1:] = key[1:] != key[:-1]
    inv = xp.cumsum(first.astype(xp.int64)) - 1
    kc_u = kc[first]
    if kc.shape[1] and bool((kc != kc_u[inv]).any()):
        raise RuntimeError("usage-distribution: 64-bit hash collision between group keys (please report)")
    G = int(kc_u.shape[0])
    ws = xp.where(w > 0, w, 0.0)
    wq = ops.run_weighted_sums(first, inv, G, ws, qr)  # sequential per run on the cpu
    return {
        "key": key[first],
        "frac": bincount(xp, inv, weights=frac, minlength=G, bounded=True),
        "wq": wq.reshape(G, 20),
        "kc": kc_u,
    }


def finalize_mixture(mp: dict[str, Any], levels: np.ndarray, backend_name: str) -> dict[str, Any]:
    """:func:`mixture_summary.finalize` of the hybrid summary ``mp`` on the backend the partials
    were computed on (when that backend is available in this process; the exact strategy's
    inversion is the heavy step)."""
    if backend_name == "gpu" and int(mp["exact"]["key"].shape[0]) + int(mp["bounded"]["key"].shape[0]):
        be = finalize_backend("gpu")  # the host where there is no device, or an out-of-core study's
        if be.name != "cpu":
            return to_host(hs.finalize(hs.to_backend(mp, be), levels))
    return hs.finalize(to_host(mp), levels)


def merge_partials(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two partials merged: finished groups (``done``) concatenated, open ones' mixture states (or
    second-pass states, ``tp``) merged."""
    be = merged_backend(a["backend"], b["backend"])
    if "done" in a or "done" in b:
        # finalized groups of different partitions: disjoint, so the union is a concatenation
        parts = [p for p in (a, b) if "done" in p]
        if any(p["ms"] is not None for p in (a, b)):
            raise RuntimeError("usage-distribution: finalized and open partials mixed (internal error)")
        cat = (
            (lambda f, d: backend_of(parts[0][d][f]).xp.concatenate([p[d][f] for p in parts]))
            if len(parts) > 1
            else (lambda f, d: parts[0][d][f])
        )
        return {
            "backend": be,
            "ms": None,
            "done": {f: cat(f, "done") for f in _DONE_FIELDS},
            "groups": {f: cat(f, "groups") for f in parts[0]["groups"]},
            "stats": _add(a["stats"], b["stats"]),
        }
    if a["ms"] is None or b["ms"] is None:
        mp = b["ms"] if a["ms"] is None else a["ms"]
    else:
        mp = hs.merge(a["ms"], b["ms"])
    out = {
        "backend": be,
        "ms": mp,
        "groups": _merge_groups(a["groups"], b["groups"]),
        "stats": _add(a["stats"], b["stats"]),
    }
    if "tp" in a or "tp" in b:  # exact-two-pass: second-pass states
        out["tp"] = merge_two_pass(a.get("tp"), b.get("tp"))
    return out


def _add(a: Any, b: Any) -> Any:
    """Two partials' counters added where they are (on the host when one is there)."""
    a, b = colocated(a, b)
    return a + b


def empty_rows(n_levels: int, n_components: int) -> dict[str, np.ndarray]:
    """The empty rows of finished groups (``split_partial``)."""
    L = n_levels
    return {
        "key": np.zeros(0, np.int64),
        "n_windows": np.zeros(0, np.int64),
        "weight": np.zeros(0),
        "mean": np.zeros(0),
        "quantiles": np.zeros((0, L)),
        "err_bound": np.zeros(0),
        **{f"g_{k}": v for k, v in empty_groups(np, n_components).items() if k != "key"},
    }


def split_partial(
    partial: dict[str, Any], n_components: int, n_levels: int, sample_every: int
) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
    """Finished groups (a bucketed source) become rows keyed by their leading key component,
    sorted, every ``sample_every``-th key kept as a sample for the shard bounds; anything else
    stays whole in ``full`` (merged by the tree, one shard)."""
    rest = {
        "backend": partial["backend"],
        "stats": np.asarray(partial["stats"]),
        "full": None,
        "n": 0,
        "err_max": 0.0,
        "sample": np.zeros(0, np.int64),
    }
    if "done" not in partial:
        empty = partial["ms"] is None and int(np.asarray(partial["groups"]["key"]).shape[0]) == 0
        rest["full"] = None if empty else partial
        return rest, {"rows": empty_rows(n_levels, n_components)}
    d, g = partial["done"], partial["groups"]
    if not np.array_equal(np.asarray(d["key"]), np.asarray(g["key"])):
        raise RuntimeError("usage-distribution: summary and group tables disagree (internal error)")
    G = int(np.asarray(d["key"]).shape[0])
    kc = np.asarray(g["kc"]).reshape(G, n_components)
    coord = kc[:, 0].astype(np.int64)
    order = np.argsort(coord, kind="stable")
    rows = {
        "key": coord[order],
        **{f: np.asarray(d[f])[order] for f in _DONE_FIELDS if f != "key"},
        **{f"g_{k}": np.asarray(v)[order] for k, v in g.items() if k != "key"},
    }
    rows["quantiles"] = rows["quantiles"].reshape(G, n_levels)
    rows["g_kc"] = rows["g_kc"].reshape(G, n_components)
    rows["g_wq"] = rows["g_wq"].reshape(G, 20)
    err = np.asarray(d["err_bound"], np.float64)
    rest.update(n=G, err_max=float(err.max()) if G else 0.0, sample=rows["key"][::sample_every].copy())
    return rest, {"rows": rows}


def none_aware(merge: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``merge`` of two optional values: one that is None is the identity (a rest's ``full``)."""

    def merged(a: Any, b: Any) -> Any:
        return a if b is None else b if a is None else merge(a, b)

    return merged


def open_fields(n_components: int, n_stats: int) -> Fields:
    """The fields of an open partial (neither finished groups, ``done``, nor second-pass states,
    ``tp``), which :func:`merge_partials` merges field by field as declared here: the backend's
    name, the mixture states (None: none yet), the group extras (``n_components`` key
    components) and the ``n_stats`` global counters.  Its identity is the empty partial."""
    return Fields(
        {
            "backend": Label(),
            "ms": Merged(none_aware(hs.merge), empty=lambda xp: None),
            "groups": Merged(_merge_groups, empty=bound(empty_groups, n_components=n_components)),
            "stats": Sum((n_stats,), np.int64),
        }
    )


@dataclass(frozen=True)
class UsageFields(Fields):
    """The partial's kinds: its ``kinds`` declare the *rest* of a split (and its keyed ``rows``),
    which :meth:`Fields.merge_rest` merges field by field; a whole partial (finished groups or
    open mixture states, not a field-by-field merge) merges by ``whole`` (:func:`merge_partials`,
    or the first pass's merge) and splits by :func:`split_partial` (``n_components`` key
    components, ``n_levels`` levels, every ``sample_every``-th key sampled); the empty partial is
    the identity of an open one (:func:`open_fields`, ``n_stats`` counters)."""

    whole: Callable[[Any, Any], Any] = merge_partials
    n_components: int = 0
    n_levels: int = 0
    sample_every: int = 1
    n_stats: int = 0
    #: whether two whole partials on a device merge there (``whole`` runs on either; False where a
    #: partial holds every window: the one-pass exact strategy's, merged in host memory)
    device: bool = False

    def merge(self, a: Any, b: Any) -> Any:
        return self.whole(a, b)

    @property
    def merges_on_device(self) -> bool:
        return self.device

    def split(self, p: Any) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
        return split_partial(p, self.n_components, self.n_levels, self.sample_every)

    def empty(self, backend: Any = None, *, on_backend: bool = False) -> dict[str, Any]:
        """The empty whole partial (not a rest): :func:`open_fields`' identity."""
        return open_fields(self.n_components, self.n_stats).empty(backend, on_backend=on_backend)
