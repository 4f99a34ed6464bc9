"""``gpuclust claims DATASET``: the published observations the trace supports, with this dataset's
values beside the papers' (see :mod:`gpuclust.claims`)."""

from __future__ import annotations

import argparse
import csv
import sys
import textwrap
from pathlib import Path
from typing import Any

__all__ = ["main", "register", "render"]


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``claims`` sub-command."""
    p = subparsers.add_parser(
        "claims",
        help="published observations on the traces, side by side with this dataset's values",
        description=textwrap.fill(
            "For every published observation the trace can support (seed 003's ten observations on the 2011 "
            "trace, Borg's, the 2019 job tail): the claim, its source, the paper's value, this dataset's value, "
            "what it rests on, and whether this dataset can support it (trace, share of the trace, time span, "
            "usage present) or why not. Runs the analyses the claims read. "
            "Definitions: docs/user/claims.md.",
            88,
        ),
    )
    p.add_argument("dataset", metavar="DATASET", help="canonical dataset folder (from `gpuclust ingest`)")
    p.add_argument("--csv", default=None, metavar="FILE", help="also write the rows as CSV")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=main)
    return p


def _results(dataset: str, quiet: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """The claims' analyses by name, run in this process (cpu backend, automatic partitions):
    those the dataset has the tables for; and for the others why not (``needs TABLE``)."""
    from gpuclust.analyses.registry import create
    from gpuclust.claims import needed_analyses
    from gpuclust.dataset import Dataset
    from gpuclust.engine import run
    from gpuclust.info import dataset_info

    state = {n: str(v) for n, v in dataset_info(dataset)["analyses"].items()}
    not_run = {n: state[n] for n in needed_analyses() if state.get(n, "").startswith("needs")}
    todo = [create(n, **o) for n, o in needed_analyses().items() if n not in not_run]
    if not todo:
        return {}, not_run
    if not quiet:
        print(f"claims: running {', '.join(a.label for a in todo)}", file=sys.stderr)
    res = run(Dataset(dataset), todo, partitions="auto")
    return {a.name: res[a.label if a.label in res else a.name] for a in todo}, not_run


def render(rows: list[dict[str, Any]]) -> str:
    """The rows as text: one block per claim."""
    lines = []
    for r in rows:
        mark = "supported" if r["supported"] else f"cannot compare: {r['why']}"
        lines += [
            f"[{r['id']}] {r['claim']}",
            f"    source:  {r['source']}",
            f"    paper:   {r['paper']}",
            f"    dataset: {r['dataset']}" + (f" (rests on {r['rests_on']})" if r["rests_on"] else ""),
            f"    {mark}",
            "",
        ]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from gpuclust._files import write_atomic
    from gpuclust.claims import DatasetFacts, evaluate
    from gpuclust.dataset import DatasetError
    from gpuclust.errors import EXIT_ERROR

    try:
        facts = DatasetFacts.of(args.dataset)
        res, not_run = _results(args.dataset, args.quiet)
    except (DatasetError, OSError, ValueError) as e:
        print(f"gpuclust claims: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    rows = evaluate(res, facts, not_run=not_run)
    print(render(rows))
    if args.csv:

        def write(tmp: str) -> None:
            with open(tmp, "w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)

        try:  # whole or not at all
            write_atomic(Path(args.csv), write)
        except OSError as e:
            print(f"gpuclust claims: error: {args.csv}: {e.strerror or e}", file=sys.stderr)
            return EXIT_ERROR
    return 0
