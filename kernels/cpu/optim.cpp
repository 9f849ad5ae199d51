// optim.cpp -- AdamW with decoupled weight decay and global-norm gradient clipping,
// contract §8 adamw and clip_grad. All host scalars arrive already rounded to float32.
#include "kernels.h"

void rp_adamw(float* p, const float* g, float* m, float* v, int64_t n, float lr, float b1, float b2,
              float omb1, float omb2, float eps, float decay, float bc1, float bc2) {
  rp::parallel_for(n, 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i += rp::VL) {  // 8 elements at a time (vmath.h)
      const int64_t k = i1 - i;
      const rp::vf gi = rp::loadn(g + i, k);
      const rp::vf mi = rp::add(rp::mul(b1, rp::loadn(m + i, k)), rp::mul(omb1, gi));
      const rp::vf vi = rp::add(rp::mul(b2, rp::loadn(v + i, k)), rp::mul(omb2, rp::mul(gi, gi)));
      const rp::vf den = rp::add(rp::vsqrt(rp::mul(vi, bc2)), eps);
      const rp::vf u = rp::mul(rp::mul(mi, bc1), rp::vrecip(den));
      rp::storen(m + i, mi, k);
      rp::storen(v + i, vi, k);
      rp::storen(p + i, rp::sub(rp::mul(rp::loadn(p + i, k), decay), rp::mul(lr, u)), k);
    }
  });
}

void rp_clip_grad(const float* g, float max_norm, float* out, float* norm, int64_t n) {
  float c;
  {
    rp::FpModeGuard guard;  // one scalar sum over the whole vector, in the calling thread
    const float nrm = rp::sqrt(rp::csum(n, [g](int64_t i) { return rp::mul(g[i], g[i]); }));
    const float coef = rp::mul(max_norm, rp::recip(rp::add(nrm, 1e-6f)));
    c = (coef < 1.0f) ? coef : 1.0f;
    *norm = nrm;
  }
  rp::parallel_for(n, 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = rp::mul(g[i], c);
  });
}
