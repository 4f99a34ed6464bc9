"""Peak memory and time of `gpuclust optimize` at several dataset sizes.

    python bench/optimize_bench.py                       # 1e6 and 4e6 windows
    python bench/optimize_bench.py --sizes 1000000 --name optimize-small

For each size, the canonical benchmark dataset (bench/data/canonical-<size>, generated once by
bench/gen_canonical.py) is optimized into a new folder (``--out``) in its own process, sampling
the summed RSS of the process tree (bench/_harness.py ``run_measured``), twice:

* with a fixed bucket size (``--buckets ceil(windows / ROWS_PER_BUCKET_FIXED)``): the peak must
  not grow with the dataset (one bucket + one batch in memory);
* with one bucket (``--buckets 1``), i.e. the whole table: the peak grows there; the default
  count (``ceil(windows / 1 Mi)``, at least 16) never makes a bucket larger than 1 Mi usage rows,
  so this at 1e6 windows is the default layout's worst case.

Writes bench/results/<name>.json and .md with the figures, device, versions and commit.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
from pathlib import Path

from _harness import bench_dataset, environment, run_measured, write_results

#: Rows per bucket of the fixed-size runs.
ROWS_PER_BUCKET_FIXED = 256 * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000])
    ap.add_argument("--name", default="optimize")
    a = ap.parse_args()
    rows = []
    for size in a.sizes:
        ds = bench_dataset(size)
        # "whole": the whole table in one bucket (the largest bucket the default count can make
        # is 4 Mi usage rows; at these sizes one bucket is that worst case)
        for label, buckets in (("fixed", math.ceil(size / ROWS_PER_BUCKET_FIXED)), ("whole", 1)):
            tmp = Path(tempfile.mkdtemp(prefix="gpuclust-opt-bench-"))
            cmd = [sys.executable, "-m", "gpuclust", "optimize", str(ds), "--out", str(tmp / "ds"), "--no-progress"]
            cmd += ["--buckets", str(buckets)]
            m = run_measured(cmd)
            shutil.rmtree(tmp, ignore_errors=True)
            if m.returncode != 0:
                raise SystemExit(f"{cmd} failed:\n{m.stdout_tail}")
            n = buckets
            rows.append(
                {
                    "windows": size,
                    "mode": label,
                    "buckets": n,
                    "wall_s": round(m.wall_s, 2),
                    "peak_rss_mb": round(m.peak_rss_bytes / 2**20),
                    "rows_per_bucket": math.ceil(size / n),
                }
            )
            print(rows[-1], flush=True)
    env = environment()
    md = [
        "# `gpuclust optimize`: peak RSS and time",
        "",
        f"{env.get('cpu', '')}, {env.get('cores', '')} cores; commit {env.get('commit', '')}; {env.get('date', '')}",
        "",
        "| windows | buckets | usage rows / bucket | wall s | peak RSS MiB |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        md.append(
            f"| {r['windows']:,} | {r['buckets']} ({r['mode']}) | {r['rows_per_bucket']:,} | {r['wall_s']} | {r['peak_rss_mb']:,} |"
        )
    write_results(a.name, {"environment": env, "rows": rows}, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
