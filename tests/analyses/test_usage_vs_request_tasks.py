"""``usage-vs-request``'s per-task tables (Borg, EuroSys 2015, Figure 11: CDFs over tasks of usage /
limit and reservation / limit, prod against non-prod) against two references that share nothing
with the analysis: a slow Python replay (a loop over each window's instance events) and DuckDB SQL
(the limits by ASOF JOIN, the per-task values by GROUP BY), on random cells, on a synthetic cell and
on the real 2011 trace parts (their real events, with usage windows planted on real instances: the
parts hold no task_usage rows)."""

from __future__ import annotations

import bisect
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples, table, write_dataset

from gpuclust.analyses.usage_change import RATIO_EDGES
from gpuclust.analyses.usage_vs_request import UsageVsRequest
from gpuclust.dataset import Dataset
from gpuclust.engine import TableSource, run
from gpuclust.schema import SCHEMAS, tier_map

EDGES = [float(x) for x in RATIO_EDGES]
LO = [0.0, *EDGES]
S = 1_000_000
AFTER = 2**63 - 1
#: measure -> (usage column, limit column, kind)
MEASURES = {
    "cpu_mean": ("avg_cpu", "req_cpu", "mean"),
    "cpu_peak": ("max_cpu", "req_cpu", "peak"),
    "mem_mean": ("avg_mem", "req_mem", "mean"),
    "mem_peak": ("max_mem", "req_mem", "peak"),
    "mem_reservation": ("assigned_mem", "req_mem", "mean"),
}


def cell(seed: int, n_inst: int = 50, n_ev: int = 200, n_win: int = 1500) -> dict[str, pa.Table]:
    """Random instances (ids beyond 2^53), events with zero, NULL and changing requests and NULL
    priorities and machines, windows of 300 s, 150 s, zero and negative length and ending at
    2^63-1, NULL usages and reservations."""
    rng = np.random.default_rng(seed)
    inst = list(
        dict.fromkeys(
            (int(c), int(i), int(m))
            for c, i, m in zip(
                rng.choice([3, 2**40 + 1, 2**62 + 9], n_inst),
                rng.integers(0, 25, n_inst),
                rng.choice([5, 6, 2**53 + 1], n_inst),
                strict=True,
            )
        )
    )
    ev: dict[str, list[Any]] = defaultdict(list)

    def req() -> float | None:
        return None if rng.random() < 0.1 else float(np.float32(rng.choice([0.0, rng.uniform(0.01, 0.5)])))

    for _ in range(n_ev):
        c, i, m = inst[rng.integers(len(inst))]
        for k, v in (
            ("time", int(rng.integers(0, 40)) * 300 * S),
            ("type", int(rng.choice([0, 3, 9, 10]))),
            ("collection_id", c),
            ("instance_index", i),
            ("machine_id", None if rng.random() < 0.05 else m),
            ("priority", None if rng.random() < 0.05 else int(rng.choice([0, 103, 117, 150, 400]))),
            ("req_cpu", req()),
            ("req_mem", req()),
        ):
            ev[k].append(v)
    us: dict[str, list[Any]] = defaultdict(list)
    for _ in range(n_win):
        c, i, m = inst[rng.integers(len(inst))]
        start = int(rng.integers(0, 45)) * 300 * S
        end = AFTER if rng.random() < 0.02 else start + int(rng.choice([300, 300, 300, 150, 0, -10])) * S
        for k, v in (
            ("start_time", start),
            ("end_time", end),
            ("collection_id", c),
            ("instance_index", i),
            ("machine_id", m),
        ):
            us[k].append(v)
        for col in ("avg_cpu", "max_cpu", "avg_mem", "max_mem", "assigned_mem"):
            us[col].append(None if rng.random() < 0.04 else float(np.float32(rng.uniform(0, 0.6))))
    return {"instance_events": table("instance_events", dict(ev)), "instance_usage": table("instance_usage", dict(us))}


def _band(code: int, names: tuple[str, ...]) -> str:
    if code < 0:
        return "unknown"
    return "prod" if code >= names.index("prod") else "non-prod"


def replay(tables: dict[str, pa.Table], tm_name: str) -> dict[tuple[int, int], dict[str, Any]]:
    """Per task: its band and, per measure, ``(state, value)`` (state ``no_limit``, ``unknown`` or
    ``defined``), by a loop over every window's instance events."""
    tm = tier_map(tm_name)
    evs = tables["instance_events"].to_pylist()
    top: dict[tuple, int] = {}  # (c, i, m) -> highest priority
    by_inst: dict[tuple, list[tuple[int, int, dict[str, Any]]]] = defaultdict(list)
    for k, e in enumerate(evs):
        by_inst[(e["collection_id"], e["instance_index"])].append((e["time"], k, e))
        if e["machine_id"] is not None and e["priority"] is not None:
            key = (e["collection_id"], e["instance_index"], e["machine_id"])
            top[key] = max(top.get(key, e["priority"]), e["priority"])
    for v in by_inst.values():
        v.sort(key=lambda x: (x[0], x[1]))
    acc: dict[tuple, dict[str, Any]] = {}
    for w in tables["instance_usage"].to_pylist():
        task = (w["collection_id"], w["instance_index"])
        a = acc.setdefault(
            task, {"tier": -1, **{m: {"lim": 0, "n": 0, "w": 0.0, "s": 0.0, "pk": None} for m in MEASURES}}
        )
        p = top.get((*task, w["machine_id"]))
        if p is not None and p >= 0:
            a["tier"] = max(a["tier"], max(k for k, lo in enumerate(tm.bounds) if p >= lo))
        dur = w["end_time"] - w["start_time"]
        weight = dur / S if dur > 0 and w["end_time"] != AFTER else 0.0
        for m, (col, lim_col, _) in MEASURES.items():
            lim = None
            for t, _, e in by_inst.get(task, []):
                if t <= w["start_time"] and e[lim_col] is not None and e[lim_col] > 0:
                    lim = e[lim_col]
            if lim is None:
                continue
            g = a[m]
            g["lim"] += 1
            u = w[col]
            if u is None or not math.isfinite(u):
                continue
            r = u / lim
            g["n"] += 1
            g["w"] += weight
            g["s"] += weight * r
            g["pk"] = r if g["pk"] is None else max(g["pk"], r)
    out = {}
    for task, a in acc.items():
        vals = {}
        for m, (_, _, kind) in MEASURES.items():
            g = a[m]
            if not g["lim"]:
                vals[m] = ("no_limit", None)
            elif kind == "mean":
                vals[m] = ("defined", g["s"] / g["w"]) if g["w"] > 0 else ("unknown", None)
            else:
                vals[m] = ("defined", g["pk"]) if g["n"] else ("unknown", None)
        out[task] = {"band": _band(a["tier"], tm.names), **vals}
    return out


def load(ds: Path) -> dict[str, pa.Table]:
    """A dataset's usage and events, read by pyarrow from the files its manifest lists, in order."""
    import pyarrow.parquet as pq

    man = json.loads((ds / "manifest.json").read_text())
    return {
        t: pa.concat_tables(
            [
                SCHEMAS[t].empty_table(),
                *(pq.read_table(ds / f).cast(SCHEMAS[t]) for f in man["tables"].get(t, {}).get("files", [])),
            ]
        )
        for t in ("instance_usage", "instance_events")
    }


def duckdb_tasks(ds: Path, tm_name: str) -> dict[tuple[int, int], dict[str, Any]]:
    """:func:`replay`'s values by DuckDB SQL over the dataset's tables (:func:`load`): per window the
    latest event with a positive request at or before its start (of events at one microsecond, the
    last row) by ASOF JOIN, its tier from MAX(priority) of its (collection, instance, machine), then
    per task a GROUP BY."""
    duckdb = pytest.importorskip("duckdb")
    tm = tier_map(tm_name)
    tier_case = (
        "CASE "
        + " ".join(f"WHEN p >= {lo} THEN {k}" for k, lo in reversed(list(enumerate(tm.bounds))))
        + " ELSE -1 END"
    )
    con = duckdb.connect()
    tables = load(ds)
    events = tables["instance_events"]
    con.register("ev", events.append_column("rn", pa.array(np.arange(events.num_rows))))  # rn: the row order
    con.register("u", tables["instance_usage"])
    lims = []
    for r in ("cpu", "mem"):
        con.execute(f"""CREATE TABLE ev_{r} AS SELECT collection_id, instance_index, time, CAST(req_{r} AS DOUBLE) AS lim
                        FROM ev WHERE req_{r} > 0
                        QUALIFY row_number() OVER (PARTITION BY collection_id, instance_index, time ORDER BY rn DESC) = 1""")
        lims.append(f"""ASOF LEFT JOIN ev_{r} ON u.collection_id = ev_{r}.collection_id
                        AND u.instance_index = ev_{r}.instance_index AND u.start_time >= ev_{r}.time""")
    con.execute(f"""CREATE TABLE tiers AS SELECT collection_id, instance_index, machine_id, {tier_case} AS tier
                    FROM (SELECT collection_id, instance_index, machine_id, MAX(priority) AS p FROM ev
                          WHERE machine_id IS NOT NULL AND priority IS NOT NULL GROUP BY ALL)""")
    con.execute(f"""CREATE TABLE w AS SELECT u.collection_id AS c, u.instance_index AS i,
                      COALESCE(tiers.tier, -1) AS tier, ev_cpu.lim AS lim_cpu, ev_mem.lim AS lim_mem,
                      CASE WHEN u.end_time > u.start_time AND u.end_time <> {AFTER}
                           THEN (u.end_time - u.start_time) / 1e6 ELSE 0.0 END AS wt,
                      CAST(avg_cpu AS DOUBLE) AS avg_cpu, CAST(max_cpu AS DOUBLE) AS max_cpu,
                      CAST(avg_mem AS DOUBLE) AS avg_mem, CAST(max_mem AS DOUBLE) AS max_mem,
                      CAST(assigned_mem AS DOUBLE) AS assigned_mem
                    FROM u {lims[0]} {lims[1]}
                    LEFT JOIN tiers ON u.collection_id = tiers.collection_id AND u.instance_index = tiers.instance_index
                                   AND u.machine_id = tiers.machine_id""")
    sel = ["c", "i", "MAX(tier) AS tier"]
    for m, (col, lim_col, kind) in MEASURES.items():
        lim = "lim_" + lim_col[4:]
        ok = f"{lim} IS NOT NULL AND isfinite({col})"
        sel.append(f"COUNT({lim}) AS {m}_lim")
        if kind == "mean":
            sel.append(f"SUM(wt * {col} / {lim}) FILTER (WHERE {ok}) / NULLIF(SUM(wt) FILTER (WHERE {ok}), 0) AS {m}")
        else:
            sel.append(f"MAX({col} / {lim}) FILTER (WHERE {ok}) AS {m}")
    rows = con.execute(f"SELECT {', '.join(sel)} FROM w GROUP BY c, i").fetchall()
    names = ["c", "i", "tier", *(f"{m}{s}" for m in MEASURES for s in ("_lim", ""))]
    out = {}
    for row in rows:
        d = dict(zip(names, row, strict=True))
        vals = {
            m: ("no_limit", None) if not d[f"{m}_lim"] else ("unknown", None) if d[m] is None else ("defined", d[m])
            for m in MEASURES
        }
        out[(d["c"], d["i"])] = {"band": _band(d["tier"], tm.names), **vals}
    return out


def summarize(tasks: dict[tuple[int, int], dict[str, Any]]) -> tuple[dict, dict]:
    """The task_summary rows ((band, measure) -> dict) and task_hist counts ((band, measure, bin)
    -> tasks) of per-task values, by plain Python (bisect into the log bins, inverted-CDF quantiles)."""
    summary: dict = {}
    hist: dict = defaultdict(int)
    for band in ("prod", "non-prod", "unknown", "all"):
        group = [t for t in tasks.values() if band in ("all", t["band"])]
        if not group:
            continue
        for m in MEASURES:
            states = [t[m][0] for t in group]
            xs = [t[m][1] for t in group if t[m][0] == "defined"]
            row = {
                "tasks": len(group),
                "no_limit": states.count("no_limit"),
                "unknown": states.count("unknown"),
                "defined": len(xs),
                "above_limit": sum(x > 1 for x in xs),
                "at_most_half": sum(x <= 0.5 for x in xs),
                "mean_ratio": sum(xs) / len(xs) if xs else None,
            }
            for q in (10, 50, 90, 99):
                row[f"p{q}_ratio"] = (
                    LO[bisect.bisect_right(EDGES, sorted(xs)[math.ceil(q * len(xs) / 100) - 1])] if xs else None
                )
            summary[(band, m)] = row
            for x in xs:
                hist[(band, m, bisect.bisect_right(EDGES, x))] += 1
    return summary, dict(hist)


def check(res: dict[str, Any], tasks: dict[tuple[int, int], dict[str, Any]]) -> None:
    want, want_hist = summarize(tasks)
    got = {(r["band"], r["measure"]): r for r in res["task_summary"].to_dict("records")}
    assert set(got) == set(want)
    for key, w in want.items():
        g = got[key]
        for c in ("tasks", "no_limit", "unknown", "defined", "above_limit", "at_most_half"):
            assert g[c] == w[c], (key, c)
        for c in ("mean_ratio", "p10_ratio", "p50_ratio", "p90_ratio", "p99_ratio"):
            if w[c] is None:
                assert np.isnan(g[c]), (key, c)  # missing is NULL, never 0
            elif c == "mean_ratio":
                assert g[c] == pytest.approx(w[c], rel=1e-9), key
            else:
                assert g[c] == w[c], (key, c)
    assert {(r.band, r.measure, r.bin): r.tasks for r in res["task_hist"].itertuples()} == want_hist
    assert int(res["info"]["tasks"].iloc[0]) == len(tasks)


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), tm_name=st.sampled_from(["notebook", "v3-doc"]))
def test_matches_the_python_replay(seed, tm_name):
    """Every count, bin and quantile bin of both tables exact, means to 1e-9, on random cells
    (v3-doc: priority 400 is its monitoring tier, prod as Borg counts it)."""
    tables = cell(seed)
    res = run(TableSource(tables), UsageVsRequest(tier_map=tm_name), partitions=3)["usage-vs-request"]
    check(res, replay(tables, tm_name))


def test_matches_duckdb_on_random_cells(tmp_path):
    """DuckDB's per-task values (ASOF JOIN, GROUP BY) give the same tables; the two references agree."""
    for seed in (1, 2):
        tables = cell(seed, n_inst=80, n_ev=500, n_win=4000)
        ds = write_dataset(tmp_path / f"ds{seed}", tables, files=2, row_group_size=900)
        res = run(Dataset(ds), UsageVsRequest(tier_map="notebook"), partitions=3)["usage-vs-request"]
        ref = duckdb_tasks(ds, "notebook")
        py = replay(tables, "notebook")
        assert set(ref) == set(py)
        for k in py:
            assert py[k]["band"] == ref[k]["band"]
            for m in MEASURES:
                assert py[k][m][0] == ref[k][m][0], (k, m)
                if py[k][m][1] is not None:
                    assert py[k][m][1] == pytest.approx(ref[k][m][1], rel=1e-9), (k, m)
        check(res, ref)


def test_a_worked_task():
    """Limit 0.2 from 0 s, 0.4 from 900 s; windows [300, 900) CPU 0.1 and [900, 1050) CPU 0.5:
    ratios 0.5 over 600 s and 1.25 over 150 s, the task's mean (0.5 x 600 + 1.25 x 150) / 750 = 0.65
    and peak (max_cpu 0.6 / 0.4) 1.5; priority 200 (notebook: prod)."""
    ev = table(
        "instance_events",
        {
            "time": [0, 900 * S],
            "type": [0, 10],
            "collection_id": [7] * 2,
            "instance_index": [1] * 2,
            "machine_id": [5] * 2,
            "priority": [200] * 2,
            "req_cpu": [0.2, 0.4],
            "req_mem": [0.5, 0.5],
        },
    )
    us = table(
        "instance_usage",
        {
            "start_time": [300 * S, 900 * S],
            "end_time": [900 * S, 1050 * S],
            "collection_id": [7] * 2,
            "instance_index": [1] * 2,
            "machine_id": [5] * 2,
            "avg_cpu": [0.1, 0.5],
            "max_cpu": [0.2, 0.6],
            "avg_mem": [0.1, 0.1],
            "max_mem": [0.1, 0.1],
            "assigned_mem": [0.25, None],
        },
    )
    res = run(TableSource({"instance_events": ev, "instance_usage": us}), UsageVsRequest(tier_map="notebook"))
    s = res["usage-vs-request"]["task_summary"].set_index(["band", "measure"])
    assert s.loc[("prod", "cpu_mean"), "mean_ratio"] == pytest.approx(0.65)
    assert s.loc[("prod", "cpu_peak"), "mean_ratio"] == pytest.approx(1.5)
    assert s.loc[("prod", "mem_reservation"), "mean_ratio"] == pytest.approx(0.5)  # the NULL window left out
    assert ("non-prod", "cpu_mean") not in s.index
    assert res["usage-vs-request"]["info"]["reservation"].iloc[0] == "assigned_mem"


def test_without_reservations_says_so():
    tables = cell(5)
    us = tables["instance_usage"]
    us = us.set_column(us.schema.get_field_index("assigned_mem"), "assigned_mem", pa.nulls(us.num_rows, pa.float32()))
    res = run(TableSource({**tables, "instance_usage": us}), UsageVsRequest())["usage-vs-request"]
    info = res["info"].iloc[0]
    assert info["reservation_windows"] == 0 and info["reservation"].startswith("none")
    r = res["task_summary"].set_index(["band", "measure"]).loc[("all", "mem_reservation")]
    assert r["defined"] == 0 and r["unknown"] > 0 and np.isnan(r["p50_ratio"])


def test_synthetic_cell_against_duckdb(tmp_path):
    """A synthetic cell (gpuclust synth, bucketed layout): DuckDB's per-task tables are
    gpuclust's; the per-task median CPU usage / limit is above the per-window one (the many
    short-lived non-prod tasks, with higher ratios, count once each, the long-lived prod tasks'
    many windows once per task)."""
    from gpuclust.synth import SynthConfig, synthesize

    synthesize(SynthConfig(machines=30, hours=3, seed=4), tmp_path / "raw", dataset=tmp_path / "ds", progress=None)
    res = run(Dataset(tmp_path / "ds"), UsageVsRequest(tier_map="notebook"), partitions="auto")["usage-vs-request"]
    check(res, duckdb_tasks(tmp_path / "ds", "notebook"))
    t = res["task_summary"].set_index(["band", "measure"])
    assert t.loc[("prod", "cpu_mean"), "defined"] > 0 and t.loc[("non-prod", "cpu_mean"), "defined"] > 0
    w = res["summary"].set_index(["tier", "measure"])
    assert t.loc[("all", "cpu_mean"), "p50_ratio"] > w.loc[("all", "cpu_avg"), "p50_ratio"]
    assert t.loc[("prod", "cpu_mean"), "p50_ratio"] < t.loc[("non-prod", "cpu_mean"), "p50_ratio"]


def test_real_2011_parts(real_2011, tmp_path):
    """The real 2011 parts (task_events, job_events, machine_events; no task_usage in them): alone,
    no windows and empty per-task tables with their columns; with usage windows planted on 300 of
    their real instances (300 s windows from each instance's first event, CPU and memory at random
    fractions of its real requests), the per-task tables match DuckDB's over the real request
    timelines, priorities and v2 tier map (the parts ingested once per run: ``real_2011``)."""
    ds = Dataset(real_2011)
    alone = run(ds, UsageVsRequest())["usage-vs-request"]
    assert alone["info"]["tier_map"].iloc[0] == "v2" and int(alone["info"]["tasks"].iloc[0]) == 0
    assert alone["task_summary"].empty and alone["task_hist"].empty and "p50_ratio" in alone["task_summary"]
    # usage planted on real instances
    ev = ds.read("instance_events", ["time", "collection_id", "instance_index", "machine_id", "req_cpu", "req_mem"])
    cols = {c: ev.column(c).to_numpy(zero_copy_only=False) for c in ev.column_names}
    rng = np.random.default_rng(0)
    keys = sorted(set(zip(cols["collection_id"].tolist(), cols["instance_index"].tolist(), strict=True)))
    pick = [keys[k] for k in rng.choice(len(keys), 300, replace=False)]
    first = {}
    for t, c, i, m in zip(
        cols["time"].tolist(),
        cols["collection_id"].tolist(),
        cols["instance_index"].tolist(),
        cols["machine_id"].tolist(),
        strict=True,
    ):
        if (c, i) not in first or t < first[(c, i)][0]:
            first[(c, i)] = (t, m)
    us: dict[str, list[Any]] = defaultdict(list)
    for c, i in pick:
        t0, m = first[(c, i)]
        for k in range(int(rng.integers(1, 30))):
            s = t0 + (k - 2) * 300 * S  # two windows before the first event: no limit yet
            for col, v in (
                ("start_time", s),
                ("end_time", s + int(rng.choice([300, 300, 60])) * S),
                ("collection_id", c),
                ("instance_index", i),
                ("machine_id", 0 if m is None or m < 0 else m),
            ):
                us[col].append(v)
            for col in ("avg_cpu", "max_cpu", "avg_mem", "max_mem", "assigned_mem"):
                us[col].append(float(np.float32(rng.uniform(0, 0.05))))
    planted = write_dataset(
        tmp_path / "planted",
        {
            "instance_events": load(real_2011)["instance_events"],
            "instance_usage": table("instance_usage", dict(us)),
        },
        files=3,
        tier_map="v2",
        trace_version="v2",
    )
    res = run(Dataset(planted), UsageVsRequest(), partitions=3)["usage-vs-request"]
    check(res, duckdb_tasks(planted, "v2"))
    s = res["task_summary"].set_index(["band", "measure"])
    assert s.loc[("all", "cpu_mean"), "defined"] > 100


def _tasks_cell(n_tasks: int, seed: int = 0) -> dict[str, pa.Table]:
    """``n_tasks`` instances, each with one submit event (its priority and limits) and four 300 s
    windows, some NULL usages and limits: the per-task partial has ``n_tasks`` rows."""
    rng = np.random.default_rng(seed)
    cid = 10**6 + np.arange(n_tasks, dtype=np.int64) // 20
    idx = (np.arange(n_tasks) % 20).astype(np.int32)
    mach = rng.integers(1, 50, n_tasks)
    ev = table(
        "instance_events",
        {
            "time": np.zeros(n_tasks, np.int64),
            "type": np.zeros(n_tasks, np.int8),
            "collection_id": cid,
            "instance_index": idx,
            "machine_id": mach,
            "priority": rng.choice([0, 103, 117, 150, 400], n_tasks),
            "req_cpu": [None if rng.random() < 0.05 else float(x) for x in rng.uniform(0.01, 0.5, n_tasks)],
            "req_mem": [None if rng.random() < 0.05 else float(x) for x in rng.uniform(0.01, 0.5, n_tasks)],
        },
    )
    w = np.repeat(np.arange(n_tasks), 4)
    start = (np.tile(np.arange(4), n_tasks) * 300 + 60) * S
    us = {"start_time": start, "end_time": start + 300 * S, "collection_id": cid[w], "instance_index": idx[w]}
    us["machine_id"] = mach[w]
    for col in ("avg_cpu", "max_cpu", "avg_mem", "max_mem", "assigned_mem"):
        us[col] = [None if rng.random() < 0.03 else float(x) for x in rng.uniform(0, 0.6, w.size)]
    return {"instance_events": ev, "instance_usage": table("instance_usage", us)}


def test_a_gpu_run_copies_out_its_tables_not_its_tasks(monkeypatch):
    """On a device (the device-shaped backend, partials marked as the gpu's), the per-task partial
    stays where it was computed and is reduced there: a warm run's device-to-host bytes follow its
    result tables (plus the per-window counts of the named tiers), not its tasks, which grow 8x
    here; syncs and launches do not grow; the results are the cpu's."""
    from device_backend import DEVICE, counting_device_work, mark_partials_gpu, resolve_gpu_to_device, result_bytes
    from strategies import assert_results_same

    import gpuclust

    resolve_gpu_to_device(monkeypatch)
    mark_partials_gpu(monkeypatch)
    seen = {}
    for n_tasks in (1500, 12000):
        tables = _tasks_cell(n_tasks)
        study = gpuclust.open(TableSource(tables), backend=DEVICE, workers=1)
        study.run(UsageVsRequest())  # cold: columns loaded, contexts staged
        with counting_device_work() as w:
            got = study.run(UsageVsRequest())
        study.close()
        res = got["usage-vs-request"]
        assert int(res["info"]["tasks"].iloc[0]) == n_tasks
        assert_results_same(got, {"usage-vs-request": run(TableSource(tables), UsageVsRequest())["usage-vs-request"]})
        seen[n_tasks] = {**w, "result": result_bytes(res)}
    small, large = seen[1500], seen[12000]
    dense = 5 * 4 * (len(RATIO_EDGES) + 1) * 8  # the per-window histograms of the named tiers
    for c in (small, large):
        assert c["d2h_bytes"] <= c["result"] + dense + (64 << 10), c
    growth = max(1.0, large["result"] / small["result"])
    assert large["d2h_bytes"] <= 1.2 * growth * small["d2h_bytes"] + (64 << 10), (small, large)
    for kind in ("ops", "kernels", "syncs"):
        assert large.get(kind, 0) == small.get(kind, 0), (kind, small, large)
