// ids.h -- the numbers that the CPU kernels, the CUDA kernels and both torch bindings must
// agree on: which canonical function an elementwise op applies, and the Philox purpose tags.
// Plain C++ with no torch and no CUDA headers: kernels/cpu/selftest.cpp builds the CPU kernels
// without torch, and nvcc uses these values in device code.
#pragma once
#include <cstdint>

// The canonical functions of contract §5 that the unary ops (torch.ops.repops.exp, ...) apply.
// New functions are appended: the numbers are part of the Metal kernels' arguments
// (repops_mps.py RPFN, kernels/metal/elementwise.metal).
enum class RpFn { Exp, Log, Recip, Rsqrt, Sqrt, Sin, Cos, Tanh, Erf, Sigmoid, Gelu, GeluTanh, GeluGrad, GeluTanhGrad };

// Philox purpose tags, word c3 of the counter (contract §6): streams drawn for different
// purposes never share a counter. repops.PURPOSE_* pass the same numbers from Python
// (tests/test_kernels.py checks that they agree).
enum RpPurpose : uint32_t { kPurposeInit = 1, kPurposeDropout = 2, kPurposeData = 3, kPurposeSample = 4 };

// Where rope's rows lie (kernels/*/rope.*): row (b, t, h) of a [B, T, H, Dh] tensor, Dh
// contiguous floats, starts at b * rows.b + t * rows.t + h * rows.h floats from the base. The
// kernels take one for their input and one for their output, so one pass rotates the pairs and
// moves the heads (binding_common.h rope_args says which layouts).
struct RpRows {
  int64_t b, t, h;
};

// The chunk length L of the chunked sum (contract §4.5): a flat sum of n terms is the canonical
// sum of each chunk of L terms (the last one shorter, never padded), then the canonical sum of
// the ceil(n / L) chunk sums. Part of the contract: changing it changes the bits.
constexpr int64_t kFlatChunk = 32768;
