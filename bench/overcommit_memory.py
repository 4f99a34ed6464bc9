"""Peak memory of ``overcommit`` per phase, in a child process (issue 8).

Many machine-buckets cheaply: ``bench/gen_canonical.py`` with many machines and a short bucket
(``--bucket-s``), so finalize's cost per machine-bucket dominates.  The child runs the engine's
phases itself (contexts, partials spilled + merge, finalize: the shards of the machine table
written as Parquet parts, as ``gpuclust analyze --out`` does) and reports its RSS after each
phase and its peak (VmHWM, reset before finalize through ``/proc/self/clear_refs`` so finalize's
own peak is seen even below the partials' peak); ``finalize_growth_per_mb`` = (peak after
finalize - RSS before it) / machine-buckets (M x B), ``finalize_temp_per_mb`` the same less the
tables returned in memory (the machine table is on disk).  Before that baseline the allocators
(glibc's and pyarrow's pool) give their free memory back to the system, so the growth is what
finalize allocates: otherwise it reuses what the partials phase left free, which hides all of it
or none of it depending on which thread's arena freed what (measured on a flat source: 24-32 MiB
usually, 193 MiB once; 200-206 MiB every time with the release).

    python bench/overcommit_memory.py --windows 2000000 --machines 4000 --bucket-s 10 [--buckets 7]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import release_free_memory  # noqa: E402

HERE = Path(__file__).resolve().parent


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _maxrss() -> int:
    """Peak RSS since the start or the last :func:`_reset_peak` (VmHWM), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_peak() -> bool:
    """Reset the peak RSS to the current RSS (Linux: ``5 > /proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def child(
    path: str,
    bucket_s: int,
    buckets: int | None,
    partitions: int,
    finalize_cells: int = 0,
    shard_cells: int = 0,
    client_cells: int = 0,
) -> dict:
    import tempfile

    import gpuclust.engine.local as L
    from gpuclust.analyses.overcommit import Overcommit
    from gpuclust.backends import get_backend
    from gpuclust.dataset import Dataset
    from gpuclust.engine.partition import TableSource, as_source
    from gpuclust.engine.shards import SpillFolders, reduce_shard
    from gpuclust.schema import TABLES

    if finalize_cells:
        import gpuclust.analyses.overcommit as oc

        oc.FINALIZE_CELLS = {**oc.FINALIZE_CELLS, "cpu": finalize_cells}
    if shard_cells:
        import gpuclust.analyses.overcommit as oc

        oc.SHARD_CELLS = shard_cells
    if client_cells:
        import gpuclust.analyses.overcommit as oc

        oc.CLIENT_CELLS = client_cells

    if buckets:
        ds = Dataset(path)
        src = TableSource(
            {t: ds.read(t) for t in TABLES if ds.num_rows(t)},
            tier_map=ds.tier_map_name,
            trace_version=ds.trace_version,
            buckets=buckets,
        )
    else:
        src = as_source(path)
    out: dict = {"rss_start": _rss()}
    a = Overcommit(bucket_s=bucket_s)
    be = get_backend("cpu")
    t0 = time.perf_counter()
    plans = L.plan_tables(src, [a], partitions)
    ctxs = L.contexts([a], src, per_partition=L.per_partition(src, [a], plans))
    out["rss_after_context"], out["peak_after_context"] = _rss(), _maxrss()
    folders = SpillFolders(tempfile.mkdtemp(prefix="oc-mem-"))  # as `analyze --out`: parts written by the shards
    spills = [folders.for_analysis(0)]
    merged = L.merge_local(
        plans, [a], ctxs, be, 2, None, lambda spec, sub, sc, sp: L.partition_partials(spec, sub, sc, be, sp), spills
    )
    out["peak_before_finalize"] = _maxrss()
    release_free_memory()  # so finalize's growth is what it allocates, not what it reuses
    out["rss_before_finalize"] = _rss()
    out["partials_s"] = time.perf_counter() - t0
    out["peak_reset"] = _reset_peak()  # so the peak below is finalize's own
    t1 = time.perf_counter()
    res = L.finalize_all(
        [a],
        merged,
        [L.unbound(ctxs[0])],
        None,
        folders=folders,
        spills=spills,
        run_tasks=lambda args: [reduce_shard(*t) for t in args],
    )["overcommit"]
    out["finalize_s"] = time.perf_counter() - t1
    out["peak_after_finalize"] = _maxrss()
    from gpuclust.tables import as_arrow

    info = as_arrow(res["info"]).to_pylist()[0]
    mb = int(info["machines"]) * int(info["buckets"])
    machine = res["machine"]
    out.update(
        machines=int(info["machines"]),
        buckets=int(info["buckets"]),
        machine_buckets=mb,
        machine_rows=machine.num_rows,
        machine_parts=len(machine.files),
        output_bytes=int(sum(as_arrow(t).nbytes for name, t in res.items() if name != "machine")),
    )
    folders.close()
    import shutil

    shutil.rmtree(folders.root, ignore_errors=True)
    growth = out["peak_after_finalize"] - out["rss_before_finalize"]
    out["finalize_growth_per_mb"] = growth / max(mb, 1)
    out["finalize_temp_per_mb"] = (growth - out["output_bytes"]) / max(mb, 1)
    out["peak_per_mb"] = out["peak_after_finalize"] / max(mb, 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--windows", type=int, default=2_000_000)
    p.add_argument("--machines", type=int, default=4000)
    p.add_argument("--bucket-s", type=int, default=10)
    p.add_argument("--buckets", type=int, default=0, help="bucket the tables in memory (TableSource buckets=N)")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--finalize-cells", type=int, default=0, help="machine-buckets per finalize chunk (0: default)")
    p.add_argument("--shard-cells", type=int, default=0, help="machine-buckets per shard (0: default)")
    p.add_argument(
        "--client-cells",
        type=int,
        default=0,
        help="machine-buckets per chunk of a flat source's intervals (0: default)",
    )
    p.add_argument("--data", default="/tmp/overcommit_mem")
    p.add_argument("--child", action="store_true")
    args = p.parse_args()
    path = Path(args.data) / f"w{args.windows}_m{args.machines}"
    if args.child:
        print(
            json.dumps(
                child(
                    str(path),
                    args.bucket_s,
                    args.buckets or None,
                    args.partitions,
                    args.finalize_cells,
                    args.shard_cells,
                    args.client_cells,
                )
            )
        )
        return
    if not (path / "manifest.json").exists():
        sys.path.insert(0, str(HERE))
        from gen_canonical import make_dataset

        make_dataset(path, args.windows, machines=args.machines)
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--windows",
        str(args.windows),
        "--machines",
        str(args.machines),
        "--bucket-s",
        str(args.bucket_s),
        "--buckets",
        str(args.buckets),
        "--partitions",
        str(args.partitions),
        "--finalize-cells",
        str(args.finalize_cells),
        "--shard-cells",
        str(args.shard_cells),
        "--client-cells",
        str(args.client_cells),
        "--data",
        args.data,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    print(r.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
