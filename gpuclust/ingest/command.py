"""``gpuclust ingest SRC... --out DATASET``: the command-line face of :func:`gpuclust.ingest.ingest`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpuclust.errors import EXIT_ERROR, fault_text
from gpuclust.ingest.base import FORMATS


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``ingest`` sub-command to ``subparsers``."""
    from gpuclust.schema import TIER_MAPS

    p = subparsers.add_parser(
        "ingest",
        help="convert raw trace files (v3 JSON/Parquet exports, v2 CSV, Kaggle CSV) into a canonical dataset",
        description=(
            "Read raw Google cluster-trace files and write a canonical dataset (typed Parquet parts, "
            "a manifest, rejected records).  Re-running on the same DATASET resumes: inputs already "
            "ingested are skipped, leftovers of an interrupted run are removed."
        ),
    )
    p.add_argument(
        "sources", nargs="+", metavar="SRC", help="input files or folders (folders are expanded recursively)"
    )
    p.add_argument("--out", "-o", required=True, metavar="DATASET", help="dataset folder to create or extend")
    p.add_argument("--format", choices=FORMATS, help="override format detection")
    p.add_argument("--table", help="override source-table detection (e.g. instance_usage, task_events)")
    p.add_argument("--cell", help="cell name recorded in the manifest (e.g. a)")
    p.add_argument(
        "--tier-map",
        choices=sorted(TIER_MAPS),
        help="priority tier map recorded in the manifest (default: notebook for v3, v2 for v2)",
    )
    p.add_argument(
        "--max-reject-rate",
        type=float,
        default=0.01,
        metavar="R",
        help="fail (exit 1) if rejected/read exceeds R (default 0.01)",
    )
    p.add_argument(
        "--workers", type=int, default=None, metavar="N", help="files read in parallel (default: number of CPUs)"
    )
    p.add_argument(
        "--chunk-mb", type=int, default=64, metavar="MB", help="decoded input per chunk / output part (default 64)"
    )
    p.add_argument(
        "--prefer",
        choices=("parquet", "json"),
        help="twin exports of one shard (JSON and Parquet, same name stem): read this one and skip "
        "the other (without it, twins are an error)",
    )
    p.add_argument(
        "--sample",
        metavar="KEY=P",
        help="keep a consistent sample: machines=P or collections=P (P like 1%% or 0.01); every row of the "
        "sampled machines / collections in every table that names them (docs/user/ingest.md)",
    )
    p.add_argument(
        "--from",
        dest="time_from",
        metavar="T",
        help="keep usage windows ending after T (trace time like 1d, or wall-clock in the cell's time zone)",
    )
    p.add_argument(
        "--to",
        dest="time_to",
        metavar="T",
        help="keep usage windows starting before T, and the events before T",
    )
    p.add_argument(
        "--listing",
        metavar="FILE",
        help="a bucket listing (`gsutil ls -l` output): an input smaller than listed fails as a truncated download",
    )
    p.add_argument(
        "--layout",
        choices=("bucketed", "flat"),
        default="bucketed",
        help="bucketed (default): once complete, lay the usage and event tables out by instance and machine "
        "(again after files are added), the layout every analysis holds its memory goal on; flat: leave new "
        "parts as read (e.g. while adding shards run by run), and lay it out at the end with `gpuclust optimize`",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the ingest described by ``args``; returns the exit status (0 ok, 1 an input failed, 2 an
    expected fault: usage, a missing input, a dataset folder that cannot be written)."""
    from gpuclust.ingest.api import IngestUsageError, ingest
    from gpuclust.ingest.base import ReadOptions
    from gpuclust.ingest.detect import DetectError
    from gpuclust.ingest.progress import Progress

    if args.chunk_mb < 1:
        print("gpuclust ingest: error: --chunk-mb must be >= 1", file=sys.stderr)
        return EXIT_ERROR
    try:
        report = ingest(
            args.sources,
            args.out,
            format=args.format,
            table=args.table,
            cell=args.cell,
            tier_map=args.tier_map,
            max_reject_rate=args.max_reject_rate,
            workers=args.workers,
            progress=None if args.no_progress else Progress(),
            opts=ReadOptions(chunk_bytes=args.chunk_mb << 20),
            prefer=args.prefer,
            sample=args.sample,
            time_from=args.time_from,
            time_to=args.time_to,
            listing=args.listing,
            layout=args.layout,
        )
    except (FileNotFoundError, DetectError, IngestUsageError) as e:
        print(f"gpuclust ingest: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as e:  # e.g. the dataset folder cannot be written: as analyze / optimize --out
        print(f"gpuclust ingest: error: {fault_text(e)}", file=sys.stderr)
        return EXIT_ERROR
    print(report.summary())
    return report.exit_status
