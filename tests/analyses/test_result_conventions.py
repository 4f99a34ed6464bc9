"""Result conventions shared by every analysis (issue 7; docs/user/dataset.md "Time buckets" and
"Result tables"):

* one time-bucket convention: bucket ``k`` of width ``W`` is ``[k*W, (k+1)*W)`` of trace time
  (origin 0, 600 s before the trace start), reported as ``bucket`` (= k) and ``bucket_start_us``
  (= k*W, int64 µs), so the hourly results of cell-usage, overcommit and usage-distribution join
  on equal keys — and agree on what they both measure;
* one name for one thing: ``machine_id``, ``collection_id``, ``tier``, ``bucket``,
  ``bucket_start_us`` everywhere (no ``machine``, ``time``, ``hour``, ``bucket_start_s``);
* missing is never zero: an unmeasured quantity is NaN in tables and "unknown" in summaries.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpuclust.analyses import REGISTRY, CellUsage, Overcommit, UsageDistribution, create
from gpuclust.engine import run

H = 3_600_000_000
W = 3600


@pytest.fixture(scope="module")
def synth_ds(tmp_path_factory):
    from gpuclust.synth import SynthConfig, synthesize

    root = tmp_path_factory.mktemp("conventions")
    synthesize(SynthConfig(machines=20, hours=3, seed=11), root / "raw", dataset=root / "ds", progress=None)
    return root / "ds"


@pytest.fixture(scope="module")
def hourly(synth_ds):
    ud_mt = UsageDistribution(by=("machine", "time"), bucket_s=W, strategy="exact")
    ud_tt = UsageDistribution(by=("tier", "time"), bucket_s=W, strategy="exact")
    oc = Overcommit(bucket_s=W)
    cu = CellUsage(mode="exact")
    res = run(synth_ds, [ud_mt, ud_tt, oc, cu], partitions=2)
    return {"ud_mt": _pick(res, ud_mt), "ud_tt": _pick(res, ud_tt), "oc": _pick(res, oc), "cu": _pick(res, cu)}


def _pick(res, a):
    """An analysis' result (keyed by its label, or by its name when it ran once)."""
    return res[a.label] if a.label in res else res[a.name]


def _bucket_keys_ok(df: pd.DataFrame, width_us: int) -> None:
    assert df["bucket"].dtype == np.int64 and df["bucket_start_us"].dtype == np.int64
    assert (df["bucket_start_us"] == df["bucket"] * width_us).all()


def test_hourly_results_join_on_bucket_keys(hourly):
    ud_mt, ud_tt, oc, cu = hourly["ud_mt"], hourly["ud_tt"], hourly["oc"], hourly["cu"]
    for df in (ud_mt["quantiles"], ud_tt["quantiles"], oc["machine"], oc["cell"], cu["usage"]):
        _bucket_keys_ok(df, W * 1_000_000)
    info = ud_mt["info"].iloc[0]
    assert info["skipped_no_percentiles"] == 0 and info["bad_time_windows"] == 0  # every window has a shape

    # usage-distribution by machine+time  <->  overcommit per machine-bucket: the same keys where both
    # have windows, and the same count of windows per key
    key = ["machine_id", "bucket", "bucket_start_us"]
    ud = ud_mt["quantiles"][ud_mt["quantiles"]["n_windows"] > 0]
    om = oc["machine"][oc["machine"]["windows"] > 0]
    j = ud.merge(om, on=key, how="outer", indicator=True, suffixes=("_ud", "_oc"))
    assert len(ud) > 50 and (j["_merge"] == "both").all(), j["_merge"].value_counts()
    np.testing.assert_array_equal(j["n_windows"].to_numpy(), j["windows"].to_numpy())

    # cell-usage (exact, hourly) <-> overcommit's cell series: same hours, same CPU-seconds per tier
    cap = float(cu["info"]["cpu_capacity"].iloc[0])
    tiers = [t for t in oc["info"]["tiers"].iloc[0].split(",")]
    wide = cu["usage"].pivot(index=["bucket", "bucket_start_us"], columns="tier", values="cpu").reset_index()
    j = wide.merge(oc["cell"], on=["bucket", "bucket_start_us"], how="inner", suffixes=("_cu", ""))
    assert len(j) == len(wide) >= 3  # every cell-usage hour is an overcommit bucket
    for t in tiers:
        if t not in wide.columns:
            continue
        cu_cpu_s = j[t].fillna(0).to_numpy() * cap * 3600.0
        oc_cpu_s = j[f"use_cpu_{t}"].to_numpy() * j["covered_s"].to_numpy()
        np.testing.assert_allclose(cu_cpu_s, oc_cpu_s, rtol=1e-9, atol=1e-9, err_msg=t)

    # usage-distribution by tier+time <-> cell-usage: every distribution group is a cell-usage row
    ut = ud_tt["quantiles"][ud_tt["quantiles"]["n_windows"] > 0]
    j = ut.merge(cu["usage"], on=["tier", "bucket", "bucket_start_us"], how="left", indicator=True)
    assert len(ut) > 5 and (j["_merge"] == "both").all()


def test_bucket_origin_is_trace_time_zero_for_every_width(synth_ds):
    """Buckets of every width nest: an overcommit 300 s bucket lies inside the hourly bucket with
    bucket_start_us = floor(start / 1 h) h, for overcommit and usage-distribution alike."""
    oc, ud = Overcommit(bucket_s=300), UsageDistribution(by="time", bucket_s=300, strategy="exact")
    res = run(synth_ds, [oc, ud])
    m = _pick(res, oc)["machine"]
    q = _pick(res, ud)["quantiles"]
    for df in (m, q):
        _bucket_keys_ok(df, 300_000_000)
        assert (df["bucket_start_us"] % 300_000_000 == 0).all()
    # the trace starts at 600 s: overcommit's first bucket is bucket 2 = [600 s, 900 s)
    assert m["bucket"].min() == 2 and _pick(res, oc)["cell"]["bucket_start_us"].iloc[0] == 600_000_000
    assert set(q["bucket"]) <= set(m["bucket"])


def _all_variants():
    out = [create(n) for n in REGISTRY]
    out += [UsageDistribution(by=b) for b in ("instance", "collection", "machine", "cell", "tier,time")]
    out += [create("cpi", by=b) for b in ("machine", "collection", "tier")]
    out += [CellUsage(mode="exact")]
    return out


def test_same_name_for_same_thing(synth_ds):
    variants = _all_variants()
    res = run(synth_ds, variants)
    forbidden = {"machine", "time", "hour", "bucket_start_s", "collection", "platform", "instance"}
    seen: dict[str, set[str]] = {}
    for a in variants:
        for table, df in _pick(res, a).items():
            cols = set(df.columns)
            assert not (cols & forbidden), (a.label, table, cols & forbidden)
            if "bucket" in cols:
                assert "bucket_start_us" in cols, (a.label, table)
            for c in cols:
                seen.setdefault(c, set()).add(f"{a.label}/{table}")
    # the identifiers appear under one name across analyses
    assert len(seen["machine_id"]) >= 3 and len(seen["bucket_start_us"]) >= 4
    assert len(seen["collection_id"]) >= 2 and len(seen["tier"]) >= 3


def test_summaries_say_unknown_not_nan(tmp_path):
    """Without instance_usage, overcommit's summary says unknown for usage; cell-usage's summary
    shows an all-NULL tier as unknown."""
    from strategies import table, write_dataset

    tables = {
        "machine_events": table(
            "machine_events", {"time": [0], "machine_id": [5], "type": [1], "cap_cpu": [1.0], "cap_mem": [1.0]}
        ),
        "instance_events": table(
            "instance_events",
            {
                "time": [0],
                "type": [3],
                "collection_id": [1],
                "instance_index": [0],
                "machine_id": [5],
                "priority": [200],
                "alloc_collection_id": [0],
                "req_cpu": [0.5],
                "req_mem": [0.5],
            },
        ),
        "instance_usage": table(
            "instance_usage",
            {
                "start_time": [H],
                "end_time": [H + 300_000_000],
                "collection_id": [1],
                "instance_index": [0],
                "machine_id": [5],
                "alloc_collection_id": [0],
                "avg_cpu": [None],
                "avg_mem": [0.5],
            },
        ),
    }
    ds = write_dataset(tmp_path / "ds", tables)
    cu = CellUsage(mode="exact")
    r = _pick(run(ds, [cu]), cu)
    assert np.isnan(r["usage"]["cpu"]).all() and (r["usage"]["mem"] > 0).all()
    text = cu.summary(r)
    assert "mean cpu unknown" in text and "nan" not in text.lower().replace("unknown", "")

    del tables["instance_usage"]
    ds2 = write_dataset(tmp_path / "ds2", tables)
    oc = Overcommit(bucket_s=W, window_end_us=3 * H)
    r = _pick(run(ds2, [oc]), oc)
    assert r["machine"]["use_cpu"].isna().all() and r["cell"]["usage_ratio_cpu"].isna().all()
    assert (r["machine"]["req_cpu"] > 0).all()
    assert "usage/capacity mean unknown" in oc.summary(r)


def test_plots_draw_unknown_values(tmp_path):
    """Plots accept NaN (unknown) values and draw them as gaps (never as 0)."""
    from gpuclust.report.plots import plot_result

    usage = pd.DataFrame(
        {
            "bucket": np.array([0, 0, 1], np.int64),
            "bucket_start_us": np.array([0, 0, H], np.int64),
            "tier": ["free", "prod", "prod"],
            "cpu": [0.1, np.nan, 0.2],
            "mem": [0.1, 0.2, np.nan],
            "windows": np.array([1, 1, 1], np.int64),
        }
    )
    info = pd.DataFrame([{"tiers": "free,beb,mid,prod,unknown"}])
    assert plot_result("cell-usage", {"usage": usage, "info": info}, tmp_path / "cu.png")
    assert (tmp_path / "cu.png").stat().st_size > 1000


def test_zero_weight_distribution_is_unknown():
    """usage-distribution: a group whose windows all have weight 0 has no distribution: mean and
    quantiles NaN (not 0), and the summary says unknown."""
    from strategies import table

    from gpuclust.engine import TableSource
    from gpuclust.schema import CPU_PERCENTILE_COLUMNS_SORTED

    cols = {
        "start_time": [H, 2 * H],
        "end_time": [H, 2 * H + 300_000_000],
        "collection_id": [1, 2],
        "instance_index": [0, 0],
        "machine_id": [5, 6],
        "alloc_collection_id": [0, 0],
        "sample_rate": [1.0, 1.0],
    }
    cols.update({c: [0.5, 0.2] for c in CPU_PERCENTILE_COLUMNS_SORTED})
    a = UsageDistribution(by="machine")
    r = _pick(run(TableSource({"instance_usage": table("instance_usage", cols)}), [a]), a)
    q = r["quantiles"].set_index("machine_id")
    assert q.loc[5, "weight"] == 0 and np.isnan(q.loc[5, "mean"]) and np.isnan(q.loc[5, "q50"])
    assert q.loc[6, "mean"] == pytest.approx(0.2)
    text = a.summary(r)
    assert "machine_id=5: weight=0 unknown unknown" in text and "nan" not in text


def test_fmt():
    from gpuclust.analyses.base import fmt

    assert fmt(float("nan")) == "unknown" and fmt(None) == "unknown" and fmt(pd.NA) == "unknown"
    assert fmt(0.0, ".3f") == "0.000" and fmt(0.1234, ".2f", 100, "%") == "12.34%"


def test_docs_list_the_result_columns(synth_ds):
    """The docs name the result columns the analyses produce (and none of the old names), and every
    analysis doc that buckets time links the shared convention."""
    import re
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs"
    text = {p.relative_to(docs).as_posix(): p.read_text() for p in docs.rglob("*.md")}
    assert (
        "## Time buckets" in text["user/dataset.md"]
        and "## Result tables: names and missing values" in text["user/dataset.md"]
    )
    for name in (
        "analyses/README.md",
        "analyses/cell-usage.md",
        "analyses/overcommit.md",
        "analyses/usage-distribution.md",
        "analyses/cpi.md",
    ):
        assert "dataset.md#time-buckets" in text[name], name
    for name in (
        "analyses/README.md",
        "analyses/cell-usage.md",
        "analyses/overcommit.md",
        "analyses/usage-distribution.md",
    ):
        for old in ("`hour`", "`bucket_start_s`", "`machine`,", "`time`, `bucket_s`"):
            assert old not in text[name], (name, old)
    oc, cu, ud = Overcommit(bucket_s=W), CellUsage(), UsageDistribution(by="tier,time")
    res = run(synth_ds, [oc, cu, ud])
    tiers = _pick(res, oc)["info"]["tiers"].iloc[0].split(",")
    per_tier = re.compile(r"_(" + "|".join(tiers) + r")$")
    for table in ("machine", "cell"):
        for c in _pick(res, oc)[table].columns:
            if not per_tier.search(c):
                assert f"`{c}`" in text["analyses/overcommit.md"], (table, c)
    for c in _pick(res, cu)["usage"].columns:
        assert f"`{c}`" in text["analyses/cell-usage.md"], c
    for c in ud.key_columns():
        assert f"`{c}`" in text["analyses/usage-distribution.md"], c


#: The analyses that split by priority tier (those with the ``tier_map`` option), and the options
#: that make one split by tier where its default grouping does not.
TIERED = sorted(n for n, e in REGISTRY.items() if any(o.name == "tier_map" for o in e.options))
BY_TIER = {"cpi": {"by": "tier"}, "usage-change": {"level": "instance"}}


def test_every_tiered_result_names_its_tier_map(synth_ds):
    """TRACE_NOTES: a result split by priority tier says which tier map it used.  Every analysis
    with the ``tier_map`` option writes the map in its ``info`` table, the dataset's default
    (``notebook`` on a 2019 cell) and one asked for (``v3-doc``), and its ``tier`` columns hold
    only that map's names (besides ``all`` and ``unknown``)."""
    from gpuclust.schema import TIER_MAPS

    assert len(TIERED) >= 9, TIERED  # a new tiered analysis is checked here by itself
    runs = {
        (n, m): create(n, **BY_TIER.get(n, {}), **({} if m == "notebook" else {"tier_map": m}))
        for n in TIERED
        for m in ("notebook", "v3-doc")
    }
    res = run(synth_ds, list(runs.values()), partitions=2)
    seen: dict[tuple[str, str], set[str]] = {}
    for (name, m), a in runs.items():
        tables = {t: v if hasattr(v, "columns") else v.read() for t, v in _pick(res, a).items()}
        assert tables["info"]["tier_map"].tolist() == [m], (name, m)
        got = set().union(*(set(df["tier"].dropna().astype(str)) for df in tables.values() if "tier" in df.columns))
        assert got <= {*TIER_MAPS[m].names, "all", "unknown"}, (name, m, got)
        seen[name, m] = got
    for name in TIERED:  # the map asked for is the one applied: the 2019 notebook's "beb" tier is not v3-doc's
        if "beb" in seen[name, "notebook"]:
            assert "beb" not in seen[name, "v3-doc"] and seen[name, "v3-doc"] & {"mid", "free"}, name
    assert sum("beb" in seen[n, "notebook"] for n in TIERED) >= 5, seen
