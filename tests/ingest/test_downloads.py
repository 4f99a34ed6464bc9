"""Ingesting a folder of shards as they download: re-runs pick up new shards only (without reading
the finished ones again), unfinished downloads are left for later, and a listing names a
truncated download as such."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuclust.dataset import Dataset
from gpuclust.ingest import content_hash, ingest
from gpuclust.ingest.api import IngestUsageError, read_listing

from .conftest import records, write_json


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths ingest hashes, in order (before reading them, or while it reads them)."""
    seen: list[str] = []
    real, real_init = content_hash.file_hash, content_hash.StreamHash.__init__

    def spy(path: Path, *a: object, **k: object) -> str:
        seen.append(Path(path).name)
        return real(path, *a, **k)

    def spy_init(self: content_hash.StreamHash, path: Path, *a: object, **k: object) -> None:
        seen.append(Path(path).name)
        real_init(self, path, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(content_hash, "file_hash", spy)
    monkeypatch.setattr(content_hash.StreamHash, "__init__", spy_init)
    return seen


def _shard(folder: Path, k: int, n: int = 300) -> Path:
    return write_json(folder / f"machine_events-{k:012d}.json.gz", records("machine_events", n, seed=k))


def test_rerun_picks_up_new_shards_only(tmp_path: Path, hashed: list[str]) -> None:
    raw, out = tmp_path / "raw", tmp_path / "ds"
    raw.mkdir()
    a = _shard(raw, 0)
    (raw / "machine_events-000000000001.json.gz.gstmp").write_bytes(b"\x1f\x8b half a download")
    rep = ingest([raw], out, workers=1)
    assert rep.exit_status == 0 and [f.status for f in rep.files] == ["done"]
    assert any("unfinished download" in n for n in rep.notes)
    assert hashed == [a.name]
    # the download finishes; another shard arrives
    (raw / "machine_events-000000000001.json.gz.gstmp").unlink()
    b = _shard(raw, 1)
    hashed.clear()
    rep = ingest([raw], out, workers=1)
    assert {Path(f.path).name: f.status for f in rep.files} == {a.name: "skipped", b.name: "done"}
    assert hashed == [b.name]  # the finished shard is not read again (same path, size and mtime)
    assert Dataset(out).num_rows("machine_events") == 600
    # a touched file is hashed again, and still recognised by its content
    os.utime(a, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns + 10**9))
    hashed.clear()
    rep = ingest([raw], out, workers=1)
    assert hashed == [a.name] and {f.status for f in rep.files} == {"skipped"}
    assert Dataset(out).num_rows("machine_events") == 600


def test_listing_names_a_truncated_download(tmp_path: Path) -> None:
    raw, out = tmp_path / "raw", tmp_path / "ds"
    raw.mkdir()
    good, cut, extra = _shard(raw, 0), _shard(raw, 1), _shard(raw, 2)
    full = cut.stat().st_size
    cut.write_bytes(cut.read_bytes()[: full // 3])
    listing = tmp_path / "ls.txt"
    listing.write_text(
        f"{good.stat().st_size:>10}  2019-06-01T10:00:00Z  gs://clusterdata_2019_a/{good.name}\n"
        f"{full:>10}  2019-06-01T10:00:00Z  gs://clusterdata_2019_a/{cut.name}\n"
        f"TOTAL: 2 objects, {good.stat().st_size + full} bytes\n"
    )
    assert read_listing(listing) == {good.name: good.stat().st_size, cut.name: full}
    rep = ingest([raw], out, workers=1, listing=listing)
    by = {Path(f.path).name: f for f in rep.files}
    assert by[good.name].status == by[extra.name].status == "done"
    assert by[cut.name].status == "failed" and by[cut.name].rows_read == 0
    assert f"truncated download: {full // 3:,} of {full:,} bytes" in by[cut.name].error
    assert any(extra.name in n and "not in the listing" in n for n in rep.notes)
    assert rep.exit_status == 1 and not rep.complete


def test_listing_errors(tmp_path: Path) -> None:
    f = _shard(tmp_path, 0)
    empty = tmp_path / "ls.txt"
    empty.write_text("nothing here\n")
    with pytest.raises(IngestUsageError, match="no 'SIZE"):
        ingest([f], tmp_path / "ds", workers=1, listing=empty)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuclust",
            "ingest",
            str(f),
            "--out",
            str(tmp_path / "ds"),
            "--listing",
            str(tmp_path / "missing.txt"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr and "missing.txt: cannot read" in p.stderr
