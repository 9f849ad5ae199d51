// grid_slices.cuh -- one product as several launches where one grid would pass CUDA's limits:
// grid.y (row tiles) and grid.z (batch) stop at 65535, so the rows go in slices of 65535 row tiles
// of BM rows and the batch in slices of 65535 (pointers offset by the caller; C keeps its batch
// stride M * N). Each output is still computed whole by one thread, so the slicing changes no bit.
// matmul.cu (version 1) and matmul_tiled.cu (versions 2-4) launch through it.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace rpc {
// launch(b0, nb, m0, mm) for batch entries [b0, b0 + nb) and rows [m0, m0 + mm), every slice in
// order; returns the first error a launch returns, else cudaSuccess.
template <int64_t BM, class Launch>
cudaError_t for_grid_slices(int64_t batch, int64_t M, Launch&& launch) {
  constexpr int64_t kMaxYZ = 65535, kRowsPerLaunch = kMaxYZ * BM;
  for (int64_t b0 = 0; b0 < batch; b0 += kMaxYZ) {
    const int64_t nb = batch - b0 < kMaxYZ ? batch - b0 : kMaxYZ;
    for (int64_t m0 = 0; m0 < M; m0 += kRowsPerLaunch) {
      const cudaError_t err = launch(b0, nb, m0, M - m0 < kRowsPerLaunch ? M - m0 : kRowsPerLaunch);
      if (err != cudaSuccess) return err;
    }
  }
  return cudaSuccess;
}
}  // namespace rpc
