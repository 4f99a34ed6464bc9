"""Planted malformed lines (``SynthConfig.malformed_rate``): which rows break and how."""

from __future__ import annotations

import re

import numpy as np

from gpuclust.synth.config import MALFORMED_KINDS, MALFORMED_TABLES

_RE_CID = re.compile(r'"collection_id":"(-?\d+)"')
_RE_DIST = re.compile(r'("cpu_usage_distribution":\[[^\]]*),[^,\]]*\]')


def corrupt_line(line: str, kind: str) -> str:
    """Break one JSON line (without newline) in the named way."""
    if kind == "bad_json":
        return line[: max(1, int(len(line) * 0.6))]
    if kind == "wrong_list_length":
        new = _RE_DIST.sub(r"\1]", line, count=1)
        if new == line:
            raise ValueError("no cpu_usage_distribution to shorten")
        return new
    if kind == "quoted_non_number_id":
        return _RE_CID.sub(r'"collection_id":"id-\1"', line, count=1)
    if kind == "missing_required_key":
        new = _RE_CID.sub("", line, count=1)
        return new.replace("{,", "{").replace(",,", ",")
    raise ValueError(kind)


class _Malformer:
    def __init__(self, rate: float, rng: np.random.Generator):
        self.rate = rate
        self.rng = rng
        self.counts: dict[str, dict[str, int]] = {t: {k: 0 for k in MALFORMED_KINDS} for t in MALFORMED_TABLES}

    def pick(self, table: str, n: int) -> tuple[np.ndarray, list[str]]:
        if self.rate <= 0 or n == 0 or table not in MALFORMED_TABLES:
            return np.zeros(0, np.int64), []
        m = int(self.rng.binomial(n, self.rate))
        rows = np.sort(self.rng.choice(n, size=m, replace=False)) if m else np.zeros(0, np.int64)
        kinds = (
            MALFORMED_KINDS
            if table == "instance_usage"
            else tuple(k for k in MALFORMED_KINDS if k != "wrong_list_length")
        )
        chosen = [kinds[int(i)] for i in self.rng.integers(len(kinds), size=m)]
        for k in chosen:
            self.counts[table][k] += 1
        return rows, chosen

    def apply_lines(self, table: str, lines: list[str]) -> None:
        rows, kinds = self.pick(table, len(lines))
        for r, k in zip(rows, kinds, strict=True):
            lines[r] = corrupt_line(lines[r][:-1], k) + "\n"

    def apply_bytes(self, table: str, data: bytes, lengths: np.ndarray) -> tuple[bytes, np.ndarray, np.ndarray]:
        rows, kinds = self.pick(table, len(lengths))
        if rows.size == 0:
            return data, lengths, rows
        lines = data.split(b"\n")[:-1]
        for r, k in zip(rows, kinds, strict=True):
            lines[r] = corrupt_line(lines[r].decode(), k).encode()
        lengths = np.fromiter((len(x) + 1 for x in lines), np.int64, len(lines))
        return b"\n".join(lines) + b"\n", lengths, rows
