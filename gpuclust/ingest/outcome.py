"""What an ingest run reports: per input (:class:`FileReport`) and over the run
(:class:`IngestReport`), and the error for a request it cannot carry out
(:class:`IngestUsageError`).  All three are importable from :mod:`gpuclust.ingest.api` too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


class IngestUsageError(ValueError):
    """The request cannot be carried out as given (mixed trace versions, conflicting cell, ...)."""


@dataclass
class FileReport:
    """Per-input outcome of one ingest run."""

    path: str
    #: The hash of the input's content that keys it in the manifest (``manifest["content_hash"]``
    #: names the algorithm: :mod:`gpuclust.ingest.content_hash`).
    content_hash: str
    #: "done", "failed", "skipped" (already in the dataset) or "duplicate" (same content given twice).
    status: str
    format: str = ""
    source_table: str = ""
    rows_read: int = 0
    rows_written: dict[str, int] = field(default_factory=dict)
    rows_rejected: int = 0
    rows_deduplicated: int = 0
    #: Rows outside the ingest's sample / time range (not written, not validated).
    rows_skipped: int = 0
    rejects_file: str | None = None
    first_reasons: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    bytes: int = 0


@dataclass
class IngestReport:
    """The result of :func:`ingest`: per-file statistics, totals, failures and the exit status."""

    out: Path
    files: list[FileReport]
    rows_read: int
    rows_written: dict[str, int]
    rows_rejected: int
    rows_deduplicated: int
    max_reject_rate: float
    complete: bool
    seconds: float
    warnings: list[str] = field(default_factory=list)
    #: One line per file not read on purpose (not a trace table, a twin export not chosen) and
    #: per file read as something other than its name says.
    notes: list[str] = field(default_factory=list)
    #: The ingest's selection (:meth:`gpuclust.ingest.sampling.IngestSelection.describe`), if any.
    selection: str | None = None
    #: Rows outside the selection, over the files read.
    rows_skipped: int = 0
    #: How the dataset's key-partitioned tables are laid out after the run: ``"bucketed"`` (by
    #: instance and machine, :mod:`gpuclust.optimize`), ``"flat"``, or ``None`` (unfinished).
    layout: str | None = None
    #: One line on the layout step of this run (``None``: none ran).
    layout_note: str | None = None

    @property
    def failed(self) -> list[FileReport]:
        return [f for f in self.files if f.status == "failed"]

    @property
    def reject_rate(self) -> float:
        return self.rows_rejected / self.rows_read if self.rows_read else 0.0

    @property
    def over_threshold(self) -> bool:
        return self.reject_rate > self.max_reject_rate

    @property
    def exit_status(self) -> int:
        """0 when every file was read and rejects stayed under the threshold, else 1."""
        return 1 if (self.failed or self.over_threshold) else 0

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def summary(self) -> str:
        """A human-readable summary: per file rows read / written / rejected, first reasons."""
        lines = [f"ingest into {self.out}:"]
        if self.selection:
            lines.append(f"selection: {self.selection} ({self.rows_skipped:,} rows outside it, not written)")
        lines.extend(f"note: {n}" for n in self.notes)
        for f in self.files:
            if f.status in ("skipped", "duplicate"):
                why = "already ingested" if f.status == "skipped" else "the same content as another input of this run"
                lines.append(f"  {f.path}: skipped, {why}")
                continue
            w = sum(f.rows_written.values())
            extra = f", {f.rows_deduplicated:,} deduplicated" if f.rows_deduplicated else ""
            extra += f", {f.rows_skipped:,} outside the selection" if f.rows_skipped else ""
            lines.append(
                f"  {f.path}: {f.status}; {f.rows_read:,} read, {w:,} written, {f.rows_rejected:,} rejected{extra}"
            )
            if f.error:
                lines.append(f"    error: {f.error}")
            for r in f.first_reasons[:3]:
                lines.append(f"    reject {r}")
            if f.rejects_file:
                lines.append(f"    rejects: {self.out / f.rejects_file}")
        w = sum(self.rows_written.values())
        lines.append(
            f"total: {self.rows_read:,} read, {w:,} written, {self.rows_rejected:,} rejected "
            f"({self.reject_rate:.4%}; threshold {self.max_reject_rate:.4%}) in {self.seconds:.1f} s"
        )
        for t, n in sorted(self.rows_written.items()):
            lines.append(f"  {t}: {n:,} rows")
        for wmsg in self.warnings:
            lines.append(f"warning: {wmsg}")
        if self.failed:
            lines.append(f"FAILED: {len(self.failed)} input(s) failed (see 'error:' above)")
        if self.over_threshold:
            lines.append("FAILED: the reject rate is over the threshold (--max-reject-rate)")
        if self.layout_note:
            lines.append(self.layout_note)
        if self.complete:
            lines.append("dataset complete: true")
        else:
            lines.append(
                "dataset unfinished: analyses refuse it until every input is done; "
                "fix the failed input(s) and re-run the same command to retry them"
            )
        return "\n".join(lines)
