"""A fast generator of canonical gpuclust datasets at benchmark scale (10^6 .. 10^8 windows).

`gpuclust synth` simulates a cell faithfully and writes the real JSON export (about 1.2M windows
per minute on 2 cores); the analysis benchmarks need 10^7+ windows in minutes, so this writes the
*canonical Parquet* directly with NumPy: machines with capacities and platforms, instances with
SCHEDULE/FINISH events and requests across the priority tiers (each its own job, with SUBMIT /
SCHEDULE / FINISH collection events), and 300 s usage windows on a
global grid whose 20 CPU percentiles come from a per-window lognormal shape (monotone by
construction), CPI/MAI on some platforms with a planted load effect. Realistic enough for
timing (key cardinalities, group sizes, contention on busy machines); not a model of a cell.
Datasets cached under bench/data before collection events were added lack them: delete the folder
to regenerate.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpuclust.dataset import new_manifest, write_json_atomic
from gpuclust.schema import CPU_PERCENTILES_SOURCE_ORDER, SCHEMAS, tier_map

ROW_GROUP = 1 << 20
US = 1_000_000
T0 = 600 * US


def _write(out: Path, table: str, t: pa.Table, part: int) -> str:
    rel = f"{table}/part-bench-{part:05d}.parquet"
    (out / table).mkdir(parents=True, exist_ok=True)
    pq.write_table(
        t.select(SCHEMAS[table].names).cast(SCHEMAS[table]), out / rel, row_group_size=ROW_GROUP, compression="zstd"
    )
    return rel


def make_dataset(
    out: str | Path,
    n_windows: int,
    *,
    machines: int | None = None,
    days: float | None = None,
    seed: int = 0,
    windows_per_part: int = 4 << 20,
) -> Path:
    """Write a complete canonical dataset with about ``n_windows`` usage windows to ``out``.

    By default the span follows from the size (``machines`` = n_windows / 20,000, at least 50;
    about 12 instances running per machine).  ``days`` fixes the span instead (e.g. 31 days with
    2,000 machines and 10^7 windows: the *long-span* set, sparse machines, 17.9M machine x 5-min
    buckets for 10^7 windows).  Without ``days`` the output is what it always was (same random
    stream), so cached datasets stay valid.
    """
    out = Path(out)
    rng = np.random.default_rng(seed)
    machines = machines or max(50, n_windows // 20_000)
    # Instances: each runs a contiguous span of 300 s windows on one machine.
    mean_windows = 40
    n_inst = max(1, n_windows // mean_windows)
    if days is None:
        hours = max(1.0, n_windows / (machines * 12 * 12))  # ~12 concurrent instances per machine
    else:
        hours = float(days) * 24
    n_cells = int(hours * 12)
    machine_ids = (np.int64(10**9) + np.sort(rng.choice(10**9, size=machines, replace=False)).astype(np.int64) * 997)[
        rng.permutation(machines)
    ]
    plat = rng.integers(0, 5, machines)
    cap_cpu = rng.choice(np.array([0.386719, 0.591797, 0.708984, 1.0], np.float32), machines)
    cap_mem = rng.choice(np.array([0.166748, 0.333496, 0.5, 1.0], np.float32), machines)
    platforms = np.array([f"platform-{i}" for i in range(5)], dtype=object)
    me = pa.table(
        {
            "time": np.zeros(machines, np.int64),
            "machine_id": machine_ids,
            "type": np.ones(machines, np.int8),
            "switch_id": pa.nulls(machines, pa.string()),
            "cap_cpu": cap_cpu,
            "cap_mem": cap_mem,
            "platform_id": platforms[plat],
            "missing_data_reason": np.zeros(machines, np.int8),
        }
    )
    files: dict[str, list[str]] = {t: [] for t in SCHEMAS}
    files["machine_events"].append(_write(out, "machine_events", me, 0))

    coll = rng.integers(10**10, 2**62, n_inst, dtype=np.int64)
    idx = rng.integers(0, 2000, n_inst).astype(np.int32)
    m_of = rng.integers(0, machines, n_inst)
    length = np.minimum(rng.geometric(1 / mean_windows, n_inst), n_cells)
    first = rng.integers(0, np.maximum(1, n_cells - length + 1))
    prio = rng.choice(
        np.array([0, 25, 103, 107, 116, 119, 200, 360], np.int32),
        n_inst,
        p=[0.15, 0.1, 0.2, 0.1, 0.05, 0.05, 0.3, 0.05],
    )
    alloc = np.where(rng.random(n_inst) < 0.05, rng.integers(10**10, 2**62, n_inst), 0).astype(np.int64)
    req_cpu = (rng.lognormal(-4, 1, n_inst)).astype(np.float32)
    req_mem = (rng.lognormal(-4.5, 1, n_inst)).astype(np.float32)
    t_start = T0 + first.astype(np.int64) * 300 * US
    t_end = t_start + length.astype(np.int64) * 300 * US
    n = n_inst
    ev = pa.table(
        {
            "time": np.concatenate([t_start, t_end]),
            "type": np.repeat(np.array([3, 6], np.int8), n),
            "collection_id": np.tile(coll, 2),
            "scheduling_class": np.tile(rng.integers(0, 4, n).astype(np.int8), 2),
            "missing_type": np.zeros(2 * n, np.int8),
            "collection_type": np.zeros(2 * n, np.int8),
            "priority": np.tile(prio, 2),
            "alloc_collection_id": np.tile(alloc, 2),
            "instance_index": np.tile(idx, 2),
            "machine_id": np.tile(machine_ids[m_of], 2),
            "alloc_instance_index": np.where(np.tile(alloc, 2) != 0, 0, -1).astype(np.int32),
            "req_cpu": np.tile(req_cpu, 2),
            "req_mem": np.tile(req_mem, 2),
        }
    )
    files["instance_events"].append(_write(out, "instance_events", ev, 0))
    # every instance is its own job: SUBMIT 1 s before it starts, SCHEDULE, FINISH (no random draws,
    # so the other tables are what they always were)
    ce = pa.table(
        {
            "time": np.concatenate([t_start - US, t_start, t_end]),
            "type": np.repeat(np.array([0, 3, 6], np.int8), n),
            "collection_id": np.tile(coll, 3),
            "scheduling_class": np.tile(ev["scheduling_class"].to_numpy()[:n], 3),
            "missing_type": np.zeros(3 * n, np.int8),
            "collection_type": np.zeros(3 * n, np.int8),
            "priority": np.tile(prio, 3),
            "alloc_collection_id": np.tile(alloc, 3),
        }
    )
    ce = pa.table(
        {
            f.name: ce[f.name] if f.name in ce.column_names else pa.nulls(3 * n, f.type)
            for f in SCHEMAS["collection_events"]
        }
    )
    files["collection_events"].append(_write(out, "collection_events", ce, 0))

    # Usage windows, written in parts to bound memory.
    inst_of_window = np.repeat(np.arange(n_inst), length)
    pos = np.arange(len(inst_of_window)) - np.repeat(np.cumsum(length) - length, length)
    order = np.argsort(rng.random(len(inst_of_window)), kind="stable")  # shuffle (real shards are unsorted)
    inst_of_window, pos = inst_of_window[order], pos[order]
    levels = np.array(CPU_PERCENTILES_SOURCE_ORDER, np.float64) / 100
    # Quantiles of a lognormal(0, s) relative to its mean, for a per-window shape s.
    from math import erf, sqrt

    def ndtri(p: np.ndarray) -> np.ndarray:  # inverse normal CDF by bisection (small, vectorised)
        lo, hi = np.full_like(p, -8.0), np.full_like(p, 8.0)
        cdf = np.vectorize(lambda x: 0.5 * (1 + erf(x / sqrt(2))))
        for _ in range(60):
            mid = (lo + hi) / 2
            below = cdf(mid) < p
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        return (lo + hi) / 2

    z = ndtri(np.clip(levels, 0.002, 0.998))
    wtot = len(inst_of_window)
    part = 0
    for s in range(0, wtot, windows_per_part):
        sl = slice(s, min(wtot, s + windows_per_part))
        ii, pp = inst_of_window[sl], pos[sl]
        k = len(ii)
        st = t_start[ii] + pp.astype(np.int64) * 300 * US
        en = st + 300 * US
        avg = np.minimum(req_cpu[ii] * rng.lognormal(-0.8, 0.5, k), 4).astype(np.float32)
        shape = rng.uniform(0.1, 0.8, k)
        q = avg[:, None] * np.exp(shape[:, None] * z[None, :] - shape[:, None] ** 2 / 2)
        cols: dict[str, object] = {
            "start_time": st,
            "end_time": en,
            "collection_id": coll[ii],
            "instance_index": idx[ii],
            "machine_id": machine_ids[m_of[ii]],
            "alloc_collection_id": alloc[ii],
            "alloc_instance_index": np.where(alloc[ii] != 0, 0, -1).astype(np.int32),
            "collection_type": np.zeros(k, np.int8),
            "avg_cpu": avg,
            "avg_mem": (req_mem[ii] * rng.uniform(0.3, 0.9, k)).astype(np.float32),
            "max_cpu": q[:, 10].astype(np.float32),
            "max_mem": (req_mem[ii] * 0.95).astype(np.float32),
            "sample_cpu": q[:, 5].astype(np.float32),
            "assigned_mem": req_mem[ii],
            "page_cache_mem": (req_mem[ii] * 0.05).astype(np.float32),
            "sample_rate": np.where(rng.random(k) < 0.97, 1.0, 0.5).astype(np.float32),
        }
        has_cpi = plat[m_of[ii]] < 3
        cpi = (1.2 + 0.2 * plat[m_of[ii]]) * (1 + 0.02 * rng.poisson(10, k)) * rng.lognormal(0, 0.1, k)
        cols["cpi"] = pa.array(cpi.astype(np.float32), mask=~has_cpi)
        cols["mai"] = pa.array((0.01 * cpi * rng.lognormal(0, 0.15, k)).astype(np.float32), mask=~has_cpi)
        for j, p in enumerate(CPU_PERCENTILES_SOURCE_ORDER):
            cols[f"cpu_p{p}"] = q[:, j].astype(np.float32)
        files["instance_usage"].append(_write(out, "instance_usage", pa.table(cols), part))
        part += 1
    man = new_manifest(trace_version="v3", cell="bench", tier_map=tier_map("notebook").to_json(), complete=True)
    for t, fl in files.items():
        man["tables"][t] = {"files": fl, "rows": int(sum(pq.ParquetFile(out / f).metadata.num_rows for f in fl))}
    man["generator"] = {"name": "bench/gen_canonical.py", "n_windows": wtot, "machines": machines, "seed": seed}
    if days is not None:
        man["generator"]["days"] = days
    write_json_atomic(out / "manifest.json", man)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--windows", type=lambda s: int(float(s)), default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--machines", type=int, default=None, help="machine count (default: windows / 20,000, at least 50)")
    ap.add_argument(
        "--days",
        type=float,
        default=None,
        help="trace span in days (default: from the size, ~12 instances running per machine); "
        "e.g. --windows 10000000 --machines 2000 --days 31 is the long-span set",
    )
    a = ap.parse_args()
    p = make_dataset(a.out, a.windows, machines=a.machines, days=a.days, seed=a.seed)
    print(p)
