"""Benchmark: exact per-group mixture quantiles (``mixture_quantiles``) against the per-group loop a
user would write.

The data: ``--windows`` usage windows in ``--groups`` groups (sizes Poisson around the mean),
20 CPU percentiles each (gamma-distributed, 30% of windows idle for their lower levels -> flat
steps), weights = 300 s x sample rate.

Contenders (all on the CPU; ``--gpu`` adds the CuPy op when a device is present):

* ``gpuclust numpy``: :func:`gpuclust.backends.mixture_cpu.mixture_quantiles` (exact);
* ``per-group loop``: pandas ``groupby`` -> for each group, F on a fine grid (``--grid`` points
  between the group's min and max) as ``sum_i w_i * np.interp(grid, q_i, levels)``, then
  ``np.interp(levels, F / W, grid)`` -- the straightforward code, and only approximate (grid
  resolution, no point masses).  ``--baseline-groups`` times it on a subset of groups and
  extrapolates by window count (reported as such).

Prints windows/s for each and the speed-up; ``--save`` writes bench/results/mixture_bench.{json,md}.

Run: ``python bench/mixture_bench.py [--windows 250000,1000000 --groups 10000] [--save]``; each
contender's ``work MiB``: how far the process's RSS rose above the data's during a first, untimed
call.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import publish, working_set  # noqa: E402

from gpuclust.backends import mixture_cpu  # noqa: E402
from gpuclust.schema import CPU_PERCENTILE_COLUMNS_SORTED, CPU_PERCENTILE_LEVELS_SORTED  # noqa: E402

LEVELS = np.asarray(CPU_PERCENTILE_LEVELS_SORTED, dtype=np.float64)


def make_data(n: int, n_groups: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    q = np.sort(rng.gamma(0.6, 0.05, (n, 20)), axis=1)
    q[rng.random(n) < 0.3, :8] = 0.0
    w = 300.0 * rng.choice([1.0, 0.5, 1.0 / 3.0], n)
    g = rng.integers(0, n_groups, n).astype(np.int64)
    return np.ascontiguousarray(q), w, g


def per_group_loop(df: pd.DataFrame, grid_points: int) -> dict[int, np.ndarray]:
    """The straightforward per-group code (approximate: F tabulated on a grid)."""
    out = {}
    cols = list(CPU_PERCENTILE_COLUMNS_SORTED)
    for key, sub in df.groupby("group", sort=False):
        qs = sub[cols].to_numpy()
        ws = sub["w"].to_numpy()
        grid = np.linspace(qs.min(), qs.max(), grid_points)
        F = np.zeros(grid_points)
        for qi, wi in zip(qs, ws, strict=False):
            F += wi * np.interp(grid, qi, LEVELS)
        out[int(key)] = np.interp(LEVELS, F / ws.sum(), grid)
    return out


def timeit(fn: Any, repeat: int) -> float:
    """Best wall time of ``repeat`` runs (the CPU time of that run is kept in ``CPU_TIMES``)."""
    best, best_cpu = np.inf, np.inf
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if wall < best:
            best, best_cpu = wall, cpu
    CPU_TIMES.append(float(best_cpu))
    return float(best)


#: Process CPU seconds of the best run of each timeit call (wall time suffers on a shared machine).
CPU_TIMES: list[float] = []


def _one_size(n: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The contenders on ``n`` windows in ``args.groups`` groups."""
    q, w, g = make_data(n, args.groups)
    rows: list[dict[str, Any]] = []

    def run_np() -> Any:
        return mixture_cpu.mixture_quantiles(q, w, g, args.groups, LEVELS)

    work = working_set(run_np)[1]  # the first call: what it allocates (and a warm-up)
    t_np = timeit(run_np, args.repeat)
    rows.append(
        {"contender": "gpuclust numpy (exact)", "seconds": t_np, "cpu_seconds": CPU_TIMES[-1], "work_mib": work}
    )

    df = pd.DataFrame(q, columns=list(CPU_PERCENTILE_COLUMNS_SORTED))
    df["w"], df["group"] = w, g
    if args.baseline_groups and args.baseline_groups < args.groups:
        sub = df[df["group"] < args.baseline_groups]
        work = working_set(lambda: per_group_loop(sub, args.grid))[1]
        t_sub = timeit(lambda: per_group_loop(sub, args.grid), 1)
        t_loop = t_sub * n / len(sub)
        CPU_TIMES[-1] *= n / len(sub)
        label = f"per-group loop (grid {args.grid}; timed on {args.baseline_groups} groups, extrapolated)"
    else:
        work = working_set(lambda: per_group_loop(df, args.grid))[1]
        t_loop = timeit(lambda: per_group_loop(df, args.grid), 1)
        label = f"per-group loop (grid {args.grid})"
    rows.append({"contender": label, "seconds": t_loop, "cpu_seconds": CPU_TIMES[-1], "work_mib": work})

    if args.gpu:
        import cupy as cp

        from gpuclust.backends import mixture_gpu

        qd, wd, gd, lv = cp.asarray(q), cp.asarray(w), cp.asarray(g), cp.asarray(LEVELS)

        def run_gpu() -> None:
            mixture_gpu.mixture_quantiles(qd, wd, gd, args.groups, lv)
            cp.cuda.Device().synchronize()

        run_gpu()
        t_gpu = timeit(run_gpu, max(args.repeat, 3))
        rows.append({"contender": "gpuclust cupy (exact)", "seconds": t_gpu, "cpu_seconds": CPU_TIMES[-1]})
        rows[-1]["work_mib"] = float("nan")  # device memory: not the process's RSS
        got = cp.asnumpy(mixture_gpu.mixture_quantiles(qd, wd, gd, args.groups, lv))
        ref = run_np()
        rel = np.nanmax(np.abs(got - ref) / np.maximum(np.abs(ref), 1e-300))
        print(f"gpu vs numpy: max relative difference {rel:.3g}")
    for r in rows:
        r.update(windows=n, groups=args.groups, windows_per_s=n / r["seconds"])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", default="250000,1000000", help="comma-separated sizes (default 250000,1000000)")
    ap.add_argument("--groups", type=int, default=10_000)
    ap.add_argument("--grid", type=int, default=2049, help="grid points of the per-group loop")
    ap.add_argument(
        "--baseline-groups",
        type=int,
        default=0,
        help="time the loop on this many groups only and extrapolate (0 = all groups)",
    )
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--gpu", action="store_true", help="also time the CuPy op (needs a device)")
    ap.add_argument("--save", action="store_true", help="write bench/results/mixture_bench.{json,md}")
    args = ap.parse_args(argv)

    rows: list[dict[str, Any]] = []
    for n in (int(float(x)) for x in args.windows.split(",")):
        got = _one_size(n, args)
        rows += got
        print(f"{n:,} windows, {args.groups:,} groups, 20 levels")
        for r in got:
            print(
                f"  {r['contender']:<75s} {r['seconds']:9.3f} s wall {r['cpu_seconds']:9.3f} s cpu"
                f"  {r['windows_per_s']:14,.0f} windows/s  {r['work_mib']:7.0f} MiB working set"
            )
        print(
            f"  speed-up of gpuclust numpy over the per-group loop: {got[1]['seconds'] / got[0]['seconds']:.1f}x wall, "
            f"{got[1]['cpu_seconds'] / got[0]['cpu_seconds']:.1f}x cpu"
        )

    if args.save:
        md = [
            f"# Mixture merge: exact per-group quantiles of 20-level windows in {args.groups:,} groups",
            "",
            f"`python bench/mixture_bench.py --windows {args.windows} --save`: best-of-{args.repeat} wall seconds "
            "(the per-group loop: one run), the data in memory; work MiB = how far the process's RSS rose above "
            "the data's during a first, untimed call (`bench/_harness.working_set`).",
            "",
            "| windows | contender | wall s | cpu s | windows/s | work MiB |",
            "|---:|---|---:|---:|---:|---:|",
        ]
        md += [
            f"| {r['windows']:,} | {r['contender']} | {r['seconds']:.3f} | {r['cpu_seconds']:.3f} | "
            f"{r['windows_per_s']:,.0f} | {r['work_mib']:,.0f} |"
            for r in rows
        ]
        md.append("")
        for i in range(0, len(rows), 2 + bool(args.gpu)):
            md.append(
                f"- {rows[i]['windows']:,} windows: speed-up over the per-group loop "
                f"{rows[i + 1]['seconds'] / rows[i]['seconds']:.1f}x wall"
            )
        publish("mixture_bench", {"args": vars(args), "rows": rows}, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
