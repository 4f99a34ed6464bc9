"""The claims: seed 003's observations on the 2011 trace (Zhu, Wang, Wang: "10 Observations on
Google Cluster Trace"), Borg's (Verma et al., EuroSys 2015) and the 2019 trace's job tail, each
computed from an analysis' result tables (docs/user/claims.md gives each definition)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from gpuclust.claims.borg import BORG, BORG_CPI, cpi_effect, cpi_mean, fig11_above, fig11_median
from gpuclust.claims.model import Claim, DatasetFacts, Verdict, pct

__all__ = ["CLAIMS"]

SEED3 = "Zhu, Wang, Wang, 10 Observations on Google Cluster Trace (seed 003)"
LIFECYCLE: tuple[tuple[str, dict[str, Any]], ...] = (("lifecycle", {}),)
#: a trend or a month's distribution needs the month: the 2011 trace spans 29 days
MONTH_H = 28 * 24


def _transitions(r: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    t = r["lifecycle"]["transitions"]
    return {(str(a), str(b)): int(n) for (a, b), n in t.groupby(["from_event", "to_event"])["count"].sum().items()}


def _from_submit(r: Mapping[str, Any]) -> int:
    return sum(n for (a, _), n in _transitions(r).items() if a == "SUBMIT")


def _submit_evict(r: Mapping[str, Any], f: DatasetFacts) -> Verdict:
    n, m = _transitions(r).get(("SUBMIT", "EVICT"), 0), _from_submit(r)
    whole, why = f.whole_trace("instance_events")
    seen = n > 0
    return Verdict(
        float(n),
        f"{n:,} SUBMIT -> EVICT of {m:,} transitions from SUBMIT",
        f"{m:,} transitions from SUBMIT",
        seen or whole,
        "" if seen or whole else f"none in this sample ({why}): absence here does not refute it",
    )


def _no_submit_submit(r: Mapping[str, Any], f: DatasetFacts) -> Verdict:
    n, m = _transitions(r).get(("SUBMIT", "SUBMIT"), 0), _from_submit(r)
    return Verdict(
        float(n),
        f"{n:,} SUBMIT -> SUBMIT of {m:,} transitions from SUBMIT",
        f"{m:,} transitions from SUBMIT",
        m > 0,
        "" if m > 0 else "no transition from SUBMIT",
    )


def _first_submissions(series: Any) -> Any:
    """Per row of the lifecycle series: the tasks submitted for the first time, the tasks present
    at the trace start counted too where the series reports them apart (as the paper counts every
    task once)."""
    extra = series["present_at_start"] if "present_at_start" in series.columns else 0
    return series["new_submissions"] + extra


def _total(column: str, what: str) -> Any:
    def compute(r: Mapping[str, Any], f: DatasetFacts) -> Verdict:
        s = r["lifecycle"]["series"]
        n = int((_first_submissions(s) if column == "new_submissions" else s[column]).sum())
        whole, why = f.whole_trace("instance_events")
        return Verdict(
            float(n),
            f"{n:,}",
            f"{f.rows.get('instance_events', 0):,} instance events",
            whole,
            "" if whole else f"a total over the whole trace; {why}",
        )

    compute.__doc__ = f"The total of {what}: the lifecycle series' `{column}` summed."
    return compute


def _tasks(r: Mapping[str, Any], f: DatasetFacts) -> Verdict:
    n = int(r["lifecycle"]["info"]["instances"].iloc[0])
    whole, why = f.whole_trace("instance_events")
    return Verdict(
        float(n),
        f"{n:,}",
        f"{f.rows.get('instance_events', 0):,} instance events",
        whole,
        "" if whole else f"a total over the whole trace; {why}",
    )


def _production_share(r: Mapping[str, Any], f: DatasetFacts) -> Verdict:
    s = r["lifecycle"]["series"]
    by_tier = _first_submissions(s).groupby(s["tier"]).sum()
    total = int(by_tier.sum())
    prod = int(by_tier.get("prod", 0))
    whole, why = f.whole_trace("instance_events")
    share = prod / total if total else float("nan")
    return Verdict(
        share,
        f"{prod:,} production tasks, {pct(share)} of {total:,}" if total else "no tasks",
        f"{total:,} tasks (first submissions)",
        whole and total > 0,
        "" if whole else f"the trace's part files are consecutive hours, not a sample of tasks; {why}",
    )


def _execution_share(limit_s: float) -> Any:
    def compute(r: Mapping[str, Any], f: DatasetFacts) -> Verdict:
        h = r["lifecycle"]["delay_hist"]
        h = h[(h["measure"] == "execution") & (h["outcome"] == "finish")]
        edges = np.unique(np.concatenate([h["lo_s"].to_numpy(), h["hi_s"].to_numpy()]))
        edge = float(edges[np.argmin(np.abs(np.log(edges / limit_s)))]) if edges.size else limit_s
        n = int(h["episodes"].sum())
        below = int(h.loc[h["hi_s"] <= edge * (1 + 1e-12), "episodes"].sum())
        share = below / n if n else float("nan")
        d = r["lifecycle"]["delays"]
        cens = d[(d["measure"] == "execution") & (d["outcome"] == "censored")]["episodes"].sum()
        hours = f.hours("instance_events")
        ok = hours >= MONTH_H and n > 0
        why = (
            ""
            if ok
            else (
                f"the data spans {hours:.1f} h: a run longer than that cannot finish in it "
                f"({int(cens):,} runs censored), so short runs are over-represented"
            )
        )
        return Verdict(
            share,
            f"{pct(share)} of {n:,} finished runs shorter than {edge:,.2f} s" if n else "no finished run",
            f"{n:,} finished runs (their execution-time histogram; the bin edge nearest {limit_s:,.0f} s)",
            ok,
            why,
        )

    return compute


def _trend(column: str) -> Any:
    def compute(r: Mapping[str, Any], f: DatasetFacts) -> Verdict:
        s = r["lifecycle"]["series"].groupby("bucket_start_us")[column].sum().sort_index()
        t = (s.index.to_numpy(np.float64) - float(s.index.min() if len(s) else 0)) / 8.64e10  # days
        y = s.to_numpy(np.float64)
        slope = float(np.polyfit(t, y, 1)[0]) if len(s) >= 2 and np.ptp(t) > 0 else float("nan")
        hours = f.hours("instance_events")
        ok = hours >= MONTH_H
        return Verdict(
            slope,
            f"{slope:+,.0f} tasks a day (least squares over {len(s):,} hours; mean {y.mean():,.0f})"
            if len(s) >= 2
            else "no series",
            f"{len(s):,} hourly counts",
            ok,
            "" if ok else f"the data spans {hours:.1f} h, not the month the trend is about",
        )

    return compute


def _hourly(r: Mapping[str, Any], column: str) -> Any:
    """The lifecycle series' ``column`` summed over tiers per bucket, in bucket order (seed 003's
    new task submissions for ``new_submissions``)."""
    s = r["lifecycle"]["series"]
    y = _first_submissions(s) if column == "new_submissions" else s[column]
    return y.groupby(s["bucket"]).sum().sort_index()


def _steady(column: str, what: str) -> Any:
    def compute(r: Mapping[str, Any], f: DatasetFacts) -> Verdict:
        per = _hourly(r, column)
        c = per.cumsum().to_numpy(np.float64)
        t = per.index.to_numpy(np.float64)
        if len(c) < 3 or c[-1] <= c[0]:
            return Verdict(None, f"no {what} to fit", "", False, f"fewer than 3 buckets or no {what} after the first")
        slope, icpt = np.polyfit(t, c, 1)
        r2 = 1.0 - float(np.sum((c - (slope * t + icpt)) ** 2) / np.sum((c - c.mean()) ** 2))
        hours = f.hours("instance_events")
        ok = hours >= MONTH_H
        return Verdict(
            r2,
            f"R² {r2:.4f} of a straight line through the cumulative {what} ({slope:,.0f} an hour)",
            f"{int(c[-1]):,} {what} over {len(c):,} hourly buckets",
            ok,
            "" if ok else f"the data spans {hours:.1f} h, not the month the rate is about",
        )

    compute.__doc__ = f"How straight the cumulative {what} are: R² of a least-squares line through them."
    return compute


def _completions_below_submissions(r: Mapping[str, Any], f: DatasetFacts) -> Verdict:
    finishes = _hourly(r, "finishes")
    new, done = int(_hourly(r, "new_submissions").sum()), int(finishes.sum())
    ratio = done / new if new else float("nan")
    hours = f.hours("instance_events")
    ok = new > 0 and hours >= MONTH_H
    return Verdict(
        ratio if new else None,
        f"{done:,} completions for {new:,} new task submissions ({pct(ratio)})" if new else "no new submission",
        f"{len(finishes):,} hourly buckets",
        ok,
        "" if ok else f"the data spans {hours:.1f} h, not the month the rates are about",
    )


def _cluster_changes(r: Mapping[str, Any], f: DatasetFacts) -> Verdict:
    s = r["usage-change"]["summary"]
    s = s[s["tier"] == "all"].set_index("resource")
    if not f.rows.get("instance_usage") or s.empty:
        return Verdict(None, "no usage", "", False, "the dataset has no usage windows (instance_usage)")
    cpu, mem = float(s.loc["cpu", "within_20pct"]), float(s.loc["mem", "within_20pct"])
    pairs = int(s.loc["cpu", "defined"])
    return Verdict(
        cpu,
        f"CPU {pct(cpu)}, memory {pct(mem)} of {pairs:,} consecutive 300 s periods",
        f"{pairs:,} pairs of consecutive periods of the cluster's usage",
        pairs > 0,
        "" if pairs > 0 else "fewer than two sampling periods",
    )


def _prod_usage_over_allocation(r: Mapping[str, Any], f: DatasetFacts) -> Verdict:
    cell = r["overcommit"]["cell"]
    if not f.rows.get("instance_usage"):
        return Verdict(None, "no usage", "", False, "the dataset has no usage windows (instance_usage)")
    if "use_cpu_prod" not in cell.columns:
        return Verdict(None, "no production tier", "", False, "the tier map has no tier named prod")
    use, req = float(np.nansum(cell["use_cpu_prod"])), float(np.nansum(cell["req_cpu_prod"]))
    ratio = use / req if req > 0 else float("nan")
    return Verdict(
        ratio,
        f"{pct(ratio)} (CPU-seconds used / requested by production)",
        f"{len(cell):,} cell buckets",
        req > 0,
        "" if req > 0 else "no production request",
    )


def _job_tail(resource: str) -> Any:
    def compute(r: Mapping[str, Any], f: DatasetFacts) -> Verdict:
        s = r["job-usage"]["stats"]
        s = s[(s["tier"] == "all") & (s["resource"] == resource)]
        if s.empty or not int(s["jobs"].iloc[0]):
            return Verdict(None, "no jobs", "", False, "no job with usage")
        share, jobs = float(s["top1pct_share"].iloc[0]), int(s["jobs"].iloc[0])
        whole, why = f.whole_trace("instance_usage")
        hours = f.hours("instance_usage")
        ok = whole and hours >= MONTH_H
        unit = {"cpu": "NCU", "mem": "NMU"}[resource]
        return Verdict(
            share,
            f"{pct(share)} of the {unit}-hours by the top 1% of {jobs:,} jobs",
            f"{jobs:,} jobs",
            ok,
            "" if ok else (why or f"the data spans {hours:.1f} h of the month"),
        )

    return compute


CLAIMS = (
    Claim(
        "submit-evict",
        "A task can be evicted straight from pending: SUBMIT is followed by EVICT.",
        f"{SEED3}, state transition graph (Fig. 1)",
        "occurs",
        LIFECYCLE,
        _submit_evict,
    ),
    Claim(
        "no-submit-submit",
        "A SUBMIT never directly follows another SUBMIT of the same task.",
        f"{SEED3}, state transition graph (Fig. 1)",
        "0",
        LIFECYCLE,
        _no_submit_submit,
    ),
    Claim(
        "new-submissions",
        "Total new task submissions (first SUBMIT of each task).",
        f"{SEED3}, Fig. 3",
        "25,424,731",
        LIFECYCLE,
        _total("new_submissions", "new submissions"),
    ),
    Claim(
        "submissions",
        "Total task submissions, resubmissions included.",
        f"{SEED3}, Fig. 3",
        "48,375,166",
        LIFECYCLE,
        _total("submissions", "submissions"),
    ),
    Claim(
        "schedules",
        "Total task scheduling events.",
        f"{SEED3}, Fig. 3",
        "47,331,507",
        LIFECYCLE,
        _total("schedules", "schedules"),
    ),
    Claim(
        "completions",
        "Total task completions (FINISH): the tasks run to completion.",
        f"{SEED3}, Fig. 3 and §5",
        "18,217,975 (18,217,749 tasks)",
        LIFECYCLE,
        _total("finishes", "completions"),
    ),
    Claim("tasks", "Tasks in the trace.", f"{SEED3}, §5", "25,444,397", LIFECYCLE, _tasks),
    Claim(
        "production-tasks",
        "Production tasks (priority >= 9) are about 6% of tasks.",
        f"{SEED3}, §6",
        "1,558,255 (6%)",
        LIFECYCLE,
        _production_share,
    ),
    Claim(
        "short-30min",
        "About 80% of tasks run for less than 30 minutes.",
        f"{SEED3}, Fig. 8",
        "~80%",
        LIFECYCLE,
        _execution_share(1800.0),
    ),
    Claim(
        "short-5min",
        "About 40% of tasks run for less than 5 minutes.",
        f"{SEED3}, Fig. 8 and §7",
        "~40%",
        LIFECYCLE,
        _execution_share(300.0),
    ),
    Claim(
        "queue-trend",
        "The number of tasks queueing to be scheduled slowly increases.",
        f"{SEED3}, Obs. 7, Fig. 4",
        "increasing",
        LIFECYCLE,
        _trend("pending"),
    ),
    Claim(
        "running-trend",
        "The number of running tasks increases.",
        f"{SEED3}, Obs. 8, Fig. 5",
        "increasing",
        LIFECYCLE,
        _trend("running"),
    ),
    Claim(
        "submissions-steady",
        "New task submissions come at a steady rate over the month: their cumulative count is almost a straight line.",
        f"{SEED3}, Fig. 3",
        "almost linear",
        LIFECYCLE,
        _steady("new_submissions", "new task submissions"),
    ),
    Claim(
        "completions-steady",
        "Task completions come at a steady rate over the month: their cumulative count is almost a straight line.",
        f"{SEED3}, Obs. 5, Fig. 3",
        "almost linear",
        LIFECYCLE,
        _steady("finishes", "completions"),
    ),
    Claim(
        "completions-below-submissions",
        "Tasks complete at a lower rate than new tasks are submitted: unfinished tasks accumulate.",
        f"{SEED3}, Obs. 5",
        "18,217,975 for 25,424,731 (71.7%)",
        LIFECYCLE,
        _completions_below_submissions,
    ),
    Claim(
        "cluster-change-20pct",
        "For more than 90% of 300 s sampling moments the cluster's CPU and memory "
        "consumption changes by less than 20%.",
        f"{SEED3}, Fig. 10",
        "> 90%",
        (("usage-change", {"level": "cluster"}),),
        _cluster_changes,
    ),
    Claim(
        "prod-usage-half",
        "Production tasks use about 50% of the CPU allocated to them.",
        f"{SEED3}, Fig. 9 and §8",
        "~50%",
        (("overcommit", {}),),
        _prod_usage_over_allocation,
    ),
    Claim(
        "borg-cpu-below-limit",
        "Most tasks use much less CPU than their limit (the dotted CPU line).",
        f"{BORG}, Fig. 11",
        "most tasks well below 1",
        (("usage-vs-request", {}),),
        fig11_median("cpu_mean", "a task's time-weighted mean CPU usage / limit"),
        trace="v3",
    ),
    Claim(
        "borg-mem-below-limit",
        "Most tasks use much less memory than their limit (the dotted memory line).",
        f"{BORG}, Fig. 11",
        "most tasks well below 1",
        (("usage-vs-request", {}),),
        fig11_median("mem_mean", "a task's time-weighted mean memory usage / limit"),
        trace="v3",
    ),
    Claim(
        "borg-cpu-above-limit",
        "A few tasks use more CPU than they requested.",
        f"{BORG}, Fig. 11",
        "a few",
        (("usage-vs-request", {}),),
        fig11_above("cpu_mean"),
        trace="v3",
    ),
    Claim(
        "borg-mem-rarely-above",
        "It is rare for a task to exceed its memory limit.",
        f"{BORG}, §5.5 and Fig. 11",
        "rare",
        (("usage-vs-request", {}),),
        fig11_above("mem_peak"),
        trace="v3",
    ),
    Claim(
        "borg-reservation-near-limit",
        "Memory reservations are closer to the limit than usage is (the solid line).",
        f"{BORG}, Fig. 11",
        "closer to 100%",
        (("usage-vs-request", {}),),
        fig11_median("mem_reservation", "a task's time-weighted mean assigned memory / limit"),
        trace="v3",
    ),
    Claim(
        "borg-cpi-per-task",
        "Adding a task to a machine increases the CPI of the other tasks by about 0.3%.",
        f"{BORG}, §5.2",
        "+0.3%",
        BORG_CPI,
        cpi_effect("pct_per_task_vs_mean", lambda v: f"{v:+.2f}% per task (of the mean CPI)"),
        trace="v3",
    ),
    Claim(
        "borg-cpi-per-10pct-util",
        "Increasing the machine's CPU usage by 10% increases CPI by less than 2%.",
        f"{BORG}, §5.2",
        "< 2%",
        BORG_CPI,
        cpi_effect(
            "pct_per_10pct_util_vs_mean", lambda v: f"{v:+.2f}% per +10% of the machine's CPU (of the mean CPI)"
        ),
        trace="v3",
    ),
    Claim(
        "borg-cpi-variance-explained",
        "The machine's task count and CPU usage explain only about 5% of the variance of CPI.",
        f"{BORG}, §5.2",
        "~5%",
        BORG_CPI,
        cpi_effect("r2", lambda v: f"{pct(v)} (R² of the fit)"),
        trace="v3",
    ),
    Claim(
        "borg-cpi-mean",
        "The mean CPI of production tasks in shared cells is 1.58 (σ 0.35).",
        f"{BORG}, §5.2",
        "1.58 (σ 0.35)",
        BORG_CPI,
        cpi_mean,
        trace="v3",
    ),
    Claim(
        "job-tail-cpu",
        "The top 1% of jobs use about 99% of the CPU-hours (NCU-hours).",
        "Tirmazi et al., Borg: the Next Generation (EuroSys 2020), as docs/analyses/job-usage.md",
        "~99%",
        (("job-usage", {}),),
        _job_tail("cpu"),
        trace="v3",
    ),
    Claim(
        "job-tail-mem",
        "The top 1% of jobs use about 99% of the memory-hours (NMU-hours).",
        "Tirmazi et al., Borg: the Next Generation (EuroSys 2020), as docs/analyses/job-usage.md",
        "~99%",
        (("job-usage", {}),),
        _job_tail("mem"),
        trace="v3",
    ),
)
