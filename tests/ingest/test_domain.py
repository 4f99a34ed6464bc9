"""Issue 7: values outside the spec's domain are rejected with a reason; good rows are kept."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from gpuclust.dataset import Dataset
from gpuclust.ingest import ingest
from gpuclust.ingest.normalize import conform

from .conftest import BIG, write_json


def test_conform_times_sentinels_and_negatives() -> None:
    times = ["0", str(BIG), "600000000", "-1", str(-(2**63))]
    n = len(times)
    t, bad, why = conform(
        "machine_events", {"time": pa.array(times), "machine_id": pa.array(["1"] * n), "type": pa.array(["1"] * n)}, n
    )
    assert bad.tolist() == [False, False, False, True, True]
    assert t.column("time").to_pylist() == [0, BIG, 600000000]
    assert "negative time -1" in why[3] and "column time" in why[3]


def test_conform_resources() -> None:
    cap = ["0.5", "1", "0", "NaN", "inf", "-0.25", "1.5", None, "-inf"]
    n = len(cap)
    cols = {
        "time": pa.array(["1"] * n),
        "machine_id": pa.array(["1"] * n),
        "type": pa.array(["1"] * n),
        "cap_cpu": pa.array(cap),
    }
    t, bad, why = conform("machine_events", cols, n)
    assert bad.tolist() == [False, False, False, True, True, True, True, False, True]
    assert t.column("cap_cpu").to_pylist() == [0.5, 1.0, 0.0, None]
    assert "not a finite number" in why[3] and "not a finite number" in why[4] and "not a finite number" in why[8]
    assert "negative value -0.25" in why[5]
    assert "above 1" in why[6]


def test_usage_may_exceed_one_but_not_be_negative() -> None:
    cols = {
        "start_time": pa.array([1, 1, 1], pa.int64()),
        "end_time": pa.array([2, -5, 2], pa.int64()),
        "collection_id": pa.array([1, 1, 1], pa.int64()),
        "instance_index": pa.array([0, 0, 0], pa.int64()),
        "machine_id": pa.array([1, 1, 1], pa.int64()),
        "avg_cpu": pa.array([1.25, 0.5, -0.1], pa.float64()),
    }
    t, bad, why = conform("instance_usage", cols, 3)
    assert bad.tolist() == [False, True, True]
    assert t.column("avg_cpu").to_pylist() == [1.25]
    assert "end_time" in why[1] and "avg_cpu" in why[2]


def test_json_ingest_rejects_out_of_domain_keeps_good(tmp_path: Path) -> None:
    good = [
        '{"time":"0","machine_id":"1","type":"1","capacity":{"cpus":0.5,"memory":1}}',
        f'{{"time":"{BIG}","machine_id":"2","type":"2"}}',
        '{"time":"700000000","machine_id":"3","type":"3","capacity":{"cpus":0,"memory":0.25}}',
    ]
    bad = {
        '{"time":"-5","machine_id":"4","type":"1"}': "negative time",
        '{"time":"1","machine_id":"5","type":"1","capacity":{"cpus":"NaN","memory":0.5}}': "not a finite number",
        '{"time":"1","machine_id":"6","type":"1","capacity":{"cpus":0.5,"memory":"inf"}}': "not a finite number",
        '{"time":"1","machine_id":"7","type":"1","capacity":{"cpus":-0.5,"memory":0.5}}': "negative value",
        '{"time":"1","machine_id":"8","type":"1","capacity":{"cpus":2,"memory":0.5}}': "above 1",
    }
    lines = [good[0], *bad, good[1], good[2]]
    f = write_json(tmp_path / "machine_events-000000000000.json.gz", lines)
    rep = ingest([f], tmp_path / "ds", max_reject_rate=1, workers=1)
    assert rep.ok and rep.complete and rep.rows_rejected == len(bad)
    ds = Dataset(tmp_path / "ds")
    assert sorted(ds.read("machine_events").column("machine_id").to_pylist()) == [1, 2, 3]
    rej = [json.loads(x) for x in (tmp_path / "ds" / rep.files[0].rejects_file).read_text().splitlines()]
    for r in rej:
        assert bad[r["raw"]] in r["reason"], r
        assert r["line"] == lines.index(r["raw"]) + 1


def test_parquet_nan_and_negative_request(tmp_path: Path) -> None:
    res = pa.struct([("cpus", pa.float64()), ("memory", pa.float64())])
    tbl = pa.table(
        {
            "time": pa.array([1, 2, -3, 4], pa.int64()),
            "type": pa.array([0, 0, 0, 0], pa.int64()),
            "collection_id": pa.array([1, 2, 3, 4], pa.int64()),
            "instance_index": pa.array([0, 0, 0, 0], pa.int64()),
            "resource_request": pa.array(
                [
                    {"cpus": 0.1, "memory": 0.2},
                    {"cpus": float("nan"), "memory": 0.2},
                    None,
                    {"cpus": -1.0, "memory": 0.1},
                ],
                res,
            ),
        }
    )
    f = tmp_path / "instance_events-000000000000.parquet"
    pq.write_table(tbl, f)
    rep = ingest([f], tmp_path / "ds", max_reject_rate=1, workers=1)
    assert rep.rows_read == 4 and rep.rows_rejected == 3
    assert Dataset(tmp_path / "ds").read("instance_events").column("collection_id").to_pylist() == [1]
    assert [r.split(": ", 1)[1].split(":")[0] for r in rep.files[0].first_reasons] == [
        "column req_cpu",
        "column time",
        "column req_cpu",
    ]
