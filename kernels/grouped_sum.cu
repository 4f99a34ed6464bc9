// Grouped sum: out[codes[i]] += (double)values[i] for codes in [0, n_groups); NaN values and
// out-of-range codes add nothing.  Same contention strategy as bucket_overlap.cu: warp
// aggregation of equal codes, then either a block-local shared-memory copy of the output
// (grouped_sum_shared, small n_groups) or global atomics (grouped_sum_global).  Each thread loads
// ROWS_IN_FLIGHT rows of its grid-stride loop before it adds any (accumulate.cuh).
#include "accumulate.cuh"

namespace gpuclust {

template <typename C, typename T>
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
                const double x = (double)values[i];
                if (c >= 0 && c < n_groups && !(x != x)) {
                    key[u] = c;
                    v[u] = x;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < ROWS_IN_FLIGHT; ++u) warp_aggregated_add(acc, key[u], v[u]);
    }
}

template <typename C, typename T>
__global__ void grouped_sum_global(const C* __restrict__ codes, const T* __restrict__ values, long long n,
                                   long long n_groups, double* __restrict__ out) {
    grouped_sum_body<C, T>(codes, values, n, n_groups, out);
}

template <typename C, typename T>
__global__ void grouped_sum_shared(const C* __restrict__ codes, const T* __restrict__ values, long long n,
                                   long long n_groups, double* __restrict__ out) {
    extern __shared__ double acc[];
    block_zero(acc, n_groups);
    grouped_sum_body<C, T>(codes, values, n, n_groups, acc);
    block_flush(acc, out, n_groups);
}

}  // namespace gpuclust
