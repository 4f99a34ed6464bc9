// Grouped sums into n_groups double accumulators, in three modes of one body:
//   grouped_sum_*:   out[codes[i]] += (double)values[i] for codes in [0, n_groups); NaN values and
//                    out-of-range codes add nothing (the backends' ops.grouped_sum);
//   bincount_*:      out[codes[i]] += (double)values[i], NaN included (numpy.bincount with
//                    weights; the caller sizes n_groups past the largest code);
//   bincount_count_*: out[codes[i]] += 1 (numpy.bincount without weights, counted in doubles:
//                    exact below 2^53 rows; `values` is not read).
// Same contention strategy as bucket_overlap.cu: warp aggregation of equal codes, then either a
// block-local shared-memory copy of the output (*_shared, small n_groups) or global atomics
// (*_global).  Each thread loads ROWS_IN_FLIGHT rows of its grid-stride loop before it adds any
// (accumulate.cuh).
#include "accumulate.cuh"

namespace gpuclust {

enum { SUM_SKIP_NAN = 0, SUM_ALL = 1, SUM_COUNT = 2 };

template <int MODE, typename C, typename T, bool RUNS = false>
__device__ __forceinline__ void grouped_sum_body(const C* __restrict__ codes, const T* __restrict__ values,
                                                 long long n, long long n_groups, double* __restrict__ acc) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long base = (long long)blockIdx.x * blockDim.x; base < n; base += stride * ROWS_IN_FLIGHT) {
        long long key[ROWS_IN_FLIGHT];
        double v[ROWS_IN_FLIGHT];
#pragma unroll
        for (int u = 0; u < ROWS_IN_FLIGHT; ++u) {  // every load first
            const long long i = base + u * stride + threadIdx.x;
            key[u] = -1;
            v[u] = 0.0;
            if (i < n) {
                const long long c = (long long)codes[i];
                double x = 1.0;
                if constexpr (MODE != SUM_COUNT) x = (double)values[i];
                if (c >= 0 && c < n_groups && (MODE != SUM_SKIP_NAN || !(x != x))) {
                    key[u] = c;
                    v[u] = x;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < ROWS_IN_FLIGHT; ++u) {
            if constexpr (RUNS) {
                warp_run_add(acc, key[u], v[u]);
            } else {
                warp_aggregated_add(acc, key[u], v[u]);
            }
        }
    }
}

template <int MODE, typename C, typename T, bool RUNS = false>
__device__ __forceinline__ void grouped_sum_shared_body(const C* __restrict__ codes, const T* __restrict__ values,
                                                        long long n, long long n_groups, double* __restrict__ out) {
    extern __shared__ double acc[];
    block_zero(acc, n_groups);
    grouped_sum_body<MODE, C, T, RUNS>(codes, values, n, n_groups, acc);
    block_flush(acc, out, n_groups);
}

template <typename C, typename T>
__global__ void grouped_sum_global(const C* __restrict__ codes, const T* __restrict__ values, long long n,
                                   long long n_groups, double* __restrict__ out) {
    grouped_sum_body<SUM_SKIP_NAN, C, T>(codes, values, n, n_groups, out);
}

template <typename C, typename T>
__global__ void grouped_sum_shared(const C* __restrict__ codes, const T* __restrict__ values, long long n,
                                   long long n_groups, double* __restrict__ out) {
    grouped_sum_shared_body<SUM_SKIP_NAN, C, T>(codes, values, n, n_groups, out);
}

// grouped_sum_* adding the runs of equal consecutive codes of a warp together (warp_run_add), not
// every lane of a code (warp_aggregated_add): for rows ordered by their code (backends/gpu.py:
// WARP_RUNS; bench/kernels_bench.py measures the two)
template <typename C, typename T>
__global__ void grouped_sum_runs_global(const C* __restrict__ codes, const T* __restrict__ values, long long n,
                                        long long n_groups, double* __restrict__ out) {
    grouped_sum_body<SUM_SKIP_NAN, C, T, true>(codes, values, n, n_groups, out);
}

template <typename C, typename T>
__global__ void grouped_sum_runs_shared(const C* __restrict__ codes, const T* __restrict__ values, long long n,
                                        long long n_groups, double* __restrict__ out) {
    grouped_sum_shared_body<SUM_SKIP_NAN, C, T, true>(codes, values, n, n_groups, out);
}

template <typename C, typename T>
__global__ void bincount_global(const C* __restrict__ codes, const T* __restrict__ values, long long n,
                                long long n_groups, double* __restrict__ out) {
    grouped_sum_body<SUM_ALL, C, T>(codes, values, n, n_groups, out);
}

template <typename C, typename T>
__global__ void bincount_shared(const C* __restrict__ codes, const T* __restrict__ values, long long n,
                                long long n_groups, double* __restrict__ out) {
    grouped_sum_shared_body<SUM_ALL, C, T>(codes, values, n, n_groups, out);
}

template <typename C, typename T>
__global__ void bincount_count_global(const C* __restrict__ codes, const T* __restrict__ values, long long n,
                                      long long n_groups, double* __restrict__ out) {
    grouped_sum_body<SUM_COUNT, C, T>(codes, values, n, n_groups, out);
}

template <typename C, typename T>
__global__ void bincount_count_shared(const C* __restrict__ codes, const T* __restrict__ values, long long n,
                                      long long n_groups, double* __restrict__ out) {
    grouped_sum_shared_body<SUM_COUNT, C, T>(codes, values, n, n_groups, out);
}

}  // namespace gpuclust
