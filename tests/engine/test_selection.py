"""Time selections (--from / --to) with row-group pushdown, and several cells in one run (--cells).

The reference for a selected run is a run over the dataset whose streamed table was filtered
first (Arrow filter, written back as a dataset), and DuckDB SQL with the WHERE clause for
cell-usage's notebook query.  The fixture is a multi-day cell whose usage rows are written
time-sorted in small row groups (tight statistics), shuffled (loose statistics) and without
statistics: the results are the same on all three; only the bytes read differ.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from strategies import assert_results_same

from gpuclust.analyses import CellUsage, MachineShapes
from gpuclust.analyses.cpi import Cpi
from gpuclust.analyses.overcommit import Overcommit
from gpuclust.analyses.usage_distribution import UsageDistribution
from gpuclust.dataset import Dataset, DatasetError, write_json_atomic
from gpuclust.engine import TableSource, run
from gpuclust.engine.cells import find_cells, run_cells
from gpuclust.engine.selection import SelectedSource, attach
from gpuclust.report.analyze import analyze
from gpuclust.trace_time import SelectionError, parse_time, selection_of

ROOT = Path(__file__).resolve().parents[2]
US = 1_000_000
HOUR, DAY = 3600 * US, 86400 * US


def _gen(out: Path, seed: int, windows: int = 40_000) -> Path:
    sys.path.insert(0, str(ROOT / "bench"))
    from gen_canonical import make_dataset

    return make_dataset(out, windows, machines=4, seed=seed)  # ~3 days of 300 s windows


def _rewrite_usage(
    ds: Path, t: pa.Table, *, files: int = 2, row_group_size: int = 1000, statistics: bool = True
) -> None:
    m = json.loads((ds / "manifest.json").read_text())
    for f in m["tables"]["instance_usage"]["files"]:
        (ds / f).unlink()
    edges = np.linspace(0, t.num_rows, files + 1).round().astype(int)
    rel = []
    for j in range(files):
        f = f"instance_usage/part-{j:05d}.parquet"
        pq.write_table(
            t.slice(edges[j], edges[j + 1] - edges[j]),
            ds / f,
            row_group_size=row_group_size,
            write_statistics=statistics,
        )
        rel.append(f)
    m["tables"]["instance_usage"] = {"rows": t.num_rows, "files": rel}
    write_json_atomic(ds / "manifest.json", m)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """The same multi-day cell as time-sorted (tight statistics), shuffled and statistics-free."""
    base = tmp_path_factory.mktemp("sel")
    raw = _gen(base / "raw", seed=5)
    usage = Dataset(raw).read("instance_usage")
    out = {}
    sorted_ = usage.take(pc.sort_indices(usage, [("start_time", "ascending")]))
    out["sorted"] = _copy(raw, base / "sorted")
    _rewrite_usage(out["sorted"], sorted_)
    out["shuffled"] = _copy(raw, base / "shuffled")
    _rewrite_usage(out["shuffled"], usage.take(np.random.default_rng(1).permutation(usage.num_rows)))
    out["nostats"] = _copy(raw, base / "nostats")
    _rewrite_usage(out["nostats"], sorted_, statistics=False)
    return {k: Dataset(v) for k, v in out.items()}


def _filtered(ds: Dataset, dst: Path, table: str, mask) -> Dataset:
    """A copy of ``ds`` with ``table`` filtered first (the definition a selected run must equal)."""
    if dst.exists():
        return Dataset(dst)
    _copy(ds.path, dst)
    t = ds.read(table)
    t = t.filter(mask(t))
    m = json.loads((dst / "manifest.json").read_text())
    for f in m["tables"][table]["files"]:
        (dst / f).unlink()
    f = f"{table}/part-filtered.parquet"
    pq.write_table(t, dst / f)
    m["tables"][table] = {"rows": t.num_rows, "files": [f]}
    write_json_atomic(dst / "manifest.json", m)
    return Dataset(dst)


LO, HI = 600 * US + DAY, 600 * US + 2 * DAY  # the second day of the trace


def _start_in(t):
    return pc.and_(pc.greater_equal(t["start_time"], LO), pc.less(t["start_time"], HI))


def _overlaps(t):
    return pc.and_(pc.less(t["start_time"], HI), pc.greater(t["end_time"], LO))


USAGE_ANALYSES = [CellUsage(mode="notebook"), CellUsage(mode="exact"), UsageDistribution(by=("tier", "time")), Cpi()]


# ------------------------------------------------------------------------------------ grammar
def test_trace_time_grammar():
    assert parse_time("86400s") == parse_time("1d") == parse_time("24h") == parse_time("1440min") == DAY
    assert parse_time("1500ms") == 1_500_000 and parse_time("250us") == 250 and parse_time("42") == 42
    assert parse_time("1.5h") == 90 * 60 * US and parse_time(7) == 7
    for bad in ("1.5", "0.5us", "yesterday", "1 week", "-1d", "2019-13-01"):
        with pytest.raises(SelectionError):
            parse_time(bad, TableSource({}, trace_version="v3"))


def _cell_src(cell, version="v3"):
    src = TableSource({}, trace_version=version)
    src.manifest = {"cell": cell}
    return src


def test_wall_clock_in_the_cells_time_zone():
    # trace start (t = 600 s) is 1 May 2019 00:00 PDT = 07:00 UTC in every 2019 cell
    assert parse_time("2019-05-01T00:00-07:00", _cell_src(None)) == 600 * US
    assert parse_time("2019-05-01T07:00Z", _cell_src(None)) == 600 * US
    # cell a (America/New_York, EDT = UTC-4): local midnight of 2 May is 21 h after the start
    assert parse_time("2019-05-02", _cell_src("a")) == 600 * US + 21 * HOUR
    assert parse_time("2019-05-02T08:00", _cell_src("2019-05-a")) == 600 * US + 29 * HOUR
    assert parse_time("2019-05-02T08:00", _cell_src("clusterdata_2019_a")) == 600 * US + 29 * HOUR  # (its bucket)
    # cell g (Asia/Singapore, UTC+8): 2 May 00:00 is 1 May 16:00 UTC, 9 h after the start
    assert parse_time("2019-05-02", _cell_src("g")) == 600 * US + 9 * HOUR
    # cell e (Europe/Helsinki, EEST = UTC+3)
    assert parse_time("2019-05-01T10:00", _cell_src("e")) == 600 * US
    sel = selection_of(_cell_src("b"), "2019-05-02", "2019-05-03")
    assert sel.time_zone == "America/Chicago" and sel.end - sel.start == DAY


def test_wall_clock_without_a_known_zone_is_a_clear_error():
    with pytest.raises(SelectionError, match="manifest names no cell"):
        parse_time("2019-05-02", _cell_src(None))
    with pytest.raises(SelectionError, match="cell 'bench', not one of a-h"):
        parse_time("2019-05-02", _cell_src("bench"))
    with pytest.raises(SelectionError, match="cell 'clusterdata_2019_x', not one of a-h"):
        parse_time("2019-05-02", _cell_src("clusterdata_2019_x"))
    with pytest.raises(SelectionError, match="only the v3"):
        parse_time("2011-05-02", _cell_src("x", "v2"))
    # the v2 trace start is known: an explicit offset works (1 May 2011 19:00 EDT)
    assert parse_time("2011-05-01T19:00-04:00", _cell_src(None, "v2")) == 600 * US
    with pytest.raises(SelectionError, match="trace version is unknown"):
        parse_time("2019-05-02T00:00Z", TableSource({}))
    with pytest.raises(SelectionError, match="empty selection"):
        selection_of(_cell_src(None), "2d", "1d")


# ------------------------------------------------------------------------------------ results
@pytest.mark.parametrize("layout", ["sorted", "shuffled", "nostats"])
def test_selected_run_equals_run_over_filtered_dataset(layouts, layout, tmp_path_factory):
    ds = layouts[layout]
    ref_dir = tmp_path_factory.getbasetemp() / "ref-start"
    want = run(_filtered(layouts["sorted"], ref_dir, "instance_usage", _start_in), USAGE_ANALYSES, partitions=2)
    got = run(ds, USAGE_ANALYSES, partitions=3, time_from=LO, time_to=HI)
    assert_results_same(got, want, rtol=1e-9)
    assert got["cell-usage[mode=notebook]"]["usage"]["bucket_start_us"].between(LO - HOUR, HI).all()


def test_selection_of_text_equals_microseconds(layouts):
    got = run(layouts["sorted"], [CellUsage()], time_from="87000s", time_to="173400000000")
    want = run(layouts["sorted"], [CellUsage()], time_from=LO, time_to=HI)
    assert_results_same(got, want, rtol=0)


@pytest.mark.parametrize("layout", ["sorted", "shuffled"])
def test_overcommit_selection_is_its_window(layouts, layout, tmp_path_factory):
    ds = layouts[layout]
    ref = _filtered(layouts["sorted"], tmp_path_factory.getbasetemp() / "ref-overlap", "instance_usage", _overlaps)
    want = run(ref, [Overcommit(bucket_s=3600, window_start_us=LO, window_end_us=HI)], partitions=2)
    got = run(ds, [Overcommit(bucket_s=3600)], partitions=3, time_from=LO, time_to=HI)
    assert_results_same(got, want, rtol=1e-9)
    assert got["overcommit"]["cell"]["bucket_start_us"].min() >= LO - HOUR
    # the same explicit window is no conflict; a different one is an error naming both
    run(ds, [Overcommit(bucket_s=3600, window_start_us=LO)], time_from=LO, time_to=HI)
    with pytest.raises(SelectionError, match="window_start_us=600000000000 conflicts with --from"):
        run(ds, [Overcommit(window_start_us=600 * US * 1000)], time_from=LO, time_to=HI)


def test_machine_shapes_reads_machine_events_before_to(layouts, tmp_path_factory):
    ds = layouts["sorted"]
    ref = _filtered(ds, tmp_path_factory.getbasetemp() / "ref-me", "machine_events", lambda t: pc.less(t["time"], HI))
    assert_results_same(run(ds, [MachineShapes()], time_from=LO, time_to=HI), run(ref, [MachineShapes()]), rtol=0)


def test_notebook_query_with_where_clause_in_duckdb(layouts):
    duckdb = pytest.importorskip("duckdb")
    ds = layouts["shuffled"]

    def files(t):
        return "[" + ", ".join(f"'{f}'" for f in ds.files(t)) + "]"

    q = f"""
    WITH cap AS (SELECT SUM(c) AS cc, SUM(m) AS mc FROM (SELECT machine_id, MAX(cap_cpu) c, MAX(cap_mem) m
                 FROM read_parquet({files("machine_events")}) GROUP BY 1)),
    e AS (SELECT collection_id, instance_index, machine_id, MAX(priority) AS priority
          FROM read_parquet({files("instance_events")})
          WHERE alloc_collection_id IS NULL OR alloc_collection_id = 0 GROUP BY 1, 2, 3),
    u AS (SELECT * FROM read_parquet({files("instance_usage")})
          WHERE start_time >= {LO} AND start_time < {HI}
            AND (alloc_collection_id IS NULL OR alloc_collection_id = 0) AND end_time - start_time >= 300000000)
    SELECT CAST(FLOOR(u.start_time / 3600000000) AS BIGINT) AS bucket,
           CASE WHEN e.priority BETWEEN 0 AND 99 THEN 'free' WHEN e.priority BETWEEN 100 AND 115 THEN 'beb'
                WHEN e.priority BETWEEN 116 AND 119 THEN 'mid' ELSE 'prod' END AS tier,
           SUM(u.avg_cpu) / (12 * ANY_VALUE(cap.cc)) AS cpu, COUNT(*) AS windows
    FROM u JOIN e USING (collection_id, instance_index, machine_id), cap GROUP BY 1, 2 ORDER BY 1, 2"""
    want = duckdb.sql(q).df()
    got = run(ds, [CellUsage()], time_from=LO, time_to=HI, partitions=3)["cell-usage"]["usage"]
    got = got.sort_values(["bucket", "tier"]).reset_index(drop=True)
    assert got["bucket"].tolist() == want["bucket"].tolist() and got["tier"].tolist() == want["tier"].tolist()
    assert got["windows"].tolist() == want["windows"].tolist()
    np.testing.assert_allclose(got["cpu"].to_numpy(float), want["cpu"].to_numpy(float), rtol=1e-9)


def test_in_memory_tables_are_filtered_too(layouts):
    ds = layouts["shuffled"]
    tables = {t: ds.read(t) for t in ("machine_events", "instance_events", "instance_usage")}
    src = TableSource(tables, tier_map="notebook", trace_version="v3")
    want = run(ds, [CellUsage(mode="exact")], time_from=LO, time_to=HI)
    assert_results_same(run(src, [CellUsage(mode="exact")], partitions=3, time_from=LO, time_to=HI), want, rtol=1e-9)


# ------------------------------------------------------------------------------------ pushdown
def _read_stats(ds, analyses, **kw):
    src, ans = attach(ds, analyses, LO, HI)
    run(src, ans, partitions="auto", **kw)
    assert isinstance(src, SelectedSource)
    return src.stats["instance_usage"]


def test_one_day_reads_about_one_days_row_groups(layouts):
    days = (
        Dataset(layouts["sorted"].path).read("instance_usage", ["start_time"]).column(0).to_numpy().max() - 600 * US
    ) / DAY
    st = _read_stats(layouts["sorted"], [CellUsage()])
    share = st["bytes_read"] / st["bytes"]
    assert st["passes"] == 1 and st["row_groups"] > 20
    assert share < 1.5 / days, (share, days, st)  # about one day's share (+ the edge row groups)
    assert share > 0.5 / days
    # loose or missing statistics: every row group is read (and the results above are still the same)
    assert (
        _read_stats(layouts["nostats"], [CellUsage()])["bytes_read"]
        == _read_stats(layouts["nostats"], [CellUsage()])["bytes"]
    )
    shuffled = _read_stats(layouts["shuffled"], [CellUsage()])
    assert shuffled["bytes_read"] == shuffled["bytes"]


def test_cpi_first_pass_is_pruned_too(layouts):
    st = _read_stats(layouts["sorted"], [Cpi()])
    assert st["passes"] == 2 and st["bytes_read"] < 0.5 * st["bytes"]


def test_cli_from_to_and_run_json(layouts, tmp_path, capsys):
    from gpuclust.cli import main

    out = tmp_path / "r"
    rc = main(
        [
            "analyze",
            str(layouts["sorted"].path),
            "cell-usage",
            "overcommit",
            "--out",
            str(out),
            "--from",
            "87000s",
            "--to",
            "173400s",
            "--no-plots",
            "--quiet",
        ]
    )
    assert rc == 0
    info = json.loads((out / "_run.json").read_text())
    assert info["selection"]["from_us"] == LO and info["selection"]["to_us"] == HI
    assert (
        info["selection"]["read"]["instance_usage"]["bytes_read"] < info["selection"]["read"]["instance_usage"]["bytes"]
    )
    oc = next(a for a in info["analyses"] if a["name"] == "overcommit")
    assert oc["options"]["window_start_us"] == LO and oc["options"]["window_end_us"] == HI
    capsys.readouterr()
    rc = main(
        [
            "analyze",
            str(layouts["sorted"].path),
            "cell-usage",
            "--out",
            str(tmp_path / "r2"),
            "--from",
            "2019-05-02",
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "cell 'bench', not one of a-h" in err and "Traceback" not in err
    assert not (tmp_path / "r2").exists()


# ------------------------------------------------------------------------------------ cells
@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    root = tmp_path_factory.mktemp("cells")
    for cell, seed in (("a", 1), ("b", 2)):
        d = _gen(root / f"cell-{cell}", seed=seed, windows=8000)
        m = json.loads((d / "manifest.json").read_text())
        m["cell"] = cell
        write_json_atomic(d / "manifest.json", m)
    return root


CELL_ANALYSES = [CellUsage(), MachineShapes(), UsageDistribution(by=("cell", "tier")), Overcommit(bucket_s=3600)]


def test_cells_results_equal_per_cell_runs(cells):
    paths = find_cells(cells, "a,b")
    assert list(paths) == ["a", "b"]
    got = run_cells(paths, CELL_ANALYSES, partitions=2)
    for key, tables in got.items():
        for tname, df in tables.items():
            assert list(df.columns)[0] == "cell"
            for cell, path in paths.items():
                one = run(path, CELL_ANALYSES, partitions=2)[key][tname]
                sub = df[df["cell"] == cell].drop(columns="cell").reset_index(drop=True)
                if "cell" in one.columns:  # by=cell: the cell column is the cell's name
                    one = one.drop(columns="cell")
                assert_results_same({"k": {"t": sub}}, {"k": {"t": one[list(sub.columns)]}}, rtol=0)


def test_cli_cells_with_wall_clock_selection(cells, tmp_path, capsys):
    from gpuclust.cli import main

    out = tmp_path / "r"
    # manifests say cells a and b: wall-clock is read in each cell's own zone (New York, Chicago)
    rc = main(
        [
            "analyze",
            str(cells),
            "cell-usage",
            "machine-shapes",
            "--cells",
            "b,a",
            "--out",
            str(out),
            "--from",
            "2019-05-01T12:00",
            "--to",
            "2019-05-02",
            "--quiet",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    usage = pq.read_table(out / "cell-usage" / "usage.parquet").to_pandas()
    assert usage.columns[0] == "cell" and set(usage["cell"]) == {"a", "b"}
    info = json.loads((out / "_run.json").read_text())
    sel = {c: v["selection"] for c, v in info["cells"].items()}
    assert sel["a"]["time_zone"] == "America/New_York" and sel["b"]["time_zone"] == "America/Chicago"
    assert sel["b"]["from_us"] - sel["a"]["from_us"] == HOUR  # Chicago's noon is an hour after New York's
    summary = (out / "summary.txt").read_text()
    assert "cell b: cell-usage" in summary and "cell a: cell-usage" in summary
    assert summary.index("cell b: cell-usage") < summary.index("cell a: cell-usage")
    want = run(Dataset(cells / "cell-a"), [CellUsage()], time_from=sel["a"]["from_us"], time_to=sel["a"]["to_us"])
    got = usage[usage["cell"] == "a"].drop(columns="cell").reset_index(drop=True)
    assert_results_same({"k": {"t": got}}, {"k": {"t": want["cell-usage"]["usage"]}}, rtol=0)


def test_cells_errors(cells, tmp_path):
    with pytest.raises(DatasetError, match="no dataset for cell.s. c; found: a,b"):
        find_cells(cells, "a,c")
    with pytest.raises(DatasetError, match="is one dataset"):
        find_cells(cells / "cell-a", "all")
    with pytest.raises(ValueError, match="named twice"):
        find_cells(cells, "a,a")
    assert list(find_cells(cells, "all")) == ["a", "b"]
    with pytest.raises(DatasetError, match="no such folder"):
        analyze(tmp_path / "none", ["cell-usage"], cells="all")


def test_dask_threads_scheduler_takes_the_same_selection(layouts):
    want = run(layouts["sorted"], [CellUsage(mode="exact")], time_from=LO, time_to=HI)
    got = run(layouts["sorted"], [CellUsage(mode="exact")], partitions=4, scheduler="threads", time_from=LO, time_to=HI)
    assert_results_same(got, want, rtol=1e-12)


def test_cells_parted_tables_stay_parts(cells, tmp_path):
    """``--cells`` with a results folder: overcommit's machine table (parted) is copied part by
    part with the ``cell`` column into ``<key>/machine/``, equals the per-cell runs, and no
    staging folder is left; the summary is each cell's own."""
    from gpuclust.parted import PartedTable
    from gpuclust.report.analyze import analyze

    out = tmp_path / "r"
    res = analyze(cells, ["overcommit"], cells="a,b", out=out, partitions=2, plots=False)
    key = next(iter(res))
    machine = res[key]["machine"]
    assert isinstance(machine, PartedTable) and machine.folder == out / key / "machine"
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no staging folder left
    files = sorted((out / key / "machine").glob("part-*.parquet"))
    assert [f.name for f in files] == machine.files and len(files) >= 2
    got = machine.read()
    assert got.columns[0] == "cell" and list(dict.fromkeys(got["cell"])) == ["a", "b"]
    for cell in ("a", "b"):
        one = run(cells / f"cell-{cell}", ["overcommit"], partitions=2)[key]["machine"]
        sub = got[got["cell"] == cell].drop(columns="cell").reset_index(drop=True)
        assert_results_same({"k": {"t": sub}}, {"k": {"t": one}}, rtol=0)
        assert f"cell {cell}: overcommit" in (out / "summary.txt").read_text()
    small = pq.read_table(out / key / "summary.parquet").to_pandas()
    assert set(small["cell"]) == {"a", "b"}
