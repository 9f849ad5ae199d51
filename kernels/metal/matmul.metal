// matmul.metal -- C[b] = A[b] @ B[b] in the canonical order of contract §4.1: every C[i,j] is
// acc = +0.0; acc = acc + A[i,k]*B[k,j] for k = 0..K-1 strictly in order, by one thread; the
// Metal twin of kernels/cuda/matmul.cu.
//
// A threadgroup of 16 x 16 = 256 threads computes a 16 x 16 tile of C, one output per thread
// (row lid / 16, column lid % 16). k runs in steps of 16 through threadgroup memory: the group
// stages A[tile rows, k0..k0+15] and B[k0..k0+15, tile cols], then every thread adds its
// products for k0, k0+1, ... in order to its accumulator. Nothing is split along k, so the tile
// size cannot change a bit. Groups stride over the tiles (batch-major), so any grid works.
// A and B take any strides (transposed views cost nothing); a 2-D operand is broadcast over the
// batch with batch stride 0. C is contiguous [batch, M, N].
#pragma METAL fp contract(off)
#include "canonical.h"

constant constexpr int kTile = 16;

kernel void rp_matmul(device const float* A, device const float* B, device float* C, constant long& sab,
                      constant long& sam, constant long& sak, constant long& sbb, constant long& sbk,
                      constant long& sbn, constant long& batch, constant long& M, constant long& N,
                      constant long& K, RP_POS) {
  RP_THREADGROUP float As[kTile][kTile];  // As[i][k]
  RP_THREADGROUP float Bs[kTile][kTile];  // Bs[k][j]
  const long tm = (M + kTile - 1) / kTile, tn = (N + kTile - 1) / kTile;
  const int ty = (int)(lid / kTile), tx = (int)(lid % kTile);
  for (long tile = gid; tile < batch * tm * tn; tile += ngroups) {
    const long b = tile / (tm * tn), i0 = (tile / tn) % tm * kTile, j0 = tile % tn * kTile;
    device const float* Ab = A + b * sab;
    device const float* Bb = B + b * sbb;
    const long i = i0 + ty, j = j0 + tx;
    float acc = 0.0f;
    for (long k0 = 0; k0 < K; k0 += kTile) {
      As[ty][tx] = (i < M && k0 + tx < K) ? Ab[i * sam + (k0 + tx) * sak] : 0.0f;
      Bs[ty][tx] = (k0 + ty < K && j < N) ? Bb[(k0 + ty) * sbk + j * sbn] : 0.0f;
      threadgroup_barrier(mem_flags::mem_threadgroup);
      const int kc = (K - k0 < kTile) ? (int)(K - k0) : kTile;  // only real k: no padded terms
      for (int kk = 0; kk < kc; ++kk) acc = fadd(acc, fmul(As[ty][kk], Bs[kk][tx]));
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (i < M && j < N) C[b * M * N + i * N + j] = acc;
  }
}
