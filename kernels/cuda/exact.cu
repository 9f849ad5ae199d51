// exact.cu -- the exact matmul on CUDA, contract §11 (kernels/README.md; Ozaki scheme II); the
// CPU twin is kernels/cpu/exact.cpp and this gives its bits (integer arithmetic only):
//
//   rpc_exact_matmul(A, Bt, C, M, N, K, work, gemm, ctx, st)   C[i,j] = fl32(sum_k A[i,k] * Bt[j,k]) per §11
//   rpc_exact_workspace_bytes(M, N, K)                         the bytes `work` must hold (device memory)
//
// A [M, K] and Bt [N, K] float32 (K-contiguous rows), C [M, N] float32, all contiguous. Steps:
//   exponents    one warp per row: max biased exponent of the finite nonzero values and whether
//                a NaN/inf marks the row (integer max / or: any order gives the same value);
//   split        elementwise over [rows, kc]: the beta-bit integer q (half away from zero) and its
//                eight symmetric residues, one int8 plane [rows, kc] per modulus;
//   GEMMs        per modulus, an exact int8 GEMM (the caller's, else int8.cu's mma.sync rpc_int8_gemm),
//                in chunks of at most kChunk k whose residue sums are reduced mod p and added (combine);
//   reconstruct  elementwise over the outputs: Garner's digits (uint32), C' in uint64, one
//                rounding by the int64 -> float32 conversion (cvt.rn.f32.s64), the exponent moved
//                in the bits, the §3 flush, NaN for a bad row or column.
// C is made in panels of at most `mp` rows, so the eight residue sums ([kMod][mp][N] int32) stay
// near kResBytes whatever M and N. Every element function below is __host__ __device__: with
// RPC_EMULATE (tests/cuda_exact_emulate.cpp, compiled as host C++) the launches are host loops over
// the same functions and rpc_int8_gemm is the emulator's plain int32 GEMM.
#include "canonical.cuh"
#include "kernels_cuda.h"

namespace rpc {
namespace {
constexpr int kWarp = 32;   // lanes per row (canonical.cuh's kLanes, which host C++ does not see)
constexpr int kMod = 8, THREADS = 256, WARPS = THREADS / kWarp;
constexpr uint64_t kProduct = 12292429416557426565ull;  // 255 * 253 * 251 * 247 * 241 * 239 * 233 * 229
constexpr uint64_t kHalf = (kProduct - 1) / 2;          // C' in [-kHalf, kHalf]
constexpr int64_t kChunk = 131072;                      // k per residue GEMM: 131072 * 127^2 < 2^31
constexpr int64_t kResBytes = int64_t(2) << 30;         // one panel's residue sums

// The moduli as a function of a constant t (loops over t are unrolled, so each % is by a constant).
RPC_HD constexpr uint32_t modulus(int t) {
  return t == 0 ? 255u : t == 1 ? 253u : t == 2 ? 251u : t == 3 ? 247u : t == 4 ? 241u : t == 5 ? 239u
       : t == 6 ? 233u : 229u;
}
constexpr uint32_t inverse(uint32_t a, uint32_t p) {  // a^-1 mod p by search (compile time)
  uint32_t x = 1;
  while ((a % p) * x % p != 1) ++x;
  return x;
}
// Garner's digits in one reduction each, as exact.cpp: v_t = (sum_{s<=t} x_s coef[t][s]) mod p_t
// with x_t = u_t and x_s = v_s (s < t); every sum is below 8 * 255^2 < 2^19. Passed to the kernel
// by value (parameter space), the same table the CPU derives.
struct Garner {
  uint32_t coef[kMod][kMod];
};
constexpr Garner make_garner() {
  Garner g{};
  for (int t = 0; t < kMod; ++t) {
    uint32_t Ps[kMod] = {}, P = 1;  // P_s mod p_t
    for (int s = 0; s < t; ++s) {
      Ps[s] = P;
      P = P * modulus(s) % modulus(t);
    }
    const uint32_t Q = inverse(P, modulus(t));
    g.coef[t][t] = Q;
    for (int s = 0; s < t; ++s) g.coef[t][s] = (modulus(t) - Ps[s]) % modulus(t) * Q % modulus(t);
  }
  return g;
}
constexpr Garner kGarner = make_garner();

// beta = (62 - ceil(log2 K)) / 2 for K >= 1 (§11 step 2).
inline int beta_of(int64_t K) {
  int c = 0;
  while ((int64_t(1) << c) < K) ++c;
  return (62 - c) / 2;
}

// One lane's part of a row's exponent: over k = lane, lane + 32, ... the max biased exponent of
// the finite values (subnormals and zeros give 0) and whether one is NaN/inf.
RPC_HD void lane_exponent(const float* x, int64_t K, int lane, uint32_t* emax, uint32_t* nonfinite) {
  uint32_t e = 0, nf = 0;
  for (int64_t k = lane; k < K; k += kWarp) {
    const uint32_t E = (bits(x[k]) >> 23) & 0xFFu;
    nf |= E == 255u;
    e = (E != 255u && E > e) ? E : e;
  }
  *emax = e;
  *nonfinite = nf;
}

// §11 step 4: |q| of the float with bits u in a row with exponent e (0 for a zero, subnormal or
// non-finite value); |q| <= 2^beta <= 2^31.
RPC_HD uint32_t magnitude(uint32_t u, int32_t e, int beta) {
  const int32_t E = (int32_t)((u >> 23) & 0xFFu);
  if (E == 0 || E == 255) return 0u;
  const uint32_t m = (u & 0x7FFFFFu) | 0x800000u;
  const int32_t sh = e - E + 24 - beta;  // >= 24 - beta >= -7 for a live value
  if (sh <= 0) return m << (uint32_t)(-sh);
  if (sh > 24) return 0u;
  return (m + (1u << (sh - 1))) >> sh;
}

// The symmetric residue of +-q mod p, in [-(p-1)/2, (p-1)/2] (§11 step 5).
template <uint32_t P>
RPC_HD int8_t residue(uint32_t q, uint32_t neg) {
  const int32_t r0 = (int32_t)(q % P), r1 = r0 > (int32_t)(P / 2) ? r0 - (int32_t)P : r0;
  return (int8_t)(neg ? -r1 : r1);
}

// Entry i of [rows, kc] (values k0 .. k0 + kc - 1 of x [rows, K]) into planes [kMod][rows][kc].
RPC_HD void split_at(int64_t i, const float* x, int64_t K, int64_t k0, int64_t kc, int64_t rows, const int32_t* e,
                     int beta, int8_t* planes) {
  const int64_t r = i / kc, k = i % kc, n = rows * kc;
  const uint32_t u = bits(x[r * K + k0 + k]), q = magnitude(u, e[r], beta), neg = u >> 31;
  planes[0 * n + i] = residue<modulus(0)>(q, neg);
  planes[1 * n + i] = residue<modulus(1)>(q, neg);
  planes[2 * n + i] = residue<modulus(2)>(q, neg);
  planes[3 * n + i] = residue<modulus(3)>(q, neg);
  planes[4 * n + i] = residue<modulus(4)>(q, neg);
  planes[5 * n + i] = residue<modulus(5)>(q, neg);
  planes[6 * n + i] = residue<modulus(6)>(q, neg);
  planes[7 * n + i] = residue<modulus(7)>(q, neg);
}

// A later k chunk's residue sums `part` [n] added to plane t's `res` [n], both reduced mod p_t
// first so the total stays in int32 (|total| < 2 p_t).
RPC_HD void combine_at(int64_t i, int32_t* res, const int32_t* part, int32_t p) { res[i] = res[i] % p + part[i] % p; }

// §11 step 7: the integer c times 2^ex rounded to float32 once, as its bit pattern. The int64 ->
// float32 conversion rounds to nearest even (cvt.rn.f32.s64 on the device; the host's default
// mode under RPC_EMULATE): exactly step 7's 24-bit rounding, carry included; then the exponent
// field moves by ex (c != 0 gives a normal float >= 1).
RPC_HD uint32_t to_float_bits(int64_t c, int32_t ex) {
#if defined(__CUDA_ARCH__)
  const uint32_t b = bits(__ll2float_rn((long long)c));
#else
  const uint32_t b = bits((float)c);
#endif
  const uint32_t sign = b & 0x80000000u;
  const int32_t E = (int32_t)((b >> 23) & 0xFFu) - 127 + ex;
  if (c == 0) return 0u;            // C' = 0: +0.0
  if (E > 127) return sign | 0x7F800000u;
  if (E < -126) return sign;        // the §3 flush: tininess after rounding, the sign kept
  return sign | ((uint32_t)(E + 127) << 23) | (b & 0x7FFFFFu);
}

// Output i of a panel [m, N] from its eight residue sums res[t * m * N + i]: Garner, C', rounding.
// ea, bad_a: the panel's rows; eb, bad_b: the columns; both exponents already minus 126 + beta.
RPC_HD void reconstruct_at(int64_t i, const int32_t* res, int64_t m, int64_t N, const int32_t* ea, const int32_t* eb,
                           const uint8_t* bad_a, const uint8_t* bad_b, Garner g, float* C) {
  const int64_t r = i / N, j = i % N, n = m * N;
  uint32_t v[kMod];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int t = 0; t < kMod; ++t) {
    const int32_t p = (int32_t)modulus(t), rt = res[t * n + i] % p;
    uint32_t acc = (uint32_t)(rt < 0 ? rt + p : rt) * g.coef[t][t];
    for (int s = 0; s < t; ++s) acc += v[s] * g.coef[t][s];
    v[t] = acc % (uint32_t)p;
  }
  uint64_t X = v[kMod - 1];
  for (int t = kMod - 2; t >= 0; --t) X = X * modulus(t) + v[t];   // < kProduct < 2^64
  const int64_t c = X > kHalf ? (int64_t)(X - kProduct) : (int64_t)X;  // wraps to C' < 0
  const uint32_t f = to_float_bits(c, ea[r] + eb[j]);
  C[i] = fl((bad_a[r] || bad_b[j]) ? 0x7FC00000u : f);
}

#if !defined(RPC_EMULATE)
// One warp per row of x [rows, K]: e[r] - 126 - beta and bad[r].
__global__ void exponent_kernel(const float* __restrict__ x, int64_t rows, int64_t K, int beta,
                                int32_t* __restrict__ e, int32_t* __restrict__ ex, uint8_t* __restrict__ bad) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / kWarp;
  if (r >= rows) return;  // the whole warp leaves together
  uint32_t emax, nf;
  lane_exponent(x + r * K, K, lane, &emax, &nf);
  emax = __reduce_max_sync(kFull, emax);
  nf = __reduce_or_sync(kFull, nf);
  if (lane == 0) {
    e[r] = (int32_t)emax;
    ex[r] = (int32_t)emax - 126 - beta;
    bad[r] = (uint8_t)nf;
  }
}
__global__ void split_kernel(int64_t n, const float* __restrict__ x, int64_t K, int64_t k0, int64_t kc, int64_t rows,
                             const int32_t* __restrict__ e, int beta, int8_t* __restrict__ planes) {
  for (int64_t i = gtid(); i < n; i += gstride()) split_at(i, x, K, k0, kc, rows, e, beta, planes);
}
__global__ void combine_kernel(int64_t n, int32_t* __restrict__ res, const int32_t* __restrict__ part, int32_t p) {
  for (int64_t i = gtid(); i < n; i += gstride()) combine_at(i, res, part, p);
}
__global__ void reconstruct_kernel(int64_t n, const int32_t* __restrict__ res, int64_t m, int64_t N,
                                   const int32_t* __restrict__ ea, const int32_t* __restrict__ eb,
                                   const uint8_t* __restrict__ bad_a, const uint8_t* __restrict__ bad_b, Garner g,
                                   float* __restrict__ C) {
  for (int64_t i = gtid(); i < n; i += gstride()) reconstruct_at(i, res, m, N, ea, eb, bad_a, bad_b, g, C);
}
#endif

// The workspace's layout for (M, N, K) with k chunks of at most `chunk` (offsets in bytes, each
// a multiple of 256 so every plane and array stays aligned for the GEMM's 16-byte loads).
struct Plan {
  int64_t kc0, nchunks, mp, pa, pb, res, part, e, total;
};
inline int64_t up256(int64_t b) { return (b + 255) / 256 * 256; }
inline Plan plan_of(int64_t M, int64_t N, int64_t K, int64_t chunk, int64_t res_bytes) {
  Plan p{};
  p.kc0 = K < chunk ? K : chunk;
  p.nchunks = (K + chunk - 1) / chunk;
  const int64_t want = res_bytes / (4 * kMod * (N > 0 ? N : 1)), cap = want > 1 ? want : 1;
  p.mp = M < cap ? M : cap;
  p.pa = 0;
  p.pb = p.pa + up256(kMod * p.mp * p.kc0);
  p.res = p.pb + up256(kMod * N * p.kc0);
  p.part = p.res + up256(4 * kMod * p.mp * N);
  p.e = p.part + (p.nchunks > 1 ? up256(4 * p.mp * N) : 0);
  p.total = p.e + up256(4 * 2 * (M + N)) + up256(M + N);   // e and ex of A then B; bad of A then B
  return p;
}

inline cudaError_t launched() {
#if defined(RPC_EMULATE)
  return cudaSuccess;
#else
  return cudaGetLastError();
#endif
}

// rpc_exact_matmul with k chunks of at most `chunk` and panels of residue sums near `res_bytes`
// (the emulator also runs small ones: any split of k gives the same R_t mod p_t, §11 step 5, and
// rows are independent).
cudaError_t exact_matmul(const float* A, const float* Bt, float* C, int64_t M, int64_t N, int64_t K, void* work,
                         int64_t chunk, int64_t res_bytes, RpcInt8Gemm gemm, void* ctx, cudaStream_t st) {
  (void)st;
  if (M == 0 || N == 0) return cudaSuccess;
  if (K == 0) {
#if defined(RPC_EMULATE)
    for (int64_t i = 0; i < M * N; ++i) C[i] = 0.0f;
    return cudaSuccess;
#else
    return cudaMemsetAsync(C, 0, sizeof(float) * M * N, st);   // +0.0
#endif
  }
  const int beta = beta_of(K);
  const Plan p = plan_of(M, N, K, chunk, res_bytes);
  char* w = static_cast<char*>(work);
  int8_t *pa = reinterpret_cast<int8_t*>(w + p.pa), *pb = reinterpret_cast<int8_t*>(w + p.pb);
  int32_t *res = reinterpret_cast<int32_t*>(w + p.res), *part = reinterpret_cast<int32_t*>(w + p.part);
  int32_t *ea = reinterpret_cast<int32_t*>(w + p.e), *eb = ea + M, *xa = eb + N, *xb = xa + M;
  uint8_t *bad_a = reinterpret_cast<uint8_t*>(w + p.e + up256(4 * 2 * (M + N))), *bad_b = bad_a + M;
  cudaError_t err;
#if defined(RPC_EMULATE)
  auto exponents = [&](const float* x, int64_t rows, int32_t* e, int32_t* ex, uint8_t* bad) {
    for (int64_t r = 0; r < rows; ++r) {   // the warp's 32 lanes, then its max / or
      uint32_t emax = 0, nf = 0;
      for (int lane = 0; lane < kWarp; ++lane) {
        uint32_t le, ln;
        lane_exponent(x + r * K, K, lane, &le, &ln);
        emax = le > emax ? le : emax;
        nf |= ln;
      }
      e[r] = (int32_t)emax;
      ex[r] = (int32_t)emax - 126 - beta;
      bad[r] = (uint8_t)nf;
    }
  };
  auto split = [&](const float* x, int64_t k0, int64_t kc, int64_t rows, const int32_t* e, int8_t* planes) {
    for (int64_t i = 0; i < rows * kc; ++i) split_at(i, x, K, k0, kc, rows, e, beta, planes);
  };
  auto combine = [&](int64_t n, int32_t* r, int32_t q) { for (int64_t i = 0; i < n; ++i) combine_at(i, r, part, q); };
  auto reconstruct = [&](int64_t m, int64_t i0) {
    for (int64_t i = 0; i < m * N; ++i) reconstruct_at(i, res, m, N, xa + i0, xb, bad_a + i0, bad_b, kGarner, C + i0 * N);
  };
#else
  auto exponents = [&](const float* x, int64_t rows, int32_t* e, int32_t* ex, uint8_t* bad) {
    exponent_kernel<<<row_blocks(rows, WARPS), THREADS, 0, st>>>(x, rows, K, beta, e, ex, bad);
  };
  auto split = [&](const float* x, int64_t k0, int64_t kc, int64_t rows, const int32_t* e, int8_t* planes) {
    split_kernel<<<blocks_for(rows * kc, THREADS), THREADS, 0, st>>>(rows * kc, x, K, k0, kc, rows, e, beta, planes);
  };
  auto combine = [&](int64_t n, int32_t* r, int32_t q) {
    combine_kernel<<<blocks_for(n, THREADS), THREADS, 0, st>>>(n, r, part, q);
  };
  auto reconstruct = [&](int64_t m, int64_t i0) {
    reconstruct_kernel<<<blocks_for(m * N, THREADS), THREADS, 0, st>>>(m * N, res, m, N, xa + i0, xb, bad_a + i0,
                                                                       bad_b, kGarner, C + i0 * N);
  };
#endif
  exponents(A, M, ea, xa, bad_a);
  exponents(Bt, N, eb, xb, bad_b);
  if ((err = launched()) != cudaSuccess) return err;
  if (p.nchunks == 1) split(Bt, 0, K, N, eb, pb);   // B's planes once for every panel
  for (int64_t i0 = 0; i0 < M; i0 += p.mp) {
    const int64_t m = M - i0 < p.mp ? M - i0 : p.mp;
    for (int64_t k0 = 0; k0 < K; k0 += chunk) {
      const int64_t kc = K - k0 < chunk ? K - k0 : chunk;
      if (p.nchunks > 1) split(Bt, k0, kc, N, eb, pb);
      split(A + i0 * K, k0, kc, m, ea + i0, pa);
      if ((err = launched()) != cudaSuccess) return err;
      for (int t = 0; t < kMod; ++t) {
        int32_t* rt = res + t * m * N;
        int32_t* out = k0 == 0 ? rt : part;
        err = gemm ? gemm(pa + t * m * kc, pb + t * N * kc, out, m, N, kc, ctx, st)
                   : rpc_int8_gemm(pa + t * m * kc, pb + t * N * kc, m, N, kc, nullptr, nullptr, out, nullptr, st);
        if (err != cudaSuccess) return err;
        if (k0 > 0) combine(m * N, rt, (int32_t)modulus(t));
      }
    }
    reconstruct(m, i0);
    if ((err = launched()) != cudaSuccess) return err;
  }
  return cudaSuccess;
}
}  // namespace
}  // namespace rpc

int64_t rpc_exact_workspace_bytes(int64_t M, int64_t N, int64_t K) {
  return rpc::plan_of(M, N, K, rpc::kChunk, rpc::kResBytes).total;
}

cudaError_t rpc_exact_matmul(const float* A, const float* Bt, float* C, int64_t M, int64_t N, int64_t K, void* work,
                             RpcInt8Gemm gemm, void* ctx, cudaStream_t st) {
  return rpc::exact_matmul(A, Bt, C, M, N, K, work, rpc::kChunk, rpc::kResBytes, gemm, ctx, st);
}

#if defined(RPC_EMULATE)
int64_t rpc_emu_exact_workspace_bytes(int64_t M, int64_t N, int64_t K, int64_t chunk, int64_t res_bytes) {
  return rpc::plan_of(M, N, K, chunk, res_bytes).total;
}
cudaError_t rpc_emu_exact_matmul(const float* A, const float* Bt, float* C, int64_t M, int64_t N, int64_t K,
                                 void* work, int64_t chunk, int64_t res_bytes, RpcInt8Gemm gemm, void* ctx) {
  return rpc::exact_matmul(A, Bt, C, M, N, K, work, chunk, res_bytes, gemm, ctx, nullptr);
}
#endif
