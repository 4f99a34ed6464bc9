"""The run's memory budget (``memory_limit`` / ``--memory-limit``): parsing, partition sizing,
the dask workers' share, and results that do not depend on it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from strategies import assert_results_same, random_cell, write_dataset

from gpuclust.analyses.registry import create, names
from gpuclust.dataset import Dataset
from gpuclust.engine import run
from gpuclust.engine.dask import open_scheduler
from gpuclust.engine.memory import (
    MIN_PARTITION_ROWS,
    default_limit,
    machine_memory,
    parse_size,
    row_bytes,
    whole_table_rows,
)
from gpuclust.engine.planning import auto_rows_of, plan_tables


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return Dataset(
        write_dataset(tmp_path_factory.mktemp("ds"), random_cell(5, n_windows=40_000), files=2, row_group_size=2_000)
    )


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("8GiB", 8 << 30),
        ("512MB", 512_000_000),
        ("2g", 2_000_000_000),
        ("1.5 MiB", 3 << 19),
        (4096, 4096),
        ("auto", None),
        (None, None),
    ],
)
def test_sizes_parse(text: object, n: int | None) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["lots", "8 parsecs", "-1GB", "0"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="memory limit"):
        parse_size(text)


def test_default_is_a_share_of_the_machine() -> None:
    assert 0 < default_limit() < machine_memory()


def test_a_smaller_budget_gives_smaller_partitions_and_the_same_results(dataset: Dataset) -> None:
    # the analyses whose flat table may be cut (a whole-instance one gets it as one partition: below)
    ans = [a for a in (create(n) for n in names()) if not a.whole_instances]
    usage = [a for a in ans if a.table == "instance_usage"]
    per_row = row_bytes(usage, "instance_usage")
    # the arithmetic: two partitions in flight in half the budget
    limit = 2 * 2 * per_row * 100_000
    rows = auto_rows_of(ans, limit, 2)["instance_usage"]
    assert rows == max(MIN_PARTITION_ROWS, 100_000)
    small = auto_rows_of(ans, 1 << 20, 2)["instance_usage"]
    assert small == MIN_PARTITION_ROWS  # never below the floor
    plans = plan_tables(dataset, ans, "auto", multiple_of=2, auto_rows={"instance_usage": 10_000})
    specs = plans["instance_usage"][1]
    assert len(specs) >= 4 and max(s.num_rows for s in specs) <= 12_000
    ref = run(dataset, ans, partitions="auto", workers=2)
    got = run(dataset, ans, partitions="auto", workers=2, memory_limit="64MiB")
    # usage-distribution's one-pass exact (about 3 kB a row) does not fit 64 MiB: its streamed
    # passes run instead (info says so), for the same tables
    ud = "usage-distribution"
    assert ref[ud]["info"]["strategy"].iloc[0] == "exact" and got[ud]["info"]["strategy"].iloc[0] == "exact-two-pass"
    got[ud]["info"] = ref[ud]["info"]
    assert_results_same(ref, got, rtol=1e-9)
    # a whole-instance analysis cannot cut a flat table: one partition over the budget is a clear error
    whole = [a for a in (create(n) for n in names()) if a.whole_instances and a.table == "instance_usage"]
    assert whole
    with pytest.raises(ValueError, match="gpuclust optimize"):
        plan_tables(dataset, whole, "auto", multiple_of=2, auto_rows={"instance_usage": 10_000})


def test_a_whole_table_is_refused_by_its_bytes_against_the_budget_not_by_a_row_count(
    dataset: Dataset, monkeypatch
) -> None:
    """Issue 33: lifecycle refused 3.4M real 2011 events on a 23 GiB machine because the limit was
    the streaming partition's row target (2 Mi rows).  The whole table in one partition is refused
    only when its bytes exceed what the budget holds, and the message gives the numbers."""
    whole = [a for a in (create(n) for n in names()) if a.whole_instances and a.table == "instance_usage"]
    rows = dataset.num_rows("instance_usage")
    per_row = row_bytes(whole, "instance_usage")
    # the streaming target is far below the table (10,000 rows a partition), the budget is not
    fits = 4 * rows * per_row
    assert whole_table_rows(fits, whole, "instance_usage") >= rows
    plans = plan_tables(dataset, whole, "auto", multiple_of=2, auto_rows={"instance_usage": 10_000}, memory_limit=fits)
    assert [s.num_rows for s in plans["instance_usage"][1]] == [rows]
    # a budget whose half cannot hold the table: refused, with rows, bytes and the budget (the
    # floor of a partition lowered below this small table)
    import gpuclust.engine.memory as memory

    monkeypatch.setattr(memory, "MIN_PARTITION_ROWS", 1_000)
    with pytest.raises(ValueError, match=rf"{rows:,} rows x {per_row:,} B = .* GiB.*GiB budget.*gpuclust optimize"):
        plan_tables(
            dataset, whole, "auto", multiple_of=2, auto_rows={"instance_usage": 10_000}, memory_limit=rows * per_row
        )


def test_a_local_cluster_splits_the_budget_across_its_workers() -> None:
    with open_scheduler("local:2", "cpu", memory_limit=2 << 30) as kw:
        cl = kw["scheduler"]  # asked of the scheduler (the client's cached info may list no workers)
        info = cl.sync(cl.scheduler.identity, n_workers=-1)["workers"]
        assert sorted(w["memory_limit"] for w in info.values()) == [1 << 30, 1 << 30]


def test_cli_records_the_budget_and_refuses_a_bad_one(dataset: Dataset, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "res"
    cmd = [
        sys.executable,
        "-m",
        "gpuclust.cli",
        "analyze",
        str(dataset.path),
        "cell-usage",
        "--out",
        str(out),
        "--quiet",
        "--no-plots",
    ]
    r = subprocess.run([*cmd, "--memory-limit", "3GiB"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "_run.json").read_text())["memory_limit"] == 3 << 30
    r = subprocess.run([*cmd, "--memory-limit", "lots"], capture_output=True, text=True)
    assert r.returncode == 2 and "memory limit 'lots'" in r.stderr and "Traceback" not in r.stderr


def _fake(tmp_path, meminfo: str, cgroup: dict[str, str]) -> tuple[str, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "meminfo").write_text(meminfo)
    cg = tmp_path / "cg"
    for name, text in cgroup.items():
        (cg / name).parent.mkdir(parents=True, exist_ok=True)
        (cg / name).write_text(text)
    cg.mkdir(exist_ok=True)
    return str(tmp_path / "meminfo"), str(cg)


MEMINFO = "MemTotal:       24683520 kB\nMemFree:         3017216 kB\nMemAvailable:   23930880 kB\nCached: 20000000 kB\n"


def test_available_memory_counts_the_page_cache_and_the_cgroup_room(tmp_path) -> None:
    """MemAvailable (free + reclaimable cache), not MemFree; under a cgroup, the room left below its
    limit, its inactive page cache counted as reclaimable."""
    from gpuclust.engine.memory import available_memory

    assert available_memory(*_fake(tmp_path / "a", MEMINFO, {})) == 23930880 * 1024
    v2 = {
        "memory.max": "8589934592\n",
        "memory.current": str(6 << 30),
        "memory.stat": f"anon 1\ninactive_file {3 << 30}\n",
    }
    assert available_memory(*_fake(tmp_path / "b", MEMINFO, v2)) == (8 << 30) - (3 << 30)
    unlimited = {"memory.max": "max\n", "memory.current": str(6 << 30)}
    assert available_memory(*_fake(tmp_path / "c", MEMINFO, unlimited)) == 23930880 * 1024
    v1 = {
        "memory/memory.limit_in_bytes": str(4 << 30),
        "memory/memory.usage_in_bytes": str(5 << 30),
        "memory/memory.stat": f"total_inactive_file {2 << 30}\n",
    }
    assert available_memory(*_fake(tmp_path / "d", MEMINFO, v1)) == 1 << 30


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/meminfo")
def test_available_memory_agrees_with_psutil() -> None:
    psutil = pytest.importorskip("psutil")
    from gpuclust.engine.memory import available_memory

    got, want = available_memory(), psutil.virtual_memory().available
    assert got is not None and abs(got - want) <= 0.1 * want + (512 << 20), (got, want)
