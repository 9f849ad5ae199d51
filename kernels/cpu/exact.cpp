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
struct Inverses {
  uint32_t v[kMod][kMod] = {};
  constexpr Inverses() {
    for (int s = 0; s < kMod; ++s)
      for (int t = s + 1; t < kMod; ++t) v[s][t] = inverse(kP[s], kP[t]);
  }
};
constexpr Inverses kInv;

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
// into planes[t][k - k0] (the symmetric representative in [-(p-1)/2, (p-1)/2]).
inline void split_row(const float* x, int64_t k0, int64_t kc, int32_t e, int beta, int8_t* const* planes) {
  for (int64_t k = 0; k < kc; ++k) {
    const uint32_t u = fbits(x[k0 + k]);
    const int32_t E = (int32_t)((u >> 23) & 0xFF);
    const uint32_t m = (E == 0 || E == 255) ? 0u : ((u & 0x7FFFFFu) | 0x800000u);
    const int32_t sh = e - E + 24 - beta;                 // >= 24 - beta >= -7 for a live value
    const uint32_t left = m << (uint32_t)std::clamp(-sh, 0, 7);
    const int32_t s = std::clamp(sh, 1, 31);
    const uint32_t right = sh > 24 ? 0u : (m + (1u << (s - 1))) >> s;
    const uint32_t q = sh <= 0 ? left : right;
    const bool neg = (u >> 31) != 0;
#pragma GCC unroll 8
    for (int t = 0; t < kMod; ++t) {
      const int32_t r0 = (int32_t)(q % kP[t]);
      const int32_t r1 = r0 > (int32_t)(kP[t] / 2) ? r0 - (int32_t)kP[t] : r0;
      planes[t][k] = (int8_t)(neg ? -r1 : r1);
    }
  }
}

// §11 step 7: the integer c times 2^ex rounded to float32 once, as its bit pattern.
inline uint32_t to_float_bits(int64_t c, int32_t ex) {
  if (c == 0) return 0;
  const uint32_t sign = c < 0 ? 0x80000000u : 0u;
  const uint64_t u = c < 0 ? (uint64_t)0 - (uint64_t)c : (uint64_t)c;   // |c| <= 2^62
  const int n = 64 - __builtin_clzll(u);                                 // bit length
  uint64_t q;
  if (n > 24) {
    const int sh = n - 24;
    q = u >> sh;
    const uint64_t rem = u & ((uint64_t(1) << sh) - 1), half = uint64_t(1) << (sh - 1);
    q += (rem > half) || (rem == half && (q & 1));
  } else {
    q = u << (24 - n);
  }
  int32_t E = n - 1 + ex;
  if (q == (uint64_t(1) << 24)) {   // the rounding carried into a new bit
    q >>= 1;
    ++E;
  }
  if (E > 127) return sign | 0x7F800000u;
  if (E < -126) return sign;        // the §3 flush: tininess after rounding, the sign kept
  return sign | ((uint32_t)(E + 127) << 23) | ((uint32_t)q & 0x7FFFFFu);
}

// One output from its eight residue sums (any integers congruent to C' mod p_t).
inline uint32_t reconstruct(const int32_t* res, int64_t stride, int32_t ex) {
  uint32_t v[kMod];
#pragma GCC unroll 8
  for (int t = 0; t < kMod; ++t) {
    const int32_t r = res[t * stride] % (int32_t)kP[t];
    uint32_t w = (uint32_t)(r < 0 ? r + (int32_t)kP[t] : r);
#pragma GCC unroll 8
    for (int s = 0; s < t; ++s) w = ((w + 2 * kP[t] - v[s]) * kInv.v[s][t]) % kP[t];  // v[s] < 256 < 2 p_t
    v[t] = w;
  }
  uint64_t X = v[kMod - 1];
#pragma GCC unroll 8
  for (int t = kMod - 2; t >= 0; --t) X = X * kP[t] + v[t];                        // < kProduct
  const int64_t c = X > kHalf ? (int64_t)(X - kProduct) : (int64_t)X;               // wraps to C' < 0
  return to_float_bits(c, ex);
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
  const int64_t kc0 = std::min(K, kChunk);
  std::vector<int8_t> pa(kMod * M * kc0), pb(kMod * N * kc0);
  std::vector<int32_t> res(kMod * M * N), part(K > kChunk ? M * N : 0);
  for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
    const int64_t kc = std::min(kChunk, K - k0);
    rp::parallel_for(M, 4, [&](int64_t b, int64_t e) { split_rows(A, K, k0, kc, ea.data(), beta, pa.data(), M, b, e); });
    rp::parallel_for(N, 4, [&](int64_t b, int64_t e) { split_rows(Bt, K, k0, kc, eb.data(), beta, pb.data(), N, b, e); });
    for (int t = 0; t < kMod; ++t) {
      int32_t* rt = res.data() + t * M * N;
      if (k0 == 0) {
        rp_int8_matmul(pa.data() + t * M * kc, pb.data() + t * N * kc, rt, M, N, kc);
        continue;
      }
      // a later chunk: its exact sum, then both reduced mod p so the total stays in int32
      rp_int8_matmul(pa.data() + t * M * kc, pb.data() + t * N * kc, part.data(), M, N, kc);
      const int32_t p = (int32_t)kP[t];
      rp::parallel_for(M * N, 4096, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) rt[i] = rt[i] % p + part[i] % p;
      });
    }
  }
  rp::parallel_for(M, 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float* out = C + i * N;
      const int32_t exa = ea[i] - 126 - beta;
      for (int64_t j = 0; j < N; ++j) {
        const bool nan = bad_a[i] || bad_b[j];
        const uint32_t f = reconstruct(res.data() + i * N + j, M * N, exa + (eb[j] - 126 - beta));
        const uint32_t u = nan ? 0x7FC00000u : f;
        std::memcpy(out + j, &u, 4);
      }
    }
  });
}
