"""Whole-process CPU comparison with DuckDB (issue 8, deliverable 8 "CPU speed").

    python bench/cpu_vs_duckdb.py                       # 4e6 and 1.6e7 windows, 3 interleaved rounds
    python bench/cpu_vs_duckdb.py --sizes 4e6 --repeat 5
    python bench/cpu_vs_duckdb.py --before bench/results/cpu_vs_duckdb_before.json

Every measurement is a fresh process over the same canonical Parquet (`bench/gen_canonical.py`,
cached under bench/data/), timed from spawn to exit, with the peak RSS of its process tree sampled
by `_harness.run_measured` and its user/system CPU seconds from ``getrusage(RUSAGE_CHILDREN)``:

* ``cell-usage``: ``python -m gpuclust.cli analyze DS cell-usage --out TMP --no-plots --quiet``
  (notebook mode, the engine's defaults: one thread per usable core) against DuckDB running
  Google's notebook query (``analyses_bench.cell_usage_sql``) with ``SET threads`` = usable cores
  (and its progress bar off).
* ``cpi (SQL subset)``: ``gpuclust analyze DS cpi -O by=machine -O regression=none -O
  spearman=none`` (weighted moments and Pearson r per machine, one pass) against
  ``analyses_bench.cpi_sql`` in DuckDB.

gpuclust writes its result tables (Parquet), the summary and ``_run.json``; DuckDB fetches its
result rows.  gpuclust is byte-compiled first (``compileall``), as an installed package is.  Contenders are interleaved round by round (the machine is shared, so timings are
noisy) and the medians reported, with the ratio gpuclust / DuckDB (< 1: gpuclust is faster).
Writes bench/results/<name>.json and .md with machine, versions and commit; ``--before`` adds an
earlier run's medians (e.g. before an optimisation) as extra columns.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _harness import bench_dataset, environment, run_measured, write_results  # noqa: E402
from analyses_bench import cell_usage_sql, cpi_sql  # noqa: E402

#: case -> (gpuclust analyze arguments after the dataset, DuckDB SQL builder)
CASES: dict[str, tuple[list[str], Any]] = {
    "cell-usage": (["cell-usage", "--mode", "notebook"], cell_usage_sql),
    "cpi (SQL subset)": (["cpi", "-O", "by=machine", "-O", "regression=none", "-O", "spearman=none"], cpi_sql),
}

_DUCK = ("import os, sys, duckdb\n"
         "con = duckdb.connect()\n"
         "con.execute(f'SET threads={len(os.sched_getaffinity(0))}')\n"
         "con.execute('SET enable_progress_bar=false')\n"
         "rows = con.execute(sys.argv[1]).fetchall()\n"
         "print(len(rows))\n")


def _measure(cmd: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = run_measured(cmd, env=env)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if m.returncode != 0:
        raise RuntimeError(f"{cmd[:6]} failed ({m.returncode}):\n{m.stdout_tail}")
    return {"wall_s": m.wall_s, "peak_rss_mib": m.peak_rss_bytes / 2**20,
            "user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime}


def commands(case: str, ds: Path, out: Path) -> dict[str, list[str]]:
    args, sql = CASES[case]
    return {"gpuclust": [sys.executable, "-m", "gpuclust.cli", "analyze", str(ds), *args, "--out", str(out),
                         "--no-plots", "--quiet"],
            "duckdb": [sys.executable, "-c", _DUCK, sql(ds)]}


def _median(runs: list[dict[str, Any]], k: str) -> float:
    return statistics.median(r[k] for r in runs)


def precompile() -> None:
    """Byte-compile gpuclust, as an installed package is: without it (``PYTHONDONTWRITEBYTECODE``,
    a fresh checkout) every measured process would compile its modules from source again."""
    import compileall

    compileall.compile_dir(str(ROOT / "gpuclust"), quiet=1)


def compare(sizes: list[int], cases: list[str], repeat: int, dataset: Any = bench_dataset) -> list[dict[str, Any]]:
    """Interleaved rounds; one row per (size, case, contender) with medians and the raw runs."""
    precompile()
    rows = []
    for size in sizes:
        ds = dataset(size)
        for case in cases:
            runs: dict[str, list[dict[str, Any]]] = {"gpuclust": [], "duckdb": []}
            with tempfile.TemporaryDirectory(prefix="cpu_vs_duckdb-") as tmp:
                for rnd in range(repeat):
                    cmds = commands(case, ds, Path(tmp) / "out")
                    # alternate who goes first, so neither always runs on a warmer cache
                    for who in (("gpuclust", "duckdb") if rnd % 2 == 0 else ("duckdb", "gpuclust")):
                        runs[who].append(_measure(cmds[who]))
                    shutil.rmtree(Path(tmp) / "out", ignore_errors=True)
            for who, rs in runs.items():
                row = {"size": size, "case": case, "contender": who,
                       **{k: round(_median(rs, k), 3) for k in ("wall_s", "user_s", "sys_s", "peak_rss_mib")},
                       "runs": rs}
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
    return rows


def _ratios(rows: list[dict[str, Any]]) -> dict[tuple[int, str], dict[str, float]]:
    by = {(r["size"], r["case"], r["contender"]): r for r in rows}
    out = {}
    for (size, case, who), g in by.items():
        d = by.get((size, case, "duckdb"))
        if who == "gpuclust" and d:
            out[(size, case)] = {"time": g["wall_s"] / d["wall_s"], "rss": g["peak_rss_mib"] / d["peak_rss_mib"],
                                 "cpu": (g["user_s"] + g["sys_s"]) / max(1e-9, d["user_s"] + d["sys_s"])}
    return out


def markdown(rows: list[dict[str, Any]], env: dict[str, Any], repeat: int, before: list[dict[str, Any]] | None) -> str:
    rat = _ratios(rows)
    brat = _ratios(before) if before else {}
    bby = {(r["size"], r["case"], r["contender"]): r for r in before or []}
    md = [f"# gpuclust vs DuckDB, whole process ({env['affinity_cores']} cores, {env['cpu']})", "",
          f"Medians of {repeat} interleaved rounds; wall = spawn to exit; CPU = user + system seconds; RSS = peak "
          "of the process tree. On a shared machine wall times carry the other load; CPU seconds much less.", "",
          "| windows | case | contender | wall s | user s | sys s | peak RSS MiB | time / DuckDB | CPU / DuckDB "
          "| RSS / DuckDB |" + (" before: wall s | before: RSS MiB | before: time / DuckDB | before: CPU / DuckDB |"
                               if before else ""),
          "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|---:|---:|" if before else "")]
    for r in rows:
        k = (r["size"], r["case"])
        t = f"{rat[k]['time']:.2f}" if r["contender"] == "gpuclust" and k in rat else ""
        m = f"{rat[k]['rss']:.2f}" if r["contender"] == "gpuclust" and k in rat else ""
        u = f"{rat[k]['cpu']:.2f}" if r["contender"] == "gpuclust" and k in rat else ""
        line = (f"| {r['size']:,} | {r['case']} | {r['contender']} | {r['wall_s']:.2f} | {r['user_s']:.2f} "
                f"| {r['sys_s']:.2f} | {r['peak_rss_mib']:,.0f} | {t} | {u} | {m} |")
        if before:
            b = bby.get((r["size"], r["case"], r["contender"]))
            bt = f"{brat[k]['time']:.2f}" if r["contender"] == "gpuclust" and k in brat else ""
            bu = f"{brat[k]['cpu']:.2f}" if r["contender"] == "gpuclust" and k in brat else ""
            line += (f" {b['wall_s']:.2f} | {b['peak_rss_mib']:,.0f} | {bt} | {bu} |" if b else " | | | |")
        md.append(line)
    md += ["", "gpuclust: `python -m gpuclust.cli analyze DS <case> --out TMP --no-plots --quiet` (the engine's "
           "defaults: partitions='auto', one thread per usable core). DuckDB: `python -c` running "
           "bench/analyses_bench.py's `cell_usage_sql` / `cpi_sql` with `SET threads` = usable cores, "
           "results fetched. cpi (SQL subset) = `-O by=machine -O regression=none -O spearman=none`.",
           "", "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), ""]
    return "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4e6,1.6e7", help="comma-separated window counts")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (medians reported)")
    ap.add_argument("--layout", choices=["flat", "bucketed"], default="flat",
                    help="flat = the generated dataset; bucketed = its `gpuclust optimize`d copy (both contenders "
                         "read the same files)")
    ap.add_argument("--name", default="cpu_vs_duckdb")
    ap.add_argument("--before", type=Path, default=None, help="an earlier run's JSON: its medians become columns")
    ap.add_argument("--note", default="", help="a line added to the Markdown (e.g. what 'before' was)")
    ap.add_argument("--render", type=Path, default=None, help="re-write the Markdown of an earlier run's JSON (no runs)")
    args = ap.parse_args(argv)
    if args.render:
        payload = json.loads(args.render.read_text())
        md = markdown(payload["rows"], payload["environment"], payload["repeat"], payload.get("before"))
        md = md.replace("\n\n", f"\n\n{args.note}\n\n", 1) if args.note else md
        payload["ratios"] = [{"size": s, "case": c, **{k: round(x, 3) for k, x in v.items()}}
                             for (s, c), v in _ratios(payload["rows"]).items()]
        args.render.write_text(json.dumps(payload, indent=1) + "\n")
        args.render.with_suffix(".md").write_text(md)
        print(md)
        return 0
    cases = args.cases.split(",")
    for c in cases:
        if c not in CASES:
            ap.error(f"unknown case {c!r}")
    dataset = bench_dataset
    if args.layout == "bucketed":
        from scale_bench import bucketed

        def dataset(size: int) -> Path:
            b = bench_dataset(size, generate=False).with_name(f"canonical-{size}-bucketed")
            return b if (b / "manifest.json").exists() else bucketed(bench_dataset(size), True)
    rows = compare([int(float(s)) for s in args.sizes.split(",")], cases, args.repeat, dataset)
    before = json.loads(args.before.read_text())["rows"] if args.before else None
    env = environment()
    md = markdown(rows, env, args.repeat, before)
    if args.note:
        md = md.replace("\n\n", f"\n\n{args.note}\n\n", 1)
    payload = {"benchmark": "cpu_vs_duckdb", "repeat": args.repeat, "layout": args.layout, "rows": rows,
               "environment": env,
               "ratios": [{"size": s, "case": c, **{k: round(x, 3) for k, x in v.items()}}
                          for (s, c), v in _ratios(rows).items()],
               "before": before}
    jp, mp = write_results(args.name, payload, md)
    print(md)
    print(f"wrote {jp} and {mp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
