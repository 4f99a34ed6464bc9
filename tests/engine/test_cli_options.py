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

#: (analysis, option) -> (the text given to -O, the value the analysis must receive)
VALID = {
    ("cell-usage", "mode"): ("exact", "exact"),
    ("cell-usage", "tier_map"): ("v3-doc", "v3-doc"),
    ("cpi", "by"): ("machine", "machine"),
    ("cpi", "regression"): ("pooled", "pooled"),
    ("cpi", "spearman"): ("exact", "exact"),
    ("cpi", "spearman_bins"): ("16", 16),
    ("cpi", "cpi_min"): ("0.5", 0.5),
    ("cpi", "cpi_max"): ("50", 50.0),
    ("cpi", "mai_min"): ("0.001", 0.001),
    ("cpi", "mai_max"): ("0.9", 0.9),
    ("cpi", "min_cpu_seconds"): ("0.5", 0.5),
    ("cpi", "tier_map"): ("seed-002", "seed-002"),
    ("collection-lifecycle", "bucket_s"): ("600", 600),
    ("data-quality", "short_window_s"): ("60", 60),
    ("data-quality", "row_order"): ("true", True),
    ("collection-lifecycle", "tier_map"): ("v3-doc", "v3-doc"),
    ("job-usage", "rows"): ("top-level", "top-level"),
    ("job-usage", "tail"): ("0.25", 0.25),
    ("job-usage", "tier_map"): ("v3-doc", "v3-doc"),
    ("lifecycle", "bucket_s"): ("300", 300),
    ("lifecycle", "tier_map"): ("v2", "v2"),
    ("machine-utilization", "mode"): ("time-weighted", "time-weighted"),
    ("peak-prediction", "metric"): ("max_mem", "max_mem"),
    ("peak-prediction", "horizon_s"): ("3600", 3600),
    ("peak-prediction", "oracle_percentile"): ("99", 99.0),
    ("peak-prediction", "cap_to_limit"): ("false", False),
    ("peak-prediction", "min_samples"): ("12", 12),
    ("peak-prediction", "borg_fraction"): ("0.8", 0.8),
    ("peak-prediction", "n_sigma"): ("3", 3.0),
    ("peak-prediction", "n_sigma_history"): ("48", 48),
    ("peak-prediction", "instance_percentile"): ("95", 95.0),
    ("peak-prediction", "instance_history"): ("60", 60),
    ("peak-prediction", "machine_percentile"): ("99", 99.0),
    ("peak-prediction", "machine_history"): ("12", 12),
    ("peak-prediction", "combine"): ("n_sigma+machine_percentile", ["n_sigma", "machine_percentile"]),
    ("peak-prediction", "priority_range"): ("0,200", [0, 200]),
    ("peak-prediction", "scheduling_class_range"): ("0,3", [0, 3]),
    ("peak-prediction", "apply_ranges"): ("false", False),
    ("overcommit", "bucket_s"): ("600", 600),
    ("overcommit", "tier_map"): ("v3-doc", "v3-doc"),
    ("overcommit", "window_start_us"): ("3600000000", 3600000000),
    ("overcommit", "window_end_us"): ("7200000000", 7200000000),
    ("usage-change", "level"): ("machine", "machine"),
    ("usage-change", "max_gap_s"): ("600", 600),
    ("usage-change", "tier_map"): ("v3-doc", "v3-doc"),
    ("usage-vs-request", "tier_map"): ("seed-002", "seed-002"),
    ("usage-distribution", "by"): ("tier+time", ["tier", "time"]),
    ("usage-distribution", "bucket_s"): ("0.5", 0.5),
    ("usage-distribution", "levels"): ("0.99,0.5", [0.5, 0.99]),
    ("usage-distribution", "rows"): ("all", "all"),
    ("usage-distribution", "strategy"): ("bounded", "bounded"),
    ("usage-distribution", "k"): ("64", 64),
    ("usage-distribution", "exact_max_windows"): ("10", 10),
    ("usage-distribution", "tier_map"): ("notebook", "notebook"),
}
ALL = [(name, o) for name, e in sorted(REGISTRY.items()) for o in e.options]


def invalid_text(o: Option) -> str:
    """A value the option's type or choices refuse."""
    base = o.type
    if typing.get_origin(base) in (typing.Union, types.UnionType):  # X | None
        base = next(a for a in typing.get_args(base) if a is not type(None))
    if o.choices:
        return "nope"
    if base is int:
        return "0.5"
    if typing.get_origin(base) in (tuple, list):
        return "x"
    return "abc"


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return write_dataset(
        tmp_path_factory.mktemp("opt_ds"), random_cell(3, n_machines=10, n_instances=60, n_windows=400)
    )


def test_valid_table_covers_every_option():
    assert {(n, o.name) for n, o in ALL} == set(VALID), "add a valid CLI value for each new option to VALID"


@pytest.mark.parametrize("name, opt", ALL, ids=[f"{n}-{o.name}" for n, o in ALL])
def test_every_option_from_cli(name, opt, ds, tmp_path, capsys):
    text, want = VALID[(name, opt.name)]
    out = tmp_path / "r"
    assert main(["analyze", str(ds), name, "-O", f"{opt.name}={text}", "--out", str(out), "--quiet", "--no-plots"]) == 0
    got = json.loads((out / "_run.json").read_text())["analyses"][0]["options"][opt.name]
    assert got == want and type(got) is type(want)
    capsys.readouterr()
    bad = invalid_text(opt)
    assert main(["analyze", str(ds), name, "-O", f"{opt.name}={bad}", "--out", str(tmp_path / "bad"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpuclust analyze: error: ") and opt.name in err, err
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
        (["overcommit", "-O", "bucket_s=-5"], "overcommit: bucket_s must be positive"),
        (["cpi", "-O", "cpi_min=60", "-O", "cpi_max=50"], "cpi:"),
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


@pytest.mark.parametrize("modname", ["gpuclust.analyses.options", "gpuclust.engine.checks"])
def test_doctests(modname):
    res = doctest.testmod(importlib.import_module(modname), optionflags=doctest.ELLIPSIS)
    assert res.failed == 0
