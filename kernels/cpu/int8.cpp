// int8.cpp -- the quantized path, contract §10 (kernels/README.md): symmetric int8 quantization
// on the grid [-127, 127], the exact int8 x int8 -> int32 GEMM, dequantization, the LSQ step-size
// rule and the LSQ backward (Esser et al. 2019).
//
//   rp_quantize(x, s, q, R, C)                  q[r,c] = Q(x[r,c] * recip(s[r]))      int8
//   rp_int8_matmul(A, B, C32, M, N, K)          C32[i,j] = sum_k A[i,k] * B[j,k]       int32, exact
//   rp_int8_linear(A, B, sx, sw, Y, M, N, K)    Y[i,j] = float(C32[i,j]) * (sx * sw[j])
//   rp_dequantize(q, s, y, R, C)                y[r,c] = float(q[r,c]) * s[r]
//   rp_lsq_init(x, s, R, C, inv_c)              s[r] = (2 * (csum_c |x[r,c]| * inv_c)) * f32(1/sqrt(127))
//   rp_lsq_backward(x, s, gxh, g, gx, gs, R, C) STE gradient of x and the LSQ gradient of s
//
// The GEMM is exact integer arithmetic (|sum| <= K * 127^2 < 2^31, checked by the binding), so
// its order is free: the SIMD paths sign-extend int8 to int16 and use vpmaddwd / vpdpwssd
// (x86: pairs of products summed into int32 lanes, never saturating; vpmaddubsw, which
// saturates to int16, is never used) or smlal (AArch64 NEON), and every path gives the same
// int32 result, which the self-test digests check across builds and under qemu-aarch64.
#include "kernels.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace {

constexpr float kInvSqrtQp = 0x1.6b7612p-4f;  // f32(1/sqrt(127)) = 0.08873565 (contract §10)

// Q(v): clamp to [-127, 127] by selects, then round half to even (exact for |v| <= 127);
// NaN fails both comparisons and gives 0 (contract §10).
inline int32_t quant(float v) {
  if (v >= 127.0f) return 127;
  if (v <= -127.0f) return -127;
  if (!(v == v)) return 0;
  const float t = rp::add(v, rp::kMagic);
  return (int32_t)(rp::bits(t) - rp::bits(rp::kMagic));
}

// ---------------------------------------------------------------- GEMM packing
// Both operands are K-contiguous rows (A [M, K] activations, B [N, K] weights), sign-extended
// to int16 once per call, K rounded up to even (Kp). A stays row-major, [Mp][Kp] (the micro-
// kernel broadcasts A[i, k..k+1] from each row); B is packed into panels of R rows:
//   PAIR layout (x86 vpmaddwd): panel[k/2][R][2]  (two consecutive k of one row side by side)
//   FLAT layout (NEON, scalar): panel[k][R]
// In both, k values [k0, k0 + kc) of a panel start at offset k0 * R. Rows past the matrix and
// k past K are zero (zeros add nothing: exact).
template <int64_t R, bool PAIR>
void pack_panel(const int8_t* src, int64_t rows, int64_t K, int64_t Kp, int16_t* out) {
  for (int64_t r = 0; r < R; ++r) {
    const int8_t* s = src + r * K;
    const bool live = r < rows;
    if (PAIR) {
      for (int64_t k2 = 0; k2 < Kp / 2; ++k2) {
        const int64_t k = 2 * k2;
        out[(k2 * R + r) * 2] = (live && k < K) ? (int16_t)s[k] : (int16_t)0;
        out[(k2 * R + r) * 2 + 1] = (live && k + 1 < K) ? (int16_t)s[k + 1] : (int16_t)0;
      }
    } else {
      for (int64_t k = 0; k < Kp; ++k) out[k * R + r] = (live && k < K) ? (int16_t)s[k] : (int16_t)0;
    }
  }
}

// A [rows, K] int8 -> [ceil(rows / R) R, Kp] int16, row-major, zero-padded; in parallel.
template <int64_t R>
std::vector<int16_t> widen(const int8_t* src, int64_t rows, int64_t K, int64_t Kp) {
  std::vector<int16_t> out((rows + R - 1) / R * R * Kp);   // padding rows stay zero
  rp::parallel_for(rows, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int16_t* o = out.data() + r * Kp;
      for (int64_t k = 0; k < K; ++k) o[k] = src[r * K + k];
      for (int64_t k = K; k < Kp; ++k) o[k] = 0;
    }
  });
  return out;
}

// A[i, k], A[i, k + 1] of a row-major int16 matrix as one 32-bit word (the vpmaddwd pair).
inline int32_t pair(const int16_t* p) { int32_t w; std::memcpy(&w, p, 4); return w; }

// All panels of a [rows, K] matrix, in parallel: panel p holds rows [p R, p R + R).
template <int64_t R, bool PAIR>
std::vector<int16_t> pack(const int8_t* src, int64_t rows, int64_t K, int64_t Kp) {
  const int64_t panels = (rows + R - 1) / R;
  std::vector<int16_t> out(panels * R * Kp);
  rp::parallel_for(panels, 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p)
      pack_panel<R, PAIR>(src + p * R * K, rows - p * R, K, Kp, out.data() + p * R * Kp);
  });
  return out;
}

#if defined(__AVX512BW__)
constexpr bool kPair = true;
constexpr int64_t MR = 8, NR = 32;  // 16 zmm accumulators of 16 int32 lanes
// acc[MR][NR] (+)= A panel x B panel over kc (even) k values; C tile row stride ldc.
inline void micro(int64_t kc, const int16_t* A, int64_t lda, const int16_t* Bp, int32_t* C, int64_t ldc,
                  bool first) {
  // Named accumulators (not an array): GCC then keeps them in registers without copies.
#define RP_ACC(i) __m512i c##i##0 = first ? _mm512_setzero_si512() : _mm512_loadu_si512(C + i * ldc), \
                          c##i##1 = first ? _mm512_setzero_si512() : _mm512_loadu_si512(C + i * ldc + 16);
  RP_ACC(0) RP_ACC(1) RP_ACC(2) RP_ACC(3) RP_ACC(4) RP_ACC(5) RP_ACC(6) RP_ACC(7)
#undef RP_ACC
  for (int64_t k = 0; k < kc; k += 2) {
    const int64_t k2 = k / 2;
    const __m512i b0 = _mm512_loadu_si512(Bp + k2 * NR * 2), b1 = _mm512_loadu_si512(Bp + k2 * NR * 2 + 32);
#if defined(__AVX512VNNI__)
#define RP_MAC(i) { const __m512i ai = _mm512_set1_epi32(pair(A + i * lda + k)); \
                    c##i##0 = _mm512_dpwssd_epi32(c##i##0, ai, b0); c##i##1 = _mm512_dpwssd_epi32(c##i##1, ai, b1); }
#else
#define RP_MAC(i) { const __m512i ai = _mm512_set1_epi32(pair(A + i * lda + k)); \
                    c##i##0 = _mm512_add_epi32(c##i##0, _mm512_madd_epi16(ai, b0)); \
                    c##i##1 = _mm512_add_epi32(c##i##1, _mm512_madd_epi16(ai, b1)); }
#endif
    RP_MAC(0) RP_MAC(1) RP_MAC(2) RP_MAC(3) RP_MAC(4) RP_MAC(5) RP_MAC(6) RP_MAC(7)
#undef RP_MAC
  }
#define RP_STORE(i) _mm512_storeu_si512(C + i * ldc, c##i##0); _mm512_storeu_si512(C + i * ldc + 16, c##i##1);
  RP_STORE(0) RP_STORE(1) RP_STORE(2) RP_STORE(3) RP_STORE(4) RP_STORE(5) RP_STORE(6) RP_STORE(7)
#undef RP_STORE
}
#elif defined(__AVX2__)
constexpr bool kPair = true;
constexpr int64_t MR = 4, NR = 16;  // 8 ymm accumulators of 8 int32 lanes
inline void micro(int64_t kc, const int16_t* A, int64_t lda, const int16_t* Bp, int32_t* C, int64_t ldc,
                  bool first) {
  __m256i acc[MR][2];
  for (int i = 0; i < MR; ++i)
    for (int h = 0; h < 2; ++h)
      acc[i][h] = first ? _mm256_setzero_si256()
                        : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(C + i * ldc + 8 * h));
  for (int64_t k2 = 0; k2 < kc / 2; ++k2) {
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Bp + k2 * NR * 2));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Bp + k2 * NR * 2 + 16));
    for (int i = 0; i < MR; ++i) {
      const __m256i ai = _mm256_set1_epi32(pair(A + i * lda + 2 * k2));
      acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(ai, b0));
      acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(ai, b1));
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int h = 0; h < 2; ++h) _mm256_storeu_si256(reinterpret_cast<__m256i*>(C + i * ldc + 8 * h), acc[i][h]);
}
#elif defined(__aarch64__)
}  // namespace
#include <arm_neon.h>
namespace {
constexpr bool kPair = false;
constexpr int64_t MR = 4, NR = 16;  // 16 int32x4 accumulators
inline void micro(int64_t kc, const int16_t* A, int64_t lda, const int16_t* Bp, int32_t* C, int64_t ldc,
                  bool first) {
  int32x4_t acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < 4; ++q) acc[i][q] = first ? vdupq_n_s32(0) : vld1q_s32(C + i * ldc + 4 * q);
  for (int64_t k = 0; k < kc; ++k) {
    int16x4_t b[4];
    for (int q = 0; q < 4; ++q) b[q] = vld1_s16(Bp + k * NR + 4 * q);
    for (int i = 0; i < MR; ++i)
      for (int q = 0; q < 4; ++q) acc[i][q] = vmlal_n_s16(acc[i][q], b[q], A[i * lda + k]);  // smlal
  }
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < 4; ++q) vst1q_s32(C + i * ldc + 4 * q, acc[i][q]);
}
#else
constexpr bool kPair = false;
constexpr int64_t MR = 4, NR = 16;  // portable scalar path
inline void micro(int64_t kc, const int16_t* A, int64_t lda, const int16_t* Bp, int32_t* C, int64_t ldc,
                  bool first) {
  int32_t acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = first ? 0 : C[i * ldc + j];
  for (int64_t k = 0; k < kc; ++k)
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] += (int32_t)A[i * lda + k] * (int32_t)Bp[k * NR + j];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) C[i * ldc + j] = acc[i][j];
}
#endif

constexpr int64_t KC = 512, MC = 16 * MR, NC = 8 * NR;  // cache blocks (KC even)

// The GEMM over output blocks; `finish(i0, mc, j0, nc, tile, ldt)` receives each finished int32
// block [mc, nc] (row stride ldt) inside the thread that computed it.
template <class Finish>
void gemm(const int8_t* A, const int8_t* B, int64_t M, int64_t N, int64_t K, const Finish& finish) {
  const int64_t Kp = (K + 1) / 2 * 2;
  const std::vector<int16_t> aw = widen<MR>(A, M, K, Kp), bp = pack<NR, kPair>(B, N, K, Kp);
  const int64_t mblocks = (M + MC - 1) / MC, nblocks = (N + NC - 1) / NC;
  rp::parallel_for(mblocks * nblocks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<int32_t> tile(MC * NC);  // the block's accumulators, full tiles (padding included)
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i0 = (t / nblocks) * MC, mc = std::min(MC, M - i0);
      const int64_t j0 = (t % nblocks) * NC, nc = std::min(NC, N - j0);
      const int64_t mcp = (mc + MR - 1) / MR * MR, ncp = (nc + NR - 1) / NR * NR;
      if (Kp == 0) std::fill(tile.begin(), tile.end(), 0);
      for (int64_t k0 = 0; k0 < Kp; k0 += KC) {
        const int64_t kc = std::min(KC, Kp - k0);
        for (int64_t jp = 0; jp < ncp; jp += NR)
          for (int64_t ip = 0; ip < mcp; ip += MR)
            micro(kc, &aw[(i0 + ip) * Kp + k0], Kp, &bp[(j0 + jp) * Kp + k0 * NR], &tile[ip * NC + jp], NC,
                  k0 == 0);
      }
      finish(i0, mc, j0, nc, tile.data(), NC);
    }
  });
}

}  // namespace

void rp_int8_matmul(const int8_t* A, const int8_t* B, int32_t* C, int64_t M, int64_t N, int64_t K) {
  gemm(A, B, M, N, K, [&](int64_t i0, int64_t mc, int64_t j0, int64_t nc, const int32_t* t, int64_t ldt) {
    for (int64_t i = 0; i < mc; ++i) std::memcpy(C + (i0 + i) * N + j0, t + i * ldt, nc * sizeof(int32_t));
  });
}

void rp_int8_linear(const int8_t* A, const int8_t* B, float sx, const float* sw, float* Y, int64_t M,
                    int64_t N, int64_t K) {
  std::vector<float> sc(N);
  {
    rp::FpModeGuard guard;  // scalar work on the calling thread: FTZ/DAZ here too
    for (int64_t j = 0; j < N; ++j) sc[j] = rp::mul(sx, sw[j]);  // one rounding per column
  }
  gemm(A, B, M, N, K, [&](int64_t i0, int64_t mc, int64_t j0, int64_t nc, const int32_t* t, int64_t ldt) {
    for (int64_t i = 0; i < mc; ++i)
      for (int64_t j = 0; j < nc; ++j) Y[(i0 + i) * N + j0 + j] = rp::mul((float)t[i * ldt + j], sc[j0 + j]);
  });
}

void rp_quantize(const float* x, const float* s, int8_t* q, int64_t R, int64_t C) {
  rp::parallel_for(R * C, 4096, [&](int64_t b, int64_t e) {
    int64_t r = b / C;
    float inv = rp::recip(s[r]);
    for (int64_t i = b; i < e; ++i) {
      if (i / C != r) { r = i / C; inv = rp::recip(s[r]); }
      q[i] = (int8_t)quant(rp::mul(x[i], inv));
    }
  });
}

void rp_dequantize(const int8_t* q, const float* s, float* y, int64_t R, int64_t C) {
  rp::parallel_for(R * C, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = rp::mul((float)q[i], s[i / C]);
  });
}

void rp_lsq_init(const float* x, float* s, int64_t R, int64_t C, float inv_c) {
  rp::parallel_for(R, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * C;
      const float mean = rp::mul(rp::csum(C, [xr](int64_t c) { return std::fabs(xr[c]); }), inv_c);
      s[r] = rp::mul(rp::mul(2.0f, mean), kInvSqrtQp);
    }
  });
}

void rp_lsq_backward(const float* x, const float* s, const float* gxh, float g, float* gx, float* gs,
                     int64_t R, int64_t C) {
  // gx: the straight-through estimator, elementwise (any chunking).
  rp::parallel_for(R * C, 4096, [&](int64_t b, int64_t e) {
    int64_t r = b / C;
    float inv = rp::recip(s[r]);
    for (int64_t i = b; i < e; ++i) {
      if (i / C != r) { r = i / C; inv = rp::recip(s[r]); }
      const float v = rp::mul(x[i], inv);
      gx[i] = (v > -127.0f && v < 127.0f) ? gxh[i] : 0.0f;
    }
  });
  // gs[r] = csum_c(gxh * term) * g, term = Q(v) - v inside the grid, Q(v) = +-127 at the clip.
  rp::parallel_for(R, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float inv = rp::recip(s[r]);
      const float* xr = x + r * C;
      const float* gr = gxh + r * C;
      const float sum = rp::csum(C, [=](int64_t c) {
        const float v = rp::mul(xr[c], inv);
        const float qf = (float)quant(v);
        const float term = (v > -127.0f && v < 127.0f) ? rp::sub(qf, v) : qf;
        return rp::mul(gr[c], term);
      });
      gs[r] = rp::mul(sum, g);
    }
  });
}
