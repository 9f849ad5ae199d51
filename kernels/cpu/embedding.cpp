// embedding.cpp -- token embedding lookup and its backward, contract §8 embedding:
// gw[v] sums the gradient rows of the positions holding token v in position order (§4.3),
// never atomics or index_add; threads split the columns (output elements).
#include "kernels.h"

#include <algorithm>
#include <cstring>

void rp_embedding(const float* w, const int64_t* idx, float* out, int64_t N, int64_t D) {
  rp::parallel_for(N, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) std::memcpy(out + i * D, w + idx[i] * D, D * sizeof(float));
  });
}

void rp_embedding_backward(const float* g, const int64_t* idx, float* gw, int64_t N, int64_t V,
                           int64_t D) {
  constexpr int64_t kCols = 64;
  rp::parallel_for((D + kCols - 1) / kCols, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t j0 = b * kCols, j1 = std::min(D, j0 + kCols);
      for (int64_t v = 0; v < V; ++v)
        for (int64_t j = j0; j < j1; ++j) gw[v * D + j] = 0.0f;
      for (int64_t i = 0; i < N; ++i) {
        float* row = gw + idx[i] * D;
        const float* gi = g + i * D;
        for (int64_t j = j0; j < j1; ++j) row[j] = rp::add(row[j], gi[j]);
      }
    }
  });
}
