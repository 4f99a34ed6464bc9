"""The predictor metrics of ``peak-prediction``: per shard of machine-steps the sums of violations,
severity and savings of the oracle and each predictor (:func:`shard_sums`), and from every
shard's sums the ``summary`` table (:func:`summary_table`: violation rate, severity quantiles,
savings, per-machine violation-rate quantiles).  The severities' exact quantiles are of the
severities the shards kept on a device (:class:`gpuclust.analyses._kept.KeptValues`), else of
the machine table read a batch at a time, every predictor in the same passes.  A machine-step
whose oracle is censored (NaN: the horizon passes the data's end) counts in no metric.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from gpuclust.analyses._kept import KeptValues, kept_quantiles
from gpuclust.analyses.grouping import unique_codes
from gpuclust.arrow_numpy import schema_table
from gpuclust.parted import array_batches
from gpuclust.stream_quantiles import sorted_quantiles

__all__ = ["SUMMARY_SCHEMA", "VIOLATION_TOL", "shard_sums", "summary_table"]

#: Relative tolerance of a violation: ``oracle - predicted > VIOLATION_TOL x limit`` (float sums
#: of equal quantities in different orders must not count as violations).
VIOLATION_TOL = 1e-9
_SUMMARY_COLUMNS = [
    "predictor",
    "machine_steps",
    "violations",
    "violation_rate",
    "severity_mean",
    "severity_p50",
    "severity_p99",
    "severity_max",
    "savings",
    "mean_savings",
    "machines",
    "machine_rate_p50",
    "machine_rate_p90",
    "machine_rate_p99",
    "machine_rate_max",
]
#: The ``summary`` table's columns and types (an empty table keeps them).
SUMMARY_SCHEMA = pa.schema(
    [
        ("predictor", pa.string()),
        *(
            (c, pa.int64() if c in ("machine_steps", "violations", "machines") else pa.float64())
            for c in _SUMMARY_COLUMNS[1:]
        ),
    ]
)


def shard_sums(
    cols: dict[str, np.ndarray], code: np.ndarray, predictors: Sequence[str], kept: KeptValues
) -> dict[str, Any]:
    """The metric sums of one shard's machine-steps: ``cols`` holds the machine table's ``bucket``,
    ``limit``, ``oracle`` and each of ``predictors`` columns (host arrays), ``code`` the machine
    code of each row.  The rows, censored rows, first step, the machines with an uncensored step
    and their step counts, the summed limit, and per predictor (and ``oracle``) the violations,
    summed severity, savings and violations per machine; ``kept`` (under ``"kept"``) takes each
    predictor's severities (on a device, for the summary's quantiles)."""
    has = np.isfinite(cols["oracle"])
    limit, oracle = cols["limit"][has], cols["oracle"][has]
    ucodes, inv = unique_codes(code[has])
    n_rows = int(cols["bucket"].shape[0])
    out: dict[str, Any] = {
        "rows": n_rows,
        "censored": int(np.count_nonzero(~has)),
        "machines": ucodes,
        "first_step": int(cols["bucket"].min()) if n_rows else None,
        "machine_n": np.bincount(inv, minlength=ucodes.shape[0]),
        "limit": float(limit.sum()),
        "pred": {},
        "kept": kept,
    }
    for p in ("oracle", *predictors):
        pred = cols[p][has]
        viol = oracle - pred > VIOLATION_TOL * limit
        sev = (oracle - pred)[viol] / limit[viol]
        kept.add(p, sev)
        out["pred"][p] = {
            "violations": int(viol.sum()),
            "severity": float(sev.sum()),
            "saved": float((limit - pred).sum()),
            "saved_ratio": float(((limit - pred) / limit).sum()),
            "machine_viol": np.bincount(inv, weights=viol, minlength=ucodes.shape[0]),
        }
    return out


def summary_table(be: Any, machine: Any, extras: list[dict[str, Any]], predictors: Sequence[str]) -> pa.Table:
    """The ``summary`` table, a row for ``oracle`` and each of ``predictors``, from the shards'
    :func:`shard_sums` and, for the severity quantiles, the severities they kept on a device, else
    the parted ``machine`` table (its ``limit``, ``oracle`` and predictor columns a batch at a time,
    :func:`gpuclust.parted.array_batches`; ``be``: where the partials were finalized)."""
    n_rows = sum(e["rows"] for e in extras)
    n = n_rows - sum(e["censored"] for e in extras)
    total_limit = sum(e["limit"] for e in extras)
    mach_n = np.concatenate([np.zeros(0), *(e["machine_n"] for e in extras)])
    names = ["oracle", *predictors] if n_rows else []

    def severities() -> Any:
        for b in array_batches(machine, ["limit", *names]):
            lim, orc = (np.asarray(b[c], np.float64) for c in ("limit", "oracle"))
            ok = np.isfinite(orc)
            lim, orc = lim[ok], orc[ok]
            out = []
            for p in names:
                pr = np.asarray(b[p], np.float64)[ok]
                viol = orc - pr > VIOLATION_TOL * lim
                out.append((orc - pr)[viol] / lim[viol])
            yield out

    sev_qs: Any = kept_quantiles(be, [e["kept"] for e in extras], names, severities, (0.5, 0.99, 1.0)) if names else []
    rows = []
    for p, qs in zip(names, sev_qs, strict=True):
        d = [e["pred"][p] for e in extras]
        v = sum(x["violations"] for x in d)
        mv = np.concatenate([np.zeros(0), *(x["machine_viol"] for x in d)])
        rates = mv / np.maximum(mach_n, 1)
        mq = sorted_quantiles(np.sort(rates), (0.5, 0.9, 0.99, 1.0)) if rates.shape[0] else np.full(4, np.nan)
        rows.append(
            {
                "predictor": p,
                "machine_steps": n,
                "violations": v,
                "violation_rate": v / n if n else np.nan,
                "severity_mean": sum(x["severity"] for x in d) / v if v else np.nan,
                "severity_p50": qs[0],
                "severity_p99": qs[1],
                "severity_max": qs[2],
                "savings": sum(x["saved"] for x in d) / total_limit if n else np.nan,
                "mean_savings": sum(x["saved_ratio"] for x in d) / n if n else np.nan,
                "machines": int(rates.shape[0]),
                "machine_rate_p50": mq[0],
                "machine_rate_p90": mq[1],
                "machine_rate_p99": mq[2],
                "machine_rate_max": mq[3],
            }
        )
    return schema_table(rows, SUMMARY_SCHEMA)
