// int8_amx.cpp -- the int8 GEMM of contract §10 on AMX-INT8 tiles (Intel Sapphire Rapids and
// later): C[i,j] = sum_k A[i,k] * B[j,k], A [M, K], B [N, K] int8, C int32, exact.
//
//   rp_amx_usable()                                  AMX-INT8 here: CPU, build and Linux permission
//   rp_amx_pack_b(B, ldb, b_next, N, K, nmat, j0, j1, out)
//                                                    rows [j0, j1) of B (nmat matrices) into the tile layout
//   rp_amx_gemm(A, lda, a_next, Bp, M, N, K, nmat, direct, finish, ctx, causal)
//                                                    the nmat GEMMs, block by finished block
//                                                    (causal: attention's, skipping its zeros)
// (kernels.h says more; int8.cpp runs one matrix, exact.cpp the eight residue GEMMs at once.)
//
// tdpbssd multiplies signed bytes by signed bytes and adds groups of four products into int32
// lanes. Every partial sum is a sum of some of the K products, so |partial| <= K * 127^2 < 2^31
// under the binding's K limit (contract §10): no intermediate value leaves int32, the sum is
// exact, and its order is free, so this GEMM gives the bits of the VNNI / vpmaddwd / smlal paths
// of int8.cpp (tests/test_int8.py compares them bit for bit on this hardware). The operands'
// +-127 limit is the contract's; the arithmetic here is exact for -128 too (16384 per product) as
// long as K * 128^2 < 2^31.
//
// The tiles: 8 registers of up to 16 rows x 64 bytes. A block of 32 x 32 outputs is 2 x 2 C tiles
// (tmm0-3, 16 x 16 int32 each), updated per 64 k by 2 A tiles (tmm4-5: 16 rows x 64 int8) and 2 B
// tiles (tmm6-7: 16 rows of 16 columns x 4 consecutive k, the "VNNI layout"). Both operands are
// laid out so that every tile load reads 1 KB of consecutive bytes (rows 64 bytes apart: no
// cache-set conflicts, whatever the operands' strides):
//   - B is packed once per call into pairs of 16-column panels: the pair of columns [32q, 32q + 32)
//     holds, per 64 k (a k-step s), the tile of its first 16 columns, then that of the other 16
//     ([16 groups of 4 k][16 columns][4] each, 2 KB per step), k padded with zeros to a multiple
//     of 64 (zeros add nothing: exact);
//   - A is copied per row block (32 rows x KC k) into the same order: per k-step its tile of rows
//     0-15, then that of rows 16-31, zero past the last row and past K; or, given with lda = 0
//     (the exact matmul's residue planes, split straight into it), A already lies in that order
//     for all of K (rp_amx_a_offset, kernels.h) and its tiles are loaded where they are.
// Buffers start on cache lines (a 64-byte tile row across two lines costs two accesses).
// Threads take disjoint blocks of outputs; each configures its tiles (ldtilecfg) per chunk of
// work and releases them after.
//
// Linux gives a process the AMX tile state only on request: arch_prctl(ARCH_REQ_XCOMP_PERM,
// XFEATURE_XTILEDATA), once per process (threads share it), done at the first call of
// rp_amx_usable(). Without AMX in the CPU, the OS or the build (non-x86, or a compiler without the
// AMX intrinsics: GCC < 11, Clang < 12), rp_amx_usable() is false and int8.cpp runs its SIMD path.
// The code is compiled with target attributes, so any x86-64 build (-march of any level) carries it.
#include "kernels.h"
#include "transpose.h"

#include <algorithm>
#include <cstring>
#include <vector>

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define RP_AMX 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(RP_AMX)
namespace {

constexpr int64_t TR = 16;   // rows of a tile
constexpr int64_t TB = 64;   // bytes of a tile row: 64 int8 k values (A), 16 columns x 4 k (B)
constexpr int64_t TILE = TR * TB;    // bytes of a tile
constexpr int64_t BM = 32, BN = 32;  // a block: 2 x 2 C tiles
// The blocking (a task: MC rows x nc columns of outputs, all of K, with several threads fewer rows
// where that leaves a thread fewer than two tasks; tasks run column-chunk by column-chunk, rows
// inner, so a thread's consecutive tasks share their B panels):
//   - a row block's A tiles (32 rows x KC k, 16 KB) are copied into tile order and stay in L1
//     while the B panels of the task's columns stream from L2;
//   - nc is chosen so that those B panels (nc columns x K, all nmat matrices) fit in half of L2
//     (kL2Bytes), so the row blocks of a chunk's tasks reuse them from L2 and B comes from memory
//     about once per call;
//   - k runs in passes of KC per row block; the partial sums of the row block (nmat x 32 x nc
//     int32) wait in a buffer between passes (tile loads and stores, L1/L2);
//   - while a row block runs, the next one's A is prefetched into L2, a slice per column block.
// Measured 2026-12-01 on this Xeon (one thread, CPU time): the 2 x 2 tile step runs at 4.9 T op/s
// with all tiles in L1, 4.6 with B streaming from L2, 3.5-3.9 with A and B both from L2, 1.2-1.4
// with B from memory; A read in place (rows lda bytes apart, 16 KB per row block spread over 32
// rows) missed L1 on set conflicts when lda is a multiple of 1 KB. KC = 256 / 1024, MC = 256 and
// kL2Bytes = 512 KB could not be told apart from these on the shared machine (2026-12-02).
constexpr int64_t KC = 512, MC = 128;
constexpr int64_t kL2Bytes = int64_t(1) << 20;

inline int64_t padded_k(int64_t K) { return std::max<int64_t>(TB, (K + TB - 1) / TB * TB); }
inline int64_t panels(int64_t N) { return (N + BN - 1) / BN * 2; }   // 16-column panels, in pairs

struct alignas(64) TileConfig {
  uint8_t palette_id = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

bool request_amx() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!((d >> 24) & 1) || !((d >> 25) & 1)) return false;            // AMX-TILE, AMX-INT8
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return false;  // OSXSAVE
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;                  // XTILECFG, XTILEDATA in XCR0
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;     // linux/asm/prctl.h
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

struct Job {
  const int8_t* A;
  int64_t lda, a_next;
  const uint8_t* Bp;   // packed B: matrix t, pair of panels (columns 32q) at Bp + (t * npanels + 2 q) * Kp * 16
  int64_t M, N, K, Kp, npanels, nc, mc;   // nc, mc: the columns and rows of a task
  int nmat;
  int32_t* direct;
  RpTileFinish finish;
  void* ctx;
  RpCausalRows causal;   // attention's products: the blocks and k-steps skipped (kernels.h)
};

// Rows [r0, r0 + mr) of A (row r at A + r * lda; mr <= 32), k in [k0, k0 + kc), into tile order
// with the two tiles of a k-step side by side: rows 16h + r' (h = 0, 1), k = k0 + 64 s + u at
// out[s * 2048 + h * 1024 + r' * 64 + u]; zero past mr rows and past K (a masked load reads no
// byte past K).
__attribute__((target("avx512f,avx512bw"))) void pack_a(const int8_t* A, int64_t lda, int64_t r0, int64_t mr,
                                                         int64_t K, int64_t k0, int64_t kc, int8_t* out) {
  for (int64_t r = 0; r < BM; ++r) {
    int8_t* o = out + (r / TR) * TILE + (r % TR) * TB;
    const int8_t* src = A + (r0 + r) * lda;
    for (int64_t s = 0; s < kc / TB; ++s) {
      const int64_t k = k0 + s * TB, n = r < mr ? std::max<int64_t>(0, std::min<int64_t>(TB, K - k)) : 0;
      const __m512i v = n == TB ? _mm512_loadu_si512(src + k)
                                : _mm512_maskz_loadu_epi8(n ? (__mmask64)(~0ull >> (64 - n)) : 0, src + k);
      _mm512_store_si512(o + s * 2 * TILE, v);
    }
  }
}

// Part `part` of `parts` of the bytes [p, p + n) into L2 (A in tile order: the next pass's tiles).
inline void prefetch_bytes(const int8_t* p, int64_t n, int64_t part, int64_t parts) {
  for (int64_t q = n / 64 * part / parts, q1 = n / 64 * (part + 1) / parts; q < q1; ++q)
    _mm_prefetch(reinterpret_cast<const char*>(p + q * 64), _MM_HINT_T1);
}

// Part `part` of `parts` of the cache lines of rows [r0, r0 + mr) x k [k0, k0 + kc) of A, into L2:
// the next row block's A, a little while each column block of this one runs, so that its packing
// does not wait on memory.
inline void prefetch_a(const int8_t* A, int64_t lda, int64_t r0, int64_t mr, int64_t k0, int64_t kc, int64_t part,
                       int64_t parts) {
  const int64_t lines = (kc + 63) / 64, total = mr * lines, q1 = total * (part + 1) / parts;
  int64_t q = total * part / parts, r = q / lines, l = q % lines;
  for (; q < q1; ++q) {
    _mm_prefetch(reinterpret_cast<const char*>(A + (r0 + r) * lda + k0 + l * 64), _MM_HINT_T1);
    if (++l == lines) l = 0, ++r;
  }
}

// kc / 64 steps of the 2 x 2 tiles into tmm0-3: A's two tiles of step s at a + s * 2048 (pack_a's
// order: rows 0-15, then 16-31), B's at b + s * 2048 (columns 0-15, then 16-31): one contiguous
// stream of 2 KB per operand and step.
__attribute__((target("amx-tile,amx-int8"))) inline void tile_steps(const int8_t* a, const uint8_t* b, int64_t steps) {
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(4, a + s * 2 * TILE, TB);
    _tile_loadd(5, a + s * 2 * TILE + TILE, TB);
    _tile_loadd(6, b + s * 2 * TILE, TB);
    _tile_loadd(7, b + s * 2 * TILE + TILE, TB);
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  }
}

__attribute__((target("amx-tile,amx-int8"))) inline void tiles_zero() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}
__attribute__((target("amx-tile,amx-int8"))) inline void tiles_load(const int32_t* c, int64_t ldc) {
  _tile_loadd(0, c, ldc * 4);
  _tile_loadd(1, c + 16, ldc * 4);
  _tile_loadd(2, c + 16 * ldc, ldc * 4);
  _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
}
__attribute__((target("amx-tile,amx-int8"))) inline void tiles_store(int32_t* c, int64_t ldc) {
  _tile_stored(0, c, ldc * 4);
  _tile_stored(1, c + 16, ldc * 4);
  _tile_stored(2, c + 16 * ldc, ldc * 4);
  _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
}

// The tasks [t0, t1) of a job (task t: rows (t % ntm) * mc .., columns (t / ntm) * nc ..). ct holds
// the task's finished (or, between passes, partial) blocks: block jb of matrix m at
// ct + (jb * nmat + m) * 1024, [32][32] int32, so that finish gets the nmat blocks of one output
// block one after the other.
__attribute__((target("amx-tile,amx-int8"))) void run_tasks(const Job& job, int64_t t0, int64_t t1) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = TR;
    cfg.colsb[t] = TB;
  }
  _tile_loadconfig(&cfg);
  const bool tiled = job.lda == 0;   // A in tile order (rp_amx_a_offset): no copy
  const int64_t M = job.M, N = job.N, Kp = job.Kp, NCT = job.nc, K = tiled ? job.K : std::min(job.K, job.lda);
  const int64_t kpass = std::min(KC, Kp), MC = job.mc, ntm = (M + MC - 1) / MC;
  // the thread's A block and partial sums, kept between calls (1-2 MB: no allocation, page faults
  // or clearing per call); every byte read is written first (pack_a, tiles_store)
  static thread_local std::vector<int8_t> apack_buf;
  static thread_local std::vector<int32_t> ct_buf;
  int8_t* apack = tiled ? nullptr : rp_aligned64(apack_buf, BM * kpass);
  int32_t* ct = rp_aligned64(ct_buf, (NCT / BN) * job.nmat * BM * BN);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t i0 = (t % ntm) * MC, mc = std::min(MC, M - i0);
    const int64_t j0 = (t / ntm) * NCT, nc = std::min(NCT, N - j0), nblk = (nc + BN - 1) / BN;
    for (int64_t ib = 0; ib < mc; ib += BM) {
      const int64_t mr = std::min(BM, mc - ib), r0 = i0 + ib;
      // the block's columns wanted, [0, jend), and the k-steps of A not zero by the form, [kbeg, kend)
      int64_t jend = N, kbeg = 0, kend = Kp;
      const RpCausalRows& cz = job.causal;
      if (cz.form == RpCausal::kScores || cz.form == RpCausal::kMix) {
        const int64_t t0 = (cz.row0 + r0) % cz.T, tl = t0 + mr <= cz.T ? t0 + mr - 1 : cz.T - 1;   // largest t
        if (cz.form == RpCausal::kScores) jend = tl + 1;
        else kend = std::min(Kp, (tl + TB) / TB * TB);   // k <= tl
      } else if (cz.form == RpCausal::kMixT && K == cz.T) {
        kbeg = (cz.row0 + r0) / TB * TB;   // rows are keys j >= row0 + r0: k = t < j is zero
      }
      for (int m = 0; m < job.nmat; ++m) {
        const int8_t* am = job.A + m * job.a_next;
        const uint8_t* bm = job.Bp + (m * job.npanels + j0 / 16) * Kp * 16;
        for (int64_t k0 = kbeg; k0 < kend; k0 += kpass) {
          const int64_t kc = std::min(kpass, kend - k0), steps = kc / TB;
          const bool first = k0 == kbeg, last = k0 + kc >= kend;
          // the A block that runs next: this rows' next pass, the next matrix, or the next rows
          const int8_t* an = am;
          int64_t nr0 = r0, nmr = mr, nk0 = k0 + kc;
          if (nk0 >= kend) {
            nk0 = 0;
            if (m + 1 < job.nmat) an = am + job.a_next;
            else nr0 = r0 + BM, nmr = std::max<int64_t>(0, std::min(BM, (t == t1 - 1 ? i0 + mc : M) - nr0)), an = job.A;
          }
          const int8_t* at = am + r0 * Kp + k0 * 32;   // tiled: this pass's tiles (32 rows x kc)
          if (!tiled) {
            pack_a(am, job.lda, r0, mr, K, k0, kc, apack);
            at = apack;
          }
          __asm__ volatile("" ::: "memory");   // GCC's tileloadd asm declares no memory input
          for (int64_t jb = 0; jb < nc; jb += BN) {
            const int64_t nr = std::min(BN, nc - jb);
            if (!tiled)
              prefetch_a(an, job.lda, nr0, nmr, nk0, std::min(kpass, K - nk0), jb / BN, nblk);
            else if (nmr > 0)
              prefetch_bytes(an + nr0 * Kp + nk0 * 32, std::min(kpass, Kp - nk0) * 32, jb / BN, nblk);
            if (j0 + jb >= jend) continue;
            int32_t* cb = ct + ((jb / BN) * job.nmat + m) * BM * BN;
            if (first) tiles_zero();
            else tiles_load(cb, BN);
            tile_steps(at, bm + jb * Kp + k0 * 32, steps);
            if (last && job.direct && mr == BM && nr == BN) {
              tiles_store(job.direct + r0 * N + j0 + jb, N);
              continue;
            }
            tiles_store(cb, BN);
            if (last && job.nmat == 1) job.finish(job.ctx, r0, mr, j0 + jb, nr, cb, BN, BM * BN);
          }
        }
      }
      if (job.nmat > 1)
        for (int64_t jb = 0; jb < nc && j0 + jb < jend; jb += BN)
          job.finish(job.ctx, r0, mr, j0 + jb, std::min(BN, nc - jb), ct + (jb / BN) * job.nmat * BM * BN, BN,
                     BM * BN);
    }
  }
  _tile_release();
}

// Panel p (columns [16p, 16p + 16)) of one matrix, k >= K zero, columns >= N zero; B: its
// column 16p (row j of B at B + (j - 16p) * ldb). The tile of k-step s (k in [64 s, 64 s + 64):
// [16 groups of 4 k][16 columns][4]) goes to out + s * 2048 (out: the panel's half of its pair,
// rp_amx_pack_b). Each 16 x 64-byte chunk (16 rows, 64 k) is a 16 x 16 transpose of 4-byte words
// in AVX-512 registers (transpose.h), the bytes past K and the rows past N loaded as zeros.
__attribute__((target("avx512f,avx512bw"))) void pack_panel(const int8_t* B, int64_t ldb, int64_t N, int64_t K,
                                                              int64_t Kp, int64_t p, uint8_t* out) {
  const int64_t rows = std::max<int64_t>(0, std::min<int64_t>(16, N - 16 * p));
  for (int64_t k0 = 0; k0 < Kp; k0 += 64) {   // the last k step's bytes past K, and rows past N, read as 0
    const __mmask64 mask = K - k0 >= 64 ? ~__mmask64(0) : (__mmask64(1) << (K - k0)) - 1;
    __m512i r[16];
    for (int n = 0; n < 16; ++n)
      r[n] = n < rows ? _mm512_maskz_loadu_epi8(mask, B + n * ldb + k0) : _mm512_setzero_si512();
    rp::transpose16(r);
    for (int g = 0; g < 16; ++g) _mm512_storeu_si512(out + (k0 / 64) * 2 * TILE + g * 64, r[g]);   // r[g]: word g of rows 0-15
  }
}

}  // namespace

bool rp_amx_usable() {
  static const bool usable = request_amx();   // once per process (thread-safe initialization)
  return usable;
}

int64_t rp_amx_packed_bytes(int64_t N, int64_t K, int nmat) { return nmat * panels(N) * padded_k(K) * 16; }

void rp_amx_pack_b(const int8_t* B, int64_t ldb, int64_t b_next, int64_t N, int64_t K, int nmat, int64_t j0,
                   int64_t j1, uint8_t* out) {
  const int64_t Kp = padded_k(K), np = panels(N), p0 = j0 / 16, p1 = j1 >= N ? np : j1 / 16, n = p1 - p0;
  rp::parallel_for(nmat * n, 2, [&](int64_t b, int64_t e) {
    for (int64_t q = b; q < e; ++q) {
      const int64_t m = q / n, p = p0 + q % n;   // panel p of matrix m: half p % 2 of pair m * np / 2 + p / 2
      pack_panel(B + m * b_next + (16 * p - j0) * ldb, ldb, N, K, Kp, p,
                 out + (m * np / 2 + p / 2) * Kp * 32 + (p % 2) * TILE);
    }
  });
}

void rp_amx_gemm(const int8_t* A, int64_t lda, int64_t a_next, const uint8_t* Bp, int64_t M, int64_t N, int64_t K,
                 int nmat, int32_t* direct, RpTileFinish finish, void* ctx,
                 RpCausalRows causal) {
  if (M == 0 || N == 0) return;
  const int64_t Kp = padded_k(K);
  // the task's columns: its B panels (nmat x nc x Kp bytes) in kL2Bytes, at least one block, at
  // most N rounded up to a block
  const int64_t nc = std::clamp<int64_t>(kL2Bytes / (nmat * Kp) / BN * BN, BN, (N + BN - 1) / BN * BN);
  // the task's rows: MC, or with several threads fewer (down to a block) until there are at least
  // two tasks per thread (the model's products with 128 rows and K = 1024 had one to three)
  int64_t mc = MC;
  const auto tasks_of = [&](int64_t rows) { return ((M + rows - 1) / rows) * ((N + nc - 1) / nc); };
  if (rp_threads() > 1)
    while (mc > BM && tasks_of(mc) < 2 * rp_threads()) mc /= 2;
  const int64_t tasks = tasks_of(mc);
  const Job job{A, lda, a_next, Bp, M, N, K, Kp, panels(N), nc, mc, nmat, nmat == 1 ? direct : nullptr, finish, ctx,
                causal};
  rp::parallel_for(tasks, 1, [&](int64_t t0, int64_t t1) { run_tasks(job, t0, t1); });
}

#else   // no AMX code in this build

bool rp_amx_usable() { return false; }
int64_t rp_amx_packed_bytes(int64_t, int64_t, int) { return 0; }
void rp_amx_pack_b(const int8_t*, int64_t, int64_t, int64_t, int64_t, int, int64_t, int64_t, uint8_t*) {}
void rp_amx_gemm(const int8_t*, int64_t, int64_t, const uint8_t*, int64_t, int64_t, int64_t, int, int32_t*, RpTileFinish,
                 void*, RpCausalRows) {}

#endif
