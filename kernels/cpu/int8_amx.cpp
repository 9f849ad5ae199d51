// int8_amx.cpp -- the int8 GEMM of contract §10 on AMX-INT8 tiles (Intel Sapphire Rapids and
// later): C[i,j] = sum_k A[i,k] * B[j,k], A [M, K], B [N, K] int8, C int32, exact.
//
//   rp_amx_usable()                                  AMX-INT8 here: CPU, build and Linux permission
//   rp_amx_pack_b(B, ldb, b_next, N, K, nmat, out)   B (nmat matrices) into the tile layout
//   rp_amx_gemm(A, lda, a_next, Bp, M, N, K, nmat, direct, finish, ctx)
//                                                    the nmat GEMMs, block by finished block
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
// tiles (tmm6-7: 16 rows of 16 columns x 4 consecutive k, the "VNNI layout"). A is read in place
// where its row stride is at least K rounded up to 64 and the 32 rows exist (bytes past K meet B's
// zero padding); otherwise its block is copied into a zero-padded scratch. B is packed into panels
// of 16 columns, panel[k / 4][16][4], k padded with zeros to a multiple of 64 (zeros add nothing:
// exact). Buffers start on cache lines (a 64-byte tile row across two lines costs two accesses).
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
constexpr int64_t BM = 32, BN = 32;  // a block: 2 x 2 C tiles
// A task: MC rows x NC columns of outputs, its row blocks in turn, each against the task's columns;
// k in passes of KC (one matrix only; nmat > 1 takes one pass), so that a row block's A tiles
// (32 x KC bytes) stay in L1 while the B panels come from L2. Chosen by timing 2048^3 single
// threaded (2026-12-01, this Xeon, a shared machine: +-25% between runs): KC = 512, 128 x 128
// tasks ran at 1.4-1.8 T op/s against 1.1-1.2 for one pass over K with 32 x 512 tasks.
constexpr int64_t KC = 512, MC = 128, NC = 128;

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
  const uint8_t* Bp;   // packed B: matrix t, panel p at Bp + (t * npanels + p) * Kp * 16
  int64_t M, N, K, Kp, npanels;
  int nmat;
  int32_t* direct;
  RpTileFinish finish;
  void* ctx;
};

// The tasks [t0, t1) of a job (task t: rows (t / nblocks) * MC .., columns (t % nblocks) * NC ..).
// One pass over k (the block's 2 x 2 tiles hold the sums), except with one matrix and
// Kp > KC: then passes of KC, the partial sums kept in `part` between them.
__attribute__((target("amx-tile,amx-int8"))) void run_tasks(const Job& job, int64_t t0, int64_t t1) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = TR;
    cfg.colsb[t] = TB;
  }
  _tile_loadconfig(&cfg);
  const int64_t M = job.M, N = job.N, Kp = job.Kp, lda = job.lda;
  const int64_t kpass = job.nmat == 1 ? KC : Kp, nblocks = (N + NC - 1) / NC;
  std::vector<int8_t> apad_buf;
  std::vector<int32_t> part_buf, ct_buf;
  int8_t* apad = rp_aligned64(apad_buf, BM * std::min(kpass, Kp));        // a copied A block
  int32_t* part = rp_aligned64(part_buf, Kp > kpass ? MC * NC : 0);       // partial sums between k passes
  int32_t* ct = rp_aligned64(ct_buf, job.nmat * BM * BN);                 // the finished blocks, one per matrix
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t i0 = (t / nblocks) * MC, mc = std::min(MC, M - i0);
    const int64_t j0 = (t % nblocks) * NC, nc = std::min(NC, N - j0);
    for (int64_t k0 = 0; k0 < Kp; k0 += kpass) {
      const int64_t kc = std::min(kpass, Kp - k0);
      const bool first = k0 == 0, last = k0 + kc >= Kp;
      for (int64_t ib = 0; ib < mc; ib += BM) {
        const int64_t mr = std::min(BM, mc - ib), r0 = i0 + ib;
        const bool in_place = mr == BM && lda >= Kp;   // else a zero-padded copy per matrix
        for (int64_t jb = 0; jb < nc; jb += BN) {
          const int64_t nr = std::min(BN, nc - jb), c0 = j0 + jb;
          int32_t* pt = part + ib * NC + jb;   // this block's partial sums (passes)
          for (int m = 0; m < job.nmat; ++m) {
            const int8_t* a = job.A + m * job.a_next + r0 * lda + k0;
            int64_t ld = lda;
            if (!in_place) {
              for (int64_t r = 0; r < BM; ++r) {
                int8_t* o = apad + r * kc;
                const int64_t n = r < mr ? std::max<int64_t>(0, std::min(kc, std::min(lda, job.K) - k0)) : 0;
                if (n) std::memcpy(o, a + r * lda, n);
                std::memset(o + n, 0, kc - n);
              }
              a = apad;
              ld = kc;
              __asm__ volatile("" ::: "memory");   // GCC's tileloadd asm declares no memory input
            }
            if (first) {
              _tile_zero(0);
              _tile_zero(1);
              _tile_zero(2);
              _tile_zero(3);
            } else {
              _tile_loadd(0, pt, NC * 4);
              _tile_loadd(1, pt + 16, NC * 4);
              _tile_loadd(2, pt + 16 * NC, NC * 4);
              _tile_loadd(3, pt + 16 * NC + 16, NC * 4);
            }
            const uint8_t* b0 = job.Bp + (m * job.npanels + c0 / 16) * Kp * 16 + k0 * 16;
            const uint8_t* b1 = b0 + Kp * 16;
            for (int64_t k = 0; k < kc; k += TB) {
              _tile_loadd(4, a + k, ld);
              _tile_loadd(5, a + 16 * ld + k, ld);
              _tile_loadd(6, b0 + k * 16, TB);
              _tile_loadd(7, b1 + k * 16, TB);
              _tile_dpbssd(0, 4, 6);
              _tile_dpbssd(1, 4, 7);
              _tile_dpbssd(2, 5, 6);
              _tile_dpbssd(3, 5, 7);
            }
            int32_t* out = ct + m * BM * BN;
            int64_t ldo = BN;
            if (!last) {
              out = pt;
              ldo = NC;
            } else if (job.direct && mr == BM && nr == BN) {
              out = job.direct + r0 * N + c0;
              ldo = N;
            }
            _tile_stored(0, out, ldo * 4);
            _tile_stored(1, out + 16, ldo * 4);
            _tile_stored(2, out + 16 * ldo, ldo * 4);
            _tile_stored(3, out + 16 * ldo + 16, ldo * 4);
          }
          if (last && !(job.direct && mr == BM && nr == BN)) job.finish(job.ctx, r0, mr, c0, nr, ct, BN);
        }
      }
    }
  }
  _tile_release();
}

// Rows [16p, 16p + 16) of B (row j at B + j * ldb; rows >= N zero) into panel p: [Kp / 4][16][4],
// k >= K zero. Whole 16 x 64-byte chunks (16 rows, 64 k) are a 16 x 16 transpose of 4-byte words
// in AVX-512 registers (transpose.h); the rest (the last rows or k) byte by byte.
__attribute__((target("avx512f"))) void pack_panel(const int8_t* B, int64_t ldb, int64_t N, int64_t K, int64_t Kp,
                                                   int64_t p, uint8_t* out) {
  const int64_t j0 = 16 * p, rows = std::max<int64_t>(0, std::min<int64_t>(16, N - j0));
  const int64_t kvec = rows == 16 ? K / 64 * 64 : 0;
  for (int64_t k0 = 0; k0 < kvec; k0 += 64) {
    __m512i r[16];
    for (int n = 0; n < 16; ++n) r[n] = _mm512_loadu_si512(B + (j0 + n) * ldb + k0);
    rp::transpose16(r);
    for (int g = 0; g < 16; ++g) _mm512_storeu_si512(out + (k0 / 4 + g) * 64, r[g]);   // r[g]: word g of rows 0-15
  }
  for (int64_t n = 0; n < 16; ++n) {
    uint8_t* o = out + n * 4;
    const int8_t* src = B + (j0 + n) * ldb;
    for (int64_t g = kvec / 4; g < Kp / 4; ++g)
      for (int64_t u = 0; u < 4; ++u) o[g * 64 + u] = n < rows && 4 * g + u < K ? (uint8_t)src[4 * g + u] : 0;
  }
}

}  // namespace

bool rp_amx_usable() {
  static const bool usable = request_amx();   // once per process (thread-safe initialization)
  return usable;
}

int64_t rp_amx_packed_bytes(int64_t N, int64_t K, int nmat) { return nmat * panels(N) * padded_k(K) * 16; }

void rp_amx_pack_b(const int8_t* B, int64_t ldb, int64_t b_next, int64_t N, int64_t K, int nmat, uint8_t* out) {
  const int64_t Kp = padded_k(K), np = panels(N);
  rp::parallel_for(nmat * np, 2, [&](int64_t b, int64_t e) {
    for (int64_t q = b; q < e; ++q) pack_panel(B + (q / np) * b_next, ldb, N, K, Kp, q % np, out + q * Kp * 16);
  });
}

void rp_amx_gemm(const int8_t* A, int64_t lda, int64_t a_next, const uint8_t* Bp, int64_t M, int64_t N, int64_t K,
                 int nmat, int32_t* direct, RpTileFinish finish, void* ctx) {
  if (M == 0 || N == 0) return;
  const Job job{A, lda, a_next, Bp, M, N, K, padded_k(K), panels(N), nmat, nmat == 1 ? direct : nullptr, finish, ctx};
  const int64_t tasks = ((M + MC - 1) / MC) * ((N + NC - 1) / NC);
  rp::parallel_for(tasks, 1, [&](int64_t t0, int64_t t1) { run_tasks(job, t0, t1); });
}

#else   // no AMX code in this build

bool rp_amx_usable() { return false; }
int64_t rp_amx_packed_bytes(int64_t, int64_t, int) { return 0; }
void rp_amx_pack_b(const int8_t*, int64_t, int64_t, int64_t, int64_t, int, uint8_t*) {}
void rp_amx_gemm(const int8_t*, int64_t, int64_t, const uint8_t*, int64_t, int64_t, int64_t, int, int32_t*, RpTileFinish,
                 void*) {}

#endif
