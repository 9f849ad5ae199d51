// loss.cu -- cross-entropy over the vocabulary with optional z-loss and its backward,
// contract §8 cross_entropy. Forward: one warp per row (canonical max and sum of §4.2 over
// the row), then one warp takes the canonical sum of the R row losses (the mean over rows is
// that sum times the host scalar 1/R). Backward: one thread per logit. The incoming gradient
// g stays on the device (no host round trip).
#include "canonical.cuh"
#include "kernels_cuda.h"

namespace rpc {
namespace {
constexpr int WARPS = 4, THREADS = 256;

__global__ void cross_entropy_rows_kernel(const float* __restrict__ z, const int64_t* __restrict__ targets,
                                          float zloss, float* __restrict__ lse, float* __restrict__ row_loss,
                                          int64_t R, int64_t V) {
  const int lane = threadIdx.x % kLanes;
  const int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / kLanes;
  if (r >= R) return;
  const float* zr = z + r * V;
  const float m = warp_cmax(V, lane, [&](int64_t j) { return zr[j]; });
  const float s = warp_csum(V, lane, [&](int64_t j) { return exp(fsub(zr[j], m)); });
  const float l = fadd(m, log(s));
  if (lane == 0) {
    lse[r] = l;
    row_loss[r] = fadd(fsub(l, zr[targets[r]]), fmul(fmul(zloss, l), l));
  }
}

__global__ void mean_kernel(const float* __restrict__ row_loss, float inv_r, float* __restrict__ loss, int64_t R) {
  const float s = warp_csum(R, threadIdx.x, [&](int64_t r) { return row_loss[r]; });
  if (threadIdx.x == 0) *loss = fmul(s, inv_r);
}

__global__ void cross_entropy_backward_kernel(const float* __restrict__ g, const float* __restrict__ z,
                                              const int64_t* __restrict__ targets, const float* __restrict__ lse,
                                              float inv_r, float two_z, float* __restrict__ gz, int64_t R,
                                              int64_t V) {
  const float gs = fmul(*g, inv_r);
  for (int64_t e = gtid(); e < R * V; e += gstride()) {
    const int64_t r = e / V, j = e % V;
    const float k = fadd(1.0f, fmul(two_z, lse[r]));
    float q = fmul(exp(fsub(z[e], lse[r])), k);
    if (j == targets[r]) q = fsub(q, 1.0f);
    gz[e] = fmul(q, gs);
  }
}
}  // namespace
}  // namespace rpc

using namespace rpc;  // the launchers below name the kernels and constants above

cudaError_t rpc_cross_entropy(const float* z, const int64_t* targets, float zloss, float inv_r, float* loss,
                              float* lse, float* row_loss, int64_t R, int64_t V, cudaStream_t st) {
  if (R > 0)
    cross_entropy_rows_kernel<<<row_blocks(R, WARPS), WARPS * kLanes, 0, st>>>(z, targets, zloss, lse,
                                                                                             row_loss, R, V);
  mean_kernel<<<1, kLanes, 0, st>>>(row_loss, inv_r, loss, R);
  return cudaGetLastError();
}

cudaError_t rpc_cross_entropy_backward(const float* g, const float* z, const int64_t* targets, const float* lse,
                                       float inv_r, float two_z, float* gz, int64_t R, int64_t V, cudaStream_t st) {
  if (R * V > 0)
    cross_entropy_backward_kernel<<<blocks_for(R * V, THREADS), THREADS, 0, st>>>(g, z, targets, lse, inv_r, two_z,
                                                                                  gz, R, V);
  return cudaGetLastError();
}
