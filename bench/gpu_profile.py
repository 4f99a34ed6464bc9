"""Where the GPU path's time goes: the ceilings it is bounded by, and a profile per analysis.

    python bench/gpu_profile.py --windows 1e7        # on a GPU machine

Measures, on the machine it runs on:

* host->device bandwidth, pageable (``cupy.asarray`` of a NumPy array) and pinned (page-locked
  staging buffer, async copy on a non-default stream), and the device copy bandwidth;
* the host Parquet decode rate of the usage columns the analyses read (pyarrow, all threads), and
  of Arrow -> NumPy;
* each analysis on the gpu backend under cProfile (the 15 functions with the most own time), so
  the host-bound parts can be seen.

Writes bench/results/gpu_profile.{json,txt} (copied to $OUT when set).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _harness import bench_dataset, best_of, environment  # noqa: E402

GIB = 1 << 30


def transfer_rates(cp) -> dict[str, float]:  # type: ignore[no-untyped-def]
    n = GIB // 8
    host = np.random.default_rng(0).random(n)
    dev = cp.empty(n, dtype=np.float64)

    def pageable() -> None:
        dev.set(host)
        cp.cuda.Device().synchronize()

    pinned_mem = cp.cuda.alloc_pinned_memory(GIB)
    pinned = np.frombuffer(pinned_mem, dtype=np.float64, count=n)
    pinned[:] = host
    stream = cp.cuda.Stream(non_blocking=True)

    def from_pinned() -> None:
        dev.set(pinned, stream=stream)
        stream.synchronize()

    src = cp.asarray(host)

    def d2d() -> None:
        dev[...] = src
        cp.cuda.Device().synchronize()

    out = {
        "h2d_pageable_gbs": GIB / best_of(pageable, 5) / 1e9,
        "h2d_pinned_gbs": GIB / best_of(from_pinned, 5) / 1e9,
        "d2d_copy_gbs": 2 * GIB / best_of(d2d, 5) / 1e9,
    }
    d2h = np.empty_like(host)
    out["d2h_pageable_gbs"] = GIB / best_of(lambda: dev.get(out=d2h), 5) / 1e9
    return out


def decode_rates(ds: Path) -> dict[str, float]:
    import pyarrow.parquet as pq

    from gpuclust.analyses.registry import create, names
    from gpuclust.dataset import Dataset

    d = Dataset(ds)
    cols: set[str] = set()
    for n in names():
        a = create(n)
        if a.table == "instance_usage":
            cols.update(a.columns)
    files = sorted((ds / "instance_usage").rglob("*.parquet"))  # flat or bucket=k/ layout
    t = None

    def read() -> None:
        nonlocal t
        t = pq.read_table(files, columns=sorted(cols), use_threads=True)

    secs = best_of(read, 3)
    assert t is not None
    nbytes = t.nbytes
    del t  # (a whole decoded cell copy: 5.3 GB at 3.05e7 windows)
    return {
        "rows": d.num_rows("instance_usage"),
        "columns": len(cols),
        "decoded_bytes": nbytes,
        "decode_s": secs,
        "decode_gbs": nbytes / secs / 1e9,
        "parquet_bytes": sum(f.stat().st_size for f in files),
    }


def profile_analyses(ds: Path, top: int) -> dict[str, dict[str, object]]:
    from gpuclust.analyses.registry import create, names
    from gpuclust.dataset import Dataset
    from gpuclust.engine import run

    d = Dataset(ds)
    opts = {"cpi": {"by": "machine"}, "usage-distribution": {"by": "machine"}}
    res: dict[str, dict[str, object]] = {}
    for n in names():
        a = create(n, **opts.get(n, {}))
        run(d, [a], backend="gpu", partitions="auto")  # warm-up: kernels compiled, caches filled
        t0 = time.perf_counter()
        run(d, [a], backend="gpu", partitions="auto")
        wall = time.perf_counter() - t0
        pr = cProfile.Profile()
        pr.enable()
        run(d, [a], backend="gpu", partitions="auto")
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
        res[n] = {"wall_s": wall, "profile": s.getvalue()}
        print(f"{n}: {wall:.3f} s", flush=True)
    return res


#: The analyses the device check profiles, slowest first on the H200 (bench/results/gpu-latest.json).
PROFILED = (
    "usage-distribution",
    "peak-prediction",
    "overcommit",
    "usage-vs-request",
    "job-usage",
    "machine-utilization",
    "cpi",
)


def profile_step(ds: Path, out: Path, backend_name: str, analyses: tuple[str, ...], hz: float, top: int) -> None:
    """The device check's ``profile`` step: the study's load, its threads sampled
    (:func:`_sampled_load`), then each of ``analyses`` on the resident study, warm, its
    threads sampled at ``hz`` (bench/sampled.py) in a second run: its wall time, phases, and the
    lines of gpuclust its main thread was at (``lines``).  gpu_check.sh runs it under
    ``CUDA_LAUNCH_BLOCKING=1``: each kernel then returns when done, so its time lands on the line
    that launched it, and ``lines`` says where a gpu run's time goes, kernels included (the
    blocking launches slow the run: its ``s`` is not the warm time).  Written to ``out`` after
    each analysis, so a step cut short keeps what it measured."""
    from sampled import Sampler

    import gpuclust

    done: dict[str, object] = {}
    rec: dict[str, object] = {
        "backend": backend_name,
        "hz": hz,
        "launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING") == "1",
        "analyses": done,
    }
    study = gpuclust.open(ds, backend=backend_name)
    rec["load"] = _sampled_load(study, hz, top)
    out.write_text(json.dumps(rec, default=str))
    for n in analyses:
        study.run(n)  # kernels compiled (or read from CuPy's cache), contexts cached
        sampler = Sampler(hz).start()
        t = time.perf_counter()
        study.run(n)
        wall = time.perf_counter() - t
        sampler.stop()
        main = sampler.summary(top)["main"]
        done[n] = {
            "s": wall,
            "phases": dict(study.last_run_seconds),
            "samples": main["samples"],
            "lines": main["lines"],
            "exclusive": main["exclusive"],
        }
        out.write_text(json.dumps(rec, default=str))
        print(f"{n}: {wall:.3f} s, {main['samples']} samples; top: {main['lines'][:1]}", flush=True)
    study.close()


def _sampled_load(study: Any, hz: float, top: int) -> dict[str, object]:  # (a Study)
    """``study.persist()`` with every thread sampled at ``hz``: its wall time and rate, and where
    the main thread and the loader threads (``other``) were: the load ran at 42% of the host's
    decode rate on the H200 (bench/results/h200-2026-11-30), and this says which of decode, the
    copies into pinned buffers, the transfers or a wait takes the rest (sampling 17 threads at
    200 Hz slows the load a little)."""
    from sampled import Sampler

    sampler = Sampler(hz).start()
    t = time.perf_counter()
    study.persist()
    wall = time.perf_counter() - t
    sampler.stop()
    s = sampler.summary(top)
    keep = ("samples", "lines", "exclusive", "stacks")
    print(f"load: {wall:.3f} s, {study.loaded_bytes / wall / 1e9:.2f} GB/s", flush=True)
    return {
        "s": wall,
        "gb_s": study.loaded_bytes / wall / 1e9,
        "threads": study.load_threads,
        **{kind: {k: s[kind][k] for k in keep} for kind in ("main", "other")},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=float, default=1e7)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)
    from gpuclust.backends import gpu

    cp = gpu.require()
    n = int(args.windows)
    ds = bench_dataset(n)
    out: dict[str, object] = {"environment": environment(), "windows": n}
    out["transfer"] = transfer_rates(cp)
    print(json.dumps(out["transfer"]), flush=True)
    out["decode"] = decode_rates(ds)
    print(json.dumps(out["decode"]), flush=True)
    prof = profile_analyses(ds, args.top)
    out["analyses"] = {k: v["wall_s"] for k, v in prof.items()}
    res = HERE / "results"
    (res / "gpu_profile.json").write_text(json.dumps(out, indent=1, default=str))
    (res / "gpu_profile.txt").write_text(
        "\n".join(f"## {k} ({v['wall_s']:.3f} s)\n{v['profile']}" for k, v in prof.items())
    )
    if os.environ.get("OUT"):
        for f in ("gpu_profile.json", "gpu_profile.txt"):
            shutil.copy(res / f, os.environ["OUT"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
