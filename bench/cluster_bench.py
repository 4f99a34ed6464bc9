"""A dask cluster run against the local one: equal results, and a client whose memory does not grow
with the windows.

    python bench/cluster_bench.py --sizes 4e6,1.6e7 --repeat 2

For each size (the canonical dataset laid out by key, as ingest leaves it), the command users run,
``gpuclust analyze DS <all 13 analyses> --out DIR --no-plots``, runs once in-process (``local``)
and once on a ``distributed.LocalCluster`` of two worker processes (``--scheduler local:2``),
interleaved, ``--repeat`` times each.  The partition tasks, the merge tree and the finalize run
on the workers, which write the result tables into DIR (the parted tables, per machine, by their
shard tasks; the others by the task that finalizes them, gpuclust/engine/finish.py); the client
plans, builds contexts, builds the parted analyses' small tables and writes summary.txt and
_run.json.

Each run is a child process that calls the CLI's ``main`` and reports its own peak RSS (VmHWM:
the client alone; the workers are other processes, their peak sampled with the process tree's).
The table gives the medians of the whole process' wall time, the client's peak RSS and the
process tree's, and whether the cluster's result tables equal the local run's (every table of
every analysis, read back from DIR; floats to 1e-9 relative, the merge orders differ).  Target
(issue 34): the client's peak RSS flat (<= 1.2x) as the windows grow 4x.  Writes
bench/results/cluster.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _harness import bench_dataset, environment, peak_rss_mib, publish, run_measured  # noqa: E402
from scale_bench import bucketed  # noqa: E402

FLAT = 1.2
MODES = ("local", "local:2")


def child(mode: str, ds: Path, out: Path, options: list[str]) -> None:
    from gpuclust.analyses.registry import names
    from gpuclust.cli import main as cli

    args = [
        "analyze",
        str(ds),
        *names(),
        "--out",
        str(out),
        "--no-plots",
        "--quiet",
        *(a for o in options for a in ("-O", o)),
    ]
    if mode != "local":
        args += ["--scheduler", mode]
    rc = cli(args)
    print("RESULT " + json.dumps({"rc": rc, "client_hwm_mib": peak_rss_mib()}), flush=True)


def same_results(a: Path, b: Path, rtol: float = 1e-9) -> tuple[bool, list[str]]:
    """Whether two ``gpuclust analyze`` outputs hold the same tables (sorted rows; floats to
    ``rtol``); the tables that differ."""
    import numpy as np
    import pandas as pd

    diff = []
    tables = sorted(
        {p.relative_to(a).as_posix() for p in a.glob("*/*.parquet")}
        | {p.relative_to(a).as_posix() for p in a.glob("*/*") if p.is_dir()}
    )
    for rel in tables:
        x, y = pd.read_parquet(a / rel), pd.read_parquet(b / rel) if (b / rel).exists() else None
        if y is None or list(x.columns) != list(y.columns) or len(x) != len(y):
            diff.append(rel)
            continue
        keys = list(x.columns)
        x = x.sort_values(keys, kind="stable", ignore_index=True)
        y = y.sort_values(keys, kind="stable", ignore_index=True)
        for c in x.columns:
            u, v = x[c].to_numpy(), y[c].to_numpy()
            if u.dtype.kind == "f":
                ok = np.allclose(u, v, rtol=rtol, atol=0.0, equal_nan=True)
            else:
                ok = bool((u == v).all()) if u.dtype.kind != "O" else list(u) == list(v)
            if not ok:
                diff.append(f"{rel}:{c}")
                break
    return not diff, diff


def _one(mode: str, ds: Path, out: Path, options: list[str]) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    m = run_measured(
        [sys.executable, __file__, "--child", mode, str(ds), str(out), *(a for o in options for a in ("-O", o))]
    )
    line = next((ln for ln in m.stdout_tail.splitlines() if ln.startswith("RESULT ")), None)
    if m.returncode != 0 or line is None or json.loads(line[7:])["rc"] != 0:
        print(m.stdout_tail[-3000:], flush=True)
        raise SystemExit(f"gpuclust analyze ({mode}) on {ds} failed (exit {m.returncode})")
    res = json.loads(line[7:])
    # the tree holds the client: its exact high-water mark is a floor of the tree's sampled peak (a
    # 50 ms sampler misses short peaks: an in-process run sampled 2 MiB below its own VmHWM)
    return {**res, "wall_s": m.wall_s, "tree_peak_mib": max(m.peak_rss_bytes / 2**20, res["client_hwm_mib"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4e6,1.6e7")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each mode, interleaved")
    ap.add_argument("--name", default="cluster")
    ap.add_argument(
        "-O",
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an analysis option for both modes (as gpuclust analyze -O), e.g. strategy=bounded: "
        "usage-distribution's default (auto) is exact up to 5e6 windows and bounded above, so without "
        "it the sizes on either side of that budget compare two strategies",
    )
    ap.add_argument("--child", nargs=3, metavar=("MODE", "DATASET", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], Path(args.child[1]), Path(args.child[2]), args.option)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in [int(float(s)) for s in args.sizes.split(",")]:
            ds = bucketed(bench_dataset(size), takes_out=True)
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
            for _ in range(args.repeat):
                for mode in MODES:
                    runs[mode].append(_one(mode, ds, Path(tmp) / mode.replace(":", "-"), args.option))
            equal, diff = same_results(Path(tmp) / "local", Path(tmp) / "local-2")
            med = {
                m: {f: statistics.median(r[f] for r in v) for f in ("wall_s", "client_hwm_mib", "tree_peak_mib")}
                for m, v in runs.items()
            }
            rows.append({"size": size, "runs": runs, "median": med, "equal": equal, "differ": diff})
            print(json.dumps({"size": size, "median": med, "equal": equal}), flush=True)
    for r in rows:
        r["client_growth"] = r["median"]["local:2"]["client_hwm_mib"] / rows[0]["median"]["local:2"]["client_hwm_mib"]
    env = environment()
    md = [
        f"# gpuclust analyze on a LocalCluster against in-process ({env.get('cores')} cores)",
        "",
        f"`gpuclust analyze DS <all 13> --out DIR --no-plots{''.join(' -O ' + o for o in args.option)}`, the "
        "canonical dataset laid out by key; in-process "
        "(`local`) and with `--scheduler local:2` (two worker processes, one thread each), interleaved, "
        f"{args.repeat} of each; medians of the whole process' wall time, the client process' peak RSS (VmHWM) and "
        "the process tree's (workers included, sampled every 50 ms, at least the client's). `equal`: every result table of the cluster run equals the "
        f"local run's (rows sorted, floats to 1e-9). Target: the client's peak RSS <= {FLAT}x as the windows grow.",
        "",
        "| windows | mode | wall s | client peak RSS MiB | tree peak RSS MiB | client growth | equal |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        for mode in MODES:
            m = r["median"][mode]
            growth = f"{r['client_growth']:.2f}x" if mode != "local" else ""
            eq = ("yes" if r["equal"] else "no: " + ", ".join(r["differ"][:5])) if mode != "local" else ""
            md.append(
                f"| {r['size']:,} | {mode} | {m['wall_s']:.1f} | {m['client_hwm_mib']:,.0f} | "
                f"{m['tree_peak_mib']:,.0f} | {growth} | {eq} |"
            )
    publish(args.name, {"rows": rows, "options": args.option, "target_client_growth": FLAT}, md, env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
