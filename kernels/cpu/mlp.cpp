// mlp.cpp -- the SwiGLU gate of the MLP, contract §8 swiglu: out = silu(gate) * up.
// 8 columns at a time with the SIMD sigmoid (vmath.h; the same bits as the scalar one).
#include "kernels.h"

void rp_swiglu(const float* u, float* out, int64_t R, int64_t H) {
  rp::parallel_for(R, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *a = u + r * 2 * H, *b = a + H;
      for (int64_t j = 0; j < H; j += rp::VL) {
        const int64_t n = H - j;
        const rp::vf aj = rp::loadn(a + j, n), sg = rp::vsigmoid(aj);
        rp::storen(out + r * H + j, rp::mul(rp::mul(aj, sg), rp::loadn(b + j, n)), n);
      }
    }
  });
}

void rp_swiglu_backward(const float* g, const float* u, float* gu, int64_t R, int64_t H) {
  rp::parallel_for(R, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *a = u + r * 2 * H, *b = a + H, *gr = g + r * H;
      float *ga = gu + r * 2 * H, *gb = ga + H;
      for (int64_t j = 0; j < H; j += rp::VL) {
        const int64_t n = H - j;
        const rp::vf aj = rp::loadn(a + j, n), bj = rp::loadn(b + j, n), gj = rp::loadn(gr + j, n);
        const rp::vf sg = rp::vsigmoid(aj);
        const rp::vf sa = rp::mul(aj, sg);
        rp::storen(gb + j, rp::mul(gj, sa), n);
        rp::storen(ga + j, rp::mul(rp::mul(gj, bj), rp::mul(sg, rp::add(1.0f, rp::mul(aj, rp::sub(1.0f, sg))))), n);
      }
    }
  });
}
