// metal_window.cpp -- the products around 2^-126 (contract §3) through the Metal kernels on the
// CPU shim: reads pairs of float32 bit patterns (hex, one pair a line) from stdin and prints, per
// pair, the bits of rp_mul's result, of rp_matmul's (A = a [n, 1], B = b [1, n]: the diagonal
// is acc = +0.0 + a*b) and of the plain hardware product a * b computed in a kernel thread (so
// with the thread's flush mode: METAL_SHIM_HW_FLUSH=1 sets FTZ/DAZ on x86, FPCR.FZ on AArch64).
// tests/test_metal_emulated.py builds it for x86 and for AArch64 (run under qemu-user) and checks
// the kernels' bits against products computed with exact rationals.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "metal_shim.h"

namespace msl {
#include "elementwise.metal"
#include "matmul.metal"
}  // namespace msl

int main() {
  metal_shim::hw_flush = std::getenv("METAL_SHIM_HW_FLUSH") != nullptr;
  std::vector<float> a, b;
  unsigned ua, ub;
  while (std::scanf("%x %x", &ua, &ub) == 2) {
    a.push_back(as_type<float>((uint)ua));
    b.push_back(as_type<float>((uint)ub));
  }
  const long n = (long)a.size();
  std::vector<float> y(n), c(n * n), raw(n);
  metal_shim::launch(64, 64, [&](const metal_shim::Pos& p) {
    msl::rp_mul(a.data(), b.data(), y.data(), n, p.tid, p.nthreads, p.lid, p.gid, p.ngroups);
    for (long i = p.tid; i < n; i += p.nthreads) {
      volatile float x = a[i], z = b[i];  // the hardware's own product, in this thread's mode
      raw[i] = x * z;
    }
  });
  metal_shim::launch(3 * 256, 256, [&](const metal_shim::Pos& p) {
    msl::rp_matmul(a.data(), b.data(), c.data(), 0, 1, 1, 0, n, 1, 1, n, n, 1, p.tid, p.nthreads, p.lid, p.gid,
                   p.ngroups);
  });
  for (long i = 0; i < n; ++i)
    std::printf("%08x %08x %08x\n", (unsigned)as_type<uint>(y[i]), (unsigned)as_type<uint>(c[i * n + i]),
                (unsigned)as_type<uint>(raw[i]));
  return 0;
}
