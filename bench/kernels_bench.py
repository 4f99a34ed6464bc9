"""Kernel bandwidth benchmark: each custom op against the machine's measured copy bandwidth.

    python bench/kernels_bench.py                   # on a GPU machine: the CuPy ops, 10^8 intervals
    python bench/kernels_bench.py --backend cpu --scale 0.01   # the NumPy twins (reference figures)

The issue's target for the GPU: the interval sweep (``bucket_overlap``) and the mixture merge
(``mixture_quantiles``) at >= 50% of the device's measured copy bandwidth *for the bytes they must
move*.  Definitions used here (both sides count bytes read + bytes written):

* copy bandwidth: ``dst[...] = src`` over a 1 GiB float64 array (CUDA events on the GPU), best of
  ``--repeat``; bytes = 2 x 1 GiB;
* an op's bytes: its inputs read once plus its output written once -- ``bucket_overlap``: start,
  end (8 B each), value (8 B), group (4 B) per interval + 8 B per output cell; ``grouped_sum``:
  code + value per row + 8 B per group (``bincount``, the array module's weighted
  ``bincount`` -- CuPy's: one global ``atomicAdd`` per row -- and ``gpuclust._xp.bincount``,
  grouped_sum.cu's bincount kernel on CuPy, on the same inputs, the same);
  ``grouped_comoments``: d x 8 + 8 + 8 B per row + the
  partial; ``mixture_quantiles``: 20 x 8 (percentiles) + 8 (weight) + 8 (group) B per window +
  the (groups x 20) result.  Work the op does beyond one pass (e.g. the mixture's sort) is not
  counted: the ratio is what fraction of a pure streaming copy the op achieves.

Cases cover the shapes the analyses produce: few cells with heavy contention (cell-usage's
tier x hour), many cells (overcommit's machine x 5-min bucket), all intervals in one cell; groups
of a few hundred windows (mixture per machine-hour) and of tens of thousands (per machine).  The
many-cell and many-group cases draw every row's cell at random (no two rows of a warp share one:
each atomic its own memory sector), and again with rows in runs of 30 of one cell or group, as an
instance's consecutive windows on its machine follow each other in an instance-ordered layout.

Warp aggregation: the cases marked "warp runs" run grouped_sum with ``gpu.WARP_RUNS`` (a warp's
runs of equal consecutive codes added by a segmented scan, not every lane of a code found by
``__match_any_sync``), so each pair of rows measures one aggregation against the other.

Shared against global atomics: the ops keep a block-local float64 copy of a small output in shared
memory (``backends/gpu.py``: ``SHARED_BYTES``); a shared-memory float64 ``atomicAdd`` may compile
to a compare-and-swap loop.  The cases marked "global variant forced" run the same inputs with
``SHARED_BYTES = 0`` (every add straight to global memory), so each pair of rows measures one
choice against the other on the device.  On the cpu backend they time the same NumPy code twice.
The mixture's "one block per group forced" case runs the by=tier inputs with the per-group sweep
that the tiled one replaces for few, large groups (``mixture_gpu.TILED_SWEEP = False``).
Likewise the two 7-series cases: the k series of a 2-D ``value`` swept in one launch, against one
launch per series (what the GPU wrapper did before the one-launch kernel); a series counts 8 B per
interval and 8 B per output cell.

The mixture's windows hold float32 percentile values, as the trace's do, so its events are
ordered by one ``argsort`` of packed ``uint64`` keys (``mixture_cpu.packed_event_keys``; a radix
sort on the GPU).  Two ``sort`` cases time that sort alone against a plain sort of as many random
``uint64`` keys (``xp.sort``: CUB's radix sort through CuPy); issue 34's target is the first at
>= 25% of the second's keys per second, which the Markdown states.

Writes bench/results/kernels_<backend>.{json,md} with device, versions and commit.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _harness import best_of, environment, write_results  # noqa: E402

from gpuclust._xp import bincount  # noqa: E402

US = 1_000_000
HOUR = 3600 * US


def _timer(backend: Any) -> Callable[[Callable[[], Any], int], float]:
    """Best-of-``repeat`` seconds of ``fn`` (CUDA events around each call on the GPU)."""
    if backend.name == "gpu":
        cp = backend.xp

        def gpu_time(fn: Callable[[], Any], repeat: int) -> float:
            fn()  # warm-up: compile / load the kernel
            cp.cuda.Device().synchronize()
            best = float("inf")
            for _ in range(repeat):
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record()
                fn()
                b.record()
                b.synchronize()
                best = min(best, cp.cuda.get_elapsed_time(a, b) / 1e3)
            return best

        return gpu_time

    def cpu_time(fn: Callable[[], Any], repeat: int) -> float:
        fn()
        return best_of(fn, repeat)

    return cpu_time


def copy_bandwidth(backend: Any, nbytes: int, repeat: int) -> float:
    """Bytes read + written per second by a plain array copy of ``nbytes``."""
    xp = backend.xp
    src = xp.ones(nbytes // 8, dtype=xp.float64)
    dst = xp.empty_like(src)

    def copy() -> None:
        dst[...] = src

    t = _timer(backend)(copy, repeat)
    return 2 * src.nbytes / t


@functools.cache
def _uniform(xp: Any, n: int, k: int = 0) -> Any:
    """``n`` uniform draws in [0, 1) in ``xp``'s memory, stream ``k``: drawn on the host and
    copied once per size (drawing 10^8 values per case took most of the device check's kernels
    step, before any kernel ran); the cases derive their inputs from them on the device."""
    return xp.asarray(np.random.default_rng([n, k]).random(n))


def _run_draws(xp: Any, n: int, runs: int, k: int) -> Any:
    """Uniform draws in [0, 1) a run of ``runs`` consecutive rows (``n`` rows): row ``i`` takes
    its run's draw (stream ``k``)."""
    return _uniform(xp, -(-n // runs), k)[xp.arange(n) // runs]


def _intervals(
    xp: Any, n: int, n_groups: int, n_buckets: int, width: int, contention: bool, runs: int = 0
) -> dict[str, Any]:
    """``n`` intervals of 300 s starting uniformly over ``n_buckets`` buckets of ``width``, in
    ``n_groups`` groups (``contention``: every one in the first bucket of group 0; ``runs``: in
    runs of that many consecutive 300 s windows of one group, as an instance's windows on its
    machine follow each other in an instance-ordered layout)."""
    if runs:
        i = xp.arange(n, dtype=xp.int64)
        first = (_run_draws(xp, n, runs, 0) * ((n_buckets - runs) * width)).astype(xp.int64)
        start = first + (i % runs) * (300 * US)
        group = (_run_draws(xp, n, runs, 1) * n_groups).astype(xp.int32)
        return {"start": start, "end": start + 300 * US, "value": _uniform(xp, n, 2), "group": group}
    if contention:
        start = xp.full(n, width // 4, dtype=xp.int64)
        return {
            "start": start,
            "end": xp.full(n, width // 2, dtype=xp.int64),
            "value": _uniform(xp, n, 2),
            "group": xp.zeros(n, dtype=xp.int32),
        }
    start = (_uniform(xp, n, 0) * (n_buckets * width)).astype(xp.int64)
    group = (_uniform(xp, n, 1) * n_groups).astype(xp.int32)
    return {"start": start, "end": start + 300 * US, "value": _uniform(xp, n, 2), "group": group}


def cases(scale: float) -> list[dict[str, Any]]:
    n = max(1000, int(1e8 * scale))
    nm = max(1000, int(1e7 * scale))
    return [
        {
            "op": "bucket_overlap",
            "name": "tier x hour (5 x 744, shared-memory variant)",
            "n": n,
            "n_groups": 5,
            "n_buckets": 744,
            "width": HOUR,
            "contention": False,
        },
        {
            "op": "bucket_overlap",
            "name": "machine x 5 min (12,500 x 8,928 at scale 1, global variant)",
            "n": n,
            "n_groups": max(10, int(12_500 * min(scale, 1.0))),
            "n_buckets": 8_928,
            "width": 300 * US,
            "contention": False,
        },
        {
            "op": "bucket_overlap",
            "name": "machine x 5 min, windows in runs of 30 of one instance (an instance-ordered layout)",
            "n": n,
            "n_groups": max(10, int(12_500 * min(scale, 1.0))),
            "n_buckets": 8_928,
            "width": 300 * US,
            "contention": False,
            "runs": 30,
        },
        {
            "op": "bucket_overlap",
            "name": "tier x hour (5 x 744), global variant forced",
            "n": n,
            "n_groups": 5,
            "n_buckets": 744,
            "width": HOUR,
            "contention": False,
            "force_global": True,
        },
        {
            "op": "bucket_overlap",
            "name": "all intervals in one cell (contention)",
            "n": n,
            "n_groups": 1,
            "n_buckets": 4,
            "width": HOUR,
            "contention": True,
        },
        {
            "op": "bucket_overlap",
            "name": "all intervals in one cell (contention), global variant forced",
            "n": n,
            "n_groups": 1,
            "n_buckets": 4,
            "width": HOUR,
            "contention": True,
            "force_global": True,
        },
        {
            "op": "bucket_overlap",
            "name": "7 series in one launch (overcommit's whole-bucket sweep, 1,000 x 288)",
            "n": n // 4,
            "n_groups": 1_000,
            "n_buckets": 288,
            "width": 300 * US,
            "contention": False,
            "series": 7,
        },
        {
            "op": "bucket_overlap",
            "name": "7 series, one launch per series (the same inputs)",
            "n": n // 4,
            "n_groups": 1_000,
            "n_buckets": 288,
            "width": 300 * US,
            "contention": False,
            "series": 7,
            "per_series": True,
        },
        {"op": "grouped_sum", "name": "10^5 groups", "n": n, "n_groups": 100_000},
        {
            "op": "grouped_sum",
            "name": "10^5 groups, rows in runs of 30 (an instance's windows)",
            "n": n,
            "n_groups": 100_000,
            "runs": 30,
        },
        {"op": "grouped_sum", "name": "1,000 groups (shared-memory variant)", "n": n, "n_groups": 1_000},
        {
            "op": "grouped_sum",
            "name": "1,000 groups, global variant forced",
            "n": n,
            "n_groups": 1_000,
            "force_global": True,
        },
        {"op": "grouped_sum", "name": "16 groups (shared-memory variant; a tier per group)", "n": n, "n_groups": 16},
        {"op": "grouped_sum", "name": "10^5 groups, warp runs", "n": n, "n_groups": 100_000, "warp_runs": True},
        {
            "op": "grouped_sum",
            "name": "10^5 groups, rows in runs of 30, warp runs",
            "n": n,
            "n_groups": 100_000,
            "runs": 30,
            "warp_runs": True,
        },
        {"op": "grouped_sum", "name": "16 groups, warp runs", "n": n, "n_groups": 16, "warp_runs": True},
        {
            "op": "bincount",
            "name": "16 bins: the array module's weighted bincount (usage-vs-request's tier sums)",
            "n": n,
            "n_groups": 16,
        },
        {"op": "bincount", "name": "1,000 bins: the array module's weighted bincount", "n": n, "n_groups": 1_000},
        {
            "op": "bincount",
            "name": "4 bins, rows sorted by bin: the array module's (usage-distribution's level step by tier)",
            "n": n // 10,
            "n_groups": 4,
            "sorted": True,
        },
        {
            "op": "bincount",
            "via": "_xp",
            "name": "16 bins: gpuclust._xp.bincount (grouped_sum.cu)",
            "n": n,
            "n_groups": 16,
        },
        {"op": "bincount", "via": "_xp", "name": "1,000 bins: gpuclust._xp.bincount", "n": n, "n_groups": 1_000},
        {
            "op": "bincount",
            "via": "_xp",
            "name": "4 bins, rows sorted by bin: gpuclust._xp.bincount",
            "n": n // 10,
            "n_groups": 4,
            "sorted": True,
        },
        {"op": "grouped_comoments", "name": "d=2, 12,500 groups (cpi by machine)", "n": n, "n_groups": 12_500, "d": 2},
        {
            "op": "grouped_comoments",
            "name": "d=2, 12,500 groups, rows in runs of 30 (an instance's windows on its machine)",
            "n": n,
            "n_groups": 12_500,
            "d": 2,
            "runs": 30,
        },
        {
            "op": "sort",
            "name": "the mixture's event sort: argsort of packed (group, float32 value) keys, ~300 windows per group",
            "n": nm // 2,
            "n_groups": max(1, nm // 600),
        },
        {"op": "sort", "name": "plain sort of as many random uint64 keys", "n": nm // 2, "n_groups": 0, "plain": True},
        {"op": "mixture_quantiles", "name": "~300 windows per group", "n": nm, "n_groups": max(1, nm // 300)},
        {"op": "mixture_quantiles", "name": "~30,000 windows per group", "n": nm, "n_groups": max(1, nm // 30_000)},
        {"op": "mixture_quantiles", "name": "5 groups (by=tier): tiled sweep", "n": nm // 2, "n_groups": 5},
        {"op": "mixture_quantiles", "name": "1 group (by=cell): tiled sweep", "n": nm // 2, "n_groups": 1},
        {  # last: the slowest case, the one a time limit may cut
            "op": "mixture_quantiles",
            "name": "5 groups (by=tier), one block per group forced",
            "n": nm // 2,
            "n_groups": 5,
            "tiled": False,
        },
    ]


@contextlib.contextmanager
def _variant(c: dict[str, Any]) -> Iterator[None]:
    """Inside: the GPU ops use their global-memory variant if the case forces it (``SHARED_BYTES``
    set to 0), grouped_sum the warp aggregation it names (``WARP_RUNS``), and the mixture the
    sweep it names (``TILED_SWEEP``); all restored after."""
    from gpuclust.backends import gpu, mixture_gpu

    saved = gpu.SHARED_BYTES, mixture_gpu.TILED_SWEEP, gpu.WARP_RUNS
    if c.get("force_global"):
        gpu.SHARED_BYTES = 0
    if "tiled" in c:
        mixture_gpu.TILED_SWEEP = c["tiled"]
    gpu.WARP_RUNS = bool(c.get("warp_runs", gpu.WARP_RUNS))
    try:
        yield
    finally:
        gpu.SHARED_BYTES, mixture_gpu.TILED_SWEEP, gpu.WARP_RUNS = saved


@functools.cache
def _window_percentiles(n: int) -> np.ndarray:
    """``n`` windows' 20 sorted CPU percentiles, float32 values held as float64 (as the trace's),
    30% of them idle below the median; drawn once per ``n`` (several seconds at 10^7 windows,
    which a device check's time limit would otherwise spend on the host before each case)."""
    rng = np.random.default_rng(n)
    q = np.sort(rng.gamma(0.6, 0.05, (n, 20)).astype(np.float32), axis=1).astype(np.float64)
    q[rng.random(n) < 0.3, :8] = 0.0
    q.flags.writeable = False
    return q


def run_case(backend: Any, c: dict[str, Any], repeat: int, rng: np.random.Generator) -> dict[str, Any]:
    xp, ops = backend.xp, backend.ops
    op, n, G = c["op"], c["n"], c["n_groups"]
    if op == "bucket_overlap":
        d = _intervals(xp, n, G, c["n_buckets"], c["width"], c["contention"], c.get("runs", 0))
        k = c.get("series", 1)
        if k > 1:  # k value series over the same intervals: one 2-D sweep
            d["value"] = _uniform(xp, k * n, 3).reshape(k, n)
        kw = dict(n_groups=G, n_buckets=c["n_buckets"], origin=0, width=c["width"])

        def fn() -> Any:
            if c.get("per_series"):  # the same series, one 1-D sweep (launch) each
                return [ops.bucket_overlap(d["start"], d["end"], d["value"][j], d["group"], **kw) for j in range(k)]
            return ops.bucket_overlap(d["start"], d["end"], d["value"], d["group"], **kw)

        nbytes = n * (8 + 8 + 4 + 8 * k) + k * G * c["n_buckets"] * 8
    elif op in ("grouped_sum", "bincount"):
        codes = ((_run_draws(xp, n, c["runs"], 0) if "runs" in c else _uniform(xp, n, 0)) * G).astype(xp.int64)
        if c.get("sorted"):
            codes = xp.sort(codes)
        vals = _uniform(xp, n, 2)

        def fn() -> Any:
            if op == "bincount" and c.get("via") == "_xp":
                return bincount(xp, codes, weights=vals, minlength=G)
            if op == "bincount":
                return xp.bincount(codes, weights=vals, minlength=G)
            return ops.grouped_sum(codes, vals, n_groups=G)

        nbytes = n * 16 + G * 8
    elif op == "grouped_comoments":
        dd = c["d"]
        x = xp.ascontiguousarray(xp.stack([_uniform(xp, n, j) for j in range(dd)], axis=1))
        w = 0.1 + 299.9 * _uniform(xp, n, 2)
        g = ((_run_draws(xp, n, c["runs"], 4) if "runs" in c else _uniform(xp, n, 4)) * G).astype(xp.int64)

        def fn() -> Any:
            return ops.grouped_comoments(x, w, g, G)

        nbytes = n * (dd * 8 + 16) + G * (8 + 8 + dd * 8 + dd * dd * 8)
    elif op == "sort":
        from gpuclust.backends.mixture_cpu import packed_event_keys

        if c.get("plain"):
            keys = xp.asarray(rng.integers(0, 2**63, n * 20, dtype=np.int64).astype(np.uint64))

            def fn() -> Any:
                return xp.sort(keys)

            nbytes = n * 20 * 16  # keys read and written
        else:
            x = xp.asarray(_window_percentiles(n).reshape(-1))
            eg = xp.asarray(np.repeat(np.sort(rng.integers(0, G, n)).astype(np.int64), 20))
            packed = packed_event_keys(xp, x, eg, G)
            assert packed is not None  # float32 values: one packed key each

            def fn() -> Any:
                return xp.argsort(packed)

            nbytes = n * 20 * 16  # keys read, indices written
        n = n * 20  # keys
    elif op == "mixture_quantiles":
        q = _window_percentiles(n)
        qd = xp.asarray(np.ascontiguousarray(q))
        w = xp.asarray(300.0 * rng.choice([1.0, 0.5, 1.0 / 3.0], n))
        g = xp.asarray(np.sort(rng.integers(0, G, n)).astype(np.int64))
        from gpuclust.schema import CPU_PERCENTILE_LEVELS_SORTED

        lv = xp.asarray(np.asarray(CPU_PERCENTILE_LEVELS_SORTED, dtype=np.float64))

        def fn() -> Any:
            return ops.mixture_quantiles(qd, w, g, G, lv)

        nbytes = n * (20 * 8 + 16) + G * 20 * 8
    else:
        raise ValueError(op)
    with _variant(c):
        t = _timer(backend)(fn, repeat)
    return {
        "op": op,
        **({"plain": True} if c.get("plain") else {}),
        "case": c["name"],
        "n": n,
        "n_groups": G,
        "seconds": t,
        "bytes": nbytes,
        "gb_per_s": nbytes / t / 1e9,
        "items_per_s": n / t,
    }


def _write(
    name: str, args: Any, copy: float, rows: list[dict[str, Any]], env: dict[str, Any]
) -> tuple[Any, Any, list[str]]:
    """bench/results/<name>.{json,md} of the rows so far; returns both paths and the Markdown."""
    md = [
        f"# Kernel bandwidth ({args.backend} backend; {env['gpu'] or env['cpu']})",
        "",
        f"Copy bandwidth (read + write, {args.copy_gib:g} GiB float64 copy): **{copy / 1e9:.1f} GB/s**",
        "",
        "| op | case | n | groups | s | items/s | GB/s (bytes it must move) | of copy bandwidth |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        md.append(
            f"| {r['op']} | {r['case']} | {r['n']:,} | {r['n_groups']:,} | {r['seconds']:.4f} | "
            f"{r['items_per_s']:,.0f} | {r['gb_per_s']:.1f} | {100 * r['fraction_of_copy']:.0f}% |"
        )
    sorts = {bool(r.get("plain")): r for r in rows if r["op"] == "sort"}
    if len(sorts) == 2:
        share = sorts[False]["items_per_s"] / sorts[True]["items_per_s"]
        md += [
            "",
            f"The mixture's event sort runs at **{100 * share:.0f}%** of the plain sort's keys per second (target >= 25%).",
        ]
    md += [
        "",
        "Bytes: inputs read once + output written once (see the script's docstring); target on a "
        "GPU: bucket_overlap and mixture_quantiles >= 50% of the copy bandwidth.",
        "",
        "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()),
        "",
    ]
    jp, mp = write_results(
        name,
        {"benchmark": "kernels", "backend": args.backend, "copy_bytes_per_s": copy, "rows": rows, "environment": env},
        "\n".join(md),
    )
    return jp, mp, md


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="gpu", choices=("cpu", "gpu"))
    ap.add_argument(
        "--scale", type=float, default=1.0, help="multiply the default sizes (10^8 intervals, 10^7 windows)"
    )
    ap.add_argument("--copy-gib", type=float, default=1.0, help="size of the copy-bandwidth array, GiB")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", default="", help="comma-separated op names to run (default: all)")
    ap.add_argument("--name", default=None, help="results file name (default kernels_<backend>)")
    args = ap.parse_args(argv)

    from gpuclust.backends import BackendUnavailable, get_backend

    try:
        be = get_backend(args.backend)
    except BackendUnavailable as e:
        print(f"kernels_bench: {e}", file=sys.stderr)
        return 2
    copy = copy_bandwidth(be, int(args.copy_gib * 2**30), args.repeat)
    print(f"copy bandwidth (read + write): {copy / 1e9:.1f} GB/s", flush=True)
    rng = np.random.default_rng(0)
    only = set(filter(None, args.only.split(",")))
    rows: list[dict[str, Any]] = []
    env = environment()
    name = args.name or f"kernels_{args.backend}"
    jp, mp, md = _write(name, args, copy, rows, env)
    for c in cases(args.scale):
        if only and c["op"] not in only:
            continue
        r = run_case(be, c, args.repeat, rng)
        r["fraction_of_copy"] = r["gb_per_s"] * 1e9 / copy
        rows.append(r)
        print(json.dumps(r), flush=True)
        # written after every case: a run cut by a time limit leaves the cases it finished
        jp, mp, md = _write(name, args, copy, rows, env)
    print("\n".join(md))
    print(f"wrote {jp} and {mp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
