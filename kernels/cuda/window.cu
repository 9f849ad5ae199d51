// window.cu -- sliding-window attention in O(T*W), contract §8 window attention, line for line
// the CPU kernels of kernels/cpu/window.cpp. Band row r is the query at position t = r % T,
// column w the key j = t - (W - 1) + w (valid when j >= 0). The three band products run one
// thread per output element, its k-ordered sum over the valid terms in the CPU's order; the
// softmax runs one warp per row, the canonical max and sum of §4.2 over the valid terms
// (term i = column w0 + i, lane l takes i = l, l + 32, ...). Invalid entries are +0.0.
#include "canonical.cuh"
#include "kernels_cuda.h"

namespace rpc {
namespace {
constexpr int THREADS = 256;
constexpr int WARPS = 4;

__device__ __forceinline__ int64_t first_valid(int64_t t, int64_t W) { return t >= W - 1 ? 0 : W - 1 - t; }

__global__ void band_scores_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ s,
                                   int64_t batch, int64_t M, int64_t T, int64_t D, int64_t W) {
  for (int64_t e = gtid(); e < batch * M * W; e += gstride()) {
    const int64_t r = e / W, w = e % W, t = r % T;
    if (w < first_valid(t, W)) {
      s[e] = 0.0f;
      continue;
    }
    const float* ar = a + r * D;
    const float* bj = b + ((r / M) * T + t - (W - 1) + w) * D;
    float acc = 0.0f;
    for (int64_t d = 0; d < D; ++d) acc = fadd(acc, fmul(ar[d], bj[d]));
    s[e] = acc;
  }
}

__global__ void band_mix_kernel(const float* __restrict__ p, const float* __restrict__ b, float* __restrict__ o,
                                int64_t batch, int64_t M, int64_t T, int64_t D, int64_t W) {
  for (int64_t e = gtid(); e < batch * M * D; e += gstride()) {
    const int64_t r = e / D, d = e % D, t = r % T;
    const float* pr = p + r * W;
    const float* bb = b + (r / M) * T * D + d;
    float acc = 0.0f;
    for (int64_t w = first_valid(t, W); w < W; ++w) acc = fadd(acc, fmul(pr[w], bb[(t - (W - 1) + w) * D]));
    o[e] = acc;
  }
}

__global__ void band_mix_t_kernel(const float* __restrict__ p, const float* __restrict__ a, float* __restrict__ o,
                                  int64_t batch, int64_t M, int64_t T, int64_t D, int64_t W) {
  const int64_t G = M / T;
  for (int64_t e = gtid(); e < batch * T * D; e += gstride()) {
    const int64_t q = e / D, d = e % D, bi = q / T, j = q % T;
    const int64_t t1 = j + W - 1 < T - 1 ? j + W - 1 : T - 1;
    float acc = 0.0f;
    for (int64_t g = 0; g < G; ++g)
      for (int64_t t = j; t <= t1; ++t) {
        const int64_t r = bi * M + g * T + t;
        acc = fadd(acc, fmul(p[r * W + (j - t + W - 1)], a[r * D + d]));
      }
    o[e] = acc;
  }
}

__global__ void window_softmax_kernel(const float* __restrict__ s, float scale, float* __restrict__ p, int64_t rows,
                                      int64_t T, int64_t W) {
  const int lane = threadIdx.x % kLanes;
  const int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / kLanes;
  if (r >= rows) return;
  const int64_t w0 = first_valid(r % T, W), n = W - w0;
  const float* sr = s + r * W + w0;
  float* pr = p + r * W;
  const float m = warp_cmax(n, lane, [&](int64_t i) { return fmul(sr[i], scale); });
  float part = 0.0f;  // this lane's partial of the canonical sum, terms in increasing i
  for (int64_t i = lane; i < n; i += kLanes) {
    const float e = exp(fsub(fmul(sr[i], scale), m));
    pr[w0 + i] = e;  // read back below by this same thread
    part = fadd(part, e);
  }
  const float inv = recip(warp_tree_sum(part));
  for (int64_t i = lane; i < n; i += kLanes) pr[w0 + i] = fmul(pr[w0 + i], inv);
  for (int64_t w = lane; w < w0; w += kLanes) pr[w] = 0.0f;
}

__global__ void window_softmax_backward_kernel(const float* __restrict__ gp, const float* __restrict__ p, float scale,
                                               float* __restrict__ gs, int64_t rows, int64_t T, int64_t W) {
  const int lane = threadIdx.x % kLanes;
  const int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / kLanes;
  if (r >= rows) return;
  const int64_t w0 = first_valid(r % T, W), n = W - w0;
  const float *pr = p + r * W + w0, *gr = gp + r * W + w0;
  float* out = gs + r * W;
  const float dot = warp_csum(n, lane, [&](int64_t i) { return fmul(pr[i], gr[i]); });
  for (int64_t i = lane; i < n; i += kLanes) out[w0 + i] = fmul(fmul(fsub(gr[i], dot), pr[i]), scale);
  for (int64_t w = lane; w < w0; w += kLanes) out[w] = 0.0f;
}
}  // namespace
}  // namespace rpc

using namespace rpc;  // the launchers below name the kernels and constants above

cudaError_t rpc_band_scores(const float* a, const float* b, float* s, int64_t batch, int64_t M, int64_t T, int64_t D,
                            int64_t W, cudaStream_t st) {
  const int64_t n = batch * M * W;
  if (n > 0) band_scores_kernel<<<blocks_for(n, THREADS), THREADS, 0, st>>>(a, b, s, batch, M, T, D, W);
  return cudaGetLastError();
}

cudaError_t rpc_band_mix(const float* p, const float* b, float* o, int64_t batch, int64_t M, int64_t T, int64_t D,
                         int64_t W, cudaStream_t st) {
  const int64_t n = batch * M * D;
  if (n > 0) band_mix_kernel<<<blocks_for(n, THREADS), THREADS, 0, st>>>(p, b, o, batch, M, T, D, W);
  return cudaGetLastError();
}

cudaError_t rpc_band_mix_t(const float* p, const float* a, float* o, int64_t batch, int64_t M, int64_t T, int64_t D,
                           int64_t W, cudaStream_t st) {
  const int64_t n = batch * T * D;
  if (n > 0) band_mix_t_kernel<<<blocks_for(n, THREADS), THREADS, 0, st>>>(p, a, o, batch, M, T, D, W);
  return cudaGetLastError();
}

cudaError_t rpc_window_softmax(const float* s, float scale, float* p, int64_t rows, int64_t T, int64_t W,
                               cudaStream_t st) {
  if (rows > 0) window_softmax_kernel<<<row_blocks(rows, WARPS), WARPS * kLanes, 0, st>>>(s, scale, p, rows, T, W);
  return cudaGetLastError();
}

cudaError_t rpc_window_softmax_backward(const float* gp, const float* p, float scale, float* gs, int64_t rows,
                                        int64_t T, int64_t W, cudaStream_t st) {
  if (rows > 0)
    window_softmax_backward_kernel<<<row_blocks(rows, WARPS), WARPS * kLanes, 0, st>>>(gp, p, scale, gs, rows, T, W);
  return cudaGetLastError();
}
