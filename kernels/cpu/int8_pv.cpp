// int8_pv.cpp -- int8 P·V inside attention (contract §10 "int8 P·V"): the step-size rule of a
// block and the windowed layers' exact int8 band mix. The full layers' P·V is the int8 linear
// of int8.cpp (model side: quant.py).
//
//   rp_int8_absmax_step(x, s, R, C)    s[r] = m > 0 ? m * recip(127) : 1.0, m = cmax_c |x[r,c]|
//   rp_int8_band_mix(qp, qv, sp, sv, o, batch, M, T, D, W)
//       o[r,d] = float(sum over the valid w of qp[r,w] * qv[j,d]) * (sv[b] * sp[r])
//
// A band row r of qp [batch, M, W] is the query at position t = r % T (M = G*T), its column w
// the key j = t - (W - 1) + w, valid when j >= 0 (as in window.cpp). The sum is int32 and exact
// (|sum| <= W * 127^2 < 2^31, checked by the binding), so its order is free.
#include "kernels.h"

#include <vector>

void rp_int8_absmax_step(const float* x, float* s, int64_t R, int64_t C) {
  rp::parallel_for(R, 1, [&](int64_t b, int64_t e) {
    const float inv127 = rp::recip(127.0f);  // §5.3 (under the workers' FP mode), every backend's bits
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * C;
      const float m = rp::vcmax(C, [xr](int64_t c, int64_t n) { return rp::vabs(rp::loadn(xr + c, n)); });
      const float st = rp::mul(m, inv127);
      s[r] = st > 0.0f ? st : 1.0f;  // an all-zero (or flushed) block: step 1.0, every q is 0
    }
  });
}

void rp_int8_band_mix(const int8_t* qp, const int8_t* qv, const float* sp, const float* sv, float* o, int64_t batch,
                      int64_t M, int64_t T, int64_t D, int64_t W) {
  rp::parallel_for(batch * M, 4, [&](int64_t r0, int64_t r1) {
    std::vector<int32_t> acc(D);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % T, w0 = t >= W - 1 ? 0 : W - 1 - t;
      const int8_t* pr = qp + r * W;
      const int8_t* vb = qv + (r / M) * T * D;
      for (int64_t d = 0; d < D; ++d) acc[d] = 0;
      for (int64_t w = w0; w < W; ++w) {
        const int32_t pw = pr[w];
        const int8_t* vj = vb + (t - (W - 1) + w) * D;
        for (int64_t d = 0; d < D; ++d) acc[d] += pw * (int32_t)vj[d];
      }
      const float sc = rp::mul(sv[r / M], sp[r]);
      float* orow = o + r * D;
      for (int64_t d = 0; d < D; ++d) orow[d] = rp::mul((float)acc[d], sc);
    }
  });
}
