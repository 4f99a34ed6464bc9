"""An axes of :mod:`gpuclust.report.draw` as drawing primitives, in points from the figure's top
left: its items, frame, ticks, tick labels, axis labels, title, colour bar and legend.

A primitive is a tuple whose first element is its kind: ``("poly", points, colour, alpha, clip)``,
``("line", points, colour, width, dash, clip)``, ``("hatch", box, colour, clip)``, ``("image", box,
rgb, clip)``, ``("rect", box, colour, width)``, ``("box", box, fill, alpha, edge)`` or ``("text", x,
y, text, size, ha, va, colour, rotation)``; ``clip`` is the axes' box, or None."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuclust.report.draw.style import _PAD, _TICK, _TICK_SIZE, _runs, viridis
from gpuclust.report.draw.text import _block, text_width
from gpuclust.report.draw.ticks import _ticks

if TYPE_CHECKING:
    from gpuclust.report.draw.axes import Axes


def legend_size(ax: Axes) -> tuple[float, float]:
    spec = ax.legend_spec
    if spec is None or not ax.legend_items:
        return 0.0, 0.0
    size = spec["size"]
    w = max(text_width(label, size) for label, _ in ax.legend_items) + 2.8 * size
    h = len(ax.legend_items) * size * 1.45
    if spec["title"]:
        tw, th = _block(spec["title"], size)
        w, h = max(w, tw), h + th + 0.4 * size
    return w + 0.8 * size, h + 0.8 * size


_Limits = tuple[tuple[float, float], tuple[float, float]]
_Clip = tuple[float, float, float, float]


def axes_primitives(a: Axes) -> list[tuple[Any, ...]]:
    """The axes' primitives: its items, then frame, colour bar, grid (at the bottom), ticks, labels and legend."""
    lims = a.limits()
    x0, y0, x1, y1 = a.box
    clip = (x0, y0, x1, y1)
    out: list[tuple[Any, ...]] = []
    # spans under the data (matplotlib's axvspan at zorder 0.5), text over it
    for it in sorted(a.items, key=lambda it: {"vspan": 0, "text": 2, "data_text": 2}.get(it[0], 1)):
        draw = _ITEM_PRIMITIVES.get(it[0])
        if draw is not None:
            out.extend(draw(a, it, lims, clip))
    # frame, ticks, tick labels, axis labels, title
    out.append(("rect", (x0, y0, x1, y1), "#000000", 0.8))
    if a.colorbar_spec is not None:
        out.extend(colorbar_primitives(a))
    xt, xlab, xminor, rot = _x_ticks(a, lims)
    yt, ylab, yminor, ysize = _y_ticks(a, lims)
    if a.grid_lw:  # under everything drawn so far
        out[:0] = _grid_primitives(a, xt, yt, lims, clip)
    out.extend(_x_tick_primitives(a, xt, xlab, xminor, rot, lims))
    ytick_prims, ywidth = _y_tick_primitives(a, yt, ylab, yminor, ysize, lims)
    out.extend(ytick_prims)
    out.extend(_label_primitives(a, xlab, rot, ywidth))
    out.extend(legend_primitives(a))
    return out


def _steps_fill_primitives(a: Axes, it: tuple[Any, ...], lims: _Limits, clip: _Clip) -> list[tuple[Any, ...]]:
    """A band between two step lines: one polygon per run of buckets where both are known."""
    _, edges, lo, hi, color, alpha = it
    out: list[tuple[Any, ...]] = []
    for i, j in _runs(np.isfinite(lo) & np.isfinite(hi)):
        xs = np.repeat(edges[i : j + 1], 2)[1:-1]
        top = np.repeat(hi[i:j], 2)
        bot = np.repeat(lo[i:j], 2)
        px, py = a.to_pt(np.concatenate([xs, xs[::-1]]), np.concatenate([top, bot[::-1]]))
        out.append(("poly", list(zip(px.tolist(), py.tolist(), strict=True)), color, alpha, clip))
    return out


def _line_primitives(a: Axes, it: tuple[Any, ...], lims: _Limits, clip: _Clip) -> list[tuple[Any, ...]]:
    """A data line: one polyline per run of two or more finite points."""
    _, x, y, color, lw, dash = it
    px, py = a.to_pt(x, y)
    out: list[tuple[Any, ...]] = []
    for i, j in _runs(np.isfinite(px) & np.isfinite(py)):
        if j - i >= 2:
            pts = list(zip(px[i:j].tolist(), py[i:j].tolist(), strict=True))
            out.append(("line", pts, color, lw, dash, clip))
    return out


def _rects_primitives(a: Axes, it: tuple[Any, ...], lims: _Limits, clip: _Clip) -> list[tuple[Any, ...]]:
    """Filled data rectangles (bars, heat-map cells), each edge held just outside the axes at most."""
    x0, y0, x1, y1 = clip
    _, rx0, rx1, ry0, ry1, colors = it
    px0, py0 = a.to_pt(rx0, ry0)
    px1, py1 = a.to_pt(rx1, ry1)
    # an edge at 0 (or beyond the limits) on a log axis: at the axes' edge
    px0, px1 = (np.clip(v, x0 - 1, x1 + 1) for v in (px0, px1))
    py0, py1 = (np.clip(v, y0 - 1, y1 + 1) for v in (py0, py1))
    out: list[tuple[Any, ...]] = []
    for bx0, bx1, by0, by1, color in zip(px0.tolist(), px1.tolist(), py0.tolist(), py1.tolist(), colors, strict=True):
        if all(math.isfinite(v) for v in (bx0, bx1, by0, by1)):
            out.append(("poly", [(bx0, by0), (bx1, by0), (bx1, by1), (bx0, by1)], color, 1.0, clip))
    return out


def _markers_primitives(a: Axes, it: tuple[Any, ...], lims: _Limits, clip: _Clip) -> list[tuple[Any, ...]]:
    """Markers at finite points: a five-pointed star (``*``) or a 16-sided disc, of the given radii."""
    _, mx, my, marker, radii, color, alpha = it
    px, py = a.to_pt(mx, my)
    n = 5 if marker == "*" else 16
    t = np.pi / 2 + np.arange(2 * n if marker == "*" else n) * np.pi / (n if marker == "*" else n / 2)
    k = np.where(np.arange(t.size) % 2 == 0, 1.0, 0.38) if marker == "*" else np.ones(t.size)
    out: list[tuple[Any, ...]] = []
    for cx, cy, r in zip(px.tolist(), py.tolist(), np.asarray(radii).tolist(), strict=True):
        if math.isfinite(cx) and math.isfinite(cy):
            pts = list(zip((cx + r * k * np.cos(t)).tolist(), (cy - r * k * np.sin(t)).tolist(), strict=True))
            out.append(("poly", pts, color, alpha, clip))
    return out


def _image_primitives(a: Axes, it: tuple[Any, ...], lims: _Limits, clip: _Clip) -> list[tuple[Any, ...]]:
    """An RGB image over its data extent."""
    _, rgb, ex0, ex1, ey0, ey1 = it
    (ix0, ix1), (iy1, iy0) = (np.asarray(v, dtype=np.float64).tolist() for v in a.to_pt([ex0, ex1], [ey0, ey1]))
    return [("image", (ix0, iy0, ix1, iy1), rgb, clip)]


def _data_text_primitives(a: Axes, it: tuple[Any, ...], lims: _Limits, clip: _Clip) -> list[tuple[Any, ...]]:
    """Text at a data point (offset in points), unless the point is off the scale."""
    _, xx, yy, s, size, ha, va, dx, dy = it
    px, py = a.to_pt(xx, yy)
    if math.isfinite(float(px)) and math.isfinite(float(py)):
        return [("text", float(px) + dx, float(py) + dy, s, size, ha, va, "#000000", 0.0)]
    return []


def _rule_primitives(a: Axes, it: tuple[Any, ...], lims: _Limits, clip: _Clip) -> list[tuple[Any, ...]]:
    """A horizontal (``hline``) or vertical (``vline``) line across the axes."""
    kind, v, color, lw, dash = it
    (xl, yl), (x0, y0, x1, y1) = lims, clip
    if kind == "hline":
        _, py = a.to_pt(xl[0], v)
        pts = [(x0, float(py)), (x1, float(py))]
    else:
        px, _ = a.to_pt(v, yl[0])
        pts = [(float(px), y0), (float(px), y1)]
    return [("line", pts, color, lw, dash, clip)]


def _vspan_primitives(a: Axes, it: tuple[Any, ...], lims: _Limits, clip: _Clip) -> list[tuple[Any, ...]]:
    """A vertical band over the axes' height: hatched, or filled."""
    _, v0, v1, color, alpha, hatch = it
    yl, (_, y0, _, y1) = lims[1], clip
    pa_, _ = a.to_pt(v0, yl[0])
    pb_, _ = a.to_pt(v1, yl[0])
    lo, hi = sorted((float(pa_), float(pb_)))
    if hatch:
        return [("hatch", (lo, y0, hi, y1), color, clip)]
    return [("poly", [(lo, y0), (hi, y0), (hi, y1), (lo, y1)], color, alpha, clip)]


def _text_primitives(a: Axes, it: tuple[Any, ...], lims: _Limits, clip: _Clip) -> list[tuple[Any, ...]]:
    """Text at a position in axes fractions (from the bottom left)."""
    _, fx, fy, s, size, ha, va, color = it
    x0, y0, x1, y1 = clip
    return [("text", x0 + fx * (x1 - x0), y1 - fy * (y1 - y0), s, size, ha, va, color, 0.0)]


_ITEM_PRIMITIVES: dict[str, Callable[[Axes, tuple[Any, ...], _Limits, _Clip], list[tuple[Any, ...]]]] = {
    "steps_fill": _steps_fill_primitives,
    "line": _line_primitives,
    "rects": _rects_primitives,
    "markers": _markers_primitives,
    "image": _image_primitives,
    "data_text": _data_text_primitives,
    "hline": _rule_primitives,
    "vline": _rule_primitives,
    "vspan": _vspan_primitives,
    "text": _text_primitives,
}


def _x_ticks(a: Axes, lims: _Limits) -> tuple[list[float], list[str], list[float], float]:
    """The x axis' major ticks, their labels, minor ticks and the labels' rotation (the shared x axis' scale)."""
    if a.xtick_override is not None:
        xt, xlab, rot = a.xtick_override
        return xt, xlab, [], rot
    xt, xlab, xminor = _ticks(*lims[0], (a.sharex or a).xscale, (a.sharex or a).linthresh)
    return xt, xlab, xminor, 0.0


def _y_ticks(a: Axes, lims: _Limits) -> tuple[list[float], list[str], list[float], float]:
    """The y axis' major ticks, their labels, minor ticks and the labels' font size."""
    yt, ylab, yminor = _ticks(*lims[1], a.yscale, a.linthresh)
    if a.ytick_override is not None:
        yt, ylab, ysize = a.ytick_override
        return yt, ylab, [], ysize
    return yt, ylab, yminor, _TICK_SIZE


def _grid_primitives(a: Axes, xt: list[float], yt: list[float], lims: _Limits, clip: _Clip) -> list[tuple[Any, ...]]:
    """Grey grid lines at the major ticks inside the axes: the vertical ones, then the horizontal ones."""
    (xl, yl), (x0, y0, x1, y1) = lims, clip
    gx = [float(a.to_pt(v, yl[0])[0]) for v in xt]
    gy = [float(a.to_pt(xl[0], v)[1]) for v in yt]
    return [("line", [(px, y0), (px, y1)], "#b0b0b0", a.grid_lw, False, clip) for px in gx if x0 <= px <= x1] + [
        ("line", [(x0, py), (x1, py)], "#b0b0b0", a.grid_lw, False, clip) for py in gy if y0 <= py <= y1
    ]


def _x_tick_primitives(
    a: Axes, xt: list[float], xlab: list[str], xminor: list[float], rot: float, lims: _Limits
) -> list[tuple[Any, ...]]:
    """Major ticks under the axes with their labels (rotated ones right-aligned), then the minor ticks."""
    x0, _, x1, y1 = a.box
    yl = lims[1]
    out: list[tuple[Any, ...]] = []
    for v, s in zip(xt, xlab, strict=True):
        px, _ = a.to_pt(v, yl[0])
        px = float(px)
        if not x0 - 0.5 <= px <= x1 + 0.5:
            continue
        out.append(("line", [(px, y1), (px, y1 + _TICK)], "#000000", 0.8, False, None))
        if a.xticklabels_visible:
            if rot:
                out.append(("text", px, y1 + _TICK + _PAD, s, 8.33, "right", "top", "#000000", rot))
            else:
                out.append(("text", px, y1 + _TICK + _PAD, s, _TICK_SIZE, "center", "top", "#000000", 0.0))
    for v in xminor:
        px = float(a.to_pt(v, yl[0])[0])
        if x0 <= px <= x1:
            out.append(("line", [(px, y1), (px, y1 + _TICK / 2)], "#000000", 0.6, False, None))
    return out


def _y_tick_primitives(
    a: Axes, yt: list[float], ylab: list[str], yminor: list[float], ysize: float, lims: _Limits
) -> tuple[list[tuple[Any, ...]], float]:
    """Major ticks left of the axes with their labels, then the minor ticks; and the labels' widest width."""
    x0, y0, _, y1 = a.box
    xl = lims[0]
    out: list[tuple[Any, ...]] = []
    ywidth = 0.0
    for v, s in zip(yt, ylab, strict=True):
        py = float(a.to_pt(xl[0], v)[1])
        if not y0 - 0.5 <= py <= y1 + 0.5:
            continue
        out.append(("line", [(x0 - _TICK, py), (x0, py)], "#000000", 0.8, False, None))
        if a.yticklabels_visible:
            out.append(("text", x0 - _TICK - _PAD, py, s, ysize, "right", "center", "#000000", 0.0))
            ywidth = max(ywidth, text_width(s, ysize))
    for v in yminor:
        py = float(a.to_pt(xl[0], v)[1])
        if y0 <= py <= y1:
            out.append(("line", [(x0 - _TICK / 2, py), (x0, py)], "#000000", 0.6, False, None))
    return out, ywidth


def _label_primitives(a: Axes, xlab: list[str], rot: float, ywidth: float) -> list[tuple[Any, ...]]:
    """The x label below the tick labels, the y label left of them (rotated) and the title above the axes."""
    x0, y0, x1, y1 = a.box
    out: list[tuple[Any, ...]] = []
    if a.xlabel and a.xticklabels_visible:
        if a.xtick_override is not None and rot:
            r = math.radians(rot)
            drop = max((text_width(s, 8.33) * math.sin(r) + 8.33 * math.cos(r) for s in xlab), default=0.0)
        else:
            drop = _TICK_SIZE
        out.append(
            ("text", (x0 + x1) / 2, y1 + _TICK + _PAD + drop + _PAD, a.xlabel, 10.0, "center", "top", "#000000", 0.0)
        )
    if a.ylabel:
        _, h = _block(a.ylabel, 10.0)
        out.append(
            (
                "text",
                x0 - _TICK - _PAD - ywidth - _PAD - h / 2,
                (y0 + y1) / 2,
                a.ylabel,
                10.0,
                "center",
                "center",
                "#000000",
                90.0,
            )
        )
    if a.title:
        out.append(("text", (x0 + x1) / 2, y0 - 4.0, a.title, 10.0, "center", "bottom", "#000000", 0.0))
    return out


def colorbar_primitives(a: Axes) -> list[tuple[Any, ...]]:
    """The colour scale right of the axes (as matplotlib's colorbar in an inset at axes x 1.01,
    0.02 wide): the gradient, its frame, ticks and labels on its right, the label beside them."""
    assert a.colorbar_spec is not None
    vmin, vmax, label = a.colorbar_spec
    x0, y0, x1, y1 = a.box
    bx0 = x1 + 0.01 * (x1 - x0)
    bx1 = bx0 + 0.02 * (x1 - x0)
    out: list[tuple[Any, ...]] = [
        ("image", (bx0, y0, bx1, y1), viridis(np.linspace(vmax, vmin, 256)[:, None], vmin, vmax), None),
        ("rect", (bx0, y0, bx1, y1), "#000000", 0.8),
    ]
    width = 0.0
    for v, s in zip(*_ticks(vmin, vmax, "linear")[:2], strict=True):
        py = y1 - (v - vmin) / ((vmax - vmin) or 1.0) * (y1 - y0)
        if y0 - 0.5 <= py <= y1 + 0.5:
            out.append(("line", [(bx1, py), (bx1 + _TICK, py)], "#000000", 0.8, False, None))
            out.append(("text", bx1 + _TICK + _PAD, py, s, _TICK_SIZE, "left", "center", "#000000", 0.0))
            width = max(width, text_width(s, _TICK_SIZE))
    if label:
        h = _block(label, 10.0)[1]
        out.append(
            (
                "text",
                bx1 + _TICK + _PAD + width + _PAD + h / 2,
                (y0 + y1) / 2,
                label,
                10.0,
                "center",
                "center",
                "#000000",
                90.0,
            )
        )
    return out


def legend_primitives(a: Axes) -> list[tuple[Any, ...]]:
    spec = a.legend_spec
    if spec is None or not a.legend_items:
        return []
    w, h = legend_size(a)
    x0, y0, x1, y1 = a.box
    size, pad = spec["size"], 0.4 * spec["size"]
    if spec["outside"]:
        lx, ly = x1 + 6.0, y0
    else:
        lx = x0 + 4.0 if "left" in spec["loc"] else x1 - 4.0 - w
        ly = y0 + 4.0 if "upper" in spec["loc"] else y1 - 4.0 - h
    out: list[tuple[Any, ...]] = [("box", (lx, ly, lx + w, ly + h), "#ffffff", 0.8, "#cccccc")]
    y = ly + pad
    if spec["title"]:
        out.append(("text", lx + w / 2, y, spec["title"], size, "center", "top", "#000000", 0.0))
        y += _block(spec["title"], size)[1] + 0.4 * size
    for label, how in a.legend_items:
        mid = y + 0.725 * size
        sx = lx + pad
        if how["kind"] == "line":
            out.append(("line", [(sx, mid), (sx + 1.8 * size, mid)], how["color"], how["lw"], how["dash"], None))
        elif how["kind"] == "marker":  # a disc
            t = np.arange(16) * np.pi / 8
            out.append(
                (
                    "poly",
                    list(
                        zip(
                            (sx + 0.9 * size + 0.4 * size * np.cos(t)).tolist(),
                            (mid + 0.4 * size * np.sin(t)).tolist(),
                            strict=True,
                        )
                    ),
                    how["color"],
                    how.get("alpha", 1.0),
                    None,
                )
            )
        elif how["kind"] == "hatch":
            out.append(
                (
                    "poly",
                    [
                        (sx, mid - 0.35 * size),
                        (sx + 1.8 * size, mid - 0.35 * size),
                        (sx + 1.8 * size, mid + 0.35 * size),
                        (sx, mid + 0.35 * size),
                    ],
                    "#ffffff",
                    1.0,
                    None,
                )
            )
            out.append(("hatch", (sx, mid - 0.35 * size, sx + 1.8 * size, mid + 0.35 * size), how["color"], None))
        else:
            out.append(
                (
                    "poly",
                    [
                        (sx, mid - 0.35 * size),
                        (sx + 1.8 * size, mid - 0.35 * size),
                        (sx + 1.8 * size, mid + 0.35 * size),
                        (sx, mid + 0.35 * size),
                    ],
                    how["color"],
                    how.get("alpha", 1.0),
                    None,
                )
            )
        out.append(("text", sx + 2.4 * size, mid, label, size, "left", "center", "#000000", 0.0))
        y += size * 1.45
    return out
