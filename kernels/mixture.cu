// Mixtures of per-window piecewise-linear CPU distributions (the usage-distribution analysis).
//
// A window's percentile vector q[0..nl) at the ascending levels src[0..nl) (src[0] = 0,
// src[nl-1] = 1) is the CDF through (q_k, src_k); segment k carries mass m = v * (src[k+1] - src[k])
// (v: the window's weight normalised by its group total).  A segment narrower than
// narrow_rel * max(|q_k|, |q_k+1|) (flat steps included) is a point mass at q_k, else a density
// d = m / (q_k+1 - q_k).  Breakpoint k of a window is an event at x = q_k carrying the change of
// the slope (+d_k - d_k-1, as a TwoSum pair) and a jump (point masses).
//
// Kernels (NumPy twins in gpuclust/backends/mixture_cpu.py; wrappers in mixture_gpu.py):
//   mixture_repair<T>        one thread per row: running-max repair, NULL (non-finite) rows.
//   mixture_window_means<T>  one thread per row: sum_k half_dl[k] * (q_k + q_k+1).
//   mixture_sweep<T>         one block per group (grid-stride over groups), events already sorted
//                            by (group, x) in `ev` (ids i * nl + k into q), group g owning
//                            ev[row_start[g] .. row_start[g+1]): tiles of blockDim events,
//                            double-double block scans give the slope after each event and
//                            F(x_j) = sum (jump + slope_{j-1} * (x_j - x_{j-1})), then a max-scan
//                            keeps F monotone.  Writes x, slope and F per sorted event.
//   mixture_tile_*<T>        the same sweep with a group's tiles spread over all blocks (few,
//                            large groups); see "The tiled sweep" below.
//   mixture_invert<T>        one thread per (group, level): binary search for the first event
//                            with F >= p*T - snap_rel*T (T = F at the group's last event), then
//                            one linear inversion; p >= 1 gives the last event (support max),
//                            groups without events give NaN.
// Launch with blockDim.x a multiple of 32, at most 1024.  All arithmetic is in double.
#include "mixture_dd.cuh"

namespace gpuclust {

__device__ __forceinline__ double mixture_nan() { return __longlong_as_double(0x7ff8000000000000LL); }

__device__ __forceinline__ bool mixture_finite(double x) { return __dsub_rn(x, x) == 0.0; }

template <typename T>
__global__ void mixture_repair(const T* __restrict__ q, long long n, int nl, double* __restrict__ out,
                               bool* __restrict__ repaired, bool* __restrict__ null_mask) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x; r < n; r += stride) {
        const T* qr = q + r * nl;
        double* o = out + r * nl;
        bool nul = false, rep = false;
        double m = 0.0;
        for (int k = 0; k < nl; ++k) {
            const double x = (double)qr[k];
            if (!mixture_finite(x)) nul = true;
            m = (k == 0 || x > m) ? x : m;
            if (m != x) rep = true;
            o[k] = m;
        }
        if (nul) {
            for (int k = 0; k < nl; ++k) o[k] = mixture_nan();
            rep = false;
        }
        repaired[r] = rep;
        null_mask[r] = nul;
    }
}

template <typename T>
__global__ void mixture_window_means(const T* __restrict__ q, const double* __restrict__ half_dl, long long n,
                                     int nl, double* __restrict__ out) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x; r < n; r += stride) {
        const T* qr = q + r * nl;
        double acc = 0.0;
        for (int k = 0; k + 1 < nl; ++k)
            acc = __dadd_rn(acc, __dmul_rn(half_dl[k], __dadd_rn((double)qr[k], (double)qr[k + 1])));
        out[r] = acc;
    }
}

// Segment k of a window (0 <= k < nl-1): density (0 for a point mass) and point mass (0 for a
// density segment).  Identical arithmetic to mixture_cpu._window_payload.
template <typename T>
__device__ __forceinline__ void mixture_segment(const T* qi, const double* src, double v, int k, double narrow_rel,
                                                double* density, double* point_mass) {
    const double a = (double)qi[k], b = (double)qi[k + 1];
    const double m = __dmul_rn(v, __dsub_rn(src[k + 1], src[k]));
    const double dq = __dsub_rn(b, a);
    const double aa = a < 0 ? -a : a, ab = b < 0 ? -b : b;
    const bool narrow = dq <= __dmul_rn(narrow_rel, aa > ab ? aa : ab);
    *density = narrow ? 0.0 : __ddiv_rn(m, dq);
    *point_mass = narrow ? m : 0.0;
}

// Sorted event j (id e = ev[j] = i * nl + k): its value x = q_ik, the density it starts (plus) and
// ends (minus), and the point mass it starts (jump).  Shared by the per-group and tiled sweeps,
// so both compute every event's terms with the same arithmetic.
template <typename T>
__device__ __forceinline__ void mixture_event(const T* __restrict__ q, const double* __restrict__ src,
                                              const double* __restrict__ v, const long long* __restrict__ ev,
                                              long long j, int nl, double narrow_rel, double* x, double* jump,
                                              double* plus, double* minus) {
    const long long e = ev[j];
    const long long i = e / nl;
    const int k = (int)(e - i * nl);
    const T* qi = q + i * nl;
    const double vi = v[i];
    *x = (double)qi[k];
    double d, pm;
    if (k < nl - 1) {
        mixture_segment<T>(qi, src, vi, k, narrow_rel, &d, &pm);
        *plus = d;
        *jump = pm;
    }
    if (k > 0) {
        mixture_segment<T>(qi, src, vi, k - 1, narrow_rel, &d, &pm);
        *minus = d;
    }
}

// One tile's slope and F increments, the step both sweeps share.  The slope after this thread's
// event is `carry` plus the block scan of the slope deltas (+d_k - d_k-1, a TwoSum pair), clamped at
// 0; F's increment is the event's jump plus the slope before it times the step from the event
// before (x_prev, s_prev: the block's previous thread, or first_x / first_s for thread 0; no step
// where `has_prev` is false).  Writes the slope to *s_out and the deltas' block total to
// *delta_total; returns the increment.  Every thread of the block must call it.
__device__ __forceinline__ double mixture_slope_inc(double x, double jump, double plus, double minus, bool has_prev,
                                                    dd2 carry, double first_x, double first_s, dd2* scratch_dd,
                                                    double* warp_last_x, double* warp_last_s, double* s_out,
                                                    dd2* delta_total) {
    const int lane = threadIdx.x & 31;
    const int wid = threadIdx.x >> 5;
    const dd2 s_incl = dd_add(carry, block_scan_dd(dd_two_sum(plus, -minus), scratch_dd, delta_total));
    double s = dd_value(s_incl);
    s = s > 0.0 ? s : 0.0;
    double x_prev = __shfl_up_sync(0xffffffffu, x, 1);
    double s_prev = __shfl_up_sync(0xffffffffu, s, 1);
    if (lane == 31) {
        warp_last_x[wid] = x;
        warp_last_s[wid] = s;
    }
    __syncthreads();
    if (lane == 0) {
        x_prev = wid > 0 ? warp_last_x[wid - 1] : first_x;
        s_prev = wid > 0 ? warp_last_s[wid - 1] : first_s;
    }
    const double dx = has_prev ? __dsub_rn(x, x_prev) : 0.0;
    *s_out = s;
    return __dadd_rn(jump, __dmul_rn(s_prev, dx));
}

// F at this thread's event before the running maximum of the tiles before: `carry` plus the block
// scan of the increments, then the block's max-scan.  The increments' block total goes to
// *inc_total, the block's maximum F to *fmax_total.  Every thread of the block must call it.
__device__ __forceinline__ double mixture_cdf_step(double inc, dd2 carry, dd2* scratch_dd, double* scratch_max,
                                                   dd2* inc_total, double* fmax_total) {
    const dd2 f_incl = dd_add(carry, block_scan_dd(dd_make(inc, 0.0), scratch_dd, inc_total));
    return block_scan_max(dd_value(f_incl), scratch_max, fmax_total);
}

template <typename T>
__global__ void mixture_sweep(const T* __restrict__ q, const double* __restrict__ src, const double* __restrict__ v,
                              const long long* __restrict__ ev, const long long* __restrict__ row_start,
                              long long n_groups, int nl, double narrow_rel, double* __restrict__ xs,
                              double* __restrict__ slope, double* __restrict__ cdf) {
    __shared__ dd2 scratch_dd[32];
    __shared__ double scratch_max[32];
    __shared__ double warp_last_x[32];
    __shared__ double warp_last_s[32];
    __shared__ double carry_x, carry_s, carry_fmax;
    __shared__ dd2 carry_slope, carry_f;
    for (long long g = blockIdx.x; g < n_groups; g += gridDim.x) {
        const long long s0 = row_start[g], s1 = row_start[g + 1];
        if (threadIdx.x == 0) {
            carry_x = 0.0;
            carry_s = 0.0;
            carry_fmax = 0.0;
            carry_slope = dd_make(0.0, 0.0);
            carry_f = dd_make(0.0, 0.0);
        }
        __syncthreads();
        for (long long base = s0; base < s1; base += blockDim.x) {
            const long long j = base + threadIdx.x;
            const bool act = j < s1;
            double x = 0.0, jump = 0.0, plus = 0.0, minus = 0.0;
            if (act) mixture_event<T>(q, src, v, ev, j, nl, narrow_rel, &x, &jump, &plus, &minus);
            double s;
            dd2 tile_total, f_total;
            const double inc = mixture_slope_inc(x, jump, plus, minus, act && j > s0, carry_slope, carry_x, carry_s,
                                                 scratch_dd, warp_last_x, warp_last_s, &s, &tile_total);
            double fmax_total;
            double f = mixture_cdf_step(inc, carry_f, scratch_dd, scratch_max, &f_total, &fmax_total);
            f = f > carry_fmax ? f : carry_fmax;
            if (act) {
                xs[j] = x;
                slope[j] = s;
                cdf[j] = f;
            }
            __syncthreads();
            if (threadIdx.x == blockDim.x - 1) {
                carry_x = x;
                carry_s = s;
                carry_slope = dd_add(carry_slope, tile_total);
                carry_f = dd_add(carry_f, f_total);
                carry_fmax = f;
            }
            __syncthreads();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The tiled sweep: x, slope and F as mixture_sweep computes them, with the tiles of a group
// spread over every block instead of walked by one.  For few, large groups (by=tier: <= 6,
// by=cell: 1), where one block per group would leave all but a handful of SMs idle.
//
// Tile t covers sorted events [tile_start[t], tile_end[t]) of one group (at most blockDim.x of
// them; a group's tiles start at its first event, tile_s0[t], and are full but the last); group g
// owns tiles [tile_first[g], tile_first[g+1]).  mixture_sweep carries the slope sum, F and max F
// from tile to tile; here each carry is a separate pass.  Every per-tile step is mixture_sweep's
// block scan over the same thread layout; only the carries associate differently (a block scan
// of the tile totals, not a running sum), so the two differ by double-double rounding
// (~1e-30 relative) before the final rounding to double:
//   1. mixture_tile_slope<T>      per tile: the slope-delta block scan's total and the inclusive
//                                 value at the last thread (the tile's last event)
//   2. mixture_tile_carry<TileSum> per group: each tile's slope carry (the sum of the tiles
//                                 before it)
//   3. mixture_tile_slopes<T>     per tile: x and slope of each event, F's increment (in cdf), and
//                                 the increments' block total; the event before a tile's first
//                                 is the previous tile's last (its x read again, its slope from
//                                 that tile's carry and last inclusive value)
//   4. mixture_tile_carry<TileSum> per group: each tile's F carry
//   5. mixture_tile_cdf<T>        per tile: F = carry + block scan of the increments, the block
//                                 max-scan, and the tile's maximum
//   6. mixture_tile_carry<TileMax> per group: the max of F over the tiles before each tile
//                                 (exact: max does not round)
//   7. mixture_tile_max<T>        per tile: F = max(F, that carry)
// The per-tile kernels run one tile per block (grid-stride over tiles); the carries one block per
// group.  Tile sums and carries are double-double pairs stored as two doubles (hi, lo).

template <typename T>
__global__ void mixture_tile_slope(const T* __restrict__ q, const double* __restrict__ src,
                                   const double* __restrict__ v, const long long* __restrict__ ev,
                                   const long long* __restrict__ tile_start, const long long* __restrict__ tile_end,
                                   long long n_tiles, int nl, double narrow_rel, double* __restrict__ tile_sum,
                                   double* __restrict__ tile_last) {
    __shared__ dd2 scratch_dd[32];
    for (long long t = blockIdx.x; t < n_tiles; t += gridDim.x) {
        const long long j = tile_start[t] + threadIdx.x;
        double x = 0.0, jump = 0.0, plus = 0.0, minus = 0.0;
        if (j < tile_end[t]) mixture_event<T>(q, src, v, ev, j, nl, narrow_rel, &x, &jump, &plus, &minus);
        dd2 total;
        const dd2 incl = block_scan_dd(dd_two_sum(plus, -minus), scratch_dd, &total);
        if (threadIdx.x == blockDim.x - 1) {
            tile_last[2 * t] = incl.hi;
            tile_last[2 * t + 1] = incl.lo;
        }
        if (threadIdx.x == 0) {
            tile_sum[2 * t] = total.hi;
            tile_sum[2 * t + 1] = total.lo;
        }
    }
}

// Exclusive scans over each group's tiles, by chunks of blockDim.x tiles, each chunk a block scan
// combined with the chunks before: carry[t] = the combination of the group's tiles before t
// (Op::zero() for its first).  Op: TileSum (double-double sums, values and carries stored as
// (hi, lo) pairs) or TileMax (maxima, exact).
struct TileSum {
    typedef dd2 V;
    static __device__ __forceinline__ V zero() { return dd_make(0.0, 0.0); }
    static __device__ __forceinline__ V pad() { return zero(); }
    static __device__ __forceinline__ V load(const double* a, long long t) { return dd_make(a[2 * t], a[2 * t + 1]); }
    static __device__ __forceinline__ void store(double* a, long long t, V v) {
        a[2 * t] = v.hi;
        a[2 * t + 1] = v.lo;
    }
    static __device__ __forceinline__ V combine(V r, V x) { return dd_add(r, x); }
    static __device__ __forceinline__ V scan(V x, V* scratch, V* total) { return block_scan_dd(x, scratch, total); }
};

struct TileMax {
    typedef double V;
    static __device__ __forceinline__ V zero() { return 0.0; }  // F >= 0: mixture_sweep's carry_fmax starts at 0
    static __device__ __forceinline__ V pad() { return -1.0e308; }
    static __device__ __forceinline__ V load(const double* a, long long t) { return a[t]; }
    static __device__ __forceinline__ void store(double* a, long long t, V v) { a[t] = v; }
    static __device__ __forceinline__ V combine(V r, V x) { return x > r ? x : r; }
    static __device__ __forceinline__ V scan(V x, V* scratch, V* total) { return block_scan_max(x, scratch, total); }
};

template <typename Op>
__global__ void mixture_tile_carry(const long long* __restrict__ tile_first, long long n_groups,
                                   const double* __restrict__ vals, double* __restrict__ carry) {
    typedef typename Op::V V;
    __shared__ V scratch[32];
    __shared__ V incl_s[1024];
    __shared__ V run;
    for (long long g = blockIdx.x; g < n_groups; g += gridDim.x) {
        const long long t0 = tile_first[g], t1 = tile_first[g + 1];
        if (threadIdx.x == 0) run = Op::zero();
        __syncthreads();
        for (long long base = t0; base < t1; base += blockDim.x) {
            const long long t = base + threadIdx.x;
            const bool act = t < t1;
            V total;
            incl_s[threadIdx.x] = Op::scan(act ? Op::load(vals, t) : Op::pad(), scratch, &total);
            __syncthreads();
            const V r = run;
            if (act) Op::store(carry, t, threadIdx.x == 0 ? r : Op::combine(r, incl_s[threadIdx.x - 1]));
            __syncthreads();
            if (threadIdx.x == 0) run = Op::combine(r, total);
            __syncthreads();
        }
    }
}

template <typename T>
__global__ void mixture_tile_slopes(const T* __restrict__ q, const double* __restrict__ src,
                                    const double* __restrict__ v, const long long* __restrict__ ev,
                                    const long long* __restrict__ tile_start, const long long* __restrict__ tile_end,
                                    const long long* __restrict__ tile_s0, long long n_tiles, int nl,
                                    double narrow_rel, const double* __restrict__ slope_carry,
                                    const double* __restrict__ tile_last, double* __restrict__ xs,
                                    double* __restrict__ slope, double* __restrict__ inc_out,
                                    double* __restrict__ inc_sum) {
    __shared__ dd2 scratch_dd[32];
    __shared__ double warp_last_x[32];
    __shared__ double warp_last_s[32];
    for (long long t = blockIdx.x; t < n_tiles; t += gridDim.x) {
        const long long j0 = tile_start[t], j1 = tile_end[t], s0 = tile_s0[t];
        const long long j = j0 + threadIdx.x;
        const bool act = j < j1;
        double x = 0.0, jump = 0.0, plus = 0.0, minus = 0.0;
        if (act) mixture_event<T>(q, src, v, ev, j, nl, narrow_rel, &x, &jump, &plus, &minus);
        // thread 0's previous event: the group's first tile has none (0, 0, as mixture_sweep starts);
        // else the previous tile's last, full: event j0 - 1, its slope from that tile's carry and
        // its last inclusive value
        double first_x = 0.0, first_s = 0.0;
        if (threadIdx.x == 0 && j0 > s0) {
            first_x = (double)q[ev[j0 - 1]];
            const double sl = dd_value(dd_add(dd_make(slope_carry[2 * t - 2], slope_carry[2 * t - 1]),
                                              dd_make(tile_last[2 * t - 2], tile_last[2 * t - 1])));
            first_s = sl > 0.0 ? sl : 0.0;
        }
        double s;
        dd2 tile_total;
        const double inc = mixture_slope_inc(x, jump, plus, minus, act && j > s0,
                                             dd_make(slope_carry[2 * t], slope_carry[2 * t + 1]), first_x, first_s,
                                             scratch_dd, warp_last_x, warp_last_s, &s, &tile_total);
        if (act) {
            xs[j] = x;
            slope[j] = s;
            inc_out[j] = inc;
        }
        dd2 f_total;
        block_scan_dd(dd_make(inc, 0.0), scratch_dd, &f_total);
        if (threadIdx.x == 0) {
            inc_sum[2 * t] = f_total.hi;
            inc_sum[2 * t + 1] = f_total.lo;
        }
        __syncthreads();  // warp_last_* are rewritten by the next tile
    }
}

// cdf holds each event's increment on entry (mixture_tile_slopes) and F, max-scanned within the
// tile, on exit; tile_max[t] is the tile's maximum F.
template <typename T>
__global__ void mixture_tile_cdf(const long long* __restrict__ tile_start, const long long* __restrict__ tile_end,
                                 long long n_tiles, const double* __restrict__ cdf_carry, T* __restrict__ cdf,
                                 double* __restrict__ tile_max) {
    __shared__ dd2 scratch_dd[32];
    __shared__ double scratch_max[32];
    for (long long t = blockIdx.x; t < n_tiles; t += gridDim.x) {
        const long long j = tile_start[t] + threadIdx.x;
        const bool act = j < tile_end[t];
        const double inc = act ? (double)cdf[j] : 0.0;
        dd2 f_total;
        double fmax_total;
        const double f = mixture_cdf_step(inc, dd_make(cdf_carry[2 * t], cdf_carry[2 * t + 1]), scratch_dd,
                                          scratch_max, &f_total, &fmax_total);
        if (act) cdf[j] = (T)f;
        if (threadIdx.x == 0) tile_max[t] = fmax_total;
    }
}

template <typename T>
__global__ void mixture_tile_max(const long long* __restrict__ tile_start, const long long* __restrict__ tile_end,
                                 long long n_tiles, const double* __restrict__ max_carry, T* __restrict__ cdf) {
    for (long long t = blockIdx.x; t < n_tiles; t += gridDim.x) {
        const long long j = tile_start[t] + threadIdx.x;
        if (j < tile_end[t]) {
            const double f = (double)cdf[j], c = max_carry[t];
            cdf[j] = (T)(f > c ? f : c);
        }
    }
}

template <typename T>
__global__ void mixture_invert(const T* __restrict__ xs, const T* __restrict__ slope, const T* __restrict__ cdf,
                               const long long* __restrict__ row_start, long long n_groups,
                               const double* __restrict__ levels, long long n_levels, double snap_rel,
                               T* __restrict__ out) {
    const long long total = n_groups * n_levels;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const long long g = idx / n_levels;
        const long long l = idx - g * n_levels;
        const long long s0 = row_start[g], s1 = row_start[g + 1];
        if (s1 <= s0) {
            out[idx] = (T)mixture_nan();
            continue;
        }
        const double p = levels[l];
        const double Ttot = (double)cdf[s1 - 1];
        if (p >= 1.0) {
            out[idx] = xs[s1 - 1];
            continue;
        }
        const double t = __dmul_rn(p, Ttot);
        const double thr = __dsub_rn(t, __dmul_rn(snap_rel, Ttot));
        long long lo = s0, hi = s1 - 1;
        while (lo < hi) {
            const long long mid = lo + ((hi - lo) >> 1);
            if ((double)cdf[mid] >= thr) hi = mid;
            else lo = mid + 1;
        }
        double x;
        if (lo == s0) {
            x = (double)xs[s0];
        } else {
            const double xa = (double)xs[lo - 1], xb = (double)xs[lo];
            const double fa = (double)cdf[lo - 1], sa = (double)slope[lo - 1];
            x = sa > 0.0 ? __dadd_rn(xa, __ddiv_rn(__dsub_rn(t, fa), sa)) : xb;
            x = x < xa ? xa : x;
            x = x > xb ? xb : x;
        }
        out[idx] = (T)x;
    }
}

}  // namespace gpuclust
