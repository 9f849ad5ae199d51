// canonical.h -- the arithmetic contract (kernels/README.md) for Metal kernels: rounded
// primitives that never fuse (§2), the flush-to-zero rule done in software (§3), the
// threadgroup form of the canonical sum and max (§4.2), the canonical functions
// exp/log/recip/rsqrt/sqrt/sin/cos/tanh/erf, the derived sigmoid and GELU forms (§5) and
// Philox (§6). Every .metal source of this folder includes it; repops_mps.py pastes it in place
// of the #include before torch.mps.compile_shader (which has no include path), and
// tests/metal_shim/ compiles the same text as C++ with g++ to check the kernels' bits on the CPU.
//
// The function bodies mirror kernels/cuda/canonical.cuh line for line: same constants, same
// operations, same order. Every float add, subtract and multiply is written fadd/fsub/fmul.
//
// §2: every source starts with `#pragma METAL fp contract(off)`: Metal's "safe" math mode
// still contracts a*b + c into an FMA, the pragma keeps them separate. No Metal math function
// (precise or fast), no division and no sqrt instruction is used.
//
// §3 in software, whatever the GPU does. Apple GPUs flush subnormals in hardware, but whether a
// product is tiny before or after rounding, and which sign a flushed sum gets, is not
// documented. So the rule does not depend on it: operands are read through daz() (bit test), a
// sum whose result is below 2^-126 becomes a zero with the sign of the exact sum, and a product
// is decided on t = a * (b * 2^24) (exact scaling of a normal b, the exact product times 2^24
// rounded to 24 bits in the normal range): |t| < 2^-102 flushes to a zero with the product's
// sign, |t| == 2^-102 gives 2^-126, otherwise the hardware product stands (it is normal and
// correctly rounded then). That is the software-flush path of kernels/cpu/contract.h (the
// riscv64 one), with signs taken from the operands instead of from a possibly flushed result;
// it gives the contract's bits on hardware with gradual underflow, with FTZ deciding tininess
// after rounding, or before it (tests/test_metal_emulated.py runs all three on the CPU: x86
// without and with FTZ/DAZ, and AArch64 with FPCR.FZ under qemu-user).
#pragma METAL fp contract(off)
#pragma once

#if defined(__METAL_VERSION__)
#include <metal_stdlib>
using namespace metal;
// Threadgroup arrays are declared RP_THREADGROUP: one copy shared by the group's threads (the
// CPU shim defines it as static, since there groups run one after another).
#define RP_THREADGROUP threadgroup
#endif

// The position arguments every kernel ends with (one-dimensional grids and groups).
#define RP_POS                                                                                        \
  uint tid [[thread_position_in_grid]], uint nthreads [[threads_per_grid]],                          \
      uint lid [[thread_position_in_threadgroup]], uint gid [[threadgroup_position_in_grid]],        \
      uint ngroups [[threadgroups_per_grid]]

// ---------------------------------------------------------------- bit helpers (exact)
inline uint bits(float x) { return as_type<uint>(x); }
inline float fl(uint u) { return as_type<float>(u); }
inline float neg(float x) { return fl(bits(x) ^ 0x80000000u); }
inline float fabs_bits(float x) { return fl(bits(x) & 0x7FFFFFFFu); }
// 2^n as a float for -126 <= n <= 127 (exact).
inline float pow2(int n) { return fl((uint)(n + 127) << 23); }
// DAZ on the bit level: a subnormal reads as a signed zero.
inline float daz(float x) { const uint u = bits(x); return (u & 0x7F800000u) ? x : fl(u & 0x80000000u); }
inline float inf_f() { return fl(0x7F800000u); }
inline float qnan_f() { return fl(0x7FC00000u); }
constant constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds |y| < 2^22 to an integer

// ---------------------------------------------------------------- §2/§3 primitives
// a + b, flushed: exact sums of flushed operands below 2^-126 become a zero. A zero result that
// is not an exact cancellation (da != -db) was a tiny sum the hardware flushed: its sign is the
// sign of the larger operand (they have opposite signs then).
inline float fadd(float a, float b) {
  const float da = daz(a), db = daz(b);
  const float r = da + db;
  const uint u = bits(r);
  if ((u & 0x7F800000u) != 0) return r;               // normal, infinite or NaN
  if ((u & 0x7FFFFFFFu) != 0) return fl(u & 0x80000000u);   // a subnormal sum (gradual underflow)
  if (da == neg(db)) return r;                        // exact zero: IEEE's sign rule stands
  return fl((fabs_bits(da) > fabs_bits(db) ? bits(da) : bits(db)) & 0x80000000u);
}
// a - b is a + (-b) bit for bit (IEEE, also for signed zeros).
inline float fsub(float a, float b) { return fadd(a, neg(b)); }
inline float fmul(float a, float b) {
  const float da = daz(a), db = daz(b);
  const float r = da * db;
  const float t = fabs_bits(da * (db * 16777216.0f));  // |exact product| * 2^24, rounded to 24 bits
  const uint s = (bits(da) ^ bits(db)) & 0x80000000u;  // the product's sign
  if (t < fl(0x0C800000u)) return fl(s);               // below 2^-102: flushed (NaN compares false)
  if (t == fl(0x0C800000u)) return fl(s | 0x00800000u);  // 2^-126 after rounding
  return r;
}
// float(c) of an int32 rounded to nearest even (contract §10's GEMM output) with no conversion that
// rounds: the high part (a multiple of 256 below 2^31 in magnitude: 24 significant bits at most)
// and the low byte convert exactly, and one fadd rounds their exact sum once. A plain (float)c
// above 2^24 rounds by the compiler's conversion mode: to nearest even by MSL's default, toward
// zero under MTLCompileOptions.floatingPointConversionRoundingMode (tests/test_metal_emulated.py
// runs the kernels with every (float) conversion rounding toward zero).
inline float i32_to_float(int c) {
  const int low = c & 0xFF;
  return fadd((float)(c - low), (float)low);
}
// x > y on DAZ-read values (the canonical max compares raw inputs, contract §3).
inline bool gt(float x, float y) { return daz(x) > daz(y); }
inline bool is_nan(float x) { return (bits(x) & 0x7FFFFFFFu) > 0x7F800000u; }

// ---------------------------------------------------------------- §5 canonical functions
inline float rp_exp(float x) {  // §5.1
  x = daz(x);
  if (is_nan(x)) return fadd(x, x);
  if (x > 88.72283935546875f) return inf_f();
  if (x < -87.33654022216797f) return 0.0f;
  float t = fmul(x, 1.44269502f);
  t = fadd(t, kMagic);
  const int n = (int)(bits(t) - bits(kMagic));
  const float nf = fsub(t, kMagic);
  float r = fsub(x, fmul(nf, 0.693359375f));
  r = fsub(r, fmul(nf, -2.12194440e-4f));
  const float z = fmul(r, r);
  float p = 1.9875691500e-4f;
  p = fadd(fmul(p, r), 1.3981999507e-3f);
  p = fadd(fmul(p, r), 8.3334519073e-3f);
  p = fadd(fmul(p, r), 4.1665795894e-2f);
  p = fadd(fmul(p, r), 1.6666665459e-1f);
  p = fadd(fmul(p, r), 5.0000001201e-1f);
  const float y = fadd(fadd(fmul(p, z), r), 1.0f);
  const int n1 = n >> 1, n2 = n - n1;
  return fmul(fmul(y, pow2(n1)), pow2(n2));
}

inline float rp_log(float x) {  // §5.2
  x = daz(x);
  if (is_nan(x)) return fadd(x, x);
  if (x < 0.0f) return qnan_f();
  if (x == 0.0f) return neg(inf_f());
  if (x == inf_f()) return inf_f();
  const uint b = bits(x);
  int e = (int)((b >> 23) & 0xFFu) - 127;
  float m = fl((b & 0x007FFFFFu) | 0x3F800000u);
  if (m > 1.41421356f) { m = fmul(m, 0.5f); e = e + 1; }
  const float f = fsub(m, 1.0f);
  const float ef = (float)e;
  const float z = fmul(f, f);
  float p = 7.0376836292e-2f;
  p = fadd(fmul(p, f), -1.1514610310e-1f);
  p = fadd(fmul(p, f), 1.1676998740e-1f);
  p = fadd(fmul(p, f), -1.2420140846e-1f);
  p = fadd(fmul(p, f), 1.4249322787e-1f);
  p = fadd(fmul(p, f), -1.6668057665e-1f);
  p = fadd(fmul(p, f), 2.0000714765e-1f);
  p = fadd(fmul(p, f), -2.4999993993e-1f);
  p = fadd(fmul(p, f), 3.3333331174e-1f);
  float y = fmul(fmul(f, z), p);
  y = fadd(y, fmul(ef, -2.12194440e-4f));
  y = fsub(y, fmul(0.5f, z));
  y = fadd(f, y);
  return fadd(y, fmul(ef, 0.693359375f));
}

inline float rp_recip(float x) {  // §5.3
  x = daz(x);
  if (is_nan(x)) return fadd(x, x);
  const uint b = bits(x), s = b & 0x80000000u;
  if ((b & 0x7FFFFFFFu) == 0) return fl(s | 0x7F800000u);
  if ((b & 0x7FFFFFFFu) == 0x7F800000u) return fl(s);
  const int k = (int)((b >> 23) & 0xFFu) - 127;
  const float m = fl((b & 0x007FFFFFu) | 0x3F800000u);
  float y = fsub(1.41176474f, fmul(0.470588237f, m));  // 24/17 - 8/17 m
  for (int it = 0; it < 3; ++it) {
    const float e = fsub(1.0f, fmul(m, y));
    y = fadd(y, fmul(y, e));
  }
  const int nk = -k, k1 = nk >> 1, k2 = nk - k1;
  const float r = fmul(fmul(y, pow2(k1)), pow2(k2));
  return fl(bits(r) | s);
}

inline float rp_rsqrt(float x) {  // §5.4
  x = daz(x);
  if (is_nan(x)) return fadd(x, x);
  if (x < 0.0f) return qnan_f();
  if (x == 0.0f) return inf_f();
  if (x == inf_f()) return 0.0f;
  const uint b = bits(x);
  const int k = (int)((b >> 23) & 0xFFu) - 127;
  float m;
  int j;
  if ((k & 1) == 0) { m = fl((b & 0x007FFFFFu) | 0x3F800000u); j = k / 2; }
  else              { m = fl((b & 0x007FFFFFu) | 0x40000000u); j = (k - 1) / 2; }
  float y = fl(0x5F375A86u - (bits(m) >> 1));
  const float h = fmul(0.5f, m);
  for (int it = 0; it < 3; ++it) y = fmul(y, fsub(1.5f, fmul(fmul(h, y), y)));
  return fmul(y, pow2(-j));
}

inline float rp_sqrt(float x) {  // §5.4
  x = daz(x);
  if (x == 0.0f) return x;
  if (x == inf_f()) return inf_f();
  return fmul(x, rp_rsqrt(x));
}

// §5.5: the shared range reduction and both polynomials; the quadrant picks the result.
inline float rp_sincos_q(float x, int shift) {
  x = daz(x);
  if (!(fabs_bits(x) <= 65536.0f)) return qnan_f();
  float t = fmul(x, 0.636619747f);
  t = fadd(t, kMagic);
  const int j = (int)(bits(t) - bits(kMagic));
  const float jf = fsub(t, kMagic);
  float r = fsub(x, fmul(jf, 1.5703125f));
  r = fsub(r, fmul(jf, 4.84466552734375e-4f));
  r = fsub(r, fmul(jf, -6.407499313354492e-7f));
  r = fsub(r, fmul(jf, 9.920936294705e-10f));
  const float z = fmul(r, r);
  const float s = fmul(fadd(fmul(fadd(fmul(-1.9515295891e-4f, z), 8.3321608736e-3f), z), -1.6666654611e-1f), z);
  const float sinr = fadd(fmul(s, r), r);
  const float c = fmul(fadd(fmul(fadd(fmul(2.443315711809948e-5f, z), -1.388731625493765e-3f), z),
                            4.166664568298827e-2f), z);
  const float cosr = fadd(fsub(fmul(c, z), fmul(0.5f, z)), 1.0f);
  switch ((j + shift) & 3) {
    case 0: return sinr;
    case 1: return cosr;
    case 2: return neg(sinr);
    default: return neg(cosr);
  }
}
inline float rp_sin(float x) { return rp_sincos_q(x, 0); }
inline float rp_cos(float x) { return rp_sincos_q(x, 1); }  // cos(x) = sin(x + pi/2): quadrant + 1

inline float rp_sigmoid(float x) { return rp_recip(fadd(1.0f, rp_exp(neg(x)))); }  // §5.6

// §5.8: odd, so computed on a = |x| and given x's sign.
inline float rp_tanh(float x) {
  x = daz(x);
  if (is_nan(x)) return fadd(x, x);
  const uint s = bits(x) & 0x80000000u;
  const float a = fabs_bits(x);
  float y;
  if (a < 0.75f) {  // the odd polynomial a + a (z P(z))
    const float z = fmul(a, a);
    float p = 1.736929175e-03f;
    p = fadd(fmul(p, z), -7.657245267e-03f);
    p = fadd(fmul(p, z), 2.145202830e-02f);
    p = fadd(fmul(p, z), -5.389272422e-02f);
    p = fadd(fmul(p, z), 1.333269477e-01f);
    p = fadd(fmul(p, z), -3.333331645e-01f);
    y = fadd(a, fmul(a, fmul(z, p)));
  } else if (a < 10.0f) {  // 1 - 2 recip(exp(2a) + 1)
    const float e = rp_exp(fadd(a, a));
    y = fsub(1.0f, fmul(2.0f, rp_recip(fadd(e, 1.0f))));
  } else {
    y = 1.0f;
  }
  return fl(bits(y) | s);
}

// §5.9: odd, so computed on a = |x| and given x's sign.
inline float rp_erf(float x) {
  x = daz(x);
  if (is_nan(x)) return fadd(x, x);
  const uint s = bits(x) & 0x80000000u;
  const float a = fabs_bits(x);
  float y;
  if (a < 0.875f) {  // a + a P(a^2), on b = a 2^24 (a P alone would flush for a < 2^-123)
    const float z = fmul(a, a);
    float p = -6.203253870e-04f;
    p = fadd(fmul(p, z), 5.032181274e-03f);
    p = fadd(fmul(p, z), -2.679146267e-02f);
    p = fadd(fmul(p, z), 1.128245518e-01f);
    p = fadd(fmul(p, z), -3.761255145e-01f);
    p = fadd(fmul(p, z), 1.283791661e-01f);
    const float b = fmul(a, 16777216.0f);
    y = fmul(fadd(b, fmul(b, p)), 5.9604644775390625e-8f);
  } else if (a < 3.92000008f) {  // 1 - exp(-a^2) Q(a - 2)
    const float e = rp_exp(neg(fmul(a, a)));
    const float t = fsub(a, 2.0f);
    float q = -3.806890891e-05f;
    q = fadd(fmul(q, t), 5.693807543e-05f);
    q = fadd(fmul(q, t), -1.361304312e-04f);
    q = fadd(fmul(q, t), 6.189764244e-04f);
    q = fadd(fmul(q, t), -1.856133924e-03f);
    q = fadd(fmul(q, t), 5.419227295e-03f);
    q = fadd(fmul(q, t), -1.546066254e-02f);
    q = fadd(fmul(q, t), 4.180577025e-02f);
    q = fadd(fmul(q, t), -1.067960113e-01f);
    q = fadd(fmul(q, t), 2.553956509e-01f);
    y = fsub(1.0f, fmul(e, q));
  } else {
    y = 1.0f;
  }
  return fl(bits(y) | s);
}

// §5.6 the GELU forms (PyTorch's operation order). f32(1/sqrt 2), f32(sqrt(2/pi)), f32(0.044715), its float
// product with 3, f32(1/sqrt(2 pi)).
constant constexpr float kRsqrt2 = 7.071067691e-01f, kGeluBeta = 7.978845835e-01f, kGeluKappa = 4.471499845e-02f,
                         kGeluKappa3 = 1.341449916e-01f, kRsqrt2Pi = 3.989422917e-01f;
inline float rp_gelu(float x) { return fmul(fmul(x, 0.5f), fadd(1.0f, rp_erf(fmul(x, kRsqrt2)))); }
inline float rp_gelu_tanh(float x) {
  const float w = fmul(kGeluBeta, fadd(x, fmul(kGeluKappa, fmul(fmul(x, x), x))));
  return fmul(fmul(0.5f, x), fadd(1.0f, rp_tanh(w)));
}
inline float rp_gelu_grad(float x) {
  const float cdf = fmul(0.5f, fadd(1.0f, rp_erf(fmul(x, kRsqrt2))));
  const float pdf = fmul(kRsqrt2Pi, rp_exp(fmul(fmul(x, x), -0.5f)));
  return fadd(cdf, fmul(x, pdf));
}
inline float rp_gelu_tanh_grad(float x) {
  const float x2 = fmul(x, x);
  const float t = rp_tanh(fmul(kGeluBeta, fadd(x, fmul(kGeluKappa, fmul(x2, x)))));
  const float left_derivative = fmul(0.5f, fadd(1.0f, t));
  const float tanh_derivative = fsub(1.0f, fmul(t, t));
  const float inner_derivative = fmul(kGeluBeta, fadd(1.0f, fmul(kGeluKappa3, x2)));
  return fadd(left_derivative, fmul(fmul(fmul(0.5f, x), tanh_derivative), inner_derivative));
}

// ---------------------------------------------------------------- §6 Philox4x32-10
struct Philox4 { uint w[4]; };

inline Philox4 philox4x32_10(uint c0, uint c1, uint c2, uint c3, uint k0, uint k1) {
  for (int round = 0; round < 10; ++round) {
    const ulong p0 = (ulong)0xD2511F53u * c0;
    const ulong p1 = (ulong)0xCD9E8D57u * c2;
    const uint hi0 = (uint)(p0 >> 32), lo0 = (uint)p0;
    const uint hi1 = (uint)(p1 >> 32), lo1 = (uint)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  Philox4 r;
  r.w[0] = c0; r.w[1] = c1; r.w[2] = c2; r.w[3] = c3;
  return r;
}

inline float uniform_from_word(uint w) { return fmul((float)(w >> 8), 5.9604644775390625e-8f); }

// Box-Muller on two words: (z0, z1) = rad * (cos th, sin th).
inline float2 normal_pair(uint w0, uint w1) {
  const float u1 = fmul((float)((w0 >> 8) + 1u), 5.9604644775390625e-8f);  // (0, 1]
  const float u2 = fmul((float)(w1 >> 8), 5.9604644775390625e-8f);         // [0, 1)
  const float rad = rp_sqrt(fmul(-2.0f, rp_log(u1)));
  const float th = fmul(u2, 6.28318548f);
  return float2(fmul(rad, rp_cos(th)), fmul(rad, rp_sin(th)));
}

// ---------------------------------------------------------------- §4.2 threadgroup reductions
// The row kernels run one threadgroup of kLanes = 32 threads per row: thread `lid` is lane l of
// the contract, adds its terms i = l, l + 32, ... in increasing i, then calls tree_sum with its
// partial. The fixed tree runs in threadgroup memory `p` [32]: at width w lanes l < w add lane
// l + w. Barriers separate the steps, so no lane reads a value before it is written; every
// thread of the group must call it (uniform control flow). simd_sum is never used: its order
// is unspecified. Every thread returns p[0]; the last barrier lets the caller reuse p.
constant constexpr int kLanes = 32;

inline float tree_sum(threadgroup float* p, uint lid, float part) {
  p[lid] = part;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint w = kLanes / 2; w >= 1; w >>= 1) {
    if (lid < w) p[lid] = fadd(p[lid], p[lid + w]);
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  const float s = p[0];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return s;
}
// The canonical max's tree: p[l] = (p[l + w] > p[l]) ? p[l + w] : p[l].
inline float tree_max(threadgroup float* p, uint lid, float part) {
  p[lid] = part;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint w = kLanes / 2; w >= 1; w >>= 1) {
    if (lid < w) p[lid] = gt(p[lid + w], p[lid]) ? p[lid + w] : p[lid];
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  const float s = p[0];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return s;
}
