// Shared device helpers for gpuclust's accumulation kernels.
//
// Contention strategy (see docs/developer/kernels.md):
//   * Every lane of a warp calls these helpers in lock-step (loops are written with warp-uniform
//     trip counts, inactive lanes pass key = -1).
//   * Lanes with the same key are found with __match_any_sync (sm_70+); the group leader sums
//     its peers' values (one warp shuffle per lane that shares its key, fixed lane order) and
//     issues ONE atomicAdd.  When all
//     32 lanes hit the same (group, bucket) cell this turns 32 serialised atomics into one.
//   * The "shared" kernels add the warp sums into a block-local copy of the output in shared
//     memory and flush it to global memory once per block, so global atomics per cell are at
//     most one per block.
// All accumulation is in double.  No standard headers: this file is compiled by NVRTC.
#ifndef GPUCLUST_ACCUMULATE_CUH
#define GPUCLUST_ACCUMULATE_CUH

namespace gpuclust {

// Rows each thread loads per step of a grid-stride loop before it aggregates any of them (rows
// base + u * stride + threadIdx.x for u < ROWS_IN_FLIGHT): a warp keeps this many loads of each
// input in flight instead of one, so the memory latency is hidden with the grid's 8 blocks per SM.
// Trip counts stay block-uniform; a warp still aggregates 32 consecutive rows at a time.
enum { ROWS_IN_FLIGHT = 4 };  // (an enumerator: no unused-variable warning where a file does not use it)

__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }

// The lanes of the warp whose key equals this lane's key (a bit mask), and whether this lane is
// their leader (the lowest).  All lanes must call.
__device__ __forceinline__ unsigned warp_peers(long long key, bool* is_leader) {
    const unsigned peers = __match_any_sync(0xffffffffu, key);
    *is_leader = (lane_id() == __ffs(peers) - 1);
    return peers;
}

// Sum of `v` over the lanes in `peers` (from warp_peers), added in lane order; valid in every lane
// of the group.  All lanes must call.  Only the lanes whose key another lane shares are broadcast
// (one shuffle each, the same warp-uniform mask in every lane): a warp of distinct keys, the
// common case of many groups, takes no shuffle; one key in the whole warp takes 32.  A lane alone
// with its key returns its own value.  The same sums as adding all 32 lanes' values masked by
// `peers` in lane order (the version before 2026-11-27, which took 32 shuffles always), except that
// a lone -0.0 stays -0.0 (it was 0.0 + -0.0 = +0.0), which adds the same to any accumulator.
__device__ __forceinline__ double warp_peer_sum(unsigned peers, double v) {
    const unsigned full = 0xffffffffu;
    unsigned shared = __ballot_sync(full, (peers & (peers - 1u)) != 0u);
    double s = ((shared >> lane_id()) & 1u) ? 0.0 : v;
    while (shared != 0u) {
        const int j = __ffs(shared) - 1;
        shared &= shared - 1u;
        const double vj = __shfl_sync(full, v, j);
        if ((peers >> j) & 1u) s += vj;
    }
    return s;
}

// Sum of `v` over the lanes of the warp whose key equals this lane's key; valid in the leader
// (lowest lane) of each key group, which is reported through `is_leader`.
__device__ __forceinline__ double warp_key_sum(long long key, double v, bool* is_leader) {
    return warp_peer_sum(warp_peers(key, is_leader), v);
}

// Warp-aggregated atomic add of `v` into out[key]; key < 0 means "this lane adds nothing".
// Must be called by all 32 lanes of the warp.
__device__ __forceinline__ void warp_aggregated_add(double* out, long long key, double v) {
    bool leader;
    const double s = warp_key_sum(key, v, &leader);
    if (leader && key >= 0) atomicAdd(out + key, s);
}

// The sum of `v` over this lane's run: the lanes before it, in lane order, whose keys equal its own
// with no other key between (consecutive rows of one key, as an instance-ordered layout gives),
// valid in the run's last lane, reported through `is_tail`.  A segmented inclusive scan of five
// shuffles (Hillis-Steele within the run) and no __match_any_sync: where equal keys come in runs
// it aggregates as warp_key_sum does at a fixed cost; scattered equal keys are not aggregated.
// All lanes must call.
__device__ __forceinline__ double warp_run_sum(long long key, double v, bool* is_tail) {
    const unsigned full = 0xffffffffu;
    const int lane = lane_id();
    const long long prev = __shfl_up_sync(full, key, 1);
    const long long next = __shfl_down_sync(full, key, 1);
    *is_tail = lane == 31 || next != key;
    const unsigned heads = __ballot_sync(full, lane == 0 || prev != key);
    const int start = 31 - __clz(heads & (full >> (31 - lane)));  // the run's first lane
    double s = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const double t = __shfl_up_sync(full, s, d);
        if (lane - d >= start) s += t;
    }
    return s;
}

// Run-aggregated atomic add of `v` into out[key] (warp_run_sum); key < 0: this lane adds nothing.
// Must be called by all 32 lanes of the warp.
__device__ __forceinline__ void warp_run_add(double* out, long long key, double v) {
    bool tail;
    const double s = warp_run_sum(key, v, &tail);
    if (tail && key >= 0) atomicAdd(out + key, s);
}

// Maximum of a non-negative long long over the warp (all lanes must call).
__device__ __forceinline__ long long warp_max(long long x) {
    const unsigned full = 0xffffffffu;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const long long y = __shfl_xor_sync(full, x, off);
        x = y > x ? y : x;
    }
    return x;
}

// Zero a shared-memory accumulator of `cells` doubles (whole block).
__device__ __forceinline__ void block_zero(double* acc, long long cells) {
    for (long long c = threadIdx.x; c < cells; c += blockDim.x) acc[c] = 0.0;
    __syncthreads();
}

// Flush a shared-memory accumulator into global memory, one atomic per non-zero cell.
__device__ __forceinline__ void block_flush(const double* acc, double* out, long long cells) {
    __syncthreads();
    for (long long c = threadIdx.x; c < cells; c += blockDim.x) {
        const double v = acc[c];
        if (v != 0.0) atomicAdd(out + c, v);
    }
}

}  // namespace gpuclust

#endif  // GPUCLUST_ACCUMULATE_CUH
