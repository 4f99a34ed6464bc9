"""The content hash that keys a dataset's inputs (manifest ``inputs``, output names).

An input is identified by a hash of its bytes, so a renamed or moved file is not ingested twice,
the same content given twice is ingested once, and a changed file is a new input.  New datasets
use **BLAKE3** (the ``blake3`` package, 32-byte digests); a dataset records its algorithm in the
manifest (``content_hash``) and keeps it: a manifest without the field was written by an earlier
gpuclust with **SHA-256**, and its inputs stay keyed so.  Where ``blake3`` cannot be imported a new
dataset uses SHA-256 (same guarantees, slower).

Why BLAKE3: every byte of every input is hashed.  On this project's 2-core VM SHA-256 (OpenSSL,
SHA extensions) costs 0.55 CPU-s per GB, as much as a fifth of parsing a plain JSON shard, while
BLAKE3 costs 0.18 (0.36 s against 1.09 s for a 1.96 GB shard read from the page cache, one
thread); both are cryptographic, so equal digests mean equal content.

When: :func:`file_hash` reads a file to hash it before it is ingested; :class:`StreamHash`
hashes it as its reader reads it (ingest uses it for inputs whose size no other input has:
``gpuclust.ingest.api``), so the file is read once.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Protocol

#: The algorithm of a manifest without a ``content_hash`` field (gpuclust before 2026-11-25).
LEGACY = "sha256"
ALGORITHMS = ("blake3", "sha256")


class _Hasher(Protocol):
    def update(self, data: Any, /) -> Any: ...

    def hexdigest(self) -> str: ...


class MissingHashError(RuntimeError):
    """The dataset's inputs are keyed by an algorithm this Python cannot compute."""


def _blake3() -> Any:
    try:
        import blake3
    except ImportError:
        return None
    return blake3


def default_algorithm() -> str:
    """The algorithm for a new dataset: BLAKE3 when the ``blake3`` package is installed."""
    return "blake3" if _blake3() is not None else "sha256"


def of_manifest(manifest: dict[str, Any]) -> str:
    """The algorithm a manifest's inputs are keyed by."""
    algo = manifest.get("content_hash") or LEGACY
    if algo not in ALGORITHMS:
        raise MissingHashError(f"inputs keyed by {algo!r}, which this gpuclust does not know ({', '.join(ALGORITHMS)})")
    return str(algo)


def hasher(algorithm: str) -> _Hasher:
    """A fresh incremental hasher (``update``, ``hexdigest``)."""
    if algorithm == "sha256":
        return hashlib.sha256()
    b3 = _blake3()
    if b3 is None:
        raise MissingHashError(
            "this dataset's inputs are keyed by BLAKE3 hashes and the blake3 package is not installed: "
            "pip install blake3"
        )
    return b3.blake3()


def file_hash(path: Path, algorithm: str, block: int = 4 << 20) -> str:
    """Hex digest of the file's bytes (read in ``block``-byte pieces into one reused buffer;
    both hashes release the GIL while they work, so several files hash in parallel threads)."""
    h = hasher(algorithm)
    buf = bytearray(block)
    view = memoryview(buf)
    with open(path, "rb") as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.hexdigest()


class StreamHash:
    """The hash of one file, fed by the reader as it reads the file, so the file is read once.

    A reader that reads the file in order from its start hands its file object to :meth:`wrap`;
    every byte it reads is hashed on the way.  :meth:`finish` hashes whatever the reader did not
    read in order (the rest after an early stop, or the whole file for a reader that seeks or
    never used the wrapper) and returns the hex digest, the same as :func:`file_hash`'s.
    """

    def __init__(self, path: Path, algorithm: str):
        self.path = Path(path)
        self._h = hasher(algorithm)
        self._done = 0  # bytes [0, _done) are hashed

    def wrap(self, f: Any) -> _HashingFile:
        return _HashingFile(f, self)

    def _feed(self, at: int, data: Any) -> None:
        if at == self._done and len(data):
            self._h.update(data)
            self._done += len(data)

    def finish(self, block: int = 4 << 20) -> str:
        with open(self.path, "rb") as f:
            f.seek(self._done)
            buf = bytearray(block)
            view = memoryview(buf)
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                self._h.update(view[:n])
                self._done += n
        return self._h.hexdigest()


class _HashingFile:
    """A binary file whose ``read`` / ``readinto`` also feed a :class:`StreamHash`."""

    def __init__(self, f: Any, digest: StreamHash):
        self._f = f
        self._digest = digest

    def read(self, size: int = -1) -> bytes:
        at = self._f.tell()
        data: bytes = self._f.read(size)
        self._digest._feed(at, data)
        return data

    def readinto(self, buf: Any) -> int:
        at = self._f.tell()
        n: int = self._f.readinto(buf)
        if n:
            self._digest._feed(at, memoryview(buf)[:n])
        return n

    def __getattr__(self, name: str) -> Any:  # tell, seek, close, ...
        return getattr(self._f, name)
