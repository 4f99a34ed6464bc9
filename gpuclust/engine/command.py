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
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="local run: threads processing partitions at once (default: the usable CPU cores "
                   "on the cpu backend, 1 on gpu); results do not depend on it")
    p.add_argument("--tier-map", choices=sorted(TIER_MAPS), default=None,
                   help="priority tier map (default: the dataset manifest's)")
    p.add_argument("--mode", choices=MODES, default=None, help="cell-usage mode (default notebook)")
    p.add_argument("-O", "--option", action="append", default=[], metavar="NAME=VALUE",
                   help="an analysis option (repeatable), e.g. -O by=machine -O bucket_s=3600; it applies to "
                   "every named analysis that declares it (options: docs/analyses.md)")
    p.add_argument("--no-plots", action="store_true", help="do not write PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=main)
    return p


def _coerce(default: Any, text: str) -> Any:
    """Turn ``text`` into the type of an option's default (bool, int, float; else the text)."""
    if isinstance(default, bool):
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected a boolean, got {text!r}")
    if isinstance(default, int):
        return int(text)
    if isinstance(default, float):
        return float(text)
    return text


def build_analyses(names: list[str], raw_options: list[str], *, tier_map: str | None = None,
                   mode: str | None = None) -> list[Any]:
    """Create the named analyses with ``NAME=VALUE`` options typed by each one's registry entry.

    An option applies to every named analysis that declares it; one that none declares is an error.
    """
    from gpuclust.analyses.registry import REGISTRY, create

    given: dict[str, str] = {}
    for item in raw_options:
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--option expects NAME=VALUE, got {item!r}")
        given[key.strip().replace("-", "_")] = val
    if tier_map is not None:
        given.setdefault("tier_map", tier_map)
    if mode is not None:
        given.setdefault("mode", mode)
    used: set[str] = set()
    out = []
    for name in names:
        opts = {o.name: o for o in REGISTRY[name].options}
        kw: dict[str, Any] = {}
        for key, val in given.items():
            if key in opts:
                try:
                    kw[key] = _coerce(opts[key].default, val)
                except ValueError as e:
                    raise ValueError(f"{name}: option {key}: {e}") from None
                used.add(key)
        out.append(create(name, **kw))
    unused = sorted(set(given) - used)
    if unused:
        raise ValueError(f"no named analysis has option(s) {unused}")
    return out


def main(args: argparse.Namespace) -> int:
    from gpuclust.backends import BackendUnavailable
    from gpuclust.dataset import DatasetError
    from gpuclust.engine import analyze

    try:
        analyses = build_analyses(list(dict.fromkeys(args.names)), args.option, tier_map=args.tier_map, mode=args.mode)
        from gpuclust.engine.progress import RunProgress

        analyze(args.dataset, analyses, out=args.out, backend=args.backend,
                scheduler=args.scheduler, partitions=args.partitions, plots=not args.no_plots,
                workers=args.workers, progress=None if args.quiet else RunProgress())
    except (BackendUnavailable, DatasetError, ValueError) as e:
        print(f"gpuclust analyze: error: {e}", file=sys.stderr)
        return 2
    from pathlib import Path

    print((Path(args.out) / "summary.txt").read_text(), end="")
    return 0
