"""``gpuclust synth``: a synthetic Borg cell in the real v3 JSON export format, with planted truth.

Examples
--------
>>> from pathlib import Path
>>> from gpuclust.synth import SynthConfig, synthesize
>>> res = synthesize(SynthConfig(machines=20, hours=0.5, seed=1), Path(tmp_path))  # doctest: +SKIP
>>> res.truth["counts"]["instance_usage"]["rows"] > 0  # doctest: +SKIP
True

See ``docs/synth.md`` for the model, every knob and the ground-truth keys.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpuclust.schema import TIER_MAPS, TRACE_OFFSET_US, CollectionType, EventType, MachineEventType

from . import model as _model
from . import usage as _usage
from .export import F, LineBuilder, ShardWriter, _value, fmt_float, json_line

__all__ = ["SynthConfig", "SynthResult", "synthesize", "USAGE_TABLES", "MALFORMED_KINDS"]

#: Tables written, in order.
USAGE_TABLES = ("machine_events", "machine_attributes", "collection_events", "instance_events", "instance_usage")
#: Kinds of planted malformed lines.
MALFORMED_KINDS = ("bad_json", "wrong_list_length", "quoted_non_number_id", "missing_required_key")
#: Tables that may receive malformed lines (machine tables are left intact).
MALFORMED_TABLES = ("collection_events", "instance_events", "instance_usage")

TRUTH_FILE = "synth_truth.json"
TRUTH_VERSION = 1


@dataclass(frozen=True)
class SynthConfig:
    """Every knob of the synthetic cell (defaults make a small cell fast).  See ``docs/synth.md``."""

    machines: int = 200
    hours: float = 6.0
    seed: int = 0
    # placement
    overcommit_cpu: float = 1.25
    overcommit_mem: float = 1.0
    request_fill: float = 0.75
    preemption: bool = True
    pass_interval_s: int = 30
    pass_max_tries: int = 400
    # machines
    null_capacity_fraction: float = 0.01
    late_add_fraction: float = 0.03
    remove_fraction: float = 0.04
    update_fraction: float = 0.03
    big_id_fraction: float = 0.05
    # workload
    constraint_fraction: float = 0.08
    update_pending_fraction: float = 0.03
    update_running_fraction: float = 0.05
    service_fail_rate_per_hour: float = 0.01
    batch_fail_fraction: float = 0.04
    kill_fraction: float = 0.05
    lost_fraction: float = 0.003
    max_retries: int = 3
    # planted truths (docs/synth.md "Planted laws"): job sizes, usage / request, usage change, scheduling delay
    job_size_alpha: float = 1.2
    usage_ratio_free: float = 0.6
    usage_ratio_beb: float = 0.55
    usage_ratio_mid: float = 0.45
    usage_ratio_prod: float = 0.35
    usage_ratio_sigma: float = 0.6
    usage_window_sigma: float = 0.12
    sched_delay_free_s: float = 60.0
    sched_delay_beb_s: float = 20.0
    sched_delay_mid_s: float = 8.0
    sched_delay_prod_s: float = 3.0
    # usage
    diurnal_amplitude: float = 0.15
    machine_load_sigma: float = 0.4
    machine_cell_load_sigma: float = 0.35
    max_machine_utilisation: float = 0.95
    low_sample_rate_fraction: float = 0.03
    max_usage_missing_fraction: float = 0.005
    # CPI / MAI
    cpi_per_task: float = 0.003
    cpi_per_util: float = 0.2
    cpi_noise: float = 0.1
    mai_noise: float = 0.15
    cpi_outlier_fraction: float = 0.001
    # output
    malformed_rate: float = 0.0
    shard_rows: int = 1_500_000
    compresslevel: int = 1
    block_cells: int = 12
    workers: int = 1

    def __post_init__(self) -> None:
        if self.machines < 1:
            raise ValueError("machines must be >= 1")
        if not self.hours > 0:
            raise ValueError("hours must be > 0")
        if not 0 <= self.malformed_rate < 1:
            raise ValueError("malformed_rate must be in [0, 1)")
        if self.overcommit_cpu < 1 or self.overcommit_mem < 1:
            raise ValueError("overcommit factors must be >= 1")
        if not self.max_machine_utilisation > 0:
            raise ValueError("max_machine_utilisation must be > 0 (inf: no limit)")
        if self.job_size_alpha < 0:
            raise ValueError("job_size_alpha must be >= 0 (0: sizes not planted)")
        for t in ("free", "beb", "mid", "prod"):
            if not getattr(self, f"usage_ratio_{t}") > 0:
                raise ValueError(f"usage_ratio_{t} must be > 0")
            if not getattr(self, f"sched_delay_{t}_s") >= 0:
                raise ValueError(f"sched_delay_{t}_s must be >= 0")
        if self.usage_ratio_sigma < 0 or self.usage_window_sigma < 0:
            raise ValueError("usage_ratio_sigma and usage_window_sigma must be >= 0")


@dataclass
class SynthResult:
    out: Path
    truth: dict
    shards: dict[str, list[Path]]
    seconds: float
    ingest_report: object | None = None
    #: window-level arrays (only with ``keep_windows=True``): k, u, cpi, cpi_base, avg_cpu, dur, ...
    windows: dict[str, np.ndarray] | None = field(default=None, repr=False)


def _progress_default(msg: str) -> None:
    print(f"[synth] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# malformed lines
# ---------------------------------------------------------------------------------------------
_RE_CID = re.compile(r'"collection_id":"(-?\d+)"')
_RE_DIST = re.compile(r'("cpu_usage_distribution":\[[^\]]*),[^,\]]*\]')


def corrupt_line(line: str, kind: str) -> str:
    """Break one JSON line (without newline) in the named way."""
    if kind == "bad_json":
        return line[: max(1, int(len(line) * 0.6))]
    if kind == "wrong_list_length":
        new = _RE_DIST.sub(r"\1]", line, count=1)
        if new == line:
            raise ValueError("no cpu_usage_distribution to shorten")
        return new
    if kind == "quoted_non_number_id":
        return _RE_CID.sub(r'"collection_id":"id-\1"', line, count=1)
    if kind == "missing_required_key":
        new = _RE_CID.sub("", line, count=1)
        return new.replace("{,", "{").replace(",,", ",")
    raise ValueError(kind)


class _Malformer:
    def __init__(self, rate: float, rng: np.random.Generator):
        self.rate = rate
        self.rng = rng
        self.counts: dict[str, dict[str, int]] = {t: {k: 0 for k in MALFORMED_KINDS} for t in MALFORMED_TABLES}

    def pick(self, table: str, n: int) -> tuple[np.ndarray, list[str]]:
        if self.rate <= 0 or n == 0 or table not in MALFORMED_TABLES:
            return np.zeros(0, np.int64), []
        m = int(self.rng.binomial(n, self.rate))
        rows = np.sort(self.rng.choice(n, size=m, replace=False)) if m else np.zeros(0, np.int64)
        kinds = MALFORMED_KINDS if table == "instance_usage" else tuple(k for k in MALFORMED_KINDS if k != "wrong_list_length")
        chosen = [kinds[int(i)] for i in self.rng.integers(len(kinds), size=m)]
        for k in chosen:
            self.counts[table][k] += 1
        return rows, chosen

    def apply_lines(self, table: str, lines: list[str]) -> None:
        rows, kinds = self.pick(table, len(lines))
        for r, k in zip(rows, kinds, strict=True):
            lines[r] = corrupt_line(lines[r][:-1], k) + "\n"

    def apply_bytes(self, table: str, data: bytes, lengths: np.ndarray) -> tuple[bytes, np.ndarray, np.ndarray]:
        rows, kinds = self.pick(table, len(lengths))
        if rows.size == 0:
            return data, lengths, rows
        lines = data.split(b"\n")[:-1]
        for r, k in zip(rows, kinds, strict=True):
            lines[r] = corrupt_line(lines[r].decode(), k).encode()
        lengths = np.fromiter((len(x) + 1 for x in lines), np.int64, len(lines))
        return b"\n".join(lines) + b"\n", lengths, rows


# ---------------------------------------------------------------------------------------------
# event tables
# ---------------------------------------------------------------------------------------------


def _res(c: int, m: int) -> dict:
    return {"cpus": F(c / _model.UNIT, 6), "memory": F(m / _model.UNIT, 6)}


def _machine_lines(md: _model.Model) -> list[str]:
    lines = []
    for t, m, typ, cc, cm in sorted(md.machine_events, key=lambda e: e[0]):
        lines.append(json_line({
            "time": t, "machine_id": int(md.m_id[m]), "type": int(typ),
            "switch_id": md.switch_ids[md.m_switch[m]],
            "capacity": None if md.m_null_cap[m] else _res(cc, cm),
            "platform_id": md.platform_ids[md.m_platform[m]],
        }))
    return lines


def _attr_lines(md: _model.Model) -> list[str]:
    return [json_line({"time": t, "machine_id": int(md.m_id[m]), "name": name, "value": value, "deleted": deleted})
            for t, m, name, value, deleted in sorted(md.machine_attrs, key=lambda e: e[0])]


def _coll_lines(md: _model.Model) -> list[str]:
    colls = md.colls
    lines = []
    for t, typ, ci, missing in sorted(md.coll_events, key=lambda e: e[0]):
        c = colls[ci]
        lines.append(json_line({
            "time": t, "type": int(typ), "collection_id": c.cid, "scheduling_class": c.sclass,
            "missing_type": missing or None, "collection_type": c.ctype, "priority": c.prio,
            "alloc_collection_id": colls[c.alloc_set].cid if c.alloc_set >= 0 else None,
            "user": c.user, "collection_name": c.name, "collection_logical_name": c.lname,
            "parent_collection_id": colls[c.parent].cid if c.parent >= 0 else None,
            "start_after_collection_ids": [colls[x].cid for x in c.start_after] or None,
            "max_per_machine": c.max_pm or None, "max_per_switch": c.max_ps or None,
            "vertical_scaling": c.vscale, "scheduler": c.scheduler,
        }))
    return lines


def _inst_lines(md: _model.Model) -> list[str]:
    """instance_events lines; same encoding as :func:`json_line`, with per-collection pieces cached."""
    colls = md.colls
    cons = []
    for spec, _mask in md.constraint_kinds:
        cons.append(_value([{"name": n, "value": v, "relation": r} for n, v, r in spec]))
    head: dict[int, tuple[str, str, str]] = {}
    fl: dict[int, str] = {}

    def f6(v: int) -> str:
        x = fl.get(v)
        if x is None:
            x = fl[v] = fmt_float(v / _model.UNIT, 6)
        return x

    mids = [str(int(x)) for x in md.m_id]
    lines = []
    for t, typ, ci, index, machine, rc, rm, ai, missing in sorted(md.inst_events, key=lambda e: e[0]):
        h = head.get(ci)
        if h is None:
            c = colls[ci]
            alloc = f',"alloc_collection_id":"{colls[c.alloc_set].cid}"' if c.alloc_set >= 0 else ""
            h = head[ci] = (f'","collection_id":"{c.cid}","scheduling_class":"{c.sclass}"',
                            f',"collection_type":"{c.ctype}","priority":"{c.prio}"{alloc},"instance_index":"',
                            f',"constraint":{cons[c.constraint]}}}\n' if c.constraint >= 0 else "}\n")
        mt = f',"missing_type":"{missing}"' if missing else ""
        mach = f',"machine_id":"{mids[machine]}"' if machine >= 0 else ""
        aidx = f',"alloc_instance_index":"{ai}"' if ai >= 0 else ""
        lines.append(f'{{"time":"{t}","type":"{int(typ)}{h[0]}{mt}{h[1]}{index}"{mach}{aidx},'
                     f'"resource_request":{{"cpus":{f6(rc)},"memory":{f6(rm)}}}{h[2]}')
    return lines


# ---------------------------------------------------------------------------------------------
# usage rows -> JSON lines (vectorised)
# ---------------------------------------------------------------------------------------------


def format_usage(cols: dict[str, np.ndarray], sl: slice) -> tuple[bytes, np.ndarray]:
    """instance_usage JSON lines for rows ``sl`` of a block."""
    g = {k: (v[sl] if isinstance(v, np.ndarray) and v.ndim >= 1 else v) for k, v in cols.items()}
    n = g["start_time"].size
    b = LineBuilder(n)
    d = _usage.DEC_USAGE
    b.raw("{")
    b.field_int("start_time", g["start_time"], first=True)
    b.field_int("end_time", g["end_time"])
    b.field_int("collection_id", g["collection_id"])
    b.field_int("instance_index", g["instance_index"])
    b.field_int("machine_id", g["machine_id"])
    b.field_int("alloc_collection_id", g["alloc_collection_id"])
    ia = g["in_alloc"]
    b.field_int("alloc_instance_index", np.where(ia, g["alloc_instance_index"], 0), mask=ia)
    b.field_int("collection_type", g["collection_type"])
    b.raw(',"average_usage":{"cpus":')
    b.floats(g["avg_cpu"], d)
    b.raw(',"memory":')
    b.floats(g["avg_mem"], d)
    b.raw("}")
    has_max = ~g["max_missing"]
    b.raw(',"maximum_usage":{"cpus":', mask=has_max)
    b.floats(g["max_cpu"], d, mask=has_max)
    b.raw(',"memory":', mask=has_max)
    b.floats(g["max_mem"], d, mask=has_max)
    b.raw("}", mask=has_max)
    b.raw(',"random_sample_usage":{"cpus":')
    b.floats(g["sample_cpu"], d)
    b.raw("}")
    b.field_float("assigned_memory", g["assigned_mem"], d)
    b.field_float("page_cache_memory", g["page_cache_mem"], d)
    hc = g["has_cpi"]
    b.field_float("cycles_per_instruction", np.where(hc, g["cpi"], 0.0), _usage.DEC_CPI, mask=hc)
    b.field_float("memory_accesses_per_instruction", np.where(hc, g["mai"], 0.0), d, mask=hc)
    b.field_float("sample_rate", g["sample_rate"], _usage.DEC_RATE)
    pct = g["pct"]
    b.float_list("cpu_usage_distribution", pct[:, :11], d)
    b.float_list("tail_cpu_usage_distribution", pct[:, 11:], d)
    b.raw("}\n")
    return b.build()


# ---------------------------------------------------------------------------------------------
# the pipeline
# ---------------------------------------------------------------------------------------------


_KEEP = ("k", "u", "cpi", "mai", "cpi_base", "avg_cpu", "dur", "has_cpi", "cpi_outlier", "top", "machine", "cell",
         "start_time", "end_time", "collection_id", "instance_index", "max_cpu", "pct", "sample_rate", "n", "in_alloc",
         "req_cpu", "priority", "exp_ratio", "collection_type")
#: Columns the main process needs from a block (the rest stays in the worker).
_SUMMARY = ("start_time", "avg_cpu", "dur", "top", "priority", "collection_type", "coll", "has_cpi", "cpi_outlier", "cpi",
            "cpi_base", "machine", "exp_ratio", "req_cpu", "iv", "cell")
_FMT_ROWS = 65536
_WORKER_CTX: _usage.UsageContext | None = None


def _block_job(args: tuple) -> tuple[dict[str, Any], list[tuple[bytes, np.ndarray]]]:
    """Generate and format one block of grid cells (runs in a worker process when workers > 1)."""
    g0, g1, seed, keep = args
    ctx = _WORKER_CTX
    assert ctx is not None
    cols = _usage.generate_block(ctx, g0, g1, np.random.default_rng(seed))
    W = cols["start_time"].size
    chunks = [format_usage(cols, slice(r0, min(W, r0 + _FMT_ROWS))) for r0 in range(0, W, _FMT_ROWS)]
    names = set(_SUMMARY) | (set(_KEEP) if keep else set())
    small: dict[str, Any] = {k: cols[k] for k in names}
    small["cells"] = (g0, g1)
    return small, chunks


def _init_worker(ctx: _usage.UsageContext) -> None:
    global _WORKER_CTX
    _WORKER_CTX = ctx


def _usage_blocks(ctx, blocks, g_last, seeds, workers: int, keep: bool):
    """Yield (columns, formatted chunks) per block, in block order, serially or from a process pool."""
    global _WORKER_CTX
    jobs = [(g0, min(g0 + ctx.cfg.block_cells, g_last), seeds[i], keep) for i, g0 in enumerate(blocks)]
    _WORKER_CTX = ctx
    try:
        if workers <= 1 or len(jobs) <= 1:
            for j in jobs:
                yield _block_job(j)
            return
        import multiprocessing as mp
        from collections import deque

        # spawn (not fork: forking a process that has threads is unsafe and warns on Python >= 3.12);
        # the context is pickled once per worker by the initializer
        pool = mp.get_context("spawn").Pool(workers, initializer=_init_worker, initargs=(ctx,))
        try:
            pending: deque = deque()
            it = iter(jobs)
            for j in it:
                pending.append(pool.apply_async(_block_job, (j,)))
                if len(pending) > workers:
                    break
            while pending:
                res = pending.popleft().get()
                nxt = next(it, None)
                if nxt is not None:
                    pending.append(pool.apply_async(_block_job, (nxt,)))
                yield res
        finally:
            pool.terminate()
            pool.join()
    finally:
        _WORKER_CTX = None


def _tier_totals(prio: np.ndarray, values: np.ndarray) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name in ("notebook", "seed-002", "v3-doc"):
        tm = TIER_MAPS[name]
        codes = tm.tier_codes(prio)
        sums = np.bincount(codes.astype(np.int64), weights=values, minlength=len(tm.names))
        out[name] = {tm.names[i]: float(sums[i]) for i in range(len(tm.names))}
    return out


def synthesize(cfg: SynthConfig, out: Path | str, *, dataset: Path | str | None = None,
               progress: Callable[[str], None] | None = _progress_default, keep_windows: bool = False,
               layout: str = "bucketed") -> SynthResult:
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
    say(f"simulated {cfg.machines} machines x {cfg.hours:g} h: {len(md.colls):,} collections, "
        f"{len(md.inst_events):,} instance events ({time.perf_counter() - t_start:.1f}s)")
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
    params = _usage.interval_params(iv, coll["ctype"][iv["coll"]] == int(CollectionType.ALLOC_SET),
                                    np.random.default_rng(s_params), cfg, ratio=iv_ratio)
    cpi_base = np.array([p[1] if p[1] is not None else np.nan for p in _model.PLATFORMS])[md.m_platform]
    mai_base = np.array([p[2] if p[2] is not None else np.nan for p in _model.PLATFORMS])[md.m_platform]
    cap_c = np.where(md.m_null_cap, np.nan, md.m_cap_c / _model.UNIT)
    s_ml = cfg.machine_load_sigma
    load = np.exp(s_ml * np.random.default_rng(s_params.spawn(1)[0]).standard_normal(cfg.machines) - 0.5 * s_ml * s_ml)
    load /= load.mean()  # mean exactly one over the machines (keeps the planted usage / request means)
    mach = {"mid": md.m_id, "cap_c": cap_c, "cap_true": md.m_cap_c / _model.UNIT, "cpi_base": cpi_base,
            "mai_base": mai_base, "load": load}
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
    ratio_sums = np.zeros((4, n_tiers))  # windows, sum of E[usage/request], sum of realised, sum over machine-cells of windows^2
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
        mach_windows += np.bincount(tcode * cfg.machines + cols["machine"],
                                    minlength=n_tiers * cfg.machines).reshape(n_tiers, cfg.machines)
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
        say(f"usage cells {g0 - g_first}-{g1 - g_first} of {g_last - g_first}: {n_windows:,} windows "
            f"({time.perf_counter() - t_start:.1f}s)")
    shards["instance_usage"] = w_usage.close()
    counts["instance_usage"] = {"rows": w_usage.rows}
    for table in counts:
        mal = bad.counts.get(table, {k: 0 for k in MALFORMED_KINDS})
        counts[table]["malformed"] = dict(mal)
        counts[table]["malformed_total"] = int(sum(mal.values()))
        counts[table]["valid_rows"] = counts[table]["rows"] - counts[table]["malformed_total"]

    truth = _truth(cfg, md, counts, shards, prio_cpu_top, prio_cpu_all, prio_cpu_top_valid, job_cpu, n_windows,
                   n_cpi, n_outliers, cpi_sum, (plat_w, plat_wc))
    iv_tier = tiers.tier_codes(coll["prio"][iv["coll"]]).astype(np.int64)
    sq = {"interval": np.bincount(iv_tier, weights=iv_windows.astype(np.float64) ** 2, minlength=n_tiers),
          "machine": (mach_windows.astype(np.float64) ** 2).sum(1), "machine_cell": ratio_sums[3]}
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


def _share_within(sigma: float, h: float) -> float:
    """P(|e^X - 1| <= h) for X ~ N(0, sigma^2)."""
    from math import erf, log, sqrt

    if sigma == 0:
        return 1.0
    phi = lambda x: 0.5 * (1 + erf(x / sqrt(2)))  # noqa: E731
    return phi(log(1 + h) / sigma) - (phi(log(1 - h) / sigma) if h < 1 else 0.0)


def _planted_laws(cfg, md, ratio_sums: np.ndarray, sq: dict[str, np.ndarray]) -> dict:
    """The four planted laws of issue 11 (job sizes, usage / request, usage change, scheduling
    delay): parameters, closed forms and what the generator realised (docs/synth.md)."""
    names = _model.PLANT_TIERS.names
    ratios = _usage.ratio_by_tier(cfg)
    s_f = cfg.usage_ratio_sigma
    n_w, e_sum, r_sum = ratio_sums[:3]
    # standard error of a tier's mean usage / request over its windows: the interval factor f, the
    # machine and machine-cell factors and the window factor are independent with mean one, shared by
    # the windows of one interval, machine, machine-cell, window
    var = {"interval": np.exp(s_f**2) - 1, "machine": np.exp(cfg.machine_load_sigma**2) - 1,
           "machine_cell": np.exp(cfg.machine_cell_load_sigma**2) - 1}
    with np.errstate(invalid="ignore", divide="ignore"):
        sq = {**sq, "machine": np.maximum(sq["machine"] - n_w**2 / cfg.machines, 0.0)}  # load factors sum to one
        rel_var = sum(var[k] * sq[k] for k in var) / n_w**2 + (np.exp(cfg.usage_window_sigma**2) - 1) / n_w
        se = e_sum / n_w * np.sqrt(rel_var)
    # usage change: consecutive full windows of an instance differ by the window factor and the
    # machine-cell factor (both i.i.d. lognormal per window) and the sampling noise of 300 samples
    sig = np.linspace(0.1, 0.7, 2001)
    sampling_var = 2 * float(np.mean(np.exp(sig**2) - 1)) / _usage.CELL_S
    planted_var = 2 * (cfg.usage_window_sigma**2 + cfg.machine_cell_load_sigma**2)
    s_all = float(np.sqrt(planted_var + sampling_var))
    ds = md.delay_stats
    return {
        "job_sizes": {
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
        },
        "usage_ratio": {
            "mean_by_tier": ratios,
            "sigma": s_f,
            "tier_map": _model.PLANT_TIERS.name,
            "law": "each running interval's CPU level = request x f x mean-one factors (window, machine, "
                   "machine-cell, diurnal normalised over the trace) with f = clip(mean[tier] x exp(sigma z - "
                   "sigma^2/2), 0.01, 2.5); so E[average_usage.cpus / request] = mean[tier] (clipped mean below) "
                   "for every task window; an alloc instance's window reports its tasks' sum",
            "clipped_mean_by_tier": {t: _usage.clipped_lognormal_mean(r, s_f, *_usage.F_CPU_CLIP)
                                     for t, r in ratios.items()},
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
        },
        "usage_change": {
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
        },
        "scheduling_delay": {
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
        },
    }


def _truth(cfg, md, counts, shards, prio_top, prio_all, prio_top_valid, job_cpu, n_windows, n_cpi, n_outliers,
           cpi_sum, plat_sums) -> dict:
    ev_types: dict[str, int] = {}
    for e in md.inst_events:
        name = EventType(e[1]).name
        ev_types[name] = ev_types.get(name, 0) + 1
    m_types: dict[str, int] = {}
    for e in md.machine_events:
        name = MachineEventType(e[2]).name
        m_types[name] = m_types.get(name, 0) + 1
    prio_t = np.array(sorted(prio_top), np.int64)
    top_vals = np.array([prio_top[p] for p in prio_t])
    prio_v = np.array(sorted(prio_top_valid), np.int64)
    valid_vals = np.array([prio_top_valid[p] for p in prio_v])
    jc = np.sort(job_cpu[job_cpu > 0])[::-1]
    top1 = max(1, int(np.ceil(0.01 * jc.size))) if jc.size else 0
    shapes: dict[str, int] = {}
    shapes_end: dict[str, int] = {}
    for m in range(cfg.machines):
        for d, cc, cm in ((shapes, md.m_cap_c0, md.m_cap_m0), (shapes_end, md.m_cap_c, md.m_cap_m)):
            key = "null" if md.m_null_cap[m] else f"{cc[m] / _model.UNIT:g}x{cm[m] / _model.UNIT:g}"
            d[key] = d.get(key, 0) + 1
    platforms = {}
    for i, (_w, cpi, mai) in enumerate(_model.PLATFORMS):
        pw, pwc = plat_sums[0][i], plat_sums[1][i]
        ybar = float(pwc / pw) if pw > 0 else None
        platforms[md.platform_ids[i]] = {
            "cpi_base": cpi, "mai_base": mai, "has_counters": cpi is not None,
            "machines": int((md.m_platform == i).sum()),
            "cpi_weighted_mean_clean": ybar,
            "expected_pct_per_task_vs_mean": 100 * cfg.cpi_per_task * cpi / ybar if ybar and cpi else None,
            "expected_pct_per_10pct_util_vs_mean": 10 * cfg.cpi_per_util * cpi / ybar if ybar and cpi else None,
        }
    return {
        "truth_version": TRUTH_VERSION,
        "generator": "gpuclust synth",
        "config": dataclasses.asdict(cfg),
        "seed": cfg.seed,
        "trace_window_us": [TRACE_OFFSET_US, md.t_end],
        "grid_us": _usage.CELL_US,
        "planted": {
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
            "platforms": platforms,
        },
        "machines": {
            "count": cfg.machines,
            "capacity_shapes": shapes,
            "capacity_shapes_at_end": shapes_end,
            "null_capacity_hidden": {str(int(md.m_id[m])): [md.m_cap_c[m] / _model.UNIT, md.m_cap_m[m] / _model.UNIT]
                                     for m in np.flatnonzero(md.m_null_cap)},
            "machine_event_types": m_types,
            "ids_above_2_53": int((md.m_id > 2**53).sum()),
        },
        "workload": {
            "collections": len(md.colls),
            "collections_submitted": int(sum(1 for c in md.colls if c.submitted)),
            "alloc_sets": int(sum(1 for c in md.colls if c.ctype == CollectionType.ALLOC_SET and c.submitted)),
            "collection_ids_above_2_53": int(sum(1 for c in md.colls if c.cid > 2**53)),
            "instance_event_types": ev_types,
            "running_intervals": int(len(md.iv["coll"])),
            "still_running_at_end": int(sum(1 for e in md.iv["end"] if e == md.t_end)),
            **{k: int(v) for k, v in md.stats.items()},
        },
        "usage": {
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
        },
        "counts": counts,
        "shards": {t: [p.name for p in ps] for t, ps in shards.items()},
    }
