"""``gpuclust claims``: each claim's value against an independent computation (DuckDB SQL over the
dataset's Parquet files, the slow usage-change replay), on the real 2011 parts and on a synthetic
2019-format cell, and whether each says the dataset can support it, or why not."""

from __future__ import annotations

import json
import math
import pickle
import sys
from pathlib import Path

import pytest
from cli_cells import gpuclust
from run_once import once_per_run
from small_cell import linked, small_cell

from gpuclust.claims import DatasetFacts, claims, evaluate, needed_analyses
from gpuclust.claims.command import _results
from gpuclust.dataset import Dataset
from gpuclust.ingest import ingest

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real"
duckdb = pytest.importorskip("duckdb")  # (at collection: a module without DuckDB is skipped, never an error)
SUBMIT, SCHEDULE, EVICT, FINISH = 0, 3, 4, 6


def _by_id(rows: list[dict]) -> dict[str, dict]:
    return {r["id"]: r for r in rows}


def _events_sql(ds: Dataset) -> str:
    """instance_events in the dataset's order (file by file, row by row), as one DuckDB relation."""
    files = [str(f) for f in ds.files("instance_events")]
    order = " ".join(f"WHEN '{f}' THEN {i}" for i, f in enumerate(files))
    return (
        f"(SELECT *, CASE filename {order} END AS file_no FROM read_parquet({files!r}, filename=true, "
        "file_row_number=true))"
    )


@pytest.fixture(scope="module")
def v2(real_2011, tmp_path_factory):
    """The real 2011 parts, ingested once per run (tests/conftest.py's ``real_2011``, read-only), and
    the claims evaluated on them, also once per run (:func:`run_once.once_per_run`, kept pickled)."""

    def evaluated(d: Path) -> Path:
        res, not_run = _results(str(real_2011), quiet=True)
        rows = _by_id(evaluate(res, DatasetFacts.of(real_2011), not_run=not_run))
        (d / "rows.pickle").write_bytes(pickle.dumps(rows))
        return d / "rows.pickle"

    return Dataset(real_2011), pickle.loads(once_per_run(tmp_path_factory, "claims-2011", evaluated).read_bytes())


def test_2011_totals_and_transitions_match_duckdb(v2):
    ds, rows = v2
    ev = _events_sql(ds)
    con = duckdb.connect()
    tasks, firsts, subs, scheds, fins = con.execute(f"""
        SELECT COUNT(DISTINCT (collection_id, instance_index)),
               COUNT(DISTINCT (collection_id, instance_index)) FILTER (WHERE type = {SUBMIT}),
               COUNT(*) FILTER (WHERE type = {SUBMIT}), COUNT(*) FILTER (WHERE type = {SCHEDULE}),
               COUNT(*) FILTER (WHERE type = {FINISH})
        FROM {ev}""").fetchone()
    pairs = dict(
        ((a, b), n)
        for a, b, n in con.execute(f"""
        SELECT prev, type, COUNT(*) FROM (
          SELECT type, LAG(type) OVER (PARTITION BY collection_id, instance_index
                                       ORDER BY time, file_no, file_row_number) AS prev
          FROM {ev} WHERE type BETWEEN 0 AND 10)
        WHERE prev IS NOT NULL GROUP BY ALL""").fetchall()
    )
    assert rows["tasks"]["value"] == tasks
    assert rows["new-submissions"]["value"] == firsts
    assert rows["submissions"]["value"] == subs
    assert rows["schedules"]["value"] == scheds
    assert rows["completions"]["value"] == fins
    assert rows["submit-evict"]["value"] == pairs.get((SUBMIT, EVICT), 0) > 0  # the paper's finding holds here
    assert rows["no-submit-submit"]["value"] == pairs.get((SUBMIT, SUBMIT), 0) == 0
    assert rows["submit-evict"]["supported"] and rows["no-submit-submit"]["supported"]
    # five of the trace's 500 task_events files: no total compares with the paper's
    for cid in ("tasks", "new-submissions", "submissions", "schedules", "completions"):
        assert not rows[cid]["supported"] and "5 of the trace's 500 task_events part files" in rows[cid]["why"], cid


def test_2011_production_share_matches_duckdb(v2):
    ds, rows = v2
    prod, total = (
        duckdb.connect()
        .execute(f"""
        SELECT COUNT(*) FILTER (WHERE top >= 9), COUNT(*) FROM (
          SELECT MAX(priority) AS top FROM {_events_sql(ds)} GROUP BY collection_id, instance_index
          HAVING COUNT(*) FILTER (WHERE type = {SUBMIT}) > 0)""")
        .fetchone()
    )
    r = rows["production-tasks"]
    assert r["value"] == pytest.approx(prod / total, rel=1e-12)
    assert f"{prod:,} production tasks" in r["dataset"] and not r["supported"]
    assert "consecutive hours" in r["why"]


def test_2011_steady_rates_match_duckdb(v2):
    """Seed 003's steady rates: per trace hour (every hour from the first event's to the last's),
    the tasks whose first SUBMIT falls in it and the FINISH events, cumulated; R² of NumPy's
    least-squares line through each, and completions over new submissions."""
    import numpy as np

    ds, rows = v2
    lo, hi, firsts, fins = (
        duckdb.connect()
        .execute(f"""
        WITH e AS (SELECT * FROM {_events_sql(ds)} WHERE time < 9223372036854775807),
             f AS (SELECT MIN(time) AS t FROM e WHERE type = {SUBMIT} GROUP BY collection_id, instance_index)
        SELECT (SELECT MIN(time) // 3600000000 FROM e), (SELECT MAX(time) // 3600000000 FROM e),
               (SELECT LIST(t // 3600000000) FROM f), (SELECT LIST(time // 3600000000) FROM e WHERE type = {FINISH})""")
        .fetchone()
    )
    hours = np.arange(lo, hi + 1)
    for cid, events in (("submissions-steady", firsts), ("completions-steady", fins)):
        c = np.cumsum(np.bincount(np.asarray(events) - lo, minlength=len(hours))).astype(float)
        slope, icpt = np.polyfit(hours.astype(float), c, 1)
        r2 = 1 - np.sum((c - slope * hours - icpt) ** 2) / np.sum((c - c.mean()) ** 2)
        assert rows[cid]["value"] == pytest.approx(r2, rel=1e-9), cid
        assert f"{int(c[-1]):,}" in rows[cid]["rests_on"] and f"{len(hours):,} hourly buckets" in rows[cid]["rests_on"]
        assert not rows[cid]["supported"] and "the data spans 7.1 h" in rows[cid]["why"], cid
    r = rows["completions-below-submissions"]
    assert r["value"] == pytest.approx(len(fins) / len(firsts), rel=1e-12)
    assert f"{len(fins):,} completions for {len(firsts):,} new task submissions" in r["dataset"]
    assert not r["supported"]


def test_2011_what_the_parts_cannot_support_says_why(v2):
    _, rows = v2
    for cid in ("short-30min", "short-5min", "queue-trend", "running-trend"):
        assert not rows[cid]["supported"] and "the data spans 7.1 h" in rows[cid]["why"], cid
    # the 2011 parts here have no task_usage: usage-change cannot run, overcommit runs without usage
    assert (
        rows["cluster-change-20pct"]["value"] is None and "needs instance_usage" in rows["cluster-change-20pct"]["why"]
    )
    assert rows["prod-usage-half"]["value"] is None and "no usage windows" in rows["prod-usage-half"]["why"]
    for cid in ("job-tail-cpu", "job-tail-mem"):
        assert not rows[cid]["supported"], cid


def test_2011_execution_shares_match_duckdb(v2):
    """Finished runs: a FINISH whose previous event of the task is a SCHEDULE after the trace's
    time 0 (a run scheduled at time 0 has no known start), its duration FINISH - SCHEDULE."""
    ds, rows = v2
    durs = [
        d
        for (d,) in duckdb.connect()
        .execute(f"""
        SELECT (time - prev_time) / 1e6 FROM (
          SELECT type, time, LAG(type) OVER w AS prev, LAG(time) OVER w AS prev_time
          FROM {_events_sql(ds)} WHERE type BETWEEN 0 AND 10
          WINDOW w AS (PARTITION BY collection_id, instance_index ORDER BY time, file_no, file_row_number))
        WHERE type = {FINISH} AND prev = {SCHEDULE} AND prev_time > 0""")
        .fetchall()
    ]
    for cid, limit in (("short-30min", 1800.0), ("short-5min", 300.0)):
        r = rows[cid]
        edge = float(r["dataset"].split("shorter than ")[1].split(" s")[0].replace(",", ""))
        assert abs(math.log(edge / limit)) < 0.06, r["dataset"]  # the histogram's edge nearest the limit
        assert f"of {len(durs):,} finished runs" in r["dataset"]
        below = sum(d < edge for d in durs)
        assert r["value"] == pytest.approx(below / len(durs), abs=2 / len(durs)), (cid, r["dataset"])


@pytest.fixture(scope="module")
def synth(synth_cell_40, tmp_path_factory):
    """A 2019-format synthetic cell ingested from its raw export (conftest's ``synth_cell_40``:
    40 machines x 3 h, its ``raw`` shards ingested as ``ds``, once per run, read-only; ingested
    from the export it is not marked synthetic), and the claims evaluated on it in this process
    (``not_run``, rows by id)."""

    def build(d: Path) -> Path:
        rep = ingest([synth_cell_40 / "raw"], d / "ds", progress=False)
        assert rep.exit_status == 0, rep.summary()
        return d / "ds"

    ds = once_per_run(tmp_path_factory, "claims-synth-40", build, read_only=True)
    res, not_run = _results(str(ds), quiet=True)
    return ds, not_run, _by_id(evaluate(res, DatasetFacts.of(ds)))


def test_synthetic_cell_usage_claims_match_references(synth):
    """A 2019-format synthetic cell: the cluster-level change shares against the slow replay, the
    top-1% job shares against DuckDB; a synthetic cell supports no comparison with the paper."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from references.usage_change import THRESHOLDS, describe, period_pairs, period_usage

    path, not_run, rows = synth
    ds = Dataset(path)
    assert not_run == {}
    usage = ds.read(
        "instance_usage", ["start_time", "end_time", "alloc_collection_id", "machine_id", "avg_cpu", "avg_mem"]
    ).to_pylist()
    ref = period_pairs(period_usage(usage, None))
    share = {}
    for res in ("cpu", "mem"):
        d = describe(ref["pairs"][res], [])
        share[res] = d["within"][0.20] / d["defined"]
    r = rows["cluster-change-20pct"]
    assert 0.20 in THRESHOLDS and r["value"] == pytest.approx(share["cpu"], rel=1e-12)
    assert f"memory {100 * share['mem']:.1f}%" in r["dataset"] and r["supported"] is False
    assert "v2" not in r["why"] and "2011 trace" in r["why"]  # a 2019 dataset, a 2011 observation
    files = f"read_parquet('{path}/instance_usage/**/*.parquet')"
    for cid, col in (("job-tail-cpu", "avg_cpu"), ("job-tail-mem", "avg_mem")):
        share = (
            duckdb.connect()
            .execute(f"""
            WITH j AS (SELECT collection_id, SUM(COALESCE(CAST({col} AS DOUBLE), 0) * (end_time - start_time) / 3.6e9) AS h
                       FROM {files} WHERE collection_type = 0 AND end_time > start_time
                       AND end_time < 9223372036854775807 GROUP BY collection_id),
                 r AS (SELECT h, ROW_NUMBER() OVER (ORDER BY h DESC) AS k, COUNT(*) OVER () AS n FROM j WHERE h > 0)
            SELECT SUM(h) FILTER (WHERE k <= GREATEST(1, CEIL(0.01 * n))) / SUM(h) FROM r""")
            .fetchone()[0]
        )
        assert rows[cid]["value"] == pytest.approx(share, rel=1e-9), cid
        assert not rows[cid]["supported"] and "instance_usage files are not named part-K-of-N" in rows[cid]["why"]
    # Borg's Figure 11: the per-task values by DuckDB SQL (tests/analyses/test_usage_vs_request_tasks.py)
    import by_path

    uvr = by_path.load("uvr_tasks", Path(__file__).resolve().parent / "analyses" / "test_usage_vs_request_tasks.py")
    ref, _ = uvr.summarize(uvr.duckdb_tasks(path, ds.tier_map_name or "notebook"))
    for cid, measure, col in (
        ("borg-cpu-below-limit", "cpu_mean", "p50_ratio"),
        ("borg-mem-below-limit", "mem_mean", "p50_ratio"),
        ("borg-reservation-near-limit", "mem_reservation", "p50_ratio"),
    ):
        assert rows[cid]["value"] == pytest.approx(ref[("all", measure)][col], rel=1e-12), cid
    for cid, measure in (("borg-cpu-above-limit", "cpu_mean"), ("borg-mem-rarely-above", "mem_peak")):
        want = ref[("all", measure)]
        assert rows[cid]["value"] == pytest.approx(want["above_limit"] / want["defined"], rel=1e-12), cid
        assert f"of {want['defined']:,} tasks" in rows[cid]["dataset"]


def test_borg_cpi_claims_match_a_weighted_fit_and_sql(synth, synth_cell_40):
    """Borg §5.2 on a synthetic cell: the per-task and per-10%-utilisation effects and R² against a
    weighted least-squares fit by NumPy (platform dummies on CPI over its platform's weighted mean)
    of the windows DuckDB joins to their machine-cell's task count and utilisation; the prod mean
    and σ against SQL over the windows whose instance's highest priority is prod (notebook map)."""
    import by_path
    import numpy as np

    from gpuclust.tiers import tier_map

    here = Path(__file__).resolve().parent
    t_cpi = by_path.load("t_cpi", here / "analyses" / "test_cpi.py")
    path, _, rows = synth
    ds = Dataset(path)
    win_end = json.loads((synth_cell_40 / "raw" / "synth_truth.json").read_text())["trace_window_us"][1]
    df = t_cpi.duckdb_windows(path, win_end)
    y, w = df["cpi"].to_numpy(), df["w"].to_numpy()
    ok = df["util"].notna().to_numpy() & df["k"].notna().to_numpy() & df["platform_id"].notna().to_numpy()
    df, y, w = df[ok], y[ok], w[ok]
    plats = sorted(df["platform_id"].unique())
    ybar = {
        p: np.average(y[(df["platform_id"] == p).to_numpy()], weights=w[(df["platform_id"] == p).to_numpy()])
        for p in plats
    }
    yr = y / df["platform_id"].map(ybar).to_numpy()
    dummies = np.column_stack([(df["platform_id"] == p).to_numpy(float) for p in plats])
    coef, _, r2 = t_cpi._wls(np.column_stack([df["util"], df["k"] - 1.0, dummies]), yr, w)
    assert rows["borg-cpi-per-task"]["value"] == pytest.approx(100 * coef[1], rel=1e-9)
    assert rows["borg-cpi-per-10pct-util"]["value"] == pytest.approx(10 * coef[0], rel=1e-9)
    assert rows["borg-cpi-variance-explained"]["value"] == pytest.approx(r2, rel=1e-9)
    assert f"{len(df):,} windows of every tier" in rows["borg-cpi-per-task"]["rests_on"]
    # the prod tier's CPU-second-weighted mean and standard deviation
    tm = tier_map(ds.tier_map_name or "notebook")
    prod = tm.bounds[list(tm.names).index("prod")]
    ev = [str(f) for f in ds.files("instance_events")]
    top = (
        duckdb.connect()
        .execute(f"""
        SELECT collection_id, instance_index, machine_id, MAX(priority) AS p FROM read_parquet({ev})
        WHERE machine_id IS NOT NULL AND priority IS NOT NULL GROUP BY ALL""")
        .df()
    )
    d = duckdb.connect()
    d.register("win", t_cpi.duckdb_windows(path, win_end))
    d.register("top", top)
    mean, std, n = d.execute(f"""
        WITH x AS (SELECT cpi, w FROM win JOIN top USING (collection_id, instance_index, machine_id) WHERE p >= {prod}),
             m AS (SELECT SUM(w * cpi) / SUM(w) AS mu FROM x)
        SELECT ANY_VALUE(mu), SQRT(SUM(w * (cpi - mu) ^ 2) / SUM(w)), COUNT(*) FROM x, m""").fetchone()
    assert list(tm.names)[-1] == "prod"  # (the highest tier: p >= its bound)
    assert rows["borg-cpi-mean"]["value"] == pytest.approx(mean, rel=1e-9)
    assert (
        f"{mean:.2f} (σ {std:.2f})" == rows["borg-cpi-mean"]["dataset"]
        and f"{n:,} prod windows" in rows["borg-cpi-mean"]["rests_on"]
    )
    # (ingested from its raw export, the cell is not marked synthetic: support is the windows' count)
    assert rows["borg-cpi-per-task"]["supported"] is (len(df) >= 10_000) and rows["borg-cpi-mean"]["supported"] is (
        n >= 10_000
    )


def test_every_claim_names_its_source_and_paper_value():
    for c in claims():
        assert c.sentence.endswith(".") and c.source and c.paper and c.analyses, c.id
    assert set(needed_analyses()) <= {"lifecycle", "usage-change", "overcommit", "job-usage", "usage-vs-request", "cpi"}


@pytest.fixture(scope="module")
def cell_ds(tmp_path_factory):
    """A synthetic 12-machine, 1 h cell made by the CLI once per run (``small_cell``), read-only:
    the command tests link it as ``ds`` in their own folder."""
    return small_cell(tmp_path_factory)


def test_claims_command_as_docs_print_it(cell_ds, tmp_path):
    """``gpuclust claims DATASET --csv FILE`` on a synthetic cell: one block per claim, the CSV."""
    linked(cell_ds, tmp_path)
    r = gpuclust("claims", "ds", "--csv", "claims.csv", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("\n[") + r.stdout.startswith("[") == len(claims())
    assert "cannot compare: the paper measured the 2011 trace; this is a 2019 dataset" in r.stdout
    assert (
        (tmp_path / "claims.csv").read_text().startswith("id,claim,source,paper,value,dataset,rests_on,supported,why")
    )
    (tmp_path / "dir").mkdir()
    r = gpuclust("claims", "ds", "--csv", "dir", "--quiet", cwd=tmp_path)  # a folder where the file goes
    assert r.returncode == 2 and r.stderr.startswith("gpuclust claims: error: dir: ") and "Traceback" not in r.stderr
    assert (tmp_path / "dir").is_dir() and not list((tmp_path / "dir").iterdir())
    r = gpuclust("claims", "missing", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("gpuclust claims: error: ") and "Traceback" not in r.stderr


def test_report_has_the_claims_its_analyses_support(cell_ds, tmp_path):
    """``gpuclust report``'s page shows the claims whose analyses it holds (with the options they
    ask for), and points to ``gpuclust claims`` for the rest."""
    linked(cell_ds, tmp_path)
    r = gpuclust("report", "ds", "lifecycle", "job-usage", "--out", "r.html", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    page = (tmp_path / "r.html").read_text()
    assert '<section id="claims">' in page and '<a href="#claims">claims</a>' in page
    lifecycle_or_jobs = [c for c in claims() if {n for n, _ in c.analyses} <= {"lifecycle", "job-usage"}]
    assert page.count("<small>") == len(lifecycle_or_jobs)
    assert "SUBMIT is followed by EVICT" in page and "cannot compare: the paper measured the 2011 trace" in page
    assert f"{len(claims()) - len(lifecycle_or_jobs)} more claim(s)" in page
    r = gpuclust("report", "ds", "machine-shapes", "--out", "m.html", "--quiet", cwd=tmp_path)
    assert r.returncode == 0 and '<section id="claims">' not in (tmp_path / "m.html").read_text()


def test_claims_on_the_kaggle_sample(tmp_path):
    """The Kaggle 2019 sample (14 rows): every claim has a value or says why not; the job tail is
    DuckDB's; too few tasks for Figure 11's CDFs."""
    if not REAL.is_dir():
        pytest.skip(f"real trace files not found at {REAL}")
    rep = ingest([REAL / "kaggle-2019-sample" / "small_slice3.csv"], tmp_path / "k", progress=False)
    assert rep.exit_status == 0
    res, not_run = _results(str(tmp_path / "k"), quiet=True)
    rows = _by_id(evaluate(res, DatasetFacts.of(tmp_path / "k"), not_run=not_run))
    assert set(rows) == {c.id for c in claims()}
    for r in rows.values():
        assert r["supported"] or r["why"], r
    files = f"read_parquet('{tmp_path}/k/instance_usage/**/*.parquet')"
    share = (
        duckdb.connect()
        .execute(f"""
        WITH j AS (SELECT collection_id, SUM(COALESCE(CAST(avg_cpu AS DOUBLE), 0) * (end_time - start_time) / 3.6e9) AS h
                   FROM {files} WHERE collection_type = 0 AND end_time > start_time
                   AND end_time < 9223372036854775807 GROUP BY collection_id),
             r AS (SELECT h, ROW_NUMBER() OVER (ORDER BY h DESC) AS k, COUNT(*) OVER () AS n FROM j WHERE h > 0)
        SELECT SUM(h) FILTER (WHERE k <= GREATEST(1, CEIL(0.01 * n))) / SUM(h) FROM r""")
        .fetchone()[0]
    )
    if share is None:
        assert rows["job-tail-cpu"]["value"] is None
    else:
        assert rows["job-tail-cpu"]["value"] == pytest.approx(share, rel=1e-9)
    assert (
        "too few for a CDF over tasks" in rows["borg-cpu-below-limit"]["why"]
        or rows["borg-cpu-below-limit"]["value"] is None
    )


def test_a_synthetic_cell_supports_no_claim():
    import pandas as pd

    from gpuclust.claims.catalog import CLAIMS

    c = next(c for c in CLAIMS if c.id == "no-submit-submit")
    res = {
        "lifecycle": {
            "transitions": pd.DataFrame(
                {"tier": ["a"], "from_event": ["SUBMIT"], "to_event": ["SCHEDULE"], "count": [5]}
            )
        }
    }
    real = evaluate(res, DatasetFacts("v2"), [c])[0]
    synthetic = evaluate(res, DatasetFacts("v2", synthetic=True), [c])[0]
    assert real["supported"] and real["value"] == 0
    assert not synthetic["supported"] and synthetic["why"].startswith("a synthetic cell")
