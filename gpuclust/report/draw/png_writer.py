"""A :class:`gpuclust.report.draw.Figure` as PNG: its primitives rasterised with Pillow, drawn at
twice the size and reduced (smooth edges and text), written by a small PNG encoder of its own."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuclust.report.draw.style import _rgb, _rgba
from gpuclust.report.draw.text import _baselines, _block, _font

if TYPE_CHECKING:
    from gpuclust.report.draw.figure import Figure


def to_png(fig: Figure, *, supersample: int = 2) -> bytes:
    """The figure as PNG bytes at :attr:`dpi` (drawn ``supersample`` times larger, then reduced)."""
    from PIL import Image, ImageDraw

    k = fig.dpi / 72.0 * supersample
    W, H = fig.size_pt
    img = Image.new("RGB", (round(W * k), round(H * k)), "white")
    layers = _ClipLayers(img, k)
    prims = fig._primitives()
    # clipped content first (pasted as one layer per axes), then frames, ticks and text over it
    for p in prims:
        _draw_clipped(layers, p, k)
    layers.paste()
    d = ImageDraw.Draw(img, "RGBA")
    for p in prims:
        _draw_over(img, d, p, k)
    if supersample > 1:
        img = img.reduce(supersample)
    return _png_bytes(np.asarray(img), fig.dpi)


class _ClipLayers:
    """One white layer per clip box (an axes), in pixels at scale ``k``, to paste onto the figure's image."""

    def __init__(self, img: Any, k: float) -> None:
        self.img = img
        self.k = k
        self.layers: dict[tuple[float, ...], tuple[Any, Any, tuple[int, int]]] = {}

    def canvas(self, clip: tuple[float, ...] | None) -> tuple[Any, float, float]:
        """The drawing (and its offset in pixels) for items clipped to ``clip``."""
        from PIL import Image, ImageDraw

        if clip is None:
            return ImageDraw.Draw(self.img, "RGBA"), 0.0, 0.0
        if clip not in self.layers:
            k = self.k
            x0, y0 = math.floor(clip[0] * k), math.floor(clip[1] * k)
            x1, y1 = math.ceil(clip[2] * k), math.ceil(clip[3] * k)
            sub = Image.new("RGB", (max(1, x1 - x0), max(1, y1 - y0)), "white")
            self.layers[clip] = (sub, ImageDraw.Draw(sub, "RGBA"), (x0, y0))
        _, d, (ox, oy) = self.layers[clip]
        return d, float(ox), float(oy)

    def paste(self) -> None:
        """Paste every layer onto the figure's image at its offset."""
        for sub, _, (ox, oy) in self.layers.values():
            self.img.paste(sub, (int(ox), int(oy)))


def _draw_clipped(layers: _ClipLayers, p: tuple[Any, ...], k: float) -> None:
    """Draw a primitive of the first pass: every polygon and hatch, clipped lines and images."""
    kind = p[0]
    if kind == "poly":
        _, pts, color, alpha, clip = p
        d, ox, oy = layers.canvas(clip)
        d.polygon([(x * k - ox, y * k - oy) for x, y in pts], fill=(*_rgb(color), round(255 * alpha)))
    elif kind == "line" and p[5] is not None:
        _, pts, color, lw, dash, clip = p
        d, ox, oy = layers.canvas(clip)
        _png_line(d, [(x * k - ox, y * k - oy) for x, y in pts], _rgba(color), max(1, round(lw * k)), dash, k)
    elif kind == "image" and p[3] is not None:
        _, box, rgb, clip = p
        layers.canvas(clip)
        _png_image(layers.layers[clip][0], box, rgb, k, layers.layers[clip][2])
    elif kind == "hatch":
        _, (hx0, hy0, hx1, hy1), color, clip = p
        d, ox, oy = layers.canvas(clip)
        step = 6 * k
        x = hx0 * k - (hy1 - hy0) * k
        while x < hx1 * k:
            seg = _clip_segment((x, hy1 * k), (x + (hy1 - hy0) * k, hy0 * k), hx0 * k, hx1 * k)
            if seg is not None:
                d.line(
                    [(seg[0][0] - ox, seg[0][1] - oy), (seg[1][0] - ox, seg[1][1] - oy)],
                    fill=_rgb(color),
                    width=max(1, round(0.8 * k)),
                )
            x += step


def _draw_over(img: Any, d: Any, p: tuple[Any, ...], k: float) -> None:
    """Draw a primitive of the second pass, over the pasted layers: unclipped items, frames, boxes and text."""
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
        d.rectangle(
            [rx0 * k, ry0 * k, rx1 * k, ry1 * k],
            fill=(*_rgb(fill), round(255 * alpha)),
            outline=_rgb(edge),
            width=max(1, round(0.8 * k)),
        )
    elif kind == "poly" and p[4] is None:
        _, pts, color, alpha, _ = p
        d.polygon([(x * k, y * k) for x, y in pts], fill=(*_rgb(color), round(255 * alpha)))
    elif kind == "hatch" and p[3] is None:
        _, (hx0, hy0, hx1, hy1), color, _ = p
        for t in np.arange(hx0, hx1, 3.0):
            d.line(
                [(t * k, hy1 * k), (min(t + (hy1 - hy0), hx1) * k, (hy1 - min(hy1 - hy0, hx1 - t)) * k)],
                fill=_rgb(color),
                width=max(1, round(0.8 * k)),
            )
    elif kind == "text":
        _png_text(img, d, p, k)


def _png_text(img: Any, d: Any, p: tuple[Any, ...], k: float) -> None:
    from PIL import Image, ImageDraw

    _, x, y, s, size, ha, va, color, rot = p
    font = _font(max(1, round(size * k)))
    anchor = {"left": "l", "center": "m", "right": "r"}[ha] + "s"
    base = _baselines(y, s, size, va)
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
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"pHYs", struct.pack(">IIB", ppm, ppm, 1))
        + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
        + chunk(b"IEND", b"")
    )


def _png_image(
    img: Any, box: tuple[float, float, float, float], rgb: np.ndarray, k: float, offset: tuple[int, int]
) -> None:
    """Paste ``rgb`` (rows top first) scaled to ``box`` (points) without smoothing into ``img``,
    whose top left is at ``offset`` pixels of the figure."""
    from PIL import Image

    x0, y0 = round(box[0] * k) - offset[0], round(box[1] * k) - offset[1]
    w, h = round(box[2] * k) - offset[0] - x0, round(box[3] * k) - offset[1] - y0
    if w > 0 and h > 0:
        tile = Image.fromarray(np.ascontiguousarray(rgb, dtype=np.uint8), "RGB")
        img.paste(tile.resize((w, h), Image.Resampling.NEAREST), (x0, y0))


def _clip_segment(
    a: tuple[float, float], b: tuple[float, float], lo: float, hi: float
) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """The part of segment ``a``-``b`` with ``lo <= x <= hi``."""
    (ax, ay), (bx, by) = a, b
    if bx == ax:
        return (a, b) if lo <= ax <= hi else None
    t0, t1 = (lo - ax) / (bx - ax), (hi - ax) / (bx - ax)
    t0, t1 = max(0.0, min(t0, t1)), min(1.0, max(t0, t1))
    if t0 >= t1:
        return None
    return (ax + t0 * (bx - ax), ay + t0 * (by - ay)), (ax + t1 * (bx - ax), ay + t1 * (by - ay))


def _png_line(d: Any, pts: list[tuple[float, float]], color: tuple[int, ...], width: int, dash: bool, k: float) -> None:
    if not dash:
        d.line(pts, fill=color, width=width, joint="curve" if width > 2 else None)
        return
    on, off = 3.7 * width, 1.6 * width
    for (ax, ay), (bx, by) in zip(pts[:-1], pts[1:], strict=True):
        length = math.hypot(bx - ax, by - ay)
        t = 0.0
        while t < length:
            e = min(t + on, length)
            d.line(
                [
                    (ax + (bx - ax) * t / length, ay + (by - ay) * t / length),
                    (ax + (bx - ax) * e / length, ay + (by - ay) * e / length),
                ],
                fill=color,
                width=width,
            )
            t = e + off
