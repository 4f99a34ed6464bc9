"""bench/gpu_check.sh and bench/gpu_check.py: the device check's data, parsers, comparison and
record, without a GPU (the whole script is rehearsed with ``REHEARSE=1``; see docs/user/gpu.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
DEVICE_RUN = BENCH / "results" / "h200-2026-11-28" / "call1"


@pytest.fixture
def check(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_check

    yield gpu_check
    sys.modules.pop("gpu_check", None)


def test_script_parses_and_names_the_issue_steps_in_priority_order() -> None:
    r = subprocess.run(["bash", "-n", str(BENCH / "gpu_check.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = (BENCH / "gpu_check.sh").read_text()
    body = text[text.index("GPUCLUST_REQUIRE_GPU=1 pytest") :]  # the device branch, after the rehearsal's
    body = body[body.index("else\n    if has sanitize") :]
    # the sanitizers run beside the tests, in the background, and both end before the kernels' timings
    order = [
        body.index(s)
        for s in (
            "step memcheck ",
            "step racecheck ",
            ") &\n        SAN_PID=$!",
            "step tests ",
            'wait "$SAN_PID"',
            "step kernels ",
            "step study ",
            "step cli-gpu ",
            "step dask ",
            "step reference ",
        )
    ]
    assert order == sorted(order)


def test_replicated_data_has_every_copy_shifted_and_distinct(check, tmp_path) -> None:
    ds = check.make_data(tmp_path, 20_000, 3, machines=60)
    base = pq.read_table(tmp_path / "base" / "instance_usage").to_pandas()
    man = json.loads((ds / "manifest.json").read_text())
    usage = pq.read_table([ds / f for f in man["tables"]["instance_usage"]["files"]]).to_pandas()
    assert len(usage) == 3 * len(base) == man["tables"]["instance_usage"]["rows"]
    key = ["collection_id", "instance_index"]
    assert usage[key].drop_duplicates().shape[0] == 3 * base[key].drop_duplicates().shape[0]
    # copy k: the base's windows k spans later, collection ids offset by k << 56, all else equal
    span = man["generator"]["span_us"]
    assert span >= base.end_time.max() - base.start_time.min()
    for k in range(3):
        part = pq.read_table(ds / f"instance_usage/part-rep-{k:05d}.parquet").to_pandas()
        assert (part.start_time - base.start_time == k * span).all()
        assert (part.collection_id - base.collection_id == k << 56).all()
        assert np.array_equal(part.cpu_p50.to_numpy(), base.cpu_p50.to_numpy())
    # every instance has its SCHEDULE and FINISH events; every collection SUBMIT, SCHEDULE, FINISH
    ev = pq.read_table(ds / "instance_events").to_pandas()
    assert set(map(tuple, usage[key].drop_duplicates().to_numpy())) <= set(map(tuple, ev[key].to_numpy()))
    ce = pq.read_table(ds / "collection_events").to_pandas()
    assert sorted(ce.type.unique()) == [0, 3, 6] and ce.collection_id.nunique() == ev.collection_id.nunique()
    import gpuclust

    res = gpuclust.run(ds, ["cell-usage"], backend="cpu")  # a dataset the engine opens and runs
    assert len(res["cell-usage"]) > 0


def test_compare_is_exact_and_measures_the_difference(check) -> None:
    a = pd.DataFrame({"k": [1, 2], "x": [1.0, 2.0]})
    assert check.compare({"t": a}, {"t": a.copy()})["equal"]
    assert check.compare({"t": a}, {"t": a.copy()})["bit_equal"]
    b = a.assign(x=[1.0, 2.0 * (1 + 1e-15)])  # another summation order: equal, not the same bits
    r = check.compare({"t": a}, {"t": b})
    assert r["equal"] and not r["bit_equal"] and r["unequal"]["t"]["max_rel_diff"] == pytest.approx(1e-15, rel=0.5)
    r = check.compare({"t": a}, {"t": a.assign(x=[1.0, 2.0 * (1 + 1e-6)])})
    assert not r["equal"] and not r["bit_equal"]
    assert check.compare({"t": a}, {})["unequal"] == {"t": "missing"}
    s = pd.DataFrame({"k": ["a", "b"], "x": [1.0, 2.0]})  # a string column counts too
    assert not check.compare({"t": s}, {"t": s.assign(k=["a", "c"])})["equal"]


def test_compare_aligns_rows_that_tie_in_one_run_by_their_key(check) -> None:
    """job-usage's jobs are ordered by NCU-hours, then collection id: two jobs tied in one run
    may differ in the last bit in another and swap. Aligned by their key they are equal, and
    marked reordered; a swap of values between keys, or a key missing, is not equal."""
    a = pd.DataFrame({"collection_id": [7, 3, 5], "ncu_hours": [4.0, 2.0, 2.0]})
    b = pd.DataFrame({"collection_id": [7, 5, 3], "ncu_hours": [4.0, 2.0 * (1 + 2e-16), 2.0]})
    r = check.compare({"t": a}, {"t": b})
    assert r["equal"] and not r["bit_equal"] and r["unequal"]["t"]["reordered"]
    c = pd.DataFrame({"collection_id": [7, 5, 3], "ncu_hours": [4.0, 2.5, 2.0]})  # 5 and 3 differ
    assert not check.compare({"t": a}, {"t": c})["equal"]
    d = pd.DataFrame({"collection_id": [7, 5, 4], "ncu_hours": [4.0, 2.0, 2.0]})  # another key
    assert not check.compare({"t": a}, {"t": d})["equal"]
    dup = pd.DataFrame({"collection_id": [7, 7, 3], "ncu_hours": [4.0, 2.0, 2.0]})  # not a key
    assert not check.compare({"t": dup}, {"t": dup.iloc[[0, 2, 1]]})["equal"]


@pytest.mark.skipif(not DEVICE_RUN.exists(), reason="the device run's logs are not in this checkout")
def test_parsers_read_the_device_logs() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(BENCH))
    assert gpu_check.pytest_counts((DEVICE_RUN / "tests.log").read_text()) == {
        "passed": 337,
        "failed": 0,
        "skipped": 2,
        "errors": 0,
    }
    assert gpu_check.sanitizer_counts(
        (DEVICE_RUN / "memcheck.log").read_text(), (DEVICE_RUN / "racecheck.log").read_text()
    ) == {"memcheck_errors": 0, "racecheck_hazards": 0}
    assert gpu_check.sanitizer_counts("", "") == {
        "memcheck_errors": None,
        "racecheck_hazards": None,
    }  # not run: unknown
    assert gpu_check.pytest_counts("3 failed, 300 passed, 1 skipped, 2 errors in 9.1s") == {
        "passed": 300,
        "failed": 3,
        "skipped": 1,
        "errors": 2,
    }


def test_assemble_reports_what_ran_and_nothing_it_did_not(check, tmp_path) -> None:
    work, logs = tmp_path / "work", tmp_path / "logs"
    work.mkdir()
    logs.mkdir()
    (work / "study.json").write_text(
        json.dumps(
            {
                "windows": 1000,
                "load": {"gb_s": 2.0, "vs_ceiling": 0.5},
                "ceilings": {"decode_gbs": 4.0, "h2d_pinned_gbs": 50.0},
                "analyses": {"cell-usage": {"s": 0.5}},
                "out_of_core": {"device_budget_bytes": 10, "data_bytes": 40, "s": 2.0, "equal": True},
            }
        )
    )
    (work / "cli_gpu.json").write_text(json.dumps({"wall_s": 3.0, "returncode": 0}))
    (work / "cli_cpu.json").write_text(json.dumps({"wall_s": 110.0, "returncode": -9, "timed_out": True}))
    (logs / "tests.log").write_text("5 passed in 1.0s\n")
    rec = check.assemble(work, logs, tmp_path / "gpu-latest.json")
    assert json.loads((tmp_path / "gpu-latest.json").read_text()) == json.loads(json.dumps(rec))
    assert rec["tests"]["passed"] == 5 and rec["sanitize"]["memcheck_errors"] is None
    assert rec["cli"]["gpu_s"] == 3.0 and rec["cli"]["cpu_s"] is None and rec["cli"]["cpu_cut_at_s"] == 110.0
    assert rec["out_of_core"]["equal"] is True and rec["out_of_core"]["gpu_s"] == 2.0
    assert rec["projection_cell_min"] == pytest.approx(2.0 / 1000 * 2.7e9 / 60)
    # all 13 at once out of core, equal to the resident run: the projection's rate
    study = json.loads((work / "study.json").read_text())
    study["out_of_core"]["all_at_once"] = {"s": 0.5, "equal": True}
    (work / "study.json").write_text(json.dumps(study))
    rec = check.assemble(work, logs, tmp_path / "gpu-latest.json")
    assert rec["out_of_core"]["all_at_once_s"] == 0.5
    assert rec["projection_cell_min"] == pytest.approx(0.5 / 1000 * 2.7e9 / 60)
    study["out_of_core"]["all_at_once"] = {"s": 0.5, "equal": False}  # (unequal: not a rate)
    (work / "study.json").write_text(json.dumps(study))
    rec = check.assemble(work, logs, tmp_path / "gpu-latest.json")
    assert "all_at_once_s" not in rec["out_of_core"] and rec["projection_cell_min"] == pytest.approx(
        2.0 / 1000 * 2.7e9 / 60
    )
    assert rec["analyses"]["cell-usage"] == {"gpu_s": 0.5, "cpu_s": None, "duckdb_s": None}
    assert rec["dask_cuda"] == {"gpu_s": None, "equal": None, "bit_equal": None, "worker_allocators": None}
    # an analysis that failed out of core: the others compared equal, but the step is neither equal nor timed
    study = json.loads((work / "study.json").read_text())
    study["out_of_core"]["analyses"] = {"cell-usage": {"s": 1.0}, "cpi": {"s": 0.1, "error": "OutOfMemoryError: ..."}}
    study["out_of_core"]["failed"] = ["cpi"]
    (work / "study.json").write_text(json.dumps(study))
    rec = check.assemble(work, logs, tmp_path / "gpu-latest.json")
    ooc = rec["out_of_core"]
    assert ooc["equal"] is False and ooc["gpu_s"] is None and ooc["failed"] == ["cpi"], ooc
    assert rec["projection_cell_min"] is None
    # ... while all 13 at once (run first: the run a user makes) equal the resident run: its rate
    study["out_of_core"]["all_at_once"] = {"s": 0.5, "equal": True}
    (work / "study.json").write_text(json.dumps(study))
    rec = check.assemble(work, logs, tmp_path / "gpu-latest.json")
    assert rec["out_of_core"]["equal"] is False and rec["out_of_core"]["all_at_once_s"] == 0.5
    assert rec["projection_cell_min"] == pytest.approx(0.5 / 1000 * 2.7e9 / 60)
    # the reference step: the cpu backend's warm seconds, and DuckDB's of the analysis' first SQL case
    # against the device's seconds on that case (its options), not on the analysis' defaults
    ref = {
        "backend": "gpu",
        "analyses": {"cell-usage": {"cpu_s": 20.0, "first_s": 21.0}, "cpi": {"cpu_s": 8.0}},
        "cases": {"cpi (SQL subset)": {"duckdb_s": 3.0, "gpu_s": 0.2}, "cell-usage": {"duckdb_s": 4.0}},
    }
    (work / "reference.json").write_text(json.dumps(ref))
    rec = check.assemble(work, logs, tmp_path / "gpu-latest.json")
    assert rec["analyses"]["cell-usage"] == {
        "gpu_s": 0.5,
        "cpu_s": 20.0,
        "duckdb_s": 4.0,
        "duckdb_case": {"case": "cell-usage", "gpu_s": None, "ratio": None},  # (no device time of the case)
    }
    assert rec["analyses"]["cpi"] == {
        "gpu_s": None,
        "cpu_s": 8.0,
        "duckdb_s": 3.0,
        "duckdb_case": {"case": "cpi (SQL subset)", "gpu_s": 0.2, "ratio": pytest.approx(15.0)},
    }
    assert rec["steps"]["reference"] == ref


def test_the_projection_adds_the_key_passes_a_cells_dense_sums_take(check, tmp_path) -> None:
    """The dense plans measured on the node, scaled to a cell (12,500 machines, 31 days): the passes
    the device's room takes (one room for all, as the engine places them), each read more the
    analysis' own out-of-core seconds per window times a cell's windows; nothing without a
    device's room or an analysis' time."""
    import doctest

    import gpu_projection as gp

    assert doctest.testmod(gp).failed == 0
    dense = {
        "analyses": {
            "overcommit": {"bytes": 10**9, "machines": 1_000},  # 12.5 x 31/10 = 38.75 GB at a cell
            "cpi": {"bytes": 10**8, "machines": 1_000},  # 3.875 GB: one pass
        },
        "days": 10.0,
        "room_bytes": 10**10,
    }
    kp = gp.key_passes_at_cell(dense, {"overcommit": 4.0, "cpi": 1.0}, 10**6)
    assert kp["analyses"]["overcommit"] == {
        "cell_bytes": 38_750_000_000,
        "passes": 4,
        "reads": 4,  # cpi's accumulators placed first: no room left for a first pass in the run's stream
        "extra_min": pytest.approx(720.0),
    }
    assert kp["analyses"]["cpi"] == {"cell_bytes": 3_875_000_000, "passes": 1, "reads": 0, "extra_min": 0.0}
    assert kp["extra_min"] == pytest.approx(720.0)  # 4 reads x 4e-6 s x 2.7e9 / 60
    assert gp.key_passes_at_cell({**dense, "room_bytes": None}, {"overcommit": 4.0, "cpi": 1.0}, 10**6) is None
    assert gp.key_passes_at_cell(dense, {"cpi": 1.0}, 10**6)["extra_min"] is None  # overcommit not timed
    # in the record: beside the projection, and added to it
    work, logs = tmp_path / "work", tmp_path / "logs"
    work.mkdir()
    logs.mkdir()
    ooc = {"s": 5.0, "equal": True, "analyses": {"overcommit": {"s": 4.0}, "cpi": {"s": 1.0}}}
    (work / "study.json").write_text(json.dumps({"windows": 10**6, "dense": dense, "out_of_core": ooc}))
    rec = check.assemble(work, logs, tmp_path / "gpu-latest.json")
    assert rec["projection_cell_min"] == pytest.approx(5.0 / 10**6 * 2.7e9 / 60)
    assert rec["projection_key_passes"]["analyses"]["overcommit"]["passes"] == 4
    assert rec["projection_cell_min_with_key_passes"] == pytest.approx(225.0 + 720.0)
    (work / "study.json").write_text(json.dumps({"windows": 10**6, "out_of_core": ooc}))  # (no dense plans)
    rec = check.assemble(work, logs, tmp_path / "gpu-latest.json")
    assert rec["projection_key_passes"] is None and rec["projection_cell_min_with_key_passes"] is None


def test_out_of_core_load_rate_is_the_streamed_bytes_over_their_read_time(check) -> None:
    ooc = {
        "analyses": {
            "a": {"read_bytes": 6e9, "phases": {"read": 2.0}},
            "b": {"read_bytes": 2e9, "phases": {"read": 2.0}},
            "c": {"read_bytes": 0, "phases": {"read": 0.0}},  # (nothing streamed)
            "d": {"error": "OutOfMemoryError"},
        }
    }
    assert check.ooc_load_rate(ooc, 4.0) == {"load_gb_s": 2.0, "load_vs_ceiling": 0.5}
    assert check.ooc_load_rate({}, 4.0) == {}


def test_cli_step_records_the_phases_of_its_run_json(check, tmp_path, monkeypatch) -> None:
    """The CLI step's record carries where the command's time went, from DIR/_run.json; a
    command that wrote none (it failed) leaves them out."""
    import _harness

    phases = {"read": 2.0, "partials": 1.0, "plots": 0.5}
    ran = []

    def fake_run(cmd, timeout_s):
        ran.append(cmd)
        # bench/sampled.py --out SAMPLES --stop-after S -m gpuclust analyze DS ... --out DEST ...
        assert cmd[1].endswith("sampled.py") and cmd[6:9] == ["-m", "gpuclust", "analyze"], cmd
        assert cmd[4:6] == ["--stop-after", str(timeout_s - 5.0)], cmd  # before the outer kill
        samples, dest = Path(cmd[3]), Path(cmd[cmd.index("--out", 7) + 1])
        if len(ran) == 1:
            dest.mkdir(parents=True)
            run = {"seconds": 4.0, "phases": phases, "phases_by_analysis": {"cpi": {"read": 2.0}}}
            (dest / "_run.json").write_text(json.dumps(run))
            samples.write_text(json.dumps({"hz": 20.0, "main": {"samples": 80}}))
        if len(ran) == 3:  # cut by its deadline: the sampler wrote what it saw and ended the run
            samples.write_text(json.dumps({"hz": 20.0, "main": {"samples": 40}, "cut_after_s": 55.0}))
        return _harness.Measured(wall_s=5.0, peak_rss_bytes=2**20, returncode=[0, 1, 124][len(ran) - 1])

    monkeypatch.setattr(_harness, "run_measured", fake_run)
    check.cli_step(tmp_path / "ds", tmp_path / "cli_gpu.json", "gpu", 60)
    rec = json.loads((tmp_path / "cli_gpu.json").read_text())
    assert rec["phases"] == phases and rec["run_s"] == 4.0 and rec["wall_s"] == 5.0
    assert rec["phases_by_analysis"] == {"cpi": {"read": 2.0}} and "phases_other_threads" not in rec
    assert rec["samples"] == {"hz": 20.0, "main": {"samples": 80}} and rec["cmd"].startswith("gpuclust analyze ")
    check.cli_step(tmp_path / "ds", tmp_path / "cli_gpu.json", "gpu", 60)  # the folder is removed first
    rec = json.loads((tmp_path / "cli_gpu.json").read_text())
    assert rec["returncode"] == 1 and "phases" not in rec and "run_s" not in rec and rec["samples"] is None
    assert "timed_out" not in rec
    check.cli_step(tmp_path / "ds", tmp_path / "cli_gpu.json", "gpu", 60)
    rec = json.loads((tmp_path / "cli_gpu.json").read_text())
    assert rec["timed_out"] is True and rec["samples"]["cut_after_s"] == 55.0


@pytest.mark.slow
def test_rehearsal_as_docs_print_it(tmp_path) -> None:
    """docs/user/gpu.md's rehearsal, run from the checkout's root as printed: every step runs on the
    cpu, and the record it assembles is whole (out of core and dask equal to the resident run)."""
    import os
    import re

    doc = (ROOT / "docs" / "user" / "gpu.md").read_text()
    cmd = re.search(r"^(REHEARSE=1 bash bench/gpu_check\.sh)$", doc, re.M).group(1)
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    env.pop("GPUCLUST_REQUIRE_GPU", None)
    r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    log = (tmp_path / "check.log").read_text()
    ends = re.findall(r"\] (\S+): exit (\d+)", log)
    # the (stubbed) sanitizers ran beside the tests, in their order, and ended before the kernels' timings
    sanitize = [e for e in ends if e[0] in ("memcheck", "racecheck")]
    assert sanitize == [("memcheck", "0"), ("racecheck", "0")], log
    assert ends.index(("racecheck", "0")) < ends.index(("kernels", "0")), log
    assert "racecheck: stubbed in the rehearsal" in (tmp_path / "racecheck.log").read_text()
    assert [e for e in ends if e not in sanitize] == [
        ("tests", "0"),
        ("kernels", "0"),
        ("data", "0"),
        ("study", "0"),
        ("cli-gpu", "0"),
        ("cli-cpu", "0"),
        ("dask", "0"),
        ("profile", "0"),
        ("reference", "0"),
    ], log
    rec = json.loads((tmp_path / "gpu-latest.json").read_text())
    assert rec["windows"] > 0 and rec["cli"]["gpu_s"] > 0 and rec["cli"]["cpu_s"] > 0
    prof = rec["steps"]["profile"]  # (the rehearsal profiles two analyses; the device run, the seven slowest)
    assert prof["launch_blocking"] is True and list(prof["analyses"]) == ["usage-distribution", "job-usage"]
    assert rec["out_of_core"]["equal"] is True and rec["dask_cuda"]["equal"] is True
    assert len(rec["analyses"]) == 13 and rec["projection_cell_min"] > 0
    # all 13 at once out of core (in groups within the budget): equal, and the projection's rate
    assert rec["out_of_core"]["all_at_once_s"] == rec["steps"]["study"]["out_of_core"]["all_at_once"]["s"]
    assert rec["steps"]["study"]["variants"]["usage-distribution[strategy=exact-two-pass]"]["s"] > 0
    # all at once equal: alone, only the analyses with dense sums (their reads price a cell's key passes)
    ooc = rec["steps"]["study"]["out_of_core"]
    assert ooc["alone"] == ["cpi", "machine-utilization", "overcommit"] == sorted(ooc["analyses"])
    assert ooc["usage_distribution_strategy"] is None and ooc["all_at_once"]["phases"]["partials"] > 0
    assert set(rec["out_of_core"]["analyses"]) == set(ooc["alone"])
    assert rec["out_of_core"]["gpu_s"] == rec["out_of_core"]["all_at_once_s"]
    assert rec["out_of_core"]["load_gb_s"] > 0 and rec["out_of_core"]["load_vs_ceiling"] > 0  # (streamed loads)
    assert all(v["phases"]["partials"] > 0 and "hold" in v for v in ooc["analyses"].values())  # where time went
    # the reference step: every analysis on the cpu backend, the SQL cases in DuckDB beside the device
    assert all(v["cpu_s"] > 0 for v in rec["analyses"].values())
    duck = {n: v["duckdb_case"] for n, v in rec["analyses"].items() if v["duckdb_s"]}
    assert len(duck) == 8 and all(c["ratio"] > 0 for c in duck.values()), duck
    ref = rec["steps"]["reference"]
    assert ref["equal_to_study"]["equal"] is True and "peak-prediction (SQL part)" in ref["left_out"]
    kept = [p.name for p in tmp_path.glob("gpucheck-*")]  # the work folder removed, the data kept for a next call
    assert kept == ["gpucheck-data-3e4-3-60-uncommitted-rehearsal"], kept


def test_a_failure_is_recorded_with_its_innermost_frames(check) -> None:
    """The out-of-core step keeps where an exception came from (issue 34: an OutOfMemoryError on
    the H200 said nothing of the analysis or stage)."""

    def inner() -> None:
        raise MemoryError("Out of memory allocating 155,832,832 bytes")

    def outer(depth: int) -> None:
        if depth:
            outer(depth - 1)
        else:
            inner()

    try:
        outer(8)
    except MemoryError as e:
        frames = check.last_frames(e)
    assert len(frames) == 6
    assert " in inner: raise MemoryError(" in frames[-1] and frames[-1].startswith(__file__)
    assert all(" in outer: " in f for f in frames[:-1])


def test_load_with_every_core_is_measured_only_beyond_the_default(check, tmp_path, monkeypatch) -> None:
    """The study step's second load, on every usable core: measured when the default load uses
    fewer threads (the device node's 16 cores against 12), skipped when it already uses them all;
    the assembled record carries it beside the default's."""
    import gpuclust._parallel

    ds = check.make_data(tmp_path, 20_000, 2, machines=40)
    assert check._load_with_every_core(ds, "cpu", gpuclust._parallel.usable_cores(), 1.0) == {}
    monkeypatch.setattr(gpuclust._parallel, "usable_cores", lambda: 3)
    got = check._load_with_every_core(ds, "cpu", 2, 4.0)
    assert got["threads"] == 3 and got["s"] > 0 and got["gb_s"] == pytest.approx(4.0 * got["vs_ceiling"])
    work, logs = tmp_path / "work", tmp_path / "logs"
    work.mkdir()
    logs.mkdir()
    study = {"load": {"gb_s": 1.0, "vs_ceiling": 0.25, "threads": 2}, "load_all_cores": got}
    (work / "study.json").write_text(json.dumps(study))
    rec = check.assemble(work, logs, tmp_path / "gpu-latest.json")
    assert rec["load"]["threads"] == 2 and rec["load"]["all_cores"] == got


def test_profile_step_says_which_lines_each_analysis_ran(check, tmp_path, synth_cell_40) -> None:
    """The profile step: per analysis its wall time, phases and the gpuclust lines its main thread
    was at (bench/sampled.py), written after each analysis."""
    from gpu_profile import profile_step

    out = tmp_path / "profile.json"
    profile_step(synth_cell_40 / "ds", out, "cpu", ("usage-distribution", "cell-usage"), 500.0, 5)
    rec = json.loads(out.read_text())
    assert (
        rec["backend"] == "cpu" and rec["hz"] == 500.0 and list(rec["analyses"]) == ["usage-distribution", "cell-usage"]
    )
    ud = rec["analyses"]["usage-distribution"]
    assert ud["s"] > 0 and ud["samples"] > 0 and "finalize" in ud["phases"]
    assert all(line.startswith("gpuclust/") or line == "(no gpuclust frame)" for line, _, _ in ud["lines"])
    assert sum(c for _, c, _ in ud["lines"]) <= ud["samples"]


def test_a_second_call_on_the_same_machine_reuses_the_data(tmp_path) -> None:
    """The check's data (made, then laid out by instance: 90 s on the H200) is kept beside the
    call's work folder, keyed by its size and commit: a second call on a warm machine (a rerun of
    some STEPS) takes it as it is, a call of another commit makes its own."""
    import os

    env = {**os.environ, "REHEARSE": "1", "STEPS": "none", "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    env.pop("GPUCLUST_REQUIRE_GPU", None)
    logs = []
    for k, commit in enumerate(["a" * 40, "a" * 40, "b" * 40]):
        out = tmp_path / f"out{k}"
        r = subprocess.run(
            ["bash", "bench/gpu_check.sh"],
            cwd=ROOT,
            env={**env, "OUT": str(out), "COMMIT": commit},
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert "data: exit 0" in (out / "check.log").read_text()
        logs.append((out / "steps.log").read_text())
        assert json.loads((out / "gpu-latest.json").read_text())["steps"]["optimize"]["returncode"] == 0
    assert ["data: reused" in s for s in logs] == [False, True, False]
    assert sorted(p.name for p in tmp_path.glob("gpucheck-data-*")) == [
        f"gpucheck-data-3e4-3-60-{c * 40}-rehearsal" for c in "ab"
    ]
