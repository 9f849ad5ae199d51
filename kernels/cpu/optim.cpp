// optim.cpp -- AdamW with decoupled weight decay and global-norm gradient clipping,
// contract §8 adamw and clip_grad (its norm: the chunked sum, §4.5). All host scalars arrive
// already rounded to float32.
#include <algorithm>
#include <vector>

#include "kernels.h"

// Two passes over blocks of kBlock elements: the moments and den = sqrt(v * bc2) + eps (a chain
// of about 30 dependent operations per lane), then recip(den) and the update (about 25 more). One
// pass of the whole chain runs at its latency: a core's scheduler overlaps too few loop
// iterations of it (as in mlp.cpp). The same operations on the same values.
void rp_adamw(float* p, const float* g, float* m, float* v, int64_t n, float lr, float b1, float b2,
              float omb1, float omb2, float eps, float decay, float bc1, float bc2) {
  constexpr int64_t kBlock = 512;
  rp::parallel_for(n, 4096, [&](int64_t i0, int64_t i1) {
    alignas(64) float den[kBlock];
    for (int64_t b0 = i0; b0 < i1; b0 += kBlock) {
      const int64_t b_end = std::min(i1, b0 + kBlock);
      for (int64_t i = b0; i < b_end; i += rp::VL) {  // 8 elements at a time (vmath.h)
        const int64_t k = b_end - i;
        const rp::vf gi = rp::loadn(g + i, k);
        const rp::vf mi = rp::add(rp::mul(b1, rp::loadn(m + i, k)), rp::mul(omb1, gi));
        const rp::vf vi = rp::add(rp::mul(b2, rp::loadn(v + i, k)), rp::mul(omb2, rp::mul(gi, gi)));
        rp::storen(m + i, mi, k);
        rp::storen(v + i, vi, k);
        rp::storen(den + (i - b0), rp::add(rp::vsqrt(rp::mul(vi, bc2)), eps), k);
      }
      for (int64_t i = b0; i < b_end; i += rp::VL) {
        const int64_t k = b_end - i;
        const rp::vf u = rp::mul(rp::mul(rp::loadn(m + i, k), bc1), rp::vrecip(rp::loadn(den + (i - b0), k)));
        rp::storen(p + i, rp::sub(rp::mul(rp::loadn(p + i, k), decay), rp::mul(lr, u)), k);
      }
    }
  });
}

namespace {
// The canonical sum (§4.2) of g[i] * g[i] for i in [0, len) (vmath.h vcsum).
float csum_squares(const float* g, int64_t len) {
  return rp::vcsum(len, [g](int64_t i, int64_t m) {
    const rp::vf x = rp::loadn(g + i, m);
    return rp::mul(x, x);
  });
}
}  // namespace

// norm = sqrt(the chunked sum (§4.5) of g[i] * g[i]): chunk c of kFlatChunk terms (the last one
// shorter) summed on its own -- the chunks in parallel, each one's sum fixed -- then the
// canonical sum of the C = ceil(n / L) chunk sums (n = 0: C = 0, +0.0).
void rp_clip_grad(const float* g, float max_norm, float* out, float* norm, int64_t n) {
  const int64_t C = (n + kFlatChunk - 1) / kFlatChunk;
  std::vector<float> sums(C);  // [C]
  rp::parallel_for(C, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) sums[c] = csum_squares(g + c * kFlatChunk, std::min(kFlatChunk, n - c * kFlatChunk));
  });
  float c;
  {
    rp::FpModeGuard guard;  // the sum of the chunk sums and the coefficient, in the calling thread
    const float nrm = rp::sqrt(rp::csum_array(sums.data(), C));
    const float coef = rp::mul(max_norm, rp::recip(rp::add(nrm, 1e-6f)));
    c = (coef < 1.0f) ? coef : 1.0f;
    *norm = nrm;
  }
  rp::parallel_for(n, 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = rp::mul(g[i], c);
  });
}
