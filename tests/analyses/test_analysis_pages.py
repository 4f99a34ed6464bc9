"""Every registered analysis has its page under docs/analyses/: ``docs/analyses/<name>.md`` titled
with the analysis' name, or (an analysis documented beside a sibling) a section of another
analysis page whose heading names it.  The analyses index (docs/analyses/README.md) links the
page, and no page is left over for an analysis that is not registered."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuclust.analyses import REGISTRY

PAGES = Path(__file__).resolve().parents[2] / "docs" / "analyses"
#: Pages under docs/analyses/ that document no single analysis: the index and the maths shared by
#: analyses (cpi's numerical core, usage-distribution's mixture ops).
NOT_AN_ANALYSIS = {"README.md", "cpi-math.md", "mixture.md"}


def page_of(name: str) -> tuple[Path, str]:
    """The page documenting ``name`` and the part of it that does: its own page (whole), else the
    section of another analysis page whose heading names it in backticks."""
    own = PAGES / f"{name}.md"
    if own.exists():
        return own, own.read_text()
    for page in sorted(PAGES.glob("*.md")):
        if page.name in NOT_AN_ANALYSIS:
            continue
        m = re.search(rf"^(#+) [^\n]*`{re.escape(name)}`[^\n]*\n", page.read_text(), re.M)
        if m:
            rest = page.read_text()[m.end() :]
            end = re.search(rf"^#{{1,{len(m.group(1))}}} ", rest, re.M)
            return page, m.group(0) + (rest[: end.start()] if end else rest)
    raise AssertionError(f"no page documents {name}: write docs/analyses/{name}.md")


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_analysis_has_its_page(name: str) -> None:
    page, text = page_of(name)
    if page.stem == name:
        assert text.splitlines()[0].startswith(f"# `{name}`"), f"{page.name}: its title names `{name}`"
    index = (PAGES / "README.md").read_text()
    assert f"]({page.name})" in index, f"docs/analyses/README.md does not link {page.name}"


def test_every_analysis_page_is_a_registered_analysis() -> None:
    extra = sorted(p.name for p in PAGES.glob("*.md") if p.name not in NOT_AN_ANALYSIS and p.stem not in REGISTRY)
    assert not extra, f"pages for no registered analysis: {extra}"


def test_page_of_fails_for_an_analysis_without_a_page() -> None:
    with pytest.raises(AssertionError, match="no page documents"):
        page_of("no-such-analysis")
