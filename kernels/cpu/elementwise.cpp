// elementwise.cpp -- elementwise ops (contract §8 add/mul/scale/dropout), the canonical
// functions of §5 (and the derived sigmoid and GELU forms of §5.6) applied to tensors, the
// canonical row sum (§4.2) and the build canary (§2).
#include "kernels.h"

namespace {
constexpr int64_t kGrain = 4096;

template <class F>
void map(int64_t n, const F& f) {
  rp::parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) f(i);
  });
}
}  // namespace

void rp_unary(RpFn fn, const float* x, float* y, int64_t n) {
  auto apply = [=](auto f) {
    rp::parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) { rp::vmap(x + i0, y + i0, i1 - i0, f); });
  };
  switch (fn) {
    case RpFn::Exp: apply([](auto v) { return rp::vexp(v); }); break;
    case RpFn::Log: apply([](auto v) { return rp::vlog(v); }); break;
    case RpFn::Recip: apply([](auto v) { return rp::vrecip(v); }); break;
    case RpFn::Rsqrt: apply([](auto v) { return rp::vrsqrt(v); }); break;
    case RpFn::Sqrt: apply([](auto v) { return rp::vsqrt(v); }); break;
    case RpFn::Sin: apply([](auto v) { return rp::vsin(v); }); break;
    case RpFn::Cos: apply([](auto v) { return rp::vcos(v); }); break;
    case RpFn::Tanh: apply([](auto v) { return rp::vtanh(v); }); break;
    case RpFn::Erf: apply([](auto v) { return rp::verf(v); }); break;
    case RpFn::Sigmoid: apply([](auto v) { return rp::vsigmoid(v); }); break;
    case RpFn::Gelu: apply([](auto v) { return rp::vgelu(v); }); break;
    case RpFn::GeluTanh: apply([](auto v) { return rp::vgelu_tanh(v); }); break;
    case RpFn::GeluGrad: apply([](auto v) { return rp::vgelu_grad(v); }); break;
    case RpFn::GeluTanhGrad: apply([](auto v) { return rp::vgelu_tanh_grad(v); }); break;
  }
}

void rp_add(const float* a, const float* b, float* y, int64_t n) { map(n, [=](int64_t i) { y[i] = rp::add(a[i], b[i]); }); }
void rp_mul(const float* a, const float* b, float* y, int64_t n) { map(n, [=](int64_t i) { y[i] = rp::mul(a[i], b[i]); }); }
void rp_scale(const float* a, float s, float* y, int64_t n) { map(n, [=](int64_t i) { y[i] = rp::mul(a[i], s); }); }

void rp_csum_rows(const float* x, float* y, int64_t rows, int64_t n) {
  rp::parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) y[r] = rp::vcsum_array(x + r * n, n);
  });
}

// §6: element i keeps iff word (i mod 4) of Philox block i/4 is below threshold.
void rp_dropout(const float* x, float* y, int64_t n, uint32_t threshold, float scale,
                uint64_t seed, uint32_t c1, uint32_t c2) {
  const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  rp::parallel_for((n + 3) / 4, kGrain / 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const rp::Philox4 r = rp::philox4x32_10((uint32_t)b, c1, c2, kPurposeDropout, k0, k1);
      for (int64_t q = 0; q < 4 && 4 * b + q < n; ++q) {
        const int64_t i = 4 * b + q;
        y[i] = rp::mul(x[i], r.w[q] < threshold ? scale : 0.0f);
      }
    }
  });
}

namespace {
// Kept out of line and fed through volatile so the compiler cannot fold them at build time:
// they must run with the flags and FP mode the kernels run with.
__attribute__((noinline)) float contract_probe(float a, float b, float c) { return a * b + c; }
__attribute__((noinline)) float ftz_probe(float a, float b) { return rp::mul(a, b); }
}  // namespace

void rp_canary(float* out) {
  volatile float a = 1.0f + 0x1p-12f, c = -(1.0f + 0x1p-11f);
  {
    rp::FpModeGuard guard;
    out[0] = contract_probe(a, a, c);  // 2^-24 if fused into an FMA, 0 if not
  }
  volatile float tiny = 0x1p-100f, tiny2 = 0x1p-30f;  // product 2^-130 is subnormal
  float results[2] = {0.0f, 0.0f};
  rp::parallel_for(2, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) results[i] = ftz_probe(tiny, tiny2);
  });
  out[1] = results[0] + results[1] == 0.0f ? 0.0f : 1.0f;
}
