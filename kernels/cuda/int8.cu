// int8.cu -- the quantized path on CUDA, contract §10; the CPU twin is kernels/cpu/int8.cpp and
// every function here gives its bits:
//
//   rpc_int8_quantize    q[r,c] = Q(x[r,c] * recip(s[r]))                     elementwise
//   rpc_int8_dequantize  y[r,c] = float(q[r,c]) * s[r]                         elementwise
//   rpc_int8_gemm        C32[i,j] = sum_k A[i,k] * B[j,k], exact int32; or, with sx and sw,
//                        Y[i,j] = float(C32[i,j]) * (sx * sw[j])               (int8_linear)
//   rpc_lsq_init         s[r] = (2 * (csum_c |x[r,c]| * inv_c)) * f32(1/sqrt(127))
//   rpc_lsq_backward     gx (STE, elementwise) and gs[r] = csum_c(gxh * term) * g
//   rpc_int8_find_offgrid  whether an int8 operand holds -128 (off the grid), for the binding
//   rpc_int8_dequantize_cols  the int8_linear epilogue alone, for the cuBLASLt product (binding)
//
// The GEMM runs on the tensor cores: mma.sync m16n8k32 s8 x s8 -> s32 (sm_80 and later). Integer
// sums are exact and associative (|sum| <= K * 127^2 < 2^31 at every partial sum, checked by the
// binding), so the order the hardware adds products in cannot change a bit, unlike the float
// matmul of §4.1. A block of 8 warps computes a 128 x 128 tile of C; warp w owns rows
// 64 (w / 4) .. +63 and columns 32 (w % 4) .. +31 as 4 x 4 mma tiles of 16 x 8. k runs in steps
// of 32 through shared memory (A[tile rows, k0..k0+31] and B[tile cols, k0..k0+31], both
// K-contiguous; rows padded to 48 bytes so a warp's fragment reads hit 32 distinct banks). Rows
// and k outside the matrices are staged as zeros, which add nothing.
// Fragments (PTX ISA, mma.m16n8k32 .s8; g = lane / 4, t = lane % 4; 4 int8 per register):
//   A 16 x 32 row-major: a0 = A[g][4t..4t+3], a1 = A[g+8][4t..], a2 = A[g][16+4t..], a3 = A[g+8][16+4t..]
//   B 32 x 8 (B[k][n] = Bt[n][k]): b0 = Bt[g][4t..4t+3], b1 = Bt[g][16+4t..]
//   C 16 x 8: c0, c1 = C[g][2t], C[g][2t+1]; c2, c3 = C[g+8][2t], C[g+8][2t+1]
#include "canonical.cuh"
#include "kernels_cuda.h"

namespace rpc {
namespace {
constexpr int THREADS = 256, WARPS = THREADS / kLanes;
constexpr int BM = 128, BN = 128, BK = 32, ROW = 48;  // ROW: bytes per staged row (32 + 16 padding)
constexpr float kInvSqrtQp = 0x1.6b7612p-4f;          // f32(1/sqrt(127)), as int8.cpp

// Q(v) of contract §10: clamp by selects, round half to even; NaN gives 0.
__device__ __forceinline__ int32_t quant(float v) {
  if (v >= 127.0f) return 127;
  if (v <= -127.0f) return -127;
  if (!(v == v)) return 0;
  return (int32_t)(bits(fadd(v, kMagic)) - bits(kMagic));
}

__global__ void quantize_kernel(const float* __restrict__ x, const float* __restrict__ s,
                                int8_t* __restrict__ q, int64_t n, int64_t C) {
  for (int64_t i = gtid(); i < n; i += gstride()) q[i] = (int8_t)quant(fmul(x[i], recip(s[i / C])));
}

__global__ void dequantize_kernel(const int8_t* __restrict__ q, const float* __restrict__ s,
                                  float* __restrict__ y, int64_t n, int64_t C) {
  for (int64_t i = gtid(); i < n; i += gstride()) y[i] = fmul((float)q[i], s[i / C]);
}

__global__ void find_offgrid_kernel(const int8_t* __restrict__ p, int64_t n, int* bad) {
  for (int64_t i = gtid(); i < n; i += gstride())
    if (p[i] == -128) *bad = 1;  // every writer stores the same value
}

// Stages rows [r0, r0 + 128) x k [k0, k0 + 32) of a K-contiguous int8 matrix into tile[128][ROW]:
// thread e takes row e / 2, bytes 16 (e % 2) .. +15; zeros outside [0, rows) x [0, K). VEC: K is a
// multiple of 16 (and the base 16-byte aligned), so each 16-byte piece is whole and one load.
template <bool VEC>
__device__ __forceinline__ void stage(const int8_t* __restrict__ src, int64_t rows, int64_t K, int64_t r0,
                                      int64_t k0, int8_t (*tile)[ROW]) {
  const int rr = threadIdx.x / 2, half = threadIdx.x % 2;
  const int64_t r = r0 + rr, k = k0 + 16 * half;
  int8_t* dst = &tile[rr][16 * half];
  if (VEC) {
    int4 v = make_int4(0, 0, 0, 0);
    if (r < rows && k < K) v = *reinterpret_cast<const int4*>(src + r * K + k);
    *reinterpret_cast<int4*>(dst) = v;
  } else {
    for (int b = 0; b < 16; ++b) dst[b] = (r < rows && k + b < K) ? src[r * K + k + b] : (int8_t)0;
  }
}

__device__ __forceinline__ uint32_t word(const int8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

__device__ __forceinline__ void mma_s8(int32_t (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                       uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// C32 (sx == nullptr) or Y (float) [M, N] = A [M, K] . B [N, K]^T for rows [m0, m0 + gridDim.y 128).
template <bool VEC>
__global__ void __launch_bounds__(THREADS)
gemm_kernel(const int8_t* __restrict__ A, const int8_t* __restrict__ B, int64_t M, int64_t N, int64_t K,
            int64_t m0, const float* __restrict__ sx, const float* __restrict__ sw, int32_t* __restrict__ C32,
            float* __restrict__ Y) {
  __shared__ __align__(16) int8_t As[BM][ROW];
  __shared__ __align__(16) int8_t Bs[BN][ROW];
  const int64_t i0 = m0 + (int64_t)blockIdx.y * BM, j0 = (int64_t)blockIdx.x * BN;
  const int warp = threadIdx.x / kLanes, lane = threadIdx.x % kLanes, g = lane / 4, t = lane % 4;
  const int wm = 64 * (warp / 4), wn = 32 * (warp % 4);
  int32_t acc[4][4][4];
  for (int mi = 0; mi < 4; ++mi)
    for (int ni = 0; ni < 4; ++ni)
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0;

  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    stage<VEC>(A, M, K, i0, k0, As);
    stage<VEC>(B, N, K, j0, k0, Bs);
    __syncthreads();
    uint32_t b[4][2];
    for (int ni = 0; ni < 4; ++ni) {
      const int8_t* row = Bs[wn + 8 * ni + g];
      b[ni][0] = word(row + 4 * t);
      b[ni][1] = word(row + 16 + 4 * t);
    }
    for (int mi = 0; mi < 4; ++mi) {
      const int8_t *top = As[wm + 16 * mi + g], *bot = As[wm + 16 * mi + g + 8];
      const uint32_t a0 = word(top + 4 * t), a1 = word(bot + 4 * t), a2 = word(top + 16 + 4 * t),
                     a3 = word(bot + 16 + 4 * t);
      for (int ni = 0; ni < 4; ++ni) mma_s8(acc[mi][ni], a0, a1, a2, a3, b[ni][0], b[ni][1]);
    }
    __syncthreads();
  }

  for (int mi = 0; mi < 4; ++mi)
    for (int ni = 0; ni < 4; ++ni)
      for (int e = 0; e < 4; ++e) {
        const int64_t i = i0 + wm + 16 * mi + g + 8 * (e / 2), j = j0 + wn + 8 * ni + 2 * t + e % 2;
        if (i >= M || j >= N) continue;
        if (sx == nullptr) C32[i * N + j] = acc[mi][ni][e];
        else Y[i * N + j] = fmul((float)acc[mi][ni][e], fmul(sx[0], sw[j]));  // one rounding per column
      }
}

// gemm_kernel's epilogue over a whole int32 product: one rounding per column scale, then one multiply.
__global__ void dequantize_cols_kernel(const int32_t* __restrict__ C32, const float* __restrict__ sx,
                                       const float* __restrict__ sw, float* __restrict__ Y, int64_t n, int64_t N) {
  for (int64_t i = gtid(); i < n; i += gstride()) Y[i] = fmul((float)C32[i], fmul(sx[0], sw[i % N]));
}

// One warp per row: s[r] from the canonical sum of |x[r, :]|.
__global__ void lsq_init_kernel(const float* __restrict__ x, float* __restrict__ s, int64_t R, int64_t C,
                                float inv_c) {
  const int lane = threadIdx.x % kLanes;
  const int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / kLanes;
  if (r >= R) return;  // the whole warp leaves together
  const float* xr = x + r * C;
  const float mean = fmul(warp_csum(C, lane, [&](int64_t c) { return fabs_bits(xr[c]); }), inv_c);
  if (lane == 0) s[r] = fmul(fmul(2.0f, mean), kInvSqrtQp);
}

__global__ void lsq_gx_kernel(const float* __restrict__ x, const float* __restrict__ s,
                              const float* __restrict__ gxh, float* __restrict__ gx, int64_t n, int64_t C) {
  for (int64_t i = gtid(); i < n; i += gstride()) {
    const float v = fmul(x[i], recip(s[i / C]));
    gx[i] = (v > -127.0f && v < 127.0f) ? gxh[i] : 0.0f;
  }
}

// One warp per row: gs[r] = csum_c(gxh * term) * g, term = Q(v) - v inside the grid, Q(v) at the clip.
__global__ void lsq_gs_kernel(const float* __restrict__ x, const float* __restrict__ s,
                              const float* __restrict__ gxh, float g, float* __restrict__ gs, int64_t R,
                              int64_t C) {
  const int lane = threadIdx.x % kLanes;
  const int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / kLanes;
  if (r >= R) return;
  const float inv = recip(s[r]);
  const float *xr = x + r * C, *gr = gxh + r * C;
  const float sum = warp_csum(C, lane, [&](int64_t c) {
    const float v = fmul(xr[c], inv);
    const float qf = (float)quant(v);
    return fmul(gr[c], (v > -127.0f && v < 127.0f) ? fsub(qf, v) : qf);
  });
  if (lane == 0) gs[r] = fmul(sum, g);
}
}  // namespace
}  // namespace rpc

using namespace rpc;  // the launchers below name the kernels and constants above

cudaError_t rpc_int8_quantize(const float* x, const float* s, int8_t* q, int64_t R, int64_t C, cudaStream_t st) {
  if (R * C > 0) quantize_kernel<<<blocks_for(R * C, THREADS), THREADS, 0, st>>>(x, s, q, R * C, C);
  return cudaGetLastError();
}

cudaError_t rpc_int8_dequantize(const int8_t* q, const float* s, float* y, int64_t R, int64_t C, cudaStream_t st) {
  if (R * C > 0) dequantize_kernel<<<blocks_for(R * C, THREADS), THREADS, 0, st>>>(q, s, y, R * C, C);
  return cudaGetLastError();
}

cudaError_t rpc_int8_find_offgrid(const int8_t* p, int64_t n, int* bad, int* host_bad, cudaStream_t st) {
  *host_bad = 0;
  if (n <= 0) return cudaGetLastError();
  cudaError_t err = cudaMemsetAsync(bad, 0, sizeof(int), st);
  if (err != cudaSuccess) return err;
  find_offgrid_kernel<<<blocks_for(n, THREADS), THREADS, 0, st>>>(p, n, bad);
  err = cudaMemcpyAsync(host_bad, bad, sizeof(int), cudaMemcpyDeviceToHost, st);
  if (err != cudaSuccess) return err;
  err = cudaStreamSynchronize(st);
  return err != cudaSuccess ? err : cudaGetLastError();
}

cudaError_t rpc_int8_gemm(const int8_t* A, const int8_t* B, int64_t M, int64_t N, int64_t K, const float* sx,
                          const float* sw, int32_t* C32, float* Y, cudaStream_t st) {
  if (M == 0 || N == 0) return cudaGetLastError();
  const int64_t gx = (N + BN - 1) / BN;
  if (gx > 0x7FFFFFFF) return cudaErrorInvalidConfiguration;
  const bool vec = K % 16 == 0 && reinterpret_cast<uintptr_t>(A) % 16 == 0 && reinterpret_cast<uintptr_t>(B) % 16 == 0;
  constexpr int64_t kRowsPerLaunch = 65535 * (int64_t)BM;  // grid.y stops at 65535
  for (int64_t m0 = 0; m0 < M; m0 += kRowsPerLaunch) {
    const int64_t mm = (M - m0 < kRowsPerLaunch) ? M - m0 : kRowsPerLaunch;
    const dim3 grid((unsigned)gx, (unsigned)((mm + BM - 1) / BM));
    if (vec) gemm_kernel<true><<<grid, THREADS, 0, st>>>(A, B, M, N, K, m0, sx, sw, C32, Y);
    else gemm_kernel<false><<<grid, THREADS, 0, st>>>(A, B, M, N, K, m0, sx, sw, C32, Y);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t rpc_int8_dequantize_cols(const int32_t* C32, const float* sx, const float* sw, float* Y, int64_t M,
                                     int64_t N, cudaStream_t st) {
  if (M * N > 0) dequantize_cols_kernel<<<blocks_for(M * N, THREADS), THREADS, 0, st>>>(C32, sx, sw, Y, M * N, N);
  return cudaGetLastError();
}

cudaError_t rpc_lsq_init(const float* x, float* s, int64_t R, int64_t C, float inv_c, cudaStream_t st) {
  const unsigned blocks = row_blocks(R, WARPS);
  if (R > 0) lsq_init_kernel<<<blocks, THREADS, 0, st>>>(x, s, R, C, inv_c);
  return cudaGetLastError();
}

cudaError_t rpc_lsq_backward(const float* x, const float* s, const float* gxh, float g, float* gx, float* gs,
                             int64_t R, int64_t C, cudaStream_t st) {
  if (R * C > 0) lsq_gx_kernel<<<blocks_for(R * C, THREADS), THREADS, 0, st>>>(x, s, gxh, gx, R * C, C);
  if (R > 0) lsq_gs_kernel<<<row_blocks(R, WARPS), THREADS, 0, st>>>(x, s, gxh, g, gs, R, C);
  return cudaGetLastError();
}
