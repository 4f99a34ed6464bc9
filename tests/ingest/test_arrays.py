"""gpuclust.ingest.arrays: NumPy <-> Arrow without pandas, checked against pyarrow's own
conversions; and an InstanceUsage ingest (the compiled reader's path) that never imports pandas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from gpuclust.ingest import arrays

from .conftest import REAL, records, write_json

TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.float32(), pa.float64(), pa.bool_()]


@settings(max_examples=examples(60), deadline=None)
@given(data=st.data(), typ=st.sampled_from(TYPES), n=st.integers(0, 70), cut=st.integers(0, 9))
def test_round_trip_matches_pyarrow(data: st.DataObject, typ: pa.DataType, n: int, cut: int) -> None:
    if pa.types.is_boolean(typ):
        vals = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    elif pa.types.is_floating(typ):
        vals = np.array(
            data.draw(st.lists(st.floats(width=32, allow_nan=False), min_size=n, max_size=n)),
            dtype=typ.to_pandas_dtype(),
        )
    else:
        info = np.iinfo(typ.to_pandas_dtype())
        vals = np.array(
            data.draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=n, max_size=n)),
            dtype=typ.to_pandas_dtype(),
        )
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    ours = arrays.from_numpy(vals, typ, mask)
    ref = pa.array(vals, typ, mask=mask)
    ours.validate(full=True)
    assert ours.equals(ref) and ours.null_count == ref.null_count
    # reading back, also from a slice (offsets into the buffers)
    for a, r, m, v in ((ours, ref, mask, vals), (ours.slice(cut), ref.slice(cut), mask[cut:], vals[cut:])):
        assert np.array_equal(arrays.valid(a), ~m)
        assert np.array_equal(arrays.valid(a), r.is_valid().to_numpy(zero_copy_only=False))
        got = arrays.values(a)
        assert np.array_equal(got[~m], v[~m], equal_nan=pa.types.is_floating(typ))
        fill = 0
        filled = arrays.values(a, fill=fill)
        want = np.where(m, fill, v).astype(v.dtype)
        assert filled.dtype == v.dtype and np.array_equal(filled, want, equal_nan=pa.types.is_floating(typ))


def test_from_numpy_without_mask_and_with_another_type() -> None:
    a = arrays.from_numpy(np.arange(5, dtype=np.int64), pa.int32())
    assert a.type == pa.int32() and a.null_count == 0 and a.to_pylist() == [0, 1, 2, 3, 4]
    assert arrays.from_numpy(np.array([1.5, 2.5]), pa.float32(), np.array([False, False])).null_count == 0
    with pytest.raises(ValueError, match="1-d"):
        arrays.from_numpy(np.zeros((2, 2)))
    with pytest.raises(TypeError, match="not a numeric"):
        arrays.values(pa.array(["a"]))
    assert arrays.valid(pa.nulls(3)).tolist() == [False] * 3


def test_usage_ingest_does_not_import_pandas(tmp_path: Path) -> None:
    src = write_json(tmp_path / "instance_usage-000000000000.json", records("instance_usage", 3000, seed=4), gz=False)
    code = (
        "import sys; from gpuclust.cli import main; from gpuclust.ingest.readers import _fast_usage as f; "
        "t = f.preload(); t and t.join(); "
        f"rc = main(['ingest', {str(src)!r}, '--out', {str(tmp_path / 'ds')!r}, '--no-progress']); "
        "print('PANDAS' if 'pandas' in sys.modules else 'no pandas', f.ready()); sys.exit(rc)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "no pandas True"  # the compiled reader did the work


def test_event_ingests_do_not_import_pandas(tmp_path: Path) -> None:
    """The event tables' ingests (v2 CSV, v3 JSON with constraint and id lists, v3 Parquet) never
    import pandas either: one process ingests each source in turn into its own dataset and says,
    after each, whether pandas has been imported (so a failure names the first ingest that did)."""
    if not (REAL / "2011").is_dir():
        pytest.skip(f"real trace files not found under {REAL}")
    cell = REAL / "2019-cell-a"
    sources = {
        "v2 csv": [REAL / "2011" / "job_events" / "part-00001-of-00500.csv.gz", REAL / "2011" / "machine_events"],
        "v3 json": [
            write_json(tmp_path / "instance_events-000000000000.json.gz", records("instance_events", 400, seed=1)),
            write_json(tmp_path / "collection_events-000000000000.json.gz", records("collection_events", 400, seed=2)),
            cell / "machine_events-000000000000.json.gz",
        ],
        "v3 parquet": [cell / "machine_events-000000000000.parquet.gz"],
    }
    code = ["import sys; from gpuclust.cli import main"]
    for i, (what, srcs) in enumerate(sources.items()):
        args = [*map(str, srcs), "--out", str(tmp_path / f"ds{i}"), "--no-progress", "--layout", "flat"]
        code.append(f"rc = main(['ingest', *{args!r}]); assert rc == 0, {what!r}")
        code.append(f"print({what!r}, 'PANDAS' if 'pandas' in sys.modules else 'no pandas')")
    r = subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stdout.splitlines() if line.lower().endswith("pandas")]
    assert said == [f"{w} no pandas" for w in sources], r.stdout
