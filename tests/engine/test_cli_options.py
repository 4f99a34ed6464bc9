"""Every option of every registered analysis, driven from the CLI: `-O NAME=VALUE` is parsed by the
option field's type (the single declaration), reaches the analysis typed, and a bad value is a
one-line error with a non-zero exit (no traceback)."""

from __future__ import annotations

import doctest
import importlib
import json
import types
import typing

import pytest
from strategies import random_cell, write_dataset

from gpuclust.analyses import REGISTRY
from gpuclust.analyses.options import Option, options_of
from gpuclust.cli import main

ALL = [(name, o) for name, e in sorted(REGISTRY.items()) for o in e.options]


def _elem(o: Option) -> tuple[object, bool]:
    """(the element type, whether the option is a list)."""
    base = o.type
    if typing.get_origin(base) in (typing.Union, types.UnionType):  # X | None
        base = next(a for a in typing.get_args(base) if a is not type(None))
    if typing.get_origin(base) in (tuple, list):
        return typing.get_args(base)[0], True
    return base, False


def _text(v: object) -> str:
    if isinstance(v, (tuple, list)):
        return ",".join(_text(x) for x in v)
    return format(v, ".12g") if isinstance(v, float) else str(v).lower() if isinstance(v, bool) else str(v)


def _numbers(o: Option, elem: object, d: object) -> list[object]:
    """Candidate numbers near ``d`` (the default, or None), then inside the bounds."""
    out: list[float] = []
    if isinstance(d, (int, float)):
        out += [d * 2, d + 1, d / 2, d - 1]
    lo = o.ge if o.ge is not None else o.gt
    hi = o.le if o.le is not None else o.lt
    if lo is not None and hi is not None:
        out += [lo + (hi - lo) * 0.75, lo + (hi - lo) * 0.25]
    out += [1, 10**10]
    return [int(x) for x in out if float(x).is_integer()] if elem is int else [float(x) for x in out]


def candidates(o: Option) -> list[str]:
    """-O texts other than the default, derived from the option's declaration (its ``example``
    first, then from its choices, type, default and bounds)."""
    elem, is_list = _elem(o)
    out = [o.example] if o.example else []
    if o.choices:
        out += ["+".join(map(str, o.choices[-2:]))] if is_list else [str(c) for c in o.choices]
    elif elem is bool:
        out.append(_text(not o.default))
    elif elem in (int, float) and not is_list:
        out += [_text(x) for x in _numbers(o, elem, o.default)]
    elif elem in (int, float) and o.default is not None:  # a list: its last element changed
        out += [_text((*o.default[:-1], x)) for x in _numbers(o, elem, o.default[-1])]
    elif elem in (int, float):
        out += [_text(_numbers(o, elem, None)[:2])]
    return out


def valid_example(name: str, o: Option) -> tuple[str, object]:
    """The first candidate the analysis accepts with a value other than the default, and the value it gets."""
    cls = REGISTRY[name].cls
    for text in candidates(o):
        try:
            value = getattr(cls(**{o.name: o.parse(text)}), o.name)
        except ValueError:
            continue
        if value != o.default:
            return text, value
    raise AssertionError(f"{name}: no valid -O {o.name}=... derived; declare option(..., example=TEXT)")


def invalid_texts(o: Option) -> list[str]:
    """Values the option's type or choices refuse, and one outside its bounds."""
    elem, is_list = _elem(o)
    out = []
    if o.choices:
        out.append("nope")
    elif elem is int:
        out.append("0.5")
    elif is_list:
        out.append("x")
    elif elem in (float, bool):
        out.append("abc")
    for bound, step in ((o.gt, 0), (o.ge, -1), (o.lt, 0), (o.le, 1)):
        if bound is not None:
            out.append(_text(bound + step))
    return out


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return write_dataset(
        tmp_path_factory.mktemp("opt_ds"), random_cell(3, n_machines=10, n_instances=60, n_windows=400)
    )


def test_every_option_has_a_derived_valid_and_invalid_value():
    for name, o in ALL:
        valid_example(name, o)
        assert invalid_texts(o), f"{name}: no invalid -O {o.name}=... derived"


@pytest.mark.parametrize("name, opt", ALL, ids=[f"{n}-{o.name}" for n, o in ALL])
def test_every_option_from_cli(name, opt, ds, tmp_path, capsys):
    text, value = valid_example(name, opt)
    want = json.loads(json.dumps(value))
    out = tmp_path / "r"
    assert main(["analyze", str(ds), name, "-O", f"{opt.name}={text}", "--out", str(out), "--quiet", "--no-plots"]) == 0
    got = json.loads((out / "_run.json").read_text())["analyses"][0]["options"][opt.name]
    assert got == want and type(got) is type(want)
    elem, is_list = _elem(opt)
    assert all(type(x) is elem for x in (got if is_list else [got])), (got, opt.type)
    for bad in invalid_texts(opt):
        capsys.readouterr()
        assert (
            main(["analyze", str(ds), name, "-O", f"{opt.name}={bad}", "--out", str(tmp_path / "bad"), "--quiet"]) == 2
        )
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"gpuclust analyze: error: {name}: option {opt.name}: "), err
        assert "Traceback" not in err and not (tmp_path / "bad").exists()


def test_overcommit_window_options_together(ds, tmp_path, capsys):
    """The reported failure: two integer options, one of them optional (was: str < int TypeError)."""
    out = tmp_path / "r"
    assert (
        main(
            [
                "analyze",
                str(ds),
                "overcommit",
                "-O",
                "window_start_us=3600000000",
                "-O",
                "window_end_us=7200000000",
                "--out",
                str(out),
                "--quiet",
                "--no-plots",
            ]
        )
        == 0
    )
    assert "window [3600000000, 7200000000) us" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, match",
    [
        (["overcommit", "-O", "bucket_s=0.5"], "overcommit: option bucket_s: expected an integer, got '0.5'"),
        (["overcommit", "-O", "bucket_s=-5"], "overcommit: option bucket_s: must be > 0, got -5"),
        (
            ["cpi", "-O", "cpi_min=60", "-O", "cpi_max=50"],
            "cpi: options cpi_min, cpi_max: must satisfy cpi_min < cpi_max, got cpi_min=60.0, cpi_max=50.0",
        ),
        (["peak-prediction", "-O", "priority_range=9,1"], "option priority_range: must be two integers LO,HI"),
        (["usage-distribution", "-O", "by=instance+collection"], "option by: must be keys named once"),
        (["usage-distribution", "-O", "levels=0.5,1.5"], "option levels: must be each in [0, 1], got (0.5, 1.5)"),
        (["machine-shapes", "-O", "by=tier"], "no named analysis has option(s) ['by']"),
        (["cpi", "-O", "by"], "--option expects NAME=VALUE"),
    ],
)
def test_option_errors_are_one_line(args, match, ds, tmp_path, capsys):
    assert main(["analyze", str(ds), *args, "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err, err


def test_optional_none_and_bool_parsing():
    from gpuclust.analyses.overcommit import Overcommit

    end = {o.name: o for o in options_of(Overcommit)}["window_end_us"]
    assert end.parse("none") is None and end.parse("12") == 12
    flag = Option("flag", False, None, "a flag", bool)
    assert flag.parse("yes") is True and flag.parse("off") is False
    with pytest.raises(ValueError, match="expected true or false"):
        flag.parse("maybe")


def test_help_lists_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["analyze", "--help"])
    text = capsys.readouterr().out
    for name, o in ALL:
        assert f"{name}:" in text and f"-O {o.name}: " in text


def test_label_derived_from_fields():
    from gpuclust.analyses import CellUsage, Overcommit

    assert CellUsage().label == "cell-usage[mode=notebook]"  # mode is always shown
    assert Overcommit().label == "overcommit"
    assert Overcommit(window_end_us=7_200_000_000).label == "overcommit[window_end_us=7200000000]"


@pytest.mark.parametrize(
    "modname", ["gpuclust.analyses.options", "gpuclust.engine.checks", "gpuclust.engine.key_passes", "gpuclust._xp"]
)
def test_doctests(modname):
    res = doctest.testmod(importlib.import_module(modname), optionflags=doctest.ELLIPSIS)
    assert res.failed == 0


def test_docs_option_tables_name_every_option():
    """A page of docs/analyses/ with an options table (``| option | default |``) lists exactly the
    analysis' options (the declarations are the source; ``--help`` and the capability table are
    generated from them)."""
    import re
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs" / "analyses"
    pages = 0
    for name, e in REGISTRY.items():
        page = docs / f"{name}.md"
        text = page.read_text() if page.exists() else ""
        m = re.search(r"^\| option \| default \|.*\n\|[-|]+\|\n((?:\|.*\n)+)", text, re.M)
        if not m:
            continue
        pages += 1
        listed = [re.match(r"\| `(\w+)`", row).group(1) for row in m.group(1).splitlines()]
        assert listed == [o.name for o in e.options], (page.name, listed)
    assert pages >= 3
