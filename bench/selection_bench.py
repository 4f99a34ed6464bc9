"""Selection pushdown: a one-day `--from/--to` study of a multi-day cell reads one day's row
groups, and costs about a day whatever the cell's span.

    python bench/selection_bench.py                          # cells of 1e6 windows / 2 days and 4e6 / 8 days
    python bench/selection_bench.py --cells 8e6:8 --repeat 1

Data: `bench/gen_canonical.py` (canonical Parquet, usage windows shuffled as in real shards),
then instance_usage rewritten sorted by start_time in row groups of 65,536 rows (what a
time-ordered layout gives; the statistics are tight).  Per cell, `gpuclust analyze DS cell-usage
--no-plots` over the whole cell and with `--from 87000s --to 173400s` (its second day), each a
whole process, `--repeat` interleaved rounds: medians of wall and CPU seconds (user + system) and
peak RSS (the process tree's, sampled every 50 ms), and the usage row groups and compressed bytes
the selection read (its `_run.json`'s `selection.read`).  Writes bench/results/<name>.json and .md
(default name `selection`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import publish, run_measured  # noqa: E402

US = 1_000_000
DAY = 86400 * US
#: The selection: the cell's second day (trace time 600 s + 1 day to + 2 days).
DAY2 = ("87000s", "173400s")


def make(out: Path, windows: int, days: float, row_group: int = 1 << 16) -> Path:
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
    pq.write_table(t, tmp / rel, row_group_size=row_group, compression="zstd")
    m = json.loads((tmp / "manifest.json").read_text())
    m["tables"]["instance_usage"] = {"rows": t.num_rows, "files": [rel]}
    write_json_atomic(tmp / "manifest.json", m)
    tmp.rename(out)
    return out


def _analyze(ds: Path, sel: tuple[str, str] | None, out: Path, timeout_s: float) -> dict:
    cmd = [sys.executable, "-m", "gpuclust", "analyze", str(ds), "cell-usage", "--out", str(out), "--no-plots"]
    cmd += ["--quiet"]
    if sel is not None:
        cmd += ["--from", sel[0], "--to", sel[1]]
    m = run_measured(cmd, timeout_s=timeout_s)
    if m.returncode != 0:
        raise SystemExit(f"selection_bench: {' '.join(cmd)} failed ({m.returncode}):\n{m.stdout_tail}")
    read = json.loads((out / "_run.json").read_text()).get("selection", {}).get("read", {}).get("instance_usage")
    shutil.rmtree(out, ignore_errors=True)
    return {
        "wall_s": round(m.wall_s, 3),
        "cpu_s": m.extra["cpu_s"],
        "peak_rss_mib": round(m.peak_rss_bytes / 2**20),
        "read": read,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default="1e6:2,4e6:8", help="comma-separated WINDOWS:DAYS (default 1e6:2,4e6:8)")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--timeout-s", type=float, default=1800.0)
    ap.add_argument("--name", default="selection", help="bench/results/<name>.json and .md")
    ap.add_argument("--data", type=Path, default=HERE / "data", help="where the cells are made (once)")
    ap.add_argument("--row-group", type=int, default=1 << 16, help="usage rows per row group (default 65,536)")
    args = ap.parse_args(argv)
    from gpuclust.dataset import Dataset

    cells = []
    for spec in args.cells.split(","):
        w, d = spec.split(":")
        n, days = int(float(w)), float(d)
        ds = make(args.data / f"selection-{n}-{days:g}d-rg{args.row_group}", n, days, args.row_group)
        span = int(Dataset(ds).read("instance_usage", ["start_time"]).column(0).to_numpy().max()) - 600 * US
        cells.append({"windows": n, "days": days, "span_days": round(span / DAY, 3), "ds": ds})
    cases = [(c, label, sel) for c in cells for label, sel in (("whole cell", None), ("day 2", DAY2))]
    runs: dict[str, list[dict]] = {f"{c['windows']}/{label}": [] for c, label, _ in cases}
    tmp = Path(tempfile.mkdtemp(prefix="selection-bench-"))
    try:
        for rnd in range(args.repeat):
            for c, label, sel in cases:
                r = _analyze(c["ds"], sel, tmp / "out", args.timeout_s)
                runs[f"{c['windows']}/{label}"].append(r)
                print(json.dumps({"round": rnd, "windows": c["windows"], "selection": label, **r}), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    summary = []
    for c, label, _ in cases:
        rs = runs[f"{c['windows']}/{label}"]
        row = {"windows": c["windows"], "span_days": c["span_days"], "selection": label, "rounds": len(rs)}
        row.update({k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s", "peak_rss_mib")})
        row["read"] = rs[-1]["read"]
        summary.append(row)
    md = [
        "# Selection pushdown: a one-day study of a multi-day cell",
        "",
        f"`python bench/selection_bench.py --cells {args.cells} --repeat {args.repeat} --row-group {args.row_group}`: `gpuclust analyze DS "
        f"cell-usage --no-plots` over the whole cell and with `--from {DAY2[0]} --to {DAY2[1]}` (its second day), "
        f"whole processes, medians of {args.repeat} interleaved round(s); CPU = user + system seconds; peak RSS of "
        f"the process tree.  Cells: `bench/gen_canonical.py`, instance_usage time-sorted in row groups of {args.row_group:,} rows.",
        "",
        "| windows | span days | selection | wall s | CPU s | peak RSS MiB | usage row groups read | compressed bytes read |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        rd = s["read"]
        rg = f"{rd['row_groups_read']} of {rd['row_groups']}" if rd else "all"
        by = f"{rd['bytes_read']:,} of {rd['bytes']:,} ({100 * rd['bytes_read'] / rd['bytes']:.1f}%)" if rd else "all"
        md.append(
            f"| {s['windows']:,} | {s['span_days']:.2f} | {s['selection']} | {s['wall_s']:.2f} | {s['cpu_s']:.2f} | "
            f"{s['peak_rss_mib']:,.0f} | {rg} | {by} |"
        )
    md.append("")
    for c in cells:
        whole, day = (
            next(s for s in summary if s["windows"] == c["windows"] and s["selection"] == x)
            for x in ("whole cell", "day 2")
        )
        md.append(
            f"- {c['windows']:,} windows over {c['span_days']:.2f} days: one day is {100 / c['span_days']:.1f}% of the span; "
            f"it takes {day['wall_s'] / whole['wall_s']:.2f}x the whole cell's wall time, "
            f"{day['cpu_s'] / whole['cpu_s']:.2f}x its CPU and {day['peak_rss_mib'] / whole['peak_rss_mib']:.2f}x its peak RSS"
        )
    if len(cells) > 1:
        a, b = (
            next(s for s in summary if s["windows"] == c["windows"] and s["selection"] == "day 2")
            for c in (cells[0], cells[-1])
        )
        md.append(
            f"- the one-day study as the cell grows {cells[-1]['windows'] / cells[0]['windows']:.0f}x: "
            f"{b['wall_s'] / a['wall_s']:.2f}x the wall time, {b['peak_rss_mib'] / a['peak_rss_mib']:.2f}x the peak RSS"
        )
    payload = {"cells": [{k: v for k, v in c.items() if k != "ds"} for c in cells], "runs": runs, "summary": summary}
    publish(args.name, payload, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
