"""A/B benchmark: ``gpuclust analyze`` from two commits, whole processes, interleaved.

    python bench/ab_bench.py --base 9b9b70b --analyses overcommit --sizes 4e6,1.6e7 --rounds 5 --name NAME
    python bench/ab_bench.py --base HEAD~1 --analyses machine-shapes --sizes 1e6 --layout bucketed --name NAME

Each round runs every (size, analysis) once from the ``--base`` commit (checked out into a
temporary git worktree, imported through ``PYTHONPATH`` ahead of the installed package) and once
from this working tree, in alternating order, so that a noisy machine affects both alike.  Reported:
the medians of wall seconds, CPU seconds and peak RSS of the process tree, and the ratio of this
tree's medians to the base's.  Same dataset (bench/data, as every benchmark), same options, same
cores.

Writes bench/results/<name>.{json,md} with the environment and both commits.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import bench_dataset, publish, run_measured  # noqa: E402


def _rev(rev: str) -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=HERE.parent, capture_output=True, text=True, check=True
    ).stdout.strip()


def _run(root: Path, ds: Path, analysis: str, out: Path) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(root)}
    m = run_measured(
        [
            sys.executable,
            "-m",
            "gpuclust.cli",
            "analyze",
            str(ds),
            analysis,
            "--out",
            str(out),
            "--no-plots",
            "--quiet",
        ],
        env=env,
    )
    if m.returncode != 0:
        raise SystemExit(f"{analysis} on {ds} from {root} failed:\n{m.stdout_tail}")
    return {"wall_s": m.wall_s, "cpu_s": m.extra["cpu_s"], "rss_mib": m.peak_rss_bytes / 2**20}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the commit to compare this working tree with")
    ap.add_argument("--analyses", required=True, help="comma-separated analysis names")
    ap.add_argument("--sizes", default="4e6", help="comma-separated window counts of the bench datasets")
    ap.add_argument("--layout", choices=["flat", "bucketed"], default="flat")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--name", required=True, help="results file name (bench/results/<name>.*)")
    args = ap.parse_args(argv)
    base = _rev(args.base)
    head = _rev("HEAD")
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    names = args.analyses.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="ab-bench-"))
    tree = tmp / "base"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), base], cwd=HERE.parent, check=True)
    runs: dict[tuple[int, str, str], list[dict[str, Any]]] = {}
    try:
        for r in range(args.rounds):
            for size in sizes:
                ds = bench_dataset(size)
                if args.layout == "bucketed":
                    ds = ds.with_name(ds.name + "-bucketed")
                for a in names:
                    order = [("base", tree), ("this", HERE.parent)]
                    for side, root in order if r % 2 == 0 else order[::-1]:
                        runs.setdefault((size, a, side), []).append(_run(root, ds, a, tmp / "out"))
                        print(f"round {r + 1}: {a} at {size:.3g} ({side}) {runs[(size, a, side)][-1]}", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=HERE.parent, check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    for size in sizes:
        for a in names:
            med = {
                side: {
                    k: statistics.median(x[k] for x in runs[(size, a, side)]) for k in ("wall_s", "cpu_s", "rss_mib")
                }
                for side in ("base", "this")
            }
            rows.append(
                {
                    "size": size,
                    "analysis": a,
                    **{f"{side}_{k}": v for side, m in med.items() for k, v in m.items()},
                    **{f"ratio_{k}": med["this"][k] / med["base"][k] for k in ("wall_s", "cpu_s", "rss_mib")},
                }
            )
    md = [
        f"# A/B: {', '.join(names)} at this tree ({head} + working tree) against {base}",
        "",
        f"`python bench/ab_bench.py --base {args.base} --analyses {args.analyses} --sizes {args.sizes} "
        f"--layout {args.layout} --rounds {args.rounds} --name {args.name}`: whole `gpuclust analyze` processes, "
        f"{args.rounds} interleaved rounds, medians; ratio = this / base.",
        "",
        "| windows | analysis | base wall s | this wall s | wall ratio | base CPU s | this CPU s | CPU ratio "
        "| base RSS MiB | this RSS MiB |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in rows:
        md.append(
            f"| {x['size']:.3g} | {x['analysis']} | {x['base_wall_s']:.2f} | {x['this_wall_s']:.2f} | "
            f"**{x['ratio_wall_s']:.2f}** | {x['base_cpu_s']:.2f} | {x['this_cpu_s']:.2f} | {x['ratio_cpu_s']:.2f} | "
            f"{x['base_rss_mib']:.0f} | {x['this_rss_mib']:.0f} |"
        )
    publish(
        args.name,
        {
            "base": base,
            "head": head,
            "layout": args.layout,
            "rounds": args.rounds,
            "rows": rows,
            "runs": {f"{s}|{a}|{side}": v for (s, a, side), v in runs.items()},
        },
        md,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
