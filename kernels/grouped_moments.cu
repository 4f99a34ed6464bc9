// Grouped weighted co-moments, corrected two-pass (see docs/analyses/cpi-math.md and
// gpuclust/backends/moments_cpu.py, the NumPy twin):
//
//   pass 1  comoments_sums_{shared,global}<T, C, D>:
//           acc1[g] += (1, w, w x_0 .. w x_{D-1})                        K1 = 2 + D doubles/group
//   host    m0 = (sum w x) / W                                           (CuPy, tiny)
//   pass 2  comoments_centered_{shared,global}<T, C, D>:
//           d = x - m0[g];  acc2[g] += (w d_0 .. w d_{D-1},  w d_i d_j for i <= j, row-major)
//                                                                         K2 = D + D(D+1)/2
//   host    mean = m0 + s / W;  C = P - s s^T / W                         (CuPy, tiny)
//
// Row validity: 0 <= group < n_groups, w finite and > 0, every x finite; other rows add nothing.
// T: float or double input (x); weights are double; C: int or long long group codes; D: 1..4.
// All accumulation is in double.
//
// Each thread loads MOMENT_ROWS rows of its grid-stride loop before it adds any (accumulate.cuh's
// ROWS_IN_FLIGHT, 2 here: its unrolled passes make the 64 instantiations' compile time grow with
// it, 3.0 s at 1 row, 5.0 s at 2, 9.1 s at 4 with nvcc for sm_90).
// Contention strategy: each warp handles 32 consecutive rows per step; lanes with equal group
// are combined in registers (moments_warp.cuh: one __match_any_sync per step, butterfly when the
// warp is uniform) and the leader issues one atomicAdd per quantity.  The *_shared variants keep
// a block-private copy of the accumulators in dynamic shared memory (n_groups * K doubles,
// chosen by the wrapper when that fits in 48 KiB) and flush it once per block; the *_global
// variants add straight into global memory.  Because pass 2 sums centred, small terms, rounding
// in the atomic order changes results only at the ~1e-15 relative level, and a single group
// receiving all rows costs one atomic per quantity per warp-step (shared) -- it does not collapse.
#include "accumulate.cuh"
#include "moments_warp.cuh"

namespace gpuclust {

enum { MOMENT_ROWS = 2 };

template <typename T, typename C, int D>
__device__ __forceinline__ long long comoments_load(const T* __restrict__ x, const double* __restrict__ w,
                                                    const C* __restrict__ group, long long n, long long n_groups,
                                                    long long i, double* xv, double* wi) {
    long long key = -1;
    *wi = 0.0;
#pragma unroll
    for (int k = 0; k < D; ++k) xv[k] = 0.0;
    if (i < n) {
        const long long g = (long long)group[i];
        const double wv = w[i];
        bool ok = g >= 0 && g < n_groups && wv > 0.0 && is_finite(wv);
#pragma unroll
        for (int k = 0; k < D; ++k) {
            xv[k] = (double)x[i * D + k];
            ok = ok && is_finite(xv[k]);
        }
        if (ok) {
            key = g;
            *wi = wv;
        } else {
#pragma unroll
            for (int k = 0; k < D; ++k) xv[k] = 0.0;
        }
    }
    return key;
}

template <typename T, typename C, int D>
__device__ __forceinline__ void comoments_sums_body(const T* __restrict__ x, const double* __restrict__ w,
                                                    const C* __restrict__ group, long long n, long long n_groups,
                                                    double* __restrict__ acc) {
    constexpr int K = 2 + D;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long base = (long long)blockIdx.x * blockDim.x; base < n; base += stride * MOMENT_ROWS) {
        double xv[MOMENT_ROWS][D];
        double wi[MOMENT_ROWS];
        long long key[MOMENT_ROWS];
#pragma unroll
        for (int u = 0; u < MOMENT_ROWS; ++u)  // every row's loads first
            key[u] = comoments_load<T, C, D>(x, w, group, n, n_groups, base + u * stride + threadIdx.x, xv[u], &wi[u]);
#pragma unroll
        for (int u = 0; u < MOMENT_ROWS; ++u) {
            const WarpPeers p = warp_peers(key[u]);
            double v[K];
            v[0] = key[u] >= 0 ? 1.0 : 0.0;
            v[1] = wi[u];
#pragma unroll
            for (int k = 0; k < D; ++k) v[2 + k] = wi[u] * xv[u][k];
            peer_sums<K>(p, v);
            if (p.leader && key[u] >= 0) {
#pragma unroll
                for (int k = 0; k < K; ++k) atomicAdd(acc + key[u] * K + k, v[k]);
            }
        }
    }
}

template <typename T, typename C, int D>
__device__ __forceinline__ void comoments_centered_body(const T* __restrict__ x, const double* __restrict__ w,
                                                        const C* __restrict__ group, const double* __restrict__ m0,
                                                        long long n, long long n_groups, double* __restrict__ acc) {
    constexpr int K = D + D * (D + 1) / 2;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long base = (long long)blockIdx.x * blockDim.x; base < n; base += stride * MOMENT_ROWS) {
        double dv[MOMENT_ROWS][D];
        double wi[MOMENT_ROWS];
        long long key[MOMENT_ROWS];
#pragma unroll
        for (int u = 0; u < MOMENT_ROWS; ++u)  // every row's loads first (x into dv)
            key[u] = comoments_load<T, C, D>(x, w, group, n, n_groups, base + u * stride + threadIdx.x, dv[u], &wi[u]);
#pragma unroll
        for (int u = 0; u < MOMENT_ROWS; ++u) {  // then the group means they need
#pragma unroll
            for (int k = 0; k < D; ++k) dv[u][k] = key[u] >= 0 ? dv[u][k] - m0[key[u] * D + k] : 0.0;
        }
#pragma unroll
        for (int u = 0; u < MOMENT_ROWS; ++u) {
            const WarpPeers p = warp_peers(key[u]);
            double v[K];
#pragma unroll
            for (int k = 0; k < D; ++k) v[k] = wi[u] * dv[u][k];
            int t = D;
#pragma unroll
            for (int a = 0; a < D; ++a) {
#pragma unroll
                for (int b = a; b < D; ++b) v[t++] = wi[u] * dv[u][a] * dv[u][b];
            }
            peer_sums<K>(p, v);
            if (p.leader && key[u] >= 0) {
#pragma unroll
                for (int k = 0; k < K; ++k) atomicAdd(acc + key[u] * K + k, v[k]);
            }
        }
    }
}

// ---- pass 1 kernels: out is acc1 (n_groups x (2 + D)), zero-initialised by the caller.

template <typename T, typename C, int D>
__global__ void comoments_sums_global(const T* __restrict__ x, const double* __restrict__ w,
                                      const C* __restrict__ group, long long n, long long n_groups,
                                      double* __restrict__ out) {
    comoments_sums_body<T, C, D>(x, w, group, n, n_groups, out);
}

template <typename T, typename C, int D>
__global__ void comoments_sums_shared(const T* __restrict__ x, const double* __restrict__ w,
                                      const C* __restrict__ group, long long n, long long n_groups,
                                      double* __restrict__ out) {
    extern __shared__ double acc[];
    const long long cells = n_groups * (2 + D);
    block_zero(acc, cells);
    comoments_sums_body<T, C, D>(x, w, group, n, n_groups, acc);
    block_flush(acc, out, cells);
}

// ---- pass 2 kernels: out is acc2 (n_groups x (D + D(D+1)/2)), zero-initialised by the caller.

template <typename T, typename C, int D>
__global__ void comoments_centered_global(const T* __restrict__ x, const double* __restrict__ w,
                                          const C* __restrict__ group, const double* __restrict__ m0,
                                          long long n, long long n_groups, double* __restrict__ out) {
    comoments_centered_body<T, C, D>(x, w, group, m0, n, n_groups, out);
}

template <typename T, typename C, int D>
__global__ void comoments_centered_shared(const T* __restrict__ x, const double* __restrict__ w,
                                          const C* __restrict__ group, const double* __restrict__ m0,
                                          long long n, long long n_groups, double* __restrict__ out) {
    extern __shared__ double acc[];
    const long long cells = n_groups * (D + D * (D + 1) / 2);
    block_zero(acc, cells);
    comoments_centered_body<T, C, D>(x, w, group, m0, n, n_groups, acc);
    block_flush(acc, out, cells);
}

}  // namespace gpuclust
