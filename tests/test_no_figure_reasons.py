"""A run with nothing to plot says the real reason, at the command line and on the report page:
peak-prediction's horizon longer than the data (the span, and the horizon to pass), an option that
asks for no plotted output (cpi's ``regression=none``), a time selection outside the data (the
data's span) -- never "the dataset has no rows this analysis can use" for those."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from cli_cells import gpuclust as _gpuclust
from small_cell import linked, small_cell

NO_ROWS = "the dataset has no rows"


@pytest.fixture(scope="module")
def cell(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-hour synthetic cell (usage windows start from 600 s of trace time), ingested as ``ds``
    (``small_cell``'s, made once per run and linked into this module's folder)."""
    return linked(small_cell(tmp_path_factory), tmp_path_factory.mktemp("cell"))


def _section(page: str, key: str) -> str:
    start = page.index(f'id="a-{key}"')
    return html.unescape(page[start : page.index("</section>", start)])


def test_peak_prediction_says_the_span_and_the_horizon_to_pass(cell: Path) -> None:
    r = _gpuclust("analyze", "ds", "peak-prediction", "--out", "pp", cwd=cell)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(
        r"every machine-step is censored: the usage spans 1 h \(5-minute steps (\d+) to (\d+)\), no more "
        r"than the 24 h horizon the oracle looks ahead; pass -O horizon_s=(\d+) \(half the span\)",
        r.stdout,
    )
    assert m, r.stdout
    assert r.stdout.count("every machine-step is censored") == 1 and NO_ROWS not in r.stdout, r.stdout
    first, last, horizon = (int(x) for x in m.groups())
    assert (first, last) == (2, 13) and horizon == 1800  # 600 s to 1 h 10 min: 12 steps, half of them
    assert not (cell / "pp" / "peak-prediction" / "peak-prediction.png").exists()
    # what it says to pass scores the predictors and draws the figure
    again = _gpuclust("analyze", "ds", "peak-prediction", "-O", f"horizon_s={horizon}", "--out", "pp2", cwd=cell)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "censored: the usage spans" not in again.stdout and "violation rate unknown" not in again.stdout
    assert (cell / "pp2" / "peak-prediction" / "peak-prediction.png").is_file()
    # the report's section says the same where the figure would be
    page = _gpuclust("report", "ds", "peak-prediction", "--out", "pp.html", "--quiet", cwd=cell)
    assert page.returncode == 0, page.stderr[-2000:]
    section = _section((cell / "pp.html").read_text(), "peak-prediction")
    assert f"Nothing to plot: {m.group(0)}" in section and NO_ROWS not in section, section[:3000]


def test_an_option_that_asks_for_no_plotted_output_is_named(cell: Path) -> None:
    r = _gpuclust(
        "analyze",
        "ds",
        "cpi",
        "-O",
        "by=machine",
        "-O",
        "regression=none",
        "-O",
        "spearman=none",
        "--out",
        "r4b",
        cwd=cell,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Nothing to plot: the option regression=none asks for no regression" in r.stdout, r.stdout
    assert NO_ROWS not in r.stdout


@pytest.mark.parametrize(
    ("when", "where"),
    [(("--from", "100h"), "starts after the data's end"), (("--to", "5min"), "ends before the data's start")],
)
def test_a_selection_outside_the_data_says_the_data_span(cell: Path, when: tuple[str, str], where: str) -> None:
    r = _gpuclust("analyze", "ds", "cell-usage", *when, "--out", "sel", cwd=cell)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(
        rf"Nothing to plot: the time selection {' '.join(when)} {where}: the dataset's instance_usage "
        r"start_time runs from 600s \(0\.17 h\) to (\d+)s \((\d+\.\d\d) h\) of trace time",
        r.stdout,
    )
    assert m and 600 < int(m.group(1)) <= 600 + 3600, r.stdout
    assert NO_ROWS not in r.stdout
    page = _gpuclust("report", "ds", "cell-usage", *when, "--out", "sel.html", "--quiet", cwd=cell)
    assert page.returncode == 0, page.stderr[-2000:]
    assert m.group(0) in _section((cell / "sel.html").read_text(), "cell-usage")
