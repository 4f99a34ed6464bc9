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
    const int lane = threadIdx.x & 31;
    const int wid = threadIdx.x >> 5;
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
            if (act) {
                const long long e = ev[j];
                const long long i = e / nl;
                const int k = (int)(e - i * nl);
                const T* qi = q + i * nl;
                const double vi = v[i];
                x = (double)qi[k];
                double d, pm;
                if (k < nl - 1) {
                    mixture_segment<T>(qi, src, vi, k, narrow_rel, &d, &pm);
                    plus = d;
                    jump = pm;
                }
                if (k > 0) {
                    mixture_segment<T>(qi, src, vi, k - 1, narrow_rel, &d, &pm);
                    minus = d;
                }
            }
            // slope after this event: compensated prefix of (+d_k) + (-d_k-1)
            dd2 tile_total;
            dd2 s_incl = block_scan_dd(dd_two_sum(plus, -minus), scratch_dd, &tile_total);
            s_incl = dd_add(carry_slope, s_incl);
            double s = dd_value(s_incl);
            s = s > 0.0 ? s : 0.0;
            // previous event's x and slope (the carry for thread 0)
            double x_prev = __shfl_up_sync(0xffffffffu, x, 1);
            double s_prev = __shfl_up_sync(0xffffffffu, s, 1);
            if (lane == 31) {
                warp_last_x[wid] = x;
                warp_last_s[wid] = s;
            }
            __syncthreads();
            if (lane == 0) {
                x_prev = wid > 0 ? warp_last_x[wid - 1] : carry_x;
                s_prev = wid > 0 ? warp_last_s[wid - 1] : carry_s;
            }
            const double dx = (act && j > s0) ? __dsub_rn(x, x_prev) : 0.0;
            const double inc = __dadd_rn(jump, __dmul_rn(s_prev, dx));
            dd2 f_total;
            dd2 f_incl = block_scan_dd(dd_make(inc, 0.0), scratch_dd, &f_total);
            f_incl = dd_add(carry_f, f_incl);
            double f = dd_value(f_incl);
            double fmax_total;
            f = block_scan_max(f, scratch_max, &fmax_total);
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
