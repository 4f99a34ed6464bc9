"""``gpuclust analyze DATASET NAME... --out DIR``: run registered analyses from the command line.

Options come from the analyses' own declarations (:mod:`gpuclust.analyses.options`): ``-O
NAME=VALUE`` is parsed by the option field's type and choices, and ``--help`` lists every
analysis with its options.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Any

__all__ = [
    "OPTIONS_EPILOG",
    "AnalysesHelpFormatter",
    "add_run_options",
    "analyze_errors",
    "build_analyses",
    "flag_values",
    "main",
    "partitions_arg",
    "register",
    "scheduler_arg",
]


def partitions_arg(text: str) -> int | str:
    """``--partitions``: a positive integer or ``auto`` (argparse type)."""
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("partitions must be >= 1")
    return n


def scheduler_arg(text: str) -> str:
    """``--scheduler``: ``local:N`` must name a worker count (argparse type; the rest is checked
    when the scheduler is opened)."""
    if text == "local" or text.startswith("local:"):
        from gpuclust.engine.dask import local_workers

        try:
            local_workers(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _memory_limit(text: str) -> int | None:
    from gpuclust.engine.memory import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


OPTIONS_EPILOG = "analyses and their options (-O NAME=VALUE):"


class AnalysesHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Adds every analysis and its options to the epilog when help is printed, not when the
    parser is built: listing the options imports every analysis module (~0.05 s), which a run of
    one analysis does not need."""

    def _format_text(self, text: str) -> str:
        if text == OPTIONS_EPILOG:
            from gpuclust.analyses.registry import options_text

            text = f"{text}\n{options_text()}"
        return super()._format_text(text)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``analyze`` sub-command to ``subparsers``."""
    from gpuclust.analyses.registry import names

    p = subparsers.add_parser(
        "analyze",
        help="run analyses over a canonical dataset",
        description=textwrap.fill(
            "Run analyses over a canonical dataset and write DIR/<analysis>/<table>.parquet (a table that grows with "
            "the cell: a folder of parts, DIR/<analysis>/<table>/part-NNNNN.parquet), DIR/summary.txt, a "
            "plot per analysis and DIR/_run.json (what this run wrote, and how). DIR is written as a whole: an "
            "earlier run's results there are replaced.",
            88,
        ),
        epilog=OPTIONS_EPILOG,
        formatter_class=AnalysesHelpFormatter,
    )
    p.add_argument(
        "dataset",
        metavar="DATASET",
        help="canonical dataset folder (from `gpuclust ingest`); with --cells, a folder holding one dataset per cell",
    )
    p.add_argument("names", metavar="NAME", nargs="+", choices=names(), help=f"analyses: {', '.join(names())}")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (new, empty, or an earlier run's)")
    add_run_options(p)
    p.add_argument(
        "--cells",
        default=None,
        metavar="CELLS",
        help="a,b,... or all: DATASET holds one dataset per cell; results get a leading cell column",
    )
    p.add_argument("--no-plots", action="store_true", help="do not write PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr (notes and warnings stay)")
    p.set_defaults(func=main)
    return p


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of an analysis run (backend, scheduler, partitions, workers, memory, tier map,
    mode, time selection, ``-O``), declared once for every command that runs analyses
    (``analyze``, ``report``)."""
    from gpuclust.analyses.options import FLAG_OPTIONS

    p.add_argument(
        "--backend",
        choices=("cpu", "gpu", "auto"),
        default="cpu",
        help="array backend (default cpu; auto says what it chose)",
    )
    p.add_argument(
        "--scheduler",
        type=scheduler_arg,
        default=None,
        metavar="SCHED",
        help="threads | local:N | cuda | ADDRESS (tcp://host:port); default: run locally in-process "
        "(its threads keep about 6 cores busy: local:N, N processes, uses more; docs/developer/engine.md)",
    )
    p.add_argument(
        "--partitions",
        type=partitions_arg,
        default="auto",
        metavar="N",
        help="partitions per table, or 'auto' (about 4 Mi rows each, 1 Mi for cell-usage and cpi; the default)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="local run: threads processing partitions at once (default: the usable CPU cores "
        "on the cpu backend, 1 on gpu); results do not depend on it",
    )
    p.add_argument(
        "--memory-limit",
        type=_memory_limit,
        default=None,
        metavar="SIZE",
        help="memory budget of the run, e.g. 8GiB (default: 75%% of the machine's memory): sizes "
        "partitions and a local:N cluster's workers (docs/user/scale.md)",
    )
    for o in FLAG_OPTIONS:  # --tier-map, --mode: declared on the option they stand for
        p.add_argument(
            str(o.flag), dest=o.name, choices=o.choices, default=None, help=f"{o.help}; same as -O {o.name}=NAME"
        )
    p.add_argument(
        "--from",
        dest="time_from",
        default=None,
        metavar="TIME",
        help="select [TIME, --to): trace time (1d, 86400s, 2h, 90min, 1500ms, integer microseconds) or "
        "wall-clock in the cell's time zone (2019-05-02, 2019-05-02T08:00; Z or +HH:MM for an instant)",
    )
    p.add_argument(
        "--to", dest="time_to", default=None, metavar="TIME", help="end of the selection (exclusive), as --from"
    )
    p.add_argument(
        "-O",
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an analysis option (repeatable), e.g. -O by=machine -O bucket_s=3600; it applies to "
        "every named analysis that declares it (listed below)",
    )


def flag_values(args: argparse.Namespace) -> dict[str, str | None]:
    """The values of the flags that stand for options (``--tier-map``, ``--mode``), by option name."""
    from gpuclust.analyses.options import FLAG_OPTIONS

    return {o.name: getattr(args, o.name, None) for o in FLAG_OPTIONS}


def build_analyses(names: list[str], raw_options: list[str], **flags: str | None) -> list[Any]:
    """Create the named analyses with ``NAME=VALUE`` options parsed by each one's option fields;
    ``flags`` (:func:`flag_values`: ``tier_map=``, ``mode=``) stand for ``NAME=VALUE`` where it is
    not given.

    An option applies to every named analysis that declares it; one that none declares is an
    error.  Every error is a :class:`ValueError` with a one-line message.
    """
    from gpuclust.analyses.options import OptionError
    from gpuclust.analyses.registry import create, entry

    given: dict[str, str] = {}
    for item in raw_options:
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--option expects NAME=VALUE, got {item!r}")
        given[key.strip().replace("-", "_")] = val
    for flag_name, flag_value in flags.items():
        if flag_value is not None:
            given.setdefault(flag_name, flag_value)
    used: set[str] = set()
    out = []
    for name in names:
        opts = {o.name: o for o in entry(name).options}
        kw: dict[str, Any] = {}
        for key, val in given.items():
            if key in opts:
                try:
                    kw[key] = opts[key].parse(val)
                except OptionError as e:
                    raise ValueError(f"{name}: option {key}: {e}") from None
                used.add(key)
        try:
            out.append(create(name, **kw))
        except (ValueError, TypeError) as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(msg if msg.startswith(name) else f"{name}: {msg}") from None
    unused = sorted(set(given) - used)
    if unused:
        raise ValueError(f"no named analysis has option(s) {unused}; see gpuclust analyze --help")
    return out


def analyze_errors() -> tuple[type[BaseException], ...]:
    """The expected faults of an analysis run, reported in one line by the commands that run one
    (no traceback): no such backend, a bad dataset, an unwritable output, a bad option or plan."""
    from gpuclust.backends import BackendUnavailable
    from gpuclust.dataset import DatasetError
    from gpuclust.errors import OutputError

    return (BackendUnavailable, DatasetError, OutputError, ValueError, OSError)


def main(args: argparse.Namespace) -> int:
    from gpuclust.engine.progress import RunProgress
    from gpuclust.report.analyze import analyze

    def say(msg: str) -> None:
        print(f"gpuclust analyze: {msg}", file=sys.stderr, flush=True)

    try:
        analyses = build_analyses(list(dict.fromkeys(args.names)), args.option, **flag_values(args))
        analyze(
            args.dataset,
            analyses,
            out=args.out,
            backend=args.backend,
            scheduler=args.scheduler,
            partitions=args.partitions,
            plots=not args.no_plots,
            workers=args.workers,
            progress=None if args.quiet else RunProgress(),
            note=say,
            time_from=args.time_from,
            time_to=args.time_to,
            cells=args.cells,
            memory_limit=args.memory_limit,
            tables="native",
        )  # the results are read from the folder
    except analyze_errors() as e:
        say(f"error: {' '.join(str(e).split())}")
        return 2
    from pathlib import Path

    print((Path(args.out) / "summary.txt").read_text(), end="")
    return 0
