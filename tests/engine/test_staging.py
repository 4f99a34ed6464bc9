"""The study loader (``gpuclust.engine.staging``): columns copied as Arrow holds them and their
NULL rows filled afterwards from the validity bits, checked against
:func:`gpuclust.engine.partition.column_to_numpy` (NULL -> NaN / dtype minimum) on chunks that
start anywhere inside a validity byte.  The GPU twin is ``test_study.py::test_gpu_study_matches_cpu``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples, random_cell, write_dataset

import gpuclust.engine.reading as reading
from gpuclust.backends import get_backend
from gpuclust.dataset import Dataset
from gpuclust.engine.partition import TableSource, column_to_numpy, plan_partitions
from gpuclust.engine.staging import column_dtypes, fill_nulls, load_partitions

CPU = get_backend("cpu")


@settings(max_examples=examples(60), deadline=None)
@given(valid=st.lists(st.booleans(), min_size=1, max_size=70), start=st.integers(0, 20), data=st.data())
def test_fill_nulls_matches_column_to_numpy(valid, start, data):
    n = len(valid)
    stop = data.draw(st.integers(start, start + n)) if start < n else start
    dtype = data.draw(st.sampled_from([np.float64, np.float32, np.int64, np.int32]))
    typ = pa.from_numpy_dtype(dtype)
    arr = pa.array([k if v else None for k, v in enumerate(valid)], typ).slice(min(start, n), max(0, stop - start))
    want = column_to_numpy(arr)
    got = np.frombuffer(arr.buffers()[1], dtype, count=arr.offset + len(arr))[arr.offset :].copy()
    if arr.null_count:
        bits = np.frombuffer(arr.buffers()[0], np.uint8)[arr.offset // 8 :]
        fill_nulls(np, got, bits, arr.offset % 8)
    np.testing.assert_array_equal(got, want)


def _sliced_chunks(col: pa.ChunkedArray, rng: np.random.Generator) -> pa.ChunkedArray:
    """``col`` as chunks cut at random rows (each chunk a slice of one array: offsets inside a byte)."""
    a = col.combine_chunks()
    cuts = sorted({0, len(a), *rng.integers(0, len(a), 6).tolist()})
    return pa.chunked_array([a.slice(lo, hi - lo) for lo, hi in zip(cuts, cuts[1:], strict=False)], a.type)


@settings(max_examples=examples(10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6))
def test_loaded_columns_equal_column_to_numpy(seed):
    rng = np.random.default_rng(seed)
    tables = random_cell(seed % 97, n_machines=4, n_instances=20, n_windows=300)
    t = tables["instance_usage"]
    for name in ("cpi", "mai", "avg_cpu", "machine_id"):  # NULLs in a float and an int column
        a = t.column(name).combine_chunks()
        mask = pa.array(rng.random(len(a)) < 0.3)
        nulled = pa.chunked_array([pc.if_else(mask, pa.scalar(None, a.type), a)])
        t = t.set_column(t.schema.get_field_index(name), t.schema.field(name), _sliced_chunks(nulled, rng))
    tables["instance_usage"] = t
    cols = ["cpi", "mai", "avg_cpu", "machine_id", "start_time"]
    specs = plan_partitions(TableSource(tables), "instance_usage", 3)
    out = load_partitions([specs], cols, CPU, threads=2)[0]
    for c in cols:
        np.testing.assert_array_equal(out[c], column_to_numpy(t.column(c)), err_msg=c)


def test_device_load_path_through_pinned_buffers(monkeypatch):
    """The gpu backend's load (pinned buffers taken in turn, copies on each thread's stream, the
    NULL rows filled from the validity bits on the device) on the device-shaped backend under the
    gpu's name: the same columns as ``column_to_numpy``, and what crossed to the device is the
    columns' values and their validity bits, nothing more.  Buffers of 256 bytes make every
    column chunk several copies, so the double buffering's offsets are exercised."""
    from device_backend import DEVICE_GPU, counting_device_work

    import gpuclust.engine.staging as staging

    monkeypatch.setattr(staging, "STAGING_BYTES", 256)
    monkeypatch.setattr(staging, "_stagers", {})
    rng = np.random.default_rng(5)
    tables = random_cell(11, n_machines=4, n_instances=30, n_windows=2000)
    t = tables["instance_usage"]
    a = t.column("cpi").combine_chunks()
    nulled = pc.if_else(pa.array(rng.random(len(a)) < 0.3), pa.scalar(None, a.type), a)
    tables["instance_usage"] = t.set_column(
        t.schema.get_field_index("cpi"), t.schema.field("cpi"), _sliced_chunks(pa.chunked_array([nulled]), rng)
    )
    t = tables["instance_usage"]
    cols = ["cpi", "avg_cpu", "machine_id", "start_time"]
    specs = plan_partitions(TableSource(tables), "instance_usage", 3)
    with counting_device_work() as w:
        out = load_partitions([specs[:2], specs[2:]], cols, DEVICE_GPU, threads=2)
    got = {c: np.concatenate([DEVICE_GPU.to_host(g[c]) for g in out]) for c in cols}
    for c in cols:
        np.testing.assert_array_equal(got[c], column_to_numpy(t.column(c)), err_msg=c)
    values = sum(got[c].nbytes for c in cols)
    assert values <= w["h2d_bytes"] <= values + len(a) // 8 + 64 * len(specs) * len(cols)  # + the validity bytes


def test_a_partition_of_few_row_groups_is_decoded_by_sets_of_its_columns(tmp_path, monkeypatch):
    """A streamed partition is a few Parquet row groups: with more threads than that, each row
    group is read in sets of its columns (every thread two tasks), each task reading only its
    set, and the arrays are those of a load on one thread, bit for bit."""

    ds = Dataset(write_dataset(tmp_path / "ds", random_cell(3, n_windows=4000), files=1, row_group_size=2000))
    (spec,) = plan_partitions(ds, "instance_usage", 1)
    cols = sorted(
        column_dtypes("instance_usage", ["avg_cpu", "max_cpu", "cpi", "machine_id", "start_time", "end_time"])
    )
    one = load_partitions([[spec]], cols, CPU, threads=1)[0]
    reads = []
    real = reading.read_piece
    monkeypatch.setattr(reading, "read_piece", lambda p, table, c: reads.append(list(c)) or real(p, table, c))
    got = load_partitions([[spec]], cols, CPU, threads=4)[0]
    assert len(reads) == 8 and sorted(c for r in reads for c in r) == sorted(cols * 2)  # 2 row groups x 4 sets
    for c in cols:
        np.testing.assert_array_equal(got[c], one[c], err_msg=c)
