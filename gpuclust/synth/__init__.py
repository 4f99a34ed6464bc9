"""``gpuclust synth``: a synthetic Borg cell in the real v3 JSON export format, with planted truth.

Examples
--------
>>> from pathlib import Path
>>> from gpuclust.synth import SynthConfig, synthesize
>>> res = synthesize(SynthConfig(machines=20, hours=0.5, seed=1), Path(tmp_path))  # doctest: +SKIP
>>> res.truth["counts"]["instance_usage"]["rows"] > 0  # doctest: +SKIP
True

See ``docs/user/synth.md`` for the model, every knob and the ground-truth keys.

Modules: :mod:`~gpuclust.synth.config` (:class:`SynthConfig`, :class:`SynthResult`), the simulation
in :mod:`~gpuclust.synth.model` (its parameters and records in :mod:`~gpuclust.synth.params`, its
state in :mod:`~gpuclust.synth.state`, the instance lifecycle in :mod:`~gpuclust.synth.scheduler`),
usage windows in :mod:`~gpuclust.synth.usage` and :mod:`~gpuclust.synth.blocks`, JSON lines in
:mod:`~gpuclust.synth.tables` and :mod:`~gpuclust.synth.export`, planted malformed lines in
:mod:`~gpuclust.synth.malformed`, the ground truth in :mod:`~gpuclust.synth.truth`; this module
runs the pipeline (:func:`synthesize`).
"""

from __future__ import annotations

import errno
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gpuclust.schema import TRACE_OFFSET_US, CollectionType

from . import model as _model
from . import usage as _usage

# the pieces live in their own modules (issue 36); the names are re-exported here
from .blocks import _FMT_ROWS as _FMT_ROWS
from .blocks import _KEEP, _usage_blocks
from .blocks import _SUMMARY as _SUMMARY
from .blocks import _block_job as _block_job
from .blocks import _init_worker as _init_worker
from .config import MALFORMED_KINDS, TRUTH_FILE, USAGE_TABLES, SynthConfig, SynthResult
from .config import MALFORMED_TABLES as MALFORMED_TABLES
from .config import TRUTH_VERSION as TRUTH_VERSION
from .export import F as F
from .export import LineBuilder as LineBuilder
from .export import ShardWriter
from .export import _value as _value
from .export import fmt_float as fmt_float
from .export import json_line as json_line
from .malformed import _Malformer
from .malformed import corrupt_line as corrupt_line
from .tables import _attr_lines, _coll_lines, _inst_lines, _machine_lines
from .tables import _res as _res
from .tables import format_usage as format_usage
from .truth import _planted_laws, _truth
from .truth import _share_within as _share_within
from .truth import _tier_totals as _tier_totals

__all__ = ["SynthConfig", "SynthResult", "synthesize", "USAGE_TABLES", "MALFORMED_KINDS"]


def _progress_default(msg: str) -> None:
    print(f"[synth] {msg}", file=sys.stderr, flush=True)


def synthesize(
    cfg: SynthConfig,
    out: Path | str,
    *,
    dataset: Path | str | None = None,
    progress: Callable[[str], None] | None = _progress_default,
    keep_windows: bool = False,
    layout: str = "bucketed",
) -> SynthResult:
    """Simulate a cell and write it as v3 JSON export shards plus ``synth_truth.json``.

    Parameters
    ----------
    cfg : SynthConfig
        The model's knobs; ``cfg.seed`` makes the output byte-identical run to run.
    out : path
        Folder for the shards (created).
    dataset : path, optional
        Also ingest the shards into a gpuclust dataset there (``gpuclust.ingest.ingest``), with
        the truth in the manifest under ``synthetic``.
    progress : callable, optional
        Receives one line per phase and shard (default: stderr).  ``None`` for silence.
    keep_windows : bool
        Return window-level arrays (k, u, cpi, ...) in :attr:`SynthResult.windows` (tests).
    layout : str
        The dataset's layout, as ``gpuclust.ingest.ingest``'s ``layout`` (default ``"bucketed"``).

    Returns
    -------
    SynthResult

    Examples
    --------
    >>> res = synthesize(SynthConfig(machines=10, hours=0.25), "/tmp/cell", progress=None)  # doctest: +SKIP
    """
    t_start = time.perf_counter()
    say = progress or (lambda msg: None)
    out = Path(out)
    if out.exists() and not out.is_dir():  # mkdir's FileExistsError would not say what is wrong
        raise FileExistsError(errno.EEXIST, "exists and is not a folder", str(out))
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("*-[0-9]*.json.gz")):  # stale shards of an earlier run
        if old.name.split("-")[0] in USAGE_TABLES:
            old.unlink()
    ss = np.random.SeedSequence(cfg.seed)
    s_model, s_params, s_usage, s_bad = ss.spawn(4)
    md = _model.Model(cfg, np.random.default_rng(s_model))
    md.run()
    say(
        f"simulated {cfg.machines} machines x {cfg.hours:g} h: {len(md.colls):,} collections, "
        f"{len(md.inst_events):,} instance events ({time.perf_counter() - t_start:.1f}s)"
    )
    bad = _Malformer(cfg.malformed_rate, np.random.default_rng(s_bad))

    shards: dict[str, list[Path]] = {}
    counts: dict[str, dict[str, Any]] = {}

    def write_small(table: str, lines: list[str]) -> None:
        bad.apply_lines(table, lines)
        w = ShardWriter(out, table, cfg.shard_rows, cfg.compresslevel, say)
        w.write_lines(lines)
        shards[table] = w.close()
        counts[table] = {"rows": w.rows}

    write_small("machine_events", _machine_lines(md))
    write_small("machine_attributes", _attr_lines(md))
    write_small("collection_events", _coll_lines(md))
    write_small("instance_events", _inst_lines(md))

    # ---- usage
    iv = md.intervals()
    n_coll = len(md.colls)
    coll = {
        "cid": np.array([c.cid for c in md.colls], np.int64),
        "ctype": np.array([c.ctype for c in md.colls], np.int64),
        "prio": np.array([c.prio for c in md.colls], np.int64),
        "alloc_cid": np.array([md.colls[c.alloc_set].cid if c.alloc_set >= 0 else 0 for c in md.colls], np.int64),
    }
    tiers = _model.PLANT_TIERS
    ratios = _usage.ratio_by_tier(cfg)
    iv_ratio = np.array([ratios[t] for t in tiers.names])[tiers.tier_codes(coll["prio"][iv["coll"]]).astype(np.int64)]
    params = _usage.interval_params(
        iv,
        coll["ctype"][iv["coll"]] == int(CollectionType.ALLOC_SET),
        np.random.default_rng(s_params),
        cfg,
        ratio=iv_ratio,
    )
    cpi_base = np.array([p[1] if p[1] is not None else np.nan for p in _model.PLATFORMS])[md.m_platform]
    mai_base = np.array([p[2] if p[2] is not None else np.nan for p in _model.PLATFORMS])[md.m_platform]
    cap_c = np.where(md.m_null_cap, np.nan, md.m_cap_c / _model.UNIT)
    s_ml = cfg.machine_load_sigma
    load = np.exp(s_ml * np.random.default_rng(s_params.spawn(1)[0]).standard_normal(cfg.machines) - 0.5 * s_ml * s_ml)
    load /= load.mean()  # mean exactly one over the machines (keeps the planted usage / request means)
    mach = {
        "mid": md.m_id,
        "cap_c": cap_c,
        "cap_true": md.m_cap_c / _model.UNIT,
        "cpi_base": cpi_base,
        "mai_base": mai_base,
        "load": load,
    }
    ctx = _usage.UsageContext(cfg, iv, params, coll, mach, md.t_end)
    g_first = TRACE_OFFSET_US // _usage.CELL_US
    g_last = -(-md.t_end // _usage.CELL_US)
    blocks = list(range(g_first, g_last, cfg.block_cells))
    usage_seeds = s_usage.spawn(len(blocks))
    w_usage = ShardWriter(out, "instance_usage", cfg.shard_rows, cfg.compresslevel, say)
    prio_cpu_top: dict[int, float] = {}
    prio_cpu_all: dict[int, float] = {}
    prio_cpu_top_valid: dict[int, float] = {}
    job_cpu = np.zeros(n_coll)
    n_windows = 0
    n_cpi = 0
    n_outliers = 0
    cpi_sum = [0.0, 0.0, 0.0]  # sum w*cpi, sum w, sum w*base over clean CPI rows
    plat_w = np.zeros(len(_model.PLATFORMS))
    plat_wc = np.zeros(len(_model.PLATFORMS))
    kept: dict[str, list] = {}
    n_tiers = len(tiers.names)
    ratio_sums = np.zeros(
        (4, n_tiers)
    )  # windows, sum of E[usage/request], sum of realised, sum over machine-cells of windows^2
    iv_windows = np.zeros(iv["coll"].size, np.int64)  # windows per running interval
    mach_windows = np.zeros((n_tiers, cfg.machines), np.int64)  # windows per tier and machine
    for cols, chunks in _usage_blocks(ctx, blocks, g_last, usage_seeds, cfg.workers, keep_windows):
        W = cols["start_time"].size
        valid = np.ones(W, bool)
        r0 = 0
        for data, lengths in chunks:
            data, lengths, broken = bad.apply_bytes("instance_usage", data, lengths)
            valid[r0 + broken] = False
            r0 += len(lengths)
            w_usage.write(data, lengths)
        cs = cols["avg_cpu"] * cols["dur"]
        top = cols["top"]
        for d, sel in ((prio_cpu_top, top), (prio_cpu_all, np.ones(W, bool)), (prio_cpu_top_valid, top & valid)):
            pr, inv = np.unique(cols["priority"][sel], return_inverse=True)
            sums = np.bincount(inv, weights=cs[sel], minlength=pr.size)
            for p_, s_ in zip(pr.tolist(), sums.tolist(), strict=True):
                d[p_] = d.get(p_, 0.0) + s_
        jobs = cols["collection_type"] == int(CollectionType.JOB)
        job_cpu += np.bincount(cols["coll"][jobs], weights=cs[jobs], minlength=n_coll)
        hc = cols["has_cpi"] & ~cols["cpi_outlier"]
        n_cpi += int(cols["has_cpi"].sum())
        n_outliers += int(cols["cpi_outlier"].sum())
        cpi_sum[0] += float((cols["cpi"][hc] * cs[hc]).sum())
        cpi_sum[1] += float(cs[hc].sum())
        cpi_sum[2] += float((cols["cpi_base"][hc] * cs[hc]).sum())
        plat = md.m_platform[cols["machine"][hc]]
        plat_w += np.bincount(plat, weights=cs[hc], minlength=plat_w.size)
        plat_wc += np.bincount(plat, weights=cols["cpi"][hc] * cs[hc], minlength=plat_w.size)
        tcode = tiers.tier_codes(cols["priority"]).astype(np.int64)
        ratio_sums[0] += np.bincount(tcode, minlength=n_tiers)
        ratio_sums[1] += np.bincount(tcode, weights=cols["exp_ratio"], minlength=n_tiers)
        ratio_sums[2] += np.bincount(tcode, weights=cols["avg_cpu"] / cols["req_cpu"], minlength=n_tiers)
        iv_windows += np.bincount(cols["iv"], minlength=iv_windows.size)
        mach_windows += np.bincount(tcode * cfg.machines + cols["machine"], minlength=n_tiers * cfg.machines).reshape(
            n_tiers, cfg.machines
        )
        g0_, g1_ = cols["cells"]
        mc = np.bincount((tcode * cfg.machines + cols["machine"]) * (g1_ - g0_) + cols["cell"] - g0_)
        mc_tier = np.arange(mc.size) // (cfg.machines * (g1_ - g0_))
        ratio_sums[3] += np.bincount(mc_tier, weights=mc.astype(np.float64) ** 2, minlength=n_tiers)
        n_windows += W
        if keep_windows:
            for k in _KEEP:
                kept.setdefault(k, []).append(cols[k])
            kept.setdefault("valid", []).append(valid)
        g0, g1 = cols["cells"]
        say(
            f"usage cells {g0 - g_first}-{g1 - g_first} of {g_last - g_first}: {n_windows:,} windows "
            f"({time.perf_counter() - t_start:.1f}s)"
        )
    shards["instance_usage"] = w_usage.close()
    counts["instance_usage"] = {"rows": w_usage.rows}
    for table in counts:
        mal = bad.counts.get(table, {k: 0 for k in MALFORMED_KINDS})
        counts[table]["malformed"] = dict(mal)
        counts[table]["malformed_total"] = int(sum(mal.values()))
        counts[table]["valid_rows"] = counts[table]["rows"] - counts[table]["malformed_total"]

    truth = _truth(
        cfg,
        md,
        counts,
        shards,
        prio_cpu_top,
        prio_cpu_all,
        prio_cpu_top_valid,
        job_cpu,
        n_windows,
        n_cpi,
        n_outliers,
        cpi_sum,
        (plat_w, plat_wc),
    )
    iv_tier = tiers.tier_codes(coll["prio"][iv["coll"]]).astype(np.int64)
    sq = {
        "interval": np.bincount(iv_tier, weights=iv_windows.astype(np.float64) ** 2, minlength=n_tiers),
        "machine": (mach_windows.astype(np.float64) ** 2).sum(1),
        "machine_cell": ratio_sums[3],
    }
    truth["planted"].update(_planted_laws(cfg, md, ratio_sums, sq))
    (out / TRUTH_FILE).write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n")
    seconds = time.perf_counter() - t_start
    say(f"done: {n_windows:,} usage windows in {seconds:.1f}s ({n_windows / max(seconds, 1e-9) * 60:,.0f} windows/min)")
    res = SynthResult(out=out, truth=truth, shards=shards, seconds=seconds)
    if keep_windows:
        res.windows = {k: np.concatenate(v) for k, v in kept.items()}
    if dataset is not None:
        from gpuclust.ingest import ingest  # lazy: the ingester is optional for synth

        sources = [p for t in USAGE_TABLES for p in shards[t]]
        say(f"ingesting {len(sources)} shards into {dataset}")
        res.ingest_report = ingest(sources, Path(dataset), extra_manifest={"synthetic": truth}, layout=layout)
    return res
