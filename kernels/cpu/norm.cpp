// norm.cpp -- RMSNorm forward and backward, contract §8 rmsnorm (sums are §4.2 csum).
#include "kernels.h"

#include <algorithm>
#include <vector>

void rp_rmsnorm(const float* x, const float* w, float eps, float* y, float* rstd, int64_t R,
                int64_t D) {
  const float inv_d = (float)(1.0 / (double)D);  // host scalar, contract §1
  rp::parallel_for(R, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * D;
      float ss = rp::vcsum(D, [xr](int64_t j, int64_t m) { const rp::vf v = rp::loadn(xr + j, m); return rp::mul(v, v); });
      float rs = rp::rsqrt(rp::add(rp::mul(ss, inv_d), eps));
      rstd[r] = rs;
      for (int64_t j = 0; j < D; ++j) y[r * D + j] = rp::mul(rp::mul(xr[j], rs), w[j]);
    }
  });
}

void rp_rmsnorm_backward(const float* gy, const float* x, const float* w, const float* rstd,
                         float* gx, float* gw, int64_t R, int64_t D) {
  const float inv_d = (float)(1.0 / (double)D);
  rp::parallel_for(R, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *gr = gy + r * D, *xr = x + r * D;
      const float rs = rstd[r];
      float dot = rp::vcsum(D, [gr, xr, w](int64_t j, int64_t m) {
        return rp::mul(rp::mul(rp::loadn(gr + j, m), rp::loadn(w + j, m)), rp::loadn(xr + j, m));
      });
      float c = rp::mul(rp::mul(rp::mul(dot, inv_d), rs), rs);
      c = rp::mul(c, rs);
      for (int64_t j = 0; j < D; ++j) gx[r * D + j] = rp::sub(rp::mul(rp::mul(gr[j], w[j]), rs), rp::mul(xr[j], c));
    }
  });
  // gw[j] = csum over rows r of gy[r,j] * (x[r,j] * rstd[r]): 32 lane-strided partial rows,
  // vectorized across columns, threads over column blocks (output elements).
  constexpr int64_t kCols = 64;
  rp::parallel_for((D + kCols - 1) / kCols, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> p(rp::kLanes * kCols);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t j0 = b * kCols, nj = std::min(kCols, D - j0);
      std::fill(p.begin(), p.end(), 0.0f);
      for (int64_t r = 0; r < R; ++r) {
        float* pl = &p[(r % rp::kLanes) * kCols];
        const float *gr = gy + r * D + j0, *xr = x + r * D + j0;
        const float rs = rstd[r];
        for (int64_t j = 0; j < nj; ++j) pl[j] = rp::add(pl[j], rp::mul(gr[j], rp::mul(xr[j], rs)));
      }
      for (int64_t w2 = rp::kLanes / 2; w2 >= 1; w2 >>= 1)
        for (int64_t l = 0; l < w2; ++l)
          for (int64_t j = 0; j < nj; ++j) p[l * kCols + j] = rp::add(p[l * kCols + j], p[(l + w2) * kCols + j]);
      for (int64_t j = 0; j < nj; ++j) gw[j0 + j] = p[j];
    }
  });
}
