"""``gpuclust analyze DATASET NAME... --out DIR``: run registered analyses from the command line."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["main", "register"]


def _partitions(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("partitions must be >= 1")
    return n


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``analyze`` sub-command to ``subparsers``."""
    from gpuclust.analyses.cell_usage import MODES
    from gpuclust.analyses.registry import names
    from gpuclust.schema import TIER_MAPS

    p = subparsers.add_parser(
        "analyze",
        help="run analyses over a canonical dataset",
        description="Run analyses over a canonical dataset and write DIR/<analysis>/<table>.parquet, "
        "DIR/summary.txt and a plot per analysis.",
    )
    p.add_argument("dataset", metavar="DATASET", help="canonical dataset folder (from `gpuclust ingest`)")
    p.add_argument("names", metavar="NAME", nargs="+", choices=names(), help=f"analyses: {', '.join(names())}")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--backend", choices=("cpu", "gpu", "auto"), default="cpu", help="array backend (default cpu)")
    p.add_argument("--scheduler", default=None, metavar="SCHED",
                   help="threads | local:N | cuda | ADDRESS (tcp://host:port); default: run locally in-process")
    p.add_argument("--partitions", type=_partitions, default="auto", metavar="N",
                   help="partitions per table, or 'auto' (about 4 Mi rows each; the default)")
    p.add_argument("--tier-map", choices=sorted(TIER_MAPS), default=None,
                   help="priority tier map (default: the dataset manifest's)")
    p.add_argument("--mode", choices=MODES, default=None, help="cell-usage mode (default notebook)")
    p.add_argument("--no-plots", action="store_true", help="do not write PNG plots")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from gpuclust.backends import BackendUnavailable
    from gpuclust.dataset import DatasetError
    from gpuclust.engine import analyze

    try:
        analyze(args.dataset, list(dict.fromkeys(args.names)), out=args.out, backend=args.backend,
                scheduler=args.scheduler, partitions=args.partitions, tier_map=args.tier_map,
                mode=args.mode, plots=not args.no_plots)
    except (BackendUnavailable, DatasetError, ValueError) as e:
        print(f"gpuclust analyze: error: {e}", file=sys.stderr)
        return 2
    from pathlib import Path

    print((Path(args.out) / "summary.txt").read_text(), end="")
    return 0
