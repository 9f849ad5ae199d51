// window.cpp -- sliding-window attention in O(T*W), contract §8 window attention. A row r of
// a band [batch, M, W] is the query at position t = r % T (M = G*T: the G query heads of a
// key/value group, stacked g-major); its column w holds key position j = t - (W - 1) + w,
// valid when j >= 0. Every sum is the §4.1 k-ordered sum over the valid terms only (increasing
// d, or increasing j, or increasing row r = (g, t)): the terms of full causal attention that
// the window drops are exact zeros (P = +0.0, gS = +0.0), so skipping them gives the bits of
// the full computation with the window's mask. Softmax max and sum are §4.2 over the valid
// terms in increasing j. Invalid band entries are written +0.0 and never read.
#include "kernels.h"

#include <vector>

namespace {
inline int64_t first_valid(int64_t t, int64_t W) { return t >= W - 1 ? 0 : W - 1 - t; }
}  // namespace

// s[r, w] = sum_d a[r, d] * b[j, d] (a query row against the keys of its window).
void rp_band_scores(const float* a, const float* b, float* s, int64_t batch, int64_t M, int64_t T, int64_t D,
                    int64_t W) {
  rp::parallel_for(batch * M, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % T, w0 = first_valid(t, W);
      const float* ar = a + r * D;
      const float* bb = b + (r / M) * T * D;
      float* sr = s + r * W;
      for (int64_t w = 0; w < w0; ++w) sr[w] = 0.0f;
      for (int64_t w = w0; w < W; ++w) {
        const float* bj = bb + (t - (W - 1) + w) * D;
        float acc = 0.0f;
        for (int64_t d = 0; d < D; ++d) acc = rp::add(acc, rp::mul(ar[d], bj[d]));
        sr[w] = acc;
      }
    }
  });
}

// o[r, d] = sum_{valid w, increasing j} p[r, w] * b[j, d]; SIMD across d (output elements).
void rp_band_mix(const float* p, const float* b, float* o, int64_t batch, int64_t M, int64_t T, int64_t D,
                 int64_t W) {
  rp::parallel_for(batch * M, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % T;
      const float* pr = p + r * W;
      const float* bb = b + (r / M) * T * D;
      float* orow = o + r * D;
      for (int64_t d = 0; d < D; ++d) orow[d] = 0.0f;
      for (int64_t w = first_valid(t, W); w < W; ++w) {
        const float pw = pr[w];
        const float* bj = bb + (t - (W - 1) + w) * D;
        for (int64_t d = 0; d < D; ++d) orow[d] = rp::add(orow[d], rp::mul(pw, bj[d]));
      }
    }
  });
}

// o[j, d] = sum over rows r = (g, t), increasing, with j in row r's window (t in [j, j+W-1]),
// of p[r, w] * a[r, d], w = j - t + W - 1: the transposed band (gradients of keys and values).
void rp_band_mix_t(const float* p, const float* a, float* o, int64_t batch, int64_t M, int64_t T, int64_t D,
                   int64_t W) {
  const int64_t G = M / T;
  rp::parallel_for(batch * T, 4, [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t bi = q / T, j = q % T;
      const int64_t t1 = j + W - 1 < T - 1 ? j + W - 1 : T - 1;
      float* orow = o + q * D;
      for (int64_t d = 0; d < D; ++d) orow[d] = 0.0f;
      for (int64_t g = 0; g < G; ++g)
        for (int64_t t = j; t <= t1; ++t) {
          const int64_t r = bi * M + g * T + t;
          const float pw = p[r * W + (j - t + W - 1)];
          const float* ar = a + r * D;
          for (int64_t d = 0; d < D; ++d) orow[d] = rp::add(orow[d], rp::mul(pw, ar[d]));
        }
    }
  });
}

void rp_window_softmax(const float* s, float scale, float* p, int64_t rows, int64_t T, int64_t W) {
  rp::parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
    std::vector<float> e(W);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t w0 = first_valid(r % T, W), n = W - w0;
      const float* sr = s + r * W + w0;
      float* pr = p + r * W;
      for (int64_t i = 0; i < n; ++i) e[i] = rp::mul(sr[i], scale);  // z, term i = key j = lo + i
      const float* z = e.data();
      const float m = rp::vcmax_array(z, n);
      rp::vmap(e.data(), e.data(), n, [m](auto v) { return rp::vexp(rp::sub(v, m)); });
      const float inv = rp::recip(rp::vcsum_array(e.data(), n));
      for (int64_t w = 0; w < w0; ++w) pr[w] = 0.0f;
      for (int64_t i = 0; i < n; ++i) pr[w0 + i] = rp::mul(e[i], inv);
    }
  });
}

void rp_window_softmax_backward(const float* gp, const float* p, float scale, float* gs, int64_t rows, int64_t T,
                                int64_t W) {
  rp::parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t w0 = first_valid(r % T, W), n = W - w0;
      const float *pr = p + r * W + w0, *gr = gp + r * W + w0;
      float* out = gs + r * W;
      const float dot = rp::vcsum(n, [pr, gr](int64_t i, int64_t m) { return rp::mul(rp::loadn(pr + i, m), rp::loadn(gr + i, m)); });
      for (int64_t w = 0; w < w0; ++w) out[w] = 0.0f;
      for (int64_t i = 0; i < n; ++i) out[w0 + i] = rp::mul(rp::mul(rp::sub(gr[i], dot), pr[i]), scale);
    }
  });
}
