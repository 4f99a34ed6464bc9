#!/usr/bin/env bash
# The GPU acceptance runs, as steps sized to a device session: 15 minutes of device time in all
# (machine start included), 10 minutes per command, at most 8 files back from $OUT.  From the
# repo root:
#
#   bash bench/gpu_session.sh STEP [STEP ...]          # run the steps in order
#   bash bench/gpu_session.sh --plan STEP [STEP ...]   # print each step's limit and their sum; run nothing
#
# Steps (each has its own limit, below; a failing step is reported and the next one still runs):
#   env        nvidia-smi, driver, CUDA, CuPy, Python package versions, commit        (~10 s)
#   tests      GPUCLUST_REQUIRE_GPU=1 pytest -m gpu -x, $JOBS workers (default 8)     (~1.5-2 min)
#   tests-all  the same without -x: every GPU test runs                                (~3.5 min on 4 workers)
#   sanitize   compute-sanitizer memcheck + racecheck: kernel ops, moments, tiled mixture (~1 min)
#   kernels    bench/kernels_bench.py: each op's bandwidth against the copy bandwidth (~1-1.5 min)
#   study      bench/study_bench.py at the last of $SIZES: resident data, gpu vs cpu vs DuckDB (~3 min)
#   mixture    bench/mixture_bench.py --gpu                                            (~1-2 min)
#   moments    bench/moments_bench.py                                                  (~1 min)
#   profile    bench/gpu_profile.py: transfer and decode ceilings, cProfile per analysis (~1.5 min)
#   analyses   bench/analyses_bench.py at $SIZES (default 1e6,1e7), cpu and gpu        (~4.5 min)
#
# A call's timeout_s must be at least the --plan sum of its steps (docs/user/gpu.md gives the calls).
# Logs go straight to $OUT (when set; else bench/results/) as gpu_<step>.log, so whatever a step
# wrote comes back even when the call is cut off; result tables (json/md) are copied there too.
# Python packages missing on the machine (dask, distributed, dask-cuda, duckdb, ...) travel as
# wheels in .whl/ (docs/user/gpu.md lists them); they are installed into /tmp/site first, never over
# the image's own CuPy.
set -u
cd "$(dirname "$0")/.."
export PY=${PYTHON:-python3}
SIZES=${SIZES:-1e6,1e7}
LOGS=${OUT:-bench/results}
mkdir -p "$LOGS" bench/results
status=0
JOBS=${JOBS:-8}

# the mixture kernels under the sanitizers: the tiled sweep against the per-group one (every kernel of
# mixture.cu runs in it)
SANITIZE_MIXTURE=(tests/mixture/test_mixture_gpu.py::test_tiled_sweep_agrees_with_the_per_group_sweep)

# limit in seconds of each step (the sanitize step is two runs: memcheck 90 s and racecheck 60 s)
declare -A LIMIT=([env]=60 [tests]=240 [tests-all]=240 [sanitize]=150 [kernels]=150 [study]=300
                  [mixture]=400 [moments]=400 [profile]=300 [analyses]=560)

if [ "${1:-}" = "--plan" ]; then
    shift
    total=0
    for step in "$@"; do
        [ -n "${LIMIT[$step]:-}" ] || { echo "unknown step $step"; exit 2; }
        echo "$step ${LIMIT[$step]}"
        total=$((total + LIMIT[$step]))
    done
    echo "total $total"
    exit 0
fi

if ls .whl/*.whl >/dev/null 2>&1 && [ ! -e /tmp/site/.gpuclust-installed ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && touch /tmp/site/.gpuclust-installed
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
export GPUCLUST_REQUIRE_GPU=1

run() {  # run NAME TIMEOUT CMD...: log to $LOGS/gpu_NAME.log, remember failures
    local name=$1 limit=$2; shift 2
    echo "=== $name ($(date -u +%T), limit ${limit}s): $*" | tee -a "$LOGS/gpu_$name.log"
    if [ "$(type -t "$1")" = function ]; then
        timeout -k 10 "$limit" bash -c "$(declare -f "$1"); $*" >>"$LOGS/gpu_$name.log" 2>&1
    else
        timeout -k 10 "$limit" "$@" >>"$LOGS/gpu_$name.log" 2>&1
    fi
    local rc=$?
    echo "=== $name: exit $rc ($(date -u +%T))" | tee -a "$LOGS/gpu_$name.log"
    tail -n 15 "$LOGS/gpu_$name.log"
    [ "$rc" -eq 0 ] || status=1
}

keep() {  # copy result tables to $LOGS (no-op without $OUT)
    [ -n "${OUT:-}" ] || return 0
    for f in "$@"; do [ -f "$f" ] && cp "$f" "$OUT/"; done
    return 0
}

env_report() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    nvidia-smi | head -4
    nvcc --version | tail -2
    command -v compute-sanitizer
    git log -1 --format='commit %H %s' 2>/dev/null || echo "commit: (no git)"
    $PY - <<'EOF'
import importlib, platform, sys
print("python", sys.version.split()[0], platform.machine())
for m in ("numpy", "pyarrow", "pandas", "cupy", "dask", "distributed", "dask_cuda", "duckdb", "numba", "psutil", "hypothesis", "pytest"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:
        print(m, "MISSING:", e)
import warnings
warnings.simplefilter("error")
from gpuclust.backends import gpu
cp = gpu.require()
p = cp.cuda.runtime.getDeviceProperties(0)
print("device", p["name"].decode(), "cc", p["major"], p["minor"], "SMs", p["multiProcessorCount"],
      "L2", p["l2CacheSize"], "mem", p["totalGlobalMem"])
print("cuda runtime", cp.cuda.runtime.runtimeGetVersion(), "driver", cp.cuda.runtime.driverGetVersion())
EOF
}

for step in "$@"; do
    case $step in
        env) run env "${LIMIT[env]}" env_report ;;
        tests) run tests "${LIMIT[tests]}" $PY -m pytest -m gpu -q -x -n "$JOBS" --timeout 180 -p no:cacheprovider ;;
        tests-all) run tests-all "${LIMIT[tests-all]}" $PY -m pytest -m gpu -q -n "$JOBS" --timeout 180 -p no:cacheprovider ;;
        sanitize)
            run memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 9 --target-processes all \
                $PY -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_ops.py tests/moments/test_moments_gpu.py \
                "${SANITIZE_MIXTURE[@]}"
            # CuPy's own cupy_nonzero_kernel_incomplete_scan reports 2 racecheck warnings (640 hazards) under
            # CuPy 14.2 (H200, 2026-11-27): not our kernels, so excluded by name
            run racecheck 60 compute-sanitizer --tool racecheck --kernel-name-exclude kns=cupy_nonzero --error-exitcode 9 \
                --target-processes all \
                $PY -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_ops.py "${SANITIZE_MIXTURE[@]}" ;;
        kernels) run kernels "${LIMIT[kernels]}" $PY bench/kernels_bench.py --backend gpu
                 keep bench/results/kernels_gpu.json bench/results/kernels_gpu.md ;;
        study) run study "${LIMIT[study]}" $PY bench/study_bench.py --sizes "${SIZES##*,}" --backends gpu,cpu,duckdb --repeat 1 --name study_gpu
               keep bench/results/study_gpu.json bench/results/study_gpu.md ;;
        mixture) run mixture "${LIMIT[mixture]}" $PY bench/mixture_bench.py --gpu --save
                 keep bench/results/mixture_bench.json bench/results/mixture_bench.md ;;
        moments) run moments "${LIMIT[moments]}" $PY bench/moments_bench.py --write
                 keep bench/results/moments.json bench/results/moments.md ;;
        profile) run profile "${LIMIT[profile]}" $PY bench/gpu_profile.py --windows "${SIZES##*,}" ;;
        analyses) run analyses "${LIMIT[analyses]}" $PY bench/analyses_bench.py --sizes "$SIZES" --backends cpu,gpu --name analyses_gpu
                  keep bench/results/analyses_gpu.json bench/results/analyses_gpu.md ;;
        *) echo "unknown step $step"; status=2 ;;
    esac
done
exit $status
