"""Load: the study pipeline's decode of the usage columns against pyarrow's, same files, same cores.

    python bench/load_bench.py --sizes 4e6,1.6e7 --repeat 5

For each size (the canonical dataset laid out by key, as ingest leaves it), two kinds of child
process run interleaved, ``--repeat`` times each:

* ``gpuclust``: ``gpuclust.open(ds, backend="cpu").persist(columns)``: the instance_usage
  columns every registered analysis reads, decoded row group by row group on the load threads
  straight into NumPy arrays (NULLs filled), what a study or a streamed run holds;
* ``pyarrow``: ``pyarrow.parquet.read_table(files, columns=..., use_threads=True)`` over the same
  files: Arrow's own multi-threaded decode into Arrow buffers, the ceiling issue 34 sets (the
  pipeline at >= 80% of its rate).

Each child times its load alone (after its imports), in seconds of wall time, and reports the
decoded bytes and its peak RSS (VmHWM).  The table gives the medians, the rate in GB/s of decoded
bytes (the columns' bytes in memory), gpuclust's rate over pyarrow's, and the whole process'
peak RSS.  Writes bench/results/load.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _harness import bench_dataset, environment, peak_rss_mib, publish, run_measured  # noqa: E402
from scale_bench import bucketed  # noqa: E402

TARGET = 0.8


def usage_columns() -> list[str]:
    from gpuclust.analyses.registry import create, names

    cols: set[str] = set()
    for n in names():
        a = create(n)
        if a.table == "instance_usage":
            cols.update(a.columns, a.context_columns)
    return sorted(cols)


def child(kind: str, ds: Path) -> None:
    cols = usage_columns()
    if kind == "gpuclust":
        import gpuclust

        study = gpuclust.open(ds, backend="cpu")
        t = time.perf_counter()
        study.persist(cols)
        secs = time.perf_counter() - t
        nbytes = study.resident_bytes
    else:
        import pyarrow.parquet as pq

        files = sorted((ds / "instance_usage").rglob("*.parquet"))  # flat or bucket=k/ layout
        t = time.perf_counter()
        table = pq.read_table(files, columns=cols, use_threads=True)
        secs = time.perf_counter() - t
        nbytes = table.nbytes
    print("RESULT " + json.dumps({"s": secs, "bytes": int(nbytes), "hwm_mib": peak_rss_mib()}), flush=True)


def _one(kind: str, ds: Path) -> dict[str, Any]:
    m = run_measured([sys.executable, __file__, "--child", kind, str(ds)])
    line = next((ln for ln in m.stdout_tail.splitlines() if ln.startswith("RESULT ")), None)
    if m.returncode != 0 or line is None:
        print(m.stdout_tail[-3000:], flush=True)
        raise SystemExit(f"{kind} load of {ds} failed (exit {m.returncode})")
    return {**json.loads(line[7:]), "process_s": m.wall_s}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4e6,1.6e7")
    ap.add_argument("--repeat", type=int, default=5, help="processes of each kind, interleaved")
    ap.add_argument("--name", default="load")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "DATASET"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return 0
    rows = []
    for size in [int(float(s)) for s in args.sizes.split(",")]:
        ds = bucketed(bench_dataset(size), takes_out=True)  # (made once, shared with scale_bench.py)
        runs: dict[str, list[dict[str, Any]]] = {"gpuclust": [], "pyarrow": []}
        for _ in range(args.repeat):
            for kind in runs:
                runs[kind].append(_one(kind, ds))
        med = {
            k: {f: statistics.median(r[f] for r in v) for f in ("s", "bytes", "hwm_mib", "process_s")}
            for k, v in runs.items()
        }
        row = {
            "size": size,
            "columns": len(usage_columns()),
            "runs": runs,
            "median": med,
            "gb_s": {k: v["bytes"] / v["s"] / 1e9 for k, v in med.items()},
        }
        row["ratio"] = row["gb_s"]["gpuclust"] / row["gb_s"]["pyarrow"]
        rows.append(row)
        print(json.dumps({"size": size, "ratio": row["ratio"], "gb_s": row["gb_s"]}), flush=True)
    env = environment()
    md = [
        f"# Load: the study pipeline against pyarrow ({env.get('cores')} cores)",
        "",
        f"The instance_usage columns every analysis reads ({rows[0]['columns'] if rows else 0}), from the canonical "
        "dataset laid out by key: `gpuclust.open(ds).persist(columns)` (decode into NumPy, NULLs filled) against "
        "`pyarrow.parquet.read_table(files, columns=..., use_threads=True)`. One process per load, the two kinds "
        f"interleaved, {args.repeat} of each; medians of the load's wall time (after imports), its decoded bytes, "
        f"and the process' peak RSS. Target: gpuclust >= {TARGET:.0%} of pyarrow's rate.",
        "",
        "| windows | gpuclust s | pyarrow s | gpuclust GB/s | pyarrow GB/s | ratio | target | gpuclust peak RSS MiB "
        "| pyarrow peak RSS MiB |",
        "|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        g, p = r["median"]["gpuclust"], r["median"]["pyarrow"]
        md.append(
            f"| {r['size']:,} | {g['s']:.3f} | {p['s']:.3f} | {r['gb_s']['gpuclust']:.2f} | "
            f"{r['gb_s']['pyarrow']:.2f} | {r['ratio']:.2f} | {'met' if r['ratio'] >= TARGET else 'missed'} | "
            f"{g['hwm_mib']:,.0f} | {p['hwm_mib']:,.0f} |"
        )
    publish(args.name, {"rows": rows, "target": TARGET}, md, env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
