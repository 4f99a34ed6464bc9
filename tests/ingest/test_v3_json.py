"""The v3 JSON reader: round trips, exact int64, malformed lines, damaged files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples

from gpuclust.dataset import Dataset
from gpuclust.ingest import ingest
from gpuclust.ingest.base import ReadOptions, SourceError
from gpuclust.ingest.detect import detect
from gpuclust.ingest.readers.v3_json import read
from gpuclust.schema import SCHEMAS

from .conftest import BIG, bq_json_line, expected_tables, records, sorted_rows, table_rows, write_json

SMALL = ReadOptions(chunk_bytes=4096, threads=1)


def _read_all(path: Path, **kw: object) -> tuple[dict[str, list[dict]], list]:
    src = detect(path, **kw)  # type: ignore[arg-type]
    tables: dict[str, list[dict]] = {}
    rejects = []
    for ch in read(src, SMALL):
        for t, tbl in ch.tables.items():
            assert tbl.schema.equals(SCHEMAS[t]), t
            tables.setdefault(t, []).extend(tbl.to_pylist())
        rejects.extend(ch.rejects)
    return tables, rejects


def _rejects(out: Path) -> list[dict]:
    rows = []
    for f in sorted((out / "_rejects").glob("*.jsonl")):
        rows.extend(json.loads(x) for x in f.read_text().splitlines())
    return rows


@pytest.mark.parametrize(
    "table", ["instance_usage", "instance_events", "collection_events", "machine_events", "machine_attributes"]
)
def test_round_trip(tmp_path: Path, table: str) -> None:
    recs = records(table, 300, seed=hash(table) % 1000)
    f = write_json(tmp_path / f"{table}-000000000000.json.gz", recs)
    out = tmp_path / "ds"
    rep = ingest([f], out, opts=SMALL)
    assert rep.exit_status == 0, rep.summary()
    assert rep.rows_read == 300 and rep.rows_rejected == 0
    ds = Dataset(out)
    want = expected_tables(table, recs)
    for t, rows in want.items():
        got = ds.read(t)
        assert got.schema.equals(SCHEMAS[t])
        assert table_rows(got) == sorted_rows(rows), t
    assert len(ds.files(table)) > 1  # several chunks -> several parts


def test_exact_int64(tmp_path: Path) -> None:
    ids = [2**63 - 1, 2**53 + 1, 2**62, 2**62 + 1, 2**63 - 2, -(2**63), 9007199254740993]
    lines = [
        bq_json_line({"time": BIG, "machine_id": i, "type": 1, "capacity": {"cpus": 1.0, "memory": 0.5}}) for i in ids
    ]
    assert '"time":"9223372036854775807"' in lines[0] and '"cpus":1,' in lines[0]
    f = write_json(tmp_path / "machine_events-000000000000.json.gz", lines)
    tables, rejects = _read_all(f)
    assert not rejects
    got = tables["machine_events"]
    assert [r["machine_id"] for r in got] == ids
    assert all(r["time"] == 2**63 - 1 for r in got)
    assert got[0]["cap_cpu"] == 1.0


@pytest.mark.parametrize("fast", ["1", "0"], ids=["fast-reader", "arrow-reader"])
def test_omitted_usage_keys_are_their_none_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast: str) -> None:
    """TRACE_NOTES: the export omits NULL fields.  Where the spec defines a "none" value a missing
    key is that value: a usage window without ``alloc_collection_id`` is stored with 0 (not in an
    alloc set) and without ``alloc_instance_index`` with -1; every other omitted field stays NULL
    (``collection_type``, CPI, MAI, maximum usage, sample rate).  Through the whole ingest, with
    the compiled usage reader and without it (GPUCLUST_FAST_JSON=0: the Arrow path)."""
    monkeypatch.setenv("GPUCLUST_FAST_JSON", fast)
    base = '"start_time":"600000000","end_time":"900000000","instance_index":"3","machine_id":"32434369549"'
    lines = [
        "{" + base + ',"collection_id":"11","average_usage":{"cpus":0.25,"memory":0.5}}',
        "{" + base + ',"collection_id":"12","alloc_collection_id":"77","collection_type":"1"}',
    ]
    f = write_json(tmp_path / "instance_usage-000000000000.json.gz", lines)
    assert ingest([f], tmp_path / "ds", workers=1).exit_status == 0
    t = Dataset(tmp_path / "ds").read("instance_usage").sort_by("collection_id")
    assert t.column("alloc_collection_id").to_pylist() == [0, 77]
    assert t.column("alloc_instance_index").to_pylist() == [-1, -1]
    assert t.column("collection_type").to_pylist() == [None, 1]
    assert t.column("avg_cpu").to_pylist() == [0.25, None]
    for c in ("cpi", "mai", "max_cpu", "sample_rate"):
        assert t.column(c).to_pylist() == [None, None], c


def test_int64_overflow_rejected(tmp_path: Path) -> None:
    f = write_json(
        tmp_path / "machine_events-000000000000.json",
        ['{"time":"9223372036854775808","machine_id":"1","type":"1"}'],
        gz=False,
    )
    tables, rejects = _read_all(f)
    assert [r.line for r in rejects] == [1]
    assert "column time" in rejects[0].reason


BAD_MACHINE_LINES = {
    "bad JSON": ('{"time":"1","machine_id":"5","type":"1"', "invalid JSON"),
    "object where number": (
        '{"time":"1","machine_id":"5","type":"1","capacity":{"cpus":{"x":1}}}',
        "capacity.cpus: expected a number, got object",
    ),
    "object where int": ('{"time":{"a":1},"machine_id":"5","type":"1"}', "field time: expected an integer"),
    "quoted non-number": ('{"time":"1","machine_id":"abc","type":"1"}', "column machine_id: cannot convert 'abc'"),
    "out-of-range code": ('{"time":"1","machine_id":"5","type":"42"}', "column type: code 42 outside 0..3"),
    "missing required key": ('{"time":"1","type":"1"}', "column machine_id: required value is missing"),
    "not an object": ("[1,2,3]", "not a JSON object"),
    "hex is not decimal": ('{"time":"0x1F","machine_id":"5","type":"1"}', "column time: cannot convert '0x1F'"),
}


@pytest.mark.parametrize("kind", sorted(BAD_MACHINE_LINES))
def test_malformed_line(tmp_path: Path, kind: str) -> None:
    bad, reason = BAD_MACHINE_LINES[kind]
    good = [bq_json_line({"time": 10 + i, "machine_id": 100 + i, "type": 1}) for i in range(6)]
    lines = good[:2] + ["", bad] + good[2:]  # blank line 3 is skipped, bad line is line 4
    f = write_json(tmp_path / "machine_events-000000000000.json.gz", lines)
    out = tmp_path / "ds"
    rep = ingest([f], out, max_reject_rate=0.5)
    assert rep.exit_status == 0
    assert rep.rows_read == 7 and rep.rows_rejected == 1
    assert sorted(r["machine_id"] for r in Dataset(out).read("machine_events").to_pylist()) == list(range(100, 106))
    (rej,) = _rejects(out)
    assert rej["line"] == 4 and rej["row"] is None
    assert reason in rej["reason"], rej["reason"]
    assert rej["raw"] == bad
    assert rej["file"] == str(f)


def test_wrong_list_length(tmp_path: Path) -> None:
    base = {"start_time": 1, "end_time": 2, "collection_id": 3, "instance_index": 0, "machine_id": 4}
    lines = [
        bq_json_line({**base, "cpu_usage_distribution": [0.1] * 11, "tail_cpu_usage_distribution": [0.2] * 9}),
        bq_json_line({**base, "cpu_usage_distribution": [0.1] * 5}),
        bq_json_line({**base, "cpu_usage_distribution": [], "tail_cpu_usage_distribution": [0.2] * 10}),
        bq_json_line({**base}),
    ]
    f = write_json(tmp_path / "instance_usage-000000000000.json.gz", lines)
    tables, rejects = _read_all(f)
    assert [(r.line, r.reason) for r in rejects] == [
        (2, "cpu_usage_distribution: expected 11 values (or none), got 5"),
        (3, "tail_cpu_usage_distribution: expected 9 values (or none), got 10"),
    ]
    rows = tables["instance_usage"]
    assert len(rows) == 2
    assert rows[0]["cpu_p0"] == pytest.approx(0.1) and rows[0]["cpu_p99"] == pytest.approx(0.2)
    assert rows[1]["cpu_p0"] is None and rows[1]["cpu_p91"] is None


def test_enum_names_and_lenient_numbers(tmp_path: Path) -> None:
    lines = [
        '{"time":"1","machine_id":"5","type":"ADD"}',
        '{"time":2,"machine_id":6,"type":3}',  # unquoted ints (slow path)
        '{"time":"3","machine_id":"7","type":"REMOVE","capacity":{"cpus":"0.5"}}',  # quoted float
    ]
    f = write_json(tmp_path / "machine_events-000000000000.json.gz", lines)
    tables, rejects = _read_all(f)
    assert not rejects
    got = [(r["time"], r["machine_id"], r["type"], r["cap_cpu"]) for r in tables["machine_events"]]
    assert got == [(1, 5, 1, None), (2, 6, 3, None), (3, 7, 2, 0.5)]


def test_constraints(tmp_path: Path) -> None:
    ev = {"time": 5, "type": 0, "collection_id": 2**60, "instance_index": 3, "priority": 200}
    lines = [
        bq_json_line(
            {
                **ev,
                "constraint": [{"name": "a", "value": "1", "relation": 0}, {"name": "b", "value": "", "relation": 6}],
            }
        ),
        bq_json_line(
            {
                **ev,
                "instance_index": 4,
                "constraint": [{"name": "a", "relation": 0}, {"name": "c", "value": "x", "relation": 99}],
            }
        ),
        bq_json_line({**ev, "instance_index": 5}),
    ]
    f = write_json(tmp_path / "instance_events-000000000000.json.gz", lines)
    out = tmp_path / "ds"
    rep = ingest([f], out, max_reject_rate=1)
    assert rep.rows_read == 3 and rep.rows_rejected == 1
    assert rep.rows_written == {"instance_events": 2, "instance_constraints": 2}
    (rej,) = _rejects(out)
    assert rej["line"] == 2 and rej["reason"].startswith("constraint[1]: column relation: code 99")
    cons = Dataset(out).read("instance_constraints").to_pylist()
    assert cons == [
        {"time": 5, "collection_id": 2**60, "instance_index": 3, "name": "a", "value": "1", "relation": 0},
        {"time": 5, "collection_id": 2**60, "instance_index": 3, "name": "b", "value": "", "relation": 6},
    ]
    ev_rows = Dataset(out).read("instance_events").to_pylist()
    assert [r["instance_index"] for r in ev_rows] == [3, 5]
    assert ev_rows[0]["machine_id"] == 0 and ev_rows[0]["alloc_instance_index"] == -1  # NULL_MEANS


# --------------------------------------------------------------------------------------------
_BAD_KINDS = [
    '{"time":"1","machine_id":',
    '{"time":"1","machine_id":"5","type":"1","capacity":{"cpus":[1]}}',
    '{"time":"x1","machine_id":"5","type":"1"}',
    '{"time":"1","machine_id":"5","type":"7"}',
    '{"machine_id":"5","type":"1"}',
    '"just a string"',
    '{"time":"1","machine_id":"5","type":"1"}{"time":"2","machine_id":"6","type":"1"}',
]


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    plan=st.lists(
        st.tuples(st.sampled_from(["good", "bad", "blank"]), st.integers(0, len(_BAD_KINDS) - 1)),
        min_size=1,
        max_size=60,
    ),
    chunk=st.sampled_from([64, 300, 1024, 1 << 20]),
)
def test_mixed_good_and_bad_lines(
    tmp_path_factory: pytest.TempPathFactory, plan: list[tuple[str, int]], chunk: int
) -> None:
    d = tmp_path_factory.mktemp("mix")
    lines: list[str] = []
    good_ids: list[int] = []
    bad_lines: dict[int, str] = {}
    for i, (kind, k) in enumerate(plan):
        if kind == "good":
            mid = 2**62 + i
            lines.append(bq_json_line({"time": i, "machine_id": mid, "type": 1 + i % 3, "capacity": {"cpus": 0.5}}))
            good_ids.append(mid)
        elif kind == "bad":
            lines.append(_BAD_KINDS[k])
            bad_lines[i + 1] = _BAD_KINDS[k]
        else:
            lines.append(" " if k % 2 else "")
    f = write_json(d / "machine_events-000000000000.json.gz", lines)
    out = d / "ds"
    rep = ingest([f], out, opts=ReadOptions(chunk_bytes=chunk, threads=1), workers=1, max_reject_rate=1.0)
    assert rep.exit_status == 0 and rep.complete
    got_ids = Dataset(out).read("machine_events", ["machine_id"]).column("machine_id").to_pylist()
    assert sorted(got_ids) == sorted(good_ids)  # every good row exactly once
    rejects = _rejects(out)
    assert {r["line"]: r["raw"] for r in rejects} == bad_lines  # every bad line, at its line
    assert len(rejects) == len(bad_lines)
    assert all(r["file"] == str(f) and r["reason"] for r in rejects)
    assert rep.rows_read == len(good_ids) + len(bad_lines)
    assert rep.rows_rejected == len(bad_lines)


# --------------------------------------------------------------------------------------------
def test_truncated_gzip(tmp_path: Path) -> None:
    recs = records("machine_events", 3000, seed=3)
    full = tmp_path / "full.json.gz"
    write_json(full, recs)
    data = full.read_bytes()
    f = tmp_path / "machine_events-000000000000.json.gz"
    f.write_bytes(data[: len(data) * 2 // 3])
    # The complete lines inside the cut stream:
    import zlib

    d = zlib.decompressobj(wbits=31)
    text = d.decompress(f.read_bytes())
    complete = text.count(b"\n")
    assert 0 < complete < 3000
    good = write_json(tmp_path / "machine_attributes-000000000000.json.gz", records("machine_attributes", 10))
    out = tmp_path / "ds"
    rep = ingest([f, good], out, opts=ReadOptions(chunk_bytes=8192), workers=1)
    assert rep.exit_status == 1
    (failed,) = rep.failed
    assert failed.path == str(f)
    assert "truncated gzip" in (failed.error or "") and f"line {complete + 1}" in (failed.error or "")
    assert failed.rows_read == complete
    with pytest.raises(Exception, match="complete: false"):
        Dataset(out)
    ds = Dataset(out, allow_incomplete=True)
    assert ds.num_rows("machine_events") == complete
    assert ds.read("machine_events").num_rows == complete
    assert ds.manifest["inputs"][failed.content_hash]["status"] == "failed"
    assert ds.num_rows("machine_attributes") == 10
    # A re-run retries the failed file (still truncated -> still failed), rows are not doubled.
    rep2 = ingest([f, good], out, opts=ReadOptions(chunk_bytes=8192), workers=1)
    assert rep2.exit_status == 1
    assert Dataset(out, allow_incomplete=True).read("machine_events").num_rows == complete


def test_truncated_reader_raises_after_good_chunks(tmp_path: Path) -> None:
    f = tmp_path / "machine_events-000000000000.json.gz"
    write_json(f, records("machine_events", 500, seed=1))
    f.write_bytes(f.read_bytes()[:-20])
    got = 0
    with pytest.raises(SourceError, match="truncated gzip") as ei:
        for ch in read(detect(f), ReadOptions(chunk_bytes=2048, threads=2)):
            got += ch.rows_read
    assert ei.value.path == str(f) and ei.value.line == got + 1
    assert 0 < got <= 500


def test_plain_json_and_gzip_by_magic(tmp_path: Path) -> None:
    recs = records("machine_events", 50, seed=9)
    plain = write_json(tmp_path / "machine_events-000000000000.json.gz", recs, gz=False)  # lying suffix
    src = detect(plain)
    assert src.compression is None and src.format == "v3-json"
    zipped = write_json(tmp_path / "machine_events-x", recs)  # no suffix at all
    assert detect(zipped).compression == "gzip"
    a, _ = _read_all(plain)
    b, _ = _read_all(zipped)
    assert a == b and len(a["machine_events"]) == 50


def test_concatenated_gzip_members(tmp_path: Path) -> None:
    lines = [bq_json_line({"time": i, "machine_id": i + 1, "type": 1}) for i in range(20)]
    f = tmp_path / "machine_events-000000000000.json.gz"
    f.write_bytes(
        gzip.compress(("\n".join(lines[:10]) + "\n").encode()) + gzip.compress(("\n".join(lines[10:]) + "\n").encode())
    )
    tables, rejects = _read_all(f)
    assert not rejects and [r["time"] for r in tables["machine_events"]] == list(range(20))


def test_no_trailing_newline_and_crlf(tmp_path: Path) -> None:
    f = tmp_path / "machine_events-000000000000.json"
    f.write_bytes(
        b'{"time":"1","machine_id":"2","type":"1"}\r\n{"time":"3","machine_id":"4","type":"9"}\r\n{"time":"5","machine_id":"6","type":"1"}'
    )
    tables, rejects = _read_all(f)
    assert [r["time"] for r in tables["machine_events"]] == [1, 5]
    assert [(r.line, r.raw) for r in rejects] == [(2, '{"time":"3","machine_id":"4","type":"9"}')]


def test_multi_batch_chunks_keep_line_numbers(tmp_path: Path) -> None:
    """Big chunks are parsed in several Arrow blocks and converted batch by batch."""
    recs = records("instance_usage", 3000, seed=21)
    lines = [bq_json_line(r) for r in recs]
    bad_at = {17: "code 9 outside 0..1", 1234: "expected 11 values", 2990: "expected 11 values"}
    lines[16] = bq_json_line(dict(recs[16], collection_type=9))
    for k in (1233, 2989):
        rec = dict(recs[k], cpu_usage_distribution=[0.5] * 4)
        lines[k] = bq_json_line(rec)
    f = write_json(tmp_path / "instance_usage-000000000000.json.gz", lines)
    src = detect(f)
    chunks = list(read(src, ReadOptions(chunk_bytes=1 << 20, threads=2)))
    rejects = [r for c in chunks for r in c.rejects]
    assert {r.line: r.reason for r in rejects}.keys() == bad_at.keys()
    for r in rejects:
        assert bad_at[r.line] in r.reason and r.raw == lines[r.line - 1]
    keep = [rec for i, rec in enumerate(recs) if i + 1 not in bad_at]
    got = [row for c in chunks for row in c.tables["instance_usage"].to_pylist()]
    assert got == expected_tables("instance_usage", keep)["instance_usage"]  # same order too


def test_empty_shard(tmp_path: Path) -> None:
    f = write_json(tmp_path / "instance_usage-000000000042.json.gz", [])
    assert detect(f).format == "v3-json"
    rep = ingest([f], tmp_path / "ds")
    assert rep.exit_status == 0 and rep.rows_read == 0 and rep.complete
    assert Dataset(tmp_path / "ds").read("instance_usage").num_rows == 0


def test_sparse_bad_lines_in_a_big_chunk(tmp_path: Path) -> None:
    """One bad line costs a per-line parse of a small sub-piece only; results are exact."""
    recs = records("machine_events", 4000, seed=8)
    lines = [bq_json_line(r) for r in recs]
    bad = {10: "{oops", 2500: '{"time":{"x":1},"machine_id":"1","type":"1"}', 4000: "[]"}
    for ln, text in bad.items():
        lines[ln - 1] = text
    f = write_json(tmp_path / "machine_events-000000000000.json.gz", lines)
    from gpuclust.ingest.readers import v3_json

    calls: list[int] = []
    orig = v3_json._slow_parse

    def spy(piece, *a):  # type: ignore[no-untyped-def]
        calls.append(piece.newlines)
        return orig(piece, *a)

    v3_json._slow_parse = spy
    try:
        chunks = list(read(detect(f), ReadOptions(chunk_bytes=1 << 20, threads=2)))
    finally:
        v3_json._slow_parse = orig
    assert {r.line: r.raw for c in chunks for r in c.rejects} == bad
    assert sum(c.rows_read for c in chunks) == 4000
    keep = [r for i, r in enumerate(recs) if i + 1 not in bad]
    got = [row for c in chunks for row in c.tables["machine_events"].to_pylist()]
    assert got == expected_tables("machine_events", keep)["machine_events"]
    assert len(calls) == 3 and sum(calls) < 1000  # only the sub-pieces holding a bad line


def test_bom_and_overlong_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "machine_events-000000000000.json"
    f.write_bytes(b'\xef\xbb\xbf{"time":"1","machine_id":"2","type":"1"}\n{"time":"3","machine_id":"4","type":"1"}\n')
    tables, rejects = _read_all(f)
    assert not rejects and [r["time"] for r in tables["machine_events"]] == [1, 3]

    from gpuclust.ingest.readers import text_pieces

    monkeypatch.setattr(text_pieces, "MAX_LINE", 1000)
    g = tmp_path / "machine_events-000000000001.json"
    g.write_bytes(b'{"time":"1","machine_id":"2","type":"1"}\n[' + b'{"time":"1"},' * 200)  # no line end
    got = []
    with pytest.raises(SourceError, match="line 2 is longer than") as ei:
        for ch in read(detect(g), ReadOptions(chunk_bytes=64, threads=1)):
            got.append(ch.rows_read)
    assert sum(got) == 1 and ei.value.line == 2
