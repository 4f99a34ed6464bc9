"""Host floor: what of a gpu study's run stays on the host, measured without a device.

    python bench/host_floor.py --sizes 1e6,4e6
    python bench/host_floor.py --sizes 4e6 --analyses overcommit,cpi

Each size runs in two processes.  One persists the canonical dataset on the test suite's
device-shaped backend (tests/device_backend.py: NumPy arrays that pose as CuPy's, every operation
on them counted and timed), its partials marked as the gpu's so that the finalizes that run on a
device run there too (as in tests/engine/test_device_work.py).  Each analysis runs warm, best of
``--repeat``, and its wall time splits in two:

* the time inside device-array operations: NumPy here, kernels and copies on a device;
* the rest, which a gpu run pays on the host whatever the device: Python, host NumPy, Arrow
  and pandas (contexts, the host parts of finalize, building the result tables, ``convert``).

The other process runs the cpu backend on the same data and options (``study_bench.py``'s
child, all usable cores).  ``cpu / host`` bounds the gpu's speed-up over the cpu backend
(issue 9's target: 20x) by the host work alone, on this machine's cores: an analysis whose host
floor is above 1/20 of its cpu time cannot reach the target until that work moves to the device.
The device-shaped runs use one worker thread, so a finalize that a gpu study spreads over the
host's cores counts whole here: the floor is an upper bound for those.  So is it for freeing
large temporaries: glibc returns an array above its mmap threshold to the kernel when it is
freed (outside any array operation here, so host time), where CuPy's memory pool keeps device
memory for the next one.  The device-shaped process therefore asks glibc to keep freed memory
(``MALLOC_MMAP_THRESHOLD_`` at its 32 MiB maximum, ``MALLOC_TRIM_THRESHOLD_`` / ``MALLOC_TOP_PAD_``
large: cell-usage's host time at 4e6 windows went from 13.9 to 6.0 ms on the 2-core VM); arrays
above 32 MiB are still returned.

Writes bench/results/<name>.{json,md} (default host_floor) with the machine, versions and commit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _harness import bench_dataset, environment, publish, run_measured  # noqa: E402

#: glibc settings of the device-shaped process: freed memory kept for reuse, as by a device pool
POOL_LIKE_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(16 << 30),
                    "MALLOC_TOP_PAD_": str(1 << 30)}


def child(ds: Path, repeat: int, only: list[str], result: Path) -> None:
    sys.path.insert(0, str(HERE.parent / "tests"))
    import pytest
    from device_backend import DEVICE, counting_device_work, mark_partials_gpu, resolve_gpu_to_device
    from study_bench import bench_analyses

    import gpuclust

    mp = pytest.MonkeyPatch()
    resolve_gpu_to_device(mp)
    mark_partials_gpu(mp)
    study = gpuclust.open(ds, backend=DEVICE, workers=1).persist()
    out: dict[str, Any] = {}
    for name, a in bench_analyses().items():
        if only and name not in only:
            continue
        study.run(a)  # contexts built: the runs below are warm
        best: dict[str, Any] | None = None
        for _ in range(repeat):
            with counting_device_work() as w:
                t = time.perf_counter()
                study.run(a)
                wall = time.perf_counter() - t
            if best is None or wall < best["wall_s"]:
                best = {"wall_s": wall, "device_s": w["device_s"], "host_s": wall - w["device_s"],
                        "ops": w["ops"], "kernels": w["kernels"], "syncs": w["syncs"],
                        "phases": dict(study.last_run_seconds)}
        out[name] = best
    study.close()
    mp.undo()
    result.write_text(json.dumps(out))


def _failed(m: Any, what: str) -> SystemExit:
    print(m.stdout_tail[-3000:], flush=True)
    return SystemExit(f"{what} failed (exit {m.returncode})")


def _device_shaped(ds: Path, repeat: int, only: list[str], what: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        m = run_measured([sys.executable, __file__, "--child", str(ds), "--repeat", str(repeat),
                          "--analyses", ",".join(only), "--result", str(out)], env={**os.environ, **POOL_LIKE_MALLOC})
        if m.returncode != 0 or not out.exists():
            raise _failed(m, what)
        return json.loads(out.read_text())


def _cpu(ds: Path, repeat: int, what: str) -> dict[str, Any]:
    m = run_measured([sys.executable, str(HERE / "study_bench.py"), "--child", "cpu", str(ds), "--repeat", str(repeat)])
    line = next((ln for ln in m.stdout_tail.splitlines() if ln.startswith("RESULT ")), None)
    if m.returncode != 0 or line is None:
        raise _failed(m, what)
    return json.loads(line[7:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1e6,4e6")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each analysis in a process (best)")
    ap.add_argument("--analyses", default="", help="comma-separated labels (default: every analysis and SQL variant)")
    ap.add_argument("--name", default="host_floor")
    ap.add_argument("--child", metavar="DATASET", help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    only = [a for a in args.analyses.split(",") if a]
    if args.child:
        child(Path(args.child), args.repeat, only, args.result)
        return 0
    rows = []
    for size in [int(float(s)) for s in args.sizes.split(",")]:
        ds = bench_dataset(size)
        dev = _device_shaped(ds, args.repeat, only, f"device-shaped run at {size:,}")
        cpu = _cpu(ds, args.repeat, f"cpu run at {size:,}")
        for name, d in dev.items():
            c = cpu["analyses"].get(name)
            rows.append({"size": size, "analysis": name, **d, "cpu_s": c,
                         "cpu_over_host": c / d["host_s"] if c and d["host_s"] > 0 else None})
        print(json.dumps({"size": size, "done": len(dev)}), flush=True)
    env = environment()
    md = [f"# Host floor of a gpu study ({env.get('cores')} cores, no device needed)", "",
          "Each analysis warm on the device-shaped backend (partials marked as the gpu's), best of "
          f"{args.repeat}: its wall time, the time inside device-array operations (kernels on a device) and the "
          "rest (host: Python, host NumPy, Arrow, pandas), the device operations and host syncs it made; the cpu "
          "backend's time on the same data; `cpu / host` bounds a gpu run's speed-up over the cpu by the host "
          "work alone (target 20x).", "",
          "| windows | analysis | wall s | device-op s | host s | host share | ops | syncs | cpu s | cpu / host |",
          "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = "" if r["cpu_over_host"] is None else f"{r['cpu_over_host']:.1f}x"
        cpu_s = "" if r["cpu_s"] is None else f"{r['cpu_s']:.4f}"
        md.append(f"| {r['size']:,} | {r['analysis']} | {r['wall_s']:.4f} | {r['device_s']:.4f} | {r['host_s']:.4f} | "
                  f"{100 * r['host_s'] / r['wall_s']:.0f}% | {r['ops']} | {r['syncs']} | {cpu_s} | {ratio} |")
    md += ["", "Where the host time goes, per analysis: the last size's phases of the device-shaped run "
           "(contexts / partials / merge / finalize / convert, s; partials and finalize hold both device and host "
           "work).", "",
           "| analysis | contexts | partials | merge | finalize | convert |", "|---|---:|---:|---:|---:|---:|"]
    last = max((r["size"] for r in rows), default=0)
    for r in rows:
        if r["size"] == last:
            ph = r["phases"]
            md.append(f"| {r['analysis']} | " + " | ".join(f"{ph[k]:.4f}" for k in
                                                        ("contexts", "partials", "merge", "finalize", "convert")) + " |")
    publish(args.name, {"rows": rows}, md, env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
