"""Identifying an ingest's inputs before they are read: each input's content key (its hash, the
one recorded for an unchanged file, or none yet when it can be hashed while it is read), the
sizes a bucket listing gives (:func:`read_listing`), and the key of an input that fails before
it is read.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuclust.ingest import content_hash
from gpuclust.ingest.base import SourceFile
from gpuclust.ingest.outcome import IngestUsageError
from gpuclust.ingest.readers import _fast_usage


def _hash(s: SourceFile, algorithm: str) -> tuple[SourceFile, str]:
    """(source, the hash of its content); an unreadable file gets a key from its path and a problem."""
    try:
        return s, content_hash.file_hash(s.path, algorithm)
    except OSError as e:
        return replace(s, problem=s.problem or f"{s.path}: cannot read: {e.strerror or e}"), ""


def _known_inputs(manifest: dict[str, Any]) -> dict[tuple[str, int, int], str]:
    """``(path, size, mtime_ns) -> content hash`` of the inputs a manifest records as done."""
    return {
        (inp["path"], int(inp["size"]), int(inp["mtime_ns"])): key
        for key, inp in manifest["inputs"].items()
        if inp.get("status") == "done" and inp.get("mtime_ns") is not None and inp.get("size") is not None
    }


def _identify(
    s: SourceFile, known: dict[tuple[str, int, int], str], algorithm: str, defer: set[int]
) -> tuple[SourceFile, str | None]:
    """(source, its content key): the recorded hash of an input already ingested from the same
    path with the same size and modification time (not read again); None (hash it while it is
    read) for a readable input whose size is in ``defer``; else :func:`_hash`."""
    try:
        st = os.stat(s.path)
    except OSError:
        return _hash(s, algorithm)
    key = known.get((str(s.path), st.st_size, st.st_mtime_ns))
    if key is not None and s.problem is None:
        return s, key
    if s.problem is None and st.st_size in defer:
        return s, None
    return _hash(s, algorithm)


def _sizes_to_defer(srcs: list[SourceFile], manifest: dict[str, Any]) -> set[int]:
    """File sizes whose inputs may be hashed while they are read instead of before.

    Files of different sizes differ, so an input whose size no other input of this run and no
    input the manifest records has cannot be a duplicate, a moved file or a retry: nothing
    needs its hash before it is read.  The others are hashed first, as before, so duplicates
    and already-ingested content are still found without parsing them."""
    sizes: dict[int, int] = {}
    for s in srcs:
        try:
            n = s.path.stat().st_size
        except OSError:
            continue
        sizes[n] = sizes.get(n, 0) + 1
    recorded = {int(inp["size"]) for inp in manifest["inputs"].values() if inp.get("size") is not None}
    return {n for n, k in sizes.items() if k == 1 and n not in recorded}


_LISTING_LINE = re.compile(r"^\s*(\d+)\s+(?:\S+\s+)?(\S+)\s*$")


def read_listing(path: str | os.PathLike[str]) -> dict[str, int]:
    """``file name -> size in bytes`` from a bucket listing (``gsutil ls -l`` / ``gcloud storage
    ls -l`` output: ``SIZE  DATE  gs://bucket/name`` lines; ``SIZE  NAME`` lines work too).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "ls.txt"
    >>> _ = p.write_text("  2048  2020-03-17T20:43:08Z  gs://clusterdata_2019_a/machine_events-000000000000.json.gz\\n"
    ...                  "TOTAL: 1 objects, 2048 bytes (2 KiB)\\n")
    >>> read_listing(p)
    {'machine_events-000000000000.json.gz': 2048}
    """
    out: dict[str, int] = {}
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        raise IngestUsageError(f"--listing {path}: cannot read: {e.strerror or e}") from None
    for line in text.splitlines():
        m = _LISTING_LINE.match(line)
        if m and not line.lstrip().startswith("TOTAL"):
            out[m.group(2).rstrip("/").rsplit("/", 1)[-1]] = int(m.group(1))
    if not out:
        raise IngestUsageError(f"--listing {path}: no 'SIZE [DATE] NAME' lines (expected `gsutil ls -l` output)")
    return out


def _check_listing(s: SourceFile, listing: dict[str, int], where: str, notes: list[str]) -> SourceFile:
    """``s``, failed without reading when its size disagrees with the listing's."""
    want = listing.get(s.path.name)
    if want is None:
        notes.append(f"{s.path}: not in the listing {where}; its size is not checked")
        return s
    have = s.path.stat().st_size
    if have < want:
        why = (
            f"{s.path}: truncated download: {have:,} of {want:,} bytes (the listing {where}); "
            "download it again and re-run"
        )
    elif have > want:
        why = f"{s.path}: {have:,} bytes, but the listing {where} says {want:,}: not the listed object"
    else:
        return s
    return replace(s, problem=s.problem or why)


def _problem_key(s: SourceFile, sha: str) -> str:
    """Manifest key of an input that fails before it is read: from its path and content."""
    return hashlib.sha256(b"problem\0" + os.fsencode(s.path) + b"\0" + sha.encode()).hexdigest()


def _identify_inputs(
    srcs: list[SourceFile],
    manifest: dict[str, Any],
    algorithm: str,
    workers: int | None,
    listing: str | os.PathLike[str] | None,
    notes: list[str],
) -> tuple[list[SourceFile], list[str | None]]:
    """(sources, their content keys): sources failed by their listed size (``listing``), then
    every input's key from :func:`_identify`."""
    if listing is not None:
        sizes = read_listing(listing)
        srcs = [_check_listing(s, sizes, str(listing), notes) for s in srcs]
    # Hash inputs (threads: both hashes release the GIL); an input already done with the same path,
    # size and modification time keeps its recorded hash without being read again.
    known = _known_inputs(manifest)
    if (workers == 1 or len(srcs) == 1) and any(
        s.format == "v3-json" and s.source_table == "instance_usage" and s.problem is None for s in srcs
    ):
        _fast_usage.preload()  # read in this process: load the compiled JSON reader meanwhile
    defer = _sizes_to_defer(srcs, manifest)
    with cf.ThreadPoolExecutor(max_workers=min(4, len(srcs))) as tp:
        hashed = list(tp.map(lambda s: _identify(s, known, algorithm, defer), srcs))
    return [s for s, _ in hashed], [h for _, h in hashed]
