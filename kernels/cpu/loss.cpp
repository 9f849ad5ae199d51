// loss.cpp -- cross-entropy over the vocabulary with optional z-loss, contract §8
// cross_entropy. The mean over rows is a canonical sum (§4.2) times the host scalar 1/R.
#include "kernels.h"

#include <vector>

void rp_cross_entropy(const float* z, const int64_t* targets, float zloss, float* loss, float* lse,
                      int64_t R, int64_t V) {
  std::vector<float> row_loss(R);
  rp::parallel_for(R, 4, [&](int64_t r0, int64_t r1) {
    std::vector<float> e(V);
    for (int64_t r = r0; r < r1; ++r) {
      const float* zr = z + r * V;
      const float m = rp::vcmax_array(zr, V);
      rp::vmap(zr, e.data(), V, [m](auto v) { return rp::vexp(rp::sub(v, m)); });
      const float s = rp::vcsum_array(e.data(), V);
      const float l = rp::add(m, rp::log(s));
      lse[r] = l;
      row_loss[r] = rp::add(rp::sub(l, zr[targets[r]]), rp::mul(rp::mul(zloss, l), l));
    }
  });
  rp::FpModeGuard guard;  // this sum runs in the calling thread
  const float inv_r = (float)(1.0 / (double)R);
  *loss = rp::mul(rp::vcsum_array(row_loss.data(), R), inv_r);
}

void rp_cross_entropy_backward(float g, const float* z, const int64_t* targets, const float* lse,
                               float zloss, float* gz, int64_t R, int64_t V) {
  const float inv_r = (float)(1.0 / (double)R);
  const float two_z = (float)(2.0 * (double)zloss);  // host scalar 2*zloss (exact doubling)
  rp::parallel_for(R, 4, [&](int64_t r0, int64_t r1) {
    const float gs = rp::mul(g, inv_r);
    for (int64_t r = r0; r < r1; ++r) {
      const float *zr = z + r * V;
      float* gr = gz + r * V;
      const float k = rp::add(1.0f, rp::mul(two_z, lse[r])), l = lse[r];
      rp::vmap(zr, gr, V, [=](auto v) { return rp::mul(rp::mul(rp::vexp(rp::sub(v, l)), k), gs); });
      // the target column subtracts 1 before the last multiply: redo it (scalar, same bits)
      const int64_t tgt = targets[r];
      gr[tgt] = rp::mul(rp::sub(rp::mul(rp::exp(rp::sub(zr[tgt], l)), k), 1.0f), gs);
    }
  });
}
