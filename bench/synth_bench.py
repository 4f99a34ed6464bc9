"""Benchmark ``gpuclust synth``: end-to-end usage windows per minute (simulate + write gzipped JSON).

Usage::

    python bench/synth_bench.py --machines 1000 --hours 6 [--workers 2] [--out DIR] [--json results.json]

Prints one line per phase (from synth's progress) and a summary with windows/min, bytes written
and the phase split (simulation vs usage generation + formatting + compression).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machines", type=int, default=1000)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compresslevel", type=int, default=1)
    ap.add_argument("--workers", type=int, default=1, help="processes generating/formatting usage blocks")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default: a temporary one, removed)")
    ap.add_argument("--json", type=Path, default=None, help="append the result as one JSON line")
    args = ap.parse_args(argv)

    from gpuclust import __version__
    from gpuclust.synth import SynthConfig, synthesize

    out = args.out or Path(tempfile.mkdtemp(prefix="synth-bench-"))
    marks: list[tuple[float, str]] = []
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        marks.append((time.perf_counter() - t0, msg))
        print(f"[{marks[-1][0]:7.1f}s] {msg}", file=sys.stderr, flush=True)

    cfg = SynthConfig(
        machines=args.machines, hours=args.hours, seed=args.seed, compresslevel=args.compresslevel, workers=args.workers
    )
    res = synthesize(cfg, out, progress=progress)
    wall = time.perf_counter() - t0
    sim_s = next((t for t, m in marks if m.startswith("simulated")), float("nan"))
    windows = res.truth["usage"]["windows"]
    nbytes = sum(p.stat().st_size for ps in res.shards.values() for p in ps)
    result = {
        "benchmark": "synth",
        "machines": args.machines,
        "hours": args.hours,
        "seed": args.seed,
        "workers": args.workers,
        "usage_windows": windows,
        "wall_s": round(wall, 2),
        "simulation_s": round(sim_s, 2),
        "windows_per_min": round(windows / wall * 60),
        "bytes_written": nbytes,
        "instance_events": res.truth["counts"]["instance_events"]["rows"],
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "gpuclust": __version__,
        "machine": platform.machine(),
        "node": platform.node(),
    }
    print(json.dumps(result))
    print(
        f"{windows:,} usage windows in {wall:.1f} s = {windows / wall * 60:,.0f} windows/min "
        f"(simulation {sim_s:.1f} s; {nbytes / 1e6:,.1f} MB gzipped)"
    )
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps(result) + "\n")
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
