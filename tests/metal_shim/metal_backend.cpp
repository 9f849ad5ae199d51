// metal_backend.cpp -- the CPU kernels' entry points (kernels/cpu/kernels.h) implemented by
// running the Metal kernels of kernels/metal/ through metal_shim.h, so that
// kernels/cpu/selftest.cpp, linked against this file instead of the CPU kernels, prints the
// digests of the Metal kernels on the self-test's inputs (tests/test_metal_emulated.py compares
// them with the CPU's golden digests):
//
//   g++ -std=c++20 -O1 -ffp-contract=off -fsigned-char -pthread -Wno-attributes -Wno-psabi \
//       -I kernels/cpu -I kernels/common -I kernels/metal \
//       kernels/cpu/selftest.cpp tests/metal_shim/metal_backend.cpp -o metal_selftest
//   ./metal_selftest            # METAL_SHIM_HW_FLUSH=1: the kernels' threads run with FTZ|DAZ
//
// Each function launches the kernels as repops_mps.py does (same kernels, same argument order,
// same host scalars), but with small, odd grids (a few groups), so the grid-stride loops and the
// threadgroup loops over rows take several turns: the bits must not depend on the grid.
#include <cstdlib>
#include <vector>

#include "kernels.h"  // before the shim: its headers must not see the Metal keyword macros
#include "metal_shim.h"

namespace msl {
#include "attention.metal"
#include "elementwise.metal"
#include "embedding.metal"
#include "int8.metal"
#include "loss.metal"
#include "matmul.metal"
#include "mlp.metal"
#include "norm.metal"
#include "optim.metal"
#include "random.metal"
#include "rope.metal"
}  // namespace msl

namespace {
using metal_shim::Pos;
// The position arguments every kernel ends with.
#define AT p.tid, p.nthreads, p.lid, p.gid, p.ngroups

struct Init { Init() { metal_shim::hw_flush = std::getenv("METAL_SHIM_HW_FLUSH") != nullptr; } } init;

// Elementwise grids: 3 groups of 64 threads (grid-stride loops cover any n). Row grids: 5 groups
// of 32 (one row per group per turn). Matmul: 7 groups of 256.
void flat(const std::function<void(const Pos&)>& body) { metal_shim::launch(3 * 64, 64, body); }
void rows(const std::function<void(const Pos&)>& body) { metal_shim::launch(5 * 32, 32, body); }
void one_group(const std::function<void(const Pos&)>& body) { metal_shim::launch(32, 32, body); }
float inv(int64_t n) { return (float)(1.0 / (double)n); }  // contract §1: shape scalars
float* mut(const float* p) { return const_cast<float*>(p); }
}  // namespace

// The CPU kernels choose among versions (kernels.h); the Metal kernels have one of each, the
// default (the self-test selects only when given an option).
int rp_matmul_select(int width) { return width == 0 ? 1 : -1; }
int rp_int8_select(int path) { return path == 0 ? 1 : -1; }

void rp_matmul(const float* A, int64_t sab, int64_t sam, int64_t sak, const float* B, int64_t sbb, int64_t sbk,
               int64_t sbn, float* C, int64_t batch, int64_t M, int64_t N, int64_t K) {
  metal_shim::launch(7 * 256, 256,
                     [&](const Pos& p) { msl::rp_matmul(A, B, C, sab, sam, sak, sbb, sbk, sbn, batch, M, N, K, AT); });
}

void rp_rmsnorm(const float* x, const float* w, float eps, float* y, float* rstd, int64_t R, int64_t D) {
  rows([&](const Pos& p) { msl::rp_rmsnorm(x, w, y, rstd, eps, inv(D), R, D, AT); });
}
void rp_rmsnorm_backward(const float* gy, const float* x, const float* w, const float* rstd, float* gx, float* gw,
                         int64_t R, int64_t D) {
  rows([&](const Pos& p) { msl::rp_rmsnorm_backward(gy, x, w, rstd, gx, inv(D), R, D, AT); });
  rows([&](const Pos& p) { msl::rp_rmsnorm_gw(gy, x, rstd, gw, R, D, AT); });
}

void rp_rope_tables(int64_t T, int64_t Dh, float theta, float* cos_t, float* sin_t) {
  flat([&](const Pos& p) { msl::rp_rope_tables(cos_t, sin_t, T, Dh / 2, theta, inv(Dh), AT); });
}
void rp_rope(const float* x, RpRows xs, const float* cos_t, const float* sin_t, float* y, RpRows ys, int64_t B,
             int64_t T, int64_t H, int64_t Dh, bool backward) {
  flat([&](const Pos& p) {
    msl::rp_rope(x, cos_t, sin_t, y, B * T * H, T, H, Dh / 2, backward ? 1 : 0, xs.b, xs.t, xs.h, ys.b, ys.t, ys.h, AT);
  });
}

void rp_causal_softmax(const float* s, float scale, float* p_, int64_t BH, int64_t T) {
  rows([&](const Pos& p) { msl::rp_causal_softmax(s, p_, scale, BH * T, T, AT); });
}
void rp_causal_softmax_backward(const float* gp, const float* p_, float scale, float* gs, int64_t BH, int64_t T) {
  rows([&](const Pos& p) { msl::rp_causal_softmax_backward(gp, p_, gs, scale, BH * T, T, AT); });
}

void rp_swiglu(const float* u, float* out, int64_t R, int64_t H) {
  flat([&](const Pos& p) { msl::rp_swiglu(u, out, R, H, AT); });
}
void rp_swiglu_backward(const float* g, const float* u, float* gu, int64_t R, int64_t H) {
  flat([&](const Pos& p) { msl::rp_swiglu_backward(g, u, gu, R, H, AT); });
}

void rp_cross_entropy(const float* z, const int64_t* targets, float zloss, float* loss, float* lse, int64_t R,
                      int64_t V) {
  std::vector<float> row_loss(R);
  rows([&](const Pos& p) { msl::rp_cross_entropy_rows(z, targets, lse, row_loss.data(), zloss, R, V, AT); });
  one_group([&](const Pos& p) { msl::rp_cross_entropy_mean(row_loss.data(), loss, inv(R), R, AT); });
}
void rp_cross_entropy_backward(float g, const float* z, const int64_t* targets, const float* lse, float zloss,
                               float* gz, int64_t R, int64_t V) {
  const float two_z = (float)(2.0 * (double)zloss);  // host scalar 2*zloss, as the bindings
  flat([&](const Pos& p) { msl::rp_cross_entropy_backward(&g, z, targets, lse, gz, inv(R), two_z, R, V, AT); });
}

void rp_embedding(const float* w, const int64_t* idx, float* out, int64_t N, int64_t D) {
  flat([&](const Pos& p) { msl::rp_embedding(w, idx, out, N, D, AT); });
}
void rp_embedding_backward(const float* g, const int64_t* idx, float* gw, int64_t N, int64_t V, int64_t D) {
  flat([&](const Pos& p) { msl::rp_embedding_backward(g, idx, gw, N, V, D, AT); });
}

void rp_unary(RpFn fn, const float* x, float* y, int64_t n) {
  flat([&](const Pos& p) { msl::rp_unary(x, y, n, (long)fn, AT); });
}
void rp_add(const float* a, const float* b, float* y, int64_t n) {
  flat([&](const Pos& p) { msl::rp_add(a, b, y, n, AT); });
}
void rp_mul(const float* a, const float* b, float* y, int64_t n) {
  flat([&](const Pos& p) { msl::rp_mul(a, b, y, n, AT); });
}
void rp_scale(const float* a, float s, float* y, int64_t n) {
  flat([&](const Pos& p) { msl::rp_scale(a, y, s, n, AT); });
}
void rp_csum_rows(const float* x, float* y, int64_t nrows, int64_t n) {
  rows([&](const Pos& p) { msl::rp_csum_rows(x, y, nrows, n, AT); });
}
void rp_dropout(const float* x, float* y, int64_t n, uint32_t threshold, float scale, uint64_t seed, uint32_t c1,
                uint32_t c2) {
  flat([&](const Pos& p) {
    msl::rp_dropout(x, y, n, threshold, scale, (long)(uint32_t)seed, (long)(seed >> 32), c1, c2, AT);
  });
}
void rp_canary(float* out) {
  one_group([&](const Pos& p) { msl::rp_canary(out, 1.0f + 0x1p-12f, -(1.0f + 0x1p-11f), 0x1p-100f, 0x1p-30f, AT); });
}

void rp_adamw(float* p_, const float* g, float* m, float* v, int64_t n, float lr, float b1, float b2, float omb1,
              float omb2, float eps, float decay, float bc1, float bc2) {
  flat([&](const Pos& p) { msl::rp_adamw(p_, g, m, v, lr, b1, b2, omb1, omb2, eps, decay, bc1, bc2, n, AT); });
}
void rp_clip_grad(const float* g, float max_norm, float* out, float* norm, int64_t n) {
  float coef = 0.0f;
  const int64_t chunks = (n + msl::kFlatChunk - 1) / msl::kFlatChunk;
  std::vector<float> sums(chunks);  // §4.5's chunk sums
  rows([&](const Pos& p) { msl::rp_grad_norm_chunks(g, sums.data(), n, AT); });
  one_group([&](const Pos& p) { msl::rp_grad_norm(sums.data(), norm, &coef, max_norm, chunks, AT); });
  flat([&](const Pos& p) { msl::rp_apply_coef(g, &coef, out, n, AT); });
}

void rp_philox(uint64_t seed, uint32_t c1, uint32_t c2, uint32_t purpose, uint32_t block_offset, uint32_t* words,
               int64_t n) {
  std::vector<long> w(n);
  flat([&](const Pos& p) {
    msl::rp_philox(w.data(), (long)(uint32_t)seed, (long)(seed >> 32), c1, c2, purpose, block_offset, n, AT);
  });
  for (int64_t i = 0; i < n; ++i) words[i] = (uint32_t)w[i];
}
void rp_uniform(uint64_t seed, uint32_t c1, uint32_t c2, uint32_t purpose, float* out, int64_t n) {
  flat([&](const Pos& p) { msl::rp_uniform(out, (long)(uint32_t)seed, (long)(seed >> 32), c1, c2, purpose, n, AT); });
}
void rp_normal(uint64_t seed, uint32_t c1, uint32_t c2, uint32_t purpose, float* out, int64_t n) {
  flat([&](const Pos& p) { msl::rp_normal(out, (long)(uint32_t)seed, (long)(seed >> 32), c1, c2, purpose, n, AT); });
}

void rp_quantize(const float* x, const float* s, int8_t* q, int64_t R, int64_t C) {
  flat([&](const Pos& p) { msl::rp_int8_quantize(x, s, reinterpret_cast<char*>(q), R * C, C, AT); });
}
void rp_dequantize(const int8_t* q, const float* s, float* y, int64_t R, int64_t C) {
  flat([&](const Pos& p) { msl::rp_int8_dequantize(reinterpret_cast<const char*>(q), s, y, R * C, C, AT); });
}
void rp_int8_matmul(const int8_t* A, const int8_t* B, int32_t* C, int64_t M, int64_t N, int64_t K) {
  flat([&](const Pos& p) {
    msl::rp_int8_gemm(reinterpret_cast<const char*>(A), reinterpret_cast<const char*>(B), C, M, N, K, AT);
  });
}
void rp_int8_linear(const int8_t* A, const int8_t* B, float sx, const float* sw, float* Y, int64_t M, int64_t N,
                    int64_t K) {
  flat([&](const Pos& p) {
    msl::rp_int8_linear(reinterpret_cast<const char*>(A), reinterpret_cast<const char*>(B), &sx, sw, Y, M, N, K, AT);
  });
}
void rp_lsq_init(const float* x, float* s, int64_t R, int64_t C, float inv_c) {
  rows([&](const Pos& p) { msl::rp_lsq_init(x, s, inv_c, R, C, AT); });
}
void rp_lsq_backward(const float* x, const float* s, const float* gxh, float g, float* gx, float* gs, int64_t R,
                     int64_t C) {
  flat([&](const Pos& p) { msl::rp_lsq_gx(x, s, gxh, gx, R * C, C, AT); });
  rows([&](const Pos& p) { msl::rp_lsq_gs(x, s, gxh, gs, g, R, C, AT); });
}
