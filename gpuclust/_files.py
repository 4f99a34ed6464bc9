"""Writing one file atomically (temp file beside it + rename), created with the process umask."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: Path, write: Callable[[str], object]) -> None:
    """Call ``write(tmp)`` on a new file beside ``path``, then rename it over ``path``.

    The temp file is created with mode ``0o666`` less the process umask (``tempfile.mkstemp``
    would make it ``0o600``, and the rename keeps that mode).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        write(str(tmp))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
