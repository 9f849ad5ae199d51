// contract.h -- the arithmetic contract (kernels/README.md) as inline C++ building blocks.
//
// Every CPU kernel includes this file and uses only what it defines for floating point:
// the FP-mode guard (§3), the primitive operations rp::add / rp::sub / rp::mul / rp::gt (§2,
// §3: every float add, subtract and multiply of a kernel is written with them, so that x86's
// flush rule holds on AArch64 and on CPUs without a flush-to-zero mode), the parallel loop over
// output elements, the canonical sum and max (§4.2), the canonical functions
// exp/log/recip/rsqrt/sqrt/sin/cos/tanh/erf and the derived sigmoid and GELU forms (§5) and
// Philox (§6).
// Plain C++17, no torch headers: the standalone self-test (selftest.cpp) compiles it too.
// Build flags that the contract needs: -ffp-contract=off, no -ffast-math (see repops.py).
// Targets: x86-64 and AArch64 (hardware flush), anything else with FLT_EVAL_METHOD == 0
// through the software flush (riscv64 is tested under qemu-user).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "RepOps needs FLT_EVAL_METHOD == 0 (no x87 excess precision, no wider evaluation)"
#endif
#if defined(__FAST_MATH__)
#error "RepOps must not be built with -ffast-math (it reorders and contracts float arithmetic)"
#endif

// How §3 (flush to zero, tininess after rounding) is obtained (kernels/README.md §3):
//   RP_FLUSH_HW    x86-64: MXCSR FTZ|DAZ does exactly the contract's flush. add/sub/mul below
//                  are the plain operators: x86 code and bits are the contract's definition.
//   RP_FLUSH_FIXUP AArch64: FPCR.FZ flushes inputs and results, but decides tininess BEFORE
//                  rounding, so a product whose exact value lies in [2^-126 (1 - 2^-25), 2^-126)
//                  comes out 0 where x86 gives 2^-126. rp::mul repairs that window in software;
//                  sums need nothing (a sum that small is exact, so both rules agree).
//   RP_FLUSH_SOFT  everything else (riscv64 has no flush-to-zero mode), or any target built with
//                  -DRP_SOFT_FLUSH (the test build of this path on x86): IEEE subnormals stay on
//                  in hardware, and rp::add/sub/mul read subnormal inputs as zero and flush tiny
//                  results in software; comparisons of values that may be raw subnormal inputs
//                  go through rp::gt.
#if defined(RP_SOFT_FLUSH) || !(defined(__x86_64__) || defined(_M_X64) || defined(__aarch64__))
#define RP_FLUSH_SOFT 1
#elif defined(__aarch64__)
#define RP_FLUSH_FIXUP 1
#else
#define RP_FLUSH_HW 1
#endif
#if !defined(RP_FLUSH_SOFT)
#define RP_FLUSH_SOFT 0
#endif
#if !defined(RP_FLUSH_FIXUP)
#define RP_FLUSH_FIXUP 0
#endif
#if !defined(RP_FLUSH_HW)
#define RP_FLUSH_HW 0
#endif
#if RP_FLUSH_SOFT && !(defined(__x86_64__) || defined(_M_X64) || defined(__aarch64__))
#include <cfenv>
#endif

namespace rp {

// ---------------------------------------------------------------- §3 FP mode guard
// FTZ + DAZ + round-to-nearest for the current thread, restored on scope exit so that
// PyTorch's own thread pool is left as it was.
struct FpModeGuard {
#if defined(__x86_64__) || defined(_M_X64)
  unsigned saved;
  FpModeGuard() : saved(_mm_getcsr()) {
    // bits 15 (FTZ) and 6 (DAZ) on (off in the software-flush build), rounding control
    // (bits 13-14) = 00 (nearest).
    _mm_setcsr(RP_FLUSH_SOFT ? (saved & ~0x8040u & ~0x6000u) : ((saved | 0x8040u) & ~0x6000u));
  }
  ~FpModeGuard() { _mm_setcsr(saved); }
#elif defined(__aarch64__)
  uint64_t saved;
  FpModeGuard() {
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(saved));
    // FPCR.FZ (bit 24) on (off in the software-flush build); RMode (bits 22-23) = 00 (nearest).
    // FPCR.AH (FEAT_AFP) is left alone: rp::mul's fix-up is the one tested path.
    uint64_t mode = (RP_FLUSH_SOFT ? (saved & ~(1ull << 24)) : (saved | (1ull << 24))) & ~(3ull << 22);
    __asm__ __volatile__("msr fpcr, %0" : : "r"(mode));
  }
  ~FpModeGuard() { __asm__ __volatile__("msr fpcr, %0" : : "r"(saved)); }
#else
  // No flush-to-zero mode (riscv64, ...): only the rounding mode is set; rp::add/sub/mul flush.
  int saved;
  FpModeGuard() : saved(std::fegetround()) { std::fesetround(FE_TONEAREST); }
  ~FpModeGuard() { std::fesetround(saved); }
#endif
  FpModeGuard(const FpModeGuard&) = delete;
  FpModeGuard& operator=(const FpModeGuard&) = delete;
};

}  // namespace rp

// Provided by the host: binding.cpp (PyTorch's thread pool) or selftest.cpp (std::thread).
// Calls fn(ctx, begin, end) on disjoint chunks covering [0, n); chunks never split work
// along a reduction, only across output elements, so results do not depend on it.
void rp_parallel_for(int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t), void* ctx);
// The number of threads rp_parallel_for runs chunks on (the matmul sizes its blocks by it).
int rp_threads();

namespace rp {

// Runs f(begin, end) over chunks of [0, n) in the host's threads, each chunk inside the
// FP-mode guard (FTZ/DAZ must hold in every thread that runs kernel code).
template <class F>
inline void parallel_for(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
  rp_parallel_for(
      n, grain < 1 ? 1 : grain,
      [](void* ctx, int64_t b, int64_t e) {
        FpModeGuard guard;
        (*static_cast<const F*>(ctx))(b, e);
      },
      const_cast<void*>(static_cast<const void*>(&f)));
}

// ---------------------------------------------------------------- bit helpers
inline uint32_t bits(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }
inline float fl(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }
// 2^n as a float for -126 <= n <= 127 (exact).
inline float pow2(int32_t n) { return fl((uint32_t)(n + 127) << 23); }
// DAZ on the bit level: functions that read a float's bits see a subnormal as signed zero,
// exactly as the arithmetic units do in FTZ/DAZ mode.
inline float daz(float x) { uint32_t u = bits(x); return (u & 0x7F800000u) ? x : fl(u & 0x80000000u); }

constexpr float kInf = INFINITY;
inline float qnan() { return fl(0x7FC00000u); }
constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds |y| < 2^22 to an integer

// SIMD vectors of VL floats (GCC/Clang vector extensions): 8 on x86 (one AVX register; with
// AVX-512 too, where a bigger register file buys more registers rather than wider ones), 4 on
// AArch64 (one NEON register: GCC keeps wider generic vectors in memory there). Other targets
// get 8, which the compiler splits as it can. `vf * float` broadcasts; a cast between vf and vi
// reinterprets the bits.
#if defined(__aarch64__)
constexpr int VL = 4;
#else
constexpr int VL = 8;
#endif
typedef float vf __attribute__((vector_size(VL * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(VL * sizeof(float))));

inline int32_t ibits(float x) { return (int32_t)bits(x); }
inline float ifl(int32_t u) { return fl((uint32_t)u); }
inline vi ibits(vf x) { return (vi)x; }
inline vf ifl(vi u) { return (vf)u; }
inline float to_float(int32_t i) { return (float)i; }
inline vf to_float(vi i) { return __builtin_convertvector(i, vf); }

// vw: twice VL lanes with AVX-512 (16 floats, one zmm register), for loops whose per-element work
// is one long chain of dependent operations (a canonical function mapped over a row: vmath.h
// vmap, mlp.cpp): each instruction then carries twice the lanes of the chain. The same
// operations lane by lane as vf, so the same bits. Elsewhere vw is vf: with AVX2's 16 registers
// the wider chains spill (swiglu 2.5x slower, measured), and GCC keeps wider generic vectors in
// memory on AArch64.
#if defined(__AVX512F__)
constexpr int VW = 2 * VL;
typedef float vw __attribute__((vector_size(VW * sizeof(float))));
typedef int32_t vwi __attribute__((vector_size(VW * sizeof(float))));
inline vwi ibits(vw x) { return (vwi)x; }
inline vw ifl(vwi u) { return (vw)u; }
inline vw to_float(vwi i) { return __builtin_convertvector(i, vw); }
#else
constexpr int VW = VL;
typedef vf vw;
#endif
// c ? a : b, lane by lane for vectors (a compare gives 0 / -1 per lane).
template <class C, class T> inline T sel(C c, T a, T b) { return c ? a : b; }

constexpr int32_t kSign = (int32_t)0x80000000u, kExpMask = 0x7F800000, kMantMask = 0x007FFFFF;

// ---------------------------------------------------------------- §2/§3 primitive operations
// Every float add, subtract and multiply in the CPU kernels is written rp::add / rp::sub /
// rp::mul (scalar float, vf, or a vf with a float broadcast), so that the one rule of §3 holds
// on every instruction set:
//
//   x86 (RP_FLUSH_HW):       the plain operator: the same operations, so the same bits.
//   AArch64 (RP_FLUSH_FIXUP): mul(a, b): r = a * b; t = a * (b * 2^24);
//                            |t| == 2^-102 ? copysign(2^-126, r) : r
//   soft (RP_FLUSH_SOFT):    a, b read through daz; add/sub: r = a +- b, |r| < 2^-126 -> +-0;
//                            mul: r = a * b; t = a * (b * 2^24);
//                            |t| <  2^-102 ? copysign(0, r) : |t| == 2^-102 ? copysign(2^-126, r) : r
//
// Why (kernels/README.md §3): b * 2^24 is exact for a normal b, so t is the exact product times
// 2^24 rounded to 24 bits, and 2^-102 is a normal float: |t| == 2^-102 exactly when the product
// rounded to 24 bits with unbounded exponent is 2^-126 (x86 keeps it, AArch64's FZ flushes it
// when the exact value is below 2^-126), |t| < 2^-102 exactly when it is below 2^-126 (x86
// flushes; IEEE gradual underflow would give a subnormal, or round [2^-126 (1 - 2^-24),
// 2^-126 (1 - 2^-25)) up to 2^-126 a second time). When b * 2^24 overflows (|b| >= 2^104) the
// product is far from 2^-126 (or a NaN / zero), t is inf or NaN and r is kept. Sums of normal
// floats below 2^-126 are exact (multiples of 2^-149), so for them the two tininess rules agree.
constexpr int32_t kAbsMin = 0x00800000;      // bits of 2^-126 (FLT_MIN)
constexpr int32_t kAbsMin24 = 0x0C800000;    // bits of 2^-102 = 2^-126 * 2^24

// DAZ on the bit level, lane by lane: a subnormal reads as a zero of the same sign.
inline vf daz(vf x) { return sel((ibits(x) & kExpMask) != 0, x, ifl(ibits(x) & kSign)); }
#if defined(__AVX512F__)
inline vw daz(vw x) { return sel((ibits(x) & kExpMask) != 0, x, ifl(ibits(x) & kSign)); }
#endif

#if RP_FLUSH_HW
template <class A, class B> inline auto add(A a, B b) { return a + b; }
template <class A, class B> inline auto sub(A a, B b) { return a - b; }
template <class A, class B> inline auto mul(A a, B b) { return a * b; }
template <class A, class B> inline auto gt(A a, B b) { return a > b; }  // DAZ in hardware
#else
// The correction of a product r = a * b (a, b already flushed) from t = a * (b * 2^24).
template <class R, class T> inline R mul_fix(R r, T t) {
  const auto m = ibits(t) & ~kSign, s = ibits(r) & kSign;  // |t| as bits (NaN: above inf's)
#if RP_FLUSH_SOFT
  r = sel(m < kAbsMin24, ifl(s), r);                        // below 2^-126 after rounding
#endif
  return sel(m == kAbsMin24, ifl(s | kAbsMin), r);          // rounds to 2^-126: keep FLT_MIN
}
template <class A, class B> inline auto mul(A a, B b) {
#if RP_FLUSH_SOFT
  a = daz(a);
  b = daz(b);
#endif
  return mul_fix(a * b, a * (b * 0x1p24f));
}
#if RP_FLUSH_SOFT
template <class R> inline R flush_sum(R r) { return sel((ibits(r) & ~kSign) < kAbsMin, ifl(ibits(r) & kSign), r); }
template <class A, class B> inline auto add(A a, B b) { return flush_sum(daz(a) + daz(b)); }
template <class A, class B> inline auto sub(A a, B b) { return flush_sum(daz(a) - daz(b)); }
template <class A, class B> inline auto gt(A a, B b) { return daz(a) > daz(b); }
#else
template <class A, class B> inline auto add(A a, B b) { return a + b; }  // exact near 2^-126
template <class A, class B> inline auto sub(A a, B b) { return a - b; }
template <class A, class B> inline auto gt(A a, B b) { return a > b; }   // FZ reads inputs as 0
#endif
#endif

// ---------------------------------------------------------------- §4.2 canonical sum / max
constexpr int kLanes = 32;

// Adds term(i) for i in [0, n) into 32 lane-strided partial sums, then folds the fixed tree.
template <class Term>
inline float csum(int64_t n, const Term& term) {
  float p[kLanes];
  for (int l = 0; l < kLanes; ++l) p[l] = 0.0f;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) p[l] = add(p[l], term(i + l));
  for (int l = 0; i + l < n; ++l) p[l] = add(p[l], term(i + l));
  for (int w = kLanes / 2; w >= 1; w >>= 1)
    for (int l = 0; l < w; ++l) p[l] = add(p[l], p[l + w]);
  return p[0];
}

inline float csum_array(const float* x, int64_t n) {
  return csum(n, [x](int64_t i) { return x[i]; });
}

template <class Term>
inline float cmax(int64_t n, const Term& term) {
  float p[kLanes];
  for (int l = 0; l < kLanes; ++l) p[l] = -kInf;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) { float t = term(i + l); p[l] = gt(t, p[l]) ? t : p[l]; }
  for (int l = 0; i + l < n; ++l) { float t = term(i + l); p[l] = gt(t, p[l]) ? t : p[l]; }
  for (int w = kLanes / 2; w >= 1; w >>= 1)
    for (int l = 0; l < w; ++l) p[l] = gt(p[l + w], p[l]) ? p[l + w] : p[l];
  return p[0];
}

// ---------------------------------------------------------------- §5 canonical functions
// Each line is one rounded float operation, in the order the contract lists.
//
// The arithmetic of every function is written once, as a template (the *_core functions)
// over T = float or T = vf (VL lanes, vmath.h): only the handling of special inputs differs.
// The scalar forms below return early for them (the contract's text); the SIMD forms in
// vmath.h compute the core on every lane and select, so both give the same bits
// (tests/test_vmath.py checks this over every float32 in wide ranges).

// 2^n for -126 <= n <= 127 (exact), lane by lane.
template <class I> inline auto ipow2(I n) { return ifl((n + 127) << 23); }
// |x| = m * 2^e with m in [1, 2) for a normal x (the exponent field minus 127, and the mantissa).
template <class T> inline auto exponent_of(T x) { return ((ibits(x) >> 23) & 0xFF) - 127; }
template <class T> inline T mantissa_of(T x) { return ifl((ibits(x) & kMantMask) | 0x3F800000); }

// §5.1 for x already DAZ-read and inside [-87.34, 88.72].
template <class T> inline T exp_core(T x) {
  T t = mul(x, 1.44269502f);
  t = add(t, kMagic);
  auto n = ibits(t) - ibits(kMagic);
  T nf = sub(t, kMagic);
  T r = sub(x, mul(nf, 0.693359375f));
  r = sub(r, mul(nf, -2.12194440e-4f));
  T z = mul(r, r);
  T p = T{} + 1.9875691500e-4f;  // the constant (folded at build time; exact)
  p = add(mul(p, r), 1.3981999507e-3f);
  p = add(mul(p, r), 8.3334519073e-3f);
  p = add(mul(p, r), 4.1665795894e-2f);
  p = add(mul(p, r), 1.6666665459e-1f);
  p = add(mul(p, r), 5.0000001201e-1f);
  T y = add(add(mul(p, z), r), 1.0f);
  auto n1 = n >> 1, n2 = n - n1;
  return mul(mul(y, ipow2(n1)), ipow2(n2));
}

// §5.2 for a positive normal x (after DAZ).
template <class T> inline T log_core(T x) {
  auto e = exponent_of(x);
  T m = mantissa_of(x);
  const auto big = m > 1.41421356f;
  m = sel(big, mul(m, 0.5f), m);
  e = sel(big, e + 1, e);
  T f = sub(m, 1.0f);
  T ef = to_float(e);
  T z = mul(f, f);
  T p = T{} + 7.0376836292e-2f;  // the constant (folded at build time; exact)
  p = add(mul(p, f), -1.1514610310e-1f);
  p = add(mul(p, f), 1.1676998740e-1f);
  p = add(mul(p, f), -1.2420140846e-1f);
  p = add(mul(p, f), 1.4249322787e-1f);
  p = add(mul(p, f), -1.6668057665e-1f);
  p = add(mul(p, f), 2.0000714765e-1f);
  p = add(mul(p, f), -2.4999993993e-1f);
  p = add(mul(p, f), 3.3333331174e-1f);
  T y = mul(mul(f, z), p);
  y = add(y, mul(ef, -2.12194440e-4f));
  y = sub(y, mul(0.5f, z));
  y = add(f, y);
  return add(y, mul(ef, 0.693359375f));
}

// §5.3 for a nonzero finite x (after DAZ); the sign is copied onto the result.
template <class T> inline T recip_core(T x) {
  const auto s = ibits(x) & kSign;
  const auto k = exponent_of(x);
  const T m = mantissa_of(x);
  T y = sub(1.41176474f, mul(0.470588237f, m));  // 24/17 - 8/17 m
  for (int it = 0; it < 3; ++it) {
    T e = sub(1.0f, mul(m, y));
    y = add(y, mul(y, e));
  }
  const auto nk = -k, k1 = nk >> 1, k2 = nk - k1;
  const T r = mul(mul(y, ipow2(k1)), ipow2(k2));
  return ifl(ibits(r) | s);
}

// §5.4 for a positive normal x (after DAZ). j = k/2 for even k and (k-1)/2 for odd k is k >> 1;
// the mantissa goes to [2, 4) (one more exponent bit) for odd k.
template <class T> inline T rsqrt_core(T x) {
  const auto k = exponent_of(x);
  const T m = ifl((ibits(x) & kMantMask) | (0x3F800000 + ((k & 1) << 23)));
  const auto j = k >> 1;
  T y = ifl(0x5F375A86 - (ibits(m) >> 1));  // bits(m) is positive: the shift is logical
  const T h = mul(0.5f, m);
  for (int it = 0; it < 3; ++it) y = mul(y, sub(1.5f, mul(mul(h, y), y)));
  return mul(y, ipow2(-j));
}

// §5.5 for |x| <= 65536 (after DAZ): the shared range reduction, both polynomials, and the
// quadrant (j + shift) & 3 picking one of sinr, cosr, -sinr, -cosr.
template <class T> inline T sincos_core(T x, int32_t shift) {
  T t = mul(x, 0.636619747f);
  t = add(t, kMagic);
  auto j = ibits(t) - ibits(kMagic);
  T jf = sub(t, kMagic);
  T r = sub(x, mul(jf, 1.5703125f));
  r = sub(r, mul(jf, 4.84466552734375e-4f));
  r = sub(r, mul(jf, -6.407499313354492e-7f));
  r = sub(r, mul(jf, 9.920936294705e-10f));
  T z = mul(r, r);
  T s = mul(add(mul(add(mul(-1.9515295891e-4f, z), 8.3321608736e-3f), z), -1.6666654611e-1f), z);
  T sinr = add(mul(s, r), r);
  T c = mul(add(mul(add(mul(2.443315711809948e-5f, z), -1.388731625493765e-3f), z), 4.166664568298827e-2f), z);
  T cosr = add(sub(mul(c, z), mul(0.5f, z)), 1.0f);
  const auto q = (j + shift) & 3;
  const T v = sel((q & 1) != 0, cosr, sinr);
  return sel((q & 2) != 0, -v, v);
}

inline float exp(float x) {  // §5.1
  x = daz(x);
  if (x != x) return x + x;
  if (x > 88.72283935546875f) return kInf;
  if (x < -87.33654022216797f) return 0.0f;
  return exp_core(x);
}

inline float log(float x) {  // §5.2
  x = daz(x);
  if (x != x) return x + x;
  if (x < 0.0f) return qnan();
  if (x == 0.0f) return -kInf;
  if (x == kInf) return kInf;
  return log_core(x);
}

inline float recip(float x) {  // §5.3
  x = daz(x);
  if (x != x) return x + x;
  uint32_t b = bits(x), s = b & 0x80000000u;
  if ((b & 0x7FFFFFFFu) == 0) return fl(s | 0x7F800000u);
  if ((b & 0x7FFFFFFFu) == 0x7F800000u) return fl(s);
  return recip_core(x);
}

inline float rsqrt(float x) {  // §5.4
  x = daz(x);
  if (x != x) return x + x;
  if (x < 0.0f) return qnan();
  if (x == 0.0f) return kInf;
  if (x == kInf) return 0.0f;
  return rsqrt_core(x);
}

inline float sqrt(float x) {  // §5.4
  x = daz(x);
  if (x == 0.0f) return x;
  if (x == kInf) return kInf;
  return mul(x, rsqrt(x));
}

inline float sincos_q(float x, int32_t shift) {  // §5.5
  x = daz(x);
  if (!(std::fabs(x) <= 65536.0f)) return qnan();
  return sincos_core(x, shift);
}
inline float sin(float x) { return sincos_q(x, 0); }
inline float cos(float x) { return sincos_q(x, 1); }  // cos(x) = sin(x + pi/2): quadrant + 1

// §5.8 tanh for 0 <= a < 0.75: the odd polynomial a + a (z P(z)), z = a^2.
template <class T> inline T tanh_poly(T a) {
  const T z = mul(a, a);
  T p = T{} + 1.736929175e-03f;  // the constant (folded at build time; exact)
  p = add(mul(p, z), -7.657245267e-03f);
  p = add(mul(p, z), 2.145202830e-02f);
  p = add(mul(p, z), -5.389272422e-02f);
  p = add(mul(p, z), 1.333269477e-01f);
  p = add(mul(p, z), -3.333331645e-01f);
  return add(a, mul(a, mul(z, p)));
}

// §5.8 tanh for 0.75 <= a < 10: 1 - 2 recip(exp(2a) + 1) (2a in [1.5, 20], inside exp's range).
template <class T> inline T tanh_exp(T a) {
  const T e = exp_core(add(a, a));
  return sub(1.0f, mul(2.0f, recip_core(add(e, 1.0f))));
}

// §5.9 erf for 0 <= a < 0.875: a + a P(a^2), computed on b = a 2^24 and scaled back (both exact):
// a * p alone would flush to zero for a < 2^-123, where erf(a) is 1.128 a, not a.
template <class T> inline T erf_poly(T a) {
  const T z = mul(a, a);
  T p = T{} + -6.203253870e-04f;
  p = add(mul(p, z), 5.032181274e-03f);
  p = add(mul(p, z), -2.679146267e-02f);
  p = add(mul(p, z), 1.128245518e-01f);
  p = add(mul(p, z), -3.761255145e-01f);
  p = add(mul(p, z), 1.283791661e-01f);
  const T b = mul(a, 0x1p24f);
  return mul(add(b, mul(b, p)), 0x1p-24f);
}

// §5.9 erf for 0.875 <= a < 3.92: 1 - exp(-a^2) Q(a - 2) (-a^2 in [-15.4, -0.76], inside exp's
// range).
template <class T> inline T erf_tail(T a) {
  const T e = exp_core(-mul(a, a));
  const T t = sub(a, 2.0f);
  T q = T{} + -3.806890891e-05f;
  q = add(mul(q, t), 5.693807543e-05f);
  q = add(mul(q, t), -1.361304312e-04f);
  q = add(mul(q, t), 6.189764244e-04f);
  q = add(mul(q, t), -1.856133924e-03f);
  q = add(mul(q, t), 5.419227295e-03f);
  q = add(mul(q, t), -1.546066254e-02f);
  q = add(mul(q, t), 4.180577025e-02f);
  q = add(mul(q, t), -1.067960113e-01f);
  q = add(mul(q, t), 2.553956509e-01f);
  return sub(1.0f, mul(e, q));
}

inline float tanh(float x) {  // §5.8
  x = daz(x);
  if (x != x) return x + x;
  const uint32_t s = bits(x) & 0x80000000u;
  const float a = fl(bits(x) & 0x7FFFFFFFu);
  const float y = a < 0.75f ? tanh_poly(a) : a < 10.0f ? tanh_exp(a) : 1.0f;
  return fl(bits(y) | s);
}

inline float erf(float x) {  // §5.9
  x = daz(x);
  if (x != x) return x + x;
  const uint32_t s = bits(x) & 0x80000000u;
  const float a = fl(bits(x) & 0x7FFFFFFFu);
  const float y = a < 0.875f ? erf_poly(a) : a < 3.92000008f ? erf_tail(a) : 1.0f;
  return fl(bits(y) | s);
}

// §5.6: the GELU forms, each written once over T = float or a vector (vmath.h), with F the
// matching canonical functions (ScalarFns below, vmath.h's VectorFns). Host constants:
// f32(1/sqrt(2)) 0x3F3504F3, f32(sqrt(2/pi)) 0x3F4C422A, f32(0.044715) 0x3D372713, its float
// product with 3 0x3E095D4E, f32(1/sqrt(2 pi)) 0x3ECC422A.
constexpr float kRsqrt2 = 7.071067691e-01f, kGeluBeta = 7.978845835e-01f, kGeluKappa = 4.471499845e-02f,
                kGeluKappa3 = 1.341449916e-01f, kRsqrt2Pi = 3.989422917e-01f;

struct ScalarFns {
  float exp(float x) const { return rp::exp(x); }
  float tanh(float x) const { return rp::tanh(x); }
  float erf(float x) const { return rp::erf(x); }
};

// gelu(x) = (x * 0.5) * (1 + erf(x * f32(1/sqrt 2))): PyTorch's F.gelu (approximate='none').
template <class T, class F> inline T gelu_of(T x, F f) {
  return mul(mul(x, 0.5f), add(1.0f, f.erf(mul(x, kRsqrt2))));
}

// F.gelu(x, approximate='tanh'): (0.5 * x) * (1 + tanh(beta * (x + kappa * ((x * x) * x)))).
template <class T, class F> inline T gelu_tanh_of(T x, F f) {
  const T w = mul(kGeluBeta, add(x, mul(kGeluKappa, mul(mul(x, x), x))));
  return mul(mul(0.5f, x), add(1.0f, f.tanh(w)));
}

// d gelu / dx = 0.5 (1 + erf(x f32(1/sqrt 2))) + x (f32(1/sqrt(2 pi)) exp((x * x) * -0.5)), the
// factor of PyTorch's gelu_backward (approximate='none'): g * gelu_grad(x).
template <class T, class F> inline T gelu_grad_of(T x, F f) {
  const T cdf = mul(0.5f, add(1.0f, f.erf(mul(x, kRsqrt2))));
  const T pdf = mul(kRsqrt2Pi, f.exp(mul(mul(x, x), -0.5f)));
  return add(cdf, mul(x, pdf));
}

// d gelu_tanh / dx in PyTorch's gelu_backward (approximate='tanh') order.
template <class T, class F> inline T gelu_tanh_grad_of(T x, F f) {
  const T x2 = mul(x, x);
  const T t = f.tanh(mul(kGeluBeta, add(x, mul(kGeluKappa, mul(x2, x)))));
  const T left_derivative = mul(0.5f, add(1.0f, t));
  const T tanh_derivative = sub(1.0f, mul(t, t));
  const T inner_derivative = mul(kGeluBeta, add(1.0f, mul(kGeluKappa3, x2)));
  return add(left_derivative, mul(mul(mul(0.5f, x), tanh_derivative), inner_derivative));
}

inline float sigmoid(float x) { return recip(add(1.0f, exp(-x))); }  // §5.6
inline float gelu(float x) { return gelu_of(x, ScalarFns{}); }
inline float gelu_tanh(float x) { return gelu_tanh_of(x, ScalarFns{}); }
inline float gelu_grad(float x) { return gelu_grad_of(x, ScalarFns{}); }
inline float gelu_tanh_grad(float x) { return gelu_tanh_grad_of(x, ScalarFns{}); }

// ---------------------------------------------------------------- §6 Philox4x32-10
struct Philox4 { uint32_t w[4]; };

inline Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                             uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0;
    uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

inline float uniform_from_word(uint32_t w) { return mul((float)(w >> 8), 5.9604644775390625e-8f); }

// Box-Muller on two words: (z0, z1) = rad * (cos th, sin th).
inline void normal_pair(uint32_t w0, uint32_t w1, float* z0, float* z1) {
  float u1 = mul((float)((w0 >> 8) + 1u), 5.9604644775390625e-8f);  // (0, 1]
  float u2 = mul((float)(w1 >> 8), 5.9604644775390625e-8f);         // [0, 1)
  float rad = sqrt(mul(-2.0f, log(u1)));
  float th = mul(u2, 6.28318548f);
  *z0 = mul(rad, cos(th));
  *z1 = mul(rad, sin(th));
}

}  // namespace rp
