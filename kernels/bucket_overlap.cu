// Interval-to-bucket sweep: out[j, group, bucket] += value[j, i] * overlap_seconds([start, end), bucket)
// for k value series j over the same intervals i (k = 1: the plain 1-D sweep).
//
// Buckets are [origin + b*width, origin + (b+1)*width) for b in [0, n_buckets); times are int64
// microseconds.  Each interval is clipped to the bucket range first (so the 2^63-1 sentinel does
// not overflow); the overlap with each bucket is computed exactly in integers and converted to
// seconds as (double)overlap_us / 1e6.  Intervals with end <= start or a group outside
// [0, n_groups) add nothing; a NaN value adds nothing to its own series.  Accumulation is in
// double.  `value` is (k, n), row-major.
//
// One thread per interval, grid-stride; each warp walks the buckets of its 32 intervals in
// lock-step (trip count = the warp's longest interval).  At each step the lanes with equal
// (group, bucket) keys are found once (one __match_any_sync) and, for every series, summed
// across the warp before one atomic per key: so the k series cost one launch, one read of the
// intervals and one key match per step, not k.  The bucket of a step is b0 + step: the two
// int64 divisions are per interval, outside the bucket loop.  bucket_overlap_shared keeps a
// block-local copy of the whole (k, n_groups, n_buckets) output in shared memory (used when it
// fits); bucket_overlap_global adds straight into global memory.  Launch with blockDim.x a
// multiple of 32.
#include "accumulate.cuh"

namespace gpuclust {

template <typename T>
__device__ __forceinline__ void bucket_overlap_body(
    const long long* __restrict__ start, const long long* __restrict__ end,
    const T* __restrict__ value, int k, const int* __restrict__ group, long long n, int n_groups,
    long long n_buckets, long long origin, long long width, double* __restrict__ acc) {
    const long long hi = origin + n_buckets * width;
    const long long cells = (long long)n_groups * n_buckets;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long base = (long long)blockIdx.x * blockDim.x; base < n; base += stride) {
        const long long i = base + threadIdx.x;
        long long s = 0, e = 0, b0 = 0, count = 0;
        int g = -1;
        if (i < n) {
            s = start[i];
            e = end[i];
            g = group[i];
            s = s < origin ? origin : (s > hi ? hi : s);
            e = e < origin ? origin : (e > hi ? hi : e);
            if (e > s && g >= 0 && g < n_groups) {
                b0 = (s - origin) / width;
                count = (e - 1 - origin) / width - b0 + 1;
            }
        }
        const long long steps = warp_max(count);
        for (long long step = 0; step < steps; ++step) {
            long long key = -1;
            double seconds = 0.0;
            if (step < count) {
                const long long b = b0 + step;
                const long long bs = origin + b * width;
                const long long lo_ = s > bs ? s : bs;
                const long long hi_ = e < bs + width ? e : bs + width;
                key = (long long)g * n_buckets + b;
                seconds = (double)(hi_ - lo_) / 1e6;
            }
            bool leader;
            const unsigned peers = warp_peers(key, &leader);
            for (int j = 0; j < k; ++j) {
                double c = 0.0;
                if (key >= 0) {
                    const double v = (double)value[(long long)j * n + i];
                    if (!(v != v)) c = v * seconds;  // a NaN adds nothing to its series
                }
                const double sum = warp_peer_sum(peers, c);
                if (leader && key >= 0 && sum != 0.0) atomicAdd(acc + (long long)j * cells + key, sum);
            }
        }
    }
}

template <typename T>
__global__ void bucket_overlap_global(
    const long long* __restrict__ start, const long long* __restrict__ end,
    const T* __restrict__ value, int k, const int* __restrict__ group, long long n, int n_groups,
    long long n_buckets, long long origin, long long width, double* __restrict__ out) {
    bucket_overlap_body<T>(start, end, value, k, group, n, n_groups, n_buckets, origin, width, out);
}

template <typename T>
__global__ void bucket_overlap_shared(
    const long long* __restrict__ start, const long long* __restrict__ end,
    const T* __restrict__ value, int k, const int* __restrict__ group, long long n, int n_groups,
    long long n_buckets, long long origin, long long width, double* __restrict__ out) {
    extern __shared__ double acc[];
    const long long cells = (long long)k * n_groups * n_buckets;
    block_zero(acc, cells);
    bucket_overlap_body<T>(start, end, value, k, group, n, n_groups, n_buckets, origin, width, acc);
    block_flush(acc, out, cells);
}

}  // namespace gpuclust
