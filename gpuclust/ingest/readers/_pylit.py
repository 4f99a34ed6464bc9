"""A small, safe parser for Python-literal and NumPy-printed values found in CSV cells.

The Kaggle ``borg_traces_data.csv`` layout stores nested trace fields as the text Python and
NumPy print for them::

    {'cpus': 0.0043, 'memory': None}                      # repr() of a dict
    [0.00020885 0.00025272 0.00030518 0.00095081 0.0076
     0.01078796]                                           # str() of a NumPy array
    [{'name': 'abc', 'value': '1', 'relation': 0}]         # repr() of a list of dicts

This module reads exactly that and nothing else.  It never calls ``eval``, ``exec`` or
``ast.literal_eval``: a hand-written tokenizer accepts only

* numbers: integers (kept as exact Python ``int``), decimals and ``e`` notation, NumPy's
  ``0.`` / ``1.`` forms, ``nan``, ``inf`` and ``-inf``;
* ``None``, ``True``, ``False``;
* quoted strings (single or double quotes, with the escapes ``repr`` writes);
* dicts ``{k: v, ...}``; lists ``[a, b]`` (Python style, commas) or ``[a b]`` (NumPy style,
  whitespace, possibly across lines); tuples ``(a, b)``;
* NumPy 2 scalar reprs such as ``np.float64(0.5)`` (a number wrapped in a whitelisted name).

Anything else raises :class:`PyLitError` with the character position.

Examples
--------
>>> parse("{'cpus': 0.0043, 'memory': None}")
{'cpus': 0.0043, 'memory': None}
>>> parse("[0.  0.5\\n 1.e-05]")
[0.0, 0.5, 1e-05]
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

__all__ = ["PyLitError", "parse", "parse_float_array", "parse_resources"]

#: Nesting deeper than this is refused (no trace field nests more than 3 levels).
MAX_DEPTH = 32


class PyLitError(ValueError):
    """Text that is not an accepted Python/NumPy literal."""

    def __init__(self, message: str, pos: int):
        self.pos = pos
        super().__init__(f"{message} at character {pos}")


_NUMBER = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)")
_NAME = re.compile(r"[+-]?[A-Za-z_][A-Za-z0-9_.]*")
_WS = re.compile(r"\s*")
_NP_SCALARS = frozenset(
    f"{p}.{t}"
    for p in ("np", "numpy")
    for t in ("float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8")
)
_CONSTANTS: dict[str, Any] = {
    "None": None,
    "True": True,
    "False": False,
    "nan": math.nan,
    "+nan": math.nan,
    "-nan": math.nan,
    "NaN": math.nan,
    "inf": math.inf,
    "+inf": math.inf,
    "-inf": -math.inf,
}
_SIMPLE_ESCAPES = {
    "\\": "\\",
    "'": "'",
    '"': '"',
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "0": "\0",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


class _Parser:
    __slots__ = ("s", "i", "n")

    def __init__(self, s: str):
        self.s = s
        self.i = 0
        self.n = len(s)

    def ws(self) -> None:
        m = _WS.match(self.s, self.i)
        assert m is not None
        self.i = m.end()

    def peek(self) -> str:
        return self.s[self.i] if self.i < self.n else ""

    def expect(self, ch: str) -> None:
        self.ws()
        if self.peek() != ch:
            found = repr(self.peek()) if self.i < self.n else "end of text"
            raise PyLitError(f"expected {ch!r}, found {found}", self.i)
        self.i += 1

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise PyLitError("nesting too deep", self.i)
        self.ws()
        c = self.peek()
        if c == "{":
            return self.mapping(depth)
        if c == "[":
            return self.sequence("[", "]", depth)
        if c == "(":
            return tuple(self.sequence("(", ")", depth))
        if c in ("'", '"'):
            return self.string()
        if c == "":
            raise PyLitError("unexpected end of text", self.i)
        return self.scalar()

    def scalar(self) -> Any:
        start = self.i
        m = _NUMBER.match(self.s, self.i)
        if m is not None and m.end() > start:
            end = m.end()
            # A number must not run into a name character ("1abc", "0x10").
            if end < self.n and (self.s[end].isalnum() or self.s[end] in "_."):
                raise PyLitError(f"bad number {self.s[start : end + 1]!r}", start)
            tok = m.group()
            self.i = end
            if "." in tok or "e" in tok or "E" in tok:
                return float(tok)
            return int(tok)
        m = _NAME.match(self.s, self.i)
        if m is None:
            raise PyLitError(f"unexpected character {self.s[start]!r}", start)
        tok = m.group()
        self.i = m.end()
        if tok in _CONSTANTS:
            return _CONSTANTS[tok]
        if tok in _NP_SCALARS:
            self.expect("(")
            self.ws()
            inner = self.scalar()
            if isinstance(inner, bool) or not isinstance(inner, (int, float)):
                raise PyLitError(f"{tok}(...) must wrap a number", start)
            self.expect(")")
            return inner
        raise PyLitError(f"name {tok!r} is not an accepted literal", start)

    def string(self) -> str:
        q = self.s[self.i]
        start = self.i
        self.i += 1
        out: list[str] = []
        s = self.s
        while True:
            j = self.i
            # Fast path: copy a run of ordinary characters.
            while j < self.n and s[j] != q and s[j] != "\\" and s[j] != "\n":
                j += 1
            out.append(s[self.i : j])
            self.i = j
            if j >= self.n or s[j] == "\n":
                raise PyLitError("unterminated string", start)
            if s[j] == q:
                self.i = j + 1
                return "".join(out)
            # Backslash escape.
            if j + 1 >= self.n:
                raise PyLitError("unterminated string", start)
            e = s[j + 1]
            if e in _SIMPLE_ESCAPES:
                out.append(_SIMPLE_ESCAPES[e])
                self.i = j + 2
            elif e in _HEX_ESCAPES:
                k = _HEX_ESCAPES[e]
                digits = s[j + 2 : j + 2 + k]
                if len(digits) != k or not all(d in "0123456789abcdefABCDEF" for d in digits):
                    raise PyLitError(f"bad \\{e} escape", j)
                cp = int(digits, 16)
                if cp > 0x10FFFF:
                    raise PyLitError("code point out of range", j)
                out.append(chr(cp))
                self.i = j + 2 + k
            else:
                raise PyLitError(f"unsupported escape \\{e}", j)

    def mapping(self, depth: int) -> dict[Any, Any]:
        self.i += 1  # '{'
        out: dict[Any, Any] = {}
        self.ws()
        if self.peek() == "}":
            self.i += 1
            return out
        while True:
            kpos = self.i
            key = self.value(depth + 1)
            if isinstance(key, (dict, list)):
                raise PyLitError("unhashable dict key", kpos)
            self.expect(":")
            out[key] = self.value(depth + 1)
            self.ws()
            c = self.peek()
            if c == ",":
                self.i += 1
                self.ws()
                if self.peek() == "}":
                    self.i += 1
                    return out
                continue
            if c == "}":
                self.i += 1
                return out
            raise PyLitError("expected ',' or '}'", self.i)

    def sequence(self, open_: str, close: str, depth: int) -> list[Any]:
        self.i += 1  # opening bracket
        out: list[Any] = []
        self.ws()
        if self.peek() == close:
            self.i += 1
            return out
        style: str | None = None  # "," (Python) or " " (NumPy), fixed by the first separator
        while True:
            out.append(self.value(depth + 1))
            had_ws = self.i < self.n and self.s[self.i].isspace()
            self.ws()
            c = self.peek()
            if c == close:
                self.i += 1
                return out
            if c == ",":
                if style == " ":
                    raise PyLitError("mixed ',' and whitespace separators", self.i)
                style = ","
                self.i += 1
                self.ws()
                if self.peek() == close:
                    self.i += 1
                    return out
                continue
            if c == "":
                raise PyLitError(f"expected {close!r}", self.i)
            if had_ws and open_ == "[" and style != ",":
                style = " "
                continue
            raise PyLitError(f"expected ',' or {close!r}", self.i)


def parse(text: str) -> Any:
    """Parse one Python/NumPy literal; the whole text must be consumed.

    Integers stay exact Python ``int`` (never through float).

    Raises
    ------
    PyLitError
        If the text is not an accepted literal.
    """
    if not isinstance(text, str):
        raise TypeError(f"expected str, got {type(text).__name__}")
    p = _Parser(text)
    v = p.value(0)
    p.ws()
    if p.i != p.n:
        raise PyLitError("trailing text", p.i)
    return v


def _as_float(v: Any, what: str) -> float | None:
    """A number or None as float-or-None; NaN becomes None (a missing value)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise PyLitError(f"{what}: expected a number or None, got {type(v).__name__}", 0)
    f = float(v)
    return None if math.isnan(f) else f


_NUM_RE = r"(?:[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:nan|inf))"
#: The shape pandas writes for a resources dict; anything else goes through the full parser.
_RESOURCES_FAST = re.compile(rf"\{{'cpus': ({_NUM_RE}|None), 'memory': ({_NUM_RE}|None)\}}")
#: A flat NumPy- or Python-printed array of plain numbers.
_ARRAY_FAST = re.compile(rf"\[\s*(?:{_NUM_RE}(?:\s+{_NUM_RE})*)?\s*\]|\[\s*{_NUM_RE}(?:\s*,\s*{_NUM_RE})*\s*,?\s*\]")
_SEP = re.compile(r"[\s,]+")


def _fast_float(tok: str) -> float | None:
    f = float(tok)  # tok matched _NUM_RE: a plain number, nan or inf
    return None if math.isnan(f) else f


@functools.lru_cache(maxsize=4096)
def parse_resources(text: str) -> tuple[float | None, float | None]:
    """Parse a resources dict ``{'cpus': x, 'memory': y}`` to ``(cpus, memory)``.

    A missing key, ``None`` or ``nan`` gives None.  Keys other than ``cpus`` and ``memory``,
    and non-numeric values, are errors.  (Results are cached: the Kaggle layout repeats the
    same cells on many records.)
    """
    m = _RESOURCES_FAST.fullmatch(text)
    if m is not None:
        a, b = m.groups()
        return (None if a == "None" else _fast_float(a)), (None if b == "None" else _fast_float(b))
    d = parse(text)
    if not isinstance(d, dict):
        raise PyLitError(f"expected a dict, got {type(d).__name__}", 0)
    extra = set(d) - {"cpus", "memory"}
    if extra:
        raise PyLitError(f"unexpected keys {sorted(map(str, extra))}", 0)
    return _as_float(d.get("cpus"), "cpus"), _as_float(d.get("memory"), "memory")


@functools.lru_cache(maxsize=4096)
def parse_float_array(text: str, length: int) -> tuple[float | None, ...] | None:
    """Parse a NumPy-printed (or Python) list of exactly ``length`` numbers.

    Returns None for an empty array ``[]`` (no distribution recorded); NaN elements become
    None.  Any other length is an error.  (Results are cached, see :func:`parse_resources`.)
    """
    if _ARRAY_FAST.fullmatch(text) is not None:
        toks = [t for t in _SEP.split(text.strip()[1:-1]) if t]
        v: list[Any] = toks
        conv = True
    else:
        parsed = parse(text)
        if not isinstance(parsed, list):
            raise PyLitError(f"expected an array, got {type(parsed).__name__}", 0)
        v, conv = parsed, False
    if not v:
        return None
    if len(v) != length:
        raise PyLitError(f"expected {length} values, got {len(v)}", 0)
    if conv:
        return tuple(_fast_float(t) for t in v)
    return tuple(_as_float(x, "array element") for x in v)
