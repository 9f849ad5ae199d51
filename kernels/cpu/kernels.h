// kernels.h -- the CPU kernels' entry points: raw pointers, contiguous row-major float32
// unless a stride is passed, no torch types. binding.cpp registers them with torch;
// selftest.cpp calls them directly. Each kernel follows kernels/README.md (the contract).
#pragma once
#include <cstdint>
#include <vector>

#include "contract.h"
#include "vmath.h"
#include "ids.h"

// matmul.cpp (contract §4.1, §8 matmul). C [batch, M, N] contiguous; A, B any strides.
void rp_matmul(const float* A, int64_t sab, int64_t sam, int64_t sak,
               const float* B, int64_t sbb, int64_t sbk, int64_t sbn,
               float* C, int64_t batch, int64_t M, int64_t N, int64_t K);
// The same where only C[b, i, j <= i] is needed (attention's scores, read by the causal softmax
// on and below the diagonal): those entries have rp_matmul's bits; the others are unspecified.
void rp_matmul_lower(const float* A, int64_t sab, int64_t sam, int64_t sak,
                     const float* B, int64_t sbb, int64_t sbk, int64_t sbn,
                     float* C, int64_t batch, int64_t M, int64_t N, int64_t K);
// The instruction set this file was built for and the matmul register tile it uses (for bench.py).
const char* rp_cpu_path();
// The matmul's register tile by vector width: 256, 512 (x86 builds with AVX-512 only), or 0 for
// this CPU's default (512 where the build has it, else 256: matmul.cpp).
// Every tile gives the same bits. Returns the
// width now in use, -1 (and no change) if this build has no such tile.
int rp_matmul_select(int width);
// The contract's matmul limit on this core (flop per cycle: 2 per unfused multiply-add pair; 0 if
// not known) and the core clock in Hz measured on the calling thread (0 if not measured): bench.py.
double rp_matmul_flop_per_cycle();
double rp_cpu_clock_hz();
const char* rp_int8_path();  // int8.cpp: which int8 GEMM path this build runs

// norm.cpp (§8 rmsnorm). x, y [R, D]; w [D]; rstd [R].
void rp_rmsnorm(const float* x, const float* w, float eps, float* y, float* rstd, int64_t R, int64_t D);
void rp_rmsnorm_backward(const float* gy, const float* x, const float* w, const float* rstd,
                         float* gx, float* gw, int64_t R, int64_t D);

// rope.cpp (§8 rope). cos, sin [T, Dh/2]; x, y [B, T, H, Dh], their rows where xs, ys say (ids.h).
void rp_rope_tables(int64_t T, int64_t Dh, float theta, float* cos_t, float* sin_t);
void rp_rope(const float* x, RpRows xs, const float* cos_t, const float* sin_t, float* y, RpRows ys,
             int64_t B, int64_t T, int64_t H, int64_t Dh, bool backward);

// attention.cpp (§8 causal_softmax). s, p, gp, gs [BH, T, T].
void rp_causal_softmax(const float* s, float scale, float* p, int64_t BH, int64_t T);
void rp_causal_softmax_backward(const float* gp, const float* p, float scale, float* gs,
                                int64_t BH, int64_t T);
// Full causal attention, head by head (§8 attention): q, o [batch, G*T, D], k, v [batch, T, D],
// p [batch, G*T, T] (batch = B * Hkv; row r = g*T + t); backward: go like o, gq like q, gk, gv like k.
void rp_causal_attention(const float* q, const float* k, const float* v, float scale, float* o, float* p,
                         int64_t batch, int64_t G, int64_t T, int64_t D);
void rp_causal_attention_backward(const float* go, const float* q, const float* k, const float* v, const float* p,
                                  float scale, float* gq, float* gk, float* gv, int64_t batch, int64_t G, int64_t T,
                                  int64_t D);

// window.cpp (§8 window attention). a [batch, M, D] (M = G*T query rows, position t = r % T),
// b [batch, T, D] keys or values, band s/p [batch, M, W] (column w: key j = t - (W-1) + w);
// band_scores -> s; band_mix -> o [batch, M, D]; band_mix_t -> o [batch, T, D]. Softmax rows: t = r % T.
void rp_band_scores(const float* a, const float* b, float* s, int64_t batch, int64_t M, int64_t T, int64_t D,
                    int64_t W);
void rp_band_mix(const float* p, const float* b, float* o, int64_t batch, int64_t M, int64_t T, int64_t D,
                 int64_t W);
void rp_band_mix_t(const float* p, const float* a, float* o, int64_t batch, int64_t M, int64_t T, int64_t D,
                   int64_t W);
void rp_window_softmax(const float* s, float scale, float* p, int64_t rows, int64_t T, int64_t W);
void rp_window_softmax_backward(const float* gp, const float* p, float scale, float* gs, int64_t rows, int64_t T,
                                int64_t W);

// mlp.cpp (§8 swiglu). u [R, 2H] = [gate | up]; out [R, H].
void rp_swiglu(const float* u, float* out, int64_t R, int64_t H);
void rp_swiglu_backward(const float* g, const float* u, float* gu, int64_t R, int64_t H);

// loss.cpp (§8 cross_entropy). z [R, V]; targets [R]; loss scalar; lse [R].
void rp_cross_entropy(const float* z, const int64_t* targets, float zloss, float* loss, float* lse,
                      int64_t R, int64_t V);
void rp_cross_entropy_backward(float g, const float* z, const int64_t* targets, const float* lse,
                               float zloss, float* gz, int64_t R, int64_t V);

// embedding.cpp (§8 embedding). w [V, D]; idx [N]; out [N, D]; gw [V, D].
void rp_embedding(const float* w, const int64_t* idx, float* out, int64_t N, int64_t D);
void rp_embedding_backward(const float* g, const int64_t* idx, float* gw, int64_t N, int64_t V, int64_t D);

// elementwise.cpp (§5, §8 add/mul/scale/dropout/csum). n elements; fn: which §5 function (ids.h).
void rp_unary(RpFn fn, const float* x, float* y, int64_t n);
void rp_add(const float* a, const float* b, float* y, int64_t n);
void rp_mul(const float* a, const float* b, float* y, int64_t n);
void rp_scale(const float* a, float s, float* y, int64_t n);
void rp_csum_rows(const float* x, float* y, int64_t rows, int64_t n);
void rp_dropout(const float* x, float* y, int64_t n, uint32_t threshold, float scale,
                uint64_t seed, uint32_t c1, uint32_t c2);
// canary: out[0] = a*b + c as compiled here (0 unless contracted), out[1] = a subnormal
// product (rp::mul) computed inside a parallel chunk (0 unless FTZ is missing in that thread;
// in the software-flush build rp::mul itself must flush it).
void rp_canary(float* out);

// optim.cpp (§8 adamw, clip_grad).
void rp_adamw(float* p, const float* g, float* m, float* v, int64_t n, float lr, float b1, float b2,
              float omb1, float omb2, float eps, float decay, float bc1, float bc2);
void rp_clip_grad(const float* g, float max_norm, float* out, float* norm, int64_t n);

// random.cpp (§6). words: n uint32; uniform/normal: n floats.
void rp_philox(uint64_t seed, uint32_t c1, uint32_t c2, uint32_t purpose, uint32_t block_offset,
               uint32_t* words, int64_t n);
void rp_uniform(uint64_t seed, uint32_t c1, uint32_t c2, uint32_t purpose, float* out, int64_t n);
void rp_normal(uint64_t seed, uint32_t c1, uint32_t c2, uint32_t purpose, float* out, int64_t n);

// int8.cpp (§10 the quantized path). x, y, gx, gxh [R, C] float; q [R, C] int8; s, gs [R]
// (one step size per row; a per-tensor step size is R = 1). A [M, K], B [N, K] int8 in
// [-127, 127] with K * 127^2 < 2^31; C32 [M, N] int32 = A @ B^T; Y [M, N] float.
void rp_quantize(const float* x, const float* s, int8_t* q, int64_t R, int64_t C);
void rp_dequantize(const int8_t* q, const float* s, float* y, int64_t R, int64_t C);
void rp_int8_matmul(const int8_t* A, const int8_t* B, int32_t* C, int64_t M, int64_t N, int64_t K);
void rp_int8_linear(const int8_t* A, const int8_t* B, float sx, const float* sw, float* Y, int64_t M,
                    int64_t N, int64_t K);
void rp_lsq_init(const float* x, float* s, int64_t R, int64_t C, float inv_c);
// The int8 GEMM's path: 0 = this CPU's default (AMX-INT8 where usable, else the SIMD path),
// 1 = the build's SIMD path (VNNI vpdpbusd / vpmaddwd / smlal / C), 2 = AMX-INT8. Every path
// gives the same bits. Returns the path now in use (1 or 2), -1 (and no change) if unavailable.
int rp_int8_select(int path);
bool rp_int8_uses_amx();   // the path now in use is AMX-INT8
// int8_amx.cpp (used by int8.cpp and exact.cpp): the GEMM on AMX-INT8 tiles, nmat products at once
// (the exact matmul's eight residue GEMMs), C_m = A_m @ B_m^T for m < nmat, A_m [M, K] (row i
// at A + m * a_next + i * lda), B_m [N, K] (row j at B + m * b_next + j * ldb), int8, exact int32.
// rp_amx_usable(): the CPU has AMX-INT8, the build has the AMX code and Linux granted the tile
// state (asked once per process). rp_amx_pack_b: rows [j0, j1) of all B_m (j0 a multiple of 16,
// j1 one too or N; row j of B_m at B + m * b_next + (j - j0) * ldb) into their place in the tile
// layout of all N rows (out: rp_amx_packed_bytes), so that B can be packed a chunk of rows at a
// time. rp_amx_gemm: each finished block of outputs (mr <= 32 rows at i0, nr <= 32 columns at j0)
// goes to finish(ctx, i0, mr, j0, nr, tiles, 32, 1024) in the thread that computed it, tiles
// holding nmat blocks [32][32] one after the other; with nmat = 1 and direct (the output [M, N])
// given, full 32 x 32 blocks are stored there instead. A needs lda >= K only (its blocks are copied
// into tile order, zero past K); lda = 0 says that each A_m is in tile order already (byte
// rp_amx_a_offset(i, k, Kp) holds A_m[i, k], Kp = K rounded up to 64, the rows M rounded up to 32;
// zero past K and in the rows past M) and a_next counts bytes of it. causal (RpCausal, below; row
// i of this call is row causal.row0 + i of the product): with kScores a block whose columns all
// lie right of its rows' diagonal is neither computed nor finished (its outputs are left as they
// are); with kMix and kMixT the k-steps of 64 in which a block's rows of A are all zero by the form
// are not multiplied (kMixT: where K = T, one head).
// int8.cpp: the same nmat GEMMs on this build's SIMD path (int8.cpp has the layout), for the exact
// matmul: rp_int8_pack_b as rp_amx_pack_b (j0 a multiple of 32), rp_int8_gemm_packed as
// rp_amx_gemm without direct, its blocks rows x nr <= cols (the path's tile: 8 x 32 with AVX-512,
// 4 x 16 otherwise) in finish(ctx, i0, mr, j0, nr, tiles, cols, rows * cols), rows * cols a multiple
// of 64 and cols 16 or 32; the sums in a block's rows past mr are undefined.
// n elements of v at a 64-byte boundary (v grown to n plus a cache line, never shrunk: a buffer
// kept between calls is not cleared again for each smaller product; its contents are undefined):
// AMX reads and writes tile rows of 64 bytes, and a row that straddles two cache lines costs two
// accesses.
template <class T>
inline T* rp_aligned64(std::vector<T>& v, size_t n) {
  if (v.size() < n + 64 / sizeof(T)) v.resize(n + 64 / sizeof(T));
  return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(v.data()) + 63) & ~uintptr_t(63));
}
// Attention's causal structure, for the products of full causal attention (exact.cpp's
// rp_exact_matmul; int8_amx.cpp skips work by it). Rows (or columns) r = (g, t) of G*T, t = r % T:
//   kScores  C [G*T, T] (S = q k^T, gP = gO v^T; T = N): C[r, j] for j <= t as §11 gives it, +0.0
//            for j > t (causal_softmax and its backward never read it); the blocks wholly above
//            the diagonal may be skipped;
//   kMix     A [G*T, T] (P, gS; T = K): A[r, k] for k > t read as +0.0 (o = P v, gq = gS k);
//   kMixT    A [T, G*T] (P^T, gS^T; T = M): A[j, (g, t)] for t < j read as +0.0 (gv = P^T gO,
//            gk = gS^T q).
// P and gS hold +0.0 there (causal_softmax and its backward write it), so each is the §11 product
// of the full operands; the kernels neither read nor multiply those entries where they can skip
// them. row0: the first row of a part of the product (a panel) within the whole.
enum class RpCausal { kNone, kScores, kMix, kMixT };
struct RpCausalRows {
  RpCausal form = RpCausal::kNone;
  int64_t T = 0, row0 = 0;
};
// finish's tiles: nmat blocks one after the other (plane int32 apart), rows ldt int32 apart.
typedef void (*RpTileFinish)(void* ctx, int64_t i0, int64_t mr, int64_t j0, int64_t nr, const int32_t* tiles,
                             int64_t ldt, int64_t plane);
bool rp_amx_usable();
// A's tile order: blocks of 32 rows, each all of Kp in k-steps of 64 k, a step the tile of its
// rows 0-15 then that of rows 16-31 (16 rows of 64 consecutive k).
inline int64_t rp_amx_a_offset(int64_t i, int64_t k, int64_t Kp) {
  return (i / 32) * 32 * Kp + (k / 64) * 2048 + (i % 32) / 16 * 1024 + (i % 16) * 64 + k % 64;
}
int64_t rp_amx_packed_bytes(int64_t N, int64_t K, int nmat);
void rp_amx_pack_b(const int8_t* B, int64_t ldb, int64_t b_next, int64_t N, int64_t K, int nmat, int64_t j0,
                   int64_t j1, uint8_t* out);
void rp_amx_gemm(const int8_t* A, int64_t lda, int64_t a_next, const uint8_t* Bp, int64_t M, int64_t N, int64_t K,
                 int nmat, int32_t* direct, RpTileFinish finish, void* ctx, RpCausalRows causal = {});
int64_t rp_int8_packed_bytes(int64_t N, int64_t K, int nmat);
void rp_int8_pack_b(const int8_t* B, int64_t ldb, int64_t b_next, int64_t N, int64_t K, int nmat, int64_t j0,
                    int64_t j1, uint8_t* out);
void rp_int8_gemm_packed(const int8_t* A, int64_t lda, int64_t a_next, const uint8_t* Bp, int64_t M, int64_t N,
                         int64_t K, int nmat, RpTileFinish finish, void* ctx);
// int8_pv.cpp (§10 int8 P·V): the block step rule over rows of x [R, C] -> s [R]; the int8 band
// mix qp [batch, M, W] (band layout of window.cpp) x qv [batch, T, D] -> o [batch, M, D] float,
// sp [batch * M] per query row, sv [batch] per value block.
void rp_int8_absmax_step(const float* x, float* s, int64_t R, int64_t C);
void rp_int8_band_mix(const int8_t* qp, const int8_t* qv, const float* sp, const float* sv, float* o, int64_t batch,
                      int64_t M, int64_t T, int64_t D, int64_t W);
void rp_lsq_backward(const float* x, const float* s, const float* gxh, float g, float* gx, float* gs,
                     int64_t R, int64_t C);

// exact.cpp (§11 the exact matmul). An operand is rows of K values: value (r, k) at
// x[r * rs + k * ks], with ks = 1 (each row's values contiguous) or rs = 1 (the transpose of a
// row-major [K, rows] tensor: a backward product's x^T or g^T, read in place). A [M, K] and Bt
// [N, K] (B transposed) so; C [M, N] contiguous; integer arithmetic only (K < 2^31).
struct RpExactOperand {
  const float* x;
  int64_t rs, ks;
};
// causal: attention's products (RpCausal above; kScores: M a multiple of N; kMix: M a multiple of
// K, A's rows K-contiguous (ks = 1); kMixT: K a multiple of M, A the transpose of a row-major
// tensor (rs = 1)).
void rp_exact_matmul(RpExactOperand A, RpExactOperand Bt, float* C, int64_t M, int64_t N, int64_t K,
                     RpCausal causal = RpCausal::kNone);
// Its parts, for products whose scales come from operands larger than the ones multiplied (the
// band products, end of exact.cpp): beta of a K; each row's exponent and bad flag (§11 steps
// 2-3) of x [rows, K]; and steps 4-8 for A [M, K] and Bt [N, K] with given beta and scales
// (K >= 1: every band product's dot has at least the query's own key).
int rp_exact_beta(int64_t K);
void rp_exact_exponents(RpExactOperand x, int64_t rows, int64_t K, int32_t* e, uint8_t* bad);
void rp_exact_product(RpExactOperand A, RpExactOperand Bt, float* C, int64_t M, int64_t N, int64_t K, int beta,
                      const int32_t* ea, const uint8_t* bad_a, const int32_t* eb, const uint8_t* bad_b,
                      RpCausal causal = RpCausal::kNone);
// The band products of window attention as §11 products of the full (masked) operands, in
// O(T*W); shapes and layouts as rp_band_scores / rp_band_mix / rp_band_mix_t above.
void rp_exact_band_scores(const float* a, const float* b, float* s, int64_t batch, int64_t M, int64_t T, int64_t D,
                          int64_t W);
void rp_exact_band_mix(const float* p, const float* b, float* o, int64_t batch, int64_t M, int64_t T, int64_t D,
                       int64_t W);
void rp_exact_band_mix_t(const float* p, const float* a, float* o, int64_t batch, int64_t M, int64_t T, int64_t D,
                         int64_t W);
