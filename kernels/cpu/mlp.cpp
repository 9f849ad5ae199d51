// mlp.cpp -- the SwiGLU gate of the MLP, contract §8 swiglu: out = silu(gate) * up.
// VW columns at a time (rp::vw, 16 with AVX-512) with the SIMD sigmoid (vmath.h; the same bits as the
// scalar one): the sigmoid is a chain of about 40 dependent operations, and twice VL lanes per
// instruction nearly halves its cost per element where the core does not overlap separate chains
// (Zen 5, 2026-12-02: 2.06 -> 1.12 ns per output, docs/performance.md).
#include "kernels.h"

void rp_swiglu(const float* u, float* out, int64_t R, int64_t H) {
  rp::parallel_for(R, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *a = u + r * 2 * H, *b = a + H;
      for (int64_t j = 0; j < H; j += rp::VW) {
        const int64_t n = H - j;
        const rp::vw aj = rp::loadn<rp::vw>(a + j, n), sg = rp::vsigmoid(aj);
        rp::storen(out + r * H + j, rp::mul(rp::mul(aj, sg), rp::loadn<rp::vw>(b + j, n)), n);
      }
    }
  });
}

void rp_swiglu_backward(const float* g, const float* u, float* gu, int64_t R, int64_t H) {
  rp::parallel_for(R, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *a = u + r * 2 * H, *b = a + H, *gr = g + r * H;
      float *ga = gu + r * 2 * H, *gb = ga + H;
      for (int64_t j = 0; j < H; j += rp::VW) {
        const int64_t n = H - j;
        const rp::vw aj = rp::loadn<rp::vw>(a + j, n), bj = rp::loadn<rp::vw>(b + j, n), gj = rp::loadn<rp::vw>(gr + j, n);
        const rp::vw sg = rp::vsigmoid(aj);
        const rp::vw sa = rp::mul(aj, sg);
        rp::storen(gb + j, rp::mul(gj, sa), n);
        rp::storen(ga + j, rp::mul(rp::mul(gj, bj), rp::mul(sg, rp::add(1.0f, rp::mul(aj, rp::sub(1.0f, sg))))), n);
      }
    }
  });
}
