"""What an ingest keeps: a consistent sample of machines or collections, and a time range.

``gpuclust ingest ... --sample machines=1%`` keeps every row of the sampled machines in every
table that names a machine (``machine_events``, ``machine_attributes``, ``instance_usage``,
``instance_events``); ``--sample collections=5%`` keeps every row of the sampled collections in
every table that names a collection (``collection_events``, ``instance_events``,
``instance_constraints``, ``instance_usage``).  A table without the sample's key column is kept
whole (with ``machines=``: ``collection_events`` and ``instance_constraints``; with
``collections=``: the machine tables, which the analyses need for the cell's capacity).  A row
whose key is NULL, or a machine id that means "no machine" (0 or -1: an instance event before
scheduling), is not in a machine sample.

Which ids are sampled is a documented function of the id alone, so the sample is the same in
every table, shard, run and tool: with ``h = splitmix64(id)`` (:func:`sample_hash`, the
reference splitmix64 output function of the 64-bit two's complement id), an id is in a sample of
fraction ``p`` when ``h < floor(p * 2^64)``.  The samples are nested: the 1% sample is inside
the 5% sample.

``--from`` / ``--to`` (trace time or wall-clock, as ``gpuclust analyze`` reads them, see
:mod:`gpuclust.trace_time`) keep the usage windows that overlap ``[from, to)`` and the
rows of every event table with ``time < to``: the state (priorities, placements, capacities)
the windows of the range need.  Rows with a NULL time are not kept.

The selection is recorded in the manifest (``selection``); a dataset is only ever extended with
the same selection, and ``gpuclust analyze`` notes that it ran on a sample or a time range.

Examples
--------
>>> import numpy as np
>>> s = IngestSelection.parse(sample="machines=50%")
>>> s.sample_key, s.fraction, s.describe()
('machines', 0.5, 'machines sample 50% (splitmix64-v1)')
>>> int(sample_hash(np.array([0]))[0]) == 0xE220A8397B1DCDAF   # splitmix64's first output for seed 0
True
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa

from gpuclust.ingest import arrays
from gpuclust.keys import splitmix64

__all__ = ["HASH_NAME", "SAMPLE_KEYS", "IngestSelection", "SelectionSpecError", "int_values", "sample_hash"]

#: The sample keys and the column that carries each.
SAMPLE_KEYS = {"machines": "machine_id", "collections": "collection_id"}
#: Name and version of the sample hash (recorded in the manifest).
HASH_NAME = "splitmix64-v1"
_SPEC = re.compile(r"^\s*(\w+)\s*=\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(%?)\s*$")
#: Tables whose ``time`` rows are kept up to ``--to``; usage windows overlap the range instead.
_USAGE = "instance_usage"


class SelectionSpecError(ValueError):
    """A ``--sample`` / ``--from`` / ``--to`` that cannot be read, or differs from the dataset's."""


def sample_hash(ids: np.ndarray) -> np.ndarray:
    """splitmix64(id): ``z = id + 0x9E3779B97F4A7C15; z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9;
    z = (z ^ z >> 27) * 0x94D049BB133111EB; z ^ z >> 31`` (all mod 2^64), as uint64
    (:func:`gpuclust.keys.splitmix64`)."""
    return splitmix64(np, np.asarray(ids, dtype=np.int64))


def int_values(arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """An integer Arrow column as (int64 values, NULL 0; valid) NumPy arrays, for :meth:`IngestSelection.mask`."""
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    return arrays.values(arr, fill=0).astype(np.int64, copy=False), arrays.valid(arr)


@dataclass(frozen=True)
class IngestSelection:
    """A sample (``sample_key`` ``machines`` / ``collections`` and a ``fraction`` in (0, 1]) and a
    time range (trace microseconds; ``None`` = unbounded).  See the module docstring."""

    sample_key: str | None = None
    fraction: float = 1.0
    time_from: int | None = None
    time_to: int | None = None
    #: what the user wrote for --from / --to (for the manifest)
    given: tuple[str | None, str | None] = (None, None)

    @classmethod
    def parse(
        cls,
        sample: str | None = None,
        time_from: Any = None,
        time_to: Any = None,
        trace_version: str | None = None,
        cell: str | None = None,
    ) -> IngestSelection | None:
        """The selection of ``--sample`` / ``--from`` / ``--to`` (``None`` when none is given)."""
        if sample is None and time_from is None and time_to is None:
            return None
        key, frac = None, 1.0
        if sample is not None:
            m = _SPEC.match(sample)
            if not m or m.group(1) not in SAMPLE_KEYS:
                raise SelectionSpecError(
                    f"--sample {sample!r}: expected machines=P or collections=P "
                    "(P a percentage like 1% or a fraction like 0.01)"
                )
            key, frac = m.group(1), float(m.group(2)) / (100.0 if m.group(3) else 1.0)
            if not 0.0 < frac <= 1.0:
                raise SelectionSpecError(f"--sample {sample!r}: the fraction must be in (0, 100%]")
        lo = hi = None
        if time_from is not None or time_to is not None:
            from gpuclust.trace_time import SelectionError, selection_of

            src = SimpleNamespace(trace_version=trace_version, manifest={"cell": cell})
            try:
                sel = selection_of(src, time_from, time_to)
            except SelectionError as e:
                raise SelectionSpecError(str(e)) from None
            assert sel is not None  # None only when neither bound is given
            lo, hi = sel.start, sel.end
        return cls(
            key,
            frac,
            lo,
            hi,
            (None if time_from is None else str(time_from), None if time_to is None else str(time_to)),
        )

    @property
    def threshold(self) -> int:
        """Ids whose :func:`sample_hash` is below this are sampled (``floor(fraction * 2^64)``)."""
        return min(int(self.fraction * 2.0**64), 2**64 - 1) if self.fraction < 1.0 else 2**64

    def describe(self) -> str:
        parts = []
        if self.sample_key is not None:
            parts.append(f"{self.sample_key} sample {self.fraction * 100:.6g}% ({HASH_NAME})")
        if self.time_from is not None or self.time_to is not None:
            lo = "-inf" if self.time_from is None else f"{self.time_from} us"
            hi = "+inf" if self.time_to is None else f"{self.time_to} us"
            parts.append(f"usage windows overlapping [{lo}, {hi}), events before {hi}")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "sample": None
            if self.sample_key is None
            else {
                "key": self.sample_key,
                "column": SAMPLE_KEYS[self.sample_key],
                "fraction": self.fraction,
                "hash": HASH_NAME,
            },
            "from_us": self.time_from,
            "to_us": self.time_to,
            "from": self.given[0],
            "to": self.given[1],
            "text": self.describe(),
        }

    @staticmethod
    def same(recorded: dict[str, Any] | None, new: IngestSelection | None) -> bool:
        """Whether a manifest's recorded selection is ``new`` (both absent counts as the same)."""
        if recorded is None or new is None:
            return recorded is None and new is None
        mine = new.to_json()
        return all(recorded.get(k) == mine[k] for k in ("sample", "from_us", "to_us"))

    # ------------------------------------------------------------------ masks
    def can_filter(self, columns: Any) -> bool:
        """Whether rows with these columns can be judged (they carry what the selection looks
        at); ``False``: the table is kept whole by the sample."""
        return self.sample_key is None or SAMPLE_KEYS[self.sample_key] in columns

    def mask(self, table: str, get: Callable[[str], tuple[np.ndarray, np.ndarray] | None]) -> np.ndarray | None:
        """Which rows of ``table`` to keep; ``get(column)`` gives (int64 values, valid) or ``None``
        when the rows lack the column.  ``None``: keep every row."""
        keep: np.ndarray | None = None

        def both(m: np.ndarray) -> None:
            nonlocal keep
            keep = m if keep is None else keep & m

        if self.sample_key is not None:
            got = get(SAMPLE_KEYS[self.sample_key])
            if got is not None:
                ids, valid = got
                if self.sample_key == "machines":
                    valid = valid & (ids > 0)  # 0 / -1: no machine (never sampled)
                if self.fraction < 1.0:
                    both(valid & (sample_hash(ids) < np.uint64(self.threshold)))
                else:
                    both(valid)
        if self.time_to is not None or self.time_from is not None:
            if table == _USAGE:
                s, e = get("start_time"), get("end_time")
                if s is not None and e is not None:
                    m = s[1] & e[1]
                    if self.time_to is not None:
                        m &= s[0] < self.time_to
                    if self.time_from is not None:
                        m &= e[0] > self.time_from
                    both(m)
            elif self.time_to is not None:
                t = get("time")
                if t is not None:
                    both(t[1] & (t[0] < self.time_to))
        return keep

    def filter_table(self, table: str, tbl: pa.Table) -> tuple[pa.Table, int]:
        """``tbl`` (canonical rows of ``table``) without the rows outside the selection, and
        how many those were."""

        keep = self.mask(table, lambda name: int_values(tbl.column(name)) if name in tbl.column_names else None)
        if keep is None or bool(keep.all()):
            return tbl, 0
        return tbl.filter(arrays.from_numpy(keep)), int(tbl.num_rows - np.count_nonzero(keep))
