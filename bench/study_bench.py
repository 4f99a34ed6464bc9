"""Study benchmark: load a cell's usage columns once, then every analysis over the resident data.

    python bench/study_bench.py --sizes 1e6,1e7 --backends cpu,gpu     # on a GPU machine
    python bench/study_bench.py --sizes 1e6 --backends cpu              # anywhere
    python bench/study_bench.py --sizes 1e7 --backends gpu,gpu+cuda     # resident on a LocalCUDACluster too
    python bench/study_bench.py --sizes 1e7 --backends gpu,cpu,duckdb   # and DuckDB on resident tables

A backend ``B+SCHED`` opens the study with ``scheduler=SCHED`` (its partitions on that cluster's
workers: ``gpu+cuda``, ``cpu+local:2``); the cluster's start is part of the process time and not
of the load.

Each (size, backend) runs in its own process (``--rounds`` times, interleaved across backends;
medians reported), which opens the dataset with ``gpuclust.open``, persists the columns every
registered analysis reads (timed: the load; on a gpu the CUDA context is made before), then runs
each analysis ``--repeat`` times on the resident data (best time) and all of them in one ``run``
call, and where each analysis' best run spent its time (``Study.last_run_seconds``: partials,
merge, finalize, convert).  On a gpu backend one run of all of them comes first, timed apart and reported as
``first run s``: it compiles the kernels (CuPy's cache is empty on a fresh machine), which would
otherwise land in the first analysis' time at ``--repeat 1``.  The parent samples the process
tree's peak RSS and the whole process' wall time.  On the gpu the child also measures the two
ceilings of the load in the same process: pinned host->device bandwidth and the host Parquet
decode rate of the same columns (``bench/gpu_profile.py``), and reports the load's rate as a
fraction of the lower one.  Same data and options as ``bench/analyses_bench.py``.

Backend ``duckdb`` is the SQL peer on resident data: a process loads the dataset's tables into
DuckDB's memory (timed: its load), then runs each SQL peer of tests/references/
(``references.sql_peers.DUCKDB_SQL``) over those tables, one thread per usable core, best of
``--repeat``.  The report sets each against the gpuclust column that computes the same (the
SQL-subset variant where there is one: cpi's moments and Pearson r alone; the gpuclust processes
run those variants besides the registered analyses); the issue's target on the gpu is 10x DuckDB.

Writes bench/results/<name>.{json,md} with device, versions and commit.
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
sys.path.append(str(HERE.parent / "tests"))  # the SQL peers: tests/references/

from _harness import bench_dataset, environment, publish, run_measured  # noqa: E402

#: The tables a DuckDB process loads into its memory (those the SQL peers read).
DUCK_TABLES = ("instance_usage", "instance_events", "machine_events", "collection_events")


def duck_child(ds: Path, repeat: int) -> None:
    """The DuckDB peer on resident data: the dataset's tables loaded into DuckDB's memory once
    (timed: its load), then each SQL peer of ``references.sql_peers.DUCKDB_SQL`` over them, best of
    ``repeat``; one thread per usable core.  Peers that read the files' row order
    (``file_row_number``) cannot run over a table and are left out."""
    from analyses_bench import _duck, resident_sql
    from references.sql_peers import DUCKDB_SQL

    con = _duck()
    t0 = time.perf_counter()
    for t in DUCK_TABLES:
        if (ds / t).is_dir():
            con.execute(
                f"CREATE TABLE {t} AS SELECT * FROM read_parquet('{ds}/{t}/**/*.parquet', hive_partitioning=false)"
            )
    out: dict[str, Any] = {"load_s": time.perf_counter() - t0, "queries": {}}
    for analysis, peers in DUCKDB_SQL.items():
        for peer, sql_of in peers.items():
            sql = resident_sql(sql_of(ds), ds)
            if sql is None:
                continue
            best = float("inf")
            for _ in range(repeat):
                t = time.perf_counter()
                con.execute(sql).fetchall()
                best = min(best, time.perf_counter() - t)
            out["queries"][f"{analysis} {peer}"] = {"analysis": analysis, "s": best}
    print("RESULT " + json.dumps(out), flush=True)


def bench_analyses() -> dict[str, Any]:
    """``{label: analysis}``: every registered analysis with the bench's options, and the
    variants restricted to what a SQL peer computes (``analyses_bench.BENCH_VARIANTS``, labelled
    ``name[opt=value,...]``)."""
    from analyses_bench import BENCH_OPTIONS, BENCH_VARIANTS, variant_label

    from gpuclust.analyses.registry import create, names

    out = {n: create(n, **BENCH_OPTIONS.get(n, {})) for n in names()}
    for n, variants in BENCH_VARIANTS.items():
        for v in variants:
            out[variant_label(n, v)] = create(n, **{**BENCH_OPTIONS.get(n, {}), **v})
    return out


def sql_base(analysis: str, labels: Any) -> str:
    """The gpuclust column a SQL peer of ``analysis`` is compared with: its SQL-subset variant
    where there is one, else the analysis."""
    from analyses_bench import BENCH_VARIANTS, variant_label

    return next(
        (variant_label(analysis, v) for v in BENCH_VARIANTS.get(analysis, []) if variant_label(analysis, v) in labels),
        analysis,
    )


def child(label: str, ds: Path, repeat: int) -> None:
    if label == "duckdb":
        duck_child(ds, repeat)
        return
    import gpuclust
    from gpuclust.analyses.registry import names

    backend, _, scheduler = label.partition("+")
    study = gpuclust.open(ds, backend=backend, scheduler=scheduler or None)
    local_gpu = backend == "gpu" and not scheduler
    if local_gpu:  # the process' CUDA context is not part of the load
        study.backend.xp.zeros(1)
        study.backend.xp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    study.persist()
    if local_gpu:
        study.backend.xp.cuda.Device().synchronize()
    load = time.perf_counter() - t0
    out: dict[str, Any] = {
        "load_s": load,
        "loaded_bytes": study.loaded_bytes,
        "load_gbs": study.loaded_bytes / load / 1e9,
        "analyses": {},
    }
    labelled = bench_analyses()
    ans = list(labelled.values())
    if backend == "gpu":  # the first run compiles every kernel (an empty kernel cache on a fresh machine)
        t = time.perf_counter()
        study.run(ans)
        out["first_run_s"] = time.perf_counter() - t
    out["phases"] = {}
    for name, a in labelled.items():
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            study.run(a)
            took = time.perf_counter() - t
            if took < best:
                best, out["phases"][name] = took, dict(study.last_run_seconds)
        out["analyses"][name] = best
    t = time.perf_counter()
    study.run([labelled[n] for n in names()])  # the registered analyses (not the SQL-subset variants)
    out["all_at_once_s"] = time.perf_counter() - t
    if backend == "gpu" and not scheduler:
        from gpu_profile import decode_rates, transfer_rates

        out["ceilings"] = {**transfer_rates(study.backend.xp), **decode_rates(ds)}
        floor = min(out["ceilings"]["h2d_pinned_gbs"], out["ceilings"]["decode_gbs"])
        out["load_vs_ceiling"] = out["load_gbs"] / floor
    study.close()
    print("RESULT " + json.dumps(out), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1e6,1e7")
    ap.add_argument("--backends", default="cpu,gpu")
    ap.add_argument("--rounds", type=int, default=1, help="processes per (size, backend), interleaved")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each analysis inside a process (best)")
    ap.add_argument("--name", default="study")
    ap.add_argument("--child", nargs=2, metavar=("BACKEND", "DATASET"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], Path(args.child[1]), args.repeat)
        return 0
    backends = args.backends.split(",")
    if not [b for b in backends if b != "duckdb"]:
        ap.error("--backends: name a gpuclust backend (cpu, gpu, ...) beside duckdb")
    rows: list[dict[str, Any]] = []
    duck_rows: list[dict[str, Any]] = []
    for size in [int(float(s)) for s in args.sizes.split(",")]:
        ds = bench_dataset(size)
        runs: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
        for _ in range(args.rounds):
            for b in backends:
                m = run_measured([sys.executable, __file__, "--child", b, str(ds), "--repeat", str(args.repeat)])
                line = next((ln for ln in m.stdout_tail.splitlines() if ln.startswith("RESULT ")), None)
                if m.returncode != 0 or line is None:
                    print(m.stdout_tail[-3000:], flush=True)
                    raise SystemExit(f"{b} at {size:,} failed (exit {m.returncode})")
                r = json.loads(line[7:])
                r.update(wall_s=m.wall_s, peak_rss_mib=m.peak_rss_bytes / 2**20)
                runs[b].append(r)
                print(json.dumps({"size": size, "backend": b, **r}), flush=True)
        for b, rs in runs.items():
            if b == "duckdb":
                duck_rows.append(
                    {
                        "size": size,
                        "backend": b,
                        "rounds": len(rs),
                        **{k: statistics.median(r[k] for r in rs) for k in ("load_s", "wall_s", "peak_rss_mib")},
                        "queries": {
                            q: {"analysis": v["analysis"], "s": statistics.median(r["queries"][q]["s"] for r in rs)}
                            for q, v in rs[0]["queries"].items()
                        },
                    }
                )
                continue
            med = {
                k: statistics.median(r[k] for r in rs)
                for k in ("load_s", "load_gbs", "all_at_once_s", "wall_s", "peak_rss_mib")
            }
            med["analyses"] = {a: statistics.median(r["analyses"][a] for r in rs) for a in rs[0]["analyses"]}
            for k in ("ceilings", "load_vs_ceiling", "loaded_bytes", "first_run_s", "phases"):
                if k in rs[0]:
                    med[k] = rs[-1][k]
            rows.append({"size": size, "backend": b, "rounds": len(rs), **med})
    env = environment()
    md = [
        f"# Study benchmark ({env.get('cores')} cores, {env.get('gpu') or 'no GPU'})",
        "",
        "Persist once (`gpuclust.open(ds, backend=...).persist()`: every column a registered analysis reads), "
        "then each analysis on the resident data (best of the process' runs; median over processes).",
        "",
        "| windows | backend | load s | load GB/s | "
        + " | ".join(rows[0]["analyses"])
        + " | all at once s | process s | peak RSS MiB |",
        "|---:|---|---:|---:|" + "---:|" * len(rows[0]["analyses"]) + "---:|---:|---:|",
    ]
    for r in rows:
        md.append(
            f"| {r['size']:,} | {r['backend']} | {r['load_s']:.3f} | {r['load_gbs']:.2f} | "
            + " | ".join(f"{v:.4f}" for v in r["analyses"].values())
            + f" | {r['all_at_once_s']:.3f} | {r['wall_s']:.2f} | {r['peak_rss_mib']:,.0f} |"
        )
    by = {(r["size"], r["backend"]): r for r in rows}
    ratio_lines = []
    for (size, b), r in by.items():
        if b == "gpu" and (size, "cpu") in by:
            c = by[(size, "cpu")]
            ratio_lines.append(
                f"| {size:,} | "
                + " | ".join(f"{c['analyses'][a] / r['analyses'][a]:.1f}x" for a in r["analyses"])
                + f" | {c['all_at_once_s'] / r['all_at_once_s']:.1f}x |"
            )
    if ratio_lines:
        md += [
            "",
            "gpu speed-up over cpu on resident data (target: >= 20x):",
            "",
            "| windows | " + " | ".join(rows[0]["analyses"]) + " | all at once |",
            "|---:|" + "---:|" * (len(rows[0]["analyses"]) + 1),
            *ratio_lines,
        ]
    phased = [r for r in rows if r.get("phases")]
    if phased:
        md += [
            "",
            "Where each analysis' best run went, in seconds (`Study.last_run_seconds`, the last round's process): "
            "partials (on the backend, with their copy back) / merge / finalize / convert:",
            "",
            "| analysis | " + " | ".join(f"{r['size']:,} {r['backend']}" for r in phased) + " |",
            "|---|" + "---|" * len(phased),
        ]
        for a in rows[0]["analyses"]:
            md.append(
                f"| {a} | "
                + " | ".join(
                    " / ".join(
                        f"{r['phases'][a].get(k, float('nan')):.3f}"
                        for k in ("partials", "merge", "finalize", "convert")
                    )
                    for r in phased
                )
                + " |"
            )
    by_size = {(r["size"], r["backend"]): r for r in rows}
    for d in duck_rows:
        gpus = [b for b in ("gpu", "cpu") if (d["size"], b) in by_size]
        md += [
            "",
            f"DuckDB on resident data at {d['size']:,} windows: the dataset's tables loaded into DuckDB's memory "
            f"once ({d['load_s']:.3f} s; process {d['wall_s']:.2f} s, peak RSS {d['peak_rss_mib']:,.0f} MiB), then "
            "each SQL peer of tests/references/ over them (one thread per usable core), against the gpuclust "
            "column it is compared with (its SQL-subset variant where there is one; target on the gpu: >= 10x):",
            "",
            "| query | DuckDB s | gpuclust column | "
            + " | ".join(f"{b} s | {b} speed-up over DuckDB" for b in gpus)
            + " |",
            "|---|---:|---|" + "---:|---:|" * len(gpus),
        ]
        for q, v in d["queries"].items():
            base = sql_base(v["analysis"], rows[0]["analyses"] if rows else {})
            cells = []
            for b in gpus:
                t = by_size[(d["size"], b)]["analyses"].get(base)
                cells += ["" if t is None else f"{t:.4f}", "" if t is None else f"{v['s'] / t:.1f}x"]
            md.append(f"| {q} | {v['s']:.4f} | {base} | " + " | ".join(cells) + " |")
    for r in rows:
        if "first_run_s" in r:
            md.append(
                f"\nFirst run at {r['size']:,} on {r['backend']} (all analyses, kernels compiled): "
                f"{r['first_run_s']:.3f} s; the tables above are the runs after it."
            )
        if "ceilings" in r:
            c = r["ceilings"]
            md.append(
                f"\nLoad at {r['size']:,}: {r['load_gbs']:.2f} GB/s of decoded columns; ceilings measured in the same "
                f"process: pinned H2D {c['h2d_pinned_gbs']:.1f} GB/s, pageable H2D {c['h2d_pageable_gbs']:.1f} GB/s, "
                f"host Parquet decode {c['decode_gbs']:.2f} GB/s -> {100 * r['load_vs_ceiling']:.0f}% of the lower "
                "(target: >= 50%)."
            )
    publish(args.name, {"rows": rows, "duckdb": duck_rows}, md, env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
