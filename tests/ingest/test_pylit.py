"""The safe Python/NumPy literal parser: round-trips against what Python and NumPy print, and
refusal of everything that is not a plain literal (it must never evaluate code)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from gpuclust.ingest.readers._pylit import PyLitError, parse, parse_float_array, parse_resources


def _same(a: object, b: object) -> bool:
    """Equality where NaN equals NaN and types must match (int stays int)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)  # type: ignore[index]
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    return a == b


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
keys = st.one_of(st.text(max_size=12), st.integers(-1000, 1000), st.none(), st.booleans())
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(keys, inner, max_size=5),
        st.lists(inner, min_size=1, max_size=3).map(tuple),
    ),
    max_leaves=25,
)


@settings(max_examples=examples(300), deadline=None)
@given(values)
def test_roundtrip_python_repr(v: object) -> None:
    assert _same(parse(repr(v)), v)


@settings(max_examples=examples(200), deadline=None)
@given(st.text(max_size=40))
def test_roundtrip_strings_with_escapes(s: str) -> None:
    assert parse(repr(s)) == s
    assert parse(repr({s: [s]})) == {s: [s]}


@settings(max_examples=examples(200), deadline=None)
@given(
    st.dictionaries(st.sampled_from(["cpus", "memory"]), st.one_of(st.none(), st.floats(0, 1e6), st.integers(0, 10**6)))
)
def test_resources_dict(d: dict) -> None:
    cpus, mem = parse_resources(repr(d))
    assert cpus == (None if d.get("cpus") is None else float(d["cpus"]))
    assert mem == (None if d.get("memory") is None else float(d["memory"]))


floats64 = st.floats(allow_nan=True, allow_infinity=True, width=64)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(floats64, min_size=1, max_size=40))
def test_roundtrip_numpy_array_default_print(xs: list[float]) -> None:
    arr = np.array(xs, dtype=np.float64)
    text = str(arr)  # what pandas' to_csv writes for an ndarray cell (wrapped lines and all)
    got = np.array(parse(text), dtype=np.float64)
    assert got.shape == arr.shape
    # Default printing keeps 8 digits; compare to that precision, NaN/inf positions exactly.
    np.testing.assert_allclose(got, arr, rtol=1e-7, atol=1e-8, equal_nan=True)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(floats64, min_size=1, max_size=40))
def test_roundtrip_numpy_array_exact(xs: list[float]) -> None:
    arr = np.array(xs, dtype=np.float64)
    with np.printoptions(floatmode="unique", precision=17):
        text = str(arr)
    got = parse(text)
    assert _same(got, [float(x) for x in arr])


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=30))
def test_roundtrip_numpy_int_array(xs: list[int]) -> None:
    assert parse(str(np.array(xs, dtype=np.int64))) == xs


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.floats(0, 1, width=32), min_size=11, max_size=11))
def test_float_array_length(xs: list[float]) -> None:
    text = str(np.array(xs, dtype=np.float32))
    assert len(parse_float_array(text, 11) or []) == 11
    with pytest.raises(PyLitError, match="expected 9 values, got 11"):
        parse_float_array(text, 9)


def test_real_cells() -> None:
    """Cells copied from the real Kaggle sample (small_slice3.csv, record 0)."""
    assert parse("{'cpus': 0.0132904052734375, 'memory': 0.00432586669921875}") == {
        "cpus": 0.0132904052734375,
        "memory": 0.00432586669921875,
    }
    assert parse_resources("{'cpus': 0.00860595703125, 'memory': None}") == (0.00860595703125, None)
    dist = "[0.00020885 0.00025272 0.00030518 0.00095081 0.00767517 0.01078796\n 0.01182556 0.01242065 0.01322937 0.01477051 0.01934814]"
    assert parse_float_array(dist, 11) == (
        0.00020885,
        0.00025272,
        0.00030518,
        0.00095081,
        0.00767517,
        0.01078796,
        0.01182556,
        0.01242065,
        0.01322937,
        0.01477051,
        0.01934814,
    )
    assert parse("[]") == []
    assert parse_float_array("[]", 11) is None


def test_numpy_forms() -> None:
    assert parse("[0.  0.5 1. ]") == [0.0, 0.5, 1.0]
    assert parse("[1.e-05 2.e+03]") == [1e-05, 2e03]
    assert _same(parse("[nan -inf  inf]"), [math.nan, -math.inf, math.inf])
    assert parse("np.float64(0.25)") == 0.25
    assert parse("{'cpus': np.float32(1.5), 'memory': np.int64(3)}") == {"cpus": 1.5, "memory": 3}
    assert parse("[{'name': 'a', 'relation': 0}\n {'name': 'b', 'relation': 1}]") == [
        {"name": "a", "relation": 0},
        {"name": "b", "relation": 1},
    ]
    big = parse("123456789012345678901234567890")
    assert big == 123456789012345678901234567890 and isinstance(big, int)
    assert parse_resources("{'cpus': nan}") == (None, None)


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "().__class__",
        "[1, 2] + [3]",
        "lambda: 0",
        "{**x}",
        "1_000",
        "0x10",
        "1 2",
        "[1 2, 3]",
        "{'a' 1}",
        "{'a': 1",
        "'unterminated",
        "'bad escape \\q'",
        "np.float64('1')",
        "np.array([1])",
        "os.system",
        "[" * 40 + "]" * 40,
        "",
        "   ",
        "{[1]: 2}",
        "b'bytes'",
        "f'{x}'",
    ],
)
def test_rejects_non_literals(text: str) -> None:
    with pytest.raises(PyLitError):
        parse(text)


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("[1, 2]", "expected a dict"),
        ("{'cpus': 'x'}", "expected a number"),
        ("{'cpus': True}", "expected a number"),
        ("{'gpus': 1.0}", "unexpected keys"),
    ],
)
def test_resources_errors(text: str, msg: str) -> None:
    with pytest.raises(PyLitError, match=msg):
        parse_resources(text)


def test_not_a_string() -> None:
    with pytest.raises(TypeError):
        parse(b"[1]")  # type: ignore[arg-type]


def _slow_array(text: str, n: int) -> tuple[float | None, ...] | None:
    v = parse(text)
    if not isinstance(v, list):
        raise PyLitError("not a list", 0)
    if not v:
        return None
    if len(v) != n:
        raise PyLitError("length", 0)
    out = []
    for x in v:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise PyLitError("not a number", 0)
        out.append(None if math.isnan(x) else float(x))
    return tuple(out)


@settings(max_examples=examples(500), deadline=None)
@given(st.text(alphabet="[] ,\n0123456789.e-+naif", max_size=30), st.integers(0, 4))
def test_array_fast_path_agrees_with_full_parser(text: str, n: int) -> None:
    """The regex fast path of parse_float_array accepts exactly what the full parser accepts."""
    try:
        want: object = _slow_array(text, n)
    except PyLitError:
        want = PyLitError
    try:
        got: object = parse_float_array(text, n)
    except PyLitError:
        got = PyLitError
    assert _same(got, want), (text, got, want)


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(st.none(), st.floats(), st.integers(-5, 5)), st.one_of(st.none(), st.floats(), st.integers(-5, 5)))
def test_resources_fast_path_agrees(cpus: object, mem: object) -> None:
    text = repr({"cpus": cpus, "memory": mem})

    def norm(v: object) -> float | None:
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)  # type: ignore[arg-type]

    assert _same(parse_resources(text), (norm(cpus), norm(mem)))
