"""Every relative link in README.md, CHANGELOG.md and docs/**/*.md points at a file that exists,
and a link's ``#anchor`` into a Markdown page at one of that page's headings (GitHub's slugs), so
moving or renaming a page or a heading cannot leave a link dangling."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of the lines outside fenced code blocks, inline code removed."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, re.sub(r"`[^`]*`", "", line)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: markup dropped, lower case, punctuation other than
    ``-`` and ``_`` removed, spaces to ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = re.sub(r"[*~]|<[^>]*>", "", text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of ``page``'s headings (a repeated heading's get ``-1``, ``-2``... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            s = slug(m.group(2))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def links(page: Path) -> list[tuple[int, str]]:
    """``(line, target)`` of every relative link of ``page`` (not http(s), mail or other schemes)."""
    return [
        (n, m.group(1))
        for n, line in _prose(page.read_text())
        for m in LINK.finditer(line)
        if m.group(1) and not re.match(r"[a-z][a-z0-9+.-]*:", m.group(1))
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    bad = []
    for n, target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(ROOT)}:{n}: {target}"
        if not dest.exists():
            bad.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{where} (no heading with that anchor in {dest.relative_to(ROOT)})")
    assert not bad, "dangling links:\n" + "\n".join(bad)


def test_the_checker_sees_a_dangling_link_and_anchor(tmp_path: Path) -> None:
    """The checks above can fail: a missing file and a missing heading are both found."""
    (tmp_path / "a.md").write_text("# Time selections (`--from` / `--to`)\n\n## Same\n\n## Same\n")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#time-selections---from----to) [ok2](a.md#same-1) [gone](nope.md) [bad](a.md#nope)\n"
        "```\n[in code](ignored.md)\n```\n[web](https://example.com) `[code](x.md)`\n"
    )
    assert anchors(tmp_path / "a.md") == {"time-selections---from----to", "same", "same-1"}
    assert links(page) == [
        (1, "a.md#time-selections---from----to"),
        (1, "a.md#same-1"),
        (1, "nope.md"),
        (1, "a.md#nope"),
    ]


def test_every_page_is_in_the_docs_index() -> None:
    """docs/README.md links every page under docs/ (one line each, in its section)."""
    index = ROOT / "docs" / "README.md"
    linked = {(index.parent / t.partition("#")[0]).resolve() for _, t in links(index)}
    missing = [
        str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md") if p != index and p.resolve() not in linked
    ]
    assert not missing, f"docs/README.md does not list: {missing}"
