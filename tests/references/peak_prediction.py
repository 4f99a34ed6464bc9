"""A slow, obvious pure-Python peak-prediction simulator written from the specification
(docs/analyses/peak-prediction.md and Google's cluster-resource-forecast predictor / oracle
semantics): dicts, deques and loops per machine and step — never the code under test.

:func:`samples` joins usage windows to their limits by a loop over each instance's events;
:func:`simulate` replays each machine's snapshots in time order with one stateful object per
predictor; :func:`metrics` computes the summary numbers from the per-snapshot rows.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from typing import Any

import numpy as np

STEP = 300_000_000
AFTER = 2**63 - 1


def samples(
    tables: dict, metric: str = "cpu_p90", priority_range: Any = (0, 400), scheduling_class_range: Any = (2, 3)
) -> tuple[list[tuple], dict[str, int]]:
    """Usage windows -> ``(machine_id, step, (collection_id, instance_index), usage, limit)`` and
    the drop counts."""
    res = 1 if metric.endswith("_mem") else 0
    machines = set(tables["machine_events"].column("machine_id").to_pylist())
    events = defaultdict(list)
    for k, e in enumerate(tables["instance_events"].to_pylist()):
        events[(e["collection_id"], e["instance_index"])].append((k, e))
    out, stats = [], defaultdict(int)
    for w in tables["instance_usage"].to_pylist():
        stats["rows"] += 1
        if w.get("alloc_collection_id") not in (None, 0):
            stats["alloc_rows"] += 1
            continue
        if not 0 <= w["start_time"] < AFTER:
            stats["unplaced_rows"] += 1
            continue
        if w["machine_id"] not in machines:
            stats["unknown_machine_rows"] += 1
            continue
        u = w.get(metric)
        if u is None or u != u:
            stats["null_metric_rows"] += 1
            continue
        best = None  # the latest event at or before the start with both requests positive (ties: later row)
        for k, e in events.get((w["collection_id"], w["instance_index"]), []):
            rc, rm = e.get("req_cpu"), e.get("req_mem")
            if e["time"] <= w["start_time"] and rc is not None and rm is not None and rc > 0 and rm > 0:
                if best is None or e["time"] >= best[1]["time"]:
                    best = (k, e)
        if best is None:
            stats["no_limit_rows"] += 1
            continue
        e = best[1]
        ok = True
        for col, rng in (("priority", priority_range), ("scheduling_class", scheduling_class_range)):
            if rng is not None and (e.get(col) is None or not rng[0] <= e[col] <= rng[1]):
                ok = False
        if not ok:
            stats["filtered_rows"] += 1
            continue
        stats["used_rows"] += 1
        lim = e["req_mem"] if res else e["req_cpu"]
        out.append(
            (w["machine_id"], w["start_time"] // STEP, (w["collection_id"], w["instance_index"]), float(u), float(lim))
        )
    return out, dict(stats)


class _State:
    def __init__(self, history: int):
        self.count = 0
        self.usage: deque = deque(maxlen=history)  # index 0: newest
        self.limit: deque = deque(maxlen=history)


class Stateful:
    """The base predictor: per instance a state and a sample count; an instance absent from a
    snapshot is forgotten; a new one is cold at its first sample; warm once its count reaches
    ``min_samples``; the prediction is Predict(warm) + the limits of the cold ones."""

    def __init__(self, min_samples: int, history: int, cap: bool):
        self.min_samples, self.history, self.cap = min_samples, history, cap
        self.states: dict = {}

    def update(self, present: dict) -> float:
        new = {}
        for inst, (u, lim) in present.items():
            st = self.states.get(inst)
            if st is None:
                st = _State(self.history)
            st.count += 1
            st.usage.appendleft(min(u, lim) if self.cap else u)
            st.limit.appendleft(lim)
            new[inst] = st
        self.states = new
        warm = [st for st in new.values() if st.count >= self.min_samples and st.count >= 2]
        cold = sum(st.limit[0] for st in new.values() if not (st.count >= self.min_samples and st.count >= 2))
        return (self.predict(warm) if warm else 0.0) + cold

    def predict(self, warm: list) -> float:
        raise NotImplementedError

    def ratios(self, warm: list) -> list[float]:
        out = []
        for k in range(self.history):
            have = [st for st in warm if k < len(st.usage)]
            if not have:
                continue
            tl = sum(st.limit[k] for st in have)
            out.append(sum(st.usage[k] for st in have) / tl if tl > 0 else 0.0)
        return out


class NSigma(Stateful):
    def __init__(self, min_samples: int, history: int, cap: bool, n: float):
        super().__init__(min_samples, history, cap)
        self.n = n

    def predict(self, warm: list) -> float:
        r = self.ratios(warm)
        mean = sum(r) / len(r)
        sd = statistics.stdev(r) if len(r) > 1 else 0.0
        return min(1.0, mean + self.n * sd) * sum(st.limit[0] for st in warm)


class MachinePercentile(Stateful):
    def __init__(self, min_samples: int, history: int, cap: bool, p: float):
        super().__init__(min_samples, history, cap)
        self.p = p

    def predict(self, warm: list) -> float:
        return min(1.0, float(np.percentile(self.ratios(warm), self.p))) * sum(st.limit[0] for st in warm)


class InstancePercentile(Stateful):
    def __init__(self, min_samples: int, history: int, cap: bool, p: float):
        super().__init__(min_samples, history, cap)
        self.p = p

    def predict(self, warm: list) -> float:
        total = 0.0
        for st in warm:
            r = [u / lim for u, lim in zip(st.usage, st.limit, strict=True)]
            if self.cap:
                r = [min(x, 1.0) for x in r]
            total += float(np.percentile(r, self.p)) * st.limit[0]
        return total


def simulate(
    rows: list[tuple],
    last_step: int,
    *,
    horizon_s: int = 86400,
    oracle_percentile: float = 100.0,
    cap_to_limit: bool = True,
    min_samples: int = 24,
    borg_fraction: float = 0.9,
    n_sigma: float = 5.0,
    n_sigma_history: int = 24,
    instance_percentile: float = 99.0,
    instance_history: int = 120,
    machine_percentile: float = 100.0,
    machine_history: int = 24,
    combine: tuple = ("n_sigma", "instance_percentile"),
    **_: Any,
) -> list[dict]:
    """Per (machine, step) with a sample, in (machine, step) order: the machine table's values."""
    snaps: dict = defaultdict(dict)  # machine -> step -> inst -> (usage, limit): the max over windows
    for m, step, inst, u, lim in rows:
        cur = snaps[m][step].get(inst) if step in snaps[m] else None
        snaps[m].setdefault(step, {})[inst] = (u, lim) if cur is None else (max(cur[0], u), max(cur[1], lim))
    E = horizon_s // 300
    out = []
    for m in sorted(snaps):
        preds = {
            "n_sigma": NSigma(min_samples, n_sigma_history, cap_to_limit, n_sigma),
            "instance_percentile": InstancePercentile(min_samples, instance_history, cap_to_limit, instance_percentile),
            "machine_percentile": MachinePercentile(min_samples, machine_history, cap_to_limit, machine_percentile),
        }
        steps = sorted(snaps[m])
        for t in steps:
            present = snaps[m][t]
            limit = sum(lim for _, lim in present.values())
            row = {
                "machine_id": m,
                "bucket": t,
                "instances": len(present),
                "limit": limit,
                "total_usage": sum(min(u, lim) for u, lim in present.values()),
                "borg_default": borg_fraction * limit,
            }
            for name, pr in preds.items():
                row[name] = pr.update(present)
            sub = [row[c] for c in combine]
            row["max_of"], row["avg_of"] = max(sub), sum(sub) / len(sub)
            if t + E > last_step:
                row["oracle"] = None
            else:
                sums = []
                for s in steps:
                    if t < s <= t + E:
                        fut = snaps[m][s]
                        tot = 0.0
                        for inst, (_, lim_t) in present.items():
                            if inst in fut:
                                tot += min(fut[inst][0], lim_t) if cap_to_limit else fut[inst][0]
                        sums.append(tot)
                row["oracle"] = float(np.percentile(sums, oracle_percentile)) if sums else limit
            out.append(row)
    return out


PREDICTORS = ("oracle", "borg_default", "n_sigma", "instance_percentile", "machine_percentile", "max_of", "avg_of")


def metrics(table: list[dict], tol: float = 1e-9) -> dict[str, dict]:
    """Per predictor: machine-steps with an oracle, violations, severities, savings, per-machine rates."""
    out = {}
    rows = [r for r in table if r["oracle"] is not None]
    for p in PREDICTORS:
        viol = [r for r in rows if r["oracle"] - r[p] > tol * r["limit"]]
        sev = [(r["oracle"] - r[p]) / r["limit"] for r in viol]
        per_m: dict = defaultdict(lambda: [0, 0])
        vid = {id(r) for r in viol}
        for r in rows:
            per_m[r["machine_id"]][0] += 1
            per_m[r["machine_id"]][1] += id(r) in vid
        out[p] = {
            "machine_steps": len(rows),
            "violations": len(viol),
            "violation_rate": len(viol) / len(rows) if rows else None,
            "severities": sev,
            "savings": (sum(r["limit"] - r[p] for r in rows) / sum(r["limit"] for r in rows)) if rows else None,
            "mean_savings": (sum((r["limit"] - r[p]) / r["limit"] for r in rows) / len(rows)) if rows else None,
            "machine_rates": [v / n for n, v in per_m.values()],
        }
    return out
