// window.metal -- sliding-window attention in O(T*W), contract §8 window attention; twin of
// kernels/cuda/window.cu, line for line the CPU kernels of kernels/cpu/window.cpp. Band row r
// [batch, M = G*T, W] is the query at position t = r % T, column w the key j = t - (W - 1) + w,
// valid when j >= 0 (columns w < w0 = first_valid(t, W) are not). The three band products run
// one thread per output element (grid-stride), its k-ordered sum (§4.1) over the valid terms in
// the CPU's order: increasing d, increasing j, increasing row r = (g, t). The softmax runs one
// threadgroup of 32 per row: the canonical max and sum of §4.2 over the valid terms (term i =
// column w0 + i, lane l takes i = l, l + 32, ...), then the fixed tree. Invalid entries are +0.0.
#pragma METAL fp contract(off)
#include "canonical.h"

inline long first_valid(long t, long W) { return t >= W - 1 ? 0 : W - 1 - t; }

// s[r, w] = sum_d a[r, d] * b[j, d]: a [batch, M, D], b [batch, T, D], s [batch, M, W].
kernel void rp_band_scores(device const float* a, device const float* b, device float* s, constant long& batch,
                           constant long& M, constant long& T, constant long& D, constant long& W, RP_POS) {
  for (long e = tid; e < batch * M * W; e += nthreads) {
    const long r = e / W, w = e % W, t = r % T;
    if (w < first_valid(t, W)) {
      s[e] = 0.0f;
      continue;
    }
    device const float* ar = a + r * D;
    device const float* bj = b + ((r / M) * T + t - (W - 1) + w) * D;
    float acc = 0.0f;
    for (long d = 0; d < D; ++d) acc = fadd(acc, fmul(ar[d], bj[d]));
    s[e] = acc;
  }
}

// o[r, d] = sum over valid w (increasing j) of p[r, w] * b[j, d]: o [batch, M, D].
kernel void rp_band_mix(device const float* p, device const float* b, device float* o, constant long& batch,
                        constant long& M, constant long& T, constant long& D, constant long& W, RP_POS) {
  for (long e = tid; e < batch * M * D; e += nthreads) {
    const long r = e / D, d = e % D, t = r % T;
    device const float* pr = p + r * W;
    device const float* bb = b + (r / M) * T * D + d;
    float acc = 0.0f;
    for (long w = first_valid(t, W); w < W; ++w) acc = fadd(acc, fmul(pr[w], bb[(t - (W - 1) + w) * D]));
    o[e] = acc;
  }
}

// o[j, d] = sum over rows r = (g, t), increasing, with t in [j, j + W - 1], of p[r, w] * a[r, d]
// (w = j - t + W - 1): the transposed band, o [batch, T, D] (gradients of keys and values).
kernel void rp_band_mix_t(device const float* p, device const float* a, device float* o, constant long& batch,
                          constant long& M, constant long& T, constant long& D, constant long& W, RP_POS) {
  const long G = M / T;
  for (long e = tid; e < batch * T * D; e += nthreads) {
    const long q = e / D, d = e % D, bi = q / T, j = q % T;
    const long t1 = j + W - 1 < T - 1 ? j + W - 1 : T - 1;
    float acc = 0.0f;
    for (long g = 0; g < G; ++g)
      for (long t = j; t <= t1; ++t) {
        const long r = bi * M + g * T + t;
        acc = fadd(acc, fmul(p[r * W + (j - t + W - 1)], a[r * D + d]));
      }
    o[e] = acc;
  }
}

// p = softmax over the valid columns of each row of s [rows, W] (row r at position t = r % T).
kernel void rp_window_softmax(device const float* s, device float* p, constant float& scale, constant long& rows,
                              constant long& T, constant long& W, RP_POS) {
  RP_THREADGROUP float sh[kLanes];
  for (long r = gid; r < rows; r += ngroups) {
    const long w0 = first_valid(r % T, W), n = W - w0;
    device const float* sr = s + r * W + w0;
    device float* pr = p + r * W;
    float part = neg(inf_f());
    for (long i = lid; i < n; i += kLanes) {
      const float z = fmul(sr[i], scale);
      part = gt(z, part) ? z : part;
    }
    const float m = tree_max(sh, lid, part);
    part = 0.0f;  // this lane's partial of the canonical sum, terms in increasing i
    for (long i = lid; i < n; i += kLanes) {
      const float e = rp_exp(fsub(fmul(sr[i], scale), m));
      pr[w0 + i] = e;  // read back below by this same thread
      part = fadd(part, e);
    }
    const float inv = rp_recip(tree_sum(sh, lid, part));
    for (long i = lid; i < n; i += kLanes) pr[w0 + i] = fmul(pr[w0 + i], inv);
    for (long w = lid; w < w0; w += kLanes) pr[w] = 0.0f;
  }
}

kernel void rp_window_softmax_backward(device const float* gp, device const float* p, device float* gs,
                                       constant float& scale, constant long& rows, constant long& T,
                                       constant long& W, RP_POS) {
  RP_THREADGROUP float sh[kLanes];
  for (long r = gid; r < rows; r += ngroups) {
    const long w0 = first_valid(r % T, W), n = W - w0;
    device const float* pr = p + r * W + w0;
    device const float* gr = gp + r * W + w0;
    device float* out = gs + r * W;
    float part = 0.0f;
    for (long i = lid; i < n; i += kLanes) part = fadd(part, fmul(pr[i], gr[i]));
    const float dot = tree_sum(sh, lid, part);
    for (long i = lid; i < n; i += kLanes) out[w0 + i] = fmul(fmul(fsub(gr[i], dot), pr[i]), scale);
    for (long w = lid; w < w0; w += kLanes) out[w] = 0.0f;
  }
}
