"""Ingest-time samples and time ranges (``--sample``, ``--from`` / ``--to``): the kept rows are
exactly those the documented rule names (checked with an independent pure-Python splitmix64 over a
full ingest of the same files), and a sample is consistent across tables."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from gpuclust.dataset import Dataset
from gpuclust.ingest import IngestReport, ingest
from gpuclust.ingest.api import IngestUsageError
from gpuclust.schema import TABLES

MASK = (1 << 64) - 1
INSTANCE_TABLES = ("instance_usage", "instance_events")


def splitmix64(x: int) -> int:
    """The reference splitmix64 output for state ``x`` (Python ints, mod 2^64)."""
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def in_sample(v: int | None, fraction: float, machine: bool = False) -> bool:
    """The documented rule (a machine id of 0 or -1 means no machine: never sampled)."""
    if v is None or (machine and v <= 0):
        return False
    return splitmix64(v & MASK) < int(fraction * 2**64)


@pytest.fixture(scope="module")
def cell(synth_cell_40: Path) -> tuple[Path, Path]:
    """Raw v3 shards of a small synthetic cell, and their full ingest (conftest's ``synth_cell_40``,
    synthesized once per pytest run)."""
    return synth_cell_40 / "raw", synth_cell_40 / "ds"


def _rows(ds: Path, table: str) -> list[dict]:
    """The table's rows in one total order (the same rows give the same list): sorted by every
    column in Arrow when none is nested, else by each row's JSON."""
    t = Dataset(ds).read(table)
    if not any(pa.types.is_nested(f.type) for f in t.schema):
        return t.sort_by([(c, "ascending") for c in t.column_names]).to_pylist()
    return sorted(t.to_pylist(), key=lambda r: json.dumps(r, sort_keys=True, default=str))


FullRows = Callable[[str], tuple[list[dict], list[str]]]


@pytest.fixture(scope="module")
def full_rows(cell: tuple[Path, Path]) -> FullRows:
    """``_rows`` of the full ingest's table, and its column names, once per table in this module
    (per worker; the full ingest is the read-only ``synth_cell_40``, and its users filter copies of
    the list)."""
    full = cell[1]
    got: dict[str, tuple[list[dict], list[str]]] = {}

    def rows(table: str) -> tuple[list[dict], list[str]]:
        if table not in got:
            got[table] = _rows(full, table), Dataset(full).read(table).column_names
        return got[table]

    return rows


Sampled = Callable[[str], tuple[IngestReport, Path]]


@pytest.fixture(scope="module")
def sampled(cell: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Sampled:
    """The ingest of the cell's raw shards with ``--sample SPEC``: its report and its dataset,
    once per spec in this module (per worker); read them, copy the dataset to change it."""
    got: dict[str, tuple[IngestReport, Path]] = {}

    def run(spec: str) -> tuple[IngestReport, Path]:
        if spec not in got:
            out = tmp_path_factory.mktemp("sampled") / "ds"
            got[spec] = ingest([cell[0]], out, sample=spec, workers=1), out
        return got[spec]

    return run


@pytest.mark.parametrize(
    "key,column,fraction", [("machines", "machine_id", 0.3), ("collections", "collection_id", 0.25)]
)
def test_sample_is_the_documented_rule_in_every_table(
    cell: tuple[Path, Path], full_rows: FullRows, sampled: Sampled, key: str, column: str, fraction: float
) -> None:
    raw, full = cell
    rep, out = sampled(f"{key}={fraction * 100:g}%")
    assert rep.exit_status == 0 and rep.selection and rep.rows_skipped > 0
    ds = Dataset(out)
    assert ds.manifest["selection"]["sample"] == {
        "key": key,
        "column": column,
        "fraction": fraction,
        "hash": "splitmix64-v1",
    }
    fds = Dataset(full)
    for table in [t for t in TABLES if fds.num_rows(t)]:
        want, columns = full_rows(table)
        if column in columns:
            want = [r for r in want if in_sample(r[column], fraction, machine=key == "machines")]
        got = _rows(out, table)
        assert got == want, table
        if column in columns and fds.num_rows(table) > 20:
            assert 0 < len(got) < fds.num_rows(table), table  # a real sample, not all or nothing


def test_sample_is_consistent_across_tables(cell: tuple[Path, Path], sampled: Sampled) -> None:
    """Collections sample: every kept usage window's instance has all its events kept, and every
    kept event's instance has all its usage windows kept; machines sample: the same per
    (instance, machine).  (The samples of the test above.)"""
    raw, full = cell

    def keys(ds: Path, table: str, cols: tuple[str, ...]) -> dict[tuple, int]:
        t = Dataset(ds).read(table, list(cols))
        out: dict[tuple, int] = {}
        for r in zip(*(t.column(c).to_pylist() for c in cols), strict=True):
            out[r] = out.get(r, 0) + 1
        return out

    for spec, cols in (
        ("collections=25%", ("collection_id", "instance_index")),
        ("machines=30%", ("collection_id", "instance_index", "machine_id")),
    ):
        rep, out = sampled(spec)
        assert rep.exit_status == 0
        full_u, full_e = keys(full, "instance_usage", cols), keys(full, "instance_events", cols)
        got_u, got_e = keys(out, "instance_usage", cols), keys(out, "instance_events", cols)
        assert got_u and got_e
        for k, n in got_u.items():
            assert n == full_u[k]  # all of its windows
            assert got_e.get(k, 0) == full_e.get(k, 0)  # and all of its events
        for k, n in got_e.items():
            assert n == full_e[k]
            assert got_u.get(k, 0) == full_u.get(k, 0)


def test_time_range_keeps_overlapping_windows_and_earlier_events(
    cell: tuple[Path, Path], full_rows: FullRows, tmp_path: Path
) -> None:
    raw, full = cell
    lo, hi = 3_600_000_000, 7_200_000_000  # trace time [1 h, 2 h)
    out = tmp_path / "ds"
    rep = ingest([raw], out, time_from="1h", time_to="2h", workers=1)
    assert rep.exit_status == 0 and rep.rows_skipped > 0
    sel = Dataset(out).manifest["selection"]
    assert (sel["from_us"], sel["to_us"], sel["sample"]) == (lo, hi, None)
    for table in [t for t in TABLES if Dataset(full).num_rows(t)]:
        want, columns = full_rows(table)
        if table == "instance_usage":
            want = [
                r
                for r in want
                if r["start_time"] is not None
                and r["end_time"] is not None
                and r["start_time"] < hi
                and r["end_time"] > lo
            ]
        elif "time" in columns:
            want = [r for r in want if r["time"] is not None and r["time"] < hi]
        assert _rows(out, table) == want, table


def test_extending_needs_the_same_selection(cell: tuple[Path, Path], sampled: Sampled, tmp_path: Path) -> None:
    raw, _ = cell
    rep, first = sampled("machines=30%")
    assert rep.exit_status == 0
    out = tmp_path / "ds"
    shutil.copytree(first, out)  # that ingest, extended here
    again = ingest([raw], out, sample="machines=0.3", workers=1)  # the same sample, written differently
    assert again.exit_status == 0 and all(f.status == "skipped" for f in again.files)
    for kw in (
        {},
        {"sample": "machines=20%"},
        {"sample": "collections=30%"},
        {"sample": "machines=30%", "time_to": "1h"},
    ):
        with pytest.raises(IngestUsageError, match="was ingested with selection"):
            ingest([raw], out, workers=1, **kw)


@pytest.mark.parametrize(
    "bad,why",
    [
        ("racks=1%", "machines=P or collections=P"),
        ("machines=0%", r"\(0, 100%\]"),
        ("machines=150%", r"\(0, 100%\]"),
        ("machines", "machines=P"),
    ],
)
def test_bad_sample_is_a_usage_error(cell: tuple[Path, Path], tmp_path: Path, bad: str, why: str) -> None:
    raw, _ = cell
    with pytest.raises(IngestUsageError, match=why):
        ingest([raw], tmp_path / "ds", sample=bad, workers=1)


def test_cli_sample_and_analyze_note(cell: tuple[Path, Path], tmp_path: Path) -> None:
    """`gpuclust ingest --sample` then `gpuclust analyze`: the run notes that it ran on a sample;
    a bad --sample is one line on stderr and exit 2, no traceback."""
    raw, _ = cell
    out = tmp_path / "ds"
    run = [sys.executable, "-m", "gpuclust"]
    p = subprocess.run(
        [*run, "ingest", str(raw), "--out", str(out), "--sample", "machines=50%", "--from", "1h", "--no-progress"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    assert "selection: machines sample 50% (splitmix64-v1); usage windows overlapping [3600000000 us, +inf)" in p.stdout
    p = subprocess.run(
        [*run, "analyze", str(out), "cell-usage", "--out", str(tmp_path / "res"), "--no-plots"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    assert "this dataset is a selection of its cell: machines sample 50%" in p.stderr
    info = json.loads((tmp_path / "res" / "_run.json").read_text())
    assert any("machines sample 50%" in n for n in info["notes"])
    p = subprocess.run(
        [*run, "ingest", str(raw), "--out", str(tmp_path / "x"), "--sample", "racks=5%"], capture_output=True, text=True
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr and "machines=P or collections=P" in p.stderr


def test_sampled_out_rows_skip_validation_but_rejects_keep_their_lines(tmp_path: Path) -> None:
    """A machine sample drops usage records early (before they are flattened and validated);
    a bad line of a sampled machine is still rejected with its line number."""
    from .conftest import bq_json_line

    ids = list(range(1, 400))
    kept = [m for m in ids if in_sample(m, 0.5, machine=True)]
    lines = [
        bq_json_line(
            {
                "start_time": 0,
                "end_time": 300_000_000,
                "collection_id": 7,
                "instance_index": 0,
                "machine_id": m,
                "average_usage": {"cpus": 0.5, "memory": 0.25},
            }
        )
        for m in ids
    ]
    bad_at = ids.index(kept[3])
    lines[bad_at] = lines[bad_at].replace('"cpus":0.5', '"cpus":"lots"')
    f = tmp_path / "instance_usage-000000000000.json"
    f.write_text("\n".join(lines) + "\n")
    rep = ingest([f], tmp_path / "ds", sample="machines=50%", workers=1, max_reject_rate=1.0)
    got = Dataset(tmp_path / "ds").read("instance_usage", ["machine_id"]).column("machine_id").to_pylist()
    assert sorted(got) == [m for m in kept if m != kept[3]]
    assert rep.rows_rejected == 1 and rep.rows_skipped == len(ids) - len(kept)
    rej = [json.loads(x) for x in (tmp_path / "ds" / rep.files[0].rejects_file).read_text().splitlines()]
    assert [r["line"] for r in rej] == [bad_at + 1]


def test_nested_samples() -> None:
    import numpy as np

    from gpuclust.ingest.sampling import sample_hash

    ids = np.arange(-5000, 5000, dtype=np.int64) * 7919
    h = sample_hash(ids)
    assert [int(x) for x in h[:50]] == [splitmix64(int(v) & MASK) for v in ids[:50]]
    small, big = h < np.uint64(int(0.01 * 2**64)), h < np.uint64(int(0.05 * 2**64))
    assert not (small & ~big).any() and 0.005 < small.mean() < 0.02
    assert pa.array(ids).null_count == 0


def test_no_machine_is_never_sampled() -> None:
    from gpuclust.ingest.sampling import IngestSelection

    tbl = pa.table({"machine_id": pa.array([0, -1, 5, None, 7], pa.int64()), "time": pa.array([1, 2, 3, 4, 5])})
    sel = IngestSelection.parse(sample="machines=100%")
    kept, dropped = sel.filter_table("instance_events", tbl)
    assert kept.column("machine_id").to_pylist() == [5, 7] and dropped == 3
    sel = IngestSelection.parse(sample="collections=100%")  # no collection column: kept whole
    assert sel.filter_table("machine_events", tbl) == (tbl, 0)
