"""Grouped weighted co-moments (the ``cpi`` analysis core) vs pandas and DuckDB; prints rows/s.

    python bench/moments_bench.py                 # 1e6 and 1e7 rows x 1e3 and 1e5 groups
    python bench/moments_bench.py --rows 1000000 --groups 1000 --repeat 5
    python bench/moments_bench.py --write         # also write bench/results/moments.{json,md}

Workload: d = 3 variables (CPI, machine utilisation, co-located tasks) plus CPU-second weights
and an int64 group code, the shape of ``CPI ~ util + ntasks`` per group.  Contenders:

* ``gpuclust-numpy``: ``backends.moments_cpu.grouped_comoments`` (corrected two-pass, the
  mergeable (n, W, mean, C) partial) + ``stats.wls_from_moments`` finalize;
* ``gpuclust-gpu``: the CuPy op (only when CuPy and a device are present; synchronised);
* ``pandas-wsums``: ``groupby().sum()`` of w, w*x, w*x*y -- the raw-sums formulation (fast but
  numerically unstable; what people write by hand);
* ``pandas-cov``: unweighted ``groupby().mean()`` + ``groupby().cov()`` (only for <= 1e3 groups:
  pandas computes cov group by group -- 36 s for 1e6 rows in 1e5 groups on the 2-core dev box);
* ``duckdb-sql``: one GROUP BY with ``regr_slope``, ``regr_intercept``, ``regr_r2``, ``corr``
  (unweighted) and weighted sums, one DuckDB thread per usable core.

Timings are best-of-``--repeat`` wall times of the computation only (data already in memory);
``work MiB``: how far the process's RSS rose above the data's during the first call, before the
timed ones (``bench/_harness.working_set``; a first call, so that what DuckDB keeps in its buffer
cache between calls counts).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import publish, working_set  # noqa: E402

from gpuclust.analyses.cpi.correlation import pearson_from_moments  # noqa: E402
from gpuclust.analyses.cpi.regression import wls_from_moments  # noqa: E402
from gpuclust.backends.moments_cpu import grouped_comoments  # noqa: E402


def make(n: int, G: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    util = rng.beta(4, 3, n)
    nt = rng.poisson(20, n).astype(np.float64)
    cpi = 1.3 * (1 + 0.003 * nt + 0.15 * util) + 0.3 * rng.standard_normal(n)
    return {
        "g": rng.integers(0, G, n).astype(np.int64),
        "cpi": cpi,
        "util": util,
        "nt": nt,
        "w": rng.uniform(0.1, 300.0, n),
    }


def best(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_numpy(d: dict[str, np.ndarray], G: int) -> Callable[[], Any]:
    x = np.ascontiguousarray(np.column_stack([d["cpi"], d["util"], d["nt"]]))
    w, g = d["w"], d["g"]

    def run() -> Any:
        m = grouped_comoments(x, w, g, G)
        return wls_from_moments(m, 0, [1, 2]), pearson_from_moments(m, 0, 1)

    return run


def bench_gpu(d: dict[str, np.ndarray], G: int) -> Callable[[], Any] | None:
    from gpuclust.backends import BackendUnavailable, gpu, moments_gpu

    try:
        cp = gpu.require()
    except BackendUnavailable as e:  # no GPU here: say why; any other failure is raised
        if os.environ.get("GPUCLUST_REQUIRE_GPU") == "1":
            raise
        print(f"gpuclust-gpu skipped: {e}", flush=True)
        return None
    x = cp.asarray(np.ascontiguousarray(np.column_stack([d["cpi"], d["util"], d["nt"]])))
    w, g = cp.asarray(d["w"]), cp.asarray(d["g"])

    def run() -> Any:
        m = moments_gpu.grouped_comoments(x, w, g, G)
        cp.cuda.Stream.null.synchronize()
        return m

    run()  # compile + warm up
    return run


def bench_pandas_wsums(d: dict[str, np.ndarray]) -> Callable[[], Any]:
    import pandas as pd

    w, y, u, t = d["w"], d["cpi"], d["util"], d["nt"]

    def run() -> Any:  # the products are part of the work (timed)
        df = pd.DataFrame(
            {
                "g": d["g"],
                "w": w,
                "wy": w * y,
                "wu": w * u,
                "wt": w * t,
                "wyy": w * y * y,
                "wuu": w * u * u,
                "wtt": w * t * t,
                "wyu": w * y * u,
                "wyt": w * y * t,
                "wut": w * u * t,
            }
        )
        return df.groupby("g", sort=True).sum()

    return run


def bench_pandas_cov(d: dict[str, np.ndarray]) -> Callable[[], Any]:
    import pandas as pd

    df = pd.DataFrame({"g": d["g"], "cpi": d["cpi"], "util": d["util"], "nt": d["nt"]})

    def run() -> Any:
        gb = df.groupby("g", sort=True)
        return gb.mean(), gb.cov()

    return run


def bench_duckdb(d: dict[str, np.ndarray]) -> Callable[[], Any]:
    import duckdb
    import pyarrow as pa

    con = duckdb.connect()
    con.execute(f"SET threads = {len(os.sched_getaffinity(0))}")
    con.register("t", pa.table(d))
    sql = """
        SELECT g, count(*) AS n, sum(w) AS W,
               sum(w * cpi) / sum(w) AS cpi_wmean,
               sum(w * cpi * cpi) AS s_yy, sum(w * cpi * util) AS s_yu, sum(w * cpi * nt) AS s_yt,
               sum(w * util * util) AS s_uu, sum(w * util * nt) AS s_ut, sum(w * nt * nt) AS s_tt,
               regr_slope(cpi, util) AS slope_util, regr_intercept(cpi, util) AS icpt,
               regr_r2(cpi, util) AS r2, corr(cpi, nt) AS r_cpi_nt
        FROM t GROUP BY g ORDER BY g
    """

    def run() -> Any:
        rel = con.sql(sql)
        fetch = getattr(rel, "to_arrow_table", None) or rel.arrow  # duckdb >= 1.4 / older
        return fetch()

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="*", default=[1_000_000, 10_000_000])
    ap.add_argument("--groups", type=int, nargs="*", default=[1_000, 100_000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="write bench/results/moments.{json,md}")
    args = ap.parse_args(argv)

    results: list[dict[str, Any]] = []
    print(f"{'rows':>10} {'groups':>8} {'contender':<16} {'seconds':>9} {'Mrows/s':>9} {'work MiB':>9}")
    for n in args.rows:
        for G in args.groups:
            d = make(n, G)
            contenders: list[tuple[str, Callable[[], Any] | None]] = [
                ("gpuclust-numpy", bench_numpy(d, G)),
                ("gpuclust-gpu", bench_gpu(d, G)),
                ("pandas-wsums", bench_pandas_wsums(d)),
                ("pandas-cov", bench_pandas_cov(d) if G <= 1_000 else None),
                ("duckdb-sql", bench_duckdb(d)),
            ]
            for name, fn in contenders:
                if fn is None:
                    print(f"{n:>10} {G:>8} {name:<16} {'-':>9} {'skipped':>9}")
                    continue
                rep = args.repeat if n <= 2_000_000 else max(1, args.repeat - 1)
                _, work = working_set(fn)  # the first call: what it allocates, caches included (and a warm-up)
                s = best(fn, rep)
                results.append(
                    {"rows": n, "groups": G, "contender": name, "seconds": s, "rows_per_s": n / s, "work_mib": work}
                )
                print(f"{n:>10} {G:>8} {name:<16} {s:>9.3f} {n / s / 1e6:>9.1f} {work:>9.0f}", flush=True)
            del d
    if args.write:
        md = [
            "# Grouped weighted co-moments (cpi's core) against pandas and DuckDB",
            "",
            "`python bench/moments_bench.py --write`: best-of-repeat wall seconds of the computation, the data in "
            "memory; work MiB = how far the process's RSS rose above the data's during the first call (untimed).",
            "",
            "| rows | groups | contender | s | Mrows/s | work MiB |",
            "|---:|---:|---|---:|---:|---:|",
        ]
        md += [
            f"| {r['rows']:,} | {r['groups']:,} | {r['contender']} | {r['seconds']:.3f} | "
            f"{r['rows_per_s'] / 1e6:.1f} | {r['work_mib']:,.0f} |"
            for r in results
        ]
        publish("moments", {"results": results}, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
