// rope.cu -- rotary position embedding, contract §8 rope: the cos/sin tables from the
// canonical log/exp/sin/cos (§5), the rotation of interleaved pairs, and its backward (the
// rotation by -angle). One thread per table entry or per pair; no reductions.
#include "canonical.cuh"
#include "kernels_cuda.h"

namespace rpc {
namespace {
constexpr int THREADS = 256;

__global__ void rope_tables_kernel(int64_t T, int64_t half, float theta, float inv_dh,
                                   float* __restrict__ cos_t, float* __restrict__ sin_t) {
  const float lt = log(theta);  // the same value in every thread
  for (int64_t e = gtid(); e < T * half; e += gstride()) {
    const int64_t t = e / half, i = e % half;
    const float f = exp(fmul((float)(-2 * i), fmul(lt, inv_dh)));
    const float a = fmul((float)t, f);
    cos_t[e] = cos(a);
    sin_t[e] = sin(a);
  }
}

// Pair e = (row r = (b * T + t) * H + h of B*T*H, index i < Dh/2); x's row at xs, y's at ys.
__global__ void rope_kernel(const float* __restrict__ x, RpRows xs, const float* __restrict__ cos_t,
                            const float* __restrict__ sin_t, float* __restrict__ y, RpRows ys, int64_t rows,
                            int64_t T, int64_t H, int64_t half, bool backward) {
  for (int64_t e = gtid(); e < rows * half; e += gstride()) {
    const int64_t r = e / half, i = e % half, b = r / (T * H), t = (r / H) % T, h = r % H;
    const float c = cos_t[t * half + i], s = sin_t[t * half + i];
    const float* xp = x + b * xs.b + t * xs.t + h * xs.h + 2 * i;
    float* yp = y + b * ys.b + t * ys.t + h * ys.h + 2 * i;
    const float x0 = xp[0], x1 = xp[1];
    if (!backward) {
      yp[0] = fsub(fmul(x0, c), fmul(x1, s));
      yp[1] = fadd(fmul(x0, s), fmul(x1, c));
    } else {
      yp[0] = fadd(fmul(x0, c), fmul(x1, s));
      yp[1] = fsub(fmul(x1, c), fmul(x0, s));
    }
  }
}
}  // namespace
}  // namespace rpc

using namespace rpc;  // the launchers below name the kernels and constants above

cudaError_t rpc_rope_tables(int64_t T, int64_t Dh, float theta, float inv_dh, float* cos_t, float* sin_t,
                            cudaStream_t st) {
  const int64_t n = T * (Dh / 2);
  if (n > 0) rope_tables_kernel<<<blocks_for(n, THREADS), THREADS, 0, st>>>(T, Dh / 2, theta, inv_dh, cos_t, sin_t);
  return cudaGetLastError();
}

cudaError_t rpc_rope(const float* x, RpRows xs, const float* cos_t, const float* sin_t, float* y, RpRows ys,
                     int64_t B, int64_t T, int64_t H, int64_t Dh, bool backward, cudaStream_t st) {
  const int64_t rows = B * T * H, n = rows * (Dh / 2);
  if (n > 0)
    rope_kernel<<<blocks_for(n, THREADS), THREADS, 0, st>>>(x, xs, cos_t, sin_t, y, ys, rows, T, H, Dh / 2,
                                                            backward);
  return cudaGetLastError();
}
