"""``machine-shapes``: machines grouped by capacity shape (cap_cpu, cap_mem), as in Google's notebook.

The notebook's query is ``SELECT COUNT(DISTINCT machine_id), capacity.cpus, capacity.memory FROM
machine_events GROUP BY 2, 3``.  So:

* a machine whose capacity changes over the trace (an UPDATE event) is counted in **every**
  shape it had, and the counts can add up to more than the number of machines;
* a NULL capacity is its own group (NULL cpus and NULL memory are grouped separately, exactly as
  SQL's GROUP BY does); NULL is reported as NaN;
* -0.0 and 0.0 are one shape; shapes are compared as float32 values (the canonical dtype).

Output table ``shapes``: cap_cpu, cap_mem (float64 from the float32 values; NaN = NULL),
machines; sorted by machines descending, then cap_cpu, cap_mem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from gpuclust.analyses.base import Analysis, fmt
from gpuclust.analyses.grouping import unique_counts
from gpuclust.analyses.kinds import Fields, Flat, Merged
from gpuclust.arrow_numpy import table
from gpuclust.keys import pack_bits, unpack_bits
from gpuclust.tables import as_arrow

__all__ = ["MachineShapes"]

_NAN32_BITS = 0x7FC00000


def _bits(xp: Any, x: Any) -> Any:
    """Canonical float32 bit patterns as uint64: every NaN -> one quiet NaN, -0.0 -> 0.0."""
    x = x.astype(xp.float32)
    clean = xp.where(xp.isnan(x), xp.float32(0), x) + xp.float32(0)
    b = clean.view(xp.uint32).astype(xp.uint64)
    return xp.where(xp.isnan(x), xp.uint64(_NAN32_BITS), b)


def _no_pairs(xp: Any) -> dict[str, Any]:
    """No (shape, machine) pairs: the merge identity."""
    return {"shape": xp.zeros(0, xp.uint64), "machine_id": xp.zeros(0, xp.int64)}


def _distinct_pairs(xp: Any, shape: Any, machine: Any) -> dict[str, Any]:
    """Sorted distinct (shape, machine) pairs."""
    if shape.shape[0] == 0:
        return _no_pairs(xp)
    order = xp.lexsort(xp.stack([machine.astype(xp.int64), shape.view(xp.int64)]))
    s, m = shape[order], machine[order].astype(xp.int64)
    keep = xp.ones(s.shape[0], dtype=bool)
    keep[1:] = (s[1:] != s[:-1]) | (m[1:] != m[:-1])
    return {"shape": s[keep], "machine_id": m[keep]}


def _merge_pairs(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The union of two host partials' sorted distinct (shape, machine) pairs."""
    return _distinct_pairs(
        np, np.concatenate([a["shape"], b["shape"]]), np.concatenate([a["machine_id"], b["machine_id"]])
    )


@dataclass(frozen=True)
class MachineShapes(Analysis):
    """Machines per capacity shape: COUNT(DISTINCT machine_id) GROUP BY (cap_cpu, cap_mem).

    Examples
    --------
    >>> MachineShapes().columns
    ('machine_id', 'cap_cpu', 'cap_mem')
    """

    name = "machine-shapes"
    table = "machine_events"
    requires = ("machine_events",)
    row_bytes = 256

    @property
    def columns(self) -> tuple[str, ...]:
        return ("machine_id", "cap_cpu", "cap_mem")

    def partial(self, cols: dict[str, Any], ctx: Any, backend: Any) -> dict[str, Any]:
        xp = backend.xp
        shape = pack_bits(_bits(xp, cols["cap_cpu"]), _bits(xp, cols["cap_mem"]), 32)
        return _distinct_pairs(xp, shape, cols["machine_id"])

    @property
    def kinds(self) -> Fields:
        """The distinct (shape, machine) pairs, at the partial's top level, merged as a union
        (:func:`_merge_pairs`)."""
        return Fields({"pairs": Flat(Merged(_merge_pairs, empty=_no_pairs), "", ("shape", "machine_id"))})

    def finalize(self, partial: dict[str, np.ndarray], ctx: Any) -> dict[str, pa.Table]:
        """The shapes table (an Arrow table, built without pandas)."""
        shapes, counts = unique_counts(np.asarray(partial["shape"], dtype=np.uint64))
        cpu, mem = (b.astype(np.uint32).view(np.float32).astype(np.float64) for b in unpack_bits(shapes, 32))
        order = np.lexsort((mem, cpu, -counts))  # machines descending, then cap_cpu, cap_mem; NaN (NULL) last
        return {"shapes": table({"cap_cpu": cpu[order], "cap_mem": mem[order], "machines": counts[order]})}

    def summary(self, result: dict[str, Any]) -> str:
        rows = as_arrow(result["shapes"]).to_pylist()
        lines = [f"{self.name}: {len(rows)} capacity shapes, {sum(r['machines'] for r in rows)} machine-shape pairs"]
        for r in rows[:10]:
            lines.append(
                f"  cpu={fmt(r['cap_cpu'], '.6g'):<10} mem={fmt(r['cap_mem'], '.6g'):<10} machines={r['machines']}"
            )
        if len(rows) > 10:
            lines.append(f"  ... {len(rows) - 10} more")
        return "\n".join(lines)
