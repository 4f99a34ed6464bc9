"""What a report says about where its numbers come from: a results folder read back, and the
provenance lines (dataset, trace version, cell, tier map, time span, sample, versions, commit,
options, backend, device).
"""

from __future__ import annotations

import errno
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from gpuclust.report.axes import trace_hours
from gpuclust.schema import TIME_AFTER_TRACE, TRACE_OFFSET_US

__all__ = [
    "RUN_FILE",
    "code_commit",
    "dataset_facts",
    "device_text",
    "load_results",
    "manifest_facts",
    "provenance_rows",
    "read_run_file",
    "subject",
]


#: The run file of a results folder: what ran, on what, and the files written (see
#: :func:`gpuclust.report.write_run_file`); its presence marks a folder as gpuclust results.
RUN_FILE = "_run.json"


def read_run_file(folder: str | Path) -> dict[str, Any] | None:
    """``_run.json`` of a results folder, or ``None`` when there is none (or it is unreadable)."""
    try:
        return dict(json.loads((Path(folder) / RUN_FILE).read_text()))
    except (OSError, ValueError):
        return None


def load_results(folder: str | Path, run: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The result tables of a results folder (``gpuclust analyze --out DIR``,
    ``gpuclust.analyze(..., out=DIR)``, a report's results), as the run returned them: a dict
    ``{result key: {table: DataFrame}}``, the key being the analysis name (or its label, e.g.
    ``cell-usage[mode=exact]``, when the run had it twice); a table that grows with the cell
    (``<key>/<table>/part-*.parquet``) is a :class:`gpuclust.parted.PartedTable`, read lazily
    (``.read()``, ``.batches()``).  Public as ``gpuclust.load_results(path)``.

    Parameters
    ----------
    folder : str or Path
        The results folder.  Only the files its ``_run.json`` lists are read.
    run : dict, optional
        That file's content, when the caller has it already.

    Raises
    ------
    FileNotFoundError
        A path that is not there (not a folder: :class:`NotADirectoryError`).
    ValueError
        A folder without a readable ``_run.json``.

    Examples
    --------
    >>> import gpuclust                                                # doctest: +SKIP
    >>> res = gpuclust.load_results("results")                         # doctest: +SKIP
    >>> res["cell-usage"]["usage"].head()                              # doctest: +SKIP
    """
    from gpuclust.parted import PartedTable

    folder = Path(folder)
    if run is None:
        if not folder.exists():
            raise FileNotFoundError(errno.ENOENT, "no such folder", str(folder))
        if not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(folder))
        run = read_run_file(folder)
        if run is None:
            raise ValueError(
                f"{folder}: not a gpuclust results folder (no readable _run.json; "
                "`gpuclust analyze DATASET NAME... --out DIR` writes one)"
            )
    out: dict[str, dict[str, Any]] = {a["key"]: {} for a in run.get("analyses", [])}
    parts: dict[tuple[str, str], list[str]] = {}
    for rel in run.get("files", []):
        bits = rel.split("/")
        if len(bits) == 2 and bits[0] in out and bits[1].endswith(".parquet"):
            # (ParquetFile: read_table would import pyarrow.dataset, ~0.3 s of a reused report)
            out[bits[0]][bits[1][: -len(".parquet")]] = pq.ParquetFile(folder / rel).read().to_pandas()
        elif len(bits) == 3 and bits[0] in out and bits[2].endswith(".parquet"):
            parts.setdefault((bits[0], bits[1]), []).append(bits[2])
    for (key, table), files in parts.items():
        files = sorted(files)
        rows = sum(pq.ParquetFile(folder / key / table / f).metadata.num_rows for f in files)
        out[key][table] = PartedTable(folder / key / table, files, rows)
    return out


def dataset_facts(path: str | Path | None) -> dict[str, Any]:
    """``gpuclust info``'s facts of the dataset (footers and manifest only), or ``{}`` when it is
    no longer there."""
    from gpuclust.dataset import DatasetError
    from gpuclust.info import dataset_info

    if not path:
        return {}
    try:
        return dataset_info(path)
    except (DatasetError, OSError, ValueError):
        return {}


def manifest_facts(path: str | Path | None) -> dict[str, Any]:
    """What a figure's title names of the dataset (:func:`subject`: its path, cell and trace
    version), from its ``manifest.json`` alone: ``gpuclust analyze`` titles its figures with it
    without reading every part file's footer as :func:`dataset_facts` does.  ``{}`` when unreadable."""
    if not path:
        return {}
    try:
        m = json.loads((Path(path) / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return {"path": str(Path(path).absolute()), "cell": m.get("cell"), "trace_version": m.get("trace_version")}


def code_commit() -> str:
    """The git commit of the gpuclust source in use (``+ local changes`` when the checkout
    differs from it), or why it is not known."""
    src = Path(__file__).resolve().parents[2]
    if not (src / ".git").exists():
        return "unknown (gpuclust is not running from a git checkout)"
    try:

        def git(*args: str) -> str:
            return subprocess.run(
                ["git", "-C", str(src), *args], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()

        head = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown (git not available)"
    return head + (" + local changes" if dirty else "")


def device_text(backend: str) -> str:
    """The device a backend runs on, on this machine."""
    if backend == "gpu":
        try:
            from gpuclust.backends import get_backend

            cp = get_backend("gpu").xp
            name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
            return name.decode() if isinstance(name, bytes) else str(name)
        except Exception as e:  # noqa: BLE001 - a description, never a failure
            return f"GPU (not described: {type(e).__name__})"
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU: {model}, {os.cpu_count()} logical cores"


def subject(run: dict[str, Any], facts: dict[str, Any]) -> str:
    """Which data a figure shows, in a few words: ``dataset NAME · cell C · 2019 (v3)``."""
    path = Path(str(run.get("dataset") or facts.get("path") or "?"))
    name = f"{path.parent.name}/{path.name}" if path.parent.name else path.name  # "ds" alone says little
    version = run.get("trace_version") or facts.get("trace_version")
    year = {"v3": "2019 trace (v3)", "v2": "2011 trace (v2)"}.get(str(version), f"trace {version or 'unknown'}")
    cell = facts.get("cell")
    return " · ".join([f"dataset {name}", *([f"cell {cell}"] if cell else []), year])


def _span_text(facts: dict[str, Any]) -> str:
    """Per table with rows: its time span in trace hours (from the Parquet statistics; a time
    before the trace start, such as the sentinel 0, counts as the start, 2^63-1 as unknown)."""
    parts = []
    for t, v in (facts.get("tables") or {}).items():
        lo, hi = v.get("time_min"), v.get("time_max")
        if not v.get("rows") or lo is None or hi is None:
            continue
        a = float(trace_hours(max(int(lo), TRACE_OFFSET_US)))
        b = "after the trace (2^63-1)" if int(hi) >= TIME_AFTER_TRACE else f"{float(trace_hours(int(hi))):.2f}"
        parts.append(f"{t} {a:.2f} to {b}")
    return ("trace hours (trace time; the trace starts at 0.17 h): " + "; ".join(parts)) if parts else "unknown"


def _selection_text(sel: Any) -> str:
    """``[FROM, TO)`` of a run's time selection, with its trace hours."""
    if not isinstance(sel, dict):
        return str(sel)

    def hours(us: Any) -> str:
        return "the end" if us is None else f"{float(trace_hours(int(us))):.2f} h"

    text = f"[{sel.get('from') or 'start'}, {sel.get('to') or 'end'})"
    if "from_us" in sel or "to_us" in sel:
        text += f", trace hours {hours(sel.get('from_us', TRACE_OFFSET_US))} to {hours(sel.get('to_us'))}"
    if sel.get("time_zone"):
        text += f" (wall-clock in {sel['time_zone']})"
    return text


def _sample_text(run: dict[str, Any], facts: dict[str, Any], manifest_synthetic: bool) -> str:
    parts = []
    sel = facts.get("selection")
    if sel:
        parts.append(f"chosen at ingest: {sel.get('text', sel)}")
    if run.get("selection"):
        parts.append(f"time selection of this run: {_selection_text(run['selection'])}")
    if manifest_synthetic:
        parts.append("a synthetic cell (gpuclust synth)")
    return "; ".join(parts) or "the whole dataset (no sample or selection)"


def provenance_rows(run: dict[str, Any], facts: dict[str, Any], results: str | Path) -> list[tuple[str, str]]:
    """(label, text) rows of the report's provenance table."""
    from gpuclust import __version__

    synthetic = False
    if facts.get("path"):
        try:
            synthetic = "synthetic" in json.loads((Path(facts["path"]) / "manifest.json").read_text())
        except (OSError, ValueError):
            pass
    tiers = facts.get("tier_map_tiers") or {}
    tier_text = ", ".join(f"{k} ≥ {v}" for k, v in sorted(tiers.items(), key=lambda kv: kv[1]))
    options = "\n".join(
        f"{a['label']}: " + (", ".join(f"{k}={json.dumps(v)}" for k, v in a["options"].items()) or "no options")
        for a in run.get("analyses", [])
    )
    backend = run.get("backend", "?")
    req = run.get("backend_requested")
    run_args = {k: run.get(k) for k in ("scheduler", "partitions", "workers", "memory_limit") if k in run}
    rows = [
        ("dataset", str(run.get("dataset"))),
        ("trace version", str(run.get("trace_version") or facts.get("trace_version") or "unknown")),
        ("cell(s)", ", ".join(run["cells"]) if run.get("cells") else str(facts.get("cell") or "not recorded")),
        ("tier map", f"{facts.get('tier_map') or 'none recorded'}" + (f" ({tier_text})" if tier_text else "")),
        ("time span", _span_text(facts)),
        ("sample", _sample_text(run, facts, synthetic)),
        ("results", f"{Path(results).absolute()} (written {run.get('finished', '?')} in {run.get('seconds', '?')} s)"),
        (
            "gpuclust",
            f"results by gpuclust {run.get('gpuclust_version', '?')}; page by gpuclust {__version__}, "
            f"commit {code_commit()}",
        ),
        ("options", options),
        ("run", ", ".join(f"{k}={v}" for k, v in run_args.items()) or "defaults"),
        ("backend", backend + (f" (asked: {req})" if req and req != backend else "")),
        ("device", device_text(str(backend)) + " (this machine)"),
    ]
    if run.get("notes"):
        rows.append(("notes", "\n".join(map(str, run["notes"]))))
    return rows
