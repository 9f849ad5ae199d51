// selftest.cpp -- standalone self-test of the CPU kernels (contract §9 in kernels/README.md): no torch, no files read.
//
// Runs every CPU kernel of kernels.h on inputs generated from integer counters only and prints
// one line per kernel call, `name sha256hex`, where the digest is SHA-256 over the output
// buffers' little-endian bytes, concatenated in the order the kernel returns them. Two builds
// that follow the contract (kernels/README.md) print identical lines whatever the compiler,
// optimisation level or SIMD width; tests/test_selftest.py builds this file several ways,
// compares the lines, and recomputes every digest through the torch extension (torch.ops.repops)
// from a second, NumPy implementation of the same input generator.
//
// Build and run by hand (from the repository root; every kernels/cpu/*.cpp except binding.cpp):
//
//   g++ -O2 -std=c++17 -ffp-contract=off -pthread -I kernels/cpu $(ls kernels/cpu/*.cpp | grep -v binding.cpp) -o selftest
//   ./selftest
//
// The same digests from the other paths of contract §3 (tests/test_selftest.py runs them all):
//
//   g++ ... -DRP_SOFT_FLUSH ...                           FTZ/DAZ off, the flush in software
//   aarch64-linux-gnu-g++ -static ...; qemu-aarch64 ./selftest         FPCR.FZ + product fix-up
//   riscv64-linux-gnu-g++ ...; qemu-riscv64 -L /usr/riscv64-linux-gnu ./selftest   no hardware flush
//
// The contract's flags are required: -ffp-contract=off, never -ffast-math (contract §2). FTZ/DAZ
// is set per chunk inside rp::parallel_for (§3); the few float operations this file does outside
// the kernels (input generation) run inside an rp::FpModeGuard and are exact anyway. The kernels
// themselves are called from the main thread WITHOUT a guard, so a kernel that does scalar work
// outside parallel_for without its own guard is caught (its results would differ from torch's).
//
// ---------------------------------------------------------------- the input generator
// Every input element is a pure function of (seed, stream, i): seed is the 32-bit base seed
// (read through a volatile so the compiler cannot fold the computation at build time), stream a
// small integer naming the tensor, i the element index (flat, row-major). All arithmetic is
// uint32 with wrap-around:
//
//   mix(x)     = lowbias32: x ^= x>>16; x *= 0x7FEB352D; x ^= x>>15; x *= 0x846CA68B; x ^= x>>16
//   h1         = mix(i * 0x9E3779B9 + mix(stream ^ seed))
//   h2         = mix(h1 + 0x632BE5AB)
//
//   gen(stream, i, emin, erange, period, table):           (a float; every step is exact)
//     if period != 0 and (h2 >> 20) % period == 0:  return table[h2 & 15]     (adversarial)
//     mant = float((int32)(h1 >> 8) - 0x800000)             in [-2^23, 2^23), exact
//     e    = emin + (h2 >> 4) % erange
//     return mant * 2^(e - 23)                              |x| < 2^e, exact, never subnormal
//   bitsgen(stream, i, period, table): same special rule, otherwise the float with bits h1.
//   index(stream, i, mod) = h1 % mod                        (token ids, targets)
//
// Tables: FINITE(big) = {+0, -0, 2^-149, -2^-149, 0x1.fffffcp-127, -0x1.fffffcp-127, 2^-126,
// -2^-126, big, -big, 1, -1, 0x1.000002p+0, 2^-60, -2^-60, 0.5} (signed zeros, subnormals that
// DAZ reads as zero, the smallest normal, large values); SPECIAL (for the canonical functions) =
// {+0, -0, +inf, -inf, NaN, 2^-149, -0x1.fffffcp-127, 2^-126, FLT_MAX, -FLT_MAX, exp's two
// thresholds 0x1.62e43p+6 and -0x1.5d589ep+6, 0x1.62e432p+6, 65536, 0x1.000002p+16, 1};
// SPECIAL_FN (for tanh, erf and the GELU forms) = {+0, -0, +inf, -inf, NaN, 2^-149,
// -0x1.fffffcp-127, -2^-126, FLT_MAX, -FLT_MAX, tanh's branch points 0.75 and -0x1.7ffffep-1 (the
// float below 0.75) and 10, erf's 0.875 and -0x1.f5c29p+1 (-3.92f), 2^64 (x * x overflows)}.
// Philox seeds: seed64 = (mix(seed ^ 0x01234567) << 32) | mix(seed).
//
// Digests: floats are hashed as their 32-bit patterns, except that every NaN is hashed as
// 0x7FC00000 (contract §7: NaN payloads differ between CPUs and operand orders); uint32 words
// (philox) are hashed raw. The sizes are awkward on purpose (37, 129, ...: partial SIMD tiles,
// lane tails, several matmul cache blocks) and small (the -O0 build runs in well under 2 s).
//
// rp_parallel_for here uses std::thread and ignores the grain: [0, n) is cut into min(n, 5)
// uneven chunks run by 3 threads, so chunk boundaries differ from PyTorch's and must not matter.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels.h"

// ---------------------------------------------------------------- host threads
void rp_parallel_for(int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t), void* ctx) {
  (void)grain;
  if (n <= 0) return;
  const int64_t chunks = n < 5 ? n : 5;
  const int nthreads = 3;
  auto run = [=](int t) {
    for (int64_t c = t; c < chunks; c += nthreads) {
      const int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
      if (b < e) fn(ctx, b, e);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < nthreads; ++t) pool.emplace_back(run, t);
  run(0);
  for (auto& th : pool) th.join();
}

int rp_threads() { return 3; }   // rp_parallel_for's threads above

namespace {

// ---------------------------------------------------------------- SHA-256 (FIPS 180-4)
struct Sha256 {
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t buf[64];
  uint64_t len = 0;  // bytes
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void block(const uint8_t* p) {
    static const uint32_t K[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t w[64];
    for (int t = 0; t < 16; ++t)
      w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 | p[4 * t + 3];
    for (int t = 16; t < 64; ++t) {
      uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; ++t) {
      uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
  }
  void update(const void* data, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) {
      buf[len % 64] = p[i];
      ++len;
      if (len % 64 == 0) block(buf);
    }
  }
  std::string hex() {
    const uint64_t bitlen = len * 8;
    const uint8_t one = 0x80, zero = 0;
    update(&one, 1);
    while (len % 64 != 56) update(&zero, 1);
    uint8_t lb[8];
    for (int i = 0; i < 8; ++i) lb[i] = (uint8_t)(bitlen >> (56 - 8 * i));
    update(lb, 8);
    std::string s;
    char tmp[9];
    for (int i = 0; i < 8; ++i) { std::snprintf(tmp, sizeof tmp, "%08x", h[i]); s += tmp; }
    return s;
  }
};

std::string sha256_str(const char* s) { Sha256 h; h.update(s, std::strlen(s)); return h.hex(); }

void check_sha256() {
  struct { const char* in; const char* out; } kv[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"}};
  for (auto& v : kv)
    if (sha256_str(v.in) != v.out) {
      std::fprintf(stderr, "selftest: SHA-256 known-answer test failed for \"%s\"\n", v.in);
      std::abort();
    }
}

// ---------------------------------------------------------------- digests
struct Digest {
  Sha256 sha;
  Digest& f(const std::vector<float>& x) {  // float32 LE, NaN -> 0x7FC00000
    for (float v : x) {
      uint32_t u = rp::bits(v);
      if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu)) u = 0x7FC00000u;
      u32(u);
    }
    return *this;
  }
  Digest& w(const std::vector<uint32_t>& x) { for (uint32_t u : x) u32(u); return *this; }
  void u32(uint32_t u) {
    const uint8_t b[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
    sha.update(b, 4);
  }
};

void emit(const char* name, Digest& d) { std::printf("%s %s\n", name, d.sha.hex().c_str()); }
void emit1(const char* name, const std::vector<float>& a) { Digest d; d.f(a); emit(name, d); }
void emit2(const char* name, const std::vector<float>& a, const std::vector<float>& b) {
  Digest d; d.f(a).f(b); emit(name, d);
}

// ---------------------------------------------------------------- the input generator
volatile uint32_t g_seed_source = 0x5EED2024u;  // volatile: no build-time constant folding
uint32_t g_seed;

inline uint32_t mix(uint32_t x) {
  x ^= x >> 16; x *= 0x7FEB352Du; x ^= x >> 15; x *= 0x846CA68Bu; x ^= x >> 16;
  return x;
}
struct H { uint32_t h1, h2; };
inline H hashes(uint32_t stream, int64_t i) {
  const uint32_t h1 = mix((uint32_t)i * 0x9E3779B9u + mix(stream ^ g_seed));
  return H{h1, mix(h1 + 0x632BE5ABu)};
}

using Table = std::array<float, 16>;
Table finite(float big) {
  return Table{0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 0x1.fffffcp-127f, -0x1.fffffcp-127f,
               0x1p-126f, -0x1p-126f, big, -big, 1.0f, -1.0f, 0x1.000002p+0f, 0x1p-60f,
               -0x1p-60f, 0.5f};
}
const Table kSpecial = {0.0f, -0.0f, INFINITY, -INFINITY, rp::fl(0x7FC00000u), 0x1p-149f,
                        -0x1.fffffcp-127f, 0x1p-126f, FLT_MAX, -FLT_MAX, 0x1.62e43p+6f,
                        -0x1.5d589ep+6f, 0x1.62e432p+6f, 65536.0f, 0x1.000002p+16f, 1.0f};
const Table kSpecialFn = {0.0f, -0.0f, INFINITY, -INFINITY, rp::fl(0x7FC00000u), 0x1p-149f,
                          -0x1.fffffcp-127f, -0x1p-126f, FLT_MAX, -FLT_MAX, 0.75f, -0x1.7ffffep-1f,
                          10.0f, 0.875f, -0x1.f5c29p+1f, 0x1p64f};
const Table kNone = {};

std::vector<float> gen(uint32_t stream, int64_t n, int emin, int erange, uint32_t period,
                       const Table& table) {
  rp::FpModeGuard guard;  // scalar float work outside the kernels (exact in any mode anyway)
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) {
    const H h = hashes(stream, i);
    if (period && (h.h2 >> 20) % period == 0) { x[i] = table[h.h2 & 15]; continue; }
    const float mant = (float)((int32_t)(h.h1 >> 8) - 0x800000);
    const int e = emin + (int)((h.h2 >> 4) % (uint32_t)erange);
    x[i] = mant * rp::pow2(e - 23);
  }
  return x;
}
std::vector<float> bitsgen(uint32_t stream, int64_t n, uint32_t period, const Table& table) {
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) {
    const H h = hashes(stream, i);
    x[i] = (period && (h.h2 >> 20) % period == 0) ? table[h.h2 & 15] : rp::fl(h.h1);
  }
  return x;
}
std::vector<int64_t> index(uint32_t stream, int64_t n, uint32_t mod) {
  std::vector<int64_t> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = hashes(stream, i).h1 % mod;
  return x;
}

// ---------------------------------------------------------------- the kernels
void run_matmul() {
  // Inputs: gen(stream, n, -2, 4, 16, FINITE(2^20)); stored row-major in the shape given.
  const Table T = finite(0x1p20f);
  auto G = [&](uint32_t s, int64_t n) { return gen(s, n, -2, 4, 16, T); };
  {
    const int64_t M = 37, K = 129, N = 45;
    auto A = G(1, M * K);   // A [M, K]
    auto At = G(3, K * M);  // At [K, M], used as A = At^T
    auto B = G(2, K * N);   // B [K, N]
    auto Bt = G(4, N * K);  // Bt [N, K], used as B = Bt^T
    std::vector<float> C(M * N);
    rp_matmul(A.data(), 0, K, 1, B.data(), 0, N, 1, C.data(), 1, M, N, K);
    emit1("matmul_nn", C);
    rp_matmul(At.data(), 0, 1, M, B.data(), 0, N, 1, C.data(), 1, M, N, K);
    emit1("matmul_tn", C);
    rp_matmul(A.data(), 0, K, 1, Bt.data(), 0, 1, K, C.data(), 1, M, N, K);
    emit1("matmul_nt", C);
    rp_matmul(At.data(), 0, 1, M, Bt.data(), 0, 1, K, C.data(), 1, M, N, K);
    emit1("matmul_tt", C);
  }
  {
    const int64_t Bn = 3, M = 19, K = 70, N = 33;
    auto A = G(5, Bn * M * K);  // [3, 19, 70]
    auto B = G(6, Bn * K * N);  // [3, 70, 33]
    auto B2 = G(7, K * N);      // [70, 33]
    auto A2t = G(8, K * M);     // [70, 19], used as A = A2t^T [19, 70]
    std::vector<float> C(Bn * M * N);
    rp_matmul(A.data(), M * K, K, 1, B.data(), K * N, N, 1, C.data(), Bn, M, N, K);
    emit1("matmul_batched", C);
    rp_matmul(A.data(), M * K, K, 1, B2.data(), 0, N, 1, C.data(), Bn, M, N, K);
    emit1("matmul_bcast_b", C);
    rp_matmul(A2t.data(), 0, 1, M, B.data(), K * N, N, 1, C.data(), Bn, M, N, K);
    emit1("matmul_bcast_a", C);
  }
  {  // several cache blocks along M, N and K (K > KC carries acc across k blocks)
    const int64_t M = 100, K = 300, N = 260;
    auto A = G(9, M * K);    // [100, 300]
    auto Bt = G(10, N * K);  // [260, 300], used as B = Bt^T
    std::vector<float> C(M * N);
    rp_matmul(A.data(), 0, K, 1, Bt.data(), 0, 1, K, C.data(), 1, M, N, K);
    emit1("matmul_big", C);
  }
}

void run_rmsnorm() {
  const int64_t R = 37, D = 129;
  const float eps = 0x1.4f8b58p-17f;  // f32(1e-5)
  auto x = gen(20, R * D, -3, 8, 16, finite(0x1p20f));
  auto w = gen(21, D, -1, 2, 0, kNone);
  auto gy = gen(22, R * D, -3, 8, 16, finite(0x1p10f));
  std::vector<float> y(R * D), rstd(R), gx(R * D), gw(D);
  rp_rmsnorm(x.data(), w.data(), eps, y.data(), rstd.data(), R, D);
  emit2("rmsnorm", y, rstd);
  rp_rmsnorm_backward(gy.data(), x.data(), w.data(), rstd.data(), gx.data(), gw.data(), R, D);
  emit2("rmsnorm_backward", gx, gw);
}

void run_rope() {
  {
    const int64_t T = 3000, Dh = 8;
    std::vector<float> c(T * Dh / 2), s(T * Dh / 2);
    rp_rope_tables(T, Dh, 500000.0f, c.data(), s.data());
    emit2("rope_tables_long", c, s);
  }
  const int64_t B = 2, T = 37, H = 3, Dh = 18;
  std::vector<float> c(T * Dh / 2), s(T * Dh / 2);
  rp_rope_tables(T, Dh, 10000.0f, c.data(), s.data());
  emit2("rope_tables", c, s);
  auto x = gen(30, B * T * H * Dh, -3, 8, 16, finite(0x1p20f));
  auto g = gen(31, B * T * H * Dh, -3, 8, 16, finite(0x1p20f));
  std::vector<float> y(x.size());
  const RpRows tokens{T * H * Dh, H * Dh, Dh}, heads{H * T * Dh, Dh, T * Dh};  // [B, T, H, Dh], [B, H, T, Dh]
  rp_rope(x.data(), tokens, c.data(), s.data(), y.data(), heads, B, T, H, Dh, false);
  emit1("rope", y);  // heads-major, as the torch op returns it
  rp_rope(g.data(), heads, c.data(), s.data(), y.data(), tokens, B, T, H, Dh, true);
  emit1("rope_backward", y);  // g read heads-major, the result token-major
}

void run_softmax() {
  const int64_t BH = 3, T = 37;
  const float scale = 0x1.6a09e6p-3f;  // f32(1/sqrt(32))
  auto S = gen(40, BH * T * T, -4, 10, 16, finite(0x1p12f));
  auto gP = gen(41, BH * T * T, -4, 8, 16, finite(0x1p10f));
  std::vector<float> P(S.size()), gS(S.size());
  rp_causal_softmax(S.data(), scale, P.data(), BH, T);
  emit1("causal_softmax", P);
  rp_causal_softmax_backward(gP.data(), P.data(), scale, gS.data(), BH, T);
  emit1("causal_softmax_backward", gS);
}

void run_swiglu() {
  const int64_t R = 37, H = 45;
  auto u = gen(50, R * 2 * H, -6, 14, 16, finite(0x1p7f));  // |u| up to 2^8: sigmoid saturates
  auto g = gen(51, R * H, -3, 8, 16, finite(0x1p10f));
  std::vector<float> out(R * H), gu(R * 2 * H);
  rp_swiglu(u.data(), out.data(), R, H);
  emit1("swiglu", out);
  rp_swiglu_backward(g.data(), u.data(), gu.data(), R, H);
  emit1("swiglu_backward", gu);
}

void run_cross_entropy() {
  const int64_t R = 37, V = 131;
  const float zloss = 0x1.a36e2ep-14f;  // f32(1e-4)
  const float g = 0.75f;
  auto z = gen(60, R * V, -3, 9, 16, finite(0x1p10f));
  auto t = index(61, R, V);
  std::vector<float> loss(1), lse(R), gz(R * V);
  rp_cross_entropy(z.data(), t.data(), zloss, loss.data(), lse.data(), R, V);
  emit2("cross_entropy", loss, lse);
  rp_cross_entropy_backward(g, z.data(), t.data(), lse.data(), zloss, gz.data(), R, V);
  emit1("cross_entropy_backward", gz);
}

void run_embedding() {
  const int64_t V = 23, D = 129, N = 70;
  auto w = gen(70, V * D, -3, 8, 16, finite(0x1p20f));
  auto idx = index(71, N, 20);  // ids < 20 of 23 rows: rows 20..22 of the gradient stay +0.0
  auto g = gen(72, N * D, -3, 8, 16, finite(0x1p20f));
  std::vector<float> out(N * D), gw(V * D);
  rp_embedding(w.data(), idx.data(), out.data(), N, D);
  emit1("embedding", out);
  rp_embedding_backward(g.data(), idx.data(), gw.data(), N, V, D);
  emit1("embedding_backward", gw);
}

void run_elementwise() {
  const int64_t n = 10007;
  auto a = gen(80, n, -4, 12, 8, finite(0x1p100f));
  auto b = gen(81, n, -4, 12, 8, finite(0x1p100f));
  std::vector<float> y(n);
  rp_add(a.data(), b.data(), y.data(), n);
  emit1("add", y);
  rp_mul(a.data(), b.data(), y.data(), n);
  emit1("mul", y);
  rp_scale(a.data(), -0x1.3p-110f, y.data(), n);  // small results flush to zero
  emit1("scale", y);
  {  // host scalars exactly as binding.cpp computes them (contract §6), p = 0.1
    const double p = 0.1;
    const double th = std::nearbyint((1.0 - p) * 4294967296.0);
    const uint32_t threshold = th >= 4294967295.0 ? 0xFFFFFFFFu : (uint32_t)th;
    const float sc = (float)(1.0 / (1.0 - p));
    const uint64_t seed64 = ((uint64_t)mix(g_seed ^ 0x01234567u) << 32) | mix(g_seed);
    auto x = gen(82, n, -4, 12, 8, finite(0x1p20f));
    rp_dropout(x.data(), y.data(), n, threshold, sc, seed64, 7, 11);
    emit1("dropout", y);
  }
  {
    std::vector<float> x = gen(100, 37 * 129, -3, 8, 16, finite(0x1p20f)), r(37);
    rp_csum_rows(x.data(), r.data(), 37, 129);
    emit1("csum_rows", r);
    std::vector<float> x2 = gen(101, 3 * 1000, -3, 8, 16, finite(0x1p20f)), r2(3);
    rp_csum_rows(x2.data(), r2.data(), 3, 1000);
    emit1("csum_rows_long", r2);
  }
}

void run_optim() {
  const int64_t n = 10007;
  // Host scalars: lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1, step t = 3:
  // f32(lr), f32(b1), f32(b2), f32(1-b1), f32(1-b2), f32(eps), f32(1-lr*wd),
  // f32(1/(1-b1^3)), f32(1/(1-b2^3)) (contract §1, powers by repops.powi).
  const float lr = 0x1.3a92a4p-12f, b1 = 0x1.ccccccp-1f, b2 = 0x1.e66666p-1f;
  const float omb1 = 0x1.99999ap-4f, omb2 = 0x1.99999ap-5f, eps = 0x1.5798eep-27f;
  const float decay = 0x1.fffc12p-1f, bc1 = 0x1.d85322p+1f, bc2 = 0x1.c0baacp+2f;
  auto p = gen(90, n, -3, 8, 16, finite(0x1p20f));
  auto g = gen(91, n, -12, 14, 16, finite(0x1p20f));
  auto m = gen(92, n, -12, 10, 16, finite(0x1p20f));
  auto v = gen(93, n, -24, 20, 16, finite(0x1p20f));
  for (float& x : v) x = rp::fl(rp::bits(x) & 0x7FFFFFFFu);  // v >= 0: sign bit cleared
  rp_adamw(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, omb1, omb2, eps, decay, bc1, bc2);
  Digest d;
  d.f(p).f(m).f(v);
  emit("adamw", d);

  auto gc = gen(94, n, -4, 8, 16, finite(0x1p10f));
  std::vector<float> out(n), norm(1);
  rp_clip_grad(gc.data(), 0.5f, out.data(), norm.data(), n);
  emit2("clip_grad", out, norm);

  // Two whole chunks of the chunked sum (§4.5, L = 32768) and a short last chunk of 77.
  const int64_t nl = 2 * kFlatChunk + 77;
  auto gl = gen(95, nl, -4, 8, 16, finite(0x1p10f));
  std::vector<float> outl(nl);
  rp_clip_grad(gl.data(), 0.5f, outl.data(), norm.data(), nl);
  emit2("clip_grad_chunks", outl, norm);
}

void run_unary() {
  const int64_t n = 20011;
  struct { const char* name; RpFn fn; uint32_t stream; int kind; } fns[] = {
      {"exp", RpFn::Exp, 110, 0},     {"log", RpFn::Log, 111, 1},     {"recip", RpFn::Recip, 112, 1},
      {"rsqrt", RpFn::Rsqrt, 113, 1}, {"sqrt", RpFn::Sqrt, 114, 1},   {"sin", RpFn::Sin, 115, 2},
      {"cos", RpFn::Cos, 116, 2}};
  for (auto& f : fns) {
    // kind 0: gen(s, n, -20, 28, 8, SPECIAL) (|x| < 128); kind 1: bitsgen(s, n, 8, SPECIAL)
    // (every float pattern); kind 2: gen(s, n, -20, 38, 8, SPECIAL) (|x| < 2^18, part outside
    // the sin/cos domain).
    std::vector<float> x = f.kind == 1 ? bitsgen(f.stream, n, 8, kSpecial)
                                       : gen(f.stream, n, -20, f.kind == 0 ? 28 : 38, 8, kSpecial);
    std::vector<float> y(n);
    rp_unary(f.fn, x.data(), y.data(), n);
    emit1(f.name, y);
  }
  // tanh, erf and the derived functions (contract §5.6, §5.8, §5.9): gen(s, n, -20, 27, 8,
  // SPECIAL_FN), |x| < 128: every branch of tanh and erf, and past the GELU forms' saturation.
  const struct { const char* name; RpFn fn; uint32_t stream; } derived[] = {
      {"tanh", RpFn::Tanh, 160},           {"erf", RpFn::Erf, 161},
      {"sigmoid", RpFn::Sigmoid, 162},     {"gelu", RpFn::Gelu, 163},
      {"gelu_tanh", RpFn::GeluTanh, 164},  {"gelu_grad", RpFn::GeluGrad, 165},
      {"gelu_tanh_grad", RpFn::GeluTanhGrad, 166}};
  for (auto& f : derived) {
    const std::vector<float> x = gen(f.stream, n, -20, 27, 8, kSpecialFn);
    std::vector<float> y(n);
    rp_unary(f.fn, x.data(), y.data(), n);
    emit1(f.name, y);
  }
}

void run_random() {
  const uint64_t seed64 = ((uint64_t)mix(g_seed ^ 0x01234567u) << 32) | mix(g_seed);
  {
    std::vector<uint32_t> w(1001);
    rp_philox(seed64, 3, 5, 1, 7, w.data(), 1001);
    Digest d;
    d.w(w);
    emit("philox", d);
  }
  std::vector<float> u(1001), z(1003);
  rp_uniform(seed64, 4, 6, 3, u.data(), 1001);
  emit1("uniform", u);
  rp_normal(seed64, 8, 9, 1, z.data(), 1003);
  emit1("normal", z);
}

void run_int8() {
  // Contract §10. int8 operands: index(s, n, 255) - 127, in [-127, 127], with every 7th element
  // of A set to +-127 (extremes); step sizes: |gen(...)| (positive, normal). int8 and int32
  // outputs are hashed as sign-extended little-endian int32 words.
  const int64_t M = 37, N = 45, K = 1031;  // odd K over three k blocks of the GEMM
  auto ints = [](uint32_t stream, int64_t n) {
    std::vector<int8_t> q(n);
    auto ix = index(stream, n, 255);
    for (int64_t i = 0; i < n; ++i) q[i] = (int8_t)(ix[i] - 127);
    return q;
  };
  auto pos = [](std::vector<float> v) { for (float& x : v) x = std::fabs(x); return v; };
  auto hash_ints = [](const char* name, const auto& v) {
    Digest d;
    for (auto x : v) d.u32((uint32_t)(int32_t)x);
    emit(name, d);
  };
  std::vector<int8_t> A = ints(120, M * K), B = ints(121, N * K);
  for (int64_t i = 0; i < M * K; i += 7) A[i] = (i / 7) % 2 ? -127 : 127;
  std::vector<int32_t> C(M * N);
  rp_int8_matmul(A.data(), B.data(), C.data(), M, N, K);
  hash_ints("int8_matmul", C);
  auto sw = pos(gen(122, N, -8, 4, 0, kNone));
  std::vector<float> Y(M * N);
  rp_int8_linear(A.data(), B.data(), 0x1.2p-7f, sw.data(), Y.data(), M, N, K);
  emit1("int8_linear", Y);

  const int64_t R = 37, D = 129;
  auto x = gen(123, R * D, -8, 12, 16, finite(0x1p20f));  // |x / s| spans the grid and the clip
  auto s = pos(gen(124, R, -6, 4, 0, kNone));
  std::vector<int8_t> q(R * D);
  rp_quantize(x.data(), s.data(), q.data(), R, D);
  hash_ints("int8_quantize", q);
  std::vector<float> y(R * D), s1(R), gx(R * D), gs(R);
  rp_dequantize(q.data(), s.data(), y.data(), R, D);
  emit1("int8_dequantize", y);
  rp_lsq_init(x.data(), s1.data(), R, D, 0x1.fc07fp-8f);  // inv_c = (float)(1.0 / 129)
  emit1("lsq_init", s1);
  auto gxh = gen(125, R * D, -3, 8, 16, finite(0x1p10f));
  rp_lsq_backward(x.data(), s.data(), gxh.data(), 0x1.0002p-7f, gx.data(), gs.data(), R, D);  // f32(1/sqrt(129*127))
  emit2("lsq_backward", gx, gs);
}

// RP_SELFTEST_NO_CPU_ONLY: the Metal emulation (tests/test_metal_emulated.py) links this file
// against the Metal kernels, which have neither the fused attention (the model composes it from
// matmul and causal_softmax there) nor the exact matmul (refused on mps).
#ifndef RP_SELFTEST_NO_CPU_ONLY
void run_attention() {
  // §8 attention head by head: 3 slices (as many as this file's threads: one per task), G = 2,
  // T = 100, D = 9 (partial tiles in every product).
  const int64_t batch = 3, G = 2, T = 100, D = 9, M = G * T;
  const float scale = 0x1.555556p-2f;   // f32(1/sqrt(9))
  auto q = gen(150, batch * M * D, -3, 6, 16, finite(0x1p10f));
  auto k = gen(151, batch * T * D, -3, 6, 16, finite(0x1p10f));
  auto v = gen(152, batch * T * D, -3, 8, 16, finite(0x1p20f));
  auto go = gen(153, batch * M * D, -3, 8, 16, finite(0x1p10f));
  std::vector<float> o(batch * M * D), p(batch * M * T), gq(q.size()), gk(k.size()), gv(v.size());
  rp_causal_attention(q.data(), k.data(), v.data(), scale, o.data(), p.data(), batch, G, T, D);
  emit2("causal_attention", o, p);
  rp_causal_attention_backward(go.data(), q.data(), k.data(), v.data(), p.data(), scale, gq.data(), gk.data(),
                               gv.data(), batch, G, T, D);
  Digest d;
  d.f(gq).f(gk).f(gv);
  emit("causal_attention_backward", d);
}

void run_exact() {
  // Contract §11. C = A @ Bt^T through the integer path: wide exponent ranges, the FINITE table
  // (zeros, subnormals, the smallest normal), the SPECIAL table (NaN and infinities: NaN rows and
  // columns), a K over several int8 GEMM k blocks and a K over two residue chunks (> 131072).
  auto run = [](const char* name, int64_t M, int64_t N, int64_t K, uint32_t s, int emin, int erange,
                uint32_t period, const Table& t) {
    auto A = gen(s, M * K, emin, erange, period, t), Bt = gen(s + 1, N * K, emin, erange, period, t);
    std::vector<float> C(M * N);
    rp_exact_matmul({A.data(), K, 1}, {Bt.data(), K, 1}, C.data(), M, N, K);
    emit1(name, C);
  };
  run("exact_matmul", 37, 45, 129, 130, -20, 40, 16, finite(0x1p20f));
  run("exact_matmul_special", 19, 33, 70, 132, -60, 120, 512, kSpecial);
  run("exact_matmul_k1031", 9, 7, 1031, 134, -2, 4, 16, finite(0x1p20f));
  run("exact_matmul_chunks", 2, 3, 140000, 136, -2, 4, 0, kNone);
  // §11 band products: T = 150 (three row blocks of the kernel), G = 2, W = 70 and 200 (> T).
  const int64_t batch = 2, G = 2, T = 150, D = 5, M = G * T;
  auto a = gen(138, batch * M * D, -20, 40, 16, finite(0x1p20f)), b = gen(139, batch * T * D, -20, 40, 16, finite(0x1p20f));
  for (int64_t W : {int64_t(70), int64_t(200)}) {
    auto p = gen(140 + W, batch * M * W, -30, 30, 16, finite(0x1p20f));
    for (int64_t r = 0; r < batch * M; ++r)   // the columns before key 0 are +0.0 (window_softmax's band)
      for (int64_t w = 0; w < W - 1 - r % T; ++w) p[r * W + w] = 0.0f;
    std::vector<float> s(batch * M * W), o(batch * M * D), ot(batch * T * D);
    rp_exact_band_scores(a.data(), b.data(), s.data(), batch, M, T, D, W);
    rp_exact_band_mix(p.data(), b.data(), o.data(), batch, M, T, D, W);
    rp_exact_band_mix_t(p.data(), a.data(), ot.data(), batch, M, T, D, W);
    emit1(W < T ? "exact_band_scores" : "exact_band_scores_wide", s);
    emit1(W < T ? "exact_band_mix" : "exact_band_mix_wide", o);
    emit1(W < T ? "exact_band_mix_t" : "exact_band_mix_t_wide", ot);
  }
}
#endif

}  // namespace

// Options (tests/test_selftest.py runs each kernel version of this CPU): --matmul=256|512 picks the
// matmul's register tile, --int8=vnni|amx the int8 GEMM's path (vnni: the build's SIMD path);
// unset, this CPU's defaults. An option this build or CPU cannot run: a line on stderr, exit 3.
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    bool ok = false;
    if (arg == "--matmul=256" || arg == "--matmul=512") ok = rp_matmul_select(std::atoi(arg.c_str() + 9)) > 0;
    else if (arg == "--int8=vnni") ok = rp_int8_select(1) > 0;
    else if (arg == "--int8=amx") ok = rp_int8_select(2) > 0;
    else {
      std::fprintf(stderr, "selftest: unknown option %s (--matmul=256|512, --int8=vnni|amx)\n", argv[i]);
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "selftest: %s is not available on this build or CPU\n", argv[i]);
      return 3;
    }
  }
  check_sha256();
  g_seed = g_seed_source;
  run_matmul();
  run_rmsnorm();
  run_rope();
  run_softmax();
  run_swiglu();
  run_cross_entropy();
  run_embedding();
  run_elementwise();
  run_optim();
  run_unary();
  run_random();
  {
    std::vector<float> c(2);
    rp_canary(c.data());
    emit1("canary", c);
    if (c[0] != 0.0f) std::fprintf(stderr, "selftest: canary: this build contracts a*b+c into an FMA\n");
    if (c[1] != 0.0f) std::fprintf(stderr, "selftest: canary: flush-to-zero missing in worker threads\n");
  }
  run_int8();
#ifndef RP_SELFTEST_NO_CPU_ONLY
  run_attention();
  run_exact();
#endif
  return 0;
}
