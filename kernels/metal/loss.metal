// loss.metal -- cross-entropy over the vocabulary with optional z-loss and its backward,
// contract §8 cross_entropy; twin of kernels/cuda/loss.cu. Forward: one threadgroup of 32 per
// row (canonical max and sum of §4.2 over the row), then one threadgroup takes the canonical sum
// of the R row losses (the mean over rows is that sum times the host scalar 1/R). Backward: one
// thread per logit; the incoming gradient g stays on the device. targets: already range-checked.
#pragma METAL fp contract(off)
#include "canonical.h"

kernel void rp_cross_entropy_rows(device const float* z, device const long* targets, device float* lse,
                                  device float* row_loss, constant float& zloss, constant long& R,
                                  constant long& V, RP_POS) {
  RP_THREADGROUP float sh[kLanes];
  for (long r = gid; r < R; r += ngroups) {
    device const float* zr = z + r * V;
    float part = neg(inf_f());
    for (long j = lid; j < V; j += kLanes) part = gt(zr[j], part) ? zr[j] : part;
    const float m = tree_max(sh, lid, part);
    part = 0.0f;
    for (long j = lid; j < V; j += kLanes) part = fadd(part, rp_exp(fsub(zr[j], m)));
    const float s = tree_sum(sh, lid, part);
    const float l = fadd(m, rp_log(s));
    if (lid == 0) {
      lse[r] = l;
      row_loss[r] = fadd(fsub(l, zr[targets[r]]), fmul(fmul(zloss, l), l));
    }
  }
}

// One threadgroup of 32 (grid = 32 threads).
kernel void rp_cross_entropy_mean(device const float* row_loss, device float* loss, constant float& inv_r,
                                  constant long& R, RP_POS) {
  RP_THREADGROUP float sh[kLanes];
  float part = 0.0f;
  for (long r = lid; r < R; r += kLanes) part = fadd(part, row_loss[r]);
  const float s = tree_sum(sh, lid, part);
  if (lid == 0) loss[0] = fmul(s, inv_r);
}

kernel void rp_cross_entropy_backward(device const float* g, device const float* z, device const long* targets,
                                      device const float* lse, device float* gz, constant float& inv_r,
                                      constant float& two_z, constant long& R, constant long& V, RP_POS) {
  const float gs = fmul(g[0], inv_r);
  for (long e = tid; e < R * V; e += nthreads) {
    const long r = e / V, j = e % V;
    const float k = fadd(1.0f, fmul(two_z, lse[r]));
    float q = fmul(rp_exp(fsub(z[e], lse[r])), k);
    if (j == targets[r]) q = fsub(q, 1.0f);
    gz[e] = fmul(q, gs);
  }
}
