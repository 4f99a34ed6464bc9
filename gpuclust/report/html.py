"""``report.html``: one self-contained page for a results folder (no network at view time).

The page holds the provenance of the results, then one section per analysis (data quality first,
:data:`gpuclust.report.sections.ORDER`): a caption saying what the figure shows, the figure as inline
SVG (hover shows the data coordinates, drag zooms, double-click resets: a few lines of inline
script, :file:`assets/report.js`) and the key numbers as a table; an analysis with nothing to plot
says why.  The page's script marks each figure it found drawn (``data-rendered``), the number of
them (``data-figures-rendered`` on ``<body>``, against ``data-figures-expected``) and any script
error (``data-errors``), which is what the browser test reads.
"""

from __future__ import annotations

import html
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from gpuclust._lazy import pandas as pd

__all__ = ["PageResult", "render_page", "write_report"]


@dataclass
class PageResult:
    """What :func:`write_report` wrote."""

    path: Path
    bytes: int
    figures: int
    sections: int


def _asset(name: str) -> str:
    return resources.files("gpuclust.report").joinpath("assets").joinpath(name).read_text(encoding="utf-8")


def _table(df: pd.DataFrame) -> str:
    from gpuclust.report.sections import MAX_ROWS, format_value

    if df.empty:
        return '<p class="note">No key numbers (the table is empty).</p>'
    more = (f'<p class="note">The first {MAX_ROWS} of {len(df):,} rows; every row is in the results folder '
            "(or <code>--format csv</code>).</p>" if len(df) > MAX_ROWS else "")
    df = df.head(MAX_ROWS)
    text_cols = {c for c in df.columns if not pd.api.types.is_numeric_dtype(df[c])}
    head = "".join(f'<th class="{"t" if c in text_cols else ""}">{html.escape(str(c))}</th>' for c in df.columns)
    rows = []
    for rec in df.itertuples(index=False):
        cells = "".join(f'<td class="{"t" if c in text_cols else ""}">{html.escape(format_value(v))}</td>'
                        for c, v in zip(df.columns, rec, strict=True))
        rows.append(f"<tr>{cells}</tr>")
    return f'<div class="key-wrap"><table class="key"><tr>{head}</tr>{"".join(rows)}</table></div>{more}'


def _figure(name: str, key: str, tables: Mapping[str, Any], title: str, tmp: Path, index: int) -> str | None:
    """The figure of one analysis as inline SVG, or ``None`` when it has nothing to plot."""
    from gpuclust.report.plots import plot_result
    from gpuclust.report.svg import inline_svg

    path = tmp / f"{index}.svg"
    if not plot_result(name, dict(tables), path, title=title):
        return None
    svg = inline_svg(path.read_text(encoding="utf-8"), f"f{index}-")
    svg = svg.replace("<svg ", f'<svg role="img" aria-label="{html.escape(title, quote=True)}" ', 1)
    return (f'<figure class="plot" data-figure="{html.escape(key)}">{svg}'
            f'<figcaption>Hover for values; drag to zoom, double-click to reset.</figcaption></figure>')


def render_page(run: dict[str, Any], results: Mapping[str, Mapping[str, Any]], results_dir: Path, *,
                facts: dict[str, Any] | None = None, summary_text: str = "",
                progress: Callable[[str], None] | None = None) -> tuple[str, int]:
    """The page's HTML and the number of figures in it."""
    from gpuclust.engine.selection import TRACE_START
    from gpuclust.report.axes import TIME_LABEL
    from gpuclust.report.provenance import provenance_rows, subject
    from gpuclust.report.sections import caption, empty_reason, key_numbers, ordered

    facts = facts or {}
    who = subject(run, facts)
    start = TRACE_START.get(str(run.get("trace_version") or facts.get("trace_version")))
    clock = (f' data-time-label="{html.escape(TIME_LABEL)}" data-trace-start-ms="{int(start.timestamp() * 1000)}"'
             if start is not None else "")
    name_of = {a["key"]: a["name"] for a in run.get("analyses", [])}
    label_of = {a["key"]: a.get("label", a["key"]) for a in run.get("analyses", [])}
    keys = ordered([k for k in results if k in name_of], name_of)
    sections, nav, n_fig = [], [], 0
    with tempfile.TemporaryDirectory(prefix="gpuclust-report-") as tmp:
        for i, key in enumerate(keys):
            name, tables = name_of[key], results[key]
            if progress is not None:
                progress(f"drawing {key} ({i + 1}/{len(keys)})")
            anchor = f"a-{key}"
            nav.append(f'<a href="#{html.escape(anchor)}">{html.escape(key)}</a>')
            try:
                fig = _figure(name, key, tables, f"{label_of[key]} · {who}", Path(tmp), i)
                why = empty_reason(name, tables)
            except Exception as e:  # noqa: BLE001 - one broken plot must not cost the whole page; said on it
                fig, why = None, f"The figure could not be drawn ({type(e).__name__}: {e}): a bug, please report it."
                print(f"gpuclust report: warning: {key}: {why}", file=sys.stderr, flush=True)
            if fig is None:
                fig = f'<p class="empty">{html.escape(why)}</p>'
            else:
                n_fig += 1
            sections.append(
                f'<section class="analysis" id="{html.escape(anchor)}"><h2>{html.escape(label_of[key])}</h2>'
                f'<p class="caption">{html.escape(caption(name))}</p>{fig}'
                f"<h3>Key numbers</h3>{_table(key_numbers(name, tables))}</section>")
    prov = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                   for k, v in provenance_rows(run, facts, results_dir))
    summary = (f"<details><summary>Text summary of every analysis (summary.txt)</summary><pre>"
               f"{html.escape(summary_text)}</pre></details>" if summary_text else "")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="gpuclust report">
<title>gpuclust report · {html.escape(who)}</title><style>{_asset("report.css")}</style></head>
<body data-figures-expected="{n_fig}"{clock}>
<header><h1>gpuclust report</h1><p class="sub">{html.escape(who)} · {len(keys)} analyses, {n_fig} figures</p>
<nav><a href="#provenance">provenance</a> {" ".join(nav)}</nav></header>
<main><section id="provenance"><h2>Provenance</h2><table class="prov">{prov}</table>{summary}</section>
{"".join(sections)}</main>
<footer><p>Written by <code>gpuclust report</code>: one file, no network needed to view it (figures are inline SVG,
the script is inline). Page size: PAGE_SIZE_PLACEHOLDER.</p></footer>
<script>{_asset("report.js")}</script>
</body></html>
"""
    return page, n_fig


def _size_text(n: int) -> str:
    return f"{n / 1024:.0f} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.1f} MiB"


def write_report(results_dir: str | Path, out: str | Path, *, keys: list[str] | None = None,
                 progress: Callable[[str], None] | None = None) -> PageResult:
    """Render the results folder ``results_dir`` (written by ``gpuclust analyze``) as the page
    ``out``, written atomically; ``keys``: only these results (default: all)."""
    from gpuclust.report._files import write_atomic
    from gpuclust.report.folder import OutputError
    from gpuclust.report.provenance import dataset_facts, load_results, read_run_file

    results_dir = Path(results_dir)
    run = read_run_file(results_dir)
    if run is None:
        raise OutputError(out, f"{results_dir} is not a gpuclust results folder (no readable _run.json)")
    results = load_results(results_dir, run)
    if keys is not None:
        results = {k: v for k, v in results.items() if k in keys}
    summary_path = results_dir / "summary.txt"
    summary = summary_path.read_text() if summary_path.is_file() else ""
    page, n_fig = render_page(run, results, results_dir, facts=dataset_facts(run.get("dataset")),
                              summary_text=summary, progress=progress)
    size = len(page.encode("utf-8"))
    page = page.replace("PAGE_SIZE_PLACEHOLDER", _size_text(size))
    data = page.encode("utf-8")
    try:
        write_atomic(Path(out), lambda tmp: Path(tmp).write_bytes(data))
    except OSError as e:
        raise OutputError(out, e) from None
    return PageResult(Path(out), len(data), n_fig, len(results))
