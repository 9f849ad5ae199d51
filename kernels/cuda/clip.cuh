// clip.cuh -- the end of clip_grad's norm (contract §8 clip_grad), shared by both gradient-norm
// kernels (optim.cu's one warp, version 1; flat_sum.cu's streamed block, version 2): from the
// canonical sum of squares ss, the norm and the clip coefficient min(max_norm / (norm + 1e-6), 1).
#pragma once

#include "canonical.cuh"

namespace rpc {
__device__ __forceinline__ void clip_finish(float ss, float max_norm, float* norm, float* coef) {
  const float nrm = sqrt(ss);
  const float c = fmul(max_norm, recip(fadd(nrm, 1e-6f)));
  *coef = (c < 1.0f) ? c : 1.0f;
  *norm = nrm;
}
}  // namespace rpc
