#!/usr/bin/env bash
# Everything a GPU machine must run for the GPU acceptance criteria, in one command, from the repo
# root.  Results land in bench/results/ (and are copied to $OUT when it is set, as on the device
# machine of this workplace).  Steps that fail are reported and the next step still runs.
#
#   bash bench/gpu_session.sh            # tests + kernel bandwidth + analyses at 1e6/1e7/1e8
#   SIZES=1e6,1e7 bash bench/gpu_session.sh
#
# Python packages missing on the machine (dask, distributed, dask-cuda, duckdb, psutil, ...) can be
# carried as wheels in .whl/ (see docs/gpu.md); they are installed into /tmp/site first.
set -u
cd "$(dirname "$0")/.."
SIZES=${SIZES:-1e6,1e7,1e8}
PY=${PYTHON:-python3}
status=0

if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
mkdir -p bench/results

step() {  # step NAME CMD...: run, log to bench/results/gpu_NAME.log, remember failures
    local name=$1; shift
    echo "=== $name: $*"
    "$@" 2>&1 | tee "bench/results/gpu_$name.log"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc"
    [ "$rc" -eq 0 ] || status=1
}

step device nvidia-smi
step tests env GPUCLUST_REQUIRE_GPU=1 $PY -m pytest -m gpu -q -p no:cacheprovider
step kernels $PY bench/kernels_bench.py --backend gpu
step mixture $PY bench/mixture_bench.py --gpu --save
step moments $PY bench/moments_bench.py --write
step analyses $PY bench/analyses_bench.py --sizes "$SIZES" --backends cpu,gpu --name analyses_gpu

if [ -n "${OUT:-}" ]; then  # one archive: the device tool brings back at most 8 files
    tar czf "$OUT/gpu_results.tgz" bench/results/gpu_*.log bench/results/kernels_gpu.* \
        bench/results/analyses_gpu.* bench/results/mixture_bench.* bench/results/moments.* 2>/dev/null
fi
exit $status
