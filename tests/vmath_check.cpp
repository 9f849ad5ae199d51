// vmath_check.cpp -- compares the SIMD canonical functions (kernels/cpu/vmath.h) with the scalar
// ones (contract.h) bit for bit on float32 bit patterns lo, lo + stride, ... < hi (hi <= 2^32),
// inside the kernels' FP mode (FTZ/DAZ). tests/test_vmath.py builds and runs it; by hand:
//
//   g++ -O2 -march=native -std=c++17 -ffp-contract=off -Wno-psabi -I kernels/cpu -I kernels/common \
//       tests/vmath_check.cpp -o vmath_check
//   ./vmath_check exp 0 0x100000000 1      # every float32: "checked 4294967296 mismatches 0"
//
// Exit status 0 when every lane matched, 1 otherwise (the first mismatches are printed).
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "vmath.h"

void rp_parallel_for(int64_t, int64_t, void (*)(void*, int64_t, int64_t), void*) {}

template <class S, class V>
static int check(S scalar, V vector, uint64_t lo, uint64_t hi, uint64_t stride) {
  uint64_t bad = 0, n = 0;
  for (uint64_t u = lo; u < hi; u += stride * rp::VL) {
    float in[rp::VL], out[rp::VL];
    // the last vector may run past hi: those lanes repeat lo (checked twice, harmlessly)
    for (int l = 0; l < rp::VL; ++l) in[l] = rp::fl((uint32_t)(u + l * stride < hi ? u + l * stride : lo));
    rp::storen(out, vector(rp::loadn(in)));
    for (int l = 0; l < rp::VL; ++l, ++n) {
      const float s = scalar(in[l]);
      if (rp::bits(s) != rp::bits(out[l]) && bad++ < 5)
        std::printf("x=%08x scalar=%08x vector=%08x\n", rp::bits(in[l]), rp::bits(s), rp::bits(out[l]));
    }
  }
  std::printf("checked %" PRIu64 " mismatches %" PRIu64 "\n", n, bad);
  return bad != 0;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: vmath_check FN LO HI STRIDE\n");
    return 2;
  }
  const char* fn = argv[1];
  const uint64_t lo = strtoull(argv[2], 0, 0), hi = strtoull(argv[3], 0, 0), stride = strtoull(argv[4], 0, 0);
  rp::FpModeGuard guard;
#define CASE(name)                                                                      \
  if (!strcmp(fn, #name))                                                               \
    return check([](float x) { return rp::name(x); }, [](rp::vf x) { return rp::v##name(x); }, \
                 lo, hi, stride);
  CASE(exp) CASE(log) CASE(recip) CASE(rsqrt) CASE(sqrt) CASE(sin) CASE(cos) CASE(sigmoid)
  std::fprintf(stderr, "unknown function %s\n", fn);
  return 2;
}
