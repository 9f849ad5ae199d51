// vmath.h -- the canonical functions of contract §5 on VL lanes at once (contract.h: 8 on x86,
// 4 on AArch64), branch-free.
//
// Each function runs the shared *_core arithmetic of contract.h on every lane, then selects
// the special-case results (NaN, zeros, infinities, out-of-range) the scalar form returns
// early, so every lane has the bits of the scalar function (tests/test_vmath.py checks that
// over every float32 in wide ranges, on x86 and under qemu for AArch64). Lanes whose input is
// special compute garbage in the core (no traps: FP exceptions are masked) and are replaced.
//
//   rp::vf x = rp::loadn(p, n);        // min(n, VL) floats; missing lanes read +0.0
//   rp::storen(q, rp::vexp(x), n);
//   rp::vmap(x, y, n, [](rp::vf v) { return rp::vsigmoid(v); });   // y[i] = f(x[i]) for i < n
#pragma once

#include "contract.h"

namespace rp {

inline vf splat(float c) { return vf{} + c; }  // +0 + c = c (exact)
// Loads / stores min(n, VL) floats (n >= 1). The full case is its own branch so that it is one
// vector move rather than a variable-length copy.
inline vf loadn(const float* p, int64_t n = VL) {
  vf v = {};
  if (n >= VL) __builtin_memcpy(&v, p, sizeof(vf));
  else __builtin_memcpy(&v, p, n * sizeof(float));
  return v;
}
inline void storen(float* p, vf v, int64_t n = VL) {
  if (n >= VL) __builtin_memcpy(p, &v, sizeof(vf));
  else __builtin_memcpy(p, &v, n * sizeof(float));
}

// DAZ on the bit level (contract.h daz), lane by lane.
inline vf vdaz(vf x) { return daz(x); }
inline vf vabs(vf x) { return ifl(ibits(x) & ~kSign); }

inline vf vexp(vf x) {  // §5.1
  x = vdaz(x);
  vf y = exp_core(x);
  y = sel(x > 88.72283935546875f, splat(kInf), y);
  y = sel(x < -87.33654022216797f, splat(0.0f), y);
  return sel(x != x, x + x, y);
}

inline vf vlog(vf x) {  // §5.2
  x = vdaz(x);
  vf y = log_core(x);
  y = sel(x == kInf, splat(kInf), y);
  y = sel(x == 0.0f, splat(-kInf), y);
  y = sel(x < 0.0f, splat(qnan()), y);
  return sel(x != x, x + x, y);
}

inline vf vrecip(vf x) {  // §5.3
  x = vdaz(x);
  const vi s = ibits(x) & kSign, a = ibits(x) & ~kSign;
  vf y = recip_core(x);
  y = sel(a == kExpMask, ifl(s), y);
  y = sel(a == 0, ifl(s | kExpMask), y);
  return sel(x != x, x + x, y);
}

inline vf vrsqrt(vf x) {  // §5.4
  x = vdaz(x);
  vf y = rsqrt_core(x);
  y = sel(x == kInf, splat(0.0f), y);
  y = sel(x == 0.0f, splat(kInf), y);
  y = sel(x < 0.0f, splat(qnan()), y);
  return sel(x != x, x + x, y);
}

inline vf vsqrt(vf x) {  // §5.4
  x = vdaz(x);
  vf y = mul(x, vrsqrt(x));
  y = sel(x == kInf, splat(kInf), y);
  return sel(x == 0.0f, x, y);
}

inline vf vsincos_q(vf x, int32_t shift) {  // §5.5
  x = vdaz(x);
  const vf y = sincos_core(x, shift);
  return sel(vabs(x) <= 65536.0f, y, splat(qnan()));
}
inline vf vsin(vf x) { return vsincos_q(x, 0); }
inline vf vcos(vf x) { return vsincos_q(x, 1); }

inline vf vsigmoid(vf x) { return vrecip(add(1.0f, vexp(-x))); }  // §5.6

// y[i] = f(x[i]) for i in [0, n), VL lanes at a time; the tail runs as a partial vector.
template <class F>
inline void vmap(const float* x, float* y, int64_t n, const F& f) {
  for (int64_t i = 0; i < n; i += VL) storen(y + i, f(loadn(x + i, n - i)), n - i);
}

}  // namespace rp
