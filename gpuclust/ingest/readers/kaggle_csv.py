"""Reader for the Kaggle ``borg_traces_data.csv`` layout (a derived sample of the 2019 trace).

Each CSV record is one v3 InstanceEvent joined with a CollectionEvent and an InstanceUsage
window of the same collection; nested fields are stored as the text Python and NumPy print
(``"{'cpus': 0.0043, 'memory': None}"``, ``"[0.00020885 0.00025272 ...]"``), parsed here by the
safe literal parser :mod:`gpuclust.ingest.readers._pylit` (no ``eval``).

A record becomes

* one ``instance_events`` row (always; this is the record's primary table, so
  ``rows_read == instance_events rows + rejects``);
* one ``instance_usage`` row, unless the record carries no usage window or the same usage row
  was already produced from an earlier record of the same file (exact duplicate, counted in
  :attr:`Chunk.rows_deduplicated`);
* one ``instance_constraints`` row per element of a non-empty ``constraint`` list.

What each column means was worked out from the data; the conclusions and the evidence are in
``docs/user/formats-v2-kaggle.md``.  The two that matter most:

* ``instance_events_type`` is the event's type (v3 code).  The string column ``event`` is *not*
  the same thing (``SUBMIT`` rows say ``ENABLE``); it and ``failed`` are labels added by the
  sample's author and are not ingested.
* The usage window was joined on the collection only: the same window (identical to the last
  digit) is attached to rows of different instances on different machines, and lies outside
  those events' times.  Its instance and machine are therefore unknown; the usage row gets
  ``instance_index = -1`` (:data:`UNKNOWN_INSTANCE_INDEX`) and ``machine_id = 0``
  (:data:`UNKNOWN_MACHINE_ID`) instead of the event row's values, which would misattribute it.

Records are streamed with Python's :mod:`csv` module (quoted cells span lines) in chunks of
about ``ReadOptions.chunk_bytes`` of text; every reject carries the 1-based line number where
its record starts and the raw record text.

The columns are in :mod:`gpuclust.ingest.readers.kaggle_columns`, the conversion of records to
canonical rows in :mod:`gpuclust.ingest.readers.kaggle_records`.
"""

from __future__ import annotations

import codecs
import csv
from collections.abc import Iterator
from typing import Any

from gpuclust.ingest.base import Chunk, ReadOptions, SourceError, SourceFile
from gpuclust.ingest.readers.kaggle_columns import (
    DROPPED_COLUMNS as DROPPED_COLUMNS,  # re-exported
)
from gpuclust.ingest.readers.kaggle_columns import (
    KAGGLE_COLUMNS,
    REQUIRED_COLUMNS,
    UNKNOWN_INSTANCE_INDEX,
    UNKNOWN_MACHINE_ID,
)
from gpuclust.ingest.readers.kaggle_records import _Batch
from gpuclust.ingest.readers.v2_csv import _Truncated, decompressed_pieces

__all__ = ["KAGGLE_COLUMNS", "UNKNOWN_INSTANCE_INDEX", "UNKNOWN_MACHINE_ID", "LineFeed", "read"]


class LineFeed:
    """Iterator of text lines for :func:`csv.reader` that remembers the lines it handed out."""

    def __init__(self, pieces: Iterator[bytes]):
        self._pieces = pieces
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        self._lines: list[str] = []
        self._pos = 0
        self._tail = ""
        self._eof = False
        self.taken: list[str] = []
        self.chars = 0

    def __iter__(self) -> LineFeed:
        return self

    def __next__(self) -> str:
        while self._pos >= len(self._lines):
            if self._eof:
                raise StopIteration
            self._fill()
        line = self._lines[self._pos]
        self._pos += 1
        self.taken.append(line)
        self.chars += len(line)
        return line

    def _fill(self) -> None:
        self._lines, self._pos = [], 0
        try:
            piece = next(self._pieces)
        except StopIteration:
            text = self._tail + self._dec.decode(b"", final=True)
            self._tail = ""
            self._eof = True
            if text:
                self._lines = [text]
            return
        text = self._tail + self._dec.decode(piece)
        parts = text.split("\n")
        self._tail = parts.pop()
        self._lines = [p + "\n" for p in parts]

    def take(self) -> str:
        raw = "".join(self.taken)
        self.taken.clear()
        return raw


def _read_header(src: SourceFile, reader: Any, feed: LineFeed) -> list[str]:
    """The header row, stripped, checked to name every needed column once."""
    try:
        header = next(reader)
    except StopIteration:
        raise SourceError(src.path, "empty file: no header row") from None
    except (_Truncated, csv.Error) as e:
        raise SourceError(src.path, f"cannot read the header: {e}", line=1) from None
    feed.take()
    header = [h.strip() for h in header]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise SourceError(src.path, f"not the borg_traces_data layout: header lacks {missing}", line=1)
    if len(set(header)) != len(header):
        raise SourceError(src.path, "header has duplicate column names", line=1)
    return header


def _same_cell(src: SourceFile, cl: str, line: int, first_cluster: tuple[str, int] | None) -> tuple[str, int]:
    """The file's first cluster and its line; raises when ``cl`` (at ``line``) is another cell."""
    # One dataset holds one cell: IDs are unique only within a cell, so a file whose `cluster`
    # column changes (the full published file mixes 8) is refused, with the way out.
    if first_cluster is None:
        return (cl, line)
    if cl != first_cluster[0]:
        raise SourceError(
            src.path,
            f"the file mixes cells: cluster {first_cluster[0]} (from line {first_cluster[1]}) and "
            f"cluster {cl}; collection and machine IDs are unique only within a cell, so a dataset "
            f"holds one cell: split the file with `gpuclust kaggle-split {src.path} DIR` and ingest "
            f"each part into its own dataset (--cell)",
            line=line,
        )
    return first_cluster


def _chunks(
    src: SourceFile, raw: Any, feed: LineFeed, reader: Any, header: list[str], chunk_bytes: int
) -> Iterator[Chunk]:
    """The records after the header as chunks of about ``chunk_bytes`` of text (malformed ones rejected)."""
    seen: set[bytes] = set()
    idx = {c: header.index(c) for c in (*REQUIRED_COLUMNS, "collection_id_1", "collection_id_2") if c in header}
    ci = header.index("cluster") if "cluster" in header else None
    first_cluster: tuple[str, int] | None = None
    batch = _Batch(src, idx, len(header), seen)
    start_chars = feed.chars
    last_line = reader.line_num
    record_no = 0
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            # A malformed record (e.g. an oversized field from a stray quote): reject it, go on.
            batch.rejects.append((last_line + 1, record_no, f"CSV error: {e}", feed.take()))
            record_no += 1
            batch.rows_read += 1
            last_line = reader.line_num
            continue
        except _Truncated as e:
            if batch.rows_read:
                yield batch.finish(raw.tell())
            raise SourceError(src.path, str(e), line=last_line + 1) from None
        if ci is not None and len(fields) == len(header) and fields[ci].strip():
            first_cluster = _same_cell(src, fields[ci].strip(), last_line + 1, first_cluster)
        batch.add(last_line + 1, record_no, fields, feed.take())
        record_no += 1
        last_line = reader.line_num
        if feed.chars - start_chars >= chunk_bytes:
            yield batch.finish(raw.tell())
            batch = _Batch(src, idx, len(header), seen)
            start_chars = feed.chars
    if batch.rows_read:
        yield batch.finish(raw.tell())


def read(src: SourceFile, opts: ReadOptions) -> Iterator[Chunk]:
    """Read one Kaggle ``borg_traces_data.csv`` file as canonical chunks.

    Yields chunks holding ``instance_events``, ``instance_usage`` and ``instance_constraints``
    tables.  Exact duplicate usage rows (the layout repeats one usage window on many records)
    are dropped and counted in ``Chunk.rows_deduplicated``.

    Raises
    ------
    SourceError
        The file cannot be opened, lacks a header with the needed columns, its compressed
        stream is truncated (raised after the chunks read before the damage), or its
        ``cluster`` column holds more than one cell (see :mod:`gpuclust.ingest.kaggle_split`).

    Examples
    --------
    >>> from pathlib import Path
    >>> src = SourceFile(Path("borg_traces_data.csv"), "kaggle-csv", "borg_traces_data", None, "v3")
    >>> chunks = list(read(src, ReadOptions()))  # doctest: +SKIP
    """
    try:
        raw = open(src.path, "rb")  # noqa: SIM115 - closed below
    except OSError as e:
        raise SourceError(src.path, f"cannot open: {e.strerror or e}") from None
    chunk_bytes = max(1, int(opts.chunk_bytes))
    try:
        hashed = opts.digest.wrap(raw) if opts.digest is not None else raw  # hashed as it is read
        feed = LineFeed(decompressed_pieces(hashed, src.compression))
        reader = csv.reader(feed, strict=False)
        header = _read_header(src, reader, feed)
        yield from _chunks(src, raw, feed, reader, header, chunk_bytes)
    except OSError as e:
        raise SourceError(src.path, f"read error: {e.strerror or e}") from None
    finally:
        raw.close()
