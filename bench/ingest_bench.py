"""Ingest throughput: `gpuclust ingest` vs DuckDB converting the same v3 JSON shard to Parquet.

    python bench/ingest_bench.py                 # >= 1 GB instance_usage shard, 2 threads
    python bench/ingest_bench.py --windows 300000 --name ingest-small   # a quick look
    python bench/ingest_bench.py --windows 1500000,3000000 --repeat 3 --no-arrow-path   # + marginal MB/s

Generates (once, cached under bench/data/) a synthetic InstanceUsage shard in the real BigQuery
export encoding with `gpuclust synth`, then converts it with

* gpuclust: ``gpuclust ingest SHARD --out DS --layout flat`` (exact int64 parsing, validation,
  rejects, manifest, zstd Parquet; the layout step that a default ingest adds, bucketing and
  sorting by key, has no counterpart in DuckDB's conversion and is measured by
  ``bench/optimize_bench.py``), and
* DuckDB: ``COPY (SELECT <the same flattened, typed columns> FROM read_json(...)) TO ... (zstd)``
  with ``SET threads=N`` — the same output columns, no validation beyond DuckDB's own typing.

both on the gzipped shard and on its decompressed twin, each in its own process, sampling the
summed RSS of the process tree; gpuclust also with ``GPUCLUST_FAST_JSON=0`` (Arrow's
``read_json`` for every piece, the path before the compiled reader), unless ``--no-arrow-path``.
The runs are interleaved (gzip: gpuclust, Arrow path, DuckDB; then plain), ``--repeat`` times.
Writes bench/results/<name>.json and .md with wall time, CPU seconds (user + system, less
sensitive than wall time to other work on a shared machine), rows/s, MB/s (decompressed JSON
bytes per second), peak RSS, device, versions and commit.  With two or more ``--windows`` sizes the
rounds interleave the sizes too, and the Markdown adds each tool's marginal throughput between
consecutive sizes (extra JSON bytes / extra wall seconds): what each further shard of a cell costs
once the process has started (imports, the compiled reader's load), as a many-shard ingest pays it.

The compiled reader is the C extension built when gpuclust was installed (setup.py); the results
say which kernel the runs used (numba's stand-in where the extension was not built).
``--timeline`` adds, after the rounds, one
instrumented gpuclust run per input on the first size: when the imports end, the first piece is
read and parsed, the last is parsed and written, the process exits, with the process CPU seconds
at each point and the cores busy per tenth of a second (the instrumentation wraps the reader's
functions, a few microseconds per piece).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import textwrap
from pathlib import Path
from typing import Any

from _harness import environment, run_measured, write_results

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"

PCT = [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
TAIL = [91, 92, 93, 94, 95, 96, 97, 98, 99]

DUCK_COLUMNS = {
    "start_time": "BIGINT",
    "end_time": "BIGINT",
    "collection_id": "BIGINT",
    "instance_index": "INTEGER",
    "machine_id": "BIGINT",
    "alloc_collection_id": "BIGINT",
    "alloc_instance_index": "INTEGER",
    "collection_type": "TINYINT",
    "average_usage": "STRUCT(cpus FLOAT, memory FLOAT)",
    "maximum_usage": "STRUCT(cpus FLOAT, memory FLOAT)",
    "random_sample_usage": "STRUCT(cpus FLOAT)",
    "assigned_memory": "FLOAT",
    "page_cache_memory": "FLOAT",
    "cycles_per_instruction": "FLOAT",
    "memory_accesses_per_instruction": "FLOAT",
    "sample_rate": "FLOAT",
    "cpu_usage_distribution": "FLOAT[]",
    "tail_cpu_usage_distribution": "FLOAT[]",
}


def duck_sql(src: Path, dst: Path) -> str:
    cols = ",\n".join(f"'{k}': '{v}'" for k, v in DUCK_COLUMNS.items())
    pct = ", ".join(f"cpu_usage_distribution[{i + 1}] AS cpu_p{p}" for i, p in enumerate(PCT))
    tail = ", ".join(f"tail_cpu_usage_distribution[{i + 1}] AS cpu_p{p}" for i, p in enumerate(TAIL))
    return f"""
COPY (
  SELECT start_time, end_time, collection_id, instance_index, machine_id,
         coalesce(alloc_collection_id, 0) AS alloc_collection_id,
         coalesce(alloc_instance_index, -1) AS alloc_instance_index, collection_type,
         average_usage.cpus AS avg_cpu, average_usage.memory AS avg_mem,
         maximum_usage.cpus AS max_cpu, maximum_usage.memory AS max_mem,
         random_sample_usage.cpus AS sample_cpu, assigned_memory AS assigned_mem,
         page_cache_memory AS page_cache_mem, cycles_per_instruction AS cpi,
         memory_accesses_per_instruction AS mai, sample_rate, {pct}, {tail}
  FROM read_json('{src}', format='newline_delimited', columns={{{cols}}})
) TO '{dst}' (FORMAT parquet, COMPRESSION zstd)
"""


def make_shard(windows: int, seed: int) -> tuple[Path, Path]:
    """A gzipped instance_usage shard with about ``windows`` rows, and its decompressed twin."""
    tag = f"w{windows}-s{seed}"
    gz = DATA / tag / "instance_usage-000000000000.json.gz"
    plain = DATA / tag / "plain" / "instance_usage-000000000000.json"
    if gz.exists() and plain.exists():
        return gz, plain
    from gpuclust.synth import SynthConfig, synthesize

    # ~395 usage windows per machine-hour with the default workload (measured on the demo cell).
    hours = 6.0
    machines = max(10, round(windows / (395 * hours)))
    raw = DATA / tag / "raw"
    res = synthesize(SynthConfig(machines=machines, hours=hours, seed=seed, shard_rows=10**9), raw)
    shards = res.shards["instance_usage"]
    gz.parent.mkdir(parents=True, exist_ok=True)
    with open(gz, "wb") as out:  # concatenated gzip members are one valid gzip stream
        for s in shards:
            with open(s, "rb") as f:
                shutil.copyfileobj(f, out)
    plain.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(gz, "rb") as f, open(plain, "wb") as out:
        shutil.copyfileobj(f, out, 16 << 20)
    shutil.rmtree(raw)
    return gz, plain


def count_lines(p: Path) -> int:
    n = 0
    with open(p, "rb") as f:
        while chunk := f.read(16 << 20):
            n += chunk.count(b"\n")
    return n


def _summary(runs: list[dict[str, Any]], sizes: list[dict[str, Any]], tools: tuple[str, ...]) -> list[dict[str, Any]]:
    out = []
    for sz in sizes:
        for label in ("gzip", "plain"):
            for tool in tools:
                rs = [r for r in runs if r["windows"] == sz["windows"] and r["input"] == label and r["tool"] == tool]
                wall = statistics.median(r["wall_s"] for r in rs)
                out.append(
                    {
                        "windows": sz["windows"],
                        "input": label,
                        "tool": tool,
                        "runs": len(rs),
                        "wall_s": round(wall, 2),
                        "cpu_s": round(statistics.median(r["cpu_s"] for r in rs), 2),
                        "rows": sz["rows"],
                        "json_bytes": sz["json_bytes"],
                        "rows_per_s": round(sz["rows"] / wall),
                        "json_mb_per_s": round(sz["json_bytes"] / wall / 1e6, 1),
                        "peak_rss_mib": max(r["peak_rss_mib"] for r in rs),
                    }
                )
    return out


def marginal(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per input and tool, between consecutive sizes: extra JSON MB per extra wall (CPU) second."""
    out = []
    keys = sorted({(r["input"], r["tool"]) for r in summary})
    for label, tool in keys:
        rs = sorted((r for r in summary if r["input"] == label and r["tool"] == tool), key=lambda r: r["json_bytes"])
        for a, b in zip(rs, rs[1:], strict=False):
            mb = (b["json_bytes"] - a["json_bytes"]) / 1e6
            dw, dc = b["wall_s"] - a["wall_s"], b["cpu_s"] - a["cpu_s"]
            out.append(
                {
                    "input": label,
                    "tool": tool,
                    "from": a["windows"],
                    "to": b["windows"],
                    "mb_per_wall_s": round(mb / dw, 1) if dw > 0 else None,
                    "mb_per_cpu_s": round(mb / dc, 1) if dc > 0 else None,
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--windows",
        default="1500000",
        help="usage windows in the shard, or a comma-separated list of sizes (1.5M is ~1.1 GB of JSON)",
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2, help="threads / workers for both tools")
    ap.add_argument("--name", default="ingest", help="results file stem under bench/results/")
    ap.add_argument("--repeat", type=int, default=1, help="interleaved rounds; the table shows medians")
    ap.add_argument("--no-arrow-path", action="store_true", help="skip gpuclust with GPUCLUST_FAST_JSON=0")
    ap.add_argument(
        "--timeline",
        action="store_true",
        help="after the rounds, one instrumented gpuclust run per input on the first size (phases)",
    )
    args = ap.parse_args(argv)
    tools = ("gpuclust", "duckdb") if args.no_arrow_path else ("gpuclust", "gpuclust-arrow", "duckdb")

    sizes = []
    for w in (int(float(x)) for x in str(args.windows).split(",")):
        gz, plain = make_shard(w, args.seed)
        sizes.append(
            {
                "windows": w,
                "gz": gz,
                "plain": plain,
                "rows": count_lines(plain),
                "json_bytes": plain.stat().st_size,
                "gz_bytes": gz.stat().st_size,
            }
        )
    kernel = compiled_reader()
    print(f"gpuclust's compiled reader: {kernel}", flush=True)
    work = DATA / "work"
    runs = []
    for rnd in range(args.repeat):
        for sz in sizes:
            for label in ("gzip", "plain"):
                src, rows = sz["gz" if label == "gzip" else "plain"], sz["rows"]
                for tool in tools:
                    m = _run_tool(tool, src, work, args.threads, rows)
                    runs.append(
                        {
                            "round": rnd,
                            "windows": sz["windows"],
                            "input": label,
                            "tool": tool,
                            "wall_s": round(m.wall_s, 2),
                            "cpu_s": round(m.extra.get("cpu_s", float("nan")), 2),
                            "rows": rows,
                            "rows_per_s": round(rows / m.wall_s),
                            "json_mb_per_s": round(sz["json_bytes"] / m.wall_s / 1e6, 1),
                            "peak_rss_mib": round(m.peak_rss_bytes / 2**20),
                        }
                    )
                    print(json.dumps(runs[-1]), flush=True)
    timelines = {}
    if args.timeline:
        for label in ("plain", "gzip"):
            timelines[label] = timeline(sizes[0]["gz" if label == "gzip" else "plain"], work, args.threads)
            print(json.dumps(timelines[label]), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    env = environment()
    summary = _summary(runs, sizes, tools)
    marg = marginal(summary) if len(sizes) > 1 else []
    first = sizes[0]
    payload = {
        "benchmark": "ingest",
        "shard_gz_bytes": first["gz_bytes"],
        "shard_json_bytes": first["json_bytes"],
        "rows": first["rows"],
        "sizes": [{k: v for k, v in sz.items() if k not in ("gz", "plain")} for sz in sizes],
        "threads": args.threads,
        "repeat": args.repeat,
        "runs": runs,
        "summary": summary,
        "marginal": marg,
        "compiled_reader": kernel,
        "timelines": timelines,
        "environment": env,
    }
    names = {
        "gpuclust": "gpuclust",
        "gpuclust-arrow": "gpuclust, Arrow path (`GPUCLUST_FAST_JSON=0`)",
        "duckdb": "duckdb",
    }
    shards = "; ".join(
        f"{sz['rows']:,} rows, {sz['json_bytes'] / 1e9:.2f} GB of JSON ({sz['gz_bytes'] / 1e6:.0f} MB gzipped)"
        for sz in sizes
    )
    lines = [
        f"# Ingest benchmark: v3 InstanceUsage JSON shard -> Parquet ({args.threads} threads)",
        "",
        f"Shard{'s' if len(sizes) > 1 else ''}: {shards}; synthetic (`gpuclust synth`, seed {args.seed}), real export "
        f"encoding. {args.repeat} interleaved round(s); medians; CPU s = user + system of the whole process. "
        f"gpuclust's compiled reader: {kernel}.",
        "",
        "| rows | input | tool | wall s | CPU s | rows/s | JSON MB/s | peak RSS MiB |",
        "|---:|---|---|---:|---:|---:|---:|---:|",
        *[
            f"| {r['rows']:,} | {r['input']} | {names[r['tool']]} | {r['wall_s']} | {r['cpu_s']} | {r['rows_per_s']:,} | "
            f"{r['json_mb_per_s']} | {r['peak_rss_mib']:,} |"
            for r in summary
        ],
        "",
        "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()),
        "",
    ]
    by = {(r["windows"], r["input"], r["tool"]): r for r in summary}
    for sz in sizes:
        for label in ("gzip", "plain"):
            g, d = by[(sz["windows"], label, "gpuclust")], by[(sz["windows"], label, "duckdb")]
            lines.append(
                f"- {sz['rows']:,} rows, {label}: gpuclust / DuckDB throughput = {d['wall_s'] / g['wall_s']:.2f}x "
                f"(CPU seconds: DuckDB / gpuclust = {d['cpu_s'] / g['cpu_s']:.2f}x)"
            )
            if (sz["windows"], label, "gpuclust-arrow") in by:
                a = by[(sz["windows"], label, "gpuclust-arrow")]
                lines.append(
                    f"- {sz['rows']:,} rows, {label}: compiled reader vs Arrow path: "
                    f"{a['wall_s'] / g['wall_s']:.2f}x wall, {a['cpu_s'] / g['cpu_s']:.2f}x CPU"
                )
    if marg:
        lines += [
            "",
            "Marginal throughput between sizes (extra JSON MB per extra second; start-up cancels out):",
            "",
            "| input | tool | rows | MB per wall s | MB per CPU s |",
            "|---|---|---|---:|---:|",
            *[
                f"| {r['input']} | {names[r['tool']]} | {r['from']:,} -> {r['to']:,} | {r['mb_per_wall_s']} | "
                f"{r['mb_per_cpu_s']} |"
                for r in marg
            ],
        ]
        mb = {(r["input"], r["tool"]): r for r in marg}
        for label in ("gzip", "plain"):
            g, d = mb.get((label, "gpuclust")), mb.get((label, "duckdb"))
            if g and d and g["mb_per_wall_s"] and d["mb_per_wall_s"]:
                lines.append(
                    f"- {label}, marginal: gpuclust / DuckDB throughput = "
                    f"{g['mb_per_wall_s'] / d['mb_per_wall_s']:.2f}x"
                )
    for label, tl in timelines.items():
        lines += ["", *_timeline_md(tl, f"{label}, {sizes[0]['rows']:,} rows")]
    jp, mp = write_results(args.name, payload, "\n".join(lines) + "\n")
    print(textwrap.indent("\n".join(lines), "  "))
    print(f"wrote {jp} and {mp}")
    return 0


#: Run as ``python -c TIMELINE OUT.json ARGS...``: ``gpuclust ARGS`` with timestamps (seconds
#: since the process started, process CPU seconds, thread) at the ingest path's phases.
TIMELINE = r"""
import os, sys, time, threading, json
st = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
T0 = time.perf_counter() - (time.clock_gettime(time.CLOCK_BOOTTIME) - int(st[19]) / os.sysconf("SC_CLK_TCK"))
EV = []
def ev(name):
    EV.append({"t": time.perf_counter() - T0, "cpu": time.process_time(), "thread": threading.current_thread().name,
               "ev": name})
ev("interpreter up")
out, args = sys.argv[1], sys.argv[2:]
import gpuclust.cli as cli
from gpuclust.ingest import api, writer
from gpuclust.ingest.readers import _fast_usage, v3_json
ev("imports done")
def wrap(mod, name, gen=False):
    f = getattr(mod, name)
    def w(*a, **k):
        ev(name + " start")
        try:
            return f(*a, **k)
        finally:
            ev(name + " end")
    def g(*a, **k):
        for x in f(*a, **k):
            ev(name + " piece")
            yield x
    setattr(mod, name, g if gen else w)
for mod, name in ((_fast_usage, "parse"), (v3_json, "_finish_piece"), (writer, "write_part"),
                  (writer, "ingest_file")):
    wrap(mod, name)
wrap(v3_json, "pieces", gen=True)
exit_now = cli._exit_now
def done(rc):
    ev("exit")
    ev("C extension" if _fast_usage.compiled() else "numba kernel")
    json.dump(EV, open(out, "w"))
    exit_now(rc)
cli._exit_now = done
sys.argv = ["gpuclust", *args]
rc = cli.main()
done(rc)
"""


def timeline(src: Path, work: Path, threads: int) -> dict[str, Any]:
    """One instrumented gpuclust run (:data:`TIMELINE`): its phases and cores busy per 0.1 s."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out = work / "timeline.json"
    cmd = [
        sys.executable,
        "-c",
        TIMELINE,
        str(out),
        "ingest",
        str(src),
        "--out",
        str(work / "ds"),
        "--workers",
        str(threads),
        "--no-progress",
        "--layout",
        "flat",
    ]
    m = run_measured(cmd)
    if m.returncode != 0:
        raise SystemExit(f"timeline run failed: {m.stdout_tail}")
    ev = json.loads(out.read_text())
    first: dict[str, dict[str, Any]] = {}
    last: dict[str, dict[str, Any]] = {}
    for e in ev:
        first.setdefault(e["ev"], e)
        last[e["ev"]] = e
    phases = [
        ("interpreter up", first["interpreter up"]),
        ("imports done", first["imports done"]),
        ("first piece cut", first["pieces piece"]),
        ("first parse starts", first["parse start"]),
        ("first parse ends", first["parse end"]),
        ("first part written", first["write_part end"]),
        ("last piece cut", last["pieces piece"]),
        ("last parse ends", last["parse end"]),
        ("last part written", last["write_part end"]),
        ("exit (os._exit)", last["exit"]),
    ]
    pts = sorted((e["t"], e["cpu"]) for e in ev)

    def cpu_at(t: float) -> float:
        prev = pts[0]
        for p in pts:
            if p[0] >= t:
                return prev[1] + (p[1] - prev[1]) * (t - prev[0]) / max(p[0] - prev[0], 1e-9)
            prev = p
        return pts[-1][1]

    end = pts[-1][0]
    busy = [
        round((cpu_at(min(t / 10 + 0.1, end)) - cpu_at(t / 10)) / (min(t / 10 + 0.1, end) - t / 10), 2)
        for t in range(int(end * 10) + 1)
        if t / 10 < end
    ]
    return {
        "input": str(src),
        "wall_s": round(m.wall_s, 3),
        "cpu_s": round(m.extra.get("cpu_s", float("nan")), 2),
        "peak_rss_mib": round(m.peak_rss_bytes / 2**20),
        "kernel": ev[-1]["ev"],
        "phases": [{"phase": k, "t_s": round(e["t"], 3), "cpu_s": round(e["cpu"], 3)} for k, e in phases],
        "cores_busy_per_0.1s": busy,
        "pieces": sum(1 for e in ev if e["ev"] == "pieces piece"),
    }


def _timeline_md(tl: dict[str, Any], label: str) -> list[str]:
    rows = [f"| {p['phase']} | {p['t_s']:.3f} | {p['cpu_s']:.2f} |" for p in tl["phases"]]
    return [
        f"Timeline, {label} ({tl['pieces']} pieces, {tl['kernel']}; this run: wall {tl['wall_s']} s measured "
        f"outside, CPU {tl['cpu_s']} s, peak RSS {tl['peak_rss_mib']} MiB):",
        "",
        "| phase | s since the process started | process CPU s |",
        "|---|---:|---:|",
        *rows,
        "",
        "Cores busy per 0.1 s: " + " ".join(f"{b:.1f}" for b in tl["cores_busy_per_0.1s"]),
        "",
    ]


def compiled_reader() -> str:
    """Which kernel gpuclust's compiled reader uses here (run in a fresh process, as the runs are)."""
    import subprocess

    code = (
        "from gpuclust.ingest.readers import _fast_usage as f; ok = f.available(); "
        "print('C extension' if f.compiled() else 'numba (no C extension built)' if ok else 'none: Arrow')"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def _run_tool(tool: str, src: Path, work: Path, threads: int, rows: int) -> Any:
    """One measured conversion of ``src`` by ``tool`` into a fresh ``work`` folder; checks the rows."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = None
    if tool.startswith("gpuclust"):
        cmd = [
            sys.executable,
            "-m",
            "gpuclust.cli",
            "ingest",
            str(src),
            "--out",
            str(work / "ds"),
            "--workers",
            str(threads),
            "--no-progress",
            "--layout",
            "flat",
        ]
        env = dict(os.environ, GPUCLUST_FAST_JSON="0" if tool == "gpuclust-arrow" else "1")
    else:
        script = (
            f"import duckdb; c = duckdb.connect(); c.execute('SET threads={threads}'); "
            f"c.execute({duck_sql(src, work / 'out.parquet')!r})"
        )
        cmd = [sys.executable, "-c", script]
    m = run_measured(cmd, env=env)
    if m.returncode != 0:
        print(m.stdout_tail, file=sys.stderr)
        raise SystemExit(f"{tool} failed on {src}")
    if tool.startswith("gpuclust"):
        man = json.loads((work / "ds" / "manifest.json").read_text())
        out_rows = man["tables"]["instance_usage"]["rows"]
    else:
        import pyarrow.parquet as pq

        out_rows = pq.ParquetFile(work / "out.parquet").metadata.num_rows
    if out_rows != rows:
        raise SystemExit(f"{tool}: wrote {out_rows} rows, shard has {rows}")
    return m


if __name__ == "__main__":
    raise SystemExit(main())
