// exact.cpp -- the exact matmul, contract §11 (kernels/README.md; Ozaki scheme II): every value it
// computes before the final rounding is an integer, computed exactly, so its bits do not depend on
// any order, tiling or instruction set.
//
//   rp_exact_matmul(A, Bt, C, M, N, K)    C[i,j] = fl32(sum_k A[i,k] * Bt[j,k]) per §11
//   rp_exact_matmul(A, Bt, C, M, N, K, causal)   attention's products (kernels.h RpCausal): the
//                                        scores on and below the diagonal only, P's and gS's zeros
//                                        neither split nor multiplied (AMX skips those blocks and steps)
//   rp_exact_band_scores / _band_mix / _band_mix_t   window attention's band products (end of file)
//
// A [M, K] and Bt [N, K] (B transposed: each output column's operand is a row of K values) are
// float32 operands as kernels.h's RpExactOperand gives them (rows K-contiguous, or a transposed
// row-major tensor read in place), C [M, N] float32 contiguous. The steps, each over independent
// rows or outputs:
//   split      per row: the max biased exponent e of its finite nonzero values (a NaN/inf marks
//              the row), then each value's beta-bit integer q (rounded half away from zero;
//              uint32 shifts and selects) and its eight residues, one int8 plane [rows, K] per
//              modulus (in float32 lanes: near, below; A's planes on AMX in its tile order);
//   GEMMs      per modulus, the exact int8 GEMM of int8.cpp (AMX-INT8 / VNNI / vpmaddwd /
//              smlal). At small K (up to kFusedK on AMX, 64-256 otherwise) the eight GEMMs of each
//              block of C run one after the other (AMX: a 32 x 32 block on the tiles; SIMD: a
//              micro-tile, 8 x 32 with AVX-512) and the block is reconstructed at once
//              (exact_product_tiled: the residue sums never leave L1). Above it, eight GEMMs into
//              residue sums, then their reconstruction (AMX: up to kChunk, a chunk of a panel's
//              columns at a time; SIMD: a panel at a time, rp_int8_matmul, in chunks of at most
//              kChunk k, its K limit, whose residues add up);
//   reconstruct per output, 64 at a time in vectors: the residues and Garner's symmetric digits
//              (in float32 lanes), C' in int64, rounded to float32 once (§11 step 7).
// The residues and digits are integers below 2^24 held in float32 lanes, where products, sums and
// differences of them are exact, fused or not; the one rounded value, a reduction's quotient
// estimate, is bounded so that every residue plane and every digit is the same integer on every
// build (near, below).
#include "kernels.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "transpose.h"

namespace {

// GCC vectorizes loops with 256-bit vectors on Intel AVX-512 CPUs unless told otherwise; these
// integer loops (no float arithmetic, so no bits at stake) run faster at 512 bits.
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#define RP_WIDE_VECTORS __attribute__((target("prefer-vector-width=512")))
#else
#define RP_WIDE_VECTORS
#endif

constexpr int kMod = 8;
constexpr uint32_t kP[kMod] = {255, 253, 251, 247, 241, 239, 233, 229};  // odd, pairwise coprime
static_assert(uint64_t(kP[0]) * kP[1] * kP[2] * kP[3] * kP[4] * kP[5] * kP[6] * kP[7] == 12292429416557426565ull,
              "P = prod(p) < 2^64; |C'| <= 2^62 < (P - 1) / 2");
constexpr int64_t kChunk = 131072;  // k per residue GEMM: 131072 * 127^2 < 2^31 (contract §10)
// The int8 paths compute the eight residue GEMMs block by block (no residue sums in memory) up to
// these K; beyond them eight separate GEMMs (each blocked for the caches, its B panels reused from
// L1 and L2 by every row block) followed by one reconstruction pass were faster: on AMX above
// 1024 (2048^3), where each block's eight passes over K stream more than L2 holds; on the SIMD
// path above 256, where the eight B panels of a block (8 x 32 x K bytes) no longer stay in L1 and
// L2 with A's rows (AMD Zen 4, VNNI: K = 384-1024 with N = 128 lost 3-12%, tools/matmul_loop.py,
// and the exact step 5% at step level, tools/step_ab.py, 2026-12-03). Below kFusedSimdMinK the
// SIMD path's eight GEMMs are cheap and the fused form was slower too (QK^T, K = 32: 0.92x).
constexpr int64_t kFusedK = 1024, kFusedSimdK = 256, kFusedSimdMinK = 64;

constexpr uint32_t inverse(uint32_t a, uint32_t p) {  // a^-1 mod p by search (compile time)
  uint32_t x = 1;
  while ((a % p) * x % p != 1) ++x;
  return x;
}
// Garner's digits in one reduction each: with P_s = p_0 ... p_{s-1} and Q_t = P_t^-1 mod p_t,
// v_t = (u_t - sum_{s<t} v_s P_s) Q_t mod p_t = (sum_{s<=t} x_s coef[t][s]) mod p_t, x_t = u_t,
// x_s = v_s (s < t), coef[t][t] = Q_t, coef[t][s] = (-P_s Q_t) mod p_t: every term is below
// 255^2 and the sum of at most 8 below 2^19, so uint32 holds it unreduced.
struct Garner {
  uint32_t coef[kMod][kMod] = {};
  constexpr Garner() {
    for (int t = 0; t < kMod; ++t) {
      uint32_t Ps[kMod] = {}, P = 1;   // P_s mod p_t
      for (int s = 0; s < t; ++s) {
        Ps[s] = P;
        P = P * kP[s] % kP[t];
      }
      const uint32_t Q = inverse(P, kP[t]);
      coef[t][t] = Q;
      for (int s = 0; s < t; ++s) coef[t][s] = (kP[t] - Ps[s]) % kP[t] * Q % kP[t];
    }
  }
};
constexpr Garner kGarner;

// f(std::integral_constant<int, t>) for t = 0 .. kMod-1: every modulus a compile-time constant,
// so each % below is a multiply and shift, not a division instruction.
template <class F, int... T>
inline void each_mod(const F& f, std::integer_sequence<int, T...>) {
  (f(std::integral_constant<int, T>{}), ...);
}
template <class F>
inline void each_mod(const F& f) {
  each_mod(f, std::make_integer_sequence<int, kMod>{});
}

// beta = (62 - ceil(log2 K)) / 2 for K >= 1 (§11 step 2).
inline int beta_of(int64_t K) {
  int c = 0;
  while ((int64_t(1) << c) < K) ++c;
  return (62 - c) / 2;
}

typedef uint32_t u32v __attribute__((vector_size(64)));
typedef int32_t i32v __attribute__((vector_size(64)));
typedef float f32v __attribute__((vector_size(64)));
typedef uint32_t u32h __attribute__((vector_size(32)));   // half a vector: 8 lanes
typedef int32_t i32h __attribute__((vector_size(32)));
typedef float f32h __attribute__((vector_size(32)));
typedef uint64_t u64h __attribute__((vector_size(64)));
typedef int64_t i64h __attribute__((vector_size(64)));
typedef int8_t i8q __attribute__((vector_size(16)));
constexpr int64_t kV = 16;   // lanes per vector

// Residues are computed on small integers held in float32 lanes (x86 has no 32-bit vector
// multiply-high, so an integer % by a constant costs several times as much): the split's residues
// of each q, and the reconstruction's residues and Garner digits. Every value is an integer below
// 2^24, so their products, sums and differences are exact, fused or not; only the quotient
// estimate y = x * fl(1/p) is rounded:
//   near(x) = x - p * round(y), round(y) = (y + 1.5 * 2^23) - 1.5 * 2^23 (nearest, |y| < 2^22).
// fl(1/p) is within 2^-32 of 1/p (p in (128, 256)), and x / p is an integer or at least
// 1/(2p) > 2^-9 from a half-integer (p odd). So near(x) is congruent to x mod p, and:
//   - |x| < 2^24 (an int32 folded, x = (R >> 16) (2^16 mod p) + (R & 0xFFFF), congruent to R and
//     below 2^23; or a residue sum that is below 2^24 itself): y is within 2^-8 (its rounding) +
//     2^-8 (fl(1/p)) of x / p, so round(y) may be one off the nearest integer, |near(x)| < 3p/2,
//     and q p, at most |x| + 3p/2 < 2^24, is exact;
//   - |x| < 2^22 (a split value; a Garner sum, below 2^20, or of scaled residue sums, below 2^22):
//     y, below 2^15, is within 2^-10 (its rounding) + 2^-10 (fl(1/p)) = 2^-9 < 1/(2p)
//     of x / p, so near(x) is the representative in [-(p-1)/2, (p-1)/2], the same integer on
//     every build.
// (With a fused multiply-add, y + 1.5 * 2^23 is rounded once and only fl(1/p)'s error is left.)
// mul_add: a * b + c, one instruction with AVX-512, two (one per 256-bit half) with FMA.
inline f32v mul_add(f32v a, float b, f32v c) {
#if defined(__AVX512F__)
  return (f32v)_mm512_fmadd_ps((__m512)a, _mm512_set1_ps(b), (__m512)c);
#elif defined(__FMA__)
  const f32h lo = (f32h)_mm256_fmadd_ps((__m256)__builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_ps(b),
                                        (__m256)__builtin_shufflevector(c, c, 0, 1, 2, 3, 4, 5, 6, 7));
  const f32h hi = (f32h)_mm256_fmadd_ps((__m256)__builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15), _mm256_set1_ps(b),
                                        (__m256)__builtin_shufflevector(c, c, 8, 9, 10, 11, 12, 13, 14, 15));
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  return a * b + c;
#endif
}

// near(x) for modulus p_t, x in float32 lanes.
template <int t>
inline f32v near(f32v x) {
  constexpr float p = float(kP[t]), inv = 1.0f / float(kP[t]), kRound = 12582912.0f;   // 1.5 * 2^23
  const f32v q = mul_add(x, inv, f32v{} + kRound) - kRound;
  return mul_add(q, -p, x);
}

// The row exponent (max biased exponent of the finite nonzero values, 0 if none; subnormals read
// as zero) and whether the row holds a NaN or infinity.
// Two max reductions: of E (255 = non-finite) and of (E + 1) mod 256, which
// sends 255 to 0 and keeps the order of 0..254, so that its maximum less one is the max finite E
// (zeros and subnormals, E = 0, count as 0), in vectors of uint32 words.
// One value's bits u into the two maxima (scalar or vector lanes), and the maxima into the row's
// exponent and bad flag.
template <class U>
inline void exponent_maxima(U u, U& eall, U& eplus) {
  const U E = (u >> 23) & 0xFF, F = (E + 1) & 0xFF;
  eall = eall > E ? eall : E;
  eplus = eplus > F ? eplus : F;
}
inline void exponent_of(uint32_t eall, uint32_t eplus, int32_t* e, uint8_t* bad) {
  *e = eplus ? (int32_t)eplus - 1 : 0;
  *bad = eall == 255;
}

// The largest of a vector's 16 lanes, by halves (four shuffles and maxima, not 15 scalar steps).
inline uint32_t lane_max(u32v v) {
  u32h h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const u32h g = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  h = h > g ? h : g;
  typedef uint32_t u32q __attribute__((vector_size(16)));
  u32q q = __builtin_shufflevector(h, h, 0, 1, 2, 3), r = __builtin_shufflevector(h, h, 4, 5, 6, 7);
  q = q > r ? q : r;
  return std::max(std::max(q[0], q[1]), std::max(q[2], q[3]));
}

RP_WIDE_VECTORS inline void row_exponent(const float* x, int64_t K, int32_t* e, uint8_t* bad) {
  u32v vall = {}, vplus = {};
  int64_t k = 0;
  for (; k + kV <= K; k += kV) {
    u32v u;
    std::memcpy(&u, x + k, sizeof(u));
    exponent_maxima(u, vall, vplus);
  }
  uint32_t eall = lane_max(vall), eplus = lane_max(vplus);
  for (; k < K; ++k) {
    uint32_t u;
    std::memcpy(&u, x + k, sizeof(u));
    exponent_maxima(u, eall, eplus);
  }
  exponent_of(eall, eplus, e, bad);
}

// 16 integer-valued lanes in [-127, 127] as int8. Without AVX-512's vpmovdb, GCC turns the direct
// int32 -> int8 conversion into a byte insert per lane (perf: half of the split's time on AMD
// Zen 3); through int16 it narrows whole vectors (AVX2: vpackusdw, vpackuswb). Truncation keeps
// every value of this range either way.
typedef int16_t i16v __attribute__((vector_size(32)));
inline i8q to_int8(f32v x) {
#if defined(__AVX512F__)
  return __builtin_convertvector(__builtin_convertvector(x, i32v), i8q);
#else
  return __builtin_convertvector(__builtin_convertvector(__builtin_convertvector(x, i32v), i16v), i8q);
#endif
}

// n <= kSplit values (their float bits) of a row with exponent e: q = m 2^(E - e + beta - 24)
// rounded half away from zero (q <= 2^beta, and below 2^31 at beta = 31: m 2^7 at most), held
// with its sign as an int32, then its residues into out[t * plane + at(k)] (at(k) = k, or with
// tiled AMX's tile order within a row, (k / 64) 2048 + k % 64: kernels.h's rp_amx_a_offset) (the symmetric
// representative in [-(p-1)/2, (p-1)/2]) of +-q, or with scaled of +-q Q_t (Garner's
// coef[t][t], below): the integers first, then the residues a vector at a time (tiled: the last
// vector written whole, its lanes past n zero, where the row's values are zeros).
constexpr int64_t kSplit = 256;
// v mod p_t as the symmetric representative, |v| <= 127 (a compile-time constant of the split).
constexpr int32_t sym(uint64_t v, uint32_t p) { return v % p <= p / 2 ? int32_t(v % p) : int32_t(v % p) - int32_t(p); }
template <bool scaled, bool tiled>
RP_WIDE_VECTORS inline void split_values(const uint32_t* bits, int64_t n, int32_t e, int beta, int8_t* out,
                                         int64_t plane) {
  int32_t q[kSplit];
  for (int64_t k = 0; k < n; ++k) {
    const uint32_t u = bits[k];
    const int32_t E = (int32_t)((u >> 23) & 0xFF);
    const uint32_t m = (E == 0 || E == 255) ? 0u : ((u & 0x7FFFFFu) | 0x800000u);
    const int32_t sh = e - E + 24 - beta;               // >= 24 - beta >= -7 for a live value
    const uint32_t left = m << (uint32_t)std::clamp(-sh, 0, 7);
    const int32_t s = std::clamp(sh, 1, 31);
    const uint32_t right = sh > 24 ? 0u : (m + (1u << (s - 1))) >> s;
    const int32_t mag = (int32_t)(sh <= 0 ? left : right);
    q[k] = (u >> 31) ? -mag : mag;
  }
  // the residues in float32 lanes (near, above), from q's pieces (>> arithmetic, the low pieces
  // in [0, 2^k)) and symmetric constants, so that near(x) is the representative in
  // [-(p-1)/2, (p-1)/2]:
  //   q = a 2^17 + c (|a| <= 2^14, c < 2^17): x = a f17 + c, f17 = 2^17 mod p, congruent to q and
  //     below 2^14 127 + 2^17 < 2^22 in magnitude;
  //   scaled, q = a 2^20 + b 2^10 + c (|a| <= 2^11, b, c < 2^10): x = a f20 + b f10 + c f0 with
  //     f0 = Q_t, f20 = 2^20 f0 and f10 = 2^10 f0 mod p, congruent to q Q_t and below 2^19.
  for (int64_t k = n; k % kV; ++k) q[k] = 0;   // the last vector's lanes past n
  for (int64_t k = 0; k < n; k += kV) {
    i32v qv;
    std::memcpy(&qv, q + k, sizeof(qv));
    const auto store = [&](int t, i8q r) {
      int8_t* o = out + t * plane + (tiled ? k / 64 * 2048 + k % 64 : k);   // (16 values: one 64-k step)
      if (n - k >= kV || tiled)   // (tiled: the lanes past n, zeros, stay in the row's 64-k step, where
                                  // the values past n are zeros: padding, or a causal form's)
        std::memcpy(o, &r, kV);
      else
        std::memcpy(o, &r, n - k);
    };
    if constexpr (scaled) {
      const f32v a = __builtin_convertvector(qv >> 20, f32v), b = __builtin_convertvector((qv >> 10) & 0x3FF, f32v),
                 c = __builtin_convertvector(qv & 0x3FF, f32v);
      each_mod([&](auto t) {
        constexpr uint64_t f0 = kGarner.coef[t][t];
        constexpr float f20 = float(sym(f0 << 20, kP[t])), f10 = float(sym(f0 << 10, kP[t])), c0 = float(sym(f0, kP[t]));
        store(t, to_int8(near<t>(mul_add(a, f20, mul_add(b, f10, c * c0)))));   // (t = 0: c * 1, c)
      });
    } else {
      const f32v a = __builtin_convertvector(qv >> 17, f32v), c = __builtin_convertvector(qv & 0x1FFFF, f32v);
      each_mod([&](auto t) {
        constexpr float f17 = float(sym(uint64_t(1) << 17, kP[t]));
        store(t, to_int8(near<t>(mul_add(a, f17, c))));
      });
    }
  }
}

// The reconstruction (§11 steps 6-7) of 64 outputs at once, from their eight residue sums
// res[t * stride + l] (Sums, below), their exponents ex[l] and bad flags bad[l], to f[l] (float
// bits), lane l < 64, in vectors of 16 lanes (GCC/Clang vector extensions), two vectors' chains
// interleaved (each digit waits on the one before).
//
// Garner's algorithm with symmetric digits: v_t = (u_t - sum_{s<t} v_s P_s) Q_t (P_s = p_0 ...
// p_{s-1}, Q_t = P_t^-1 mod p_t) taken in [-(p_t-1)/2, (p_t-1)/2] makes X = sum_t v_t P_t
// congruent to C' mod every p_t with |X| <= sum_t (p_t-1)/2 P_t = (P-1)/2 = H, so X = C' itself
// (the same C' as step 6's digits in [0, p_t) and X - P above H). In one reduction per digit:
// v_t = (sum_{s<=t} x_s coef[t][s]) mod p_t, x_t = u_t, x_s = v_s (s < t), coef[t][t] = Q_t,
// coef[t][s] = (-P_s Q_t) mod p_t. In float32 lanes (near, above): u_t = near(R_t, folded unless
// small), |u_t| < 3p/2 < 383, and the sum is below 383 * 254 + 7 * 127 * 254 < 2^20, so
// v_t = near(sum). With scaled sums (one operand's residues times Q_t, split_values) R_t is
// congruent to u_t Q_t and enters the sum as it is: |R_t| <= K ((p_t-1)/2)^2, and the sum is below
// 2^22 for K <= kScaledK (scaled_bound), so again v_t = near(sum). Then Z = v_0 + p_0 v_1 +
// p_0 p_1 (v_2 + p_2 v_3) and the same Y of v_4..v_7, both below 2^31 in magnitude (int32; the
// inner sums below 2^15, exact in float32), and C' = Z + p_0 p_1 p_2 p_3 Y in int64; then its
// rounding.
constexpr int64_t kGroups = 4, kBlock = kV * kGroups;   // vectors, outputs
constexpr int64_t kP0123 = int64_t(kP[0]) * kP[1] * kP[2] * kP[3];
static_assert(kP0123 / 2 < (int64_t(1) << 31) && int64_t(kP[4]) * kP[5] * kP[6] * kP[7] / 2 < (int64_t(1) << 31),
              "Z and Y fit int32");

// What a residue sum R_t is, and so how reconstruct64 reads it:
//   kFolded  any int32 congruent to C' mod p_t (folded below 2^23, then near);
//   kSmall   congruent to C', below 2^24 in magnitude (K <= kSmallK: K 127^2 < 2^24), converted
//            exactly, then near;
//   kScaled  congruent to Q_t C' (the residues of the operand with fewer rows scaled, K <= kScaledK:
//            the scaling costs a multiply per residue of that operand and saves a reduction and a
//            multiply per residue sum), enters Garner's sum as it is.
enum class Sums { kFolded, kSmall, kScaled };
constexpr int64_t kSmallK = 1040, kScaledK = 256;
static_assert(kSmallK * 127 * 127 < (int64_t(1) << 24), "kSmall sums convert exactly");
// The largest |R_t + sum_{s<t} v_s coef[t][s]| of scaled sums at K over every t.
constexpr int64_t scaled_bound(int64_t K) {
  int64_t most = 0;
  for (int t = 0; t < kMod; ++t) {
    int64_t sum = K * ((kP[t] - 1) / 2) * ((kP[t] - 1) / 2);
    for (int s = 0; s < t; ++s) sum += (kP[s] - 1) / 2 * int64_t(kGarner.coef[t][s]);
    most = std::max(most, sum);
  }
  return most;
}
static_assert(scaled_bound(kScaledK) < (int64_t(1) << 22), "a Garner sum of scaled residue sums is below 2^22");
inline Sums sums_for(int64_t K) { return K <= kScaledK ? Sums::kScaled : K <= kSmallK ? Sums::kSmall : Sums::kFolded; }

// §11 step 7 on 8 lanes: the integers c times 2^ex rounded to float32 once, as bit patterns.
// (float)c is the int64 -> float32 conversion, correctly rounded to nearest even (IEEE; the
// rounding mode every kernel chunk sets, §3): exactly the 24-bit rounding of step 7, carry
// included, and exact for |c| < 2^24. Its exponent is then moved by ex in the bits.
inline u32h to_float_bits(i64h c, i32h ex) {
  const u32h b = (u32h)__builtin_convertvector(c, f32h);
  const u32h sign = b & 0x80000000u;
  const i32h E = (i32h)((b >> 23) & 0xFF) - 127 + ex;            // c != 0: a normal float >= 1
  u32h f = sign | ((u32h)(E + 127) << 23) | (b & 0x7FFFFFu);
  f = E > 127 ? (sign | 0x7F800000u) : f;
  f = E < -126 ? sign : f;                                        // the §3 flush, the sign kept
  return __builtin_convertvector(c == 0, i32h) ? u32h{} : f;     // C' = 0: +0.0
}

// The same on 16 lanes (c0: lanes 0-7, c1: lanes 8-15) into f. With AVX-512 and the hardware
// flush (FpModeGuard sets MXCSR.FTZ), vscalefps does the exponent's move in one instruction:
// (float)c times 2^ex exactly where the result is normal, +-inf above (round to nearest), a zero of
// the sign below 2^-126 (FTZ flushes every tiny result, exact or not), +0.0 for C' = 0.
inline void to_float_bits16(i64h c0, i64h c1, const int32_t* ex, uint32_t* f) {
#if defined(__AVX512F__) && !RP_FLUSH_SOFT
  const f32h r0 = __builtin_convertvector(c0, f32h), r1 = __builtin_convertvector(c1, f32h);
  const f32v r = __builtin_shufflevector(r0, r1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  i32v e;
  std::memcpy(&e, ex, sizeof(e));
  const __m512 scaled = _mm512_scalef_ps((__m512)r, _mm512_cvtepi32_ps((__m512i)e));
  std::memcpy(f, &scaled, sizeof(scaled));
#else
  for (int h = 0; h < 2; ++h) {
    i32h e;
    std::memcpy(&e, ex + 8 * h, sizeof(e));
    const u32h b = to_float_bits(h ? c1 : c0, e);
    std::memcpy(f + 8 * h, &b, sizeof(b));
  }
#endif
}

template <Sums sums>
__attribute__((flatten)) inline void reconstruct64(const int32_t* res, int64_t stride, const int32_t* ex,
                                                  const uint8_t* bad, uint32_t* f) {
  constexpr int kPair = 2;
  for (int g0 = 0; g0 < kGroups; g0 += kPair) {
    f32v v[kMod][kPair];
    each_mod([&](auto t) {
      constexpr float fold = float((uint32_t(1) << 16) % kP[t]);   // 2^16 mod p
      for (int g = 0; g < kPair; ++g) {
        i32v r;
        std::memcpy(&r, res + t * stride + kV * (g0 + g), sizeof(r));
        const f32v x = sums != Sums::kFolded ? __builtin_convertvector(r, f32v)
                                             : mul_add(__builtin_convertvector(r >> 16, f32v), fold,
                                                       __builtin_convertvector(r & 0xFFFF, f32v));
        f32v acc = sums == Sums::kScaled ? x : near<t>(x) * float(kGarner.coef[t][t]);
        each_mod([&](auto s) {
          if constexpr (s < t) acc = mul_add(v[s][g], float(kGarner.coef[t][s]), acc);
        });
        v[t][g] = near<t>(acc);
      }
    });
    constexpr int32_t kP01 = kP[0] * kP[1], kP45 = kP[4] * kP[5];
    for (int g = 0; g < kPair; ++g) {
      const i32v Z = __builtin_convertvector(mul_add(v[1][g], float(kP[0]), v[0][g]), i32v) +
                     kP01 * __builtin_convertvector(mul_add(v[3][g], float(kP[2]), v[2][g]), i32v);
      const i32v Y = __builtin_convertvector(mul_add(v[5][g], float(kP[4]), v[4][g]), i32v) +
                     kP45 * __builtin_convertvector(mul_add(v[7][g], float(kP[6]), v[6][g]), i32v);
      i64h c[2];   // C', lanes 0-7 and 8-15
      for (int h = 0; h < 2; ++h) {
        i32h z, y;
        std::memcpy(&z, reinterpret_cast<const int32_t*>(&Z) + 8 * h, sizeof(z));
        std::memcpy(&y, reinterpret_cast<const int32_t*>(&Y) + 8 * h, sizeof(y));
        c[h] = __builtin_convertvector(z, i64h) + kP0123 * __builtin_convertvector(y, i64h);
      }
      to_float_bits16(c[0], c[1], ex + kV * (g0 + g), f + kV * (g0 + g));
    }
  }
  for (int64_t l = 0; l < kBlock; ++l) f[l] = bad[l] ? 0x7FC00000u : f[l];
}

// Outputs [0, nj) of one row (nj <= kBlock) from res[t * stride + j]; exb[j] = the column's part of
// the exponent, exa the row's.
template <Sums sums>
inline void reconstruct(const int32_t* res, int64_t stride, int64_t nj, int32_t exa, const int32_t* exb,
                        const uint8_t* bad_b, bool bad_a, float* out) {
  int32_t ex[kBlock] = {}, r[kMod * kBlock];
  uint8_t bad[kBlock] = {};
  uint32_t f[kBlock];
  for (int64_t j = 0; j < nj; ++j) {
    ex[j] = exa + exb[j];
    bad[j] = bad_a || bad_b[j];
  }
  if (nj < kBlock) {   // a short block: zero-padded copies of its residue sums
    std::memset(r, 0, sizeof(int32_t) * kMod * kBlock);
    for (int t = 0; t < kMod; ++t) std::memcpy(r + t * kBlock, res + t * stride, nj * sizeof(int32_t));
    res = r;
    stride = kBlock;
  }
  reconstruct64<sums>(res, stride, ex, bad, f);
  std::memcpy(out, f, sizeof(uint32_t) * nj);
}

// Rows [r0, r1) of x, values [k0, k0 + kc): planes [kMod][rows][ld], ld = kc or kc rounded up to
// 64, the values past kc zero; or, tiled (k0 = 0, ld = kc rounded up to 64), each plane in AMX's tile order
// (rp_amx_a_offset, rows rounded up to 32), the rows past `rows` zeroed by the call that ends
// there; scaled: the residues for Sums::kScaled (split_values). 16 rows at a time, kSplit values
// at a time, gathered into bits: rows that are K-contiguous copied; rows of a transposed operand
// (rs = 1) through register transposes of the consecutive values of 16 rows at each k (16 x 16
// with AVX-512, 8 x 8 with AVX), so that x^T is never written out.
void split_rows(RpExactOperand x, int64_t k0, int64_t kc, const int32_t* e, int beta, int8_t* planes, int64_t rows,
                int64_t ld, int64_t r0, int64_t r1, bool scaled, bool tiled, RpCausalRows cz = {}) {
  const int64_t plane = (tiled ? (rows + 31) / 32 * 32 : rows) * ld;
  const auto at = [&](int64_t r, int64_t k) { return tiled ? rp_amx_a_offset(r, k, ld) : r * ld + k; };
  if (tiled && r1 == rows)   // the last block's rows past `rows`
    for (int64_t r = rows; r % 32; ++r)
      for (int t = 0; t < kMod; ++t)
        for (int64_t k = 0; k < ld; k += 64) std::memset(planes + t * plane + at(r, k), 0, 64);
  const bool mix = cz.form == RpCausal::kMix, mix_t = cz.form == RpCausal::kMixT;
  alignas(64) uint32_t bits[kV][kSplit];   // 16 KB
  int64_t keep[kV];   // kMix: each row's values k < keep[i] (t + 1); the rest are the form's zeros
  for (int64_t g = r0; g < r1; g += kV) {
    const int64_t ng = std::min(kV, r1 - g), rg = cz.row0 + g;   // rg: the group's first row in the product
    if (mix)
      for (int64_t i = 0, t = rg % cz.T; i < ng; ++i, t = t + 1 == cz.T ? 0 : t + 1) keep[i] = t + 1;
    else
      for (int64_t i = 0; i < ng; ++i) keep[i] = k0 + kc;
    // kMixT with one head (k0 + kc = K = T): the group's rows are keys j >= rg, so no value below
    // rg (whole 64-k steps of it) is kept
    const int64_t kfirst = mix_t && k0 == 0 && kc == cz.T ? rg / 64 * 64 : 0;
    // The zeros the split does not write, before it: values [z0, z1) of row r in every plane (tiled:
    // z0 and z1 multiples of 64, whole 64-k steps, of which the split then overwrites its part)
    const auto zero = [&](int64_t r, int64_t z0, int64_t z1) {
      for (int t = 0; t < kMod; ++t)
        if (!tiled)
          std::memset(planes + t * plane + r * ld + z0, 0, z1 - z0);
        else
          for (int64_t k = z0; k < z1; k += 64) std::memset(planes + t * plane + at(r, k), 0, 64);
    };
    for (int64_t i = 0; i < ng; ++i) {
      const int64_t r = g + i;
      if (mix && !tiled) {
        zero(r, keep[i] - k0 < kc ? std::max<int64_t>(keep[i] - k0, 0) : kc, ld);   // k past t (and kc)
      } else if (mix) {   // k past t, up to the k-steps the AMX GEMM multiplies for r's block of 32 rows
        const int64_t blk = r / 32 * 32, mb = std::min<int64_t>(32, rows - blk), t0 = (cz.row0 + blk) % cz.T;
        const int64_t tl = t0 + mb <= cz.T ? t0 + mb - 1 : cz.T - 1;   // the block's largest t
        const int64_t z0 = std::min(keep[i], kc) / 64 * 64, z1 = std::min(ld, (tl + 64) / 64 * 64);
        if (z1 > z0) zero(r, z0, z1);
      } else {
        if (kfirst) zero(r, 0, kfirst);                           // kMixT: the steps below the group's keys
        if (ld > kc) zero(r, tiled ? kc / 64 * 64 : kc, ld);      // past kc (ld = kc rounded up to 64)
      }
    }
    for (int64_t b0 = kfirst; b0 < kc; b0 += kSplit) {
      const int64_t n = std::min(kSplit, kc - b0), k1 = k0 + b0;
      if (mix && *std::max_element(keep, keep + ng) <= k1) continue;   // all the form's zeros
      const uint32_t* src[kV];   // row i's values k1 ..: bits[i], or with kMix the row itself
      for (int64_t i = 0; i < ng; ++i) src[i] = bits[i];
      if (x.ks == 1 && mix) {   // (read in place: each row's own number of values, no copy of them)
        for (int64_t i = 0; i < ng; ++i) src[i] = reinterpret_cast<const uint32_t*>(x.x + (g + i) * x.rs + k1);
      } else if (x.ks == 1) {
        for (int64_t i = 0; i < ng; ++i) {
          const float* row = x.x + (g + i) * x.rs + k1;
          if (n == kSplit)   // (a fixed-size copy is inlined)
            std::memcpy(bits[i], row, kSplit * sizeof(uint32_t));
          else
            std::memcpy(bits[i], row, n * sizeof(uint32_t));
        }
      } else {
        int64_t k = 0;
#if defined(__AVX512F__)
        if (ng == kV)
          for (; k + kV <= n; k += kV) {
            __m512i v[kV];
            for (int64_t j = 0; j < kV; ++j) v[j] = _mm512_loadu_si512(x.x + (k1 + k + j) * x.ks + g);
            rp::transpose16(v);
            for (int64_t i = 0; i < kV; ++i) _mm512_store_si512(&bits[i][k], v[i]);
          }
#elif defined(__AVX__)
        if (ng == kV)   // the same with two 8 x 8 transposes per 8 k
          for (; k + 8 <= n; k += 8)
            for (int64_t h = 0; h < kV; h += 8) {
              __m256 v[8];
              for (int64_t j = 0; j < 8; ++j) v[j] = _mm256_loadu_ps(x.x + (k1 + k + j) * x.ks + g + h);
              rp::transpose8(v);
              for (int64_t i = 0; i < 8; ++i) _mm256_store_ps(reinterpret_cast<float*>(&bits[h + i][k]), v[i]);
            }
#endif
        for (int64_t i = 0; i < ng; ++i)
          for (int64_t kk = k; kk < n; ++kk) std::memcpy(&bits[i][kk], x.x + (k1 + kk) * x.ks + g + i, 4);
      }
      if (mix_t)   // row j keeps k = (g', t) with t >= j: zero t < j in each head's period
        for (int64_t i = 0; i < ng; ++i)
          for (int64_t p0 = k1 / cz.T * cz.T; p0 < k1 + n; p0 += cz.T) {
            const int64_t z0 = std::max<int64_t>(p0, k1), z1 = std::min<int64_t>(p0 + rg + i, k1 + n);
            if (z1 > z0) std::memset(&bits[i][z0 - k1], 0, 4 * (z1 - z0));
          }
      for (int64_t i = 0; i < ng; ++i) {
        int8_t* out = planes + at(g + i, b0);
        const int64_t ni = std::clamp<int64_t>(keep[i] - k1, 0, n);
        if (ni == 0) continue;
        if (tiled)
          (scaled ? split_values<true, true> : split_values<false, true>)(src[i], ni, e[g + i], beta, out, plane);
        else
          (scaled ? split_values<true, false> : split_values<false, false>)(src[i], ni, e[g + i], beta, out, plane);
      }
    }
  }
}

// The planes and residue sums, kept between calls by the calling thread (no allocation and no page
// faults per call at the model's shapes); above kKeepBytes they are released after the call.
constexpr size_t kKeepBytes = size_t(64) << 20;
constexpr int64_t kResBytes = int64_t(32) << 20;   // one panel's residue sums
struct Buffers {
  std::vector<int8_t> pa, pb;
  std::vector<int32_t> res, part;
  std::vector<uint8_t> bpacked;   // the AMX path's B planes in the tile layout
};
Buffers& buffers() {
  static thread_local Buffers b;
  return b;
}

// x from its row r on.
inline RpExactOperand rows_from(RpExactOperand x, int64_t r) { return {x.x + r * x.rs, x.rs, x.ks}; }
// The causal form's rows from row0 on, with its period T (kernels.h: kScores N, kMix K, kMixT M).
inline RpCausalRows causal_rows(RpCausal form, int64_t M, int64_t N, int64_t K, int64_t row0) {
  const int64_t T = form == RpCausal::kScores ? N : form == RpCausal::kMix ? K : M;
  return {form, T, row0};
}

}  // namespace

int rp_exact_beta(int64_t K) { return beta_of(K); }

namespace {
// The exponents of 64 consecutive rows of a transposed operand (row i's value k at x[k * ks + i]).
RP_WIDE_VECTORS void slab_exponents(const float* x, int64_t ks, int64_t K, int32_t* e, uint8_t* bad) {
  u32v vall[4] = {}, vplus[4] = {};
  for (int64_t k = 0; k < K; ++k)
    for (int v = 0; v < 4; ++v) {
      u32v u;
      std::memcpy(&u, x + k * ks + v * kV, sizeof(u));
      exponent_maxima(u, vall[v], vplus[v]);
    }
  for (int v = 0; v < 4; ++v)
    for (int64_t l = 0; l < kV; ++l) exponent_of(vall[v][l], vplus[v][l], &e[v * kV + l], &bad[v * kV + l]);
}
}  // namespace

void rp_exact_exponents(RpExactOperand x, int64_t rows, int64_t K, int32_t* e, uint8_t* bad) {
  if (x.ks == 1) {
    rp::parallel_for(rows, 16, [&](int64_t b, int64_t end) {
      for (int64_t i = b; i < end; ++i) row_exponent(x.x + i * x.rs, K, &e[i], &bad[i]);
    });
    return;
  }
  // a transposed operand: k by k along the rows' consecutive values, the two maxima of
  // row_exponent per row, 64 rows at a time in registers (the rest of 64 one by one)
  constexpr int64_t kSlab = 4 * kV;
  rp::parallel_for((rows + kSlab - 1) / kSlab, 4, [&](int64_t sb, int64_t se) {
    for (int64_t r0 = sb * kSlab; r0 < std::min(rows, se * kSlab); r0 += kSlab) {
      const int64_t n = std::min(kSlab, rows - r0);
      if (n == kSlab) {
        slab_exponents(x.x + r0, x.ks, K, e + r0, bad + r0);
        continue;
      }
      for (int64_t i = 0; i < n; ++i) {
        uint32_t eall = 0, eplus = 0;
        for (int64_t k = 0; k < K; ++k) {
          uint32_t u;
          std::memcpy(&u, x.x + k * x.ks + r0 + i, sizeof(u));
          exponent_maxima(u, eall, eplus);
        }
        exponent_of(eall, eplus, &e[r0 + i], &bad[r0 + i]);
      }
    }
  });
}

namespace {

// The row exponents of attention's A under its causal form (kernels.h), the form's zeros read as
// +0.0 (a zero counts as exponent 0, as in row_exponent): kMix, K-contiguous rows r over k <= t =
// r % K; kMixT, a transposed operand (row j's value k at x[k * ks + j], T = rows) over k = (g, t)
// with t >= j, 64 rows at a time in registers with the lanes j > t masked to +0.0 (the rest of 64
// one by one).
RP_WIDE_VECTORS void causal_exponents(RpExactOperand x, int64_t rows, int64_t K, RpCausal form, int32_t* e,
                                      uint8_t* bad) {
  if (form == RpCausal::kMix) {
    rp::parallel_for(rows, 16, [&](int64_t b, int64_t end) {
      for (int64_t i = b, t = b % K; i < end; ++i, t = t + 1 == K ? 0 : t + 1)   // (t = i % K without a division)
        row_exponent(x.x + i * x.rs, t + 1, &e[i], &bad[i]);
    });
    return;
  }
  constexpr int64_t kSlab = 4 * kV;
  const int64_t T = rows;
  rp::parallel_for((rows + kSlab - 1) / kSlab, 1, [&](int64_t sb, int64_t se) {
    for (int64_t r0 = sb * kSlab; r0 < std::min(rows, se * kSlab); r0 += kSlab) {
      const int64_t n = std::min(kSlab, rows - r0);
      if (n < kSlab) {
        for (int64_t i = 0; i < n; ++i) {
          uint32_t eall = 0, eplus = 0;
          for (int64_t p0 = 0; p0 < K; p0 += T)   // each head's k = p0 + t, t >= j = r0 + i
            for (int64_t k = p0 + r0 + i; k < p0 + T; ++k) {
              uint32_t u;
              std::memcpy(&u, x.x + k * x.ks + r0 + i, sizeof(u));
              exponent_maxima(u, eall, eplus);
            }
          exponent_of(eall, eplus, &e[r0 + i], &bad[r0 + i]);
        }
        continue;
      }
      u32v vall[4] = {}, vplus[4] = {};
      u32v lane;
      for (int64_t l = 0; l < kV; ++l) lane[l] = uint32_t(l);
      for (int64_t k = 0, t = 0; k < K; ++k, t = t + 1 == T ? 0 : t + 1) {   // t = k % T
        if (t < r0) continue;   // every lane j > t
        for (int v = 0; v < 4; ++v) {
          u32v u;
          std::memcpy(&u, x.x + k * x.ks + r0 + v * kV, sizeof(u));
          const int64_t off = t - (r0 + v * kV);   // lanes l <= off are kept
          if (off < 0)
            u = u32v{};
          else if (off < kV - 1)
            u = lane <= (u32v{} + uint32_t(off)) ? u : u32v{};
          exponent_maxima(u, vall[v], vplus[v]);
        }
      }
      for (int v = 0; v < 4; ++v)
        for (int64_t l = 0; l < kV; ++l) exponent_of(vall[v][l], vplus[v][l], &e[r0 + v * kV + l], &bad[r0 + v * kV + l]);
    }
  });
}

// The outputs of rows [i0, i0 + m) from their residue sums res [kMod][m][N] (§11 steps 6-7), into
// columns [0, N) of C's rows, ldc apart; scores (kScores, rows i0 + i of the whole product): not
// the blocks of kBlock outputs wholly right of their row's diagonal.
template <Sums sums>
void reconstruct_rows(const int32_t* res, int64_t i0, int64_t m, int64_t N, int beta, const int32_t* ea,
                      const uint8_t* bad_a, const int32_t* exb, const uint8_t* bad_b, float* C, int64_t ldc,
                      bool scores) {
  const int64_t nblocks = (N + kBlock - 1) / kBlock;
  rp::parallel_for(m * nblocks, 16, [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) {
      const int64_t i = w / nblocks, j0 = (w % nblocks) * kBlock, nj = std::min(kBlock, N - j0);
      if (scores && j0 > (i0 + i) % N) continue;   // (+0.0, written by rp_exact_matmul)
      reconstruct<sums>(res + i * N + j0, m * N, nj, ea[i0 + i] - 126 - beta, exb + j0, bad_b + j0,
                        bad_a[i0 + i] != 0, C + (i0 + i) * ldc + j0);
    }
  });
}
void reconstruct_panel(Sums sums, const int32_t* res, int64_t i0, int64_t m, int64_t N, int beta, const int32_t* ea,
                       const uint8_t* bad_a, const int32_t* exb, const uint8_t* bad_b, float* C, int64_t ldc,
                       bool scores = false) {
  if (sums == Sums::kScaled)
    reconstruct_rows<Sums::kScaled>(res, i0, m, N, beta, ea, bad_a, exb, bad_b, C, ldc, scores);
  else if (sums == Sums::kSmall)
    reconstruct_rows<Sums::kSmall>(res, i0, m, N, beta, ea, bad_a, exb, bad_b, C, ldc, scores);
  else
    reconstruct_rows<Sums::kFolded>(res, i0, m, N, beta, ea, bad_a, exb, bad_b, C, ldc, scores);
}

// The int8 paths that run several GEMMs block by block on a B packed once (kernels.h): AMX-INT8
// (int8_amx.cpp) and this build's SIMD path (int8.cpp).
struct TiledPath {
  int64_t (*packed_bytes)(int64_t N, int64_t K, int nmat);
  void (*pack_b)(const int8_t* B, int64_t ldb, int64_t b_next, int64_t N, int64_t K, int nmat, int64_t j0,
                 int64_t j1, uint8_t* out);
  // causal: as rp_amx_gemm's (the SIMD path computes every block and k)
  void (*gemm)(const int8_t* A, int64_t lda, int64_t a_next, const uint8_t* Bp, int64_t M, int64_t N, int64_t K,
               int nmat, RpTileFinish finish, void* ctx, RpCausalRows causal);
};
constexpr TiledPath kAmxPath{rp_amx_packed_bytes, rp_amx_pack_b,
                             [](const int8_t* A, int64_t lda, int64_t a_next, const uint8_t* Bp, int64_t M, int64_t N,
                                int64_t K, int nmat, RpTileFinish finish, void* ctx, RpCausalRows causal) {
                               rp_amx_gemm(A, lda, a_next, Bp, M, N, K, nmat, nullptr, finish, ctx, causal);
                             }};
constexpr TiledPath kSimdPath{rp_int8_packed_bytes, rp_int8_pack_b,
                              [](const int8_t* A, int64_t lda, int64_t a_next, const uint8_t* Bp, int64_t M, int64_t N,
                                 int64_t K, int nmat, RpTileFinish finish, void* ctx, RpCausalRows) {
                                rp_int8_gemm_packed(A, lda, a_next, Bp, M, N, K, nmat, finish, ctx);
                              }};

// rp_exact_product on a tiled path (AMX: K <= kChunk; SIMD: kFusedSimdMinK <= K <= kFusedSimdK).
// B's eight planes are split (planes_rows rows at a time) and packed once; then per panel of rows
// of C, A's planes (on AMX in its tile order, K rounded up to 64 and zero-padded, so that the GEMM
// loads A's tiles where the split wrote them; the SIMD path's gemm copies A: rows of K) and
// either (K <= kFusedK) the eight residue GEMMs of each block of C one after the other (the
// path's gemm with nmat = 8: AMX 32 x 32 blocks, SIMD its micro-tiles), the block
// reconstructed from the eight sums while they are in L1, or (AMX) per chunk of cw columns eight
// GEMMs into the chunk's residue sums ([kMod][mp][cw] int32, 4 MB) and its reconstruction, so
// that the sums are read back from L2 and L3 rather than memory (4096^3: 0.94-0.96x the time of
// one pass over the panel's N columns; 2048^3 the same within the noise; AMX, 2026-12-04). Where
// B packed takes at most half of kKeepBytes the planes are split ~4 MB at a time (A's ~8 MB
// unfused: panels twice as tall, each B chunk reused by twice the rows), so that all buffers stay
// under kKeepBytes (a 2048^3 product's: 32 MB + 16 MB) and repeated products reuse them without
// page faults; above it (released anyway) they are twice that, so that B's planes stream from
// memory half as often (AMX, 2026-12-04: 4096^3 with 512-row panels 0.91-0.92x the time of
// 256-row ones, 1024-row ones 1.05-1.07x; 2048^3 512 rows 0.97-1.0x).
void exact_product_tiled(bool amx, RpExactOperand A, RpExactOperand Bt, float* C, int64_t M, int64_t N, int64_t K,
                         int beta, const int32_t* ea, const uint8_t* bad_a, const int32_t* eb, const uint8_t* bad_b,
                         RpCausal causal) {
  const TiledPath& path = amx ? kAmxPath : kSimdPath;
  const int64_t Kp = amx ? (K + 63) / 64 * 64 : K;   // the planes' rows: AMX tile rows start on cache lines
  const bool fused = K <= kFusedK;
  const Sums sums = sums_for(K);   // fused: kScaled or kSmall
  const bool scale_a = sums == Sums::kScaled && M <= N, scale_b = sums == Sums::kScaled && M > N;
  const int64_t scale = path.packed_bytes(N, K, kMod) <= int64_t(kKeepBytes / 2) ? 1 : 2;
  const int64_t planes_rows = std::max<int64_t>(32, scale * (int64_t(4) << 20) / (kMod * Kp) / 32 * 32);
  const int64_t mp = std::min(M, fused ? planes_rows : 2 * planes_rows), nb = std::min(N, planes_rows);
  const int64_t cw = std::min(N, std::max<int64_t>(32, (int64_t(4) << 20) / (4 * kMod * mp) / 32 * 32));
  Buffers& buf = buffers();
  // A's planes: AMX's tile order (rows rounded up to 32: the GEMM loads its tiles in place), or
  // rows of Kp
  const int64_t mpad = amx ? (mp + 31) / 32 * 32 : mp, lda = amx ? 0 : Kp;
  int8_t* pa = rp_aligned64(buf.pa, kMod * mpad * Kp);   // rows start on cache lines
  int8_t* pb = rp_aligned64(buf.pb, kMod * nb * Kp);   // the planes of nb rows of B
  uint8_t* bp = rp_aligned64(buf.bpacked, path.packed_bytes(N, K, kMod));
  int32_t* res = fused ? nullptr : rp_aligned64(buf.res, kMod * mp * cw);
  for (int64_t j0 = 0; j0 < N; j0 += nb) {
    const int64_t n = std::min(nb, N - j0);
    rp::parallel_for(n, 4, [&](int64_t b, int64_t e) {
      split_rows(rows_from(Bt, j0), 0, K, eb + j0, beta, pb, n, Kp, b, e, scale_b, false);
    });
    path.pack_b(pb, Kp, n * Kp, N, K, kMod, j0, j0 + n, bp);
  }
  std::vector<int32_t> exb(N);
  for (int64_t j = 0; j < N; ++j) exb[j] = eb[j] - 126 - beta;
  for (int64_t i0 = 0; i0 < M; i0 += mp) {
    const int64_t m = std::min(mp, M - i0), a_next = (amx ? (m + 31) / 32 * 32 : m) * Kp;
    rp::parallel_for(m, 4, [&](int64_t b, int64_t e) {
      split_rows(rows_from(A, i0), 0, K, ea + i0, beta, pa, m, Kp, b, e, scale_a, amx, causal_rows(causal, M, N, K, i0));
    });
    if (!fused) {   // (AMX) eight GEMMs, full 32 x 32 blocks straight into res, the edges through edge
      for (int64_t c0 = 0; c0 < N; c0 += cw) {   // columns [c0, c0 + n): B's pairs of panels from c0 / 32
        const int64_t n = std::min(cw, N - c0);
        for (int t = 0; t < kMod; ++t) {
          int32_t* rt = res + t * m * n;
          const auto edge = [&](int64_t bi, int64_t mr, int64_t j0, int64_t nr, const int32_t* tile, int64_t ldt) {
            for (int64_t i = 0; i < mr; ++i) std::memcpy(rt + (bi + i) * n + j0, tile + i * ldt, 4 * nr);
          };
          rp_amx_gemm(pa + t * a_next, 0, 0, bp + t * rp_amx_packed_bytes(N, K, 1) + c0 * Kp, m, n, K, 1, rt,
                      [](void* ctx, int64_t bi, int64_t mr, int64_t j0, int64_t nr, const int32_t* tile, int64_t ldt,
                         int64_t) { (*static_cast<decltype(edge)*>(ctx))(bi, mr, j0, nr, tile, ldt); },
                      const_cast<void*>(static_cast<const void*>(&edge)));
        }
        reconstruct_panel(sums, res, i0, m, n, beta, ea, bad_a, exb.data() + c0, bad_b + c0, C + c0, N);
      }
      continue;
    }
    // a block's outputs from its eight sums, rows of L = ldt columns (32 or 16: a compile-time
    // constant, so that the exponents and flags of 64 lanes are built in whole vectors), kBlock / L
    // rows at a time: 64 consecutive lanes of the sums
    const auto finish_rows = [&](auto width, int64_t bi, int64_t mr, int64_t j0, int64_t nr, const int32_t* tiles,
                                 int64_t plane) {
      constexpr int64_t L = decltype(width)::value, rows = kBlock / L;
      int32_t colex[L], ex[kBlock];
      uint8_t colbad[L], bad[kBlock];
      uint32_t f[kBlock];
      for (int64_t j = 0; j < L; ++j) {   // past nr (and below, past mr): another output's, not stored
        colex[j] = exb[j0 + std::min(j, nr - 1)];
        colbad[j] = bad_b[j0 + std::min(j, nr - 1)];
      }
      for (int64_t i = 0; i < mr; i += rows) {
        for (int64_t h = 0; h < rows; ++h) {
          const int64_t r = i0 + bi + std::min(i + h, mr - 1);
          const int32_t rowex = ea[r] - 126 - beta;
          const uint8_t rowbad = bad_a[r];
          for (int64_t j = 0; j < L; ++j) {
            ex[h * L + j] = rowex + colex[j];
            bad[h * L + j] = rowbad | colbad[j];
          }
        }
        if (sums == Sums::kScaled)
          reconstruct64<Sums::kScaled>(tiles + i * L, plane, ex, bad, f);
        else
          reconstruct64<Sums::kSmall>(tiles + i * L, plane, ex, bad, f);
        for (int64_t h = 0; h < rows && i + h < mr; ++h) {
          if (nr == L)   // (a whole row: a fixed-size copy)
            std::memcpy(C + (i0 + bi + i + h) * N + j0, f + h * L, 4 * L);
          else
            std::memcpy(C + (i0 + bi + i + h) * N + j0, f + h * L, 4 * nr);
        }
      }
    };
    const auto finish = [&](int64_t bi, int64_t mr, int64_t j0, int64_t nr, const int32_t* tiles, int64_t ldt,
                            int64_t plane) {
      if (ldt == 32)
        finish_rows(std::integral_constant<int64_t, 32>{}, bi, mr, j0, nr, tiles, plane);
      else
        finish_rows(std::integral_constant<int64_t, 16>{}, bi, mr, j0, nr, tiles, plane);
    };
    path.gemm(pa, lda, a_next, bp, m, N, K, kMod,
              [](void* ctx, int64_t bi, int64_t mr, int64_t j0, int64_t nr, const int32_t* t, int64_t ldt,
                 int64_t plane) { (*static_cast<decltype(finish)*>(ctx))(bi, mr, j0, nr, t, ldt, plane); },
              const_cast<void*>(static_cast<const void*>(&finish)), causal_rows(causal, M, N, K, i0));
  }
  if (buf.pa.capacity() + buf.pb.capacity() + buf.bpacked.capacity() + 4 * buf.res.capacity() > kKeepBytes)
    buf = Buffers();
}

}  // namespace

void rp_exact_product(RpExactOperand A, RpExactOperand Bt, float* C, int64_t M, int64_t N, int64_t K, int beta,
                      const int32_t* ea, const uint8_t* bad_a, const int32_t* eb, const uint8_t* bad_b, RpCausal causal) {
  if (M == 0 || N == 0) return;
  // AMX at every K: below 64 the tiles multiply zero padding, but the fused reconstruction saves
  // more (QK^T's 32 products of 128 x 32 x 128: 2.8 ms against 3.3 ms on VNNI, 2026-12-02). The
  // SIMD path fused from kFusedSimdMinK to kFusedSimdK: the residue sums of a panel ([kMod][mp][N]
  // int32, 25 MB at the model's 1024 x 768) no longer go through memory, and one product packs and
  // runs once where eight small ones did (PV); AMD Zen 4, VNNI: 1.18-1.24x on the model's products
  // with K = 128 and N >= 384, 1.19x on PV (tools/matmul_loop.py, 2026-12-03).
  const bool amx = rp_int8_uses_amx();
  if (K <= kChunk && (amx || (K >= kFusedSimdMinK && K <= kFusedSimdK)))
    return exact_product_tiled(amx, A, Bt, C, M, N, K, beta, ea, bad_a, eb, bad_b, causal);
  // C in panels of mp rows, so that the eight residue sums of a panel ([kMod][mp][N] int32) stay
  // near kResBytes whatever M and N (a vocabulary-wide lm_head included).
  const int64_t kc0 = std::min(K, kChunk), nchunks = (K + kChunk - 1) / kChunk;
  const int64_t mp = std::min(M, std::max<int64_t>(8, kResBytes / (4 * kMod * N)));
  const Sums sums = nchunks == 1 ? sums_for(K) : Sums::kFolded;
  const bool scale_a = sums == Sums::kScaled && M <= N, scale_b = sums == Sums::kScaled && M > N;
  Buffers& buf = buffers();
  int8_t* pa = rp_aligned64(buf.pa, kMod * mp * kc0);
  int8_t* pb = rp_aligned64(buf.pb, kMod * N * kc0);
  int32_t* res = rp_aligned64(buf.res, kMod * mp * N);
  int32_t* part = nchunks > 1 ? rp_aligned64(buf.part, mp * N) : nullptr;
  auto split_b = [&](int64_t k0, int64_t kc) {
    rp::parallel_for(N, 4, [&](int64_t b, int64_t e) {
      split_rows(Bt, k0, kc, eb, beta, pb, N, kc, b, e, scale_b, false);
    });
  };
  if (nchunks == 1) split_b(0, K);   // B's planes once for every panel
  std::vector<int32_t> exb(N);
  for (int64_t j = 0; j < N; ++j) exb[j] = eb[j] - 126 - beta;
  for (int64_t i0 = 0; i0 < M; i0 += mp) {
    const int64_t m = std::min(mp, M - i0);
    for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
      const int64_t kc = std::min(kChunk, K - k0);
      if (nchunks > 1) split_b(k0, kc);
      rp::parallel_for(m, 4, [&](int64_t b, int64_t e) {
        split_rows(rows_from(A, i0), k0, kc, ea + i0, beta, pa, m, kc, b, e, scale_a, false,
                   causal_rows(causal, M, N, K, i0));
      });
      for (int t = 0; t < kMod; ++t) {
        int32_t* rt = res + t * m * N;
        if (k0 == 0) {
          rp_int8_matmul(pa + t * m * kc, pb + t * N * kc, rt, m, N, kc);
          continue;
        }
        // a later chunk: its exact sum, then both reduced mod p so the total stays in int32
        rp_int8_matmul(pa + t * m * kc, pb + t * N * kc, part, m, N, kc);
        const int32_t p = (int32_t)kP[t];
        rp::parallel_for(m * N, 4096, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) rt[i] = rt[i] % p + part[i] % p;
        });
      }
    }
    reconstruct_panel(sums, res, i0, m, N, beta, ea, bad_a, exb.data(), bad_b, C, N, causal == RpCausal::kScores);
  }
  if ((buf.pa.capacity() + buf.pb.capacity()) + 4 * (buf.res.capacity() + buf.part.capacity()) > kKeepBytes)
    buf = Buffers();
}

void rp_exact_matmul(RpExactOperand A, RpExactOperand Bt, float* C, int64_t M, int64_t N, int64_t K,
                     RpCausal causal) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    std::memset(C, 0, sizeof(float) * M * N);   // +0.0
    return;
  }
  std::vector<int32_t> ea(M), eb(N);
  std::vector<uint8_t> bad_a(M), bad_b(N);
  if (causal == RpCausal::kMix || causal == RpCausal::kMixT)
    causal_exponents(A, M, K, causal, ea.data(), bad_a.data());
  else
    rp_exact_exponents(A, M, K, ea.data(), bad_a.data());
  rp_exact_exponents(Bt, N, K, eb.data(), bad_b.data());
  rp_exact_product(A, Bt, C, M, N, K, beta_of(K), ea.data(), bad_a.data(), eb.data(), bad_b.data(), causal);
  if (causal == RpCausal::kScores)   // +0.0 above the diagonal, whether a path skipped its block or computed it
    for (int64_t r = 0, t = 0; r < M; ++r, t = t + 1 == N ? 0 : t + 1) {   // t = r % N
      float* row = C + r * N;
      int64_t j = t + 1;
      for (; j + kV <= N; j += kV) std::memset(row + j, 0, sizeof(float) * kV);   // (a vector store)
      for (; j < N; ++j) row[j] = 0.0f;
    }
}

// ------------------------------------------------------------ the band products (§11 "Band products")
// Sliding-window attention's products with matmul = "exact", in O(T*W). Layouts as in window.cpp:
// a [batch, M, D] (row r = (g, t), t = r % T), b [batch, T, D], bands p and s [batch, M, W]
// (column w: key j = t - (W-1) + w, valid when j >= 0); P_full [M, T] is the band written out
// with +0.0 outside the window.
//   rp_exact_band_scores(a, b, s)    s[r,w] = (a @ b^T)[r, j]       K = D
//   rp_exact_band_mix(p, b, o)       o = P_full @ b                 K = T
//   rp_exact_band_mix_t(p, a, o)     o = P_full^T @ a               K = M = G*T
// Each is the §11 product of the full operands, so its scales are the full operands' (a column
// of b over all T keys, a column of a over all M rows) and its beta the full K's; only the dot
// products are cut to the window, which is exact because the left-out terms are integer zeros.
// So W >= T gives the bits of full exact attention, with no exception. The work: blocks of up
// to kRows query rows (keys, for band_mix_t) against the key (query) range their windows reach,
// written as small dense operands with explicit zeros, each one rp_exact_product with the full
// operands' scales; parallel over the blocks (the products inside run on the calling thread).
namespace {

constexpr int64_t kRows = 64;

// The full operands' scales: per row of x [rows, K] (band_scores: rows of a and b) or per
// column of x [K, cols] (band_mix/_t: columns of b and a, over their K), for every batch.
struct Scales {
  std::vector<int32_t> e;
  std::vector<uint8_t> bad;
};
Scales row_scales(const float* x, int64_t rows, int64_t K) {
  Scales s{std::vector<int32_t>(rows), std::vector<uint8_t>(rows)};
  rp_exact_exponents({x, K, 1}, rows, K, s.e.data(), s.bad.data());
  return s;
}
// x [batch, K, cols] -> xt [batch, cols, K] (a copy, no arithmetic) and the scales of its rows.
Scales col_scales(const float* x, int64_t batch, int64_t K, int64_t cols, std::vector<float>& xt) {
  xt.resize(batch * cols * K);
  rp::parallel_for(batch * cols, 16, [&](int64_t b, int64_t e) {
    for (int64_t q = b; q < e; ++q) {
      const int64_t bi = q / cols, c = q % cols;
      for (int64_t k = 0; k < K; ++k) xt[q * K + k] = x[(bi * K + k) * cols + c];
    }
  });
  return row_scales(xt.data(), batch * cols, K);
}

inline int64_t first_key(int64_t t, int64_t W) { return t >= W - 1 ? t - (W - 1) : 0; }

}  // namespace

void rp_exact_band_scores(const float* a, const float* b, float* s, int64_t batch, int64_t M, int64_t T, int64_t D,
                          int64_t W) {
  const int beta = rp_exact_beta(D);
  const Scales sa = row_scales(a, batch * M, D), sb = row_scales(b, batch * T, D);
  const int64_t G = M / T, nblk = (T + kRows - 1) / kRows;
  rp::parallel_for(batch * G * nblk, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> c;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t bi = w / (G * nblk), g = w / nblk % G, t0 = w % nblk * kRows;
      const int64_t nq = std::min(kRows, T - t0), j0 = first_key(t0, W), nk = t0 + nq - j0;
      const int64_t r0 = bi * M + g * T + t0, k0 = bi * T + j0;
      c.resize(nq * nk);
      rp_exact_product({a + r0 * D, D, 1}, {b + k0 * D, D, 1}, c.data(), nq, nk, D, beta, sa.e.data() + r0, sa.bad.data() + r0,
                       sb.e.data() + k0, sb.bad.data() + k0);
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t t = t0 + i;
        float* sr = s + (r0 + i) * W;
        for (int64_t col = 0; col < W; ++col) {
          const int64_t j = t - (W - 1) + col;
          sr[col] = j >= 0 ? c[i * nk + (j - j0)] : 0.0f;   // invalid columns +0.0 (window.cpp)
        }
      }
    }
  });
}

void rp_exact_band_mix(const float* p, const float* b, float* o, int64_t batch, int64_t M, int64_t T, int64_t D,
                       int64_t W) {
  const int beta = rp_exact_beta(T);
  std::vector<float> bt;                              // [batch, D, T]: b's columns as rows
  const Scales sb = col_scales(b, batch, T, D, bt);
  const int64_t G = M / T, nblk = (T + kRows - 1) / kRows;
  rp::parallel_for(batch * G * nblk, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> pa, bs;
    std::vector<int32_t> ea;
    std::vector<uint8_t> bad;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t bi = w / (G * nblk), g = w / nblk % G, t0 = w % nblk * kRows;
      const int64_t nq = std::min(kRows, T - t0), j0 = first_key(t0, W), nk = t0 + nq - j0;
      const int64_t r0 = bi * M + g * T + t0;
      pa.assign(nq * nk, 0.0f);                       // P_full's rows r0.., keys j0..: the band, zeros
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t t = t0 + i;
        for (int64_t j = first_key(t, W); j <= t; ++j) pa[i * nk + (j - j0)] = p[(r0 + i) * W + (j - t + W - 1)];
      }
      bs.resize(D * nk);                              // b's columns over those keys
      for (int64_t d = 0; d < D; ++d)
        std::copy_n(bt.data() + (bi * D + d) * T + j0, nk, bs.data() + d * nk);
      ea.resize(nq);
      bad.resize(nq);
      rp_exact_exponents({pa.data(), nk, 1}, nq, nk, ea.data(), bad.data());   // a row's entries all lie here
      rp_exact_product({pa.data(), nk, 1}, {bs.data(), nk, 1}, o + r0 * D, nq, D, nk, beta, ea.data(), bad.data(),
                       sb.e.data() + bi * D, sb.bad.data() + bi * D);
    }
  });
}

void rp_exact_band_mix_t(const float* p, const float* a, float* o, int64_t batch, int64_t M, int64_t T, int64_t D,
                         int64_t W) {
  const int beta = rp_exact_beta(M);
  std::vector<float> at;                              // [batch, D, M]: a's columns as rows
  const Scales sa = col_scales(a, batch, M, D, at);
  const int64_t G = M / T, nblk = (T + kRows - 1) / kRows;
  rp::parallel_for(batch * nblk, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> pa, as;
    std::vector<int32_t> ea;
    std::vector<uint8_t> bad;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t bi = w / nblk, j0 = w % nblk * kRows, nk = std::min(kRows, T - j0);
      const int64_t t1 = std::min(T - 1, j0 + nk - 1 + W - 1), nt = t1 - j0 + 1, K = G * nt;
      pa.assign(nk * K, 0.0f);                        // P_full^T's rows j0..: column (g, t) at g*nt + t-j0
      for (int64_t i = 0; i < nk; ++i) {
        const int64_t j = j0 + i;
        for (int64_t g = 0; g < G; ++g)
          for (int64_t t = j; t <= std::min(T - 1, j + W - 1); ++t)
            pa[i * K + g * nt + (t - j0)] = p[(bi * M + g * T + t) * W + (j - t + W - 1)];
      }
      as.resize(D * K);                               // a's columns over those rows, the same order
      for (int64_t d = 0; d < D; ++d)
        for (int64_t g = 0; g < G; ++g)
          std::copy_n(at.data() + (bi * D + d) * M + g * T + j0, nt, as.data() + d * K + g * nt);
      ea.resize(nk);
      bad.resize(nk);
      rp_exact_exponents({pa.data(), K, 1}, nk, K, ea.data(), bad.data());
      rp_exact_product({pa.data(), K, 1}, {as.data(), K, 1}, o + (bi * T + j0) * D, nk, D, K, beta, ea.data(), bad.data(),
                       sa.e.data() + bi * D, sa.bad.data() + bi * D);
    }
  });
}
