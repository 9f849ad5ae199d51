// metal_pyshim.cpp -- test equipment: every Metal kernel of kernels/metal/, run through
// metal_shim.h, callable by name from Python (ctypes), so that tests/test_metal_emulated.py can
// stand it in for torch.mps.compile_shader and run repops_mps.py's ops (their argument order,
// host scalars and grids) on CPU tensors:
//
//   g++ -std=c++20 -O1 -shared -fPIC -ffp-contract=off -fsigned-char -pthread -Wno-attributes \
//       -I kernels/metal tests/metal_shim/metal_pyshim.cpp -o metal_pyshim.so
//
//   rp_signature(name)  the kernel's arguments before the position ones, one letter each:
//                       p (a buffer), l (constant long&), f (constant float&); NULL if unknown
//   rp_launch(name, args, threads, group, hw_flush)  args[i]: the buffer's address, or the
//                       address of an int64 / float32 scalar; returns 0, or -1 if unknown
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "metal_shim.h"

namespace msl {
#include "attention.metal"
#include "elementwise.metal"
#include "embedding.metal"
#include "int8.metal"
#include "loss.metal"
#include "matmul.metal"
#include "mlp.metal"
#include "norm.metal"
#include "optim.metal"
#include "random.metal"
#include "rope.metal"
#include "window.metal"
}  // namespace msl

namespace {
template <class T>
T unpack(void* p) {
  if constexpr (std::is_pointer_v<T>) return static_cast<T>(p);
  else return *static_cast<std::remove_cv_t<std::remove_reference_t<T>>*>(p);
}
template <class T>
char letter() {
  using V = std::remove_cv_t<std::remove_reference_t<T>>;
  if constexpr (std::is_pointer_v<T>) return 'p';
  else if constexpr (std::is_same_v<V, long>) return 'l';
  else {
    static_assert(std::is_same_v<V, float>, "kernel scalars are long or float");
    return 'f';
  }
}

struct Kernel {
  std::string signature;
  std::function<void(void**, long, long)> run;
};

template <class... P, size_t... I>
Kernel wrap_(void (*k)(P...), std::index_sequence<I...>) {
  using Args = std::tuple<P...>;
  return Kernel{std::string{letter<std::tuple_element_t<I, Args>>()...}, [k](void** a, long threads, long group) {
                  metal_shim::launch(threads, group, [&](const metal_shim::Pos& p) {
                    k(unpack<std::tuple_element_t<I, Args>>(a[I])..., p.tid, p.nthreads, p.lid, p.gid, p.ngroups);
                  });
                }};
}
template <class... P>
Kernel wrap(void (*k)(P...)) {
  static_assert(sizeof...(P) >= 5, "every kernel ends with RP_POS");
  return wrap_(k, std::make_index_sequence<sizeof...(P) - 5>{});
}

#define K(name) {#name, wrap(&msl::name)}
const std::map<std::string, Kernel>& kernels() {
  static const std::map<std::string, Kernel> table = {
      K(rp_causal_softmax), K(rp_causal_softmax_backward), K(rp_unary), K(rp_add), K(rp_mul), K(rp_scale),
      K(rp_csum_rows), K(rp_dropout), K(rp_canary), K(rp_embedding), K(rp_embedding_backward),
      K(rp_int8_quantize), K(rp_int8_dequantize), K(rp_int8_gemm), K(rp_int8_linear), K(rp_lsq_init),
      K(rp_lsq_gx), K(rp_lsq_gs), K(rp_cross_entropy_rows), K(rp_cross_entropy_mean),
      K(rp_cross_entropy_backward), K(rp_matmul), K(rp_swiglu), K(rp_swiglu_backward), K(rp_rmsnorm),
      K(rp_rmsnorm_backward), K(rp_rmsnorm_gw), K(rp_adamw), K(rp_grad_norm_chunks), K(rp_grad_norm),
      K(rp_apply_coef), K(rp_philox), K(rp_uniform), K(rp_normal), K(rp_rope_tables), K(rp_rope),
      K(rp_band_scores), K(rp_band_mix), K(rp_band_mix_t), K(rp_window_softmax), K(rp_window_softmax_backward)};
  return table;
}
}  // namespace

extern "C" const char* rp_signature(const char* name) {
  auto it = kernels().find(name);
  return it == kernels().end() ? nullptr : it->second.signature.c_str();
}

extern "C" int rp_launch(const char* name, void** args, long threads, long group, int hw_flush) {
  auto it = kernels().find(name);
  if (it == kernels().end()) return -1;
  metal_shim::hw_flush = hw_flush != 0;
  it->second.run(args, threads, group);
  return 0;
}
