"""Loading partitions into backend memory once: decode on a few host threads, copy to the device
through pinned staging buffers on a non-default stream, overlapped with the next decode.

Used by :class:`gpuclust.engine.study.Study` (``persist``) and, on the gpu backend, by a streamed
run's partition tasks (:func:`gpuclust.engine.tasks.partition_partials`, one partition at a time).
Each column of a group of partitions is allocated once (NumPy on the cpu backend, device memory on
the gpu) and filled chunk by chunk, straight from Arrow's buffers.  On the gpu an Arrow chunk is
copied into one of two page-locked buffers of the loading thread, and ``cudaMemcpyAsync`` moves it from there on that thread's own stream while the next
chunk is copied into the other buffer (an event per buffer says when it may be reused).  A
pageable ``cupy.asarray`` would instead stage through the driver's own small bounce buffer, at a
fraction of the bus's rate (8 against 55 GB/s measured on an H100 node; bench/results/).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from gpuclust._parallel import usable_cores
from gpuclust.arrow_numpy import null_value
from gpuclust.backends import Backend
from gpuclust.engine import partition as _partition
from gpuclust.engine import reading as _reading
from gpuclust.schema import SCHEMAS

__all__ = ["LOAD_THREADS", "STAGING_BYTES", "column_bytes", "column_dtypes", "fill_nulls", "load_partitions"]

#: Host threads that decode Parquet row groups at once (each also drives its own copy stream and
#: pair of pinned buffers): the usable cores, at most 16.  Decoding is CPU-bound and runs without
#: the GIL, so threads beyond the cores only hold more row groups in memory: on the 2-core VM, 2
#: threads persisted 1.6e7 windows as fast as 6 (3.9-4.8 against 4.6-6.1 s) in 1.5 GiB less
#: RSS.  On the 16-core H200 node (2026-11-29, 3.05e7 windows, 5.39 GB of columns, one load
#: each) 16 threads loaded at 3.65 GB/s where 12 did at 2.72 (57% and 43% of the node's decode
#: ceiling); 16 threads pin 512 MiB.
LOAD_THREADS = min(16, max(2, usable_cores()))
#: Size of each of a loading thread's two page-locked staging buffers: a row group's column of
#: 2^20 int64 / float64 rows (8 MiB) in one copy, larger chunks in several.  Pinning is paid once
#: per process, and costs more than a partition's copies (H100 node, 2026-11-23): 12 threads x
#: 2 x 16 MiB are 384 MiB pinned, where 64 MiB buffers would be 1.5 GiB.
STAGING_BYTES = 16 << 20


class _Stager:
    """One loading thread's stream and pair of pinned buffers (double buffering)."""

    def __init__(self, cp: Any, nbytes: int):
        self.cp = cp
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.bufs = []
        for _ in range(2):
            mem = cp.cuda.alloc_pinned_memory(nbytes)
            self.bufs.append((mem, np.frombuffer(mem, dtype=np.uint8, count=nbytes), cp.cuda.Event()))
        self.nbytes = nbytes
        self.turn = 0

    def copy(self, dst_ptr: int, src: np.ndarray) -> None:
        """Copy host array ``src`` (C-contiguous) to device address ``dst_ptr`` via the buffers."""
        raw = src.view(np.uint8).reshape(-1)
        cp = self.cp
        for off in range(0, raw.shape[0], self.nbytes):
            piece = raw[off : off + self.nbytes]
            mem, view, done = self.bufs[self.turn]
            done.synchronize()  # the last copy out of this buffer has finished
            view[: piece.shape[0]] = piece
            cp.cuda.runtime.memcpyAsync(
                dst_ptr + off, mem.ptr, piece.shape[0], cp.cuda.runtime.memcpyHostToDevice, self.stream.ptr
            )
            done.record(self.stream)
            self.turn ^= 1

    def finish(self) -> None:
        self.stream.synchronize()


_stagers: dict[int, list[_Stager]] = {}
_stagers_lock = threading.Lock()


def _borrow(cp: Any, device: int) -> _Stager:
    """A stager for ``device``: pinned buffers are allocated once per process and reused (their
    allocation costs more than a partition's copies)."""
    with _stagers_lock:
        free = _stagers.setdefault(device, [])
        while free:
            st = free.pop()
            if st.nbytes == STAGING_BYTES:
                return st
    return _Stager(cp, STAGING_BYTES)


def _give_back(device: int, st: _Stager) -> None:
    with _stagers_lock:
        _stagers.setdefault(device, []).append(st)


def _chunk_host(chunk: pa.Array, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray | None]:
    """One Arrow chunk as host values of ``dtype`` and, when it holds NULLs, its validity bytes.

    A number chunk of ``dtype`` is a view of Arrow's value buffer, NULLs or not (the NULL slots
    hold whatever bytes the writer left); the loader copies it as it is and then fills the NULL
    rows in backend memory from the validity bytes (:func:`fill_nulls`: the chunk's row 0 at bit
    ``chunk.offset % 8`` of the first byte), so no host copy of the values is made and only the
    bits travel to the device.  Any other chunk goes through
    :func:`gpuclust.engine.partition.column_to_numpy` (NULL -> NaN / dtype minimum) and needs no
    fill.
    """
    numeric = pa.types.is_integer(chunk.type) or pa.types.is_floating(chunk.type)
    if numeric and np.dtype(chunk.type.to_pandas_dtype()) == dtype:
        n, off = len(chunk), chunk.offset
        values = np.frombuffer(chunk.buffers()[1], dtype, count=off + n)[off:]
        if chunk.null_count == 0:
            return values, None
        return values, np.frombuffer(chunk.buffers()[0], np.uint8, count=(off + n + 7) // 8)[off // 8 :]
    return np.ascontiguousarray(_partition.column_to_numpy(chunk).astype(dtype, copy=False)), None


def fill_nulls(xp: Any, dest: Any, bits: Any, first_bit: int) -> None:
    """Set the rows of ``dest`` (a 1-D slice in backend memory) whose validity bit is 0 to the
    NULL value of its dtype (NaN / the integer minimum), as
    :func:`gpuclust.engine.partition.column_to_numpy` reads NULL.  ``bits``: the validity bytes
    (``uint8``, on the same backend), least significant bit first, row 0 at bit ``first_bit``.

    >>> d = np.arange(5.0)
    >>> fill_nulls(np, d, np.array([0b10110110], np.uint8), 1)  # rows 0..4 <- bits 1..5: 1 1 0 1 1
    >>> d.tolist()
    [0.0, 1.0, nan, 3.0, 4.0]
    """
    n = int(dest.shape[0])
    valid = xp.unpackbits(bits, bitorder="little")[first_bit : first_bit + n].view(bool)
    # one elementwise write (a masked assignment would count the mask's rows first: a sync on a device)
    xp.copyto(dest, dest.dtype.type(null_value(dest.dtype)), where=~valid)


def _fill(
    t: pa.Table, dest: dict[str, Any], offset: int, copy: Callable[[Any, int, np.ndarray], None]
) -> list[tuple[Any, int, int, np.ndarray, int]]:
    """Write every column of ``t`` into rows ``offset...`` of the arrays in ``dest``, chunk by chunk
    (values as they are); returns the NULL fills still to do, ``(array, first row, rows,
    validity bytes, first bit)`` per chunk with NULLs (see :func:`fill_nulls`)."""
    nulls = []
    for c, arr in dest.items():
        off = offset
        for chunk in t.column(c).chunks:
            if len(chunk):
                values, bits = _chunk_host(chunk, arr.dtype)
                copy(arr, off, values)
                if bits is not None:
                    nulls.append((arr, off, len(chunk), bits, chunk.offset % 8))
                off += len(chunk)
    return nulls


def _address(arr: Any) -> int:
    """A device array's address (``arr.data.ptr`` on CuPy), by the CUDA array interface."""
    return int(arr.__cuda_array_interface__["data"][0])


def column_dtypes(table: str, columns: Sequence[str]) -> dict[str, np.dtype]:
    """The NumPy dtype each canonical column has in backend memory."""
    schema = SCHEMAS[table]
    return {c: np.dtype(schema.field(c).type.to_pandas_dtype()) for c in columns}


def column_bytes(table: str, columns: Iterable[str]) -> int:
    """Bytes of a row of ``columns`` of ``table`` in backend memory."""
    return sum(d.itemsize for d in column_dtypes(table, sorted(columns)).values())


def column_sets(columns: Sequence[str], dtypes: dict[str, np.dtype], parts: int) -> list[list[str]]:
    """``columns`` in at most ``parts`` sets of about equal bytes a row (each column, the widest
    first, to the lightest set so far), each in the order of ``columns``: what one decode task
    reads of a row group (Parquet's column chunks decode apart).

    >>> d = {c: np.dtype(t) for c, t in zip("abcd", ["i8", "f8", "i4", "u1"])}
    >>> column_sets(list("abcd"), d, 2), column_sets(list("abcd"), d, 1), len(column_sets(list("ab"), d, 9))
    ([['a', 'c'], ['b', 'd']], [['a', 'b', 'c', 'd']], 2)
    """
    parts = max(1, min(int(parts), len(columns)))
    sets: list[list[str]] = [[] for _ in range(parts)]
    width = [0] * parts
    for c in sorted(columns, key=lambda c: -dtypes[c].itemsize):
        k = width.index(min(width))
        sets[k].append(c)
        width[k] += dtypes[c].itemsize
    order = {c: i for i, c in enumerate(columns)}
    return [sorted(s, key=order.__getitem__) for s in sets if s]


def load_partitions(
    groups: Sequence[Sequence[_partition.PartitionSpec]],
    columns: Sequence[str],
    backend: Backend,
    *,
    threads: int = LOAD_THREADS,
    on_done: Callable[[_partition.PartitionSpec], None] | None = None,
) -> list[dict[str, Any]]:
    """Read ``columns`` once into ``backend`` memory: one dict of arrays per group of partitions
    (the partitions of a group, consecutive, fill consecutive rows of the group's arrays).

    ``threads`` Parquet row groups (of any partitions) are decoded at once, each in as many sets
    of its columns (:func:`column_sets`) as give every thread two tasks (a streamed partition is a
    few row groups); on the gpu backend each thread copies what it decoded to the device through
    its own pinned buffers and stream (see the module docstring), so decode, the host->device
    copies and the next decode overlap.  ``on_done(spec)`` is called as each partition's rows are
    all in place.  Every array is complete when this returns.
    """
    columns = list(columns)
    xp = backend.xp
    if not groups:
        return []
    dtypes = column_dtypes(groups[0][0].table, columns)
    out = [{c: xp.empty(sum(s.num_rows for s in g), dtype=dtypes[c]) for c in columns} for g in groups]
    # one task per Parquet row group and set of columns: a study's few large partitions would
    # otherwise leave all but a few threads idle (10^7 windows are 2-3 partitions; 16 cores on a
    # device node), and a streamed partition's few row groups all but a few
    pieces = [_reading.row_group_pieces(spec.pieces) for g in groups for spec in g]
    sets = column_sets(columns, dtypes, -(-2 * threads // max(1, sum(map(len, pieces)))) if threads > 1 else 1)
    tasks: list[tuple[int, int, _partition.PartitionSpec, _partition.Piece, list[str]]] = []
    left: dict[int, int] = {}  # a partition's tasks still to do
    it = iter(pieces)
    for gi, g in enumerate(groups):
        off = 0
        for spec in g:
            mine = next(it)
            left[id(spec)] = len(mine) * len(sets)
            for p in mine:
                tasks.extend((gi, off, spec, p, cols) for cols in sets)
                off += p.stop - p.start
            if not mine and on_done is not None:
                on_done(spec)
    left_lock = threading.Lock()

    device = None if backend.name == "cpu" else xp.cuda.Device().id

    def host_copy(arr: np.ndarray, off: int, host: np.ndarray) -> None:
        arr[off : off + host.shape[0]] = host

    def one(task: tuple[int, int, _partition.PartitionSpec, _partition.Piece, list[str]]) -> None:
        gi, off, spec, piece, cols = task
        t = _reading.read_piece(piece, spec.table, cols)
        dest = {c: out[gi][c] for c in cols}
        if backend.name == "cpu":  # (xp is NumPy, or in tests an array module posing as a device's)
            for arr, o, n, bits, first in _fill(t, dest, off, host_copy):
                fill_nulls(xp, arr[o : o + n], xp.asarray(bits), first)
        else:
            assert device is not None  # set for every backend but cpu
            with xp.cuda.Device(device):
                st = _borrow(xp, device)
                try:
                    nulls = _fill(
                        t, dest, off, lambda arr, o, host: st.copy(_address(arr) + o * arr.dtype.itemsize, host)
                    )
                    st.finish()  # this partition's copies have landed: the NULL fills may follow
                finally:
                    _give_back(device, st)
                for arr, o, n, bits, first in nulls:  # only the validity bytes travel: n / 8 of them
                    fill_nulls(xp, arr[o : o + n], xp.asarray(bits), first)
                if nulls:  # (the fills, on this thread's stream, done before the rows count as loaded)
                    xp.cuda.Stream.null.synchronize()
        with left_lock:
            left[id(spec)] -= 1
            done = left[id(spec)] == 0
        if done and on_done is not None:
            on_done(spec)

    if threads <= 1 or len(tasks) <= 1:
        for t in tasks:
            one(t)
    else:
        with ThreadPoolExecutor(max_workers=min(threads, len(tasks)), thread_name_prefix="gpuclust-load") as pool:
            list(pool.map(one, tasks))
    return out
