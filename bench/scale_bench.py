"""Scale benchmark (issue 8): every analysis as a whole `gpuclust analyze` process at growing sizes,
peak RSS of the process tree and wall time, to show whether memory stays flat beyond one
partition's worth and time grows linearly.

    python bench/scale_bench.py                                   # 4e6,1.6e7 + long-span, bucketed (what ingest writes)
    python bench/scale_bench.py --sizes 1e6,4e6 --no-long-span --repeat 2
    python bench/scale_bench.py --analyses cell-usage,usage-distribution[by=instance] --timeout 600
    python bench/scale_bench.py --layout both                     # also the flat layout (`ingest --layout flat`)
    python bench/scale_bench.py --sizes 6.4e7 --no-long-span --append   # add larger runs to scale.json
    python bench/scale_bench.py --render                          # rewrite scale.md from scale.json

Data: `bench/gen_canonical.py`, cached under bench/data/ (git-ignored): canonical-<size> (the
datasets every benchmark shares) and the long-span set canonical-<windows>-m<machines>-d<days>
(default 1e7 windows on 2,000 machines over 31 days: sparse machines, 17.9M machine x 5-min
buckets).  The bucketed layout is the flat dataset copied to <flat>-bucketed and rewritten by
`gpuclust optimize` (cached): the layout `gpuclust ingest` writes by default, so the default here.

Each run is `python -m gpuclust.cli analyze DATASET NAME [-O ...] --out TMP --backend cpu
--no-plots --quiet` (partitions auto, one thread per usable core), measured by
bench/_harness.py's `run_measured`: wall time of the process, peak RSS summed over the process
tree (sampled every 50 ms).  Repeats are interleaved (every run of repeat 1, then of repeat 2);
the tables report medians.  A run that passes `--timeout` or `--max-rss` is killed and recorded as
such; the same analysis is then not run at larger sizes (recorded as skipped).  `--memory-limit`
is passed to `analyze` when it has that option (noted otherwise).

Writes bench/results/<name>.json (every run, the medians, the environment: machine, versions,
commit) and <name>.md: per analysis, time and peak RSS by size, seconds per million windows
(linearity), the peak-RSS ratio 1.6e7 / 4e6 (issue 33's goal: <= 1.5x; pass / FAIL) and the
long-span row, and a summary table of the ratios at the top.  Results are rewritten after every run, so an interrupted benchmark keeps what it
measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import _harness  # noqa: E402
from _harness import bench_dataset, environment, run_measured, write_results  # noqa: E402

DEFAULT_SIZES = "4e6,1.6e7"
DEFAULT_LONG_SPAN = "1e7,2000,31"
#: The sizes of the memory goal (issue 33): peak RSS at BIG within RSS_TARGET x of SMALL (4x the windows).
RATIO_SMALL, RATIO_BIG, RSS_TARGET = 4_000_000, 16_000_000, 1.5
#: Per analysis the -O options of its benchmarked variants (label -> options); usage-distribution's
#: first is its default grouping, named, so that its label differs from the analysis's name.
VARIANT_OPTIONS: dict[str, list[dict[str, str]]] = {
    "usage-distribution": [{"by": "tier"}, {"by": "machine"}, {"by": "instance"}, {"by": "collection"}],
}


def variants(names: list[str]) -> list[tuple[str, str, dict[str, str]]]:
    """``(label, analysis, options)`` for every registered analysis (several for usage-distribution)."""
    out = []
    for n in names:
        for opts in VARIANT_OPTIONS.get(n, [{}]):
            label = n + (f"[{','.join(f'{k}={v}' for k, v in opts.items())}]" if opts else "")
            out.append((label, n, opts))
    return out


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


def _cli(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuclust.cli", *args], capture_output=True, text=True, env=_env(), timeout=timeout
    )


def has_optimize() -> tuple[bool, bool]:
    """Whether ``gpuclust optimize`` exists, and whether it takes ``--out``."""
    r = _cli("optimize", "--help")
    return r.returncode == 0, r.returncode == 0 and "--out" in r.stdout


def analyze_has_memory_limit() -> bool:
    return "--memory-limit" in _cli("analyze", "--help").stdout


def bucketed(flat: Path, takes_out: bool) -> Path:
    """The `gpuclust optimize`d copy of ``flat`` (cached beside it)."""
    dst = flat.with_name(flat.name + "-bucketed")
    if (dst / "manifest.json").exists():
        return dst
    print(f"optimizing {flat} into {dst}", flush=True)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if takes_out:
        r = _cli("optimize", str(flat), "--out", str(tmp))
    else:
        shutil.copytree(flat, tmp)
        r = _cli("optimize", str(tmp))
    if r.returncode != 0:
        raise RuntimeError(f"gpuclust optimize {flat} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    tmp.rename(dst)
    return dst


def _size(s: str) -> int:
    return int(float(s))


def size_label(size: int) -> str:
    """1e6, 4e6, 1.6e7, 6.4e7 (as the issue writes them)."""
    return f"{size:.2g}".replace("e+0", "e").replace("e+", "e")


def _dataset_rows(ds: Path) -> tuple[int, int | None, float | None]:
    man = json.loads((ds / "manifest.json").read_text())
    gen = man.get("generator", {})
    return int(man["tables"]["instance_usage"]["rows"]), gen.get("machines"), gen.get("days")


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians per (layout, dataset, analysis) over the runs that finished."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["layout"], r["dataset"], r["analysis"]), []).append(r)
    out = []
    for (layout, dataset, analysis), rs in groups.items():
        ok = [r for r in rs if r["status"] == "ok"]
        first = rs[0]
        row: dict[str, Any] = {
            "layout": layout,
            "dataset": dataset,
            "analysis": analysis,
            "size": first["size"],
            "windows": first.get("windows"),
            "long_span": first["long_span"],
            "runs": len(rs),
            "ok": len(ok),
        }
        if ok:
            row["wall_s"] = round(statistics.median(r["wall_s"] for r in ok), 3)
            row["peak_rss_bytes"] = int(statistics.median(r["peak_rss_bytes"] for r in ok))
            cpu = [r["cpu_s"] for r in ok if r.get("cpu_s") is not None]
            if cpu:
                row["cpu_s"] = round(statistics.median(cpu), 3)
            if row["windows"]:
                row["s_per_mwindows"] = round(row["wall_s"] / (row["windows"] / 1e6), 3)
                if cpu:
                    row["cpu_s_per_mwindows"] = round(row["cpu_s"] / (row["windows"] / 1e6), 3)
            loads = [r["load_avg_1m"] for r in ok if r.get("load_avg_1m") is not None]
            if loads:
                row["load_avg_1m"] = statistics.median(loads)
            row["status"] = "ok"
        else:
            worst = next((r for r in rs if r["status"] != "skipped"), rs[-1])
            row["status"] = worst["status"]
            if "peak_rss_bytes" in worst:
                row["peak_rss_bytes_at_kill"] = worst["peak_rss_bytes"]
            if "wall_s" in worst:
                row["wall_s_at_kill"] = worst["wall_s"]
        out.append(row)
    return out


def _gib(b: int | None) -> str:
    return f"{b / 2**30:.2f}" if b else ""


def markdown(summary: list[dict[str, Any]], env: dict[str, Any], notes: list[str]) -> str:
    md = [
        f"# Scale benchmark ({env['cores']} cores, {env['memory_gib']} GiB{', ' + env['gpu'] if env['gpu'] else ', no GPU'})",
        "",
        f"Commit {env['commit']}{' (dirty)' if env['dirty'] else ''}, {env['date']}.  Whole `gpuclust analyze` process, cpu "
        "backend; medians of the finished runs.  Goal: peak RSS at 1.6e7 windows within "
        f"{RSS_TARGET}x of 4e6 (4x the windows), time linear (s per million windows flat).",
        "",
    ]
    by_an: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in summary:
        by_an.setdefault((r["analysis"], r["layout"]), []).append(r)
    md += ["| analysis | layout | peak RSS GiB at 4e6 | at 1.6e7 | ratio | goal |", "|---|---|---:|---:|---:|---|"]
    for (an, layout), rs in sorted(by_an.items()):
        ok = {r["size"]: r for r in rs if r["status"] == "ok" and not r["long_span"]}
        small, big = ok.get(RATIO_SMALL), ok.get(RATIO_BIG)
        if small and big:
            ratio = big["peak_rss_bytes"] / small["peak_rss_bytes"]
            md.append(
                f"| {an} | {layout} | {_gib(small['peak_rss_bytes'])} | {_gib(big['peak_rss_bytes'])} | "
                f"{ratio:.2f}x | {'pass' if ratio <= RSS_TARGET else '**FAIL**'} |"
            )
        else:
            failed = next((r["status"] for r in rs if r["status"] not in ("ok", "skipped")), "not measured")
            md.append(f"| {an} | {layout} | {_gib(small['peak_rss_bytes']) if small else ''} | | | {failed} |")
    md.append("")
    for (an, layout), rs in sorted(by_an.items()):
        md += [
            f"## {an} ({layout})",
            "",
            "| dataset | windows | status | wall s | CPU s | peak RSS GiB | wall s per 1e6 windows | CPU s per 1e6 windows | load |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        rs = sorted(rs, key=lambda r: (r["long_span"], r["size"]))
        for r in rs:
            if r["status"] == "ok":
                md.append(
                    f"| {r['dataset']} | {r['windows']:,} | ok ({r['ok']}/{r['runs']}) | {r['wall_s']:.1f} | "
                    f"{r.get('cpu_s', '')} | {_gib(r['peak_rss_bytes'])} | {r.get('s_per_mwindows', '')} | "
                    f"{r.get('cpu_s_per_mwindows', '')} | {r.get('load_avg_1m', '')} |"
                )
            else:
                at = []
                if r.get("wall_s_at_kill") is not None:
                    at.append(f"after {r['wall_s_at_kill']:.0f} s")
                if r.get("peak_rss_bytes_at_kill"):
                    at.append(f"at {_gib(r['peak_rss_bytes_at_kill'])} GiB")
                md.append(
                    f"| {r['dataset']} | {r['windows'] or '':,} | **{r['status']}** {', '.join(at)} | | | | | | |"
                )
        md.append("")
        ok = {r["size"]: r for r in rs if r["status"] == "ok" and not r["long_span"]}
        small = ok.get(RATIO_SMALL)
        unfinished = [
            r
            for r in rs
            if not r["long_span"] and r["status"] not in ("ok", "skipped") and small and r["size"] > RATIO_SMALL
        ]
        if small and RATIO_BIG in ok:
            ratio = ok[RATIO_BIG]["peak_rss_bytes"] / small["peak_rss_bytes"]
            md.append(
                f"Peak RSS 1.6e7 / 4e6: **{ratio:.2f}x** ({'pass' if ratio <= RSS_TARGET else 'FAIL'}, target <= {RSS_TARGET}x)."
            )
        elif small:
            big = max(ok)
            if big > RATIO_SMALL:
                ratio = ok[big]["peak_rss_bytes"] / small["peak_rss_bytes"]
                verdict = (
                    ("FAIL" + (" (larger sizes did not finish)" if unfinished else ""))
                    if (ratio > RSS_TARGET or unfinished)
                    else "1.6e7 not measured"
                )
                md.append(
                    f"Peak RSS {size_label(big)} / 4e6: **{ratio:.2f}x** ({big // RATIO_SMALL}x the windows; {verdict}; "
                    f"target 1.6e7 / 4e6 <= {RSS_TARGET}x)."
                )
            elif unfinished:
                u = min(unfinished, key=lambda r: r["size"])
                at = u.get("peak_rss_bytes_at_kill")
                md.append(
                    f"Peak RSS: {size_label(u['size'])} did not finish ({u['status']}"
                    + (f", already {at / small['peak_rss_bytes']:.2f}x 4e6's when killed" if at else "")
                    + f"): **FAIL** (target 1.6e7 / 4e6 <= {RSS_TARGET}x)."
                )
        per = [r for r in rs if r["status"] == "ok" and not r["long_span"] and r.get("s_per_mwindows")]
        if len(per) >= 2:
            lo, hi = per[0], per[-1]
            md.append(
                f"Wall s per million windows {lo['dataset']} -> {hi['dataset']}: {lo['s_per_mwindows']} -> "
                f"{hi['s_per_mwindows']} ({hi['s_per_mwindows'] / lo['s_per_mwindows']:.2f}x; 1.0 = linear)."
            )
            cpu = [r for r in per if r.get("cpu_s") is not None]
            if len(cpu) >= 2:
                # marginal CPU seconds per million windows between consecutive sizes: the process start
                # and imports (~1 s, machine-shapes' whole run) cancel out
                steps = [
                    (a, b, (b["cpu_s"] - a["cpu_s"]) / ((b["windows"] - a["windows"]) / 1e6))
                    for a, b in zip(cpu, cpu[1:], strict=False)
                ]
                md.append(
                    "Marginal CPU s per million windows: "
                    + ", ".join(f"{a['dataset']} -> {b['dataset']} {m:.3f}" for a, b, m in steps)
                    + (
                        f" ({steps[-1][2] / steps[0][2]:.2f}x; 1.0 = linear)."
                        if len(steps) >= 2 and steps[0][2] > 0
                        else "."
                    )
                )
        md.append("")
    md += [
        "## Notes",
        "",
        *[f"- {n}" for n in notes],
        "",
        "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()),
        "",
    ]
    return "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help=f"comma-separated window counts (default {DEFAULT_SIZES})")
    ap.add_argument(
        "--long-span",
        default=DEFAULT_LONG_SPAN,
        metavar="WINDOWS,MACHINES,DAYS",
        help=f"the long-span set (default {DEFAULT_LONG_SPAN})",
    )
    ap.add_argument("--no-long-span", action="store_true", help="skip the long-span set")
    ap.add_argument(
        "--analyses",
        default="all",
        help="comma-separated analysis names or labels (usage-distribution[by=instance]), or all",
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs per measurement, interleaved (medians reported)")
    ap.add_argument(
        "--layout",
        choices=["flat", "bucketed", "both"],
        default="bucketed",
        help="bucketed (default) = after `gpuclust optimize`, as `gpuclust ingest` writes it; flat = the "
        "generated dataset, as `ingest --layout flat` leaves it",
    )
    ap.add_argument("--memory-limit", default=None, help="passed to `gpuclust analyze --memory-limit` when it has it")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run before it is killed (recorded)")
    ap.add_argument(
        "--max-rss",
        type=float,
        default=None,
        help="GiB of process-tree RSS at which a run is killed (recorded); default 60%% of the machine's memory",
    )
    ap.add_argument("--plots", action="store_true", help="let analyze write its plots (default --no-plots)")
    ap.add_argument("--name", default="scale", help="results file stem under bench/results")
    ap.add_argument(
        "--append",
        action="store_true",
        help="keep the runs already in <name>.json and add these as further repeats (medians over all); an "
        "earlier timeout / kill still rules out that analysis at that size and larger",
    )
    ap.add_argument(
        "--replace",
        action="store_true",
        help="with --append: drop the earlier runs of the (layout, dataset, analysis) measured now",
    )
    ap.add_argument("--render", action="store_true", help="only rewrite <name>.md from <name>.json")
    args = ap.parse_args(argv)
    if args.render:
        d = json.loads((_harness.RESULTS / f"{args.name}.json").read_text())
        d["summary"] = summarise(d["runs"])
        write_results(args.name, d, markdown(d["summary"], d["environment"], d["notes"]))
        return 0

    import psutil

    from gpuclust.analyses import names as registered

    all_variants = variants(registered())
    if args.analyses != "all":
        want = [w for w in re.split(r",(?![^\[]*\])", args.analyses) if w]  # commas outside [...]
        chosen = [v for v in all_variants if v[0] in want or v[1] in want]
        unknown = [w for w in want if not any(w in (v[0], v[1]) for v in all_variants)]
        if unknown:
            ap.error(f"unknown analyses {unknown}; choose from {[v[0] for v in all_variants]}")
    else:
        chosen = all_variants
    max_rss = int((args.max_rss * 2**30) if args.max_rss else 0.6 * psutil.virtual_memory().total)
    notes: list[str] = [
        f"Each run: `python -m gpuclust.cli analyze DATASET NAME [-O ...] --out TMP --backend cpu "
        f"{'' if args.plots else '--no-plots '}--quiet` (partitions auto = about 4 Mi rows each, one thread "
        "per usable core); peak RSS of the process tree sampled every 50 ms; CPU s = user + system of the "
        "process (RUSAGE_CHILDREN); load = the machine's 1-minute load average after the run (other work "
        "on a shared machine inflates wall time, much less CPU time).",
        f"A run is killed after {args.timeout:.0f} s or above {max_rss / 2**30:.1f} GiB RSS and recorded "
        "as timeout / rss-killed; the analysis is then skipped at larger sizes.",
        "Datasets: bench/gen_canonical.py (seed 1); windows = instance_usage rows.",
    ]

    layouts = ["flat", "bucketed"] if args.layout == "both" else [args.layout]
    takes_out = False
    if "bucketed" in layouts:
        exists, takes_out = has_optimize()
        if not exists:
            msg = "bucketed layout skipped: this gpuclust has no `optimize` sub-command yet"
            print(msg, flush=True)
            notes.append(msg)
            layouts = [x for x in layouts if x != "bucketed"]
    mem_args: list[str] = []
    if args.memory_limit:
        if analyze_has_memory_limit():
            mem_args = ["--memory-limit", args.memory_limit]
            notes.append(f"analyze --memory-limit {args.memory_limit}")
        else:
            msg = f"--memory-limit {args.memory_limit} not passed: `gpuclust analyze` has no --memory-limit yet"
            print(msg, flush=True)
            notes.append(msg)

    # (dataset label, nominal size, long-span?, flat path)
    sets: list[tuple[str, int, bool, Path]] = []

    # the flat dataset is generated only when a flat run or a missing bucketed copy needs it
    def dataset(size: int, **kw: Any) -> Path:
        flat = bench_dataset(size, generate=False, **kw)
        needed = "flat" in layouts or not (flat.with_name(flat.name + "-bucketed") / "manifest.json").exists()
        return bench_dataset(size, **kw) if needed else flat

    for s in args.sizes.split(","):
        if s.strip():
            size = _size(s)
            sets.append((size_label(size), size, False, dataset(size)))
    if not args.no_long_span:
        w, m, d = args.long_span.split(",")
        size, machines, days = _size(w), int(m), float(d)
        sets.append(
            (
                f"long-span {size_label(size)} windows, {machines:,} machines, {days:g} days",
                size,
                True,
                dataset(size, machines=machines, days=days),
            )
        )
    if not layouts or not sets or not chosen:
        print("nothing to run", flush=True)
        return 0
    paths = {("flat", label): p for label, _, _, p in sets}
    if "bucketed" in layouts:
        for label, _, _, p in sets:
            paths[("bucketed", label)] = bucketed(p, takes_out)

    jp = _harness.RESULTS / f"{args.name}.json"
    runs: list[dict[str, Any]] = []
    now = {(lay, label, v[0]) for lay in layouts for label, *_ in sets for v in chosen}
    env = environment()
    given_up: dict[tuple[str, str], int] = {}  # (layout, analysis label) -> smallest size that timed out / was killed
    first_rep = 0
    if args.append and jp.exists():
        old = json.loads(jp.read_text())
        runs = [
            r for r in old.get("runs", []) if not (args.replace and (r["layout"], r["dataset"], r["analysis"]) in now)
        ]
        notes = list(dict.fromkeys([*old.get("notes", []), *notes]))
        env["earlier_environments"] = [e for e in [old.get("environment")] if e] + old.get("environment", {}).get(
            "earlier_environments", []
        )
        for e in env["earlier_environments"]:
            e.pop("earlier_environments", None)
        for r in runs:
            if r["status"] in ("timeout", "rss-killed") and not r["long_span"]:
                k = (r["layout"], r["analysis"])
                given_up[k] = min(given_up.get(k, r["size"]), r["size"])
        first_rep = 1 + max((r["repeat"] for r in runs), default=-1)

    def save() -> None:
        summary = summarise(runs)
        write_results(
            args.name,
            {"benchmark": "scale", "runs": runs, "summary": summary, "notes": notes, "environment": env},
            markdown(summary, env, notes),
        )

    for rep in range(first_rep, first_rep + args.repeat):
        for label, size, long_span, _ in sets:
            for layout in layouts:
                ds = paths[(layout, label)]
                windows, machines, days = _dataset_rows(ds)
                for vlabel, an, opts in chosen:
                    base = {
                        "layout": layout,
                        "dataset": label,
                        "size": size,
                        "long_span": long_span,
                        "windows": windows,
                        "machines": machines,
                        "days": days,
                        "analysis": vlabel,
                        "repeat": rep,
                    }
                    # a failure at a smaller size rules out larger ones (the long-span set is run regardless)
                    if not long_span and size >= given_up.get((layout, vlabel), size + 1):
                        runs.append(
                            {
                                **base,
                                "status": "skipped",
                                "why": "timed out or killed at a smaller size or an earlier repeat",
                            }
                        )
                        save()
                        continue
                    out = Path(tempfile.mkdtemp(prefix="scale-"))
                    cmd = [
                        sys.executable,
                        "-m",
                        "gpuclust.cli",
                        "analyze",
                        str(ds),
                        an,
                        *[x for k, v in opts.items() for x in ("-O", f"{k}={v}")],
                        "--out",
                        str(out / "r"),
                        "--backend",
                        "cpu",
                        "--quiet",
                        *([] if args.plots else ["--no-plots"]),
                        *mem_args,
                    ]
                    m = run_measured(cmd, env=_env(), timeout_s=args.timeout, max_rss_bytes=max_rss)
                    shutil.rmtree(out, ignore_errors=True)
                    row = {
                        **base,
                        "wall_s": round(m.wall_s, 3),
                        "cpu_s": m.extra.get("cpu_s"),
                        "peak_rss_bytes": m.peak_rss_bytes,
                        "returncode": m.returncode,
                        "load_avg_1m": round(os.getloadavg()[0], 2),
                    }
                    if m.extra.get("timed_out"):
                        row["status"] = "timeout"
                    elif m.extra.get("rss_killed"):
                        row["status"] = "rss-killed"
                    elif m.returncode != 0:
                        row["status"] = "failed"
                        row["error"] = m.stdout_tail[-1500:]
                    else:
                        row["status"] = "ok"
                    if row["status"] != "ok":
                        if not long_span:
                            given_up[(layout, vlabel)] = min(size, given_up.get((layout, vlabel), size))
                        if row["status"] != "failed":
                            row["error"] = m.stdout_tail[-500:]
                    runs.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "error"}), flush=True)
                    if row["status"] == "failed":
                        print(m.stdout_tail[-1500:], file=sys.stderr, flush=True)
                    save()
    save()
    print((_harness.RESULTS / f"{args.name}.md").read_text())
    print(f"wrote {jp} and {_harness.RESULTS / f'{args.name}.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
