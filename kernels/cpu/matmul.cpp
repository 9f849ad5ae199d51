// matmul.cpp -- C[b] = A[b] @ B[b] with the canonical order of contract §4.1:
// every C[i,j] is acc = +0.0; acc = acc + A[i,k]*B[k,j] for k = 0..K-1 in order.
//
// Speed comes only from work across output elements: B is packed once per call into panels
// ([k-block][n-panel][kc][NR], any input strides, so transposed views cost nothing extra) that
// every thread shares; each task packs its A block, and an MR x NR register tile of accumulators
// is updated with SIMD across j. Threads take disjoint output blocks.
// Blocking over k carries the running acc through C (load, keep adding), never sums blocks.
#include "kernels.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

namespace {

using rp::vf;
using rp::VL;  // floats per vector (contract.h): 8 on x86, 4 on AArch64
// The register tile is MR rows x NR = 16 columns: MR * NV accumulators, NV vectors of B, the
// broadcast A value and a product must fit in the register file.
#if defined(__AVX512VL__)
constexpr int64_t MR = 8;  // 32 registers: 16 accumulators
constexpr const char* kPath = "x86 AVX-512VL, matmul tile 8x16 (16 accumulators), 256-bit vectors";
#elif defined(__AVX__)
constexpr int64_t MR = 6;  // 16 registers: 12 accumulators, 2 B, 1 broadcast, 1 product
constexpr const char* kPath = "x86 AVX2, matmul tile 6x16 (12 accumulators), 256-bit vectors";
#elif defined(__aarch64__)
// 32 registers, 4 floats each: 16 accumulators, 4 B, the 4 A values, products. (A 6x16 tile's
// 24 accumulators plus the 6 A values do not fit: GCC 12 spills 7-15 of them per k step.)
constexpr int64_t MR = 4;
constexpr const char* kPath = "AArch64 NEON, matmul tile 4x16 (16 accumulators), 128-bit vectors";
#else
constexpr int64_t MR = 4;
constexpr const char* kPath = "generic vectors, matmul tile 4x16";
#endif

constexpr int64_t NR = 16, NV = NR / VL;              // register tile MR x NR, NV vectors wide
constexpr int64_t KC = 256, MC = 32 * MR, NC = 16 * NR;  // cache blocks

inline vf load(const float* p) { vf v; __builtin_memcpy(&v, p, sizeof(vf)); return v; }
inline void store(float* p, vf v) { __builtin_memcpy(p, &v, sizeof(vf)); }

// acc[MR][NR] (+)= Ap[k][MR] x Bp[k][NR] over k in [0, kc); C tile has row stride ldc.
// `vector * scalar` broadcasts the scalar without arithmetic; -ffp-contract=off keeps the
// multiply and the add separate instructions. Products go through rp::mul (contract §3: the
// plain product on x86, the fix-up on AArch64, the software flush elsewhere) unless Plain,
// which the caller picks only where no product can come near 2^-126 (see plain_ok).
template <bool Plain = false>
inline void micro_kernel(int64_t kc, const float* __restrict Ap, const float* __restrict Bp,
                         float* C, int64_t ldc, bool first) {
  vf acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = first ? vf{} : load(C + i * ldc + v * VL);
  for (int64_t k = 0; k < kc; ++k) {
    vf b[NV];
    for (int v = 0; v < NV; ++v) b[v] = load(Bp + k * NR + v * VL);
    const float* a = Ap + k * MR;
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = rp::add(acc[i][v], Plain ? b[v] * a[i] : rp::mul(b[v], a[i]));
  }
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) store(C + i * ldc + v * VL, acc[i][v]);
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

// Pack rows [0, rows) x k [0, kc) of a strided matrix (element (r, k) at p[r*rs + k*ks]) into
// panels [ceil(rows/R)][kc][R], zero-padding the last panel's missing rows.
template <int64_t R>
void pack(const float* p, int64_t rs, int64_t ks, int64_t rows, int64_t kc, float* out) {
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

}  // namespace

const char* rp_cpu_path() { return kPath; }

void rp_matmul(const float* A, int64_t sab, int64_t sam, int64_t sak,
               const float* B, int64_t sbb, int64_t sbk, int64_t sbn,
               float* C, int64_t batch, int64_t M, int64_t N, int64_t K) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    std::fill(C, C + batch * M * N, 0.0f);
    return;
  }
  // Smaller blocks when the output is small, so that there are enough tasks for the threads
  // (a weight gradient with 128 rows would otherwise be one task). Bits do not change.
  int64_t mc_blk = MC, nc_blk = NC;
  auto tasks_for = [&](int64_t mc, int64_t nc) { return batch * ((M + mc - 1) / mc) * ((N + nc - 1) / nc); };
  while (tasks_for(mc_blk, nc_blk) < 8) {
    if (mc_blk > 4 * MR) mc_blk = (mc_blk / 2 + MR - 1) / MR * MR;
    else if (nc_blk > 2 * NR) nc_blk = (nc_blk / 2 + NR - 1) / NR * NR;
    else break;
  }
  const int64_t mblocks = (M + mc_blk - 1) / mc_blk, nblocks = (N + nc_blk - 1) / nc_blk;
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
      pack<NR>(B + bb * sbb + j0 * sbn + k0 * sbk, sbn, sbk, nc, kc, panel);
      if (kCheckExponents) bmin[t] = min_exponent(panel, (nc + NR - 1) / NR * NR * kc);
    }
  });

  rp::parallel_for(batch * mblocks * nblocks, 1, [&](int64_t t0, int64_t t1) {
    static thread_local std::vector<float> abuf(MC * KC);  // reused by this thread's calls
    float* apack = abuf.data();
    float edge[MR * NR];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / (mblocks * nblocks), mb = (t / nblocks) % mblocks, nb = t % nblocks;
      const int64_t i0 = mb * mc_blk, mc = std::min(mc_blk, M - i0);
      const int64_t j0 = nb * nc_blk, nc = std::min(nc_blk, N - j0);
      const float* Ab = A + b * sab;
      const float* Bb = bp + (sbb == 0 ? 0 : b) * K * Npad;
      float* Cb = C + b * M * N;
      for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = std::min(KC, K - k0);
        pack<MR>(Ab + i0 * sam + k0 * sak, sam, sak, mc, kc, apack);   // A rows
        const float* bpanels = Bb + k0 * Npad + j0 * kc;
        const bool first = (k0 == 0);
        const bool plain = kCheckExponents &&
            plain_ok(min_exponent(apack, (mc + MR - 1) / MR * MR * kc),
                     bmin[((sbb == 0 ? 0 : b) * kblocks + k0 / KC) * nblocks + nb]);
        const auto micro = [plain](int64_t kc_, const float* ap, const float* bpn, float* c, int64_t ldc, bool f) {
          if (plain) micro_kernel<true>(kc_, ap, bpn, c, ldc, f);
          else micro_kernel<false>(kc_, ap, bpn, c, ldc, f);
        };
        for (int64_t jp = 0; jp < nc; jp += NR) {
          for (int64_t ip = 0; ip < mc; ip += MR) {
            float* ct = Cb + (i0 + ip) * N + (j0 + jp);
            const int64_t mr = std::min(MR, mc - ip), nr = std::min(NR, nc - jp);
            if (mr == MR && nr == NR) {
              micro(kc, &apack[ip * kc], &bpanels[jp * kc], ct, N, first);
            } else {  // edge tile: run on a full scratch tile, copy the valid part
              for (int64_t i = 0; i < MR; ++i)
                for (int64_t j = 0; j < NR; ++j)
                  edge[i * NR + j] = (!first && i < mr && j < nr) ? ct[i * N + j] : 0.0f;
              micro(kc, &apack[ip * kc], &bpanels[jp * kc], edge, NR, first);
              for (int64_t i = 0; i < mr; ++i)
                for (int64_t j = 0; j < nr; ++j) ct[i * N + j] = edge[i * NR + j];
            }
          }
        }
      }
    }
  });
}
