"""Benchmark ``gpuclust synth``: usage windows per minute and peak RSS of the whole command, at
several cell sizes.

Usage::

    python bench/synth_bench.py                                    # 125, 250, 500 machines x 6 h, 2 workers
    python bench/synth_bench.py --machines 1000 --hours 6 --workers 1 --repeat 1 --name synth-1000

Each size runs ``gpuclust synth --out DIR --machines M --hours H --seed S --workers W`` in its own
process (simulate the cell, draw every usage window's 1 Hz samples, write gzipped v3 JSON shards),
``--repeat`` interleaved rounds over the sizes; the run's windows are read from the
``synth_truth.json`` it writes.  Reports medians of wall seconds, CPU seconds (user + system of
the process tree), usage windows per minute of wall time, MB written and peak RSS (summed over
the process tree, sampled every 50 ms: the workers included), so that a memory that grows with
the cell shows, and the ratios of the largest size to the smallest.  Writes
bench/results/<name>.json and .md (default name ``synth``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import publish, run_measured  # noqa: E402

#: The rate issue 2 asked of the synthesizer on 2 cores: usage windows per minute.
TARGET_WINDOWS_PER_MIN = 1_000_000


def _run(machines: int, args: argparse.Namespace, root: Path) -> dict:
    out = root / f"m{machines}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "gpuclust", "synth", "--out", str(out), "--quiet"]
    cmd += ["--machines", str(machines), "--hours", str(args.hours), "--seed", str(args.seed)]
    cmd += ["--workers", str(args.workers)]
    m = run_measured(cmd, timeout_s=args.timeout_s)
    if m.returncode != 0:
        raise SystemExit(f"synth_bench: {' '.join(cmd)} failed ({m.returncode}):\n{m.stdout_tail}")
    truth = json.loads((out / "synth_truth.json").read_text())
    nbytes = sum(p.stat().st_size for p in out.glob("*.json.gz"))
    shutil.rmtree(out, ignore_errors=True)
    windows = int(truth["usage"]["windows"])
    return {
        "machines": machines,
        "hours": args.hours,
        "workers": args.workers,
        "usage_windows": windows,
        "wall_s": round(m.wall_s, 2),
        "cpu_s": m.extra["cpu_s"],
        "peak_rss_mib": round(m.peak_rss_bytes / 2**20),
        "mb_written": round(nbytes / 1e6, 1),
    }


def _median(runs: list[dict]) -> dict:
    out = dict(runs[0])
    for k in ("wall_s", "cpu_s", "peak_rss_mib"):
        out[k] = round(statistics.median(r[k] for r in runs), 2)
    out["windows_per_min"] = round(out["usage_windows"] / out["wall_s"] * 60)
    out["rounds"] = len(runs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machines", default="125,250,500", help="comma-separated cell sizes (default 125,250,500)")
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2, help="synth's --workers (default 2)")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds over the sizes (default 3)")
    ap.add_argument("--timeout-s", type=float, default=1800.0)
    ap.add_argument("--name", default="synth", help="bench/results/<name>.json and .md")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.machines.split(",")]

    root = Path(tempfile.mkdtemp(prefix="synth-bench-"))
    runs: dict[int, list[dict]] = {m: [] for m in sizes}
    try:
        for rnd in range(args.repeat):
            for m in sizes:
                r = _run(m, args, root)
                runs[m].append(r)
                print(json.dumps({"round": rnd, **r}), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = [_median(runs[m]) for m in sizes]

    cmd = f"python bench/synth_bench.py --machines {args.machines} --hours {args.hours:g} --workers {args.workers}"
    md = [
        "# Synth benchmark: `gpuclust synth`, whole process (simulate + 1 Hz samples + gzipped v3 JSON)",
        "",
        f"Command: `{cmd} --repeat {args.repeat}`; medians of {args.repeat} interleaved round(s); CPU s = user + "
        "system of the process tree; peak RSS = the process tree's (workers included), sampled every 50 ms.",
        "",
        "| machines | hours | workers | usage windows | wall s | CPU s | windows/min | MB written (gz) | peak RSS MiB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        md.append(
            f"| {s['machines']:,} | {s['hours']:g} | {s['workers']} | {s['usage_windows']:,} | {s['wall_s']} | "
            f"{s['cpu_s']} | {s['windows_per_min']:,} | {s['mb_written']:,} | {s['peak_rss_mib']:,.0f} |"
        )
    lo, hi = summary[0], summary[-1]
    md.append("")
    if len(summary) > 1:
        md.append(
            f"- {hi['usage_windows'] / lo['usage_windows']:.1f}x the windows ({lo['machines']:,} -> "
            f"{hi['machines']:,} machines): {hi['wall_s'] / lo['wall_s']:.2f}x the wall time, "
            f"{hi['peak_rss_mib'] / lo['peak_rss_mib']:.2f}x the peak RSS"
        )
    best = max(s["windows_per_min"] for s in summary)
    met = "met" if best >= TARGET_WINDOWS_PER_MIN else "MISSED"
    md.append(
        f"- target (issue 2): at least {TARGET_WINDOWS_PER_MIN:,} usage windows per minute on 2 cores: {met} "
        f"({best:,} at best)"
    )
    publish(args.name, {"command": cmd, "runs": runs, "summary": summary}, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
