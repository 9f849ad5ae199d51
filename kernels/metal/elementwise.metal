// elementwise.metal -- elementwise ops (contract §8 add/mul/scale/dropout), the canonical
// functions of §5 (and the derived sigmoid and GELU forms) applied to tensors, the canonical row
// sum (§4.2, one threadgroup of 32 per row) and the build canary (§2, §3); the Metal twin of
// kernels/cuda/elementwise.cu.
// Elementwise kernels are grid-stride loops (any grid gives the same bits); dropout runs one
// thread per Philox block (§6), counter (block, c1, c2, DROPOUT) from the element index only.
#pragma METAL fp contract(off)
#include "canonical.h"

// fn: which §5 function (RpFn of kernels/common/ids.h: Exp 0, Log 1, Recip 2, Rsqrt 3, Sqrt 4,
// Sin 5, Cos 6, Tanh 7, Erf 8, Sigmoid 9, Gelu 10, GeluTanh 11, GeluGrad 12, GeluTanhGrad 13).
kernel void rp_unary(device const float* x, device float* y, constant long& n, constant long& fn, RP_POS) {
  for (long i = tid; i < n; i += nthreads) {
    const float v = x[i];
    float r;
    switch (fn) {
      case 0: r = rp_exp(v); break;
      case 1: r = rp_log(v); break;
      case 2: r = rp_recip(v); break;
      case 3: r = rp_rsqrt(v); break;
      case 4: r = rp_sqrt(v); break;
      case 5: r = rp_sin(v); break;
      case 6: r = rp_cos(v); break;
      case 7: r = rp_tanh(v); break;
      case 8: r = rp_erf(v); break;
      case 9: r = rp_sigmoid(v); break;
      case 10: r = rp_gelu(v); break;
      case 11: r = rp_gelu_tanh(v); break;
      case 12: r = rp_gelu_grad(v); break;
      default: r = rp_gelu_tanh_grad(v); break;
    }
    y[i] = r;
  }
}

kernel void rp_add(device const float* a, device const float* b, device float* y, constant long& n, RP_POS) {
  for (long i = tid; i < n; i += nthreads) y[i] = fadd(a[i], b[i]);
}
kernel void rp_mul(device const float* a, device const float* b, device float* y, constant long& n, RP_POS) {
  for (long i = tid; i < n; i += nthreads) y[i] = fmul(a[i], b[i]);
}
kernel void rp_scale(device const float* a, device float* y, constant float& s, constant long& n, RP_POS) {
  for (long i = tid; i < n; i += nthreads) y[i] = fmul(a[i], s);
}

// x [rows, n] -> y [rows]: one threadgroup of 32 per row (groups stride over the rows).
kernel void rp_csum_rows(device const float* x, device float* y, constant long& rows, constant long& n, RP_POS) {
  RP_THREADGROUP float p[kLanes];
  for (long r = gid; r < rows; r += ngroups) {
    device const float* xr = x + r * n;
    float part = 0.0f;
    for (long i = lid; i < n; i += kLanes) part = fadd(part, xr[i]);
    const float s = tree_sum(p, lid, part);
    if (lid == 0) y[r] = s;
  }
}

// Element i keeps iff word (i mod 4) of Philox block i/4 is below threshold. k0, k1: the seed's
// low and high words; threshold, c1, c2: uint32 values passed as long.
kernel void rp_dropout(device const float* x, device float* y, constant long& n, constant long& threshold,
                       constant float& scale, constant long& k0, constant long& k1, constant long& c1,
                       constant long& c2, RP_POS) {
  for (long b = tid; b < (n + 3) / 4; b += nthreads) {
    const Philox4 r = philox4x32_10((uint)b, (uint)c1, (uint)c2, 2u, (uint)k0, (uint)k1);  // 2: DROPOUT
    for (long q = 0; q < 4 && 4 * b + q < n; ++q) {
      const long i = 4 * b + q;
      y[i] = fmul(x[i], r.w[q] < (uint)threshold ? scale : 0.0f);
    }
  }
}

// out[0] = a*b + c with the plain operators (0 unless the compiler contracted it into an FMA:
// a = 1 + 2^-12, c = -(1 + 2^-11)); out[1] = 1 if the software flush let a subnormal product
// (tiny * tiny2 = 2^-130) through.
kernel void rp_canary(device float* out, constant float& a, constant float& c, constant float& tiny,
                      constant float& tiny2, RP_POS) {
  if (tid == 0) {
    out[0] = a * a + c;
    out[1] = (fmul(tiny, tiny2) == 0.0f) ? 0.0f : 1.0f;
  }
}
