// optim.cu -- AdamW with decoupled weight decay and global-norm gradient clipping, contract §8
// adamw and clip_grad. AdamW: one thread per element, host scalars already float32. The
// gradient norm's sum of squares is the chunked sum (§4.5): one warp per chunk of kFlatChunk
// terms (the last one shorter, not padded) writes the chunk's canonical sum (§4.2, warp_csum: the
// row sum of rmsnorm and the LSQ kernels), then one warp sums the C chunk sums canonically and
// computes the clip coefficient (clip.cuh), which a third kernel applies. flat_sum.cu is
// version 2 of the norm (same bits, docs/cuda-speed.md).
#include "canonical.cuh"
#include "clip.cuh"
#include "kernels_cuda.h"

namespace rpc {
namespace {
constexpr int THREADS = 256, WARPS = 8;  // WARPS: chunks per block of the norm

__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, int64_t n, float lr, float b1, float b2, float omb1, float omb2,
                             float eps, float decay, float bc1, float bc2) {
  for (int64_t i = gtid(); i < n; i += gstride()) {
    const float gi = g[i];
    const float mi = fadd(fmul(b1, m[i]), fmul(omb1, gi));
    const float vi = fadd(fmul(b2, v[i]), fmul(omb2, fmul(gi, gi)));
    const float den = fadd(sqrt(fmul(vi, bc2)), eps);
    const float u = fmul(fmul(mi, bc1), recip(den));
    m[i] = mi;
    v[i] = vi;
    p[i] = fsub(fmul(p[i], decay), fmul(lr, u));
  }
}

// sums[c] = csum of g[i]^2 over chunk c, i in [c L, min((c + 1) L, n)): one warp per chunk.
__global__ void chunk_squares_kernel(const float* __restrict__ g, float* __restrict__ sums, int64_t chunks,
                                     int64_t n) {
  const int lane = threadIdx.x % kLanes;
  const int64_t c = (int64_t)blockIdx.x * WARPS + threadIdx.x / kLanes;
  if (c >= chunks) return;
  const float* gc = g + c * kFlatChunk;
  const int64_t len = n - c * kFlatChunk < kFlatChunk ? n - c * kFlatChunk : kFlatChunk;
  const float s = warp_csum(len, lane, [&](int64_t i) { return fmul(gc[i], gc[i]); });
  if (lane == 0) sums[c] = s;
}

// One warp: the canonical sum of the chunk sums (chunks = 0: +0.0), then norm and coefficient.
__global__ void grad_norm_kernel(const float* __restrict__ sums, float max_norm, float* __restrict__ norm,
                                 float* __restrict__ coef, int64_t chunks) {
  const float ss = warp_csum(chunks, threadIdx.x, [&](int64_t c) { return sums[c]; });
  if (threadIdx.x == 0) clip_finish(ss, max_norm, norm, coef);
}

__global__ void apply_coef_kernel(const float* __restrict__ g, const float* __restrict__ coef,
                                  float* __restrict__ out, int64_t n) {
  const float c = *coef;
  for (int64_t i = gtid(); i < n; i += gstride()) out[i] = fmul(g[i], c);
}
}  // namespace
}  // namespace rpc

using namespace rpc;  // the launchers below name the kernels and constants above

cudaError_t rpc_adamw(float* p, const float* g, float* m, float* v, int64_t n, float lr, float b1, float b2,
                      float omb1, float omb2, float eps, float decay, float bc1, float bc2, cudaStream_t st) {
  if (n > 0)
    adamw_kernel<<<blocks_for(n, THREADS), THREADS, 0, st>>>(p, g, m, v, n, lr, b1, b2, omb1, omb2, eps, decay, bc1,
                                                             bc2);
  return cudaGetLastError();
}

cudaError_t rpc_clip_apply(const float* g, const float* coef, float* out, int64_t n, cudaStream_t st) {
  if (n > 0) apply_coef_kernel<<<blocks_for(n, THREADS), THREADS, 0, st>>>(g, coef, out, n);
  return cudaGetLastError();
}

cudaError_t rpc_clip_grad(const float* g, float max_norm, float* out, float* norm, float* coef, float* sums,
                          int64_t n, cudaStream_t st) {
  const int64_t chunks = (n + kFlatChunk - 1) / kFlatChunk;
  if (chunks > 0) chunk_squares_kernel<<<row_blocks(chunks, WARPS), WARPS * kLanes, 0, st>>>(g, sums, chunks, n);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  grad_norm_kernel<<<1, kLanes, 0, st>>>(sums, max_norm, norm, coef, chunks);
  err = cudaGetLastError();
  return err != cudaSuccess ? err : rpc_clip_apply(g, coef, out, n, st);
}

#if !defined(RPC_DEV_VERSIONS)
// The launcher by version (kernels_cuda.h) where only version 1 is built: version 2 is in
// dev/cuda/ until a GPU has verified it (dev/cuda/flat_sum.cu is this function there).
cudaError_t rpc_clip_grad_v(int version, const float* g, float max_norm, float* out, float* norm, float* coef,
                            float* sums, int64_t n, cudaStream_t st) {
  if (version != 1) return cudaErrorInvalidValue;
  return rpc_clip_grad(g, max_norm, out, norm, coef, sums, n, st);
}
#endif
