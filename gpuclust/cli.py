"""The ``gpuclust`` command.  Each sub-command is registered by the module that implements it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

#: sub-command -> (module, its register function); modules are imported only when needed
COMMANDS = {
    "ingest": ("gpuclust.ingest.command", "register"),
    "kaggle-split": ("gpuclust.ingest.kaggle_split", "register"),
    "optimize": ("gpuclust.optimize", "register"),
    "synth": ("gpuclust.synth.command", "register"),
    "info": ("gpuclust.info", "register"),
    "analyze": ("gpuclust.engine.command", "register"),
    "report": ("gpuclust.report.command", "register"),
    "demo": ("gpuclust.demo", "register"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every sub-command, or with just ``only`` (one of :data:`COMMANDS`: what
    :func:`main` does when the command line names it, so that running one sub-command does not
    import the others' modules: the synth generator, the demo, the ingest paths)."""
    import importlib

    from gpuclust import __version__

    p = argparse.ArgumentParser(prog="gpuclust", description="Analytics for the Google cluster-usage traces.")
    p.add_argument("--version", action="version", version=f"gpuclust {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, fn) in COMMANDS.items():
        if only is None or name == only:
            getattr(importlib.import_module(module), fn)(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse ``argv`` and run the sub-command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # `gpuclust COMMAND ...`: only that command's parser (help, --version and errors: all of them)
    only = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(only).parse_args(argv)
    rc = args.func(args)
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
