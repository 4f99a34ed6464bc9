"""The contract between source readers and the dataset writer.

A reader turns one input file into a stream of :class:`Chunk` objects.  Each chunk holds, for
one or more canonical tables, an Arrow table that already has the canonical schema
(``gpuclust.schema.SCHEMAS``), plus the raw records it rejected.  Readers never write files; the
writer (``gpuclust.ingest.writer``) owns output, atomicity, the manifest and resumption.

Reader rules
------------
* Stream: hold at most one chunk's worth of records in memory (default ~64 MiB of decoded text),
  whatever the file size.
* A bad record never costs its good neighbours: isolate it, reject it, keep the rest.
* Count every raw record exactly once: ``rows_read == rows written + rows rejected`` per source
  table, summed over the chunks of one file (a record that feeds two canonical tables, such as a
  v3 instance event with constraints, counts once, against its primary table).
* IDs and times never pass through float64 (use :func:`gpuclust.ingest.normalize.conform`).
* A file that cannot be read at all (unreadable, truncated gzip) raises :class:`SourceError`
  after yielding the chunks it could read; the writer records it as failed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

#: Source formats gpuclust reads.
FORMATS = ("v3-json", "v3-parquet", "v2-csv", "kaggle-csv")


@dataclass(frozen=True)
class Reject:
    """One raw record that could not be ingested."""

    file: str
    #: 1-based line number in the decompressed text (JSON lines, CSV), else None.
    line: int | None
    #: 0-based row number within the file (Parquet, CSV data rows), else None.
    row: int | None
    reason: str
    #: The raw record as text (a JSON line, a CSV line, a Parquet row rendered as JSON), truncated
    #: to 64 KiB.
    raw: str


@dataclass
class Chunk:
    """Canonical rows read from one contiguous piece of one input file."""

    tables: dict[str, pa.Table]
    rejects: list[Reject] = field(default_factory=list)
    #: Raw records consumed by this chunk (good + rejected).
    rows_read: int = 0
    #: Bytes of the *input file* consumed so far (compressed bytes for gzip), for progress.
    bytes_done: int = 0
    #: Rows intentionally dropped as exact duplicates (Kaggle layout only); documented, counted.
    rows_deduplicated: int = 0
    #: Raw records dropped early because they are outside ``ReadOptions.select``.
    rows_skipped: int = 0


@dataclass(frozen=True)
class SourceFile:
    """An input file and what it was detected (or declared) to be."""

    path: Path
    format: str  # one of FORMATS
    #: The source table: a v3 table name (``instance_usage`` ...), a v2 table name (``task_usage``,
    #: ``task_events``, ``job_events``, ``machine_events``, ``machine_attributes``,
    #: ``task_constraints``), or ``borg_traces_data`` for the Kaggle layout.
    source_table: str
    compression: str | None  # "gzip" or None
    trace_version: str  # "v3" or "v2"
    #: Why this file cannot be read as ``format`` (empty, unreadable, another format inside), as
    #: one line naming the file; ingest records such an input as failed without reading it.
    problem: str | None = None
    #: A remark for the user (e.g. the content decided against the name).
    note: str | None = None


class SourceError(Exception):
    """A whole input file (or the rest of it) cannot be read."""

    def __init__(self, path: Path | str, reason: str, line: int | None = None):
        self.path = str(path)
        self.reason = reason
        self.line = line
        where = f"{self.path}" + (f", line {line}" if line is not None else "")
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True)
class ReadOptions:
    #: Target size of one chunk of decoded input, in bytes.
    chunk_bytes: int = 64 << 20
    #: Threads a reader may use for parsing.
    threads: int = 2
    #: What to keep (a sample, a time range: :class:`gpuclust.ingest.sampling.IngestSelection`);
    #: ``None`` keeps everything.  Readers may drop rows outside it early (before validation).
    select: Any = None
    #: The input's :class:`gpuclust.ingest.content_hash.StreamHash`, when its hash is not known
    #: yet: a reader that reads the file in order from its start wraps its file object with
    #: ``digest.wrap(f)`` so the file is hashed as it is read (the others leave it alone).
    digest: Any = None


class Reader(Protocol):
    def __call__(self, src: SourceFile, opts: ReadOptions) -> Iterator[Chunk]: ...


#: Truncation limit for ``Reject.raw``.
RAW_LIMIT = 64 << 10


def clip_raw(text: str) -> str:
    return text if len(text) <= RAW_LIMIT else text[:RAW_LIMIT] + "...[truncated]"
