"""``gpuclust demo``: the main job on an embedded default.

Synthesises a small Borg cell in the real v3 export format, ingests it through the real ingest
path, runs every registered analysis, writes the results and the report page (``report.html``: one
self-contained HTML file, see docs/user/report.md) and prints where they are.  Re-running
it into the same folder regenerates the same bytes (the generator is deterministic per seed), the
ingest skips the inputs it already has, and the results are rewritten identically.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class DemoResult:
    out: Path
    raw: Path
    dataset: Path
    results: Path
    report: Path
    report_bytes: int
    analyses: list[str]
    seconds: float
    summary: str


def run_demo(
    out: str | Path = "gpuclust-demo",
    *,
    machines: int = 120,
    hours: float = 6.0,
    seed: int = 2019,
    backend: str = "cpu",
    partitions: int | str = "auto",
    scheduler: str | None = None,
    quiet: bool = False,
) -> DemoResult:
    """Synthesise, ingest and analyse a small cell; return where everything went.

    Parameters
    ----------
    out
        Folder for ``raw/`` (the v3 JSON shards), ``dataset/`` (the canonical dataset),
        ``results/`` (Parquet results, ``summary.txt``, plots) and ``report.html`` (the page).
    machines, hours, seed
        Size and seed of the synthetic cell.
    backend, partitions, scheduler
        Passed to the engine (``cpu``, ``gpu`` or ``auto``; partitions per table; a dask
        scheduler spec or ``None`` for in-process).
    quiet
        Suppress progress output.

    Examples
    --------
    >>> res = run_demo("/tmp/demo", machines=20, hours=1, quiet=True)  # doctest: +SKIP
    >>> sorted(p.name for p in res.results.iterdir())                  # doctest: +SKIP
    """
    from gpuclust.analyses.registry import names
    from gpuclust.report.analyze import analyze
    from gpuclust.report.html import write_report
    from gpuclust.synth import SynthConfig, synthesize

    t0 = time.perf_counter()
    out = Path(out)
    raw, dataset, results = out / "raw", out / "dataset", out / "results"

    def say(msg: str) -> None:
        if not quiet:
            print(f"[demo] {msg}", file=sys.stderr, flush=True)

    say(f"synthesising {machines} machines x {hours:g} h (seed {seed}) into {raw}")
    syn = synthesize(
        SynthConfig(machines=machines, hours=hours, seed=seed),
        raw,
        dataset=dataset,
        progress=None if quiet else (lambda m: say(f"synth: {m}")),
    )
    rep: Any = syn.ingest_report
    if rep is None or rep.exit_status != 0:
        raise RuntimeError(f"demo: ingest of {raw} into {dataset} failed:\n{getattr(rep, 'summary', lambda: rep)()}")
    which = names()
    say(f"ingested into {dataset}; running {', '.join(which)} on backend {backend!r}")
    analyze(
        dataset,
        [_demo_analysis(n, hours) for n in which],
        out=results,
        backend=backend,
        partitions=partitions,
        scheduler=scheduler,
    )
    say(f"writing the report page {out / 'report.html'}")
    page = write_report(results, out / "report.html")
    summary_path = results / "summary.txt"
    summary = summary_path.read_text() if summary_path.exists() else ""
    return DemoResult(out, raw, dataset, results, page.path, page.bytes, which, time.perf_counter() - t0, summary)


def _demo_analysis(name: str, hours: float) -> Any:
    """The analysis the demo runs for ``name``: its defaults, except that ``peak-prediction``'s
    oracle horizon (24 h) is cut to a sixth of a cell shorter than two days (at least 5 minutes),
    so that the demo's hours are not all censored."""
    from gpuclust.analyses.registry import create

    if name == "peak-prediction" and hours < 48:
        return create(name, horizon_s=max(300, int(hours * 3600 / 6) // 300 * 300))
    return create(name)


def register(sub: Any) -> None:
    from gpuclust.engine.command import partitions_arg

    p = sub.add_parser(
        "demo",
        help="synthesise a small cell, ingest it, run every analysis, write the report page",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="gpuclust-demo", help="output folder (default: %(default)s)")
    p.add_argument("--machines", type=int, default=120, help="machines in the synthetic cell (default: %(default)s)")
    p.add_argument("--hours", type=float, default=6.0, help="trace length in hours (default: %(default)s)")
    p.add_argument("--seed", type=int, default=2019, help="generator seed (default: %(default)s)")
    p.add_argument(
        "--backend", default="cpu", choices=["cpu", "gpu", "auto"], help="compute backend (default: %(default)s)"
    )
    p.add_argument(
        "--partitions",
        type=partitions_arg,
        default="auto",
        help="partitions per table, or 'auto' (default: %(default)s)",
    )
    p.add_argument("--scheduler", default=None, help="dask scheduler: threads, local:N, cuda, or an address")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from gpuclust.engine.command import analyze_errors

    try:
        res = run_demo(
            args.out,
            machines=args.machines,
            hours=args.hours,
            seed=args.seed,
            backend=args.backend,
            partitions=args.partitions,
            scheduler=args.scheduler,
            quiet=args.quiet,
        )
    except analyze_errors() as e:
        print(f"gpuclust demo: error: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
        return 2
    print(res.summary.rstrip())
    print()
    print(f"gpuclust demo finished in {res.seconds:.1f} s")
    print(f"  raw v3 export shards : {res.raw}")
    print(f"  canonical dataset    : {res.dataset}  (manifest: {res.dataset / 'manifest.json'})")
    print(f"  analysis results     : {res.results}  (summary.txt, <analysis>/*.parquet, *.png)")
    print(f"  report page          : {res.report}  ({res.report_bytes / 1024:.0f} KiB, one self-contained HTML file)")
    return 0
