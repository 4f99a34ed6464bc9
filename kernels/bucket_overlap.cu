// Interval-to-bucket sweep: out[group, bucket] += value * overlap_seconds([start, end), bucket).
//
// Buckets are [origin + b*width, origin + (b+1)*width) for b in [0, n_buckets); times are int64
// microseconds.  Each interval is clipped to the bucket range first (so the 2^63-1 sentinel does
// not overflow); the overlap with each bucket is computed exactly in integers and converted to
// seconds as (double)overlap_us / 1e6.  Intervals with end <= start, a group outside
// [0, n_groups) or a NaN value add nothing.  Accumulation is in double.
//
// One thread per interval, grid-stride; each warp walks the buckets of its 32 intervals in
// lock-step (trip count = the warp's longest interval), aggregating equal (group, bucket) keys
// across lanes before any atomic.  bucket_overlap_shared keeps a block-local copy of the whole
// output in shared memory (used when n_groups*n_buckets doubles fit); bucket_overlap_global adds
// straight into global memory.  Launch with blockDim.x a multiple of 32.
#include "accumulate.cuh"

namespace gpuclust {

template <typename T>
__device__ __forceinline__ void bucket_overlap_body(
    const long long* __restrict__ start, const long long* __restrict__ end,
    const T* __restrict__ value, const int* __restrict__ group, long long n, int n_groups,
    long long n_buckets, long long origin, long long width, double* __restrict__ acc) {
    const long long hi = origin + n_buckets * width;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long base = (long long)blockIdx.x * blockDim.x; base < n; base += stride) {
        const long long i = base + threadIdx.x;
        long long s = 0, e = 0, b0 = 0, count = 0;
        int g = -1;
        double v = 0.0;
        if (i < n) {
            s = start[i];
            e = end[i];
            g = group[i];
            v = (double)value[i];
            s = s < origin ? origin : (s > hi ? hi : s);
            e = e < origin ? origin : (e > hi ? hi : e);
            if (e > s && g >= 0 && g < n_groups && !(v != v)) {
                b0 = (s - origin) / width;
                count = (e - 1 - origin) / width - b0 + 1;
            }
        }
        const long long steps = warp_max(count);
        for (long long k = 0; k < steps; ++k) {
            long long key = -1;
            double c = 0.0;
            if (k < count) {
                const long long b = b0 + k;
                const long long bs = origin + b * width;
                const long long lo_ = s > bs ? s : bs;
                const long long hi_ = e < bs + width ? e : bs + width;
                key = (long long)g * n_buckets + b;
                c = v * ((double)(hi_ - lo_) / 1e6);
            }
            warp_aggregated_add(acc, key, c);
        }
    }
}

template <typename T>
__global__ void bucket_overlap_global(
    const long long* __restrict__ start, const long long* __restrict__ end,
    const T* __restrict__ value, const int* __restrict__ group, long long n, int n_groups,
    long long n_buckets, long long origin, long long width, double* __restrict__ out) {
    bucket_overlap_body<T>(start, end, value, group, n, n_groups, n_buckets, origin, width, out);
}

template <typename T>
__global__ void bucket_overlap_shared(
    const long long* __restrict__ start, const long long* __restrict__ end,
    const T* __restrict__ value, const int* __restrict__ group, long long n, int n_groups,
    long long n_buckets, long long origin, long long width, double* __restrict__ out) {
    extern __shared__ double acc[];
    const long long cells = (long long)n_groups * n_buckets;
    block_zero(acc, cells);
    bucket_overlap_body<T>(start, end, value, group, n, n_groups, n_buckets, origin, width, acc);
    block_flush(acc, out, cells);
}

}  // namespace gpuclust
