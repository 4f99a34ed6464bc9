"""Key passes at several sizes (issue 34): the device memory of a run whose dense keyed sums outgrow
the device's room for them (gpuclust/engine/key_passes.py).

For each size, the canonical dataset with 1,000 machines and a trace span growing with the windows
(2 days per 10^6: the dense sums, machines x tiers x buckets, grow with the windows as a longer
cell's do), the three analyses with dense keyed sums (overcommit, cpi, machine-utilization) in one
``engine.run`` on the device-shaped backend (tests/device_backend.py: NumPy arrays posing as
CuPy's, every allocation counted), in partitions of ``--partition-rows`` (a cell's run has
thousands), each run in a child process.  A pass holds whole shards of the tables (overcommit's:
2^20 machine-buckets on a device), so the passes are at most the shards:

* **capped**: a device of ``--device-mib`` (an allocation past it fails, as CUDA's would): the
  passes each analysis took (``streams``: those that read the data again; the run's own stream
  takes the first where the room has it), the device's peak bytes, the process tree's peak RSS
  and the wall;
* **uncapped**: a device of 16 GiB, where every dense sum fits at once: its peak and wall.

The two runs' tables are compared bit for bit (a hash of each table).  Target: at the largest
size the uncapped run's device peak is past the capped device (its sums would not fit at once)
and the capped run finishes within it, with the uncapped run's tables at every size.  (The
capped peak grows until the room for dense sums, four tenths of the device, is full; then the
passes grow instead.)

    python bench/key_passes_bench.py --sizes 1e6,4e6
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import environment, publish, run_measured  # noqa: E402

ANALYSES = ("overcommit", "cpi", "machine-utilization")
MACHINES = 1_000
DAYS_PER_MILLION = 2.0
UNCAPPED_MIB = 16 << 10


def bench_dataset(size: int) -> Path:
    """The canonical dataset of ``size`` windows, :data:`MACHINES` machines, its span growing with it."""
    from _harness import bench_dataset as cached

    return cached(size, machines=MACHINES, days=round(DAYS_PER_MILLION * size / 1e6, 3))


def child(ds: str, cap_mib: int, partitions: int, result: str, shard_cells: int = 0) -> None:
    """One run of :data:`ANALYSES` on the device-shaped backend under a device of ``cap_mib``
    (``shard_cells``: overcommit's shards, where not 0)."""
    import time

    sys.path.insert(0, str(HERE.parent / "tests"))
    import pandas as pd
    import pytest
    from device_backend import DEVICE_GPU, device_memory, resolve_gpu_to_device

    from gpuclust.analyses import overcommit
    from gpuclust.engine import key_passes, shards
    from gpuclust.engine.local import run
    from gpuclust.parted import PartedTable

    mp = pytest.MonkeyPatch()
    resolve_gpu_to_device(mp)
    if shard_cells:
        mp.setattr(overcommit, "SHARD_CELLS", shard_cells)
    passes: dict[str, int] = {}
    streams: dict[str, int] = {}
    real = key_passes.KeyPasses.finalize

    def counted(self: Any, a: Any, *args: Any, **kw: Any) -> Any:
        try:
            return real(self, a, *args, **kw)
        finally:
            passes[a.name], streams[a.name] = self.passes, self.streams

    mp.setattr(key_passes.KeyPasses, "finalize", counted)
    spilled: list[Any] = []
    real_write = shards.write_keyed
    mp.setattr(shards, "write_keyed", lambda *args: spilled.append(1) or real_write(*args))
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        with device_memory(cap_mib << 20) as mem:
            res = run(ds, list(ANALYSES), backend=DEVICE_GPU, partitions=partitions, parts_dir=tmp)
        wall = time.perf_counter() - t
        peak = int(mem["peak_live_bytes"])
        digest = {}
        for name, tables in res.items():
            for t_name, v in tables.items():
                df = v.read() if isinstance(v, PartedTable) else v
                h = pd.util.hash_pandas_object(df, index=False).to_numpy()
                digest[f"{name}/{t_name}"] = [len(df), list(map(str, df.columns)), h.sum().item(), h[::97].tolist()]
    mp.undo()
    Path(result).write_text(
        json.dumps(
            {
                "wall_s": wall,
                "device_peak_bytes": peak,
                "passes": passes,
                "streams": streams,
                "spilled": len(spilled),
                "digest": digest,
            }
        )
    )


def _run_child(ds: Path, cap_mib: int, partitions: int, shard_cells: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, __file__, "--child", str(ds), str(cap_mib), str(partitions), str(out), str(shard_cells)]
        m = run_measured(cmd, env=dict(os.environ))
        if m.returncode != 0 or not out.exists():
            print(m.stdout_tail[-3000:], flush=True)
            raise SystemExit(f"the run of {ds} on a device of {cap_mib} MiB failed (exit {m.returncode})")
        return {**json.loads(out.read_text()), "peak_rss_bytes": int(m.peak_rss_bytes)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1e6,4e6")
    ap.add_argument("--device-mib", type=int, default=2048, help="the capped device's memory (MiB)")
    ap.add_argument("--partition-rows", type=lambda s: int(float(s)), default=1 << 20)
    ap.add_argument(
        "--shard-cells",
        type=lambda s: int(float(s)),
        default=0,
        help="overcommit's shards in machine-buckets (default: its own, 2^20 on a device; a pass holds "
        "whole shards, so a small dataset needs small ones to take several)",
    )
    ap.add_argument("--name", default="key_passes")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a.child[0], int(a.child[1]), int(a.child[2]), a.child[3], int(a.child[4]))
        return 0
    env = environment()
    rows = []
    for size in (int(float(s)) for s in a.sizes.split(",")):
        ds = bench_dataset(size)
        parts = max(2, math.ceil(size / a.partition_rows))
        capped = _run_child(ds, a.device_mib, parts, a.shard_cells)
        uncapped = _run_child(ds, UNCAPPED_MIB, parts, a.shard_cells)
        rows.append(
            {
                "windows": size,
                "partitions": parts,
                "device_mib": a.device_mib,
                "capped": {k: v for k, v in capped.items() if k != "digest"},
                "uncapped": {k: v for k, v in uncapped.items() if k != "digest"},
                "equal": capped["digest"] == uncapped["digest"],
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    growth = rows[-1]["capped"]["device_peak_bytes"] / max(1, rows[0]["capped"]["device_peak_bytes"])
    cap, last = a.device_mib << 20, rows[-1]
    verdict = {
        "capped_peak_growth": growth,
        "uncapped_peak_growth": last["uncapped"]["device_peak_bytes"]
        / max(1, rows[0]["uncapped"]["device_peak_bytes"]),
        "windows_growth": last["windows"] / rows[0]["windows"],
        "met": last["capped"]["device_peak_bytes"] <= cap < last["uncapped"]["device_peak_bytes"]
        and all(r["equal"] for r in rows),
    }
    mib = lambda b: f"{b / 2**20:,.0f}"  # noqa: E731
    md = [
        "# Key passes: device memory at several sizes",
        "",
        f"{', '.join(ANALYSES)} in one run on the device-shaped backend, {MACHINES:,} machines, "
        f"{DAYS_PER_MILLION:g} days of trace per 10^6 windows, partitions of {a.partition_rows:,} rows; "
        f"capped: a device of {a.device_mib:,} MiB; uncapped: {UNCAPPED_MIB:,} MiB. One run each (wall, "
        "whole child process; peak RSS of its process tree).",
        "",
        "| windows | partitions | passes (capped) | device peak MiB, capped | uncapped | host peak RSS MiB, capped "
        "| uncapped | wall s, capped | uncapped | tables equal |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        c, u = r["capped"], r["uncapped"]
        passes = ", ".join(f"{k} {v} ({c['streams'][k]} streamed)" for k, v in sorted(c["passes"].items())) or "none"
        md.append(
            f"| {r['windows']:,} | {r['partitions']} | {passes} | {mib(c['device_peak_bytes'])} | "
            f"{mib(u['device_peak_bytes'])} | {mib(c['peak_rss_bytes'])} | {mib(u['peak_rss_bytes'])} | "
            f"{c['wall_s']:.1f} | {u['wall_s']:.1f} | {'yes' if r['equal'] else 'NO'} |"
        )
    md += [
        "",
        f"Windows x{verdict['windows_growth']:g}: capped device peak x{growth:.2f}, uncapped "
        f"x{verdict['uncapped_peak_growth']:.2f}. Target (at the largest size, the uncapped peak past the "
        f"{a.device_mib:,} MiB device and the capped run within it, the tables equal): "
        f"{'met' if verdict['met'] else 'NOT met'}.",
    ]
    publish(a.name, {"rows": rows, "verdict": verdict}, md, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
