// mlp.metal -- the SwiGLU gate of the MLP and its backward, contract §8 swiglu:
// out = (a * sigmoid(a)) * b for u = [gate a | up b]; one thread per output element. Twin of
// kernels/cuda/mlp.cu.
#pragma METAL fp contract(off)
#include "canonical.h"

kernel void rp_swiglu(device const float* u, device float* out, constant long& R, constant long& H, RP_POS) {
  for (long e = tid; e < R * H; e += nthreads) {
    const long r = e / H, j = e % H;
    const float a = u[r * 2 * H + j], b = u[r * 2 * H + H + j];
    const float sg = rp_sigmoid(a);
    out[e] = fmul(fmul(a, sg), b);
  }
}

kernel void rp_swiglu_backward(device const float* g, device const float* u, device float* gu, constant long& R,
                               constant long& H, RP_POS) {
  for (long e = tid; e < R * H; e += nthreads) {
    const long r = e / H, j = e % H;
    const float a = u[r * 2 * H + j], b = u[r * 2 * H + H + j], ge = g[e];
    const float sg = rp_sigmoid(a);
    const float sa = fmul(a, sg);
    gu[r * 2 * H + H + j] = fmul(ge, sa);
    gu[r * 2 * H + j] = fmul(fmul(ge, b), fmul(sg, fadd(1.0f, fmul(a, fsub(1.0f, sg)))));
  }
}
