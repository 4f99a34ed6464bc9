"""Issue 33, "a new user's first hour has no surprises", at the command line: a fault is one line
naming the file and the reason, with no traceback and the exit status of the one convention
(docs/analyses/README.md, "Exit codes"); and the small things a new user meets first (percentile
column order, cpi's group list, data-quality's row count, re-ingest, ``gpuclust.load_results``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from ingest.conftest import records, write_json
from strategies import random_cell, write_dataset

import gpuclust
from gpuclust.cli import main
from gpuclust.schema import CPU_PERCENTILE_COLUMNS_SORTED


@pytest.fixture(scope="module")
def cell():
    return random_cell(2, n_machines=12, n_instances=30, n_windows=200)


@pytest.fixture
def ds(cell, tmp_path):
    return write_dataset(tmp_path / "ds", cell, files=2)


def cli(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def error_line(err: str, command: str) -> str:
    """The one line an expected fault prints (no traceback, nothing else on stderr)."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpuclust {command}: error: "), err
    return lines[0]


# ---------------------------------------------------------------------------------------------
# Faults: one line naming the file and the reason, exit 2
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["info", "optimize", "analyze", "report"])
def test_a_part_file_replaced_by_garbage_is_named(command, ds, tmp_path, capsys):
    part = sorted((ds / "instance_usage").glob("*.parquet"))[0]
    part.write_bytes(b"not a parquet file\n" * 40)
    args = {
        "info": [ds],
        "optimize": [ds, "--out", tmp_path / "opt", "--no-progress"],
        "analyze": [ds, "cpi", "--out", tmp_path / "r", "--quiet"],
        "report": [ds, "cpi", "--out", tmp_path / "r.html", "--quiet"],
    }[command]
    rc, out, err = cli(capsys, command, *args)
    line = error_line(err, command)
    assert rc == 2 and f"{part}: not a readable Parquet file (" in line, line


@pytest.mark.parametrize("command", ["analyze", "optimize"])
def test_damaged_pages_behind_a_good_footer_are_named(command, ds, tmp_path, capsys):
    part = sorted((ds / "instance_usage").glob("*.parquet"))[0]
    data = bytearray(part.read_bytes())
    data[4:400] = b"\xff" * 396  # the first pages; the footer (metadata) is intact
    part.write_bytes(bytes(data))
    args = [ds, "cpi", "--out", tmp_path / "r", "--quiet"] if command == "analyze" else [ds, "--no-progress"]
    rc, _, err = cli(capsys, command, *args)
    assert rc == 2 and f"{part}: not a readable Parquet file (" in error_line(err, command)


def test_synth_out_is_a_file(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("mine")
    rc, out, err = cli(capsys, "synth", "--out", f, "--quiet", "--machines", "2", "--hours", "0.1")
    assert rc == 2 and error_line(err, "synth") == f"gpuclust synth: error: {f}: exists and is not a folder"
    assert f.read_text() == "mine"


def test_synth_out_in_a_read_only_folder(tmp_path, capsys, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    real_mkdir = Path.mkdir

    def mkdir(self, *a, **kw):  # what a read-only folder does (also for root, which chmod would not stop)
        if self.parent == ro:
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *a, **kw)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    rc, _, err = cli(capsys, "synth", "--out", ro / "raw", "--quiet", "--machines", "2", "--hours", "0.1")
    assert rc == 2 and error_line(err, "synth") == f"gpuclust synth: error: {ro / 'raw'}: Permission denied"


def test_an_out_that_is_a_file_is_the_same_fault_everywhere(ds, tmp_path, capsys):
    """ingest used to exit 1 where analyze / optimize exit 2: one convention, exit 2."""
    (tmp_path / "raw").mkdir()
    raw = write_json(tmp_path / "raw" / "machine_events-000000000000.json.gz", records("machine_events", 3))
    f = tmp_path / "afile"
    f.write_text("mine")
    for command, args in [
        ("ingest", [raw, "--out", f, "--no-progress"]),
        ("analyze", [ds, "machine-shapes", "--out", f, "--quiet"]),
        ("optimize", [ds, "--out", f, "--no-progress"]),
        ("synth", ["--out", f, "--quiet"]),
        ("report", [ds, "machine-shapes", "--out", f / "page.html", "--quiet"]),
    ]:
        rc, _, err = cli(capsys, command, *args)
        line = error_line(err, command)
        assert rc == 2 and str(f) in line and "not a" in line, (command, line)
    assert f.read_text() == "mine"


def test_scheduler_local_needs_a_worker_count(ds, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["analyze", str(ds), "machine-shapes", "--out", str(tmp_path / "r"), "--scheduler", "local:abc"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "invalid literal" not in err
    assert "argument --scheduler: scheduler 'local:abc': N in local:N is the number of worker processes" in err


def test_no_such_dataset_folder(tmp_path, capsys):
    for command in ("analyze", "info"):
        extra = ["machine-shapes", "--out", tmp_path / "r", "--quiet"] if command == "analyze" else []
        rc, _, err = cli(capsys, command, tmp_path / "no-such", *extra)
        assert rc == 2 and error_line(err, command).endswith(f"{tmp_path / 'no-such'}: no such folder"), err


def test_incomplete_dataset_names_the_cli_way_out(ds, tmp_path, capsys):
    m = json.loads((ds / "manifest.json").read_text())
    m["complete"] = False
    (ds / "manifest.json").write_text(json.dumps(m))
    rc, _, err = cli(capsys, "analyze", ds, "machine-shapes", "--out", tmp_path / "r", "--quiet")
    line = error_line(err, "analyze")
    assert rc == 2 and "allow_incomplete" not in line
    assert "re-run the same `gpuclust ingest` command" in line and "--max-reject-rate" in line
    assert "gpuclust info" in line


def test_exit_codes_are_documented():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "analyses" / "README.md").read_text()
    sec = doc.split("### Exit codes (every `gpuclust` command)", 1)[1].split("\n### ", 1)[0]
    from gpuclust.cli import COMMANDS
    from gpuclust.errors import EXIT_ERROR, EXIT_OK, EXIT_UNFINISHED

    assert all(f"`{c}`" in sec for c in COMMANDS)
    assert (EXIT_OK, EXIT_UNFINISHED, EXIT_ERROR) == (0, 1, 2)
    assert "| 0 | done |" in sec and "| 1 | `gpuclust ingest`" in sec and "| 2 | an expected fault" in sec


# ---------------------------------------------------------------------------------------------
# Small things
# ---------------------------------------------------------------------------------------------
def test_ingested_percentiles_in_numeric_order_and_reingest_says_already_ingested(tmp_path, capsys):
    (tmp_path / "raw").mkdir()
    raw = write_json(tmp_path / "raw" / "instance_usage-000000000000.json.gz", records("instance_usage", 20))
    out = tmp_path / "ds"
    rc, text, _ = cli(capsys, "ingest", raw, "--out", out, "--no-progress")
    assert rc == 0, text
    parts = sorted((out / "instance_usage").rglob("*.parquet"))
    names = pq.read_schema(parts[0]).names
    pcts = [c for c in names if c.startswith("cpu_p")]
    assert pcts == list(CPU_PERCENTILE_COLUMNS_SORTED) and pcts[-2:] == ["cpu_p99", "cpu_p100"]
    seen = pq.read_table(out / "instance_usage").column_names  # what pandas / DuckDB users see
    assert [c for c in seen if c.startswith("cpu_p")] == pcts
    rc, text, _ = cli(capsys, "ingest", raw, "--out", out, "--no-progress")
    assert rc == 0 and f"  {raw}: skipped, already ingested" in text.splitlines()


def test_a_dataset_with_source_ordered_percentiles_reads_the_same(cell, tmp_path):
    """Datasets written before hold cpu_p100 before cpu_p91: read by name, the same table."""
    from gpuclust.dataset import Dataset
    from gpuclust.schema import CPU_PERCENTILE_COLUMNS, SCHEMAS

    new = write_dataset(tmp_path / "new", cell)
    old = write_dataset(tmp_path / "old", cell)
    for f in (old / "instance_usage").glob("*.parquet"):
        t = pq.read_table(f)
        order = [c for c in t.column_names if not c.startswith("cpu_p")] + list(CPU_PERCENTILE_COLUMNS)
        pq.write_table(t.select(order), f)
    got = Dataset(old).read("instance_usage")
    assert got.schema.names == SCHEMAS["instance_usage"].names and got.equals(Dataset(new).read("instance_usage"))


def test_cpi_summary_says_how_many_groups_are_not_listed(cell, tmp_path, capsys):
    import numpy as np
    import pyarrow as pa

    u = cell["instance_usage"]
    rng = np.random.default_rng(3)
    for c, v in (("cpi", 1 + rng.random(u.num_rows)), ("mai", 0.01 + 0.01 * rng.random(u.num_rows))):
        u = u.set_column(u.schema.get_field_index(c), c, pa.array(v, pa.float32()))
    ds = write_dataset(tmp_path / "ds", {**cell, "instance_usage": u})
    rc, out, _ = cli(
        capsys,
        "analyze",
        ds,
        "cpi",
        "-O",
        "by=machine",
        "-O",
        "min_cpu_seconds=0",
        "--out",
        tmp_path / "r",
        "--quiet",
        "--no-plots",
    )
    groups = pq.read_table(tmp_path / "r" / "cpi" / "groups.parquet").num_rows
    assert rc == 0 and groups > 8
    assert f"  {groups} group(s) by machine, the 8 with the most CPU time:" in out
    assert f"    ... {groups - 8} more (every group is in the groups table)" in out


def test_data_quality_progress_counts_the_rows_its_passes_read(cell, tmp_path, capsys):
    events = {t: v for t, v in cell.items() if t != "instance_usage"}  # as a v2 dataset without usage
    ds = write_dataset(tmp_path / "v2", events, trace_version="v2", tier_map="v2")
    rc, _, err = cli(capsys, "analyze", ds, "data-quality", "--out", tmp_path / "r", "--no-plots")
    read = sum(events[t].num_rows for t in ("instance_events", "collection_events", "machine_events"))
    assert rc == 0 and read > 0
    done = re.search(r"analyze: done, ([\d,]+) rows", err)
    assert done and int(done.group(1).replace(",", "")) == read, err


def test_load_results_is_public(ds, tmp_path, capsys):
    assert "load_results" in gpuclust.__all__ and "results folder" in (gpuclust.load_results.__doc__ or "")
    out = tmp_path / "r"
    rc, _, _ = cli(capsys, "analyze", ds, "machine-shapes", "overcommit", "--out", out, "--quiet", "--no-plots")
    assert rc == 0
    res = gpuclust.load_results(out)
    assert sorted(res) == ["machine-shapes", "overcommit"]
    assert res["machine-shapes"]["shapes"].equals(pq.read_table(out / "machine-shapes" / "shapes.parquet").to_pandas())
    assert res["overcommit"]["machine"].read().equals(pq.read_table(out / "overcommit" / "machine").to_pandas())
    with pytest.raises(FileNotFoundError, match="no such folder"):
        gpuclust.load_results(tmp_path / "nope")
    with pytest.raises(ValueError, match="not a gpuclust results folder"):
        gpuclust.load_results(ds)


def test_the_public_functions_document_their_parameters_with_examples():
    """Every function ``gpuclust`` exports has numpydoc ``Parameters`` and ``Examples`` sections
    (shared/DESIGN.md); the runnable examples run in tests/analyses/test_base.py."""
    import inspect

    missing = []
    for name in gpuclust.__all__:
        obj = getattr(gpuclust, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            doc = inspect.getdoc(obj) or ""
            missing += [f"{name}: {sec}" for sec in ("Parameters\n---", "Examples\n---") if sec not in doc]
    assert not missing, missing
