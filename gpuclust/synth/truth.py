"""The ground truth of a synthetic cell (``synth_truth.json``): the planted laws, the model's
parameters and what the generator realised.  See ``docs/user/synth.md``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from gpuclust.schema import TIER_MAPS, TRACE_OFFSET_US, CollectionType, EventType, MachineEventType
from gpuclust.synth import model as _model
from gpuclust.synth import usage as _usage
from gpuclust.synth.config import TRUTH_VERSION
from gpuclust.tiers import tier_codes


def _tier_totals(prio: np.ndarray, values: np.ndarray) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name in ("notebook", "seed-002", "v3-doc"):
        tm = TIER_MAPS[name]
        codes = tier_codes(np, tm, prio)
        sums = np.bincount(codes, weights=values, minlength=len(tm.names))
        out[name] = {tm.names[i]: float(sums[i]) for i in range(len(tm.names))}
    return out


def _share_within(sigma: float, h: float) -> float:
    """P(|e^X - 1| <= h) for X ~ N(0, sigma^2)."""
    from math import erf, log, sqrt

    if sigma == 0:
        return 1.0
    phi = lambda x: 0.5 * (1 + erf(x / sqrt(2)))  # noqa: E731
    return phi(log(1 + h) / sigma) - (phi(log(1 - h) / sigma) if h < 1 else 0.0)


def _ratio_se(cfg, ratio_sums: np.ndarray, sq: dict[str, np.ndarray]) -> np.ndarray:
    """The standard error of each tier's mean usage / request over its windows under the planted law."""
    s_f = cfg.usage_ratio_sigma
    n_w, e_sum = ratio_sums[0], ratio_sums[1]
    # standard error of a tier's mean usage / request over its windows: the interval factor f, the
    # machine and machine-cell factors and the window factor are independent with mean one, shared by
    # the windows of one interval, machine, machine-cell, window
    var = {
        "interval": np.exp(s_f**2) - 1,
        "machine": np.exp(cfg.machine_load_sigma**2) - 1,
        "machine_cell": np.exp(cfg.machine_cell_load_sigma**2) - 1,
    }
    with np.errstate(invalid="ignore", divide="ignore"):
        sq = {**sq, "machine": np.maximum(sq["machine"] - n_w**2 / cfg.machines, 0.0)}  # load factors sum to one
        rel_var = sum(var[k] * sq[k] for k in var) / n_w**2 + (np.exp(cfg.usage_window_sigma**2) - 1) / n_w
        return e_sum / n_w * np.sqrt(rel_var)


def _job_sizes_law(cfg, md) -> dict:
    """The planted Pareto law of job sizes: its parameters and the sizes the model drew."""
    return {
        "alpha": cfg.job_size_alpha,
        "kinds": list(_model.SIZED_KINDS) if cfg.job_size_alpha else [],
        "tiers": ["free", "beb"] if cfg.job_size_alpha else [],
        "law": "per job of the batch and free classes not in an alloc set: S = instances x CPU request x "
        "expected running seconds inside the trace window ~ scale x Pareto(alpha) (P(S > x) = "
        "(x / scale)^-alpha, capped at 1e4 x scale); the request follows (then the instance count "
        "where the request would leave [0.0005, 0.3])",
        "expected_ncu_hours": "NCU-hours ~ usage_ratio[tier] x S / 3600 times a noise factor of mean about 1 "
        "(usage, work and stops of its instances), so per tier the CCDF tail of job-usage's "
        "ncu_hours (rows=top-level: jobs in alloc sets left out) has tail index alpha",
        "scale_cpu_seconds": {k: float(v) for k, v in md.size_scale.items()},
        **{k: int(v) for k, v in md.size_stats.items()},
    }


def _usage_ratio_law(cfg, ratio_sums: np.ndarray, se: np.ndarray) -> dict:
    """The planted mean usage / request per tier, and the expected and realised means over the windows."""
    names = _model.PLANT_TIERS.names
    ratios = _usage.ratio_by_tier(cfg)
    s_f = cfg.usage_ratio_sigma
    n_w, e_sum, r_sum = ratio_sums[:3]
    return {
        "mean_by_tier": ratios,
        "sigma": s_f,
        "tier_map": _model.PLANT_TIERS.name,
        "law": "each running interval's CPU level = request x f x mean-one factors (window, machine, "
        "machine-cell, diurnal normalised over the trace) with f = clip(mean[tier] x exp(sigma z - "
        "sigma^2/2), 0.01, 2.5); so E[average_usage.cpus / request] = mean[tier] (clipped mean below) "
        "for every task window; an alloc instance's window reports its tasks' sum",
        "clipped_mean_by_tier": {
            t: _usage.clipped_lognormal_mean(r, s_f, *_usage.F_CPU_CLIP) for t, r in ratios.items()
        },
        "expected_mean_by_tier": {names[k]: float(e_sum[k] / n_w[k]) for k in range(len(names)) if n_w[k]},
        "realised_mean_by_tier": {names[k]: float(r_sum[k] / n_w[k]) for k in range(len(names)) if n_w[k]},
        "windows_by_tier": {names[k]: int(n_w[k]) for k in range(len(names)) if n_w[k]},
        "expected_mean_se_by_tier": {names[k]: float(se[k]) for k in range(len(names)) if n_w[k]},
        "definitions": "expected: mean over the tier's windows of the law's E[usage / request] (alloc "
        "windows: their tasks' expected usage / the alloc's request); realised: mean of "
        "average_usage.cpus / the request at SCHEDULE (not after UPDATE_RUNNING); machines "
        "throttled to max_machine_utilisation pull it below the expectation; se: the "
        "standard error of the tier's mean under the law (interval, machine, machine-cell and "
        "window factors independent, windows sharing them counted together)",
    }


def _usage_change_law(cfg) -> dict:
    """The planted spread of the log change between consecutive windows of an instance."""
    # usage change: consecutive full windows of an instance differ by the window factor and the
    # machine-cell factor (both i.i.d. lognormal per window) and the sampling noise of 300 samples
    sig = np.linspace(0.1, 0.7, 2001)
    sampling_var = 2 * float(np.mean(np.exp(sig**2) - 1)) / _usage.CELL_S
    planted_var = 2 * (cfg.usage_window_sigma**2 + cfg.machine_cell_load_sigma**2)
    s_all = float(np.sqrt(planted_var + sampling_var))
    return {
        "window_sigma": cfg.usage_window_sigma,
        "machine_cell_sigma": cfg.machine_cell_load_sigma,
        "law": "within a running interval, consecutive 300 s windows (same machine) have independent "
        "lognormal window factors (usage_window_sigma) and machine-cell factors "
        "(machine_cell_load_sigma), so log(b / a) ~ N(0, 2 (sw^2 + smc^2)) plus the sampling "
        "noise of the mean of 300 samples (variance 2 E[exp(s_i^2) - 1] / 300, s_i ~ U(0.1, 0.7))",
        "sigma_log_change": s_all,
        "sigma_log_change_without_sampling": float(np.sqrt(planted_var)),
        **{f"share_within_{int(h * 100)}pct": _share_within(s_all, h) for h in (0.05, 0.1, 0.2, 0.5)},
        "applies_to": "task windows (not alloc instances) of full length; throttled machine-cells "
        "(max_machine_utilisation) and the diurnal drift (under 0.3% per window) add a little",
    }


def _scheduling_delay_law(md) -> dict:
    """The planted exponential scheduling delay per tier and what the model drew."""
    names = _model.PLANT_TIERS.names
    ds = md.delay_stats
    return {
        "law": "every SUBMIT during the trace (new and resubmitted instances): the first placement attempt "
        "comes an exponential delay with the tier's mean after it (BATCH-scheduler jobs are ENABLEd "
        "within it); SCHEDULE then if the instance fits, else it waits for a scheduling pass. The "
        "population submitted at time 0 has no delay",
        "mean_s_by_tier": {t: md.delay_mean_s[t] for t in names},
        "median_s_by_tier": {t: md.delay_mean_s[t] * float(np.log(2)) for t in names},
        "submissions_by_tier": {t: int(ds[t][0]) for t in names},
        "drawn_mean_s_by_tier": {t: ds[t][1] / ds[t][0] if ds[t][0] else None for t in names},
        "first_attempts_by_tier": {t: int(ds[t][2]) for t in names},
        "placed_at_first_attempt_share_by_tier": {t: ds[t][3] / ds[t][2] if ds[t][2] else None for t in names},
    }


def _planted_laws(cfg, md, ratio_sums: np.ndarray, sq: dict[str, np.ndarray]) -> dict:
    """The four planted laws of issue 11 (job sizes, usage / request, usage change, scheduling
    delay): parameters, closed forms and what the generator realised (docs/user/synth.md)."""
    return {
        "job_sizes": _job_sizes_law(cfg, md),
        "usage_ratio": _usage_ratio_law(cfg, ratio_sums, _ratio_se(cfg, ratio_sums, sq)),
        "usage_change": _usage_change_law(cfg),
        "scheduling_delay": _scheduling_delay_law(md),
    }


def _type_counts(md) -> tuple[dict[str, int], dict[str, int]]:
    """How many instance events and machine events of each type the model wrote."""
    ev_types: dict[str, int] = {}
    for e in md.inst_events:
        name = EventType(e[1]).name
        ev_types[name] = ev_types.get(name, 0) + 1
    m_types: dict[str, int] = {}
    for e in md.machine_events:
        name = MachineEventType(e[2]).name
        m_types[name] = m_types.get(name, 0) + 1
    return ev_types, m_types


def _platforms(cfg, md, plat_sums) -> dict:
    """Per platform: its CPI and MAI bases, machines, realised clean CPI mean and the expected CPI effects."""
    platforms = {}
    for i, (_w, cpi, mai) in enumerate(_model.PLATFORMS):
        pw, pwc = plat_sums[0][i], plat_sums[1][i]
        ybar = float(pwc / pw) if pw > 0 else None
        platforms[md.platform_ids[i]] = {
            "cpi_base": cpi,
            "mai_base": mai,
            "has_counters": cpi is not None,
            "machines": int((md.m_platform == i).sum()),
            "cpi_weighted_mean_clean": ybar,
            "expected_pct_per_task_vs_mean": 100 * cfg.cpi_per_task * cpi / ybar if ybar and cpi else None,
            "expected_pct_per_10pct_util_vs_mean": 10 * cfg.cpi_per_util * cpi / ybar if ybar and cpi else None,
        }
    return platforms


def _planted_cpi(cfg, md, n_cpi: int, n_outliers: int, cpi_sum, plat_sums) -> dict:
    """The planted CPI / MAI model, the overcommit and alloc rules, and the realised CPI rows and means."""
    return {
        "cpi_per_task": cfg.cpi_per_task,
        "cpi_per_util": cfg.cpi_per_util,
        "cpi_noise_sigma": cfg.cpi_noise,
        "mai_noise_sigma": cfg.mai_noise,
        "cpi_model": "cpi = base[platform] * (1 + cpi_per_task*(k-1) + cpi_per_util*u) * exp(sigma*z - sigma^2/2)",
        "mai_model": "mai = mai_base[platform] * (cpi_clean/base) * exp(sigma_m*z' - sigma_m^2/2)",
        "k_definition": "number of top-level usage rows (alloc_collection_id 0: tasks not in allocs and alloc "
        "instances) on the same machine whose window lies in the same 300 s grid cell "
        "(cell = floor(start_time / 300 s)); includes the row itself when top-level; the "
        "same k applies to tasks inside allocs on that machine and cell",
        "u_definition": "sum over those top-level rows of average_usage.cpus * (end_time - start_time) / "
        "(cell length within the trace window * capacity.cpus of the machine); capacity "
        "never changes for CPU in this generator",
        "cpi_where": "only machines of platforms with counters and with a known capacity; other rows omit "
        "cycles_per_instruction and memory_accesses_per_instruction",
        "cpi_outlier_fraction": cfg.cpi_outlier_fraction,
        "cpi_outlier_range": list(_usage.CPI_OUTLIER_RANGE),
        "cpi_outlier_filter": "keep cycles_per_instruction <= 100 (or <= 20) to drop exactly the planted "
        "outliers; clean CPI stays below 20",
        "cpi_outlier_rows": n_outliers,
        "cpi_rows": n_cpi,
        "cpi_weighting": "weight each row by average_usage.cpus * duration (CPU-seconds)",
        "cpi_weighted_mean_clean": cpi_sum[0] / cpi_sum[1] if cpi_sum[1] > 0 else None,
        "cpi_base_weighted_mean": cpi_sum[2] / cpi_sum[1] if cpi_sum[1] > 0 else None,
        "expected_effects": {
            "pct_per_task_vs_base": 100 * cfg.cpi_per_task,
            "pct_per_10pct_util_vs_base": 10 * cfg.cpi_per_util,
            "note": "per platform (group by platform_id; clean rows, CPU-second weights) the fit "
            "CPI = b0 + b_t*(k - 1) + b_u*u has b0 = base, b_t = a*base, b_u = b*base, so "
            "100*b_t/b0 = 100*a and 10*b_u/b0 = 10*b (the *_vs_base values); with ntasks = k "
            "divide by b0 + b_t instead of b0. Relative to the platform's weighted mean CPI the "
            "effects are planted.platforms[p].expected_pct_per_task_vs_mean etc. Do not pool raw "
            "CPI over platforms: bases differ by +-25% and in a finite cell the platform mix "
            "correlates with k and u by chance (a pooled fit was seen 25% off); divide by the "
            "base or group by platform",
        },
        "overcommit_cpu": cfg.overcommit_cpu,
        "overcommit_mem": cfg.overcommit_mem,
        "overcommit_rule": "sum of resource_request of running top-level instances (tasks not in allocs, alloc "
        "instances) on an ADDed machine <= overcommit * capacity, per resource, at every "
        "event; sum of requests of the tasks in an alloc instance <= the alloc's request",
        "alloc_usage_rule": "an alloc instance's CPU sample at each second is the sum of its tasks' samples; "
        "machine-level sums must use only rows with alloc_collection_id 0",
        "platforms": _platforms(cfg, md, plat_sums),
    }


def _machines_truth(cfg, md, m_types: dict[str, int]) -> dict:
    """The machines: count, capacity shapes at the start and the end, hidden capacities, event types, big IDs."""
    shapes: dict[str, int] = {}
    shapes_end: dict[str, int] = {}
    for m in range(cfg.machines):
        for d, cc, cm in ((shapes, md.m_cap_c0, md.m_cap_m0), (shapes_end, md.m_cap_c, md.m_cap_m)):
            key = "null" if md.m_null_cap[m] else f"{cc[m] / _model.UNIT:g}x{cm[m] / _model.UNIT:g}"
            d[key] = d.get(key, 0) + 1
    return {
        "count": cfg.machines,
        "capacity_shapes": shapes,
        "capacity_shapes_at_end": shapes_end,
        "null_capacity_hidden": {
            str(int(md.m_id[m])): [md.m_cap_c[m] / _model.UNIT, md.m_cap_m[m] / _model.UNIT]
            for m in np.flatnonzero(md.m_null_cap)
        },
        "machine_event_types": m_types,
        "ids_above_2_53": int((md.m_id > 2**53).sum()),
    }


def _workload_truth(md, ev_types: dict[str, int]) -> dict:
    """The collections, instance event types, running intervals and the model's counters."""
    return {
        "collections": len(md.colls),
        "collections_submitted": int(sum(1 for c in md.colls if c.submitted)),
        "alloc_sets": int(sum(1 for c in md.colls if c.ctype == CollectionType.ALLOC_SET and c.submitted)),
        "collection_ids_above_2_53": int(sum(1 for c in md.colls if c.cid > 2**53)),
        "instance_event_types": ev_types,
        "running_intervals": int(len(md.iv["coll"])),
        "still_running_at_end": int(sum(1 for e in md.iv["end"] if e == md.t_end)),
        **{k: int(v) for k, v in md.stats.items()},
    }


def _usage_truth(cfg, prio_top, prio_all, prio_top_valid, job_cpu, n_windows) -> dict:
    """The usage windows written and their CPU-seconds by priority and tier (top-level, valid, all rows)."""
    prio_t = np.array(sorted(prio_top), np.int64)
    top_vals = np.array([prio_top[p] for p in prio_t])
    prio_v = np.array(sorted(prio_top_valid), np.int64)
    valid_vals = np.array([prio_top_valid[p] for p in prio_v])
    jc = np.sort(job_cpu[job_cpu > 0])[::-1]
    top1 = max(1, int(np.ceil(0.01 * jc.size))) if jc.size else 0
    return {
        "windows": n_windows,
        "cpu_seconds_top_level_by_priority": {str(int(p)): float(v) for p, v in zip(prio_t, top_vals, strict=True)},
        "cpu_seconds_top_level_by_tier": _tier_totals(prio_t, top_vals),
        "cpu_seconds_top_level_valid_by_tier": _tier_totals(prio_v, valid_vals),
        "cpu_seconds_all_rows_by_priority": {str(int(p)): float(v) for p, v in sorted(prio_all.items())},
        "cpu_seconds_top_level_total": float(top_vals.sum()),
        "job_cpu_seconds_top1pct_share": float(jc[:top1].sum() / jc.sum()) if jc.size else None,
        "cpu_seconds_definition": "sum of average_usage.cpus * (end_time - start_time)/1e6 over rows; "
        "top-level = alloc_collection_id 0; valid = excluding planted malformed lines",
        "sample_rate_below_1_fraction_planted": cfg.low_sample_rate_fraction,
    }


def _truth(
    cfg,
    md,
    counts,
    shards,
    prio_top,
    prio_all,
    prio_top_valid,
    job_cpu,
    n_windows,
    n_cpi,
    n_outliers,
    cpi_sum,
    plat_sums,
) -> dict:
    """``synth_truth.json`` but the planted laws: the config, the CPI model, machines, workload, usage, counts, shards."""
    ev_types, m_types = _type_counts(md)
    return {
        "truth_version": TRUTH_VERSION,
        "generator": "gpuclust synth",
        "config": dataclasses.asdict(cfg),
        "seed": cfg.seed,
        "trace_window_us": [TRACE_OFFSET_US, md.t_end],
        "grid_us": _usage.CELL_US,
        "planted": _planted_cpi(cfg, md, n_cpi, n_outliers, cpi_sum, plat_sums),
        "machines": _machines_truth(cfg, md, m_types),
        "workload": _workload_truth(md, ev_types),
        "usage": _usage_truth(cfg, prio_top, prio_all, prio_top_valid, job_cpu, n_windows),
        "counts": counts,
        "shards": {t: [p.name for p in ps] for t, ps in shards.items()},
    }
