"""Reader for the 2011 trace (format v2): headerless CSV shards, usually gzipped.

One module reads all six v2 tables; ``SourceFile.source_table`` says which one.  The column
order of every table is embedded below (:data:`V2_FIELDS`) and is the one in the trace's own
``schema.csv``; a test checks the two against each other.

How a file is read
------------------
* The (decompressed) byte stream is cut into newline-aligned blocks of about
  ``ReadOptions.chunk_bytes``; each block becomes one :class:`~gpuclust.ingest.base.Chunk`, so
  memory stays bounded whatever the file size.  Each block knows the 1-based line number of its
  first line, so every reject carries its exact line number and raw text.
* A block is parsed by ``pyarrow.csv`` with every column read as a string (integers are then
  parsed exactly by :func:`~gpuclust.ingest.normalize.conform`, never through float64), no
  quoting (v2 fields are never quoted; hashes are base64), and an ``invalid_row_handler`` that
  rejects rows with the wrong number of fields individually.  Parsing is single-threaded per
  block: that is what makes pyarrow report the row number of an invalid row.
* Empty fields are NULL.  Floats may be written in ``e`` notation (``9.537e-06``).
* v2 codes are translated to the canonical v3 codes with the maps in :mod:`gpuclust.schema`;
  a code outside the v2 range (an event type 9, say) rejects the row with a reason, it is
  never mapped to a neighbouring value.
* Empty lines are rejected (reason ``empty line``) so that nothing in a file disappears
  silently; lines that are not valid UTF-8 are rejected too.
* A truncated or corrupt gzip stream: every complete line before the damage is yielded, the
  incomplete last line is not (its last field could be cut short and still parse), then
  :class:`~gpuclust.ingest.base.SourceError` is raised with the line number of the cut.

See ``docs/user/formats-v2-kaggle.md`` for the field-by-field mapping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from gpuclust.ingest import arrays, inflate
from gpuclust.ingest.base import Chunk, ReadOptions, Reject, SourceError, SourceFile, clip_raw
from gpuclust.ingest.normalize import conform
from gpuclust.ingest.readers.v2_columns import MAPPERS

__all__ = ["V2_FIELDS", "V2_TO_CANONICAL", "read"]

#: Field names of every v2 table, in file order, exactly as the trace's ``schema.csv`` names
#: them (its ``content`` column).
V2_FIELDS: dict[str, tuple[str, ...]] = {
    "job_events": (
        "time",
        "missing info",
        "job ID",
        "event type",
        "user",
        "scheduling class",
        "job name",
        "logical job name",
    ),
    "task_events": (
        "time",
        "missing info",
        "job ID",
        "task index",
        "machine ID",
        "event type",
        "user",
        "scheduling class",
        "priority",
        "CPU request",
        "memory request",
        "disk space request",
        "different machines restriction",
    ),
    "machine_events": ("time", "machine ID", "event type", "platform ID", "CPUs", "Memory"),
    "machine_attributes": ("time", "machine ID", "attribute name", "attribute value", "attribute deleted"),
    "task_constraints": ("time", "job ID", "task index", "comparison operator", "attribute name", "attribute value"),
    "task_usage": (
        "start time",
        "end time",
        "job ID",
        "task index",
        "machine ID",
        "CPU rate",
        "canonical memory usage",
        "assigned memory usage",
        "unmapped page cache",
        "total page cache",
        "maximum memory usage",
        "disk I/O time",
        "local disk space usage",
        "maximum CPU rate",
        "maximum disk IO time",
        "cycles per instruction",
        "memory accesses per instruction",
        "sample portion",
        "aggregation type",
        "sampled CPU usage",
    ),
}

#: The canonical table each v2 table is normalised to.
V2_TO_CANONICAL: dict[str, str] = {
    "task_usage": "instance_usage",
    "task_events": "instance_events",
    "job_events": "collection_events",
    "machine_events": "machine_events",
    "machine_attributes": "machine_attributes",
    "task_constraints": "instance_constraints",
}

#: Size of one read from the (compressed) file.
_PIECE = 1 << 20
#: Most decompressed bytes produced per inflate call (bounds memory on highly compressible input).
_MAX_INFLATE = 8 << 20

# ---------------------------------------------------------------------------------------------
# Shared helpers (also used by the Kaggle reader)
# ---------------------------------------------------------------------------------------------


class _Truncated(Exception):
    """The compressed stream ended early or is corrupt (carries a reason)."""


def decompressed_pieces(raw: BinaryIO, compression: str | None) -> Iterator[bytes]:
    """Yield the decompressed bytes of ``raw`` piece by piece.

    Gzip is inflated stream by stream (:mod:`gpuclust.ingest.inflate`: igzip or zlib; multi-member
    files are supported) so that every byte before a truncation or corruption is delivered before
    :class:`_Truncated` is raised.
    """
    if compression is None:
        while True:
            buf = raw.read(_PIECE)
            if not buf:
                return
            yield buf
    if compression != "gzip":
        raise _Truncated(f"unsupported compression {compression!r}")
    d = inflate.decompressobj()
    started = False
    data = b""
    while True:
        if not data:
            data = raw.read(_PIECE)
            if not data:
                break
        if d is None:
            if not data.strip(b"\x00"):  # zero padding after the last member
                data = b""
                continue
            d = inflate.decompressobj()
        started = True
        try:
            out = d.decompress(data, _MAX_INFLATE)
        except inflate.ERRORS as e:
            raise _Truncated(f"corrupt gzip data: {e}") from None
        if out:
            yield out
        if d.eof:
            data = d.unused_data
            d = None
            started = False
        else:
            data = d.unconsumed_tail
    if d is not None and started and not d.eof:
        raise _Truncated("truncated gzip stream (compressed data ended before the end-of-stream marker)")


def conform_rows(
    table: str,
    columns: Mapping[str, pa.Array],
    n: int,
    pre_bad: np.ndarray,
    pre_why: list[str | None],
) -> tuple[pa.Table, np.ndarray, list[str | None]]:
    """:func:`conform` plus rows the reader already rejected (``pre_bad`` / ``pre_why``).

    Returns the good rows (canonical schema) and the combined rejection mask and reasons; the
    reader's own reason wins where both rejected a row.
    """
    tbl, bad, why = conform(table, columns, n)
    all_bad = bad | pre_bad
    if pre_bad.any():
        keep = ~pre_bad[~bad]
        if not keep.all():
            tbl = tbl.filter(arrays.from_numpy(keep))
        why = [pw if pb else w for pw, pb, w in zip(pre_why, pre_bad, why, strict=True)]
    return tbl, all_bad, why


# ---------------------------------------------------------------------------------------------
# Blocks and parsing
# ---------------------------------------------------------------------------------------------


def _blocks(src: SourceFile, chunk_bytes: int, digest: Any = None) -> Iterator[tuple[bytes, int, int]]:
    """Yield ``(block, first_line, bytes_done)``: newline-aligned blocks of decompressed text.

    The last block may lack a final newline (a file that does not end in one).  On a truncated
    or corrupt stream the incomplete last line is dropped and SourceError is raised.
    """
    try:
        raw = open(src.path, "rb")  # noqa: SIM115 - closed below
    except OSError as e:
        raise SourceError(src.path, f"cannot open: {e.strerror or e}") from None
    line = 1
    pending = bytearray()
    try:
        try:
            hashed = digest.wrap(raw) if digest is not None else raw  # hashed as it is read
            for piece in decompressed_pieces(hashed, src.compression):
                pending += piece
                pos = 0
                while len(pending) - pos >= chunk_bytes:
                    # Cut at the last newline within chunk_bytes, else at the first one after
                    # (a line longer than chunk_bytes makes a block of its own).
                    cut = pending.rfind(b"\n", pos, pos + chunk_bytes)
                    if cut < 0:
                        cut = pending.find(b"\n", pos + chunk_bytes)
                        if cut < 0:
                            break  # one enormous line: keep reading
                    block = bytes(pending[pos : cut + 1])
                    pos = cut + 1
                    yield block, line, raw.tell()
                    line += block.count(b"\n")
                if pos:
                    del pending[:pos]
        except _Truncated as e:
            cut = pending.rfind(b"\n")
            if cut >= 0:
                block = bytes(pending[: cut + 1])
                yield block, line, raw.tell()
                line += block.count(b"\n")
            raise SourceError(src.path, str(e), line=line) from None
        except OSError as e:
            raise SourceError(src.path, f"read error: {e.strerror or e}", line=line) from None
        if pending:
            yield bytes(pending), line, raw.tell()
    finally:
        raw.close()


def _line_bounds(block: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive, without the newline) offset of every line in ``block``."""
    buf = np.frombuffer(block, dtype=np.uint8)
    nl = np.flatnonzero(buf == 10)
    ends = nl if (len(block) and block[-1] == 10) else np.append(nl, len(block))
    starts = np.concatenate(([0], nl + 1))[: len(ends)]
    return starts.astype(np.int64), ends.astype(np.int64)


def _parse_arrow(block: bytes, names: tuple[str, ...]) -> tuple[pa.Table, list[tuple[int, str, int]]] | None:
    """Parse with pyarrow; returns the table and ``(line_in_block, text, n_fields)`` of invalid rows."""
    invalid: list[tuple[int, str, int]] = []
    failed = False

    def handler(row: pacsv.InvalidRow) -> str:
        nonlocal failed
        if row.number is None:  # cannot happen single-threaded; fall back to be safe
            failed = True
        else:
            invalid.append((row.number, row.text, row.actual_columns))
        return "skip"

    cols = [f"c{i}" for i in range(len(names))]
    try:
        tbl = pacsv.read_csv(
            pa.py_buffer(block),
            read_options=pacsv.ReadOptions(
                column_names=cols, use_threads=False, block_size=max(1 << 20, min(len(block) + 1, 1 << 30))
            ),
            parse_options=pacsv.ParseOptions(quote_char=False, ignore_empty_lines=False, invalid_row_handler=handler),
            convert_options=pacsv.ConvertOptions(
                column_types={c: pa.string() for c in cols},
                null_values=[""],
                strings_can_be_null=True,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if failed:
        return None
    return tbl, invalid


def _parse_python(lines: list[str], ncols: int) -> tuple[list[list[str | None]], list[int]]:
    """Slow, obvious fallback: split each line on commas.  Returns columns and bad line indices."""
    cols: list[list[str | None]] = [[] for _ in range(ncols)]
    bad: list[int] = []
    for i, text in enumerate(lines):
        fields = text.split(",")
        if len(fields) != ncols:
            bad.append(i)
            continue
        for c, f in zip(cols, fields, strict=True):
            c.append(f if f else None)
    return cols, bad


def _clean_lines(block: bytes) -> tuple[bytes, np.ndarray, np.ndarray, dict[int, str], dict[int, str]]:
    """The block with lines that are not UTF-8 emptied, its line bounds, the lines rejected before
    parsing (line index -> why: empty, not UTF-8), and the raw text of the emptied lines."""
    starts, ends = _line_bounds(block)
    # Line index in block -> why it is rejected before parsing (empty, not UTF-8).
    pre: dict[int, str] = {}
    # Line index -> raw text, for lines whose bytes are replaced before parsing.
    raw_texts: dict[int, str] = {}
    try:
        block.decode("utf-8")
    except UnicodeDecodeError:
        parts = []
        for i in range(len(starts)):
            seg = block[starts[i] : ends[i]]
            try:
                seg.decode("utf-8")
            except UnicodeDecodeError:
                pre[i] = "line is not valid UTF-8"
                raw_texts[i] = seg.decode("utf-8", errors="replace").rstrip("\r")
                seg = b""  # parsed as an empty line, rejected with the reason above
            parts.append(seg)
        block = b"\n".join(parts) + b"\n"
        starts, ends = _line_bounds(block)
    lens = ends - starts
    empty = lens == 0
    for j in np.flatnonzero(lens == 1).tolist():  # a line holding only "\r" is empty too
        if block[starts[j]] == 13:
            empty[j] = True
    for j in np.flatnonzero(empty).tolist():
        pre.setdefault(j, "empty line")
    return block, starts, ends, pre, raw_texts


def _parse_fields(
    block: bytes, names: tuple[str, ...], nlines: int, text_of: Callable[[int], str]
) -> tuple[np.ndarray, dict[str, pa.Array], dict[int, str]]:
    """The lines that parse into ``len(names)`` fields, their columns as strings (by v2 field name), and
    the other lines' reasons; by pyarrow, or by splitting on commas where pyarrow cannot say which line."""
    ncols = len(names)
    field_rejects: dict[int, str] = {}
    parsed = _parse_arrow(block, names)
    if parsed is not None:
        tbl, invalid = parsed
        inv_idx = np.array([num - 1 for num, _, _ in invalid], dtype=np.int64)
        if tbl.num_rows + len(inv_idx) == nlines:
            mask = np.ones(nlines, dtype=bool)
            mask[inv_idx] = False
            for (_num, _text, nf), i in zip(invalid, inv_idx, strict=True):
                field_rejects[int(i)] = f"expected {ncols} fields, found {nf}"
            return (
                np.flatnonzero(mask),
                {name: tbl.column(k).combine_chunks() for k, name in enumerate(names)},
                field_rejects,
            )
    lines = [text_of(i) for i in range(nlines)]
    cols, bad_idx = _parse_python(lines, ncols)
    for i in bad_idx:
        field_rejects[i] = f"expected {ncols} fields, found {len(lines[i].split(','))}"
    mask = np.ones(nlines, dtype=bool)
    mask[np.array(bad_idx, dtype=np.int64)] = False
    return (
        np.flatnonzero(mask),
        {name: pa.array(c, pa.string()) for name, c in zip(names, cols, strict=True)},
        field_rejects,
    )


def _pre_rejected(pre: dict[int, str], row_lines: np.ndarray) -> tuple[np.ndarray, list[str | None]]:
    """Which parsed rows were rejected before parsing, with the reason, by row."""
    n = len(row_lines)
    pre_bad = np.zeros(n, dtype=bool)
    pre_why: list[str | None] = [None] * n
    if pre:
        keys = np.array(sorted(pre), dtype=np.int64)
        pos = np.searchsorted(row_lines, keys)
        for i, k in zip(keys.tolist(), pos.tolist(), strict=True):
            if k < n and row_lines[k] == i:
                pre_bad[k] = True
                pre_why[k] = pre[i]
    return pre_bad, pre_why


def _rejects_by_line(
    field_rejects: dict[int, str], pre: dict[int, str], bad: np.ndarray, why: list[str | None], row_lines: np.ndarray
) -> dict[int, str]:
    """Line index -> reason of every rejected line: the field count, else the pre-parse reason, else conform's."""
    by_line: dict[int, str] = dict(field_rejects)
    for i in pre:
        if i in field_rejects:
            by_line[i] = pre[i]
    for k in np.flatnonzero(bad).tolist():
        by_line[int(row_lines[k])] = why[k] or "rejected"
    return by_line


def _read_block(src: SourceFile, block: bytes, first_line: int, bytes_done: int) -> Chunk:
    """Parse one newline-aligned block (its first line is ``first_line``) into a chunk of one canonical table."""
    names = V2_FIELDS[src.source_table]
    fname = str(src.path)
    block, starts, ends, pre, raw_texts = _clean_lines(block)
    nlines = len(starts)

    def text_of(i: int) -> str:
        return block[starts[i] : ends[i]].decode("utf-8", errors="replace").rstrip("\r")

    row_lines, raw_cols, field_rejects = _parse_fields(block, names, nlines, text_of)
    n = len(row_lines)
    pre_bad, pre_why = _pre_rejected(pre, row_lines)
    canonical = V2_TO_CANONICAL[src.source_table]
    columns = MAPPERS[src.source_table](raw_cols, n, pre_bad, pre_why)
    good, bad, why = conform_rows(canonical, columns, n, pre_bad, pre_why)
    # Rejects in line order.
    by_line = _rejects_by_line(field_rejects, pre, bad, why, row_lines)
    rejects: list[Reject] = []
    for i in sorted(by_line):
        raw = raw_texts.get(i)
        if raw is None:
            raw = text_of(i)
        rejects.append(
            Reject(file=fname, line=first_line + i, row=first_line + i - 1, reason=by_line[i], raw=clip_raw(raw))
        )
    return Chunk(tables={canonical: good}, rejects=rejects, rows_read=nlines, bytes_done=bytes_done)


def read(src: SourceFile, opts: ReadOptions) -> Iterator[Chunk]:
    """Read one v2 CSV file (any of the six tables) as canonical chunks.

    Parameters
    ----------
    src
        The file; ``src.source_table`` is the v2 table name (``task_usage``, ``task_events``,
        ``job_events``, ``machine_events``, ``machine_attributes``, ``task_constraints``) and
        ``src.compression`` is ``"gzip"`` or None.
    opts
        ``opts.chunk_bytes`` sets the size of one block of decompressed text (one chunk).

    Yields
    ------
    Chunk
        ``tables`` holds one canonical table (see :data:`V2_TO_CANONICAL`).

    Raises
    ------
    SourceError
        The file cannot be opened, or its compressed stream is truncated or corrupt (raised
        after the chunks read before the damage).

    Examples
    --------
    >>> from pathlib import Path
    >>> src = SourceFile(Path("machine_events/part-00000-of-00001.csv.gz"), "v2-csv",
    ...                  "machine_events", "gzip", "v2")
    >>> tables = [c.tables["machine_events"] for c in read(src, ReadOptions())]  # doctest: +SKIP
    """
    if src.source_table not in V2_FIELDS:
        raise SourceError(src.path, f"unknown v2 table {src.source_table!r}; expected one of {sorted(V2_FIELDS)}")
    chunk_bytes = max(1, int(opts.chunk_bytes))
    for block, first_line, bytes_done in _blocks(src, chunk_bytes, opts.digest):
        yield _read_block(src, block, first_line, bytes_done)
