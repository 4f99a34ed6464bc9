"""Per-line coercion of decoded v3 JSON records (the slow path for chunks Arrow cannot parse).

:func:`coerce_record` turns one record :func:`json.loads` decoded into the Python values of the
raw schema (:func:`gpuclust.ingest.readers.v3_fields.raw_schema`), or raises a ``ValueError``
that names the field.
"""

from __future__ import annotations

import math
from typing import Any

from gpuclust.ingest.readers.v3_fields import BOOL, CONSTRAINTS, FLOAT, FLOATS, INT, INTS, RES, STR


class _BadValue(ValueError):
    pass


def _jtype(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return f"number {v!r}"
    if isinstance(v, str):
        s = v if len(v) <= 40 else v[:37] + "..."
        return f"string {s!r}"
    if isinstance(v, list):
        return "array"
    return "object"


class _NegativeZero(int):
    """JSON ``-0``: the integer 0 whose float is -0.0, as Arrow's reader and the compiled one
    read it into a float field (Python's ``json`` reads it as the int 0, losing the sign)."""

    def __float__(self) -> float:
        return -0.0


def _json_int(text: str) -> int:
    """``json.loads``'s ``parse_int``: as ``int``, but ``-0`` keeps its sign for float fields."""
    return _NegativeZero(0) if text == "-0" else int(text)


def _co_int(v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        raise _BadValue(f"expected an integer, got {_jtype(v)}")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float) and math.isfinite(v) and v.is_integer() and abs(v) < 2.0**53:
        return str(int(v))
    raise _BadValue(f"expected an integer (a quoted string or a number), got {_jtype(v)}")


def _co_float(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool):
        raise _BadValue(f"expected a number, got {_jtype(v)}")
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            pass
    raise _BadValue(f"expected a number, got {_jtype(v)}")


def _co_str(v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return str(v)
    raise _BadValue(f"expected a string, got {_jtype(v)}")


def _co_bool(v: Any) -> bool | None:
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false", "1", "0"):
        return v.strip().lower() in ("true", "1")
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise _BadValue(f"expected a boolean, got {_jtype(v)}")


def _co_res(v: Any, name: str) -> dict[str, float | None] | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise _BadValue(f"expected an object with cpus/memory, got {_jtype(v)}")
    out = {}
    for k in ("cpus", "memory"):
        try:
            out[k] = _co_float(v.get(k))
        except _BadValue as e:
            raise _BadValue(f"{name}.{k}: {e}") from None
    return out


def _co_list(v: Any, each: Any) -> list[Any] | None:
    if v is None:
        return None
    if not isinstance(v, list):
        raise _BadValue(f"expected an array, got {_jtype(v)}")
    return [each(x) for x in v]


def _co_constraint(v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _BadValue(f"expected a constraint object, got {_jtype(v)}")
    return {"name": _co_str(v.get("name")), "value": _co_str(v.get("value")), "relation": _co_int(v.get("relation"))}


def coerce_record(rec: dict[str, Any], fields: dict[str, str]) -> dict[str, Any]:
    """One decoded JSON record -> the raw schema's Python values; :class:`ValueError` names the field."""
    out: dict[str, Any] = {}
    for name, kind in fields.items():
        v = rec.get(name)
        try:
            if kind == INT:
                out[name] = _co_int(v)
            elif kind == FLOAT:
                out[name] = _co_float(v)
            elif kind == STR:
                out[name] = _co_str(v)
            elif kind == BOOL:
                out[name] = _co_bool(v)
            elif kind == RES:
                out[name] = _co_res(v, name)
                continue
            elif kind == FLOATS:
                out[name] = _co_list(v, _co_float)
            elif kind == INTS:
                out[name] = _co_list(v, _co_int)
            elif kind == CONSTRAINTS:
                out[name] = _co_list(v, _co_constraint)
        except _BadValue as e:
            msg = str(e)
            raise _BadValue(msg if msg.startswith(f"{name}.") else f"field {name}: {msg}") from None
    return out
