"""Exit statuses, the one-line fault text, and the faults raised low and reported high.

The commands live in the packages that implement them (``gpuclust ingest`` in
:mod:`gpuclust.ingest.command`, ``gpuclust claims`` in :mod:`gpuclust.claims.command`, ...) and
:mod:`gpuclust.cli` dispatches to them; this module sits below all of them so that a command
reports a fault the same way without importing the dispatcher, and so that a fault one layer
raises (:class:`BackendUnavailable` from :mod:`gpuclust.backends`, :class:`OutputError` from the
results folder) is caught by name above it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

__all__ = [
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_UNFINISHED",
    "BackendUnavailable",
    "OutputError",
    "expected_fault",
    "fault_text",
]

#: Exit statuses, one convention for every command (docs/analyses/README.md, "Exit codes"): 0 done;
#: 1 ingest (or ``synth --dataset``) ran but an input failed, so the dataset is unfinished (its
#: summary says which); 2 an expected fault, reported as one line on stderr naming the file or
#: option and the reason: bad usage, a path that is missing or not what it should be, a damaged
#: dataset file, an output that cannot be written.
EXIT_OK, EXIT_UNFINISHED, EXIT_ERROR = 0, 1, 2


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here (e.g. ``gpu`` without CuPy or a CUDA device); also
    :class:`gpuclust.backends.BackendUnavailable`."""


class OutputError(Exception):
    """The results cannot be written: ``cannot write results to PATH: REASON`` (raised by the
    results folder, :mod:`gpuclust.report.folder`; also :class:`gpuclust.report.OutputError`)."""

    def __init__(self, path: Path | str, reason: BaseException | str):
        if isinstance(reason, OSError):
            where = f" ({reason.filename})" if reason.filename and str(reason.filename) != str(path) else ""
            reason = f"{reason.strerror or reason}{where}"
        super().__init__(f"cannot write results to {path}: {reason}")
        self.path = Path(path)
        self.reason = str(reason)

    def __reduce__(self) -> Any:  # from a dask worker that wrote results (see gpuclust.report.writer)
        return (OutputError, (self.path, self.reason))


def expected_fault(e: BaseException) -> bool:
    """Whether ``e`` is a fault of the user's files or machine rather than of gpuclust: an
    ``OSError`` (a path missing, not writable, a full disk) or a
    :class:`gpuclust.dataset.DatasetError`."""
    if isinstance(e, OSError):
        return True
    ds = sys.modules.get("gpuclust.dataset")
    return ds is not None and isinstance(e, ds.DatasetError)


def fault_text(e: BaseException) -> str:
    """An expected fault as one line: an ``OSError`` as ``FILE: reason`` (``/x/out: Permission
    denied``), anything else its message with the whitespace collapsed.

    >>> fault_text(PermissionError(13, "Permission denied", "/x/out"))
    '/x/out: Permission denied'
    >>> fault_text(ValueError("bad\\n  value"))
    'bad value'
    """
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        return f"{e.filename}: {e.strerror}"
    return " ".join(str(e).split()) or type(e).__name__
