"""Figures drawn without matplotlib: a few kinds of axes content, written as SVG or as PNG.

Importing matplotlib (and pandas, which the matplotlib plots draw from) costs about a second of
every ``gpuclust analyze`` that writes a figure, more than the analysis itself on a small cell
(issue 33).  The figures whose content is simple (filled steps, lines, bars, spans) are drawn here
instead, from NumPy arrays, in a few milliseconds:

* :meth:`Figure.save` to ``*.svg``: text as text, and the root element's ``data-axes`` carries per
  axes its box (figure fractions, origin bottom left), limits, scales and labels, which the report
  page's hover reads (a drawing over :data:`gpuclust.report.svg.MAX_SVG_BYTES` is a PNG inside the
  SVG, with the same ``data-axes``);
* to ``*.png``: rasterised with Pillow (a matplotlib dependency, ~30 ms to import), drawn at twice
  the size and reduced, so edges and text are smooth.

Layout is in points (1/72 in) with the origin at the top left; the axes' margins follow from their
tick labels, axis labels and legends, like matplotlib's constrained layout.  Colours are
matplotlib's default cycle (``C0`` ...), font sizes its named sizes, the font DejaVu Sans (the one
matplotlib ships and uses by default).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["COLORS", "Axes", "Figure", "first", "nice_ticks", "numbers", "strings"]

#: matplotlib's default colour cycle ("tab10").
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")
_SIZES = {"xx-small": 5.79, "x-small": 6.94, "small": 8.33, "medium": 10.0, "large": 12.0}
_FONT_FAMILY = "DejaVu Sans, Bitstream Vera Sans, Arial, Helvetica, sans-serif"
_TICK_SIZE = 10.0  # matplotlib's tick labels: "medium" at font.size 10
_LINE = 1.2  # line height, in font sizes
_PAD = 3.5  # points between a tick label and its tick, or a label and the tick labels
_TICK = 3.5  # tick length


def _runs(ok: np.ndarray) -> Any:
    """``(start, stop)`` of each run of True in ``ok``."""
    edges = np.flatnonzero(np.diff(np.r_[False, ok, False].astype(np.int8)))
    return zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True)


def _size(s: float | str) -> float:
    return float(_SIZES[s]) if isinstance(s, str) else float(s)


def _color(c: str | None) -> str:
    if c is None:
        return "none"
    if c.startswith("C") and c[1:].isdigit():
        return COLORS[int(c[1:]) % len(COLORS)]
    if c.replace(".", "", 1).isdigit():  # a grey level, "0.3"
        v = round(float(c) * 255)
        return f"#{v:02x}{v:02x}{v:02x}"
    return {"k": "#000000", "r": "#ff0000", "grey": "#808080", "gray": "#808080", "white": "#ffffff"}.get(c, c)


def _rgb(c: str) -> tuple[int, int, int]:
    c = _color(c).lstrip("#")
    return int(c[0:2], 16), int(c[2:4], 16), int(c[4:6], 16)


#: matplotlib's "viridis" at 33 evenly spaced levels (interpolated linearly between them).
_VIRIDIS = ("440154470d6048186a482374472d7b4537814240863e49893b528b375b8d33638d2f6b8e2c728e297a8e26828e23898e21918c1f"
            "988b1fa08822a78528ae8032b67a3fbc734ec36b5ec96270cf5784d44b98d83eaddc30c2df23d8e219ece51bfde725")


def viridis(values: Any, vmin: float, vmax: float, nan: str = "0.85") -> np.ndarray:
    """``values`` (any shape) as viridis RGB (uint8, one more axis of 3), ``vmin`` and ``vmax`` the
    ends of the scale (values beyond them clipped), NaN as the colour ``nan``."""
    lut = np.frombuffer(bytes.fromhex(_VIRIDIS), dtype=np.uint8).reshape(-1, 3).astype(np.float64)
    v = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        t = np.clip((v - vmin) / ((vmax - vmin) or 1.0), 0.0, 1.0) * (len(lut) - 1)
    t = np.nan_to_num(t)
    i = np.minimum(t.astype(np.int64), len(lut) - 2)
    f = (t - i)[..., None]
    rgb = np.rint(lut[i] * (1 - f) + lut[i + 1] * f).astype(np.uint8)
    rgb[np.isnan(v)] = _rgb(nan)
    return rgb


def _rgba(c: str) -> tuple[int, ...]:
    """A colour, ``#rrggbb`` or ``#rrggbbaa`` (a translucent line's), as Pillow's RGB(A) tuple."""
    return (*_rgb(c), int(c[7:9], 16)) if len(c) == 9 else _rgb(c)


# ------------------------------------------------------------------- result tables, pandas or not
def _is_arrow(t: Any) -> bool:
    return hasattr(t, "column_names")


def names_of(t: Any) -> list[str]:
    return list(t.column_names) if _is_arrow(t) else [str(c) for c in t.columns]


def numbers(t: Any, name: str) -> np.ndarray:
    """A number column as float64 (NULL as NaN)."""
    from gpuclust.tables import column

    return np.asarray(column(t, name), dtype=np.float64)


def strings(t: Any, name: str) -> np.ndarray:
    """A text column as an object array of ``str`` (an Arrow string column's ``to_numpy`` would
    import pandas: a second of the run)."""
    vals = t.column(name).to_pylist() if _is_arrow(t) else t[name].tolist()
    return np.asarray([str(v) for v in vals], dtype=object)


def first(t: Any, name: str, default: Any = None) -> Any:
    """The first row's ``name`` (``default`` when the table, the column or the value is missing)."""
    if t is None or len(t) == 0 or name not in names_of(t):
        return default
    v = t.column(name)[0].as_py() if _is_arrow(t) else t[name].iloc[0]
    if isinstance(v, np.generic):
        v = v.item()
    return default if v is None or (isinstance(v, float) and v != v) else v


# ----------------------------------------------------------------------------------------- text
@lru_cache(maxsize=1)
def _font_path() -> str | None:
    """DejaVu Sans from matplotlib's data folder, found without importing matplotlib."""
    import importlib.util

    spec = importlib.util.find_spec("matplotlib")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf"
        if p.is_file():
            return str(p)
    return None


@lru_cache(maxsize=64)
def _font(px: int) -> Any:
    from PIL import ImageFont

    path = _font_path()
    if path is not None:
        try:
            return ImageFont.truetype(path, px)
        except OSError:
            pass
    return ImageFont.load_default(px)


def text_width(s: str, size: float) -> float:
    """Width in points of one line of ``s`` at ``size`` points (measured at 100 pt, scaled)."""
    if not s:
        return 0.0
    return float(_font(100).getlength(s)) * size / 100.0


def _block(s: str, size: float) -> tuple[float, float]:
    """Width and height in points of a (multi-line) text."""
    lines = s.split("\n")
    return max(text_width(line, size) for line in lines), size * (_LINE * (len(lines) - 1) + 1.0)


def wrap(s: str, width_pt: float, size: float) -> str:
    """``s`` broken at spaces into lines at most ``width_pt`` wide."""
    out: list[str] = []
    for para in s.split("\n"):
        line = ""
        for word in para.split(" "):
            cand = f"{line} {word}" if line else word
            if line and text_width(cand, size) > width_pt:
                out.append(line)
                line = word
            else:
                line = cand
        out.append(line)
    return "\n".join(out)


# ---------------------------------------------------------------------------------------- ticks
def nice_ticks(lo: float, hi: float, n: int = 6) -> tuple[np.ndarray, int]:
    """Ticks at 1, 2, 2.5 or 5 times a power of ten inside ``[lo, hi]`` (about ``n`` of them), and
    the decimals their labels need."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return np.array([lo]), 0
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * 0.999)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = np.arange(first, hi + step * 1e-9, step)
    decimals = -math.floor(math.log10(step) + 1e-12)
    if round(step / 10.0 ** math.floor(math.log10(step)), 6) == 2.5:
        decimals += 1  # 0.25, 2.5: one more digit (25000: none)
    return ticks, max(0, decimals)


def _tick_label(v: float, decimals: int) -> str:
    if abs(v) >= 1e6 or (v != 0 and abs(v) < 1e-4):
        return f"{v:.3g}"
    s = f"{v:.{decimals}f}"
    return "0" if s.strip("-0.") == "" else s


_SUP = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _log_label(k: int) -> str:
    if 0 <= k <= 3:
        return str(10**k)
    if -2 <= k < 0:
        return f"{10.0 ** k:g}"
    return "10" + str(k).translate(_SUP)


_SYMLOG_LIN = 1.0 / (1.0 - 0.1)  # matplotlib's symlog, base 10, linscale 1: the linear part's width in decades


def _symlog(v: Any, linthresh: float) -> Any:
    """matplotlib's ``symlog`` transform (base 10, linscale 1), in decades: linear inside
    ``[-linthresh, linthresh]``, logarithmic outside."""
    v = np.asarray(v, dtype=np.float64) / linthresh
    a = np.abs(v)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(a <= 1.0, v * _SYMLOG_LIN, np.sign(v) * (_SYMLOG_LIN + np.log10(np.maximum(a, 1.0))))


def _symlog_inverse(t: float, linthresh: float) -> float:
    a = abs(t)
    v = t / _SYMLOG_LIN if a <= _SYMLOG_LIN else math.copysign(10.0 ** (a - _SYMLOG_LIN), t)
    return v * linthresh


def _ticks(lo: float, hi: float, scale: str, linthresh: float = 1.0) -> tuple[list[float], list[str], list[float]]:
    """Major ticks and their labels, and minor ticks (log and symlog axes), inside ``[lo, hi]``."""
    if scale == "symlog":  # 0 and +-10^k outside the linear part, minor ticks at their multiples
        k0 = math.ceil(math.log10(linthresh) - 1e-9)
        k1 = math.ceil(math.log10(max(abs(lo), abs(hi), linthresh)) + 1e-9)
        pairs = [(0.0, "0")] if lo <= 0 <= hi else []
        for k in range(k0, k1 + 1):
            pairs += [(sign * 10.0**k, ("\u2212" if sign < 0 else "") + _log_label(k)) for sign in (-1, 1)
                      if lo - 1e-12 <= sign * 10.0**k <= hi + 1e-12]
        pairs.sort()
        minor = [sign * m * 10.0**k for k in range(k0, k1 + 1) for m in range(2, 10) for sign in (-1, 1)
                 if lo <= sign * m * 10.0**k <= hi]
        return [p[0] for p in pairs], [p[1] for p in pairs], minor
    if scale == "log":
        a, b = math.floor(math.log10(lo) + 1e-9), math.ceil(math.log10(hi) - 1e-9)
        major = [10.0**k for k in range(a, b + 1) if lo * (1 - 1e-9) <= 10.0**k <= hi * (1 + 1e-9)]
        step = max(1, math.ceil((b - a) / 8))
        major = [v for v in major if round(math.log10(v)) % step == 0]
        minor = [m * 10.0**k for k in range(a - 1, b + 1) for m in range(2, 10) if lo <= m * 10.0**k <= hi]
        labels = [_log_label(round(math.log10(v))) for v in major]
        if len(major) < 2:  # less than two decades shown: label some minor ticks too
            extra = [v for v in minor if round(v / 10.0 ** math.floor(math.log10(v) + 1e-9)) in (2, 5)]
            pairs = sorted([*zip(major, labels, strict=True), *((v, f"{v:g}") for v in extra)])
            major, labels = [p[0] for p in pairs], [p[1] for p in pairs]
        return major, labels, minor
    t, dec = nice_ticks(lo, hi)
    return [float(v) for v in t], [_tick_label(float(v), dec) for v in t], []


def _scale_name(scale: str) -> str:
    """A scale as the page's hover reads it: ``linear``, ``log``, or ``other`` (not read back)."""
    return scale if scale in ("linear", "log") else "other"


# ----------------------------------------------------------------------------------------- axes
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

    def stairs(self, values: Any, edges: Any, *, label: str | None = None, color: str | None = None,
               lw: float = 1.5, dash: bool = False) -> None:
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

    def plot(self, x: Any, y: Any, *, label: str | None = None, color: str | None = None, lw: float = 1.5,
             dash: bool = False, alpha: float = 1.0) -> None:
        """A line through the points (a NaN breaks it); ``alpha`` < 1: translucent."""
        color = _color(color) if color else self.next_color()
        if alpha < 1:
            color += f"{round(255 * alpha):02x}"
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        self.items.append(("line", x, y, color, lw, dash))
        self._label(label, kind="line", color=color, lw=lw, dash=dash)
        self._extent(x, y)

    def scatter(self, x: Any, y: Any, *, marker: str = "o", size: float = 36.0, color: str | None = None,
                alpha: float = 1.0, label: str | None = None) -> None:
        """Markers at the points: ``o`` (disc) or ``*`` (star), ``size`` their area in pt² (as
        matplotlib's ``s``), one size or one per point."""
        color = _color(color) if color else self.next_color()
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        r = np.broadcast_to(np.sqrt(np.asarray(size, dtype=np.float64)) / 2, x.shape)
        self.items.append(("markers", x, y, marker, r, color, alpha))
        self._label(label, kind="marker", color=color, alpha=alpha)
        self._extent(x, y)

    def image(self, values: Any, extent: tuple[float, float, float, float], *, vmin: float, vmax: float,
              nan: str = "0.85") -> None:
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

    def rects(self, x0: Any, x1: Any, y0: Any, y1: Any, *, color: str | Sequence[str] | None = None,
              label: str | None = None) -> None:
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

    def bar(self, x: Any, heights: Any, *, width: float = 0.8, color: str | None = None,
            value_labels: Sequence[str] | None = None, label_size: float | str = "x-small") -> None:
        """Vertical bars centred on ``x``, with an optional label above each."""
        x, h = np.asarray(x, dtype=np.float64), np.asarray(heights, dtype=np.float64)
        self.rects(x - width / 2, x + width / 2, 0.0, h, color=color)
        if value_labels is not None:
            for xx, hh, s in zip(x, h, value_labels, strict=True):
                self.text_at(float(xx), float(hh), s, size=label_size, ha="center", va="bottom", dy=-1.5)

    def barh(self, y: Any, widths: Any, *, height: float = 0.8, color: str | Sequence[str] | None = None,
             label: str | None = None) -> None:
        """Horizontal bars from 0, centred on ``y``."""
        y = np.asarray(y, dtype=np.float64)
        self.rects(0.0, widths, y - height / 2, y + height / 2, color=color, label=label)

    def text_at(self, x: float, y: float, s: str, *, size: float | str = "medium", ha: str = "left",
                va: str = "baseline", dx: float = 0.0, dy: float = 0.0) -> None:
        """Text at data ``(x, y)``, moved by ``(dx, dy)`` points (right, down)."""
        self.items.append(("data_text", float(x), float(y), s, _size(size), ha, va, dx, dy))

    def axhline(self, y: float, *, color: str = "k", lw: float = 0.8, dash: bool = False,
                label: str | None = None) -> None:
        """A line across the axes at ``y`` (counts for the automatic y limits, as matplotlib's)."""
        self.items.append(("hline", float(y), _color(color), lw, dash))
        self._extent([], [y])
        self._label(label, kind="line", color=_color(color), lw=lw, dash=dash)

    def axvline(self, x: float, *, color: str = "k", lw: float = 0.8, dash: bool = False,
                label: str | None = None) -> None:
        self.items.append(("vline", float(x), _color(color), lw, dash))
        self._label(label, kind="line", color=_color(color), lw=lw, dash=dash)

    def axvspan(self, x0: float, x1: float, *, color: str = "0.78", alpha: float = 1.0, hatch: bool = False,
                label: str | None = None) -> None:
        """A band over the whole height (its ends count for the automatic x limits, as matplotlib's);
        ``hatch``: diagonal lines instead of a fill."""
        self.items.append(("vspan", float(x0), float(x1), _color(color), alpha, hatch))
        self._extent([x0, x1], [])
        self._label(label, kind="hatch" if hatch else "patch", color=_color(color), alpha=alpha)

    def text(self, fx: float, fy: float, s: str, *, size: float | str = "medium", ha: str = "left",
             va: str = "baseline", color: str = "k") -> None:
        """Text at axes fractions ``(fx, fy)`` (origin bottom left)."""
        self.items.append(("text", fx, fy, s, _size(size), ha, va, _color(color)))

    def legend(self, *, loc: str = "upper left", title: str | None = None, size: float | str = "small",
               outside: bool = False) -> None:
        """A legend of the labelled items; ``outside``: to the right of the axes, top aligned."""
        self.legend_spec = {"loc": loc, "title": title, "size": _size(size), "outside": outside}

    def set_xticks(self, positions: Sequence[float], labels: Sequence[str], *, rotation: float = 0.0) -> None:
        self.xtick_override = ([float(p) for p in positions], [str(s) for s in labels], float(rotation))

    def set_yticks(self, positions: Sequence[float], labels: Sequence[str], *, size: float | str = "medium") -> None:
        self.ytick_override = ([float(p) for p in positions], [str(s) for s in labels], _size(size))

    # -- limits and transforms
    def limits(self) -> tuple[tuple[float, float], tuple[float, float]]:
        def auto(lim: tuple[float | None, float | None], data: list[float], scale: str,
                 lt: float) -> tuple[float, float]:
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
        return (auto(src.xlim, data_x, src.xscale, src.linthresh),
                auto(self.ylim, self._data_y, self.yscale, self.linthresh))

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
        return (x0 + self._f(x, xl, src.xscale, src.linthresh) * (x1 - x0),
                y1 - self._f(y, yl, self.yscale, self.linthresh) * (y1 - y0))


# --------------------------------------------------------------------------------------- figure
class Figure:
    """A figure of ``rows`` x ``cols`` axes, ``width`` x ``height`` inches."""

    def __init__(self, width: float = 10.0, height: float = 4.5, *, dpi: int = 100):
        self.width, self.height, self.dpi = float(width), float(height), int(dpi)
        self.axes: list[Axes] = []
        self.suptitle = ""
        self.grid = (1, 1)
        self.width_ratios: list[float] | None = None
        self.height_ratios: list[float] | None = None

    @property
    def size_pt(self) -> tuple[float, float]:
        return self.width * 72.0, self.height * 72.0

    def subplots(self, rows: int = 1, cols: int = 1, *, sharex: bool = False, sharey: bool = False,
                 width_ratios: Sequence[float] | None = None,
                 height_ratios: Sequence[float] | None = None) -> list[Axes]:
        """The axes, row by row; ``sharex``: one x axis, tick labels under the bottom row only;
        ``sharey``: y tick labels in the left column only (set the same ``ylim`` on each)."""
        self.grid = (rows, cols)
        self.width_ratios = list(width_ratios) if width_ratios else None
        self.height_ratios = list(height_ratios) if height_ratios else None
        self.axes = [Axes(self, r, c) for r in range(rows) for c in range(cols)]
        if sharey:
            for a in self.axes:
                a.yticklabels_visible = a.col == 0
        if sharex:
            for a in self.axes:
                if a is not self.axes[0]:
                    a.sharex = self.axes[0]
            for a in self.axes[: (rows - 1) * cols]:
                a.xticklabels_visible = False
        return self.axes

    def set_title(self, title: str, what: str | None = None) -> None:
        """The title (the analysis and the dataset / cell it shows) over ``what`` (what the figure
        shows), each wrapped to the figure's width so that nothing is clipped."""
        w = self.size_pt[0] - 20
        self.suptitle = "\n".join([wrap(title, w, 10.0)] + ([wrap(what, w, 10.0)] if what else []))

    # -- layout
    def _legend_size(self, ax: Axes) -> tuple[float, float]:
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

    def _layout(self) -> None:
        W, H = self.size_pt
        rows, cols = self.grid
        top = 6.0 + (_block(self.suptitle, 10.0)[1] + 6.0 if self.suptitle else 0.0)
        need: dict[Axes, dict[str, float]] = {}
        for a in self.axes:
            (xl, yl) = a.limits()
            _, ylabels, _ = _ticks(*yl, a.yscale, a.linthresh)
            ysize = _TICK_SIZE
            if a.ytick_override is not None:
                _, ylabels, ysize = a.ytick_override
            if not a.yticklabels_visible:
                ylabels = []
            left = max((text_width(s, ysize) for s in ylabels), default=0.0) + _TICK + _PAD + 4.0
            if a.ylabel:
                left += _block(a.ylabel, 10.0)[1] + _PAD
            bottom = 4.0
            if a.xticklabels_visible:
                if a.xtick_override is not None and a.xtick_override[2]:
                    labels, rot = a.xtick_override[1], math.radians(a.xtick_override[2])
                    size = 8.33
                    bottom += max((text_width(s, size) * math.sin(rot) + size * math.cos(rot) for s in labels),
                                  default=0.0) + _TICK + _PAD
                else:
                    bottom += _TICK_SIZE + _TICK + _PAD
                if a.xlabel:
                    bottom += _block(a.xlabel, 10.0)[1] + _PAD
            right = 8.0
            if a.legend_spec is not None and a.legend_spec["outside"]:
                right += self._legend_size(a)[0] + 6.0
            if a.colorbar_spec is not None:  # the bar (3% of the axes' width with its gap), ticks, labels
                vmin, vmax, label = a.colorbar_spec
                right += 0.03 * W + _TICK + _PAD + max(text_width(t, _TICK_SIZE) for t in
                                                       _ticks(vmin, vmax, "linear")[1]) + _PAD
                right += _block(label, 10.0)[1] + _PAD if label else 0.0
            head = _block(a.title, 10.0)[1] + 6.0 if a.title else 4.0
            need[a] = {"left": left, "bottom": bottom, "right": right, "top": head}
        ratios = self.width_ratios or [1.0] * cols
        col_w = [(W - 0.0) * r / sum(ratios) for r in ratios]
        col_x = [sum(col_w[:c]) for c in range(cols)]
        hr = self.height_ratios or [1.0] * rows
        row_hs = [(H - top) * r / sum(hr) for r in hr]
        row_y = [top + sum(row_hs[:r]) for r in range(rows)]
        for c in range(cols):
            in_col = [a for a in self.axes if a.col == c]
            left = max(need[a]["left"] for a in in_col)
            right = max(need[a]["right"] for a in in_col)
            for a in in_col:
                in_row = [b for b in self.axes if b.row == a.row]
                bottom = max(need[b]["bottom"] for b in in_row)
                head = max(need[b]["top"] for b in in_row)
                y0 = row_y[a.row]
                a.box = (col_x[c] + left, y0 + head, col_x[c] + col_w[c] - right, y0 + row_hs[a.row] - bottom)

    def geometry(self) -> list[dict[str, Any]]:
        """Per axes what the page's hover reads: box, limits, scales and labels."""
        W, H = self.size_pt
        out = []
        for a in self.axes:
            (xl, yl) = a.limits()
            x0, y0, x1, y1 = a.box
            xlabel = a.xlabel or next((b.xlabel for b in a.shared() if b.xlabel), "")  # a stacked panel's
            out.append({"box": [round(x0 / W, 5), round(1 - y1 / H, 5), round(x1 / W, 5), round(1 - y0 / H, 5)],
                        "x": list(xl), "y": list(yl), "xscale": _scale_name((a.sharex or a).xscale),
                        "yscale": _scale_name(a.yscale),
                        "xlabel": xlabel, "ylabel": a.ylabel})
        return out

    # -- drawing into primitives (points, top left origin)
    def _primitives(self) -> list[tuple[Any, ...]]:
        self._layout()
        W, H = self.size_pt
        out: list[tuple[Any, ...]] = []
        if self.suptitle:
            out.append(("text", W / 2, 6.0, self.suptitle, 10.0, "center", "top", "#000000", 0.0))
        for a in self.axes:
            out.extend(self._axes_primitives(a))
        return out

    def _axes_primitives(self, a: Axes) -> list[tuple[Any, ...]]:
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
                    xs = np.repeat(edges[i:j + 1], 2)[1:-1]
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
                for bx0, bx1, by0, by1, color in zip(px0.tolist(), px1.tolist(), py0.tolist(), py1.tolist(), colors,
                                                     strict=True):
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
                        pts = list(zip((cx + r * k * np.cos(t)).tolist(), (cy - r * k * np.sin(t)).tolist(),
                                       strict=True))
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
            out.extend(self._colorbar_primitives(a))
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
            out[:0] = ([("line", [(px, y0), (px, y1)], "#b0b0b0", a.grid_lw, False, clip) for px in gx if x0 <= px <= x1]
                       + [("line", [(x0, py), (x1, py)], "#b0b0b0", a.grid_lw, False, clip) for py in gy
                          if y0 <= py <= y1])
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
            out.append(("text", (x0 + x1) / 2, y1 + _TICK + _PAD + drop + _PAD, a.xlabel, 10.0, "center", "top",
                        "#000000", 0.0))
        if a.ylabel:
            _, h = _block(a.ylabel, 10.0)
            out.append(("text", x0 - _TICK - _PAD - ywidth - _PAD - h / 2, (y0 + y1) / 2, a.ylabel, 10.0, "center",
                        "center", "#000000", 90.0))
        if a.title:
            out.append(("text", (x0 + x1) / 2, y0 - 4.0, a.title, 10.0, "center", "bottom", "#000000", 0.0))
        out.extend(self._legend_primitives(a))
        return out

    @staticmethod
    def _colorbar_primitives(a: Axes) -> list[tuple[Any, ...]]:
        """The colour scale right of the axes (as matplotlib's colorbar in an inset at axes x 1.01,
        0.02 wide): the gradient, its frame, ticks and labels on its right, the label beside them."""
        assert a.colorbar_spec is not None
        vmin, vmax, label = a.colorbar_spec
        x0, y0, x1, y1 = a.box
        bx0 = x1 + 0.01 * (x1 - x0)
        bx1 = bx0 + 0.02 * (x1 - x0)
        out: list[tuple[Any, ...]] = [("image", (bx0, y0, bx1, y1), viridis(np.linspace(vmax, vmin, 256)[:, None],
                                                                           vmin, vmax), None),
                                      ("rect", (bx0, y0, bx1, y1), "#000000", 0.8)]
        width = 0.0
        for v, s in zip(*_ticks(vmin, vmax, "linear")[:2], strict=True):
            py = y1 - (v - vmin) / ((vmax - vmin) or 1.0) * (y1 - y0)
            if y0 - 0.5 <= py <= y1 + 0.5:
                out.append(("line", [(bx1, py), (bx1 + _TICK, py)], "#000000", 0.8, False, None))
                out.append(("text", bx1 + _TICK + _PAD, py, s, _TICK_SIZE, "left", "center", "#000000", 0.0))
                width = max(width, text_width(s, _TICK_SIZE))
        if label:
            h = _block(label, 10.0)[1]
            out.append(("text", bx1 + _TICK + _PAD + width + _PAD + h / 2, (y0 + y1) / 2, label, 10.0, "center",
                        "center", "#000000", 90.0))
        return out

    def _legend_primitives(self, a: Axes) -> list[tuple[Any, ...]]:
        spec = a.legend_spec
        if spec is None or not a.legend_items:
            return []
        w, h = self._legend_size(a)
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
                out.append(("poly", list(zip((sx + 0.9 * size + 0.4 * size * np.cos(t)).tolist(),
                                             (mid + 0.4 * size * np.sin(t)).tolist(), strict=True)),
                            how["color"], how.get("alpha", 1.0), None))
            elif how["kind"] == "hatch":
                out.append(("poly", [(sx, mid - 0.35 * size), (sx + 1.8 * size, mid - 0.35 * size),
                                     (sx + 1.8 * size, mid + 0.35 * size), (sx, mid + 0.35 * size)], "#ffffff", 1.0,
                            None))
                out.append(("hatch", (sx, mid - 0.35 * size, sx + 1.8 * size, mid + 0.35 * size), how["color"], None))
            else:
                out.append(("poly", [(sx, mid - 0.35 * size), (sx + 1.8 * size, mid - 0.35 * size),
                                     (sx + 1.8 * size, mid + 0.35 * size), (sx, mid + 0.35 * size)], how["color"],
                            how.get("alpha", 1.0), None))
            out.append(("text", sx + 2.4 * size, mid, label, size, "left", "center", "#000000", 0.0))
            y += size * 1.45
        return out

    # -- output
    def save(self, path: str | Path) -> None:
        """Write the figure to ``path`` (``.svg`` or ``.png``) atomically."""
        from gpuclust.report._files import write_atomic

        path = Path(path)
        if path.suffix == ".svg":
            text = self.to_svg()
            from gpuclust.report.svg import MAX_SVG_BYTES

            if len(text) > MAX_SVG_BYTES:  # too many vectors for a page (a month of 5-min buckets): a PNG in it
                text = self._raster_svg()
            write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
        else:
            data = self.to_png()
            write_atomic(path, lambda tmp: Path(tmp).write_bytes(data))

    def to_svg(self) -> str:
        prims = self._primitives()
        W, H = self.size_pt
        geometry = html.escape(json.dumps(self.geometry(), separators=(",", ":")), quote=True)
        clips: dict[tuple[float, ...], str] = {}
        body: list[str] = []
        defs: list[str] = []

        def n(v: float) -> str:
            s = f"{v:.2f}".rstrip("0").rstrip(".")
            return "0" if s == "-0" else s

        def clip_attr(c: tuple[float, ...] | None) -> str:
            if c is None:
                return ""
            if c not in clips:
                cid = f"c{len(clips)}"
                clips[c] = cid
                defs.append(f'<clipPath id="{cid}"><rect x="{n(c[0])}" y="{n(c[1])}" width="{n(c[2] - c[0])}" '
                            f'height="{n(c[3] - c[1])}"/></clipPath>')
            return f' clip-path="url(#{clips[c]})"'

        for p in prims:
            kind = p[0]
            if kind == "poly":
                _, pts, color, alpha, clip = p
                d = "M" + " L".join(f"{n(x)} {n(y)}" for x, y in pts) + "Z"
                op = f' fill-opacity="{alpha:g}"' if alpha < 1 else ""
                body.append(f'<path d="{d}" fill="{color}"{op}{clip_attr(clip)}/>')
            elif kind == "line":
                _, pts, color, lw, dash, clip = p
                d = "M" + " L".join(f"{n(x)} {n(y)}" for x, y in pts)
                da = f' stroke-dasharray="{n(3.7 * lw)} {n(1.6 * lw)}"' if dash else ""
                if len(color) == 9:  # #rrggbbaa: translucent
                    da += f' stroke-opacity="{int(color[7:], 16) / 255:.3g}"'
                    color = color[:7]
                body.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="{lw:g}"{da} '
                            f'stroke-linejoin="round"{clip_attr(clip)}/>')
            elif kind == "hatch":
                _, (hx0, hy0, hx1, hy1), color, clip = p
                pid = f"h{len(defs)}"
                defs.append(f'<pattern id="{pid}" patternUnits="userSpaceOnUse" width="6" height="6">'
                            f'<path d="M-1 1 L1 -1 M0 6 L6 0 M5 7 L7 5" stroke="{color}" stroke-width="1"/></pattern>')
                body.append(f'<rect x="{n(hx0)}" y="{n(hy0)}" width="{n(hx1 - hx0)}" height="{n(hy1 - hy0)}" '
                            f'fill="url(#{pid})"{clip_attr(clip)}/>')
            elif kind == "image":
                import base64

                _, (ix0, iy0, ix1, iy1), rgb, clip = p
                data = base64.b64encode(_png_bytes(np.ascontiguousarray(rgb), 72)).decode("ascii")
                body.append(f'<image x="{n(ix0)}" y="{n(iy0)}" width="{n(ix1 - ix0)}" height="{n(iy1 - iy0)}" '
                            f'preserveAspectRatio="none" style="image-rendering:pixelated"{clip_attr(clip)} '
                            f'href="data:image/png;base64,{data}"/>')
            elif kind == "rect":
                _, (rx0, ry0, rx1, ry1), color, lw = p
                body.append(f'<rect x="{n(rx0)}" y="{n(ry0)}" width="{n(rx1 - rx0)}" height="{n(ry1 - ry0)}" '
                            f'fill="none" stroke="{color}" stroke-width="{lw:g}"/>')
            elif kind == "box":
                _, (rx0, ry0, rx1, ry1), fill, alpha, edge = p
                body.append(f'<rect x="{n(rx0)}" y="{n(ry0)}" width="{n(rx1 - rx0)}" height="{n(ry1 - ry0)}" '
                            f'rx="2" fill="{fill}" fill-opacity="{alpha:g}" stroke="{edge}" stroke-width="0.8"/>')
            elif kind == "text":
                body.append(self._svg_text(p, n))
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{n(W)}pt" height="{n(H)}pt" '
                f'viewBox="0 0 {n(W)} {n(H)}" data-axes="{geometry}" data-drawn="gpuclust">'
                f'<defs>{"".join(defs)}</defs><rect width="{n(W)}" height="{n(H)}" fill="#ffffff"/>'
                f'<g font-family="{_FONT_FAMILY}">{"".join(body)}</g></svg>\n')

    def _raster_svg(self) -> str:
        """The figure as an SVG holding one PNG of it, with the same ``data-axes`` (the page's hover)."""
        import base64

        W, H = self.size_pt
        png = base64.b64encode(self.to_png()).decode("ascii")
        geometry = html.escape(json.dumps(self.geometry(), separators=(",", ":")), quote=True)
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W:g}pt" height="{H:g}pt" viewBox="0 0 {W:g} {H:g}" '
                f'data-axes="{geometry}" data-drawn="gpuclust" data-raster="png"><image width="{W:g}" height="{H:g}" '
                f'href="data:image/png;base64,{png}"/></svg>\n')

    @staticmethod
    def _baselines(y: float, s: str, size: float, va: str) -> list[float]:
        """The baseline of each line of ``s``, for text whose ``va`` edge is at ``y``."""
        lines = s.split("\n")
        h = size * (_LINE * (len(lines) - 1) + 1.0)
        top = {"top": y, "center": y - h / 2, "bottom": y - h}.get(va, y - 0.8 * size)
        return [top + 0.8 * size + k * _LINE * size for k in range(len(lines))]

    def _svg_text(self, p: tuple[Any, ...], n: Any) -> str:
        _, x, y, s, size, ha, va, color, rot = p
        anchor = {"left": "start", "center": "middle", "right": "end"}[ha]
        lines = s.split("\n")
        if rot:  # rotated about (x, y): lay the lines out as if unrotated, then turn them
            base = self._baselines(y, s, size, va)
            spans = "".join(f'<tspan x="{n(x)}" y="{n(b)}">{html.escape(line)}</tspan>'
                            for line, b in zip(lines, base, strict=True))
            return (f'<text font-size="{size:g}" fill="{color}" text-anchor="{anchor}" '
                    f'transform="rotate({-rot:g} {n(x)} {n(y)})">{spans}</text>')
        base = self._baselines(y, s, size, va)
        spans = "".join(f'<tspan x="{n(x)}" y="{n(b)}">{html.escape(line)}</tspan>'
                        for line, b in zip(lines, base, strict=True))
        return f'<text font-size="{size:g}" fill="{color}" text-anchor="{anchor}">{spans}</text>'

    def to_png(self, *, supersample: int = 2) -> bytes:
        """The figure as PNG bytes at :attr:`dpi` (drawn ``supersample`` times larger, then reduced)."""
        from PIL import Image, ImageDraw

        k = self.dpi / 72.0 * supersample
        W, H = self.size_pt
        img = Image.new("RGB", (round(W * k), round(H * k)), "white")
        layers: dict[tuple[float, ...], tuple[Any, Any, tuple[int, int]]] = {}

        def canvas(clip: tuple[float, ...] | None) -> tuple[Any, float, float]:
            """The drawing (and its offset in pixels) for items clipped to ``clip``."""
            if clip is None:
                return ImageDraw.Draw(img, "RGBA"), 0.0, 0.0
            if clip not in layers:
                x0, y0 = math.floor(clip[0] * k), math.floor(clip[1] * k)
                x1, y1 = math.ceil(clip[2] * k), math.ceil(clip[3] * k)
                sub = Image.new("RGB", (max(1, x1 - x0), max(1, y1 - y0)), "white")
                layers[clip] = (sub, ImageDraw.Draw(sub, "RGBA"), (x0, y0))
            _, d, (ox, oy) = layers[clip]
            return d, float(ox), float(oy)

        prims = self._primitives()
        # clipped content first (pasted as one layer per axes), then frames, ticks and text over it
        for p in prims:
            kind = p[0]
            if kind == "poly":
                _, pts, color, alpha, clip = p
                d, ox, oy = canvas(clip)
                d.polygon([(x * k - ox, y * k - oy) for x, y in pts], fill=(*_rgb(color), round(255 * alpha)))
            elif kind == "line" and p[5] is not None:
                _, pts, color, lw, dash, clip = p
                d, ox, oy = canvas(clip)
                _png_line(d, [(x * k - ox, y * k - oy) for x, y in pts], _rgba(color), max(1, round(lw * k)), dash, k)
            elif kind == "image" and p[3] is not None:
                _, box, rgb, clip = p
                canvas(clip)
                _png_image(layers[clip][0], box, rgb, k, layers[clip][2])
            elif kind == "hatch":
                _, (hx0, hy0, hx1, hy1), color, clip = p
                d, ox, oy = canvas(clip)
                step = 6 * k
                x = hx0 * k - (hy1 - hy0) * k
                while x < hx1 * k:
                    seg = _clip_segment((x, hy1 * k), (x + (hy1 - hy0) * k, hy0 * k), hx0 * k, hx1 * k)
                    if seg is not None:
                        d.line([(seg[0][0] - ox, seg[0][1] - oy), (seg[1][0] - ox, seg[1][1] - oy)],
                               fill=_rgb(color), width=max(1, round(0.8 * k)))
                    x += step
        for sub, _, (ox, oy) in layers.values():
            img.paste(sub, (int(ox), int(oy)))
        d = ImageDraw.Draw(img, "RGBA")
        for p in prims:
            kind = p[0]
            if kind == "line" and p[5] is None:
                _, pts, color, lw, dash, _ = p
                _png_line(d, [(x * k, y * k) for x, y in pts], _rgba(color), max(1, round(lw * k)), dash, k)
            elif kind == "image" and p[3] is None:
                _png_image(img, p[1], p[2], k, (0, 0))
            elif kind == "rect":
                _, (rx0, ry0, rx1, ry1), color, lw = p
                d.rectangle([rx0 * k, ry0 * k, rx1 * k, ry1 * k], outline=_rgb(color), width=max(1, round(lw * k)))
            elif kind == "box":
                _, (rx0, ry0, rx1, ry1), fill, alpha, edge = p
                d.rectangle([rx0 * k, ry0 * k, rx1 * k, ry1 * k], fill=(*_rgb(fill), round(255 * alpha)),
                            outline=_rgb(edge), width=max(1, round(0.8 * k)))
            elif kind == "poly" and p[4] is None:
                _, pts, color, alpha, _ = p
                d.polygon([(x * k, y * k) for x, y in pts], fill=(*_rgb(color), round(255 * alpha)))
            elif kind == "hatch" and p[3] is None:
                _, (hx0, hy0, hx1, hy1), color, _ = p
                for t in np.arange(hx0, hx1, 3.0):
                    d.line([(t * k, hy1 * k), (min(t + (hy1 - hy0), hx1) * k, (hy1 - min(hy1 - hy0, hx1 - t)) * k)],
                           fill=_rgb(color), width=max(1, round(0.8 * k)))
            elif kind == "text":
                self._png_text(img, d, p, k)
        if supersample > 1:
            img = img.reduce(supersample)
        return _png_bytes(np.asarray(img), self.dpi)

    def _png_text(self, img: Any, d: Any, p: tuple[Any, ...], k: float) -> None:
        from PIL import Image, ImageDraw

        _, x, y, s, size, ha, va, color, rot = p
        font = _font(max(1, round(size * k)))
        anchor = {"left": "l", "center": "m", "right": "r"}[ha] + "s"
        base = self._baselines(y, s, size, va)
        if not rot:
            for line, b in zip(s.split("\n"), base, strict=True):
                d.text((x * k, b * k), line, font=font, fill=_rgb(color), anchor=anchor)
            return
        # rotated: draw on a transparent tile centred on (x, y), turn it about its centre, paste
        w, h = _block(s, size)
        r = math.ceil((max(w, h) + size) * k)
        tile = Image.new("L", (2 * r, 2 * r), 0)
        td = ImageDraw.Draw(tile)
        for line, b in zip(s.split("\n"), base, strict=True):
            td.text((r, r + (b - y) * k), line, font=font, fill=255, anchor=anchor)
        if rot == 90:  # exact and fast
            tile = tile.transpose(Image.Transpose.ROTATE_90)
        else:
            tile = tile.rotate(rot, resample=Image.Resampling.BILINEAR, center=(r, r))
        box = tile.getbbox()
        if box is None:
            return
        ink = Image.new("RGB", (box[2] - box[0], box[3] - box[1]), _rgb(color))
        img.paste(ink, (round(x * k) - r + box[0], round(y * k) - r + box[1]), tile.crop(box))


def _png_bytes(rgb: np.ndarray, dpi: int) -> bytes:
    """An RGB image (height x width x 3, uint8) as PNG bytes: each row "Sub"-filtered (the
    difference to the pixel on its left), zlib level 6.  Pillow's own writer would first import
    every image plugin it has (~50 ms)."""
    import struct
    import zlib

    h, w, _ = rgb.shape
    sub = rgb.astype(np.int16)
    sub[:, 1:] -= rgb[:, :-1]
    rows = np.empty((h, 1 + 3 * w), dtype=np.uint8)
    rows[:, 0] = 1  # filter type Sub
    rows[:, 1:] = (sub % 256).astype(np.uint8).reshape(h, 3 * w)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ppm = round(dpi / 0.0254)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"pHYs", struct.pack(">IIB", ppm, ppm, 1)) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
            + chunk(b"IEND", b""))


def _png_image(img: Any, box: tuple[float, float, float, float], rgb: np.ndarray, k: float,
               offset: tuple[int, int]) -> None:
    """Paste ``rgb`` (rows top first) scaled to ``box`` (points) without smoothing into ``img``,
    whose top left is at ``offset`` pixels of the figure."""
    from PIL import Image

    x0, y0 = round(box[0] * k) - offset[0], round(box[1] * k) - offset[1]
    w, h = round(box[2] * k) - offset[0] - x0, round(box[3] * k) - offset[1] - y0
    if w > 0 and h > 0:
        tile = Image.fromarray(np.ascontiguousarray(rgb, dtype=np.uint8), "RGB")
        img.paste(tile.resize((w, h), Image.Resampling.NEAREST), (x0, y0))


def _clip_segment(a: tuple[float, float], b: tuple[float, float], lo: float,
                  hi: float) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """The part of segment ``a``-``b`` with ``lo <= x <= hi``."""
    (ax, ay), (bx, by) = a, b
    if bx == ax:
        return (a, b) if lo <= ax <= hi else None
    t0, t1 = (lo - ax) / (bx - ax), (hi - ax) / (bx - ax)
    t0, t1 = max(0.0, min(t0, t1)), min(1.0, max(t0, t1))
    if t0 >= t1:
        return None
    return (ax + t0 * (bx - ax), ay + t0 * (by - ay)), (ax + t1 * (bx - ax), ay + t1 * (by - ay))


def _png_line(d: Any, pts: list[tuple[float, float]], color: tuple[int, ...], width: int, dash: bool,
              k: float) -> None:
    if not dash:
        d.line(pts, fill=color, width=width, joint="curve" if width > 2 else None)
        return
    on, off = 3.7 * width, 1.6 * width
    for (ax, ay), (bx, by) in zip(pts[:-1], pts[1:], strict=True):
        length = math.hypot(bx - ax, by - ay)
        t = 0.0
        while t < length:
            e = min(t + on, length)
            d.line([(ax + (bx - ax) * t / length, ay + (by - ay) * t / length),
                    (ax + (bx - ax) * e / length, ay + (by - ay) * e / length)], fill=color, width=width)
            t = e + off
