"""`gpuclust report` end to end, opened in a real headless Chromium (Debian's ``chromium``).

The page is checked as a person would see it: no console errors, every figure drawn (the page's
script marks each one it found non-empty; the count is compared with the figures the page holds
and with the analyses known to draw one), nothing fetched from the network, and a screenshot kept
as an artifact (``out/report-browser/`` unless ``GPUCLUST_ARTIFACTS`` names another folder).

Chromium is found on the PATH, or installed with ``apt-get`` when running as root; where neither
works the browser tests are skipped with the reason, and ``GPUCLUST_REQUIRE_BROWSER=1`` (set by
``.ci/run``) makes that a failure instead.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from run_once import once_per_run

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("GPUCLUST_ARTIFACTS") or ROOT / "out" / "report-browser")
#: Analyses whose figure the synthetic cell always has data for.
DRAWN = {
    "cell-usage",
    "collection-lifecycle",
    "cpi",
    "job-usage",
    "lifecycle",
    "machine-shapes",
    "overcommit",
    "usage-change",
    "usage-distribution",
    "usage-vs-request",
}
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _gpuclust(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuclust", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def find_chromium() -> tuple[str | None, str]:
    """The Chromium binary, installing Debian's package when root; else ``(None, why)``."""
    for b in BROWSERS:
        if shutil.which(b):
            return shutil.which(b), ""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("apt-get"):
        return None, "no chromium on the PATH, and not root with apt-get to install Debian's chromium package"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if r.returncode != 0:
            return None, f"`{' '.join(cmd)}` failed: {r.stderr.strip()[-300:]}"
    found = shutil.which("chromium")
    return (found, "") if found else (None, "apt-get installed chromium but it is not on the PATH")


@pytest.fixture(scope="module")
def chromium() -> str:
    path, why = find_chromium()
    if path is None:
        if os.environ.get("GPUCLUST_REQUIRE_BROWSER") == "1":
            pytest.fail(f"GPUCLUST_REQUIRE_BROWSER=1 but no browser: {why}")
        pytest.skip(why)
    return path


def browse(chromium: str, page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on a local page (console messages go to stderr)."""
    profile = page.parent / ".chromium-profile"
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
        *args,
        page.absolute().as_uri(),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


REAL = ROOT.parent / "shared" / "data" / "real"
#: dataset -> (how to make it: a session fixture's dataset linked as ``ds`` (the fixture, the dataset's
#: folder in what it gives), or gpuclust command lines run in a fresh folder; analyses that must
#: draw a figure)
DATASETS = {
    # tests/conftest.py's synth_cell_40: a synthetic cell of 40 machines x 3 h, ingested once per run
    "synthetic": (("synth_cell_40", "ds"), DRAWN),
    # the run's ingest of the 2011 parts (tests/conftest.py's real_2011)
    "real-2011": (("real_2011", "."), {"collection-lifecycle", "lifecycle", "machine-shapes", "overcommit"}),
    "real-2019-cell-a": (
        [("ingest", str(REAL / "2019-cell-a"), "--out", "ds", "--cell", "a", "--prefer", "parquet")],
        {"machine-shapes"},
    ),
}


@pytest.fixture(scope="module", params=list(DATASETS))
def report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, set[str]]:
    """A dataset (a synthetic cell, the real 2011 events-only trace files, the real 2019 cell-a
    machine_events), ingested, and its report: made once per pytest run whatever the number of
    xdist workers (:func:`run_once.once_per_run`); tests only read the page."""
    name = request.param
    how, drawn = DATASETS[name]
    if name.startswith("real") and not REAL.is_dir():
        pytest.skip(f"real trace files not found at {REAL}")

    def make(d: Path) -> Path:
        if isinstance(how, tuple):  # linked: the report writes beside its page, not into the dataset
            fixture, folder = how
            (d / "ds").symlink_to(request.getfixturevalue(fixture) / folder, target_is_directory=True)
        for args in how if isinstance(how, list) else []:
            r = _gpuclust(*args, cwd=d)
            assert r.returncode == 0, (args, r.stderr[-2000:])
        r = _gpuclust("report", "ds", "--out", "report.html", "--quiet", cwd=d)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert "report.html" in r.stdout and "KiB" in r.stdout
        return d / "report.html"

    return name, once_per_run(tmp_path_factory, f"report-{name}", make), drawn


def test_page_is_self_contained_and_small(report: tuple[str, Path, set[str]]) -> None:
    name, page, drawn = report
    text = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), "the page fetches something"
    assert "<link" not in text and "@import" not in text
    assert page.stat().st_size < 2 * 1024 * 1024, "too large to mail"
    for what in (
        "dataset",
        "trace version",
        "tier map",
        "time span",
        "sample",
        "gpuclust",
        "options",
        "backend",
        "device",
    ):
        assert f"<td>{what}</td>" in text, what
    sections = re.findall(r'<section class="analysis" id="a-([^"]+)"', text)
    assert sections[0] == "data-quality" or "data-quality" not in sections, "data quality comes first"
    assert drawn <= set(sections)


def test_report_renders_in_chromium(chromium: str, report: tuple[str, Path, set[str]]) -> None:
    name, page, drawn = report
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"report-{name}.png"
    shot.unlink(missing_ok=True)  # (an earlier run's)
    # one browser run: the DOM after the page's script, and the screenshot
    dom = browse(chromium, page, "--dump-dom", f"--screenshot={shot}", "--window-size=1280,4200")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert not console_lines(dom.stderr), console_lines(dom.stderr)
    body = re.search(r"<body([^>]*)>", dom.stdout)
    assert body, dom.stdout[:500]
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))
    assert attrs.get("data-errors", "0") == "0", attrs
    figures = re.findall(r'<figure class="plot" data-figure="([^"]+)"[^>]*data-rendered="(\w+)"', dom.stdout)
    assert figures, "the page's script marked no figure"
    assert all(state == "yes" for _, state in figures), figures
    expected = int(attrs["data-figures-expected"])
    assert int(attrs["data-figures-rendered"]) == expected == len(figures) == dom.stdout.count('<figure class="plot"')
    assert drawn <= {k for k, _ in figures}
    # a section without a figure says why
    for sec in re.findall(r'<section class="analysis".*?</section>', dom.stdout, re.S):
        assert "<figure" in sec or re.search(r'class="empty">(Nothing to plot|This analysis draws no figure)', sec), (
            sec[:300]
        )

    assert shot.is_file() and shot.stat().st_size > 50_000, dom.stderr[-2000:]
    shutil.copyfile(page, ARTIFACTS / f"report-{name}.html")
    (ARTIFACTS / f"figures-{name}.json").write_text(json.dumps(dict(figures), indent=1))


#: Appended to a copy of the page: after the page's own script, hover over the middle of the first
#: axes of the cell-usage figure (else the first figure), then drag across it (there is no drag-to-zoom:
#: cropping the drawing lost its axes and labels, issue 33); the results go on <body>.
PROBE = """<script>document.addEventListener("DOMContentLoaded", function () {
  var fig = document.querySelector("figure.plot[data-figure='cell-usage']") || document.querySelector("figure.plot");
  var svg = fig.querySelector("svg");
  var a = JSON.parse(svg.getAttribute("data-axes"))[0], vb = svg.viewBox.baseVal;
  function at(fx, fy) {
    var p = svg.createSVGPoint(); p.x = fx * vb.width; p.y = (1 - fy) * vb.height;
    return p.matrixTransform(svg.getScreenCTM());
  }
  function ev(target, type, p) { target.dispatchEvent(new MouseEvent(type, {clientX: p.x, clientY: p.y, bubbles: true})); }
  var mid = at((a.box[0] + a.box[2]) / 2, (a.box[1] + a.box[3]) / 2);
  var corner = at(a.box[0] + 0.1 * (a.box[2] - a.box[0]), a.box[3] - 0.1 * (a.box[3] - a.box[1]));
  ev(svg, "mousemove", mid);
  document.body.setAttribute("data-probe-tip", fig.querySelector(".tip").textContent.replace(/\\n/g, " | "));
  document.body.setAttribute("data-probe-axes", JSON.stringify(a));
  document.body.setAttribute("data-probe-full", svg.getAttribute("viewBox"));
  ev(svg, "mousedown", mid); ev(svg, "mousemove", corner); ev(window, "mouseup", corner); ev(svg, "mouseup", corner);
  document.body.setAttribute("data-probe-dragged", svg.getAttribute("viewBox"));
  document.body.setAttribute("data-probe-aspect", svg.getAttribute("preserveAspectRatio") || "");
});</script>"""


def test_hover_in_chromium_and_no_zoom_that_crops_axes(
    chromium: str, report: tuple[str, Path, set[str]], tmp_path: Path
) -> None:
    """Hover shows the data coordinates of the point under the pointer (the middle of the axes:
    the middle of its limits on a linear axis); a drag leaves the figure whole (axes and labels
    stay: no zoom that crops them away)."""
    name, page, _ = report
    probe = tmp_path / "probe.html"  # the page is self-contained: it renders from any folder
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = browse(chromium, probe, "--dump-dom")
    assert not console_lines(dom.stderr), console_lines(dom.stderr)
    body = re.search(r"<body([^>]*)>", dom.stdout)
    assert body
    attrs = {k: html.unescape(v) for k, v in re.findall(r'([\w-]+)="([^"]*)"', body.group(1))}
    assert attrs.get("data-errors", "0") == "0", attrs
    axes = json.loads(attrs["data-probe-axes"])
    tip = attrs["data-probe-tip"]
    for which in ("x", "y"):
        label = (axes[f"{which}label"] or which).split("\n")[0]
        assert f"{label}: " in tip, (tip, axes)
        if axes[f"{which}scale"] == "linear":
            value = float(tip.split(f"{label}: ", 1)[1].split(" | ")[0])
            lo, hi = axes[which]
            assert value == pytest.approx((lo + hi) / 2, abs=0.02 * abs(hi - lo)), (which, tip, axes)
    if name == "synthetic":  # a time axis: the wall-clock instant too (the 2019 trace starts at trace time
        # 600 s, 2019-05-01 07:00 UTC: trace time 0 is 06:50 UTC)
        assert axes["xlabel"] == "trace hours (trace time; the trace starts at 0.17 h)", axes
        hours = (axes["x"][0] + axes["x"][1]) / 2
        minute = 6 * 60 + 50 + hours * 60
        assert f"UTC: 2019-05-01 {int(minute // 60):02d}:" in tip, tip
    assert attrs["data-probe-dragged"] == attrs["data-probe-full"] and len(attrs["data-probe-full"].split()) == 4
    assert attrs["data-probe-aspect"] == ""
    assert "drag to zoom" not in page.read_text()


def test_a_script_error_is_caught(chromium: str, tmp_path: Path) -> None:
    """The checks above can fail: a page whose script throws is reported."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><script>undefinedFunction();</script></body></html>")
    r = browse(chromium, page, "--dump-dom")
    assert any("undefinedFunction" in line for line in console_lines(r.stderr)), r.stderr[-2000:]
