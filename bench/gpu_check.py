"""The steps of the device check (``bench/gpu_check.sh``), each a subcommand writing one JSON file.

    python bench/gpu_check.py data OUT --base 1e6 --copies 35     # a 3*10^7-window dataset in seconds
    python bench/gpu_check.py optimize DS --out OPT --json o.json  # gpuclust optimize, timed
    python bench/gpu_check.py study DS --json study.json          # load, ceilings, warm analyses, out of core
    python bench/gpu_check.py cli DS --backend gpu --json cli_gpu.json
    python bench/gpu_check.py dask DS --json dask.json --ref REF  # LocalCUDACluster against the local run
    python bench/gpu_check.py assemble WORK --logs LOGS --out gpu-latest.json   # the issue's record

``data`` generates a base dataset with ``bench/gen_canonical.py`` and replicates it in time with
pyarrow: copy k has its windows and events shifted by k spans and its collection ids offset by
``k << 56`` (distinct instances), so per-instance, per-machine and per-hour keys grow with the copies.

``study`` (backend from ``--backend``, default gpu): persist every column the registered analyses
read (timed: the load; its rate against the pinned host->device and host decode ceilings measured in
the same process), one run of all analyses (kernel compilation), each analysis warm on the
resident data, all at once, the results saved under ``--ref``; then the resident columns are
released and the same analyses stream through ``gpuclust.run(partitions="auto")`` with the device
memory pool capped at ``--budget-frac`` of the loaded bytes (the out-of-core run), compared table by
table with the resident results.  The JSON is rewritten after every phase, so a step cut off by its
deadline still leaves what it measured.

Every step accepts a CPU backend, which is how the script is rehearsed on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

US = 1_000_000


def _dump(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")  # steps that run at once assemble apart
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


# -- data ---------------------------------------------------------------------------------------
def make_data(out: Path, base: int, copies: int, machines: int) -> Path:
    """A dataset of ``copies`` time-shifted replicas of a ``base``-window canonical dataset."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from gen_canonical import ROW_GROUP, make_dataset

    from gpuclust.dataset import new_manifest, write_json_atomic
    from gpuclust.schema import SCHEMAS, tier_map

    t0 = time.perf_counter()
    src = make_dataset(out / "base", base, machines=machines, seed=1)
    usage = pq.read_table(src / "instance_usage")
    events = pq.read_table(src / "instance_events")
    lo = pc.min(usage["start_time"]).as_py()
    hi = pc.max(usage["end_time"]).as_py()
    span = ((hi - lo) // (300 * US) + 1) * 300 * US
    ds = out / "ds"
    for t in ("instance_usage", "instance_events", "machine_events", "collection_events"):
        (ds / t).mkdir(parents=True, exist_ok=True)

    def shifted(t: pa.Table, k: int, times: tuple[str, ...]) -> pa.Table:
        cols = {n: t[n] for n in t.column_names}
        for n in times:
            cols[n] = pc.add(t[n], pa.scalar(k * span, pa.int64()))
        off = pa.scalar(k << 56, pa.int64())
        cols["collection_id"] = pc.add(t["collection_id"], off)
        a = t["alloc_collection_id"]
        cols["alloc_collection_id"] = pc.if_else(pc.equal(a, 0), a, pc.add(a, off))
        return pa.table(cols).cast(t.schema)

    def write_usage(k: int) -> str:
        rel = f"instance_usage/part-rep-{k:05d}.parquet"
        pq.write_table(
            shifted(usage, k, ("start_time", "end_time")), ds / rel, row_group_size=ROW_GROUP, compression="zstd"
        )
        return rel

    with ThreadPoolExecutor(min(copies, os.cpu_count() or 1)) as pool:
        usage_files = list(pool.map(write_usage, range(copies)))
    ev = pa.concat_tables([shifted(events, k, ("time",)) for k in range(copies)])
    pq.write_table(ev, ds / "instance_events/part-rep-00000.parquet", row_group_size=ROW_GROUP, compression="zstd")
    ce = pq.read_table(src / "collection_events")  # every instance is its own job: SUBMIT, SCHEDULE, FINISH
    pq.write_table(
        pa.concat_tables([shifted(ce, k, ("time",)) for k in range(copies)]),
        ds / "collection_events/part-rep-00000.parquet",
        row_group_size=ROW_GROUP,
        compression="zstd",
    )
    me = next((src / "machine_events").glob("*.parquet"))
    (ds / "machine_events" / me.name).write_bytes(me.read_bytes())
    man = new_manifest(trace_version="v3", cell="bench", tier_map=tier_map("notebook").to_json(), complete=True)
    files = {
        "instance_usage": usage_files,
        "instance_events": ["instance_events/part-rep-00000.parquet"],
        "machine_events": [f"machine_events/{me.name}"],
        "collection_events": ["collection_events/part-rep-00000.parquet"],
    }
    for t in SCHEMAS:
        fl = files.get(t, [])
        man["tables"][t] = {"files": fl, "rows": int(sum(pq.ParquetFile(ds / f).metadata.num_rows for f in fl))}
    man["generator"] = {
        "name": "bench/gpu_check.py data",
        "base_windows": usage.num_rows,
        "copies": copies,
        "machines": machines,
        "span_us": span,
    }
    write_json_atomic(ds / "manifest.json", man)
    print(f"{man['tables']['instance_usage']['rows']:,} windows in {ds} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return ds


def optimize(ds: Path, out: Path, rec_path: Path) -> None:
    """Lay ``ds`` out by instance into ``out`` (``gpuclust optimize``), timed."""
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "gpuclust", "optimize", str(ds), "--out", str(out), "--no-progress"],
        capture_output=True,
        text=True,
    )
    rec = {"s": time.perf_counter() - t, "returncode": r.returncode, "tail": (r.stdout + r.stderr)[-1500:]}
    _dump(rec_path, rec)
    print(json.dumps(rec), flush=True)
    if r.returncode:
        raise SystemExit(r.returncode)


# -- comparing results --------------------------------------------------------------------------
def frames(res: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``{analysis/table: DataFrame}`` of a run's results (parted tables read whole)."""
    out = {}
    for a, tabs in res.items():
        for t, df in tabs.items():
            out[f"{a}/{t}"] = df.read() if hasattr(df, "read") else df
    return out


def _rel_diff(a: Any, b: Any) -> float:
    """The largest relative difference between the numeric columns of two frames of one shape
    (non-finite values where both are non-finite are left out); ``inf`` where another column
    differs."""
    import numpy as np

    worst = 0.0
    for c in a.columns:
        x, y = a[c].to_numpy(), b[c].to_numpy()
        if x.dtype.kind in "fiu" and y.dtype.kind in "fiu":
            x, y = x.astype(np.float64), y.astype(np.float64)
            both = np.isfinite(x) & np.isfinite(y)
            if not np.array_equal(np.isfinite(x), np.isfinite(y)):
                return float("inf")
            d = np.abs(x[both] - y[both]) / np.maximum(np.abs(x[both]), 1e-300)
            worst = max(worst, float(d.max()) if d.size else 0.0)
        elif not a[c].equals(b[c]):
            return float("inf")
    return worst


def _by_key(a: Any, b: Any) -> tuple[Any, Any] | None:
    """Both frames' rows in the order of their exact (integer, string) columns, when those
    columns are a key of both (unique per row, the same set of keys); else None."""
    keys = [c for c in a.columns if a[c].dtype.kind in "iuObU"]
    if not keys or a[keys].duplicated().any() or b[keys].duplicated().any():
        return None
    a2, b2 = a.sort_values(keys, kind="stable"), b.sort_values(keys, kind="stable")
    if not a2[keys].reset_index(drop=True).equals(b2[keys].reset_index(drop=True)):
        return None
    return a2.reset_index(drop=True), b2.reset_index(drop=True)


def compare(ref: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    """Equality per table: ``bit_equal`` (every table the same bits) and ``equal`` (the same
    tables, shapes and columns, values to 1e-9 relative: runs over other partitions, such as
    the out-of-core study's smaller ones, sum in another order), and the largest relative
    difference where they differ.  A table ordered by a value (job-usage's jobs, by their
    NCU-hours) may order rows whose values tie in one run and differ in the last bit in the
    other either way: where its integer and string columns are a key of both and the values
    agree to 1e-9 once the rows are aligned by that key, it is equal and marked
    ``"reordered": true``."""
    import pandas as pd

    unequal: dict[str, Any] = {}
    for k in sorted(set(ref) | set(got)):
        a, b = ref.get(k), got.get(k)
        if a is None or b is None:
            unequal[k] = "missing"
            continue
        a, b = a.reset_index(drop=True), b.reset_index(drop=True)
        try:
            pd.testing.assert_frame_equal(a, b, check_exact=True)
            continue
        except AssertionError as e:
            why: Any = str(e).splitlines()[0][:200]
        if a.shape == b.shape and list(a.columns) == list(b.columns):
            why = {"first": why, "max_rel_diff": _rel_diff(a, b)}
            aligned = _by_key(a, b) if why["max_rel_diff"] > 1e-9 else None
            if aligned is not None and _rel_diff(*aligned) <= 1e-9:
                why.update(max_rel_diff=_rel_diff(*aligned), reordered=True)
        unequal[k] = why
    close = all(isinstance(v, dict) and v["max_rel_diff"] <= 1e-9 for v in unequal.values())
    return {"tables": len(ref), "equal": close, "bit_equal": not unequal, "unequal": unequal}


def save_ref(res: dict[str, Any], ref: Path) -> None:
    import pickle

    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_bytes(pickle.dumps(frames(res)))


def compare_runs(ref: Path, got: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """:func:`compare` of a run's results with the reference run's, on the analyses the run has,
    but usage-distribution's ``info``: it says how each ran (``auto`` takes one pass where the
    device's memory holds it, two within a memory cap), as ``usage_distribution_strategy``."""
    how, mine = "usage-distribution/info", frames(got)
    theirs = {k: v for k, v in load_ref(ref).items() if k.split("/")[0] in got and k != how}
    return {
        "usage_distribution_strategy": str(mine[how]["strategy"].iloc[0]) if how in mine else None,
        **compare(theirs, {k: v for k, v in mine.items() if k != how}),
    }


def load_ref(ref: Path) -> dict[str, Any]:
    import pickle

    return pickle.loads(ref.read_bytes())


# -- study: load, warm analyses, out of core ----------------------------------------------------
def _sync(backend: Any) -> None:
    if backend.xp.__name__ == "cupy":
        backend.xp.cuda.Device().synchronize()


def last_frames(e: BaseException, n: int = 6) -> list[str]:
    """The innermost ``n`` frames of ``e``'s traceback, a line each (``file:line in function:
    source``): where in the engine or an analysis a failure on the device happened."""
    import traceback

    return [
        f"{f.filename}:{f.lineno} in {f.name}: {(f.line or '').strip()}"
        for f in traceback.extract_tb(e.__traceback__)[-n:]
    ]


def _load_with_every_core(ds: Path, backend_name: str, default_threads: int, floor: float) -> dict[str, Any]:
    """The same load in a second study, decoding on every usable core (the default stops at 16,
    ``engine.staging.LOAD_THREADS``): whether more threads reach more of the ceiling; ``{}`` when
    the default already uses every core."""
    import gpuclust
    from gpuclust._parallel import usable_cores

    n = usable_cores()
    if n <= default_threads:
        return {}
    study = gpuclust.open(ds, backend=backend_name, load_threads=n)
    t = time.perf_counter()
    study.persist()
    _sync(study.backend)
    s = time.perf_counter() - t
    rec = {
        "threads": n,
        "s": s,
        "gb_s": study.loaded_bytes / s / 1e9,
        "vs_ceiling": study.loaded_bytes / s / 1e9 / floor,
    }
    study.release()
    study.close()
    return rec


def _strategy_variants(study: Any, gpu: bool) -> dict[str, Any]:
    """usage-distribution's ``exact-two-pass`` strategy, warm, on the resident study: ``auto``
    takes one-pass ``exact`` on a device wherever its memory holds it (no row limit there; on the
    host, two passes above 2e6 rows by tier).  Its time beside the default's (``analyses``) and,
    on a device, the bytes CuPy's pool grew by during the run (a bound on its device peak)."""
    from gpuclust.analyses.registry import create

    out: dict[str, Any] = {}
    a = create("usage-distribution", strategy="exact-two-pass")
    pool = study.backend.xp.get_default_memory_pool() if gpu else None
    before = 0
    if pool is not None:
        pool.free_all_blocks()
        before = int(pool.total_bytes())
    t = time.perf_counter()
    try:
        study.run([a])
        out["s"] = time.perf_counter() - t
    except Exception as e:  # recorded (a device out of memory says what exact needs there)
        out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    if pool is not None:
        out["pool_growth_bytes"] = int(pool.total_bytes()) - before
        pool.free_all_blocks()
    return {"usage-distribution[strategy=exact-two-pass]": out}


def study_step(ds: Path, out: Path, ref: Path, backend_name: str, budget_frac: float, repeat: int) -> None:
    from gpu_projection import dense_record

    import gpuclust
    from gpuclust.analyses.registry import names

    rec: dict[str, Any] = {"backend": backend_name}
    every = list(names())
    study = gpuclust.open(ds, backend=backend_name)
    be = study.backend
    gpu = be.xp.__name__ == "cupy"
    if gpu:
        be.xp.zeros(1)
        _sync(be)
    t = time.perf_counter()
    study.persist()
    _sync(be)
    rec["load"] = {"s": time.perf_counter() - t, "bytes": study.loaded_bytes}
    rec["load"]["gb_s"] = rec["load"]["bytes"] / rec["load"]["s"] / 1e9
    rec["windows"] = study.source.num_rows("instance_usage") if hasattr(study.source, "num_rows") else None
    _dump(out, rec)
    from gpu_profile import decode_rates, transfer_rates

    rec["ceilings"] = decode_rates(ds)
    if gpu:
        rec["ceilings"].update(transfer_rates(be.xp))
        floor = min(rec["ceilings"]["h2d_pinned_gbs"], rec["ceilings"]["decode_gbs"])
    else:
        floor = rec["ceilings"]["decode_gbs"]
    rec["windows"] = rec["windows"] or rec["ceilings"]["rows"]
    rec["load"]["vs_ceiling"] = rec["load"]["gb_s"] / floor
    rec["load"]["threads"] = study.load_threads
    _dump(out, rec)
    rec["load_all_cores"] = _load_with_every_core(ds, backend_name, study.load_threads, floor)
    _dump(out, rec)
    t = time.perf_counter()
    study.run(every)
    rec["first_run_s"] = time.perf_counter() - t  # kernels compiled (or read from CuPy's cache)
    try:  # (the projection's key passes at a cell's size: the dense plans, here)
        rec["dense"] = dense_record(study, every)
    except Exception as e:
        rec["dense"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    _dump(out, rec)
    rec["analyses"] = {}
    for n in every:
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            study.run(n)
            best = min(best, time.perf_counter() - t)
        rec["analyses"][n] = {"s": best, "phases": dict(study.last_run_seconds)}
        _dump(out, rec)
    rec["variants"] = _strategy_variants(study, gpu)
    _dump(out, rec)
    t = time.perf_counter()
    res = study.run(every)
    rec["all_at_once_s"] = time.perf_counter() - t
    save_ref(res, ref)
    _dump(out, rec)
    study.release()
    study.close()
    del res
    # out of core: a study whose device memory is capped at budget_frac of its data (CuPy's pool
    # limit), half of it for resident and streamed partitions (memory_budget), half for the
    # analyses' temporaries
    budget = int(budget_frac * rec["load"]["bytes"])
    ooc: dict[str, Any] = {
        "device_budget_bytes": budget,
        "data_bytes": rec["load"]["bytes"],
        "capped": gpu,
        "study_memory_budget": budget // 2,
    }
    rec["out_of_core"] = ooc
    if gpu:
        pool = be.xp.get_default_memory_pool()
        pool.free_all_blocks()
        pool.set_limit(size=budget)
    t = time.perf_counter()
    try:
        ooc_study = gpuclust.open(ds, backend=backend_name, memory_budget=budget // 2).persist()
        ooc["resident_bytes"] = ooc_study.resident_bytes
        ooc["streamed_partitions"] = ooc_study.streamed_partitions
        ooc["analyses"], got = {}, {}
        _dump(out, rec)
        # first the run a user makes, all 13 at once (the projection's rate), then alone: where that
        # run equals the resident one, the analyses with dense sums (their reads price the key passes
        # a cell takes, bench/gpu_projection.py), else each (which one fails, where the time goes);
        # each recorded as it ends: a step cut at its limit says how far it got
        ooc["all_at_once"] = _ooc_all_at_once(ooc_study, every, ref, pool if gpu else None)
        whole = _at_once_equal(ooc["all_at_once"])
        dense = sorted(rec.get("dense", {}).get("analyses", {})) or ["cpi", "machine-utilization", "overcommit"]
        ooc["alone"] = [n for n in every if n in dense] if whole else every
        _dump(out, rec)
        for n in ooc["alone"]:
            t1, b1 = time.perf_counter(), ooc_study.streamed_bytes
            try:
                got.update(ooc_study.run(n))
                ooc["analyses"][n] = {
                    "s": time.perf_counter() - t1,
                    "hold": ooc_study.last_run_hold,
                    "phases": dict(ooc_study.last_run_seconds),
                    "read_bytes": ooc_study.streamed_bytes - b1,  # (its read time: phases["read"])
                }
            except Exception as e:  # (a device out of memory: which analysis, where)
                ooc["analyses"][n] = {"s": time.perf_counter() - t1, "error": f"{type(e).__name__}: {str(e)[:300]}"}
                ooc["analyses"][n]["traceback"] = last_frames(e)
            if gpu:  # the pool's size after the run (it keeps its blocks: its peak), then emptied
                ooc["analyses"][n]["pool_peak_bytes"] = int(pool.total_bytes())
                pool.free_all_blocks()
            _dump(out, rec)
        ooc["s"] = time.perf_counter() - t - ooc["all_at_once"]["s"]
        ooc_study.close()
        if failed := [n for n, v in ooc["analyses"].items() if "error" in v]:  # (compared without them)
            ooc["failed"] = failed
        ooc.update(compare_runs(ref, got))
        if whole:  # (the run of all at once compared every analysis)
            ooc["equal"] = bool(ooc.get("equal")) and bool(ooc["all_at_once"]["equal"])
            ooc["bit_equal"] = bool(ooc.get("bit_equal")) and bool(ooc["all_at_once"].get("bit_equal"))
    except Exception as e:  # recorded: the step's purpose is to say what happens
        ooc["s"] = time.perf_counter() - t
        ooc["error"] = f"{type(e).__name__}: {str(e)[:500]}"
        ooc["traceback"] = last_frames(e)
    finally:
        if gpu:
            ooc["pool_peak_note"] = "CuPy pool limit (set_limit) was the cap; pool_peak_bytes: its size after each run"
            pool.set_limit(size=0)
    _dump(out, rec)
    print(json.dumps(rec, default=str)[:4000], flush=True)


def _at_once_equal(at_once: dict[str, Any]) -> bool:
    """Whether the out-of-core run of all 13 at once ran and equalled the resident run."""
    return "error" not in at_once and bool(at_once.get("equal"))


def _ooc_seconds(ooc: dict[str, Any]) -> float | None:
    """The out-of-core study's seconds for all 13 analyses: its run of all at once where that
    equalled the resident run, else its runs of each alone (every one of them then: their sum).

    >>> _ooc_seconds({"all_at_once": {"s": 2.0, "equal": True}, "s": 9.0, "alone": ["cpi"]})
    2.0
    >>> _ooc_seconds({"all_at_once": {"s": 2.0, "equal": False}, "s": 9.0})
    9.0
    """
    at_once = ooc.get("all_at_once", {})
    return at_once["s"] if _at_once_equal(at_once) else ooc.get("s")


def _ooc_all_at_once(study: Any, every: list[str], ref: Path, pool: Any) -> dict[str, Any]:
    """The 13 analyses in one run of the out-of-core study (in groups within its budget, each
    group streaming the data once: the run a user makes), timed and compared with the resident
    results; on a device, the pool's size after it."""
    t, b = time.perf_counter(), study.streamed_bytes
    try:
        res = study.run(every)
        rec: dict[str, Any] = {"s": time.perf_counter() - t, "groups": study.last_run_hold.get("groups", 1)}
        rec.update(read_bytes=study.streamed_bytes - b, read_s=study.last_run_seconds.get("read"))
        rec.update(phases=dict(study.last_run_seconds), hold=study.last_run_hold)
        rec.update(compare_runs(ref, res))
    except Exception as e:  # (recorded: the one-at-a-time runs stand)
        rec = {
            "s": time.perf_counter() - t,
            "error": f"{type(e).__name__}: {str(e)[:300]}",
            "traceback": last_frames(e),
        }
    if pool is not None:
        rec["pool_peak_bytes"] = int(pool.total_bytes())
        pool.free_all_blocks()
    return rec


# -- CLI: the command users run, whole process --------------------------------------------------
def cli_step(ds: Path, out: Path, backend: str, timeout_s: float) -> None:
    import shutil

    from _harness import run_measured

    from gpuclust.analyses.registry import names

    dest = out.parent / f"cli-{backend}"  # beside the step records, removed with them
    samples = out.parent / f"cli-{backend}-samples.json"
    shutil.rmtree(dest, ignore_errors=True)
    samples.unlink(missing_ok=True)
    cmd = ["gpuclust", "analyze", str(ds), *names(), "--out", str(dest), "--backend", backend, "--quiet"]
    # run as `python -m gpuclust ...`, its threads' stacks sampled at 20 Hz (bench/sampled.py: where
    # the host time goes, which a device run cannot profile otherwise)
    # a run past the step's time is ended by the sampler itself (status 124) after it wrote what it
    # saw, a few seconds before the outer timeout's kill: a cut run still says where its time went
    stop_after = max(1.0, timeout_s - 5.0)
    sampled = [
        *(sys.executable, str(Path(__file__).with_name("sampled.py")), "--out", str(samples)),
        *("--stop-after", str(stop_after), "-m"),
    ]
    m = run_measured([*sampled, *cmd], timeout_s=timeout_s)
    rec = {
        "backend": backend,
        "cmd": " ".join(cmd),
        "wall_s": m.wall_s,
        "peak_rss_mib": m.peak_rss_bytes / 2**20,
        "returncode": m.returncode,
        **m.extra,
        **({"timed_out": True} if m.returncode == 124 else {}),
        **_run_phases(dest),
        "samples": _read(samples) or None,
        "tail": m.stdout_tail[-1500:],
    }
    _dump(out, rec)
    print(json.dumps(rec)[:3000], flush=True)


def _run_phases(dest: Path) -> dict[str, Any]:
    """Where the command's time went, as its ``DIR/_run.json`` says (docs/analyses/README.md):
    ``run_s`` (the run in the process, less the interpreter's start and imports), ``phases``,
    ``phases_other_threads`` and ``phases_by_analysis``; ``{}`` when it wrote none (it failed)."""
    try:
        run = json.loads((dest / "_run.json").read_text())
    except (OSError, ValueError):
        return {}
    keys = ("phases", "phases_other_threads", "phases_by_analysis")
    return {"run_s": run.get("seconds"), **{k: run[k] for k in keys if k in run}}


# -- dask-cuda: the same study on a LocalCUDACluster --------------------------------------------
def dask_step(ds: Path, out: Path, ref: Path, backend: str, scheduler: str) -> None:
    import gpuclust
    from gpuclust.analyses.registry import names

    rec: dict[str, Any] = {"backend": backend, "scheduler": scheduler}
    t = time.perf_counter()
    try:
        with gpuclust.open(ds, backend=backend, scheduler=scheduler) as study:
            rec["start_s"] = time.perf_counter() - t
            _dump(out, rec)  # each phase recorded as it ends: a cut step says how far it got
            t1 = time.perf_counter()
            study.persist()
            rec["load_s"] = time.perf_counter() - t1
            _dump(out, rec)
            t1 = time.perf_counter()
            res = study.run(list(names()))
            rec["first_run_s"] = time.perf_counter() - t1
            _dump(out, rec)
            t1 = time.perf_counter()
            res = study.run(list(names()))
            rec["gpu_s"] = time.perf_counter() - t1
            if ref.exists():  # (the study step's results: a call without it times the run only)
                rec.update(compare_runs(ref, res))
            rec["worker_allocators"] = _worker_allocators()
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {str(e)[:500]}"
    rec["process_s"] = time.perf_counter() - t
    _dump(out, rec)
    print(json.dumps(rec, default=str)[:3000], flush=True)


def _worker_allocators() -> list[str]:
    """What CuPy allocates from on the cluster's workers (``rmm_cupy_allocator``: the RMM pool of
    :func:`gpuclust.engine.dask.cuda_cluster_options`; ``MemoryPool.malloc``: CuPy's own)."""
    import distributed

    def allocator() -> str:
        try:
            import cupy
        except ImportError:  # (the CPU rehearsal's workers)
            return "no cupy"
        f = cupy.cuda.get_allocator()
        return str(getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or repr(f))

    return sorted(set(distributed.default_client().run(allocator).values()))


# -- assemble -----------------------------------------------------------------------------------
def _read(p: Path) -> dict[str, Any]:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return {}


def pytest_counts(log: str) -> dict[str, int]:
    """The counts of pytest's last summary line (``3 failed, 300 passed, 1 skipped ...``)."""
    lines = [ln for ln in log.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", ln)]
    out = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    if lines:
        for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed)", lines[-1]):
            out["errors" if word.startswith("error") else word] = int(n)
    return out


def sanitizer_counts(memcheck: str, racecheck: str) -> dict[str, Any]:
    def total(pattern: str, text: str) -> int | None:
        hits = re.findall(pattern, text)
        return sum(int(h) for h in hits) if hits else None

    return {
        "memcheck_errors": total(r"ERROR SUMMARY: (\d+) error", memcheck),
        "racecheck_hazards": total(r"RACECHECK SUMMARY: (\d+) hazard", racecheck),
    }


def ooc_load_rate(ooc: dict[str, Any], ceiling: float) -> dict[str, Any]:
    """The out-of-core runs' load rate: the bytes their streamed partitions took over the seconds
    spent loading them (``phases.read``), and its share of the lower ceiling; ``{}`` without."""
    runs = [v for v in ooc.get("analyses", {}).values() if v.get("read_bytes") and v.get("phases", {}).get("read")]
    if not runs:
        return {}
    gb_s = sum(v["read_bytes"] for v in runs) / sum(v["phases"]["read"] for v in runs) / 1e9
    return {"load_gb_s": gb_s, "load_vs_ceiling": gb_s / ceiling if ceiling != float("inf") else None}


def assemble(work: Path, logs: Path, out: Path) -> dict[str, Any]:
    """The issue's record from the steps' JSON files in ``work`` and their logs in ``logs``."""
    env = _read(work / "env.json")
    study = _read(work / "study.json")
    cli_gpu, cli_cpu = _read(work / "cli_gpu.json"), _read(work / "cli_cpu.json")
    dask = _read(work / "dask.json")
    opt = _read(work / "optimize.json")
    text = {
        n: (logs / n).read_text(errors="replace") if (logs / n).exists() else ""
        for n in ("tests.log", "memcheck.log", "racecheck.log")
    }
    ooc = study.get("out_of_core", {})

    def ok(r: dict[str, Any]) -> float | None:
        return r.get("wall_s") if r.get("returncode") == 0 else None

    rec: dict[str, Any] = {k: env.get(k) for k in ("device", "driver", "cuda", "cupy", "commit", "date")}
    rec["windows"] = study.get("windows") or 0
    rec["tests"] = pytest_counts(text["tests.log"])
    rec["sanitize"] = sanitizer_counts(text["memcheck.log"], text["racecheck.log"])
    rec["cli"] = {
        "analyses": 13,
        "gpu_s": ok(cli_gpu),
        "cpu_s": ok(cli_cpu),
        "cpu_cut_at_s": cli_cpu.get("wall_s") if cli_cpu.get("timed_out") else None,
        "gpu_peak_rss_mib": cli_gpu.get("peak_rss_mib"),
        "cpu_peak_rss_mib": cli_cpu.get("peak_rss_mib"),
    }
    c = study.get("ceilings", {})
    rec["load"] = {
        "gb_s": study.get("load", {}).get("gb_s"),
        "decode_ceiling_gb_s": c.get("decode_gbs"),
        "h2d_pinned_gb_s": c.get("h2d_pinned_gbs"),
        "vs_ceiling": study.get("load", {}).get("vs_ceiling"),
        "threads": study.get("load", {}).get("threads"),
        **({"all_cores": study["load_all_cores"]} if study.get("load_all_cores") else {}),
    }
    rec["out_of_core"] = {
        "device_budget_bytes": ooc.get("device_budget_bytes"),
        "data_bytes": ooc.get("data_bytes"),
        **ooc_load_rate(ooc, min(c.get("h2d_pinned_gbs") or float("inf"), c.get("decode_gbs") or float("inf"))),
        # every analysis or none: one that failed is neither equal nor timed (no projection from the rest)
        "equal": False if ooc.get("failed") else ooc.get("equal"),
        "bit_equal": False if ooc.get("failed") else ooc.get("bit_equal"),
        "streamed_partitions": ooc.get("streamed_partitions"),
        "analyses": {n: v.get("error") or v["s"] for n, v in ooc.get("analyses", {}).items()},  # one at a time
        # the run of all 13 at once where it ran and equalled the resident run, else each alone summed
        "gpu_s": None if "error" in ooc or ooc.get("failed") else _ooc_seconds(ooc),
        **({"failed": ooc["failed"]} if ooc.get("failed") else {}),
        **({"error": ooc["error"]} if "error" in ooc else {}),
        **({"unequal": ooc["unequal"]} if ooc.get("unequal") else {}),
    }
    from gpu_projection import CELL_WINDOWS, key_passes_at_cell
    from gpu_reference import analyses_record

    rec["analyses"] = analyses_record(study.get("analyses", {}), _read(work / "reference.json"))
    rec["dask_cuda"] = {
        "gpu_s": dask.get("gpu_s"),
        "equal": dask.get("equal"),
        "bit_equal": dask.get("bit_equal"),
        "worker_allocators": dask.get("worker_allocators"),
        **({"error": dask["error"]} if "error" in dask else {}),
    }
    # a whole cell cannot be resident (~150 B a window: 400 GB), so it streams: the out-of-core rate
    at_once = ooc.get("all_at_once", {})
    if _at_once_equal(at_once):
        rec["out_of_core"]["all_at_once_s"] = at_once["s"]
    ooc_s = rec["out_of_core"].get("all_at_once_s") or rec["out_of_core"]["gpu_s"]
    per_window = ooc_s / rec["windows"] if ooc_s and rec["windows"] else None
    rec["projection_cell_min"] = per_window * CELL_WINDOWS / 60 if per_window else None
    one_at_a_time = {n: v for n, v in rec["out_of_core"]["analyses"].items() if isinstance(v, (int, float))}
    kp = key_passes_at_cell(study.get("dense", {}), one_at_a_time, rec["windows"])
    rec["projection_key_passes"] = kp
    extra = None if kp is None else kp["extra_min"]
    rec["projection_cell_min_with_key_passes"] = (
        rec["projection_cell_min"] + extra if rec["projection_cell_min"] and extra is not None else None
    )
    rec["notes"] = {
        "projection": "out-of-core (streamed) seconds per window x 2.7e9 windows: of the run of all 13 at once "
        "(out_of_core.all_at_once_s, equal to the resident results) where it ran, else of the analyses one at "
        "a time, each streaming the data itself (out_of_core.gpu_s: an upper bound). At a cell's size (12,500 "
        "machines, 31 days) the dense sums of overcommit, cpi and machine-utilization pass the device's room for "
        "them (a tenth of its memory) and a run takes them in key passes, each a further read of their columns: "
        "projection_key_passes scales the plans measured here (steps.study.dense) to a cell and counts the "
        "passes, each further one taken as the analysis' own out-of-core time; "
        "projection_cell_min_with_key_passes adds them (bench/gpu_projection.py)",
        "analyses.cpu_s": "the reference step's cpu backend, resident, every core, warm (a second run: its "
        "contexts cached, as the device's warm runs'); duckdb_s: the first SQL case of the analysis, on resident tables (duckdb_case: the "
        "device's time of that case, its options, and the ratio)",
        "first_run_s": study.get("first_run_s"),
        "all_at_once_s": study.get("all_at_once_s"),
    }
    rec["steps"] = {
        "optimize": opt,
        "study": study,
        "cli_gpu": cli_gpu,
        "cli_cpu": cli_cpu,
        "dask": dask,
        "profile": _read(work / "profile.json"),
        "reference": _read(work / "reference.json"),
    }
    _dump(out, rec)
    return rec


def env_step(out: Path, commit: str) -> None:
    rec: dict[str, Any] = {"commit": commit or None, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        q = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            .stdout.strip()
            .split(", ")
        )
        rec["device"], rec["driver"] = q[0], q[1]
        import cupy as cp

        v = cp.cuda.runtime.runtimeGetVersion()
        rec["cuda"], rec["cupy"] = f"{v // 1000}.{v % 1000 // 10}", cp.__version__
    except Exception as e:  # rehearsal on a machine without a GPU
        rec["device"] = f"none ({type(e).__name__})"
    _dump(out, rec)
    print(json.dumps(rec), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("data")
    p.add_argument("out", type=Path)
    p.add_argument("--base", type=lambda s: int(float(s)), default=1_000_000)
    p.add_argument("--copies", type=int, default=30)
    p.add_argument("--machines", type=int, default=1000)
    p = sub.add_parser("optimize")
    p.add_argument("ds", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--json", type=Path, required=True)
    p = sub.add_parser("env")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--commit", default="")
    p = sub.add_parser("study")
    p.add_argument("ds", type=Path)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--ref", type=Path, required=True)
    p.add_argument("--backend", default="gpu")
    p.add_argument("--budget-frac", type=float, default=0.25)
    p.add_argument("--repeat", type=int, default=1)
    p = sub.add_parser("cli")
    p.add_argument("ds", type=Path)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--backend", default="gpu")
    p.add_argument("--timeout", type=float, default=300)
    p = sub.add_parser("dask")
    p.add_argument("ds", type=Path)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--ref", type=Path, required=True)
    p.add_argument("--backend", default="gpu")
    p.add_argument("--scheduler", default="cuda")
    p = sub.add_parser("profile")
    p.add_argument("ds", type=Path)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--backend", default="gpu")
    p.add_argument("--hz", type=float, default=200.0)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--analyses", default="", help="comma-separated (default: gpu_profile.PROFILED)")
    p = sub.add_parser("reference")
    p.add_argument("ds", type=Path)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--ref", type=Path, default=None)
    p.add_argument("--backend", default="gpu")
    p = sub.add_parser("assemble")
    p.add_argument("work", type=Path)
    p.add_argument("--logs", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "data":
        make_data(a.out, a.base, a.copies, a.machines)
    elif a.cmd == "optimize":
        optimize(a.ds, a.out, a.json)
    elif a.cmd == "env":
        env_step(a.json, a.commit)
    elif a.cmd == "study":
        study_step(a.ds, a.json, a.ref, a.backend, a.budget_frac, a.repeat)
    elif a.cmd == "cli":
        cli_step(a.ds, a.json, a.backend, a.timeout)
    elif a.cmd == "dask":
        dask_step(a.ds, a.json, a.ref, a.backend, a.scheduler)
    elif a.cmd == "profile":
        from gpu_profile import PROFILED, profile_step

        profile_step(a.ds, a.json, a.backend, tuple(a.analyses.split(",")) if a.analyses else PROFILED, a.hz, a.top)
    elif a.cmd == "reference":
        from gpu_reference import reference_step

        reference_step(a.ds, a.json, a.backend, a.ref)
    else:
        print(json.dumps(assemble(a.work, a.logs, a.out), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
