// vmath.h -- the canonical functions of contract §5 on VL lanes at once (contract.h: 8 on x86,
// 4 on AArch64), or VW (rp::vw: 16 with AVX-512), branch-free.
//
// Each function runs the shared *_core arithmetic of contract.h on every lane, then selects
// the special-case results (NaN, zeros, infinities, out-of-range) the scalar form returns
// early, so every lane has the bits of the scalar function (tests/test_vmath.py checks that
// over every float32 in wide ranges, on x86 and under qemu for AArch64). Lanes whose input is
// special compute garbage in the core (no traps: FP exceptions are masked) and are replaced.
//
//   rp::vf x = rp::loadn(p, n);        // min(n, VL) floats; missing lanes read +0.0
//   rp::storen(q, rp::vexp(x), n);
//   rp::vmap(x, y, n, [](auto v) { return rp::vsigmoid(v); });     // y[i] = f(x[i]) for i < n
#pragma once

#include "contract.h"

namespace rp {

// Every function takes V = vf (VL lanes) or vw (VW lanes, contract.h): the same operations on
// every lane.
template <class V> constexpr int64_t kLanesOf = sizeof(V) / sizeof(float);
#if defined(__AVX2__) && !(defined(__AVX512F__) && defined(__AVX512VL__))
// vmaskmovps's mask: lanes [0, n) set (their sign bit), n < 8.
inline __m256i tail_mask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif
template <class V = vf> inline V splat(float c) { return V{} + c; }  // +0 + c = c (exact)
// Loads / stores min(n, lanes) floats (n >= 1). The full case is its own branch so that it is one
// vector move rather than a variable-length copy. A partial vector (a row's tail) is one masked
// move on x86 (AVX-512: vmovups under a mask register; AVX2: vmaskmovps), which touches no float
// past n and zeroes the missing lanes, as the copy through the stack does elsewhere; that copy
// (a memcpy call and a store-forwarding stall per tail) was most of the causal softmax's fixed
// cost per row, about 115 ns of it (docs/performance.md).
template <class V = vf>
inline V loadn(const float* p, int64_t n = kLanesOf<V>) {
  if (n >= kLanesOf<V>) {
    V v;
    __builtin_memcpy(&v, p, sizeof(V));
    return v;
  }
#if defined(__AVX512F__) && defined(__AVX512VL__)
  if constexpr (kLanesOf<V> == 16) return (V)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
  if constexpr (kLanesOf<V> == 8) return (V)_mm256_maskz_loadu_ps((__mmask8)((1u << n) - 1), p);
#elif defined(__AVX2__)
  if constexpr (kLanesOf<V> == 8) return (V)_mm256_maskload_ps(p, tail_mask(n));
#endif
  V v = {};
  __builtin_memcpy(&v, p, n * sizeof(float));
  return v;
}
template <class V>
inline void storen(float* p, V v, int64_t n = kLanesOf<V>) {
  if (n >= kLanesOf<V>) {
    __builtin_memcpy(p, &v, sizeof(V));
    return;
  }
#if defined(__AVX512F__) && defined(__AVX512VL__)
  if constexpr (kLanesOf<V> == 16) return _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), (__m512)v);
  if constexpr (kLanesOf<V> == 8) return _mm256_mask_storeu_ps(p, (__mmask8)((1u << n) - 1), (__m256)v);
#elif defined(__AVX2__)
  if constexpr (kLanesOf<V> == 8) return _mm256_maskstore_ps(p, tail_mask(n), (__m256)v);
#endif
  __builtin_memcpy(p, &v, n * sizeof(float));
}

// DAZ on the bit level (contract.h daz), lane by lane.
template <class V> inline V vdaz(V x) { return daz(x); }
template <class V> inline V vabs(V x) { return ifl(ibits(x) & ~kSign); }

template <class V> inline V vexp(V x) {  // §5.1
  x = vdaz(x);
  V y = exp_core(x);
  y = sel(x > 88.72283935546875f, splat<V>(kInf), y);
  y = sel(x < -87.33654022216797f, splat<V>(0.0f), y);
  return sel(x != x, x + x, y);
}

template <class V> inline V vlog(V x) {  // §5.2
  x = vdaz(x);
  V y = log_core(x);
  y = sel(x == kInf, splat<V>(kInf), y);
  y = sel(x == 0.0f, splat<V>(-kInf), y);
  y = sel(x < 0.0f, splat<V>(qnan()), y);
  return sel(x != x, x + x, y);
}

template <class V> inline V vrecip(V x) {  // §5.3
  x = vdaz(x);
  const auto s = ibits(x) & kSign, a = ibits(x) & ~kSign;
  V y = recip_core(x);
  y = sel(a == kExpMask, ifl(s), y);
  y = sel(a == 0, ifl(s | kExpMask), y);
  return sel(x != x, x + x, y);
}

template <class V> inline V vrsqrt(V x) {  // §5.4
  x = vdaz(x);
  V y = rsqrt_core(x);
  y = sel(x == kInf, splat<V>(0.0f), y);
  y = sel(x == 0.0f, splat<V>(kInf), y);
  y = sel(x < 0.0f, splat<V>(qnan()), y);
  return sel(x != x, x + x, y);
}

template <class V> inline V vsqrt(V x) {  // §5.4
  x = vdaz(x);
  V y = mul(x, vrsqrt(x));
  y = sel(x == kInf, splat<V>(kInf), y);
  return sel(x == 0.0f, x, y);
}

template <class V> inline V vsincos_q(V x, int32_t shift) {  // §5.5
  x = vdaz(x);
  const V y = sincos_core(x, shift);
  return sel(vabs(x) <= 65536.0f, y, splat<V>(qnan()));
}
template <class V> inline V vsin(V x) { return vsincos_q(x, 0); }
template <class V> inline V vcos(V x) { return vsincos_q(x, 1); }

template <class V> inline V vtanh(V x) {  // §5.8
  x = vdaz(x);
  const V a = vabs(x);
  V y = sel(a < 0.75f, tanh_poly(a), tanh_exp(a));
  y = sel(a < 10.0f, y, splat<V>(1.0f));
  y = ifl(ibits(y) | (ibits(x) & kSign));
  return sel(x != x, x + x, y);
}

template <class V> inline V verf(V x) {  // §5.9
  x = vdaz(x);
  const V a = vabs(x);
  V y = sel(a < 0.875f, erf_poly(a), erf_tail(a));
  y = sel(a < 3.92000008f, y, splat<V>(1.0f));
  y = ifl(ibits(y) | (ibits(x) & kSign));
  return sel(x != x, x + x, y);
}

// The canonical functions the GELU forms of contract.h (gelu_of, ...) call, on vectors.
struct VectorFns {
  template <class V> V exp(V x) const { return vexp(x); }
  template <class V> V tanh(V x) const { return vtanh(x); }
  template <class V> V erf(V x) const { return verf(x); }
};
template <class V> inline V vgelu(V x) { return gelu_of(x, VectorFns{}); }  // §5.6
template <class V> inline V vgelu_tanh(V x) { return gelu_tanh_of(x, VectorFns{}); }
template <class V> inline V vgelu_grad(V x) { return gelu_grad_of(x, VectorFns{}); }
template <class V> inline V vgelu_tanh_grad(V x) { return gelu_tanh_grad_of(x, VectorFns{}); }

// §5.6 from e = vexp(-x): a kernel may compute e in one pass over a row and finish in another
// (mlp.cpp), the same operations on the same values.
template <class V> inline V vsigmoid_of_exp(V e) { return vrecip(add(1.0f, e)); }
template <class V> inline V vsigmoid(V x) { return vsigmoid_of_exp(vexp(-x)); }  // §5.6

// §4.2's canonical sum and max on vectors, the same operations in the same order as csum / cmax
// (contract.h): partial l of the kLanes lane-strided partial results is lane l % VL of vector
// l / VL. term(i, m) returns the terms i .. i + VL - 1 as a vf of which the first m (1 <= m <= VL)
// are real. Whole blocks of kLanes terms, then the tail's vectors with the lanes past n masked
// (their partial stays as it was: padding with +0.0 would not do, as -0.0 + +0.0 is +0.0 and a
// partial sum can be -0.0 after a flush), then the fixed fold: its levels w >= VL are vector
// operations, the last log2(VL) run lane by lane.
//   float s = rp::vcsum(n, [x](int64_t i, int64_t m) { return rp::loadn(x + i, m); });
template <class Op, class Term>
inline float vreduce(int64_t n, float init, const Op& op, const Term& term) {
  constexpr int NV = kLanes / VL;
  vf p[NV];
  for (int u = 0; u < NV; ++u) p[u] = splat(init);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int u = 0; u < NV; ++u) p[u] = op(p[u], term(i + u * VL, VL));
  vi lane;
  for (int l = 0; l < VL; ++l) lane[l] = l;
  for (int u = 0; i + u * VL < n; ++u) {
    const int64_t m = n - i - u * VL < VL ? n - i - u * VL : VL;
    p[u] = sel(lane < (int32_t)m, op(p[u], term(i + u * VL, m)), p[u]);
  }
  for (int w = kLanes / 2; w >= VL; w >>= 1)
    for (int u = 0; u < w / VL; ++u) p[u] = op(p[u], p[u + w / VL]);
  float q[VL];
  __builtin_memcpy(q, &p[0], sizeof(q));
  for (int w = VL / 2; w >= 1; w >>= 1)
    for (int l = 0; l < w; ++l) q[l] = op(q[l], q[l + w]);
  return q[0];
}
template <class Term> inline float vcsum(int64_t n, const Term& term) {
  return vreduce(n, 0.0f, [](auto a, auto b) { return add(a, b); }, term);
}
template <class Term> inline float vcmax(int64_t n, const Term& term) {  // cmax's p = gt(t, p) ? t : p
  return vreduce(n, -kInf, [](auto p, auto t) { return sel(gt(t, p), t, p); }, term);
}
inline float vcsum_array(const float* x, int64_t n) {
  return vcsum(n, [x](int64_t i, int64_t m) { return loadn(x + i, m); });
}
inline float vcmax_array(const float* x, int64_t n) {
  return vcmax(n, [x](int64_t i, int64_t m) { return loadn(x + i, m); });
}

// y[i] = f(x[i]) for i in [0, n), VW lanes at a time (f takes and returns V: a generic lambda,
// [](auto v) {...}); the tail runs as a partial vector.
template <class V = vw, class F>
inline void vmap(const float* x, float* y, int64_t n, const F& f) {
  for (int64_t i = 0; i < n; i += kLanesOf<V>) storen(y + i, f(loadn<V>(x + i, n - i)), n - i);
}

}  // namespace rp
