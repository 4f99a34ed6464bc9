"""``gpuclust info DATASET``: what a dataset holds, and whether to trust it, before analysing it.

Tables (rows, files, bytes, time span, layout), trace version, cell, tier map, ingest inputs and rejects,
completeness (manifest flag, failed inputs, part files missing on disk) and which registered
analyses it can run.  Everything comes from the manifest and the Parquet footers: no data is read,
so it is instant on a full cell.  Times are trace microseconds; the span comes from the Parquet
column statistics, so the sentinels 0 ("before the trace") and 2^63-1 ("after the trace") can
be its ends, and are labelled so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["dataset_info", "format_info", "main", "register"]

_TIME_COLUMNS = {"instance_usage": ("start_time", "end_time")}


def _span(files: list[Path], columns: tuple[str, ...]) -> tuple[int | None, int | None]:
    from gpuclust.dataset import open_parquet

    lo: int | None = None
    hi: int | None = None
    for f in files:
        md = open_parquet(f).metadata
        names = [md.schema.column(i).name for i in range(md.num_columns)]
        for rg in range(md.num_row_groups):
            for c in columns:
                if c not in names:
                    continue
                st = md.row_group(rg).column(names.index(c)).statistics
                if st is None or not st.has_min_max:
                    continue
                lo = int(st.min) if lo is None else min(lo, int(st.min))
                hi = int(st.max) if hi is None else max(hi, int(st.max))
    return lo, hi


def _tiers(entry: Any, name: str | None) -> dict[str, int] | None:
    """Tier name -> lowest priority: the manifest's own record, else the named map's."""
    from gpuclust.schema import TIER_MAPS

    if isinstance(entry, dict) and entry.get("tiers"):
        return dict(entry["tiers"])
    tm = TIER_MAPS.get(name or "")
    return dict(zip(tm.names, tm.bounds, strict=True)) if tm else None


def dataset_info(path: str | Path) -> dict[str, Any]:
    """The facts ``gpuclust info`` prints, as a JSON-ready dict; :class:`~gpuclust.dataset.DatasetError`
    when ``path`` is not a dataset."""
    from gpuclust.analyses.registry import REGISTRY
    from gpuclust.dataset import REJECTS_DIR, Dataset
    from gpuclust.engine.checks import tier_map_note
    from gpuclust.schema import TABLES

    ds = Dataset(path, allow_incomplete=True)
    m = ds.manifest
    tables: dict[str, Any] = {}
    missing_files: list[str] = []
    for t in TABLES:
        files = ds.files(t)
        present = [f for f in files if f.is_file()]
        missing_files += [str(f.relative_to(ds.path)) for f in files if not f.is_file()]
        lo, hi = _span(present, _TIME_COLUMNS.get(t, ("time",)))
        tables[t] = {
            "rows": ds.num_rows(t),
            "files": len(files),
            "bytes": sum(f.stat().st_size for f in present),
            "time_min": lo,
            "time_max": hi,
            "layout": ds.layout(t),
        }
    inputs = list(m.get("inputs", {}).values())
    failed = [
        {"path": i.get("path"), "status": i.get("status"), "error": i.get("error")}
        for i in inputs
        if i.get("status") != "done"
    ]
    rejects_dir = ds.path / REJECTS_DIR
    rejected = {
        i.get("path"): {"rows": int(i.get("rows_rejected") or 0), "reasons": i.get("first_reasons") or []}
        for i in inputs
        if i.get("rows_rejected")
    }
    analyses = {}
    for name, e in sorted(REGISTRY.items()):
        required, optional = e.cls().needed_tables()  # with its default options
        lacking = [f"{t} ({required[t]})" if required[t] else t for t in required if not ds.num_rows(t)]
        thin = [t for t in optional if not ds.num_rows(t)]
        analyses[name] = (
            ("needs " + ", ".join(lacking)) if lacking else ("runs without " + ", ".join(thin) if thin else "runs")
        )
    tm = ds.tier_map_name
    return {
        "path": str(ds.path.absolute()),
        "dataset_format_version": m.get("dataset_format_version"),
        "trace_version": ds.trace_version,
        "cell": m.get("cell"),
        "tier_map": tm,
        "tier_map_tiers": _tiers(m.get("tier_map"), tm),
        "tier_map_warning": tier_map_note(tm, ds),
        "selection": m.get("selection"),
        "tables": tables,
        "inputs": {
            "files": len(inputs),
            "done": len(inputs) - len(failed),
            "rows_read": sum(int(i.get("rows_read") or 0) for i in inputs),
            "rows_deduplicated": sum(int(i.get("rows_deduplicated") or 0) for i in inputs),
        },
        "rejects": {
            "rows": sum(r["rows"] for r in rejected.values()),
            "by_input": rejected,
            "folder": str(rejects_dir) if rejects_dir.is_dir() else None,
        },
        "complete": bool(m.get("complete")) and not failed and not missing_files,
        "manifest_complete": bool(m.get("complete")),
        "failed_inputs": failed,
        "missing_files": missing_files,
        "analyses": analyses,
    }


def _time(us: int | None) -> str:
    from gpuclust.schema import TIME_AFTER_TRACE, TRACE_OFFSET_US

    if us is None:
        return "-"
    if us == TIME_AFTER_TRACE:
        return "2^63-1 (after the trace)"
    if us == 0:
        return "0 (before the trace)"
    return f"{us:,} us (day {(us - TRACE_OFFSET_US) / 86_400e6:.2f})"


def format_info(d: dict[str, Any]) -> str:
    """The plain-text report of :func:`dataset_info`."""
    tiers = ", ".join(f"{k} >= {v}" for k, v in sorted((d["tier_map_tiers"] or {}).items(), key=lambda kv: kv[1]))
    lines = [
        f"dataset      {d['path']}",
        f"trace        {d['trace_version'] or 'unknown'}   cell {d['cell'] or 'not recorded'}   "
        f"format {d['dataset_format_version']}",
        f"tier map     {d['tier_map'] or 'none recorded'}" + (f" ({tiers})" if tiers else ""),
    ]
    if d["tier_map_warning"]:
        lines.append(f"             {d['tier_map_warning']}")
    if d.get("selection"):
        lines.append(f"selection    {d['selection'].get('text')} (chosen at ingest: a part of the cell)")
    lay = {t: v["layout"] for t, v in d["tables"].items() if v.get("layout")}
    if lay:
        groups: dict[tuple[str, int], list[str]] = {}
        for t, v in lay.items():
            groups.setdefault((",".join(v["key"]), int(v["buckets"])), []).append(t)
        lines.append(
            "layout       bucketed: "
            + "; ".join(f"{', '.join(ts)} by {k} into {n} buckets" for (k, n), ts in groups.items())
        )
    else:
        lines.append(
            "layout       flat (as read; `gpuclust optimize` lays it out by key, as ingest does by default; "
            "docs/user/scale.md)"
        )
    lines.append("tables       rows          files  MB        time span (trace us)")
    for t, v in d["tables"].items():
        span = f"{_time(v['time_min'])} .. {_time(v['time_max'])}" if v["rows"] else ""
        lines.append(f"  {t:<20} {v['rows']:>13,} {v['files']:>5}  {v['bytes'] / 1e6:>8.1f}  {span}")
    i, r = d["inputs"], d["rejects"]
    lines.append(
        f"inputs       {i['files']} file(s), {i['done']} done; {i['rows_read']:,} rows read, "
        f"{i['rows_deduplicated']:,} duplicates dropped"
    )
    lines.append(f"rejects      {r['rows']:,} row(s)" + (f" (raw records in {r['folder']})" if r["folder"] else ""))
    for p, v in r["by_input"].items():
        lines.append(f"  {p}: {v['rows']:,}" + (f" - {'; '.join(map(str, v['reasons'][:3]))}" if v["reasons"] else ""))
    state = "yes" if d["complete"] else "NO"
    lines.append(f"complete     {state}" + ("" if d["manifest_complete"] else " (ingest has not finished: re-run it)"))
    for f in d["failed_inputs"]:
        lines.append(f"  failed input {f['path']}: {f['status']} {f['error'] or ''}".rstrip())
    for f in d["missing_files"]:
        lines.append(f"  missing part file {f}")
    lines.append("analyses")
    lines += [f"  {n:<20} {s}" for n, s in d["analyses"].items()]
    return "\n".join(lines) + "\n"


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``info`` sub-command."""
    p = subparsers.add_parser(
        "info",
        help="what a dataset holds: tables, rows, time span, rejects, completeness",
        description="Describe a canonical dataset from its manifest and Parquet footers "
        "(reads no data): tables, rows, files, time span, trace version, cell, tier map, "
        "rejects, completeness and which analyses it can run.",
    )
    p.add_argument("dataset", metavar="DATASET", help="canonical dataset folder (from `gpuclust ingest`)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from gpuclust.dataset import DatasetError

    try:
        d = dataset_info(args.dataset)
    except (DatasetError, OSError) as e:
        print(f"gpuclust info: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(json.dumps(d, indent=1) if args.json else format_info(d), end="\n" if args.json else "")
    return 0
