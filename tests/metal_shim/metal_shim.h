// metal_shim.h -- test equipment, not a backend: lets g++ compile the Metal kernels of
// kernels/metal/*.metal as C++ and run them on the CPU, so that their bits are checked against
// the CPU backend in CI, where there is no Apple GPU and no Metal compiler
// (tests/test_metal_emulated.py; metal_backend.cpp, metal_pyshim.cpp and metal_window.cpp use it).
//
//   g++ -std=c++20 -O1 -ffp-contract=off -pthread -Wno-attributes -include tests/metal_shim/metal_shim.h ...
//
// What it provides: Metal's address-space keywords (device, constant, threadgroup, thread) and
// `kernel` as nothing (constant as const, so scalar arguments bind like Metal's constant refs),
// RP_THREADGROUP as static in the section rp_metal_tg (one array shared by the threads of a
// group), uint/ulong, float2, as_type<T>, threadgroup_barrier, and metal_shim::launch: a
// one-dimensional dispatch of `threads` threads in groups of `group`. The groups run one after
// another; the threads of a group are real threads (std::thread), which meet at every
// threadgroup_barrier (a std::barrier), so a kernel that reads threadgroup memory before the
// barrier that orders it, or that lets threads of one group skip a barrier (a hang), fails here
// as on a GPU. Threadgroup memory starts undefined on a GPU: before each group the shim fills
// every threadgroup array with 0xFF bytes (a NaN in every float), so a kernel that reads an
// element before its group wrote it reads NaN, not zero or the previous group's value.
// metal_shim::FloatTowardZero is (float) rounding toward zero, one of the conversion modes Metal's
// compiler options allow: tests/test_metal_emulated.py compiles the kernels with every (float)
// cast spelled (metal_shim::FloatTowardZero), to show that no conversion of theirs rounds.
// metal_shim::hw_flush = true sets FTZ|DAZ (x86 MXCSR: tininess after rounding) or FPCR.FZ
// (AArch64: tininess before rounding) in every kernel thread: the kernels must give the same
// bits on hardware that flushes either way as on hardware that does not flush.
//
// What it cannot check: the Metal compiler's own floating-point behaviour (whether `#pragma
// METAL fp contract(off)` really keeps every a*b + c unfused, whether "safe" math reorders or
// flushes anything, whether compile_shader has fast math off: .ci/mac's "fast math off" line),
// the Apple GPU's arithmetic (its
// flush rule: the kernels are written so that any of the usual rules gives the contract's bits,
// but g++ runs them on x86 SSE arithmetic), real SIMD-group timing and memory ordering between
// threadgroups, Metal's limits (threadgroup memory size, buffer argument count), and how
// torch.mps.compile_shader binds arguments (repops_mps.py). Those are what tests/test_mps.py
// checks on a Mac.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <vector>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

static_assert(sizeof(long) == 8, "Metal's long is 64 bits; the shim needs an LP64 host");
static_assert((char)-1 < 0, "Metal's char is signed; build the shim with -fsigned-char");

typedef uint32_t uint;
typedef uint64_t ulong;

struct float2 {
  float x, y;
  float2(float a, float b) : x(a), y(b) {}
};

template <class T, class F>
inline T as_type(F v) {
  static_assert(sizeof(T) == sizeof(F), "as_type: sizes differ");
  T t;
  std::memcpy(&t, &v, sizeof t);
  return t;
}

namespace mem_flags {
constexpr int mem_threadgroup = 1;
}

// The linker's bounds of the section that holds every threadgroup array (RP_THREADGROUP below).
extern "C" char __start_rp_metal_tg[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_rp_metal_tg[] __attribute__((weak, visibility("hidden")));

namespace metal_shim {
struct Pos { uint tid, nthreads, lid, gid, ngroups; };
inline bool hw_flush = false;
inline thread_local std::barrier<>* group_barrier = nullptr;

// Threadgroup memory is undefined when a group starts: 0xFF bytes (NaN floats) in every array.
inline void poison_threadgroup_memory() noexcept {
  if (__start_rp_metal_tg != __stop_rp_metal_tg)
    std::memset(__start_rp_metal_tg, 0xFF, (size_t)(__stop_rp_metal_tg - __start_rp_metal_tg));
}
struct PoisonNextGroup {
  void operator()() noexcept { poison_threadgroup_memory(); }
};

// (float)x rounded toward zero: what a Metal compiler set to that conversion mode gives.
struct FloatTowardZero {
  float v;
  template <class T>
  FloatTowardZero(T x) {
    if constexpr (std::is_integral_v<T>) {
      const double d = (double)x;  // exact: the kernels convert ints of at most 32 bits
      float f = (float)d;
      if (std::fabs((double)f) > std::fabs(d)) f = std::nextafter(f, 0.0f);
      v = f;
    } else {
      v = (float)x;
    }
  }
  operator float() const { return v; }
};

// threads: a multiple of group (Metal would otherwise run a partial last group).
inline void launch(long threads, long group, const std::function<void(const Pos&)>& body) {
  if (threads <= 0 || group <= 0 || threads % group) throw std::runtime_error("metal_shim::launch: bad grid");
  const uint ngroups = (uint)(threads / group);
  std::barrier<> bar((std::ptrdiff_t)group);                    // threadgroup_barrier
  std::barrier<PoisonNextGroup> next_group((std::ptrdiff_t)group);  // a group's end: poison, go on
  poison_threadgroup_memory();
  std::vector<std::thread> pool;
  for (long t = 0; t < group; ++t)
    pool.emplace_back([&, t] {
#if defined(__x86_64__)
      if (hw_flush) _mm_setcsr(_mm_getcsr() | 0x8040);  // FTZ | DAZ: tininess after rounding
#elif defined(__aarch64__)
      if (hw_flush) {  // FPCR.FZ: flushes inputs and results, tininess before rounding
        uint64_t fpcr;
        asm volatile("mrs %0, fpcr" : "=r"(fpcr));
        asm volatile("msr fpcr, %0" : : "r"(fpcr | (1ull << 24)));
      }
#endif
      group_barrier = &bar;
      for (uint g = 0; g < ngroups; ++g) {
        body(Pos{(uint)(g * group + t), (uint)threads, (uint)t, g, ngroups});
        next_group.arrive_and_wait();  // the next group starts when this one is done
      }
    });
  for (auto& th : pool) th.join();
}
}  // namespace metal_shim

inline void threadgroup_barrier(int) { metal_shim::group_barrier->arrive_and_wait(); }

// After every standard header: these names are keywords in Metal and nothing here.
#define kernel
#define device
#define constant const
#define thread
#define threadgroup
#define RP_THREADGROUP static __attribute__((section("rp_metal_tg")))
