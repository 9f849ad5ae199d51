// mlp.cpp -- the SwiGLU gate of the MLP, contract §8 swiglu: out = silu(gate) * up.
// VW columns at a time (rp::vw, 16 with AVX-512) with the SIMD sigmoid (vmath.h; the same bits as the
// scalar one). The sigmoid is one chain of about 40 dependent operations per lane (exp, then
// recip), longer than a core's scheduler can overlap across loop iterations, so it runs at its
// latency. Each row is therefore done in two passes: the first writes e = exp(-gate) into the
// output row, the second reads it back and finishes (recip(1 + e), the products). Two chains of
// half the length overlap twice as deep. Twice VL lanes per instruction (AVX-512) halves the
// instructions per element for the same reason. Measured, ns per output of the forward
// (docs/performance.md): Zen 5, 8 -> 16 lanes, 2.06 -> 1.12; Zen 3 (AVX2), one pass -> two
// (with vmath.h's loadn without a stack copy), 2.95 -> 1.99.
#include "kernels.h"

namespace {
// e[j] = exp(-a[j]) for j < H: the first pass (contract §5.6 sigmoid(a) = recip(1 + exp(-a))).
void exp_neg(const float* a, float* e, int64_t H) {
  rp::vmap(a, e, H, [](auto v) { return rp::vexp(-v); });
}
}  // namespace

void rp_swiglu(const float* u, float* out, int64_t R, int64_t H) {
  rp::parallel_for(R, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *a = u + r * 2 * H, *b = a + H;
      float* o = out + r * H;
      exp_neg(a, o, H);
      for (int64_t j = 0; j < H; j += rp::VW) {
        const int64_t n = H - j;
        const rp::vw aj = rp::loadn<rp::vw>(a + j, n), sg = rp::vsigmoid_of_exp(rp::loadn<rp::vw>(o + j, n));
        rp::storen(o + j, rp::mul(rp::mul(aj, sg), rp::loadn<rp::vw>(b + j, n)), n);
      }
    }
  });
}

void rp_swiglu_backward(const float* g, const float* u, float* gu, int64_t R, int64_t H) {
  rp::parallel_for(R, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *a = u + r * 2 * H, *b = a + H, *gr = g + r * H;
      float *ga = gu + r * 2 * H, *gb = ga + H;
      exp_neg(a, ga, H);
      for (int64_t j = 0; j < H; j += rp::VW) {
        const int64_t n = H - j;
        const rp::vw aj = rp::loadn<rp::vw>(a + j, n), bj = rp::loadn<rp::vw>(b + j, n), gj = rp::loadn<rp::vw>(gr + j, n);
        const rp::vw sg = rp::vsigmoid_of_exp(rp::loadn<rp::vw>(ga + j, n));
        const rp::vw sa = rp::mul(aj, sg);
        rp::storen(gb + j, rp::mul(gj, sa), n);
        rp::storen(ga + j, rp::mul(rp::mul(gj, bj), rp::mul(sg, rp::add(1.0f, rp::mul(aj, rp::sub(1.0f, sg))))), n);
      }
    }
  });
}
