"""Writer, manifest, resume, detection, CLI and progress."""

from __future__ import annotations

import argparse
import io
import json
import os
from pathlib import Path

import pytest

from gpuclust.dataset import Dataset
from gpuclust.ingest import ingest
from gpuclust.ingest.api import IngestUsageError
from gpuclust.ingest.base import ReadOptions
from gpuclust.ingest.detect import DetectError, detect, expand_sources
from gpuclust.ingest.progress import Progress
from gpuclust.schema import TABLES, TIER_MAPS

from .conftest import records, write_json, write_parquet

OPTS = ReadOptions(chunk_bytes=4096, threads=1)


def _inputs(d: Path) -> list[Path]:
    return [
        write_json(d / "machine_events-000000000000.json.gz", records("machine_events", 400, seed=1)),
        write_json(d / "machine_events-000000000001.json.gz", records("machine_events", 300, seed=2)),
        write_json(d / "instance_events-000000000000.json.gz", records("instance_events", 300, seed=3)),
        write_parquet(
            d / "machine_attributes-000000000000.parquet",
            "machine_attributes",
            records("machine_attributes", 100, seed=4),
        ),
    ]


def _snapshot(out: Path) -> dict[str, list]:
    ds = Dataset(out, allow_incomplete=True)
    return {t: sorted(map(json.dumps, ds.read(t).to_pylist())) for t in TABLES}


def test_manifest(tmp_path: Path) -> None:
    files = _inputs(tmp_path)
    out = tmp_path / "ds"
    rep = ingest(files, out, cell="a", opts=OPTS, workers=1, extra_manifest={"synthetic": {"seed": 1}})
    assert rep.exit_status == 0 and rep.complete
    m = json.loads((out / "manifest.json").read_text())
    assert m["dataset_format_version"] == 1 and m["trace_version"] == "v3" and m["cell"] == "a"
    assert m["tier_map"] == TIER_MAPS["notebook"].to_json()
    assert m["complete"] is True and m["synthetic"] == {"seed": 1}
    assert len(m["inputs"]) == 4
    for sha, inp in m["inputs"].items():
        assert (
            inp["content_hash"] == sha
            and m["content_hash"] == "blake3"
            and inp["status"] == "done"
            and inp["error"] is None
        )
        assert Path(inp["path"]).is_file() and inp["size"] == Path(inp["path"]).stat().st_size
        assert (
            inp["rows_read"]
            == sum(inp["rows_written"].get(t, 0) for t in inp["rows_written"] if t != "instance_constraints")
            + inp["rows_rejected"]
        )
        for rel in inp["outputs"]:
            assert (out / rel).is_file() and Path(rel).name.startswith(f"part-{sha[:16]}-")
    assert m["tables"]["machine_events"]["rows"] == 700
    assert m["tables"]["instance_events"]["rows"] == 300
    assert m["tables"]["machine_attributes"]["rows"] == 100
    ds = Dataset(out)
    for t in TABLES:
        assert ds.read(t).num_rows == m["tables"][t]["rows"]
    assert rep.rows_written["machine_events"] == 700


def test_rerun_skips_done_and_duplicates(tmp_path: Path) -> None:
    files = _inputs(tmp_path)
    out = tmp_path / "ds"
    ingest(files[:2], out, opts=OPTS, workers=1, layout="flat")
    mtimes = {p: p.stat().st_mtime_ns for p in (out / "machine_events").iterdir()}
    dup = tmp_path / "copy" / "machine_events-000000000000.json.gz"
    dup.parent.mkdir()
    dup.write_bytes(files[0].read_bytes())
    rep = ingest([*files, dup], out, opts=OPTS, workers=1, layout="flat")
    status = {Path(f.path).name if f.status != "duplicate" else "dup": f.status for f in rep.files}
    assert status["machine_events-000000000000.json.gz"] == "skipped"
    assert status["machine_events-000000000001.json.gz"] == "skipped"
    assert status["instance_events-000000000000.json.gz"] == "done"
    assert status["dup"] == "duplicate"
    assert any("same content" in w for w in rep.warnings)
    assert {p: p.stat().st_mtime_ns for p in (out / "machine_events").iterdir()} == mtimes
    assert Dataset(out).num_rows("machine_events") == 700


def test_parallel_equals_serial(tmp_path: Path) -> None:
    files = _inputs(tmp_path)
    a = ingest(files, tmp_path / "a", opts=OPTS, workers=1)
    log = io.StringIO()
    b = ingest(files, tmp_path / "b", opts=OPTS, workers=2, progress=Progress(log, log_interval=0.0))
    assert a.ok and b.ok
    assert _snapshot(tmp_path / "a") == _snapshot(tmp_path / "b")
    ma = json.loads((tmp_path / "a" / "manifest.json").read_text())
    mb = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert ma["tables"] == mb["tables"]
    # Progress in log mode (fed by the worker processes through a queue): one line per file.
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert sum("[" in ln and "done)" in ln for ln in lines) == 4
    assert any("rows/s" in ln for ln in lines)


def test_leftovers_removed(tmp_path: Path) -> None:
    files = _inputs(tmp_path)[:1]
    out = tmp_path / "ds"
    ingest(files, out, opts=OPTS)
    junk = [
        out / "machine_events" / "part-deadbeefdeadbeef-00000.parquet",
        out / "machine_events" / ".part-x.parquet.123.tmp",
        out / "_rejects" / "part-deadbeefdeadbeef.jsonl",
    ]
    for j in junk:
        j.parent.mkdir(exist_ok=True)
        j.write_bytes(b"junk")
    mine = out / "machine_events" / "README-user-file.txt"
    mine.write_text("not ours")
    ingest(files, out, opts=OPTS)
    assert not any(j.exists() for j in junk)
    assert mine.exists()


def test_reject_threshold(tmp_path: Path) -> None:
    lines = ['{"time":"1","machine_id":"2","type":"1"}'] * 95 + ["{bad"] * 5
    f = write_json(tmp_path / "machine_events-000000000000.json.gz", lines)
    rep = ingest([f], tmp_path / "a", max_reject_rate=0.01)
    # Issue 7: an input over the threshold is not done, so the dataset is not complete.
    assert rep.exit_status == 1 and rep.over_threshold and not rep.complete
    assert rep.files[0].status == "failed" and "over --max-reject-rate" in (rep.files[0].error or "")
    assert "over the threshold" in rep.summary() and "invalid JSON" in rep.summary()
    assert "complete: true" not in rep.summary() and rep.summary().splitlines()[-1].startswith("dataset unfinished")
    assert not json.loads((tmp_path / "a" / "manifest.json").read_text())["complete"]
    # the re-run retries it (and fails it again: same content, same threshold) ...
    again = ingest([f], tmp_path / "a", max_reject_rate=0.01)
    assert again.files[0].status == "failed" and not again.complete
    # ... until the threshold allows it
    assert ingest([f], tmp_path / "a", max_reject_rate=0.05).complete
    rep = ingest([f], tmp_path / "b", max_reject_rate=0.05)
    assert rep.exit_status == 0
    assert rep.files[0].rejects_file == f"_rejects/part-{rep.files[0].content_hash[:16]}.jsonl"
    assert len((tmp_path / "b" / rep.files[0].rejects_file).read_text().splitlines()) == 5


def test_usage_errors(tmp_path: Path) -> None:
    v3 = write_json(tmp_path / "machine_events-000000000000.json.gz", records("machine_events", 5))
    v2 = tmp_path / "task_events" / "part-00000-of-00500.csv"
    v2.parent.mkdir()
    v2.write_text("0,,1,2,3,0,u,0,0,0.1,0.1,0,0\n")
    with pytest.raises(IngestUsageError, match="mix trace versions"):
        ingest([v3, v2], tmp_path / "ds")
    with pytest.raises(FileNotFoundError):
        ingest([tmp_path / "nope.json.gz"], tmp_path / "ds")
    ingest([v3], tmp_path / "ds", cell="a")
    with pytest.raises(IngestUsageError, match="cell"):
        ingest([v3], tmp_path / "ds", cell="b")
    with pytest.raises(IngestUsageError, match="tier map"):
        ingest([v3], tmp_path / "ds", tier_map="v3-doc")
    with pytest.raises(IngestUsageError, match="reserved"):
        ingest([v3], tmp_path / "ds2", extra_manifest={"inputs": {}})


def test_detection(tmp_path: Path) -> None:
    def mk(rel: str, data: bytes) -> Path:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        return p

    a = mk("x/instance_usage/000.json", b'{"start_time":"1"}\n')
    assert (detect(a).format, detect(a).source_table) == ("v3-json", "instance_usage")
    b = mk("x/task_usage/part-00000-of-00500.csv.gz", __import__("gzip").compress(b"1,2,3\n"))
    sb = detect(b)
    assert (sb.format, sb.source_table, sb.compression, sb.trace_version) == ("v2-csv", "task_usage", "gzip", "v2")
    k = mk("y/some_sample.csv", b",time,instance_events_type,collection_id,scheduling_class\n0,1,2,3,4\n")
    assert (detect(k).format, detect(k).source_table) == ("kaggle-csv", "borg_traces_data")
    k2 = mk("y/borg_traces_data.csv", b"whatever\n")
    assert detect(k2).format == "kaggle-csv"
    u = mk("y/mystery.bin", b"\x00\x01hello")
    with pytest.raises(DetectError, match="mystery.bin"):
        detect(u)
    nt = mk("y/events.json", b'{"time":"1"}\n')
    with pytest.raises(DetectError, match="--table"):
        detect(nt)
    s = detect(nt, table="machine_events")
    assert s.source_table == "machine_events"
    with pytest.raises(DetectError, match="not a v3-json table"):
        detect(nt, table="task_usage")
    forced = detect(nt, format="v3-json", table="machine_attributes")
    assert forced.source_table == "machine_attributes"
    mk("x/instance_usage/README.md", b"doc")
    mk("x/.hidden/instance_usage-1.json", b"{}")
    assert expand_sources([tmp_path / "x"]) == [b, a] or expand_sources([tmp_path / "x"]) == sorted([a, b])


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write_json(tmp_path / "machine_events-000000000000.json.gz", records("machine_events", 50))
    out = tmp_path / "ds"
    assert main(["ingest", str(f), "--out", str(out), "--cell", "a", "--no-progress"]) == 0
    txt = capsys.readouterr().out
    assert "50 read, 50 written, 0 rejected" in txt and "dataset complete: true" in txt
    assert main(["ingest", str(tmp_path / "missing.json.gz"), "--out", str(out), "--no-progress"]) == 2
    assert "missing.json.gz" in capsys.readouterr().err
    bad = tmp_path / "machine_events-000000000001.json.gz"
    bad.write_bytes(f.read_bytes()[:-10])
    assert main(["ingest", str(bad), "--out", str(tmp_path / "ds2"), "--no-progress"]) == 1
    assert "truncated" in capsys.readouterr().out
    assert (
        main(
            [
                "ingest",
                str(f),
                "--out",
                str(tmp_path / "ds3"),
                "--no-progress",
                "--max-reject-rate",
                "0",
                "--workers",
                "1",
                "--tier-map",
                "seed-002",
            ]
        )
        == 0
    )
    assert Dataset(tmp_path / "ds3").tier_map_name == "seed-002"


def main(argv: list[str]) -> int:
    """``gpuclust ingest`` alone (the full CLI also needs the other sub-commands' modules)."""
    from gpuclust.ingest.command import register

    p = argparse.ArgumentParser(prog="gpuclust")
    register(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    return int(args.func(args))


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_tty(tmp_path: Path) -> None:
    files = _inputs(tmp_path)[:2]
    tty = _Tty()
    ingest(files, tmp_path / "a", progress=Progress(tty, min_interval=0.0), opts=OPTS, workers=1)
    out = tty.getvalue()
    assert "\r[" in out and "rows/s" in out and "MB/s" in out
    assert out.count("done)") == 2


def test_lock(tmp_path: Path) -> None:
    import fcntl

    f = write_json(tmp_path / "machine_events-000000000000.json.gz", records("machine_events", 5))
    out = tmp_path / "ds"
    out.mkdir()
    with open(out / ".gpuclust-ingest.lock", "a+") as lk:
        fcntl.flock(lk.fileno(), fcntl.LOCK_EX)
        with pytest.raises(IngestUsageError, match="another ingest"):
            ingest([f], out)
    assert ingest([f], out).ok
    assert os.path.exists(out / "manifest.json")


def test_json_named_file_with_bad_first_line_is_json(tmp_path: Path) -> None:
    f = write_json(
        tmp_path / "machine_events-000000000000.json.gz",
        ['"not an object"', '{"time":"1","machine_id":"2","type":"1"}'],
    )
    assert detect(f).format == "v3-json"
    rep = ingest([f], tmp_path / "ds", max_reject_rate=1)
    assert rep.rows_read == 2 and rep.rows_rejected == 1 and rep.rows_written == {"machine_events": 1}
