"""`gpuclust analyze` checks the dataset before computing: required tables, optional tables,
tier maps of the other trace version; says what `--backend auto` chose; counts rows on every
scheduler."""

from __future__ import annotations

import pytest
from strategies import random_cell, write_dataset

from gpuclust.cli import main
from gpuclust.schema import DEFAULT_TIER_MAP, TIER_MAP_TRACE, TIER_MAPS

pytestmark = [
    pytest.mark.filterwarnings("ignore:unclosed <socket:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:Exception ignored in. <socket:pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture(scope="module")
def tables():
    return random_cell(7, n_machines=8, n_instances=40, n_windows=300)


@pytest.fixture(scope="module")
def ds(tables, tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("chk"), tables)


@pytest.fixture(scope="module")
def machines_only(tables, tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("me"), {"machine_events": tables["machine_events"]})


@pytest.fixture(scope="module")
def no_usage(tables, tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("nu"), {k: v for k, v in tables.items() if k != "instance_usage"})


@pytest.fixture(scope="module")
def v2(tables, tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("v2"), tables, tier_map="v2", trace_version="v2")


def run(ds, tmp_path, *args):
    return main(["analyze", str(ds), *args, "--out", str(tmp_path / "r"), "--quiet", "--no-plots"])


@pytest.mark.parametrize("name", ["cpi", "cell-usage", "usage-distribution", "overcommit"])
def test_missing_required_table_is_refused(name, machines_only, tmp_path, capsys):
    assert run(machines_only, tmp_path, name) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "which the dataset does not have" in err and name in err
    assert not (tmp_path / "r").exists()


def test_machine_shapes_runs_on_machine_events_alone(machines_only, tmp_path, capsys):
    assert run(machines_only, tmp_path, "machine-shapes") == 0
    assert capsys.readouterr().err == ""


def test_missing_optional_table_is_a_note(no_usage, tmp_path, capsys):
    assert run(no_usage, tmp_path, "overcommit") == 0
    err = capsys.readouterr().err
    assert "gpuclust analyze: note: overcommit: the dataset has no instance_usage rows" in err


def test_tier_map_of_the_other_trace_version_warns(ds, v2, tmp_path, capsys):
    assert run(v2, tmp_path, "overcommit", "-O", "tier_map=v3-doc") == 0
    assert "warning: tier map 'v3-doc' is for v3 traces but the dataset is v2" in capsys.readouterr().err
    assert run(ds, tmp_path, "cell-usage", "--tier-map", "v2") == 0
    assert "warning: tier map 'v2' is for v2 traces but the dataset is v3" in capsys.readouterr().err
    assert run(v2, tmp_path, "overcommit") == 0  # the dataset's own map: no warning
    assert "warning" not in capsys.readouterr().err


def test_every_tier_map_has_a_trace_version():
    assert set(TIER_MAP_TRACE) == set(TIER_MAPS)
    assert all(TIER_MAP_TRACE[m] == v for v, m in DEFAULT_TIER_MAP.items())


def test_backend_auto_says_what_it_chose(ds, tmp_path, capsys):
    from gpuclust.backends import get_backend

    assert run(ds, tmp_path, "machine-shapes", "--backend", "auto") == 0
    chosen = get_backend("auto").name
    assert f"gpuclust analyze: backend auto: using {chosen} (" in capsys.readouterr().err
    import json

    assert json.loads((tmp_path / "r" / "_run.json").read_text())["backend"] == chosen


@pytest.mark.parametrize("scheduler", [None, "threads", "sync", pytest.param("local:2", marks=pytest.mark.slow)])
def test_progress_counts_rows_on_every_scheduler(scheduler, ds, tables, tmp_path, capsys):
    args = ["analyze", str(ds), "cell-usage", "machine-shapes", "--out", str(tmp_path / "r"), "--partitions", "2"]
    assert main([*args, *(["--scheduler", scheduler] if scheduler else [])]) == 0
    err = capsys.readouterr().err.splitlines()
    rows = tables["instance_usage"].num_rows + tables["machine_events"].num_rows
    assert [line for line in err if line.startswith("analyze: done, ")][0].startswith(f"analyze: done, {rows:,} rows")
    for t in ("instance_usage", "machine_events"):
        assert any(line.startswith(f"analyze: {t}: partition 2/2") and "(100%)" in line for line in err), err


# A table is required only by the options that read it (issue 33): cpi's CPI/MAI groups other than
# platforms need only usage rows; machine_events feeds by=platform (required) and the regression
# (its capacities: optional); instance_events is read for by=tier only.
@pytest.fixture(scope="module")
def no_machines(tables, tmp_path_factory):
    import numpy as np
    import pyarrow as pa

    usage = tables["instance_usage"]
    rng = np.random.default_rng(3)
    for name, lo, hi in (("cpi", 0.5, 3.0), ("mai", 0.0, 0.1)):  # random_cell leaves them NULL
        usage = usage.set_column(
            usage.schema.get_field_index(name),
            name,
            pa.array(rng.uniform(lo, hi, usage.num_rows), usage.schema.field(name).type),
        )
    return write_dataset(
        tmp_path_factory.mktemp("nm"),
        {**{k: v for k, v in tables.items() if k != "machine_events"}, "instance_usage": usage},
    )


@pytest.fixture(scope="module")
def usage_only(tables, tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("uo"), {"instance_usage": tables["instance_usage"]})


@pytest.mark.parametrize(
    "options",
    [
        ["by=cell"],
        ["by=cell", "regression=none"],
        ["by=machine"],
        ["by=collection", "regression=none"],
        ["by=tier", "regression=pooled"],
    ],
)
def test_cpi_without_machine_events_runs_unless_an_option_reads_them(options, no_machines, tmp_path, capsys):
    assert run(no_machines, tmp_path, "cpi", *[a for o in options for a in ("-O", o)]) == 0
    err = capsys.readouterr().err
    assert "error" not in err
    regression = "regression=none" not in options
    assert (
        "no machine_events rows; the results that depend on it (the regression: machine capacities) are empty" in err
    ) is regression
    assert err.count("\n") == int(regression)
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "r" / "cpi" / "groups.parquet").num_rows > 0


def test_cpi_by_platform_without_machine_events_is_refused(no_machines, tmp_path, capsys):
    assert run(no_machines, tmp_path, "cpi") == 2
    err = capsys.readouterr().err
    assert err == (
        "gpuclust analyze: error: cpi needs table(s) machine_events (by=platform: the machines' platforms; "
        "by=cell, machine, collection, tier do not), which the dataset does not have (0 rows)\n"
    )
    assert not (tmp_path / "r").exists()


def test_instance_events_only_noted_for_the_options_that_read_them(usage_only, tmp_path, capsys):
    assert run(usage_only, tmp_path, "cpi", "-O", "by=machine", "-O", "regression=none") == 0
    assert capsys.readouterr().err == ""  # nothing it reads is missing
    assert run(usage_only, tmp_path, "usage-distribution", "-O", "by=instance") == 0
    assert capsys.readouterr().err == ""
    assert run(usage_only, tmp_path, "usage-distribution") == 0  # by=tier (the default) reads the priorities
    assert (
        "note: usage-distribution: the dataset has no instance_events rows; the results that depend on it "
        "(by=tier: the instances' priorities) are empty" in capsys.readouterr().err
    )
    assert run(usage_only, tmp_path, "cpi", "-O", "by=tier", "-O", "regression=none") == 0
    assert "note: cpi[by=tier,regression=none]: the dataset has no instance_events rows" in capsys.readouterr().err


def test_info_names_the_option_that_needs_a_table(no_machines, capsys):
    assert main(["info", str(no_machines)]) == 0
    out = capsys.readouterr().out
    assert "cpi                  needs machine_events (by=platform: the machines' platforms;" in out
    assert "usage-distribution   runs\n" in out
