// attention.cpp -- causal softmax over attention scores, contract §8 causal_softmax:
// row t uses columns j <= t; canonical max and sum (§4.2); masked entries are +0.0.
#include "kernels.h"

#include <vector>

void rp_causal_softmax(const float* s, float scale, float* p, int64_t BH, int64_t T) {
  rp::parallel_for(BH * T, 8, [&](int64_t r0, int64_t r1) {
    std::vector<float> e(T);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % T, n = t + 1;
      const float* sr = s + r * T;
      float* pr = p + r * T;
      for (int64_t j = 0; j < n; ++j) e[j] = rp::mul(sr[j], scale);  // z_j
      const float* z = e.data();
      const float m = rp::vcmax_array(z, n);
      rp::vmap(e.data(), e.data(), n, [m](auto v) { return rp::vexp(rp::sub(v, m)); });
      const float inv = rp::recip(rp::vcsum_array(e.data(), n));
      for (int64_t j = 0; j < n; ++j) pr[j] = rp::mul(e[j], inv);
      for (int64_t j = n; j < T; ++j) pr[j] = 0.0f;
    }
  });
}

void rp_causal_softmax_backward(const float* gp, const float* p, float scale, float* gs,
                                int64_t BH, int64_t T) {
  rp::parallel_for(BH * T, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % T, n = t + 1;
      const float *pr = p + r * T, *gr = gp + r * T;
      float* out = gs + r * T;
      const float dot = rp::vcsum(n, [pr, gr](int64_t j, int64_t m) { return rp::mul(rp::loadn(pr + j, m), rp::loadn(gr + j, m)); });
      for (int64_t j = 0; j < n; ++j) out[j] = rp::mul(rp::mul(rp::sub(gr[j], dot), pr[j]), scale);
      for (int64_t j = n; j < T; ++j) out[j] = 0.0f;
    }
  });
}
