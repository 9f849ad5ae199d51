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
// its order is free: AVX-512 VNNI uses vpdpbusd on a + 128 (unsigned) with an exact correction,
// the other SIMD paths sign-extend int8 to int16 and use vpmaddwd (x86: pairs of products
// summed into int32 lanes, never saturating) or smlal (AArch64 NEON); the saturating
// vpmaddubsw and vpdpbusds are never used. Where the CPU and Linux give AMX-INT8, the GEMM runs
// on its tiles instead (int8_amx.cpp, tdpbssd s8 x s8; chosen at run time, rp_int8_select). Every
// path gives the same int32 result, which the self-test digests check across builds, paths and
// under qemu-aarch64 (see "The paths" below).
#include "kernels.h"
#include "transpose.h"
#include "vmath.h"

#include <algorithm>
#include <atomic>
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

// Q(v) on VL lanes, branch-free: the same float add and the same three selections as quant()
// (the conditions exclude each other), so every lane has quant()'s bits.
inline rp::vi vquant(rp::vf v) {
  const rp::vf t = rp::add(v, rp::kMagic);
  rp::vi q = rp::ibits(t) - rp::ibits(rp::kMagic);
  q = rp::sel(v != v, rp::vi{}, q);
  q = rp::sel(v <= -127.0f, rp::vi{} - 127, q);
  return rp::sel(v >= 127.0f, rp::vi{} + 127, q);
}

// The clip test of the LSQ backward, (v > -127) and (v < 127), lane by lane.
inline rp::vi vinside(rp::vf v) { return (v > -127.0f) & (v < 127.0f); }

typedef int8_t vb __attribute__((vector_size(rp::VL)));  // VL int8 lanes
typedef int16_t vs __attribute__((vector_size(2 * rp::VL)));   // VL int16 lanes

// Q's lanes (in [-127, 127]) as int8, through int16: the direct int32 -> int8 conversion is a
// lane extract, shift and or per lane on AVX2 (GCC 12; 4.6% of an int8 step on AMD Zen 3, perf),
// the two narrowings whole-vector packs. Truncation keeps every value of this range either way.
inline vb to_int8(rp::vi q) { return __builtin_convertvector(__builtin_convertvector(q, vs), vb); }

// f(r, i0, i1) for the parts of the flat range [b, e) of a [R, C] matrix in each row r.
template <class F>
inline void by_rows(int64_t b, int64_t e, int64_t C, const F& f) {
  while (b < e) {
    const int64_t r = b / C, end = std::min(e, (r + 1) * C);
    f(r, b, end);
    b = end;
  }
}

// ---------------------------------------------------------------- GEMM packing
// Both operands are K-contiguous rows (A [M, K] activations, B [N, K] weights), packed once per
// call, K rounded up to a multiple of G (Kp):
//   A row-major, [ceil(M / MR) MR][lda] (lda >= Kp; the micro-kernel broadcasts one 32-bit word,
//     G consecutive k of one row, from each of MR rows); a plain row copy, which vectorizes;
//   B in panels of NR rows, panel[k / G][NR][G] (G values of one row side by side), so that one
//     k group of a panel is NR * G contiguous values, loaded as whole vectors.
// Rows past the matrix and k past K are zero (zeros add nothing: exact). The k values
// [k0, k0 + kc) of a B panel start at offset k0 * NR.
//
// The SIMD paths, chosen at build time (-march; every one gives the same int32 results, and the
// same as AMX-INT8, which int8_amx.cpp runs where usable, chosen at run time):
//   AVX-512 VNNI  A as uint8 a + 128, B int8, G = 4: vpdpbusd (u8 x s8, four products summed
//                 into each int32 lane, wrapping, never saturating), with the exact correction
//                 below;
//   AVX-512BW     int16, G = 2: vpmaddwd (pairs of int16 products into int32, never saturating);
//   AVX2          int16, G = 2: vpmaddwd on 256-bit vectors;
//   AArch64 NEON  int16, G = 1: smlal;  elsewhere plain C, int16, G = 1.
// vpmaddubsw and vpdpbusds (both saturating) are never used.
//
// The VNNI correction. vpdpbusd multiplies an unsigned byte by a signed one, so A enters as
// a' = a + 128 in [1, 255] and sum_k a'[i,k] b[j,k] = C[i,j] + 128 * colsum[j], colsum[j] =
// sum_k b[j,k]. Each accumulator therefore starts at bias[j] = -128 * colsum[j] instead of 0,
// and ends at exactly C[i,j]. The values on the way can leave int32 at large K (|bias| <=
// 128 * 127 * K, the running sums reach 255 * 127 * K, both > 2^31 near K = 133144; the four
// products one lane adds per instruction, |sum| <= 4 * 255 * 127 < 2^17, are exact). vpdpbusd
// adds with two's-complement wraparound, i.e. modulo 2^32, bias is computed modulo 2^32 too,
// and the true result lies in int32 (|C| <= 127^2 K < 2^31, checked by the binding), so the
// final value modulo 2^32 is C[i,j] itself: exact. tests/test_int8.py checks this at the
// largest K with every operand +-127.
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define RP_I8_VNNI 1
typedef uint8_t TA;
typedef int8_t TB;
constexpr int64_t G = 4, MR = 8, NR = 32;  // 16 zmm accumulators of 16 int32 lanes
constexpr const char* kI8Path = "int8 GEMM: AVX-512 VNNI vpdpbusd (u8 x s8), tile 8x32";
#elif defined(__AVX512BW__)
typedef int16_t TA;
typedef int16_t TB;
constexpr int64_t G = 2, MR = 8, NR = 32;
constexpr const char* kI8Path = "int8 GEMM: AVX-512BW vpmaddwd (int16), tile 8x32";
#elif defined(__AVX2__)
#define RP_I8_AVX2 1
typedef int16_t TA;
typedef int16_t TB;
constexpr int64_t G = 2, MR = 4, NR = 16;  // 8 ymm accumulators of 8 int32 lanes
constexpr const char* kI8Path = "int8 GEMM: AVX2 vpmaddwd (int16), tile 4x16";
#elif defined(__aarch64__)
typedef int16_t TA;
typedef int16_t TB;
constexpr int64_t G = 1, MR = 4, NR = 16;  // 16 int32x4 accumulators
constexpr const char* kI8Path = "int8 GEMM: NEON smlal (int16), tile 4x16";
#else
typedef int16_t TA;
typedef int16_t TB;
constexpr int64_t G = 1, MR = 4, NR = 16;
constexpr const char* kI8Path = "int8 GEMM: scalar (int16), tile 4x16";
#endif
// rp_int8_gemm_packed's finish gets tiles of MR rows x NR columns; exact.cpp reconstructs them 64
// outputs (whole rows) at a time.
static_assert((NR == 16 || NR == 32) && (MR * NR) % 64 == 0, "a tile is whole rows of 64-output groups");

// The accumulators' start for a column whose values sum to colsum: -128 colsum modulo 2^32 on VNNI
// (unsigned: wraparound is defined; see the correction above), else 0.
inline int32_t bias_of([[maybe_unused]] int64_t colsum) {
#if defined(RP_I8_VNNI)
  return (int32_t)(uint32_t)(0u - 128u * (uint32_t)(uint64_t)colsum);
#else
  return 0;
#endif
}

// A's packed value of an int8: a + 128 as a byte for vpdpbusd, else a itself (int16).
inline TA a_val(int8_t a) {
#if defined(RP_I8_VNNI)
  return (uint8_t)((uint8_t)a ^ 0x80u);  // two's complement: (uint8)a ^ 0x80 = a + 128
#else
  return (TA)a;
#endif
}

// A's row stride: Kp rounded up to a cache line, plus one line when that is a multiple of 2 KB
// (MR rows a multiple of 2 KB apart would share L1 sets).
inline int64_t a_stride(int64_t Kp) {
  const int64_t per_line = 64 / (int64_t)sizeof(TA);
  int64_t lda = (Kp + per_line - 1) / per_line * per_line;
  if ((lda * (int64_t)sizeof(TA)) % 2048 == 0) lda += per_line;
  return lda;
}

// Rows [r0, r1) of A (row r at src + r ld; rows >= M are zero) into out [*, lda].
void pack_a(const int8_t* src, int64_t ld, int64_t M, int64_t K, int64_t lda, int64_t r0, int64_t r1, TA* out) {
  for (int64_t r = r0; r < r1; ++r) {
    TA* o = out + r * lda;
    const int64_t n = r < M ? K : 0;
    const int8_t* s = src + r * ld;
    for (int64_t k = 0; k < n; ++k) o[k] = a_val(s[k]);
    for (int64_t k = n; k < lda; ++k) o[k] = 0;
  }
}

#if defined(RP_I8_VNNI)
// A full panel's (NR = 32 rows, row r at src + r ld) values, all K of them: per half of 16 rows
// and 64 values (the last block's rows loaded under a mask, zero past K), 16 rows x 16 words
// through a 16 x 16 transpose of 32-bit words (transpose.h), so that word w of each row lands in
// group w's 64 bytes (out [Kp / 4][NR][4], Kp = K rounded up to 4, the last group zero-padded);
// sums[r] = the row's sum, four per lane by vpdpbusd with bytes of one (exact: |sum| <= 128 K <
// 2^31, since the binding bounds K below 133144). Returns Kp.
int64_t pack_b_blocks(const int8_t* src, int64_t ld, int64_t K, int8_t* out, int64_t* sums) {
  const int64_t Kp = (K + 3) / 4 * 4;
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t h = 0; h < NR; h += 16) {
    __m512i acc = _mm512_setzero_si512();
    for (int64_t k = 0; k < K; k += 64) {
      const int64_t n = std::min<int64_t>(64, K - k);
      const __mmask64 live = n == 64 ? ~__mmask64(0) : (__mmask64(1) << n) - 1;
      __m512i v[16];
      for (int64_t i = 0; i < 16; ++i) v[i] = _mm512_maskz_loadu_epi8(live, src + (h + i) * ld + k);
      rp::transpose16(v);
      for (int64_t w = 0; w < (std::min<int64_t>(64, Kp - k)) / 4; ++w) {
        _mm512_storeu_si512(out + ((k / 4 + w) * NR + h) * 4, v[w]);
        acc = _mm512_dpbusd_epi32(acc, ones, v[w]);
      }
    }
    alignas(64) int32_t s[16];
    _mm512_store_si512(s, acc);
    for (int64_t i = 0; i < 16; ++i) sums[h + i] = s[i];
  }
  return Kp;
}
#elif defined(RP_I8_AVX2)
// A full panel's (NR = 16 rows, row r at src + r ld) values [0, kv), kv = K rounded down to 16:
// per half of 8 rows and 16 values, each row sign-extended to 16 int16 (8 words, one per pair of
// values), the 8 rows x 8 words through an 8 x 8 transpose of 32-bit words (transpose.h), so that
// pair w of each row lands in group w's 64 bytes (out [kv / 2][NR][2]). Returns kv. (Value by value, this packing
// took 5-6% of an exact step on AMD Zen 3, perf, 2026-12-02.)
int64_t pack_b_blocks(const int8_t* src, int64_t ld, int64_t K, int16_t* out) {
  const int64_t kv = K / 16 * 16;
  for (int64_t h = 0; h < NR; h += 8)
    for (int64_t k = 0; k < kv; k += 16) {
      __m256 v[8];
      for (int64_t i = 0; i < 8; ++i)
        v[i] = _mm256_castsi256_ps(
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + (h + i) * ld + k))));
      rp::transpose8(v);   // v[w]: values k + 2w and k + 2w + 1 of rows h .. h + 7
      for (int64_t w = 0; w < 8; ++w)
        _mm256_storeu_ps(reinterpret_cast<float*>(out + ((k / 2 + w) * NR + h) * 2), v[w]);
    }
  return kv;
}
#endif

// One B panel: rows [0, rows) of src ([*, K], row stride ld) into out [Kp / G][NR][G]; rows past
// `rows` are zero. colsum[r] = sum_k src[r, k] (exact in int64; VNNI only, for its correction).
// A full panel goes through pack_b_blocks on VNNI (all of it) and AVX2 (its blocks of 16 values);
// the rest, and every other path, value by value.
void pack_b(const int8_t* src, int64_t ld, int64_t rows, int64_t K, int64_t Kp, TB* out,
            [[maybe_unused]] int64_t* colsum) {
  const int64_t kfull = K / G * G;
  const int64_t live = std::min(rows, NR);
  int64_t kv = 0;   // values [0, kv) of every row packed by blocks
#if defined(RP_I8_VNNI)
  int64_t sums[NR] = {};   // their sums
  if (live == NR) kv = pack_b_blocks(src, ld, K, out, sums);
#elif defined(RP_I8_AVX2)
  if (live == NR) kv = pack_b_blocks(src, ld, K, out);
#endif
  for (int64_t g = kv / G; g < kfull / G; ++g)  // full groups of the live rows: sequential writes
    for (int64_t r = 0; r < live; ++r)
      for (int64_t u = 0; u < G; ++u) out[(g * NR + r) * G + u] = (TB)src[r * ld + g * G + u];
  if (kfull < Kp && kv < Kp)                    // the last, partial group
    for (int64_t r = 0; r < live; ++r)
      for (int64_t u = 0; u < G; ++u)
        out[((kfull / G) * NR + r) * G + u] = kfull + u < K ? (TB)src[r * ld + kfull + u] : (TB)0;
  if (live < NR)                                // rows past the matrix
    for (int64_t g = 0; g < Kp / G; ++g)
      for (int64_t r = live; r < NR; ++r)
        for (int64_t u = 0; u < G; ++u) out[(g * NR + r) * G + u] = 0;
#if defined(RP_I8_VNNI)   // the correction's column sums
  for (int64_t r = 0; r < NR; ++r) {
    int64_t sum = sums[r];
    if (r < live)
      for (int64_t k = kv; k < K; ++k) sum += src[r * ld + k];
    colsum[r] = sum;
  }
#endif
}

// A 32-bit word (a group of G values) from memory, for a broadcast.
inline int32_t word(const void* p) { int32_t w; std::memcpy(&w, p, 4); return w; }

// ---------------------------------------------------------------- micro-kernels
// acc[i][j] = init[i][j] + sum over kg groups of A row i (row stride lda) x B panel row j, for a
// tile of MR x NR; init has row stride ldi (0: one row for all, the bias). Stored at out (row
// stride ldo) as int32, or, with column scales sc, as the float float(acc[i][j]) * sc[j] (the
// int8 linear: a conversion that rounds to nearest even, then one multiply, as in finish). That
// multiply is the plain instruction on every ISA: sc[j] is a flushed normal (rp::mul) and
// float(acc) an integer, so the product is 0 or at least |sc[j]| >= 2^-126 and the §3 rule
// (tininess near 2^-126) never applies to it.
#if defined(RP_I8_VNNI) || defined(__AVX512BW__)
// One group: VNNI vpdpbusd (4 unsigned x signed byte products per int32 lane), else vpmaddwd on
// int16 pairs; both panels hold NR * G values per group, b1 the second half.
#if defined(RP_I8_VNNI)
#define RP_DOT(c, a, b) c = _mm512_dpbusd_epi32(c, a, b)
#else
#define RP_DOT(c, a, b) c = _mm512_add_epi32(c, _mm512_madd_epi16(a, b))
#endif
inline void micro(int64_t kg, const TA* Ap, int64_t lda, const TB* Bp, const int32_t* init, int64_t ldi, void* out,
                  int64_t ldo, const float* sc) {
  // Named accumulators (not an array): GCC then keeps them in registers without copies.
#define RP_ACC(i) __m512i c##i##0 = _mm512_loadu_si512(init + i * ldi), c##i##1 = _mm512_loadu_si512(init + i * ldi + 16);
  RP_ACC(0) RP_ACC(1) RP_ACC(2) RP_ACC(3) RP_ACC(4) RP_ACC(5) RP_ACC(6) RP_ACC(7)
#undef RP_ACC
  for (int64_t g = 0; g < kg; ++g) {
    const __m512i b0 = _mm512_loadu_si512(Bp + g * NR * G), b1 = _mm512_loadu_si512(Bp + g * NR * G + NR * G / 2);
    const TA* a = Ap + g * G;
#define RP_MAC(i) { const __m512i ai = _mm512_set1_epi32(word(a + i * lda)); RP_DOT(c##i##0, ai, b0); RP_DOT(c##i##1, ai, b1); }
    RP_MAC(0) RP_MAC(1) RP_MAC(2) RP_MAC(3) RP_MAC(4) RP_MAC(5) RP_MAC(6) RP_MAC(7)
#undef RP_MAC
  }
  if (sc) {
    float* o = static_cast<float*>(out);
    const __m512 s0 = _mm512_loadu_ps(sc), s1 = _mm512_loadu_ps(sc + 16);
#define RP_STORE(i) _mm512_storeu_ps(o + i * ldo, _mm512_mul_ps(_mm512_cvtepi32_ps(c##i##0), s0)); \
                    _mm512_storeu_ps(o + i * ldo + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(c##i##1), s1));
    RP_STORE(0) RP_STORE(1) RP_STORE(2) RP_STORE(3) RP_STORE(4) RP_STORE(5) RP_STORE(6) RP_STORE(7)
#undef RP_STORE
  } else {
    int32_t* o = static_cast<int32_t*>(out);
#define RP_STORE(i) _mm512_storeu_si512(o + i * ldo, c##i##0); _mm512_storeu_si512(o + i * ldo + 16, c##i##1);
    RP_STORE(0) RP_STORE(1) RP_STORE(2) RP_STORE(3) RP_STORE(4) RP_STORE(5) RP_STORE(6) RP_STORE(7)
#undef RP_STORE
  }
}
#undef RP_DOT
#elif defined(__AVX2__)
inline void micro(int64_t kg, const TA* Ap, int64_t lda, const TB* Bp, const int32_t* init, int64_t ldi, void* out,
                  int64_t ldo, const float* sc) {
  __m256i acc[MR][2];
  for (int i = 0; i < MR; ++i)
    for (int h = 0; h < 2; ++h) acc[i][h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(init + i * ldi + 8 * h));
  for (int64_t g = 0; g < kg; ++g) {
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Bp + g * NR * G));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Bp + g * NR * G + 16));
    const TA* a = Ap + g * G;
    for (int i = 0; i < MR; ++i) {
      const __m256i ai = _mm256_set1_epi32(word(a + i * lda));
      acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(ai, b0));
      acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(ai, b1));
    }
  }
  if (sc) {
    float* o = static_cast<float*>(out);
    for (int i = 0; i < MR; ++i)
      for (int h = 0; h < 2; ++h)
        _mm256_storeu_ps(o + i * ldo + 8 * h, _mm256_mul_ps(_mm256_cvtepi32_ps(acc[i][h]), _mm256_loadu_ps(sc + 8 * h)));
  } else {
    int32_t* o = static_cast<int32_t*>(out);
    for (int i = 0; i < MR; ++i)
      for (int h = 0; h < 2; ++h) _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i * ldo + 8 * h), acc[i][h]);
  }
}
#elif defined(__aarch64__)
}  // namespace
#include <arm_neon.h>
namespace {
inline void micro(int64_t kg, const TA* Ap, int64_t lda, const TB* Bp, const int32_t* init, int64_t ldi, void* out,
                  int64_t ldo, const float* sc) {
  int32x4_t acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < 4; ++q) acc[i][q] = vld1q_s32(init + i * ldi + 4 * q);
  for (int64_t k = 0; k < kg; ++k) {
    int16x4_t b[4];
    for (int q = 0; q < 4; ++q) b[q] = vld1_s16(Bp + k * NR + 4 * q);
    for (int i = 0; i < MR; ++i)
      for (int q = 0; q < 4; ++q) acc[i][q] = vmlal_n_s16(acc[i][q], b[q], Ap[i * lda + k]);  // smlal
  }
  if (sc) {
    float* o = static_cast<float*>(out);
    for (int i = 0; i < MR; ++i)
      for (int q = 0; q < 4; ++q) vst1q_f32(o + i * ldo + 4 * q, vmulq_f32(vcvtq_f32_s32(acc[i][q]), vld1q_f32(sc + 4 * q)));
  } else {
    int32_t* o = static_cast<int32_t*>(out);
    for (int i = 0; i < MR; ++i)
      for (int q = 0; q < 4; ++q) vst1q_s32(o + i * ldo + 4 * q, acc[i][q]);
  }
}
#else
inline void micro(int64_t kg, const TA* Ap, int64_t lda, const TB* Bp, const int32_t* init, int64_t ldi, void* out,
                  int64_t ldo, const float* sc) {
  int32_t acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = init[i * ldi + j];
  for (int64_t k = 0; k < kg; ++k)
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] += (int32_t)Ap[i * lda + k] * (int32_t)Bp[k * NR + j];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      if (sc) static_cast<float*>(out)[i * ldo + j] = (float)acc[i][j] * sc[j];
      else static_cast<int32_t*>(out)[i * ldo + j] = acc[i][j];
    }
}
#endif

// Cache blocks: a B panel's k-slice (NR x KC values) stays in L1 (16 KB), MC rows of A in L2.
constexpr int64_t KC = 16384 / (NR * (int64_t)sizeof(TB)) / G * G, MC = 16 * MR, NC = 8 * NR;
static_assert(KC % G == 0 && KC > 0, "KC must be a whole number of k groups");

// Per-thread packing buffers, kept between calls: no allocation (and no page faults) per call at
// the model's small shapes. Only the calling thread owns them; workers write disjoint panels.
// Buffers above kKeepBytes are released after the call (large shapes do not pin memory).
constexpr size_t kKeepBytes = size_t(64) << 20;
struct Packed {
  std::vector<TA> a;
  std::vector<TB> b;
  std::vector<int32_t> bias;
  std::vector<int64_t> colsum;
};

Packed& packed() {
  static thread_local Packed pk;
  return pk;
}

// The GEMM over output blocks; `finish(i0, mr, j0, nr, tile, ldt)` receives each finished int32
// micro-tile [mr, nr] (row stride ldt) inside the thread that computed it, while it is in L1.
// direct (the output [M, N], or null): full micro-tiles are stored there by the micro-kernel,
// without finish: int32, or float(acc) * dsc[j] when dsc (column scales) is given.
template <class Finish>
void gemm(const int8_t* A, const int8_t* B, int64_t M, int64_t N, int64_t K, const Finish& finish,
          void* direct = nullptr, const float* dsc = nullptr) {
  if (M == 0 || N == 0) return;
  const int64_t Kp = (K + G - 1) / G * G;
  const int64_t mpanels = (M + MR - 1) / MR, npanels = (N + NR - 1) / NR, lda = a_stride(Kp);
  Packed& pk = packed();
  TA* ap = rp_aligned64(pk.a, mpanels * MR * lda);   // every byte written by pack_a / pack_b
  TB* bp = rp_aligned64(pk.b, npanels * NR * Kp);
  int32_t* bias = rp_aligned64(pk.bias, npanels * NR);
  int64_t* colsum = rp_aligned64(pk.colsum, npanels * NR);
  rp::parallel_for(mpanels * MR, 64, [&](int64_t b, int64_t e) { pack_a(A, K, M, K, lda, b, e, ap); });
  rp::parallel_for(npanels, 4, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      pack_b(B + p * NR * K, K, N - p * NR, K, Kp, bp + p * NR * Kp, colsum + p * NR);
      for (int64_t j = p * NR; j < p * NR + NR; ++j) bias[j] = bias_of(colsum[j]);
    }
  });
  const int64_t mblocks = (M + MC - 1) / MC, nblocks = (N + NC - 1) / NC;
  rp::parallel_for(mblocks * nblocks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<int32_t> tile;  // the block's partial sums, only when K takes several k-blocks
    if (Kp > KC) tile.resize(MC * NC);
    alignas(64) int32_t ct[MR * NR];  // a finished micro-tile
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i0 = (t / nblocks) * MC, mc = std::min(MC, M - i0);
      const int64_t j0 = (t % nblocks) * NC, nc = std::min(NC, N - j0);
      for (int64_t k0 = 0; k0 < Kp || k0 == 0; k0 += KC) {
        const int64_t kc = std::min(KC, Kp - k0);
        const bool first = k0 == 0, last = k0 + kc >= Kp;
        for (int64_t jp = 0; jp < nc; jp += NR)
          for (int64_t ip = 0; ip < mc; ip += MR) {
            const int64_t mr = std::min(MR, mc - ip), nr = std::min(NR, nc - jp);
            const bool to_direct = last && direct && mr == MR && nr == NR;
            const int32_t* init = first ? bias + j0 + jp : tile.data() + ip * NC + jp;
            const int64_t at = (i0 + ip) * N + j0 + jp;  // the tile's offset in the output
            void* out = !to_direct ? (void*)(last ? ct : tile.data() + ip * NC + jp)
                        : dsc ? (void*)(static_cast<float*>(direct) + at) : (void*)(static_cast<int32_t*>(direct) + at);
            micro(kc / G, ap + (i0 + ip) * lda + k0, lda, bp + (j0 + jp) * Kp + k0 * NR, init, first ? 0 : NC,
                  out, to_direct ? N : last ? NR : NC, to_direct && dsc ? dsc + j0 + jp : nullptr);
            if (last && !to_direct) finish(i0 + ip, mr, j0 + jp, nr, ct, NR);
          }
      }
    }
  });
  if (pk.a.capacity() * sizeof(TA) + pk.b.capacity() * sizeof(TB) > kKeepBytes) pk = Packed();
}

// ---------------------------------------------------------------- several GEMMs on a packed B
// The exact matmul's eight residue GEMMs on this build's SIMD path (exact.cpp), in the AMX path's
// convention (kernels.h: rp_amx_pack_b, rp_amx_gemm). Each B_m is packed once, a chunk of rows at
// a time, at Bp + m * rp_int8_packed_bytes(N, K, 1): its panels as pack_b lays them
// ([N / NR][Kp / G][NR][G]), then the accumulators' start of each column (bias_of, int32). Each A_m
// is packed per call (pack_a). Then every MR x NR block of outputs runs the nmat micro-kernels one
// after the other, over all of K, into nmat tiles [MR][NR] that finish receives while they are in
// L1: the residue sums never go to memory. Blocks of mc rows x NC columns per task, mc chosen so
// that the task's A (nmat x mc rows x Kp) takes at most about kBlockBytes of L2 (eight matrices:
// MC = 128 rows up to K = 256 on VNNI, 64 at K = 1024); each B panel (nmat x NR x Kp) is reused
// by the block's mc / MR row tiles.
constexpr int64_t kBlockBytes = int64_t(512) << 10;

inline int64_t packed_k(int64_t K) { return (K + G - 1) / G * G; }
inline int64_t panels_of(int64_t N) { return (N + NR - 1) / NR; }

}  // namespace

int64_t rp_int8_packed_bytes(int64_t N, int64_t K, int nmat) {
  return nmat * panels_of(N) * NR * (packed_k(K) * (int64_t)sizeof(TB) + (int64_t)sizeof(int32_t));
}

void rp_int8_pack_b(const int8_t* B, int64_t ldb, int64_t b_next, int64_t N, int64_t K, int nmat, int64_t j0,
                    int64_t j1, uint8_t* out) {
  const int64_t Kp = packed_k(K), npanels = panels_of(N), bytes = rp_int8_packed_bytes(N, K, 1);
  const int64_t p0 = j0 / NR, np = (j1 + NR - 1) / NR - p0;
  rp::parallel_for(nmat * np, 4, [&](int64_t b, int64_t e) {
    for (int64_t q = b; q < e; ++q) {
      const int64_t m = q / np, p = p0 + q % np;
      uint8_t* mat = out + m * bytes;
      int32_t* bias = reinterpret_cast<int32_t*>(mat + npanels * NR * Kp * sizeof(TB)) + p * NR;
      int64_t colsum[NR];
      pack_b(B + m * b_next + (p * NR - j0) * ldb, ldb, j1 - p * NR, K, Kp, reinterpret_cast<TB*>(mat) + p * NR * Kp,
             colsum);
      for (int64_t r = 0; r < NR; ++r) bias[r] = bias_of(colsum[r]);
    }
  });
}

void rp_int8_gemm_packed(const int8_t* A, int64_t lda, int64_t a_next, const uint8_t* Bp, int64_t M, int64_t N,
                         int64_t K, int nmat, RpTileFinish finish, void* ctx) {
  if (M == 0 || N == 0) return;
  const int64_t Kp = packed_k(K), npanels = panels_of(N), bytes = rp_int8_packed_bytes(N, K, 1);
  const int64_t la = a_stride(Kp), rows = (M + MR - 1) / MR * MR;   // A_m packed: [rows][la]
  static thread_local std::vector<TA> abuf;   // the calling thread's; workers fill disjoint rows
  TA* ap = rp_aligned64(abuf, nmat * rows * la);
  rp::parallel_for(nmat * rows, 64, [&](int64_t b, int64_t e) {
    by_rows(b, e, rows, [&](int64_t m, int64_t r0, int64_t r1) {
      pack_a(A + m * a_next, lda, M, K, la, r0 - m * rows, r1 - m * rows, ap + m * rows * la);
    });
  });
  const int64_t mc = std::clamp<int64_t>(kBlockBytes / (nmat * la * (int64_t)sizeof(TA)) / MR * MR, MR, MC);
  const int64_t mblocks = (M + mc - 1) / mc, nblocks = (N + NC - 1) / NC;
  rp::parallel_for(mblocks * nblocks, 1, [&](int64_t t0, int64_t t1) {
    static thread_local std::vector<int32_t> tiles_buf;   // nmat finished tiles [MR][NR], in L1
    int32_t* tiles = rp_aligned64(tiles_buf, nmat * MR * NR);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i0 = (t / nblocks) * mc, mcb = std::min(mc, M - i0);
      const int64_t j0 = (t % nblocks) * NC, ncb = std::min(NC, N - j0);
      for (int64_t jp = 0; jp < ncb; jp += NR)
        for (int64_t ip = 0; ip < mcb; ip += MR) {
          for (int m = 0; m < nmat; ++m) {
            const uint8_t* mat = Bp + m * bytes;
            const int32_t* bias = reinterpret_cast<const int32_t*>(mat + npanels * NR * Kp * sizeof(TB));
            micro(Kp / G, ap + (m * rows + i0 + ip) * la, la, reinterpret_cast<const TB*>(mat) + (j0 + jp) * Kp,
                  bias + j0 + jp, 0, tiles + m * MR * NR, NR, nullptr);
          }
          finish(ctx, i0 + ip, std::min(MR, mcb - ip), j0 + jp, std::min(NR, ncb - jp), tiles, NR, MR * NR);
        }
    }
  });
  if (abuf.capacity() * sizeof(TA) > kKeepBytes) std::vector<TA>().swap(abuf);   // large shapes do not pin memory
}

namespace {

// ---------------------------------------------------------------- the path: SIMD or AMX
// AMX-INT8 (int8_amx.cpp) is the default where rp_amx_usable(): its bit-for-bit tests
// (tests/test_int8.py, test_int8_pv.py, test_exact_matmul.py against this file's SIMD path and the
// NumPy references) passed on AMX hardware (an Intel Xeon with AMX-INT8, 2026-12-01).
constexpr const char* kAmxPath = "int8 GEMM: AMX-INT8 tdpbssd (s8 x s8), blocks 32x32 of 2x2 tiles";
std::atomic<int> g_path{0};   // 0: not chosen yet; 1: SIMD; 2: AMX

int path() {
  int p = g_path.load(std::memory_order_relaxed);
  if (p == 0) g_path.store(p = rp_amx_usable() ? 2 : 1, std::memory_order_relaxed);
  return p;
}

// The AMX GEMM with gemm()'s finish convention; direct: the int32 output (full blocks go there).
template <class Finish>
void gemm_amx(const int8_t* A, const int8_t* B, int64_t M, int64_t N, int64_t K, const Finish& finish,
              int32_t* direct = nullptr) {
  static thread_local std::vector<uint8_t> bp;   // the calling thread's; workers fill disjoint panels
  uint8_t* b = rp_aligned64(bp, rp_amx_packed_bytes(N, K, 1));
  rp_amx_pack_b(B, K, 0, N, K, 1, 0, N, b);
  rp_amx_gemm(A, K, 0, b, M, N, K, 1, direct,
              [](void* ctx, int64_t i0, int64_t mr, int64_t j0, int64_t nr, const int32_t* t, int64_t ldt, int64_t) {
                (*static_cast<const Finish*>(ctx))(i0, mr, j0, nr, t, ldt);
              }, const_cast<void*>(static_cast<const void*>(&finish)));
  if (bp.capacity() > kKeepBytes) std::vector<uint8_t>().swap(bp);   // large shapes do not pin memory
}

}  // namespace

int rp_int8_select(int p) {
  if (p < 0 || p > 2 || (p == 2 && !rp_amx_usable())) return -1;
  g_path.store(p == 0 ? (rp_amx_usable() ? 2 : 1) : p, std::memory_order_relaxed);
  return path();
}

const char* rp_int8_path() { return path() == 2 ? kAmxPath : kI8Path; }

bool rp_int8_uses_amx() { return path() == 2; }

void rp_int8_matmul(const int8_t* A, const int8_t* B, int32_t* C, int64_t M, int64_t N, int64_t K) {
  const auto edges = [&](int64_t i0, int64_t mr, int64_t j0, int64_t nr, const int32_t* t, int64_t ldt) {
    for (int64_t i = 0; i < mr; ++i)  // the edge tiles; full ones were stored directly
      for (int64_t j = 0; j < nr; ++j) C[(i0 + i) * N + j0 + j] = t[i * ldt + j];
  };
  if (path() == 2) gemm_amx(A, B, M, N, K, edges, C);
  else gemm(A, B, M, N, K, edges, C);
}

void rp_int8_linear(const int8_t* A, const int8_t* B, float sx, const float* sw, float* Y, int64_t M,
                    int64_t N, int64_t K) {
  std::vector<float> sc(N);
  {
    rp::FpModeGuard guard;  // scalar work on the calling thread: FTZ/DAZ here too
    for (int64_t j = 0; j < N; ++j) sc[j] = rp::mul(sx, sw[j]);  // one rounding per column
  }
  const auto scale = [&](int64_t i0, int64_t mr, int64_t j0, int64_t nr, const int32_t* t, int64_t ldt) {
    const float* s = sc.data() + j0;
    for (int64_t i = 0; i < mr; ++i) {
      float* y = Y + (i0 + i) * N + j0;
      const int32_t* ti = t + i * ldt;
      for (int64_t j = 0; j < nr; ++j) y[j] = rp::mul((float)ti[j], s[j]);
    }
  };
  if (path() == 2) gemm_amx(A, B, M, N, K, scale);   // every block through scale
  else gemm(A, B, M, N, K, scale, Y, sc.data());
}

// The elementwise kernels below walk each chunk row by row (one recip per row part, no division
// per element) with VL lanes at a time and a scalar tail; every element gets the same float
// operations as the scalar form, so the bits do not depend on the split.
void rp_quantize(const float* x, const float* s, int8_t* q, int64_t R, int64_t C) {
  rp::parallel_for(R * C, 4096, [&](int64_t b, int64_t e) {
    by_rows(b, e, C, [&](int64_t r, int64_t i, int64_t end) {
      const float inv = rp::recip(s[r]);
      for (; i + rp::VL <= end; i += rp::VL) {
        const vb qb = to_int8(vquant(rp::mul(rp::loadn(x + i), inv)));
        std::memcpy(q + i, &qb, sizeof(qb));
      }
      for (; i < end; ++i) q[i] = (int8_t)quant(rp::mul(x[i], inv));
    });
  });
}

void rp_dequantize(const int8_t* q, const float* s, float* y, int64_t R, int64_t C) {
  rp::parallel_for(R * C, 4096, [&](int64_t b, int64_t e) {
    by_rows(b, e, C, [&](int64_t r, int64_t i0, int64_t end) {
      const float sr = s[r];
      for (int64_t i = i0; i < end; ++i) y[i] = rp::mul((float)q[i], sr);
    });
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
  // One pass per row: gx, the straight-through estimator (elementwise), and gs[r] = csum_c(gxh *
  // term) * g, term = Q(v) - v inside the grid, Q(v) = +-127 at the clip: the canonical sum on
  // vectors (vmath.h vcsum), whose term function runs once per chunk of the row, in order, and
  // stores that chunk's gx on the way.
  rp::parallel_for(R, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float inv = rp::recip(s[r]);
      const float *xr = x + r * C, *gr = gxh + r * C;
      float* gxr = gx + r * C;
      const float sum = rp::vcsum(C, [xr, gr, gxr, inv](int64_t c, int64_t m) {
        const rp::vf v = rp::mul(rp::loadn(xr + c, m), inv), gv = rp::loadn(gr + c, m);
        const rp::vi inside = vinside(v);
        rp::storen(gxr + c, rp::sel(inside, gv, rp::vf{}), m);
        const rp::vf qf = rp::to_float(vquant(v));
        return rp::mul(gv, rp::sel(inside, rp::sub(qf, v), qf));
      });
      gs[r] = rp::mul(sum, g);
    }
  });
}
