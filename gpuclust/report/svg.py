"""Figures as SVG for the HTML report: text kept as text, stable ids, and the axes' geometry.

:func:`save_svg` writes a matplotlib figure as an SVG whose root element carries ``data-axes``: per
axes, its box in figure fractions, data limits and scales, so the page's script can show the data
coordinates under the pointer (hover) without any plotting library.  :func:`inline_svg` turns such a
file into an ``<svg>`` element for a page that holds several figures (ids made unique per figure).
"""

from __future__ import annotations

import html
import io
import json
import re
from pathlib import Path
from typing import Any

__all__ = ["MAX_SVG_BYTES", "axes_geometry", "compact", "inline_svg", "save_svg"]

_SCALES = {"linear", "log"}


def axes_geometry(fig: Any) -> list[dict[str, Any]]:
    """Per axes of a drawn figure: ``box`` [x0, y0, x1, y1] in figure fractions (origin bottom
    left), ``x`` / ``y`` limits, scales (``linear``, ``log``; others are not read back) and labels."""
    out = []
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        b = ax.get_position()
        xs, ys = ax.get_xscale(), ax.get_yscale()
        out.append({"box": [round(float(v), 5) for v in (b.x0, b.y0, b.x1, b.y1)],
                    "x": [float(v) for v in ax.get_xlim()], "y": [float(v) for v in ax.get_ylim()],
                    "xscale": xs if xs in _SCALES else "other", "yscale": ys if ys in _SCALES else "other",
                    "xlabel": _shared_label(ax, "x"), "ylabel": _shared_label(ax, "y")})
    return out


def _shared_label(ax: Any, which: str) -> str:
    """The axes' label, or the one of an axes it shares that axis with (a stacked panel's x label
    is written under the bottom panel only)."""
    own = getattr(ax, f"get_{which}label")()
    if own:
        return str(own)
    for other in getattr(ax, f"get_shared_{which}_axes")().get_siblings(ax):
        label = getattr(other, f"get_{which}label")()
        if label:
            return str(label)
    return ""


#: Above this size a figure is embedded as a PNG inside its SVG (same geometry: hover still reads
#: the data coordinates); a vector drawing of, say, 9,000 buckets x 5 tiers would not be mailable.
MAX_SVG_BYTES = 400_000


def _raster(fig: Any) -> str:
    """The figure as an SVG holding one PNG image of it (110 dpi)."""
    import base64

    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    w, h = (float(v) * 72 for v in fig.get_size_inches())
    data = base64.b64encode(png.getvalue()).decode("ascii")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" width="{w:g}pt" '
            f'height="{h:g}pt" viewBox="0 0 {w:g} {h:g}" data-raster="png"><image width="{w:g}" height="{h:g}" '
            f'xlink:href="data:image/png;base64,{data}"/></svg>\n')


def save_svg(fig: Any, path: Path, *, max_bytes: int | None = None) -> None:
    """Write ``fig`` as SVG to ``path`` atomically (text as text, no date, ids stable across runs);
    a drawing larger than ``max_bytes`` (default :data:`MAX_SVG_BYTES`) as a PNG inside the SVG."""
    import matplotlib

    from gpuclust.report._files import write_atomic

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "gpuclust"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    geometry = html.escape(json.dumps(axes_geometry(fig), separators=(",", ":")), quote=True)
    text = compact(buf.getvalue())
    if len(text) > (MAX_SVG_BYTES if max_bytes is None else max_bytes):
        text = _raster(fig)
    text = text.replace("<svg ", f'<svg data-axes="{geometry}" ', 1)
    write_atomic(Path(path), lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


_GEOMETRY_ATTR = re.compile(r'\b(d|x|y|x1|x2|y1|y2|width|height|transform|points|viewBox)="([^"]*)"')
_NUMBER = re.compile(r"-?\d+\.\d+")
_BETWEEN_TAGS = re.compile(r">\s+<")


def _short(m: re.Match[str]) -> str:
    v = f"{float(m.group(0)):.2f}".rstrip("0").rstrip(".")
    return "0" if v == "-0" else v


def _path(d: str) -> str:
    """Path data without the ``L`` that follows an ``M`` or ``L`` (implied there by SVG)."""
    out, last = [], ""
    for tok in d.split():
        if tok.isalpha():
            if tok == "L" and last in ("M", "L"):
                continue
            last = tok
        out.append(tok)
    return " ".join(out)


def _attr(m: re.Match[str]) -> str:
    v = " ".join(_NUMBER.sub(_short, m.group(2)).split())
    return f'{m.group(1)}="{_path(v) if m.group(1) == "d" else v}"'


def compact(text: str) -> str:
    """A matplotlib SVG with the same drawing in fewer bytes: coordinates rounded to 1/100 pt (finer
    than any screen), no newlines inside paths, no indentation between tags.  Text content (tick
    labels, legends) is left as it is."""
    text = _GEOMETRY_ATTR.sub(_attr, text)
    return _BETWEEN_TAGS.sub("><", text)
_PROLOG = re.compile(r"^.*?(?=<svg[\s>])", re.S)
_ID = re.compile(r'\sid="([^"]+)"')
_REF = re.compile(r'#([^")\s]+)[")]')
_SIZE = re.compile(r'(<svg[^>]*?)\s(width|height)="[^"]*"')


def inline_svg(text: str, prefix: str) -> str:
    """An SVG file's text as an element to embed in HTML: no XML prolog or DOCTYPE, ids (and the
    references to them) prefixed with ``prefix``, and sized by the page (``width: 100%``)."""
    text = _PROLOG.sub("", text, count=1)
    used = set(_REF.findall(text))
    text = _ID.sub(lambda m: m.group(0) if m.group(1) in used else "", text)  # matplotlib's structural ids
    for ident in sorted(set(_ID.findall(text)), key=len, reverse=True):
        new = f"{prefix}{ident}"
        text = text.replace(f'id="{ident}"', f'id="{new}"').replace(f"#{ident})", f"#{new})")
        text = text.replace(f'href="#{ident}"', f'href="#{new}"')
    while _SIZE.search(text.split(">", 1)[0] + ">"):
        text = _SIZE.sub(r"\1", text, count=1)
    return text.replace("<svg ", '<svg class="figure-svg" ', 1)
