"""``data-quality`` against a slow pure-Python reference (tests/references/data_quality.py) and DuckDB
SQL over the canonical Parquet, hand-worked instances, events-only datasets, the layouts and
schedulers, and the real 2011 / 2019 files."""

from __future__ import annotations

import bisect
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from references.data_quality import reference
from strategies import assert_results_same, cell, examples, random_cell, table, write_dataset

from gpuclust.analyses.data_quality import RATIO_EDGES, DataQuality
from gpuclust.dataset import Dataset
from gpuclust.engine import TableSource, run
from gpuclust.optimize import optimize
from gpuclust.schema import CPU_PERCENTILE_COLUMNS, TIME_AFTER_TRACE

REAL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "real"
LEVELS = sorted(int(c[5:]) for c in CPU_PERCENTILE_COLUMNS)
W = 300_000_000


def check(res: dict, tables: dict, short_s: int = 300, row_order: bool = False) -> None:
    ref = reference(tables, short_s, row_order)
    got = {(r.table, r.check): (r.count, r.unit, r.of) for r in res["checks"].itertuples()}
    assert got == ref["checks"]
    for r in res["checks"].itertuples():
        assert (np.isnan(r.share) and r.of == 0) or r.share == r.count / r.of
    nulls = {(r.table, r.column): r.nulls for r in res["columns"].itertuples()}
    assert nulls == ref["nulls"]
    codes = {(r.table, r.column, r.code): r.rows for r in res["codes"].itertuples()}
    assert codes == ref["codes"]
    edges = [float(x) for x in RATIO_EDGES]
    bins: dict[int, int] = {}
    for x in ref["ratio"]:
        b = bisect.bisect_right(edges, x)
        bins[b] = bins.get(b, 0) + 1
    assert dict(zip(res["max_over_p100"]["bin"], res["max_over_p100"]["windows"], strict=True)) == bins


percentile = st.one_of(st.none(), st.sampled_from([0.0, 0.1, 0.5, 1.0]), st.floats(0, 2, width=32))


@st.composite
def quality_cell(draw) -> dict:
    """strategies.cell with what the checks look at: CPU percentile vectors (monotone, shuffled,
    partly NULL), max_cpu, CPI / MAI, every event type and missing_type, the time sentinels."""
    t = draw(cell(max_windows=25))
    us = t["instance_usage"].to_pylist()
    for r in us:
        kind = draw(st.sampled_from(["null", "sorted", "sorted", "any", "partly"]))
        vals = sorted(draw(st.lists(st.floats(0, 2, width=32), min_size=20, max_size=20)))
        if kind == "null":
            vals = [None] * 20
        elif kind == "any":
            vals = draw(st.permutations(vals))
        elif kind == "partly":
            vals = [draw(st.one_of(st.none(), st.just(v))) for v in vals]
        for q, v in zip(LEVELS, vals, strict=True):
            r[f"cpu_p{q}"] = v
        r["max_cpu"] = draw(
            st.one_of(st.none(), st.just(vals[-1]), percentile, st.just(None if vals[-1] is None else vals[-1] * 3))
        )
        r["cpi"] = draw(st.sampled_from([None, 0.0, 1.5, 150.0, -1.0, float("inf")]))
        r["mai"] = draw(st.sampled_from([None, 0.01, 2.0, -0.1]))
        r["end_time"] = draw(st.sampled_from([r["end_time"]] * 6 + [TIME_AFTER_TRACE, 0]))
        r["start_time"] = draw(st.sampled_from([r["start_time"]] * 6 + [TIME_AFTER_TRACE]))
        r["machine_id"] = draw(st.sampled_from([r["machine_id"]] * 4 + [0, -1]))
    ev = t["instance_events"].to_pylist()
    for r in ev:
        r["type"] = draw(st.integers(0, 10))
        r["missing_type"] = draw(st.one_of(st.none(), st.integers(0, 5)))
        r["time"] = draw(st.sampled_from([r["time"]] * 4 + [0, TIME_AFTER_TRACE]))
        r["machine_id"] = draw(st.sampled_from([r["machine_id"]] * 4 + [-1]))
    me = t["machine_events"].to_pylist()
    for r in me:
        r["missing_data_reason"] = draw(st.sampled_from([None, 0, 1]))
    co = t["collection_events"].to_pylist()
    for r, e in zip(co, ev, strict=True):
        r["type"], r["time"], r["missing_type"] = e["type"], e["time"], e["missing_type"]

    def tab(name, rows, like):
        return table(name, {c: [r[c] for r in rows] for c in like.column_names}) if rows else like

    return {
        "instance_usage": tab("instance_usage", us, t["instance_usage"]),
        "instance_events": tab("instance_events", ev, t["instance_events"]),
        "machine_events": tab("machine_events", me, t["machine_events"]),
        "collection_events": tab("collection_events", co, t["collection_events"]),
    }


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables=quality_cell(), short=st.sampled_from([300, 60]), row_order=st.booleans())
def test_matches_the_reference(tables, short, row_order):
    res = run(TableSource(tables), DataQuality(short_window_s=short, row_order=row_order))["data-quality"]
    check(res, tables, short, row_order)


@pytest.mark.parametrize("seed", [1, 2])
def test_random_cells(seed):
    tables = random_cell(seed, n_windows=3000)
    check(run(TableSource(tables), DataQuality())["data-quality"], tables)


def test_a_worked_instance():
    """Instance (9, 0): SUBMIT, SCHEDULE at 100 s, FINISH at 1000 s (in the rows: FINISH before SCHEDULE,
    time going backwards); windows [400, 700), [700, 1000) (fine),
    [900, 1010) (runs past the end), [1000, 1300) (starts at the end), [1400, 1700) (300 s after
    it), the last one with a non-monotone percentile vector and p100 < max.  Instance (9, 1) has
    events only (KILL then UPDATE_RUNNING at the same time: not ended); (8, 0) usage only."""
    s = [400, 700, 900, 1000, 1400, 50]
    e = [700, 1000, 1010, 1300, 1700, 350]
    us = {
        "start_time": [x * 10**6 for x in s],
        "end_time": [x * 10**6 for x in e],
        "collection_id": [9] * 5 + [8],
        "instance_index": [0] * 6,
        "machine_id": [5] * 6,
        "max_cpu": [None] * 4 + [0.9, None],
        **{f"cpu_p{q}": [None] * 4 + [0.45 if q == 50 else q / 200, None] for q in LEVELS},
    }
    ev = {
        "time": [0, 10**9, 10**8, 5 * 10**8, 5 * 10**8],
        "type": [0, 6, 3, 7, 10],
        "collection_id": [9, 9, 9, 9, 9],
        "instance_index": [0, 0, 0, 1, 1],
        "machine_id": [5] * 5,
    }
    t = {"instance_usage": table("instance_usage", us), "instance_events": table("instance_events", ev)}
    res = run(TableSource(t), DataQuality(row_order=True))["data-quality"]
    ch = {(r.table, r.check): r.count for r in res["checks"].itertuples()}
    assert ch["instance_usage", "after_end_rows"] == 2 and ch["instance_usage", "after_end_300s_rows"] == 1
    assert ch["instance_usage", "past_end_rows"] == 1 and ch["instance_usage", "after_end_instances"] == 1
    assert ch["instance_usage", "no_events_rows"] == 1 and ch["instance_usage", "no_events_instances"] == 1
    assert ch["instance_usage", "percentiles_non_monotone"] == 1 and ch["instance_usage", "p100_below_max"] == 1
    assert ch["instance_usage", "short_windows"] == 1  # [900, 1010): 110 s
    assert ch["instance_events", "instances_without_usage"] == 1
    assert ch["instance_events", "time_ties"] == 1 and ch["instance_events", "time_backwards"] == 1
    # (9, 1): UPDATE_RUNNING after KILL (same time, row order) is not in the v3 diagram
    assert ch["instance_events", "out_of_order"] == 1 and ch["instance_events", "out_of_order_instances"] == 1
    assert ch["instance_events", "time_zero"] == 1
    assert "collection_events" not in set(res["checks"]["table"])  # absent table: no rows
    check(res, t, row_order=True)
    assert "time_backwards" not in set(run(TableSource(t), DataQuality())["data-quality"]["checks"]["check"])


def test_instances_on_dedicated_machines_are_apart_from_the_missing_usage(tmp_path):
    """TRACE_NOTES: instances on dedicated machines (machine_id -1) have events but no usage rows.
    (7, 0) is scheduled on -1 and has none: expected, counted apart; (7, 1) on machine 5 has none:
    missing usage; (7, 2) on 5 has a window; (7, 3), once on -1, has one too (counted as matched)."""
    us = {
        "start_time": [10**9, 2 * 10**9],
        "end_time": [13 * 10**8, 23 * 10**8],
        "collection_id": [7, 7],
        "instance_index": [2, 3],
        "machine_id": [5, -1],
    }
    ev = {
        "time": [10**8] * 5,
        "type": [3] * 5,
        "collection_id": [7] * 5,
        "instance_index": [0, 1, 2, 3, 3],
        "machine_id": [-1, 5, 5, 5, -1],
    }
    t = {"instance_usage": table("instance_usage", us), "instance_events": table("instance_events", ev)}
    res = run(TableSource(t), DataQuality())["data-quality"]
    got = {r.check: (r.count, r.of) for r in res["checks"].itertuples() if r.table == "instance_events"}
    assert got["instances_without_usage"] == (1, 2)  # (7, 1) of (7, 1), (7, 2)
    assert got["dedicated_instances_without_usage"] == (1, 2)  # (7, 0) of (7, 0), (7, 3)
    check(res, t)
    # the gpu's code path on the device-shaped backend (its refusals of host operands): the same
    from device_backend import DEVICE

    assert_results_same(run(TableSource(t), DataQuality(), backend=DEVICE), {"data-quality": res})
    # bound in the partition tasks of a bucketed dataset (each counts its own instances): the same
    ds = write_dataset(tmp_path / "flat", t)
    optimize(ds, buckets=3, out=tmp_path / "opt", progress=False)
    res_b = run(Dataset(tmp_path / "opt"), DataQuality(), partitions=3)["data-quality"]
    got_b = {r.check: (r.count, r.of) for r in res_b["checks"].itertuples() if r.table == "instance_events"}
    assert got_b["instances_without_usage"] == (1, 2) and got_b["dedicated_instances_without_usage"] == (1, 2)


def test_events_only_dataset_and_cli(tmp_path):
    """A dataset without instance_usage (as the real 2011 events): the events and machine profiles,
    no usage rows, no "instances without usage" (not measurable); the CLI runs it."""
    tables = random_cell(3, n_windows=500)
    del tables["instance_usage"]
    res = run(TableSource(tables), DataQuality())["data-quality"]
    assert "instance_usage" not in set(res["checks"]["table"])
    assert "instances_without_usage" not in set(res["checks"]["check"])
    check(res, tables)
    ds = write_dataset(tmp_path / "ds", tables)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuclust.cli",
            "analyze",
            str(ds),
            "data-quality",
            "--out",
            str(tmp_path / "out"),
            "--no-plots",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "instance_events" in r.stdout and "out_of_order" in r.stdout
    assert (tmp_path / "out" / "data-quality").is_dir()


def test_bucketed_equals_flat_and_schedulers(tmp_path):
    """Flat and `gpuclust optimize`d layouts, local / threads / sync schedulers, several
    partitions: the same tables.  With ``row_order``, time_backwards is the exception: optimize
    sorts each bucket by time, so bucketed events and machine tables have none."""
    tables = random_cell(5, n_windows=4000)
    flat = write_dataset(tmp_path / "flat", tables, files=3, row_group_size=500)
    a = DataQuality()
    r_flat = run(Dataset(flat), a, partitions="auto")["data-quality"]
    check(r_flat, tables)
    optimize(flat, buckets=8, out=tmp_path / "opt", progress=False)  # (the command: tests/test_layout.py)

    for parts, scheduler in ((3, None), ("auto", None), (3, "threads"), (2, "sync")):
        r_opt = run(Dataset(tmp_path / "opt"), a, partitions=parts, workers=2, scheduler=scheduler)["data-quality"]
        assert_results_same({"dq": r_opt}, {"dq": r_flat})
    for scheduler in ("threads", "sync"):
        r_flat2 = run(Dataset(flat), a, partitions=3, scheduler=scheduler)["data-quality"]
        assert_results_same({"dq": r_flat2}, {"dq": r_flat})
    ro = DataQuality(row_order=True)
    check(run(Dataset(flat), ro)["data-quality"], tables, row_order=True)
    ch = run(Dataset(tmp_path / "opt"), ro, partitions=3)["data-quality"]["checks"]
    back = ch[ch["check"].str.startswith("time_backwards")]
    assert len(back) == 6 and (back.loc[back["table"] != "collection_events", "count"] == 0).all()


def test_duckdb_over_the_parquet(tmp_path):
    """NULLs per column, sentinels, window lengths, p100 vs max, usage without events, the final
    terminal event and ties: DuckDB SQL over the dataset's Parquet files."""
    duckdb = pytest.importorskip("duckdb")
    tables = random_cell(7, n_windows=3000)
    us = tables["instance_usage"].to_pylist()
    rng = np.random.default_rng(7)
    for r in us:
        v = sorted(rng.random(20).astype(np.float32).tolist())
        if rng.random() < 0.2:
            v[3], v[15] = v[15], v[3]
        for q, x in zip(LEVELS, v, strict=True):
            r[f"cpu_p{q}"] = x
        r["max_cpu"] = float(np.float32(v[-1] * rng.choice([0.5, 1.0, 3.0])))
    tables["instance_usage"] = table(
        "instance_usage", {c: [r[c] for r in us] for c in tables["instance_usage"].column_names}
    )
    ev = tables["instance_events"].to_pylist()
    for r in ev:
        r["type"] = int(rng.choice([0, 3, 5, 6, 7, 10]))
    tables["instance_events"] = table(
        "instance_events", {c: [r[c] for r in ev] for c in tables["instance_events"].column_names}
    )
    ds = write_dataset(tmp_path / "ds", tables, files=2)
    res = run(Dataset(ds), DataQuality(), partitions="auto")["data-quality"]
    got = {(r.table, r.check): r.count for r in res["checks"].itertuples()}
    con = duckdb.connect()
    u, e = f"read_parquet('{ds}/instance_usage/*.parquet')", f"read_parquet('{ds}/instance_events/*.parquet')"
    for col in tables["instance_usage"].column_names:
        n = con.execute(f"SELECT COUNT(*) FILTER (WHERE {col} IS NULL OR isnan({col}::DOUBLE)) FROM {u}").fetchone()[0]
        assert res["columns"].set_index(["table", "column"]).loc[("instance_usage", col), "nulls"] == n, col
    monotone = " AND ".join(f"cpu_p{a} <= cpu_p{b}" for a, b in zip(LEVELS, LEVELS[1:], strict=False))  # no NULLs here
    q = con.execute(f"""
        SELECT COUNT(*) FILTER (WHERE end_time - start_time >= 0 AND end_time - start_time < 300000000),
               COUNT(*) FILTER (WHERE end_time - start_time > 300000000),
               COUNT(*) FILTER (WHERE cpu_p100 < max_cpu), COUNT(*) FILTER (WHERE cpu_p100 > max_cpu),
               COUNT(*) FILTER (WHERE NOT ({monotone}))
        FROM {u}""").fetchone()
    assert (
        got["instance_usage", "short_windows"],
        got["instance_usage", "long_windows"],
        got["instance_usage", "p100_below_max"],
        got["instance_usage", "p100_above_max"],
        got["instance_usage", "percentiles_non_monotone"],
    ) == q
    q = con.execute(f"""
        WITH last AS (SELECT collection_id, instance_index, arg_max(type, time) AS type, max(time) AS time
                      FROM {e} GROUP BY ALL),
             k AS (SELECT DISTINCT collection_id, instance_index FROM {u})
        SELECT (SELECT COUNT(*) FROM {u} x ANTI JOIN last USING (collection_id, instance_index)),
               (SELECT COUNT(*) FROM k ANTI JOIN last USING (collection_id, instance_index)),
               (SELECT COUNT(*) FROM last ANTI JOIN k USING (collection_id, instance_index)),
               (SELECT COUNT(*) FROM {u} x JOIN last USING (collection_id, instance_index)
                WHERE last.type IN (4, 5, 6, 7, 8) AND x.start_time >= last.time)""").fetchone()
    # random_cell's event times are distinct per instance, so arg_max(type, time) is the last event
    assert (
        con.execute(f"SELECT COUNT(*) - COUNT(DISTINCT (collection_id, instance_index, time)) FROM {e}").fetchone()[0]
        == 0
    )
    assert (
        got["instance_usage", "no_events_rows"],
        got["instance_usage", "no_events_instances"],
        got["instance_events", "instances_without_usage"],
        got["instance_usage", "after_end_rows"],
    ) == q


def test_real_2011_events_and_2019_machines(real_2011, tmp_path):
    """The real 2011 task / job / machine events (first 5 of 500 parts) and the real 2019 cell-a
    machine_events shard: the figures of docs/analyses/data-quality.md, checked against the
    reference (and SOURCES.md: 32 rows of 2011 machine_events, 459 of 2019, lack capacity)."""
    from gpuclust.ingest import ingest

    ds = Dataset(real_2011)  # the 2011 parts, ingested once per run (tests/conftest.py), read-only
    res = run(ds, DataQuality(), partitions="auto")["data-quality"]
    tables = {t: ds.read(t) for t in ("instance_events", "collection_events", "machine_events")}
    check(res, tables)
    ch = {(r.table, r.check): r.count for r in res["checks"].itertuples()}
    assert ch["instance_events", "rows"] == 919_519 and ch["collection_events", "rows"] == 25_437
    assert ch["machine_events", "null_capacity_rows"] == 32
    assert (ch["instance_events", "out_of_order"], ch["collection_events", "out_of_order"]) == (
        21,
        0,
    )  # SUBMIT -> EVICT
    # the export's own row order (ingest's layout step would sort each bucket by time)
    rep = ingest(
        [REAL / "2019-cell-a" / "machine_events-000000000000.json.gz"],
        tmp_path / "v3",
        cell="a",
        progress=False,
        layout="flat",
    )
    assert rep.exit_status == 0, rep.summary()
    ds3 = Dataset(tmp_path / "v3")
    res3 = run(ds3, DataQuality(row_order=True))["data-quality"]
    check(res3, {"machine_events": ds3.read("machine_events")}, row_order=True)
    ch3 = {(r.table, r.check): r.count for r in res3["checks"].itertuples()}
    assert ch3["machine_events", "rows"] == 46_219 and ch3["machine_events", "null_capacity_rows"] == 459
    assert (ch3["machine_events", "out_of_order"], ch3["machine_events", "time_backwards"]) == (0, 9_791)


def test_the_graph_and_the_client_do_not_grow_with_the_data(tmp_path):
    """On a `gpuclust optimize`d dataset the terminal-event lookup is bound in each partition task
    (from that partition's events), so what the client ships (contexts and partition specs) stays
    the same size for 4x the instances and windows."""
    import pickle

    from gpuclust.engine.contexts import contexts, per_partition
    from gpuclust.engine.planning import plan_tables

    sizes = []
    for k, (inst, win) in enumerate(((300, 4000), (1200, 16000))):
        flat = write_dataset(tmp_path / f"flat{k}", random_cell(9, n_instances=inst, n_windows=win), files=2)
        optimize(flat, buckets=8, out=tmp_path / f"bk{k}", progress=False)
        ds = Dataset(tmp_path / f"bk{k}")
        ans = [DataQuality()]
        plans = plan_tables(ds, ans, 4)
        pp = per_partition(ds, ans, plans)
        assert pp == {0}  # bound per partition, not on the client
        ctxs = contexts(ans, ds, per_partition=pp, run_pass=lambda pre, ds=ds: run(ds, pre, partitions=4))
        assert len(ctxs[0].ctx.lookup) == 0  # the client's context holds no instance
        sizes.append(len(pickle.dumps(ctxs)) + len(pickle.dumps(plans)))
    assert sizes[1] <= 1.5 * sizes[0], sizes


def test_a_time_selection_joins_with_every_event():
    """With --from/--to the per-instance joins use every event of an instance (the side input is not
    cut): instances_without_usage counts the dataset's event instances with no window in the
    selection, never below zero."""
    tables = random_cell(4, n_windows=3000)
    res = run(TableSource(tables), DataQuality(), time_from="6h", time_to="12h")["data-quality"]
    ch = {(r.table, r.check): (r.count, r.of) for r in res["checks"].itertuples()}
    ev = tables["instance_events"].to_pylist()
    keys = {(r["collection_id"], r["instance_index"]) for r in ev}
    n, of = ch["instance_events", "instances_without_usage"]
    used = ch["instance_usage", "instances"][0] - ch["instance_usage", "no_events_instances"][0]
    assert of == len(keys) and n == of - used and 0 <= n < of
    assert ch["instance_usage", "rows"][0] < tables["instance_usage"].num_rows


def test_string_nulls_from_parquet_statistics(tmp_path):
    """NULLs of string / list columns: Parquet statistics on a dataset (the same counts as the
    in-memory table), not counted under a time selection."""
    tables = random_cell(6, n_windows=500)
    ds = Dataset(write_dataset(tmp_path / "ds", tables, files=2, row_group_size=100))
    strings = {
        ("collection_events", c)
        for c in ("user", "collection_name", "collection_logical_name", "start_after_collection_ids")
    } | {("machine_events", c) for c in ("switch_id", "platform_id")}
    mem = run(TableSource(tables), DataQuality())["data-quality"]["columns"].set_index(["table", "column"])["nulls"]
    got = run(ds, DataQuality())["data-quality"]["columns"].set_index(["table", "column"])["nulls"]
    for k in strings:
        assert got[k] == mem[k] == tables[k[0]].column(k[1]).null_count, k
    sel = run(ds, DataQuality(), time_from="1h")["data-quality"]["columns"].set_index(["table", "column"])["nulls"]
    assert strings <= set(sel.index) and all(sel[k] is pd.NA for k in strings)


@pytest.mark.parametrize("row_order", [False, True])
@pytest.mark.parametrize("seed", [1, 2])
def test_table_profiles_merge_laws(seed, row_order):
    """The prerequisite profiles (not registered, so not in the conformance checks): empty is an
    identity, merges are associative and commutative, and cuts between things do not matter."""
    import pyarrow.compute as pc

    from gpuclust.analyses._quality import CollectionEventsProfile, InstanceEventsProfile, MachineEventsProfile
    from gpuclust.backends import get_backend
    from gpuclust.engine.partition import column_to_numpy

    be = get_backend("cpu")
    tables = random_cell(seed, n_windows=200)
    rng = np.random.default_rng(seed)
    for a in (
        InstanceEventsProfile(row_order=row_order),
        CollectionEventsProfile(row_order=row_order),
        MachineEventsProfile(row_order=row_order),
    ):
        t = tables[a.table]
        t = t.take(pc.sort_indices(t, sort_keys=[(k, "ascending") for k in a.key_columns]))  # stable
        ctx = a.context(TableSource(tables))

        def part(x, a=a, ctx=ctx):
            return a.partial({c: column_to_numpy(x.column(c)) for c in a.columns}, ctx, be)

        keys = list(zip(*(t.column(k).to_pylist() for k in a.key_columns), strict=True))
        cuts = [k for k in range(1, len(keys)) if keys[k] != keys[k - 1]]
        c1, c2 = sorted(rng.choice(cuts, 2, replace=False))
        p1, p2, p3 = part(t.slice(0, c1)), part(t.slice(c1, c2 - c1)), part(t.slice(c2))
        whole = a.finalize(part(t), ctx)
        for merged in (
            a.kinds.merge(a.kinds.merge(p1, p2), p3),
            a.kinds.merge(p3, a.kinds.merge(p2, p1)),
            a.kinds.merge(a.empty(), a.kinds.merge(p1, a.kinds.merge(p2, p3))),
        ):
            assert_results_same({"p": a.finalize(merged, ctx)}, {"p": whole})
