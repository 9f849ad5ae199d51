// vmath_check.cpp -- compares the SIMD canonical functions (kernels/cpu/vmath.h) with the scalar
// ones (contract.h) bit for bit on float32 bit patterns lo, lo + stride, ... < hi (hi <= 2^32),
// inside the kernels' FP mode (FTZ/DAZ). tests/test_vmath.py builds and runs it; by hand:
//
//   g++ -O2 -march=native -std=c++17 -ffp-contract=off -Wno-psabi -I kernels/cpu -I kernels/common \
//       tests/vmath_check.cpp -o vmath_check
//   ./vmath_check exp 0 0x100000000 1      # every float32: "checked 4294967296 mismatches 0"
//
//   ./vmath_check mul 0x1e800000 0x21000000 1   # rp::mul near 2^-126 against a double reference
//   ./vmath_check csum 0 0x100000000 4099       # rp::vcsum_array against rp::csum (also cmax)
//
// Each run ends with a digest of the scalar results, equal across builds that agree.
// Exit status 0 when every lane matched, 1 otherwise (the first mismatches are printed).
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "vmath.h"

void rp_parallel_for(int64_t, int64_t, void (*)(void*, int64_t, int64_t), void*) {}

// FNV-1a over the outputs' bit patterns (every NaN as 0x7FC00000, contract §7): two builds that
// print the same digest for the same arguments computed the same bits.
static void digest(uint64_t* h, float x) {
  const uint32_t u = x != x ? 0x7FC00000u : rp::bits(x);
  *h = (*h ^ u) * 1099511628211ull;
}

template <class S, class V>
static int check(S scalar, V vector, uint64_t lo, uint64_t hi, uint64_t stride) {
  uint64_t bad = 0, n = 0, h = 14695981039346656037ull;
  for (uint64_t u = lo; u < hi; u += stride * rp::VL) {
    float in[rp::VL], out[rp::VL];
    // the last vector may run past hi: those lanes repeat lo (checked twice, harmlessly, and
    // left out of the digest, so that it does not depend on VL)
    for (int l = 0; l < rp::VL; ++l) in[l] = rp::fl((uint32_t)(u + l * stride < hi ? u + l * stride : lo));
    rp::storen(out, vector(rp::loadn(in)));
    for (int l = 0; l < rp::VL; ++l, ++n) {
      const float s = scalar(in[l]);
      if (u + l * stride < hi) digest(&h, s);
      if (rp::bits(s) != rp::bits(out[l]) && bad++ < 5)
        std::printf("x=%08x scalar=%08x vector=%08x\n", rp::bits(in[l]), rp::bits(s), rp::bits(out[l]));
    }
  }
  std::printf("checked %" PRIu64 " mismatches %" PRIu64 " digest %016" PRIx64 "\n", n, bad, h);
  return bad != 0;
}

// contract §3 for products: the result of a * b on x86 (flush when the product rounded to 24
// bits with unbounded exponent is below 2^-126), computed independently of rp::mul in double
// (the product of two floats is exact in double), subnormal inputs read as zero.
static float mul_reference(float a, float b) {
  const double p = (double)rp::daz(a) * (double)rp::daz(b);
  if (std::fabs(p) >= 0x1p-100) return (float)p;  // far from 2^-126: one ordinary rounding
  const float r = (float)(p * 0x1p24);             // rounded to 24 bits, 2^24 times too big
  if (std::fabs(r) < 0x1p-102f) return std::copysign(0.0f, (float)p);
  return r * 0x1p-24f;                             // >= 2^-126: exact
}

// "mul": for every x in the pattern range, b runs over the 5 floats nearest 2^-126 / x, so the
// products x * b land on both sides of 2^-126, in the AArch64 window [2^-126 (1 - 2^-25), 2^-126)
// and in the double-rounding band [2^-126 (1 - 2^-24), 2^-126 (1 - 2^-25)) among them. Scalar
// rp::mul, vector rp::mul and mul_reference must agree; it prints how many products the plain
// hardware multiply got wrong ("hardware-differs", 0 on x86), how many landed in the window
// and how many in the double-rounding band.
// Equal bits, or both NaN (which NaN an operation returns is not part of the contract, §7).
static bool same(float x, float y) { return rp::bits(x) == rp::bits(y) || (x != x && y != y); }

static int check_mul(uint64_t lo, uint64_t hi, uint64_t stride) {
  uint64_t bad = 0, n = 0, hw = 0, window = 0, band = 0, h = 14695981039346656037ull;
  for (uint64_t u = lo; u < hi; u += stride * rp::VL) {
    float a[rp::VL], b[5][rp::VL];
    for (int l = 0; l < rp::VL; ++l) {
      const uint64_t ul = u + l * stride < hi ? u + l * stride : lo;
      a[l] = rp::fl((uint32_t)ul);
      // b0 = the float nearest 2^-126 / |a|, clamped to [2^-126 (1 + 2^-22), FLT_MAX (1 - 2^-22)]
      // so that its neighbours b0 +- 2 are normal (the same inputs whatever the FP mode)
      const double q = 0x1p-126 / std::fabs((double)rp::daz(a[l]));
      const uint32_t b0 = q != q ? 0x3F800000u : q < 0x1.000004p-126 ? 0x00800002u
                        : q > 0x1.fffff8p+127 ? 0x7F7FFFFDu : rp::bits((float)q);
      for (int d = 0; d < 5; ++d)  // both signs, alternating with d and with the input
        b[d][l] = rp::fl(b0 + d - 2 + ((((ul - lo) / stride) ^ d) & 1 ? 0x80000000u : 0u));
    }
    float out[5][rp::VL];
    for (int d = 0; d < 5; ++d) rp::storen(out[d], rp::mul(rp::loadn(a), rp::loadn(b[d])));
    for (int l = 0; l < rp::VL && u + l * stride < hi; ++l)  // lanes past hi are repeats
      for (int d = 0; d < 5; ++d, ++n) {
        const float want = mul_reference(a[l], b[d][l]), s = rp::mul(a[l], b[d][l]);
        digest(&h, s);
        const volatile float x = a[l], y = b[d][l];
        const float raw = x * y;
        const double p = std::fabs((double)rp::daz(a[l]) * (double)rp::daz(b[d][l]));
        window += p >= 0x1p-126 * (1 - 0x1p-25) && p < 0x1p-126;
        band += p >= 0x1p-126 * (1 - 0x1p-24) && p < 0x1p-126 * (1 - 0x1p-25);
        hw += !same(raw, want);
        if ((!same(s, want) || !same(out[d][l], want)) && bad++ < 5)
          std::printf("a=%08x b=%08x reference=%08x scalar=%08x vector=%08x\n", rp::bits(a[l]), rp::bits(b[d][l]),
                      rp::bits(want), rp::bits(s), rp::bits(out[d][l]));
      }
  }
  std::printf("checked %" PRIu64 " mismatches %" PRIu64 " hardware-differs %" PRIu64 " window %" PRIu64
              " band %" PRIu64 " digest %016" PRIx64 "\n", n, bad, hw, window, band, h);
  return bad != 0;
}

// "csum" / "cmax": the vector reductions (vmath.h vcsum_array, vcmax_array) against the scalar
// ones (contract.h csum, cmax) on windows of kWindow values, every length 0 .. kWindow of each (so
// every tail length, whole blocks and the fold run): windows made from the bit patterns lo,
// lo + stride, ... < hi, every third value negated (near 2^-126: cancellations and flushed
// sums), and one fixed window whose 32 partial sums all become -0.0 (2^-126, then
// -1.5 * 2^-126: the sum is flushed to -0.0) followed by -0.0 terms, where a tail padded with
// +0.0 instead of masked would give +0.0. Equal bits, or both NaN.
static int check_reduce(bool is_max, uint64_t lo, uint64_t hi, uint64_t stride) {
  constexpr int64_t kWindow = 100;
  uint64_t bad = 0, n = 0, h = 14695981039346656037ull;
  float x[kWindow];
  const auto run = [&](uint32_t id) {
    for (int64_t len = 0; len <= kWindow; ++len, ++n) {
      const auto term = [&x](int64_t i) { return x[i]; };
      const float s = is_max ? rp::cmax(len, term) : rp::csum(len, term);
      const float v = is_max ? rp::vcmax_array(x, len) : rp::vcsum_array(x, len);
      digest(&h, s);
      if (!same(s, v) && bad++ < 5)
        std::printf("window %08x length %" PRId64 ": scalar=%08x vector=%08x\n", id, len, rp::bits(s), rp::bits(v));
    }
  };
  for (int64_t j = 0; j < kWindow; ++j) x[j] = j < 32 ? 0x1p-126f : j < 64 ? -0x1.8p-126f : -0.0f;
  run(0);
  for (uint64_t u = lo; u + (kWindow - 1) * stride < hi; u += kWindow * stride) {
    for (int64_t j = 0; j < kWindow; ++j) x[j] = rp::fl((uint32_t)(u + j * stride) ^ (j % 3 == 1 ? 0x80000000u : 0u));
    run((uint32_t)u);
  }
  std::printf("checked %" PRIu64 " mismatches %" PRIu64 " digest %016" PRIx64 "\n", n, bad, h);
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
  if (!strcmp(fn, "mul")) return check_mul(lo, hi, stride);
  if (!strcmp(fn, "csum") || !strcmp(fn, "cmax")) return check_reduce(fn[1] == 'm', lo, hi, stride);
#define CASE(name)                                                                      \
  if (!strcmp(fn, #name))                                                               \
    return check([](float x) { return rp::name(x); }, [](rp::vf x) { return rp::v##name(x); }, \
                 lo, hi, stride);
  CASE(exp) CASE(log) CASE(recip) CASE(rsqrt) CASE(sqrt) CASE(sin) CASE(cos) CASE(sigmoid)
  CASE(tanh) CASE(erf) CASE(gelu) CASE(gelu_tanh) CASE(gelu_grad) CASE(gelu_tanh_grad)
  std::fprintf(stderr, "unknown function %s\n", fn);
  return 2;
}
