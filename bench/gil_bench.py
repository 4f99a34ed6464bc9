"""The cpu backend's threads and the GIL: how much of `gpuclust analyze`'s work holds it.

    python bench/gil_bench.py --sizes 4e6 --repeat 2

The local engine runs its partitions on one thread per core.  NumPy releases the GIL inside its
large loops, so those threads run at once until the work that holds the GIL (the Python between
NumPy calls, the setup of each call, the NumPy loops that keep it) fills one core: with a share
``g`` of the busy thread-seconds holding it, at most ``1 / g`` cores are ever busy, however many
the machine has.  This bench measures ``g`` where a 2-core machine can: for each size (the
canonical dataset laid out by key, as ingest leaves it) the command users run,
``gpuclust analyze DS <analyses> --out DIR --backend cpu --quiet``, runs under py-spy
(``py-spy record --format raw``) twice, interleaved, ``--repeat`` times: once sampling every
thread that is running (``active``), once only the thread that holds the GIL (``--gil``).  The
table gives the medians of the whole process' wall time under the sampler, the busy and the
GIL-holding thread-seconds (samples / rate), the share, the ceiling ``1 / share`` in cores, and
the gpuclust functions that hold the GIL most (the innermost gpuclust frame of each GIL sample,
over all runs).  Needs py-spy (in the test extras).  Writes bench/results/gil.{json,md}.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _harness import bench_dataset, environment, publish  # noqa: E402
from scale_bench import bucketed, size_label  # noqa: E402

#: Innermost gpuclust frames reported per size
TOP = 12


def py_spy() -> str | None:
    """The py-spy executable: beside this Python's (a virtual environment's bin), else on PATH."""
    own = Path(sys.executable).with_name("py-spy")
    return str(own) if own.exists() else shutil.which("py-spy")


def parse_raw(text: str) -> tuple[int, collections.Counter[str]]:
    """py-spy's raw output (``thread (id): name;frame;...;frame count`` a line, frames
    ``function (file:line)``): the samples in all, and per innermost gpuclust frame (``function
    (gpuclust/...py:line)``; ``-`` for a stack without one).

    >>> n, top = parse_raw(
    ...     "thread (7): gpuclust-part_0;run (threading.py:9);partial (/x/gpuclust/a.py:3) 5\\n"
    ...     "thread (8): MainThread;main (/x/gpuclust/cli.py:1);f (/x/gpuclust/a.py:4);g (np.py:2) 2\\n"
    ...     "thread (9);import (<frozen>:1) 1\\n"
    ... )
    >>> n, sorted(top.items())
    (8, [('-', 1), ('f (gpuclust/a.py:4)', 2), ('partial (gpuclust/a.py:3)', 5)])
    """
    total, top = 0, collections.Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        ours = [f for f in stack.split(";")[1:] if "gpuclust/" in f]
        top[re.sub(r"\(.*?(gpuclust/)", r"(\1", ours[-1]) if ours else "-"] += n
    return total, top


def sampled(spy: str, cmd: list[str], rate: int, gil: bool) -> dict[str, Any]:
    """``cmd`` run under ``py-spy record`` at ``rate`` Hz (``gil``: only the GIL's holder):
    whole-process wall seconds, samples, and the samples per innermost gpuclust frame."""
    with tempfile.TemporaryDirectory(prefix="gpuclust-gil-") as tmp:
        raw = Path(tmp) / "raw.txt"
        spy_cmd = [spy, "record", "--format", "raw", "--threads", "--rate", str(rate), "--output", str(raw)]
        t0 = time.perf_counter()
        r = subprocess.run(
            [*spy_cmd, *(["--gil"] if gil else []), "--", *cmd], capture_output=True, text=True, check=False
        )
        wall = time.perf_counter() - t0
        if r.returncode != 0 or not raw.exists():
            raise RuntimeError(f"py-spy {' '.join(cmd[:4])} ... exited {r.returncode}:\n{r.stderr[-2000:]}")
        n, top = parse_raw(raw.read_text())
    return {"wall_s": wall, "samples": n, "seconds": n / rate, "top": dict(top)}


def analyze_cmd(ds: Path, out: Path, analyses: list[str]) -> list[str]:
    """The CLI run, as users run it (cpu backend, every core)."""
    return [sys.executable, "-m", "gpuclust", "analyze", str(ds), *analyses, "--out", str(out), "--backend", "cpu"]


def main(argv: list[str] | None = None) -> int:
    from gpuclust.analyses.registry import names

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4e6")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each kind, interleaved")
    ap.add_argument("--rate", type=int, default=50, help="samples per second")
    ap.add_argument("--analyses", default="all", help="comma-separated names, or all (the 13)")
    ap.add_argument("--name", default="gil")
    args = ap.parse_args(argv)
    spy = py_spy()
    if spy is None:
        print("gil_bench: needs py-spy (pip install py-spy: it is in gpuclust's test extras)", file=sys.stderr)
        return 2
    analyses = sorted(names()) if args.analyses == "all" else args.analyses.split(",")
    rows = []
    for size in (int(float(s)) for s in args.sizes.split(",")):
        ds = bucketed(bench_dataset(size), True)
        runs: dict[str, list[dict[str, Any]]] = {"active": [], "gil": []}
        with tempfile.TemporaryDirectory(prefix="gpuclust-gil-out-") as tmp:
            for i in range(args.repeat):
                for kind in runs:
                    out = Path(tmp) / f"{kind}-{i}"
                    runs[kind].append(
                        sampled(spy, [*analyze_cmd(ds, out, analyses), "--quiet"], args.rate, kind == "gil")
                    )
        med = {k: {f: statistics.median(r[f] for r in v) for f in ("wall_s", "seconds")} for k, v in runs.items()}
        top: collections.Counter[str] = collections.Counter()
        for r in runs["gil"]:
            top.update(r["top"])
        share = med["gil"]["seconds"] / med["active"]["seconds"] if med["active"]["seconds"] else float("nan")
        row = {
            "size": size,
            "analyses": analyses,
            "runs": runs,
            "median": med,
            "gil_share": share,
            "ceiling_cores": 1.0 / share if share else None,
            "top": [[f, n / sum(top.values())] for f, n in top.most_common(TOP)],
        }
        rows.append(row)
        print(json.dumps({"size": size, "gil_share": share, "ceiling_cores": row["ceiling_cores"]}), flush=True)
    env = environment()
    which = "all 13 analyses" if args.analyses == "all" else ", ".join(analyses)
    md = [
        f"# The cpu backend and the GIL ({env.get('cores')} cores)",
        "",
        f"`gpuclust analyze DS <{which}> --out DIR --backend cpu --quiet` on the canonical dataset laid out by key, "
        f"under `py-spy record --format raw` at {args.rate} Hz: sampling every running thread (`active`) and, in "
        f"another run, only the thread holding the GIL (`gil`); {args.repeat} of each, interleaved; medians. "
        "Wall: the whole process under the sampler. Thread-seconds: samples / rate. The GIL's share of the busy "
        "thread-seconds bounds how many cores the engine's threads keep busy: at most 1 / share, however many the "
        "machine has.",
        "",
        "| windows | wall s (active run) | busy thread-s | GIL thread-s | GIL share | ceiling, cores |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        m = r["median"]
        md.append(
            f"| {r['size']:,} | {m['active']['wall_s']:.1f} | {m['active']['seconds']:.1f} | "
            f"{m['gil']['seconds']:.1f} | {r['gil_share']:.1%} | {r['ceiling_cores']:.1f} |"
        )
    for r in rows:
        md += [
            "",
            f"Where the GIL is held at {size_label(r['size'])} windows (innermost gpuclust frame, share of "
            "the GIL samples):",
            "",
            "| frame | share |",
            "|---|---:|",
        ]
        md += [f"| `{f}` | {s:.1%} |" for f, s in r["top"]]
    publish(args.name, {"rows": rows, "rate": args.rate}, md, env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
