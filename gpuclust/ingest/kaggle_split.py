"""``gpuclust kaggle-split``: cut a Kaggle ``borg_traces_data.csv`` into one file per cell.

The published file mixes the trace's 8 cells (its ``cluster`` column), and collection and
machine IDs are unique only within a cell, so ingest refuses a file whose ``cluster`` changes
(:mod:`gpuclust.ingest.readers.kaggle_csv`).  This command streams the file (plain or gzip) and
writes ``OUTDIR/<name>.cluster-<N>.csv``: the header, then every record of that cell **as its
original text** (quoted cells spanning lines included), so each part ingests exactly as those
records would have.  Records whose ``cluster`` is empty or whose field count is wrong go to
``<name>.cluster-unknown.csv`` (ingest then rejects or keeps them with a reason, as usual).

Parts are written under temporary names and renamed when the whole input has been read, so an
interrupted split leaves no part that looks complete; re-running overwrites.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import sys
from pathlib import Path
from typing import Any, TextIO

__all__ = ["kaggle_split", "register"]

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def kaggle_split(path: str | Path, out_dir: str | Path) -> dict[str, int]:
    """Split ``path`` by its ``cluster`` column into ``out_dir``; returns records per cell.

    Examples
    --------
    >>> kaggle_split("borg_traces_data.csv", "by-cell")  # doctest: +SKIP
    {'1': 52031, '2': 48114, ...}
    """
    from gpuclust.ingest.detect import GZIP_MAGIC
    from gpuclust.ingest.readers.kaggle_csv import LineFeed
    from gpuclust.ingest.readers.v2_csv import decompressed_pieces

    path, out_dir = Path(path), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = path.name
    for suffix in (".gz", ".csv"):
        stem = stem.removesuffix(suffix)
    with open(path, "rb") as raw:
        compression = "gzip" if raw.read(2) == GZIP_MAGIC else None
        raw.seek(0)
        feed = LineFeed(decompressed_pieces(raw, compression))
        reader = csv.reader(feed, strict=False)
        try:
            header = next(reader)
        except StopIteration:
            raise ValueError(f"{path}: empty file: no header row") from None
        header_text = feed.take()
        names = [h.strip() for h in header]
        if "cluster" not in names:
            raise ValueError(f"{path}, line 1: no `cluster` column: not the borg_traces_data layout")
        ci = names.index("cluster")
        parts: dict[str, tuple[Path, Path, TextIO]] = {}
        counts: dict[str, int] = {}
        try:
            for fields in reader:
                text = feed.take()
                cell = fields[ci].strip() if len(fields) == len(names) and fields[ci].strip() else "unknown"
                if cell not in parts:
                    final = out_dir / f"{stem}.cluster-{_SAFE.sub('_', cell)}.csv"
                    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
                    f: TextIO = open(tmp, "w", encoding="utf-8", errors="surrogateescape", newline="")  # noqa: SIM115
                    f.write(header_text)
                    parts[cell] = (final, tmp, f)
                    counts[cell] = 0
                parts[cell][2].write(text)
                counts[cell] += 1
            for _final, _tmp, f in parts.values():
                f.flush()
                os.fsync(f.fileno())
                f.close()
            for final, tmp, _f in parts.values():
                os.replace(tmp, final)
        except BaseException:
            for _final, tmp, f in parts.values():
                f.close()
                tmp.unlink(missing_ok=True)
            raise
    return counts


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "kaggle-split",
        help="split a Kaggle borg_traces_data.csv into one file per cell (its `cluster` column)",
        description="Write OUTDIR/<name>.cluster-<N>.csv per cell, records as their original text; "
        "then ingest each part into its own dataset.",
    )
    p.add_argument("file", metavar="FILE", help="borg_traces_data.csv (plain or gzip)")
    p.add_argument("out", metavar="OUTDIR", help="folder for the per-cell files")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    try:
        counts = kaggle_split(args.file, args.out)
    except (OSError, ValueError, csv.Error) as e:
        from gpuclust.errors import EXIT_ERROR, fault_text

        print(f"gpuclust kaggle-split: error: {fault_text(e)}", file=sys.stderr)
        return EXIT_ERROR
    for cell, n in sorted(counts.items()):
        print(f"cluster {cell}: {n:,} records")
    return 0
