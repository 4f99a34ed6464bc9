"""The v2 (2011) headerless CSV reader: real trace files end to end, code maps checked against
hand-picked raw lines and against histograms computed independently with ``csv`` + ``gzip``,
and hand-written fixtures for the tables and the malformed cases the real files lack."""

from __future__ import annotations

import collections
import csv
import gzip
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples

from gpuclust.ingest.base import Chunk, ReadOptions, SourceError, SourceFile
from gpuclust.ingest.readers.v2_csv import V2_FIELDS, V2_TO_CANONICAL, read
from gpuclust.schema import SCHEMAS

REAL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "real"
V2 = REAL / "2011"
needs_real = pytest.mark.skipif(
    not V2.is_dir(), reason=f"real 2011 trace files not found at {V2} (shared/data/real is a sibling of the repo)"
)

# v2 code -> v3 code, written out by hand from the two format documents (not from gpuclust.schema).
EVENT_V2_TO_V3 = {0: 0, 1: 3, 2: 4, 3: 5, 4: 6, 5: 7, 6: 8, 7: 9, 8: 10}
MACHINE_V2_TO_V3 = {0: 1, 1: 2, 2: 3}
MISSING_V2_TO_V3 = {None: 0, 0: 1, 1: 2, 2: 3}


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------
def _src(path: Path, table: str, gz: bool | None = None) -> SourceFile:
    if gz is None:
        gz = path.read_bytes()[:2] == b"\x1f\x8b"
    return SourceFile(
        path=path, format="v2-csv", source_table=table, compression="gzip" if gz else None, trace_version="v2"
    )


def _read_all(src: SourceFile, chunk_bytes: int = 64 << 20) -> tuple[pa.Table, list, list[Chunk]]:
    chunks = list(read(src, ReadOptions(chunk_bytes=chunk_bytes)))
    canon = V2_TO_CANONICAL[src.source_table]
    tables = [c.tables[canon] for c in chunks]
    tbl = pa.concat_tables(tables) if tables else SCHEMAS[canon].empty_table()
    return tbl, [r for c in chunks for r in c.rejects], chunks


def _write(tmp_path: Path, name: str, text: str | bytes, gz: bool = False) -> Path:
    data = text.encode() if isinstance(text, str) else text
    p = tmp_path / name
    p.write_bytes(gzip.compress(data) if gz else data)
    return p


def _raw_rows(paths: list[Path]) -> list[list[str]]:
    rows: list[list[str]] = []
    for p in paths:
        with gzip.open(p, "rt", newline="") as f:
            rows.extend(csv.reader(f))
    return rows


def _hist(col: pa.ChunkedArray) -> dict[int, int]:
    vc = pc.value_counts(col)
    return dict(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist(), strict=True))


def _raw_line(path: Path, lineno: int) -> str:
    with gzip.open(path, "rt") as f:
        for i, line in enumerate(f, 1):
            if i == lineno:
                return line.rstrip("\n")
    raise AssertionError(f"{path} has fewer than {lineno} lines")


# ----------------------------------------------------------------------------------------------
# the embedded column map
# ----------------------------------------------------------------------------------------------
@needs_real
def test_fields_match_schema_csv() -> None:
    per_table: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    with open(V2 / "schema.csv", newline="") as f:
        for row in csv.DictReader(f):
            table = row["file pattern"].split("/")[0]
            per_table[table].append((int(row["field number"]), row["content"]))
    # 8 + 13 + 6 + 5 + 6 + 20 = 58 field rows (SOURCES.md says 57: `wc -l` misses the last row,
    # the file has no final newline).
    assert sum(len(v) for v in per_table.values()) == 58
    got = {t: tuple(name for _, name in sorted(v)) for t, v in per_table.items()}
    assert got == V2_FIELDS
    for v in per_table.values():  # field numbers are 1..n without gaps
        assert sorted(n for n, _ in v) == list(range(1, len(v) + 1))


# ----------------------------------------------------------------------------------------------
# real files
# ----------------------------------------------------------------------------------------------
@needs_real
def test_real_machine_events() -> None:
    path = V2 / "machine_events" / "part-00000-of-00001.csv.gz"
    tbl, rejects, chunks = _read_all(_src(path, "machine_events"))
    assert rejects == []
    assert tbl.num_rows == 37_780 == sum(c.rows_read for c in chunks)
    assert tbl.schema == SCHEMAS["machine_events"]
    assert chunks[-1].bytes_done == path.stat().st_size

    raw = _raw_rows([path])
    assert len(raw) == 37_780
    # Independent histogram: raw v2 codes mapped by hand == canonical codes.
    want = collections.Counter(MACHINE_V2_TO_V3[int(r[2])] for r in raw)
    assert collections.Counter(tbl.column("type").to_pylist()) == want
    # The 32 rows with empty CPU/memory give NULL capacity, and they are the same rows.
    empty = [i for i, r in enumerate(raw) if r[4] == "" and r[5] == ""]
    assert len(empty) == 32
    cpu_null = pc.is_null(tbl.column("cap_cpu")).to_pylist()
    mem_null = pc.is_null(tbl.column("cap_mem")).to_pylist()
    assert [i for i, v in enumerate(cpu_null) if v] == empty
    assert [i for i, v in enumerate(mem_null) if v] == empty
    assert tbl.column("switch_id").null_count == tbl.num_rows
    # Exact ids: sums as Python ints over the raw text.
    assert pc.sum(tbl.column("machine_id")).as_py() == sum(int(r[1]) for r in raw)
    assert pc.sum(tbl.column("time")).as_py() == sum(int(r[0]) for r in raw)

    # Rows picked by hand from `zcat ... | sed -n Np`.
    rows = tbl.to_pylist()  # 37,780 rows: small enough
    plat = "HofLGzk1Or/8Ildj2+Lqv0UGGvY82NLoni8+J/Yy0RU="
    # line 1: 0,5,0,HofL...,0.5,0.2493  (v2 ADD 0 -> v3 ADD 1)
    r = rows[0]
    assert (r["time"], r["machine_id"], r["type"], r["platform_id"]) == (0, 5, 1, plat)
    assert r["cap_cpu"] == pytest.approx(0.5) and r["cap_mem"] == pytest.approx(0.2493)
    # line 12478: 779231019,5782512,1,HofL...,0.5,0.2493  (v2 REMOVE 1 -> v3 REMOVE 2)
    assert _raw_line(path, 12478) == f"779231019,5782512,1,{plat},0.5,0.2493"
    assert (rows[12477]["time"], rows[12477]["machine_id"], rows[12477]["type"]) == (779231019, 5782512, 2)
    # line 12479: 974363601,1438195245,2,HofL...,0.5,0.4995  (v2 UPDATE 2 -> v3 UPDATE 3)
    assert (rows[12478]["time"], rows[12478]["machine_id"], rows[12478]["type"]) == (974363601, 1438195245, 3)
    assert rows[12478]["cap_mem"] == pytest.approx(0.4995)
    # line 13659: 113019603442,6264344062,0,JQ1t...,,  (empty capacity -> NULL)
    r = rows[13658]
    assert (r["time"], r["machine_id"], r["type"], r["cap_cpu"], r["cap_mem"]) == (
        113019603442,
        6264344062,
        1,
        None,
        None,
    )


@needs_real
def test_real_task_events() -> None:
    paths = sorted((V2 / "task_events").glob("part-*.csv.gz"))
    assert len(paths) == 5
    tables = []
    per_file = []
    for p in paths:
        tbl, rejects, chunks = _read_all(_src(p, "task_events"))
        assert rejects == [], rejects[:3]
        assert sum(c.rows_read for c in chunks) == tbl.num_rows
        per_file.append(tbl.num_rows)
        tables.append(tbl)
    assert per_file == [450_146, 77_776, 160_642, 115_400, 115_555]
    tbl = pa.concat_tables(tables)
    assert tbl.num_rows == 919_519
    assert tbl.schema == SCHEMAS["instance_events"]

    # Independent tallies over the raw text (plain gzip + str.split, one pass).
    n = 0
    widths: set[int] = set()
    ev_hist: collections.Counter[int] = collections.Counter()
    miss_hist: collections.Counter[int] = collections.Counter()
    sum_job = sum_machine = sum_time = no_cpu = 0
    for p in paths:
        with gzip.open(p, "rt", newline="") as f:
            for line in f:
                r = line.rstrip("\n").split(",")
                n += 1
                widths.add(len(r))
                ev_hist[EVENT_V2_TO_V3[int(r[5])]] += 1
                miss_hist[MISSING_V2_TO_V3[int(r[1]) if r[1] else None]] += 1
                sum_time += int(r[0])
                sum_job += int(r[2])
                sum_machine += int(r[4]) if r[4] else 0
                no_cpu += r[9] == ""
    assert n == 919_519 and widths == {13}
    assert _hist(tbl.column("type")) == ev_hist
    assert _hist(tbl.column("missing_type")) == miss_hist
    assert pc.sum(tbl.column("collection_id")).as_py() == sum_job
    assert pc.sum(tbl.column("machine_id")).as_py() == sum_machine
    assert pc.sum(tbl.column("time")).as_py() == sum_time
    assert tbl.column("machine_id").null_count == 0  # empty -> NO_MACHINE (0)
    assert pc.unique(tbl.column("collection_type")).to_pylist() == [0]
    assert pc.unique(tbl.column("alloc_collection_id")).to_pylist() == [0]
    assert pc.unique(tbl.column("alloc_instance_index")).to_pylist() == [-1]
    assert tbl.column("req_cpu").null_count == no_cpu

    first = tables[0].slice(0, 3).to_pylist()
    # part-00000 line 1: 0,2,3418309,0,4155527081,0,70s3...,3,9,,,,
    r = first[0]
    assert (r["time"], r["missing_type"], r["collection_id"], r["instance_index"], r["machine_id"], r["type"]) == (
        0,
        3,
        3418309,
        0,
        4155527081,
        0,
    )
    assert (r["scheduling_class"], r["priority"], r["req_cpu"], r["req_mem"]) == (3, 9, None, None)
    # part-00000 line 3: 0,,3418314,0,3938719206,0,70s3...,3,9,0.125,0.07446,0.0004244,0
    r = first[2]
    assert (r["missing_type"], r["collection_id"], r["machine_id"]) == (0, 3418314, 3938719206)
    assert r["req_cpu"] == pytest.approx(0.125) and r["req_mem"] == pytest.approx(0.07446)
    third = tables[2].slice(0, 2).to_pylist()
    # part-00002 line 1: 10623199542,,6126024662,0,43,3,pUz8...,3,9,0.125,0.0159,9.537e-06,0  (FAIL 3 -> 5)
    assert _raw_line(paths[2], 1).startswith("10623199542,,6126024662,0,43,3,")
    r = third[0]
    assert (r["time"], r["collection_id"], r["machine_id"], r["type"], r["req_mem"]) == (
        10623199542,
        6126024662,
        43,
        5,
        pytest.approx(0.0159),
    )
    # part-00002 line 2: 10623199551,,6126024662,0,,0,...  (empty machine -> 0)
    assert (third[1]["machine_id"], third[1]["type"]) == (0, 0)
    second = tables[1].slice(0, 1).to_pylist()
    # part-00001 line 1: 5611824441,,6251812952,1761,1306108,4,...,0,2,0.02499,0.07959,...  (FINISH 4 -> 6)
    r = second[0]
    assert (r["time"], r["collection_id"], r["instance_index"], r["machine_id"], r["type"], r["priority"]) == (
        5611824441,
        6251812952,
        1761,
        1306108,
        6,
        2,
    )


@needs_real
def test_real_job_events() -> None:
    paths = sorted((V2 / "job_events").glob("part-*.csv.gz"))
    assert len(paths) == 5
    tables = []
    for p in paths:
        tbl, rejects, chunks = _read_all(_src(p, "job_events"))
        assert rejects == []
        assert sum(c.rows_read for c in chunks) == tbl.num_rows
        tables.append(tbl)
    tbl = pa.concat_tables(tables)
    assert tbl.num_rows == 25_437
    raw = _raw_rows(paths)
    assert collections.Counter(tbl.column("type").to_pylist()) == collections.Counter(
        EVENT_V2_TO_V3[int(r[3])] for r in raw
    )
    assert tbl.column("user").to_pylist() == [r[4] for r in raw]
    assert tbl.column("collection_name").to_pylist() == [r[6] for r in raw]
    assert tbl.column("collection_logical_name").to_pylist() == [r[7] for r in raw]
    assert tbl.column("priority").null_count == tbl.num_rows  # v2 jobs carry no priority
    assert pc.sum(tbl.column("collection_id")).as_py() == sum(int(r[2]) for r in raw)
    # part-00000 line 1: 0,,3418309,0,70s3...,3,IHgt...,wAmg...
    r = tables[0].to_pylist()[0]
    assert (r["time"], r["missing_type"], r["collection_id"], r["type"], r["scheduling_class"]) == (0, 0, 3418309, 0, 3)
    assert r["user"] == "70s3v5qRyCO/1PCdI6fVXnrW8FU/w+5CKRSa72xgcIo="
    assert r["collection_name"] == "IHgtoxEBuUTHNbUeVs4hzptMY4n8rZKLbZg+Jh5fNG4="
    assert r["collection_logical_name"] == "wAmgn2H74cdoMuSFwJF3NaUEaudVBTZ0/HaNZBwIpEQ="


@needs_real
def test_real_file_in_small_chunks_same_result() -> None:
    path = V2 / "job_events" / "part-00001-of-00500.csv.gz"
    whole, _, _ = _read_all(_src(path, "job_events"))
    small, rejects, chunks = _read_all(_src(path, "job_events"), chunk_bytes=20_000)
    assert len(chunks) > 5 and rejects == []
    assert small.equals(whole)
    sizes = [c.bytes_done for c in chunks]
    assert sizes == sorted(sizes) and sizes[-1] == path.stat().st_size


# ----------------------------------------------------------------------------------------------
# hand-written fixtures
# ----------------------------------------------------------------------------------------------
def test_task_usage_fixture(tmp_path: Path) -> None:
    lines = [
        # 20 fields: start,end,job,task,machine,cpu,canon mem,assigned mem,unmapped pc,total pc,max mem,
        # disk io,local disk,max cpu,max disk io,cpi,mai,sample portion,agg type,sampled cpu
        "600000000,900000000,3418309,0,4155527081,0.03143,0.05389,0.06946,0.003464,0.003471,0.05408,7.629e-05,0.0003834,0.2415,0.001022,2.911,0.003135,1,0,0.03418",
        "900000000,1200000000,6251812952,1761,1306108,1.5e-05,,,,,,,,,,,,0.5,1,",
        "9223372036854775807,9223372036854775807,9223372036854775807,2147483647,9223372036854775807,0,0,0,0,0,0,0,0,0,0,,,,,",
    ]
    p = _write(tmp_path, "part-00000-of-00500.csv.gz", "\n".join(lines) + "\n", gz=True)
    tbl, rejects, chunks = _read_all(_src(p, "task_usage"))
    assert rejects == [] and tbl.num_rows == 3 and chunks[0].rows_read == 3
    assert tbl.schema == SCHEMAS["instance_usage"]
    a, b, c = tbl.to_pylist()
    assert (a["start_time"], a["end_time"], a["collection_id"], a["instance_index"], a["machine_id"]) == (
        600000000,
        900000000,
        3418309,
        0,
        4155527081,
    )
    expect = {
        "avg_cpu": 0.03143,
        "avg_mem": 0.05389,
        "assigned_mem": 0.06946,
        "page_cache_mem": 0.003471,  # total page cache (not the unmapped one)
        "max_mem": 0.05408,
        "max_cpu": 0.2415,
        "cpi": 2.911,
        "mai": 0.003135,
        "sample_rate": 1.0,
        "sample_cpu": 0.03418,
    }
    for k, v in expect.items():
        assert a[k] == pytest.approx(v, rel=1e-6), k
    assert (a["alloc_collection_id"], a["alloc_instance_index"], a["collection_type"]) == (0, -1, 0)
    assert all(a[f"cpu_p{q}"] is None for q in (0, 50, 91, 99, 100))
    assert b["avg_cpu"] == pytest.approx(1.5e-05) and b["avg_mem"] is None and b["cpi"] is None
    assert b["sample_rate"] == 0.5 and b["sample_cpu"] is None
    # int64 extremes survive exactly (never through float64)
    assert (c["start_time"], c["collection_id"], c["instance_index"], c["machine_id"]) == (
        2**63 - 1,
        2**63 - 1,
        2**31 - 1,
        2**63 - 1,
    )


def test_machine_attributes_fixture(tmp_path: Path) -> None:
    text = "0,5,GTXqMhJAo8YtgBr3NKPOZXyDd7Tq8oEpjdxIsK+hCtY=,2,0\n12345,6,Nsi4KYVJrMIUiKOKxrjvYyu+jxzOdaebo0sTZd7EBXs=,,1\n7,8,x,y,true\n"
    p = _write(tmp_path, "ma.csv", text)
    tbl, rejects, _ = _read_all(_src(p, "machine_attributes"))
    assert rejects == []
    assert tbl.to_pylist() == [
        {
            "time": 0,
            "machine_id": 5,
            "name": "GTXqMhJAo8YtgBr3NKPOZXyDd7Tq8oEpjdxIsK+hCtY=",
            "value": "2",
            "deleted": False,
        },
        {
            "time": 12345,
            "machine_id": 6,
            "name": "Nsi4KYVJrMIUiKOKxrjvYyu+jxzOdaebo0sTZd7EBXs=",
            "value": None,
            "deleted": True,
        },
        {"time": 7, "machine_id": 8, "name": "x", "value": "y", "deleted": True},
    ]


def test_task_constraints_fixture(tmp_path: Path) -> None:
    text = "\n".join(
        [
            "5611824441,6251812952,0,0,GTXq,2",  # EQUAL
            "5611824441,6251812952,0,1,GTXq,",  # NOT_EQUAL, empty value
            "5611824442,6251812952,1,2,w5Rr,5",  # LESS_THAN
            "5611824443,6251812952,2,3,w5Rr,1",  # GREATER_THAN
            "5611824444,6251812952,3,4,w5Rr,1",  # 4 is not a v2 operator -> rejected
        ]
    )
    p = _write(tmp_path, "tc.csv", text)  # no final newline
    tbl, rejects, chunks = _read_all(_src(p, "task_constraints"))
    assert tbl.column("relation").to_pylist() == [0, 1, 2, 3]
    assert tbl.column("value").to_pylist() == ["2", None, "5", "1"]
    assert tbl.column("instance_index").to_pylist() == [0, 0, 1, 2]
    assert [(r.line, r.row, r.raw) for r in rejects] == [(5, 4, "5611824444,6251812952,3,4,w5Rr,1")]
    assert "comparison operator" in rejects[0].reason and "4 outside 0..3" in rejects[0].reason
    assert chunks[0].rows_read == 5


MALFORMED = [
    "0,5,0,P,0.5,0.2493",  # 1 good
    "0,6,0,P,0.5",  # 2 too few fields
    "0,7,0,P,0.5,0.2493,9",  # 3 too many fields
    "0,abc,0,P,0.5,0.2493",  # 4 non-numeric id
    "0,9,9,P,0.5,0.2493",  # 5 event type 9: outside v2 0..2
    "",  # 6 empty line
    "0,10,-1,P,0.5,0.2493",  # 7 negative code
    "0,11,x,P,0.5,0.2493",  # 8 non-numeric code
    "1.5,12,0,P,0.5,0.2493",  # 9 float time
    "0,13,0,P,half,0.2493",  # 10 non-numeric capacity
    "0,14,2,P,,",  # 11 good (UPDATE, no capacity)
    ",15,0,P,0.5,0.2493",  # 12 missing mandatory time
    "0,99999999999999999999,0,P,0.5,0.2493",  # 13 id beyond int64
    "0,16,1,P,1,1",  # 14 good
]
MALFORMED_REASONS = {
    2: "expected 6 fields, found 5",
    3: "expected 6 fields, found 7",
    4: "machine_id",
    5: "code 9 outside 0..2",
    6: "empty line",
    7: "code -1 outside 0..2",
    8: "cannot read 'x'",
    9: "column time",
    10: "cap_cpu",
    12: "time: required value is missing",
    13: "machine_id",
}


@pytest.mark.parametrize("chunk_bytes", [64 << 20, 30, 1])
@pytest.mark.parametrize("gz", [False, True])
def test_malformed_rows_isolated(tmp_path: Path, chunk_bytes: int, gz: bool) -> None:
    p = _write(tmp_path, "me.csv" + (".gz" if gz else ""), "\n".join(MALFORMED) + "\n", gz=gz)
    tbl, rejects, chunks = _read_all(_src(p, "machine_events"), chunk_bytes=chunk_bytes)
    assert tbl.column("machine_id").to_pylist() == [5, 14, 16]
    assert tbl.column("type").to_pylist() == [1, 3, 2]
    assert sum(c.rows_read for c in chunks) == len(MALFORMED)
    assert {r.line for r in rejects} == set(MALFORMED_REASONS)
    for r in rejects:
        assert MALFORMED_REASONS[r.line] in r.reason, (r.line, r.reason)
        assert r.raw == MALFORMED[r.line - 1]
        assert r.row == r.line - 1 and r.file == str(p)
    assert [r.line for r in rejects] == sorted(r.line for r in rejects)


def test_bad_codes_in_events(tmp_path: Path) -> None:
    text = "\n".join(
        [
            "1,,7,0,,9,u,0,0,,,,",  # task event type 9: not a v2 code
            "2,3,7,0,,0,u,0,0,,,,",  # missing info 3: not a v2 code
            "3,,7,0,,8,u,0,0,,,,",  # 8 UPDATE_RUNNING -> 10: good
            "4,1,7,0,,1,u,4,0,,,,",  # scheduling class 4: outside 0..3
        ]
    )
    p = _write(tmp_path, "te.csv", text + "\n")
    tbl, rejects, _ = _read_all(_src(p, "task_events"))
    assert tbl.column("type").to_pylist() == [10]
    assert [r.line for r in rejects] == [1, 2, 4]
    assert "event type code 9 outside 0..8" in rejects[0].reason
    assert "missing info code 3 outside 0..2" in rejects[1].reason
    assert "scheduling_class" in rejects[2].reason
    p = _write(tmp_path, "je.csv", "1,,7,9,u,0,n,l\n2,,7,4,u,0,n,l\n")
    tbl, rejects, _ = _read_all(_src(p, "job_events"))
    assert tbl.column("type").to_pylist() == [6]
    assert [r.line for r in rejects] == [1] and "outside 0..8" in rejects[0].reason


def test_crlf_and_invalid_utf8(tmp_path: Path) -> None:
    data = b"0,5,0,P,0.5,0.25\r\n0,6,0,\xff\xfe,0.5,0.25\r\n0,7,0,P,0.5,0.25\r\n"
    p = _write(tmp_path, "me.csv", data)
    tbl, rejects, chunks = _read_all(_src(p, "machine_events"))
    assert tbl.column("machine_id").to_pylist() == [5, 7]
    assert tbl.column("cap_mem").to_pylist() == [0.25, 0.25]
    assert [(r.line, r.reason, r.raw) for r in rejects] == [
        (2, "line is not valid UTF-8", "0,6,0,\ufffd\ufffd,0.5,0.25")
    ]
    assert sum(c.rows_read for c in chunks) == 3


def test_stray_quote_is_literal(tmp_path: Path) -> None:
    p = _write(tmp_path, "me.csv", '0,5,0,"P,0.5,0.25\n0,6,0,P",0.5,0.25\n')
    tbl, rejects, _ = _read_all(_src(p, "machine_events"))
    assert tbl.column("platform_id").to_pylist() == ['"P', 'P"']
    assert rejects == []


@pytest.mark.parametrize("chunk_bytes", [64 << 20, 4096])
def test_truncated_gzip(tmp_path: Path, chunk_bytes: int) -> None:
    lines = [f"{i * 1000},{i},{i % 3},P{i % 7},0.5,0.25" for i in range(20_000)]
    full = gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=1)
    p = tmp_path / "cut.csv.gz"
    p.write_bytes(full[: len(full) // 2])
    got: list[pa.Table] = []
    with pytest.raises(SourceError) as ei:
        for c in read(_src(p, "machine_events"), ReadOptions(chunk_bytes=chunk_bytes)):
            assert c.rejects == []
            got.append(c.tables["machine_events"])
    assert got, "rows before the cut must be yielded"
    tbl = pa.concat_tables(got)
    n = tbl.num_rows
    assert 1000 < n < 20_000
    # A prefix of the file, each row exact.
    assert tbl.column("machine_id").to_pylist() == list(range(n))
    assert tbl.column("time").to_pylist() == [i * 1000 for i in range(n)]
    assert ei.value.line == n + 1
    assert "truncated" in ei.value.reason
    assert str(p) in str(ei.value)


def test_corrupt_gzip(tmp_path: Path) -> None:
    full = bytearray(gzip.compress(b"0,5,0,P,0.5,0.25\n" * 1000))
    full[len(full) // 2] ^= 0xFF
    full[len(full) // 2 + 1] ^= 0xFF
    p = tmp_path / "bad.csv.gz"
    p.write_bytes(bytes(full))
    with pytest.raises(SourceError):
        for _ in read(_src(p, "machine_events"), ReadOptions()):
            pass


def test_multimember_gzip(tmp_path: Path) -> None:
    p = tmp_path / "mm.csv.gz"
    p.write_bytes(gzip.compress(b"0,5,0,P,0.5,0.25\n") + gzip.compress(b"0,6,0,P,0.5,0.25\n"))
    tbl, rejects, _ = _read_all(_src(p, "machine_events"))
    assert tbl.column("machine_id").to_pylist() == [5, 6] and rejects == []


def test_unreadable_and_unknown(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="cannot open"):
        list(read(_src(tmp_path / "absent.csv", "machine_events", gz=False), ReadOptions()))
    p = _write(tmp_path, "x.csv", "1,2\n")
    with pytest.raises(SourceError, match="unknown v2 table"):
        list(read(_src(p, "task_usages"), ReadOptions()))


def test_empty_file(tmp_path: Path) -> None:
    p = _write(tmp_path, "empty.csv", "")
    assert list(read(_src(p, "machine_events"), ReadOptions())) == []


def test_python_fallback_matches_arrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The slow fallback parser (used if pyarrow cannot parse a block) gives the same result."""
    from gpuclust.ingest.readers import v2_csv

    p = _write(tmp_path, "me.csv", "\n".join(MALFORMED) + "\n")
    tbl1, rej1, _ = _read_all(_src(p, "machine_events"))
    monkeypatch.setattr(v2_csv, "_parse_arrow", lambda block, names: None)
    tbl2, rej2, _ = _read_all(_src(p, "machine_events"))
    assert tbl1.equals(tbl2)
    assert [(r.line, r.reason, r.raw) for r in rej1] == [(r.line, r.reason, r.raw) for r in rej2]


def test_bare_cr_falls_back(tmp_path: Path) -> None:
    # pyarrow splits rows at a bare "\r"; the reader notices and keeps lines exact.
    p = _write(tmp_path, "me.csv", b"0,5,0,P\rQ,0.5,0.25\n0,6,0,P,0.5,0.25\n")
    tbl, rejects, _ = _read_all(_src(p, "machine_events"))
    assert tbl.column("platform_id").to_pylist() == ["P\rQ", "P"]
    assert rejects == []


def test_every_canonical_table_written() -> None:
    assert set(V2_TO_CANONICAL) == set(V2_FIELDS)
    assert set(V2_TO_CANONICAL.values()) == set(SCHEMAS)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kinds=st.lists(
        st.sampled_from(["good", "good", "good", "short", "long", "empty", "badcode"]), min_size=1, max_size=40
    ),
    chunk_bytes=st.integers(1, 300),
    final_newline=st.booleans(),
    gz=st.booleans(),
)
def test_line_numbers_any_chunking(
    tmp_path: Path, kinds: list[str], chunk_bytes: int, final_newline: bool, gz: bool
) -> None:
    """Whatever the block size, good rows come out in order and every reject has its exact line."""
    lines = []
    for i, k in enumerate(kinds):
        mid = 2**40 + i  # beyond 32 bits
        lines.append(
            {
                "good": f"{i},{mid},{i % 3},P{i},0.5,0.25",
                "short": f"{i},{mid},0",
                "long": f"{i},{mid},0,P,0.5,0.25,1",
                "empty": "",
                "badcode": f"{i},{mid},7,P,0.5,0.25",
            }[k]
        )
    text = "\n".join(lines) + ("\n" if final_newline else "")
    if not text:
        return
    p = _write(tmp_path, f"h{chunk_bytes}{int(gz)}.csv", text, gz=gz)
    tbl, rejects, chunks = _read_all(_src(p, "machine_events", gz=gz), chunk_bytes=chunk_bytes)
    nlines = len(lines) if (final_newline or lines[-1] != "") else len(lines) - 1
    want_good = [2**40 + i for i, k in enumerate(kinds[:nlines]) if k == "good"]
    assert tbl.column("machine_id").to_pylist() == want_good
    assert [r.line for r in rejects] == [i + 1 for i, k in enumerate(kinds[:nlines]) if k != "good"]
    assert all(r.raw == lines[r.line - 1] for r in rejects)
    assert sum(c.rows_read for c in chunks) == nlines
