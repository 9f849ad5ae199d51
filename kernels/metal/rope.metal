// rope.metal -- rotary position embedding, contract §8 rope: the cos/sin tables from the
// canonical log/exp/sin/cos (§5), the rotation of interleaved pairs, and its backward (the
// rotation by -angle). One thread per table entry or per pair; no reductions. Twin of
// kernels/cuda/rope.cu.
#pragma METAL fp contract(off)
#include "canonical.h"

kernel void rp_rope_tables(device float* cos_t, device float* sin_t, constant long& T, constant long& half_dh,
                           constant float& theta, constant float& inv_dh, RP_POS) {
  const float lt = rp_log(theta);  // the same value in every thread
  for (long e = tid; e < T * half_dh; e += nthreads) {
    const long t = e / half_dh, i = e % half_dh;
    const float f = rp_exp(fmul((float)(-2 * i), fmul(lt, inv_dh)));
    const float a = fmul((float)t, f);
    cos_t[e] = rp_cos(a);
    sin_t[e] = rp_sin(a);
  }
}

// Pair e = (row r = (b * T + t) * H + h of B*T*H, index i < Dh/2); x's row (b, t, h) starts at
// b * xb + t * xt + h * xh, y's at b * yb + t * yt + h * yh (kernels/common/ids.h RpRows).
kernel void rp_rope(device const float* x, device const float* cos_t, device const float* sin_t, device float* y,
                    constant long& rows, constant long& T, constant long& H, constant long& half_dh,
                    constant long& backward, constant long& xb, constant long& xt, constant long& xh,
                    constant long& yb, constant long& yt, constant long& yh, RP_POS) {
  for (long e = tid; e < rows * half_dh; e += nthreads) {
    const long r = e / half_dh, i = e % half_dh, b = r / (T * H), t = (r / H) % T, h = r % H;
    const float c = cos_t[t * half_dh + i], s = sin_t[t * half_dh + i];
    const long xe = b * xb + t * xt + h * xh + 2 * i, ye = b * yb + t * yt + h * yh + 2 * i;
    const float x0 = x[xe], x1 = x[xe + 1];
    if (backward == 0) {
      y[ye] = fsub(fmul(x0, c), fmul(x1, s));
      y[ye + 1] = fadd(fmul(x0, s), fmul(x1, c));
    } else {
      y[ye] = fadd(fmul(x0, c), fmul(x1, s));
      y[ye + 1] = fsub(fmul(x1, c), fmul(x0, s));
    }
  }
}
