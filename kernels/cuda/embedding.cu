// embedding.cu -- token embedding lookup and its backward, contract §8 embedding. The
// gradient row gw[v] is the sequential sum (§4.3) of the rows g[i] of the positions i holding
// token v, in increasing i: thread (row chunk, column j) owns gw[v, j] for the VC rows v of its
// chunk, zeroes them, and scans every position in order, adding g[i, j] when idx[i] falls in
// its chunk. No atomics, no sort; each output element has exactly one writer.
#include "canonical.cuh"
#include "kernels_cuda.h"

namespace rpc {
namespace {
constexpr int THREADS = 256;
constexpr int64_t VC = 64;  // rows of gw per thread (trades idx scans against parallelism)

__global__ void check_index_kernel(const int64_t* __restrict__ idx, int64_t n, int64_t hi, int* bad) {
  for (int64_t i = gtid(); i < n; i += gstride())
    if (idx[i] < 0 || idx[i] >= hi) *bad = 1;  // every writer stores the same value
}

__global__ void embedding_kernel(const float* __restrict__ w, const int64_t* __restrict__ idx,
                                 float* __restrict__ out, int64_t N, int64_t D) {
  for (int64_t e = gtid(); e < N * D; e += gstride()) out[e] = w[idx[e / D] * D + e % D];
}

__global__ void embedding_backward_kernel(const float* __restrict__ g, const int64_t* __restrict__ idx,
                                          float* __restrict__ gw, int64_t N, int64_t V, int64_t D) {
  const int64_t chunks = (V + VC - 1) / VC;
  for (int64_t e = gtid(); e < chunks * D; e += gstride()) {
    const int64_t v0 = (e / D) * VC, v1 = (v0 + VC < V) ? v0 + VC : V, j = e % D;
    for (int64_t v = v0; v < v1; ++v) gw[v * D + j] = 0.0f;
    for (int64_t i = 0; i < N; ++i) {
      const int64_t v = idx[i];
      if (v >= v0 && v < v1) gw[v * D + j] = fadd(gw[v * D + j], g[i * D + j]);
    }
  }
}
}  // namespace
}  // namespace rpc

using namespace rpc;  // the launchers below name the kernels and constants above

cudaError_t rpc_check_index(const int64_t* idx, int64_t n, int64_t hi, int* bad, int* host_bad, cudaStream_t st) {
  *host_bad = 0;
  if (n <= 0) return cudaGetLastError();
  cudaError_t err = cudaMemsetAsync(bad, 0, sizeof(int), st);
  if (err != cudaSuccess) return err;
  check_index_kernel<<<blocks_for(n, THREADS), THREADS, 0, st>>>(idx, n, hi, bad);
  err = cudaMemcpyAsync(host_bad, bad, sizeof(int), cudaMemcpyDeviceToHost, st);
  if (err != cudaSuccess) return err;
  err = cudaStreamSynchronize(st);
  return err != cudaSuccess ? err : cudaGetLastError();
}

cudaError_t rpc_embedding(const float* w, const int64_t* idx, float* out, int64_t N, int64_t D, cudaStream_t st) {
  if (N * D > 0) embedding_kernel<<<blocks_for(N * D, THREADS), THREADS, 0, st>>>(w, idx, out, N, D);
  return cudaGetLastError();
}

cudaError_t rpc_embedding_backward(const float* g, const int64_t* idx, float* gw, int64_t N, int64_t V, int64_t D,
                                   cudaStream_t st) {
  const int64_t n = (V + VC - 1) / VC * D;
  if (n > 0) embedding_backward_kernel<<<blocks_for(n, THREADS), THREADS, 0, st>>>(g, idx, gw, N, V, D);
  return cudaGetLastError();
}
