"""``report.html``: one self-contained page for a results folder (no network at view time).

The page holds the provenance of the results, then one section per analysis (data quality first,
:data:`gpuclust.report.sections.ORDER`): a caption saying what the figure shows, the figure as inline
SVG (hover shows the data coordinates: a few lines of inline script, :file:`assets/report.js`; no
drag-to-zoom, which would crop the axes and labels away: the browser's zoom enlarges the whole figure) and the key numbers as a table; an analysis with nothing to plot
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
    more = (
        f'<p class="note">The first {MAX_ROWS} of {len(df):,} rows; every row is in the results folder '
        "(or <code>--format csv</code>).</p>"
        if len(df) > MAX_ROWS
        else ""
    )
    if len(df.columns) > 8:  # every column is there; a narrow window scrolls the table
        more = f'<p class="note">{len(df.columns)} columns: scroll the table sideways to see them all.</p>' + more
    df = df.head(MAX_ROWS)
    text_cols = {c for c in df.columns if not pd.api.types.is_numeric_dtype(df[c])}
    head = "".join(f'<th class="{"t" if c in text_cols else ""}">{html.escape(str(c))}</th>' for c in df.columns)
    rows = []
    for rec in df.itertuples(index=False):
        cells = "".join(
            f'<td class="{"t" if c in text_cols else ""}">{html.escape(format_value(v))}</td>'
            for c, v in zip(df.columns, rec, strict=True)
        )
        rows.append(f"<tr>{cells}</tr>")
    return f'<div class="key-wrap"><table class="key"><tr>{head}</tr>{"".join(rows)}</table></div>{more}'


#: The folder inside a results folder where the page keeps the figures it drew (see :class:`FigureCache`).
FIGURES_DIR = "_figures"
_NONE = "no figure"


def _code_fingerprint() -> str:
    """What else a figure depends on besides its results: the gpuclust version, the report code
    (every module of this package) and the matplotlib version."""
    import hashlib
    from importlib import metadata

    from gpuclust import __version__

    h = hashlib.sha256(__version__.encode())
    for f in sorted(Path(__file__).parent.glob("*.py")):
        h.update(f.name.encode() + f.read_bytes())
    try:
        h.update(metadata.version("matplotlib").encode())
    except metadata.PackageNotFoundError:
        pass
    return h.hexdigest()


class FigureCache:
    """The figures of a results folder's page, kept in ``<results>/_figures/<key>.svg``, each under
    a key made of the results' ``_run.json``, the analysis, the figure's title and the report code
    (:func:`_code_fingerprint`): a page over results that are still valid reuses them instead of
    drawing them again.  The folder goes with its results (a new run replaces the whole results
    folder); a folder that cannot be written just means the figures are drawn every time."""

    def __init__(self, folder: Path | None, run: Mapping[str, Any]):
        import hashlib
        import json

        self.folder = folder
        self.base = hashlib.sha256((json.dumps(run, sort_keys=True, default=str) + _code_fingerprint()).encode())
        self.hits = 0

    def _tag(self, key: str, name: str, title: str) -> str:
        h = self.base.copy()
        h.update("\0".join((key, name, title)).encode())
        return f"<!-- gpuclust figure {h.hexdigest()} -->\n"

    def get(self, key: str, name: str, title: str) -> str | None:
        """The cached SVG text (``""``: the analysis had nothing to plot), or ``None`` when not cached."""
        if self.folder is None:
            return None
        try:
            text = (self.folder / f"{key}.svg").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        tag = self._tag(key, name, title)
        if not text.startswith(tag):
            return None
        self.hits += 1
        body = text[len(tag) :]
        return "" if body == _NONE else body

    def put(self, key: str, name: str, title: str, svg: str | None) -> None:
        if self.folder is None:
            return
        from gpuclust._files import write_atomic

        text = self._tag(key, name, title) + (_NONE if svg is None else svg)
        try:
            write_atomic(self.folder / f"{key}.svg", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
        except OSError:  # a read-only results folder: draw again next time
            pass


def _figure(
    name: str, key: str, tables: Mapping[str, Any], title: str, tmp: Path, index: int, cache: FigureCache | None = None
) -> str | None:
    """The figure of one analysis as inline SVG, or ``None`` when it has nothing to plot; taken
    from ``cache`` when it holds it (else drawn, and put there)."""
    from gpuclust.report.svg import inline_svg

    text = cache.get(key, name, title) if cache is not None else None
    if text is None:
        from gpuclust.report.plots import plot_result

        path = tmp / f"{index}.svg"
        text = path.read_text(encoding="utf-8") if plot_result(name, dict(tables), path, title=title) else ""
        if cache is not None:
            cache.put(key, name, title, text or None)
    if not text:
        return None
    svg = inline_svg(text, f"f{index}-")
    svg = svg.replace("<svg ", f'<svg role="img" aria-label="{html.escape(title, quote=True)}" ', 1)
    return (
        f'<figure class="plot" data-figure="{html.escape(key)}">{svg}'
        "<figcaption>Hover for values; the browser&rsquo;s zoom (Ctrl +) enlarges the figure, axes and labels "
        "included.</figcaption></figure>"
    )


def render_page(
    run: dict[str, Any],
    results: Mapping[str, Mapping[str, Any]],
    results_dir: Path,
    *,
    facts: dict[str, Any] | None = None,
    summary_text: str = "",
    progress: Callable[[str], None] | None = None,
    figures: FigureCache | None = None,
) -> tuple[str, int]:
    """The page's HTML and the number of figures in it; ``figures``: where to reuse (and keep) the
    figures drawn."""
    from gpuclust.report.provenance import provenance_rows, subject

    facts = facts or {}
    who = subject(run, facts)
    clock = _time_zero_attrs(run, facts)
    keys, sections, nav, n_fig = _analysis_sections(run, results, who, progress, figures)
    claims_html = _claims_section(run, results)
    if claims_html:
        nav.insert(0, '<a href="#claims">claims</a>')
        sections.insert(0, claims_html)
    prov = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
        for k, v in provenance_rows(run, facts, results_dir)
    )
    summary = (
        f"<details><summary>Text summary of every analysis (summary.txt)</summary><pre>"
        f"{html.escape(summary_text)}</pre></details>"
        if summary_text
        else ""
    )
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


def _time_zero_attrs(run: dict[str, Any], facts: dict[str, Any]) -> str:
    """The body's time-axis label and the wall clock (ms) of trace time 0: 600 s before the trace's
    start; "" for an unknown trace version."""
    from gpuclust.report.axes import TIME_LABEL
    from gpuclust.schema import TRACE_OFFSET_US
    from gpuclust.trace_time import TRACE_START

    start = TRACE_START.get(str(run.get("trace_version") or facts.get("trace_version")))
    if start is None:
        return ""
    return (
        f' data-time-label="{html.escape(TIME_LABEL)}" '
        f'data-time-zero-ms="{int(start.timestamp() * 1000) - TRACE_OFFSET_US // 1000}"'
    )


def _analysis_sections(
    run: dict[str, Any],
    results: Mapping[str, Mapping[str, Any]],
    who: str,
    progress: Callable[[str], None] | None,
    figures: FigureCache | None,
) -> tuple[list[str], list[str], list[str], int]:
    """The analyses' keys in page order, a section (figure or why none, caption, key numbers) and a
    navigation link for each, and the number of figures drawn."""
    from gpuclust.report.sections import caption, empty_reason, key_numbers, ordered

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
                fig = _figure(name, key, tables, f"{label_of[key]} · {who}", Path(tmp), i, figures)
                why = empty_reason(name, tables, selection=run.get("selection"))
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
                f"<h3>Key numbers</h3>{_table(key_numbers(name, tables))}</section>"
            )
    return keys, sections, nav, n_fig


def _claims_section(run: dict[str, Any], results: Mapping[str, Mapping[str, Any]]) -> str:
    """The published claims (:mod:`gpuclust.claims`) whose analyses, with the options each claim
    asks for, are in this report: the paper's value beside the dataset's, supported or why not;
    "" when none is (or the dataset is gone)."""
    from gpuclust.analyses.registry import create
    from gpuclust.claims import DatasetFacts, claims, evaluate

    labels = {a.get("label", a["key"]): a["key"] for a in run.get("analyses", [])}
    by_name: dict[str, Mapping[str, Any]] = {}
    chosen, left = [], 0
    for c in claims():
        keys = [labels.get(create(n, **o).label) for n, o in c.analyses]
        if all(k is not None and k in results for k in keys):
            chosen.append(c)
            for (n, _), k in zip(c.analyses, keys, strict=True):
                by_name[n] = results[str(k)]
        else:
            left += 1
    if not chosen or not run.get("dataset"):
        return ""
    try:
        facts = DatasetFacts.of(run["dataset"])
    except Exception:  # noqa: BLE001 - the dataset moved or changed: the page goes without the section
        return ""
    body = "".join(
        f'<tr><td class="t">{html.escape(r["claim"])}<br><small>{html.escape(r["source"])}</small></td>'
        f'<td class="t">{html.escape(r["paper"])}</td><td class="t">{html.escape(r["dataset"])}</td>'
        f'<td class="t">{"supported" if r["supported"] else html.escape("cannot compare: " + r["why"])}</td></tr>'
        for r in evaluate(by_name, facts, chosen)
    )
    more = (
        f'<p class="note">{left} more claim(s) read analyses or options not in this report: '
        "<code>gpuclust claims DATASET</code> computes every one (docs/user/claims.md).</p>"
        if left
        else ""
    )
    return (
        f'<section id="claims"><h2>Published claims on this dataset</h2><div class="key-wrap"><table class="key">'
        f'<tr><th class="t">claim (source)</th><th class="t">paper</th><th class="t">this dataset</th>'
        f'<th class="t">comparison</th></tr>{body}</table></div>{more}</section>'
    )


def _size_text(n: int) -> str:
    return f"{n / 1024:.0f} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.1f} MiB"


def write_report(
    results_dir: str | Path,
    out: str | Path,
    *,
    keys: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> PageResult:
    """Render the results folder ``results_dir`` (written by ``gpuclust analyze``) as the page
    ``out``, written atomically; ``keys``: only these results (default: all)."""
    from gpuclust._files import write_atomic
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
    page, n_fig = render_page(
        run,
        results,
        results_dir,
        facts=dataset_facts(run.get("dataset")),
        summary_text=summary,
        progress=progress,
        figures=FigureCache(results_dir / FIGURES_DIR, run),
    )
    size = len(page.encode("utf-8"))
    page = page.replace("PAGE_SIZE_PLACEHOLDER", _size_text(size))
    data = page.encode("utf-8")
    try:
        write_atomic(Path(out), lambda tmp: Path(tmp).write_bytes(data))
    except OSError as e:
        raise OutputError(out, e) from None
    return PageResult(Path(out), len(data), n_fig, len(results))
