"""A results folder, written per run as a whole: into a temporary sibling, swapped in by rename.

``ResultsFolder(out).open()`` checks the output path and creates the temporary sibling
``.<name>.gpuclust-tmp-<pid>-<token>`` *before* any computation, so a bad path fails at once.
:meth:`ResultsFolder.commit` renames the previous folder aside, renames the new one into place
and deletes the previous one: the folder then holds exactly this run's files, with ``_run.json``
saying what wrote them.  Outputs of earlier runs are removed, never mixed with new ones.  A run
killed before the swap leaves the previous folder untouched (its temporary sibling is removed by
the next run once its process is gone).

Only a folder that is empty, holds ``_run.json`` or looks like the results of an older gpuclust
(``summary.txt`` plus per-analysis folders) is replaced; any other existing path is refused.

Every OS error becomes an :class:`OutputError`: one line naming the path and the reason.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

from gpuclust.errors import OutputError
from gpuclust.report.provenance import RUN_FILE

__all__ = ["RUN_FILE", "OutputError", "ResultsFolder"]

_TMP, _OLD = ".gpuclust-tmp-", ".gpuclust-old-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _subject(plots: bool, run_info: dict[str, Any] | None) -> str | None:
    """What plot titles name (the dataset, cell and trace; only with plots)."""
    if plots and run_info and run_info.get("dataset"):
        from gpuclust.report.provenance import manifest_facts, subject

        return subject(run_info, manifest_facts(run_info["dataset"]))
    return None


class ResultsFolder:
    """One run's results folder (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]):
        # a link to a folder: the folder it points to is replaced (the link stays a link)
        self.path = Path(os.path.realpath(path) if os.path.islink(path) else os.path.abspath(path))
        self.tmp: Path | None = None

    # ------------------------------------------------------------------------- checks
    def _check_replaceable(self) -> None:
        p = self.path
        try:
            entries = list(p.iterdir())
        except OSError as e:
            raise OutputError(p, e) from None
        if not entries or (p / RUN_FILE).is_file():
            return
        legacy = (p / "summary.txt").is_file() and all(
            e.name == "summary.txt" or e.name.startswith(".") or e.is_dir() and not (e / "manifest.json").exists()
            for e in entries
        )
        if not legacy:
            raise OutputError(
                p,
                f"folder exists and holds files that are not gpuclust results (no {RUN_FILE}); "
                "choose a new or empty folder",
            )

    def _sweep(self) -> None:
        """Remove temporary siblings left by runs whose process is gone."""
        with contextlib.suppress(OSError):
            for q in self.path.parent.glob(f".{self.path.name}.gpuclust-*"):
                tag = q.name[len(self.path.name) + 1 :]
                if not tag.startswith((_TMP, _OLD)):
                    continue
                pid = tag[len(_TMP) :].split("-", 1)[0]
                if pid.isdigit() and not _alive(int(pid)):
                    shutil.rmtree(q, ignore_errors=True)

    def open(self) -> ResultsFolder:
        """Check the output path and create the temporary folder; :class:`OutputError` if not possible."""
        p = self.path
        if p.exists() and not p.is_dir():
            raise OutputError(p, "exists and is not a folder")
        if p.is_dir():
            self._check_replaceable()
        anc = p.parent
        while not anc.exists() and anc != anc.parent:
            anc = anc.parent
        if not anc.is_dir():
            raise OutputError(p, f"{anc} is not a folder")
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            self._sweep()
            tmp = p.parent / f".{p.name}{_TMP}{os.getpid()}-{secrets.token_hex(4)}"
            os.mkdir(tmp)  # mode 0o777 less the umask
        except OSError as e:
            raise OutputError(p, e) from None
        self.tmp = tmp
        return self

    # ------------------------------------------------------------------------- writing
    def write(
        self,
        results: Any,
        analyses: Any,
        *,
        plots: bool = True,
        run_info: dict[str, Any] | None = None,
        rendered: Any = None,
    ) -> list[Path]:
        """Write the results into the temporary folder (see :func:`gpuclust.report.render`;
        ``rendered``: the analyses whose files the dask workers wrote, see :meth:`writer`); the
        paths returned are where the files will be after :meth:`commit`."""
        from gpuclust.report.rendering import render, write_run_file

        assert self.tmp is not None, "open() first"
        try:
            rel = render(
                results,
                analyses,
                self.tmp,
                plots=plots,
                subject=_subject(plots, run_info),
                selection=(run_info or {}).get("selection"),
                rendered=rendered,
            )
            rel.append(write_run_file(self.tmp, rel, run_info or {}))
        except OSError as e:
            raise OutputError(self.path, e) from None
        return [self.path / r for r in rel]

    def writer(
        self, *, plots: bool = True, run_info: dict[str, Any] | None = None, selection: dict[str, Any] | None = None
    ) -> Any:
        """An :class:`gpuclust.report.writer.AnalysisWriter` into the temporary folder: for the
        engine to write each analysis' tables where it finalizes them (a dask worker); pass its
        ``rendered`` to :meth:`write`.  ``run_info``: as :meth:`write` gets it (what the plots'
        titles name); ``selection``: the time selection, as ``_run.json`` records it."""
        from gpuclust.report.writer import AnalysisWriter

        assert self.tmp is not None, "open() first"
        return AnalysisWriter(
            self.tmp, out=self.path, plots=plots, subject=_subject(plots, run_info), selection=selection
        )

    def commit(self) -> Path:
        """Swap the new folder in (the previous one, if any, is removed)."""
        assert self.tmp is not None, "open() first"
        p, old = self.path, None
        try:
            if p.exists():
                old = p.parent / f".{p.name}{_OLD}{os.getpid()}-{secrets.token_hex(4)}"
                os.rename(p, old)
            try:
                os.rename(self.tmp, p)
            except OSError:
                if old is not None:
                    os.rename(old, p)
                raise
        except OSError as e:
            self.abort()
            raise OutputError(p, e) from None
        self.tmp = None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return p

    def abort(self) -> None:
        """Remove the temporary folder (the previous results stay as they were)."""
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
