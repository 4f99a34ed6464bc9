"""Analyses benchmark: every registered analysis on the cpu backend, the gpu backend where present,
and the peers a user would otherwise pick, at 10^6 and 10^7 usage windows (10^8 on a GPU machine).

    python bench/analyses_bench.py                         # 1e6 and 1e7 windows, every analysis
    python bench/analyses_bench.py --sizes 1e6 --analyses cell-usage,cpi
    python bench/analyses_bench.py --sizes 1e6,1e7,1e8     # on a GPU machine

Data: `bench/gen_canonical.py` (canonical Parquet written directly, cached under bench/data/).
Each measurement runs in its own process; the parent samples the process tree's RSS. Reported
per (size, analysis, contender): seconds inside the timed call (imports and process start
excluded), rows/s of the analysed table, achieved GB/s over the in-memory bytes of the columns
the analysis reads, and peak RSS. Writes bench/results/<name>.json and .md with device, versions
and commit.

Peers (what SQL / pandas can express of each analysis, written the way a user would):
cell-usage: DuckDB SQL of Google's notebook query and a pandas merge + groupby;
machine-shapes: DuckDB COUNT(DISTINCT); cpi: DuckDB and pandas grouped weighted Pearson per
machine (compared with gpuclust's cpi restricted to that: regression=none, spearman=none);
overcommit: DuckDB machine x 5-min bucket CPU sums with exact overlap (generate_series), DuckDB
computing all of gpuclust's usage sums (tier join, CPU/memory overlap, maxima, counts), and
pandas on the 300 s grid; usage-distribution: the straightforward per-group loop (timed on a
subset of groups and scaled by window count, reported as such).

The DuckDB peers are the SQL references in tests/references/ (``references.sql_peers.DUCKDB_SQL``):
independent SQL statements of what each analysis computes, which the tests use as the oracle.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent / "tests"))  # the SQL peers: tests/references/

from _harness import bench_dataset, environment, run_measured, write_results  # noqa: E402
from references.sql_peers import DUCKDB_SQL  # noqa: E402

US = 1_000_000


# ------------------------------------------------------------------------------------------
# Contenders (run inside the child process)
# ------------------------------------------------------------------------------------------
#: Options that make gpuclust compute what its peers compute (same groups).
BENCH_OPTIONS: dict[str, dict[str, Any]] = {
    "cpi": {"by": "machine"},  # peers: grouped weighted Pearson per machine
    "usage-distribution": {"by": "machine"},  # peer: the per-group loop over machines
    "usage-change": {"level": "instance"},  # peer: pairs of an instance's windows by LEAD
    "machine-utilization": {"mode": "notebook"},  # peer: the notebook's query
}
#: Extra gpuclust rows: the analysis restricted to what its SQL peer computes (contender name
#: ``gpuclust-<backend>[opt=value,...]``).
BENCH_VARIANTS: dict[str, list[dict[str, Any]]] = {
    "cpi": [{"regression": "none", "spearman": "none"}],  # moments + Pearson only, as the SQL
}


def variant_label(name: str, opts: dict[str, Any]) -> str:
    """``name[opt=value,...]`` (``name`` without options): a gpuclust run restricted by ``opts``."""
    return f"{name}[{','.join(f'{k}={v}' for k, v in opts.items())}]" if opts else name


def _variant_name(backend: str, opts: dict[str, Any]) -> str:
    return variant_label(f"gpuclust-{backend}", opts)


def _parse_contender(name: str) -> tuple[str, dict[str, Any]]:
    """``gpuclust-cpu[a=1,b=x]`` -> ("cpu", {"a": "1", "b": "x"})."""
    body = name.split("-", 1)[1]
    if "[" not in body:
        return body, {}
    backend, opts = body[:-1].split("[", 1)
    return backend, dict(kv.split("=", 1) for kv in opts.split(","))


def gpuclust_runner(backend: str, extra: dict[str, Any] | None = None) -> Callable[[Path, str], Callable[[], Any]]:
    def make(ds: Path, analysis: str) -> Callable[[], Any]:
        from gpuclust.analyses.registry import create
        from gpuclust.dataset import Dataset
        from gpuclust.engine import run

        d = Dataset(ds)
        a = create(analysis, **{**BENCH_OPTIONS.get(analysis, {}), **(extra or {})})
        # the engine's defaults: about 4 Mi rows a partition, one thread per usable core (the
        # DuckDB peers run with one thread per usable core too: same cores)
        return lambda: run(d, [a], backend=backend, partitions="auto")

    return make


def _duck() -> Any:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads={len(os.sched_getaffinity(0))}")
    return con


def pandas_cell_usage(ds: Path, _: str) -> Callable[[], Any]:
    import pandas as pd

    def go() -> Any:
        me = pd.read_parquet(ds / "machine_events", columns=["machine_id", "cap_cpu", "cap_mem"])
        cap = me.groupby("machine_id").max().sum()
        ev = pd.read_parquet(
            ds / "instance_events",
            columns=["collection_id", "instance_index", "machine_id", "priority", "alloc_collection_id"],
        )
        ev = (
            ev[ev.alloc_collection_id == 0]
            .groupby(["collection_id", "instance_index", "machine_id"], as_index=False)["priority"]
            .max()
        )
        u = pd.read_parquet(
            ds / "instance_usage",
            columns=[
                "start_time",
                "end_time",
                "collection_id",
                "instance_index",
                "machine_id",
                "alloc_collection_id",
                "avg_cpu",
                "avg_mem",
            ],
        )
        u = u[(u.alloc_collection_id == 0) & (u.end_time - u.start_time >= 300 * US)]
        j = u.merge(ev, on=["collection_id", "instance_index", "machine_id"])
        j["bucket"] = j.start_time // 3_600_000_000  # hours from trace time 0 (docs/user/dataset.md "Time buckets")
        j["tier"] = pd.cut(j.priority, [-1, 99, 115, 119, 10**9], labels=["free", "beb", "mid", "prod"])
        g = j.groupby(["bucket", "tier"], observed=True)[["avg_cpu", "avg_mem"]].sum()
        return g.avg_cpu / (12 * cap.cap_cpu), g.avg_mem / (12 * cap.cap_mem)

    return go


def pandas_cpi(ds: Path, _: str) -> Callable[[], Any]:
    import pandas as pd

    def go() -> Any:
        u = pd.read_parquet(
            ds / "instance_usage", columns=["machine_id", "cpi", "mai", "avg_cpu", "start_time", "end_time"]
        )
        u = u[u.cpi.notna() & u.mai.notna() & (u.cpi > 0) & (u.cpi <= 100) & (u.mai >= 0) & (u.mai <= 1)]
        u = u.assign(w=u.avg_cpu.astype("float64") * (u.end_time - u.start_time) / 1e6)
        g = u.groupby("machine_id")
        mc = g.apply(lambda s: (s.w * s.cpi).sum() / s.w.sum(), include_groups=False)
        u = u.join(mc.rename("mc"), on="machine_id")
        mm = g.apply(lambda s: (s.w * s.mai).sum() / s.w.sum(), include_groups=False)
        u = u.join(mm.rename("mm"), on="machine_id")
        u = u.assign(
            xy=u.w * (u.cpi - u.mc) * (u.mai - u.mm), xx=u.w * (u.cpi - u.mc) ** 2, yy=u.w * (u.mai - u.mm) ** 2
        )
        s = u.groupby("machine_id")[["xy", "xx", "yy"]].sum()
        return s.xy / (s.xx * s.yy) ** 0.5

    return go


def pandas_overcommit(ds: Path, _: str) -> Callable[[], Any]:
    import pandas as pd

    def go() -> Any:
        u = pd.read_parquet(
            ds / "instance_usage", columns=["machine_id", "start_time", "end_time", "avg_cpu", "alloc_collection_id"]
        )
        u = u[u.alloc_collection_id == 0]
        u = u.assign(bucket=u.start_time // (300 * US), cs=u.avg_cpu * (u.end_time - u.start_time) / (300 * US))
        return u.groupby(["machine_id", "bucket"]).cs.sum()  # grid-aligned windows only

    return go


def loop_usage_distribution(ds: Path, _: str) -> Callable[[], Any]:
    """The per-group loop of bench/mixture_bench.py on the per-machine groups of a subset."""
    import numpy as np
    import pandas as pd
    from mixture_bench import per_group_loop

    from gpuclust.schema import CPU_PERCENTILE_COLUMNS_SORTED

    cols = list(CPU_PERCENTILE_COLUMNS_SORTED)
    u = pd.read_parquet(ds / "instance_usage", columns=["machine_id", "start_time", "end_time", "sample_rate", *cols])
    u = u.dropna(subset=cols)
    u["group"] = u.machine_id
    u["w"] = (u.end_time - u.start_time) / 1e6 * u.sample_rate.fillna(1.0).replace(0, 1.0)
    machines = u.machine_id.unique()
    sub = u[u.machine_id.isin(machines[: max(1, len(machines) // 20)])]
    scale = len(u) / max(1, len(sub))
    _ = np

    def go() -> Any:
        per_group_loop(sub, 2049)
        return scale

    return go


def resident_sql(sql: str, ds: Path | str) -> str | None:
    """``sql`` over tables loaded into DuckDB's memory, named as the dataset's tables, instead of
    the dataset's Parquet; None where it reads the Parquet in another form (``file_row_number``:
    the files' row order, which a table does not keep).

    >>> resident_sql("SELECT * FROM read_parquet('/d/instance_usage/**/*.parquet', hive_partitioning=false) u", "/d")
    'SELECT * FROM instance_usage u'
    """
    pattern = rf"read_parquet\('{re.escape(str(ds))}/(\w+)/\*\*/\*\.parquet', hive_partitioning=false\)"
    out = re.sub(pattern, r"\1", sql)
    return None if "read_parquet(" in out else out


def duck_peer(sql_of: Callable[[Path | str], str]) -> Callable[[Path, str], Callable[[], Any]]:
    """A contender running ``sql_of(ds)`` in DuckDB (one thread per usable core)."""

    def make(ds: Path, _: str) -> Callable[[], Any]:
        con = _duck()
        sql = sql_of(ds)
        return lambda: con.execute(sql).fetchall()

    return make


PEERS: dict[str, dict[str, Callable[[Path, str], Callable[[], Any]]]] = {
    a: {name: duck_peer(f) for name, f in peers.items()} for a, peers in DUCKDB_SQL.items()
}
PEERS["cell-usage"]["pandas"] = pandas_cell_usage
PEERS["cpi"]["pandas"] = pandas_cpi
PEERS["overcommit"]["pandas"] = pandas_overcommit
PEERS["usage-distribution"] = {"per-group loop": loop_usage_distribution}


def child(analysis: str, contender: str, ds: Path, repeat: int) -> None:
    if contender.startswith("gpuclust-"):
        be, extra = _parse_contender(contender)
        fn = gpuclust_runner(be, extra)(ds, analysis)
    else:
        fn = PEERS[analysis][contender](ds, analysis)
    best, scale = float("inf"), 1.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = fn()
        best = min(best, time.perf_counter() - t0)
        if isinstance(r, float):
            scale = r
    from gpuclust.analyses.registry import create
    from gpuclust.dataset import Dataset

    a = create(analysis)
    d = Dataset(ds)
    nbytes = d.read(a.table, list(a.columns)).nbytes
    print(
        json.dumps(
            {
                "seconds": best * scale,
                "measured_seconds": best,
                "scaled": scale != 1.0,
                "rows": d.num_rows(a.table),
                "table": a.table,
                "bytes": nbytes,
            }
        )
    )


# ------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1e6,1e7", help="comma-separated window counts")
    ap.add_argument("--analyses", default="all", help="comma-separated analysis names, or all")
    ap.add_argument("--backends", default="auto", help="cpu,gpu or auto (gpu when a device is present)")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--name", default="analyses")
    ap.add_argument("--child", nargs=3, metavar=("ANALYSIS", "CONTENDER", "DATASET"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], Path(args.child[2]), args.repeat)
        return 0

    from gpuclust.analyses.registry import names
    from gpuclust.backends import gpu_available

    analyses = names() if args.analyses == "all" else args.analyses.split(",")
    backends = (
        ["cpu", "gpu"]
        if args.backends == "auto" and gpu_available()
        else (["cpu"] if args.backends == "auto" else args.backends.split(","))
    )
    rows = []
    for size in [int(float(s)) for s in args.sizes.split(",")]:
        ds = bench_dataset(size)
        for an in analyses:
            contenders = (
                [f"gpuclust-{b}" for b in backends]
                + [_variant_name(b, v) for b in backends for v in BENCH_VARIANTS.get(an, [])]
                + ([] if args.no_peers else list(PEERS.get(an, {})))
            )
            for c in contenders:
                m = run_measured(
                    [
                        sys.executable,
                        str(HERE / "analyses_bench.py"),
                        "--repeat",
                        str(args.repeat),
                        "--child",
                        an,
                        c,
                        str(ds),
                    ]
                )
                if m.returncode != 0:
                    print(f"{an} / {c} failed:\n{m.stdout_tail}", file=sys.stderr)
                    rows.append({"size": size, "analysis": an, "contender": c, "error": m.stdout_tail[-500:]})
                    continue
                r = json.loads(m.stdout_tail.strip().splitlines()[-1])
                row = {
                    "size": size,
                    "analysis": an,
                    "contender": c,
                    "table": r["table"],
                    "rows": r["rows"],
                    "seconds": round(r["seconds"], 3),
                    "rows_per_s": round(r["rows"] / r["seconds"]),
                    "gb_per_s": round(r["bytes"] / r["seconds"] / 1e9, 3),
                    "peak_rss_mib": round(m.peak_rss_bytes / 2**20),
                    "scaled_from_subset": r["scaled"],
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    env = environment()
    notes = [
        "gpuclust options: " + "; ".join(f"{k}: {v}" for k, v in BENCH_OPTIONS.items()),
        "gpuclust runs with the engine's defaults: partitions='auto' (about 4 Mi rows each, rounded up to the "
        "thread count) on one thread per usable core; DuckDB runs with one thread per usable core ("
        + str(len(os.sched_getaffinity(0)))
        + ").",
        "gpuclust times include the analysis' context pass (e.g. priority lookups, interval construction, cpi's "
        "machine-cell pass), reading Parquet and finalize. Rows named gpuclust-cpu[...] run the analysis "
        "restricted to what its SQL peer computes (cpi: moments and Pearson r only); peers are compared with "
        "that row where there is one ('base' column). overcommit also computes capacity and request series "
        "besides the usage sums; 'duckdb (usage by tier)' computes the same usage sums as gpuclust's partial "
        "(tier join, 5 sums), 'duckdb' only the CPU sum. The per-group loop is timed on 1/20 of the machines "
        "and scaled by window count.",
    ]
    md = [
        f"# Analyses benchmark ({env['cores']} cores{', ' + env['gpu'] if env['gpu'] else ', no GPU'})",
        "",
        "| windows | analysis | contender | s | rows/s | GB/s | peak RSS MiB | base | vs base |",
        "|---:|---|---|---:|---:|---:|---:|---|---:|",
    ]
    times = {(r["size"], r["analysis"], r["contender"]): r["seconds"] for r in rows if "seconds" in r}

    def base_of(r: dict[str, Any]) -> str:
        own = r["contender"]
        if own.startswith("gpuclust-"):
            return "gpuclust-cpu" if own != "gpuclust-cpu" else ""
        for v in BENCH_VARIANTS.get(r["analysis"], []):
            if (r["size"], r["analysis"], _variant_name("cpu", v)) in times:
                return _variant_name("cpu", v)
        return "gpuclust-cpu"

    for r in rows:
        if "error" in r:
            md.append(f"| {r['size']:,} | {r['analysis']} | {r['contender']} | failed | | | | | |")
            continue
        bname = base_of(r)
        b = times.get((r["size"], r["analysis"], bname))
        rel = (
            f"{r['seconds'] / b:.2f}x slower"
            if b and r["seconds"] >= b
            else (f"{b / r['seconds']:.2f}x faster" if b else "")
        )
        note = " (subset, scaled)" if r["scaled_from_subset"] else ""
        md.append(
            f"| {r['size']:,} | {r['analysis']} | {r['contender']}{note} | {r['seconds']} | {r['rows_per_s']:,} "
            f"| {r['gb_per_s']} | {r['peak_rss_mib']:,} | {bname} | {rel} |"
        )
    md += ["", *notes, "", "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), ""]
    jp, mp = write_results(args.name, {"benchmark": "analyses", "rows": rows, "environment": env}, "\n".join(md))
    print("\n".join(md))
    print(f"wrote {jp} and {mp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
