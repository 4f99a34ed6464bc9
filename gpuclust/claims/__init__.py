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

from collections.abc import Mapping
from typing import Any

from gpuclust.claims.model import Claim, DatasetFacts, Verdict

__all__ = ["Claim", "DatasetFacts", "Verdict", "claims", "evaluate", "needed_analyses"]


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
