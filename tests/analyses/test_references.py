"""Independent references: DuckDB SQL over the same Parquet files, for every number reported.

The notebook-mode SQL is Google's notebook query (clusterdata_analysis_colab) in DuckDB dialect,
with canonical column names; the exact-mode SQL expands each window over its hours with
generate_series.  Engine results are compared to 1e-12 relative.  Hours are time buckets of
3600 s from trace time 0 (docs/user/dataset.md, "Time buckets"), reported as ``bucket`` and
``bucket_start_us``; a group whose values are all NULL is NULL (SQL's SUM), never 0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import cell, examples, random_cell, write_dataset

from gpuclust.analyses import CellUsage, MachineShapes
from gpuclust.dataset import Dataset
from gpuclust.engine import run
from gpuclust.schema import TIER_MAPS


def _files(ds: Dataset, table: str) -> str:
    return "[" + ", ".join(f"'{f}'" for f in ds.files(table)) + "]"


def _case(tm_name: str, unknown: str | None) -> str:
    """CASE over priority for a tier map: the notebook's CASE ... ELSE <last tier> (unknown=None),
    or exact mode's variant where NULL / negative priorities are 'unknown'."""
    tm = TIER_MAPS[tm_name]
    parts = []
    if unknown:
        parts.append(f"WHEN e.priority IS NULL OR e.priority < {tm.bounds[0]} THEN '{unknown}'")
    for name, lo, hi in zip(tm.names[:-1], tm.bounds[:-1], tm.bounds[1:], strict=False):
        parts.append(f"WHEN e.priority BETWEEN {lo} AND {hi - 1} THEN '{name}'")
    return "CASE " + " ".join(parts) + f" ELSE '{tm.names[-1]}' END"


CAPACITY_SQL = """
SELECT SUM(cpu_cap) AS cpu_capacity, SUM(memory_cap) AS memory_capacity
FROM (SELECT machine_id, MAX(cap_cpu) AS cpu_cap, MAX(cap_mem) AS memory_cap
      FROM read_parquet({me}) GROUP BY 1)
"""

PRIORITY_SQL = """
SELECT collection_id, instance_index, machine_id, MAX(priority) AS priority
FROM read_parquet({ev})
WHERE (alloc_collection_id IS NULL OR alloc_collection_id = 0)
GROUP BY 1, 2, 3
"""


def notebook_sql(ds: Dataset, tm: str) -> pd.DataFrame:
    duckdb = pytest.importorskip("duckdb")
    q = f"""
    WITH cap AS ({CAPACITY_SQL.format(me=_files(ds, "machine_events"))}),
    e AS ({PRIORITY_SQL.format(ev=_files(ds, "instance_events"))}),
    u AS (
      SELECT start_time AS time, collection_id, instance_index, machine_id,
             avg_cpu AS cpu_usage, avg_mem AS memory_usage
      FROM read_parquet({_files(ds, "instance_usage")})
      WHERE (alloc_collection_id IS NULL OR alloc_collection_id = 0)
        AND (end_time - start_time) >= (5 * 60 * 1e6)
    ),
    j AS (
      SELECT u.time, {_case(tm, None)} AS tier, u.cpu_usage, u.memory_usage
      FROM u JOIN e ON u.collection_id = e.collection_id AND u.instance_index = e.instance_index
                   AND u.machine_id = e.machine_id
    )
    SELECT CAST(FLOOR(time / (1e6 * 60 * 60)) AS BIGINT) AS bucket, tier,
           SUM(cpu_usage) / (12 * NULLIF(ANY_VALUE(cap.cpu_capacity), 0)) AS cpu,
           SUM(memory_usage) / (12 * NULLIF(ANY_VALUE(cap.memory_capacity), 0)) AS mem,
           COUNT(*) AS windows
    FROM j, cap GROUP BY 1, 2
    """
    return duckdb.sql(q).df()


def exact_sql(ds: Dataset, tm: str) -> pd.DataFrame:
    duckdb = pytest.importorskip("duckdb")
    H = 3_600_000_000
    q = f"""
    WITH cap AS ({CAPACITY_SQL.format(me=_files(ds, "machine_events"))}),
    e AS ({PRIORITY_SQL.format(ev=_files(ds, "instance_events"))}),
    u AS (
      SELECT start_time AS s, end_time AS t, collection_id, instance_index, machine_id, avg_cpu, avg_mem
      FROM read_parquet({_files(ds, "instance_usage")})
      WHERE (alloc_collection_id IS NULL OR alloc_collection_id = 0) AND end_time <> 9223372036854775807
    ),
    j AS (
      SELECT u.*, {_case(tm, "unknown")} AS tier
      FROM u LEFT JOIN e ON u.collection_id = e.collection_id AND u.instance_index = e.instance_index
                        AND u.machine_id = e.machine_id
    ),
    x AS (
      SELECT j.*, g.h AS h FROM j,
        generate_series(j.s // {H}, GREATEST(j.s // {H}, (j.t - 1) // {H})) AS g(h)
    )
    SELECT h AS bucket, tier,
      SUM(avg_cpu * (GREATEST(0, LEAST(t, (h + 1) * {H}) - GREATEST(s, h * {H})) / 1e6))
        / (3600 * NULLIF(ANY_VALUE(cap.cpu_capacity), 0)) AS cpu,
      SUM(avg_mem * (GREATEST(0, LEAST(t, (h + 1) * {H}) - GREATEST(s, h * {H})) / 1e6))
        / (3600 * NULLIF(ANY_VALUE(cap.memory_capacity), 0)) AS mem,
      SUM(CASE WHEN s // {H} = h THEN 1 ELSE 0 END) AS windows,
      SUM(COALESCE(avg_cpu, 0) * (GREATEST(0, LEAST(t, (h + 1) * {H}) - GREATEST(s, h * {H})))) AS rawc,
      SUM(COALESCE(avg_mem, 0) * (GREATEST(0, LEAST(t, (h + 1) * {H}) - GREATEST(s, h * {H})))) AS rawm
    FROM x, cap GROUP BY 1, 2
    """
    df = duckdb.sql(q).df()
    keep = (df["rawc"] != 0) | (df["rawm"] != 0) | (df["windows"] != 0)
    return df[keep].drop(columns=["rawc", "rawm"])


def shapes_sql(ds: Dataset) -> pd.DataFrame:
    duckdb = pytest.importorskip("duckdb")
    q = f"""SELECT cap_cpu, cap_mem, COUNT(DISTINCT machine_id) AS machines
            FROM read_parquet({_files(ds, "machine_events")}) GROUP BY 1, 2"""
    return duckdb.sql(q).df()


def assert_usage_equal(got: pd.DataFrame, want: pd.DataFrame, rtol: float = 1e-12) -> None:
    key = ["bucket", "tier"]
    g = got.sort_values(key).reset_index(drop=True)
    w = want.sort_values(key).reset_index(drop=True)
    assert len(g) == len(w), (g, w)
    assert g["bucket"].tolist() == w["bucket"].astype(np.int64).tolist()
    assert g["bucket_start_us"].tolist() == (w["bucket"].astype(np.int64) * 3_600_000_000).tolist()
    assert g["tier"].tolist() == w["tier"].tolist()
    assert g["windows"].tolist() == w["windows"].astype(np.int64).tolist()
    for c in ("cpu", "mem"):
        np.testing.assert_allclose(g[c].to_numpy(float), w[c].to_numpy(float), rtol=rtol, atol=1e-300, equal_nan=True)


def assert_shapes_equal(got: pd.DataFrame, want: pd.DataFrame) -> None:
    def norm(df: pd.DataFrame) -> list[tuple[str, str, int]]:
        rows = []
        for c, m, n in zip(df["cap_cpu"], df["cap_mem"], df["machines"], strict=False):

            def f(v):
                return "NULL" if v is None or pd.isna(v) else repr(float(np.float32(v)) + 0.0)

            rows.append((f(c), f(m), int(n)))
        return sorted(rows)

    assert norm(got) == norm(want)


def _check(ds: Dataset, tm: str | None = None, partitions: int = 1) -> None:
    tmn = tm or "notebook"
    res = run(
        ds,
        [CellUsage(mode="notebook", tier_map=tm), CellUsage(mode="exact", tier_map=tm), MachineShapes()],
        partitions=partitions,
    )
    assert_usage_equal(
        res["cell-usage[mode=notebook" + (f",tier_map={tm}" if tm else "") + "]"]["usage"], notebook_sql(ds, tmn)
    )
    assert_usage_equal(
        res["cell-usage[mode=exact" + (f",tier_map={tm}" if tm else "") + "]"]["usage"], exact_sql(ds, tmn)
    )
    assert_shapes_equal(res["machine-shapes"]["shapes"], shapes_sql(ds))


@pytest.mark.parametrize("seed", [0, 1])
def test_random_cell_matches_duckdb(tmp_path, seed):
    ds = Dataset(write_dataset(tmp_path / "ds", random_cell(seed), files=3, row_group_size=700))
    _check(ds, partitions=4)


def test_windows_that_never_end_match_duckdb(tmp_path):
    """Windows whose end is the "after the trace" sentinel (2^63-1, TRACE_NOTES): the exact mode
    cannot place them in time and leaves them out, as the SQL reference does (``end_time <>
    9223372036854775807``), counting the top-level ones in ``info.unbounded_windows``; the notebook
    mode keeps them (Google's query reads no end)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from gpuclust.schema import TIME_AFTER_TRACE

    tables = random_cell(5, n_windows=3000)
    us = tables["instance_usage"]
    never = np.random.default_rng(5).random(us.num_rows) < 0.03
    end = np.where(never, TIME_AFTER_TRACE, us.column("end_time").to_numpy())
    i = us.schema.get_field_index("end_time")
    tables["instance_usage"] = us.set_column(i, us.schema.field(i), pa.array(end, pa.int64()))
    ds = Dataset(write_dataset(tmp_path / "ds", tables, files=3, row_group_size=700))
    _check(ds, partitions=4)
    top = pc.fill_null(pc.equal(us.column("alloc_collection_id"), 0), True).to_numpy(zero_copy_only=False)
    info = run(ds, CellUsage(mode="exact"), partitions=3)["cell-usage"]["info"].iloc[0]
    assert int(info["unbounded_windows"]) == int((never & top).sum()) > 0


@pytest.mark.parametrize("tm", ["seed-002", "v3-doc"])
def test_other_tier_maps_match_duckdb(tmp_path, tm):
    ds = Dataset(write_dataset(tmp_path / "ds", random_cell(7, n_windows=1500)))
    _check(ds, tm=tm, partitions=2)


@settings(
    max_examples=examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(tables=cell())
def test_hypothesis_cells_match_duckdb(tmp_path_factory, tables):
    ds = Dataset(write_dataset(tmp_path_factory.mktemp("ds"), tables, files=2))
    _check(ds, partitions=3)


def test_info_counts(tmp_path):
    tables = random_cell(3, n_windows=2000)
    ds = Dataset(write_dataset(tmp_path / "ds", tables))
    files = _files(ds, "instance_usage")
    nb = run(ds, CellUsage(mode="notebook"))["cell-usage"]["info"].iloc[0]
    ex = run(ds, CellUsage(mode="exact"))["cell-usage"]["info"].iloc[0]
    top = "(alloc_collection_id IS NULL OR alloc_collection_id = 0)"

    def one(q: str) -> object:
        duckdb = pytest.importorskip("duckdb")
        return duckdb.sql(q).fetchall()[0][0]

    assert nb["rows"] == ex["rows"] == one(f"SELECT COUNT(*) FROM read_parquet({files})")
    assert nb["alloc_rows"] == one(f"SELECT COUNT(*) FROM read_parquet({files}) WHERE NOT {top}")
    assert nb["short_windows"] == one(
        f"SELECT COUNT(*) FROM read_parquet({files}) WHERE {top} AND end_time - start_time < 300000000"
    )
    assert nb["used_windows"] == run(ds, CellUsage())["cell-usage"]["usage"]["windows"].sum()
    assert nb["used_windows"] + nb["unmatched_windows"] + nb["short_windows"] + nb["alloc_rows"] == nb["rows"]
    assert ex["used_windows"] + ex["alloc_rows"] + ex["unbounded_windows"] == ex["rows"]
    assert (
        ex["unknown_windows"]
        == run(ds, CellUsage(mode="exact"))["cell-usage"]["usage"].query("tier == 'unknown'")["windows"].sum()
    )
    # independently: bounded top-level windows whose instance has no event priority (no match, or
    # MAX(priority) NULL) -- the notebook tier map covers every priority >= 0
    ev = _files(ds, "instance_events")
    unknown = one(f"""
        WITH e AS (SELECT collection_id, instance_index, machine_id, MAX(priority) AS p FROM read_parquet({ev})
                   WHERE (alloc_collection_id IS NULL OR alloc_collection_id = 0) AND machine_id IS NOT NULL
                   GROUP BY ALL)
        SELECT COUNT(*) FROM read_parquet({files}) AS u LEFT JOIN e USING (collection_id, instance_index, machine_id)
        WHERE {top} AND end_time <> 9223372036854775807 AND (e.p IS NULL OR e.p < 0)""")
    assert ex["unknown_windows"] == unknown
    nulls = one(f"SELECT COUNT(*) FROM read_parquet({ev}) WHERE priority IS NULL")
    assert unknown > 0 and nulls > 0  # the case is exercised
    assert nb["cpu_capacity"] == pytest.approx(one(CAPACITY_SQL.format(me=_files(ds, "machine_events"))), rel=1e-12)


def test_all_null_group_is_unknown_not_zero(tmp_path):
    """Issue 7: an (hour, tier) group whose usage values are all NULL was not measured: NaN in both
    modes (SQL's SUM over only NULLs is NULL), never 0; a measured 0 stays 0."""
    from strategies import table

    H = 3_600_000_000
    tables = {
        "machine_events": table(
            "machine_events", {"time": [0], "machine_id": [5], "type": [1], "cap_cpu": [1.0], "cap_mem": [1.0]}
        ),
        "instance_events": table(
            "instance_events",
            {
                "time": [0, 0],
                "type": [3, 3],
                "collection_id": [1, 2],
                "instance_index": [0, 0],
                "machine_id": [5, 5],
                "priority": [200, 0],
                "alloc_collection_id": [0, 0],
            },
        ),
        # hour 2: prod window with NULL cpu, measured mem; hour 3: free window with cpu 0.0 (measured)
        "instance_usage": table(
            "instance_usage",
            {
                "start_time": [2 * H, 3 * H],
                "end_time": [2 * H + 300_000_000, 3 * H + 300_000_000],
                "collection_id": [1, 2],
                "instance_index": [0, 0],
                "machine_id": [5, 5],
                "alloc_collection_id": [0, 0],
                "avg_cpu": [None, 0.0],
                "avg_mem": [0.5, 0.25],
            },
        ),
    }
    ds = Dataset(write_dataset(tmp_path / "ds", tables))
    for mode in ("notebook", "exact"):
        u = run(ds, CellUsage(mode=mode))["cell-usage"]["usage"].set_index(["bucket", "tier"])
        assert np.isnan(u.loc[(2, "prod"), "cpu"]) and u.loc[(2, "prod"), "mem"] > 0, mode
        assert u.loc[(3, "free"), "cpu"] == 0.0 and u.loc[(2, "prod"), "windows"] == 1, mode
        assert u.loc[(2, "prod"), "bucket_start_us"] == 2 * H
    _check(ds)


@settings(max_examples=examples(60), deadline=None)
@given(
    pairs=st.lists(
        st.tuples(
            st.sampled_from([0.5, 0.25, -0.0, 0.0, 1.0, float("nan")]),
            st.sampled_from([0.5, 0.125, 0.0, float("nan")]),
            st.integers(1, 6),
        ),
        max_size=40,
    )
)
def test_shapes_rows_in_the_documented_order(pairs: list) -> None:
    """machine-shapes' rows: COUNT(DISTINCT machine_id) per shape (-0.0 and 0.0 one shape, NULL
    its own), sorted by machines descending, then cap_cpu, cap_mem, NULL last -- as pandas'
    ``sort_values`` orders the counts a slow replay takes."""
    from collections import defaultdict

    from gpuclust.backends import get_backend
    from gpuclust.tables import as_pandas

    cpu = np.array([p[0] for p in pairs], np.float32)
    mem = np.array([p[1] for p in pairs], np.float32)
    mid = np.array([p[2] for p in pairs], np.int64)
    a = MachineShapes()
    res = as_pandas(
        a.finalize(a.partial({"machine_id": mid, "cap_cpu": cpu, "cap_mem": mem}, None, get_backend("cpu")), None)[
            "shapes"
        ]
    )
    machines: dict = defaultdict(set)
    for c, m, i in pairs:
        key = tuple("NULL" if v != v else float(np.float32(v)) + 0.0 for v in (c, m))
        machines[key].add(i)
    want = pd.DataFrame(
        [
            {"cap_cpu": np.nan if c == "NULL" else c, "cap_mem": np.nan if m == "NULL" else m, "machines": len(ids)}
            for (c, m), ids in machines.items()
        ],
        columns=["cap_cpu", "cap_mem", "machines"],
    ).astype({"cap_cpu": float, "cap_mem": float, "machines": np.int64})
    want = want.sort_values(
        ["machines", "cap_cpu", "cap_mem"], ascending=[False, True, True], na_position="last", kind="stable"
    ).reset_index(drop=True)
    pd.testing.assert_frame_equal(res, want)
