"""Line-aligned pieces of a text file, read (or inflated) in a background thread, and the
ordered thread map the readers parse them with.

:func:`pieces` cuts a newline-delimited file, gzipped or not, into ~``chunk_bytes`` pieces that
end at a line end, in reused buffers; :func:`threaded` runs an iterator in a background thread;
:func:`ordered_map` computes a function of every item in several threads and hands the results
back in order.  Used by the v3 JSON reader (:mod:`gpuclust.ingest.readers.v3_json`).
"""

from __future__ import annotations

import mmap
import os
import queue
import stat
import sys
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from gpuclust.ingest import inflate
from gpuclust.ingest.base import SourceError, SourceFile

__all__ = ["MAX_LINE", "Piece", "mapping_enabled", "ordered_map", "pieces", "release", "threaded"]


@dataclass
class Piece:
    """``buf[start:end]``: whole lines of decompressed text (no copy of the shared buffer)."""

    buf: bytes | bytearray | mmap.mmap
    start: int
    end: int
    first_line: int  # 1-based number of the first line
    newlines: int
    bytes_done: int  # input (compressed) bytes consumed so far
    #: Offsets (from ``start``) of the piece's newlines, when :func:`pieces` found them.
    nl_pos: np.ndarray | None = None

    @property
    def view(self) -> memoryview:
        return memoryview(self.buf)[self.start : self.end]

    def tobytes(self) -> bytes:
        if isinstance(self.buf, bytes) and self.start == 0 and self.end == len(self.buf):
            return self.buf
        return bytes(self.view)

    def __len__(self) -> int:
        return self.end - self.start


_READ_BLOCK = 256 << 10
_MAX_OUT = 4 << 20
#: A line longer than this (or 4 chunks) stops the file: it is not newline-delimited JSON.
MAX_LINE = 256 << 20


_T = TypeVar("_T")


class _Damage(Exception):
    pass


def _blocks(f: Any, gz: bool) -> Iterator[bytes]:
    """Decompressed blocks of at most ~4 MiB; :class:`_Damage` when the stream is damaged."""
    d = inflate.decompressobj() if gz else None
    started = False
    while True:
        try:
            block = f.read(_READ_BLOCK)
        except OSError as e:
            raise _Damage(f"read error: {e.strerror or e}") from None
        if not block:
            if d is not None and started and not d.eof:
                raise _Damage("truncated gzip stream (the file ends inside compressed data)")
            return
        if d is None:
            yield block
            continue
        try:
            while block:
                if d.eof:  # concatenated gzip members
                    d = inflate.decompressobj()
                out = d.decompress(block, _MAX_OUT)
                started = True
                block = d.unused_data if d.eof else d.unconsumed_tail
                if out:
                    yield out
        except inflate.ERRORS as e:
            raise _Damage(f"corrupt gzip data ({e})") from None


class _BufferPool:
    """Reusable text buffers of one size for :func:`pieces`.

    A fresh ~64 MiB buffer per piece costs a page fault per 4 KiB page (as much CPU as the copy
    into it); reusing a few buffers avoids that.  A buffer is handed out again only when nothing
    but the pool refers to it -- no piece, memoryview or Arrow buffer -- so a piece's text is never
    overwritten while someone may still read it; when none is free a new one is made.
    """

    def __init__(self, size: int, keep: int = 4):
        self.size = size
        self._keep = keep
        self._bufs: list[bytearray] = [bytearray(1)]
        self._free_refs = self._refs(0)  # the count of a buffer held by the pool alone
        self._bufs.clear()

    def _refs(self, i: int) -> int:
        return sys.getrefcount(self._bufs[i])

    def get(self) -> bytearray:
        for i in range(len(self._bufs)):
            if self._refs(i) <= self._free_refs:
                return self._bufs[i]
        buf = bytearray(self.size)
        if len(self._bufs) < self._keep:
            self._bufs.append(buf)
        return buf


#: Room for one more decompressed block or read beyond a full chunk.
_SLACK = max(_MAX_OUT, _READ_BLOCK)


class _TextStream:
    """The state of :func:`pieces` over one file: its reused buffers, the text read but not cut yet
    (``buf[start:n]``), the number of the next line, and the error that stopped the reading."""

    def __init__(self, f: Any, gz: bool, chunk_bytes: int, keep: int) -> None:
        self.f = f
        self.pool = _BufferPool(chunk_bytes + _SLACK, keep)
        self.buf = self.pool.get()
        self.start = self.n = 0  # buf[start:n]: text read but not yet cut into pieces
        self.line = 1
        self.error: str | None = None
        self.chunk_bytes = chunk_bytes
        self.max_line = max(4 * chunk_bytes, MAX_LINE)
        self.it = _blocks(f, True) if gz else None

    def room(self, size: int) -> None:
        """Make ``buf[n:n + size]`` writable, keeping ``buf[start:n]`` (moved to a new buffer)."""
        if self.n + size <= len(self.buf):
            return
        rest = self.n - self.start
        new = self.pool.get() if rest + size <= self.pool.size else bytearray(max(rest + size, 2 * rest))
        if rest:
            new[:rest] = memoryview(self.buf)[self.start : self.n]
        self.buf, self.start, self.n = new, 0, rest

    def read(self) -> bool:
        """Append the next decompressed block or read to the text; True at the end (or where damage stops it)."""
        if self.it is not None:
            try:
                data = next(self.it, None)
            except _Damage as e:
                self.error = str(e)
                data = None
            if not data:
                return True
            self.room(len(data))
            self.buf[self.n : self.n + len(data)] = data
            self.n += len(data)
            return False
        want = max(self.chunk_bytes - (self.n - self.start), _READ_BLOCK)
        self.room(want)
        try:
            got = self.f.readinto(memoryview(self.buf)[self.n : self.n + want])
        except OSError as e:
            self.error = f"read error: {e.strerror or e}"
            got = 0
        if not got:
            return True
        self.n += got
        return False

    def cut(self, final: bool, count: Callable[[bytearray, int, int], int] | None) -> Generator[Piece, None, bool]:
        """Yield the line-aligned pieces of ~chunk_bytes the text holds (at the end, the rest); returns
        whether the reading is over (a line too long ends it)."""
        buf, chunk_bytes = self.buf, self.chunk_bytes
        while self.n - self.start >= chunk_bytes or (final and self.start < self.n):
            start, n = self.start, self.n
            cut = buf.rfind(b"\n", start, min(start + chunk_bytes, n)) + 1
            if cut <= start:  # a line longer than chunk_bytes
                cut = buf.find(b"\n", start + chunk_bytes, n) + 1
            if cut <= start:
                if n - start > self.max_line and self.error is None:
                    self.error = (
                        f"line {self.line} is longer than {self.max_line >> 20} MiB (is this newline-delimited JSON?)"
                    )
                    self.start = n
                    return True
                if not final or self.error is not None:
                    break  # no line end yet (or never: a damaged file's partial last line)
                cut = n  # the last line lacks a newline
            if count is not None:  # the compiled reader parses it: only the count is needed
                nl_pos, nl = None, count(buf, start, cut)
            else:
                # One pass finds the newlines: their count, and later the blank-line check.
                nl_pos = np.flatnonzero(np.frombuffer(buf, np.uint8, cut - start, start) == 10)
                nl = len(nl_pos)
            yield Piece(buf, start, cut, self.line, nl, self.f.tell(), nl_pos)
            self.line += nl
            self.start = cut
        return final


def pieces(
    src: SourceFile,
    chunk_bytes: int,
    count: Callable[[bytearray, int, int], int] | None = None,
    keep: int = 4,
    digest: Any = None,
) -> Iterator[Piece]:
    """Line-aligned pieces of ~chunk_bytes of the decompressed text (``count(buf, start, end)``,
    when given, counts a piece's newlines instead of NumPy, and the pieces carry no ``nl_pos``).

    The text goes straight into reused buffers (:class:`_BufferPool`): a plain file is read into
    them with ``readinto``, decompressed blocks are copied in; only the partial line left after
    the last cut is copied again, into the next buffer.

    On damage: every complete line read so far, then :class:`SourceError` naming the file and
    the line where reading stopped.
    """
    path = src.path
    try:
        raw = open(path, "rb")
    except OSError as e:
        raise SourceError(path, f"cannot open: {e.strerror or e}") from None
    with raw:
        mm = _map(raw) if count is not None and src.compression != "gzip" else None
        if mm is not None:
            yield from _mapped_pieces(src, mm, chunk_bytes, count, digest)  # type: ignore[arg-type]
            return
        f = digest.wrap(raw) if digest is not None else raw  # hashed as it is read
        s = _TextStream(f, src.compression == "gzip", chunk_bytes, keep)
        first = True
        while True:
            final = s.read()
            if s.n - s.start < chunk_bytes and not final:
                continue
            if first and s.buf.startswith(b"\xef\xbb\xbf", s.start, s.n):  # a UTF-8 byte-order mark
                s.start += 3
            first = False
            if (yield from s.cut(final, count)):
                break
        if s.error is not None:
            partial = " (its partial last line was dropped)" if s.n > s.start else ""
            raise SourceError(path, s.error + partial, line=s.line)


def mapping_enabled() -> bool:
    """Whether plain text for a counting reader is memory-mapped (``GPUCLUST_MMAP`` not ``0``)."""
    return os.environ.get("GPUCLUST_MMAP", "1").strip().lower() not in ("0", "false", "no", "off")


def _map(f: Any) -> mmap.mmap | None:
    """A read-only map of a regular, non-empty file, or None (read it instead)."""
    if not mapping_enabled():
        return None
    try:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # empty, or a file system that cannot map
        return None
    try:
        mm.madvise(mmap.MADV_SEQUENTIAL)
    except (OSError, AttributeError):
        pass
    return mm


def release(piece: Piece) -> None:
    """Unmap the whole pages of a mapped piece once it is parsed (:func:`_mapped_pieces`): the
    process's resident memory stays the pieces in flight, not the file; the text stays readable
    (a later read maps the pages again from the page cache)."""
    buf = piece.buf
    if not isinstance(buf, mmap.mmap):
        return
    lo = -(-piece.start // mmap.PAGESIZE) * mmap.PAGESIZE
    hi = piece.end // mmap.PAGESIZE * mmap.PAGESIZE
    if hi > lo:
        try:
            buf.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        except (OSError, ValueError):
            pass


def _mapped_pieces(
    src: SourceFile, mm: mmap.mmap, chunk_bytes: int, count: Callable[[Any, int, int], int], digest: Any
) -> Iterator[Piece]:
    """:func:`pieces` of a plain file by memory map: no read copy into buffers (0.2 CPU-s per GB)
    and no buffer pages to fault in.  The pieces are views of the map; the hash is fed from it in
    order; :func:`release` gives a parsed piece's pages back.  A file that shrinks while it is
    mapped ends the process with SIGBUS (``GPUCLUST_MMAP=0`` reads it instead)."""
    size = len(mm)
    start = 3 if mm[:3] == b"\xef\xbb\xbf" else 0  # a UTF-8 byte-order mark (hashed like the rest)
    line = 1
    hashed = 0
    max_line = max(4 * chunk_bytes, MAX_LINE)
    view = memoryview(mm)
    while start < size:
        end = start + chunk_bytes
        cut = mm.rfind(b"\n", start, min(end, size)) + 1
        if cut <= start:  # a line longer than chunk_bytes, or the last line without a newline
            if end >= size:
                cut = size
            else:
                cut = mm.find(b"\n", end, min(size, start + max_line + 1)) + 1
                if cut <= start:
                    if size - start > max_line:
                        raise SourceError(
                            src.path,
                            f"line {line} is longer than {max_line >> 20} MiB (is this newline-delimited JSON?)",
                            line=line,
                        )
                    cut = size  # the last line, without a newline
        if digest is not None:
            digest._feed(hashed, view[hashed:cut])
            hashed = cut
        nl = count(mm, start, cut)
        yield Piece(mm, start, cut, line, nl, cut, None)
        line += nl
        start = cut
    if digest is not None and hashed < size:
        digest._feed(hashed, view[hashed:size])


def threaded(it: Iterator[_T], depth: int = 1, name: str = "gpuclust-decompress") -> Iterator[_T]:
    """Run an iterator (decompression, cutting and Arrow parsing, which mostly release the GIL)
    in a background thread; at most ``depth`` finished items wait in between."""
    q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for p in it:
                if not put(("piece", p)):
                    return
            put(("end", None))
        except BaseException as e:  # handed to the consumer
            put(("error", e))
        finally:
            close = getattr(it, "close", None)
            if close is not None:  # a threaded iterator inside: stop its thread too
                close()

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    try:
        while True:
            kind, val = q.get()
            if kind == "piece":
                yield val
            elif kind == "end":
                return
            else:
                raise val
    finally:
        stop.set()
        t.join(timeout=5)


def ordered_map(fn: Callable[[Any], _T], it: Iterator[Any], workers: int, name: str) -> Iterator[_T]:
    """``fn`` of every item of ``it``, in order, computed by ``workers`` threads (``fn`` must
    release the GIL to gain): while the caller handles one result, the next ``workers`` items are
    being computed.  An error raised by ``it`` comes after the results of the items before it."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
    pending: deque[Future[_T]] = deque()
    error: Exception | None = None
    try:
        while True:
            try:
                item = next(it)
            except StopIteration:
                break
            except Exception as e:  # e.g. a damaged file: its complete lines first
                error = e
                break
            pending.append(pool.submit(fn, item))
            if len(pending) > workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
        if error is not None:
            raise error
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=True)
        close = getattr(it, "close", None)
        if close is not None:  # a threaded iterator: stop its thread too
            close()
