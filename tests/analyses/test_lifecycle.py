"""``lifecycle`` against a slow pure-Python replay (tests/references/lifecycle.py), a
hand-worked sequence, the real 2011 task events, and the layouts it may and may not run on."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from generic_backend import CPU, GENERIC
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from references.lifecycle import AFTER_TRACE, NAMES, bin_of, km_quantile, max_priorities, replay
from references.lifecycle import kaplan_meier as km_reference
from strategies import HOUR, examples, table, write_dataset

from gpuclust.analyses.lifecycle import DELAY_EDGES_US, Lifecycle, delay_bins
from gpuclust.dataset import Dataset
from gpuclust.engine import TableSource, run
from gpuclust.schema import tier_map

EDGES = [int(x) for x in DELAY_EDGES_US]
REAL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "real"


@st.composite
def event_rows(draw, max_instances: int = 8, max_events: int = 10) -> list[dict]:
    """Instances with short random event sequences: every v3 type, ties, time 0, the after-trace
    sentinel, NULL and changing priorities, events the trace synthesised (missing_type), tasks,
    alloc instances and unknown kinds; rows shuffled (the replay orders them by time, then row)."""
    insts = draw(
        st.lists(
            st.tuples(st.sampled_from([3, 2**40 + 1, 2**62 + 9]), st.integers(0, 3)),
            unique=True,
            max_size=max_instances,
        )
    )
    rows = []
    for c, i in insts:
        t = draw(st.sampled_from([0, 0, 600_000_000, 7 * HOUR + 5]))
        prio = draw(st.one_of(st.none(), st.sampled_from([0, 9, 99, 100, 116, 120, 360])))
        kind = draw(st.sampled_from([None, 0, 0, 1]))
        for _ in range(draw(st.integers(1, max_events))):
            t += draw(st.sampled_from([0, 0, 1, 999_999, 300_000_000, 2 * HOUR, 10**11]))
            late = draw(st.integers(0, 25)) == 0
            rows.append(
                {
                    "time": AFTER_TRACE if late else t,
                    "type": draw(st.sampled_from([0, 0, 3, 3, 6, *range(11)])),
                    "collection_id": c,
                    "instance_index": i,
                    "priority": draw(st.sampled_from([prio, prio, prio, None, 11, 200])),
                    "missing_type": draw(st.sampled_from([None, 0, 0, 0, 0, 1, 2, 3])),
                    "collection_type": draw(st.sampled_from([kind, kind, kind, None])),
                }
            )
    perm = draw(st.permutations(range(len(rows))))
    return [rows[k] for k in perm]


EVENT_COLUMNS = ("time", "type", "collection_id", "instance_index", "priority", "missing_type", "collection_type")
JOB_KINDS = ("job", "alloc_set", "unknown")


def events_table(rows: list[dict]) -> pa.Table:
    return table("instance_events", {k: [r.get(k) for r in rows] for k in EVENT_COLUMNS})


def data_end_of(rows: list[dict]) -> int | None:
    finite = [r["time"] for r in rows if r["time"] != AFTER_TRACE]
    return max(finite) if finite else None


def check(
    res: dict,
    rows: list[dict],
    tm_name: str = "notebook",
    bucket_s: int = 3600,
    kinds: tuple[str, str, str] = ("task", "alloc_instance", "unknown"),
    fallback: dict | None = None,
) -> dict:
    """Every table of ``res`` (a lifecycle result) equals the replay of ``rows``; returns the replay."""
    tm = tier_map(tm_name)
    bucket_us = bucket_s * 1_000_000
    ref = replay(rows, tm.bounds, tm.names, bucket_us, data_end_of(rows), kinds=kinds, fallback_priority=fallback)
    ev = res["events"]
    assert {(r.tier, r.event): r.count for r in ev.itertuples()} == dict(ref["events"])
    tr = res["transitions"]
    assert {(r.tier, r.from_event, r.to_event, r.expected): r.count for r in tr.itertuples()} == dict(
        ref["transitions"]
    )
    info = res["info"].iloc[0]
    assert info["instances"] == sum(ref["instances"].values())
    assert info["first_not_submit"] == ref["first_not_submit"]
    assert info["invalid_type_rows"] == ref["invalid"]
    assert info["unexpected_transitions"] == sum(n for k, n in ref["transitions"].items() if not k[3])
    for c in ("present_at_start", "synthesized_events", "synthesized_duration_episodes", "priority_from_instances"):
        assert info[c] == ref[c], c
    for k in kinds:
        col = f"unknown_{'collection' if kinds[0] == 'job' else 'instance'}s" if k == "unknown" else f"{k}s"
        assert info[col] == ref["kinds"][k], k
    ek = res["events_by_kind"]
    assert {(r.kind, r.tier, r.event): r.count for r in ek.itertuples()} == dict(ref["kind_events"])
    # series: counts per (bucket, tier); levels = the replay's changes summed up to the bucket
    s = res["series"]
    fields = (
        "submissions",
        "new_submissions",
        "resubmissions",
        "present_at_start",
        "schedules",
        "evictions",
        "failures",
        "finishes",
        "kills",
        "losses",
    )
    levels = ("pending", "running", "queued", "eligible")
    bucket, tier = s["bucket"].to_numpy(np.int64), s["tier"].astype(object).to_numpy()
    assert (s["bucket_start_us"].to_numpy(np.int64) == bucket * bucket_us).all()
    # counts: the replay's for the row's (bucket, tier), 0 where the replay has none
    keys = list(ref["series"])
    want = pd.DataFrame(
        [[ref["series"][k][f] for f in fields] for k in keys],
        index=pd.MultiIndex.from_tuples(keys, names=["bucket", "tier"]) if keys else None,
        columns=list(fields),
        dtype=np.int64,
    )
    rows_key = pd.MultiIndex.from_arrays([bucket, tier], names=["bucket", "tier"])
    want = want.reindex(rows_key, fill_value=0) if keys else pd.DataFrame(0, index=rows_key, columns=list(fields))
    got = s[list(fields)].to_numpy(np.int64)
    bad = np.flatnonzero((got != want.to_numpy(np.int64)).any(axis=1))
    assert not len(bad), s.iloc[bad[:5]]
    # levels: the replay's changes summed over the buckets b <= the row's (integers: exact)
    for t in set(tier.tolist()) | {k[1] for k in keys}:
        ch = sorted((b, [ref["series"][(b, tt)][f] for f in levels]) for b, tt in keys if tt == t)
        cum = np.cumsum(np.array([[0] * len(levels)] + [v for _, v in ch], dtype=np.int64), axis=0)
        at = tier == t
        upto = np.searchsorted(np.array([b for b, _ in ch], dtype=np.int64), bucket[at], side="right")
        lv = s[list(levels)].to_numpy(np.int64)[at]
        bad = np.flatnonzero((lv != cum[upto]).any(axis=1))
        assert not len(bad), (t, s[at].iloc[bad[:5]], cum[upto][bad[:5]])
    assert set(keys) <= set(zip(bucket.tolist(), tier.tolist(), strict=True))
    # delays: exact counts, mean, min, max; quantiles resolved to their bin; the histogram
    d = res["delays"]
    got = {(r.tier, r.measure, r.outcome): r for r in d.itertuples()}
    assert set(got) == {k for k, v in ref["episodes"].items() if v}
    hist = Counter({(r.tier, r.measure, r.outcome, r.bin): r.episodes for r in res["delay_hist"].itertuples()})
    want_hist: Counter = Counter()
    for key, eps in ref["episodes"].items():
        r = got[key]
        durs = sorted(x for x in eps if x is not None)
        assert r.episodes == len(eps) and r.with_duration == len(durs), key
        for x in durs:
            want_hist[(*key, bin_of(x, EDGES))] += 1
        if not durs:
            assert np.isnan(r.mean_s) and np.isnan(r.p50_s)
            continue
        assert r.mean_s == pytest.approx(sum(durs) / len(durs) / 1e6, rel=1e-12)
        assert (r.min_s, r.max_s) == (durs[0] / 1e6, durs[-1] / 1e6)
        for q, v in ((0.5, r.p50_s), (0.9, r.p90_s), (0.99, r.p99_s)):
            exact = int(np.quantile(np.array(durs, dtype=np.int64), q, method="inverted_cdf"))
            j = bin_of(exact, EDGES)
            assert v == max(0.0 if j == 0 else EDGES[j - 1] / 1e6, durs[0] / 1e6), (key, q, exact, v)
            assert v <= exact / 1e6 < (EDGES[j] / 1e6 if j < len(EDGES) else np.inf)
    assert hist == want_hist
    # by kind: the same episodes, counted per (kind, tier)
    dk = {
        (r.kind, r.tier, r.measure, r.outcome): (r.episodes, r.with_duration)
        for r in res["delays_by_kind"].itertuples()
    }
    assert dk == {k: (len(v), sum(x is not None for x in v)) for k, v in ref["kind_episodes"].items() if v}
    check_survival(res["survival"], ref)
    return ref


def check_exact_km(res: dict, ref: dict) -> int:
    """``survival``'s medians (every kind together) against Kaplan-Meier on the exact durations of
    the reference: the exact median lies in the table's bin or the one below (coarsening a bin's
    censorings to after its events can only raise the estimate, and by little where the bins hold
    few episodes of the risk set).  Returns the number of medians compared."""
    pairs: dict = {}
    for (_, tier, measure, outcome), durs in ref["kind_episodes"].items():
        if measure in KM_MEASURES:
            pairs.setdefault((tier, measure), []).extend(
                (x, outcome in KM_MEASURES[measure][0]) for x in durs if x is not None
            )
    sv = res["survival"].set_index(["kind", "tier", "measure"])
    n = 0
    for (tier, measure), p in pairs.items():
        v = sv.loc[("all", tier, measure), "km_p50_s"]
        exact = km_quantile(km_reference(p), 0.5)
        if np.isnan(v):
            assert exact is None or bin_of(exact, EDGES) >= len(EDGES), (tier, measure, exact)
            continue
        assert exact is not None and LO_S.index(v) - 1 <= bin_of(exact, EDGES) <= LO_S.index(v), (
            tier,
            measure,
            v,
            exact,
        )
        n += 1
    return n


LO_S = [0.0, *(x / 1e6 for x in EDGES)]
HI_S = [0.0, *(x / 1e6 for x in EDGES[1:]), np.inf]
#: measure: (its event outcomes, its completed outcome), as docs/analyses/lifecycle.md defines them
KM_MEASURES = {
    "scheduling": ({"scheduled"}, "scheduled"),
    "execution": ({"evict", "fail", "finish", "kill", "lost", "interrupted"}, "finish"),
}


def check_survival(sv, ref: dict) -> None:
    """``survival`` against the product-limit estimate of the reference (tests/references/lifecycle.py)
    over each (kind, tier, measure)'s (duration, ended) pairs, each duration taken as its bin (the
    table's resolution): every estimate and band bound is the edge of the reference's bin."""
    want = {}
    for kind_key in ("all", "kind"):
        groups: dict = {}
        for key, durs in ref["kind_episodes"].items():
            kind, tier, measure, outcome = key
            if measure not in KM_MEASURES:
                continue
            g = groups.setdefault(("all" if kind_key == "all" else kind, tier, measure), [])
            g += [(bin_of(x, EDGES), outcome in KM_MEASURES[measure][0], outcome) for x in durs if x is not None]
        want.update({k: v for k, v in groups.items() if v})
    got = {(r.kind, r.tier, r.measure): r for r in sv.itertuples()}
    assert set(got) == set(want)
    for key, pairs in want.items():
        r = got[key]
        assert (r.episodes, r.events, r.censored) == (
            len(pairs),
            sum(p[1] for p in pairs),
            sum(not p[1] for p in pairs),
        ), key
        assert r.completed == sum(p[2] == KM_MEASURES[key[2]][1] for p in pairs)
        curve = km_reference([(b, ended) for b, ended, _ in pairs])
        for q, name in ((0.5, "p50"), (0.9, "p90")):
            for which, col, edges in ((1, "", LO_S), (2, "_lo", LO_S), (3, "_hi", HI_S)):
                b = km_quantile(curve, q, which)
                v = getattr(r, f"km_{name}{col}_s")
                if b is None or not np.isfinite(edges[b]):
                    assert np.isnan(v), (key, name, col, v)
                else:
                    assert v == edges[b], (key, name, col, v, b)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=event_rows())
def test_matches_the_replay(rows):
    res = run(TableSource({"instance_events": events_table(rows)}), Lifecycle(tier_map="notebook"))["lifecycle"]
    check(res, rows)


@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=event_rows(max_instances=12), bucket_s=st.sampled_from([1, 300, 86_400]))
def test_bucket_width(rows, bucket_s):
    res = run(TableSource({"instance_events": events_table(rows)}), Lifecycle(tier_map="notebook", bucket_s=bucket_s))[
        "lifecycle"
    ]
    check(res, rows, bucket_s=bucket_s)


def test_a_worked_sequence():
    """Two instances, worked by hand: (7, 0) is submitted at 10 s, scheduled at 15 s, finishes at
    100 s; (7, 1) is submitted at 20 s, evicted while pending at 30 s (not in the v3 diagram),
    resubmitted at 30 s, enabled at 40 s, scheduled at 50 s, and still running at the end (100 s)."""
    s = 1_000_000
    rows = [(10, 0, 0), (15, 3, 0), (100, 6, 0), (20, 0, 1), (30, 4, 1), (30, 0, 1), (40, 2, 1), (50, 3, 1)]
    t = events_table(
        [{"time": a * s, "type": e, "collection_id": 7, "instance_index": i, "priority": 120} for a, e, i in rows]
    )
    res = run(TableSource({"instance_events": t}), Lifecycle(tier_map="notebook", bucket_s=25))["lifecycle"]
    d = res["delays"].set_index(["measure", "outcome"])
    assert d.loc[("scheduling", "scheduled"), "episodes"] == 2
    assert d.loc[("scheduling", "scheduled"), "min_s"] == 5.0 and d.loc[("scheduling", "scheduled"), "max_s"] == 20.0
    assert d.loc[("scheduling", "evict"), ["episodes", "min_s"]].tolist() == [1, 10.0]
    assert d.loc[("enable_to_schedule", "scheduled"), "min_s"] == 10.0
    assert d.loc[("execution", "finish"), "min_s"] == 85.0
    assert d.loc[("execution", "censored"), ["episodes", "min_s"]].tolist() == [1, 50.0]  # 100 s - 50 s
    assert set(d["episodes"].index) == {
        ("scheduling", "scheduled"),
        ("scheduling", "evict"),
        ("enable_to_schedule", "scheduled"),
        ("execution", "finish"),
        ("execution", "censored"),
    }
    tr = res["transitions"].set_index(["from_event", "to_event"])
    assert not tr.loc[("SUBMIT", "EVICT"), "expected"] and tr.loc[("EVICT", "SUBMIT"), "expected"]
    assert res["info"].iloc[0]["unexpected_transitions"] == 1
    sr = res["series"].set_index("bucket")  # buckets of 25 s: [0,25) [25,50) [50,75) [75,100) [100,125)
    assert sr["new_submissions"].tolist() == [2, 0, 0, 0, 0] and sr["resubmissions"].tolist() == [0, 1, 0, 0, 0]
    assert sr["pending"].tolist() == [1, 1, 0, 0, 0] and sr["running"].tolist() == [1, 1, 2, 2, 1]
    assert (sr["tier"] == "prod").all()


def test_every_layout_gives_the_same_result(tmp_path):
    """A flat dataset (one partition), its `gpuclust optimize`d copy cut into several bucket
    partitions, and in-memory tables give one result."""
    from gpuclust.optimize import optimize

    rng = np.random.default_rng(3)
    n = 3000
    rows = [
        {
            "time": int(t),
            "type": int(e),
            "collection_id": int(c),
            "instance_index": int(i),
            "priority": None if p < 0 else int(p),
        }
        for t, e, c, i, p in zip(
            rng.integers(0, 50, n) * 60_000_000,
            rng.choice([0, 0, 1, 2, 3, 3, 4, 6, 7, 9, 10], n),
            rng.choice([3, 2**40 + 1, 2**62 + 9], n),
            rng.integers(0, 200, n),
            rng.choice([-1, 0, 105, 118, 120, 400], n),
            strict=True,
        )
    ]
    flat = write_dataset(tmp_path / "flat", {"instance_events": events_table(rows)}, files=3, row_group_size=500)
    a = Lifecycle(bucket_s=600)
    r_flat = run(Dataset(flat), a, partitions="auto")["lifecycle"]
    check(r_flat, rows, bucket_s=600)
    optimize(flat, buckets=8, out=tmp_path / "opt", progress=False)  # (the command: tests/test_layout.py)
    for parts, scheduler in ((1, None), (3, None), ("auto", None), (3, "threads"), (3, "local:2")):
        r_opt = run(Dataset(tmp_path / "opt"), a, partitions=parts, workers=2, scheduler=scheduler)["lifecycle"]
        for k in r_flat:
            assert r_opt[k].equals(r_flat[k]), (parts, scheduler, k)


def test_a_flat_dataset_is_never_cut(tmp_path, monkeypatch):
    """A flat table is one partition for a whole-instance analysis, whatever partitions were asked
    for (the other analyses streaming it share that one read); one that is larger than a partition
    may be under the memory budget is a one-line error naming `gpuclust optimize`."""
    from gpuclust.engine import memory

    rows = [{"time": k, "type": k % 4, "collection_id": 1, "instance_index": k % 7, "priority": 0} for k in range(100)]
    flat = write_dataset(tmp_path / "flat", {"instance_events": events_table(rows)}, files=4)
    one = run(Dataset(flat), Lifecycle(), partitions=1)["lifecycle"]
    for kw in ({"partitions": 3}, {"partitions": "auto"}, {"cut_points": [10, 50]}, {"partitions": 2, "time_from": 5}):
        got = run(Dataset(flat), Lifecycle(), **kw)["lifecycle"]
        if "time_from" not in kw:
            assert all(got[k].equals(one[k]) for k in one), kw
        check(got, [r for r in rows if r["time"] >= kw.get("time_from", 0)])
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuclust.cli",
            "analyze",
            str(flat),
            "lifecycle",
            "--partitions",
            "2",
            "--out",
            str(tmp_path / "r2"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    monkeypatch.setattr(memory, "MIN_PARTITION_ROWS", 10)  # a budget of 10-row partitions: 100 rows are too many
    with pytest.raises(ValueError, match="gpuclust optimize"):
        run(Dataset(flat), Lifecycle(), partitions="auto", memory_limit=10 * 2 * Lifecycle.row_bytes * 2, workers=2)
    monkeypatch.undo()
    # the CLI says it in one line, without a traceback, and writes nothing
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuclust.cli",
            "analyze",
            str(flat),
            "lifecycle",
            "--memory-limit",
            "1",
            "--out",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:  # (a budget floor may still admit 100 rows: then the run is simply fine)
        assert "gpuclust optimize" in r.stderr and "Traceback" not in r.stderr and r.stderr.count("\n") == 1
        assert not (tmp_path / "r").exists()


@pytest.mark.skipif(not REAL.is_dir(), reason=f"real trace files not found at {REAL}")
def test_real_2011_task_events(real_2011):
    """The first 5 of 500 parts of the 2011 task_events (919,519 rows), ingested (with the machine
    and job events: the session's ``real_2011``), against the replay of the same canonical rows."""
    ds = Dataset(real_2011)
    res = run(ds, Lifecycle(), partitions="auto")["lifecycle"]
    t = ds.read("instance_events", list(EVENT_COLUMNS))
    rows = t.to_pylist()
    ref = check(res, rows, tm_name="v2")
    assert check_exact_km(res, ref) == 6  # scheduling and execution of the three tiers
    info = res["info"].iloc[0]
    assert info["rows"] == 919_519 and info["tier_map"] == "v2"
    # seed 003: a SUBMIT never directly follows a SUBMIT in the 2011 trace
    tr = res["transitions"]
    assert tr[(tr["from_event"] == "SUBMIT") & (tr["to_event"] == "SUBMIT")].empty
    assert set(NAMES) >= set(res["events"]["event"])


def test_planted_life_cycles_of_a_synthetic_cell(synth_cell_40):
    """`gpuclust synth` plants its instance life cycles and writes what it planted
    (synth_truth.json, and the dataset's manifest: events by type, resubmissions, instances still
    running or never placed at the end, running intervals); lifecycle recovers them exactly from
    the ingested dataset (the pending ones bounded: the truth counts only those never placed).  The
    session's 40-machine x 3 h cell (``synth_cell_40``)."""
    ds = Dataset(synth_cell_40 / "ds")
    truth = ds.manifest["synthetic"]
    assert truth["counts"]["instance_events"]["malformed_total"] == 0
    w = truth["workload"]
    res = run(ds, Lifecycle(), partitions="auto")["lifecycle"]
    assert res["events"].groupby("event")["count"].sum().to_dict() == w["instance_event_types"]
    s = res["series"]
    assert int(s["resubmissions"].sum()) == w["resubmissions"]
    end = s[s["bucket"] == s["bucket"].max()]
    assert int(end["running"].sum()) == w["still_running_at_end"]
    # pending at the end: the never-placed ones (planted) and any evicted or failed and resubmitted
    pending = int(end["pending"].sum())
    assert w["unplaced_at_end"] <= pending <= w["unplaced_at_end"] + w["resubmissions"]
    assert pending == int(res["delays"].query("measure == 'scheduling' and outcome == 'censored'")["episodes"].sum())
    d = res["delays"]
    assert int(d.loc[d["measure"] == "execution", "episodes"].sum()) == w["running_intervals"]
    assert (
        int(d.loc[(d["measure"] == "execution") & (d["outcome"] == "censored"), "episodes"].sum())
        == w["still_running_at_end"]
    )


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=event_rows())
def test_collection_lifecycle_matches_the_replay(rows):
    """The same replay per collection, from collection_events (no instance_index: one thing per
    collection_id; the replay's instance is then the collection)."""
    from gpuclust.analyses.lifecycle import CollectionLifecycle

    rows = [{**r, "instance_index": 0} for r in rows]
    t = table("collection_events", {k: [r[k] for r in rows] for k in EVENT_COLUMNS if k != "instance_index"})
    res = run(TableSource({"collection_events": t}), CollectionLifecycle(tier_map="notebook"))["collection-lifecycle"]
    check(res, rows, kinds=JOB_KINDS)


@pytest.mark.skipif(not REAL.is_dir(), reason=f"real trace files not found at {REAL}")
def test_real_2011_job_events(tmp_path):
    """The first 5 of 500 parts of the 2011 job_events (25,437 rows) as collection_events,
    against the replay."""
    from gpuclust.analyses.lifecycle import CollectionLifecycle
    from gpuclust.ingest import ingest

    assert ingest([REAL / "2011" / "job_events"], tmp_path / "v2", progress=False).exit_status == 0
    ds = Dataset(tmp_path / "v2")
    res = run(ds, CollectionLifecycle(), partitions="auto")["collection-lifecycle"]
    rows = [
        {**r, "instance_index": 0}
        for r in ds.read("collection_events", [c for c in EVENT_COLUMNS if c != "instance_index"]).to_pylist()
    ]
    check(res, rows, tm_name="v2", kinds=JOB_KINDS)
    assert res["info"].iloc[0]["rows"] == 25_437


def test_planted_scheduling_delays_of_a_synthetic_cell(tmp_path):
    """`gpuclust synth` plants the scheduling delay: every SUBMIT during the trace gets its first
    placement attempt an exponential delay (mean ``sched_delay_<tier>_s``) later, and SCHEDULE then
    if the instance fits, else at a later scheduling pass; synth_truth.json planted.scheduling_delay.
    So the planted delay is a floor that queueing can only lengthen: in a cell with headroom
    (``request_fill`` 0.55, where 96-100% of first attempts place) lifecycle's SUBMIT -> SCHEDULE
    distribution per tier recovers the planted median (from ``delay_hist``: the bin holding it,
    whose lower edge is within 4.7% below the exact one) within 0.05 + 3 x 1.44 / sqrt(n) (the
    standard error of an exponential sample median, relative, is 1 / (ln 2 sqrt(n))) plus 0.05 for
    queueing, and its exact mean is at least the planted mean less 3 standard errors (mean /
    sqrt(n)).  Tiers with at least 300 episodes; the population submitted at time 0 (no delay) has
    no duration.  Seed 2, 60 machines x 3 h: free median bin 39.8 s (planted 41.6; 1,141 episodes;
    mean 66 s, planted 60), beb 14.5 s (13.9; 3,026; mean 23 s, planted 20); mid and prod have under
    60 episodes in this cell."""
    from gpuclust.synth import SynthConfig, synthesize

    syn = synthesize(
        SynthConfig(machines=60, hours=3, seed=2, request_fill=0.55),
        tmp_path / "raw",
        dataset=tmp_path / "ds",
        progress=None,
    )
    p = syn.truth["planted"]["scheduling_delay"]
    res = run(Dataset(tmp_path / "ds"), Lifecycle(tier_map="notebook"), partitions="auto")["lifecycle"]
    d = res["delays"].set_index(["tier", "measure", "outcome"])
    h = res["delay_hist"]
    checked = []
    for tier, mean in p["mean_s_by_tier"].items():
        if (tier, "scheduling", "scheduled") not in d.index:
            continue
        row = d.loc[(tier, "scheduling", "scheduled")]
        n = int(row["with_duration"])
        if n < 300:
            continue
        assert p["placed_at_first_attempt_share_by_tier"][tier] >= 0.9
        hb = h[(h["tier"] == tier) & (h["measure"] == "scheduling") & (h["outcome"] == "scheduled")].sort_values("lo_s")
        assert int(hb["episodes"].sum()) == n
        assert int(hb.loc[hb["hi_s"] == 0, "episodes"].sum()) == 0  # no zero delays during the trace
        median = float(hb["lo_s"].to_numpy()[np.searchsorted(hb["episodes"].cumsum().to_numpy(), 0.5 * n)])
        want = p["median_s_by_tier"][tier]
        assert abs(median / want - 1) <= 0.1 + 3 * 1.44 / np.sqrt(n), (tier, median, want)
        assert row["mean_s"] >= mean * (1 - 3 / np.sqrt(n)), (tier, row["mean_s"], mean)
        checked.append(tier)
    assert {"free", "beb"} <= set(checked), checked


# ---------------------------------------------------------------- the cpu backend's fast path


@settings(max_examples=examples(50), deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=200), st.integers(0, 10**6))
def test_delay_bins_is_a_binary_search(ds, seed):
    rng = np.random.default_rng(seed)
    near = rng.choice(DELAY_EDGES_US, 200)
    d = np.concatenate(
        [
            np.array(ds, dtype=np.int64),
            near,
            near - 1,
            near + 1,
            [0, 1, 2**53, 2**53 + 1, 2**62],
            (10.0 ** rng.uniform(0, 15, 500)).astype(np.int64),
        ]
    )
    assert (delay_bins(np, d) == np.searchsorted(DELAY_EDGES_US, d, side="right")).all()


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].equals(b[k]), k


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=event_rows())
def test_lifecycle_cpu_path_is_the_generic_path(rows):
    """lifecycle's per-instance top priority by ``maximum.reduceat`` (cpu) and by a sort (generic):
    the same tables."""
    t = events_table(rows)
    fast = run(TableSource({"instance_events": t}), Lifecycle(), backend=CPU)["lifecycle"]
    slow = run(TableSource({"instance_events": t}), Lifecycle(), backend=GENERIC)["lifecycle"]
    _same(fast, slow)


def test_lifecycle_without_events_of_a_known_type():
    t = events_table([{"time": 5, "type": 99, "collection_id": 1, "instance_index": 0, "priority": None}])
    for be in (CPU, GENERIC):
        res = run(TableSource({"instance_events": t}), Lifecycle(), backend=be)["lifecycle"]
        assert int(res["info"]["invalid_type_rows"].iloc[0]) == 1
    empty = pa.Table.from_pylist([], schema=t.schema)
    res = run(TableSource({"instance_events": empty}), Lifecycle(), backend=CPU)["lifecycle"]
    assert int(res["info"]["rows"].iloc[0]) == 0


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=event_rows(), split=st.sampled_from([1, 2, 7]))
def test_replay_in_two_halves_is_the_replay(rows, split):
    """The cpu path replays a partition of at least ``SPLIT_ROWS`` rows as two halves by instance
    hash, on two threads where one is spare: against the replay reference, and the same tables on
    one worker and two (the halves depend on the rows alone), for instances and collections."""
    from unittest import mock

    from gpuclust.analyses import lifecycle as lc

    t = events_table(rows)
    with mock.patch.object(lc, "SPLIT_ROWS", split):
        one = run(TableSource({"instance_events": t}), Lifecycle(tier_map="notebook"), workers=1)["lifecycle"]
        two = run(TableSource({"instance_events": t}), Lifecycle(tier_map="notebook"), workers=2)["lifecycle"]
        jobs = {
            w: run(TableSource({"collection_events": t}), lc.CollectionLifecycle(tier_map="notebook"), workers=w)[
                "collection-lifecycle"
            ]
            for w in (1, 2)
        }
    check(one, rows)
    _same(one, two)
    _same(jobs[1], jobs[2])
    whole = run(TableSource({"collection_events": t}), lc.CollectionLifecycle(tier_map="notebook"))[
        "collection-lifecycle"
    ]
    _same(jobs[1], whole)


# ---------------------------------------------------------------- issue 35: synthesised events, present at start,
# QUEUE / ENABLE, kinds, job priority from task events, Kaplan-Meier


def test_a_worked_sequence_of_the_issue_35_definitions():
    """Worked by hand (priority 120, prod): task (7, 0) is present at the trace start (SUBMIT and
    SCHEDULE at 0), finishes at 100 s; task (7, 1) is submitted at 10 s, QUEUEd at 20 s, ENABLEd
    at 30 s, UPDATE_PENDING at 35 s (stays eligible), scheduled at 40 s by a SCHEDULE the trace
    synthesised (missing_type 1: snapshot time), finishes at 90 s; alloc instance (8, 0) is
    submitted at 50 s, QUEUEd at 60 s and still queued at the end (100 s)."""
    s = 1_000_000
    rows = [
        (0, 0, 7, 0, 0, 0),
        (0, 3, 7, 0, 0, 0),
        (100, 6, 7, 0, 0, 0),
        (10, 0, 7, 1, 0, 0),
        (20, 1, 7, 1, 0, 0),
        (30, 2, 7, 1, 0, 0),
        (35, 9, 7, 1, 0, 0),
        (40, 3, 7, 1, 1, 0),
        (90, 6, 7, 1, 0, 0),
        (50, 0, 8, 0, 0, 1),
        (60, 1, 8, 0, None, 1),
    ]
    t = events_table(
        [
            {
                "time": a * s,
                "type": e,
                "collection_id": c,
                "instance_index": i,
                "priority": 120,
                "missing_type": m,
                "collection_type": k,
            }
            for a, e, c, i, m, k in rows
        ]
    )
    res = run(TableSource({"instance_events": t}), Lifecycle(tier_map="notebook", bucket_s=25))["lifecycle"]
    info = res["info"].iloc[0]
    assert (info["present_at_start"], info["synthesized_events"], info["synthesized_duration_episodes"]) == (1, 1, 2)
    assert (info["tasks"], info["alloc_instances"], info["unknown_instances"]) == (2, 1, 0)
    d = res["delays"].set_index(["measure", "outcome"])
    # (7, 1)'s pending stay ends at the synthesised SCHEDULE and its run begins there: no duration
    assert d.loc[("scheduling", "scheduled"), ["episodes", "with_duration"]].tolist() == [2, 0]
    assert d.loc[("execution", "finish"), ["episodes", "with_duration"]].tolist() == [2, 0]
    assert ("enable_to_schedule", "scheduled") not in d.index
    assert d.loc[("scheduling", "censored"), ["episodes", "with_duration", "min_s"]].tolist() == [1, 1, 50.0]
    # queued (deferred) stretches: (7, 1) from 20 s to its ENABLE at 30 s; (8, 0) from 60 s to the end
    assert d.loc[("queued", "enabled"), ["episodes", "with_duration", "min_s"]].tolist() == [1, 1, 10.0]
    assert d.loc[("queued", "censored"), ["episodes", "with_duration", "min_s"]].tolist() == [1, 1, 40.0]
    sr = res["series"].set_index("bucket")  # buckets of 25 s: [0,25) [25,50) [50,75) [75,100) [100,125)
    assert sr["submissions"].tolist() == [2, 0, 1, 0, 0]
    assert sr["new_submissions"].tolist() == [1, 0, 1, 0, 0] and sr["present_at_start"].tolist() == [1, 0, 0, 0, 0]
    assert sr["resubmissions"].sum() == 0
    assert sr["pending"].tolist() == [1, 0, 1, 1, 1]
    assert sr["queued"].tolist() == [1, 0, 1, 1, 1] and sr["eligible"].tolist() == [0, 0, 0, 0, 0]
    bk = res["delays_by_kind"].set_index(["kind", "measure", "outcome"])
    assert bk.loc[("alloc_instance", "scheduling", "censored"), "episodes"] == 1
    assert ("alloc_instance", "execution", "finish") not in bk.index
    assert bk.loc[("task", "execution", "finish"), "episodes"] == 2
    ek = res["events_by_kind"].groupby("kind")["count"].sum().to_dict()
    assert ek == {"task": 9, "alloc_instance": 2}
    text = Lifecycle().summary(res)
    assert "(1 instances present at the start apart)" in text and "1 events synthesised by the trace" in text
    assert "scheduling Kaplan-Meier     prod: 0 ended, 1 censored; median unknown (95% unknown-unknown)" in text
    # eligible from the ENABLE at 30 s to the SCHEDULE at 40 s, across the UPDATE_PENDING: bucket 1
    # ends at 50 s, after it; buckets of 5 s show it
    r5 = run(TableSource({"instance_events": t}), Lifecycle(tier_map="notebook", bucket_s=5))["lifecycle"]["series"]
    el = dict(zip(r5["bucket"], r5["eligible"], strict=True))
    assert [el[b] for b in range(5, 9)] == [0, 1, 1, 0]  # [25,30) [30,35) [35,40) [40,45)


def test_collection_priority_from_instance_events():
    """A collection whose own events carry no priority takes the highest priority over its
    instances' events (the 2011 job_events); one with its own keeps it; one without either is
    unknown.  Against the replay with the same rule, on random sequences."""
    from gpuclust.analyses.lifecycle import CollectionLifecycle

    s = 1_000_000
    jobs = [
        {"time": a * s, "type": e, "collection_id": c, "priority": p}
        for a, e, c, p in ((1, 0, 1, None), (2, 3, 1, None), (1, 0, 2, 0), (1, 0, 3, None))
    ]
    tasks = [
        {"time": 1 * s, "type": 0, "collection_id": c, "instance_index": i, "priority": p}
        for c, i, p in ((1, 0, 9), (1, 1, None), (1, 2, 2), (2, 0, 11))
    ]
    src = TableSource(
        {
            "collection_events": table("collection_events", {k: [r[k] for r in jobs] for k in jobs[0]}),
            "instance_events": events_table(tasks),
        }
    )
    res = run(src, CollectionLifecycle(tier_map="v2"))["collection-lifecycle"]
    ev = res["events"].set_index(["tier", "event"])["count"].to_dict()
    # job 1: priority 9 from its tasks (v2 production); job 2: its own 0 (free); job 3: unknown
    assert ev == {("prod", "SUBMIT"): 1, ("prod", "SCHEDULE"): 1, ("free", "SUBMIT"): 1, ("unknown", "SUBMIT"): 1}
    assert res["info"].iloc[0]["priority_from_instances"] == 1
    check(
        res, [{**r, "instance_index": 0} for r in jobs], tm_name="v2", kinds=JOB_KINDS, fallback=max_priorities(tasks)
    )


def test_collection_priority_lookup_copied_only_when_needed(monkeypatch):
    """The instances' priorities per collection are copied to the device only for a cell with
    collections whose own events carry none (a 2011 trace): a 2019 cell's run copies its columns
    and no lookup (its collections, 8+8 bytes each, would add 20% to its copies in)."""
    from device_backend import DEVICE

    from gpuclust.analyses.lifecycle import CollectionLifecycle

    n = 4000
    tasks = events_table(
        [{"time": HOUR, "type": 0, "collection_id": c, "instance_index": 0, "priority": 200} for c in range(n)]
    )
    staged: list[int] = []
    stage = type(DEVICE).stage
    monkeypatch.setattr(type(DEVICE), "stage", lambda self, a: staged.append(np.asarray(a).size) or stage(self, a))
    for own in (200, None):
        staged.clear()
        jobs = table(
            "collection_events",
            {"time": [HOUR] * n, "type": [0] * n, "collection_id": list(range(n)), "priority": [own] * n},
        )
        src = TableSource({"collection_events": jobs, "instance_events": tasks})
        res = run(src, CollectionLifecycle(), backend=DEVICE)["collection-lifecycle"]
        assert res["info"].iloc[0]["unknown_priority_instances"] == 0
        assert res["info"].iloc[0]["priority_from_instances"] == (0 if own else n)
        assert staged.count(n) == (0 if own else 2), staged  # the ids and their priorities


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=event_rows(), tasks=event_rows(max_instances=6, max_events=3))
def test_collection_priority_matches_the_replay(rows, tasks):
    from gpuclust.analyses.lifecycle import CollectionLifecycle

    rows = [{**r, "instance_index": 0} for r in rows]
    t = table("collection_events", {k: [r.get(k) for r in rows] for k in EVENT_COLUMNS if k != "instance_index"})
    src = TableSource({"collection_events": t, "instance_events": events_table(tasks)})
    res = run(src, CollectionLifecycle(tier_map="notebook"))["collection-lifecycle"]
    check(res, rows, kinds=JOB_KINDS, fallback=max_priorities(tasks))


def test_kaplan_meier_on_planted_durations():
    """Episodes with planted exponential durations (median 600 s) and independent exponential
    censoring (median 1200 s: a third censored): the Kaplan-Meier median recovers the planted one
    within its band and 10%, where the completed-only median (the durations that ended before their
    censoring: exponential with median 400 s) is a third below it; p90 likewise.  Each episode is a SUBMIT at a time
    after 0, then SCHEDULE (the scheduling delay, censored when the data ends first)."""
    rng = np.random.default_rng(5)
    n, s = 4000, 1_000_000
    start = rng.integers(1, 10**6, n) * s // 1000 + s
    dur = (rng.exponential(600 / np.log(2), n) * s).astype(np.int64) + 1
    cens = (rng.exponential(1200 / np.log(2), n) * s).astype(np.int64) + 1
    rows = []
    for k in range(n):  # censored: a KILL while pending (a competing end: censored for scheduling)
        ended = dur[k] <= cens[k]
        rows += [
            {"time": int(start[k]), "type": 0, "collection_id": 5, "instance_index": k, "priority": 200},
            {
                "time": int(start[k] + min(dur[k], cens[k])),
                "type": 3 if ended else 7,
                "collection_id": 5,
                "instance_index": k,
                "priority": 200,
            },
        ]
    res = run(TableSource({"instance_events": events_table(rows)}), Lifecycle(tier_map="notebook"))["lifecycle"]
    sv = res["survival"].set_index(["kind", "measure"]).loc[("all", "scheduling")]
    assert sv["events"] == int((dur <= cens).sum()) and sv["censored"] == int((dur > cens).sum())
    for q, name in ((0.5, "p50"), (0.9, "p90")):
        true = -np.log(1 - q) * 600 / np.log(2)
        assert sv[f"km_{name}_lo_s"] <= true <= sv[f"km_{name}_hi_s"], (name, sv.to_dict())
        assert abs(sv[f"km_{name}_s"] / true - 1) < 0.1, (name, sv[f"km_{name}_s"], true)
        assert sv[f"completed_{name}_s"] < 0.75 * true
    assert check_exact_km(res, check(res, rows)) == 1


@pytest.mark.skipif(not REAL.is_dir(), reason=f"real trace files not found at {REAL}")
def test_real_2011_issue_35_figures_against_duckdb(real_2011):
    """The first 5 of 500 parts of the 2011 task_events and job_events in one dataset, against
    DuckDB SQL written from docs/analyses/lifecycle.md: tasks present at the trace start (first
    event at time 0), events the trace synthesised (missing_type set), the new submissions of the
    series (first SUBMITs of tasks not present at the start), and each job's tier from the highest
    priority over its tasks' events (the job events carry none) counted over the job events."""
    duckdb = pytest.importorskip("duckdb")
    from gpuclust.analyses.lifecycle import CollectionLifecycle

    ds = Dataset(real_2011)  # the task and job events (and the machine events, unread here)
    res = run(ds, [Lifecycle(), CollectionLifecycle()], partitions="auto")
    lc, jc = res["lifecycle"], res["collection-lifecycle"]
    ie, je = (f"read_parquet('{real_2011 / t}/**/*.parquet')" for t in ("instance_events", "collection_events"))
    q = duckdb.connect().sql
    (present,) = q(
        f"SELECT count(*) FROM (SELECT min(time) t0 FROM {ie} GROUP BY collection_id, instance_index) WHERE t0 = 0"
    ).fetchall()[0]
    (synth,) = q(f"SELECT count(*) FROM {ie} WHERE missing_type > 0").fetchall()[0]
    (new,) = q(f"""WITH f AS (SELECT collection_id, instance_index, min(time) t0 FROM {ie} GROUP BY ALL),
                 s AS (SELECT collection_id, instance_index, min(time) ts FROM {ie} WHERE type = 0 GROUP BY ALL)
                 SELECT count(*) FROM s JOIN f USING (collection_id, instance_index) WHERE f.t0 > 0""").fetchall()[0]
    info = lc["info"].iloc[0]
    assert (info["present_at_start"], info["synthesized_events"]) == (present, synth) == (144_339, 291)
    assert lc["series"]["new_submissions"].sum() == new
    assert lc["series"]["present_at_start"].sum() == present
    by_tier = dict(
        q(f"""WITH p AS (SELECT collection_id, max(priority) p FROM {ie} GROUP BY ALL)
                         SELECT CASE WHEN p.p IS NULL THEN 'unknown' WHEN p.p >= 9 THEN 'prod'
                                     WHEN p.p >= 2 THEN 'middle' ELSE 'free' END, count(*)
                         FROM {je} j LEFT JOIN p USING (collection_id) GROUP BY ALL""").fetchall()
    )
    assert jc["events"].groupby("tier")["count"].sum().to_dict() == by_tier
    assert by_tier.get("unknown", 0) < 0.01 * sum(by_tier.values())
    jinfo = jc["info"].iloc[0]
    assert jinfo["priority_from_instances"] + jinfo["unknown_priority_instances"] == jinfo["instances"] == 9808
    # Kaplan-Meier beside completed-only, production execution: more runs, a longer median
    sv = lc["survival"].set_index(["kind", "tier", "measure"]).loc[("all", "prod", "execution")]
    assert sv["episodes"] > sv["completed"] and sv["km_p50_s"] > sv["completed_p50_s"]
