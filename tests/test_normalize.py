"""The row-isolating normaliser: exact integers, code ranges, NULL defaults, reasons per row."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from gpuclust.ingest.normalize import conform
from gpuclust.schema import SCHEMAS

INT64_MAX = 2**63 - 1


def test_exact_int64_from_text() -> None:
    vals = [str(INT64_MAX), str(2**53 + 1), str(-(2**63)), "0", "+7", " 12 "]
    n = len(vals)
    # machine_id: any int64 (times may not be negative, see test_domain.py).
    t, bad, why = conform(
        "machine_events", {"time": pa.array(["1"] * n), "machine_id": pa.array(vals), "type": pa.array(["1"] * n)}, n
    )
    assert not bad.any(), why
    assert t.column("machine_id").to_pylist() == [INT64_MAX, 2**53 + 1, -(2**63), 0, 7, 12]
    assert t.schema == SCHEMAS["machine_events"]


def test_bad_rows_isolated_with_reasons() -> None:
    n = 5
    cols = {
        "time": pa.array(["1", "x", "3", "99999999999999999999", "5"]),
        "machine_id": pa.array(["1", "2", None, "4", "5"]),
        "type": pa.array(["1", "2", "3", "1", "7"]),
        "cap_cpu": pa.array(["0.5", "1", "2e-1", "nope", None]),
    }
    t, bad, why = conform("machine_events", cols, n)
    assert bad.tolist() == [False, True, True, True, True]
    assert t.num_rows == 1 and t.column("cap_cpu").to_pylist() == [0.5]
    assert "cannot convert 'x' to int64" in why[1]
    assert "machine_id: required value is missing" in why[2]
    assert "99999999999999999999" in why[3]
    assert "type: code 7 outside 0..3" in why[4]


def test_null_means_defaults_and_narrowing() -> None:
    n = 3
    cols = {
        "time": pa.array([1, 2, 3], pa.int64()),
        "type": pa.array([0, 3, 10], pa.int64()),
        "collection_id": pa.array([1, 2, 3], pa.int64()),
        "instance_index": pa.array([0, 2**31, 1], pa.int64()),
        "machine_id": pa.array([None, 5, None], pa.int64()),
        "req_cpu": pa.array([0.1, None, 0.75], pa.float64()),
    }
    t, bad, why = conform("instance_events", cols, n)
    assert bad.tolist() == [False, True, False]
    assert "instance_index" in why[1]
    assert t.column("machine_id").to_pylist() == [0, 0]
    assert t.column("alloc_collection_id").to_pylist() == [0, 0]
    assert t.column("alloc_instance_index").to_pylist() == [-1, -1]
    assert t.column("missing_type").to_pylist() == [0, 0]
    assert t.column("priority").to_pylist() == [None, None]


def test_measures_without_a_none_value_stay_null() -> None:
    """TRACE_NOTES: an omitted field is NULL unless the spec gives it a "none" value; a CPI, MAI,
    capacity, request or usage that is missing is unknown, never 0 (averages would count it)."""
    usage = {
        "start_time": pa.array([1, 2], pa.int64()),
        "end_time": pa.array([3, 4], pa.int64()),
        "collection_id": pa.array([1, 2], pa.int64()),
        "instance_index": pa.array([0, 1], pa.int64()),
        "machine_id": pa.array([5, 6], pa.int64()),
        "cpi": pa.array([1.5, None], pa.float64()),  # one present, one NULL; mai, avg_cpu, ... omitted
    }
    t, bad, _ = conform("instance_usage", usage, 2)
    assert not bad.any()
    assert t.column("cpi").to_pylist() == [1.5, None]
    for c in ("mai", "avg_cpu", "avg_mem", "max_cpu", "assigned_mem", "sample_rate", "cpu_p90"):
        assert t.column(c).null_count == 2, c
    t, bad, _ = conform(
        "machine_events", {"time": pa.array([1]), "machine_id": pa.array([5]), "type": pa.array([1])}, 1
    )
    assert (
        t.column("cap_cpu").null_count == 1
        and t.column("cap_mem").null_count == 1
        and t.column("platform_id").null_count == 1
    )
    t, bad, _ = conform(
        "instance_events",
        {"time": pa.array([1]), "type": pa.array([0]), "collection_id": pa.array([1]), "instance_index": pa.array([0])},
        1,
    )
    assert t.column("req_cpu").null_count == 1 and t.column("req_mem").null_count == 1


def test_whole_floats_accepted_as_ints_fractional_rejected() -> None:
    cols = {"time": pa.array([1.0, 2.5]), "machine_id": pa.array([3.0, 4.0]), "type": pa.array([1.0, 1.0])}
    t, bad, why = conform("machine_events", cols, 2)
    assert bad.tolist() == [False, True]
    assert t.column("time").to_pylist() == [1]


@given(st.lists(st.one_of(st.integers(-(2**63), 2**63 - 1).map(str), st.text(max_size=5)), min_size=1, max_size=50))
def test_good_rows_never_lost(values: list[str]) -> None:
    n = len(values)
    t, bad, why = conform(
        "machine_events", {"time": pa.array(["1"] * n), "machine_id": pa.array(values), "type": pa.array(["1"] * n)}, n
    )

    def ok(v: str) -> bool:
        s = v.strip()
        body = s[1:] if s[:1] in "+-" else s
        return body.isascii() and body.isdigit() and -(2**63) <= int(s) < 2**63

    expected = [int(v) for v in values if ok(v)]
    assert t.column("machine_id").to_pylist() == expected
    assert int(bad.sum()) == n - len(expected)
    assert all((w is None) != b for w, b in zip(why, bad, strict=True))
