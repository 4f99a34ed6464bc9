"""Result tables (gpuclust.tables) and the pandas-free run path (gpuclust.arrow_numpy,
gpuclust._lazy): ``tables=`` of run/analyze, Arrow <-> NumPy without pandas checked against
pyarrow's own conversions, and a ``gpuclust analyze`` cell-usage run that never imports pandas."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples, random_cell, write_dataset

from gpuclust import arrow_numpy
from gpuclust.analyses import create
from gpuclust.dataset import Dataset
from gpuclust.engine import run
from gpuclust.report.analyze import analyze
from gpuclust.tables import as_pandas, convert


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return Dataset(write_dataset(tmp_path_factory.mktemp("tables"), random_cell(11, n_windows=4_000)))


class CliRun:
    """``gpuclust analyze <dataset> <name> --out ... --no-plots --quiet <opts>`` in a fresh interpreter,
    run once per (dataset, name, opts) in this module (per xdist worker): what it left in
    ``sys.modules`` (pandas, pyarrow.compute, numpy.ma, the analyses) and the folder it wrote.  The
    tests of one run check different tables or modules of the same run."""

    def __init__(self, dataset: Dataset, folder: Path) -> None:
        self.dataset, self.folder = dataset, folder
        self.runs: dict[tuple[str, str, tuple[str, ...]], tuple[dict, Path]] = {}

    def __call__(self, path: Path | None, name: str, opts: list[str]) -> tuple[dict, Path]:
        ds = self.dataset.path if path is None else path
        key = (str(ds), name, tuple(opts))
        if key not in self.runs:
            out = self.folder / f"run{len(self.runs)}"
            code = (
                "import sys, json\nfrom gpuclust.cli import main\n"
                f"rc = main(['analyze', {str(ds)!r}, {name!r}, '--out', {str(out)!r}, "
                f"'--no-plots', '--quiet', *{opts!r}])\n"
                "print(json.dumps({'rc': rc, 'pandas': 'pandas' in sys.modules, "
                "'compute': 'pyarrow.compute' in sys.modules, 'ma': 'numpy.ma' in sys.modules, "
                "'analyses': sorted(m for m in sys.modules if m.startswith('gpuclust.analyses.'))}))"
            )
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            assert p.returncode == 0, p.stderr
            self.runs[key] = (json.loads(p.stdout.strip().splitlines()[-1]), out)
        return self.runs[key]


@pytest.fixture(scope="module")
def cli_run(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> CliRun:
    return CliRun(dataset, tmp_path_factory.mktemp("cli"))


@pytest.fixture(scope="module")
def bucketed(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dataset's `gpuclust optimize`d copy (4 buckets)."""
    from gpuclust.optimize import optimize

    out = tmp_path_factory.mktemp("bucketed") / "ds"
    optimize(dataset.path, buckets=4, out=out)
    return out


Want = Callable[[str, list[str]], dict]


@pytest.fixture(scope="module")
def want(dataset: Dataset) -> Want:
    """``run(dataset, [name with opts])`` in this process, once per (name, opts) in this module."""
    results: dict[tuple[str, tuple[str, ...]], dict] = {}

    def get(name: str, opts: list[str]) -> dict:
        key = (name, tuple(opts))
        if key not in results:
            results[key] = run(dataset, [create(name, **dict([opts[1].split("=")])) if opts else name])
        return results[key]

    return get


def test_run_tables_kinds(dataset: Dataset) -> None:
    names = ["cell-usage", "usage-distribution"]  # one analysis finalizes Arrow tables, the other DataFrames
    native = run(dataset, names, tables="native")
    assert isinstance(native["cell-usage"]["usage"], pa.Table)
    assert isinstance(native["usage-distribution"]["quantiles"], pd.DataFrame)
    frames, arrow = run(dataset, names), run(dataset, names, tables="arrow")
    for key, tabs in frames.items():
        for t, df in tabs.items():
            assert isinstance(df, pd.DataFrame) and isinstance(arrow[key][t], pa.Table)
            # (a DataFrame's object string column comes back from Arrow as pandas' string dtype)
            pd.testing.assert_frame_equal(df, as_pandas(arrow[key][t]), check_dtype=key == "cell-usage")
            pd.testing.assert_frame_equal(df, as_pandas(native[key][t]))
    # the same tables as the analyze results folder holds
    res = analyze(dataset, names, out=None)
    pd.testing.assert_frame_equal(res["cell-usage"]["usage"], frames["cell-usage"]["usage"])


def test_cell_usage_dtypes_are_those_of_the_dataframes_it_built_before(dataset: Dataset) -> None:
    df = run(dataset, ["cell-usage"])["cell-usage"]["usage"]
    assert df.dtypes.astype(str).to_dict() == {
        "bucket": "int64",
        "bucket_start_us": "int64",
        "tier": "object",
        "cpu": "float64",
        "mem": "float64",
        "windows": "int64",
    }
    assert df["tier"].map(type).eq(str).all() and len(df)


def test_an_unknown_kind_is_refused_before_anything_runs(dataset: Dataset) -> None:
    with pytest.raises(ValueError, match="tables must be one of pandas, arrow, native"):
        run(dataset, ["cell-usage"], tables="polars")
    with pytest.raises(ValueError, match="tables must be one of"):
        analyze(dataset, ["cell-usage"], tables="csv")
    with pytest.raises(ValueError, match="tables must be one of"):
        convert({}, "csv")


_NUMBER_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(), pa.float32(), pa.float64()]


@settings(max_examples=examples(60), deadline=None)
@given(data=st.data(), t=st.sampled_from(_NUMBER_TYPES))
def test_to_numpy_matches_pyarrows_conversion(data: st.DataObject, t: pa.DataType) -> None:
    info = np.iinfo(t.to_pandas_dtype()) if pa.types.is_integer(t) else None
    value = (
        st.integers(int(info.min) + 1, int(info.max))
        if info is not None
        else st.floats(-1e6, 1e6, width=32 if t == pa.float32() else 64)
    )
    chunks = data.draw(st.lists(st.lists(st.one_of(st.none(), value), max_size=20), max_size=4))
    arr = pa.chunked_array([pa.array(c, t) for c in chunks], t)
    if data.draw(st.booleans()) and len(arr):
        lo = data.draw(st.integers(0, len(arr) - 1))
        arr = arr.slice(lo, data.draw(st.integers(0, len(arr) - lo)))  # offsets into the buffers
    got = arrow_numpy.to_numpy(arr)
    fill = np.nan if info is None else info.min
    want = np.array([fill if v is None else v for v in arr.to_pylist()], dtype=t.to_pandas_dtype())
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    # read as another dtype: the NULL fill is that dtype's (pc.cast, then to_numpy, did this before)
    for dt in (np.int64, np.float64) if info is not None else (np.float64,):
        fill = np.nan if dt is np.float64 else np.iinfo(dt).min
        want = np.array([fill if v is None else v for v in arr.to_pylist()], dtype=dt)
        got = arrow_numpy.to_numpy(arr, dt)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    assert arrow_numpy.valid(arr).tolist() == [v is not None for v in arr.to_pylist()]
    for chunk in arr.chunks:  # one chunk, no NULL: a view of the Arrow buffer, never writable
        if chunk.null_count == 0 and len(chunk):
            assert not arrow_numpy.to_numpy(chunk).flags.writeable


@settings(max_examples=examples(60), deadline=None)
@given(data=st.data(), names=st.lists(st.text(max_size=6), min_size=1, max_size=5))
def test_labels_equal_a_string_per_row(data: st.DataObject, names: list[str]) -> None:
    """The vectorised label column (job-usage's tier per collection) against pyarrow's array of the
    Python strings, empty and non-ASCII labels included."""
    codes = np.array(data.draw(st.lists(st.integers(0, len(names) - 1), max_size=30)), np.int64)
    got = arrow_numpy.labels(names, codes)
    assert got.equals(pa.array([names[c] for c in codes], pa.string()))


@settings(max_examples=examples(40), deadline=None)
@given(
    rows=st.lists(
        st.fixed_dictionaries(
            {
                "s": st.text(max_size=5),
                "i": st.integers(-(2**63), 2**63 - 1),
                "f": st.floats(allow_nan=True),
                "b": st.booleans(),
                "m": st.one_of(st.integers(-5, 5), st.floats(-5, 5)),
            }
        ),
        min_size=1,
        max_size=6,
    )
)
def test_tables_without_pandas_equal_pyarrows(rows: list[dict]) -> None:
    """The reference is what the analyses did before: a DataFrame built from the rows (or
    columns), converted by ``pa.Table.from_pandas`` (NaN -> NULL)."""

    def same(a: pa.Table, b: pa.Table) -> bool:  # Table.equals: NaN != NaN
        def nan_free(t: pa.Table) -> list:
            return [{k: "NaN" if isinstance(v, float) and v != v else v for k, v in r.items()} for r in t.to_pylist()]

        return a.schema == b.schema and nan_free(a) == nan_free(b)

    def via_pandas(df: pd.DataFrame) -> pa.Table:  # strings as object columns, as the analyses built them
        return pa.Table.from_pandas(df.astype({"s": object}), preserve_index=False)

    assert same(arrow_numpy.table_from_rows(rows), via_pandas(pd.DataFrame(rows)))
    cols = {
        "s": [r["s"] for r in rows],
        "i": np.array([r["i"] for r in rows], np.int64),
        "f": np.array([r["f"] for r in rows]),
        "b": np.array([r["b"] for r in rows]),
    }
    assert same(arrow_numpy.table(cols), via_pandas(pd.DataFrame({**cols, "s": np.array(cols["s"], dtype=object)})))
    assert arrow_numpy.scalar(rows[0]["i"], pa.int64()).equals(pa.scalar(rows[0]["i"], pa.int64()))


def test_rows_with_none_go_through_pyarrow() -> None:
    rows = [{"a": None, "b": 1}, {"a": "x", "b": 2}]
    assert arrow_numpy.table_from_rows(rows).equals(pa.Table.from_pylist(rows))


@pytest.mark.parametrize(
    ("name", "table", "opts"),
    [
        ("cell-usage", "usage", []),
        ("machine-shapes", "shapes", []),
        ("job-usage", "jobs", []),  # (no JOB collections in the cell: empty tables)
        ("job-usage", "jobs", ["-O", "rows=top-level"]),
        ("job-usage", "stats", ["-O", "rows=top-level"]),
        ("usage-vs-request", "summary", []),
        ("usage-vs-request", "hist", []),
        ("lifecycle", "series", []),
        ("lifecycle", "transitions", []),
        ("lifecycle", "delays", []),
        ("collection-lifecycle", "events", []),
        ("usage-change", "summary", []),
        ("usage-change", "hist", []),
        ("machine-utilization", "summary", []),
        ("machine-utilization", "quantiles", []),
        ("machine-utilization", "series", []),
        ("machine-utilization", "info", []),
        ("data-quality", "checks", []),
        ("data-quality", "columns", []),
        ("data-quality", "codes", []),
        ("data-quality", "max_over_p100", []),
        ("data-quality", "info", []),
        ("peak-prediction", "summary", []),
        ("peak-prediction", "info", []),
        ("overcommit", "summary", []),
        ("overcommit", "cell", []),
        ("overcommit", "info", []),
    ],
)
def test_from_the_command_line_never_imports_pandas(
    cli_run: CliRun, want: Want, name: str, table: str, opts: list[str]
) -> None:
    """The start-up this saves (pandas, and pyarrow.compute): docs/user/scale.md, "Start-up"."""
    doc, out = cli_run(None, name, opts)
    assert doc["rc"] == 0 and doc["pandas"] is False
    assert doc["compute"] is False  # (~0.06 s: Table.cast imports it, see Dataset.read)
    assert "gpuclust.analyses.cpi" not in doc["analyses"]  # the registry imports the analyses it runs only
    # and the results read back as before
    df = as_pandas(pq.read_table(out / name / f"{table}.parquet"))
    results = want(name, opts)
    label = next(iter(results))
    assert len(df) > 0 or not opts
    pd.testing.assert_frame_equal(df, results[label][table])


@pytest.mark.parametrize(
    "name",
    [
        "cell-usage",
        "lifecycle",
        "usage-vs-request",
        "usage-change",
        "job-usage",
        "machine-utilization",
        "data-quality",
        "peak-prediction",
        "overcommit",
        "machine-shapes",
    ],
)
def test_a_run_never_imports_numpy_ma(cli_run: CliRun, bucketed: Path, name: str) -> None:
    """``np.unique`` imports ``numpy.ma`` (~20-30 ms of start-up): the engine's bucket plan and
    these analyses' runs, on a flat and on an optimized (bucketed) dataset, do without it."""
    for ds in (None, bucketed):
        doc, _out = cli_run(ds, name, [])
        assert {"rc": doc["rc"], "ma": doc["ma"]} == {"rc": 0, "ma": False}, ds


@settings(max_examples=examples(60), deadline=None)
@given(hists=st.lists(st.lists(st.integers(0, 3), min_size=5, max_size=5), max_size=4), floats=st.booleans())
def test_bin_table_is_the_table_of_bin_rows(hists, floats):
    """arrow_numpy.bin_table (columns) gives rows_table of partials.bin_rows (a dict a row, the way
    the histogram tables were built before): same rows, order and types; the schema's empty table
    when no bin is non-empty."""
    from gpuclust.arrow_numpy import bin_table, rows_table
    from gpuclust.partials import bin_rows

    schema = pa.schema(
        [
            ("tier", pa.string()),
            ("measure", pa.string()),
            ("bin", pa.int64()),
            ("lo_x", pa.float64()),
            ("hi_x", pa.float64()),
            ("n", pa.int64()),
        ]
    )
    lower = np.array([0.0, 0.5, 1.0, 2.0, 4.0])
    upper = np.array([0.5, 1.0, 2.0, 4.0, np.inf])
    hs = [np.array(h, dtype=np.float64 if floats else np.int64) for h in hists]
    tiers = [f"t{i % 2}" for i in range(len(hs))]
    measures = ["cpu" if i % 3 else "memory" for i in range(len(hs))]
    rows = [
        {c: r[c] for c in schema.names}
        for h, t, m in zip(hs, tiers, measures, strict=True)
        for r in bin_rows(h, lower, upper, "x", "n", tier=t, measure=m)
    ]
    want = rows_table(rows, schema)
    got = bin_table(hs, lower, upper, "x", "n", schema, tier=tiers, measure=measures)
    assert got.schema.names == schema.names and got.equals(want), (got.to_pylist(), want.to_pylist())
