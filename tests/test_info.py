"""`gpuclust info DATASET`: what a user checks before trusting a dataset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from strategies import random_cell, write_dataset

from gpuclust.cli import main
from gpuclust.schema import TABLES


@pytest.fixture
def tables():
    return random_cell(2, n_machines=6, n_instances=30, n_windows=200)


@pytest.fixture
def ds(tables, tmp_path):
    path = write_dataset(tmp_path / "ds", tables, files=2)
    m = json.loads((path / "manifest.json").read_text())
    m["inputs"] = {
        "abc": {
            "path": "/raw/instance_usage-0.json.gz",
            "status": "done",
            "rows_read": 205,
            "rows_rejected": 5,
            "rows_deduplicated": 0,
            "first_reasons": ["line 3: bad INT64"],
        }
    }
    (path / "manifest.json").write_text(json.dumps(m))
    return path


def info(capsys, *args):
    rc = main(["info", *map(str, args)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_text(ds, tables, capsys):
    rc, out, err = info(capsys, ds)
    assert rc == 0 and err == ""
    assert "trace        v3   cell test" in out and "tier map     notebook (free >= 0" in out
    for t in TABLES:
        n = tables[t].num_rows if t in tables else 0
        assert any(line.split()[:2] == [t, f"{n:,}"] for line in out.splitlines()), t
    assert "rejects      5 row(s)" in out and "line 3: bad INT64" in out
    assert "complete     yes" in out
    assert "  cell-usage           runs" in out


def test_json(ds, tables, capsys):
    rc, out, _ = info(capsys, ds, "--json")
    d = json.loads(out)
    assert rc == 0 and d["trace_version"] == "v3" and d["cell"] == "test" and d["tier_map"] == "notebook"
    u = d["tables"]["instance_usage"]
    assert u["rows"] == tables["instance_usage"].num_rows and u["files"] == 2 and u["bytes"] > 0
    import pyarrow.compute as pc

    assert u["time_min"] == pc.min(tables["instance_usage"]["start_time"]).as_py()
    assert u["time_max"] == max(pc.max(tables["instance_usage"][c]).as_py() for c in ("start_time", "end_time"))
    assert d["rejects"]["rows"] == 5 and d["complete"] is True and d["analyses"]["machine-shapes"] == "runs"


def test_incomplete_and_missing_files(ds, capsys):
    m = json.loads((ds / "manifest.json").read_text())
    m["complete"] = False
    m["inputs"]["def"] = {"path": "/raw/broken.json.gz", "status": "failed", "error": "truncated gzip"}
    (ds / "manifest.json").write_text(json.dumps(m))
    next((ds / "machine_events").glob("*.parquet")).unlink()
    rc, out, _ = info(capsys, ds)
    assert rc == 0
    assert "complete     NO (ingest has not finished: re-run it)" in out
    assert (
        "failed input /raw/broken.json.gz: failed truncated gzip" in out and "missing part file machine_events/" in out
    )


def test_other_version_tier_map_and_missing_tables(tables, tmp_path, capsys):
    path = write_dataset(
        tmp_path / "v2", {"machine_events": tables["machine_events"]}, tier_map="notebook", trace_version="v2"
    )
    rc, out, _ = info(capsys, path)
    assert rc == 0 and "warning: tier map 'notebook' is for v3 traces but the dataset is v2" in out
    assert "  cpi                  needs instance_usage" in out and "  machine-shapes       runs" in out


@pytest.mark.parametrize(
    ("make", "why"), [(lambda p: p / "missing", "no such folder"), (lambda p: p, "not a gpuclust dataset")]
)
def test_not_a_dataset(make, why, tmp_path, capsys):
    rc, out, err = info(capsys, make(tmp_path))
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("gpuclust info: error: ") and why in err


def test_readme_cli_tour_has_info():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    tour = readme.split("## CLI tour", 1)[1].split("\n## ", 1)[0]
    assert "gpuclust info " in tour


def test_layout_flat_then_bucketed(ds, capsys):
    rc, out, _ = info(capsys, ds)
    assert rc == 0 and "layout       flat" in out
    from gpuclust.optimize import optimize

    optimize(ds, buckets=3, progress=False)
    rc, out, _ = info(capsys, ds)
    assert rc == 0
    assert (
        "layout       bucketed: instance_usage, instance_events by "
        "collection_id,instance_index into 3 buckets; collection_events by collection_id into 3 buckets; "
        "machine_events, machine_attributes by machine_id into 3 buckets"
    ) in out
    d = json.loads(info(capsys, ds, "--json")[1])
    assert d["tables"]["instance_usage"]["layout"]["buckets"] == 3
    assert d["tables"]["collection_events"]["layout"]["key"] == ["collection_id"]
    assert d["tables"]["instance_constraints"]["layout"] is None
