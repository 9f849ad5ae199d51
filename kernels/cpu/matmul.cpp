// matmul.cpp -- C[b] = A[b] @ B[b] with the canonical order of contract §4.1:
// every C[i,j] is acc = +0.0; acc = acc + A[i,k]*B[k,j] for k = 0..K-1 in order.
//
// Speed comes only from work across output elements: B is packed once per call into panels
// ([k-block][n-panel][kc][NR], any input strides, so transposed views cost nothing extra) that
// every thread shares; each task packs its A block (the 512-bit tile reads A in place where its
// rows are contiguous across i, or in k where the task has one column panel, see matmul), and an
// MR x NR register tile of accumulators is updated with SIMD across j (an edge tile of fewer
// rows on those rows only). Threads take disjoint output blocks.
// Blocking over k carries the running acc through C (load, keep adding), never sums blocks.
//
// Two register tiles on x86 with AVX-512 (rp_matmul_select picks one; both give the same bits,
// since each output's operations are the same in both):
//   512-bit  12 x 32 (24 zmm accumulators, 2 B vectors, products; the A value is the multiply's
//            broadcast memory operand): the default wherever the build has it. Intel cores run
//            vmulps and vaddps on the same two FMA ports (p0, p5 at 512 bits), so the contract's
//            unfused pair reaches 16 per cycle only with 16-float vectors (32 flop/cycle); AMD
//            Zen 5 server and desktop cores have two FMUL and two FADD pipes of 512 bits (32
//            pairs, 64 flop/cycle), which only 16-float vectors fill; AMD Zen 4 runs 512-bit
//            instructions as two 256-bit halves on two FMUL and two FADD pipes (16 pairs), and
//            there this tile was never slower than the 256-bit one and held 0.74-0.91 of the
//            limit, where the 256-bit tile, 5.6 instructions per cycle at the limit against
//            Zen 4's 6-wide dispatch, ran at 0.49-0.9 with the build and the moment
//            (docs/performance.md, AMD Zen 4);
//   256-bit  8 x 16 (16 accumulators of 8 floats): REPOPS_CPU_MATMUL=256, and the software-flush
//            test build.
#include "kernels.h"
#include "transpose.h"

#include <algorithm>
#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif
#include <atomic>
#include <cstring>
#include <ctime>
#include <memory>
#include <vector>

namespace {

// A register tile: MR rows x NR columns of accumulators in vectors V (NV of them per row).
template <class V, int64_t MR_, int64_t NR_, int64_t KC_, int64_t MC_, int64_t NC_>
struct Tile {
  using vec = V;
  static constexpr int64_t L = sizeof(V) / sizeof(float);  // floats per vector
  static constexpr int64_t MR = MR_, NR = NR_, NV = NR_ / L;
  static constexpr int64_t KC = KC_, MC = MC_, NC = NC_;   // cache blocks
};

using rp::vf;
// The register tile is MR rows x NR = 16 columns of rp::vf (VL floats: 8 on x86, 4 on AArch64):
// MR * NV accumulators, NV vectors of B, the broadcast A value and a product must fit in the
// register file.
#if defined(__AVX512VL__)
using Tile256 = Tile<vf, 8, 16, 256, 256, 256>;  // 32 registers: 16 accumulators
constexpr const char* kPath256 = "x86 AVX-512, matmul tile 8x16 (16 accumulators), 256-bit vectors";
#elif defined(__AVX__)
// 16 registers: 12 accumulators, 2 B, 1 broadcast, 1 product. k-blocks of 512 (B's micro-panel
// 32 KB): the products with K > 256 ran 2.5-7% faster than with 256 (fewer passes over C), the
// rest the same (AMD Zen 3, tools.matmul_loop, 2026-12-02).
using Tile256 = Tile<vf, 6, 16, 512, 96, 256>;
constexpr const char* kPath256 = "x86 AVX2, matmul tile 6x16 (12 accumulators), 256-bit vectors";
#elif defined(__aarch64__)
// 32 registers, 4 floats each: 16 accumulators, 4 B, the 4 A values, products. (A 6x16 tile's
// 24 accumulators plus the 6 A values do not fit: GCC 12 spills 7-15 of them per k step.)
using Tile256 = Tile<vf, 4, 16, 256, 128, 256>;
constexpr const char* kPath256 = "AArch64 NEON, matmul tile 4x16 (16 accumulators), 128-bit vectors";
#else
using Tile256 = Tile<vf, 4, 16, 256, 128, 256>;
constexpr const char* kPath256 = "generic vectors, matmul tile 4x16";
#endif

// The 512-bit tile: x86 with AVX-512 and the hardware flush only (rp::mul is the plain product;
// the software-flush test build keeps the 256-bit tile, whose vf lanes rp::mul's fix-up handles).
#if defined(__AVX512F__) && RP_FLUSH_HW
#define RP_MATMUL_512 1
typedef float vf16 __attribute__((vector_size(64)));
using Tile512 = Tile<vf16, 12, 32, 256, 96, 384>;
constexpr const char* kPath512 = "x86 AVX-512, matmul tile 12x32 (24 accumulators), 512-bit vectors";
#endif

template <class V> inline V load(const float* p) { V v; __builtin_memcpy(&v, p, sizeof(V)); return v; }
template <class V> inline void store(float* p, V v) { __builtin_memcpy(p, &v, sizeof(V)); }

// Where micro_kernel reads A(i, k): kPacked at Ap[k * MR + i] (a packed panel), or in the operand
// itself, kColumns at Ap[k * lda + i] (its rows contiguous across i), kRows at Ap[i * lda + k]
// (its rows contiguous in k).
enum ALayout { kPacked, kColumns, kRows };

// acc[MR][NR] (+)= A x Bp[k][NR] over k in [0, kc), A read as Layout says; C tile
// has row stride ldc. `vector * scalar` broadcasts the scalar without arithmetic;
// -ffp-contract=off keeps the multiply and the add separate instructions. Products go through
// rp::mul (contract §3: the plain product on x86, the fix-up on AArch64, the software flush
// elsewhere) unless Plain, which the caller picks only where no product can come near 2^-126
// (see plain_ok).
constexpr int64_t kPrefetchK = 8;   // kColumns: A's row kPrefetchK k ahead is fetched into L1

// b * (*a) through rp::mul. The 512-bit tile's takes *a as vmulps's broadcast memory operand
// ({1to16}: the same multiply, b its first source as in rp::mul, so the same bits): written as
// b * a[i], GCC loads each A value into a register with vbroadcastss first, one more instruction
// per row and k, and on AMD Zen 4 the 12x32 tile's loop in L1 then ran at 77 GFLOP/s against 110
// with the memory operand (one thread, 2026-12-03).
template <class V> inline V product(V b, const float* a) { return rp::mul(b, *a); }
#if defined(RP_MATMUL_512)
template <> inline vf16 product<vf16>(vf16 b, const float* a) {
  vf16 r;
  asm("vmulps %2%{1to16%}, %1, %0" : "=v"(r) : "v"(b), "m"(*a));
  return r;
}
#endif
// Rows < MR: only the tile's first Rows rows (an edge tile; a packed panel keeps its MR stride).
template <class T, bool Plain = false, ALayout Layout = kPacked, int64_t Rows = T::MR>
inline void micro_kernel(int64_t kc, const float* __restrict Ap, const float* __restrict Bp,
                         float* C, int64_t ldc, bool first, int64_t lda = T::MR) {
  using V = typename T::vec;
  constexpr int64_t MR = Rows, NR = T::NR, NV = T::NV, L = T::L;
  // Every loop over the accumulators is unrolled by pragma: with the loads and stores of C left
  // to GCC 12's own unrolling, a kernel compiled out of line kept acc as an array in memory and
  // stored every accumulator at each k step (objdump).
  V acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = first ? V{} : load<V>(C + i * ldc + v * L);
  for (int64_t k = 0; k < kc; ++k) {
    V b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = load<V>(Bp + k * NR + v * L);
    const float* a = Layout == kRows ? Ap + k : Ap + k * (Layout == kColumns ? lda : T::MR);
    const int64_t row_step = Layout == kRows ? lda : 1;   // A(i, k) at a[i * row_step]
    // kColumns: A's k steps are lda floats apart, each k step's MR values in another line, which
    // the hardware prefetchers do not fetch in time (without this the broadcasts wait on L1 misses)
    if constexpr (Layout == kColumns) __builtin_prefetch(a + kPrefetchK * lda, 0, 3);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        acc[i][v] = rp::add(acc[i][v], Plain ? b[v] * a[i * row_step] : product(b[v], a + i * row_step));
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) store<V>(C + i * ldc + v * L, acc[i][v]);
}

// micro_kernel with A read in place by rows (kRows) on `tiles` consecutive MR-row tiles of one
// column panel, out of line (`flatten` inlines the kernel here): inlined into matmul's task loop
// instead, the products with K = 32, which do not use it, ran 6% slower (tools.matmul_loop
// --fresh 16 --only attn, AMD Zen 4, 2026-12-03).
template <class T>
__attribute__((noinline, flatten)) void row_tiles(int64_t tiles, int64_t kc, const float* A, int64_t lda,
                                                  const float* Bp, float* C, int64_t ldc, bool first) {
  for (int64_t t = 0; t < tiles; ++t) {
    float* c = C + t * T::MR * ldc;
    for (int64_t i = 0; i < T::MR; ++i)   // the next tile's C lines, as in matmul
      for (int64_t v = 0; v < T::NR; v += T::L) __builtin_prefetch(c + (T::MR + i) * ldc + v, 1, 3);
    micro_kernel<T, false, kRows>(kc, A + t * T::MR * lda, Bp, c, ldc, first, lda);
  }
}

// micro_kernel on the first mr (1 .. MR - 1) rows of a packed A panel (an edge tile), straight into
// C: one kernel per row count, out of line as row_tiles. With a scratch tile instead (all MR rows
// computed, cleared and copied element by element), the products with such an edge ran 2-9%
// slower (tools.matmul_loop, AMD Zen 4, 2026-12-03).
template <class T, bool Plain, int64_t R = T::MR - 1>
__attribute__((noinline, flatten)) void edge_rows(int64_t mr, int64_t kc, const float* Ap, const float* Bp, float* C,
                                                  int64_t ldc, bool first) {
  if constexpr (R > 1)
    if (mr < R) return edge_rows<T, Plain, R - 1>(mr, kc, Ap, Bp, C, ldc, first);
  micro_kernel<T, Plain, kPacked, R>(kc, Ap, Bp, C, ldc, first);
}

#if RP_FLUSH_HW
constexpr bool kCheckExponents = false;  // x86: rp::mul is the plain product already
#else
// Where rp::mul costs more than a multiply (AArch64's fix-up, the software flush), a k-block
// whose operands cannot produce a product near 2^-126 runs the plain micro-kernel. For normal
// a = ma 2^ea, b = mb 2^eb (ma, mb in [1, 2)) the exact product is at least 2^(ea + eb), so if
// ea + eb >= -126 for every pair, every product is a normal number >= 2^-126 (or inf / NaN):
// no flush, no window, nothing to fix, and the plain product has the same bits. Zeros give
// zero products either way; a subnormal operand forces the fixed-up kernel (DAZ). Both kernels
// give the same bits, so the choice (per A block and B panel) never shows in the result.
constexpr bool kCheckExponents = true;
#endif
constexpr int32_t kSubnormalExp = -1000;  // min_exponent of a block holding a subnormal

// The smallest biased exponent field among the nonzero floats of p[0, n) (kSubnormalExp if
// one is subnormal; 255 if all are zero).
inline int32_t min_exponent(const float* p, int64_t n) {
  int32_t m = 255;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = rp::bits(p[i]) & 0x7FFFFFFFu;
    const int32_t f = (int32_t)(u >> 23);
    const int32_t e = u == 0 ? 255 : f == 0 ? kSubnormalExp : f;
    m = e < m ? e : m;
  }
  return m;
}
// (ea + 127) + (eb + 127) >= -126 + 254: every product of the two blocks is >= 2^-126.
inline bool plain_ok(int32_t min_a, int32_t min_b) { return min_a + min_b >= 128; }

#if defined(__AVX__)
// pack<R> where each row is contiguous in k (ks == 1: the x and W of x @ W^T, the gy of gy @ W):
// 8 k of up to 8 rows at a time through an 8 x 8 transpose in registers (transpose.h), each k's
// n rows of a group stored as one panel row piece; the last kc % 8 values one by one. Element for
// element it writes what the loop in pack<R> writes, 2-3.5% faster over the model's 15 products
// (geometric mean; up to 5% on x @ W.T and gy @ W) than that loop on AMD Zen 3, one binary
// switching between the two (2026-12-02, docs/performance.md).
template <int64_t R>
void pack_k_rows(const float* p, int64_t rs, int64_t rows, int64_t kc, float* out) {
  for (int64_t r0 = 0; r0 < rows; r0 += R) {
    const int64_t nr = std::min(R, rows - r0);
    float* panel = out + r0 * kc;
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8)
      for (int64_t g = 0; g < R; g += 8) {
        const int64_t n = std::min<int64_t>(8, R - g);   // panel columns in this group
        __m256 v[8];
        for (int64_t i = 0; i < 8; ++i)
          v[i] = g + i < nr ? _mm256_loadu_ps(p + (r0 + g + i) * rs + k) : _mm256_setzero_ps();
        rp::transpose8(v);   // v[kk]: k + kk of rows g .. g + 7
        for (int64_t kk = 0; kk < 8; ++kk) {
          float* dst = panel + (k + kk) * R + g;
          if (n == 8) {
            _mm256_storeu_ps(dst, v[kk]);
          } else {   // n == 6: four floats and two
            _mm_storeu_ps(dst, _mm256_castps256_ps128(v[kk]));
            _mm_storel_pi(reinterpret_cast<__m64*>(dst + 4), _mm256_extractf128_ps(v[kk], 1));
          }
        }
      }
    for (int64_t r = 0; r < R; ++r)
      for (int64_t kt = k; kt < kc; ++kt) panel[kt * R + r] = r < nr ? p[(r0 + r) * rs + kt] : 0.0f;
  }
}
#endif

// Pack rows [0, rows) x k [0, kc) of a strided matrix (element (r, k) at p[r*rs + k*ks]) into
// panels [ceil(rows/R)][kc][R], zero-padding the last panel's missing rows.
template <int64_t R>
void pack(const float* p, int64_t rs, int64_t ks, int64_t rows, int64_t kc, float* out) {
#if defined(__AVX__)
  if constexpr (R % 8 == 0 || R == 6)
    if (ks == 1 && rs != 1) return pack_k_rows<R>(p, rs, rows, kc, out);
#endif
  for (int64_t r0 = 0; r0 < rows; r0 += R) {
    const int64_t nr = std::min(R, rows - r0);
    float* panel = out + r0 * kc;
    if (nr == R && rs == 1) {  // the R rows are contiguous: copy vectors
      for (int64_t k = 0; k < kc; ++k) std::memcpy(panel + k * R, p + r0 + k * ks, R * sizeof(float));
      continue;
    }
    for (int64_t r = 0; r < nr; ++r) {
      const float* src = p + (r0 + r) * rs;
      for (int64_t k = 0; k < kc; ++k) panel[k * R + r] = src[k * ks];
    }
    for (int64_t r = nr; r < R; ++r)
      for (int64_t k = 0; k < kc; ++k) panel[k * R + r] = 0.0f;
  }
}

#if defined(RP_MATMUL_512)
// pack<R> for the 512-bit tile (R = 12 rows of A, 32 columns of B): where each row is contiguous
// in k (ks == 1, the x and W of x @ W^T), 16 k of up to 16 rows at a time through a 16 x 16
// transpose in registers (transpose.h), stored as R-wide panel rows; where the rows are
// contiguous across r (rs == 1, the B of gy @ W and of gy^T @ x), k outer and every panel inner,
// so that each k's values are read once, in order (panel by panel, a stride of ks floats misses
// L1 on cache-set conflicts and reads each line once per panel); the rest as pack<R>.
template <int64_t R>
void pack_wide(const float* p, int64_t rs, int64_t ks, int64_t rows, int64_t kc, float* out) {
  if (rs == 1) {
    const int64_t full = rows / R * R;   // rows in full panels
    for (int64_t k = 0; k < kc; ++k) {
      const float* src = p + k * ks;
      for (int64_t r0 = 0; r0 < full; r0 += R) std::memcpy(out + r0 * kc + k * R, src + r0, R * sizeof(float));
      float* last = out + full * kc + k * R;   // the last panel, zero-padded
      for (int64_t r = 0; full < rows && r < R; ++r) last[r] = full + r < rows ? src[full + r] : 0.0f;
    }
    return;
  }
  if (ks != 1) return pack<R>(p, rs, ks, rows, kc, out);
  for (int64_t r0 = 0; r0 < rows; r0 += R) {
    const int64_t nr = std::min(R, rows - r0);
    float* panel = out + r0 * kc;
    int64_t k = 0;
    for (; k + 16 <= kc; k += 16)
      for (int64_t g = 0; g < R; g += 16) {
        const int64_t n = std::min<int64_t>(16, R - g);   // panel columns in this group
        __m512i v[16];
        for (int64_t i = 0; i < 16; ++i)
          v[i] = g + i < nr ? _mm512_loadu_si512(p + (r0 + g + i) * rs + k) : _mm512_setzero_si512();
        rp::transpose16(v);   // v[kk]: k + kk of rows g .. g + 15
        for (int64_t kk = 0; kk < 16; ++kk)
          _mm512_mask_storeu_epi32(panel + (k + kk) * R + g, (__mmask16)((1u << n) - 1), v[kk]);
      }
    for (int64_t r = 0; r < R; ++r)   // the last kc % 16 values
      for (int64_t kt = k; kt < kc; ++kt) panel[kt * R + r] = r < nr ? p[(r0 + r) * rs + kt] : 0.0f;
  }
}
#endif

// The packing of tile T's operands.
template <class T, int64_t R>
void pack_for(const float* p, int64_t rs, int64_t ks, int64_t rows, int64_t kc, float* out) {
#if defined(RP_MATMUL_512)
  if constexpr (T::L == 16) return pack_wide<R>(p, rs, ks, rows, kc, out);
#endif
  pack<R>(p, rs, ks, rows, kc, out);
}

// lower: only C[b, i, j <= i] is needed (rp_matmul_lower): tiles and tasks wholly above the
// diagonal are skipped; every entry computed is the same as without.
template <class T>
void matmul(const float* A, int64_t sab, int64_t sam, int64_t sak,
            const float* B, int64_t sbb, int64_t sbk, int64_t sbn,
            float* C, int64_t batch, int64_t M, int64_t N, int64_t K, bool lower) {
  constexpr int64_t MR = T::MR, NR = T::NR, KC = T::KC, MC = T::MC, NC = T::NC;
  // Smaller blocks when the output is small, so that there are enough tasks for the threads
  // (a weight gradient with 128 rows would otherwise be one task). Bits do not change.
  int64_t mc_blk = MC, nc_blk = NC;
  auto tasks_for = [&](int64_t mc, int64_t nc) { return batch * ((M + mc - 1) / mc) * ((N + nc - 1) / nc); };
  while (tasks_for(mc_blk, nc_blk) < 8) {
    if (mc_blk > 4 * MR) mc_blk = (mc_blk / 2 + MR - 1) / MR * MR;
    else if (nc_blk > 2 * NR) nc_blk = (nc_blk / 2 + NR - 1) / NR * NR;
    else break;
  }
  // Blocks of even size for that number of blocks: threads take equal runs of tasks, so a short
  // last block leaves one thread with less work (M = 1024 in 192-row blocks ends with 64 rows: the
  // three products with M = 1024 and N >= 384 ran 5-12% faster on 2 threads of an AMD Zen 3 with
  // even blocks, docs/performance.md). Columns: blocks of one size, a multiple of NR. Rows: the
  // ceil(M / MR) row tiles split into mblocks blocks whose sizes differ by one tile at most, and
  // mblocks raised (up to twice) until the tasks are a multiple of the threads: M = 1024 in the
  // 512-bit tile's 96-row blocks is 86 tiles in 11 blocks, 6 tasks on one thread and 5 on the
  // other, and in 12 blocks of 7-8 tiles the products with M = 1024 ran about 10% faster on 2
  // threads (AMD Zen 4, docs/performance.md).
  const auto even = [](int64_t n, int64_t blk, int64_t r) {
    if (n == 0) return blk;
    const int64_t blocks = (n + blk - 1) / blk;
    return ((n + blocks - 1) / blocks + r - 1) / r * r;   // <= blk, the same number of blocks or fewer
  };
  nc_blk = even(N, nc_blk, NR);
  const int64_t nblocks = (N + nc_blk - 1) / nc_blk, mtiles = (M + MR - 1) / MR;
  int64_t mblocks = (M + mc_blk - 1) / mc_blk;
  const int64_t threads = std::max(1, rp_threads());
  for (int64_t m = mblocks; m <= std::min(2 * mblocks, mtiles); ++m)
    if (batch * m * nblocks % threads == 0) {
      mblocks = m;
      break;
    }
  // row block mb: rows [mb_row(mb), mb_row(mb + 1)) (MR-row tiles; the last block ends at M)
  const auto mb_row = [=](int64_t mb) { return std::min(M, mb * mtiles / mblocks * MR); };
  const int64_t kblocks = (K + KC - 1) / KC;

  // Pack all of B once: batch bb, k-block starting at k0 (kc deep) is at
  // bp + bb * K * Npad + k0 * Npad, its n-panel at column j0 a further j0 * kc on.
  // A broadcast B (batch stride 0) is packed once for all batches.
  const int64_t Npad = (N + NR - 1) / NR * NR, bbatches = sbb == 0 ? 1 : batch;
  // Allocated per call, not zeroed (every element read is written first): its size follows B.
  const std::unique_ptr<float[]> bbuf(new float[bbatches * K * Npad]);
  float* bp = bbuf.get();
  // min_exponent of each packed B panel block [bb][k-block][n-block] (kCheckExponents only)
  std::vector<int32_t> bmin(kCheckExponents ? bbatches * kblocks * nblocks : 0);
  rp::parallel_for(bbatches * kblocks * nblocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t bb = t / (kblocks * nblocks), k0 = (t / nblocks) % kblocks * KC, j0 = t % nblocks * nc_blk;
      const int64_t kc = std::min(KC, K - k0), nc = std::min(nc_blk, N - j0);
      float* panel = bp + bb * K * Npad + k0 * Npad + j0 * kc;
      pack_for<T, NR>(B + bb * sbb + j0 * sbn + k0 * sbk, sbn, sbk, nc, kc, panel);
      if (kCheckExponents) bmin[t] = min_exponent(panel, (nc + NR - 1) / NR * NR * kc);
    }
  });

  rp::parallel_for(batch * mblocks * nblocks, 1, [&](int64_t t0, int64_t t1) {
    static thread_local std::vector<float> abuf(MC * KC);  // reused by this thread's calls
    if ((int64_t)abuf.size() < MC * KC) abuf.resize(MC * KC);  // (the other tile's size may differ)
    float* apack = abuf.data();
    float edge[MR * NR];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / (mblocks * nblocks), mb = (t / nblocks) % mblocks, nb = t % nblocks;
      const int64_t i0 = mb_row(mb), mc = mb_row(mb + 1) - i0;
      const int64_t j0 = nb * nc_blk, nc = std::min(nc_blk, N - j0);
      if (lower && j0 >= i0 + mc) continue;   // every column right of every row's diagonal
      const float* Ab = A + b * sab;
      const float* Bb = bp + (sbb == 0 ? 0 : b) * K * Npad;
      float* Cb = C + b * M * N;
      for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = std::min(KC, K - k0);
        // 512-bit tile: A's full MR-row panels [0, packed_from) are read in place, not packed,
        // where that costs less (x86 only, where no exponent check reads the packed A):
        // - kColumns, where A's rows are contiguous across i (sam == 1: the gy^T of a weight
        //   gradient, attention's P^T and gS^T): packing took about 14% of those products' time
        //   (strided 48-byte reads, perf), and the broadcasts find the values in L1 with a
        //   software prefetch (micro_kernel);
        // - kRows, where A's rows are contiguous in k (sak == 1) and the task has one column panel
        //   (nc == NR: attention's P V and gS K, N = head_dim = 32), so that each A value is used
        //   by one tile only: attention's two such products ran 1.16-1.2x faster unpacked (AMD Zen
        //   4, tools.matmul_loop, 2026-12-03). Not where the rows are a multiple of 2 KB apart:
        //   the tile's 12 rows would then share at most two of L1's 64 sets.
        const bool a_columns = T::L == 16 && !kCheckExponents && sam == 1;
        const bool a_rows = T::L == 16 && !kCheckExponents && sak == 1 && !a_columns && nc == NR && sam % 512 != 0;
        const int64_t packed_from = a_columns || a_rows ? mc / MR * MR : 0;
        if (packed_from < mc)
          pack_for<T, MR>(Ab + (i0 + packed_from) * sam + k0 * sak, sam, sak, mc - packed_from, kc,
                          apack + packed_from * kc);
        const float* bpanels = Bb + k0 * Npad + j0 * kc;
        const bool first = (k0 == 0);
        const bool plain = kCheckExponents &&
            plain_ok(min_exponent(apack, (mc + MR - 1) / MR * MR * kc),
                     bmin[((sbb == 0 ? 0 : b) * kblocks + k0 / KC) * nblocks + nb]);
        if (a_rows) row_tiles<T>(packed_from / MR, kc, Ab + i0 * sam + k0, sam, bpanels, Cb + i0 * N + j0, N, first);
        for (int64_t jp = 0; jp < nc; jp += NR) {
          for (int64_t ip = a_rows ? packed_from : 0; ip < mc; ip += MR) {
            float* ct = Cb + (i0 + ip) * N + (j0 + jp);
            const int64_t mr = std::min(MR, mc - ip), nr = std::min(NR, nc - jp);
            if (lower && j0 + jp >= i0 + ip + mr) continue;
            if constexpr (T::L == 16) {
              // 512-bit tile: the next tile's C lines, fetched for writing while this one runs (a
              // fresh output is not in cache; prefetches past an edge or C's end are harmless)
              const float* cn = ip + MR < mc ? ct + MR * N : Cb + i0 * N + (j0 + jp + NR);
              for (int64_t i = 0; i < MR; ++i)
                for (int64_t v = 0; v < NR; v += 16) __builtin_prefetch(cn + i * N + v, 1, 3);
            }
            // the tile into c (row stride ldc)
            const auto tile = [&](float* c, int64_t ldc) {
              const float* bpn = &bpanels[jp * kc];
              if (a_columns && ip < packed_from)
                micro_kernel<T, false, kColumns>(kc, Ab + (i0 + ip) + k0 * sak, bpn, c, ldc, first, sak);
              else if (plain) micro_kernel<T, true>(kc, &apack[ip * kc], bpn, c, ldc, first);
              else micro_kernel<T, false>(kc, &apack[ip * kc], bpn, c, ldc, first);
            };
            if (mr == MR && nr == NR) {
              tile(ct, N);
            } else if (nr == NR) {  // fewer rows (a packed panel's last): those rows, straight into C
              if (plain) edge_rows<T, true>(mr, kc, &apack[ip * kc], &bpanels[jp * kc], ct, N, first);
              else edge_rows<T, false>(mr, kc, &apack[ip * kc], &bpanels[jp * kc], ct, N, first);
            } else {  // fewer columns: run on a full scratch tile, copy the valid part
              for (int64_t i = 0; i < MR; ++i)
                for (int64_t j = 0; j < NR; ++j)
                  edge[i * NR + j] = (!first && i < mr && j < nr) ? ct[i * N + j] : 0.0f;
              tile(edge, NR);
              for (int64_t i = 0; i < mr; ++i)
                for (int64_t j = 0; j < nr; ++j) ct[i * N + j] = edge[i * NR + j];
            }
          }
        }
      }
    }
  });
}

// ---------------------------------------------------------------- the choice of tile
bool is_intel() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  return __builtin_cpu_is("intel");
#else
  return false;
#endif
}

// AMD up to Zen 4 (family 19h and older): 256-bit FMUL and FADD pipes (512-bit instructions run
// as two halves), so the port limit is 16 pairs per cycle at either width.
bool is_amd_before_zen5() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  if (!__builtin_cpu_is("amd")) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return true;
  const unsigned base = (a >> 8) & 0xF, ext = (a >> 20) & 0xFF;
  return (base == 0xF ? base + ext : base) < 0x1A;
#else
  return false;
#endif
}

#if defined(RP_MATMUL_512)
// Unfused multiply-add pairs per second at vector type V on this thread: 12 independent sums, each
// step a product of a register with the opaque b (the tile's broadcast) and an add, as in the
// tile's inner loop; zeros throughout, so no operand is subnormal. Best of three runs of 2^17
// steps (about 0.1-0.4 ms each), on the thread's CPU clock.
template <class V>
double pair_rate() {
  const int64_t n = int64_t(1) << 17;
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    V acc[12] = {}, a[12] = {}, b = {};
    // opaque, so that the compiler can neither share the equal products nor merge the equal sums
    for (int j = 0; j < 12; ++j) __asm__ volatile("" : "+v"(acc[j]), "+v"(a[j]));
    timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    for (int64_t i = 0; i < n; ++i) {
      __asm__ volatile("" : "+v"(b));
      for (int j = 0; j < 12; ++j) acc[j] = acc[j] + a[j] * b;
    }
    for (int j = 0; j < 12; ++j) __asm__ volatile("" : : "v"(acc[j]));
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    best = std::min(best, (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
  }
  return 12.0 * (double)n * (double)(sizeof(V) / sizeof(float)) / best;
}
#endif

// Whether this core's vector pipes are 512 bits wide for the unfused pair (the port limit of AMD
// cores from Zen 5 on: rp_matmul_flop_per_cycle): the 512-bit pair loop does at least 1.5x the
// lane operations per second of the 256-bit one (measured once per process, about 2 ms; 512-bit
// pipes give 2x, split 512-bit instructions 1x). Zen 5's mobile cores split 512-bit instructions
// as Zen 4 does, and the family number does not tell them apart.
bool wide_pipes() {
#if defined(RP_MATMUL_512)
  static const bool wide = pair_rate<vf16>() >= 1.5 * pair_rate<vf>();
  return wide;
#else
  return false;
#endif
}

int auto_width() {
#if defined(RP_MATMUL_512)
  return 512;
#else
  return 256;
#endif
}

std::atomic<int> g_width{0};  // 0: not chosen yet (auto_width on first use)

int width() {
  int w = g_width.load(std::memory_order_relaxed);
  if (w == 0) g_width.store(w = auto_width(), std::memory_order_relaxed);
  return w;
}

}  // namespace

int rp_matmul_select(int w) {
#if defined(RP_MATMUL_512)
  const bool ok = w == 0 || w == 256 || w == 512;
#else
  const bool ok = w == 0 || w == 256;
#endif
  if (!ok) return -1;
  g_width.store(w == 0 ? auto_width() : w, std::memory_order_relaxed);
  return width();
}

const char* rp_cpu_path() {
#if defined(RP_MATMUL_512)
  if (width() == 512) return kPath512;
#endif
  return kPath256;
}

// The contract's matmul limit on this core: unfused multiply-add pairs need one multiply and one
// add instruction each, so the limit is (vector instructions per cycle for mul and add) x lanes.
double rp_matmul_flop_per_cycle() {
#if defined(__x86_64__) || defined(_M_X64)
  if (!is_intel()) {
    if (is_amd_before_zen5()) return 32.0;   // Zen 2-4: 2 FMUL + 2 FADD pipes of 256 bits: 16 pairs
    return wide_pipes() ? 64.0 : 32.0;      // Zen 5 server/desktop: the same pipes at 512 bits
  }
  if (width() == 512) return 32.0;  // p0, p5 at 512 bits: 2 ops x 16 lanes = 16 pairs
  return 24.0;                      // p0, p1 (mul or add) + p5 (add) at 256 bits (Golden Cove+)
#else
  return 0.0;                       // not known for this architecture
#endif
}

// The core clock in Hz while the matmul's vector instructions run: a chain of dependent integer
// multiplies (3 cycles each on every Intel and AMD core since 2008) timed on this thread's CPU
// clock, the best of three runs of ~15 ms; with the 512-bit tile, independent 512-bit multiplies
// run beside the chain, so that a lower clock for 512-bit instructions shows. 0 where not
// measured (not x86).
double rp_cpu_clock_hz() {
#if (defined(__x86_64__) || defined(_M_X64)) && defined(CLOCK_THREAD_CPUTIME_ID)
  const int64_t n = int64_t(1) << 22;   // 4 multiplies each: 12 * 2^22 cycles
  const bool wide = width() == 512;
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    uint64_t x = 1;
    const uint64_t y = 3;
    timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
#if defined(RP_MATMUL_512)
    vf16 v = vf16{} + 1.0f;
#endif
    for (int64_t i = 0; i < n; ++i) {
      __asm__ volatile("imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0" : "+r"(x) : "r"(y));
#if defined(RP_MATMUL_512)
      if (wide) {
        v = v * v;   // independent of the chain (1.0 stays 1.0)
        __asm__ volatile("" : "+v"(v));
      }
#endif
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    best = std::min(best, (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
  }
  (void)wide;
  return 12.0 * (double)n / best;
#else
  return 0.0;
#endif
}

namespace {
void run_matmul(const float* A, int64_t sab, int64_t sam, int64_t sak,
                const float* B, int64_t sbb, int64_t sbk, int64_t sbn,
                float* C, int64_t batch, int64_t M, int64_t N, int64_t K, bool lower) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    std::fill(C, C + batch * M * N, 0.0f);
    return;
  }
#if defined(RP_MATMUL_512)
  if (width() == 512) return matmul<Tile512>(A, sab, sam, sak, B, sbb, sbk, sbn, C, batch, M, N, K, lower);
#endif
  matmul<Tile256>(A, sab, sam, sak, B, sbb, sbk, sbn, C, batch, M, N, K, lower);
}
}  // namespace

void rp_matmul(const float* A, int64_t sab, int64_t sam, int64_t sak,
               const float* B, int64_t sbb, int64_t sbk, int64_t sbn,
               float* C, int64_t batch, int64_t M, int64_t N, int64_t K) {
  run_matmul(A, sab, sam, sak, B, sbb, sbk, sbn, C, batch, M, N, K, false);
}

void rp_matmul_lower(const float* A, int64_t sab, int64_t sam, int64_t sak,
                     const float* B, int64_t sbb, int64_t sbk, int64_t sbn,
                     float* C, int64_t batch, int64_t M, int64_t N, int64_t K) {
  run_matmul(A, sab, sam, sak, B, sbb, sbk, sbn, C, batch, M, N, K, true);
}
