"""What :func:`gpuclust.report.analyze.analyze` settles before computing, and what ``_run.json`` records.

:func:`prepare` resolves the analyses, opens the source, checks it
(:func:`gpuclust.engine.checks.preflight`) and resolves the backend once, reporting notes (and
what ``backend="auto"`` chose) through ``note``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

__all__ = ["RunPlan", "prepare"]

log = logging.getLogger("gpuclust")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class RunPlan:
    """The resolved inputs of one ``analyze`` run."""

    source: Any
    analyses: list[Any]
    backend: Any
    backend_requested: str
    notes: list[str] = field(default_factory=list)
    started: str = field(default_factory=_now)
    t0: float = field(default_factory=time.monotonic)

    @property
    def keys(self) -> list[str]:
        from gpuclust.engine.contexts import result_keys

        return result_keys(self.analyses)

    def by_key(self) -> dict[str, Any]:
        return dict(zip(self.keys, self.analyses, strict=True))

    def info(self, **run_args: Any) -> dict[str, Any]:
        """The body of ``_run.json`` (without its file list)."""
        from gpuclust import __version__
        from gpuclust.analyses.options import options_of

        path = getattr(self.source, "path", None)
        return {
            "gpuclust_version": __version__,
            "dataset": str(path.absolute()) if path is not None else None,
            "trace_version": getattr(self.source, "trace_version", None),
            "analyses": [
                {
                    "key": k,
                    "name": a.name,
                    "label": a.label,
                    "options": {o.name: getattr(a, o.name) for o in options_of(type(a))},
                }
                for k, a in zip(self.keys, self.analyses, strict=True)
            ],
            "backend": self.backend.name,
            "backend_requested": self.backend_requested,
            **run_args,
            "notes": self.notes,
            "started": self.started,
            "finished": _now(),
            "seconds": round(time.monotonic() - self.t0, 3),
        }


def _analyses(names: Any, options: dict[str, Any]) -> list[Any]:
    from gpuclust.analyses.registry import create, entry
    from gpuclust.engine.contexts import resolve_analyses

    if isinstance(names, str):
        names = [names]
    out = []
    for n in names:
        if isinstance(n, str):
            known = {o.name for o in entry(n).options}
            out.append(create(n, **{k: v for k, v in options.items() if k in known}))
        else:
            out.append(n)
    return resolve_analyses(out)


def prepare(
    dataset: Any,
    names: Any,
    *,
    backend: Any = "cpu",
    tier_map: str | None = None,
    mode: str | None = None,
    note: Callable[[str], None] | None = None,
) -> RunPlan:
    """Resolve and check everything :func:`gpuclust.report.analyze.analyze` needs before it computes."""
    from gpuclust.backends import get_backend
    from gpuclust.engine.checks import preflight
    from gpuclust.engine.partition import as_source

    say = note if note is not None else log.warning
    analyses = _analyses(names, {"tier_map": tier_map, "mode": mode})
    src = as_source(dataset)
    notes = preflight(src, analyses)
    be = get_backend(backend)
    requested = backend if isinstance(backend, str) else be.name
    if requested == "auto":
        why = "CuPy sees a CUDA device" if be.name == "gpu" else "no CUDA device visible to CuPy"
        notes.append(f"backend auto: using {be.name} ({why})")
    for n in notes:
        say(n)
    return RunPlan(src, analyses, be, requested, notes)
