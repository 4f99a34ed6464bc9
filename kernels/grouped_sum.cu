// Grouped sum: out[codes[i]] += (double)values[i] for codes in [0, n_groups); NaN values and
// out-of-range codes add nothing.  Same contention strategy as bucket_overlap.cu: warp
// aggregation of equal codes, then either a block-local shared-memory copy of the output
// (grouped_sum_shared, small n_groups) or global atomics (grouped_sum_global).
#include "accumulate.cuh"

namespace gpuclust {

template <typename C, typename T>
__device__ __forceinline__ void grouped_sum_body(const C* __restrict__ codes, const T* __restrict__ values,
                                                 long long n, long long n_groups, double* __restrict__ acc) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long base = (long long)blockIdx.x * blockDim.x; base < n; base += stride) {
        const long long i = base + threadIdx.x;
        long long key = -1;
        double v = 0.0;
        if (i < n) {
            const long long c = (long long)codes[i];
            v = (double)values[i];
            if (c >= 0 && c < n_groups && !(v != v)) key = c;
        }
        warp_aggregated_add(acc, key, key >= 0 ? v : 0.0);
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
