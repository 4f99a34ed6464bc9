"""One panel of a :class:`gpuclust.report.draw.Figure`: what it draws (items in data coordinates),
its limits and scales, and the transform from data to the figure's points."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuclust.report.draw.style import COLORS, _color, _size, viridis
from gpuclust.report.draw.ticks import _symlog, _symlog_inverse

if TYPE_CHECKING:
    from gpuclust.report.draw.figure import Figure


class Axes:
    """One panel: data items in data coordinates, limits, scales, labels, a legend."""

    def __init__(self, fig: Figure, row: int, col: int):
        self.fig, self.row, self.col = fig, row, col
        self.items: list[tuple[Any, ...]] = []
        self.legend_items: list[tuple[str, dict[str, Any]]] = []
        self.xlim: tuple[float | None, float | None] = (None, None)
        self.ylim: tuple[float | None, float | None] = (None, None)
        self.xscale = self.yscale = "linear"  # or "log", or "symlog" (linear inside +-linthresh)
        self.linthresh = 1.0
        self.xlabel = self.ylabel = self.title = ""
        self.xticklabels_visible = True
        self.yticklabels_visible = True
        self.xtick_override: tuple[list[float], list[str], float] | None = None
        self.ytick_override: tuple[list[float], list[str], float] | None = None  # positions, labels, size
        self.legend_spec: dict[str, Any] | None = None
        self.grid_lw = 0.0  # > 0: grid lines at the major ticks
        self.colorbar_spec: tuple[float, float, str] | None = None
        self.sharex: Axes | None = None
        self._next = 0
        self._data_x: list[float] = []
        self._data_y: list[float] = []
        self.box = (0.0, 0.0, 1.0, 1.0)  # x0, y0, x1, y1 in points from the top left (after layout)

    # -- what it draws
    def next_color(self) -> str:
        c = COLORS[self._next % len(COLORS)]
        self._next += 1
        return c

    def _extent(self, x: Any, y: Any) -> None:
        for arr, into in ((x, self._data_x), (y, self._data_y)):
            a = np.asarray(arr, dtype=np.float64)
            a = a[np.isfinite(a)]
            if a.size:
                into.extend((float(a.min()), float(a.max())))

    def _label(self, label: str | None, **how: Any) -> None:
        if label:
            self.legend_items.append((label, how))

    def stack_steps(self, edges: Any, ys: Sequence[Any], labels: Sequence[str], *, alpha: float = 0.85) -> None:
        """Stacked areas, each value held over its bucket ``[edges[i], edges[i+1])`` (matplotlib's
        ``stackplot(..., step="post")``); a NaN leaves a gap in its layer and the ones above."""
        edges = np.asarray(edges, dtype=np.float64)
        base = np.zeros(edges.size - 1)
        for y, label in zip(ys, labels, strict=True):
            top = base + np.asarray(y, dtype=np.float64)
            color = self.next_color()
            self.items.append(("steps_fill", edges, base.copy(), top.copy(), color, alpha))
            self._label(label, kind="patch", color=color, alpha=alpha)
            self._extent(edges, top)
            base = top
        self._extent([], [0.0])

    def stairs(
        self,
        values: Any,
        edges: Any,
        *,
        label: str | None = None,
        color: str | None = None,
        lw: float = 1.5,
        dash: bool = False,
    ) -> None:
        """A step line: ``values[i]`` over ``[edges[i], edges[i+1])``."""
        edges, v = np.asarray(edges, dtype=np.float64), np.asarray(values, dtype=np.float64)
        x = np.repeat(edges, 2)[1:-1]
        y = np.repeat(v, 2)
        self.plot(x, y, label=label, color=color, lw=lw, dash=dash)

    def step(self, x: Any, y: Any, *, label: str | None = None, color: str | None = None, lw: float = 1.5) -> None:
        """matplotlib's ``step(x, y, where="post")``."""
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        if x.size == 0:
            return
        xs = np.repeat(x, 2)[1:]
        ys = np.repeat(y, 2)[:-1]
        self.plot(xs, ys, label=label, color=color, lw=lw)

    def plot(
        self,
        x: Any,
        y: Any,
        *,
        label: str | None = None,
        color: str | None = None,
        lw: float = 1.5,
        dash: bool = False,
        alpha: float = 1.0,
    ) -> None:
        """A line through the points (a NaN breaks it); ``alpha`` < 1: translucent."""
        color = _color(color) if color else self.next_color()
        if alpha < 1:
            color += f"{round(255 * alpha):02x}"
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        self.items.append(("line", x, y, color, lw, dash))
        self._label(label, kind="line", color=color, lw=lw, dash=dash)
        self._extent(x, y)

    def scatter(
        self,
        x: Any,
        y: Any,
        *,
        marker: str = "o",
        size: float = 36.0,
        color: str | None = None,
        alpha: float = 1.0,
        label: str | None = None,
    ) -> None:
        """Markers at the points: ``o`` (disc) or ``*`` (star), ``size`` their area in pt² (as
        matplotlib's ``s``), one size or one per point."""
        color = _color(color) if color else self.next_color()
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        r = np.broadcast_to(np.sqrt(np.asarray(size, dtype=np.float64)) / 2, x.shape)
        self.items.append(("markers", x, y, marker, r, color, alpha))
        self._label(label, kind="marker", color=color, alpha=alpha)
        self._extent(x, y)

    def image(
        self, values: Any, extent: tuple[float, float, float, float], *, vmin: float, vmax: float, nan: str = "0.85"
    ) -> None:
        """A grid of cells coloured by value (viridis, NaN in ``nan``) over ``extent`` (x0, x1, y0,
        y1 in data coordinates), row 0 at the bottom (matplotlib's ``imshow(origin="lower",
        interpolation="nearest")``)."""
        rgb = viridis(values, vmin, vmax, nan)[::-1]
        self.items.append(("image", rgb, *(float(v) for v in extent)))
        self._extent(extent[:2], extent[2:])

    def colorbar(self, vmin: float, vmax: float, label: str = "") -> None:
        """A viridis scale from ``vmin`` to ``vmax`` right of the axes, ``label`` beside it."""
        self.colorbar_spec = (float(vmin), float(vmax), label)

    def grid(self, lw: float = 0.3) -> None:
        """Grey lines at the major ticks, under the data."""
        self.grid_lw = lw

    def rects(
        self, x0: Any, x1: Any, y0: Any, y1: Any, *, color: str | Sequence[str] | None = None, label: str | None = None
    ) -> None:
        """Filled rectangles ``[x0, x1] x [y0, y1]`` (data coordinates; an edge at 0 on a log axis
        reaches the axes' edge); ``color``: one colour or one per rectangle."""
        x0, x1, y0, y1 = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (x0, x1, y0, y1)))
        if color is None or isinstance(color, str):
            colors = [_color(color) if color else self.next_color()] * x0.size
        else:
            colors = [_color(c) for c in color]
        self.items.append(("rects", x0.ravel(), x1.ravel(), y0.ravel(), y1.ravel(), colors))
        self._label(label, kind="patch", color=colors[0] if colors else "#000000")
        self._extent(np.concatenate([x0.ravel(), x1.ravel()]), np.concatenate([y0.ravel(), y1.ravel()]))

    def bar(
        self,
        x: Any,
        heights: Any,
        *,
        width: float = 0.8,
        color: str | None = None,
        value_labels: Sequence[str] | None = None,
        label_size: float | str = "x-small",
    ) -> None:
        """Vertical bars centred on ``x``, with an optional label above each."""
        x, h = np.asarray(x, dtype=np.float64), np.asarray(heights, dtype=np.float64)
        self.rects(x - width / 2, x + width / 2, 0.0, h, color=color)
        if value_labels is not None:
            for xx, hh, s in zip(x, h, value_labels, strict=True):
                self.text_at(float(xx), float(hh), s, size=label_size, ha="center", va="bottom", dy=-1.5)

    def barh(
        self,
        y: Any,
        widths: Any,
        *,
        height: float = 0.8,
        color: str | Sequence[str] | None = None,
        label: str | None = None,
    ) -> None:
        """Horizontal bars from 0, centred on ``y``."""
        y = np.asarray(y, dtype=np.float64)
        self.rects(0.0, widths, y - height / 2, y + height / 2, color=color, label=label)

    def text_at(
        self,
        x: float,
        y: float,
        s: str,
        *,
        size: float | str = "medium",
        ha: str = "left",
        va: str = "baseline",
        dx: float = 0.0,
        dy: float = 0.0,
    ) -> None:
        """Text at data ``(x, y)``, moved by ``(dx, dy)`` points (right, down)."""
        self.items.append(("data_text", float(x), float(y), s, _size(size), ha, va, dx, dy))

    def axhline(
        self, y: float, *, color: str = "k", lw: float = 0.8, dash: bool = False, label: str | None = None
    ) -> None:
        """A line across the axes at ``y`` (counts for the automatic y limits, as matplotlib's)."""
        self.items.append(("hline", float(y), _color(color), lw, dash))
        self._extent([], [y])
        self._label(label, kind="line", color=_color(color), lw=lw, dash=dash)

    def axvline(
        self, x: float, *, color: str = "k", lw: float = 0.8, dash: bool = False, label: str | None = None
    ) -> None:
        self.items.append(("vline", float(x), _color(color), lw, dash))
        self._label(label, kind="line", color=_color(color), lw=lw, dash=dash)

    def axvspan(
        self,
        x0: float,
        x1: float,
        *,
        color: str = "0.78",
        alpha: float = 1.0,
        hatch: bool = False,
        label: str | None = None,
    ) -> None:
        """A band over the whole height (its ends count for the automatic x limits, as matplotlib's);
        ``hatch``: diagonal lines instead of a fill."""
        self.items.append(("vspan", float(x0), float(x1), _color(color), alpha, hatch))
        self._extent([x0, x1], [])
        self._label(label, kind="hatch" if hatch else "patch", color=_color(color), alpha=alpha)

    def text(
        self,
        fx: float,
        fy: float,
        s: str,
        *,
        size: float | str = "medium",
        ha: str = "left",
        va: str = "baseline",
        color: str = "k",
    ) -> None:
        """Text at axes fractions ``(fx, fy)`` (origin bottom left)."""
        self.items.append(("text", fx, fy, s, _size(size), ha, va, _color(color)))

    def legend(
        self, *, loc: str = "upper left", title: str | None = None, size: float | str = "small", outside: bool = False
    ) -> None:
        """A legend of the labelled items; ``outside``: to the right of the axes, top aligned."""
        self.legend_spec = {"loc": loc, "title": title, "size": _size(size), "outside": outside}

    def set_xticks(self, positions: Sequence[float], labels: Sequence[str], *, rotation: float = 0.0) -> None:
        self.xtick_override = ([float(p) for p in positions], [str(s) for s in labels], float(rotation))

    def set_yticks(self, positions: Sequence[float], labels: Sequence[str], *, size: float | str = "medium") -> None:
        self.ytick_override = ([float(p) for p in positions], [str(s) for s in labels], _size(size))

    # -- limits and transforms
    def limits(self) -> tuple[tuple[float, float], tuple[float, float]]:
        def auto(
            lim: tuple[float | None, float | None], data: list[float], scale: str, lt: float
        ) -> tuple[float, float]:
            vals = [v for v in data if scale != "log" or v > 0]
            lo_d, hi_d = (min(vals), max(vals)) if vals else ((1.0, 10.0) if scale == "log" else (0.0, 1.0))
            if scale == "symlog":  # the 5% margins in the transformed space
                a, b = float(_symlog(lo_d, lt)), float(_symlog(hi_d, lt))
                pad = 0.05 * (b - a) if b > a else 0.5
                lo_a, hi_a = _symlog_inverse(a - pad, lt), _symlog_inverse(b + pad, lt)
            elif scale == "log":
                a, b = math.log10(lo_d), math.log10(hi_d)
                pad = 0.05 * (b - a) if b > a else 0.5
                lo_a, hi_a = 10 ** (a - pad), 10 ** (b + pad)
            else:
                pad = 0.05 * (hi_d - lo_d) if hi_d > lo_d else (abs(hi_d) * 0.05 or 0.5)
                lo_a, hi_a = lo_d - pad, hi_d + pad
            lo = lim[0] if lim[0] is not None else lo_a
            hi = lim[1] if lim[1] is not None else hi_a
            if hi <= lo:
                hi = lo + (abs(lo) or 1.0)
            return float(lo), float(hi)

        src = self.sharex or self
        data_x = [v for a in self.shared() for v in a._data_x]
        return (
            auto(src.xlim, data_x, src.xscale, src.linthresh),
            auto(self.ylim, self._data_y, self.yscale, self.linthresh),
        )

    def shared(self) -> list[Axes]:
        """The axes sharing this one's x axis (itself included)."""
        src = self.sharex or self
        return [src, *(a for a in self.fig.axes if a.sharex is src)]

    def _f(self, v: Any, lim: tuple[float, float], scale: str, linthresh: float = 1.0) -> Any:
        v = np.asarray(v, dtype=np.float64)
        if scale == "symlog":
            a, b = _symlog(np.asarray(lim), linthresh)
            return (_symlog(v, linthresh) - a) / (b - a)
        if scale == "log":
            with np.errstate(divide="ignore", invalid="ignore"):
                return (np.log10(v) - math.log10(lim[0])) / (math.log10(lim[1]) - math.log10(lim[0]))
        return (v - lim[0]) / (lim[1] - lim[0])

    def to_pt(self, x: Any, y: Any) -> tuple[Any, Any]:
        """Data -> points from the figure's top left."""
        (xl, yl) = self.limits()
        x0, y0, x1, y1 = self.box
        src = self.sharex or self
        return (
            x0 + self._f(x, xl, src.xscale, src.linthresh) * (x1 - x0),
            y1 - self._f(y, yl, self.yscale, self.linthresh) * (y1 - y0),
        )
