// flat_sum.cu -- clip_grad version 2 (docs/cuda-speed.md): the gradient norm's chunked sum
// (contract §4.5) in exactly version 1's order -- within chunk k of kFlatChunk terms, lane l adds
// g[i] * g[i] for i = k L + l, k L + l + 32, ... in increasing i, no padded terms, then the fixed
// tree 16, 8, 4, 2, 1 gives the chunk sum s[k]; lane k mod 32 of a second set of lanes adds
// s[0], s[1], ... in order, and the same tree over those lanes gives the sum -- and the same
// finish (clip.cuh). Version 1 (optim.cu) runs one warp per chunk, then one warp over the chunk
// sums. Here one block of 1024 threads: warps 1..31 stream the gradient with cp.async into a
// ring of STAGES staging blocks of shared memory, STAGES - 1 ahead, while warp 0 squares and
// adds block after block, so its adds wait only on each other. The trees run in shared memory
// on thread 0 (the same adds as the warp shuffles of version 1), which lets the host emulation
// (tests/cuda_emulate.cpp) run this kernel too.
#include <cuda_runtime.h>

#include "canonical.cuh"
#include "clip.cuh"
#include "cp_async.cuh"
#include "kernels_cuda.h"

namespace rpc {
namespace {
constexpr int LANES = 32;                                 // the canonical sum's lanes (§4.2)
constexpr int NTHREADS = 1024, CHUNK = 2048, STAGES = 4;  // staging blocks: 64 terms per lane; a 32 KiB ring
static_assert(CHUNK % LANES == 0, "a staging block must keep i mod 32 = the lane");
static_assert(kFlatChunk % CHUNK == 0, "a staging block must lie inside one chunk of §4.5");
constexpr int64_t PER_CHUNK = kFlatChunk / CHUNK;  // staging blocks per chunk of §4.5

// Thread 0: the tree 16, 8, 4, 2, 1 over lanes[0..31] (in place), the result in lanes[0].
__device__ __forceinline__ float tree_fold(float* lanes) {
  for (int w = LANES / 2; w >= 1; w >>= 1)
    for (int l = 0; l < w; ++l) lanes[l] = fadd(lanes[l], lanes[l + w]);  // p[l] = p[l] + p[l + w]
  return lanes[0];
}

// vec: g is 16-byte aligned (16-byte copies; else 4-byte ones). Zeros past n are never added.
__global__ void __launch_bounds__(NTHREADS, 1)
norm_stream_kernel(const float* __restrict__ g, float max_norm, float* __restrict__ norm, float* __restrict__ coef,
                   int64_t n, bool vec) {
  __shared__ __align__(16) float ring[STAGES][CHUNK];
  __shared__ float lanes[LANES];   // warp 0's partial sums of the current chunk, for thread 0's tree
  __shared__ float outer[LANES];   // thread 0 only: lane k mod 32 adds the chunk sums s[k] in order
  const int tid = threadIdx.x, warp = tid / LANES, lane = tid % LANES;
  constexpr int PRODUCERS = NTHREADS - LANES;
  const int64_t chunks = (n + CHUNK - 1) / CHUNK;  // staging blocks
  const auto issue = [&](int64_t c) {  // warps 1..31: staging block c into its stage
    float* dst = ring[c % STAGES];
    const int64_t base = c * CHUNK;
    if (vec) {
      for (int v = tid - LANES; v < CHUNK / 4; v += PRODUCERS) {
        const int64_t left = n - (base + 4 * v);
        const int nb = left <= 0 ? 0 : left >= 4 ? 4 : (int)left;
        cp_async<16>(dst + 4 * v, nb > 0 ? g + base + 4 * v : g, 4 * nb);
      }
    } else {
      for (int e = tid - LANES; e < CHUNK; e += PRODUCERS) {
        const bool in = base + e < n;
        cp_async<4>(dst + e, in ? g + base + e : g, in ? 4 : 0);
      }
    }
  };
  // Every thread commits one group per chunk slot (empty for warp 0), so all count alike.
  for (int64_t c = 0; c < STAGES - 1; ++c) {
    if (warp > 0 && c < chunks) issue(c);
    cp_async_commit();
  }
  if (tid == 0)
    for (int l = 0; l < LANES; ++l) outer[l] = 0.0f;
  float p = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) {
    cp_async_wait<STAGES - 2>();  // block c's group is done (the newest STAGES - 2 may still run)
    __syncthreads();              // ... for every thread's copies; block c - 1's stage is free; and
                                  // warp 0's lanes of a chunk that ended with block c - 1 are in lanes[]
    if (tid == 0 && c > 0 && c % PER_CHUNK == 0) {
      const int64_t k = c / PER_CHUNK - 1;  // the chunk that just ended, whole
      outer[k % LANES] = fadd(outer[k % LANES], tree_fold(lanes));
    }
    if (warp == 0) {
      const float* src = ring[c % STAGES];
      const int64_t left = n - c * CHUNK;
      const int real = left >= CHUNK ? CHUNK : (int)left;
      for (int j = lane; j < real; j += LANES) p = fadd(p, fmul(src[j], src[j]));  // i = c CHUNK + j
      if ((c + 1) % PER_CHUNK == 0 && c + 1 < chunks) {  // a chunk ends here, another follows
        lanes[lane] = p;  // thread 0 folds it after the next barrier, before any later write
        p = 0.0f;
      }
    } else if (c + STAGES - 1 < chunks) {
      issue(c + STAGES - 1);  // into block c - 1's stage
    }
    cp_async_commit();
  }
  __syncthreads();                 // thread 0 has folded a chunk that ended with the last block but one
  if (warp == 0) lanes[lane] = p;  // the last chunk (1..L terms; none when n = 0)
  __syncthreads();
  if (tid == 0) {
    if (n > 0) {
      const int64_t k = (n - 1) / kFlatChunk;
      outer[k % LANES] = fadd(outer[k % LANES], tree_fold(lanes));
    }
    clip_finish(tree_fold(outer), max_norm, norm, coef);
  }
}
}  // namespace
}  // namespace rpc

using namespace rpc;  // the launcher below names the kernel above

cudaError_t rpc_clip_grad_v(int version, const float* g, float max_norm, float* out, float* norm, float* coef,
                            float* sums, int64_t n, cudaStream_t st) {
  if (version == 1) return rpc_clip_grad(g, max_norm, out, norm, coef, sums, n, st);
  if (version != 2) return cudaErrorInvalidValue;
  const bool vec = reinterpret_cast<uintptr_t>(g) % 16 == 0;
#if defined(RPC_EMULATE)  // tests/test_cuda_emulate.py: the block's threads as host threads
  rpc_emulate(dim3(1, 1, 1), NTHREADS, [&] { norm_stream_kernel(g, max_norm, norm, coef, n, vec); });
#else
  norm_stream_kernel<<<1, NTHREADS, 0, st>>>(g, max_norm, norm, coef, n, vec);
#endif
  const cudaError_t err = cudaGetLastError();
  return err != cudaSuccess ? err : rpc_clip_apply(g, coef, out, n, st);
}
