"""Work that every xdist worker of one pytest run shares: built by the first worker that needs it,
in the folder all workers of the run have in common, and used read-only by the others."""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder all workers of this pytest run share (``getbasetemp().parent`` under xdist: each
    worker's basetemp is a subfolder of the run's), or the basetemp without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_run(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Path], *, read_only: bool = False
) -> Path:
    """What ``build(folder)`` returns, built once per pytest run whatever the number of workers.

    ``build`` gets an empty folder ``<run folder>/<name>/work`` and returns the path its users get.
    The first worker to need it builds it holding a lock on ``<name>``, and marks it done; a worker
    that comes later waits for the lock and gets the same path.  A build that failed left no mark:
    the next worker builds it again, from an empty folder, and fails the same way.  With
    ``read_only``, the write bits of every file and folder under the result are cleared once built,
    so a user that writes into it fails (except as root, whom they do not stop): users copy it to
    change it."""
    base = run_folder(tmp_path_factory) / name
    base.mkdir(exist_ok=True)
    with open(base / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        work, done = base / "work", base / "done"
        if done.exists():
            return Path(done.read_text())
        if work.exists():
            _writable(work)
            shutil.rmtree(work)
        work.mkdir()
        out = build(work)
        if read_only:
            _read_only(out)
        done.write_text(str(out))
        return out


def _read_only(path: Path) -> None:
    """Clear the write bits of ``path`` and everything under it (folders last, so files first)."""
    for root, dirs, files in os.walk(path, topdown=False):
        for n in files + dirs:
            p = os.path.join(root, n)
            if not os.path.islink(p):
                os.chmod(p, stat.S_IMODE(os.stat(p).st_mode) & ~0o222)
    os.chmod(path, stat.S_IMODE(os.stat(path).st_mode) & ~0o222)


def _writable(path: Path) -> None:
    """Give the owner write access again under ``path`` (to remove a failed build's folder)."""
    for root, dirs, _files in os.walk(path):
        os.chmod(root, stat.S_IMODE(os.stat(root).st_mode) | 0o200)
        for n in dirs:
            p = os.path.join(root, n)
            if not os.path.islink(p):
                os.chmod(p, stat.S_IMODE(os.stat(p).st_mode) | 0o200)
