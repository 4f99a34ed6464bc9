"""Colours, font sizes and the layout's constants of :mod:`gpuclust.report.draw` (matplotlib's
defaults), the viridis colour scale, and small array helpers."""

from __future__ import annotations

from typing import Any

import numpy as np

#: matplotlib's default colour cycle ("tab10").
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
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
_VIRIDIS = (
    "440154470d6048186a482374472d7b4537814240863e49893b528b375b8d33638d2f6b8e2c728e297a8e26828e23898e21918c1f"
    "988b1fa08822a78528ae8032b67a3fbc734ec36b5ec96270cf5784d44b98d83eaddc30c2df23d8e219ece51bfde725"
)


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
