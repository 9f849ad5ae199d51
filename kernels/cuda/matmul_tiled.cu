// matmul_tiled.cu -- the numbered matmul versions 2 to 6 (docs/cuda-speed.md), and the launcher
// that picks a version: rpc_matmul_v(version, ...). Version 1 is matmul.cu (64 x 64 tiles). Version 3
// is the default: tools/matmul_versions.py verified 1-4 bit for bit on an H200 and timed 3 fastest
// over the models' products (geometric mean 15.4 TFLOP/s against version 1's 9.4; docs/cuda-speed.md).
//
// Every version computes contract §4.1 exactly: each C[i,j] is acc = +0.0; acc = acc +
// A[i,k]*B[k,j] (__fmul_rn, then __fadd_rn) for k = 0..K-1 strictly in order, by one thread that
// keeps acc in a register for the whole k loop. Tiles only decide which thread owns which outputs
// and how operands reach it, so no tile size can change a bit.
//
//   v2: a block of 16 x 16 threads computes a 128 x 128 tile of C, 8 x 8 outputs per thread.
//   v3: a block of 8 x 8 threads computes a 64 x 64 tile, 8 x 8 per thread: four times as many
//       blocks, for the model's small products (4096 x 512 x 512 is 128 tiles of 128 x 128:
//       less than one per SM on an H200).
//   v4: v2 where its 128 x 128 tiles number at least twice the GPU's SMs, v3 otherwise.
//   v5: a block of 8 x 8 threads computes a 32 x 32 tile, 4 x 4 per thread: four times v3's
//       blocks again, for the weight gradients whose output is small and K long (gy^T @ x of a
//       512 x 512 weight over 4096 tokens is 64 tiles of 64 x 64: half the H200's SMs busy).
//   v6: v3 where its 64 x 64 tiles number at least twice the GPU's SMs, v5 otherwise.
//   v5 and v6 are built only with RPC_DEV_VERSIONS (REPOPS_CUDA_DEV=1) until a GPU has verified them.
//
// k runs in steps of BK = 16 through shared memory, double buffered: while the block computes on
// one stage, cp.async (sm_80+) copies the next k step of both operands into the other. Each
// operand is staged in its own global layout, so every copy is a straight 16-byte cp.async:
//   A with unit k stride ("k-major", x @ W.T's x): As[BM][BK + 4]; the thread reads float4s along
//     k (4 k steps of one row); its rows are ty + (BM / TM) r (r = 0..TM-1), so the 8 threads of a
//     quarter warp hit distinct bank groups (row pitch 20 floats);
//   otherwise ("m-major", gy.T @ x's gy.T): As[BK][BM + 4]; the thread reads float4s along m;
//     its rows are 4 ty + (r % 4) + BM/2 (r / 4) (two float4s per k step; one with TM = 4).
//   B the same way with n for m ("k-major" B is W.T of x @ W.T, "n-major" B is W of gy @ W).
// Out-of-matrix rows, columns and k (edge tiles) are zero-filled by cp.async's src-size operand,
// per 16-byte piece: edge tiles take the same path as interior ones. Rows and columns outside the
// matrix are never stored, and zero-filled k are never added: +0.0 would turn an acc of -0.0 into
// +0.0, and acc can be -0.0 under FTZ (a tiny negative sum flushes to -0.0; the host emulation,
// tests/test_cuda_emulate.py, fails a version that adds them). The 16-byte path needs the unit
// stride, the other stride a multiple of 4 floats and a 16-byte aligned base; any other operand
// (odd leading dimension, a step-2 slice) is staged with 4-byte cp.async per element, with the
// same layout and the same compute loop.
//
// The file also builds as host C++ with RPC_EMULATE (tests/test_cuda_emulate.py): every CUDA
// thread of a block becomes a host thread, __syncthreads a barrier, cp.async a zero-filling copy
// made at once or only at the wait that covers it, so the tiling, staging, pipelining and edge
// handling are checked bit for bit against the CPU kernel where no GPU is. Only the branches
// marked RPC_EMULATE differ from the device build.
#include <cuda_runtime.h>

#include "canonical.cuh"
#include "cp_async.cuh"
#include "grid_slices.cuh"
#include "kernels_cuda.h"

namespace rpc {
namespace {
constexpr int BK = 16, PAD = 4;  // k per stage; row padding (floats) of the staged tiles

// One operand's tile of ROWS (m or n) x BK (k) for rows [r0, r0 + ROWS), k [k0, k0 + BK), staged
// k-major (KMAJ: T[row][k], pitch BK + PAD) or row-major in k (T[k][row], pitch ROWS + PAD).
// Global element (row, k) is at P[row * s_row + k * s_k]; `rows` and K bound it. Each thread
// reads TM (8 or 4) rows of it.
template <int ROWS, bool KMAJ, int THREADS, int TM>
struct Tile {
  static constexpr int PITCH = KMAJ ? BK + PAD : ROWS + PAD;
  static constexpr int SIZE = KMAJ ? ROWS * PITCH : BK * PITCH;  // floats per stage
  static constexpr int VECS = ROWS * BK / 4 / THREADS;            // 16-byte pieces per thread
  static constexpr int ELEMS = ROWS * BK / THREADS;               // 4-byte elements per thread
  static_assert(ROWS * BK % (4 * THREADS) == 0, "tile must split evenly into 16-byte pieces");
  static_assert(TM == 8 || TM == 4, "a thread reads 8 or 4 rows");

  // The row index (within the tile) of the thread's q-th row, q = 0..TM-1, t its thread row/column.
  __device__ static __forceinline__ int row(int t, int q) {
    return KMAJ ? t + (ROWS / TM) * q : 4 * t + (q % 4) + (ROWS / 2) * (q / 4);
  }

  __device__ static __forceinline__ void load(float* T, const float* __restrict__ P, int64_t s_row, int64_t s_k,
                                              int64_t rows, int64_t K, int64_t r0, int64_t k0, bool vec) {
    const int tid = threadIdx.x;
    if (vec) {
      for (int q = 0; q < VECS; ++q) {
        const int v = tid + THREADS * q;
        // KMAJ: 4 pieces along k per row; else ROWS / 4 pieces along the row per k
        const int rr = KMAJ ? v / (BK / 4) : 4 * (v % (ROWS / 4));
        const int kk = KMAJ ? 4 * (v % (BK / 4)) : v / (ROWS / 4);
        const int64_t r = r0 + rr, k = k0 + kk;
        const int64_t left = KMAJ ? (r < rows ? K - k : 0) : (k < K ? rows - r : 0);
        const int n = left <= 0 ? 0 : left >= 4 ? 4 : (int)left;
        const float* src = n > 0 ? P + r * s_row + k * s_k : P;
        cp_async<16>(T + (KMAJ ? rr * PITCH + kk : kk * PITCH + rr), src, 4 * n);
      }
    } else {
      for (int q = 0; q < ELEMS; ++q) {
        const int e = tid + THREADS * q;
        // consecutive threads walk the operand's unit-stride dimension where it has one
        const int rr = KMAJ ? e / BK : e % ROWS, kk = KMAJ ? e % BK : e / ROWS;
        const int64_t r = r0 + rr, k = k0 + kk;
        const bool in = r < rows && k < K;
        cp_async<4>(T + (KMAJ ? rr * PITCH + kk : kk * PITCH + rr), in ? P + r * s_row + k * s_k : P, in ? 4 : 0);
      }
    }
  }

  // f[q][j] = the thread's q-th row at k = k4 + j (j = 0..3) from stage T.
  __device__ static __forceinline__ void frag(const float* T, int t, int k4, float (&f)[TM][4]) {
    if (KMAJ) {
      for (int q = 0; q < TM; ++q) {
        const float4 v = *reinterpret_cast<const float4*>(T + row(t, q) * PITCH + k4);
        f[q][0] = v.x, f[q][1] = v.y, f[q][2] = v.z, f[q][3] = v.w;
      }
    } else {
      for (int j = 0; j < 4; ++j) {
        const float4 lo = *reinterpret_cast<const float4*>(T + (k4 + j) * PITCH + 4 * t);
        f[0][j] = lo.x, f[1][j] = lo.y, f[2][j] = lo.z, f[3][j] = lo.w;
        if constexpr (TM == 8) {   // rows ROWS/2 + 4t .. +3: the second half of the tile
          const float4 hi = *reinterpret_cast<const float4*>(T + (k4 + j) * PITCH + ROWS / 2 + 4 * t);
          f[4][j] = hi.x, f[5][j] = hi.y, f[6][j] = hi.z, f[7][j] = hi.w;
        }
      }
    }
  }
};

// C [M, N] (+ batch * scb) for rows [m0, m0 + gridDim.y BM) = A . B; thread (ty, tx) = (tid / TX,
// tid % TX) owns rows TA::row(ty, r) and columns TB::row(tx, c), r, c = 0..TM-1.
template <int BM, int BN, int TM, bool A_KMAJ, bool B_KMAJ>
__global__ void __launch_bounds__((BM / TM) * (BN / TM), 1)
tiled_kernel(const float* __restrict__ A, int64_t sab, int64_t sam, int64_t sak, const float* __restrict__ B,
             int64_t sbb, int64_t sbk, int64_t sbn, float* __restrict__ C, int64_t scb, int64_t M, int64_t N,
             int64_t K, bool a_vec, bool b_vec) {
  constexpr int TX = BN / TM, THREADS = (BM / TM) * (BN / TM);
  using TA = Tile<BM, A_KMAJ, THREADS, TM>;
  using TB = Tile<BN, B_KMAJ, THREADS, TM>;
  __shared__ __align__(16) float As[2][TA::SIZE];
  __shared__ __align__(16) float Bs[2][TB::SIZE];
  const int64_t b = blockIdx.z, i0 = (int64_t)blockIdx.y * BM, j0 = (int64_t)blockIdx.x * BN;
  const int ty = threadIdx.x / TX, tx = threadIdx.x % TX;
  A += b * sab;
  B += b * sbb;
  float acc[TM][TM];
  for (int r = 0; r < TM; ++r)
    for (int c = 0; c < TM; ++c) acc[r][c] = 0.0f;

  const int64_t steps = (K + BK - 1) / BK;
  if (steps > 0) {
    TA::load(As[0], A, sam, sak, M, K, i0, 0, a_vec);
    TB::load(Bs[0], B, sbn, sbk, N, K, j0, 0, b_vec);
    cp_async_commit();
  }
  for (int64_t s = 0; s < steps; ++s) {
    const int cur = (int)(s & 1);
    if (s + 1 < steps) {  // the next k step into the other stage, while this one is computed
      TA::load(As[cur ^ 1], A, sam, sak, M, K, i0, (s + 1) * BK, a_vec);
      TB::load(Bs[cur ^ 1], B, sbn, sbk, N, K, j0, (s + 1) * BK, b_vec);
      cp_async_commit();
      cp_async_wait<1>();  // this stage's copies are done (the newest group may still run)
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int kc = K - s * BK < BK ? (int)(K - s * BK) : BK;  // real k in this stage
    for (int k4 = 0; k4 < kc; k4 += 4) {
      float a[TM][4], bv[TM][4];
      TA::frag(As[cur], ty, k4, a);
      TB::frag(Bs[cur], tx, k4, bv);
      const int jn = kc - k4;  // real k from k4 on: the last group of the matrix may have fewer than 4
      for (int j = 0; j < 4; ++j)  // k = s BK + k4 + j, in increasing order
        if (j < jn)                // never a zero-filled k (see the top of the file)
          for (int r = 0; r < TM; ++r)
            for (int c = 0; c < TM; ++c) acc[r][c] = fadd(acc[r][c], fmul(a[r][j], bv[c][j]));
    }
    __syncthreads();  // every thread is done with this stage before it is refilled
  }
  float* Cb = C + b * scb;
  for (int r = 0; r < TM; ++r)
    for (int c = 0; c < TM; ++c) {
      const int64_t i = i0 + TA::row(ty, r), j = j0 + TB::row(tx, c);
      if (i < M && j < N) Cb[i * N + j] = acc[r][c];
    }
}

bool aligned16(const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int BM, int BN, int TM, bool A_KMAJ, bool B_KMAJ>
cudaError_t launch(const float* A, int64_t sab, int64_t sam, int64_t sak, const float* B, int64_t sbb, int64_t sbk,
                   int64_t sbn, float* C, int64_t batch, int64_t M, int64_t N, int64_t K, bool a_vec, bool b_vec,
                   cudaStream_t st) {
  constexpr int THREADS = (BM / TM) * (BN / TM);
  const int64_t gx = (N + BN - 1) / BN;
  if (gx > 0x7FFFFFFF) return cudaErrorInvalidConfiguration;
  return for_grid_slices<BM>(batch, M, [&](int64_t b0, int64_t nb, int64_t m0, int64_t mm) {
    const dim3 grid((unsigned)gx, (unsigned)((mm + BM - 1) / BM), (unsigned)nb);
    const float *Ab = A + b0 * sab + m0 * sam, *Bb = B + b0 * sbb;
    float* Cb = C + b0 * M * N + m0 * N;
#if defined(RPC_EMULATE)  // tests/test_cuda_emulate.py: the block's threads as host threads
    (void)st;
    rpc_emulate(grid, THREADS, [&] {
      tiled_kernel<BM, BN, TM, A_KMAJ, B_KMAJ>(Ab, sab, sam, sak, Bb, sbb, sbk, sbn, Cb, M * N, mm, N, K, a_vec, b_vec);
    });
#else
    tiled_kernel<BM, BN, TM, A_KMAJ, B_KMAJ><<<grid, THREADS, 0, st>>>(Ab, sab, sam, sak, Bb, sbb, sbk, sbn, Cb, M * N,
                                                                       mm, N, K, a_vec, b_vec);
#endif
    return cudaGetLastError();
  });
}

// Picks the staging layout of each operand from its strides (k-major where k has unit stride)
// and whether 16-byte copies are possible (see the top of the file).
template <int BM, int BN, int TM>
cudaError_t tiled(const float* A, int64_t sab, int64_t sam, int64_t sak, const float* B, int64_t sbb, int64_t sbk,
                  int64_t sbn, float* C, int64_t batch, int64_t M, int64_t N, int64_t K, cudaStream_t st) {
  const bool a_k = sak == 1, b_k = sbk == 1;
  const bool a_vec = aligned16(A) && sab % 4 == 0 && (a_k ? sam % 4 == 0 : sam == 1 && sak % 4 == 0);
  const bool b_vec = aligned16(B) && sbb % 4 == 0 && (b_k ? sbn % 4 == 0 : sbn == 1 && sbk % 4 == 0);
  if (a_k && b_k) return launch<BM, BN, TM, true, true>(A, sab, sam, sak, B, sbb, sbk, sbn, C, batch, M, N, K, a_vec, b_vec, st);
  if (a_k) return launch<BM, BN, TM, true, false>(A, sab, sam, sak, B, sbb, sbk, sbn, C, batch, M, N, K, a_vec, b_vec, st);
  if (b_k) return launch<BM, BN, TM, false, true>(A, sab, sam, sak, B, sbb, sbk, sbn, C, batch, M, N, K, a_vec, b_vec, st);
  return launch<BM, BN, TM, false, false>(A, sab, sam, sak, B, sbb, sbk, sbn, C, batch, M, N, K, a_vec, b_vec, st);
}
}  // namespace
}  // namespace rpc

using namespace rpc;  // the launcher below names the templates above

// Versions 5 and 6 are built only with RPC_DEV_VERSIONS (REPOPS_CUDA_DEV=1) until a GPU has verified them.
#if defined(RPC_DEV_VERSIONS)
constexpr int kMatmulVersionsBuilt = 6;
#else
constexpr int kMatmulVersionsBuilt = 4;
#endif

cudaError_t rpc_matmul_v(int version, const float* A, int64_t sab, int64_t sam, int64_t sak, const float* B,
                         int64_t sbb, int64_t sbk, int64_t sbn, float* C, int64_t batch, int64_t M, int64_t N,
                         int64_t K, cudaStream_t st) {
  if (version == 1) return rpc_matmul(A, sab, sam, sak, B, sbb, sbk, sbn, C, batch, M, N, K, st);
  if (version < 2 || version > kMatmulVersionsBuilt) return cudaErrorInvalidValue;
  if (batch == 0 || M == 0 || N == 0) return cudaGetLastError();
  if (version == 4 || version == 6) {  // by size: the larger tiles where they fill every SM at least twice
    int dev = 0, sms = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (err != cudaSuccess) return err;
    const int64_t big = version == 4 ? 128 : 64;   // 4: version 2, else 3; 6: version 3, else 5
    const bool fill = batch * ((M + big - 1) / big) * ((N + big - 1) / big) >= 2 * (int64_t)sms;
    version = version == 4 ? (fill ? 2 : 3) : (fill ? 3 : 5);
  }
  if (version == 2) return tiled<128, 128, 8>(A, sab, sam, sak, B, sbb, sbk, sbn, C, batch, M, N, K, st);
#if defined(RPC_DEV_VERSIONS)
  if (version == 5) return tiled<32, 32, 4>(A, sab, sam, sak, B, sbb, sbk, sbn, C, batch, M, N, K, st);
#endif
  return tiled<64, 64, 8>(A, sab, sam, sak, B, sbb, sbk, sbn, C, batch, M, N, K, st);
}
