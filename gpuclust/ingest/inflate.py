"""Gzip inflation for the readers: ISA-L's igzip (``python-isal``) where it is installed, else zlib.

zlib inflates the 2019 exports at ~1.6 CPU-seconds per GB of JSON, about a seventh of ingest's CPU;
igzip inflates the same stream 2.5x faster on this project's benchmark shard (docs/user/ingest.md).  ``isal`` is a dependency (wheels
for CPython 3.10-3.13 on x86-64 and aarch64); where it cannot be imported, zlib is used and the
bytes are the same.  ``GPUCLUST_INFLATE=zlib`` forces zlib (to compare, or to rule isal out).

Both engines expose the same streaming object (``decompress(data, max_length)``,
``unconsumed_tail``, ``unused_data``, ``eof``); their errors differ, so callers catch
:data:`ERRORS`.

Examples
--------
>>> import gzip
>>> d = decompressobj()
>>> d.decompress(gzip.compress(b"one line\\n")), d.eof
(b'one line\\n', True)
"""

from __future__ import annotations

import os
import zlib
from typing import Any

__all__ = ["ENGINE", "ERRORS", "decompressobj"]

_zmod: Any = zlib
if os.environ.get("GPUCLUST_INFLATE", "").lower() != "zlib":
    try:
        from isal import isal_zlib as _zmod
    except ImportError:  # no wheel for this platform: zlib gives the same bytes, slower
        _zmod = zlib

#: The engine in use: ``"isal"`` or ``"zlib"``.
ENGINE: str = "isal" if _zmod is not zlib else "zlib"
#: What a corrupt stream raises (``zlib.error`` or isal's ``IsalError``).
ERRORS: tuple[type[BaseException], ...] = tuple({zlib.error, _zmod.error})


def decompressobj() -> Any:
    """A streaming decompressor for one gzip member (``wbits=31``: gzip header and trailer)."""
    return _zmod.decompressobj(wbits=31)
