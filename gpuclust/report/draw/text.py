"""Text measurement for :mod:`gpuclust.report.draw`: DejaVu Sans (matplotlib's font, found
without importing matplotlib) through Pillow, line wrapping, and where each line's baseline is."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from gpuclust.report.draw.style import _LINE


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


def _baselines(y: float, s: str, size: float, va: str) -> list[float]:
    """The baseline of each line of ``s``, for text whose ``va`` edge is at ``y``."""
    lines = s.split("\n")
    h = size * (_LINE * (len(lines) - 1) + 1.0)
    top = {"top": y, "center": y - h / 2, "bottom": y - h}.get(va, y - 0.8 * size)
    return [top + 0.8 * size + k * _LINE * size for k in range(len(lines))]
