// random.metal -- Philox4x32-10 streams (contract §6): raw words, uniform floats and normals;
// twin of kernels/cuda/random.cu. One thread per Philox block; the counter is (block, c1, c2,
// purpose) from logical indices only, never from thread or group ids, so any grid gives the
// same stream. k0, k1: the seed's low and high words; all uint32 values are passed as long.
#pragma METAL fp contract(off)
#include "canonical.h"

// words: n uint32 values stored as int64 (as the CPU op returns them).
kernel void rp_philox(device long* words, constant long& k0, constant long& k1, constant long& c1, constant long& c2,
                      constant long& purpose, constant long& block_offset, constant long& n, RP_POS) {
  for (long b = tid; b < (n + 3) / 4; b += nthreads) {
    const Philox4 r =
        philox4x32_10((uint)block_offset + (uint)b, (uint)c1, (uint)c2, (uint)purpose, (uint)k0, (uint)k1);
    for (long q = 0; q < 4 && 4 * b + q < n; ++q) words[4 * b + q] = (long)r.w[q];
  }
}

kernel void rp_uniform(device float* out, constant long& k0, constant long& k1, constant long& c1, constant long& c2,
                       constant long& purpose, constant long& n, RP_POS) {
  for (long b = tid; b < (n + 3) / 4; b += nthreads) {
    const Philox4 r = philox4x32_10((uint)b, (uint)c1, (uint)c2, (uint)purpose, (uint)k0, (uint)k1);
    for (long q = 0; q < 4 && 4 * b + q < n; ++q) out[4 * b + q] = uniform_from_word(r.w[q]);
  }
}

kernel void rp_normal(device float* out, constant long& k0, constant long& k1, constant long& c1, constant long& c2,
                      constant long& purpose, constant long& n, RP_POS) {
  for (long b = tid; b < (n + 3) / 4; b += nthreads) {
    const Philox4 r = philox4x32_10((uint)b, (uint)c1, (uint)c2, (uint)purpose, (uint)k0, (uint)k1);
    const float2 z01 = normal_pair(r.w[0], r.w[1]), z23 = normal_pair(r.w[2], r.w[3]);
    const float z[4] = {z01.x, z01.y, z23.x, z23.y};
    for (long q = 0; q < 4 && 4 * b + q < n; ++q) out[4 * b + q] = z[q];
  }
}
