"""The figure of :mod:`gpuclust.report.draw`: a grid of :class:`Axes`, their layout (margins from
tick labels, axis labels and legends, like matplotlib's constrained layout), the geometry the
report page's hover reads, and :meth:`Figure.save` to SVG or PNG."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuclust.report.draw import png_writer, svg_writer
from gpuclust.report.draw.axes import Axes
from gpuclust.report.draw.primitives import axes_primitives, legend_size
from gpuclust.report.draw.style import _PAD, _TICK, _TICK_SIZE
from gpuclust.report.draw.text import _block, text_width, wrap
from gpuclust.report.draw.ticks import _scale_name, _ticks


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

    def subplots(
        self,
        rows: int = 1,
        cols: int = 1,
        *,
        sharex: bool = False,
        sharey: bool = False,
        width_ratios: Sequence[float] | None = None,
        height_ratios: Sequence[float] | None = None,
    ) -> list[Axes]:
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
    # -- layout
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
                    bottom += (
                        max((text_width(s, size) * math.sin(rot) + size * math.cos(rot) for s in labels), default=0.0)
                        + _TICK
                        + _PAD
                    )
                else:
                    bottom += _TICK_SIZE + _TICK + _PAD
                if a.xlabel:
                    bottom += _block(a.xlabel, 10.0)[1] + _PAD
            right = 8.0
            if a.legend_spec is not None and a.legend_spec["outside"]:
                right += legend_size(a)[0] + 6.0
            if a.colorbar_spec is not None:  # the bar (3% of the axes' width with its gap), ticks, labels
                vmin, vmax, label = a.colorbar_spec
                right += (
                    0.03 * W
                    + _TICK
                    + _PAD
                    + max(text_width(t, _TICK_SIZE) for t in _ticks(vmin, vmax, "linear")[1])
                    + _PAD
                )
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
            out.append(
                {
                    "box": [round(x0 / W, 5), round(1 - y1 / H, 5), round(x1 / W, 5), round(1 - y0 / H, 5)],
                    "x": list(xl),
                    "y": list(yl),
                    "xscale": _scale_name((a.sharex or a).xscale),
                    "yscale": _scale_name(a.yscale),
                    "xlabel": xlabel,
                    "ylabel": a.ylabel,
                }
            )
        return out

    # -- drawing into primitives (points, top left origin)
    def _primitives(self) -> list[tuple[Any, ...]]:
        self._layout()
        W, H = self.size_pt
        out: list[tuple[Any, ...]] = []
        if self.suptitle:
            out.append(("text", W / 2, 6.0, self.suptitle, 10.0, "center", "top", "#000000", 0.0))
        for a in self.axes:
            out.extend(axes_primitives(a))
        return out

    # -- output
    def save(self, path: str | Path) -> None:
        """Write the figure to ``path`` (``.svg`` or ``.png``) atomically."""
        from gpuclust._files import write_atomic

        path = Path(path)
        if path.suffix == ".svg":
            text = self.to_svg()
            from gpuclust.report.svg import MAX_SVG_BYTES

            if len(text) > MAX_SVG_BYTES:  # too many vectors for a page (a month of 5-min buckets): a PNG in it
                text = svg_writer.raster_svg(self)
            write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
        else:
            data = self.to_png()
            write_atomic(path, lambda tmp: Path(tmp).write_bytes(data))

    def to_svg(self) -> str:
        return svg_writer.to_svg(self)

    def to_png(self, *, supersample: int = 2) -> bytes:
        """The figure as PNG bytes at :attr:`dpi` (drawn ``supersample`` times larger, then reduced)."""
        return png_writer.to_png(self, supersample=supersample)
