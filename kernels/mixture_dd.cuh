// Double-double (TwoSum-compensated) arithmetic and block-wide inclusive scans for the mixture
// kernels (kernels/mixture.cu).
//
// A dd2 {hi, lo} holds an unevaluated sum hi + lo.  dd_add is the "sloppy" double-double add
// (TwoSum of the high parts, low parts added, renormalised): its error is ~eps^2 of the operands,
// enough for prefix sums where +d and -d must cancel to far below eps * d.  The explicit __dadd_rn /
// __dsub_rn / __dmul_rn intrinsics keep the compiler from contracting or reassociating the
// error-free transformations (and make the arithmetic identical to the NumPy twin where the
// formulas match).
//
// block_scan_dd / block_scan_max: inclusive scans over the whole block; blockDim.x must be a
// multiple of 32 and at most 1024; every thread of the block must call them (they contain
// __syncthreads).  `scratch` is 32 slots of shared memory, reused across calls.
// No standard headers: this file is compiled by NVRTC.
#ifndef GPUCLUST_MIXTURE_DD_CUH
#define GPUCLUST_MIXTURE_DD_CUH

namespace gpuclust {

struct dd2 {
    double hi;
    double lo;
};

__device__ __forceinline__ dd2 dd_two_sum(double a, double b) {
    const double s = __dadd_rn(a, b);
    const double bb = __dsub_rn(s, a);
    const double err = __dadd_rn(__dsub_rn(a, __dsub_rn(s, bb)), __dsub_rn(b, bb));
    dd2 r;
    r.hi = s;
    r.lo = err;
    return r;
}

__device__ __forceinline__ dd2 dd_add(dd2 a, dd2 b) {
    const dd2 s = dd_two_sum(a.hi, b.hi);
    const double lo = __dadd_rn(__dadd_rn(a.lo, b.lo), s.lo);
    return dd_two_sum(s.hi, lo);
}

__device__ __forceinline__ double dd_value(dd2 a) { return __dadd_rn(a.hi, a.lo); }

__device__ __forceinline__ dd2 dd_make(double hi, double lo) {
    dd2 r;
    r.hi = hi;
    r.lo = lo;
    return r;
}

__device__ __forceinline__ dd2 dd_shfl_up(dd2 v, unsigned off) {
    const unsigned full = 0xffffffffu;
    return dd_make(__shfl_up_sync(full, v.hi, off), __shfl_up_sync(full, v.lo, off));
}

__device__ __forceinline__ dd2 warp_scan_dd(dd2 v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (unsigned off = 1; off < 32; off <<= 1) {
        const dd2 o = dd_shfl_up(v, off);
        if (lane >= (int)off) v = dd_add(o, v);
    }
    return v;
}

// Inclusive block scan of dd2; *total receives the sum over the whole block.
__device__ __forceinline__ dd2 block_scan_dd(dd2 v, dd2* scratch, dd2* total) {
    const int lane = threadIdx.x & 31;
    const int wid = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    v = warp_scan_dd(v);
    if (lane == 31) scratch[wid] = v;
    __syncthreads();
    if (wid == 0) {
        dd2 t = lane < nw ? scratch[lane] : dd_make(0.0, 0.0);
        t = warp_scan_dd(t);
        if (lane < nw) scratch[lane] = t;
    }
    __syncthreads();
    if (wid > 0) v = dd_add(scratch[wid - 1], v);
    *total = scratch[nw - 1];
    __syncthreads();
    return v;
}

__device__ __forceinline__ double warp_scan_max(double v) {
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (unsigned off = 1; off < 32; off <<= 1) {
        const double o = __shfl_up_sync(full, v, off);
        if (lane >= (int)off) v = o > v ? o : v;
    }
    return v;
}

// Inclusive block max-scan; *total receives the block maximum.
__device__ __forceinline__ double block_scan_max(double v, double* scratch, double* total) {
    const int lane = threadIdx.x & 31;
    const int wid = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    v = warp_scan_max(v);
    if (lane == 31) scratch[wid] = v;
    __syncthreads();
    if (wid == 0) {
        double t = lane < nw ? scratch[lane] : -1.0e308;
        t = warp_scan_max(t);
        if (lane < nw) scratch[lane] = t;
    }
    __syncthreads();
    if (wid > 0) v = scratch[wid - 1] > v ? scratch[wid - 1] : v;
    *total = scratch[nw - 1];
    __syncthreads();
    return v;
}

}  // namespace gpuclust

#endif  // GPUCLUST_MIXTURE_DD_CUH
