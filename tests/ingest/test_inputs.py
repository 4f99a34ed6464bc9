"""Issue 7: what ingest does with files that are not what they seem.

Non-table files are skipped with a note; twin exports are refused unless ``--prefer`` picks one;
a file whose content is another format than its name says, an empty (0-byte) file and a
truncated one fail that input (not "done", dataset not complete, exit 1, retried by a re-run);
no traceback reaches the user.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuclust.cli import main
from gpuclust.dataset import Dataset
from gpuclust.ingest import ingest
from gpuclust.ingest.api import IngestUsageError
from gpuclust.ingest.detect import DetectError, detect, expand_sources

from .conftest import records, write_json, write_parquet

ROOT = Path(__file__).parents[2]
CSV_LINES = [
    "0,2,3418309,0,4155527081,0,70s3v5qRyCO/1PCdI6fVXnrW8FU/w+5CKRSa72xgcIo=,3,9,,,,",
    "0,2,3418314,0,4155527081,0,70s3v5qRyCO/1PCdI6fVXnrW8FU/w+5CKRSa72xgcIo=,3,9,,,,",
]


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


# -------------------------------------------------------------------------------------------
# 1. non-table files
# -------------------------------------------------------------------------------------------
def test_synth_then_ingest_folder_tour(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README tour: `gpuclust synth --out cell/raw ...` then `gpuclust ingest cell/raw --out cell/ds`."""
    raw, ds = tmp_path / "cell" / "raw", tmp_path / "cell" / "ds"
    assert main(["synth", "--out", str(raw), "--machines", "12", "--hours", "1", "--seed", "1"]) == 0
    assert (raw / "synth_truth.json").is_file()
    capsys.readouterr()
    assert main(["ingest", str(raw), "--out", str(ds), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"note: {raw / 'synth_truth.json'}: skipped, not a trace table" in out
    assert out.splitlines()[-1] == "dataset complete: true"
    assert Dataset(ds).num_rows("instance_usage") > 0


def test_non_table_files_skipped_with_a_note(tmp_path: Path) -> None:
    d = tmp_path / "export"
    d.mkdir()
    good = write_json(d / "machine_events-000000000000.json.gz", records("machine_events", 20))
    junk = {
        "README.md": b"# docs",
        "SHA256SUMS": b"abc  machine_events-000000000000.json.gz\n",
        "machine_events-000000000000.json.gz.md5": b"abc\n",
        "_SUCCESS": b"",
        ".DS_Store": b"\x00\x01",
        "synth_truth.json": b"{}",
    }
    for name, data in junk.items():
        (d / name).write_bytes(data)
    (d / ".git").mkdir()
    (d / ".git" / "config").write_text("x")
    notes: list[str] = []
    assert expand_sources([d], notes) == [good]
    for name in junk:
        assert sum(n.startswith(f"{d / name}: skipped") for n in notes) == 1, (name, notes)
    assert f"{d / '.git'}: hidden folder skipped" in notes
    rep = ingest([d, d / "README.md"], tmp_path / "ds", workers=1)  # named explicitly: skipped too
    assert rep.ok and rep.complete and len(rep.files) == 1
    assert sum("README.md: skipped" in n for n in rep.notes) == 2
    assert all(f"note: {n}" in rep.summary() for n in rep.notes)
    with pytest.raises(IngestUsageError, match="no input files"):
        ingest([d / "SHA256SUMS"], tmp_path / "ds2")


# -------------------------------------------------------------------------------------------
# 2. twin exports
# -------------------------------------------------------------------------------------------
def test_real_cell_a_twins_refused_unless_preferred(
    real_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cell = real_dir / "2019-cell-a"
    js, pq_ = cell / "machine_events-000000000000.json.gz", cell / "machine_events-000000000000.parquet.gz"
    assert sorted(p.name for p in cell.iterdir()) == [js.name, pq_.name]  # what the folder holds
    out = tmp_path / "cell-a"
    assert main(["ingest", str(cell), "--out", str(out), "--cell", "a", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert str(js) in err and str(pq_) in err and "--prefer" in err and "double" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (out / "manifest.json").exists()  # nothing written
    for prefer, kept, skipped in (("parquet", pq_, js), ("json", js, pq_)):
        o = tmp_path / f"cell-a-{prefer}"
        assert main(["ingest", str(cell), "--out", str(o), "--cell", "a", "--no-progress", "--prefer", prefer]) == 0
        text = capsys.readouterr().out
        assert f"note: {skipped}: skipped, twin of {kept} (--prefer {prefer})" in text
        m = _manifest(o)
        assert [i["path"] for i in m["inputs"].values()] == [str(kept)]
        assert m["tables"]["machine_events"]["rows"] == 46_219  # not 92,438
    # A twin already in the dataset counts too.
    with pytest.raises(IngestUsageError, match="already in the dataset"):
        ingest([js], tmp_path / "cell-a-parquet")
    with pytest.raises(IngestUsageError, match="already in the dataset"):
        ingest([js], tmp_path / "cell-a-parquet", prefer="json")
    rep = ingest([cell], tmp_path / "cell-a-parquet", prefer="parquet")
    assert rep.ok and [f.status for f in rep.files] == ["skipped"]


def test_twins_by_stem_synthetic(tmp_path: Path) -> None:
    recs = records("machine_events", 30, seed=3)
    a = write_json(tmp_path / "machine_events-000000000007.json.gz", recs)
    b = write_parquet(tmp_path / "machine_events-000000000007.parquet", "machine_events", recs)
    c = write_json(tmp_path / "machine_events-000000000008.json.gz", records("machine_events", 5, seed=4))
    with pytest.raises(IngestUsageError, match="twin exports") as ei:
        ingest([a, b, c], tmp_path / "ds")
    assert str(a) in str(ei.value) and str(b) in str(ei.value) and str(c) not in str(ei.value)
    rep = ingest([a, b, c], tmp_path / "ds", prefer="json", workers=1)
    assert rep.ok and Dataset(tmp_path / "ds").num_rows("machine_events") == 35


# -------------------------------------------------------------------------------------------
# 4./5. content that is not what the name says; empty and truncated files
# -------------------------------------------------------------------------------------------
def _bad_inputs(d: Path) -> dict[str, tuple[Path, str]]:
    d.mkdir(parents=True, exist_ok=True)
    csv = d / "instance_events-000000000001.json.gz"
    csv.write_bytes(gzip.compress(("\n".join(CSV_LINES * 50) + "\n").encode()))
    garbage = d / "machine_events-000000000001.json.gz"
    garbage.write_bytes(gzip.compress(bytes(range(256)) * 60))
    empty_pq = d / "instance_usage-000000000001.parquet"
    empty_pq.write_bytes(b"")
    empty_js = d / "instance_usage-000000000002.json.gz"
    empty_js.write_bytes(b"")
    whole = gzip.compress(
        ("\n".join(json.dumps({"time": "1", "machine_id": str(i), "type": "1"}) for i in range(3000))).encode()
    )
    trunc = d / "machine_events-000000000002.json.gz"
    trunc.write_bytes(whole[: len(whole) // 2])
    return {
        "csv": (csv, "holds CSV (13 fields: v2 task_events?), not newline-delimited JSON"),
        "garbage": (garbage, "holds binary data"),
        "empty_pq": (empty_pq, "empty file (0 bytes"),
        "empty_js": (empty_js, "empty file (0 bytes"),
        "trunc": (trunc, "truncated gzip stream"),
    }


def test_bad_files_fail_their_input_and_are_retried(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    good = write_json(d / "machine_events-000000000000.json.gz", records("machine_events", 40))
    bad = _bad_inputs(d)
    out = tmp_path / "ds"
    rep = ingest([d], out, workers=1)
    assert rep.exit_status == 1 and not rep.complete
    by = {f.path: f for f in rep.files}
    assert by[str(good)].status == "done"
    for path, why in bad.values():
        f = by[str(path)]
        assert f.status == "failed" and f.error is not None, f
        assert f.error.startswith(str(path)) and why in f.error, f.error
    assert by[str(bad["csv"][0])].rows_read == 0  # not read line by line as invalid JSON
    m = _manifest(out)
    assert m["complete"] is False
    assert {i["path"]: i["status"] for i in m["inputs"].values()}[str(bad["empty_pq"][0])] == "failed"
    summary = rep.summary()
    assert "complete: true" not in summary and summary.splitlines()[-1].startswith("dataset unfinished")
    # The re-run retries every failed input (none is "skipped") and the good one is skipped.
    again = ingest([d], out, workers=2)
    assert {f.path: f.status for f in again.files} == {
        str(good): "skipped",
        **{str(p): "failed" for p, _ in bad.values()},
    }
    assert again.exit_status == 1 and not again.complete
    # Fix the files (a good download replaces the empty one, the others go): complete.
    for key in ("csv", "garbage", "empty_js", "trunc"):
        bad[key][0].unlink()
    write_parquet(bad["empty_pq"][0], "instance_usage", records("instance_usage", 10, seed=9))
    final = ingest([d], out, workers=1)
    assert final.ok and final.complete
    assert sum("forgotten, a failed input whose file no longer exists" in n for n in final.notes) == 4
    assert Dataset(out).num_rows("instance_usage") == 10
    assert {i["status"] for i in _manifest(out)["inputs"].values()} == {"done"}


def test_content_named_wrongly(tmp_path: Path) -> None:
    js_in_pq = write_json(tmp_path / "machine_events-000000000000.parquet", records("machine_events", 10), gz=False)
    s = detect(js_in_pq)
    assert s.format == "v3-json" and s.problem is None and "named like parquet but holds JSON" in (s.note or "")
    rep = ingest([js_in_pq], tmp_path / "ds")
    assert rep.ok and any("named like parquet" in n for n in rep.notes)
    csv_forced = detect(tmp_path / "machine_events-000000000000.parquet", format="v2-csv", table="machine_events")
    assert "holds JSON lines (a v3 export?), not v2 CSV" in (csv_forced.problem or "")
    # A CSV named like a JSON shard of no v3 table: the run stops, naming the content.
    t = tmp_path / "task_events-000000000000.json.gz"
    t.write_bytes(gzip.compress(("\n".join(CSV_LINES) + "\n").encode()))
    with pytest.raises(DetectError, match=r"holds CSV \(13 fields: v2 task_events\?\)"):
        detect(t)


# -------------------------------------------------------------------------------------------
# no traceback reaches the user
# -------------------------------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "gpuclust", "ingest", *args, "--no-progress"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_expected_faults_without_traceback(tmp_path: Path) -> None:
    d = tmp_path / "in"
    bad = _bad_inputs(d)
    r = _cli(str(d), "--out", str(tmp_path / "ds"))
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    for path, why in bad.values():
        lines = [ln for ln in r.stdout.splitlines() if "error:" in ln and str(path) in ln]
        assert len(lines) == 1 and why in lines[0], (path, r.stdout)
    assert "complete: true" not in r.stdout
    # usage faults: one line on stderr naming the file, exit 2
    u = tmp_path / "u"
    u.mkdir()
    (u / "mystery.bin").write_bytes(b"\x00\x01\x02")
    t = u / "task_events-000000000000.json.gz"
    t.write_bytes(gzip.compress(("\n".join(CSV_LINES) + "\n").encode()))
    for src, want in ((u / "mystery.bin", "mystery.bin"), (t, "holds CSV"), (u / "absent.json.gz", "absent.json.gz")):
        r = _cli(str(src), "--out", str(tmp_path / "ds2"))
        assert r.returncode == 2 and "Traceback" not in r.stderr and want in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and str(src) in r.stderr
    # a dataset folder that cannot be made: one line, exit 2 (an expected fault, as every command)
    ok = write_json(u / "machine_events-000000000000.json.gz", records("machine_events", 5))
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    r = _cli(str(ok), "--out", str(blocker / "ds"))
    assert r.returncode == 2 and "Traceback" not in r.stderr and str(blocker) in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
