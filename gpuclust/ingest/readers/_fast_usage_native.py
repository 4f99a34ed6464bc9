"""The compiled InstanceUsage reader as a plain shared library, loaded without numba.

Importing numba and loading the kernel from numba's cache costs ~0.4 s at the start of every
ingest process (numba's import ~0.25 s, the first call's cache load ~0.15 s: LLVM's set-up), and
no InstanceUsage piece can be parsed before it ends; on a 1 GB plain-JSON shard that is a quarter
of the run.  So the kernel is also kept as a shared library: the *same* numba kernel
(:func:`gpuclust.ingest.readers._fast_usage_kernel.parse_usage`) behind a C entry point
(``numba.cfunc`` over raw pointers), compiled by numba to an object file for this CPU and linked
by the system C compiler (``cc``) together with a few lines of C standing in for the numba
helpers the object refers to.  A process then loads it with ``ctypes`` in ~2 ms; ``ctypes`` calls
release the GIL, as the ``nogil`` kernel does, so pieces are still parsed in several threads.

* :func:`load` returns the kernel (same arguments and result as ``parse_usage``) from the
  library built for this kernel source and this CPU, or None.  A library is named by a hash of
  the kernel's source, this module's and the CPU's model and flags (``/proc/cpuinfo``; Linux
  only), so an edited kernel or another CPU never loads a stale or foreign build; a library that
  does not load, or that parses a known line wrongly, is not used.
* :func:`build` makes the library (numba, ~1-7 s); :func:`build_in_background` runs it in a
  detached ``python -m`` process (started by a launcher that exits at once, so it is not this
  process' child) when a reader wanted the library and found none (at most one
  build at a time per library: a lock file), so the run that needs it goes on with numba and the
  next one loads the library.  Without a C compiler there is no library and numba's kernel is
  used, as before.

Where: beside numba's cache of the kernel (``readers/__pycache__``), or in
``~/.cache/gpuclust`` where that folder is read-only; ``GPUCLUST_KERNEL_DIR`` overrides it.
``GPUCLUST_NATIVE_KERNEL=0`` turns the library off (numba's kernel every time; no build).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["Kernel", "build", "build_in_background", "enabled", "library_path", "load"]

#: Bumped when the C entry point's arguments change.
ABI = 1
_HERE = Path(__file__).resolve().parent
_KERNEL_SRC = _HERE / "_fast_usage_kernel.py"
#: A build lock older than this is a crashed build's.
_STALE_LOCK_S = 600.0


def enabled() -> bool:
    return os.environ.get("GPUCLUST_NATIVE_KERNEL", "1").strip().lower() not in ("0", "false", "no", "off")


def _cpu_tag() -> str | None:
    """The CPU's model and flags (what numba compiles for), or None where not known (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/cpuinfo", "rb") as f:
            head = f.read(16 << 10)
    except OSError:
        return None
    info: dict[bytes, bytes] = {}
    for line in head.split(b"\n"):
        if not line.strip():
            if info:
                break  # the first processor's block
            continue
        k, _, v = line.partition(b":")
        info[k.strip()] = v.strip()
    flags = info.get(b"flags") or info.get(b"Features")
    if not flags:
        return None
    model = info.get(b"model name") or info.get(b"CPU part") or b""
    return f"{os.uname().machine}|{model.decode(errors='replace')}|{' '.join(sorted(flags.decode().split()))}"


def _folder() -> Path:
    env = os.environ.get("GPUCLUST_KERNEL_DIR")
    if env:
        return Path(env)
    here = _HERE / "__pycache__"
    if os.access(here if here.exists() else _HERE, os.W_OK):
        return here
    return Path.home() / ".cache" / "gpuclust"


def library_path() -> Path | None:
    """Where the library for this kernel source and CPU is (or would be); None: not supported."""
    cpu = _cpu_tag()
    if cpu is None:
        return None
    try:
        h = hashlib.sha256(_KERNEL_SRC.read_bytes() + Path(__file__).read_bytes() + cpu.encode())
    except OSError:
        return None
    return _folder() / f"gpuclust_fast_usage-{ABI}-{h.hexdigest()[:20]}.so"


class Kernel:
    """``parse_usage``'s arguments and result over the library's C entry point."""

    def __init__(self, fn: Any):
        self._fn = fn

    def __call__(self, buf: Any, keys: Any, lens: Any, hi: Any, lo: Any, ints: Any, int_ok: Any, res: Any,
                 res_ok: Any, obj_ok: Any, flt: Any, flt_ok: Any, lvals: Any, loffs: Any, list_ok: Any, hard: Any,
                 hn: Any) -> tuple[int, int]:
        import numpy as np

        arrays = (buf, keys, lens, hi, lo, ints, int_ok, res, res_ok, obj_ok, flt, flt_ok, lvals, loffs, list_ok,
                  hard, hn)  # fmt: skip
        for a in arrays:
            if not a.flags.c_contiguous:
                raise ValueError("the native kernel needs C-contiguous arrays")
        assert ints.shape[0] == 8 and res.shape[0] == 6 and flt.shape[0] == 5 and lvals.shape[0] == 2
        assert loffs.shape[1] == ints.shape[1] + 1 and hard.shape[0] == 5 and len(hi) == len(lo)
        rows = np.zeros(1, dtype=np.int64)
        st = self._fn(
            buf.ctypes.data, buf.shape[0], keys.ctypes.data, keys.shape[0], keys.shape[1], lens.ctypes.data,
            hi.ctypes.data, lo.ctypes.data, hi.shape[0], ints.ctypes.data, int_ok.ctypes.data, res.ctypes.data,
            res_ok.ctypes.data, obj_ok.ctypes.data, flt.ctypes.data, flt_ok.ctypes.data, ints.shape[1],
            lvals.ctypes.data, lvals.shape[1], loffs.ctypes.data, list_ok.ctypes.data, hard.ctypes.data,
            hard.shape[1], hn.ctypes.data, rows.ctypes.data,
        )  # fmt: skip
        return int(st), int(rows[0])


def _open(path: Path) -> Kernel:
    import ctypes

    lib = ctypes.CDLL(str(path))
    if lib.gpuclust_kernel_abi() != ABI:
        raise OSError(f"{path}: another ABI")
    fn = lib.gpuclust_parse_usage
    P, I = ctypes.c_void_p, ctypes.c_int64  # noqa: E741, N806
    fn.argtypes = [P, I, P, I, I, P, P, P, I, P, P, P, P, P, P, P, I, P, I, P, P, P, I, P, P]
    fn.restype = I
    return Kernel(fn)


def load() -> Kernel | None:
    """The library's kernel for this source and CPU, or None (none built, off, or it fails)."""
    if not enabled():
        return None
    path = library_path()
    if path is None or not path.is_file():
        return None
    try:
        return _open(path)
    except (OSError, AttributeError):
        return None


# --------------------------------------------------------------------------------------------
# Building (imports numba)
# --------------------------------------------------------------------------------------------
#: C for the symbols the object refers to outside the kernel: ``math.ldexp`` (numba's helper, the
#: same code), and the error paths of numba's C-callable wrapper, which this kernel never takes
#: (it raises nothing: no bounds checks, no allocation) and which abort if ever reached.
_SHIM = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
double numba_ldexp(double x, int exp) { if (isfinite(x) && x != 0.0 && exp) x = ldexp(x, exp); return x; }
float numba_ldexpf(float x, int exp) { if (isfinite(x) && x != 0.0f && exp) x = ldexpf(x, exp); return x; }
#define NEVER(name) void name(void) { abort(); }
NEVER(NRT_Free) NEVER(NRT_MemInfo_call_dtor) NEVER(numba_gil_ensure) NEVER(numba_gil_release)
NEVER(numba_do_raise) NEVER(numba_unpickle) NEVER(numba_runtime_build_excinfo_struct)
NEVER(PyErr_Clear) NEVER(PyErr_SetNone) NEVER(PyErr_SetString) NEVER(PyErr_WriteUnraisable)
NEVER(PyBytes_FromStringAndSize) NEVER(PyUnicode_FromString) NEVER(Py_DecRef)
NEVER(PyExc_RuntimeError) NEVER(PyExc_StopIteration) NEVER(PyExc_SystemError)
int64_t gpuclust_kernel_abi(void) { return %(abi)d; }
extern int64_t gpuclust_entry(%(params)s) __asm__("%(sym)s");
int64_t gpuclust_parse_usage(%(params)s) { return gpuclust_entry(%(args)s); }
"""


def _cfunc() -> Any:
    """The kernel behind a C-callable entry point over raw pointers and sizes (numba)."""
    from numba import carray, cfunc, types

    from gpuclust.ingest.readers import _fast_usage_kernel as k

    u8, i32, i64, u64, f32 = (types.CPointer(t) for t in (types.uint8, types.int32, types.int64, types.uint64,
                                                            types.float32))  # fmt: skip
    n = types.int64
    sig = types.int64(u8, n, u8, n, n, i64, u64, u64, n, i64, u8, f32, u8, u8, f32, u8, n, f32, n, i32, u8, i64, n,
                      i64, i64)  # fmt: skip

    def entry(bp, nb, kp, nk, kw, lp, hip, lop, nt, ip, iop, rp, rop, op, fp, fop, cap, lvp, lcap, lfp, lokp, hp,
              hcap, hnp, outp):  # fmt: skip
        st, rows = k.parse_usage(
            carray(bp, (nb,)), carray(kp, (nk, kw)), carray(lp, (nk,)), carray(hip, (nt,)), carray(lop, (nt,)),
            carray(ip, (8, cap)), carray(iop, (8, cap)), carray(rp, (6, cap)), carray(rop, (6, cap)),
            carray(op, (3, cap)), carray(fp, (5, cap)), carray(fop, (5, cap)), carray(lvp, (2, lcap)),
            carray(lfp, (2, cap + 1)), carray(lokp, (2, cap)), carray(hp, (5, hcap)), carray(hnp, (1,)),
        )  # fmt: skip
        out = carray(outp, (1,))
        out[0] = rows
        return st

    return cfunc(sig, nogil=True)(entry), len(sig.args)


def build(path: Path | None = None) -> Path:
    """Compile the library to ``path`` (default :func:`library_path`) and check it; returns it.

    Raises where numba, the C compiler or the check fails."""
    import shutil
    import subprocess

    import llvmlite.binding as ll

    path = path or library_path()
    if path is None:
        raise RuntimeError("no native kernel on this platform (the CPU is not known)")
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc) to link the native kernel")
    fn, nargs = _cfunc()
    lib = fn._library
    lib._ensure_finalized()
    tm = ll.Target.from_default_triple().create_target_machine(
        cpu=ll.get_host_cpu_name(), features=ll.get_host_cpu_features().flatten(), opt=3, reloc="pic",
        codemodel="default",
    )  # fmt: skip
    obj = tm.emit_object(lib._final_module)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    src, o = tmp.with_suffix(".c"), tmp.with_suffix(".o")
    try:
        o.write_bytes(obj)
        names = [f"a{i}" for i in range(nargs)]
        src.write_text(_SHIM % {
            "abi": ABI, "sym": fn.native_name,
            "params": ", ".join(f"{'void *' if i in _PTR_ARGS else 'int64_t '}{a}" for i, a in enumerate(names)),
            "args": ", ".join(names),
        })  # fmt: skip
        done = subprocess.run([cc, "-shared", "-O2", "-fPIC", "-Wl,-Bsymbolic", "-o", str(tmp), str(src), str(o),
                               "-lm"], capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-2000:]}")
        check(_open(tmp))
        os.replace(tmp, path)
    finally:
        for f in (tmp, src, o):
            try:
                f.unlink()
            except FileNotFoundError:
                pass
    return path


#: Positions of the pointer arguments of the C entry point (the rest are int64 sizes).
_PTR_ARGS = frozenset({0, 2, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 17, 19, 20, 21, 23, 24})

_CHECK_LINE = (
    b'{"start_time":"600000000","end_time":"9223372036854775807","collection_id":"477319772031",'
    b'"instance_index":"3","machine_id":"32434369549","collection_type":"0",'
    b'"average_usage":{"cpus":0.0637732,"memory":0.0095003},"random_sample_usage":{"cpus":1},'
    b'"cycles_per_instruction":1.71071,"sample_rate":1,'
    b'"cpu_usage_distribution":[0.0204756,0.0347219,0.0403137],"tail_cpu_usage_distribution":[]}\n'
)


def check(kernel: Any) -> None:
    """Parse a known line with ``kernel``; raise if anything differs from the expected columns."""
    from gpuclust.ingest.readers import _fast_usage

    got = _fast_usage.parse_with(kernel, _CHECK_LINE, 1)
    if got is None:
        raise RuntimeError("the native kernel refused a clean line")
    row = got.to_pylist()[0]
    import numpy as np

    def f32(x: float) -> float:
        return float(np.float32(x))

    want = {
        "start_time": 600000000, "end_time": 2**63 - 1, "collection_id": 477319772031, "instance_index": 3,
        "machine_id": 32434369549, "alloc_collection_id": None, "alloc_instance_index": None, "collection_type": 0,
        "average_usage": {"cpus": f32(0.0637732), "memory": f32(0.0095003)}, "maximum_usage": None,
        "random_sample_usage": {"cpus": 1.0, "memory": None}, "assigned_memory": None, "page_cache_memory": None,
        "cycles_per_instruction": f32(1.71071), "memory_accesses_per_instruction": None, "sample_rate": 1.0,
        "cpu_usage_distribution": [f32(0.0204756), f32(0.0347219), f32(0.0403137)],
        "tail_cpu_usage_distribution": [],
    }  # fmt: skip
    if row != want:
        raise RuntimeError(f"the native kernel parsed a known line wrongly: {row} != {want}")


#: The launcher of a background build: it starts the build in a new session and exits at once,
#: so the build is nobody's child here (it outlives the ingest that wanted it; no zombie, and no
#: "subprocess is still running" warning when this process exits before it).
_LAUNCHER = ("import os, subprocess, sys\n"
             "subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, "
             "stderr=subprocess.DEVNULL, start_new_session=True)\n"
             "os._exit(0)\n")


def build_in_background() -> bool:
    """Start a detached process that builds the library, unless one is building it, there is no
    C compiler, or a build failed here before (a ``.failed`` note beside it); True if started."""
    import shutil
    import subprocess

    if not enabled():
        return False
    path = library_path()
    if path is None or path.exists() or shutil.which(os.environ.get("CC", "cc")) is None:
        return False
    failed = path.with_name(path.name + ".failed")
    lock = path.with_name(path.name + ".lock")
    if failed.exists():
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if lock.exists() and time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
            lock.unlink()
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except OSError:
        return False  # building already, or the folder is not writable
    os.close(fd)
    try:
        launched = subprocess.run(
            [sys.executable, "-c", _LAUNCHER, sys.executable, "-m", "gpuclust.ingest.readers._fast_usage_native",
             str(path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
            env=dict(os.environ, GPUCLUST_NATIVE_KERNEL_LOCK=str(lock)),
        ).returncode == 0  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        launched = False
    if not launched:
        lock.unlink(missing_ok=True)
    return launched


def _main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else library_path()
    lock = os.environ.get("GPUCLUST_NATIVE_KERNEL_LOCK")
    try:
        build(path)
    except Exception as e:  # noted, so that every later run does not try again
        if path is not None:
            try:
                path.with_name(path.name + ".failed").write_text(f"{type(e).__name__}: {e}\n")
            except OSError:
                pass
        print(f"gpuclust: native kernel not built: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        if lock:
            Path(lock).unlink(missing_ok=True)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
