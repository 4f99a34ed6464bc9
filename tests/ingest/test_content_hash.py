"""The content hash that keys a dataset's inputs: BLAKE3 for new datasets, SHA-256 kept for
datasets written before (manifests without ``content_hash``), a clear error where the recorded
algorithm cannot be computed; and the ordered parallel map the compiled JSON parse runs in."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest

from gpuclust.dataset import Dataset
from gpuclust.ingest import content_hash, ingest
from gpuclust.ingest.api import IngestUsageError
from gpuclust.ingest.readers.text_pieces import ordered_map as _ordered_map

from .conftest import records, write_json

blake3 = pytest.importorskip("blake3")  # a test dependency; the device image lacks it


def _shard(folder: Path, k: int, n: int = 200) -> Path:
    folder.mkdir(exist_ok=True)
    return write_json(folder / f"machine_events-{k:012d}.json.gz", records("machine_events", n, seed=k))


def test_new_dataset_keys_inputs_by_blake3(tmp_path: Path) -> None:
    a, b = _shard(tmp_path / "raw", 0), _shard(tmp_path / "raw", 1)
    rep = ingest([a, b], tmp_path / "ds", workers=1)
    assert rep.exit_status == 0
    m = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert m["content_hash"] == "blake3"
    want = {blake3.blake3(p.read_bytes()).hexdigest(): str(p) for p in (a, b)}  # one read, one call
    assert {k: v["path"] for k, v in m["inputs"].items()} == want
    for k, inp in m["inputs"].items():
        assert inp["content_hash"] == k
        assert all(Path(o).name.startswith(f"part-{k[:16]}-") for o in inp["outputs"])


def test_file_hash_matches_whole_file_digests(tmp_path: Path) -> None:
    p = tmp_path / "x.bin"
    p.write_bytes(bytes(range(256)) * 40_000 + b"tail")  # several read blocks and a partial one
    data = p.read_bytes()
    assert content_hash.file_hash(p, "blake3", block=1 << 16) == blake3.blake3(data).hexdigest()
    assert content_hash.file_hash(p, "sha256", block=1 << 16) == hashlib.sha256(data).hexdigest()


def test_legacy_sha256_dataset_stays_sha256(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "ds"
    a = _shard(tmp_path / "raw", 0)
    # a dataset written by gpuclust before BLAKE3: SHA-256 keys, no content_hash field
    monkeypatch.setattr(content_hash, "default_algorithm", lambda: "sha256")
    assert ingest([a], out, workers=1).exit_status == 0
    man = out / "manifest.json"
    m = json.loads(man.read_text())
    del m["content_hash"]
    for inp in m["inputs"].values():
        inp["sha256"] = inp.pop("content_hash")
    man.write_text(json.dumps(m))
    monkeypatch.undo()
    # a new shard arrives and a copy of the first (same content, another name)
    b = _shard(tmp_path / "raw", 1)
    c = tmp_path / "raw" / "machine_events-000000000002.json.gz"
    c.write_bytes(a.read_bytes())
    rep = ingest([a, b, c], out, workers=1)
    assert {Path(f.path).name: f.status for f in rep.files} == {a.name: "skipped", b.name: "done", c.name: "duplicate"}
    m = json.loads(man.read_text())
    assert m["content_hash"] == "sha256"
    assert set(m["inputs"]) == {hashlib.sha256(p.read_bytes()).hexdigest() for p in (a, b)}
    assert Dataset(out).num_rows("machine_events") == 400


def test_blake3_dataset_without_blake3_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = _shard(tmp_path / "raw", 0)
    assert ingest([a], tmp_path / "ds", workers=1).exit_status == 0
    monkeypatch.setattr(content_hash, "_blake3", lambda: None)
    with pytest.raises(IngestUsageError, match=r"keyed by BLAKE3.*pip install blake3"):
        ingest([_shard(tmp_path / "raw", 1)], tmp_path / "ds", workers=1)
    # a new dataset falls back to SHA-256
    assert content_hash.default_algorithm() == "sha256"
    assert ingest([a], tmp_path / "ds2", workers=1).exit_status == 0
    assert json.loads((tmp_path / "ds2" / "manifest.json").read_text())["content_hash"] == "sha256"


def test_unknown_algorithm_is_a_usage_error(tmp_path: Path) -> None:
    a = _shard(tmp_path / "raw", 0)
    assert ingest([a], tmp_path / "ds", workers=1).exit_status == 0
    man = tmp_path / "ds" / "manifest.json"
    man.write_text(json.dumps(json.loads(man.read_text()) | {"content_hash": "md5"}))
    with pytest.raises(IngestUsageError, match="'md5'"):
        ingest([a], tmp_path / "ds", workers=1)


# --------------------------------------------------------------------------------------------
# The ordered map of the compiled parse
# --------------------------------------------------------------------------------------------
def _slow_square(x: int) -> int:
    time.sleep(0.001 * (x % 3))  # later items often finish first
    return x * x


def test_ordered_map_keeps_order_and_uses_threads() -> None:
    names: set[str] = set()

    def fn(x: int) -> int:
        names.add(threading.current_thread().name)
        return _slow_square(x)

    assert list(_ordered_map(fn, iter(range(50)), 2, "t-map")) == [x * x for x in range(50)]
    assert names and all(n.startswith("t-map") for n in names)


def test_ordered_map_source_error_comes_after_earlier_results() -> None:
    def items() -> object:
        yield from range(5)
        raise OSError("truncated")

    got: list[int] = []
    with pytest.raises(OSError, match="truncated"):
        for v in _ordered_map(_slow_square, iter(items()), 2, "t-map"):  # type: ignore[call-overload]
            got.append(v)
    assert got == [0, 1, 4, 9, 16]


def test_ordered_map_fn_error_in_order_and_close_stops() -> None:
    def fn(x: int) -> int:
        if x == 3:
            raise ValueError("bad piece")
        return x

    got: list[int] = []
    with pytest.raises(ValueError, match="bad piece"):
        for v in _ordered_map(fn, iter(range(10)), 2, "t-map"):
            got.append(v)
    assert got == [0, 1, 2]
    # a consumer that stops early: the generator closes cleanly, the source is not read further
    read: list[int] = []

    def source() -> object:
        for i in range(1000):
            read.append(i)
            yield i

    gen = _ordered_map(lambda x: x, iter(source()), 2, "t-map")  # type: ignore[call-overload]
    assert next(gen) == 0
    gen.close()
    assert len(read) <= 4


# --------------------------------------------------------------------------------------------
# Hashing while reading
# --------------------------------------------------------------------------------------------
@pytest.fixture
def prehashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the files hashed *before* they are read."""
    seen: list[str] = []
    real = content_hash.file_hash

    def spy(path: Path, *a: object, **k: object) -> str:
        seen.append(Path(path).name)
        return real(path, *a, **k)

    monkeypatch.setattr(content_hash, "file_hash", spy)
    return seen


def _keys_by_name(out: Path) -> dict[str, str]:
    m = json.loads((out / "manifest.json").read_text())
    return {Path(v["path"]).name: k for k, v in m["inputs"].items()}


def _all_files(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


@pytest.mark.parametrize("workers", [1, 2])
def test_inputs_of_unique_size_are_hashed_while_read(tmp_path: Path, prehashed: list[str], workers: int) -> None:
    raw = tmp_path / "raw"
    a, b = _shard(raw, 0, 300), _shard(raw, 1, 500)  # different sizes
    usage = write_json(raw / "instance_usage-000000000000.json", records("instance_usage", 400, seed=3), gz=False)
    lines = usage.read_text().splitlines()
    lines[7] = "{not json"  # a reject, so a rejects file is named too
    usage.write_text("\n".join(lines) + "\n")
    out = tmp_path / "ds"
    rep = ingest([a, b, usage], out, workers=workers, layout="flat")
    assert rep.exit_status == 0 and prehashed == []  # nothing read twice
    want = {p.name: blake3.blake3(p.read_bytes()).hexdigest() for p in (a, b, usage)}
    assert _keys_by_name(out) == want
    files = _all_files(out)
    assert not any("part-new" in f or f.startswith("_staging") for f in files)
    for key in want.values():
        inp = json.loads((out / "manifest.json").read_text())["inputs"][key]
        assert inp["outputs"] and all(Path(o).name.startswith(f"part-{key[:16]}-") for o in inp["outputs"])
        assert all(o in files for o in inp["outputs"])
    rej = [f for f in files if f.startswith("_rejects/")]
    assert rej == [f"_rejects/part-{want[usage.name][:16]}.jsonl"]
    assert Dataset(out).num_rows("machine_events") == 800 and Dataset(out).num_rows("instance_usage") == 399


def test_same_size_inputs_are_hashed_first_and_deduplicated(tmp_path: Path, prehashed: list[str]) -> None:
    raw = tmp_path / "raw"
    a = _shard(raw, 0)
    c = raw / "machine_events-000000000009.json.gz"
    c.write_bytes(a.read_bytes())
    rep = ingest([a, c], tmp_path / "ds", workers=1)
    assert sorted(prehashed) == sorted([a.name, c.name])
    assert [f.status for f in rep.files] == ["done", "duplicate"]
    # a re-run with a moved copy: same size as a recorded input, so hashed first and skipped
    d = tmp_path / "elsewhere.json.gz"
    d.write_bytes(a.read_bytes())
    prehashed.clear()
    rep = ingest([d], tmp_path / "ds", workers=1, table="machine_events")
    assert prehashed == [d.name] and [f.status for f in rep.files] == ["skipped"]


def test_truncated_input_hashed_while_read_is_keyed_by_its_whole_content(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    a = _shard(raw, 0, 2000)
    a.write_bytes(a.read_bytes()[: a.stat().st_size // 2])  # a cut download
    rep = ingest([a], tmp_path / "ds", workers=1)
    assert rep.files[0].status == "failed" and "truncated" in (rep.files[0].error or "")
    assert rep.files[0].content_hash == blake3.blake3(a.read_bytes()).hexdigest()
    # the retry after the download is repaired ingests it completely
    b = _shard(raw, 0, 2000)
    rep = ingest([b], tmp_path / "ds", workers=1)
    assert rep.exit_status == 0 and Dataset(tmp_path / "ds").num_rows("machine_events") == 2000
    assert set(_keys_by_name(tmp_path / "ds").values()) == {blake3.blake3(b.read_bytes()).hexdigest()}


def test_stream_hash_finishes_what_the_reader_left(tmp_path: Path) -> None:
    p = tmp_path / "x.bin"
    data = bytes(range(256)) * 10_000
    p.write_bytes(data)
    want = blake3.blake3(data).hexdigest()
    # read in order, partly: finish() hashes the rest
    d = content_hash.StreamHash(p, "blake3")
    with open(p, "rb") as f:
        g = d.wrap(f)
        assert g.read(1000) == data[:1000]
        buf = bytearray(5000)
        assert g.readinto(buf) == 5000 and bytes(buf) == data[1000:6000]
        assert g.tell() == 6000
    assert d.finish() == want
    # a reader that seeks: what it reads out of order is not hashed twice
    d = content_hash.StreamHash(p, "blake3")
    with open(p, "rb") as f:
        g = d.wrap(f)
        g.read(10)
        g.seek(50_000)
        g.read(100)
        g.seek(0)
        g.read(10)  # again from 0: not hashed again (at != done)
    assert d.finish() == want


def test_a_part_that_cannot_be_renamed_fails_its_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Renaming the staged parts to the hash's names is the last step of an input hashed while
    read: an OS error there fails the input (no traceback, nothing published), and the next run
    ingests it."""
    a = _shard(tmp_path / "raw", 0, 300)
    real = os.replace

    def broken(src: object, dst: object) -> None:
        if "part-new-" in str(src) and "part-new-" not in str(dst):  # the rename to the hash's name
            raise OSError(28, "No space left on device")
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", broken)
    rep = ingest([a], tmp_path / "ds", workers=1)
    assert rep.exit_status == 1 and rep.files[0].status == "failed"
    assert "cannot name its parts: No space left on device" in (rep.files[0].error or "")
    m = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert not m["complete"] and m["tables"]["machine_events"]["rows"] == 0
    assert not list((tmp_path / "ds").glob("machine_events/*.parquet"))  # nothing published
    monkeypatch.undo()
    rep = ingest([a], tmp_path / "ds", workers=1)
    assert rep.exit_status == 0 and Dataset(tmp_path / "ds").num_rows("machine_events") == 300
