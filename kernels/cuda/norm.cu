// norm.cu -- RMSNorm forward and backward, contract §8 rmsnorm; every sum is the canonical
// sum of §4.2. Row sums: one warp per row (lane l takes columns l, l+32, ...; then the warp
// tree). The weight gradient sums over rows per column: a 32 x 32 block holds 32 columns x 32
// lanes, lane l takes rows l, l+32, ... in order, and the fixed tree runs in shared memory.
#include "canonical.cuh"
#include "kernels_cuda.h"

namespace rpc {
namespace {
constexpr int WARPS = 4;  // rows per block of the row kernels

__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w, float eps,
                               float inv_d, float* __restrict__ y, float* __restrict__ rstd, int64_t R,
                               int64_t D) {
  const int lane = threadIdx.x % kLanes;
  const int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / kLanes;
  if (r >= R) return;  // the whole warp leaves together
  const float* xr = x + r * D;
  const float ss = warp_csum(D, lane, [&](int64_t j) { return fmul(xr[j], xr[j]); });
  const float rs = rsqrt(fadd(fmul(ss, inv_d), eps));
  if (lane == 0) rstd[r] = rs;
  for (int64_t j = lane; j < D; j += kLanes) y[r * D + j] = fmul(fmul(xr[j], rs), w[j]);
}

__global__ void rmsnorm_backward_kernel(const float* __restrict__ gy, const float* __restrict__ x,
                                        const float* __restrict__ w, const float* __restrict__ rstd,
                                        float inv_d, float* __restrict__ gx, int64_t R, int64_t D) {
  const int lane = threadIdx.x % kLanes;
  const int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / kLanes;
  if (r >= R) return;
  const float *gr = gy + r * D, *xr = x + r * D;
  const float rs = rstd[r];
  const float dot = warp_csum(D, lane, [&](int64_t j) { return fmul(fmul(gr[j], w[j]), xr[j]); });
  float c = fmul(fmul(fmul(dot, inv_d), rs), rs);
  c = fmul(c, rs);
  for (int64_t j = lane; j < D; j += kLanes)
    gx[r * D + j] = fsub(fmul(fmul(gr[j], w[j]), rs), fmul(xr[j], c));
}

// gw[j] = csum over r of gy[r,j] * (x[r,j] * rstd[r]). threadIdx.x: column, threadIdx.y: lane.
__global__ void rmsnorm_gw_kernel(const float* __restrict__ gy, const float* __restrict__ x,
                                  const float* __restrict__ rstd, float* __restrict__ gw, int64_t R,
                                  int64_t D) {
  __shared__ float p[kLanes][kLanes + 1];
  const int col = threadIdx.x, l = threadIdx.y;
  const int64_t j = (int64_t)blockIdx.x * kLanes + col;
  float acc = 0.0f;
  if (j < D)
    for (int64_t r = l; r < R; r += kLanes) acc = fadd(acc, fmul(gy[r * D + j], fmul(x[r * D + j], rstd[r])));
  p[l][col] = acc;
  __syncthreads();
  for (int w2 = kLanes / 2; w2 >= 1; w2 >>= 1) {
    if (l < w2) p[l][col] = fadd(p[l][col], p[l + w2][col]);
    __syncthreads();
  }
  if (l == 0 && j < D) gw[j] = p[0][col];
}
}  // namespace
}  // namespace rpc

using namespace rpc;  // the launchers below name the kernels and constants above

cudaError_t rpc_rmsnorm(const float* x, const float* w, float eps, float inv_d, float* y, float* rstd,
                        int64_t R, int64_t D, cudaStream_t st) {
  if (R == 0) return cudaGetLastError();
  rmsnorm_kernel<<<row_blocks(R, WARPS), WARPS * kLanes, 0, st>>>(x, w, eps, inv_d, y, rstd, R, D);
  return cudaGetLastError();
}

cudaError_t rpc_rmsnorm_backward(const float* gy, const float* x, const float* w, const float* rstd,
                                 float inv_d, float* gx, float* gw, int64_t R, int64_t D, cudaStream_t st) {
  if (R > 0)
    rmsnorm_backward_kernel<<<row_blocks(R, WARPS), WARPS * kLanes, 0, st>>>(gy, x, w, rstd, inv_d,
                                                                                           gx, R, D);
  if (D > 0)
    rmsnorm_gw_kernel<<<row_blocks(D, kLanes), dim3(kLanes, kLanes), 0, st>>>(gy, x, rstd, gw, R, D);
  return cudaGetLastError();
}
