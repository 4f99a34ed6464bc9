"""What a claim is: the facts of a dataset its support depends on (:class:`DatasetFacts`), its
declaration (:class:`Claim`) and what it says on a dataset (:class:`Verdict`).

The catalog (:mod:`gpuclust.claims.catalog`) declares every claim with these; :mod:`gpuclust.claims`
evaluates them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Claim", "DatasetFacts", "Verdict", "pct"]


@dataclass(frozen=True)
class DatasetFacts:
    """What a claim's support depends on: the trace version, the share of the trace's part files
    the dataset holds (per source table; None where unknown, e.g. a synthetic cell), the time
    span of each table (µs of trace time) and its rows."""

    trace_version: str | None
    synthetic: bool = False
    #: source table -> (part files present, part files of the whole trace), from ``part-K-of-N`` names
    parts: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    #: table -> (min, max) of its time column, µs
    span_us: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    rows: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, path: str | Path) -> DatasetFacts:
        """The facts of a dataset folder: its manifest and Parquet footers (nothing else read)."""
        from gpuclust.dataset import Dataset
        from gpuclust.info import dataset_info

        ds = Dataset(path)
        info = dataset_info(path)
        parts: dict[str, tuple[int, int]] = {}
        seen: dict[str, set[int]] = {}
        for inp in ds.manifest.get("inputs", {}).values():
            m = re.search(r"part-(\d+)-of-(\d+)", str(inp.get("path", "")))
            if m and inp.get("source_table"):
                seen.setdefault(inp["source_table"], set()).add(int(m.group(1)))
                parts[inp["source_table"]] = (0, int(m.group(2)))
        parts = {t: (len(seen[t]), n) for t, (_, n) in parts.items()}
        span, rows = {}, {}
        for t, v in (info.get("tables") or {}).items():
            rows[t] = int(v.get("rows") or 0)
            if v.get("time_min") is not None and v.get("time_max") is not None:
                span[t] = (int(v["time_min"]), int(v["time_max"]))
        return cls(ds.trace_version, "synthetic" in ds.manifest, parts, span, rows)

    def whole_trace(self, table: str) -> tuple[bool, str]:
        """Whether the dataset holds every part file of ``table``'s source, and if not, why."""
        v2 = {"instance_events": "task_events", "collection_events": "job_events", "instance_usage": "task_usage"}
        src = v2.get(table, table) if self.trace_version == "v2" else table
        if self.synthetic:
            return False, "a synthetic cell, not the trace"
        if src in self.parts:
            k, n = self.parts[src]
            if k < n:
                return False, f"the dataset holds {k} of the trace's {n} {src} part files ({100 * k / n:.1f}%)"
            return True, ""
        return False, f"unknown share of the trace (its {src} files are not named part-K-of-N)"

    def hours(self, table: str) -> float:
        """The span of ``table``'s times, hours (0 without rows)."""
        lo, hi = self.span_us.get(table, (0, 0))
        return max(0.0, (hi - lo) / 3.6e9)


@dataclass(frozen=True)
class Verdict:
    """A claim on one dataset: its value (None: not computed), the text shown for it, what it
    rests on, and whether the dataset supports comparing it with the paper (``why`` when not)."""

    value: float | None
    text: str
    rests_on: str
    supported: bool
    why: str = ""


@dataclass(frozen=True)
class Claim:
    """One published observation (see the module docstring)."""

    id: str
    sentence: str
    source: str
    paper: str
    #: the analyses it reads: ``(name, options)`` each
    analyses: tuple[tuple[str, Mapping[str, Any]], ...]
    #: ``(results by analysis name, facts) -> Verdict``
    compute: Callable[[Mapping[str, Mapping[str, Any]], DatasetFacts], Verdict]
    #: traces the paper's observation is about ("v2": the 2011 trace, "v3": 2019)
    trace: str = "v2"


def pct(x: float) -> str:
    """A share as a percentage with one decimal, for a claim's text.

    >>> pct(0.7165)
    '71.7%'
    """
    return f"{100 * x:.1f}%"
