"""The Kaggle ``borg_traces_data.csv`` reader: the real 14-record sample, values checked by hand
against its raw text, the usage de-duplication, constraints, and malformed records."""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from gpuclust.ingest.base import Chunk, ReadOptions, SourceError, SourceFile
from gpuclust.ingest.readers.kaggle_csv import KAGGLE_COLUMNS, UNKNOWN_INSTANCE_INDEX, UNKNOWN_MACHINE_ID, read
from gpuclust.schema import SCHEMAS

REAL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "real"
SAMPLE = REAL / "kaggle-2019-sample" / "small_slice3.csv"
needs_real = pytest.mark.skipif(
    not SAMPLE.is_file(), reason=f"real Kaggle sample not found at {SAMPLE} (shared/data/real is a sibling of the repo)"
)
TABLES = ("instance_events", "instance_usage", "instance_constraints")


def _src(path: Path) -> SourceFile:
    gz = path.read_bytes()[:2] == b"\x1f\x8b"
    return SourceFile(
        path=path,
        format="kaggle-csv",
        source_table="borg_traces_data",
        compression="gzip" if gz else None,
        trace_version="v3",
    )


def _read_all(path: Path, chunk_bytes: int = 64 << 20) -> tuple[dict[str, pa.Table], list, list[Chunk]]:
    chunks = list(read(_src(path), ReadOptions(chunk_bytes=chunk_bytes)))
    out = {t: pa.concat_tables([c.tables[t] for c in chunks]) if chunks else SCHEMAS[t].empty_table() for t in TABLES}
    return out, [r for c in chunks for r in c.rejects], chunks


def _sample_rows() -> tuple[list[str], list[list[str]]]:
    with open(SAMPLE, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def _write_records(path: Path, header: list[str], records: list[list[str] | str]) -> list[int]:
    """Write header + records (a str record is written verbatim); returns each record's start line."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(header)
    starts = []
    for rec in records:
        starts.append(buf.getvalue().count("\n") + 1)
        if isinstance(rec, str):
            buf.write(rec)
        else:
            w.writerow(rec)
    path.write_text(buf.getvalue(), newline="")
    return starts


# ----------------------------------------------------------------------------------------------
# the real sample
# ----------------------------------------------------------------------------------------------
@needs_real
def test_real_sample() -> None:
    tables, rejects, chunks = _read_all(SAMPLE)
    assert rejects == []
    assert sum(c.rows_read for c in chunks) == 14
    ev, us, con = tables["instance_events"], tables["instance_usage"], tables["instance_constraints"]
    for t in TABLES:
        assert tables[t].schema == SCHEMAS[t]
    assert ev.num_rows == 14
    # 14 records carry only 2 distinct usage windows (one per collection): 12 duplicates dropped.
    assert us.num_rows == 2 and sum(c.rows_deduplicated for c in chunks) == 12
    assert con.num_rows == 0  # every `constraint` cell is "[]"
    assert chunks[-1].bytes_done == SAMPLE.stat().st_size

    e = ev.to_pylist()
    # Record 0 (file line 2), copied by hand from the raw text:
    # 0,2571992274762,0,399853286886,1,0,119,0,3864,104792005923,"{'cpus': 0.0132904052734375, 'memory': 0.00432586669921875}",[],...
    assert {
        k: e[0][k]
        for k in (
            "time",
            "type",
            "collection_id",
            "scheduling_class",
            "collection_type",
            "priority",
            "alloc_collection_id",
            "instance_index",
            "machine_id",
        )
    } == {
        "time": 2571992274762,
        "type": 0,
        "collection_id": 399853286886,
        "scheduling_class": 1,
        "collection_type": 0,
        "priority": 119,
        "alloc_collection_id": 0,
        "instance_index": 3864,
        "machine_id": 104792005923,
    }
    assert e[0]["req_cpu"] == np.float32(0.0132904052734375) and e[0]["req_mem"] == np.float32(0.00432586669921875)
    assert (e[0]["missing_type"], e[0]["alloc_instance_index"]) == (0, -1)
    # Record 1: same instance 3864, later time, memory request 0.0048828125
    assert (e[1]["time"], e[1]["instance_index"], e[1]["req_mem"]) == (2591003936161, 3864, 0.0048828125)
    # Record 9: 9,2600134621000,0,330587209928,2,0,360,330587118384,1131,21109491,"{'cpus': 0.01947021484375, ...
    assert (
        e[9]["time"],
        e[9]["collection_id"],
        e[9]["scheduling_class"],
        e[9]["priority"],
        e[9]["alloc_collection_id"],
        e[9]["instance_index"],
        e[9]["machine_id"],
    ) == (
        2600134621000,
        330587209928,
        2,
        360,
        330587118384,
        1131,
        21109491,
    )
    # Record 13: ...,"{'cpus': 0.019989013671875, 'memory': 0.0013027191162109375}"
    assert e[13]["req_cpu"] == 0.019989013671875 and e[13]["time"] == 2675510674081
    assert ev.column("time").to_pylist() == [
        2571992274762, 2591003936161, 2569384582655, 2590311476021, 2570114196201, 2585995351124, 2566241832854,
        2579700939011, 2576826776512, 2600134621000, 2604392456936, 2525515133040, 2664362430311, 2675510674081,
    ]  # fmt: skip

    u0, u1 = us.to_pylist()
    assert (
        u0["start_time"],
        u0["end_time"],
        u0["collection_id"],
        u0["alloc_collection_id"],
        u0["collection_type"],
    ) == (2624100000000, 2624400000000, 399853286886, 0, 0)
    assert (u1["start_time"], u1["end_time"], u1["collection_id"], u1["alloc_collection_id"]) == (
        150300000000,
        150600000000,
        330587209928,
        330587118384,
    )
    for u in (u0, u1):
        assert (u["instance_index"], u["machine_id"], u["alloc_instance_index"]) == (
            UNKNOWN_INSTANCE_INDEX,
            UNKNOWN_MACHINE_ID,
            -1,
        )
    f32 = np.float32
    # "{'cpus': 0.008087158203125, 'memory': 0.001956939697265625}" / max / random sample
    assert (u0["avg_cpu"], u0["avg_mem"]) == (f32(0.008087158203125), f32(0.001956939697265625))
    assert (u0["max_cpu"], u0["max_mem"]) == (f32(0.019317626953125), f32(0.0019989013671875))
    assert u0["sample_cpu"] == f32(0.00860595703125)
    # 0.0048828125, 4.57763671875e-05, 1.2961403131484983, 0.0081595117226243, 1.0
    assert (u0["assigned_mem"], u0["page_cache_mem"], u0["sample_rate"]) == (
        f32(0.0048828125),
        f32(4.57763671875e-05),
        1.0,
    )
    assert (u0["cpi"], u0["mai"]) == (f32(1.2961403131484983), f32(0.0081595117226243))
    assert (u1["assigned_mem"], u1["cpi"]) == (0.0, f32(2.0546905994415283))
    # "[0.00020885 0.00025272 ... 0.01934814]" -> cpu_p0..cpu_p100; "[0.01502991 ... 0.01831055]" -> cpu_p91..cpu_p99
    dist = [
        0.00020885,
        0.00025272,
        0.00030518,
        0.00095081,
        0.00767517,
        0.01078796,
        0.01182556,
        0.01242065,
        0.01322937,
        0.01477051,
        0.01934814,
    ]
    tail = [0.01502991, 0.01525879, 0.01547241, 0.01593018, 0.01641846, 0.01690674, 0.01715088, 0.0177002, 0.01831055]
    assert [u0[f"cpu_p{q}"] for q in range(0, 101, 10)] == [f32(x) for x in dist]
    assert [u0[f"cpu_p{q}"] for q in range(91, 100)] == [f32(x) for x in tail]
    assert u1["cpu_p0"] == f32(0.0001049) and u1["cpu_p99"] == f32(0.04931641)


@needs_real
def test_real_sample_header_is_the_documented_layout() -> None:
    header, recs = _sample_rows()
    assert tuple(header) == KAGGLE_COLUMNS
    assert len(recs) == 14 and {len(r) for r in recs} == {36}


@needs_real
@pytest.mark.parametrize("chunk_bytes", [1, 2000])
def test_real_sample_small_chunks(chunk_bytes: int) -> None:
    whole, _, _ = _read_all(SAMPLE)
    tables, rejects, chunks = _read_all(SAMPLE, chunk_bytes=chunk_bytes)
    assert rejects == [] and len(chunks) > 1
    for t in TABLES:
        assert tables[t].equals(whole[t])
    assert sum(c.rows_deduplicated for c in chunks) == 12  # de-duplication spans chunks
    assert sum(c.rows_read for c in chunks) == 14


@needs_real
def test_gzip_and_truncation(tmp_path: Path) -> None:
    header, recs = _sample_rows()
    plain = tmp_path / "b.csv"
    _write_records(plain, header, recs * 50)  # 700 records
    gz = tmp_path / "b.csv.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    a, rej, chunks = _read_all(gz)
    assert rej == [] and a["instance_events"].num_rows == 700 and a["instance_usage"].num_rows == 2
    assert sum(c.rows_deduplicated for c in chunks) == 698
    data = gz.read_bytes()
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(data[: len(data) // 2])
    got = []
    with pytest.raises(SourceError) as ei:
        for c in read(_src(cut), ReadOptions(chunk_bytes=5000)):
            got.append(c)
    n = sum(c.tables["instance_events"].num_rows for c in got)
    assert 0 < n < 700
    assert sum(c.rows_read for c in got) == n
    assert "truncated" in ei.value.reason
    times = pa.concat_tables([c.tables["instance_events"] for c in got]).column("time").to_pylist()
    assert times == (a["instance_events"].column("time").to_pylist())[:n]


# ----------------------------------------------------------------------------------------------
# malformed records
# ----------------------------------------------------------------------------------------------
@needs_real
def test_malformed_records_isolated(tmp_path: Path) -> None:
    header, recs = _sample_rows()
    col = {c: i for i, c in enumerate(header)}

    def edit(base: list[str], **kw: str) -> list[str]:
        r = list(base)
        for k, v in kw.items():
            r[col[k]] = v
        return r

    good = recs[0]
    bad_records: list[tuple[list[str] | str, str]] = [
        (good[:-1], "expected 36 fields, found 35"),
        ([*good, "x"], "expected 36 fields, found 37"),
        (edit(good, average_usage="{'cpus': __import__('os'), 'memory': 1}"), "column average_usage"),
        (edit(good, resource_request="{'cpus': 0.1, 'memory': 0.2"), "column resource_request"),
        (edit(good, cpu_usage_distribution="[0.1 0.2 0.3]"), "expected 11 values, got 3"),
        (
            edit(good, tail_cpu_usage_distribution="[0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9 1.0]"),
            "expected 9 values, got 10",
        ),
        (edit(good, collection_id_2="123"), "collection_id_2: 123 differs"),
        (edit(good, collection_id_1="124"), "collection_id_1: 124 differs"),
        (edit(good, time="25719922747x2"), "column time"),
        (edit(good, time="2571992274762.5"), "column time"),
        (edit(good, instance_events_type="11"), "code 11 outside 0..10"),
        (edit(good, start_time=""), "usage: column start_time: required value is missing"),
        (edit(good, constraint="[{'name': 'a', 'value': 'b', 'relation': 9}]"), "constraint: column relation"),
        (edit(good, constraint="[1, 2]"), "is not a {name, value, relation} dict"),
        (edit(good, instance_index="99999999999"), "instance_index"),
        ("\r\n", "empty line"),
    ]
    records: list[list[str] | str] = []
    expect: dict[int, str] = {}
    good_idx = []
    for k, (rec, why) in enumerate(bad_records):
        g = edit(recs[k % 14], time=str(10_000 + k))  # a distinct good neighbour before each bad one
        records.append(g)
        good_idx.append(len(records) - 1)
        records.append(rec)
        expect[len(records) - 1] = why
    records.append(edit(recs[13], time="99"))
    good_idx.append(len(records) - 1)
    p = tmp_path / "m.csv"
    starts = _write_records(p, header, records)
    for chunk_bytes in (64 << 20, 3000):
        tables, rejects, chunks = _read_all(p, chunk_bytes=chunk_bytes)
        assert sum(c.rows_read for c in chunks) == len(records)
        assert tables["instance_events"].column("time").to_pylist() == [10_000 + k for k in range(len(bad_records))] + [
            99
        ]
        assert [r.line for r in rejects] == [starts[i] for i in sorted(expect)]
        for r, i in zip(rejects, sorted(expect), strict=True):
            assert expect[i] in r.reason, (i, r.reason)
            assert r.row == i  # 0-based index among data records
            assert r.file == str(p)
        # The raw text is the record as written (a quoted cell keeps its line breaks).
        assert rejects[2].raw.startswith("0,2571992274762,0,399853286886,") and "__import__" in rejects[2].raw
        assert rejects[2].raw.count("\n") == 3
        assert sum(t.num_rows for t in tables.values()) > 0


def test_constraints_and_float_written_ids(tmp_path: Path) -> None:
    header = list(KAGGLE_COLUMNS)
    base = dict.fromkeys(header, "")
    base.update(
        {
            "Unnamed: 0": "0",
            "time": "2571992274762.0",  # pandas wrote the column as float: exact digits kept
            "instance_events_type": "3.0",
            "collection_id": "399853286886",
            "scheduling_class": "1",
            "collection_type": "0",
            "priority": "119",
            "alloc_collection_id": "",
            "instance_index": "7",
            "machine_id": "",
            "resource_request": "",
            "constraint": "[{'name': 'abc', 'value': '2', 'relation': 0}\n {'name': 'xyz', 'value': '', 'relation': 'NOT_EQUAL'}]",
            "collection_id_1": "399853286886.0",
            "vertical_scaling": "2.0",
            "event": "SCHEDULE",
            "failed": "0",
        }
    )
    p = tmp_path / "c.csv"
    _write_records(p, header, [[base[h] for h in header]])
    tables, rejects, chunks = _read_all(p)
    assert rejects == []
    (e,) = tables["instance_events"].to_pylist()
    assert (e["time"], e["type"], e["machine_id"], e["alloc_collection_id"], e["req_cpu"]) == (
        2571992274762,
        3,
        0,
        0,
        None,
    )
    assert tables["instance_usage"].num_rows == 0  # no usage window in this record
    assert tables["instance_constraints"].to_pylist() == [
        {
            "time": 2571992274762,
            "collection_id": 399853286886,
            "instance_index": 7,
            "name": "abc",
            "value": "2",
            "relation": 0,
        },
        {
            "time": 2571992274762,
            "collection_id": 399853286886,
            "instance_index": 7,
            "name": "xyz",
            "value": "",
            "relation": 1,
        },
    ]
    assert chunks[0].rows_read == 1 and chunks[0].rows_deduplicated == 0


def test_header_without_index_column_and_errors(tmp_path: Path) -> None:
    header = [h for h in KAGGLE_COLUMNS if h != "Unnamed: 0"]
    row = dict.fromkeys(header, "")
    row.update(
        {
            "time": "5",
            "instance_events_type": "0",
            "collection_id": "1",
            "instance_index": "0",
            "constraint": "[]",
            "start_time": "0",
            "end_time": "300000000",
            "average_usage": "{'cpus': 1, 'memory': 2}",
            "cpu_usage_distribution": "[]",
        }
    )
    p = tmp_path / "noidx.csv"
    _write_records(p, header, [[row[h] for h in header]])
    tables, rejects, _ = _read_all(p)
    assert rejects == []
    (u,) = tables["instance_usage"].to_pylist()
    assert (u["avg_cpu"], u["avg_mem"], u["max_cpu"], u["cpu_p50"], u["collection_id"]) == (1.0, 2.0, None, None, 1)

    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(SourceError, match="header lacks"):
        list(read(_src(bad), ReadOptions()))
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(SourceError, match="no header"):
        list(read(_src(empty), ReadOptions()))
    with pytest.raises(SourceError, match="cannot open"):
        list(read(SourceFile(tmp_path / "absent.csv", "kaggle-csv", "borg_traces_data", None, "v3"), ReadOptions()))


def test_invalid_utf8_record(tmp_path: Path) -> None:
    header = ",".join(KAGGLE_COLUMNS).encode()
    ok = [""] * len(KAGGLE_COLUMNS)
    ok[1], ok[2], ok[3], ok[8], ok[11] = "1", "0", "2", "0", "[]"
    line = ",".join(ok).encode()
    badl = line + b"\xff"  # the last field (failed) holds a byte that is not UTF-8
    p = tmp_path / "u.csv"
    p.write_bytes(header + b"\n" + line + b"\n" + badl + b"\n" + line + b"\n")
    tables, rejects, chunks = _read_all(p)
    assert tables["instance_events"].num_rows == 2
    assert [(r.line, r.reason) for r in rejects] == [(3, "record is not valid UTF-8")]
    assert sum(c.rows_read for c in chunks) == 3


# ----------------------------------------------------------------------------------------------
# the full file mixes cells: refused, and `gpuclust kaggle-split` cuts it per cell
# ----------------------------------------------------------------------------------------------
def _mixed(tmp_path: Path) -> tuple[Path, list[int], int]:
    header, recs = _sample_rows()
    ci, cid = header.index("cluster"), header.index("collection_id")
    other = []
    for r in recs:
        r = list(r)
        r[ci] = "3"
        r[cid] = str(int(r[cid]) + 1)  # another cell's IDs
        for k in ("collection_id_1", "collection_id_2"):
            if k in header and r[header.index(k)].strip():
                r[header.index(k)] = str(int(float(r[header.index(k)])) + 1)
        other.append(r)
    plain = tmp_path / "borg_traces_data.csv"
    starts = _write_records(plain, header, recs + other + recs[:2])
    gz = tmp_path / "borg_traces_data.csv.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    return gz, starts, len(recs)


def test_mixed_cells_are_refused_with_the_way_out(tmp_path: Path) -> None:
    gz, starts, n = _mixed(tmp_path)
    with pytest.raises(SourceError) as ei:
        _read_all(gz)
    e = ei.value
    assert e.line == starts[n] and "mixes cells" in e.reason and "cluster 1" in e.reason and "cluster 3" in e.reason
    assert f"gpuclust kaggle-split {gz}" in e.reason
    from gpuclust.ingest import ingest

    rep = ingest([gz], tmp_path / "ds", progress=None)
    assert not rep.complete and len(rep.failed) == 1 and "mixes cells" in rep.failed[0].error


def test_kaggle_split_parts_ingest_like_their_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuclust.cli import main

    gz, starts, n = _mixed(tmp_path)
    assert main(["kaggle-split", str(gz), str(tmp_path / "parts")]) == 0
    assert capsys.readouterr().out.splitlines() == [f"cluster 1: {n + 2:,} records", f"cluster 3: {n:,} records"]
    parts = sorted((tmp_path / "parts").iterdir())
    assert [p.name for p in parts] == ["borg_traces_data.cluster-1.csv", "borg_traces_data.cluster-3.csv"]
    # byte for byte: the header and each record's original text, in order
    text = gzip.decompress(gz.read_bytes()).decode()
    assert text.endswith("\n")
    lines = [line + "\n" for line in text.split("\n")[:-1]]
    rec_text = ["".join(lines[s - 1 : e - 1]) for s, e in zip(starts, [*starts[1:], len(lines) + 1], strict=True)]
    head = "".join(lines[: starts[0] - 1])
    assert parts[0].read_bytes().decode() == head + "".join(rec_text[:n] + rec_text[2 * n :])
    assert parts[1].read_bytes().decode() == head + "".join(rec_text[n : 2 * n])
    one, rej1, _ = _read_all(parts[0])
    three, rej3, _ = _read_all(parts[1])
    assert rej1 == rej3 == [] and one["instance_events"].num_rows == n + 2 and three["instance_events"].num_rows == n
    assert set(three["instance_events"].column("collection_id").to_pylist()).isdisjoint(
        one["instance_events"].column("collection_id").to_pylist()
    )
    assert not list((tmp_path / "parts").glob(".*.tmp"))
    assert main(["kaggle-split", str(tmp_path / "missing.csv"), str(tmp_path / "p2")]) == 2
