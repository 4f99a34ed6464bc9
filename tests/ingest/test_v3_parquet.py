"""The v3 Parquet reader: round trips, JSON/Parquet equivalence, row-numbered rejects."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpuclust.dataset import Dataset
from gpuclust.ingest import ingest
from gpuclust.ingest.base import ReadOptions, SourceError
from gpuclust.ingest.detect import detect
from gpuclust.ingest.readers.v3_parquet import read
from gpuclust.schema import SCHEMAS

from .conftest import expected_tables, records, sorted_rows, table_rows, write_json, write_parquet

TABLES = ["instance_usage", "instance_events", "collection_events", "machine_events", "machine_attributes"]


@pytest.mark.parametrize("table", TABLES)
def test_round_trip(tmp_path: Path, table: str) -> None:
    recs = records(table, 200, seed=7)
    f = write_parquet(tmp_path / f"{table}-000000000000.parquet.gz", table, recs)
    src = detect(f)
    assert (src.format, src.source_table, src.compression) == ("v3-parquet", table, None)
    out = tmp_path / "ds"
    rep = ingest([f], out)
    assert rep.exit_status == 0, rep.summary()
    ds = Dataset(out)
    for t, rows in expected_tables(table, recs).items():
        got = ds.read(t)
        assert got.schema.equals(SCHEMAS[t])
        assert table_rows(got) == sorted_rows(rows), t


@pytest.mark.parametrize("table", TABLES)
def test_same_as_json_twin(tmp_path: Path, table: str) -> None:
    recs = records(table, 150, seed=11)
    pj = write_parquet(tmp_path / f"{table}-000000000000.parquet", table, recs)
    js = write_json(tmp_path / f"{table}-000000000000.json.gz", recs)
    a = ingest([pj], tmp_path / "a")
    b = ingest([js], tmp_path / "b")
    assert a.ok and b.ok
    for t in a.rows_written:
        ta = Dataset(tmp_path / "a").read(t)
        tb = Dataset(tmp_path / "b").read(t)
        assert ta.equals(tb), t


def test_rejects_report_row_numbers(tmp_path: Path) -> None:
    recs = records("machine_events", 2500, seed=5)
    bad_rows = [3, 1500, 2499]
    for r in bad_rows:
        recs[r]["type"] = 42
    recs[2000]["machine_id"] = None  # required
    f = write_parquet(tmp_path / "machine_events-000000000000.parquet", "machine_events", recs)
    chunks = list(read(detect(f), ReadOptions(chunk_bytes=1, threads=1)))  # 1024-row batches
    assert len(chunks) == 3
    rejects = [r for c in chunks for r in c.rejects]
    assert [(r.row, r.line) for r in rejects] == [(3, None), (1500, None), (2000, None), (2499, None)]
    assert "code 42" in rejects[0].reason and "machine_id: required" in rejects[2].reason
    assert json.loads(rejects[0].raw)["type"] == 42
    assert sum(c.rows_read for c in chunks) == 2500
    assert sum(c.tables["machine_events"].num_rows for c in chunks) == 2496


def test_gzipped_parquet(tmp_path: Path) -> None:
    recs = records("machine_events", 100, seed=2)
    plain = write_parquet(tmp_path / "plain.parquet", "machine_events", recs)
    gz = tmp_path / "machine_events-000000000000.parquet.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    src = detect(gz)
    assert (src.format, src.compression) == ("v3-parquet", "gzip")
    got = pa.concat_tables([c.tables["machine_events"] for c in read(src, ReadOptions())])
    assert table_rows(got) == sorted_rows(expected_tables("machine_events", recs)["machine_events"])


def test_extra_and_missing_columns(tmp_path: Path) -> None:
    t = pa.table(
        {
            "time": pa.array([1, 2], pa.int64()),
            "machine_id": pa.array([3, 4], pa.int64()),
            "type": pa.array([1, 2], pa.int64()),
            "something_new": pa.array(["x", "y"]),
        }
    )
    f = tmp_path / "machine_events-000000000000.parquet"
    pq.write_table(t, f)
    (ch,) = list(read(detect(f), ReadOptions()))
    assert ch.tables["machine_events"].to_pylist()[1] == {
        "time": 2,
        "machine_id": 4,
        "type": 2,
        "switch_id": None,
        "cap_cpu": None,
        "cap_mem": None,
        "platform_id": None,
        "missing_data_reason": 0,
    }


def test_unsigned_times_and_ids_read_as_int64_and_past_int64_a_row_is_rejected(tmp_path: Path) -> None:
    """An export that writes times and ids unsigned (TRACE_NOTES: "treat both as int64"): values up
    to 2^63-1 (the "after the trace" sentinel) read exactly; one above is its row's reject, with
    the column and the value, and the other rows stay."""
    big = 2**63 - 1
    t = pa.table(
        {
            "time": pa.array([0, big, 2**63, 5], pa.uint64()),
            "machine_id": pa.array([3, 2**62 + 1, 4, 2**64 - 1], pa.uint64()),
            "type": pa.array([1, 2, 1, 3], pa.uint8()),
        }
    )
    f = tmp_path / "machine_events-000000000000.parquet"
    pq.write_table(t, f)
    chunks = list(read(detect(f), ReadOptions()))
    got = pa.concat_tables([c.tables["machine_events"] for c in chunks])
    assert got.schema.field("time").type == pa.int64() and got.schema.field("machine_id").type == pa.int64()
    assert got.select(["time", "machine_id", "type"]).to_pylist() == [
        {"time": 0, "machine_id": 3, "type": 1},
        {"time": big, "machine_id": 2**62 + 1, "type": 2},
    ]
    rejects = [r for c in chunks for r in c.rejects]
    assert [r.row for r in rejects] == [2, 3]
    assert "column time" in rejects[0].reason and str(2**63) in rejects[0].reason
    assert "column machine_id" in rejects[1].reason and str(2**64 - 1) in rejects[1].reason
    rep = ingest([f], tmp_path / "ds", max_reject_rate=0.5)  # (the good rows published beside the rejects)
    assert rep.rows_rejected == 2 and not rep.failed
    assert pq.read_table(tmp_path / "ds" / "machine_events").num_rows == 2


def test_unreadable_parquet(tmp_path: Path) -> None:
    f = tmp_path / "machine_events-000000000000.parquet"
    f.write_bytes(b"PAR1" + b"\0" * 100)
    with pytest.raises(SourceError, match="not a readable Parquet file"):
        list(read(detect(f), ReadOptions()))
    rep = ingest([f], tmp_path / "ds")
    assert rep.exit_status == 1 and rep.failed
