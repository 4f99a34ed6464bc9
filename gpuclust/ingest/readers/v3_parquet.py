"""Reader for the 2019 (v3) Parquet exports.

The export shards are plain Parquet files whatever their suffix (``*.parquet.gz``); a file that
really is gzip-compressed Parquet is decompressed to a temporary file first (Parquet needs
random access).  Columns keep the v3 field names with nested ``capacity`` / ``average_usage``
structs, repeated lists and real nulls.  The file is read in record batches (bounded memory) and
flattened by exactly the code the JSON reader uses (:func:`~gpuclust.ingest.readers.v3_json.to_canonical`),
so a JSON shard and its Parquet twin ingest to identical canonical tables.

Rejected rows are reported with their 0-based row number in the file and the row rendered as JSON.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpuclust.ingest import arrays, inflate
from gpuclust.ingest.base import Chunk, ReadOptions, Reject, SourceError, SourceFile, clip_raw
from gpuclust.ingest.readers.v3_json import SOURCE_FIELDS, preselect, to_canonical

#: Rough decoded bytes per row, to turn ``ReadOptions.chunk_bytes`` into a batch size.
_BYTES_PER_ROW = 300


def _gunzip_to_temp(path: Path) -> Path:
    fd, tmp = tempfile.mkstemp(prefix="gpuclust-", suffix=".parquet")
    try:
        with os.fdopen(fd, "wb") as out, open(path, "rb") as f:
            d = inflate.decompressobj()
            while True:
                block = f.read(1 << 20)
                if not block:
                    break
                out.write(d.decompress(block))
                while d.eof and d.unused_data:
                    rest = d.unused_data
                    d = inflate.decompressobj()
                    out.write(d.decompress(rest))
            if not d.eof:
                raise SourceError(path, "truncated gzip stream (the file ends inside compressed data)")
    except inflate.ERRORS as e:
        os.unlink(tmp)
        raise SourceError(path, f"corrupt gzip data ({e})") from None
    except BaseException:
        os.unlink(tmp)
        raise
    return Path(tmp)


def _row_json(raw: pa.Table, i: int) -> str:
    row = raw.slice(i, 1).to_pylist()[0]
    return json.dumps({k: v for k, v in row.items() if v is not None}, default=str, separators=(",", ":"))


def read(src: SourceFile, opts: ReadOptions) -> Iterator[Chunk]:
    """Read one v3 Parquet file as a stream of :class:`Chunk`, one per record batch.

    Raises
    ------
    SourceError
        When the file is not readable Parquet (after yielding the batches it could read).
    """
    if src.source_table not in SOURCE_FIELDS:
        raise SourceError(src.path, f"v3 Parquet has no table {src.source_table!r}")
    fields = SOURCE_FIELDS[src.source_table]
    tmp: Path | None = None
    path = src.path
    if src.compression == "gzip":
        tmp = _gunzip_to_temp(path)
        path = tmp
    try:
        try:
            pf = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as e:
            raise SourceError(src.path, f"not a readable Parquet file: {e}") from None
        present = [n for n in pf.schema_arrow.names if n in fields]
        batch_rows = max(1024, opts.chunk_bytes // _BYTES_PER_ROW)
        total_rows = pf.metadata.num_rows
        size = os.path.getsize(src.path)
        row0 = 0
        file = str(src.path)
        it = pf.iter_batches(batch_size=batch_rows, columns=present, use_threads=opts.threads > 1)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            except (OSError, pa.ArrowException) as e:
                raise SourceError(src.path, f"cannot read Parquet data after row {row0}: {e}") from None
            raw = pa.Table.from_batches([batch])
            n = raw.num_rows
            rows = np.arange(n)  # file row of each raw row (relative to row0)
            keep = preselect(src.source_table, raw, opts.select)
            if keep is not None and not bool(keep.all()):
                rows = np.flatnonzero(keep)
                raw = raw.take(arrays.from_numpy(rows))
            tables, bad, why = to_canonical(src.source_table, raw)
            rejects = [
                Reject(
                    file=file,
                    line=None,
                    row=row0 + int(rows[i]),
                    reason=why[i] or "rejected",
                    raw=clip_raw(_row_json(raw, int(i))),
                )
                for i in np.flatnonzero(bad)
            ]
            row0 += n
            done = size if total_rows == 0 else int(size * row0 / total_rows)
            yield Chunk(tables=tables, rejects=rejects, rows_read=n, bytes_done=done, rows_skipped=n - len(rows))
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
