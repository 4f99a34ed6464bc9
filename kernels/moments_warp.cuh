// Warp helpers for the grouped co-moment kernels (grouped_moments.cu).
//
// A warp reduces one row per lane.  Lanes are grouped by key with __match_any_sync (sm_70+) ONCE
// per step; every accumulated quantity is then summed over the lane's peers and the group leader
// (lowest lane) issues one atomicAdd per quantity.  When the whole warp has one key (sorted input,
// or one dominant group: the "many rows hit one group" case) the sum is a 5-step xor butterfly;
// otherwise a fixed-order shuffle loop over the lanes whose key another lane shares (none when
// every lane's key is its own: many groups).  All lanes must call these helpers together.
// No standard headers: this file is compiled by NVRTC.
#ifndef GPUCLUST_MOMENTS_WARP_CUH
#define GPUCLUST_MOMENTS_WARP_CUH

namespace gpuclust {

struct WarpPeers {
    unsigned peers;   // lanes sharing this lane's key
    bool uniform;     // all 32 lanes share one key
    bool leader;      // lowest lane of this lane's key group
};

__device__ __forceinline__ WarpPeers warp_peers(long long key) {
    const unsigned full = 0xffffffffu;
    WarpPeers p;
    p.peers = __match_any_sync(full, key);
    p.uniform = __all_sync(full, p.peers == full) != 0;
    p.leader = (int)(threadIdx.x & 31) == __ffs(p.peers) - 1;
    return p;
}

// Replace each v[k] by its sum over this lane's peers (valid in the leader; in the uniform case in
// every lane).  Non-uniform case: one pass over the shared lanes, all K quantities per pass
// (the lane loop is deliberately not unrolled: it keeps the code small and compile times short).
template <int K>
__device__ __forceinline__ void peer_sums(const WarpPeers& p, double* v) {
    const unsigned full = 0xffffffffu;
    if (p.uniform) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) v[k] += __shfl_xor_sync(full, v[k], off);
        }
        return;
    }
    // only the lanes whose key another lane shares are broadcast (warp-uniform mask, lane order);
    // a lane alone with its key keeps its own values (as accumulate.cuh's warp_peer_sum)
    unsigned shared = __ballot_sync(full, (p.peers & (p.peers - 1u)) != 0u);
    const bool alone = ((shared >> (threadIdx.x & 31)) & 1u) == 0u;
    double s[K];
#pragma unroll
    for (int k = 0; k < K; ++k) s[k] = alone ? v[k] : 0.0;
#pragma unroll 1
    while (shared != 0u) {
        const int j = __ffs(shared) - 1;
        shared &= shared - 1u;
        const bool take = (p.peers >> j) & 1u;
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const double vj = __shfl_sync(full, v[k], j);
            if (take) s[k] += vj;
        }
    }
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = s[k];
}

// True for finite doubles (false for NaN and +-inf) without <cmath>: inf - inf and NaN - NaN are NaN.
__device__ __forceinline__ bool is_finite(double v) { return v - v == 0.0; }

}  // namespace gpuclust

#endif  // GPUCLUST_MOMENTS_WARP_CUH
