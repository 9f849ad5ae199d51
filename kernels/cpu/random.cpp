// random.cpp -- Philox4x32-10 streams (contract §6): raw words, uniform floats and normals.
// The counter is (block, c1, c2, purpose) from logical indices only.
#include "kernels.h"

namespace {
template <class F>
void blocks(int64_t n, const F& f) {
  rp::parallel_for((n + 3) / 4, 1024, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) f(b);
  });
}
}  // namespace

void rp_philox(uint64_t seed, uint32_t c1, uint32_t c2, uint32_t purpose, uint32_t block_offset,
               uint32_t* words, int64_t n) {
  blocks(n, [&](int64_t b) {
    const rp::Philox4 r = rp::philox4x32_10(block_offset + (uint32_t)b, c1, c2, purpose,
                                            (uint32_t)seed, (uint32_t)(seed >> 32));
    for (int64_t q = 0; q < 4 && 4 * b + q < n; ++q) words[4 * b + q] = r.w[q];
  });
}

void rp_uniform(uint64_t seed, uint32_t c1, uint32_t c2, uint32_t purpose, float* out, int64_t n) {
  blocks(n, [&](int64_t b) {
    const rp::Philox4 r = rp::philox4x32_10((uint32_t)b, c1, c2, purpose, (uint32_t)seed, (uint32_t)(seed >> 32));
    for (int64_t q = 0; q < 4 && 4 * b + q < n; ++q) out[4 * b + q] = rp::uniform_from_word(r.w[q]);
  });
}

void rp_normal(uint64_t seed, uint32_t c1, uint32_t c2, uint32_t purpose, float* out, int64_t n) {
  blocks(n, [&](int64_t b) {
    const rp::Philox4 r = rp::philox4x32_10((uint32_t)b, c1, c2, purpose, (uint32_t)seed, (uint32_t)(seed >> 32));
    float z[4];
    rp::normal_pair(r.w[0], r.w[1], &z[0], &z[1]);
    rp::normal_pair(r.w[2], r.w[3], &z[2], &z[3]);
    for (int64_t q = 0; q < 4 && 4 * b + q < n; ++q) out[4 * b + q] = z[q];
  });
}
