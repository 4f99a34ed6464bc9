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
from gpuclust.synth import model as _model
from gpuclust.synth import usage as _usage

# the pieces live in their own modules (issue 36); the names are re-exported here
from gpuclust.synth.blocks import _FMT_ROWS as _FMT_ROWS
from gpuclust.synth.blocks import _KEEP, _usage_blocks, block_starts, windows_per_cell
from gpuclust.synth.blocks import _SUMMARY as _SUMMARY
from gpuclust.synth.blocks import _block_job as _block_job
from gpuclust.synth.blocks import _init_worker as _init_worker
from gpuclust.synth.config import MALFORMED_KINDS, TRUTH_FILE, USAGE_TABLES, SynthConfig, SynthResult
from gpuclust.synth.config import MALFORMED_TABLES as MALFORMED_TABLES
from gpuclust.synth.config import TRUTH_VERSION as TRUTH_VERSION
from gpuclust.synth.export import F as F
from gpuclust.synth.export import LineBuilder as LineBuilder
from gpuclust.synth.export import ShardWriter
from gpuclust.synth.export import _value as _value
from gpuclust.synth.export import fmt_float as fmt_float
from gpuclust.synth.export import json_line as json_line
from gpuclust.synth.malformed import _Malformer
from gpuclust.synth.malformed import corrupt_line as corrupt_line
from gpuclust.synth.tables import _attr_lines, _coll_lines, _inst_lines, _machine_lines
from gpuclust.synth.tables import _res as _res
from gpuclust.synth.tables import format_usage as format_usage
from gpuclust.synth.truth import _planted_laws, _truth
from gpuclust.synth.truth import _share_within as _share_within
from gpuclust.synth.truth import _tier_totals as _tier_totals
from gpuclust.tiers import tier_codes

__all__ = ["SynthConfig", "SynthResult", "synthesize", "USAGE_TABLES", "MALFORMED_KINDS"]


def _progress_default(msg: str) -> None:
    print(f"[synth] {msg}", file=sys.stderr, flush=True)


def _fresh_folder(out: Path) -> None:
    """Create the output folder and remove the usage shards an earlier run left in it."""
    if out.exists() and not out.is_dir():  # mkdir's FileExistsError would not say what is wrong
        raise FileExistsError(errno.EEXIST, "exists and is not a folder", str(out))
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("*-[0-9]*.json.gz")):  # stale shards of an earlier run
        if old.name.split("-")[0] in USAGE_TABLES:
            old.unlink()


def _usage_context(cfg: SynthConfig, md: _model.Model, s_params: np.random.SeedSequence) -> _usage.UsageContext:
    """The per-collection, per-interval (usage parameters drawn from ``s_params``) and per-machine arrays of usage."""
    iv = md.intervals()
    coll = {
        "cid": np.array([c.cid for c in md.colls], np.int64),
        "ctype": np.array([c.ctype for c in md.colls], np.int64),
        "prio": np.array([c.prio for c in md.colls], np.int64),
        "alloc_cid": np.array([md.colls[c.alloc_set].cid if c.alloc_set >= 0 else 0 for c in md.colls], np.int64),
    }
    tiers = _model.PLANT_TIERS
    ratios = _usage.ratio_by_tier(cfg)
    iv_ratio = np.array([ratios[t] for t in tiers.names])[tier_codes(np, tiers, coll["prio"][iv["coll"]])]
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
    return _usage.UsageContext(cfg, iv, params, coll, mach, md.t_end)


class _UsageTally:
    """The sums over the usage blocks that the ground truth needs (CPU-seconds by priority and job,
    CPI sums, usage / request sums by tier, windows per interval and per tier and machine)."""

    def __init__(self, cfg: SynthConfig, md: _model.Model, n_intervals: int) -> None:
        self.machines = cfg.machines
        self.m_platform = md.m_platform
        self.prio_cpu_top: dict[int, float] = {}
        self.prio_cpu_all: dict[int, float] = {}
        self.prio_cpu_top_valid: dict[int, float] = {}
        self.job_cpu = np.zeros(len(md.colls))
        self.n_windows = 0
        self.n_cpi = 0
        self.n_outliers = 0
        self.cpi_sum = [0.0, 0.0, 0.0]  # sum w*cpi, sum w, sum w*base over clean CPI rows
        self.plat_w = np.zeros(len(_model.PLATFORMS))
        self.plat_wc = np.zeros(len(_model.PLATFORMS))
        self.n_tiers = len(_model.PLANT_TIERS.names)
        # windows, sum of E[usage/request], sum of realised, sum over machine-cells of windows^2
        self.ratio_sums = np.zeros((4, self.n_tiers))
        self.iv_windows = np.zeros(n_intervals, np.int64)  # windows per running interval
        self.mach_windows = np.zeros((self.n_tiers, cfg.machines), np.int64)  # windows per tier and machine

    def add(self, cols: dict[str, Any], valid: np.ndarray) -> None:
        """Add one block's windows (``valid``: not planted malformed)."""
        W = cols["start_time"].size
        cs = cols["avg_cpu"] * cols["dur"]
        top = cols["top"]
        for d, sel in (
            (self.prio_cpu_top, top),
            (self.prio_cpu_all, np.ones(W, bool)),
            (self.prio_cpu_top_valid, top & valid),
        ):
            pr, inv = np.unique(cols["priority"][sel], return_inverse=True)
            sums = np.bincount(inv, weights=cs[sel], minlength=pr.size)
            for p_, s_ in zip(pr.tolist(), sums.tolist(), strict=True):
                d[p_] = d.get(p_, 0.0) + s_
        jobs = cols["collection_type"] == int(CollectionType.JOB)
        self.job_cpu += np.bincount(cols["coll"][jobs], weights=cs[jobs], minlength=self.job_cpu.size)
        self._add_cpi(cols, cs)
        self._add_tiers(cols)
        self.n_windows += W

    def _add_cpi(self, cols: dict[str, Any], cs: np.ndarray) -> None:
        """Add the block's CPI rows, outliers and CPU-second-weighted CPI sums (overall and by platform)."""
        hc = cols["has_cpi"] & ~cols["cpi_outlier"]
        self.n_cpi += int(cols["has_cpi"].sum())
        self.n_outliers += int(cols["cpi_outlier"].sum())
        self.cpi_sum[0] += float((cols["cpi"][hc] * cs[hc]).sum())
        self.cpi_sum[1] += float(cs[hc].sum())
        self.cpi_sum[2] += float((cols["cpi_base"][hc] * cs[hc]).sum())
        plat = self.m_platform[cols["machine"][hc]]
        self.plat_w += np.bincount(plat, weights=cs[hc], minlength=self.plat_w.size)
        self.plat_wc += np.bincount(plat, weights=cols["cpi"][hc] * cs[hc], minlength=self.plat_w.size)

    def _add_tiers(self, cols: dict[str, Any]) -> None:
        """Add the block's usage / request sums by tier and its windows by interval, machine and machine-cell."""
        n_tiers, machines = self.n_tiers, self.machines
        tcode = tier_codes(np, _model.PLANT_TIERS, cols["priority"])
        self.ratio_sums[0] += np.bincount(tcode, minlength=n_tiers)
        self.ratio_sums[1] += np.bincount(tcode, weights=cols["exp_ratio"], minlength=n_tiers)
        self.ratio_sums[2] += np.bincount(tcode, weights=cols["avg_cpu"] / cols["req_cpu"], minlength=n_tiers)
        self.iv_windows += np.bincount(cols["iv"], minlength=self.iv_windows.size)
        self.mach_windows += np.bincount(tcode * machines + cols["machine"], minlength=n_tiers * machines).reshape(
            n_tiers, machines
        )
        g0_, g1_ = cols["cells"]
        mc = np.bincount((tcode * machines + cols["machine"]) * (g1_ - g0_) + cols["cell"] - g0_)
        mc_tier = np.arange(mc.size) // (machines * (g1_ - g0_))
        self.ratio_sums[3] += np.bincount(mc_tier, weights=mc.astype(np.float64) ** 2, minlength=n_tiers)

    def squares(self, iv_prio: np.ndarray) -> dict[str, np.ndarray]:
        """Per tier, the sums of squared window counts per interval (``iv_prio``: their priorities),
        machine and machine-cell (the planted laws' standard errors)."""
        iv_tier = tier_codes(np, _model.PLANT_TIERS, iv_prio)
        return {
            "interval": np.bincount(iv_tier, weights=self.iv_windows.astype(np.float64) ** 2, minlength=self.n_tiers),
            "machine": (self.mach_windows.astype(np.float64) ** 2).sum(1),
            "machine_cell": self.ratio_sums[3],
        }


def _write_chunks(chunks: Any, bad: _Malformer, w_usage: ShardWriter, n_rows: int) -> np.ndarray:
    """Write one block's formatted chunks (some lines made malformed); returns which rows stay valid."""
    valid = np.ones(n_rows, bool)
    r0 = 0
    for data, lengths in chunks:
        data, lengths, broken = bad.apply_bytes("instance_usage", data, lengths)
        valid[r0 + broken] = False
        r0 += len(lengths)
        w_usage.write(data, lengths)
    return valid


def _write_usage(
    cfg: SynthConfig,
    md: _model.Model,
    ctx: _usage.UsageContext,
    out: Path,
    s_usage: np.random.SeedSequence,
    bad: _Malformer,
    say: Callable[[str], None],
    keep_windows: bool,
    t_start: float,
) -> tuple[list[Path], int, _UsageTally, dict[str, list]]:
    """Generate the usage windows block by block and write them as ``instance_usage`` shards (some
    lines malformed); their paths and rows, their tally and (``keep_windows``) the window arrays."""
    g_first = TRACE_OFFSET_US // _usage.CELL_US
    g_last = -(-md.t_end // _usage.CELL_US)
    blocks = block_starts(windows_per_cell(ctx.iv, g_first, g_last, md.t_end), g_first, cfg.block_cells)
    usage_seeds = s_usage.spawn(len(blocks))
    w_usage = ShardWriter(out, "instance_usage", cfg.shard_rows, cfg.compresslevel, say)
    tally = _UsageTally(cfg, md, ctx.iv["coll"].size)
    kept: dict[str, list] = {}
    for cols, chunks in _usage_blocks(ctx, blocks, g_last, usage_seeds, cfg.workers, keep_windows):
        valid = _write_chunks(chunks, bad, w_usage, cols["start_time"].size)
        tally.add(cols, valid)
        if keep_windows:
            for k in _KEEP:
                kept.setdefault(k, []).append(cols[k])
            kept.setdefault("valid", []).append(valid)
        g0, g1 = cols["cells"]
        say(
            f"usage cells {g0 - g_first}-{g1 - g_first} of {g_last - g_first}: {tally.n_windows:,} windows "
            f"({time.perf_counter() - t_start:.1f}s)"
        )
    return w_usage.close(), w_usage.rows, tally, kept


def _count_malformed(counts: dict[str, dict[str, Any]], bad: _Malformer) -> None:
    """Add each table's planted malformed lines, by kind and in total, and its valid rows to ``counts``."""
    for table in counts:
        mal = bad.counts.get(table, {k: 0 for k in MALFORMED_KINDS})
        counts[table]["malformed"] = dict(mal)
        counts[table]["malformed_total"] = int(sum(mal.values()))
        counts[table]["valid_rows"] = counts[table]["rows"] - counts[table]["malformed_total"]


def _write_small_tables(
    md: _model.Model, out: Path, cfg: SynthConfig, bad: _Malformer, say: Callable[[str], None]
) -> tuple[dict[str, list[Path]], dict[str, dict[str, Any]]]:
    """Write the machine, attribute, collection and instance event tables (some lines malformed); their shards and row counts."""
    shards: dict[str, list[Path]] = {}
    counts: dict[str, dict[str, Any]] = {}
    for table, make_lines in (
        ("machine_events", _machine_lines),
        ("machine_attributes", _attr_lines),
        ("collection_events", _coll_lines),
        ("instance_events", _inst_lines),
    ):
        lines = make_lines(md)
        bad.apply_lines(table, lines)
        w = ShardWriter(out, table, cfg.shard_rows, cfg.compresslevel, say)
        w.write_lines(lines)
        shards[table] = w.close()
        counts[table] = {"rows": w.rows}
    return shards, counts


def _tally_truth(
    cfg: SynthConfig,
    md: _model.Model,
    counts: dict[str, dict[str, Any]],
    shards: dict[str, list[Path]],
    tally: _UsageTally,
    iv_prio: np.ndarray,
) -> dict[str, Any]:
    """The ground truth (:func:`_truth`) from the tally, with the planted laws (:func:`_planted_laws`)."""
    truth = _truth(
        cfg,
        md,
        counts,
        shards,
        tally.prio_cpu_top,
        tally.prio_cpu_all,
        tally.prio_cpu_top_valid,
        tally.job_cpu,
        tally.n_windows,
        tally.n_cpi,
        tally.n_outliers,
        tally.cpi_sum,
        (tally.plat_w, tally.plat_wc),
    )
    truth["planted"].update(_planted_laws(cfg, md, tally.ratio_sums, tally.squares(iv_prio)))
    return truth


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
    _fresh_folder(out)
    ss = np.random.SeedSequence(cfg.seed)
    s_model, s_params, s_usage, s_bad = ss.spawn(4)
    md = _model.Model(cfg, np.random.default_rng(s_model))
    md.run()
    say(
        f"simulated {cfg.machines} machines x {cfg.hours:g} h: {len(md.colls):,} collections, "
        f"{len(md.inst_events):,} instance events ({time.perf_counter() - t_start:.1f}s)"
    )
    bad = _Malformer(cfg.malformed_rate, np.random.default_rng(s_bad))
    shards, counts = _write_small_tables(md, out, cfg, bad, say)
    ctx = _usage_context(cfg, md, s_params)
    paths, rows, tally, kept = _write_usage(cfg, md, ctx, out, s_usage, bad, say, keep_windows, t_start)
    shards["instance_usage"] = paths
    counts["instance_usage"] = {"rows": rows}
    _count_malformed(counts, bad)
    truth = _tally_truth(cfg, md, counts, shards, tally, ctx.coll["prio"][ctx.iv["coll"]])
    (out / TRUTH_FILE).write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n")
    seconds = time.perf_counter() - t_start
    n_windows = tally.n_windows
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
