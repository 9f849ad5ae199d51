// exact.cpp -- the exact matmul, contract §11 (kernels/README.md; Ozaki scheme II): no float
// arithmetic at all, so its bits do not depend on any order, tiling or instruction set.
//
//   rp_exact_matmul(A, Bt, C, M, N, K)    C[i,j] = fl32(sum_k A[i,k] * Bt[j,k]) per §11
//
// A [M, K] and Bt [N, K] (B transposed: each output column's operand is a K-contiguous row) are
// float32, C [M, N] float32, all contiguous. The steps, each over independent rows or outputs:
//   split      per row: the max biased exponent e of its finite nonzero values (a NaN/inf marks
//              the row), then each value's beta-bit integer q (rounded half away from zero) and
//              its eight residues, one int8 plane [rows, K] per modulus (vectorized by GCC:
//              uint32 shifts and selects, % by constants);
//   GEMMs      per modulus, the exact int8 GEMM of int8.cpp (rp_int8_matmul: VNNI / vpmaddwd /
//              smlal), in chunks of at most kChunk k (its K limit) whose residues add up;
//   reconstruct per output: the residues mod p, Garner's mixed-radix digits (uint32), the
//              integer C' in uint64, rounded to float32 once by integer operations (§11 step 7).
#include "kernels.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

namespace {

constexpr int kMod = 8;
constexpr uint32_t kP[kMod] = {255, 253, 251, 247, 241, 239, 233, 229};  // odd, pairwise coprime
constexpr uint64_t kProduct = 12292429416557426565ull;                   // prod(kP) < 2^64
constexpr uint64_t kHalf = (kProduct - 1) / 2;                           // C' in [-kHalf, kHalf]
constexpr int64_t kChunk = 131072;  // k per residue GEMM: 131072 * 127^2 < 2^31 (contract §10)

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

inline uint32_t fbits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// The row exponent (max biased exponent of the finite nonzero values, 0 if none; subnormals read
// as zero) and whether the row holds a NaN or infinity.
inline void row_exponent(const float* x, int64_t K, int32_t* e, uint8_t* bad) {
  uint32_t emax = 0, nonfinite = 0;
  for (int64_t k = 0; k < K; ++k) {
    const uint32_t E = (fbits(x[k]) >> 23) & 0xFF;
    nonfinite |= E == 255;
    emax = std::max(emax, E == 255 ? 0u : E);
  }
  *e = (int32_t)emax;
  *bad = (uint8_t)nonfinite;
}

// Values [k0, k0 + kc) of a row with exponent e: q = m 2^(E - e + beta - 24) rounded half away
// from zero (|q| <= 2^beta <= 2^31, held as a uint32 magnitude and a sign), then its residues
// into planes[t][k - k0] (the symmetric representative in [-(p-1)/2, (p-1)/2]). In blocks of
// kSplit values: the integers first, then one plane at a time (each loop vectorizes).
constexpr int64_t kSplit = 256;
inline void split_row(const float* x, int64_t k0, int64_t kc, int32_t e, int beta, int8_t* const* planes) {
  uint32_t q[kSplit], neg[kSplit];
  for (int64_t b = 0; b < kc; b += kSplit) {
    const int64_t n = std::min(kSplit, kc - b);
    for (int64_t k = 0; k < n; ++k) {
      const uint32_t u = fbits(x[k0 + b + k]);
      const int32_t E = (int32_t)((u >> 23) & 0xFF);
      const uint32_t m = (E == 0 || E == 255) ? 0u : ((u & 0x7FFFFFu) | 0x800000u);
      const int32_t sh = e - E + 24 - beta;               // >= 24 - beta >= -7 for a live value
      const uint32_t left = m << (uint32_t)std::clamp(-sh, 0, 7);
      const int32_t s = std::clamp(sh, 1, 31);
      const uint32_t right = sh > 24 ? 0u : (m + (1u << (s - 1))) >> s;
      q[k] = sh <= 0 ? left : right;
      neg[k] = u >> 31;
    }
    each_mod([&](auto t) {
      constexpr int32_t p = (int32_t)kP[t];
      int8_t* out = planes[t] + b;
      for (int64_t k = 0; k < n; ++k) {
        const int32_t r0 = (int32_t)(q[k] % (uint32_t)p);
        const int32_t r1 = r0 > p / 2 ? r0 - p : r0;
        out[k] = (int8_t)(neg[k] ? -r1 : r1);
      }
    });
  }
}

// §11 step 7: the integer c times 2^ex rounded to float32 once, as its bit pattern. Branch-free
// (selects only), so the loop over a block of outputs vectorizes.
inline uint32_t to_float_bits(int64_t c, int32_t ex) {
  // (float)c is the int64 -> float32 conversion, correctly rounded to nearest even (IEEE; the
  // rounding mode every kernel chunk sets, §3): exactly the 24-bit rounding of step 7, carry
  // included, and exact for |c| < 2^24. Its exponent is then moved by ex in the bits.
  const float fc = (float)c;
  uint32_t b;
  std::memcpy(&b, &fc, 4);
  const uint32_t sign = b & 0x80000000u;
  const int32_t E = (int32_t)((b >> 23) & 0xFF) - 127 + ex;     // c != 0: a normal float >= 1
  uint32_t f = sign | ((uint32_t)(E + 127) << 23) | (b & 0x7FFFFFu);
  f = E > 127 ? (sign | 0x7F800000u) : f;
  f = E < -126 ? sign : f;       // the §3 flush: tininess after rounding, the sign kept
  return c == 0 ? 0u : f;        // C' = 0: +0.0
}

// Outputs [j0, j0 + nj) of one row (nj <= kBlock) from their eight residue sums res[t * stride + j]
// (any integers congruent to C' mod p_t): Garner's digits for the whole block modulus by modulus
// (uint32 lanes), then C' in uint64 and its rounding. exb[j] = the column's part of the exponent.
constexpr int64_t kBlock = 64;
inline void reconstruct(const int32_t* res, int64_t stride, int64_t nj, int32_t exa, const int32_t* exb,
                        const uint8_t* bad_b, bool bad_a, float* out) {
  uint32_t v[kMod][kBlock];
  each_mod([&](auto t) {
    constexpr uint32_t p = kP[t];
    uint32_t* vt = v[t];
    const int32_t* rt = res + t * stride;
    for (int64_t j = 0; j < nj; ++j) {
      const int32_t r = rt[j] % (int32_t)p;
      uint32_t acc = (uint32_t)(r < 0 ? r + (int32_t)p : r) * kGarner.coef[t][t];
      each_mod([&](auto s) {
        if constexpr (s < t) acc += v[s][j] * kGarner.coef[t][s];
      });
      vt[j] = acc % p;
    }
  });
  uint32_t f[kBlock];
  for (int64_t j = 0; j < nj; ++j) {
    uint64_t X = v[kMod - 1][j];
    each_mod([&](auto t) {
      if constexpr (t < kMod - 1) X = X * kP[kMod - 2 - t] + v[kMod - 2 - t][j];   // < kProduct
    });
    const int64_t c = X > kHalf ? (int64_t)(X - kProduct) : (int64_t)X;             // wraps to C' < 0
    const uint32_t b = to_float_bits(c, exa + exb[j]);
    f[j] = (bad_a || bad_b[j]) ? 0x7FC00000u : b;
  }
  std::memcpy(out, f, sizeof(uint32_t) * nj);
}

// Rows [r0, r1) of x [rows, K], values [k0, k0 + kc): planes [kMod][rows][kc].
void split_rows(const float* x, int64_t K, int64_t k0, int64_t kc, const int32_t* e, int beta, int8_t* planes,
                int64_t rows, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    int8_t* p[kMod];
    for (int t = 0; t < kMod; ++t) p[t] = planes + (t * rows + r) * kc;
    split_row(x + r * K, k0, kc, e[r], beta, p);
  }
}

// The planes and residue sums, kept between calls by the calling thread (no allocation and no page
// faults per call at the model's shapes); above kKeepBytes they are released after the call.
constexpr size_t kKeepBytes = size_t(64) << 20;
constexpr int64_t kResBytes = int64_t(32) << 20;   // one panel's residue sums
struct Buffers {
  std::vector<int8_t> pa, pb;
  std::vector<int32_t> res, part;
};
Buffers& buffers() {
  static thread_local Buffers b;
  return b;
}

}  // namespace

void rp_exact_matmul(const float* A, const float* Bt, float* C, int64_t M, int64_t N, int64_t K) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    std::memset(C, 0, sizeof(float) * M * N);   // +0.0
    return;
  }
  const int beta = beta_of(K);
  std::vector<int32_t> ea(M), eb(N);
  std::vector<uint8_t> bad_a(M), bad_b(N);
  rp::parallel_for(M, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) row_exponent(A + i * K, K, &ea[i], &bad_a[i]);
  });
  rp::parallel_for(N, 16, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) row_exponent(Bt + j * K, K, &eb[j], &bad_b[j]);
  });
  // C in panels of mp rows, so that the eight residue sums of a panel ([kMod][mp][N] int32) stay
  // near kResBytes whatever M and N (a vocabulary-wide lm_head included).
  const int64_t kc0 = std::min(K, kChunk), nchunks = (K + kChunk - 1) / kChunk;
  const int64_t mp = std::min(M, std::max<int64_t>(8, kResBytes / (4 * kMod * N)));
  Buffers& buf = buffers();
  std::vector<int8_t>&pa = buf.pa, &pb = buf.pb;
  std::vector<int32_t>&res = buf.res, &part = buf.part;
  pa.resize(kMod * mp * kc0);
  pb.resize(kMod * N * kc0);
  res.resize(kMod * mp * N);
  part.resize(nchunks > 1 ? mp * N : 0);
  auto split_b = [&](int64_t k0, int64_t kc) {
    rp::parallel_for(N, 4, [&](int64_t b, int64_t e) { split_rows(Bt, K, k0, kc, eb.data(), beta, pb.data(), N, b, e); });
  };
  if (nchunks == 1) split_b(0, K);   // B's planes once for every panel
  std::vector<int32_t> exb(N);
  for (int64_t j = 0; j < N; ++j) exb[j] = eb[j] - 126 - beta;
  const int64_t nblocks = (N + kBlock - 1) / kBlock;
  for (int64_t i0 = 0; i0 < M; i0 += mp) {
    const int64_t m = std::min(mp, M - i0);
    for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
      const int64_t kc = std::min(kChunk, K - k0);
      if (nchunks > 1) split_b(k0, kc);
      rp::parallel_for(m, 4, [&](int64_t b, int64_t e) {
        split_rows(A + i0 * K, K, k0, kc, ea.data() + i0, beta, pa.data(), m, b, e);
      });
      for (int t = 0; t < kMod; ++t) {
        int32_t* rt = res.data() + t * m * N;
        if (k0 == 0) {
          rp_int8_matmul(pa.data() + t * m * kc, pb.data() + t * N * kc, rt, m, N, kc);
          continue;
        }
        // a later chunk: its exact sum, then both reduced mod p so the total stays in int32
        rp_int8_matmul(pa.data() + t * m * kc, pb.data() + t * N * kc, part.data(), m, N, kc);
        const int32_t p = (int32_t)kP[t];
        rp::parallel_for(m * N, 4096, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) rt[i] = rt[i] % p + part[i] % p;
        });
      }
    }
    rp::parallel_for(m * nblocks, 16, [&](int64_t b, int64_t e) {
      for (int64_t w = b; w < e; ++w) {
        const int64_t i = w / nblocks, j0 = (w % nblocks) * kBlock, nj = std::min(kBlock, N - j0);
        reconstruct(res.data() + i * N + j0, m * N, nj, ea[i0 + i] - 126 - beta, exb.data() + j0,
                    bad_b.data() + j0, bad_a[i0 + i] != 0, C + (i0 + i) * N + j0);
      }
    });
  }
  if ((pa.capacity() + pb.capacity()) + 4 * (res.capacity() + part.capacity()) > kKeepBytes) buf = Buffers();
}
