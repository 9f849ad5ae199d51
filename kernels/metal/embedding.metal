// embedding.metal -- token embedding lookup and its backward, contract §8 embedding; twin of
// kernels/cuda/embedding.cu. The gradient row gw[v] is the sequential sum (§4.3) of the rows g[i]
// of the positions i holding token v, in increasing i: thread (row chunk, column j) owns gw[v, j]
// for the kVC rows v of its chunk, zeroes them, and scans every position in order, adding
// g[i, j] when idx[i] falls in its chunk. No atomics, no sort; one writer per output element.
// idx: already range-checked.
#pragma METAL fp contract(off)
#include "canonical.h"

constant constexpr long kVC = 64;  // rows of gw per thread (trades idx scans against parallelism)

kernel void rp_embedding(device const float* w, device const long* idx, device float* out, constant long& N,
                         constant long& D, RP_POS) {
  for (long e = tid; e < N * D; e += nthreads) out[e] = w[idx[e / D] * D + e % D];
}

kernel void rp_embedding_backward(device const float* g, device const long* idx, device float* gw, constant long& N,
                                  constant long& V, constant long& D, RP_POS) {
  const long chunks = (V + kVC - 1) / kVC;
  for (long e = tid; e < chunks * D; e += nthreads) {
    const long v0 = (e / D) * kVC, v1 = (v0 + kVC < V) ? v0 + kVC : V, j = e % D;
    for (long v = v0; v < v1; ++v) gw[v * D + j] = 0.0f;
    for (long i = 0; i < N; ++i) {
      const long v = idx[i];
      if (v >= v0 && v < v1) gw[v * D + j] = fadd(gw[v * D + j], g[i * D + j]);
    }
  }
}
