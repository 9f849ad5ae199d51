// int8.metal -- the quantized path on Metal, contract §10; twin of kernels/cuda/int8.cu:
//
//   rp_int8_quantize    q[r,c] = Q(x[r,c] * recip(s[r]))                     elementwise
//   rp_int8_dequantize  y[r,c] = float(q[r,c]) * s[r]                         elementwise
//   rp_int8_gemm        C32[i,j] = sum_k A[i,k] * B[j,k], exact int32
//   rp_int8_linear      Y[i,j] = float(C32[i,j]) * (sx * sw[j])
//   rp_lsq_init         s[r] = (2 * (csum_c |x[r,c]| * inv_c)) * f32(1/sqrt(127))
//   rp_lsq_gx, rp_lsq_gs  the LSQ backward: gx (STE, elementwise), gs[r] = csum_c(gxh * term) * g
//
// The GEMM: one thread per output, k in order; integer sums are exact (the caller checks
// K * 127^2 < 2^31 and that no operand holds -128), so any order gives the same bits. The
// int32 -> float conversion rounds to nearest even by canonical.h's i32_to_float (exact pieces and
// one fadd), not by Metal's (float) conversion, whose rounding mode the compiler options decide.
#pragma METAL fp contract(off)
#include "canonical.h"

constant constexpr float kInvSqrtQp = 0.08873564749956131f;  // f32(1/sqrt(127)) = 0x1.6b7612p-4 (exact)

// Q(v) of contract §10: clamp by selects, round half to even; NaN gives 0.
inline int quant(float v) {
  if (v >= 127.0f) return 127;
  if (v <= -127.0f) return -127;
  if (is_nan(v)) return 0;
  return (int)(bits(fadd(v, kMagic)) - bits(kMagic));
}

kernel void rp_int8_quantize(device const float* x, device const float* s, device char* q, constant long& n,
                             constant long& C, RP_POS) {
  for (long i = tid; i < n; i += nthreads) q[i] = (char)quant(fmul(x[i], rp_recip(s[i / C])));
}

kernel void rp_int8_dequantize(device const char* q, device const float* s, device float* y, constant long& n,
                               constant long& C, RP_POS) {
  for (long i = tid; i < n; i += nthreads) y[i] = fmul((float)q[i], s[i / C]);
}

inline int dot_i8(device const char* a, device const char* b, long K) {
  int acc = 0;
  for (long k = 0; k < K; ++k) acc += (int)a[k] * (int)b[k];
  return acc;
}

kernel void rp_int8_gemm(device const char* A, device const char* B, device int* C32, constant long& M,
                         constant long& N, constant long& K, RP_POS) {
  for (long e = tid; e < M * N; e += nthreads) C32[e] = dot_i8(A + (e / N) * K, B + (e % N) * K, K);
}

kernel void rp_int8_linear(device const char* A, device const char* B, device const float* sx, device const float* sw,
                           device float* Y, constant long& M, constant long& N, constant long& K, RP_POS) {
  for (long e = tid; e < M * N; e += nthreads) {
    const long j = e % N;
    Y[e] = fmul(i32_to_float(dot_i8(A + (e / N) * K, B + j * K, K)), fmul(sx[0], sw[j]));  // one rounding per column
  }
}

// One threadgroup of 32 per row: s[r] from the canonical sum of |x[r, :]|.
kernel void rp_lsq_init(device const float* x, device float* s, constant float& inv_c, constant long& R,
                        constant long& C, RP_POS) {
  RP_THREADGROUP float sh[kLanes];
  for (long r = gid; r < R; r += ngroups) {
    device const float* xr = x + r * C;
    float part = 0.0f;
    for (long c = lid; c < C; c += kLanes) part = fadd(part, fabs_bits(xr[c]));
    const float mean = fmul(tree_sum(sh, lid, part), inv_c);
    if (lid == 0) s[r] = fmul(fmul(2.0f, mean), kInvSqrtQp);
  }
}

kernel void rp_lsq_gx(device const float* x, device const float* s, device const float* gxh, device float* gx,
                      constant long& n, constant long& C, RP_POS) {
  for (long i = tid; i < n; i += nthreads) {
    const float v = fmul(x[i], rp_recip(s[i / C]));
    gx[i] = (v > -127.0f && v < 127.0f) ? gxh[i] : 0.0f;
  }
}

// One threadgroup of 32 per row: gs[r] = csum_c(gxh * term) * g, term = Q(v) - v inside the
// grid, Q(v) at the clip.
kernel void rp_lsq_gs(device const float* x, device const float* s, device const float* gxh, device float* gs,
                      constant float& g, constant long& R, constant long& C, RP_POS) {
  RP_THREADGROUP float sh[kLanes];
  for (long r = gid; r < R; r += ngroups) {
    const float inv = rp_recip(s[r]);
    device const float* xr = x + r * C;
    device const float* gr = gxh + r * C;
    float part = 0.0f;
    for (long c = lid; c < C; c += kLanes) {
      const float v = fmul(xr[c], inv);
      const float qf = (float)quant(v);
      part = fadd(part, fmul(gr[c], (v > -127.0f && v < 127.0f) ? fsub(qf, v) : qf));
    }
    const float sum = tree_sum(sh, lid, part);
    if (lid == 0) gs[r] = fmul(sum, g);
  }
}
