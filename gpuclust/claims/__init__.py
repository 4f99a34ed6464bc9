"""Published observations on the traces, side by side with a dataset's own values.

A **claim** is one published observation the trace can support: a sentence, its source (paper,
section or figure), the paper's value, and how this tool computes the same quantity from an
analysis' result tables.  :func:`evaluate` computes every claim on a dataset's results and says
for each whether this dataset can support it (trace version, the share of the trace it holds,
its time span, usage present) and, when it cannot, why, instead of a number alone.

Each claim is declared once (:class:`Claim`) in :mod:`gpuclust.claims.catalog`, naming the
analyses (with options) whose tables it reads; ``gpuclust claims DATASET`` runs what is needed
(or reads an earlier ``gpuclust analyze`` folder) and prints one row per claim.  The exact
definition of each claim is in docs/user/claims.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Claim", "DatasetFacts", "Verdict", "claims", "evaluate", "needed_analyses"]


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


def claims() -> list[Claim]:
    """Every claim, in the order they are printed."""
    from gpuclust.claims.catalog import CLAIMS

    return list(CLAIMS)


def needed_analyses(selected: list[Claim] | None = None) -> dict[str, dict[str, Any]]:
    """``{analysis name: options}`` the claims read (one options set per analysis)."""
    out: dict[str, dict[str, Any]] = {}
    for c in selected if selected is not None else claims():
        for name, opts in c.analyses:
            if name in out and dict(out[name]) != dict(opts):
                raise ValueError(f"claims ask {name} for two option sets: {out[name]} and {dict(opts)}")
            out[name] = dict(opts)
    return out


def evaluate(
    results: Mapping[str, Mapping[str, Any]],
    facts: DatasetFacts,
    selected: list[Claim] | None = None,
    not_run: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One row per claim: ``id``, ``claim``, ``source``, ``paper``, ``value`` (number or None),
    ``dataset`` (the value as text), ``rests_on``, ``supported`` and ``why`` (empty when
    supported).  ``results``: the analyses' tables by analysis name (pandas); ``not_run``: why
    an analysis has none (e.g. ``"needs instance_usage"``)."""
    rows = []
    for c in selected if selected is not None else claims():
        missing = [n for n, _ in c.analyses if n not in results]
        if missing:
            why = "; ".join(f"{n} {(not_run or {}).get(n, 'was not run')}" for n in missing)
            v = Verdict(None, "not computed", "", False, why)
        else:
            v = c.compute(results, facts)
            if facts.synthetic and v.supported:
                v = Verdict(
                    v.value, v.text, v.rests_on, False, "a synthetic cell: its values are the generator's, not Google's"
                )
            elif c.trace != (facts.trace_version or "v3") and v.supported:
                v = Verdict(
                    v.value,
                    v.text,
                    v.rests_on,
                    False,
                    f"the paper measured the {'2011' if c.trace == 'v2' else '2019'} trace; this is a "
                    f"{'2011' if facts.trace_version == 'v2' else '2019'} dataset",
                )
        rows.append(
            {
                "id": c.id,
                "claim": c.sentence,
                "source": c.source,
                "paper": c.paper,
                "value": v.value,
                "dataset": v.text,
                "rests_on": v.rests_on,
                "supported": v.supported,
                "why": v.why,
            }
        )
    return rows
