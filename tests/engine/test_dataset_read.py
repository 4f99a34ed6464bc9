"""``Dataset.read``: by the Parquet file reader where a file has every column asked for, by
``pq.read_table`` with the canonical schema where it lacks one (NULLs); the same table either way."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from strategies import random_cell, write_dataset

from gpuclust.dataset import Dataset
from gpuclust.schema import SCHEMAS


def test_read_equals_read_table_and_fills_a_missing_column(tmp_path: Path) -> None:
    ds = Dataset(write_dataset(tmp_path / "ds", random_cell(3, n_windows=2_000), files=2))
    cols = ["machine_id", "cap_cpu", "cap_mem"]
    files = ds.files("machine_events")
    want = __import__("pyarrow").concat_tables(
        [pq.read_table(f, columns=cols, schema=SCHEMAS["machine_events"]) for f in files]
    )
    got = ds.read("machine_events", cols)
    assert got.equals(want.cast(got.schema))
    # a file written without cap_mem (an older writer): that column reads as NULLs
    t = pq.read_table(files[0])
    pq.write_table(t.drop_columns(["cap_mem"]), files[0])
    got = ds.read("machine_events", cols)
    n0 = t.num_rows
    assert got.num_rows == want.num_rows
    assert got.column("cap_mem").slice(0, n0).null_count == n0
    assert got.column("cap_cpu").equals(want.column("cap_cpu").cast(got.schema.field("cap_cpu").type))
