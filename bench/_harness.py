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


def run_measured(cmd: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None, poll_s: float = 0.05) -> Measured:
    """Run ``cmd`` and sample the summed RSS of it and all its descendants every ``poll_s``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd, text=True)
    peak = 0
    stop = threading.Event()

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
            stop.wait(poll_s)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, _ = proc.communicate()
    wall = time.perf_counter() - t0
    stop.set()
    th.join()
    return Measured(wall, peak, proc.returncode, out[-4000:])


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
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=Path(__file__).parent).stdout.strip())
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
    jp.write_text(json.dumps(payload, indent=1, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o)) + "\n")
    mp.write_text(markdown)
    return jp, mp


def best_of(fn: Any, repeat: int) -> float:
    """Best wall seconds of ``repeat`` calls of ``fn`` (host clock; synchronise inside ``fn``)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_dataset(size: int) -> Path:
    """The canonical benchmark dataset of ``size`` windows (bench/data/canonical-<size>, seed 1),
    generated on first use and shared by every benchmark."""
    from gen_canonical import make_dataset

    ds = Path(__file__).resolve().parent / "data" / f"canonical-{size}"
    if not (ds / "manifest.json").exists():
        print(f"generating {size:,} windows into {ds}", flush=True)
        make_dataset(ds, size, seed=1)
    return ds
