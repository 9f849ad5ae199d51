// norm.metal -- RMSNorm forward and backward, contract §8 rmsnorm; every sum is the canonical
// sum of §4.2 (one threadgroup of 32 per row: lane l takes columns l, l+32, ...; then the fixed
// tree in threadgroup memory). The weight gradient sums over rows per column: one threadgroup of
// 32 per column, lane l takes rows l, l+32, ... in order. Twin of kernels/cuda/norm.cu.
#pragma METAL fp contract(off)
#include "canonical.h"

kernel void rp_rmsnorm(device const float* x, device const float* w, device float* y, device float* rstd,
                       constant float& eps, constant float& inv_d, constant long& R, constant long& D, RP_POS) {
  RP_THREADGROUP float p[kLanes];
  for (long r = gid; r < R; r += ngroups) {
    device const float* xr = x + r * D;
    float part = 0.0f;
    for (long j = lid; j < D; j += kLanes) part = fadd(part, fmul(xr[j], xr[j]));
    const float ss = tree_sum(p, lid, part);
    const float rs = rp_rsqrt(fadd(fmul(ss, inv_d), eps));
    if (lid == 0) rstd[r] = rs;
    for (long j = lid; j < D; j += kLanes) y[r * D + j] = fmul(fmul(xr[j], rs), w[j]);
  }
}

kernel void rp_rmsnorm_backward(device const float* gy, device const float* x, device const float* w,
                                device const float* rstd, device float* gx, constant float& inv_d,
                                constant long& R, constant long& D, RP_POS) {
  RP_THREADGROUP float p[kLanes];
  for (long r = gid; r < R; r += ngroups) {
    device const float* gr = gy + r * D;
    device const float* xr = x + r * D;
    const float rs = rstd[r];
    float part = 0.0f;
    for (long j = lid; j < D; j += kLanes) part = fadd(part, fmul(fmul(gr[j], w[j]), xr[j]));
    const float dot = tree_sum(p, lid, part);
    float c = fmul(fmul(fmul(dot, inv_d), rs), rs);
    c = fmul(c, rs);
    for (long j = lid; j < D; j += kLanes) gx[r * D + j] = fsub(fmul(fmul(gr[j], w[j]), rs), fmul(xr[j], c));
  }
}

// gw[j] = csum over r of gy[r,j] * (x[r,j] * rstd[r]): one threadgroup of 32 per column j.
kernel void rp_rmsnorm_gw(device const float* gy, device const float* x, device const float* rstd,
                          device float* gw, constant long& R, constant long& D, RP_POS) {
  RP_THREADGROUP float p[kLanes];
  for (long j = gid; j < D; j += ngroups) {
    float part = 0.0f;
    for (long r = lid; r < R; r += kLanes) part = fadd(part, fmul(gy[r * D + j], fmul(x[r * D + j], rstd[r])));
    const float s = tree_sum(p, lid, part);
    if (lid == 0) gw[j] = s;
  }
}
