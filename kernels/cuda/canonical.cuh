// canonical.cuh -- the arithmetic contract (kernels/README.md) for CUDA device code: rounded
// primitives that never fuse (§2), FTZ/DAZ (§3), the warp form of the canonical sum and max
// (§4.2), the canonical functions exp/log/recip/rsqrt/sqrt/sin/cos/tanh/erf, the derived sigmoid
// and GELU forms (§5) and Philox (§6).
//
// The function bodies mirror kernels/cpu/contract.h line for line: same constants, same
// operations, same order. Every float add, subtract and multiply is written fadd/fsub/fmul,
// which on the device are __fadd_rn/__fsub_rn/__fmul_rn: PTX add/sub/mul with an explicit .rn,
// which neither nvcc nor ptxas nor the driver's JIT may contract into an FMA, whatever --fmad
// says. With -ftz=true they flush subnormal inputs and results (§3). Negation and |x| are bit
// operations: neg.ftz would flush a subnormal, the CPU's sign flip does not. No division, sqrt
// or special-function instruction is used (tests/test_cuda.py checks the PTX for that).
//
// The file is also plain host C++ (fadd is then a + b, built with -ffp-contract=off):
// tests/test_cuda.py compiles it next to contract.h with g++ and checks that the two agree bit
// for bit on millions of inputs, so the mirror cannot drift from the CPU even where no GPU is.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define RPC_HD __host__ __device__ __forceinline__
#else
#define RPC_HD inline
#endif

#if defined(__USE_FAST_MATH__) || defined(__FAST_MATH__)
#error "RepOps CUDA kernels must not be built with --use_fast_math / -ffast-math (contract §2)"
#endif

namespace rpc {

// ---------------------------------------------------------------- §2 primitives, bit helpers
RPC_HD float fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
RPC_HD float fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
RPC_HD float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
RPC_HD uint32_t bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}
RPC_HD float fl(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}
RPC_HD float neg(float x) { return fl(bits(x) ^ 0x80000000u); }
RPC_HD float fabs_bits(float x) { return fl(bits(x) & 0x7FFFFFFFu); }
// 2^n as a float for -126 <= n <= 127 (exact).
RPC_HD float pow2(int32_t n) { return fl((uint32_t)(n + 127) << 23); }
// DAZ on the bit level: a subnormal reads as a signed zero, as the arithmetic units see it.
RPC_HD float daz(float x) { uint32_t u = bits(x); return (u & 0x7F800000u) ? x : fl(u & 0x80000000u); }
RPC_HD float inf() { return fl(0x7F800000u); }
RPC_HD float qnan() { return fl(0x7FC00000u); }
constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds |y| < 2^22 to an integer

// ---------------------------------------------------------------- §5 canonical functions
// Each line is one rounded operation, in the order of contract.h and the README.

RPC_HD float exp(float x) {  // §5.1
  x = daz(x);
  if (x != x) return fadd(x, x);
  if (x > 88.72283935546875f) return inf();
  if (x < -87.33654022216797f) return 0.0f;
  float t = fmul(x, 1.44269502f);
  t = fadd(t, kMagic);
  const int32_t n = (int32_t)(bits(t) - bits(kMagic));
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
  const int32_t n1 = n >> 1, n2 = n - n1;
  return fmul(fmul(y, pow2(n1)), pow2(n2));
}

RPC_HD float log(float x) {  // §5.2
  x = daz(x);
  if (x != x) return fadd(x, x);
  if (x < 0.0f) return qnan();
  if (x == 0.0f) return neg(inf());
  if (x == inf()) return inf();
  const uint32_t b = bits(x);
  int32_t e = (int32_t)((b >> 23) & 0xFFu) - 127;
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

RPC_HD float recip(float x) {  // §5.3
  x = daz(x);
  if (x != x) return fadd(x, x);
  const uint32_t b = bits(x), s = b & 0x80000000u;
  if ((b & 0x7FFFFFFFu) == 0) return fl(s | 0x7F800000u);
  if ((b & 0x7FFFFFFFu) == 0x7F800000u) return fl(s);
  const int32_t k = (int32_t)((b >> 23) & 0xFFu) - 127;
  const float m = fl((b & 0x007FFFFFu) | 0x3F800000u);
  float y = fsub(1.41176474f, fmul(0.470588237f, m));  // 24/17 - 8/17 m
  for (int it = 0; it < 3; ++it) {
    const float e = fsub(1.0f, fmul(m, y));
    y = fadd(y, fmul(y, e));
  }
  const int32_t nk = -k, k1 = nk >> 1, k2 = nk - k1;
  const float r = fmul(fmul(y, pow2(k1)), pow2(k2));
  return fl(bits(r) | s);
}

RPC_HD float rsqrt(float x) {  // §5.4
  x = daz(x);
  if (x != x) return fadd(x, x);
  if (x < 0.0f) return qnan();
  if (x == 0.0f) return inf();
  if (x == inf()) return 0.0f;
  const uint32_t b = bits(x);
  const int32_t k = (int32_t)((b >> 23) & 0xFFu) - 127;
  float m;
  int32_t j;
  if ((k & 1) == 0) { m = fl((b & 0x007FFFFFu) | 0x3F800000u); j = k / 2; }
  else              { m = fl((b & 0x007FFFFFu) | 0x40000000u); j = (k - 1) / 2; }
  float y = fl(0x5F375A86u - (bits(m) >> 1));
  const float h = fmul(0.5f, m);
  for (int it = 0; it < 3; ++it) y = fmul(y, fsub(1.5f, fmul(fmul(h, y), y)));
  return fmul(y, pow2(-j));
}

RPC_HD float sqrt(float x) {  // §5.4
  x = daz(x);
  if (x == 0.0f) return x;
  if (x == inf()) return inf();
  return fmul(x, rsqrt(x));
}

// §5.5: the shared range reduction and both polynomials; the quadrant picks the result.
RPC_HD float sincos_q(float x, int32_t shift) {
  x = daz(x);
  if (!(fabs_bits(x) <= 65536.0f)) return qnan();
  float t = fmul(x, 0.636619747f);
  t = fadd(t, kMagic);
  const int32_t j = (int32_t)(bits(t) - bits(kMagic));
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
RPC_HD float sin(float x) { return sincos_q(x, 0); }
RPC_HD float cos(float x) { return sincos_q(x, 1); }  // cos(x) = sin(x + pi/2): quadrant + 1

RPC_HD float sigmoid(float x) { return recip(fadd(1.0f, exp(neg(x)))); }  // §5.6

// §5.8: odd, so computed on a = |x| and given x's sign.
RPC_HD float tanh(float x) {
  x = daz(x);
  if (x != x) return fadd(x, x);
  const uint32_t s = bits(x) & 0x80000000u;
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
    const float e = exp(fadd(a, a));
    y = fsub(1.0f, fmul(2.0f, recip(fadd(e, 1.0f))));
  } else {
    y = 1.0f;
  }
  return fl(bits(y) | s);
}

// §5.9: odd, so computed on a = |x| and given x's sign.
RPC_HD float erf(float x) {
  x = daz(x);
  if (x != x) return fadd(x, x);
  const uint32_t s = bits(x) & 0x80000000u;
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
    const float e = exp(neg(fmul(a, a)));
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
constexpr float kRsqrt2 = 7.071067691e-01f, kGeluBeta = 7.978845835e-01f, kGeluKappa = 4.471499845e-02f,
                kGeluKappa3 = 1.341449916e-01f, kRsqrt2Pi = 3.989422917e-01f;
RPC_HD float gelu(float x) { return fmul(fmul(x, 0.5f), fadd(1.0f, erf(fmul(x, kRsqrt2)))); }
RPC_HD float gelu_tanh(float x) {
  const float w = fmul(kGeluBeta, fadd(x, fmul(kGeluKappa, fmul(fmul(x, x), x))));
  return fmul(fmul(0.5f, x), fadd(1.0f, tanh(w)));
}
RPC_HD float gelu_grad(float x) {
  const float cdf = fmul(0.5f, fadd(1.0f, erf(fmul(x, kRsqrt2))));
  const float pdf = fmul(kRsqrt2Pi, exp(fmul(fmul(x, x), -0.5f)));
  return fadd(cdf, fmul(x, pdf));
}
RPC_HD float gelu_tanh_grad(float x) {
  const float x2 = fmul(x, x);
  const float t = tanh(fmul(kGeluBeta, fadd(x, fmul(kGeluKappa, fmul(x2, x)))));
  const float left_derivative = fmul(0.5f, fadd(1.0f, t));
  const float tanh_derivative = fsub(1.0f, fmul(t, t));
  const float inner_derivative = fmul(kGeluBeta, fadd(1.0f, fmul(kGeluKappa3, x2)));
  return fadd(left_derivative, fmul(fmul(fmul(0.5f, x), tanh_derivative), inner_derivative));
}

// ---------------------------------------------------------------- §6 Philox4x32-10
struct Philox4 { uint32_t w[4]; };

RPC_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                             uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = (uint64_t)0xD2511F53u * c0;
    const uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
    const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

RPC_HD float uniform_from_word(uint32_t w) { return fmul((float)(w >> 8), 5.9604644775390625e-8f); }

// Box-Muller on two words: (z0, z1) = rad * (cos th, sin th).
RPC_HD void normal_pair(uint32_t w0, uint32_t w1, float* z0, float* z1) {
  const float u1 = fmul((float)((w0 >> 8) + 1u), 5.9604644775390625e-8f);  // (0, 1]
  const float u2 = fmul((float)(w1 >> 8), 5.9604644775390625e-8f);         // [0, 1)
  const float rad = sqrt(fmul(-2.0f, log(u1)));
  const float th = fmul(u2, 6.28318548f);
  *z0 = fmul(rad, cos(th));
  *z1 = fmul(rad, sin(th));
}

// ---------------------------------------------------------------- §4.2 warp reductions
#if defined(__CUDACC__)
// Blocks for a grid-stride loop over n items (work never depends on the grid: each item is
// computed whole by whichever thread reaches it).
inline unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return (unsigned)(b < 1 ? 1 : (b > (1 << 20) ? (1 << 20) : b));
}
// Blocks for the row kernels (one warp per row, `warps` rows per block). Past the grid's limit
// of 2^31 - 1 blocks it returns 0, which the launch rejects (cudaErrorInvalidConfiguration,
// reported by the launcher) instead of running a truncated grid that leaves rows unwritten.
inline unsigned row_blocks(int64_t rows, int warps) {
  const int64_t b = (rows + warps - 1) / warps;
  return b > 0x7FFFFFFF ? 0u : (unsigned)b;
}
// Global index and stride of a 1-D grid-stride loop.
__device__ __forceinline__ int64_t gtid() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t gstride() { return (int64_t)gridDim.x * blockDim.x; }

constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int kLanes = 32;

// The fixed tree of the canonical sum over one warp: lane l enters holding p[l]. At width w,
// __shfl_down_sync gives lane l the value of lane l + w, so lanes l < w compute exactly
// p[l] + p[l + w]; lanes >= w compute values no later step reads (width w/2 reads lanes < w).
// Every lane returns p[0].
__device__ __forceinline__ float warp_tree_sum(float p) {
  for (int w = kLanes / 2; w >= 1; w >>= 1) p = fadd(p, __shfl_down_sync(kFull, p, w));
  return __shfl_sync(kFull, p, 0);
}
// The canonical max's tree: p[l] = (p[l + w] > p[l]) ? p[l + w] : p[l].
__device__ __forceinline__ float warp_tree_max(float p) {
  for (int w = kLanes / 2; w >= 1; w >>= 1) {
    const float o = __shfl_down_sync(kFull, p, w);
    p = (o > p) ? o : p;
  }
  return __shfl_sync(kFull, p, 0);
}

// csum of term(i), i in [0, n), by the calling warp (all 32 lanes call it with the same n):
// lane l adds the terms i = l, l + 32, l + 64, ... in increasing i, then the tree. The terms of
// 8 consecutive rounds are computed first and then added in order, so their loads are in flight
// together instead of one memory round trip per add; the adds and their order are unchanged.
template <class Term>
__device__ __forceinline__ float warp_csum(int64_t n, int lane, const Term& term) {
  constexpr int kUnroll = 8;
  float p = 0.0f;
  int64_t i = lane;
  for (; i + (kUnroll - 1) * kLanes < n; i += kUnroll * kLanes) {
    float t[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) t[u] = term(i + u * kLanes);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) p = fadd(p, t[u]);
  }
  for (; i < n; i += kLanes) p = fadd(p, term(i));
  return warp_tree_sum(p);
}
template <class Term>
__device__ __forceinline__ float warp_cmax(int64_t n, int lane, const Term& term) {
  float p = neg(inf());
  for (int64_t i = lane; i < n; i += kLanes) {
    const float t = term(i);
    p = (t > p) ? t : p;
  }
  return warp_tree_max(p);
}
#endif

}  // namespace rpc
