// random.cu -- Philox4x32-10 streams (contract §6): raw words, uniform floats and normals.
// One thread per Philox block; the counter is (block, c1, c2, purpose) from logical indices
// only, never from thread or block ids, so any grid gives the same stream.
#include "canonical.cuh"
#include "kernels_cuda.h"

namespace rpc {
namespace {
constexpr int THREADS = 256;

__global__ void philox_kernel(uint32_t k0, uint32_t k1, uint32_t c1, uint32_t c2, uint32_t purpose,
                              uint32_t block_offset, int64_t* __restrict__ words, int64_t n) {
  for (int64_t b = gtid(); b < (n + 3) / 4; b += gstride()) {
    const Philox4 r = philox4x32_10(block_offset + (uint32_t)b, c1, c2, purpose, k0, k1);
    for (int64_t q = 0; q < 4 && 4 * b + q < n; ++q) words[4 * b + q] = (int64_t)r.w[q];
  }
}

__global__ void uniform_kernel(uint32_t k0, uint32_t k1, uint32_t c1, uint32_t c2, uint32_t purpose,
                               float* __restrict__ out, int64_t n) {
  for (int64_t b = gtid(); b < (n + 3) / 4; b += gstride()) {
    const Philox4 r = philox4x32_10((uint32_t)b, c1, c2, purpose, k0, k1);
    for (int64_t q = 0; q < 4 && 4 * b + q < n; ++q) out[4 * b + q] = uniform_from_word(r.w[q]);
  }
}

__global__ void normal_kernel(uint32_t k0, uint32_t k1, uint32_t c1, uint32_t c2, uint32_t purpose,
                              float* __restrict__ out, int64_t n) {
  for (int64_t b = gtid(); b < (n + 3) / 4; b += gstride()) {
    const Philox4 r = philox4x32_10((uint32_t)b, c1, c2, purpose, k0, k1);
    float z[4];
    normal_pair(r.w[0], r.w[1], &z[0], &z[1]);
    normal_pair(r.w[2], r.w[3], &z[2], &z[3]);
    for (int64_t q = 0; q < 4 && 4 * b + q < n; ++q) out[4 * b + q] = z[q];
  }
}
}  // namespace
}  // namespace rpc

using namespace rpc;  // the launchers below name the kernels and constants above

cudaError_t rpc_philox(uint64_t seed, uint32_t c1, uint32_t c2, uint32_t purpose, uint32_t block_offset,
                       int64_t* words, int64_t n, cudaStream_t st) {
  if (n > 0)
    philox_kernel<<<blocks_for((n + 3) / 4, THREADS), THREADS, 0, st>>>((uint32_t)seed, (uint32_t)(seed >> 32), c1, c2,
                                                                        purpose, block_offset, words, n);
  return cudaGetLastError();
}

cudaError_t rpc_uniform(uint64_t seed, uint32_t c1, uint32_t c2, uint32_t purpose, float* out, int64_t n,
                        cudaStream_t st) {
  if (n > 0)
    uniform_kernel<<<blocks_for((n + 3) / 4, THREADS), THREADS, 0, st>>>((uint32_t)seed, (uint32_t)(seed >> 32), c1,
                                                                         c2, purpose, out, n);
  return cudaGetLastError();
}

cudaError_t rpc_normal(uint64_t seed, uint32_t c1, uint32_t c2, uint32_t purpose, float* out, int64_t n,
                       cudaStream_t st) {
  if (n > 0)
    normal_kernel<<<blocks_for((n + 3) / 4, THREADS), THREADS, 0, st>>>((uint32_t)seed, (uint32_t)(seed >> 32), c1,
                                                                        c2, purpose, out, n);
  return cudaGetLastError();
}
