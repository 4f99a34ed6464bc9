"""Tick positions and labels of :mod:`gpuclust.report.draw`'s axes (linear, log and symlog, as
matplotlib places them), and the symlog transform."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


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
        return f"{10.0**k:g}"
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
            pairs += [
                (sign * 10.0**k, ("\u2212" if sign < 0 else "") + _log_label(k))
                for sign in (-1, 1)
                if lo - 1e-12 <= sign * 10.0**k <= hi + 1e-12
            ]
        pairs.sort()
        minor = [
            sign * m * 10.0**k
            for k in range(k0, k1 + 1)
            for m in range(2, 10)
            for sign in (-1, 1)
            if lo <= sign * m * 10.0**k <= hi
        ]
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
