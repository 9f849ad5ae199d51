// amx_emulate.cpp -- int8_amx.cpp's interface (kernels/cpu/kernels.h) in plain C++, for the
// self-test on CPUs without AMX-INT8: tests/test_selftest.py builds the self-test with this file
// in place of int8_amx.cpp and runs it with --int8=amx, so that the code around the tiles
// (int8.cpp's gemm_amx, exact.cpp's exact_product_tiled: its fused blocks of eight residue GEMMs,
// its panels, its scaled residues) runs and must print the digests of every other build. The
// tiles themselves are tested on AMX hardware (tests/test_int8.py, test_exact_matmul.py).
//
// What it keeps of the interface: rp_amx_usable() is true; rp_amx_pack_b lays B out in its own
// order (matrix m, row j: K values zero-padded to a multiple of 64), which only rp_amx_gemm reads;
// rp_amx_gemm reads A by rows (lda) or in tile order (lda = 0: rp_amx_a_offset), computes each
// block of 32 x 32 outputs of the nmat products (exact int32 sums; rows past M and columns past N
// zero, as the tiles' zero padding gives) and stores full blocks of a single product into direct
// when given, else calls finish(ctx, i0, mr, j0, nr, tiles, 32, 1024) with the nmat blocks
// [32][32] one after the other, in the thread that computed them; every block and k-step, causal or
// not (a path may skip what an attention product's form makes zero or unwanted; none has to).
#include "kernels.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace {
constexpr int64_t kBlock = 32;
inline int64_t padded(int64_t K) { return (K + 63) / 64 * 64; }
}  // namespace

bool rp_amx_usable() { return true; }

int64_t rp_amx_packed_bytes(int64_t N, int64_t K, int nmat) { return nmat * N * padded(K); }

void rp_amx_pack_b(const int8_t* B, int64_t ldb, int64_t b_next, int64_t N, int64_t K, int nmat, int64_t j0,
                   int64_t j1, uint8_t* out) {
  const int64_t Kp = padded(K);
  for (int m = 0; m < nmat; ++m)
    for (int64_t j = j0; j < std::min(j1, N); ++j) {
      uint8_t* row = out + (m * N + j) * Kp;
      std::memcpy(row, B + m * b_next + (j - j0) * ldb, K);
      std::memset(row + K, 0, Kp - K);
    }
}

void rp_amx_gemm(const int8_t* A, int64_t lda, int64_t a_next, const uint8_t* Bp, int64_t M, int64_t N, int64_t K,
                 int nmat, int32_t* direct, RpTileFinish finish, void* ctx,
                 RpCausalRows /*causal*/) {
  const int64_t Kp = padded(K), mblocks = (M + kBlock - 1) / kBlock, nblocks = (N + kBlock - 1) / kBlock;
  rp::parallel_for(mblocks * nblocks, 1, [&](int64_t b, int64_t e) {
    std::vector<int32_t> tiles(nmat * kBlock * kBlock);
    for (int64_t w = b; w < e; ++w) {
      const int64_t i0 = w / nblocks * kBlock, j0 = w % nblocks * kBlock;
      const int64_t mr = std::min(kBlock, M - i0), nr = std::min(kBlock, N - j0);
      std::fill(tiles.begin(), tiles.end(), 0);
      for (int m = 0; m < nmat; ++m)
        for (int64_t i = 0; i < mr; ++i)
          for (int64_t j = 0; j < nr; ++j) {
            const int8_t* a = A + m * a_next;
            const int8_t* bj = reinterpret_cast<const int8_t*>(Bp + (m * N + j0 + j) * Kp);
            int32_t sum = 0;
            for (int64_t k = 0; k < K; ++k)
              sum += int32_t(a[lda ? (i0 + i) * lda + k : rp_amx_a_offset(i0 + i, k, Kp)]) * int32_t(bj[k]);
            tiles[(m * kBlock + i) * kBlock + j] = sum;
          }
      if (nmat == 1 && direct && mr == kBlock && nr == kBlock)
        for (int64_t i = 0; i < kBlock; ++i) std::memcpy(direct + (i0 + i) * N + j0, &tiles[i * kBlock], 4 * kBlock);
      else
        finish(ctx, i0, mr, j0, nr, tiles.data(), kBlock, kBlock * kBlock);
    }
  });
}
