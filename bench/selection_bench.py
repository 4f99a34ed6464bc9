"""Selection pushdown: a one-day `--from/--to` study of a multi-day cell reads one day's row groups.

    python bench/selection_bench.py                       # 2e6 windows over ~4 days
    python bench/selection_bench.py --windows 8e6 --days 8

Data: `bench/gen_canonical.py` (canonical Parquet, usage windows shuffled as in real shards),
then instance_usage rewritten sorted by start_time in row groups of 65,536 rows (what a
time-ordered layout gives; the statistics are tight).  Times cell-usage over the whole cell and
over its second day, and reports the compressed bytes of the usage row groups each read (the
selection's `_run.json` figure).  Writes bench/results/selection.json and .md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import environment  # noqa: E402

US = 1_000_000
DAY = 86400 * US


def make(out: Path, windows: int, days: float) -> Path:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from gen_canonical import make_dataset

    from gpuclust.dataset import Dataset, write_json_atomic

    if (out / "manifest.json").exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    machines = max(1, round(windows / (144 * 24 * days)))  # gen_canonical: hours = windows / (machines * 144)
    make_dataset(tmp, windows, machines=machines, seed=1)
    ds = Dataset(tmp)
    t = ds.read("instance_usage")
    t = t.take(pc.sort_indices(t, [("start_time", "ascending")]))
    for f in ds.files("instance_usage"):
        f.unlink()
    rel = "instance_usage/part-sorted-00000.parquet"
    pq.write_table(t, tmp / rel, row_group_size=1 << 16, compression="zstd")
    m = json.loads((tmp / "manifest.json").read_text())
    m["tables"]["instance_usage"] = {"rows": t.num_rows, "files": [rel]}
    write_json_atomic(tmp / "manifest.json", m)
    tmp.rename(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=float, default=2e6)
    ap.add_argument("--days", type=float, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from gpuclust.dataset import Dataset
    from gpuclust.engine import run
    from gpuclust.engine.selection import attach

    n = int(args.windows)
    ds = Dataset(make(HERE / "data" / f"selection-{n}-{args.days:g}d", n, args.days))
    span = ds.read("instance_usage", ["start_time"]).column(0).to_numpy().max() - 600 * US
    rows = []
    for label, sel in (("whole cell", (None, None)), ("day 2", (600 * US + DAY, 600 * US + 2 * DAY))):
        best, stats = float("inf"), None
        for _ in range(args.repeat):
            src, ans = attach(ds, ["cell-usage"], *sel) if sel[0] is not None else (ds, ["cell-usage"])
            t0 = time.perf_counter()
            run(src, ans, partitions="auto")
            best = min(best, time.perf_counter() - t0)
            stats = getattr(src, "stats", {}).get("instance_usage")
        rows.append({"selection": label, "seconds": round(best, 4), "read": stats})
    total = rows[1]["read"]["bytes"]
    line = (
        f"cell-usage, {n:,} windows over {span / DAY:.2f} days: whole cell {rows[0]['seconds']:.3f} s; "
        f"one day (--from 87000s --to 173400s) {rows[1]['seconds']:.3f} s, read "
        f"{rows[1]['read']['row_groups_read']} of {rows[1]['read']['row_groups']} usage row groups, "
        f"{rows[1]['read']['bytes_read']:,} of {total:,} compressed bytes "
        f"({100 * rows[1]['read']['bytes_read'] / total:.1f}%; one day is {100 * DAY / span:.1f}% of the span)"
    )
    print(line)
    res = {
        "benchmark": "selection",
        "windows": n,
        "span_days": span / DAY,
        "rows": rows,
        "line": line,
        "environment": environment(),
    }
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "selection.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    (out / "selection.md").write_text(
        "# Selection pushdown\n\n`python bench/selection_bench.py`"
        f" ({time.strftime('%Y-%m-%d')}, 2 cores, shared machine)\n\n{line}\n"
    )


if __name__ == "__main__":
    main()
