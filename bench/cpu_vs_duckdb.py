"""Whole-process CPU comparison with DuckDB (issue 8, deliverable 8 "CPU speed").

    python bench/cpu_vs_duckdb.py                       # 4e6 and 1.6e7 windows, 3 interleaved rounds
    python bench/cpu_vs_duckdb.py --sizes 4e6 --repeat 5
    python bench/cpu_vs_duckdb.py --before bench/results/<an earlier run>.json
    python bench/cpu_vs_duckdb.py --merge A.json B.json --name cpu_vs_duckdb   # runs of one layout -> one result
    python bench/cpu_vs_duckdb.py --merge bench/results/cpu_vs_duckdb.json NEW.json --name cpu_vs_duckdb  # add a run

Every measurement is a fresh process over the same canonical Parquet (`bench/gen_canonical.py`,
cached under bench/data/), timed from spawn to exit, with the peak RSS of its process tree sampled
by `_harness.run_measured` and its user/system CPU seconds from ``getrusage(RUSAGE_CHILDREN)``:

* ``cell-usage``: ``python -m gpuclust.cli analyze DS cell-usage --out TMP --no-plots --quiet``
  (notebook mode, the engine's defaults: one thread per usable core) against DuckDB running
  Google's notebook query (``cell_usage_sql``) with ``SET threads`` = usable cores
  (and its progress bar off).
* ``cpi (SQL subset)``: ``gpuclust analyze DS cpi -O by=machine -O regression=none -O
  spearman=none`` (weighted moments and Pearson r per machine, one pass) against
  ``cpi_sql`` in DuckDB.
* ``lifecycle``: ``gpuclust analyze DS lifecycle`` (every table) against
  ``lifecycle_sql``, its SQL-expressible subset (per-instance tier, event and
  transition counts by LAG over each instance's events).
* ``lifecycle (all tables)``: the same gpuclust run against ``lifecycle_full_sql``:
  DuckDB writing gpuclust's tables but ``survival`` and the per-kind ones (events, transitions,
  the series with its present-at-start column and its queued, eligible, queue and running levels,
  the scheduling, queued and execution episodes with their outcomes, censoring and log bins, info) as Parquet beside gpuclust's folder; checked table for table against gpuclust's in
  tests/bench/test_cpu_vs_duckdb.py.
* ``job-usage``: ``gpuclust analyze DS job-usage`` (every table, tiers included) against
  ``job_usage_sql`` (per-collection hours and the overall statistics, no tiers).
* ``job-usage (tiers)``: the same gpuclust run against ``job_usage_tiers_sql``:
  DuckDB doing the work gpuclust does (each collection's tier from the MAX priority of the events
  of its keys with usage, then the statistics per tier and over all; checked against gpuclust's
  ``stats`` table in tests/bench/test_cpu_vs_duckdb.py).
* ``job-usage (all tables)``: the same gpuclust run against ``job_usage_full_sql``:
  DuckDB writing every table gpuclust writes (the 400,000-row ``jobs`` table at 1.6e7, ``stats``
  for CPU and memory with the top 0.1% share, C² and the Pareto fit, ``correlation``, ``info``)
  as Parquet into a folder beside gpuclust's; tests/bench/test_cpu_vs_duckdb.py checks each table
  against gpuclust's.
* ``usage-vs-request``: ``gpuclust analyze DS usage-vs-request`` (every table) against
  ``usage_vs_request_sql`` (an ASOF join for the CPU limit, one measure, no tiers).
* ``usage-vs-request (all tables)``: the same gpuclust run against
  ``usage_vs_request_full_sql``: DuckDB writing gpuclust's tables (both limits by
  ASOF joins, the tier join, four measures by tier and over all, counts, means, the log-binned
  distributions and their quantiles); checked against gpuclust's in tests/bench/test_cpu_vs_duckdb.py.
* ``usage-change``: ``gpuclust analyze DS usage-change -O level=instance`` (every table) against
  ``usage_change_sql`` (pairs of consecutive windows by LEAD, by tier, with the
  defined changes and those within ±20%).
* ``usage-change (all tables)``: the same gpuclust run against ``usage_change_full_sql``:
  DuckDB writing gpuclust's tables (pairs by LEAD, the tier join, the four kinds of pair, the
  shares within ±5/10/20/50%, the mean and the log-binned ratios with their quantiles, info);
  checked against gpuclust's in tests/bench/test_cpu_vs_duckdb.py.
* ``machine-utilization``: ``gpuclust analyze DS machine-utilization -O mode=notebook`` (every table, the machine
  table written as parts) against ``machine_utilization_sql``: the notebook's
  query whole, with exact quantiles.
* ``machine-utilization (all tables)``: the same gpuclust run against
  ``machine_utilization_full_sql``: DuckDB writing every table gpuclust writes (the
  per machine x 5-minute bucket ``machine`` table, as one Parquet file, with its windows, usage
  sums, capacities and ratios; the exact quantiles, ``summary``, ``series`` and ``info`` with the
  rows dropped by each rule) as Parquet; checked table for table against gpuclust's in
  tests/bench/test_cpu_vs_duckdb.py.
* ``data-quality (SQL subset)``: ``gpuclust analyze DS data-quality`` (every table: events checks,
  ties and out-of-order sequences, the max/p100 histogram included) against
  ``data_quality_sql``: the usage table's NULLs per column, sentinels, window
  lengths, p100 against max, non-monotone percentiles and the joins with each instance's last
  event (checked against gpuclust's ``checks`` and ``columns`` in tests/bench/test_cpu_vs_duckdb.py).
  An unbucketed dataset larger than one partition is refused by data-quality: use ``--layout
  bucketed``.
* ``data-quality (all tables)``: the same gpuclust run against
  ``data_quality_full_sql``: DuckDB writing every table gpuclust writes
  (``checks`` of all four tables: the usage checks in one scan joined to each instance's final
  terminal event, the events tables' sentinels, ties, out-of-order sequences and NULL capacities;
  ``columns``, ``codes``, the ``max_over_p100`` bins and ``info``) as Parquet; checked table for
  table against gpuclust's in tests/bench/test_cpu_vs_duckdb.py.
* ``peak-prediction (SQL part)``: ``gpuclust analyze DS peak-prediction`` (the whole simulation,
  default options) against ``peak_prediction_sql``: DuckDB writing the columns of
  gpuclust's ``machine`` table that SQL computes (the ASOF join of each window to its instance's
  latest event with both requests positive, the paper's filters, per machine x 5-minute step the
  instances, the sums of limits and of usage capped at them, ``borg_default`` and the 24 h oracle
  by a self-join over the horizon) as Parquet; the stateful predictors (N-sigma, percentiles and
  their combinations) are left out.  Checked against gpuclust's ``machine`` table in
  tests/bench/test_cpu_vs_duckdb.py.

The DuckDB side of each case is an SQL reference of tests/references/ (``sql_<analysis>.py``),
written from the analysis' document; the tests use the same statements as their oracle.

A third contender, ``floor``, is the least any engine built on gpuclust's fixed stack (Python,
NumPy, pyarrow's Parquet reader, pandas result tables) can take for a case: a fresh process that
imports numpy, pandas and pyarrow.parquet and reads the case's columns (the analysis'
declared ``columns`` of the table it streams) of every file into NumPy on one thread per usable core, and does nothing
else (``--no-floor`` leaves it out).  Where the floor is already slower than DuckDB, no
optimisation of gpuclust's own work can reach DuckDB's time at that size.  With two or more
sizes, the Markdown adds each contender's marginal cost (seconds per million windows between
consecutive sizes), which is what a whole cell pays.

gpuclust writes its result tables (Parquet), the summary and ``_run.json``; DuckDB fetches its
result rows.  gpuclust is byte-compiled first (``compileall``), as an installed package is.  Contenders are interleaved round by round (the machine is shared, so timings are
noisy) and the medians reported; a command several cases share (the ``(all tables)`` and
``(tiers)`` cases run the same gpuclust command and floor as their plain case) runs once a round and
its measurement stands for each.  Each row has the ratio gpuclust / DuckDB (< 1: gpuclust is faster).
Writes bench/results/<name>.json and .md with machine, versions and commit; ``--before`` adds an
earlier run's medians (e.g. before an optimisation) as extra columns; ``--merge`` makes one result of
earlier runs of one layout (per size and case the latest run's rows, each row naming its run, and
the runs' environments listed).  A case whose run fails (an
analysis that needs whole instances refuses a flat table larger than a partition: use ``--layout
bucketed``) is listed under "Not measured" with the error's line and left out at larger sizes.
"""

from __future__ import annotations

import argparse
import inspect
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
sys.path.append(str(ROOT / "tests"))  # the SQL peers: tests/references/

from _harness import bench_dataset, environment, run_measured, write_results  # noqa: E402
from references.sql_cell_usage import cell_usage_sql  # noqa: E402
from references.sql_cpi import cpi_sql  # noqa: E402
from references.sql_data_quality import data_quality_full_sql, data_quality_sql  # noqa: E402
from references.sql_job_usage import job_usage_full_sql, job_usage_sql, job_usage_tiers_sql  # noqa: E402
from references.sql_lifecycle import lifecycle_full_sql, lifecycle_sql  # noqa: E402
from references.sql_machine_utilization import machine_utilization_full_sql, machine_utilization_sql  # noqa: E402
from references.sql_peak_prediction import peak_prediction_sql  # noqa: E402
from references.sql_usage_change import usage_change_full_sql, usage_change_sql  # noqa: E402
from references.sql_usage_vs_request import usage_vs_request_full_sql, usage_vs_request_sql  # noqa: E402

#: case -> (gpuclust analyze arguments after the dataset, DuckDB SQL builder, the analysis (its columns))
CASES: dict[str, tuple[list[str], Any, tuple[str, dict[str, str]]]] = {
    "cell-usage": (["cell-usage", "--mode", "notebook"], cell_usage_sql, ("cell-usage", {"mode": "notebook"})),
    "cpi (SQL subset)": (
        ["cpi", "-O", "by=machine", "-O", "regression=none", "-O", "spearman=none"],
        cpi_sql,
        ("cpi", {"by": "machine", "regression": "none", "spearman": "none"}),
    ),
    "lifecycle": (["lifecycle"], lifecycle_sql, ("lifecycle", {})),
    "lifecycle (all tables)": (["lifecycle"], lifecycle_full_sql, ("lifecycle", {})),
    "usage-change": (
        ["usage-change", "-O", "level=instance"],
        usage_change_sql,
        ("usage-change", {"level": "instance"}),
    ),
    "usage-change (all tables)": (
        ["usage-change", "-O", "level=instance"],
        usage_change_full_sql,
        ("usage-change", {"level": "instance"}),
    ),
    "job-usage": (["job-usage"], job_usage_sql, ("job-usage", {})),
    "job-usage (tiers)": (["job-usage"], job_usage_tiers_sql, ("job-usage", {})),
    "job-usage (all tables)": (["job-usage"], job_usage_full_sql, ("job-usage", {})),
    "usage-vs-request": (["usage-vs-request"], usage_vs_request_sql, ("usage-vs-request", {})),
    "usage-vs-request (all tables)": (["usage-vs-request"], usage_vs_request_full_sql, ("usage-vs-request", {})),
    "machine-utilization": (
        ["machine-utilization", "-O", "mode=notebook"],
        machine_utilization_sql,
        ("machine-utilization", {"mode": "notebook"}),
    ),
    "machine-utilization (all tables)": (
        ["machine-utilization", "-O", "mode=notebook"],
        machine_utilization_full_sql,
        ("machine-utilization", {"mode": "notebook"}),
    ),
    "data-quality (SQL subset)": (["data-quality"], data_quality_sql, ("data-quality", {})),
    "data-quality (all tables)": (["data-quality"], data_quality_full_sql, ("data-quality", {})),
    "peak-prediction (SQL part)": (["peak-prediction"], peak_prediction_sql, ("peak-prediction", {})),
}

_DUCK = (
    "import os, sys, duckdb\n"
    "if len(sys.argv) > 2:\n"
    "    os.makedirs(sys.argv[2], exist_ok=True)  # where its COPY statements write the tables\n"
    "con = duckdb.connect()\n"
    "con.execute(f'SET threads={len(os.sched_getaffinity(0))}')\n"
    "con.execute('SET enable_progress_bar=false')\n"
    "rows = con.execute(sys.argv[1]).fetchall()\n"
    "print(len(rows))\n"
)

#: The floor: the fixed stack's imports and the Parquet read of the case's columns, nothing else.
_FLOOR = (
    "import glob, os, sys\n"
    "from concurrent.futures import ThreadPoolExecutor\n"
    "import numpy, pandas, pyarrow.parquet as pq\n"
    "cols = sys.argv[2].split(',')\n"
    "files = sorted(glob.glob(os.path.join(sys.argv[1], sys.argv[3], '**', '*.parquet'), recursive=True))\n"
    "def read(f):\n"
    "    t = pq.ParquetFile(f).read(columns=cols, use_threads=False)\n"
    "    return sum(len(t.column(c).to_numpy()) for c in cols) // len(cols)\n"
    "with ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:\n"
    "    print(sum(pool.map(read, files)))\n"
)


def _measure(cmd: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = run_measured(cmd, env=env)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if m.returncode != 0:
        raise RuntimeError(f"{cmd[:6]} failed ({m.returncode}):\n{m.stdout_tail}")
    return {
        "wall_s": m.wall_s,
        "peak_rss_mib": m.peak_rss_bytes / 2**20,
        "user_s": r1.ru_utime - r0.ru_utime,
        "sys_s": r1.ru_stime - r0.ru_stime,
    }


def case_columns(case: str) -> tuple[str, list[str]]:
    """The table the case's analysis streams and the columns it declares (what gpuclust reads; the
    floor reads them too)."""
    from gpuclust.analyses.registry import create

    name, options = CASES[case][2]
    a = create(name, **options)
    return a.table, list(a.columns)


def duck_out(out: Path) -> Path:
    """Where the DuckDB contender of a case that writes tables (its SQL builder takes ``out``)
    writes them: beside gpuclust's results folder ``out``."""
    return out.with_name(out.name + "-duckdb")


def commands(case: str, ds: Path, out: Path, floor: bool = True) -> dict[str, list[str]]:
    args, sql, _ = CASES[case]
    writes = "out" in inspect.signature(sql).parameters
    cmds = {
        "gpuclust": [
            sys.executable,
            "-m",
            "gpuclust.cli",
            "analyze",
            str(ds),
            *args,
            "--out",
            str(out),
            "--no-plots",
            "--quiet",
        ],
        "duckdb": [
            sys.executable,
            "-c",
            _DUCK,
            *((sql(ds, out=duck_out(out)), str(duck_out(out))) if writes else (sql(ds),)),
        ],
    }
    if floor:
        table, cols = case_columns(case)
        cmds["floor"] = [sys.executable, "-c", _FLOOR, str(ds), ",".join(cols), table]
    return cmds


def _median(runs: list[dict[str, Any]], k: str) -> float:
    return statistics.median(r[k] for r in runs)


def precompile() -> None:
    """Byte-compile gpuclust, as an installed package is: without it (``PYTHONDONTWRITEBYTECODE``,
    a fresh checkout) every measured process would compile its modules from source again."""
    import compileall

    compileall.compile_dir(str(ROOT / "gpuclust"), quiet=1)


def compare(
    sizes: list[int],
    cases: list[str],
    repeat: int,
    dataset: Any = bench_dataset,
    floor: bool = True,
    refused: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Interleaved rounds; one row per (size, case, contender) with medians and the raw runs.

    With ``refused`` (a list), a case whose run fails (e.g. an analysis that needs whole instances
    refusing a flat table larger than a partition) is recorded there, ``{size, case, error}`` (the
    error's last line), and not run at the larger sizes; the other cases go on.  Without it, the
    failure is raised."""
    precompile()
    rows = []
    failed: set[str] = set()
    for size in sizes:
        ds = dataset(size)
        # a command several cases share (the same gpuclust run, or floor, against other SQL) runs
        # once per round; its measurement stands for each of those cases
        done: dict[tuple[int, str, tuple[str, ...]], dict[str, Any]] = {}
        for case in cases:
            if case in failed:
                continue
            order = ["gpuclust", "duckdb", *(["floor"] if floor else [])]
            runs: dict[str, list[dict[str, Any]]] = {who: [] for who in order}
            with tempfile.TemporaryDirectory(prefix="cpu_vs_duckdb-") as tmp:
                try:
                    for rnd in range(repeat):
                        cmds = commands(case, ds, Path(tmp) / "out", floor)
                        # rotate who goes first, so no one always runs on a warmer cache
                        for who in order[rnd % len(order) :] + order[: rnd % len(order)]:
                            key = (rnd, who, tuple(c.replace(tmp, "") for c in cmds[who]))  # (a case's own folder)
                            if key not in done:
                                done[key] = _measure(cmds[who])
                            runs[who].append(done[key])
                        for d in (Path(tmp) / "out", duck_out(Path(tmp) / "out")):
                            shutil.rmtree(d, ignore_errors=True)
                except RuntimeError as e:
                    if refused is None:
                        raise
                    lines = [ln for ln in str(e).splitlines() if ln.strip()]
                    refused.append({"size": size, "case": case, "error": lines[-1] if lines else str(e)})
                    print(json.dumps(refused[-1]), flush=True)
                    failed.add(case)
                    continue
            for who, rs in runs.items():
                row = {
                    "size": size,
                    "case": case,
                    "contender": who,
                    **{k: round(_median(rs, k), 3) for k in ("wall_s", "user_s", "sys_s", "peak_rss_mib")},
                    "runs": rs,
                }
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
    return rows


def _ratios(rows: list[dict[str, Any]]) -> dict[tuple[int, str, str], dict[str, float]]:
    """``{(size, case, contender): {time, rss, cpu}}``: each contender's medians over DuckDB's."""
    by = {(r["size"], r["case"], r["contender"]): r for r in rows}
    out = {}
    for (size, case, who), g in by.items():
        d = by.get((size, case, "duckdb"))
        if who != "duckdb" and d:
            out[(size, case, who)] = {
                "time": g["wall_s"] / d["wall_s"],
                "rss": g["peak_rss_mib"] / d["peak_rss_mib"],
                "cpu": (g["user_s"] + g["sys_s"]) / max(1e-9, d["user_s"] + d["sys_s"]),
            }
    return out


def ratio_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ratios as JSON rows."""
    return [
        {"size": s, "case": c, "contender": w, **{k: round(x, 3) for k, x in v.items()}}
        for (s, c, w), v in _ratios(rows).items()
    ]


def marginal(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case and contender, between consecutive sizes: the median wall and CPU seconds added per
    million windows (what a larger cell pays, start-up left out); in a merged result, between sizes
    of one run."""
    by: dict[tuple[str, str, int | None], list[dict[str, Any]]] = {}
    for r in rows:  # a merged result's rows: within their run only
        by.setdefault((r["case"], r["contender"], r.get("run")), []).append(r)
    out = []
    for (case, who, _), rs in by.items():
        rs = sorted(rs, key=lambda r: r["size"])
        for a, b in zip(rs, rs[1:], strict=False):
            dm = (b["size"] - a["size"]) / 1e6
            out.append(
                {
                    "case": case,
                    "contender": who,
                    "from": a["size"],
                    "to": b["size"],
                    "wall_s_per_m": round((b["wall_s"] - a["wall_s"]) / dm, 4),
                    "cpu_s_per_m": round((b["user_s"] + b["sys_s"] - a["user_s"] - a["sys_s"]) / dm, 4),
                }
            )
    return out


def markdown(
    rows: list[dict[str, Any]],
    env: dict[str, Any],
    repeat: int,
    before: list[dict[str, Any]] | None,
    refused: list[dict[str, Any]] | None = None,
    runs: list[dict[str, Any]] | None = None,
) -> str:
    """The result's Markdown; with ``runs`` (a merged result, :func:`merge_runs`), each row's run in
    a column and the runs listed instead of one environment."""
    rat = _ratios(rows)
    brat = _ratios(before) if before else {}
    bby = {(r["size"], r["case"], r["contender"]): r for r in before or []}
    machines = sorted(
        {f"{e['affinity_cores']} cores, {e['cpu']}" for e in [r["environment"] for r in runs or []] or [env]}
    )
    md = [
        f"# gpuclust vs DuckDB, whole process ({' / '.join(machines)})",
        "",
        (f"Medians of {repeat} interleaved rounds" if not runs else "Medians of each run's interleaved rounds")
        + "; wall = spawn to exit; CPU = user + system seconds; RSS = peak "
        "of the process tree. On a shared machine wall times carry the other load; CPU seconds much less.",
        "",
        "| windows | case | contender | wall s | user s | sys s | peak RSS MiB | time / DuckDB | CPU / DuckDB "
        "| RSS / DuckDB |"
        + (" before: wall s | before: RSS MiB | before: time / DuckDB | before: CPU / DuckDB |" if before else "")
        + (" run |" if runs else ""),
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"
        + ("---:|---:|---:|---:|" if before else "")
        + ("---:|" if runs else ""),
    ]
    for r in rows:
        k = (r["size"], r["case"], r["contender"])
        t = f"{rat[k]['time']:.2f}" if k in rat else ""
        m = f"{rat[k]['rss']:.2f}" if k in rat else ""
        u = f"{rat[k]['cpu']:.2f}" if k in rat else ""
        line = (
            f"| {r['size']:,} | {r['case']} | {r['contender']} | {r['wall_s']:.2f} | {r['user_s']:.2f} "
            f"| {r['sys_s']:.2f} | {r['peak_rss_mib']:,.0f} | {t} | {u} | {m} |"
        )
        if before:
            b = bby.get((r["size"], r["case"], r["contender"]))
            bt = f"{brat[k]['time']:.2f}" if k in brat else ""
            bu = f"{brat[k]['cpu']:.2f}" if k in brat else ""
            line += f" {b['wall_s']:.2f} | {b['peak_rss_mib']:,.0f} | {bt} | {bu} |" if b else " | | | |"
        if runs:
            line += f" {r['run']} |"
        md.append(line)
    md += [
        "",
        "gpuclust: `python -m gpuclust.cli analyze DS <case> --out TMP --no-plots --quiet` (the engine's "
        "defaults: partitions='auto', one thread per usable core). DuckDB: `python -c` running "
        "the SQL references of tests/references/ (`cell_usage_sql` / `cpi_sql` / `lifecycle_sql` / `usage_change_sql` / `job_usage_sql` / "
        "`job_usage_tiers_sql` / `usage_vs_request_sql` / `machine_utilization_sql` / `data_quality_sql`) with `SET threads` = "
        "usable cores, results fetched; the `(all tables)` cases run `*_full_sql`, which write every table the analysis "
        "writes as Parquet; `peak-prediction (SQL part)` runs `peak_prediction_sql`, which writes the columns of its "
        "`machine` table SQL computes. cpi (SQL subset) = `-O by=machine -O regression=none -O spearman=none`.",
        "floor: a fresh process importing numpy, pandas and pyarrow.parquet and reading the case's columns "
        "(what gpuclust reads) of every file into NumPy, one thread per usable core, nothing else.",
        "",
    ]
    marg = marginal(rows)
    if marg:
        duck = {(m["case"], m["from"], m["to"]): m for m in marg if m["contender"] == "duckdb"}
        md += [
            "Marginal cost between sizes (median seconds per million windows; start-up cancels out):",
            "",
            "| case | contender | windows | wall s / M | CPU s / M | wall / DuckDB's |",
            "|---|---|---|---:|---:|---:|",
        ]
        for m in marg:
            d = duck.get((m["case"], m["from"], m["to"]))
            rel = f"{m['wall_s_per_m'] / d['wall_s_per_m']:.2f}" if d and d["wall_s_per_m"] > 0 else ""
            md.append(
                f"| {m['case']} | {m['contender']} | {m['from']:,} -> {m['to']:,} | {m['wall_s_per_m']:.4f} "
                f"| {m['cpu_s_per_m']:.4f} | {rel} |"
            )
        md.append("")
    if refused:
        md += ["Not measured (a run failed; the case was left out from that size on):", ""]
        md += [f"* {r['case']} at {r['size']:,} windows: {r['error']}" for r in refused]
        md.append("")
    if runs:
        md += [
            "Runs (merged: per size and case the rows of the latest run that measured it; ratios and marginal "
            "costs within a run; every run's rows, environment and source file are in the JSON):",
            "",
        ]
        for k, run in enumerate(runs):
            e = run["environment"]
            md.append(
                f"* {k}: {e['date']}, commit {str(e['commit'])[:7]}{' (dirty)' if e.get('dirty') else ''}, "
                f"medians of {run['repeat']}, {e['affinity_cores']} cores, {e['cpu']}, load {e['load_avg_1m']}, "
                + ", ".join(f"{v}={e[v]}" for v in ("python", "numpy", "pyarrow", "duckdb", "gpuclust") if v in e)
            )
        md.append("")
        return "\n".join(md)
    md += ["Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), ""]
    return "\n".join(md)


def _runs_of(path: Path) -> list[tuple[dict[str, Any], str]]:
    """The runs one JSON file holds, each as a run's payload and its source: a run's own file is one;
    a merged result (``runs``) gives back each of its runs with the rows and refusals it kept."""
    payload = json.loads(path.read_text())
    if "runs" not in payload:
        rel = path.resolve()
        return [(payload, str(rel.relative_to(ROOT)) if rel.is_relative_to(ROOT) else str(path))]
    return [
        (
            {
                "repeat": run["repeat"],
                "layout": payload.get("layout", "flat"),
                "environment": run["environment"],
                "rows": [r for r in payload["rows"] if r["run"] == k],
                "refused": [r for r in payload.get("refused") or [] if r["run"] == k],
            },
            run["source"],
        )
        for k, run in enumerate(payload["runs"])
    ]


def merge_runs(sources: list[Path]) -> dict[str, Any]:
    """One result from earlier runs of one layout (their JSON files, or a merged result to add runs
    to): per (size, case) the rows of the latest run (by its date) that measured it, each with
    ``run``, its index in ``runs`` (the source, its rounds and its environment, oldest first)."""
    loaded = sorted((r for p in sources for r in _runs_of(p)), key=lambda x: x[0]["environment"]["date"])
    layouts = {p.get("layout", "flat") for p, _ in loaded}
    if len(layouts) != 1:
        raise ValueError(f"runs of different layouts: {sorted(layouts)}")
    latest = {(r["size"], r["case"]): k for k, (p, _) in enumerate(loaded) for r in p["rows"]}
    case_order, who_order = {c: i for i, c in enumerate(CASES)}, {"gpuclust": 0, "duckdb": 1, "floor": 2}
    rows = [
        {**r, "run": k} for k, (p, _) in enumerate(loaded) for r in p["rows"] if latest[(r["size"], r["case"])] == k
    ]
    rows.sort(key=lambda r: (r["size"], case_order.get(r["case"], len(CASES)), who_order.get(r["contender"], 3)))
    refused = [
        {**r, "run": k}
        for k, (p, _) in enumerate(loaded)
        for r in p.get("refused") or []
        if latest.get((r["size"], r["case"]), -1) < k
    ]

    return {
        "benchmark": "cpu_vs_duckdb",
        "layout": layouts.pop(),
        "runs": [{"source": f, "repeat": p["repeat"], "environment": p["environment"]} for p, f in loaded],
        "rows": rows,
        "refused": refused,
        "marginal": marginal(rows),
        "ratios": ratio_rows(rows),
        "before": None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4e6,1.6e7", help="comma-separated window counts")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (medians reported)")
    ap.add_argument(
        "--layout",
        choices=["flat", "bucketed"],
        default="flat",
        help="flat = the generated dataset; bucketed = its `gpuclust optimize`d copy (both contenders "
        "read the same files)",
    )
    ap.add_argument("--name", default="cpu_vs_duckdb")
    ap.add_argument("--no-floor", action="store_true", help="leave out the floor contender (imports + Parquet read)")
    ap.add_argument("--before", type=Path, default=None, help="an earlier run's JSON: its medians become columns")
    ap.add_argument("--note", default="", help="a line added to the Markdown (e.g. what 'before' was)")
    ap.add_argument(
        "--render", type=Path, default=None, help="re-write the Markdown of an earlier run's JSON (no runs)"
    )
    ap.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="earlier runs' JSON (one layout): write one result (--name) of, per size and case, the latest run's rows",
    )
    args = ap.parse_args(argv)
    if args.merge:
        payload = merge_runs(args.merge)
        md = markdown(payload["rows"], {}, 0, None, payload["refused"], payload["runs"])
        jp, mp = write_results(args.name, payload, md)
        print(md)
        print(f"wrote {jp} and {mp}")
        return 0
    if args.render:
        payload = json.loads(args.render.read_text())
        md = markdown(
            payload["rows"],
            payload.get("environment", {}),
            payload.get("repeat", 0),
            payload.get("before"),
            payload.get("refused"),
            payload.get("runs"),
        )
        md = md.replace("\n\n", f"\n\n{args.note}\n\n", 1) if args.note else md
        payload["ratios"] = ratio_rows(payload["rows"])
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

    refused: list[dict[str, Any]] = []
    rows = compare(
        [int(float(s)) for s in args.sizes.split(",")], cases, args.repeat, dataset, not args.no_floor, refused
    )
    before = json.loads(args.before.read_text())["rows"] if args.before else None
    env = environment()
    md = markdown(rows, env, args.repeat, before, refused)
    if args.note:
        md = md.replace("\n\n", f"\n\n{args.note}\n\n", 1)
    payload = {
        "benchmark": "cpu_vs_duckdb",
        "repeat": args.repeat,
        "layout": args.layout,
        "rows": rows,
        "refused": refused,
        "marginal": marginal(rows),
        "environment": env,
        "ratios": ratio_rows(rows),
        "before": before,
    }
    jp, mp = write_results(args.name, payload, md)
    print(md)
    print(f"wrote {jp} and {mp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
