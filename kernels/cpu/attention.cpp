// attention.cpp -- causal softmax over attention scores, contract §8 causal_softmax:
// row t uses columns j <= t; canonical max and sum (§4.2); masked entries are +0.0.
// And full causal attention (§8 attention) scheduled head by head: rp_causal_attention and its
// backward run the same matmul.cpp and causal_softmax calls as the composed ops (the same bits:
// each output is one kernel's output on the same values, and §4.1 fixes a matmul's bits whatever
// its blocking), one key/value head's slice at a time, so that its scores, probabilities and
// their gradients ([G*T, T] each, 64 KB at the default model's T = 128) stay in L2 between the
// kernels instead of passing through memory for all heads at once. The scores and their gradient
// are scratch here and the softmax reads them on and below the diagonal only, so their products
// skip the register tiles wholly above it (rp_matmul_lower; the 512-bit tile computes 29 of 44
// at T = 128).
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

namespace {
// run(b0, b1) over the slices [0, batch): the slices are the threads' tasks where there are at
// least as many as threads (each kernel inside then runs on its task's thread); with fewer, one
// slice after another on this thread, each kernel spread over all threads (a task would leave
// threads idle). Only kernel calls do arithmetic, each inside its own FP-mode guard.
template <class Run>
void by_slices(int64_t batch, const Run& run) {
  if (batch >= rp_threads())
    rp::parallel_for(batch, 1, run);
  else
    run(0, batch);
}
}  // namespace

// Per slice b: S = q_b k_b^T [G*T, T] (§4.1 over Dh; as G blocks of [T, T], j <= t only);
// p_b = causal_softmax(S * scale) on those blocks; o_b = p_b v_b [G*T, Dh] (§4.1 over the keys).
void rp_causal_attention(const float* q, const float* k, const float* v, float scale, float* o, float* p,
                         int64_t batch, int64_t G, int64_t T, int64_t D) {
  const int64_t M = G * T;
  by_slices(batch, [&](int64_t b0, int64_t b1) {
    std::vector<float> s(M * T);   // the slice's scores
    for (int64_t b = b0; b < b1; ++b) {
      const float *qb = q + b * M * D, *kb = k + b * T * D, *vb = v + b * T * D;
      float *pb = p + b * M * T, *ob = o + b * M * D;
      rp_matmul_lower(qb, T * D, D, 1, kb, 0, 1, D, s.data(), G, T, T, D);   // B(d, j) = k_b[j, d]
      rp_causal_softmax(s.data(), scale, pb, G, T);
      rp_matmul(pb, 0, T, 1, vb, 0, D, 1, ob, 1, M, D, T);
    }
  });
}

// Per slice b, with go_b [G*T, Dh]: gP = go_b v_b^T (j <= t only);
// gS = causal_softmax_backward(gP, p_b); gq_b = gS k_b; gk_b = gS^T q_b and gv_b = p_b^T go_b
// (§4.1 over the group's G*T rows in order).
void rp_causal_attention_backward(const float* go, const float* q, const float* k, const float* v, const float* p,
                                  float scale, float* gq, float* gk, float* gv, int64_t batch, int64_t G, int64_t T,
                                  int64_t D) {
  const int64_t M = G * T;
  by_slices(batch, [&](int64_t b0, int64_t b1) {
    std::vector<float> gp(M * T), gs(M * T);
    for (int64_t b = b0; b < b1; ++b) {
      const float *gob = go + b * M * D, *qb = q + b * M * D, *kb = k + b * T * D, *vb = v + b * T * D;
      const float* pb = p + b * M * T;
      rp_matmul_lower(gob, T * D, D, 1, vb, 0, 1, D, gp.data(), G, T, T, D);
      rp_causal_softmax_backward(gp.data(), pb, scale, gs.data(), G, T);
      rp_matmul(gs.data(), 0, T, 1, kb, 0, D, 1, gq + b * M * D, 1, M, D, T);
      rp_matmul(gs.data(), 0, 1, T, qb, 0, D, 1, gk + b * T * D, 1, T, D, M);   // A(j, r) = gS[r, j]
      rp_matmul(pb, 0, 1, T, gob, 0, D, 1, gv + b * T * D, 1, T, D, M);
    }
  });
}
