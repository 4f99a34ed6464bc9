"""The ``gpuclust`` command.  Each sub-command is registered by the module that implements it; the
exit statuses and fault text they share are :mod:`gpuclust.errors`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpuclust.errors import EXIT_ERROR, expected_fault, fault_text

#: sub-command -> (module, its register function); modules are imported only when needed
COMMANDS = {
    "ingest": ("gpuclust.ingest.command", "register"),
    "kaggle-split": ("gpuclust.ingest.kaggle_split", "register"),
    "optimize": ("gpuclust.optimize", "register"),
    "synth": ("gpuclust.synth.command", "register"),
    "info": ("gpuclust.info", "register"),
    "analyze": ("gpuclust.engine.command", "register"),
    "report": ("gpuclust.report.command", "register"),
    "claims": ("gpuclust.claims.command", "register"),
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


#: sub-commands that end the process as soon as they are done (see :func:`_exit_now`; ingest: ~0.2 s
#: of teardown after a 1 GB shard, measured)
FAST_EXIT = ("analyze", "ingest")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse ``argv`` and run the sub-command; returns the exit status.

    Run as the program (``argv`` None: the ``gpuclust`` script, ``python -m gpuclust.cli``), a
    sub-command of :data:`FAST_EXIT` that succeeded ends the process there (:func:`_exit_now`)."""
    program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    # `gpuclust COMMAND ...`: only that command's parser (help, --version and errors: all of them)
    only = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(only).parse_args(argv)
    try:
        rc = int(args.func(args) or 0)
    except Exception as e:  # an expected fault the command did not catch: one line, not a traceback
        if not expected_fault(e):
            raise
        print(f"gpuclust {args.command}: error: {fault_text(e)}", file=sys.stderr, flush=True)
        return EXIT_ERROR
    if program and rc == 0 and args.command in FAST_EXIT:
        _exit_now(rc)
    return rc


def _exit_now(rc: int) -> None:
    """End the process with ``rc`` without the interpreter's teardown: the exit handlers run
    (``atexit``: temporary folders, logging), the standard streams are flushed, then ``os._exit``
    skips freeing every module and cached array one by one (about 80 ms after cell-usage at
    1.6e7 windows; the kernel frees the memory at once).  Only with the main thread alone (a
    live thread would be cut off), and not with ``GPUCLUST_FAST_EXIT=0``."""
    import atexit
    import os
    import threading

    if os.environ.get("GPUCLUST_FAST_EXIT", "1") == "0" or threading.active_count() > 1:
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed pipe: nothing more to write
            pass
    os._exit(rc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
