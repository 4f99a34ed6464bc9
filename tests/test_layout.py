"""The bucketed dataset layout and ``gpuclust optimize``.

Independent checks: the rows of every table are the same multiset before and after (DuckDB SQL
over both folders), every row is in the bucket a slow pure-Python splitmix64 gives its key, rows
are time-ordered and row groups bounded, DuckDB's hive read sees the folder's bucket, every
registered analysis gives the same result on both layouts, and SIGKILLs at four points leave a
readable dataset that a re-run turns into exactly a clean run's.  (The killed runs are
``gpuclust`` processes of their own; the re-runs and clean runs are the same commands, run in the
test's process by ``gpuclust.cli.main``.)
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from strategies import assert_results_same, ref_bucket

from gpuclust.dataset import MANIFEST, Dataset, DatasetError
from gpuclust.layout import HASH_NAME, KEYS, ORDER
from gpuclust.optimize import KILL_ENV, OptimizeUsageError, default_buckets, optimize
from gpuclust.schema import SCHEMAS, TABLES

# the device image has no duckdb: skip there instead of failing the GPU run's collection
duckdb = pytest.importorskip("duckdb")

ROOT = Path(__file__).resolve().parents[1]
RG = 700  # small row groups: several per part


# --------------------------------------------------------------------------------------------
# An obviously-correct reference of the bucket hash
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def flat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic cell ingested: every table, rejects, several parts."""
    from gpuclust.synth import SynthConfig, synthesize

    root = tmp_path_factory.mktemp("flat")
    synthesize(
        SynthConfig(machines=20, hours=1.5, seed=1, malformed_rate=0.001),
        root / "raw",
        dataset=root / "ds",
        progress=None,
        layout="flat",
    )
    return root / "ds"


@pytest.fixture(scope="module")
def bench_flat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A benchmark-style dataset whose usage is spread over several shuffled parts."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gen_canonical import make_dataset

    return make_dataset(tmp_path_factory.mktemp("bench") / "ds", 30_000, windows_per_part=7_000, seed=3)


@pytest.fixture(scope="module")
def opt(flat: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("opt") / "ds"
    optimize(flat, buckets=4, out=out, row_group_rows=RG)
    return out


def _files(ds: Path, table: str) -> list[str]:
    return [str(f) for f in Dataset(ds).files(table)]


_DUCKDB: list[duckdb.DuckDBPyConnection] = []


def _duckdb() -> duckdb.DuckDBPyConnection:
    """One in-memory DuckDB connection for this module's checks (each new one cost ~50 ms), with
    no cache of file contents: every query reads the files as they are now."""
    if not _DUCKDB:
        _DUCKDB.append(duckdb.connect(config={"enable_external_file_cache": False}))
    return _DUCKDB[0]


def _same_rows(a: Path, b: Path, table: str) -> None:
    fa, fb = _files(a, table), _files(b, table)
    assert len(fa) > 0 or len(fb) == 0
    if not fa:
        assert Dataset(b).num_rows(table) == 0
        return
    con = _duckdb()
    q = "select count(*) from (select * from read_parquet({x}, hive_partitioning=false) except all select * from read_parquet({y}, hive_partitioning=false))"
    assert con.sql(q.format(x=fa, y=fb)).fetchall()[0] == (0,), table
    assert con.sql(q.format(x=fb, y=fa)).fetchall()[0] == (0,), table
    n = con.sql(f"select count(*) from read_parquet({fa}, hive_partitioning=false)").fetchall()[0][0]  # type: ignore[index]
    assert con.sql(f"select count(*) from read_parquet({fb}, hive_partitioning=false)").fetchall()[0] == (n,)
    assert Dataset(a).num_rows(table) == Dataset(b).num_rows(table) == n


def _listed_only(ds: Path) -> None:
    """Every Parquet file under the table folders is listed; no staging folder, no temp file."""
    m = json.loads((ds / MANIFEST).read_text())
    listed = {f for e in m["tables"].values() for f in e["files"]}
    on_disk = {str(p.relative_to(ds)) for t in TABLES if (ds / t).exists() for p in (ds / t).rglob("*") if p.is_file()}
    assert on_disk == listed
    assert not (ds / "_staging").exists()
    for t in KEYS:  # no empty bucket folders either
        for d in (ds / t).glob("bucket=*"):
            assert any(d.iterdir()), d


def _snapshot(ds: Path) -> dict[str, object]:
    """The tables entries of the manifest and every listed part's content (Arrow tables: equal
    when their schemas and values are)."""
    m = json.loads((ds / MANIFEST).read_text())
    content = {f: pq.read_table(ds / f) for e in m["tables"].values() for f in e["files"]}
    return {"tables": m["tables"], "content": content}


# --------------------------------------------------------------------------------------------
# The layout
# --------------------------------------------------------------------------------------------
def test_rows_unchanged(flat: Path, opt: Path) -> None:
    for t in TABLES:
        _same_rows(flat, opt, t)
    # the other tables and the rejects are copied as they were
    mf, mo = (json.loads((d / MANIFEST).read_text()) for d in (flat, opt))
    for t in set(TABLES) - set(KEYS):
        assert mo["tables"][t] == mf["tables"][t]
    rejects = [i["rejects_file"] for i in mf["inputs"].values() if i.get("rejects_file")]
    assert rejects, "the synthetic cell has rejects"
    for r in rejects:
        assert (opt / r).read_bytes() == (flat / r).read_bytes()
    _listed_only(opt)


def test_every_row_in_its_bucket(opt: Path) -> None:
    ds = Dataset(opt)
    for t, key in KEYS.items():
        lay = ds.layout(t)
        assert lay == {"key": list(key), "buckets": 4, "hash": HASH_NAME, "order": ORDER[t]}
        per = ds.bucket_files(t)
        assert len(per) == 4
        for k, files in enumerate(per):
            for f in files:
                assert f.parent.name == f"bucket={k}"
                cols = pq.read_table(f, columns=list(key)).to_pydict()
                for row in set(zip(*(cols[c] for c in key), strict=True)):
                    assert ref_bucket(row, 4) == k, (t, row, k)


def test_instances_colocated(opt: Path) -> None:
    con = duckdb.connect()
    q = """
        select count(*) from
          (select distinct collection_id, instance_index, bucket
             from read_parquet('{d}/instance_usage/*/*.parquet', hive_partitioning=true)) u
        join
          (select distinct collection_id, instance_index, bucket
             from read_parquet('{d}/instance_events/*/*.parquet', hive_partitioning=true)) e
        using (collection_id, instance_index)
        where u.bucket <> e.bucket
    """
    assert con.sql(q.format(d=opt)).fetchall()[0] == (0,)
    both = con.sql(
        f"select count(*) from (select distinct collection_id, instance_index from '{opt}/instance_usage/*/*.parquet') "
        f"join (select distinct collection_id, instance_index from '{opt}/instance_events/*/*.parquet') "
        "using (collection_id, instance_index)"
    ).fetchall()[0]
    assert both is not None and both[0] > 50


def test_time_ordered_bounded_row_groups_plain_parquet(opt: Path) -> None:
    multi = 0
    for t in KEYS:
        for f in Dataset(opt).files(t):
            pf = pq.ParquetFile(f)
            assert pf.schema_arrow == SCHEMAS[t], f  # canonical schema: no bucket column in the file
            md = pf.metadata
            multi += md.num_row_groups > 1
            for g in range(md.num_row_groups):
                assert md.row_group(g).num_rows <= RG
                assert md.row_group(g).column(0).compression == "ZSTD"
            tbl = pf.read()
            times = tbl.column(ORDER[t]).to_pylist()
            assert times == sorted(times), f
            # ties on time keep key order
            keys = list(zip(times, *(tbl.column(c).to_pylist() for c in KEYS[t]), strict=True))
            assert keys == sorted(keys), f
    assert multi > 0


def test_duckdb_hive_bucket_column_is_the_folder(opt: Path) -> None:
    rows = duckdb.sql(
        f"select distinct bucket, filename from read_parquet('{opt}/instance_usage/*/*.parquet', "
        "hive_partitioning=true, filename=true)"
    ).fetchall()
    assert len(rows) == 4
    for b, fn in rows:
        assert Path(fn).parent.name == f"bucket={b}"
    import pandas as pd

    df = pd.read_parquet(opt / "machine_events")
    assert len(df) == Dataset(opt).num_rows("machine_events")
    assert sorted(df["bucket"].astype(int).unique()) == [
        k for k, f in enumerate(Dataset(opt).bucket_files("machine_events")) if f
    ]


def test_dataset_read_and_api(flat: Path, opt: Path) -> None:
    d = Dataset(opt)
    assert d.layout("instance_constraints") is None
    with pytest.raises(DatasetError, match="not bucketed"):
        d.bucket_files("instance_constraints")
    assert d.layout("collection_events")["key"] == ["collection_id"]
    assert Dataset(flat).layout("instance_usage") is None
    assert d.read("instance_usage").schema == SCHEMAS["instance_usage"]
    assert d.read("instance_usage").num_rows == Dataset(flat).num_rows("instance_usage")


def test_empty_buckets(flat: Path, tmp_path: Path) -> None:
    optimize(flat, buckets=64, out=tmp_path / "o")
    d = Dataset(tmp_path / "o")
    per = d.bucket_files("machine_events")
    assert len(per) == 64 and any(f == [] for f in per) and sum(map(len, per)) == len(d.files("machine_events"))
    assert len(d.bucket_files("machine_attributes")) == 64


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda m: m["tables"]["instance_usage"]["layout"].update(hash="murmur3"), "unknown"),
        (lambda m: m["tables"]["instance_events"]["layout"].update(buckets=5), "same bucket count"),
        (lambda m: m["tables"]["instance_usage"]["layout"].update(key=["machine_id"]), "bucketing key"),
        (lambda m: m["tables"]["instance_usage"]["files"].append("instance_usage/part-x.parquet"), "bucket="),
        (
            lambda m: m["tables"]["instance_constraints"].update(layout=m["tables"]["instance_usage"]["layout"]),
            "cannot be bucketed",
        ),
    ],
)
def test_bad_layout_refused(opt: Path, tmp_path: Path, change, match: str) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path / "ds"
    d.mkdir()
    m = json.loads((opt / MANIFEST).read_text())
    change(m)
    (d / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(DatasetError, match=match):
        Dataset(d)


def test_engine_results_identical(flat: Path, opt: Path) -> None:
    from gpuclust.analyses import names
    from gpuclust.engine import run

    all_names = list(names())
    assert_results_same(run(Dataset(flat), all_names), run(Dataset(opt), all_names))


def test_many_input_parts_and_few_open_spill_files(bench_flat: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    optimize(bench_flat, buckets=5, out=a, row_group_rows=RG)
    optimize(bench_flat, buckets=5, out=b, row_group_rows=RG, max_open=2)  # spill files rotate
    for t in KEYS:
        _same_rows(bench_flat, a, t)
    sa, sb = _snapshot(a), _snapshot(b)
    assert sa["content"] == sb["content"]


def test_in_place_idempotent_and_rebucket(flat: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuclust.cli import main

    d = tmp_path / "ds"
    shutil.copytree(flat, d)
    old = {t: Dataset(d).files(t) for t in KEYS}
    assert main(["optimize", str(d), "--buckets", "3", "--no-progress"]) == 0
    assert all(not f.exists() for fs in old.values() for f in fs)  # the flat parts are gone
    for t in TABLES:
        _same_rows(flat, d, t)
    _listed_only(d)
    snap = _snapshot(d)
    capsys.readouterr()
    assert main(["optimize", str(d), "--buckets", "3", "--no-progress"]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert _snapshot(d) == snap
    assert main(["optimize", str(d), "--buckets", "5", "--no-progress"]) == 0
    assert Dataset(d).layout("machine_events")["buckets"] == 5  # type: ignore[index]
    for t in TABLES:
        _same_rows(flat, d, t)
    _listed_only(d)
    # the default bucket count: ceil(usage rows / 1 Mi), at least 16
    assert main(["optimize", str(d), "--no-progress"]) == 0
    assert (
        Dataset(d).layout("instance_usage")["buckets"]
        == default_buckets(Dataset(flat).num_rows("instance_usage"))
        == 16
    )  # type: ignore[index]
    _listed_only(d)


def test_ingest_adds_to_a_bucketed_dataset_and_lays_it_out_again(flat: Path, ingested: Path, tmp_path: Path) -> None:
    """A bucketed dataset (what ingest writes) takes new files: they are ingested, then the four
    key-partitioned tables are laid out again, as one ingest of every file lays them out (the
    ``ingested`` fixture's)."""
    from gpuclust.ingest import ingest

    raw = sorted(p for p in (flat.parent / "raw").iterdir() if p.name.endswith(".json.gz"))
    usage = [p for p in raw if p.name.startswith("instance_usage")]
    rest = [p for p in raw if p not in usage]
    d, once = tmp_path / "ds", ingested
    assert ingest(rest, d, workers=1).layout == "bucketed"
    assert Dataset(d).num_rows("instance_usage") == 0 and Dataset(d).layout("instance_usage") is not None
    rep = ingest(raw, d, workers=1)  # the usage shards are new, the rest is skipped
    assert rep.layout == "bucketed" and {f.status for f in rep.files} == {"done", "skipped"}
    for t in TABLES:
        _same_rows(d, once, t)
    assert Dataset(d).layout("instance_usage") == Dataset(once).layout("instance_usage")
    m = json.loads((d / "manifest.json").read_text())
    assert all(not any(o.split("/")[0] in KEYS for o in inp["outputs"]) for inp in m["inputs"].values())
    # a re-run with nothing new changes nothing
    before = (d / "manifest.json").read_bytes()
    assert {f.status for f in ingest(raw, d, workers=1).files} == {"skipped"}
    assert (d / "manifest.json").read_bytes() == before


# --------------------------------------------------------------------------------------------
# Crashes
# --------------------------------------------------------------------------------------------
def _rerun(*args: str) -> int:
    """``gpuclust ARGS`` (the run after a kill, or a clean run to compare with) in this process:
    its exit status; no kill point is set here."""
    from gpuclust.cli import main

    assert KILL_ENV not in os.environ
    return main(list(args))


def _cli(args: list[str], kill: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != KILL_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if kill:
        env[KILL_ENV] = kill
    return subprocess.run(
        [sys.executable, "-m", "gpuclust", "optimize", *args], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def clean_in_place(flat: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    d = tmp_path_factory.mktemp("clean") / "ds"
    shutil.copytree(flat, d)
    assert _rerun("optimize", str(d), "--buckets", "3", "--no-progress") == 0
    return _snapshot(d)


@pytest.mark.slow
@pytest.mark.parametrize("kill", ["spill:3", "part:5", "move:4", "swap:1"])
def test_kill_then_rerun_in_place(flat: Path, tmp_path: Path, clean_in_place: dict[str, object], kill: str) -> None:
    d = tmp_path / "ds"
    shutil.copytree(flat, d)
    r = _cli([str(d), "--buckets", "3", "--no-progress"], kill=kill)
    assert r.returncode == -signal.SIGKILL, r.stderr
    after = Dataset(d)  # opens, and reads exactly the old rows or the complete new layout
    assert (after.layout("instance_usage") is None) == (kill != "swap:1")
    for t in TABLES:
        _same_rows(flat, d, t)
    if kill != "swap:1":  # a flat glob still counts exactly what the manifest lists
        n = duckdb.sql(f"select count(*) from '{d}/instance_usage/*.parquet'").fetchall()[0]
        assert n == (after.num_rows("instance_usage"),)
    assert _rerun("optimize", str(d), "--buckets", "3", "--no-progress") == 0
    assert _snapshot(d) == clean_in_place
    _listed_only(d)


@pytest.mark.slow
def test_kill_then_rerun_out(flat: Path, opt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    r = _cli([str(flat), "--buckets", "4", "--out", str(out), "--no-progress"], kill="move:3")
    assert r.returncode == -signal.SIGKILL
    with pytest.raises(DatasetError):
        Dataset(out)  # no manifest yet: not presented as a dataset
    assert _rerun("optimize", str(flat), "--buckets", "4", "--out", str(out), "--no-progress") == 0
    for t in TABLES:
        _same_rows(flat, out, t)
    _listed_only(out)
    # same run again: nothing to do
    capsys.readouterr()
    assert _rerun("optimize", str(flat), "--buckets", "4", "--out", str(out), "--no-progress") == 0
    assert "nothing to do" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# Command-line errors: one line, no traceback, exit 2
# --------------------------------------------------------------------------------------------
def test_cli_errors(flat: Path, tmp_path: Path) -> None:
    inc = tmp_path / "inc"
    shutil.copytree(flat, inc)
    m = json.loads((inc / MANIFEST).read_text())
    m["complete"] = False
    (inc / MANIFEST).write_text(json.dumps(m))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x.txt").write_text("mine")
    cases = [
        ([str(tmp_path / "nope")], "nope: no such folder"),
        ([str(inc)], "not completed"),
        ([str(flat), "--buckets", "0", "--out", str(tmp_path / "z")], "--buckets must be an integer >= 1"),
        ([str(flat), "--buckets", "x"], "invalid int value"),
        ([str(flat), "--out", str(busy)], "not empty"),
    ]
    for args, msg in cases:
        r = _cli(args)
        assert r.returncode == 2, (args, r.stderr)
        assert msg in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert (busy / "x.txt").read_text() == "mine"
    with pytest.raises(OptimizeUsageError):
        optimize(flat, buckets=True, out=tmp_path / "zz")  # type: ignore[arg-type]


def _ingest_cli(raw: Path, out: Path, kill: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != KILL_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if kill:
        env[KILL_ENV] = kill
    return subprocess.run(
        [sys.executable, "-m", "gpuclust", "ingest", str(raw), "--out", str(out), "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def ingested(flat: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The flat fixture's raw files ingested as `gpuclust ingest` does by default (the command, in
    this process): laid out."""
    out = tmp_path_factory.mktemp("ingested") / "ds"
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        assert _rerun("ingest", str(flat.parent / "raw"), "--out", str(out), "--no-progress") == 0
    assert "laid out by instance and machine" in said.getvalue(), said.getvalue()
    return out


@pytest.mark.parametrize("kill", ["spill:2", "swap:1"])
def test_ingest_killed_in_its_layout_step_then_rerun_equals_a_clean_run(
    flat: Path, ingested: Path, tmp_path: Path, kill: str
) -> None:
    """A kill -9 while ingest lays the dataset out leaves the flat dataset (or the whole new
    layout); the same command again gives what a clean run gives, part for part."""
    d = tmp_path / "ds"
    r = _ingest_cli(flat.parent / "raw", d, kill)
    assert r.returncode == -signal.SIGKILL, r.stdout + r.stderr
    assert _rerun("ingest", str(flat.parent / "raw"), "--out", str(d), "--no-progress") == 0
    for t in TABLES:
        assert Dataset(d).layout(t) == Dataset(ingested).layout(t)
        _same_rows(d, ingested, t)
    parts = {p.relative_to(d).as_posix(): p.read_bytes() for p in d.rglob("*.parquet")}
    assert parts == {p.relative_to(ingested).as_posix(): p.read_bytes() for p in ingested.rglob("*.parquet")}
    assert not (d / "_staging").exists()
