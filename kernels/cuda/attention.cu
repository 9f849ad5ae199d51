// attention.cu -- causal softmax over attention scores and its backward, contract §8
// causal_softmax: row t of each [T, T] matrix uses columns j <= t; its max and sum are the
// canonical max and sum of §4.2, one warp per row (lane l takes columns l, l+32, ... in order,
// then the warp tree). Masked entries (j > t) are +0.0 and never read.
#include "canonical.cuh"
#include "kernels_cuda.h"

namespace rpc {
namespace {
constexpr int WARPS = 4;

__global__ void causal_softmax_kernel(const float* __restrict__ s, float scale, float* __restrict__ p,
                                      int64_t rows, int64_t T) {
  const int lane = threadIdx.x % kLanes;
  const int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / kLanes;
  if (r >= rows) return;
  const int64_t n = r % T + 1;
  const float* sr = s + r * T;
  float* pr = p + r * T;
  const float m = warp_cmax(n, lane, [&](int64_t j) { return fmul(sr[j], scale); });
  float part = 0.0f;  // this lane's partial of the canonical sum, terms in increasing j
  for (int64_t j = lane; j < n; j += kLanes) {
    const float e = exp(fsub(fmul(sr[j], scale), m));
    pr[j] = e;  // read back below by this same thread
    part = fadd(part, e);
  }
  const float inv = recip(warp_tree_sum(part));
  for (int64_t j = lane; j < n; j += kLanes) pr[j] = fmul(pr[j], inv);
  for (int64_t j = n + lane; j < T; j += kLanes) pr[j] = 0.0f;
}

__global__ void causal_softmax_backward_kernel(const float* __restrict__ gp, const float* __restrict__ p,
                                               float scale, float* __restrict__ gs, int64_t rows, int64_t T) {
  const int lane = threadIdx.x % kLanes;
  const int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / kLanes;
  if (r >= rows) return;
  const int64_t n = r % T + 1;
  const float *pr = p + r * T, *gr = gp + r * T;
  float* out = gs + r * T;
  const float dot = warp_csum(n, lane, [&](int64_t j) { return fmul(pr[j], gr[j]); });
  for (int64_t j = lane; j < n; j += kLanes) out[j] = fmul(fmul(fsub(gr[j], dot), pr[j]), scale);
  for (int64_t j = n + lane; j < T; j += kLanes) out[j] = 0.0f;
}
}  // namespace
}  // namespace rpc

using namespace rpc;  // the launchers below name the kernels and constants above

cudaError_t rpc_causal_softmax(const float* s, float scale, float* p, int64_t BH, int64_t T, cudaStream_t st) {
  const int64_t rows = BH * T;
  if (rows > 0) causal_softmax_kernel<<<row_blocks(rows, WARPS), WARPS * kLanes, 0, st>>>(s, scale, p, rows, T);
  return cudaGetLastError();
}

cudaError_t rpc_causal_softmax_backward(const float* gp, const float* p, float scale, float* gs, int64_t BH,
                                        int64_t T, cudaStream_t st) {
  const int64_t rows = BH * T;
  if (rows > 0)
    causal_softmax_backward_kernel<<<row_blocks(rows, WARPS), WARPS * kLanes, 0, st>>>(gp, p, scale,
                                                                                                     gs, rows, T);
  return cudaGetLastError();
}
