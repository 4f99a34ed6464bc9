"""``gpuclust report DATASET --out report.html [NAME...]``: a study as one self-contained page.

Runs the analyses (every one the dataset can run, or the NAMEs) into a results folder, or reuses
that folder when its ``_run.json`` says it was written for the same dataset (not re-ingested
since), the same analyses and options and the same time selection; then renders one HTML page
(:mod:`gpuclust.report.html`), or with ``--format csv`` a folder of CSV files.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Any

__all__ = ["default_analyses", "main", "register", "reusable"]


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``report`` sub-command."""
    from gpuclust.analyses.registry import names
    from gpuclust.engine.command import OPTIONS_EPILOG, AnalysesHelpFormatter, add_run_options

    p = subparsers.add_parser(
        "report",
        help="one self-contained HTML page (or CSV files) of a dataset's analyses",
        description=textwrap.fill(
            "Run the analyses a dataset can run (or the NAMEs) into a results folder, or reuse it when its _run.json "
            "says it holds the same dataset (not written since), analyses and options; then write one "
            "self-contained HTML page: provenance, data quality, and per analysis a caption, the figure (hover for "
            "values) and the key numbers. --format csv writes every result table as CSV instead.",
            88,
        ),
        epilog=OPTIONS_EPILOG,
        formatter_class=AnalysesHelpFormatter,
    )
    p.add_argument("dataset", metavar="DATASET", help="canonical dataset folder (from `gpuclust ingest`)")
    p.add_argument(
        "names",
        metavar="NAME",
        nargs="*",
        help=f"analyses (default: every one the dataset can run): {', '.join(names())}",
    )
    p.add_argument(
        "--out", required=True, metavar="PATH", help="the page to write (report.html); with --format csv, a folder"
    )
    p.add_argument(
        "--format",
        choices=("html", "csv"),
        default="html",
        help="html: one page with figures and key numbers (default); csv: every result table as "
        "<analysis>/<table>.csv, for spreadsheets",
    )
    p.add_argument(
        "--results",
        default=None,
        metavar="DIR",
        help="results folder to reuse or (re)write (default: OUT's name + '-results', beside it)",
    )
    p.add_argument("--rerun", action="store_true", help="run the analyses even when DIR holds matching results")
    add_run_options(p)
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr (notes and warnings stay)")
    p.set_defaults(func=main)
    return p


def default_analyses(dataset: str | Path) -> list[str]:
    """Every registered analysis whose required tables the dataset has."""
    from gpuclust.info import dataset_info

    return [n for n, state in dataset_info(dataset)["analyses"].items() if not state.startswith("needs")]


def _wanted(analyses: list[Any]) -> list[dict[str, Any]]:
    from gpuclust.analyses.options import options_of
    from gpuclust.report.rendering import _jsonable

    return [
        {"name": a.name, "options": _jsonable({o.name: getattr(a, o.name) for o in options_of(type(a))})}
        for a in analyses
    ]


def reusable(results: str | Path, dataset: str | Path, analyses: list[Any], selection: tuple[Any, Any]) -> str | None:
    """``None`` when the results folder holds results of ``analyses`` (same options) over
    ``dataset`` with the same time ``selection``, written by this gpuclust version, and the dataset
    was not written since; else why not."""
    import os
    from datetime import datetime

    from gpuclust.report.provenance import read_run_file

    run = read_run_file(results)
    if run is None:
        return "no results there yet"
    if run.get("cells"):
        return "the results there are of several cells"
    from gpuclust import __version__

    if run.get("gpuclust_version") != __version__:
        return f"the results there were written by gpuclust {run.get('gpuclust_version')}"
    if run.get("dataset") != str(Path(dataset).absolute()):
        return f"the results there are of {run.get('dataset')}"
    have = [{"name": a["name"], "options": a["options"]} for a in run.get("analyses", [])]
    missing = [w["name"] for w in _wanted(analyses) if w not in have]
    if missing:
        return f"the results there lack {', '.join(missing)} with these options"
    sel = run.get("selection") or {}
    if any(selection) or sel:
        return "a time selection (--from/--to) is always run anew"
    try:
        started = datetime.fromisoformat(str(run["started"])).timestamp()
        written = os.stat(Path(dataset) / "manifest.json").st_mtime
    except (KeyError, ValueError, OSError):
        return "its run time or the dataset's manifest cannot be read"
    if written >= started + 1.0:  # "started" is recorded to the second
        return "the dataset was written after those results"
    if not all((Path(results) / f).exists() for f in run.get("files", [])):
        return "files listed in its _run.json are missing"
    return None


def _default_results(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(f"{out.stem if out.suffix == '.html' else out.name}-results")


def _matching_results(
    out: str | Path, dataset: str | Path, analyses: list[Any], selection: tuple[Any, Any]
) -> Path | None:
    """A results folder beside ``out`` (a sibling folder with a ``_run.json``, newest first) that
    :func:`reusable` accepts, so that ``--format csv`` after the page (or a second page) reuses the
    results the first one wrote instead of computing them again into a folder of its own."""
    parent = Path(out).absolute().parent
    try:
        found: list[tuple[float, Path]] = []
        for i, d in enumerate(parent.iterdir()):
            if i >= 2000:  # a crowded folder: look no further
                break
            run = d / "_run.json"
            if not d.name.startswith(".") and run.is_file():
                found.append((run.stat().st_mtime, d))
    except OSError:
        return None
    for _, d in sorted(found, key=lambda t: -t[0]):
        if reusable(d, dataset, analyses, selection) is None:
            return d
    return None


def _check_out(out: str | Path, fmt: str) -> None:
    """:class:`gpuclust.report.OutputError` now when ``out`` cannot be written later."""
    import os

    from gpuclust.report.folder import OutputError, ResultsFolder

    if fmt == "csv":
        ResultsFolder(out).open().abort()  # checks the folder, creates and removes its temporary sibling
        return
    p = Path(out)
    if p.is_dir():
        raise OutputError(p, "is a folder; the page is one file (report.html)")
    anc = p.parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir() or not os.access(anc, os.W_OK | os.X_OK):
        raise OutputError(p, f"{anc} is not a writable folder")


def main(args: argparse.Namespace) -> int:
    from gpuclust.engine.command import analyze_errors, build_analyses, flag_values
    from gpuclust.engine.progress import RunProgress
    from gpuclust.report.analyze import analyze

    def say(msg: str) -> None:
        print(f"gpuclust report: {msg}", file=sys.stderr, flush=True)

    results = Path(args.results) if args.results else _default_results(args.out)
    try:
        if Path(args.out).resolve() == results.resolve():
            raise ValueError("--out and --results must differ")
        _check_out(args.out, args.format)  # a bad output path fails before anything is computed
        names = list(dict.fromkeys(args.names)) or default_analyses(args.dataset)
        if not names:
            raise ValueError(f"{args.dataset}: the dataset has no table any analysis reads (see gpuclust info)")
        analyses = build_analyses(names, args.option, **flag_values(args))
        selection = (args.time_from, args.time_to)
        why = "--rerun" if args.rerun else reusable(results, args.dataset, analyses, selection)
        if why is not None and not args.rerun and not args.results:  # another results folder beside OUT?
            other = _matching_results(args.out, args.dataset, analyses, selection)
            if other is not None and other.resolve() != Path(args.out).resolve():
                results, why = other, None
        keys: list[str] | None = None
        if why is None:
            say(f"reusing the results in {results} (same dataset, analyses and options)")
            from gpuclust.engine.contexts import result_keys

            keys = result_keys(analyses)
        else:
            if not args.quiet:
                say(f"running {', '.join(names)} into {results} ({why})")
            analyze(
                args.dataset,
                analyses,
                out=results,
                backend=args.backend,
                scheduler=args.scheduler,
                partitions=args.partitions,
                plots=False,
                workers=args.workers,
                progress=None if args.quiet else RunProgress(),
                note=say,
                time_from=args.time_from,
                time_to=args.time_to,
                memory_limit=args.memory_limit,
                tables="native",  # read back from the folder below (on a cluster: written by the workers)
            )
        if args.format == "csv":
            from gpuclust.report.csv_out import write_csv

            files = write_csv(results, args.out, keys=keys)
            print(f"{Path(args.out)}  ({len(files)} CSV files; _run.json says what wrote them)")
            return 0
        from gpuclust.report.html import write_report

        page = write_report(results, args.out, keys=keys, progress=None if args.quiet else say)
    except analyze_errors() as e:
        say(f"error: {' '.join(str(e).split())}")
        return 2
    print(
        f"{page.path}  ({page.bytes / 1024:.0f} KiB, {page.sections} analyses, {page.figures} figures; "
        f"results in {results})"
    )
    return 0
