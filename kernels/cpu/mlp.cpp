// mlp.cpp -- the SwiGLU gate of the MLP, contract §8 swiglu: out = silu(gate) * up.
#include "kernels.h"

void rp_swiglu(const float* u, float* out, int64_t R, int64_t H) {
  rp::parallel_for(R, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *a = u + r * 2 * H, *b = a + H;
      for (int64_t j = 0; j < H; ++j) {
        const float sg = rp::sigmoid(a[j]);
        out[r * H + j] = (a[j] * sg) * b[j];
      }
    }
  });
}

void rp_swiglu_backward(const float* g, const float* u, float* gu, int64_t R, int64_t H) {
  rp::parallel_for(R, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *a = u + r * 2 * H, *b = a + H, *gr = g + r * H;
      float *ga = gu + r * 2 * H, *gb = ga + H;
      for (int64_t j = 0; j < H; ++j) {
        const float sg = rp::sigmoid(a[j]);
        const float sa = a[j] * sg;
        gb[j] = gr[j] * sa;
        ga[j] = (gr[j] * b[j]) * (sg * (1.0f + (a[j] * (1.0f - sg))));
      }
    }
  });
}
