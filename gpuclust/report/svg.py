"""Figures as SVG for the HTML report.

:class:`gpuclust.report.draw.Figure` writes SVGs whose root element carries ``data-axes``: per
axes, its box in figure fractions, data limits and scales, so the page's script can show the data
coordinates under the pointer (hover) without any plotting library.  :func:`inline_svg` turns such a
file into an ``<svg>`` element for a page that holds several figures (ids made unique per figure).
"""

from __future__ import annotations

import re

__all__ = ["MAX_SVG_BYTES", "inline_svg"]

#: Above this size a figure is embedded as a PNG inside its SVG (same geometry: hover still reads
#: the data coordinates); a vector drawing of, say, 9,000 buckets x 5 tiers would not be mailable.
MAX_SVG_BYTES = 400_000

_PROLOG = re.compile(r"^.*?(?=<svg[\s>])", re.S)
_ID = re.compile(r'\sid="([^"]+)"')
_REF = re.compile(r'#([^")\s]+)[")]')
_SIZE = re.compile(r'(<svg[^>]*?)\s(width|height)="[^"]*"')


def inline_svg(text: str, prefix: str) -> str:
    """An SVG file's text as an element to embed in HTML: no XML prolog or DOCTYPE, ids (and the
    references to them) prefixed with ``prefix``, and sized by the page (``width: 100%``)."""
    text = _PROLOG.sub("", text, count=1)
    used = set(_REF.findall(text))
    text = _ID.sub(lambda m: m.group(0) if m.group(1) in used else "", text)  # unreferenced ids
    for ident in sorted(set(_ID.findall(text)), key=len, reverse=True):
        new = f"{prefix}{ident}"
        text = text.replace(f'id="{ident}"', f'id="{new}"').replace(f"#{ident})", f"#{new})")
        text = text.replace(f'href="#{ident}"', f'href="#{new}"')
    while _SIZE.search(text.split(">", 1)[0] + ">"):
        text = _SIZE.sub(r"\1", text, count=1)
    return text.replace("<svg ", '<svg class="figure-svg" ', 1)
