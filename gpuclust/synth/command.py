"""The ``gpuclust synth`` sub-command."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``synth`` to the ``gpuclust`` command."""
    from gpuclust.synth import SynthConfig

    p = subparsers.add_parser(
        "synth",
        help="write a synthetic cell in the v3 JSON export format, with planted ground truth",
        description="Simulate a Borg cell and write v3 BigQuery-export JSON shards plus synth_truth.json "
        "(see docs/user/synth.md).",
    )
    p.add_argument("--out", required=True, type=Path, help="output folder for the shards")
    p.add_argument("--dataset", type=Path, default=None, help="also ingest into this gpuclust dataset")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    defaults = SynthConfig()
    for f in dataclasses.fields(SynthConfig):
        d = getattr(defaults, f.name)
        if isinstance(d, bool):
            p.add_argument(
                _flag(f.name), dest=f.name, default=d, action=argparse.BooleanOptionalAction, help=f"(default {d})"
            )
        else:
            p.add_argument(_flag(f.name), dest=f.name, type=type(d), default=d, help=f"(default {d})")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``gpuclust synth``: 0 done; 1 the ``--dataset`` ingest left an input failed; 2 an
    expected fault (a bad setting, an ``--out`` that is a file or cannot be written), one line."""
    from gpuclust.dataset import DatasetError
    from gpuclust.errors import EXIT_ERROR, fault_text
    from gpuclust.synth import SynthConfig, synthesize

    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(SynthConfig)}
    faults: tuple[type[Exception], ...] = (ValueError,)  # a bad setting
    try:
        cfg = SynthConfig(**kw)
        faults = (OSError, DatasetError)  # an --out / --dataset that cannot be written
        if args.dataset is not None:
            from gpuclust.ingest.api import IngestUsageError
            from gpuclust.ingest.detect import DetectError

            faults += (IngestUsageError, DetectError)
        res = synthesize(cfg, args.out, dataset=args.dataset, progress=None if args.quiet else _stderr)
    except Exception as e:
        if not isinstance(e, faults):
            raise
        print(f"gpuclust synth: error: {fault_text(e)}", file=sys.stderr)
        return EXIT_ERROR
    if res.ingest_report is not None:
        summary = getattr(res.ingest_report, "summary", None)
        if callable(summary):
            print(summary())
        return int(getattr(res.ingest_report, "exit_status", 0) or 0)
    return 0


def _stderr(msg: str) -> None:
    print(f"[synth] {msg}", file=sys.stderr, flush=True)
