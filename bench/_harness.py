"""Shared benchmark plumbing: run a command, sample the whole process tree's RSS, record the
machine, versions and commit next to every figure."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Measured:
    wall_s: float
    peak_rss_bytes: int
    returncode: int
    stdout_tail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def run_measured(
    cmd: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    poll_s: float = 0.05,
    timeout_s: float | None = None,
    max_rss_bytes: int | None = None,
) -> Measured:
    """Run ``cmd`` and sample the summed RSS of it and all its descendants every ``poll_s``.

    ``timeout_s`` / ``max_rss_bytes``: kill the process tree when the wall time / the sampled RSS
    passes it; ``extra`` then says ``{"timed_out": True}`` / ``{"rss_killed": True}`` (the
    returncode is the kill's, negative).  A guard for benchmarks of code whose memory grows with
    the data, so that a run cannot take a shared machine down.  ``extra["cpu_s"]``: user + system
    CPU seconds of the process and the descendants it waited for (``RUSAGE_CHILDREN`` before and
    after; exact when this is the only child running), less sensitive than wall time to other
    work on a shared machine.
    """
    import resource

    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd, text=True)
    peak = 0
    stop = threading.Event()
    extra: dict[str, Any] = {}

    def kill_tree(root: psutil.Process) -> None:
        try:
            procs = [*root.children(recursive=True), root]
        except psutil.NoSuchProcess:
            return
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass

    def sample() -> None:
        nonlocal peak
        try:
            root = psutil.Process(proc.pid)
        except psutil.NoSuchProcess:
            return
        while not stop.is_set():
            total = 0
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for p in procs:
                try:
                    total += p.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            peak = max(peak, total)
            if max_rss_bytes is not None and total > max_rss_bytes:
                extra["rss_killed"] = True
                kill_tree(root)
                break
            if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
                extra["timed_out"] = True
                kill_tree(root)
                break
            stop.wait(poll_s)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, _ = proc.communicate()
    wall = time.perf_counter() - t0
    stop.set()
    th.join()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    extra["cpu_s"] = round(ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime, 3)
    return Measured(wall, peak, proc.returncode, out[-4000:], extra)


def environment() -> dict[str, Any]:
    """Device, versions and commit that produced a figure."""
    import numpy
    import pyarrow

    def ver(mod: str) -> str | None:
        try:
            return __import__(mod).__version__
        except Exception:
            return None

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                cwd=Path(__file__).parent,
            ).stdout.strip()
        )
    except OSError:
        commit, dirty = None, None
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = cupy_version = cuda_runtime = driver = None
    try:
        import cupy  # noqa: TID251 - bench only, optional

        cupy_version = cupy.__version__
        props = cupy.cuda.runtime.getDeviceProperties(0)
        gpu = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        cuda_runtime = cupy.cuda.runtime.runtimeGetVersion()
        driver = cupy.cuda.runtime.driverGetVersion()
    except Exception:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "affinity_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        # Other work on the machine while measuring (1-minute load average when results were written).
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "gpu": gpu,
        "cupy": cupy_version,
        "cuda_runtime": cuda_runtime,
        "cuda_driver": driver,
        "python": sys.version.split()[0],
        "numpy": numpy.__version__,
        "pyarrow": pyarrow.__version__,
        "duckdb": ver("duckdb"),
        "gpuclust": ver("gpuclust"),
        "commit": commit,
        "dirty": dirty,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


def write_results(name: str, payload: dict[str, Any], markdown: str) -> tuple[Path, Path]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    jp, mp = RESULTS / f"{name}.json", RESULTS / f"{name}.md"
    jp.write_text(
        json.dumps(payload, indent=1, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))
        + "\n"
    )
    mp.write_text(markdown)
    return jp, mp


def publish(name: str, payload: dict[str, Any], md: list[str], env: dict[str, Any] | None = None) -> None:
    """Write ``payload`` (with the :func:`environment`, or ``env``) and the Markdown lines ``md``
    (with an ``Environment:`` line) as bench/results/<name>.json and .md, and print them."""
    env = environment() if env is None else env
    md = [*md, "", "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), ""]
    jp, mp = write_results(name, {"environment": env, **payload}, "\n".join(md))
    print("\n".join(md))
    print(f"wrote {jp} and {mp}")


def peak_rss_mib() -> float:
    """This process' own peak RSS so far, MiB (VmHWM: kernel-kept, reset at exec; NaN off Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def release_free_memory() -> None:
    """Give the allocators' free memory back to the system: pyarrow's pool, then glibc's arenas
    (``malloc_trim``; a no-op where there is no glibc)."""
    import ctypes
    import ctypes.util

    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    libc = ctypes.util.find_library("c")
    if libc:
        trim = getattr(ctypes.CDLL(libc), "malloc_trim", None)
        if trim is not None:
            trim(0)


def working_set(fn: Any, poll_s: float = 0.005) -> tuple[Any, float]:
    """Call ``fn()`` in this process: its result and how far the process's RSS rose above where it
    started, MiB (the peak sampled every ``poll_s`` during the call, less the RSS before it).  Freed
    memory is handed back to the system first (:func:`release_free_memory`), so what an earlier call left
    in the allocator does not hide this call's working memory.  For in-process benchmarks whose
    contenders share the data already in memory (a whole process's peak would be the data's).  The
    sampler is a Python thread: it sees the memory of the stretches that release the GIL (NumPy's,
    pandas', DuckDB's heavy loops do) and what is left at the end, not a peak held only under it."""
    release_free_memory()
    me = psutil.Process()
    start = me.memory_info().rss
    peak = [start]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], me.memory_info().rss)
            stop.wait(poll_s)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        out = fn()
    finally:
        stop.set()
        th.join()
    peak[0] = max(peak[0], me.memory_info().rss)
    return out, (peak[0] - start) / 2**20


def best_of(fn: Any, repeat: int) -> float:
    """Best wall seconds of ``repeat`` calls of ``fn`` (host clock; synchronise inside ``fn``)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_dataset(size: int, *, machines: int | None = None, days: float | None = None, generate: bool = True) -> Path:
    """The canonical benchmark dataset of ``size`` windows (bench/data/canonical-<size>, seed 1),
    generated on first use and shared by every benchmark (``generate=False``: only its path).
    With ``machines`` / ``days`` (the long-span set): bench/data/canonical-<size>-m<machines>-d<days>."""
    from gen_canonical import make_dataset

    name = f"canonical-{size}"
    if machines is not None or days is not None:
        name += f"-m{machines or 'auto'}-d{days if days is not None else 'auto'}"
    ds = Path(__file__).resolve().parent / "data" / name
    if generate and not (ds / "manifest.json").exists():
        print(f"generating {size:,} windows into {ds}", flush=True)
        make_dataset(ds, size, machines=machines, days=days, seed=1)
    return ds
