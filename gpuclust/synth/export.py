"""Writing tables in the real v3 BigQuery JSON-export encoding.

Two paths produce byte-identical encodings:

* :class:`LineBuilder` formats many rows at once with NumPy: every field is rendered into a
  fixed-width ``uint8`` block (unused bytes are 0), the blocks are concatenated into one
  ``(rows, width)`` matrix and the zero bytes are squeezed out.  Omitted (NULL) fields are
  handled by zeroing the key and the value of that row.  This is the fast path for
  ``instance_usage``.
* :func:`json_line` renders one record (a ``dict``) for the small tables.

Encoding rules (as in BigQuery's exports): INT64 values are quoted decimal strings, NULL fields
are omitted, floats are JSON numbers written with a fixed number of decimals and trailing zeros
trimmed (a whole float has no decimal point: ``1``), booleans are ``true``/``false``.

:class:`ShardWriter` writes ``<table>-000000000000.json.gz`` shards (single-member gzip, fixed
header mtime so the output is deterministic), starting a new shard every ``shard_rows`` lines.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

_POW10 = np.array([10**i for i in range(19)], dtype=np.uint64)


def _ndigits(a: np.ndarray) -> np.ndarray:
    """Number of decimal digits of each non-negative uint64 (0 has 1 digit)."""
    nd = np.ones(a.shape, dtype=np.int8)
    for j in range(1, 19):
        nd += a >= _POW10[j]
    # values >= 10**19 (only possible for uint64 above int64 range) are not used here
    return nd


def int_digits(v: np.ndarray) -> np.ndarray:
    """Render int64 values as ASCII digits in a ``(n, width)`` uint8 matrix, left-padded with 0 bytes."""
    v = np.asarray(v, dtype=np.int64)
    n = v.shape[0]
    neg = v < 0
    a = np.abs(v).astype(np.uint64)
    if n == 0:
        return np.zeros((0, 1), np.uint8)
    width = int(_ndigits(np.array([a.max()], np.uint64))[0])
    nd = _ndigits(a) if width > 1 else np.ones(n, np.int8)
    out = np.empty((n, width + 1), dtype=np.uint8)
    if width <= 9:
        b = a.astype(np.int64)
    else:
        b = a.copy()
    for k in range(width, 0, -1):
        out[:, k] = (b % 10).astype(np.uint8) + 48
        b //= 10
    col = np.arange(width + 1)[None, :]
    keep = col > (width - nd.astype(np.int64))[:, None]
    out[~keep] = 0
    # sign goes right before the first digit
    if neg.any():
        rows = np.nonzero(neg)[0]
        out[rows, width - nd[rows].astype(np.int64)] = ord("-")
    return out


_T4 = np.array([list(f"{i:04d}".encode()) for i in range(10000)], dtype=np.uint8)
_TZ4 = np.array([4] + [len(f"{i:04d}") - len(f"{i:04d}".rstrip("0")) for i in range(1, 10000)], dtype=np.int8)
_COL8 = np.arange(8, dtype=np.int8)[None, :]


def float_digits(x: np.ndarray, decimals: int) -> np.ndarray:
    """Render non-negative floats with ``decimals`` (<= 8) decimals, trailing zeros (and a bare '.') trimmed."""
    if not 0 <= decimals <= 8:
        raise ValueError("decimals must be in [0, 8]")
    x = np.asarray(x, dtype=np.float64)
    scale = 10**decimals
    q = np.rint(x * scale).astype(np.int64)
    if q.size and q.min() < 0:
        raise ValueError("float_digits renders non-negative values only")
    ipv = q // scale
    if ipv.size and ipv.max() < 10:
        ip = (ipv.astype(np.uint8) + 48)[:, None]
    else:
        ip = int_digits(ipv)
    if decimals == 0:
        return ip
    fp8 = (q - ipv * scale).astype(np.int32) * np.int32(10 ** (8 - decimals))
    hi = fp8 // 10000
    lo = fp8 - hi * 10000
    frac = np.concatenate([_T4[hi], _T4[lo]], axis=1)
    tz = np.where(lo == 0, 4 + _TZ4[hi], _TZ4[lo])
    keep = _COL8 < (8 - tz)[:, None]
    frac[~keep] = 0
    dot = (keep[:, 0].astype(np.uint8) * ord("."))[:, None]
    return np.concatenate([ip, dot, frac[:, :decimals]], axis=1)


def quantize(x: np.ndarray, decimals: int) -> np.ndarray:
    """Round to the value the writer will print (so ground truth is computed on what is written)."""
    scale = 10.0**decimals
    return np.rint(np.asarray(x, dtype=np.float64) * scale) / scale


def _lit(s: str) -> np.ndarray:
    return np.frombuffer(s.encode("ascii"), dtype=np.uint8)


class LineBuilder:
    """Vectorised builder of ``n`` JSON lines with the same key order.

    Examples
    --------
    >>> b = LineBuilder(2)
    >>> b.raw('{"a":"'); b.ints(np.array([1, -20])); b.raw('"'); b.field_float("x", np.array([0.5, 2.0]), 3)
    >>> b.raw("}\\n"); b.build()[0]
    b'{"a":"1","x":0.5}\\n{"a":"-20","x":2}\\n'
    """

    def __init__(self, n: int):
        self.n = n
        self.blocks: list[np.ndarray] = []
        self._first = True

    def _add(self, block: np.ndarray, mask: np.ndarray | None) -> None:
        if mask is not None:
            block = block * mask[:, None].astype(np.uint8)
        self.blocks.append(block)

    def raw(self, s: str, mask: np.ndarray | None = None) -> None:
        arr = _lit(s)
        self._add(np.broadcast_to(arr, (self.n, arr.size)), mask)

    def ints(self, v: np.ndarray, mask: np.ndarray | None = None) -> None:
        self._add(int_digits(v), mask)

    def floats(self, v: np.ndarray, decimals: int, mask: np.ndarray | None = None) -> None:
        self._add(float_digits(v, decimals), mask)

    # key helpers: the first key of an object has no leading comma -------------------------
    def field_int(self, key: str, v: np.ndarray, mask: np.ndarray | None = None, first: bool = False) -> None:
        """``"key":"<int64>"`` (quoted, as BigQuery writes INT64)."""
        self.raw(("" if first else ",") + f'"{key}":"', mask)
        self.ints(v, mask)
        self.raw('"', mask)

    def field_float(
        self, key: str, v: np.ndarray, decimals: int, mask: np.ndarray | None = None, first: bool = False
    ) -> None:
        self.raw(("" if first else ",") + f'"{key}":', mask)
        self.floats(v, decimals, mask)

    def float_list(self, key: str, cols: np.ndarray, decimals: int) -> None:
        """``,"key":[v0,v1,...]`` from a ``(n, m)`` array."""
        self.raw(f',"{key}":[')
        n, m = cols.shape
        # all m columns rendered at once: a column narrower than the widest gets more 0 bytes
        # of padding, which build() squeezes out as it does any column's
        flat = float_digits(np.ascontiguousarray(cols).ravel(), decimals)
        digits = flat.reshape(n, m, flat.shape[1])
        block = np.empty((n, m, digits.shape[2] + 1), np.uint8)
        block[:, :, :-1] = digits
        block[:, :, -1] = ord(",")
        block[:, -1, -1] = ord("]")
        self._add(block.reshape(n, m * block.shape[2]), None)

    def build(self) -> tuple[bytes, np.ndarray]:
        """The lines as one ``bytes`` and each line's length."""
        if self.n == 0:
            return b"", np.zeros(0, np.int64)
        mat = np.concatenate(self.blocks, axis=1)
        nz = mat != 0
        lengths = nz.sum(axis=1, dtype=np.int64)
        return mat[nz].tobytes(), lengths


# ---------------------------------------------------------------------------------------------
# One-record path for the small tables
# ---------------------------------------------------------------------------------------------


def fmt_float(x: float, decimals: int) -> str:
    """The same text :func:`float_digits` produces for one value."""
    scale = 10**decimals
    q = int(np.rint(float(x) * scale))
    ip, fp = divmod(q, scale)
    if fp == 0:
        return str(ip)
    return f"{ip}.{fp:0{decimals}d}".rstrip("0")


class F:
    """A float with the number of decimals to print it with."""

    __slots__ = ("v", "d")

    def __init__(self, v: float, d: int = 6):
        self.v = v
        self.d = d


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return f'"{int(v)}"'
    if isinstance(v, F):
        return fmt_float(v.v, v.d)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, dict):
        return "{" + ",".join(f'"{k}":{_value(x)}' for k, x in v.items() if x is not None) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot encode {type(v).__name__}")


def json_line(rec: dict[str, object]) -> str:
    """One BigQuery-export JSON line (with newline); ``None`` values are omitted.

    Python ``int`` is INT64 (quoted), :class:`F` is a float, ``str`` a string, ``bool`` a
    boolean, ``dict`` a struct, ``list`` a repeated field.
    """
    return "{" + ",".join(f'"{k}":{_value(v)}' for k, v in rec.items() if v is not None) + "}\n"


# ---------------------------------------------------------------------------------------------
# Shards
# ---------------------------------------------------------------------------------------------


def _gzip_header() -> bytes:
    # magic, CM=deflate, FLG=0, MTIME=0 (deterministic), XFL=0, OS=255 (unknown)
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


class ShardWriter:
    """Streams lines of one table into ``<table>-NNNNNNNNNNNN.json.gz`` shards."""

    def __init__(
        self,
        out: Path,
        table: str,
        shard_rows: int = 1_500_000,
        compresslevel: int = 1,
        progress: Callable[[str], None] | None = None,
    ):
        self.out = Path(out)
        self.table = table
        self.shard_rows = int(shard_rows)
        self.level = int(compresslevel)
        self.progress = progress
        self.paths: list[Path] = []
        self.rows = 0
        self._fh: BinaryIO | None = None
        self._rows_in_shard = 0

    def _open(self) -> None:
        path = self.out / f"{self.table}-{len(self.paths):012d}.json.gz"
        self.paths.append(path)
        fh = open(path, "wb")  # closed in _close_shard
        fh.write(_gzip_header())
        self._fh = fh
        self._comp = zlib.compressobj(self.level, zlib.DEFLATED, -zlib.MAX_WBITS, 9)
        self._crc = 0
        self._size = 0
        self._rows_in_shard = 0

    def _close_shard(self) -> None:
        if self._fh is None:
            return
        self._fh.write(self._comp.flush())
        self._fh.write((self._crc & 0xFFFFFFFF).to_bytes(4, "little"))
        self._fh.write((self._size & 0xFFFFFFFF).to_bytes(4, "little"))
        self._fh.close()
        self._fh = None
        if self.progress:
            self.progress(f"wrote {self.paths[-1].name} ({self._rows_in_shard:,} rows)")

    def _write(self, data: bytes, nrows: int) -> None:
        if self._fh is None:
            self._open()
        assert self._fh is not None
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)
        self._fh.write(self._comp.compress(data))
        self._rows_in_shard += nrows
        self.rows += nrows

    def write(self, data: bytes, lengths: np.ndarray) -> None:
        """Write lines given as one buffer and the length of each line."""
        n = len(lengths)
        pos = 0
        i = 0
        while i < n:
            if self._fh is not None and self._rows_in_shard >= self.shard_rows:
                self._close_shard()
            room = self.shard_rows - (self._rows_in_shard if self._fh is not None else 0)
            take = min(room, n - i)
            nbytes = int(lengths[i : i + take].sum())
            self._write(data[pos : pos + nbytes], take)
            pos += nbytes
            i += take

    def write_lines(self, lines: list[str]) -> None:
        if not lines:
            return
        enc = [ln.encode("utf-8") for ln in lines]
        self.write(b"".join(enc), np.fromiter((len(e) for e in enc), np.int64, len(enc)))

    def close(self) -> list[Path]:
        if not self.paths:  # an empty table still gets one (empty) shard
            self._open()
        self._close_shard()
        return self.paths
