// int8_pv.cu -- int8 P·V inside attention on CUDA (contract §10 "int8 P·V"), line for line the
// CPU kernels of kernels/cpu/int8_pv.cpp. The step rule runs one warp per row (the canonical
// max of §4.2); the band mix one thread per output element, its int32 sum exact (so any order).
// The full layers' P·V is int8.cu's int8 linear.
#include "canonical.cuh"
#include "kernels_cuda.h"

namespace rpc {
namespace {
constexpr int THREADS = 256;
constexpr int WARPS = 4;

__global__ void absmax_step_kernel(const float* __restrict__ x, float* __restrict__ s, int64_t R, int64_t C) {
  const int lane = threadIdx.x % kLanes;
  const int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / kLanes;
  if (r >= R) return;
  const float* xr = x + r * C;
  const float m = warp_cmax(C, lane, [&](int64_t c) { return fabs_bits(xr[c]); });
  const float st = fmul(m, recip(127.0f));
  if (lane == 0) s[r] = st > 0.0f ? st : 1.0f;  // an all-zero (or flushed) block: step 1.0
}

__global__ void band_mix_kernel(const int8_t* __restrict__ qp, const int8_t* __restrict__ qv,
                                const float* __restrict__ sp, const float* __restrict__ sv, float* __restrict__ o,
                                int64_t batch, int64_t M, int64_t T, int64_t D, int64_t W) {
  for (int64_t e = gtid(); e < batch * M * D; e += gstride()) {
    const int64_t r = e / D, d = e % D, t = r % T;
    const int64_t w0 = t >= W - 1 ? 0 : W - 1 - t;
    const int8_t* pr = qp + r * W;
    const int8_t* vb = qv + (r / M) * T * D + d;
    int32_t acc = 0;
    for (int64_t w = w0; w < W; ++w) acc += (int32_t)pr[w] * (int32_t)vb[(t - (W - 1) + w) * D];
    o[e] = fmul((float)acc, fmul(sv[r / M], sp[r]));
  }
}
}  // namespace
}  // namespace rpc

using namespace rpc;  // the launchers below name the kernels and constants above

cudaError_t rpc_int8_absmax_step(const float* x, float* s, int64_t R, int64_t C, cudaStream_t st) {
  if (R > 0) absmax_step_kernel<<<row_blocks(R, WARPS), WARPS * kLanes, 0, st>>>(x, s, R, C);
  return cudaGetLastError();
}

cudaError_t rpc_int8_band_mix(const int8_t* qp, const int8_t* qv, const float* sp, const float* sv, float* o,
                              int64_t batch, int64_t M, int64_t T, int64_t D, int64_t W, cudaStream_t st) {
  const int64_t n = batch * M * D;
  if (n > 0) band_mix_kernel<<<blocks_for(n, THREADS), THREADS, 0, st>>>(qp, qv, sp, sv, o, batch, M, T, D, W);
  return cudaGetLastError();
}
