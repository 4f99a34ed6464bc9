"""An axes of :mod:`gpuclust.report.draw` as drawing primitives, in points from the figure's top
left: its items, frame, ticks, tick labels, axis labels, title, colour bar and legend.

A primitive is a tuple whose first element is its kind: ``("poly", points, colour, alpha, clip)``,
``("line", points, colour, width, dash, clip)``, ``("hatch", box, colour, clip)``, ``("image", box,
rgb, clip)``, ``("rect", box, colour, width)``, ``("box", box, fill, alpha, edge)`` or ``("text", x,
y, text, size, ha, va, colour, rotation)``; ``clip`` is the axes' box, or None."""

from __future__ import annotations

import math
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


def axes_primitives(a: Axes) -> list[tuple[Any, ...]]:
    (xl, yl) = a.limits()
    x0, y0, x1, y1 = a.box
    clip = (x0, y0, x1, y1)
    out: list[tuple[Any, ...]] = []
    # spans under the data (matplotlib's axvspan at zorder 0.5), text over it
    for it in sorted(a.items, key=lambda it: {"vspan": 0, "text": 2, "data_text": 2}.get(it[0], 1)):
        kind = it[0]
        if kind == "steps_fill":
            _, edges, lo, hi, color, alpha = it
            for i, j in _runs(np.isfinite(lo) & np.isfinite(hi)):  # one polygon per run of known buckets
                xs = np.repeat(edges[i : j + 1], 2)[1:-1]
                top = np.repeat(hi[i:j], 2)
                bot = np.repeat(lo[i:j], 2)
                px, py = a.to_pt(np.concatenate([xs, xs[::-1]]), np.concatenate([top, bot[::-1]]))
                out.append(("poly", list(zip(px.tolist(), py.tolist(), strict=True)), color, alpha, clip))
        elif kind == "line":
            _, x, y, color, lw, dash = it
            px, py = a.to_pt(x, y)
            for i, j in _runs(np.isfinite(px) & np.isfinite(py)):
                if j - i >= 2:
                    pts = list(zip(px[i:j].tolist(), py[i:j].tolist(), strict=True))
                    out.append(("line", pts, color, lw, dash, clip))
        elif kind == "rects":
            _, rx0, rx1, ry0, ry1, colors = it
            px0, py0 = a.to_pt(rx0, ry0)
            px1, py1 = a.to_pt(rx1, ry1)
            # an edge at 0 (or beyond the limits) on a log axis: at the axes' edge
            px0, px1 = (np.clip(v, x0 - 1, x1 + 1) for v in (px0, px1))
            py0, py1 = (np.clip(v, y0 - 1, y1 + 1) for v in (py0, py1))
            for bx0, bx1, by0, by1, color in zip(
                px0.tolist(), px1.tolist(), py0.tolist(), py1.tolist(), colors, strict=True
            ):
                if all(math.isfinite(v) for v in (bx0, bx1, by0, by1)):
                    out.append(("poly", [(bx0, by0), (bx1, by0), (bx1, by1), (bx0, by1)], color, 1.0, clip))
        elif kind == "markers":
            _, mx, my, marker, radii, color, alpha = it
            px, py = a.to_pt(mx, my)
            n = 5 if marker == "*" else 16
            t = np.pi / 2 + np.arange(2 * n if marker == "*" else n) * np.pi / (n if marker == "*" else n / 2)
            k = np.where(np.arange(t.size) % 2 == 0, 1.0, 0.38) if marker == "*" else np.ones(t.size)
            for cx, cy, r in zip(px.tolist(), py.tolist(), np.asarray(radii).tolist(), strict=True):
                if math.isfinite(cx) and math.isfinite(cy):
                    pts = list(zip((cx + r * k * np.cos(t)).tolist(), (cy - r * k * np.sin(t)).tolist(), strict=True))
                    out.append(("poly", pts, color, alpha, clip))
        elif kind == "image":
            _, rgb, ex0, ex1, ey0, ey1 = it
            (ix0, ix1), (iy1, iy0) = (np.asarray(v, dtype=np.float64).tolist() for v in a.to_pt([ex0, ex1], [ey0, ey1]))
            out.append(("image", (ix0, iy0, ix1, iy1), rgb, clip))
        elif kind == "data_text":
            _, xx, yy, s, size, ha, va, dx, dy = it
            px, py = a.to_pt(xx, yy)
            if math.isfinite(float(px)) and math.isfinite(float(py)):
                out.append(("text", float(px) + dx, float(py) + dy, s, size, ha, va, "#000000", 0.0))
        elif kind in ("hline", "vline"):
            _, v, color, lw, dash = it
            if kind == "hline":
                _, py = a.to_pt(xl[0], v)
                pts = [(x0, float(py)), (x1, float(py))]
            else:
                px, _ = a.to_pt(v, yl[0])
                pts = [(float(px), y0), (float(px), y1)]
            out.append(("line", pts, color, lw, dash, clip))
        elif kind == "vspan":
            _, v0, v1, color, alpha, hatch = it
            pa_, _ = a.to_pt(v0, yl[0])
            pb_, _ = a.to_pt(v1, yl[0])
            lo, hi = sorted((float(pa_), float(pb_)))
            if hatch:
                out.append(("hatch", (lo, y0, hi, y1), color, clip))
            else:
                out.append(("poly", [(lo, y0), (hi, y0), (hi, y1), (lo, y1)], color, alpha, clip))
        elif kind == "text":
            _, fx, fy, s, size, ha, va, color = it
            out.append(("text", x0 + fx * (x1 - x0), y1 - fy * (y1 - y0), s, size, ha, va, color, 0.0))
    # frame, ticks, tick labels, axis labels, title
    out.append(("rect", (x0, y0, x1, y1), "#000000", 0.8))
    if a.colorbar_spec is not None:
        out.extend(colorbar_primitives(a))
    xscale = (a.sharex or a).xscale
    if a.xtick_override is not None:
        xt, xlab, rot = a.xtick_override
        xminor: list[float] = []
    else:
        xt, xlab, xminor = _ticks(*xl, xscale, (a.sharex or a).linthresh)
        rot = 0.0
    yt, ylab, yminor = _ticks(*yl, a.yscale, a.linthresh)
    ysize = _TICK_SIZE
    if a.ytick_override is not None:
        yt, ylab, ysize = a.ytick_override
        yminor = []
    if a.grid_lw:  # under everything drawn so far
        gx = [float(a.to_pt(v, yl[0])[0]) for v in xt]
        gy = [float(a.to_pt(xl[0], v)[1]) for v in yt]
        out[:0] = [("line", [(px, y0), (px, y1)], "#b0b0b0", a.grid_lw, False, clip) for px in gx if x0 <= px <= x1] + [
            ("line", [(x0, py), (x1, py)], "#b0b0b0", a.grid_lw, False, clip) for py in gy if y0 <= py <= y1
        ]
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
    out.extend(legend_primitives(a))
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
