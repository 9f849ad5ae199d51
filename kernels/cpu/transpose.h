// transpose.h -- 16 x 16 and 8 x 8 transposes of 32-bit words in AVX-512 and AVX registers: data
// movement only, no arithmetic. matmul.cpp's 512-bit tile packs its operands with the 16 x 16
// (floats: 16 k of 16 rows into 16 rows of the panel), its 256-bit tile with the 8 x 8;
// int8_amx.cpp packs its B operand with the 16 x 16 (words of four int8: the VNNI layout).
// x86 only; the target attributes let a file built for any x86-64 level call them from code that
// runs only on CPUs with those instructions.
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

namespace rp {

// Word j of r[i] becomes word i of r[j]: pairs of rows, then quads, then 128-bit lanes.
__attribute__((target("avx512f"))) inline void transpose16(__m512i* r) {
  __m512i t[16];
  for (int n = 0; n < 16; n += 2) {
    t[n] = _mm512_unpacklo_epi32(r[n], r[n + 1]);
    t[n + 1] = _mm512_unpackhi_epi32(r[n], r[n + 1]);
  }
  for (int n = 0; n < 16; n += 4) {
    r[n] = _mm512_unpacklo_epi64(t[n], t[n + 2]);
    r[n + 1] = _mm512_unpackhi_epi64(t[n], t[n + 2]);
    r[n + 2] = _mm512_unpacklo_epi64(t[n + 1], t[n + 3]);
    r[n + 3] = _mm512_unpackhi_epi64(t[n + 1], t[n + 3]);
  }
  for (int n = 0; n < 4; ++n) {
    t[n] = _mm512_shuffle_i32x4(r[n], r[n + 4], 0x88);
    t[n + 4] = _mm512_shuffle_i32x4(r[n], r[n + 4], 0xDD);
    t[n + 8] = _mm512_shuffle_i32x4(r[n + 8], r[n + 12], 0x88);
    t[n + 12] = _mm512_shuffle_i32x4(r[n + 8], r[n + 12], 0xDD);
  }
  for (int n = 0; n < 8; ++n) {
    r[n] = _mm512_shuffle_i32x4(t[n], t[n + 8], 0x88);
    r[n + 8] = _mm512_shuffle_i32x4(t[n], t[n + 8], 0xDD);
  }
}

// Float j of r[i] becomes float i of r[j]: pairs of rows, then quads, then 128-bit lanes.
__attribute__((target("avx"))) inline void transpose8(__m256* r) {
  __m256 t[8];
  for (int n = 0; n < 8; n += 2) {
    t[n] = _mm256_unpacklo_ps(r[n], r[n + 1]);       // r[n][0] r[n+1][0] r[n][1] r[n+1][1] | 4, 5
    t[n + 1] = _mm256_unpackhi_ps(r[n], r[n + 1]);   // 2, 3 | 6, 7
  }
  for (int n = 0; n < 8; n += 4) {
    r[n] = _mm256_shuffle_ps(t[n], t[n + 2], 0x44);       // column 0 of rows n..n+3 | column 4
    r[n + 1] = _mm256_shuffle_ps(t[n], t[n + 2], 0xEE);   // 1 | 5
    r[n + 2] = _mm256_shuffle_ps(t[n + 1], t[n + 3], 0x44);   // 2 | 6
    r[n + 3] = _mm256_shuffle_ps(t[n + 1], t[n + 3], 0xEE);   // 3 | 7
  }
  for (int n = 0; n < 4; ++n) {
    t[n] = _mm256_permute2f128_ps(r[n], r[n + 4], 0x20);
    t[n + 4] = _mm256_permute2f128_ps(r[n], r[n + 4], 0x31);
  }
  for (int n = 0; n < 8; ++n) r[n] = t[n];
}

}  // namespace rp
#endif
