"""The ``gpuclust`` command.  Each sub-command is registered by the module that implements it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from gpuclust import __version__
    from gpuclust.demo import register as reg_demo
    from gpuclust.engine.command import register as reg_analyze
    from gpuclust.info import register as reg_info
    from gpuclust.ingest.command import register as reg_ingest
    from gpuclust.ingest.kaggle_split import register as reg_kaggle_split
    from gpuclust.optimize import register as reg_optimize
    from gpuclust.synth.command import register as reg_synth

    p = argparse.ArgumentParser(prog="gpuclust", description="Analytics for the Google cluster-usage traces.")
    p.add_argument("--version", action="version", version=f"gpuclust {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for reg in (reg_ingest, reg_kaggle_split, reg_optimize, reg_synth, reg_info, reg_analyze, reg_demo):
        reg(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse ``argv`` and run the sub-command; returns the exit status."""
    args = build_parser().parse_args(argv)
    rc = args.func(args)
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
