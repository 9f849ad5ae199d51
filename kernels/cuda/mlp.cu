// mlp.cu -- the SwiGLU gate of the MLP and its backward, contract §8 swiglu:
// out = (a * sigmoid(a)) * b for u = [gate a | up b]; one thread per output element.
#include "canonical.cuh"
#include "kernels_cuda.h"

namespace rpc {
namespace {
constexpr int THREADS = 256;

__global__ void swiglu_kernel(const float* __restrict__ u, float* __restrict__ out, int64_t R, int64_t H) {
  for (int64_t e = gtid(); e < R * H; e += gstride()) {
    const int64_t r = e / H, j = e % H;
    const float a = u[r * 2 * H + j], b = u[r * 2 * H + H + j];
    const float sg = sigmoid(a);
    out[e] = fmul(fmul(a, sg), b);
  }
}

__global__ void swiglu_backward_kernel(const float* __restrict__ g, const float* __restrict__ u,
                                       float* __restrict__ gu, int64_t R, int64_t H) {
  for (int64_t e = gtid(); e < R * H; e += gstride()) {
    const int64_t r = e / H, j = e % H;
    const float a = u[r * 2 * H + j], b = u[r * 2 * H + H + j], ge = g[e];
    const float sg = sigmoid(a);
    const float sa = fmul(a, sg);
    gu[r * 2 * H + H + j] = fmul(ge, sa);
    gu[r * 2 * H + j] = fmul(fmul(ge, b), fmul(sg, fadd(1.0f, fmul(a, fsub(1.0f, sg)))));
  }
}
}  // namespace
}  // namespace rpc

using namespace rpc;  // the launchers below name the kernels and constants above

cudaError_t rpc_swiglu(const float* u, float* out, int64_t R, int64_t H, cudaStream_t st) {
  if (R * H > 0) swiglu_kernel<<<blocks_for(R * H, THREADS), THREADS, 0, st>>>(u, out, R, H);
  return cudaGetLastError();
}

cudaError_t rpc_swiglu_backward(const float* g, const float* u, float* gu, int64_t R, int64_t H, cudaStream_t st) {
  if (R * H > 0) swiglu_backward_kernel<<<blocks_for(R * H, THREADS), THREADS, 0, st>>>(g, u, gu, R, H);
  return cudaGetLastError();
}
