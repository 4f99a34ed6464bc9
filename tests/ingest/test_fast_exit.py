"""``gpuclust ingest`` run as the program ends with ``os._exit`` after its exit handlers
(gpuclust/cli.py ``_exit_now``; ~0.2 s of interpreter teardown after a 1 GB shard): the same
dataset and output as an ordinary exit, and a run with a failed input exits as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import records, write_json


def _ingest(src: list[Path], out: Path, fast: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "gpuclust.cli", "ingest", *map(str, src), "--out", str(out), "--no-progress"]
    return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "GPUCLUST_FAST_EXIT": fast})


def _files(d: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file() and p.suffix == ".parquet"
    }


def test_fast_exit_ingest_writes_and_prints_what_an_ordinary_exit_does(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    src = [
        write_json(raw / "instance_usage-000000000000.json", records("instance_usage", 3000, seed=5), gz=False),
        write_json(raw / "machine_events-000000000000.json.gz", records("machine_events", 500, seed=6)),
    ]
    fast, slow = _ingest(src, tmp_path / "fast", "1"), _ingest(src, tmp_path / "slow", "0")
    assert fast.returncode == slow.returncode == 0, fast.stderr + slow.stderr
    norm = [r.stdout.replace(str(tmp_path / name), "DS") for r, name in ((fast, "fast"), (slow, "slow"))]
    strip = [
        [ln for ln in s.splitlines() if not ln.startswith(("total:", "laid out by"))] for s in norm
    ]  # seconds differ
    assert strip[0] == strip[1] and "dataset complete: true" in norm[0]
    assert _files(tmp_path / "fast") == _files(tmp_path / "slow") and _files(tmp_path / "fast")
    mf, ms = (json.loads((tmp_path / n / "manifest.json").read_text()) for n in ("fast", "slow"))
    assert mf["complete"] and mf["tables"] == ms["tables"] and set(mf["inputs"]) == set(ms["inputs"])
    assert not (tmp_path / "fast" / "_staging").exists()


def test_ingest_with_a_failed_input_exits_as_before(tmp_path: Path) -> None:
    bad = tmp_path / "instance_usage-000000000000.json.gz"
    bad.write_bytes(b"")  # an empty download: the input fails, exit status 1
    r = _ingest([bad], tmp_path / "ds", "1")
    assert r.returncode == 1 and "empty file" in (r.stdout + r.stderr) and "Traceback" not in r.stderr
