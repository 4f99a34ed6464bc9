"""`gpuclust report` as a command: reuse of a matching results folder, CSV export, one-line errors;
and the SVG and plot helpers the page is built from."""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from cli_cells import gpuclust as _gpuclust
from small_cell import small_cell, writable_copy


@pytest.fixture(scope="module")
def cell(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 12-machine, 1 h synthetic cell (``raw``, ingested as ``ds``): this module's own copy of
    ``small_cell``'s, made once per run (the tests write beside it, re-ingest it, touch it)."""
    return writable_copy(small_cell(tmp_path_factory), tmp_path_factory.mktemp("cell") / "cell")


@pytest.fixture(scope="module")
def first_report(cell: Path) -> Path:
    """``gpuclust report ds cell-usage machine-shapes --out first/page.html``: the folder with the
    page and its results (``page-results``), which the tests below copy as their first report."""
    first = _gpuclust("report", "ds", "cell-usage", "machine-shapes", "--out", "first/page.html", "--quiet", cwd=cell)
    assert first.returncode == 0, first.stderr[-2000:]
    assert (cell / "first" / "page-results" / "_run.json").is_file() and (cell / "first" / "page.html").is_file()
    return cell / "first"


def test_reuses_matching_results_and_reruns_otherwise(cell: Path, first_report: Path) -> None:
    """A report over the results of one with more analyses reuses them; other options, ``--rerun``
    or a dataset written after them run anew."""
    shutil.copytree(first_report, cell / "r")  # the first report, as if made with --out r/page.html
    again = _gpuclust("report", "ds", "machine-shapes", "--out", "r/page.html", "--quiet", cwd=cell)
    assert again.returncode == 0 and "reusing the results" in again.stderr, again.stderr
    page = (cell / "r" / "page.html").read_text()
    assert 'id="a-machine-shapes"' in page and 'id="a-cell-usage"' not in page  # only what was asked for
    other = _gpuclust("report", "ds", "cell-usage", "-O", "mode=exact", "--out", "r/page.html", "--quiet", cwd=cell)
    assert other.returncode == 0 and "reusing" not in other.stderr, other.stderr
    forced = _gpuclust("report", "ds", "cell-usage", "-O", "mode=exact", "--out", "r/page.html", "--rerun", cwd=cell)
    assert forced.returncode == 0 and "--rerun" in forced.stderr, forced.stderr
    # a dataset written after the results: run anew
    written_at = (cell / "ds" / "manifest.json").stat().st_mtime
    later_time = time.time() + 5  # run times are recorded to the second
    os.utime(cell / "ds" / "manifest.json", (later_time, later_time))
    try:
        later = _gpuclust("report", "ds", "cell-usage", "-O", "mode=exact", "--out", "r/page.html", cwd=cell)
    finally:
        os.utime(cell / "ds" / "manifest.json", (written_at, written_at))
    assert later.returncode == 0 and "written after those results" in later.stderr, later.stderr


def test_csv_export_matches_the_parquet_results(cell: Path) -> None:
    r = _gpuclust(
        "report",
        "ds",
        "overcommit",
        "machine-shapes",
        "--format",
        "csv",
        "--out",
        "csv",
        "--results",
        "res",
        "--quiet",
        cwd=cell,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res, out = cell / "res", cell / "csv"
    assert (out / "_run.json").read_text() == (res / "_run.json").read_text()
    tables = sorted(p.relative_to(res) for p in res.glob("*/*") if p.suffix == ".parquet" or p.is_dir())
    assert tables and sorted(p.relative_to(out) for p in out.glob("*/*.csv")) == [t.with_suffix(".csv") for t in tables]
    for t in tables:
        want = pq.read_table(res / t).to_pandas() if t.suffix else pq.ParquetDataset(res / t).read().to_pandas()
        with open(out / t.with_suffix(".csv"), newline="") as f:
            rows = list(csv.reader(f))
        assert rows[0] == list(want.columns), t
        assert len(rows) - 1 == len(want), t
        for col in want.select_dtypes("number").columns[:3]:  # numbers as written, NULL as an empty cell
            got = np.array([float(x[rows[0].index(col)] or "nan") for x in rows[1:]])
            np.testing.assert_allclose(got, want[col].to_numpy(dtype=float), rtol=1e-12, equal_nan=True)
    again = _gpuclust(
        "report",
        "ds",
        "overcommit",
        "machine-shapes",
        "--format",
        "csv",
        "--out",
        "csv",
        "--results",
        "res",
        "--quiet",
        cwd=cell,
    )
    assert again.returncode == 0 and "reusing" in again.stderr, again.stderr


def test_a_report_over_valid_results_reuses_results_and_figures(
    cell: Path, first_report: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 33: a second report over results that are still valid neither runs an analysis nor
    draws a figure (the page keeps its figures in <results>/_figures); a re-ingest that ingests
    nothing leaves manifest.json as it was (bytes and mtime), so the report after it reuses too; and
    the CSV export reuses the results folder the page wrote instead of computing a second one."""
    import gpuclust.report.analyze as report_analyze
    from gpuclust.cli import main
    from gpuclust.report import plots

    shutil.copytree(first_report, cell / "reuse")  # the first report, as if made with --out reuse/page.html
    page = cell / "reuse" / "page.html"
    drawn = re.findall(r'<figure class="plot" data-figure="[^"]+">.*?</figure>', page.read_text(), re.S)
    assert len(drawn) == 2
    manifest = cell / "ds" / "manifest.json"
    before = (manifest.read_bytes(), manifest.stat().st_mtime_ns)
    again = _gpuclust("ingest", "raw", "--out", "ds", cwd=cell)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (manifest.read_bytes(), manifest.stat().st_mtime_ns) == before, "a no-op re-ingest rewrote manifest.json"

    def forbidden(*args: object, **kwargs: object) -> bool:
        raise AssertionError("called on results that are still valid")

    monkeypatch.setattr(report_analyze, "analyze", forbidden)
    monkeypatch.setattr(plots, "plot_result", forbidden)
    monkeypatch.chdir(cell)
    page.unlink()
    assert main(["report", "ds", "cell-usage", "machine-shapes", "--out", "reuse/page.html"]) == 0
    assert "reusing the results in reuse/page-results" in capsys.readouterr().err
    assert re.findall(r'<figure class="plot" data-figure="[^"]+">.*?</figure>', page.read_text(), re.S) == drawn
    assert main(["report", "ds", "cell-usage", "--format", "csv", "--out", "reuse/csv"]) == 0
    assert f"reusing the results in {cell / 'reuse' / 'page-results'}" in capsys.readouterr().err
    assert (cell / "reuse" / "csv" / "cell-usage" / "usage.csv").is_file()
    assert sorted(p.name for p in (cell / "reuse").iterdir()) == ["csv", "page-results", "page.html"]


@pytest.mark.parametrize(
    "args, message",
    [
        (("no-such-dataset", "--out", "x.html"), "no-such-dataset"),
        (("ds", "cell-usage", "-O", "nonsense=1", "--out", "x.html"), "nonsense"),
        (("ds", "cell-usage", "--out", "x.html", "--results", "x.html"), "must differ"),
        (("ds", "cell-usage", "--format", "csv", "--out", "raw"), "not gpuclust results"),
        (("ds", "cell-usage", "--out", "raw"), "is a folder"),
        (("ds", "no-such-analysis", "--out", "x.html"), "unknown analysis 'no-such-analysis'"),
    ],
)
def test_expected_faults_are_one_line(cell: Path, args: tuple[str, ...], message: str) -> None:
    r = _gpuclust("report", *args, "--quiet", cwd=cell)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("gpuclust report: error:")]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert not (cell / "x-results").exists() and not (cell / "raw-results").exists(), "computed before failing"


def test_inline_svg_prefixes_ids_and_drops_the_prolog() -> None:
    from gpuclust.report.svg import inline_svg

    svg = (
        '<?xml version="1.0"?>\n<!DOCTYPE svg>\n<svg width="720pt" height="324pt" viewBox="0 0 720 324">\n'
        ' <defs>\n  <clipPath id="p1"><rect x="1.12" y="2" width="3" height="4"/></clipPath>\n </defs>\n'
        ' <g id="figure_1"><path d="M 1.23 2.5 3 4" clip-path="url(#p1)"/>\n  <text x="1.23">0.0125</text></g>\n'
        "</svg>\n"
    )
    inl = inline_svg(svg, "f7-")
    assert inl.startswith("<svg ") and "<?xml" not in inl and 'width="720pt"' not in inl
    assert 'id="f7-p1"' in inl and "url(#f7-p1)" in inl and 'id="figure_1"' not in inl


def test_edge_buckets() -> None:
    from gpuclust.report.axes import edge_buckets, trace_hours

    h = 3_600_000_000
    starts = [0, h, 2 * h]
    assert [e[2] for e in edge_buckets(starts, h, None, 2 * h + 600_000_000)] == [
        "starts before the data",
        "ends after the data",
    ]
    assert edge_buckets([600_000_000, 600_000_000 + h], h, None, 600_000_000 + 2 * h) == []
    assert edge_buckets(starts, h)[-1][2] == "the data may end inside it"
    assert trace_hours(h) == pytest.approx(1.0)  # trace time, the buckets' and --from's origin
    assert trace_hours(600_000_000) == pytest.approx(1 / 6)  # the trace start


def test_every_section_states_what_it_shows() -> None:
    """Each registered analysis gets a caption (its own or the registry summary) and, where it
    has no figure module, a stated reason instead of a figure."""
    from gpuclust.analyses.registry import REGISTRY
    from gpuclust.report.sections import caption, empty_reason, has_figure, ordered

    for name in REGISTRY:
        assert len(caption(name)) > 30, name
        if not has_figure(name):
            assert "no figure" in empty_reason(name, {})
    keys = ordered(list(REGISTRY))
    assert keys[0] == "data-quality" if "data-quality" in REGISTRY else True
    assert re.match(r"^[a-z-]+$", "".join(keys))


def test_machine_heatmap_draws_the_heatmap_table_and_the_histogram_its_bins() -> None:
    """The figure takes overcommit's ``heatmap`` table as its image (bands x columns, in row
    order) with the columns' edges from their first bucket and width, and adds ``ratio_hist``'s
    0.01-wide bins into bars of whole bins up to the 99.9th percentile's bin (2 at least)."""
    import pyarrow as pa

    from gpuclust.report.overcommit_plots import machine_heatmap, ratio_bars

    w = 300_000_000
    heat = pa.table(
        {
            "band": [0, 0, 0, 1, 1, 1],
            "machines": [3, 3, 3, 2, 2, 2],
            "bucket": [4, 6, 8, 4, 6, 8],
            "bucket_start_us": [4 * w, 6 * w, 8 * w, 4 * w, 6 * w, 8 * w],
            "buckets": [2, 2, 1, 2, 2, 1],
            "alloc_ratio_cpu": [0.5, None, 0.7, 1.5, 1.25, None],
            "machine_buckets": [4, 0, 2, 3, 1, 0],
        }
    )
    image, edges, machines = machine_heatmap(heat, w)
    np.testing.assert_array_equal(image, [[0.5, np.nan, 0.7], [1.5, 1.25, np.nan]])
    assert edges.tolist() == [4 * w, 6 * w, 8 * w, 9 * w] and machines == 5
    assert machine_heatmap(heat.slice(0, 0), w) is None
    # 1,000 ratios: the 99.9th percentile's bin is [3.07, 3.08): bars of 4 fine bins up to 3.08
    lo = np.array([0.0, 0.99, 1.0, 3.07, 41.0])
    count = np.array([500, 300, 198, 1, 1])
    edges, bars = ratio_bars(lo, count)
    assert len(edges) == 78 and edges[1] == 0.04 and edges[-1] == 3.08
    assert bars[0] == 500 and bars[24] == 300 and bars[25] == 198 and bars[-1] == 1 and bars.sum() == 999  # 41 beyond


def test_a_figure_too_large_for_vectors_is_embedded_as_png(tmp_path: Path) -> None:
    from gpuclust.report.draw import Figure
    from gpuclust.report.svg import MAX_SVG_BYTES, inline_svg

    def figure(n: int) -> Figure:
        fig = Figure()
        (ax,) = fig.subplots()
        x = np.arange(n, dtype=np.float64)
        ax.scatter(x, np.sin(x / 500.0) + np.random.default_rng(1).random(x.size), size=2)  # a marker each
        ax.xlabel = "x"
        return fig

    figure(20_000).save(tmp_path / "big.svg")
    big = (tmp_path / "big.svg").read_text()
    assert 'data-raster="png"' in big and "data:image/png;base64," in big and len(big) < MAX_SVG_BYTES
    assert '"xlabel":"x"' in big.replace("&quot;", '"')  # hover still reads the axes
    figure(200).save(tmp_path / "vector.svg")
    assert "data-raster" not in (tmp_path / "vector.svg").read_text()
    assert inline_svg(big, "f1-").startswith('<svg class="figure-svg" ')


def test_a_section_with_nothing_to_plot_says_why(tmp_path: Path) -> None:
    import pandas as pd

    from gpuclust.report.html import render_page

    run = {
        "dataset": str(tmp_path / "gone"),
        "trace_version": "v3",
        "backend": "cpu",
        "analyses": [{"key": "cell-usage", "name": "cell-usage", "label": "cell-usage", "options": {}}],
    }
    usage = pd.DataFrame(
        {
            "bucket": pd.Series([], dtype="int64"),
            "bucket_start_us": pd.Series([], dtype="int64"),
            "tier": pd.Series([], dtype="object"),
            "cpu": pd.Series([], dtype="float64"),
            "mem": pd.Series([], dtype="float64"),
            "windows": pd.Series([], dtype="int64"),
        }
    )
    info = pd.DataFrame([{"tiers": "free,beb,mid,prod", "bucket_s": 3600}])
    page, figures = render_page(run, {"cell-usage": {"usage": usage, "info": info}}, tmp_path)
    assert figures == 0 and 'data-figures-expected="0"' in page
    assert "Nothing to plot: its result table(s) usage are empty" in page
    assert "instance_usage" in page.split("Nothing to plot", 1)[1].split("</p>", 1)[0]


def test_a_plot_that_fails_costs_its_figure_not_the_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pandas as pd

    from gpuclust.report import plots
    from gpuclust.report.html import render_page

    def broken(*args: object, **kwargs: object) -> bool:
        raise RuntimeError("boom")

    monkeypatch.setattr(plots, "plot_result", broken)
    run = {
        "dataset": None,
        "analyses": [{"key": "machine-shapes", "name": "machine-shapes", "label": "machine-shapes", "options": {}}],
    }
    shapes = pd.DataFrame({"cap_cpu": [0.5], "cap_mem": [0.25], "machines": [3]})
    page, figures = render_page(run, {"machine-shapes": {"shapes": shapes}}, tmp_path)
    assert figures == 0 and "The figure could not be drawn (RuntimeError: boom)" in page
    assert "0.5 / 0.25" in page  # the key numbers are still there
    assert "warning: machine-shapes" in capsys.readouterr().err


def test_figures_and_key_numbers_count_the_same(cell: Path) -> None:
    """Issue 33: the life-cycle legend says how many episodes its CDFs count, of the table's
    `episodes`; an unknown median says why; small shares keep their digits in the legend (0.2%, not
    0%); the data-quality panels have titles; the peak-prediction table has every column."""
    import html as html_lib

    from gpuclust.analyses.lifecycle import Lifecycle
    from gpuclust.dataset import Dataset
    from gpuclust.engine import run
    from gpuclust.report.axes import percent
    from gpuclust.report.html import render_page
    from gpuclust.tables import as_pandas

    names = ["lifecycle", "usage-vs-request", "data-quality", "peak-prediction"]
    res = {k: {t: as_pandas(v) for t, v in tables.items()} for k, tables in run(Dataset(cell / "ds"), names).items()}
    delays = res["lifecycle"]["delays"]
    gone = delays.index[(delays["measure"] == "execution") & (delays["outcome"] == "finish")][0]
    delays.loc[gone, ["with_duration", "p50_s", "p90_s", "p99_s", "max_s"]] = [0, np.nan, np.nan, np.nan, np.nan]
    res["lifecycle"]["delay_hist"] = res["lifecycle"]["delay_hist"].pipe(
        lambda h: h[
            ~((h["measure"] == "execution") & (h["outcome"] == "finish") & (h["tier"] == delays.at[gone, "tier"]))
        ]
    )
    run_info = {
        "dataset": str(cell / "ds"),
        "trace_version": "v3",
        "backend": "cpu",
        "analyses": [{"key": n, "name": n, "label": n, "options": {}} for n in names],
    }
    page, _ = render_page(run_info, res, cell)
    sections = {
        m.group(1): html_lib.unescape(m.group(0))
        for m in re.finditer(r'<section class="analysis" id="a-([^"]+)">.*?</section>', page, re.S)
    }
    life = sections["lifecycle"]
    shown = delays[(delays["measure"] == "scheduling") & (delays["outcome"] == "scheduled")]
    for r in shown.itertuples():
        assert f"{r.tier}: {r.with_duration:,} of {r.episodes:,}" in life, r  # the legend, against the table
    assert "<th >with_duration</th>" in life.replace('class=""', "")
    reason = "none of its episodes has a known duration"
    assert reason in life  # the table says why its quantiles are unknown
    assert f"median unknown: {reason}" in Lifecycle().summary(res["lifecycle"])
    uvr = sections["usage-vs-request"]
    for r in res["usage-vs-request"]["summary"].itertuples():
        if r.tier == "all" and r.above_limit_share > 0:
            assert f"all: {percent(r.above_limit_share)} above" in uvr, r
    small = res["usage-vs-request"]["summary"]["above_limit_share"]
    assert ((small > 0) & (small < 0.005)).any() and "0.2%" in percent(0.002) and percent(0.0) == "0%"
    if len(res["data-quality"]["max_over_p100"]):
        assert "max_cpu / cpu_p100 per usage window" in sections["data-quality"]
        assert "what each check flags, by table" in sections["data-quality"]
    peak = sections["peak-prediction"].split("Key numbers", 1)[1]
    for col in res["peak-prediction"]["summary"].columns:
        assert f">{col}</th>" in peak, col


def test_simple_figures_cost_no_matplotlib_or_pandas_import(cell: Path) -> None:
    """Issue 33: `gpuclust analyze` spent ~1.1 s of every run on importing matplotlib and pandas for
    its figures.  The figures of gpuclust.report.plots.NATIVE are drawn without either (PNG by
    Pillow, SVG as text), so a run of those analyses imports neither, and still writes its PNGs
    (the cpi and usage-distribution analyses import pandas themselves: their run imports no
    matplotlib)."""
    from gpuclust.report.plots import NATIVE

    assert {
        "cell-usage",
        "collection-lifecycle",
        "data-quality",
        "job-usage",
        "lifecycle",
        "machine-shapes",
        "machine-utilization",
        "peak-prediction",
        "usage-change",
        "usage-distribution",
        "usage-vs-request",
        "cpi",
        "overcommit",
    } <= NATIVE  # the figures moved off matplotlib stay off it
    own_pandas = {"cpi", "usage-distribution"}  # analyses that import pandas themselves (not for their figure)
    for names, loaded in ((sorted(NATIVE - own_pandas), "[]"), (sorted(NATIVE & own_pandas), "['pandas']")):
        code = (
            "import sys; from gpuclust.cli import main; "
            f"rc = main(['analyze', 'ds', *{names!r}, '--out', 'native', '--quiet', "
            # peak-prediction's oracle horizon inside the 1 h cell (the default 24 h censors every step: no figure)
            + ("'-O', 'horizon_s=1800'" if "peak-prediction" in names else "")
            + "]); "
            "print(rc, sorted(m for m in ('matplotlib', 'pandas') if m in sys.modules))"
        )
        r = subprocess.run([sys.executable, "-c", code], cwd=cell, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.strip().splitlines()[-1] == f"0 {loaded}", (names, r.stdout[-2000:])
        for name in names:
            png = (cell / "native" / name / f"{name}.png").read_bytes()
            assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000, name
            from PIL import Image

            assert Image.open(io.BytesIO(png)).convert("L").getextrema()[0] < 64, name  # decodes, and has ink
