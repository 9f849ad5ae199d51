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

// One row: pairs (x[2i], x[2i+1]) rotated by the angle of cos c[i], sin s[i] (its backward:
// by minus the angle). The pointers never alias (y is a new tensor), so the compiler vectorizes
// the pairs (deinterleaving loads) without a run-time overlap check: each output is the same
// expression as written.
template <bool kBackward>
static void rotate_row(const float* __restrict x, const float* __restrict c, const float* __restrict s,
                       float* __restrict y, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float x0 = x[2 * i], x1 = x[2 * i + 1];
    if (!kBackward) {
      y[2 * i] = rp::sub(rp::mul(x0, c[i]), rp::mul(x1, s[i]));
      y[2 * i + 1] = rp::add(rp::mul(x0, s[i]), rp::mul(x1, c[i]));
    } else {
      y[2 * i] = rp::add(rp::mul(x0, c[i]), rp::mul(x1, s[i]));
      y[2 * i + 1] = rp::sub(rp::mul(x1, c[i]), rp::mul(x0, s[i]));
    }
  }
}

// Rows (b, t, h) of [B, T, H]: x's are read where xs says, y's written where ys says, so that one
// pass also moves the heads (binding_common.h rope_args: heads-major out of the forward).
void rp_rope(const float* x, RpRows xs, const float* cos_t, const float* sin_t, float* y, RpRows ys,
             int64_t B, int64_t T, int64_t H, int64_t Dh, bool backward) {
  const int64_t half = Dh / 2;
  const auto rotate = backward ? rotate_row<true> : rotate_row<false>;
  rp::parallel_for(B * T, 16, [&](int64_t bt0, int64_t bt1) {
    for (int64_t bt = bt0; bt < bt1; ++bt) {
      const int64_t b = bt / T, t = bt % T;
      for (int64_t h = 0; h < H; ++h)
        rotate(x + b * xs.b + t * xs.t + h * xs.h, cos_t + t * half, sin_t + t * half,
               y + b * ys.b + t * ys.t + h * ys.h, half);
    }
  });
}
