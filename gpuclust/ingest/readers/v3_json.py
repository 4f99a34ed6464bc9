"""Reader for the 2019 (v3) BigQuery JSON exports: newline-delimited JSON, optionally gzipped.

Encoding of the exports (and what this reader does about it):

* INT64 values are quoted strings (``"machine_id":"23624491139"``).  They are read as strings and
  parsed by Arrow's exact integer parser (never through float64), so 2^63-1 and IDs above 2^53
  survive exactly.  Enum fields are quoted numbers too; enum *names* (``"SCHEDULE"``) are
  accepted as well.
* NULL fields are omitted keys; whole floats lack a decimal point (``"cpus":1``).
* Repeated fields (``constraint``, ``start_after_collection_ids``) may be omitted when empty.

The fast path cuts the decompressed text into ~64 MiB chunks at line ends and parses each with
``pyarrow.json.read_json`` against an explicit schema (Arrow's threads on), while a background
thread decompresses the next chunk.  A chunk Arrow cannot parse (malformed JSON, an object where
a number belongs, ...) is re-parsed line by line with :mod:`json` to find and reject exactly the
bad lines; its good lines are kept.  Rows that parse but do not fit the canonical schema are
rejected one by one by :func:`gpuclust.ingest.normalize.conform`.

The source fields and their mapping to canonical columns are in
:mod:`gpuclust.ingest.readers.v3_fields`, the flattening shared with the Parquet reader
(:mod:`gpuclust.ingest.readers.v3_parquet`) in :mod:`gpuclust.ingest.readers.v3_canonical`, so
both formats flatten identically; the per-line coercion of the slow path is in
:mod:`gpuclust.ingest.readers.v3_coerce`.  Their public names are importable from here as well.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pj

from gpuclust.ingest import arrays
from gpuclust.ingest.base import Chunk, ReadOptions, Reject, SourceError, SourceFile, clip_raw
from gpuclust.ingest.readers import _fast_usage
from gpuclust.ingest.readers.text_pieces import Piece, ordered_map, pieces, release, threaded
from gpuclust.ingest.readers.v3_canonical import OUTPUTS, preselect, to_canonical, to_canonical_batches
from gpuclust.ingest.readers.v3_coerce import _BadValue, _json_int, _jtype, coerce_record
from gpuclust.ingest.readers.v3_fields import (
    BOOL,
    COLUMN_MAP,
    CONSTRAINTS,
    ENUMS,
    FLOAT,
    FLOATS,
    INT,
    INTS,
    RAW_TYPES,
    RES,
    SOURCE_FIELDS,
    STR,
    raw_schema,
)

__all__ = [
    "BOOL",
    "COLUMN_MAP",
    "CONSTRAINTS",
    "ENUMS",
    "FLOAT",
    "FLOATS",
    "INT",
    "INTS",
    "OUTPUTS",
    "RAW_TYPES",
    "RES",
    "SOURCE_FIELDS",
    "STR",
    "coerce_record",
    "parse_piece",
    "preselect",
    "raw_schema",
    "read",
    "to_canonical",
    "to_canonical_batches",
]


# --------------------------------------------------------------------------------------------
# Parsing one chunk
# --------------------------------------------------------------------------------------------
class _Mismatch(Exception):
    pass


class _Lines:
    """Lazy access to line texts inside one piece."""

    def __init__(self, piece: Piece):
        self.data = piece.view
        self._nl: np.ndarray | None = None

    def text(self, k: int) -> str:
        """Text of the k-th (0-based) line of the piece."""
        if self._nl is None:
            self._nl = np.flatnonzero(np.frombuffer(self.data, np.uint8) == 10)
        nl = self._nl
        start = int(nl[k - 1]) + 1 if k > 0 else 0
        end = int(nl[k]) if k < len(nl) else len(self.data)
        return bytes(self.data[start:end]).decode("utf-8", "replace").rstrip("\r")


_BLANK_INSIDE = re.compile(rb"\n[ \t\r]*\n")
_BLANK_EDGE = re.compile(rb"[ \t\r]*\n?")


def _has_blank_line(piece: Piece) -> bool:
    """Whether the piece has an empty or whitespace-only line (Arrow skips those)."""
    buf, start, end = piece.buf, piece.start, piece.end
    if end <= start:
        return False
    m = _BLANK_EDGE.match(buf, start, end)  # first line
    if m is not None and (m.end() == end or buf[m.end() - 1] == 10):
        return True
    last = buf.rfind(b"\n", start, end - 1) + 1 if buf[end - 1] == 10 else buf.rfind(b"\n", start, end) + 1
    last = max(last, start)
    if not buf[last:end].strip():  # last line
        return True
    if piece.nl_pos is not None:
        # A blank line inside starts right after a newline with a newline, blank or CR; most
        # pieces have none of those, which spares the regular-expression scan.
        after = piece.nl_pos[piece.nl_pos < end - start - 1] + 1
        nxt = np.frombuffer(buf, np.uint8, end - start, start)[after]
        if not ((nxt == 10) | (nxt == 32) | (nxt == 9) | (nxt == 13)).any():
            return False
    return _BLANK_INSIDE.search(buf, start, end) is not None


def _arrow_parse(data: memoryview, schema: pa.Schema, opts: ReadOptions) -> pa.Table:
    block = max(64 << 10, min(4 << 20, len(data) // max(1, 2 * opts.threads) + 1))
    return pj.read_json(
        pa.py_buffer(data),
        read_options=pj.ReadOptions(use_threads=opts.threads > 1, block_size=block),
        parse_options=pj.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=False
        ),
    )


def _slow_parse(
    piece: Piece, fields: dict[str, str], schema: pa.Schema, file: str
) -> tuple[pa.Table, np.ndarray, list[Reject], int]:
    """Per-line parse: (raw table of good records, their 0-based line indexes, rejects, non-blank lines)."""
    lines = piece.tobytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    records: list[dict[str, Any]] = []
    idx: list[int] = []
    rejects: list[Reject] = []
    nonblank = 0
    for k, raw in enumerate(lines):
        if not raw.strip():
            continue
        nonblank += 1
        reason: str | None = None
        try:
            rec = json.loads(raw, parse_int=_json_int)
        except UnicodeDecodeError as e:
            reason = f"invalid UTF-8: {e.reason}"
        except ValueError as e:
            reason = f"invalid JSON: {e}"
        else:
            if not isinstance(rec, dict):
                reason = f"not a JSON object (got {_jtype(rec)})"
            else:
                try:
                    records.append(coerce_record(rec, fields))
                    idx.append(k)
                    continue
                except _BadValue as e:
                    reason = str(e)
        text = raw.decode("utf-8", "replace").rstrip("\r")
        rejects.append(Reject(file=file, line=piece.first_line + k, row=None, reason=reason, raw=clip_raw(text)))
    table = pa.Table.from_pylist(records, schema=schema)
    return table, np.asarray(idx, dtype=np.int64), rejects, nonblank


def _arrow_checked(piece: Piece, schema: pa.Schema, opts: ReadOptions) -> tuple[pa.Table, np.ndarray | None, int]:
    """Arrow-parse a piece: (raw table, 0-based line index per row or None for row i = line i, records).

    Raises ``pa.ArrowInvalid`` (or :class:`_Mismatch` when rows cannot be matched to lines, e.g. a
    line holding two objects) so the caller can isolate the bad lines.
    """
    buf, start, end = piece.buf, piece.start, piece.end
    n_lines = piece.newlines + (1 if end > start and buf[end - 1] != 10 else 0)
    raw = _arrow_parse(piece.view, schema, opts)
    if raw.num_rows == n_lines and not _has_blank_line(piece):
        return raw, None, n_lines
    lines = piece.tobytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    nb = np.asarray([k for k, ln in enumerate(lines) if ln.strip()], dtype=np.int64)
    if raw.num_rows != len(nb):
        raise _Mismatch
    return raw, nb, len(nb)


def _split(piece: Piece, size: int) -> list[Piece]:
    """Cut a piece into line-aligned sub-pieces of about ``size`` bytes."""
    out: list[Piece] = []
    buf, pos, end, line = piece.buf, piece.start, piece.end, piece.first_line
    while pos < end:
        cut = end if pos + size >= end else buf.find(b"\n", pos + size, end) + 1
        if cut <= pos:
            cut = end
        nl = int(np.count_nonzero(np.frombuffer(buf, np.uint8, cut - pos, pos) == 10))  # buf may be a mmap
        out.append(Piece(buf, pos, cut, line, nl, piece.bytes_done))
        line += nl
        pos = cut
    return out


def _isolate(
    piece: Piece, fields: dict[str, str], schema: pa.Schema, file: str, opts: ReadOptions
) -> tuple[pa.Table, np.ndarray, list[Reject], int]:
    """A piece Arrow could not parse: re-parse ~1/16 of it at a time with Arrow, and only the
    sub-pieces that still fail line by line with :mod:`json`."""
    subs = _split(piece, max(1024, min(1 << 20, len(piece) // 16)))
    if len(subs) <= 1:
        return _slow_parse(piece, fields, schema, file)
    tables: list[pa.Table] = []
    idx: list[np.ndarray] = []
    rejects: list[Reject] = []
    total = 0
    for sp in subs:
        off = sp.first_line - piece.first_line
        try:
            t, li, n = _arrow_checked(sp, schema, opts)
            li = np.arange(t.num_rows, dtype=np.int64) if li is None else li
        except (pa.ArrowInvalid, _Mismatch):
            t, li, rej, n = _slow_parse(sp, fields, schema, file)
            rejects.extend(rej)
        tables.append(t)
        idx.append(li + off)
        total += n
    return pa.concat_tables(tables), np.concatenate(idx), rejects, total


@dataclass
class _Parsed:
    """A piece after the Arrow (or per-line) parse, before :func:`to_canonical`."""

    piece: Piece
    raw: pa.Table
    line_idx: np.ndarray | None  # 0-based line index (within the piece) of each raw row; None = row i is line i
    rejects: list[Reject]
    rows_read: int


def _parse_raw(src: SourceFile, piece: Piece, opts: ReadOptions) -> _Parsed:
    """The parse half of :func:`parse_piece` (runs ahead in the reader's thread when threads > 1).

    InstanceUsage pieces go to the compiled reader (:mod:`._fast_usage`) first, once it is loaded
    (:func:`._fast_usage.ready`; pieces read while it loads are parsed by Arrow, with the same
    result); a piece it does not accept (anything but clean records) is parsed by Arrow, with
    per-line isolation."""
    if src.source_table == "instance_usage" and _fast_usage.ready(_fast_usage.LOAD_WAIT):
        n_lines = piece.newlines + (1 if len(piece) and piece.buf[piece.end - 1] != 10 else 0)
        fast = _fast_usage.parse(piece.view, n_lines, opts.threads)
        if fast is not None:
            release(piece)  # a mapped piece's pages (the table holds no reference to the text)
            return _Parsed(piece, fast, None, [], fast.num_rows)
    rejects: list[Reject] = []
    schema = raw_schema(src.source_table)
    try:
        raw, line_idx, rows_read = _arrow_checked(piece, schema, opts)
    except (pa.ArrowInvalid, _Mismatch):
        raw, line_idx, rejects, rows_read = _isolate(
            piece, SOURCE_FIELDS[src.source_table], schema, str(src.path), opts
        )
    return _Parsed(piece, raw, line_idx, rejects, rows_read)


def _finish_piece(src: SourceFile, parsed: _Parsed, opts: ReadOptions) -> Chunk:
    """The canonical half of :func:`parse_piece` (records outside ``opts.select`` dropped first)."""
    piece, line_idx, rejects, raw = parsed.piece, parsed.line_idx, parsed.rejects, parsed.raw
    file = str(src.path)
    keep = preselect(src.source_table, raw, opts.select)
    skipped = 0
    if keep is not None and not bool(keep.all()):
        rows = np.flatnonzero(keep)
        skipped = raw.num_rows - len(rows)
        raw = raw.take(arrays.from_numpy(rows))
        line_idx = rows if line_idx is None else line_idx[rows]
    tables, bad, why = to_canonical_batches(src.source_table, raw)
    if bad.any():
        lines_obj = _Lines(piece)
        for i in np.flatnonzero(bad):
            k = int(line_idx[i]) if line_idx is not None else int(i)
            rejects.append(
                Reject(
                    file=file,
                    line=piece.first_line + k,
                    row=None,
                    reason=why[i] or "rejected",
                    raw=clip_raw(lines_obj.text(k)),
                )
            )
        rejects.sort(key=lambda r: r.line or 0)
    release(piece)
    return Chunk(
        tables=tables, rejects=rejects, rows_read=parsed.rows_read, bytes_done=piece.bytes_done, rows_skipped=skipped
    )


def parse_piece(src: SourceFile, piece: Piece, opts: ReadOptions) -> Chunk:
    """Parse one line-aligned piece of v3 JSON into a :class:`Chunk`."""
    return _finish_piece(src, _parse_raw(src, piece, opts), opts)


def read(src: SourceFile, opts: ReadOptions) -> Iterator[Chunk]:
    """Read one v3 JSON file (gzipped or not) as a stream of :class:`Chunk`.

    With ``opts.threads > 1`` one background thread decompresses, cuts and Arrow-parses piece
    N+1 (Arrow's own threads on) while this thread flattens piece N (:func:`to_canonical`,
    mostly single-threaded); the hand-over queue holds one piece, so at most three pieces are
    in memory.  InstanceUsage pieces for the compiled reader are read (or inflated) and cut in
    one thread and parsed in ``opts.threads`` more at once (:func:`.text_pieces.ordered_map`;
    about seven pieces in memory).  Pieces, rejects and errors come out in file order either
    way.

    Raises
    ------
    SourceError
        After yielding every complete line it could read, when the file is unreadable,
        truncated or its gzip stream is corrupt.
    """
    if src.source_table not in SOURCE_FIELDS:
        raise SourceError(src.path, f"v3 JSON has no table {src.source_table!r}")
    fast = src.source_table == "instance_usage" and _fast_usage.wanted()
    if fast:  # load the compiled reader in the background (a piece waits for it: _parse_raw)
        _fast_usage.preload()
    text = pieces(
        src,
        opts.chunk_bytes,
        _fast_usage.count_newlines if fast else None,
        keep=4 + opts.threads if fast else 4,
        digest=opts.digest,
    )
    if opts.threads > 1:
        if fast:  # read or inflate in one thread, the compiled parse in ``threads`` more
            parsed_it = ordered_map(
                lambda p: _parse_raw(src, p, opts),
                threaded(text, name="gpuclust-inflate"),
                opts.threads,
                "gpuclust-parse",
            )
        else:
            parsed_it = threaded((_parse_raw(src, p, opts) for p in text), name="gpuclust-parse")
        for parsed in parsed_it:
            yield _finish_piece(src, parsed, opts)
        return
    for piece in text:
        yield parse_piece(src, piece, opts)
