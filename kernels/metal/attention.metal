// attention.metal -- causal softmax over attention scores and its backward, contract §8
// causal_softmax: row t of each [T, T] matrix uses columns j <= t; its max and sum are the
// canonical max and sum of §4.2, one threadgroup of 32 per row (lane l takes columns l, l+32,
// ... in order, then the fixed tree). Masked entries (j > t) are +0.0. Twin of
// kernels/cuda/attention.cu.
#pragma METAL fp contract(off)
#include "canonical.h"

kernel void rp_causal_softmax(device const float* s, device float* p, constant float& scale, constant long& rows,
                              constant long& T, RP_POS) {
  RP_THREADGROUP float sh[kLanes];
  for (long r = gid; r < rows; r += ngroups) {
    const long n = r % T + 1;
    device const float* sr = s + r * T;
    device float* pr = p + r * T;
    float part = neg(inf_f());
    for (long j = lid; j < n; j += kLanes) {
      const float t = fmul(sr[j], scale);
      part = gt(t, part) ? t : part;
    }
    const float m = tree_max(sh, lid, part);
    part = 0.0f;  // this lane's partial of the canonical sum, terms in increasing j
    for (long j = lid; j < n; j += kLanes) {
      const float e = rp_exp(fsub(fmul(sr[j], scale), m));
      pr[j] = e;  // read back below by this same thread
      part = fadd(part, e);
    }
    const float inv = rp_recip(tree_sum(sh, lid, part));
    for (long j = lid; j < n; j += kLanes) pr[j] = fmul(pr[j], inv);
    for (long j = n + lid; j < T; j += kLanes) pr[j] = 0.0f;
  }
}

kernel void rp_causal_softmax_backward(device const float* gp, device const float* p, device float* gs,
                                       constant float& scale, constant long& rows, constant long& T, RP_POS) {
  RP_THREADGROUP float sh[kLanes];
  for (long r = gid; r < rows; r += ngroups) {
    const long n = r % T + 1;
    device const float* pr = p + r * T;
    device const float* gr = gp + r * T;
    device float* out = gs + r * T;
    float part = 0.0f;
    for (long j = lid; j < n; j += kLanes) part = fadd(part, fmul(pr[j], gr[j]));
    const float dot = tree_sum(sh, lid, part);
    for (long j = lid; j < n; j += kLanes) out[j] = fmul(fmul(fsub(gr[j], dot), pr[j]), scale);
    for (long j = n + lid; j < T; j += kLanes) out[j] = 0.0f;
  }
}
