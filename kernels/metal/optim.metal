// optim.metal -- AdamW with decoupled weight decay and global-norm gradient clipping, contract §8
// adamw and clip_grad; twin of kernels/cuda/optim.cu. AdamW: one thread per element, host scalars
// already float32. The gradient norm's sum of squares is the chunked sum (§4.5): one threadgroup
// of 32 per chunk of kFlatChunk terms (the last one shorter, not padded) writes the chunk's
// canonical sum (§4.2, lane l adding its terms l, l+32, ... in order), then one threadgroup sums
// the chunk sums canonically and computes the clip coefficient, which a third kernel applies.
#pragma METAL fp contract(off)
#include "canonical.h"

kernel void rp_adamw(device float* p, device const float* g, device float* m, device float* v, constant float& lr,
                     constant float& b1, constant float& b2, constant float& omb1, constant float& omb2,
                     constant float& eps, constant float& decay, constant float& bc1, constant float& bc2,
                     constant long& n, RP_POS) {
  for (long i = tid; i < n; i += nthreads) {
    const float gi = g[i];
    const float mi = fadd(fmul(b1, m[i]), fmul(omb1, gi));
    const float vi = fadd(fmul(b2, v[i]), fmul(omb2, fmul(gi, gi)));
    const float den = fadd(rp_sqrt(fmul(vi, bc2)), eps);
    const float u = fmul(fmul(mi, bc1), rp_recip(den));
    m[i] = mi;
    v[i] = vi;
    p[i] = fsub(fmul(p[i], decay), fmul(lr, u));
  }
}

constant constexpr long kFlatChunk = 32768;  // §4.5's chunk length L (kernels/common/ids.h)

// sums [ceil(n / L)]: sums[c] = csum of g[i]^2 over chunk c, one threadgroup of 32 per chunk
// (groups stride over the chunks).
kernel void rp_grad_norm_chunks(device const float* g, device float* sums, constant long& n, RP_POS) {
  RP_THREADGROUP float sh[kLanes];
  const long chunks = (n + kFlatChunk - 1) / kFlatChunk;
  for (long c = gid; c < chunks; c += ngroups) {
    device const float* gc = g + c * kFlatChunk;
    const long len = (n - c * kFlatChunk < kFlatChunk) ? n - c * kFlatChunk : kFlatChunk;
    float part = 0.0f;
    for (long i = lid; i < len; i += kLanes) part = fadd(part, fmul(gc[i], gc[i]));
    const float s = tree_sum(sh, lid, part);
    if (lid == 0) sums[c] = s;
  }
}

// One threadgroup of 32 (grid = 32 threads): the canonical sum of sums [chunks] (0 chunks: +0.0),
// then norm [1] and coef [1].
kernel void rp_grad_norm(device const float* sums, device float* norm, device float* coef, constant float& max_norm,
                         constant long& chunks, RP_POS) {
  RP_THREADGROUP float sh[kLanes];
  float part = 0.0f;
  for (long c = lid; c < chunks; c += kLanes) part = fadd(part, sums[c]);
  const float ss = tree_sum(sh, lid, part);
  if (lid == 0) {
    const float nrm = rp_sqrt(ss);
    const float c = fmul(max_norm, rp_recip(fadd(nrm, 1e-6f)));
    coef[0] = (c < 1.0f) ? c : 1.0f;
    norm[0] = nrm;
  }
}

kernel void rp_apply_coef(device const float* g, device const float* coef, device float* out, constant long& n,
                          RP_POS) {
  const float c = coef[0];
  for (long i = tid; i < n; i += nthreads) out[i] = fmul(g[i], c);
}
