// rope.cpp -- rotary position embedding, contract §8 rope: tables from the canonical
// exp/log/sin/cos (§5), rotation of interleaved pairs, and its backward (rotation by -angle).
#include "kernels.h"

#include <vector>

void rp_rope_tables(int64_t T, int64_t Dh, float theta, float* cos_t, float* sin_t) {
  const int64_t half = Dh / 2;
  const float inv_dh = (float)(1.0 / (double)Dh);
  std::vector<float> f(half);  // the frequencies do not depend on t: once, here
  {
    rp::FpModeGuard guard;  // computed in the calling thread
    const float lt = rp::log(theta);
    for (int64_t i = 0; i < half; ++i) f[i] = rp::exp(rp::mul((float)(-2 * i), rp::mul(lt, inv_dh)));
  }
  rp::parallel_for(T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t i = 0; i < half; i += rp::VL) {
        const rp::vf a = rp::mul((float)t, rp::loadn(&f[i], half - i));
        rp::storen(cos_t + t * half + i, rp::vcos(a), half - i);
        rp::storen(sin_t + t * half + i, rp::vsin(a), half - i);
      }
  });
}

void rp_rope(const float* x, const float* cos_t, const float* sin_t, float* y, int64_t B,
             int64_t T, int64_t H, int64_t Dh, bool backward) {
  const int64_t half = Dh / 2;
  rp::parallel_for(B * T * H, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = (r / H) % T;
      const float *xr = x + r * Dh, *c = cos_t + t * half, *s = sin_t + t * half;
      float* yr = y + r * Dh;
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = xr[2 * i], x1 = xr[2 * i + 1];
        if (!backward) {
          yr[2 * i] = rp::sub(rp::mul(x0, c[i]), rp::mul(x1, s[i]));
          yr[2 * i + 1] = rp::add(rp::mul(x0, s[i]), rp::mul(x1, c[i]));
        } else {
          yr[2 * i] = rp::add(rp::mul(x0, c[i]), rp::mul(x1, s[i]));
          yr[2 * i + 1] = rp::sub(rp::mul(x1, c[i]), rp::mul(x0, s[i]));
        }
      }
    }
  });
}
