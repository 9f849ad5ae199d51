// matmul.cu -- C[b] = A[b] @ B[b] in the canonical order of contract §4.1: every C[i,j] is
// acc = +0.0; acc = acc + A[i,k]*B[k,j] for k = 0..K-1 strictly in order, by one thread.
//
// A block of 16 x 16 threads computes a 64 x 64 tile of C; each thread owns a 4 x 4 set of
// outputs (rows ty + 16r, columns tx + 16c) and keeps their accumulators in registers. k runs in
// steps of 16 through shared memory: the block stages A[tile rows, k0..k0+15] and
// B[k0..k0+15, tile cols], then every thread adds its products for k0, k0+1, ... in order to
// its own accumulators. Nothing is split along k and nothing is summed afterwards, so the
// tile sizes cannot change a bit. A and B take any strides (transposed views cost nothing);
// a 2-D operand is broadcast over the batch with batch stride 0.
#include "canonical.cuh"
#include "grid_slices.cuh"
#include "kernels_cuda.h"

namespace rpc {
namespace {
constexpr int BM = 64, BN = 64, BK = 16, TM = 4, TN = 4, THREADS = 256;

__global__ void __launch_bounds__(THREADS)
matmul_kernel(const float* __restrict__ A, int64_t sab, int64_t sam, int64_t sak,
              const float* __restrict__ B, int64_t sbb, int64_t sbk, int64_t sbn,
              float* __restrict__ C, int64_t scb, int64_t M, int64_t N, int64_t K) {
  __shared__ float As[BK][BM];  // As[k][i]
  __shared__ float Bs[BK][BN];  // Bs[k][j]
  const int64_t b = blockIdx.z, i0 = (int64_t)blockIdx.y * BM, j0 = (int64_t)blockIdx.x * BN;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  A += b * sab;
  B += b * sbb;
  float acc[TM][TN];
  for (int r = 0; r < TM; ++r)
    for (int c = 0; c < TN; ++c) acc[r][c] = 0.0f;

  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    // Stage the tiles (zeros outside the matrix); consecutive threads walk the unit stride.
    for (int e = threadIdx.x; e < BM * BK; e += THREADS) {
      const int ii = (sak == 1) ? e / BK : e % BM, kk = (sak == 1) ? e % BK : e / BM;
      const int64_t i = i0 + ii, k = k0 + kk;
      As[kk][ii] = (i < M && k < K) ? A[i * sam + k * sak] : 0.0f;
    }
    for (int e = threadIdx.x; e < BK * BN; e += THREADS) {
      const int jj = (sbn == 1) ? e % BN : e / BK, kk = (sbn == 1) ? e / BN : e % BK;
      const int64_t j = j0 + jj, k = k0 + kk;
      Bs[kk][jj] = (j < N && k < K) ? B[k * sbk + j * sbn] : 0.0f;
    }
    __syncthreads();
    const int kc = (K - k0 < BK) ? (int)(K - k0) : BK;  // only real k: no padded terms
    for (int kk = 0; kk < kc; ++kk) {
      float a[TM], bv[TN];
      for (int r = 0; r < TM; ++r) a[r] = As[kk][ty + 16 * r];
      for (int c = 0; c < TN; ++c) bv[c] = Bs[kk][tx + 16 * c];
      for (int r = 0; r < TM; ++r)
        for (int c = 0; c < TN; ++c) acc[r][c] = fadd(acc[r][c], fmul(a[r], bv[c]));
    }
    __syncthreads();
  }
  float* Cb = C + b * scb;
  for (int r = 0; r < TM; ++r)
    for (int c = 0; c < TN; ++c) {
      const int64_t i = i0 + ty + 16 * r, j = j0 + tx + 16 * c;
      if (i < M && j < N) Cb[i * N + j] = acc[r][c];
    }
}
}  // namespace
}  // namespace rpc

using namespace rpc;  // the launcher below names the kernel and constants above

cudaError_t rpc_matmul(const float* A, int64_t sab, int64_t sam, int64_t sak,
                       const float* B, int64_t sbb, int64_t sbk, int64_t sbn,
                       float* C, int64_t batch, int64_t M, int64_t N, int64_t K, cudaStream_t st) {
  if (batch == 0 || M == 0 || N == 0) return cudaGetLastError();
  const int64_t gx = (N + BN - 1) / BN;
  if (gx > 0x7FFFFFFF) return cudaErrorInvalidConfiguration;
  return for_grid_slices<BM>(batch, M, [&](int64_t b0, int64_t nb, int64_t m0, int64_t mm) {
    const dim3 grid((unsigned)gx, (unsigned)((mm + BM - 1) / BM), (unsigned)nb);
    matmul_kernel<<<grid, THREADS, 0, st>>>(A + b0 * sab + m0 * sam, sab, sam, sak, B + b0 * sbb, sbb, sbk, sbn,
                                            C + b0 * M * N + m0 * N, M * N, mm, N, K);
    return cudaGetLastError();
  });
}
