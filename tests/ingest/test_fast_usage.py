"""The compiled InstanceUsage JSON reader (``readers/_fast_usage``) against the Arrow path.

Every test reads the same bytes twice -- with the fast reader on, and with
``GPUCLUST_FAST_JSON=0`` (Arrow ``read_json`` + per-line isolation) -- and requires identical
canonical tables (every column, every NULL, float bits), rejects (line, reason, raw text) and
row counts; and it checks which path the pieces took, so a test of the fast reader cannot pass by
silently falling back.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples

from gpuclust.dataset import Dataset
from gpuclust.ingest import ingest
from gpuclust.ingest.base import ReadOptions
from gpuclust.ingest.detect import detect
from gpuclust.ingest.readers import _fast_usage, v3_json

from .conftest import BIG, bq_json_line, records, write_json

pytestmark = pytest.mark.skipif(not _fast_usage.available(), reason="no compiled reader (no extension, no numba)")


def _extension() -> Any:
    """The C extension built at install (setup.py), or None where it was not built."""
    try:
        from gpuclust.ingest.readers import _fast_usage_c
    except ImportError:
        return None
    return _fast_usage_c


@pytest.fixture(autouse=True, params=["numba", "c"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs with numba's kernel (the stand-in where the extension was not built)
    and with the C extension built at install."""
    if request.param == "numba":
        from gpuclust.ingest.readers import _fast_usage_kernel

        mod: Any = _fast_usage_kernel
    else:
        mod = _extension()
        if mod is None:
            pytest.skip("the C extension is not built here (pip install -e . builds it, given a C compiler)")
    monkeypatch.setattr(_fast_usage, "_kernel", mod.parse_usage)
    monkeypatch.setattr(_fast_usage, "_numbers", mod.parse_numbers)
    return str(request.param)


GOOD = {
    "start_time": "600000000",
    "end_time": "900000000",
    "collection_id": "477319772031",
    "instance_index": "3",
    "machine_id": "32434369549",
    "alloc_collection_id": "0",
    "collection_type": "0",
}
GOOD_LINE = (
    '{"start_time":"600000000","end_time":"900000000","collection_id":"477319772031","instance_index":"3",'
    '"machine_id":"32434369549","alloc_collection_id":"0","collection_type":"0",'
    '"average_usage":{"cpus":0.0637732,"memory":0.0095003},"maximum_usage":{"cpus":0.2123632,"memory":0.009551},'
    '"random_sample_usage":{"cpus":0.0231088},"assigned_memory":0.018528,"page_cache_memory":0.0005518,'
    '"cycles_per_instruction":1.71071,"memory_accesses_per_instruction":0.0122081,"sample_rate":1,'
    '"cpu_usage_distribution":[0.0204756,0.0347219,0.0403137,0.0465799,0.051505,0.0580301,0.0639032,'
    '0.0702573,0.0825102,0.0993762,0.2123632],"tail_cpu_usage_distribution":[0.102765,0.1080336,0.1135926,'
    "0.1189096,0.1228147,0.1268398,0.136508,0.1444362,0.1652012]}"
)


class Spy:
    """Counts pieces the fast reader accepted and refused."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.took = 0
        self.refused = 0
        orig = _fast_usage.parse

        def parse(data: Any, n_lines: int, threads: int = 1) -> pa.Table | None:
            out = orig(data, n_lines, threads)
            if out is None:
                self.refused += 1
            else:
                self.took += 1
            return out

        monkeypatch.setattr(_fast_usage, "parse", parse)


def _read(path: Path, opts: ReadOptions) -> tuple[pa.Table, list[tuple[int | None, str, str]], int]:
    tables, rejects, rows = [], [], 0
    for ch in v3_json.read(detect(path), opts):
        if "instance_usage" in ch.tables:
            tables.append(ch.tables["instance_usage"])
        rejects.extend((r.line, r.reason, r.raw) for r in ch.rejects)
        rows += ch.rows_read
    from gpuclust.schema import SCHEMAS

    tbl = pa.concat_tables(tables) if tables else SCHEMAS["instance_usage"].empty_table()
    return tbl, rejects, rows


def _same_bits(a: pa.Table, b: pa.Table) -> None:
    assert a.schema.equals(b.schema)
    assert a.num_rows == b.num_rows
    for name in a.column_names:
        x, y = a.column(name).combine_chunks(), b.column(name).combine_chunks()
        assert x.is_valid().equals(y.is_valid()), name
        if pa.types.is_floating(x.type):  # bit for bit: -0.0, NaN payloads
            bx = np.asarray(x.fill_null(0).to_numpy(zero_copy_only=False)).view(np.uint32)
            by = np.asarray(y.fill_null(0).to_numpy(zero_copy_only=False)).view(np.uint32)
            assert np.array_equal(bx, by), name
        else:
            assert x.equals(y), name


#: The Arrow path's reads (``_read`` with ``GPUCLUST_FAST_JSON=0``) by file name, content and
#: options: the same bytes read the same way under the other kernel's run of a test are not read
#: again (no kernel takes part in that path).
_ARROW_READS: dict[tuple[str, str, str], tuple[pa.Table, list[tuple[int | None, str, str]], int]] = {}


def both(path: Path, monkeypatch: pytest.MonkeyPatch, opts: ReadOptions | None = None) -> tuple[Spy, Any]:
    """Read ``path`` with the fast reader and without; assert identical results; return the spy."""
    opts = opts or ReadOptions(chunk_bytes=4096, threads=1)
    with monkeypatch.context() as m:
        m.setenv("GPUCLUST_FAST_JSON", "0")
        assert not _fast_usage.available()
        key = (path.name, hashlib.sha256(path.read_bytes()).hexdigest(), repr(opts))
        if key not in _ARROW_READS:
            _ARROW_READS[key] = _read(path, opts)
        ref = _ARROW_READS[key]
    spy = Spy(monkeypatch)
    got = _read(path, opts)
    _same_bits(got[0], ref[0])
    assert got[1] == ref[1]  # rejects: line, reason, raw
    assert got[2] == ref[2]  # rows read
    return spy, got


@functools.cache
def _usage_lines(n: int, seed: int) -> tuple[str, ...]:
    """``records("instance_usage", n, seed=seed)`` in the export encoding (as ``write_json`` writes
    them), made once per process: several tests and both kernels' runs read the same lines."""
    return tuple(bq_json_line(r) for r in records("instance_usage", n, seed=seed))


def _write(
    tmp_path: Path, lines: list[str], name: str = "instance_usage-000000000000.json", crlf: bool = False
) -> Path:
    f = tmp_path / name
    sep = "\r\n" if crlf else "\n"
    f.write_bytes("".join(x + sep for x in lines).encode())
    return f


# --------------------------------------------------------------------------------------------
# Number conversion
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def number_texts() -> tuple[list[bytes], np.ndarray]:
    """Number texts of every kind, and Python's float() of each (once for both kernels)."""
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2**63, size=100_000, dtype=np.uint64) & np.uint64(0x7FEFFFFFFFFFFFFF)
    doubles = bits.view(np.float64)
    texts = [repr(float(v)).encode() for v in doubles[np.isfinite(doubles)]]  # up to 17 digits
    texts += [repr(float(np.float32(x))).encode() for x in rng.random(30_000)]  # float32 data as float64
    mans, exps = rng.integers(1, 10**18, 30_000), rng.integers(-330, 300, 30_000)
    texts += [f"{m}e{e}".encode() for m, e in zip(mans, exps, strict=True)]
    texts += [f"-0.{m:019d}".encode() for m in rng.integers(1, 10**19, 10_000, dtype=np.uint64)]
    texts += [f"{m}".encode() for m in rng.integers(0, 2**63 - 1, 10_000, dtype=np.int64)]
    texts += [
        b"0", b"-0", b"-0.0", b"0.1", b"1E+2", b"2.5e-3", b"1e-7", b"123456789012345678901234",
        b"9007199254740993", b"9007199254740992", b"1.7976931348623157e308", b"2.2250738585072014e-308",
        b"0.30000000000000004", b"5e-324", b"1e400", b"1e-400",
    ]  # fmt: skip
    return texts, np.array([float(t) for t in texts])


def test_numbers_are_correctly_rounded(number_texts: tuple[list[bytes], np.ndarray]) -> None:
    """Every number the kernel converts itself equals Python's correctly rounded float() bit for
    bit; the rest (ok False) are converted from their text by the caller."""
    texts, ref = number_texts
    out, ok = _fast_usage.parse_numbers(texts)
    assert np.array_equal(out[ok].view(np.uint64), ref[ok].view(np.uint64))
    assert ok.mean() > 0.99  # Eisel-Lemire decides nearly all
    ok_of = dict(zip(texts[-16:], ok[-16:].tolist(), strict=True))
    assert ok_of[b"-0"] and ok_of[b"0.1"] and ok_of[b"1E+2"]
    assert not ok_of[b"9007199254740993"]  # halfway: left to float()
    assert not ok_of[b"123456789012345678901234"]  # more than 19 digits: left to float()
    assert np.signbit(out[texts.index(b"-0")])


# --------------------------------------------------------------------------------------------
# Whole pieces: fast reader vs Arrow path
# --------------------------------------------------------------------------------------------
def test_benchmark_encoding_takes_the_fast_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = _write(tmp_path, [GOOD_LINE] * 50)
    spy, (tbl, rejects, rows) = both(f, monkeypatch)
    assert spy.took > 1 and spy.refused == 0
    assert rows == 50 and not rejects and tbl.num_rows == 50


def test_pieces_read_while_the_reader_loads_go_to_arrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process reads its first pieces while numba still loads: those go to the Arrow path
    (``_fast_usage.ready`` is False), the rest to the compiled reader, and the result is the
    Arrow path's exactly."""
    f = write_json(tmp_path / "instance_usage-000000000000.json.gz", _usage_lines(2000, 12))
    calls = []

    def ready(wait: float = 0.0) -> bool:
        if os.environ.get("GPUCLUST_FAST_JSON") == "0":  # the reference read: the Arrow path
            return False
        calls.append(1)
        return len(calls) > 3  # the first three pieces: still loading

    monkeypatch.setattr(_fast_usage, "ready", ready)
    spy, (tbl, rejects, rows) = both(f, monkeypatch, ReadOptions(chunk_bytes=32 << 10, threads=2))
    assert len(calls) > 6 and spy.took == len(calls) - 3 and spy.refused == 0
    assert rows == 2000 and not rejects


def test_ready_waits_for_a_load_in_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    """A piece waits (up to ``wait`` seconds) for a load in progress instead of going to Arrow."""
    assert _fast_usage.available()  # loaded in this process
    loading = threading.Thread(target=time.sleep, args=(0.3,))
    loading.start()
    monkeypatch.setattr(_fast_usage, "_preloading", loading)
    assert not _fast_usage.ready()  # no wait: still loading
    t0 = time.monotonic()
    assert _fast_usage.ready(5.0) and time.monotonic() - t0 < 4.0  # returned when the load ended
    slow = threading.Thread(target=time.sleep, args=(0.5,))
    slow.start()
    monkeypatch.setattr(_fast_usage, "_preloading", slow)
    assert not _fast_usage.ready(0.05)  # a first-ever compile: the piece goes to Arrow
    slow.join()


def test_generated_records_all_pieces_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test generator's records (big ids, sentinels, omitted keys, whole floats, empty and
    missing arrays, 12-digit floats) -- in real export encoding, gzipped, several threads."""
    f = write_json(tmp_path / "instance_usage-000000000000.json.gz", _usage_lines(3000, 11))
    spy, (tbl, rejects, rows) = both(f, monkeypatch, ReadOptions(chunk_bytes=64 << 10, threads=2))
    assert spy.took > 5 and spy.refused == 0
    assert rows == 3000


@pytest.mark.parametrize("bad_at", [None, 5, 2990])
def test_halves_parsed_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad_at: int | None) -> None:
    """With threads > 2 a big piece is parsed as two halves in two threads; a refused line in
    either half sends the whole piece to the Arrow path."""
    monkeypatch.setattr(_fast_usage, "_SPLIT_MIN", 1024)
    cuts: list[int] = []
    orig = _fast_usage._middle_line_end
    monkeypatch.setattr(_fast_usage, "_middle_line_end", lambda buf: cuts.append(orig(buf)) or cuts[-1])
    lines = list(_usage_lines(3000, 4))
    if bad_at is not None:
        lines[bad_at] = _line(EDGE_FALLBACK["quoted float"])
    f = write_json(tmp_path / "instance_usage-000000000000.json.gz", lines)
    spy, (tbl, rejects, rows) = both(f, monkeypatch, ReadOptions(chunk_bytes=256 << 10, threads=3))
    assert rows == 3000 and spy.took >= 3
    assert spy.refused == (0 if bad_at is None else 1)
    assert len(cuts) >= 3 and all(c > 0 for c in cuts)


SHARD_OPTS = ReadOptions(chunk_bytes=256 << 10, threads=2)


@pytest.fixture(scope="module")
def synth_shard(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A `gpuclust synth` InstanceUsage shard (6 machines x 2 h), and its ingest by the Arrow path
    (``GPUCLUST_FAST_JSON=0``: no kernel takes part), once for both kernels' runs."""
    from gpuclust.synth import SynthConfig, synthesize

    d = tmp_path_factory.mktemp("synth")
    res = synthesize(SynthConfig(machines=6, hours=2, seed=3), d / "raw", progress=None)
    (shard,) = res.shards["instance_usage"]
    with pytest.MonkeyPatch.context() as m:
        m.setenv("GPUCLUST_FAST_JSON", "0")
        assert not _fast_usage.available()
        rep = ingest([shard], d / "ds0", opts=SHARD_OPTS, workers=1)
    assert rep.exit_status == 0 and rep.rows_rejected == 0
    return shard, d / "ds0"


def test_synth_shard(synth_shard: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `gpuclust synth` InstanceUsage shard ingests to byte-identical Parquet both ways."""
    shard, arrow = synth_shard
    spy = Spy(monkeypatch)
    monkeypatch.setenv("GPUCLUST_FAST_JSON", "1")
    rep = ingest([shard], tmp_path / "ds1", opts=SHARD_OPTS, workers=1)
    assert rep.exit_status == 0 and rep.rows_rejected == 0
    outs = {"0": arrow, "1": tmp_path / "ds1"}
    assert spy.took > 1 and spy.refused == 0
    a, b = Dataset(outs["0"]), Dataset(outs["1"])
    assert a.read("instance_usage").equals(b.read("instance_usage"))
    for fa, fb in zip(a.files("instance_usage"), b.files("instance_usage"), strict=True):
        assert Path(fa).read_bytes() == Path(fb).read_bytes()
    ma, mb = (json.loads((o / "manifest.json").read_text()) for o in outs.values())
    for m in (ma, mb):
        for v in m["inputs"].values():
            v.pop("seconds", None)
    assert ma == mb


EDGE_FAST = {
    "sentinel and big ids": {
        **GOOD,
        "end_time": str(BIG),
        "collection_id": str(2**53 + 1),
        "machine_id": str(2**63 - 2),
    },
    "int64 min, -0, leading zeros": {**GOOD, "start_time": str(-(2**63)), "instance_index": "-0", "end_time": "007"},
    "unquoted ints": '{"start_time":600,"end_time":9223372036854775807,"collection_id":-5,"instance_index":0,"machine_id":12}',
    "reordered keys": '{"sample_rate":0.5,"machine_id":"4","instance_index":"1","collection_id":"3","end_time":"2","start_time":"1"}',
    "missing keys": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4"}',
    "nulls": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4",'
    '"alloc_collection_id":null,"average_usage":null,"maximum_usage":{"cpus":null,"memory":1},'
    '"cycles_per_instruction":null,"cpu_usage_distribution":null}',
    "empty object and arrays": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4",'
    '"average_usage":{},"cpu_usage_distribution":[],"tail_cpu_usage_distribution":[ ]}',
    "negative zero and exponents": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4",'
    '"average_usage":{"cpus":-0,"memory":-0.0},"assigned_memory":1E+2,"page_cache_memory":2.5e-3,'
    '"cycles_per_instruction":1e-45,"sample_rate":3.4028235e38,"memory_accesses_per_instruction":1.0000000596046448}',
    "long digits (float() path)": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4",'
    '"average_usage":{"cpus":0.123456789012345678901234,"memory":9007199254740993},'
    '"cpu_usage_distribution":[0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0,2677482104093203.5]}',
    "underflow to zero (float() path)": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1",'
    '"machine_id":"4","cycles_per_instruction":1e-400,"memory_accesses_per_instruction":-1e-400}',
    "whitespace": ' { "start_time" : "1" ,\t"end_time":"2", "collection_id":"3","instance_index":"1","machine_id":"4",'
    '"average_usage": { "cpus" : 1 , "memory" : 2 } , "cpu_usage_distribution" : [ 1 , 2 ] }  ',
    "wrong list lengths (rejected by to_canonical)": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1",'
    '"machine_id":"4","cpu_usage_distribution":[0.1,0.2],"tail_cpu_usage_distribution":[1,2,3,4,5,6,7,8,9,10]}',
    "codes and domain (rejected by conform)": {**GOOD, "collection_type": "7"},
    "missing required (rejected by conform)": '{"start_time":"1","end_time":"2"}',
    "empty object line": "{}",
    "int32 overflow (rejected by conform)": {**GOOD, "instance_index": "4294967296"},
}

EDGE_FALLBACK = {
    "bad JSON": '{"start_time":"1","end_time":',
    "unknown key": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4","extra":1}',
    "repeated key": '{"start_time":"1","start_time":"2","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4"}',
    "escaped key": '{"start\\u005ftime":"1","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4"}',
    "quoted float": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4","sample_rate":"0.5"}',
    "enum name": {**GOOD, "collection_type": "JOB"},
    "hex id": {**GOOD, "machine_id": "0x1F"},
    "id overflow": {**GOOD, "machine_id": "9223372036854775808"},
    "spaces in a quoted int": {**GOOD, "machine_id": " 12"},
    "NaN": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4","sample_rate":NaN}',
    "null in an array": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4",'
    '"cpu_usage_distribution":[0.1,null,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1,1]}',
    "huge exponent": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4","sample_rate":1e400}',
    "subnormal": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4","sample_rate":5e-324}',
    "unquoted float id": '{"start_time":1.0,"end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4"}',
    "leading zero number": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4","sample_rate":01}',
    "boolean": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4","sample_rate":true}',
    "object where a number belongs": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1",'
    '"machine_id":"4","average_usage":{"cpus":{"x":1}}}',
    "array of arrays": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4",'
    '"cpu_usage_distribution":[[1]]}',
    "not an object": "[1,2,3]",
    "two objects": GOOD_LINE + GOOD_LINE,
    "blank line": "   ",
    "unicode in a key": '{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4","é":1}',
}


def _line(v: str | dict[str, Any]) -> str:
    return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))


@pytest.mark.parametrize("kind", sorted(EDGE_FAST))
@pytest.mark.parametrize("crlf", [False, True])
def test_edge_cases_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, crlf: bool) -> None:
    lines = [GOOD_LINE, _line(EDGE_FAST[kind]), GOOD_LINE]
    spy, _ = both(_write(tmp_path, lines, crlf=crlf), monkeypatch)
    assert spy.took == 1 and spy.refused == 0


@pytest.mark.parametrize("kind", sorted(EDGE_FALLBACK))
def test_edge_cases_fall_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """A piece holding one such line is parsed the old way (identical rejects); the other pieces
    stay fast."""
    lines = [GOOD_LINE] * 3 + [_line(EDGE_FALLBACK[kind])] + [GOOD_LINE] * 3 + [""] + [GOOD_LINE] * 30
    spy, _ = both(_write(tmp_path, lines), monkeypatch, ReadOptions(chunk_bytes=4 * len(GOOD_LINE), threads=1))
    assert spy.refused >= 1 and spy.took >= 5


def test_no_trailing_newline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "instance_usage-000000000000.json"
    f.write_bytes((GOOD_LINE + "\n" + GOOD_LINE).encode())
    spy, (tbl, _, rows) = both(f, monkeypatch)
    assert spy.took >= 1 and spy.refused == 0 and rows == 2


def test_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    for v in ("0", "false", "off"):
        monkeypatch.setenv("GPUCLUST_FAST_JSON", v)
        assert not _fast_usage.available()
    monkeypatch.setenv("GPUCLUST_FAST_JSON", "1")
    assert _fast_usage.available()


# --------------------------------------------------------------------------------------------
# Generated lines
# --------------------------------------------------------------------------------------------
def _vary(line: str, rng: random.Random) -> str:
    """Re-encode one export line the ways a JSON writer may: keys shuffled, spaces, exponents,
    unquoted ints, null for an omitted key."""
    rec = json.loads(line)
    keys = list(rec)
    if rng.random() < 0.5:
        rng.shuffle(keys)
    parts = []
    for k in keys:
        v = rec[k]
        if isinstance(v, str) and rng.random() < 0.2:
            v = int(v)  # unquoted INT64
        text = json.dumps(v, separators=(",", ":"))
        if isinstance(v, float) and rng.random() < 0.3:
            text = f"{v:.17e}" if rng.random() < 0.5 else repr(v).upper()
        parts.append(json.dumps(k) + (" : " if rng.random() < 0.1 else ":") + text)
    if rng.random() < 0.2:
        parts.append('"page_cache_memory":null' if "page_cache_memory" not in rec else '"cycles_per_instruction":null')
    return "{" + ",".join(parts) + "}"


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10**6),
    n=st.integers(1, 80),
    bad=st.lists(st.integers(0, 79), max_size=3),
    chunk=st.sampled_from([512, 4096, 1 << 20]),
    vary=st.booleans(),
)
def test_generated_lines_match(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
    n: int,
    bad: list[int],
    chunk: int,
    vary: bool,
) -> None:
    rng = random.Random(seed)
    lines = [bq_json_line(r) for r in records("instance_usage", n, seed=seed)]
    if vary:
        lines = [_vary(x, rng) for x in lines]
    for i in bad:
        if i < n:
            lines[i] = rng.choice(list(EDGE_FALLBACK.values()) + list(EDGE_FAST.values()))
            lines[i] = _line(lines[i])
    d = tmp_path_factory.mktemp("gen")
    f = write_json(d / "instance_usage-000000000000.json.gz", lines)
    both(f, monkeypatch, ReadOptions(chunk_bytes=chunk, threads=1 + seed % 2))


def test_big_floats_repr_piece_is_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Floats written with all 17 significant digits (as BigQuery writes float32 data held in
    FLOAT64): Eisel-Lemire or, for its rare undecided cases, float() -- never a piece fallback."""
    rng = np.random.default_rng(5)
    lines = []
    for i in range(2000):
        v = [repr(float(x)) for x in rng.random(23).astype(np.float32)]
        lines.append(
            f'{{"start_time":"{i}","end_time":"{i + 300}","collection_id":"1","instance_index":"0","machine_id":"7",'
            f'"average_usage":{{"cpus":{v[0]},"memory":{v[1]}}},"cycles_per_instruction":{v[2]},'
            f'"cpu_usage_distribution":[{",".join(sorted(v[3:14]))}],'
            f'"tail_cpu_usage_distribution":[{",".join(sorted(v[14:23]))}]}}'
        )
    f = _write(tmp_path, lines)
    spy, (tbl, rejects, rows) = both(f, monkeypatch, ReadOptions(chunk_bytes=1 << 20, threads=2))
    assert spy.refused == 0 and rows == 2000 and not rejects
    assert re.search(r"\d{15}", lines[0])


@pytest.fixture(scope="module")
def without_numba(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A shard, and its ingest by a process where neither the extension nor numba can be imported
    (which finds the reader off), once for both kernels' runs."""
    import subprocess
    import sys

    d = tmp_path_factory.mktemp("without-numba")
    f = write_json(d / "instance_usage-000000000000.json.gz", [GOOD_LINE] * 20)
    code = (
        "import os, sys; sys.modules['numba'] = None; sys.modules['gpuclust.ingest.readers._fast_usage_c'] = None\n"
        "from gpuclust.ingest import ingest\n"
        "from gpuclust.ingest.readers import _fast_usage\n"
        f"rep = ingest([{str(f)!r}], {str(d / 'ds')!r}, workers=1)\n"
        "assert rep.exit_status == 0 and rep.rows_read == 20, rep.summary()\n"
        "assert not _fast_usage.available()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    return f, d / "ds"


def test_without_numba_the_arrow_path_reads(without_numba: tuple[Path, Path], tmp_path: Path) -> None:
    """Where neither the extension nor numba can be imported, the reader is off and ingest gives
    the same dataset."""
    f, ds = without_numba
    with_numba = ingest([f], tmp_path / "ds2", workers=1)
    assert with_numba.exit_status == 0
    assert Dataset(ds).read("instance_usage").equals(Dataset(tmp_path / "ds2").read("instance_usage"))


def test_without_the_extension_numba_stands_in_and_caches_outside_the_package(tmp_path: Path, kernel: str) -> None:
    """Where the extension was not built (no C compiler at install), numba's kernel parses, and
    its machine code is cached in the user's cache folder: nothing is written into the package."""
    import subprocess
    import sys

    if kernel != "numba":
        pytest.skip("once")
    pkg = Path(_fast_usage.__file__).parent

    def files() -> list[tuple[Path, int]]:  # (.pyc files: Python's own, written by any import)
        return sorted((p.relative_to(pkg), p.stat().st_mtime_ns) for p in pkg.rglob("*") if p.suffix != ".pyc")

    before = files()
    f = _write(tmp_path, [GOOD_LINE] * 20)
    code = (
        "import sys; sys.modules['gpuclust.ingest.readers._fast_usage_c'] = None\n"
        "from gpuclust.ingest import ingest\n"
        "from gpuclust.ingest.readers import _fast_usage\n"
        f"rep = ingest([{str(f)!r}], {str(tmp_path / 'ds')!r}, workers=1)\n"
        "assert rep.exit_status == 0 and rep.rows_read == 20, rep.summary()\n"
        "assert _fast_usage.available() and not _fast_usage.compiled()\n"
        f"assert _fast_usage.parse({GOOD_LINE.encode()!r}, 1).num_rows == 1\n"  # compiled (and cached) by now
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(env, XDG_CACHE_HOME=str(tmp_path / "cache")))
    assert any((tmp_path / "cache" / "gpuclust" / "numba").rglob("*parse_usage*.nbi"))
    assert files() == before


def test_negative_zero_keeps_its_sign_on_the_per_line_path(tmp_path: Path) -> None:
    """JSON ``-0`` in a float field is -0.0 on every path: the per-line isolation (a piece with a
    damaged line) read it as the int 0 through Python's ``json`` and lost the sign (found by
    ``test_generated_lines_match``)."""
    line = _line(EDGE_FAST["negative zero and exponents"])
    f = _write(tmp_path, [line, "{damaged", line])
    tbl, rejects, rows = _read(f, ReadOptions(chunk_bytes=1 << 20, threads=2))
    assert rows == 3 and [r[0] for r in rejects] == [2]
    bits = np.asarray(tbl.column("avg_cpu").to_numpy()).view(np.uint32)
    assert bits.tolist() == [0x80000000, 0x80000000]  # -0.0f, twice
    assert tbl.column("instance_index").to_pylist() == [1, 1]


def test_extension_without_numba(tmp_path: Path, kernel: str) -> None:
    """The C extension needs no numba: a process where numba cannot be imported still parses with
    the compiled reader (and imports no numba), with the same dataset as numba's kernel."""
    import subprocess
    import sys

    if kernel != "c":
        pytest.skip("once")
    f = _write(tmp_path, [GOOD_LINE] * 20)
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "from gpuclust.ingest import ingest\n"
        "from gpuclust.ingest.readers import _fast_usage\n"
        f"rep = ingest([{str(f)!r}], {str(tmp_path / 'ds')!r}, workers=1)\n"
        "assert rep.exit_status == 0 and rep.rows_read == 20, rep.summary()\n"
        "assert _fast_usage.available() and _fast_usage.compiled()\n"
        "assert 'numba.core' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    ref = ingest([f], tmp_path / "ds2", workers=1)
    assert ref.exit_status == 0
    assert Dataset(tmp_path / "ds").read("instance_usage").equals(Dataset(tmp_path / "ds2").read("instance_usage"))
