"""Issue 8, deliverable 5: every analysis runs under a memory cap set to what a *bounded*
implementation needs (a fixed baseline plus one partition's worth per worker plus its output),
below what today's code needs, and gives the results of an uncapped run.

How the cap is enforced (decided by trying; Linux only):

* ``RLIMIT_AS`` counts virtual reservations, not memory in use: with a 400 MiB limit,
  ``engine.run(cell-usage)`` on the 2e6-window set below (peak RSS 230 MiB) *hangs* in its
  thread pool.  ``RLIMIT_DATA`` counts glibc's per-thread arena reservations: with 400 MiB the
  same run aborts with "cannot allocate memory for thread-local data".  Neither measures what the
  issue is about (resident memory).
* So the child runs uncapped by the kernel, a psutil watchdog in this process samples its RSS
  every 10 ms and kills it above the cap, and the child reports its own high-water mark
  (``VmHWM`` in /proc/self/status: exact, kernel-kept, reset at exec so not inherited from the
  pytest process) which must be at most the cap too.  The child pickles its results; they must
  equal an uncapped in-process run with the same partitions (identical cut points, so only the
  merge order of the thread pool could differ: compared to 1e-12).

Cap arithmetic (2e6 windows, 16 partitions of ~125k rows, 128 Ki-row row groups so the cuts
snap to row groups; the engine's default thread pool = 2 workers here):

=====================  =========================================================================
fixed baseline         ``BASE_MIB`` = 160 MiB: measured on this data, the child after importing
                       gpuclust, NumPy, pandas, pyarrow is 112 MiB; machine-shapes (reads only
                       machine_events) peaks at 124 MiB; plus ~36 MiB for the side tables
                       (instance_events: 1e5 rows x 13 columns ~ 5 MB) and pyarrow's buffers
one partition's worth  ``IN_FLIGHT`` (2 workers) x 125,000 rows x 149 B (a whole instance_usage
                       row in memory: 8 int64/int32/int8 keys and times = 41 B, 27 float32 =
                       108 B) x ``AMPLIFY`` 4 (decoded Arrow buffers, NumPy copies, float64
                       temporaries) = 149 MB = 142 MiB
output                 2 x the result tables (the frame and what it was built from): overcommit
                       100 machines x 1,666 buckets x 53 columns x 8 B = 70.6 MB -> 135 MiB
                       (its machine table is written by shard tasks now: the allowance covers
                       one shard's keyed partials and rows, here the whole 166k machine-buckets);
                       usage-distribution by=instance 50,000 instances x 2 tables x 24 columns
                       x 8 B = 19 MB -> 37 MiB; the others < 1 MiB
=====================  =========================================================================

So the cap is 302 MiB (+ output), against a whole dataset's worth of 2e6 x 149 B x 4 = 1.1 GiB:
one partition's worth is clearly below the data's.  Measured today (whole run, 16 partitions,
VmHWM): cell-usage 230-239 MiB, machine-shapes 124, cpi 487-501 before its first pass became a
prerequisite run on the same partitions (now within the cap), overcommit 643-682,
usage-distribution by=machine 1,081-1,345, by=instance 1,357-1,541 (one-pass exact), by=tier
(default) 2,860-3,369 with one-pass exact and 528-605 with the two passes ``auto`` takes since
its exact limit by tier is 2e6 rows (these are 2,008,179; live heap at most ~360 MiB, the rest
memory the allocator keeps for reuse).  The analyses above their cap are ``xfail(strict=True)``:
the day one is bounded the test XPASSes, fails, and its mark must go.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_once import once_per_run
from strategies import assert_results_same

psutil = pytest.importorskip("psutil")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc (VmHWM)"),
]

ROOT = Path(__file__).resolve().parents[2]
WINDOWS = 2_000_000
PARTITIONS = 16
ROW_GROUP = 1 << 17
MIB = 1 << 20

BASE_MIB = 160
IN_FLIGHT = 2
ROW_BYTES = 149
AMPLIFY = 4
PARTITION_MIB = IN_FLIGHT * (WINDOWS // PARTITIONS) * ROW_BYTES * AMPLIFY / MIB  # 142 MiB
#: 2 x the result tables, MiB (see the module docstring).
OUTPUT_MIB = {
    "overcommit": 2 * 100 * 1_666 * 53 * 8 / MIB,
    "usage-distribution[by=instance]": 2 * 50_000 * 2 * 24 * 8 / MIB,
}


#: What an analysis holds per row beyond the generic ``AMPLIFY`` x a row, MiB: usage-distribution
#: by instance gathers a partition's 20 percentiles (+ the repaired flag) as float64 and then
#: gathers them again in group order, both alive at once: one float64 copy per worker more,
#: 2 x 125,000 x 21 x 8 B = 40 MiB.  (memray's high-water mark on this data: 145 MiB of live
#: heap, of which those copies 2 x 20 + 2 x 20 MiB and the row groups read 31 MiB; the peak RSS
#: adds the imports and what the allocator keeps: 300-345 MiB over 16 runs beside a busy core,
#: since one malloc arena serves every thread; with the second arena pyarrow's import made,
#: 307-429: see gpuclust/_memory.py.)
WORKING_MIB = {"usage-distribution[by=instance]": IN_FLIGHT * (WINDOWS // PARTITIONS) * 21 * 8 / MIB}


def cap_mib(label: str) -> float:
    return BASE_MIB + PARTITION_MIB + OUTPUT_MIB.get(label, 0.0) + WORKING_MIB.get(label, 0.0)


def _xfail(what: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=f"issue 8: {what}")


CASES = [
    pytest.param("cell-usage", {}, id="cell-usage"),
    pytest.param("machine-shapes", {}, id="machine-shapes"),
    # cpi fits since its first pass is a declared prerequisite run on the same 16 partitions
    # (it was a nested run with partitions="auto": 487-501 MiB)
    pytest.param("cpi", {}, id="cpi"),
    # overcommit fits since its machine table is written by the shard tasks and its partials'
    # dense blocks are at most 2 cells per row (643-682 MiB before; 383-392 MiB VmHWM now, after
    # the child pickled with protocol 5: with protocol 4 the copies of the result's buffers added
    # 15-45 MiB and a CI run was killed at 438 MiB against the 437 MiB cap)
    pytest.param("overcommit", {}, id="overcommit"),
    pytest.param(
        "usage-distribution",
        {},
        id="usage-distribution",
        marks=_xfail(
            "by=tier: auto runs exact-two-pass here (2,008,179 rows > 2e6), whose first pass inverts a "
            "partition's tiers at once (a tier's events in one row, ~53 MiB a thread) beside kept memory"
        ),
    ),
    pytest.param(
        "usage-distribution",
        {"by": "machine"},
        id="usage-distribution[by=machine]",
        marks=_xfail("exact partials carry every window (several n x 20 float64 copies) to finalize"),
    ),
    pytest.param(
        "usage-distribution",
        {"by": "instance"},
        id="usage-distribution[by=instance]",
        marks=_xfail("exact partials carry every window: an instance's windows are spread over all partitions"),
    ),
]

#: The same analyses on the dataset after ``gpuclust optimize --buckets 16`` (one bucket of ~125k
#: rows per partition: per-instance side inputs are built per partition, cpi's first pass runs on
#: the same partitions).  Measured (VmHWM): cell-usage 184 MiB, cpi 231, overcommit 569 (356-371 now),
#: usage-distribution by=instance 355.
BUCKETED_CASES = [
    pytest.param("cell-usage", {}, id="cell-usage"),
    pytest.param("cpi", {}, id="cpi"),
    # fits since the machine table is written by the shard tasks, a chunk of rows at a time, and
    # the spills are merged into dense accumulators (569 MiB before)
    pytest.param("overcommit", {}, id="overcommit"),
    # the per-instance rows are written by the shard tasks; its cap allows its percentile copies
    # (WORKING_MIB): 300-345 MiB measured against 379
    pytest.param("usage-distribution", {"by": "instance"}, id="usage-distribution[by=instance]"),
]

CHILD = r"""
import pickle, sys, json
from gpuclust.analyses.registry import create
from gpuclust.engine import run

ds, name, opts, parts, out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
# as `gpuclust analyze --out` does: tables that grow with the data are written by the shard tasks
r = run(ds, [create(name, **opts)], backend="cpu", partitions=parts, parts_dir=out + ".parts")
hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]
r = {k: {t: v if hasattr(v, "columns") else v.read() for t, v in tables.items()} for k, tables in r.items()}
with open(out, "wb") as f:  # protocol 5: NumPy buffers written in place, not copied to bytes first
    pickle.dump(r, f, protocol=5)
print(json.dumps({"vmhwm_bytes": int(hwm) * 1024}))
"""


def _make_dataset(folder: Path) -> Path:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import gen_canonical
    finally:
        sys.path.remove(str(ROOT / "bench"))
    old = gen_canonical.ROW_GROUP
    gen_canonical.ROW_GROUP = ROW_GROUP  # so that 16 partitions snap to row groups
    try:
        return gen_canonical.make_dataset(folder / "ds", WINDOWS, seed=3)
    finally:
        gen_canonical.ROW_GROUP = old


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 2e6-window dataset, made once per pytest run (:func:`run_once.once_per_run`: xdist
    workers read the same one; the runs only read it).  Not made read-only: ``optimize`` (the
    :func:`bucketed` fixture) takes the source's lock file for writing."""
    return once_per_run(tmp_path_factory, "memory-cap", _make_dataset)


@pytest.fixture(scope="module")
def bucketed(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dataset after ``optimize --buckets 16``, made once per pytest run like :func:`dataset`."""
    from gpuclust.optimize import optimize

    def build(folder: Path) -> Path:
        optimize(dataset, buckets=PARTITIONS, out=folder / "ds", progress=False)
        return folder / "ds"

    return once_per_run(tmp_path_factory, "memory-cap-bucketed", build, read_only=True)


def run_capped(
    ds: Path, name: str, opts: dict[str, str], cap_bytes: int, out: Path, timeout_s: float = 300
) -> dict[str, int]:
    """Run the analysis in a child; kill it when its RSS passes ``cap_bytes``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(ds), name, json.dumps(opts), str(PARTITIONS), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    watched = psutil.Process(proc.pid)
    peak, t0, killed = 0, time.monotonic(), None
    while proc.poll() is None:
        try:
            rss = watched.memory_info().rss
        except psutil.NoSuchProcess:
            break
        peak = max(peak, rss)
        if rss > cap_bytes:
            killed = f"RSS {rss / MIB:.0f} MiB above the cap {cap_bytes / MIB:.0f} MiB"
        elif time.monotonic() - t0 > timeout_s:
            killed = f"still running after {timeout_s:.0f} s"
        if killed:
            proc.kill()
            proc.communicate()
            pytest.fail(f"{name} {opts}: killed: {killed}")
        time.sleep(0.01)
    stdout, stderr = proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    return {"sampled_peak": peak, **json.loads(stdout.strip().splitlines()[-1])}


def test_cap_is_one_partition_not_the_data() -> None:
    whole_mib = WINDOWS * ROW_BYTES * AMPLIFY / MIB
    assert PARTITION_MIB < whole_mib / 5
    assert max(cap_mib(str(c.id)) for c in CASES) < BASE_MIB + whole_mib / 2


def _check_under_cap(ds: Path, tmp_path: Path, name: str, opts: dict[str, str], label: str) -> None:
    """Run the analysis capped in a child; its peak within the cap, its results the uncapped run's."""
    cap = int(cap_mib(label) * MIB)
    out = tmp_path / "result.pkl"
    m = run_capped(ds, name, opts, cap, out)
    assert m["vmhwm_bytes"] <= cap, f"peak RSS {m['vmhwm_bytes'] / MIB:.0f} MiB above the cap {cap / MIB:.0f} MiB"
    with open(out, "rb") as f:
        capped = pickle.load(f)

    from gpuclust.analyses.registry import create
    from gpuclust.engine import run

    assert_results_same(capped, run(ds, [create(name, **opts)], backend="cpu", partitions=PARTITIONS))


@pytest.mark.parametrize(("name", "opts"), CASES)
def test_analysis_under_memory_cap(
    dataset: Path, tmp_path: Path, name: str, opts: dict[str, str], request: pytest.FixtureRequest
) -> None:
    _check_under_cap(dataset, tmp_path, name, opts, request.node.callspec.id)


@pytest.mark.parametrize(("name", "opts"), BUCKETED_CASES)
def test_analysis_under_memory_cap_on_a_bucketed_dataset(
    bucketed: Path, tmp_path: Path, name: str, opts: dict[str, str], request: pytest.FixtureRequest
) -> None:
    _check_under_cap(bucketed, tmp_path, name, opts, request.node.callspec.id)
