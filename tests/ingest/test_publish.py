"""Issue 7: dataset files get the umask's mode; parts reach the table folders only with the manifest."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpuclust.ingest import ingest
from gpuclust.ingest.writer import STAGING_DIR
from gpuclust.schema import TABLES

from .conftest import records, write_json


def _files(out: Path) -> list[Path]:
    return [p for p in out.rglob("*") if p.is_file() and p.name != ".gpuclust-ingest.lock"]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_files_follow_the_umask(tmp_path: Path, umask: int) -> None:
    f = write_json(
        tmp_path / "machine_events-000000000000.json.gz",
        [*map(json.dumps, [{"time": "1", "machine_id": "1", "type": "1"}] * 50), "{bad"],
    )
    old = os.umask(umask)
    try:
        rep = ingest([f], tmp_path / "ds", workers=1, max_reject_rate=1)
    finally:
        os.umask(old)
    assert rep.ok and rep.rows_rejected == 1
    files = _files(tmp_path / "ds")
    names = {p.name for p in files}
    assert (
        "manifest.json" in names
        and any(n.endswith(".jsonl") for n in names)
        and any(n.endswith(".parquet") for n in names)
    )
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~umask, p


def test_staging_is_gone_after_a_run_and_parts_are_all_listed(tmp_path: Path) -> None:
    files = [
        write_json(tmp_path / "machine_events-000000000000.json.gz", records("machine_events", 300, seed=1)),
        write_json(tmp_path / "instance_events-000000000000.json.gz", records("instance_events", 300, seed=2)),
    ]
    out = tmp_path / "ds"
    from gpuclust.ingest.base import ReadOptions

    rep = ingest(files, out, opts=ReadOptions(chunk_bytes=4096, threads=1), workers=2)
    assert rep.ok
    assert not (out / STAGING_DIR).exists()
    m = json.loads((out / "manifest.json").read_text())
    for t in TABLES:
        # flat parts, or the bucket=<k>/ parts of the layout step
        on_disk = (
            sorted(p.relative_to(out).as_posix() for p in (out / t).rglob("*.parquet")) if (out / t).is_dir() else []
        )
        assert on_disk == m["tables"][t]["files"]
