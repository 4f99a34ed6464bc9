"""A :class:`gpuclust.report.draw.Figure` as SVG: its primitives as SVG elements (text as text), the
root element's ``data-axes`` the figure's geometry (read by the report page's hover); or, for a
drawing too large for a page, one PNG of it inside an SVG with the same ``data-axes``."""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuclust.report.draw.png_writer import _png_bytes
from gpuclust.report.draw.style import _FONT_FAMILY
from gpuclust.report.draw.text import _baselines

if TYPE_CHECKING:
    from gpuclust.report.draw.figure import Figure


def to_svg(fig: Figure) -> str:
    """The figure as SVG text."""
    prims = fig._primitives()
    W, H = fig.size_pt
    geometry = html.escape(json.dumps(fig.geometry(), separators=(",", ":")), quote=True)
    defs = _SvgDefs()
    body: list[str] = []
    for p in prims:
        draw = _SVG_ELEMENTS.get(p[0])
        if draw is not None:
            body.append(draw(p, defs))
    n = _num
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{n(W)}pt" height="{n(H)}pt" '
        f'viewBox="0 0 {n(W)} {n(H)}" data-axes="{geometry}" data-drawn="gpuclust">'
        f'<defs>{"".join(defs.defs)}</defs><rect width="{n(W)}" height="{n(H)}" fill="#ffffff"/>'
        f'<g font-family="{_FONT_FAMILY}">{"".join(body)}</g></svg>\n'
    )


def _num(v: float) -> str:
    """A coordinate with at most two decimals, trailing zeros dropped (``-0`` as ``0``)."""
    s = f"{v:.2f}".rstrip("0").rstrip(".")
    return "0" if s == "-0" else s


class _SvgDefs:
    """The SVG's ``<defs>``: a clip path per clip box (numbered in order of first use) and the hatch patterns."""

    def __init__(self) -> None:
        self.clips: dict[tuple[float, ...], str] = {}
        self.defs: list[str] = []

    def clip_attr(self, c: tuple[float, ...] | None) -> str:
        """The ``clip-path`` attribute for ``c`` (nothing for None), defining its clip path on first use."""
        if c is None:
            return ""
        if c not in self.clips:
            cid = f"c{len(self.clips)}"
            self.clips[c] = cid
            n = _num
            self.defs.append(
                f'<clipPath id="{cid}"><rect x="{n(c[0])}" y="{n(c[1])}" width="{n(c[2] - c[0])}" '
                f'height="{n(c[3] - c[1])}"/></clipPath>'
            )
        return f' clip-path="url(#{self.clips[c]})"'

    def hatch(self, color: str) -> str:
        """The id of a new diagonal hatch pattern in ``color``."""
        pid = f"h{len(self.defs)}"
        self.defs.append(
            f'<pattern id="{pid}" patternUnits="userSpaceOnUse" width="6" height="6">'
            f'<path d="M-1 1 L1 -1 M0 6 L6 0 M5 7 L7 5" stroke="{color}" stroke-width="1"/></pattern>'
        )
        return pid


def _svg_poly(p: tuple[Any, ...], defs: _SvgDefs) -> str:
    """A filled polygon."""
    _, pts, color, alpha, clip = p
    d = "M" + " L".join(f"{_num(x)} {_num(y)}" for x, y in pts) + "Z"
    op = f' fill-opacity="{alpha:g}"' if alpha < 1 else ""
    return f'<path d="{d}" fill="{color}"{op}{defs.clip_attr(clip)}/>'


def _svg_line(p: tuple[Any, ...], defs: _SvgDefs) -> str:
    """A polyline, dashed or not; a ``#rrggbbaa`` colour as a translucent stroke."""
    _, pts, color, lw, dash, clip = p
    d = "M" + " L".join(f"{_num(x)} {_num(y)}" for x, y in pts)
    da = f' stroke-dasharray="{_num(3.7 * lw)} {_num(1.6 * lw)}"' if dash else ""
    if len(color) == 9:  # #rrggbbaa: translucent
        da += f' stroke-opacity="{int(color[7:], 16) / 255:.3g}"'
        color = color[:7]
    return (
        f'<path d="{d}" fill="none" stroke="{color}" stroke-width="{lw:g}"{da} '
        f'stroke-linejoin="round"{defs.clip_attr(clip)}/>'
    )


def _svg_hatch(p: tuple[Any, ...], defs: _SvgDefs) -> str:
    """A hatched rectangle (a pattern of its own)."""
    _, (hx0, hy0, hx1, hy1), color, clip = p
    pid = defs.hatch(color)
    n = _num
    return (
        f'<rect x="{n(hx0)}" y="{n(hy0)}" width="{n(hx1 - hx0)}" height="{n(hy1 - hy0)}" '
        f'fill="url(#{pid})"{defs.clip_attr(clip)}/>'
    )


def _svg_image(p: tuple[Any, ...], defs: _SvgDefs) -> str:
    """An RGB image as an embedded PNG, drawn with its pixels kept sharp."""
    import base64

    _, (ix0, iy0, ix1, iy1), rgb, clip = p
    data = base64.b64encode(_png_bytes(np.ascontiguousarray(rgb), 72)).decode("ascii")
    n = _num
    return (
        f'<image x="{n(ix0)}" y="{n(iy0)}" width="{n(ix1 - ix0)}" height="{n(iy1 - iy0)}" '
        f'preserveAspectRatio="none" style="image-rendering:pixelated"{defs.clip_attr(clip)} '
        f'href="data:image/png;base64,{data}"/>'
    )


def _svg_rect(p: tuple[Any, ...], defs: _SvgDefs) -> str:
    """An unfilled rectangle (an axes' frame)."""
    _, (rx0, ry0, rx1, ry1), color, lw = p
    n = _num
    return (
        f'<rect x="{n(rx0)}" y="{n(ry0)}" width="{n(rx1 - rx0)}" height="{n(ry1 - ry0)}" '
        f'fill="none" stroke="{color}" stroke-width="{lw:g}"/>'
    )


def _svg_box(p: tuple[Any, ...], defs: _SvgDefs) -> str:
    """A filled, rounded, edged rectangle (a legend's box)."""
    _, (rx0, ry0, rx1, ry1), fill, alpha, edge = p
    n = _num
    return (
        f'<rect x="{n(rx0)}" y="{n(ry0)}" width="{n(rx1 - rx0)}" height="{n(ry1 - ry0)}" '
        f'rx="2" fill="{fill}" fill-opacity="{alpha:g}" stroke="{edge}" stroke-width="0.8"/>'
    )


def raster_svg(fig: Figure) -> str:
    """The figure as an SVG holding one PNG of it, with the same ``data-axes`` (the page's hover)."""
    import base64

    W, H = fig.size_pt
    png = base64.b64encode(fig.to_png()).decode("ascii")
    geometry = html.escape(json.dumps(fig.geometry(), separators=(",", ":")), quote=True)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W:g}pt" height="{H:g}pt" viewBox="0 0 {W:g} {H:g}" '
        f'data-axes="{geometry}" data-drawn="gpuclust" data-raster="png"><image width="{W:g}" height="{H:g}" '
        f'href="data:image/png;base64,{png}"/></svg>\n'
    )


def _svg_text(p: tuple[Any, ...], defs: _SvgDefs) -> str:
    """Text as a ``<text>`` of one ``<tspan>`` per line, turned about its anchor when rotated."""
    n = _num
    _, x, y, s, size, ha, va, color, rot = p
    anchor = {"left": "start", "center": "middle", "right": "end"}[ha]
    lines = s.split("\n")
    if rot:  # rotated about (x, y): lay the lines out as if unrotated, then turn them
        base = _baselines(y, s, size, va)
        spans = "".join(
            f'<tspan x="{n(x)}" y="{n(b)}">{html.escape(line)}</tspan>' for line, b in zip(lines, base, strict=True)
        )
        return (
            f'<text font-size="{size:g}" fill="{color}" text-anchor="{anchor}" '
            f'transform="rotate({-rot:g} {n(x)} {n(y)})">{spans}</text>'
        )
    base = _baselines(y, s, size, va)
    spans = "".join(
        f'<tspan x="{n(x)}" y="{n(b)}">{html.escape(line)}</tspan>' for line, b in zip(lines, base, strict=True)
    )
    return f'<text font-size="{size:g}" fill="{color}" text-anchor="{anchor}">{spans}</text>'


_SVG_ELEMENTS: dict[str, Callable[[tuple[Any, ...], _SvgDefs], str]] = {
    "poly": _svg_poly,
    "line": _svg_line,
    "hatch": _svg_hatch,
    "image": _svg_image,
    "rect": _svg_rect,
    "box": _svg_box,
    "text": _svg_text,
}
