"""Both gzip engines (ISA-L igzip and zlib) give the readers the same bytes and the same faults."""

from __future__ import annotations

import gzip
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuclust.ingest import inflate
from gpuclust.ingest.base import ReadOptions, SourceError, SourceFile
from gpuclust.ingest.detect import detect
from gpuclust.ingest.readers import v2_csv, v3_json

from .conftest import records, write_json

ENGINES = ["zlib"] + (["isal"] if importlib.util.find_spec("isal") else [])


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Reload :mod:`gpuclust.ingest.inflate` with the engine chosen by ``GPUCLUST_INFLATE``."""
    monkeypatch.setenv("GPUCLUST_INFLATE", "zlib" if request.param == "zlib" else "")
    importlib.reload(inflate)
    assert inflate.ENGINE == request.param
    yield request.param
    monkeypatch.delenv("GPUCLUST_INFLATE")
    importlib.reload(inflate)


def _v3_rows(path: Path) -> tuple[list[int], SourceError | None]:
    ids: list[int] = []
    try:
        for ch in v3_json.read(detect(path), ReadOptions(chunk_bytes=4096, threads=1)):
            ids.extend(ch.tables["machine_events"].column("machine_id").to_pylist())
    except SourceError as e:
        return ids, e
    return ids, None


def test_isal_is_the_default_where_installed() -> None:
    assert inflate.ENGINE == ("isal" if "isal" in ENGINES else "zlib")


def test_same_rows_members_and_faults(engine: str, tmp_path: Path) -> None:
    recs = records("machine_events", 2000, seed=4)
    whole = write_json(tmp_path / "machine_events-000000000000.json.gz", recs)
    data = whole.read_bytes()
    ids, err = _v3_rows(whole)
    assert err is None and ids == [r["machine_id"] for r in recs]
    # two gzip members, one after the other
    text = gzip.decompress(data)
    cut = text.index(b"\n", len(text) // 2) + 1
    two = tmp_path / "machine_events-000000000001.json.gz"
    two.write_bytes(gzip.compress(text[:cut]) + gzip.compress(text[cut:]))
    assert _v3_rows(two) == (ids, None)
    # truncated: the complete lines, then the fault named with the line it stopped at
    short = tmp_path / "machine_events-000000000002.json.gz"
    short.write_bytes(data[: len(data) // 2])
    got, err = _v3_rows(short)
    assert err is not None and "truncated gzip" in err.reason and err.line == len(got) + 1
    assert 0 < len(got) < len(ids) and got == ids[: len(got)]
    # corrupt: a clear fault, never wrong rows
    bad = bytearray(data)
    for k in range(len(bad) // 2, len(bad) // 2 + 64):
        bad[k] ^= 0x5A
    broken = tmp_path / "machine_events-000000000003.json.gz"
    broken.write_bytes(bytes(bad))
    got, err = _v3_rows(broken)
    assert err is not None and "corrupt gzip" in err.reason  # (the trailer's check fails)
    assert got == ids[: len(got)]


def test_v2_reader_faults(engine: str, tmp_path: Path) -> None:
    full = bytearray(gzip.compress(b"0,5,0,P,0.5,0.25\n" * 1000))
    full[len(full) // 2] ^= 0xFF
    full[len(full) // 2 + 1] ^= 0xFF
    p = tmp_path / "bad.csv.gz"
    p.write_bytes(bytes(full))
    src = SourceFile(path=p, format="v2-csv", source_table="machine_events", compression="gzip", trace_version="v2")
    with pytest.raises(SourceError, match="gzip"):
        for _ in v2_csv.read(src, ReadOptions()):
            pass
