// binding_cuda.cpp -- registers the CUDA kernels with torch under the CPU ops' names
// (TORCH_LIBRARY_IMPL(repops, CUDA, m)): a CUDA tensor passed to torch.ops.repops.<name> runs
// the kernel of kernels/cuda that follows the same contract (kernels/README.md) and gives the
// same bits as the CPU kernel. The only CUDA source with torch headers. It checks every
// argument with the checks it shares with kernels/cpu/binding.cpp (kernels/common/
// binding_common.h), allocates outputs, turns host scalars into float32 (contract §1), and
// launches on PyTorch's current stream under a guard for the operands' device.
//
// Ops without tensor inputs (rope_tables, philox, uniform, normal, canary) cannot be dispatched
// by device; their CUDA versions are separate ops, <name>_cuda, that return tensors on the
// current CUDA device (the CPU versions give the same bits; the model builds tables and the
// initialization on the CPU and moves them, which is data movement only).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "binding_common.h"
#include "kernels_cuda.h"

namespace {
using at::Tensor;
constexpr at::DeviceType kDev = at::kCUDA;  // where every tensor argument must be

cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

void check(cudaError_t err, const char* name) {
  TORCH_CHECK(err == cudaSuccess, "repops.", name, " (CUDA): ", cudaGetErrorString(err));
}

// Every index in [0, hi), tested on the device; on failure the indices are copied to the host
// so that the message names the first bad one, as the CPU binding's does. The test waits for the
// device (a host sync), so the training path avoids it: repops.py checks host indices on the
// host before moving them, and the backward ops reuse their forward's checked indices.
void check_range(const Tensor& idx, int64_t hi, const char* name) {
  if (idx.numel() == 0) return;
  Tensor bad = at::empty({1}, idx.options().dtype(at::kInt));
  int host_bad = 0;
  check(rpc_check_index(idx.data_ptr<int64_t>(), idx.numel(), hi, bad.data_ptr<int>(), &host_bad, stream()),
        "check_index");
  if (host_bad != 0) rpb::check_range(idx.cpu(), hi, name);
}
float inv(int64_t n) { return (float)(1.0 / (double)n); }  // contract §1: shape scalars

// The kernel versions the plain ops use (docs/cuda-speed.md), set once by repops.load() through
// cuda_select from REPOPS_CUDA_MATMUL, REPOPS_CUDA_INT8, REPOPS_CUDA_CLIP and REPOPS_CUDA_EXACT_GEMM. Every
// version gives the same bits; a default is the fastest version a GPU run of tools/matmul_versions.py
// (tools/exact_cuda.py for the exact matmul) verified (docs/cuda-speed.md: matmul 3, cuBLASLt's int8
// product, optim.cu's norm, the exact matmul's residue GEMMs on int8.cu). The _v ops name a version.
int64_t g_matmul_version = 3;  // 1: matmul.cu; 2-6: matmul_tiled.cu
int64_t g_int8_path = 1;       // 0: int8.cu's mma.sync GEMM; 1: cuBLASLt (at::_int_mm) where it fits
int64_t g_clip_version = 1;    // 1: optim.cu; 2: dev/cuda/flat_sum.cu
int64_t g_exact_path = 0;      // exact.cu's residue GEMMs: 0: int8.cu's mma.sync GEMM; 1: cuBLASLt where it fits
// The versions built: those of kernels/cuda, and with RPC_DEV_VERSIONS (REPOPS_CUDA_DEV=1: the
// harness's build) clip version 2 of dev/cuda, verified on a GPU but slower, and, not yet verified
// on a GPU, matmul versions 5-6 and the exact matmul's cuBLASLt residue GEMMs (docs/cuda-speed.md).
#if defined(RPC_DEV_VERSIONS)
constexpr int64_t kMatmulVersions = 6, kClipVersions = 2, kExactPaths = 2;
#else
constexpr int64_t kMatmulVersions = 4, kClipVersions = 1, kExactPaths = 1;
#endif

void check_exact_path(int64_t path, const char* op) {
  TORCH_CHECK(path >= 0 && path < kExactPaths, "repops.", op, ": exact path must be 0 (mma)",
              kExactPaths > 1 ? " or 1 (cublaslt)" : " in this build (cublaslt: REPOPS_CUDA_DEV=1)", ", got ", path);
}

void cuda_select(int64_t matmul_version, int64_t int8_path, int64_t clip_version, int64_t exact_path) {
  TORCH_CHECK(matmul_version >= 1 && matmul_version <= kMatmulVersions, "repops.cuda_select: matmul version must "
              "be 1 to ", kMatmulVersions, ", got ", matmul_version);
  TORCH_CHECK(int8_path == 0 || int8_path == 1, "repops.cuda_select: int8 path must be 0 (mma) or 1 (cublaslt), got ",
              int8_path);
  TORCH_CHECK(clip_version >= 1 && clip_version <= kClipVersions, "repops.cuda_select: clip version must be 1 to ",
              kClipVersions, " in this build (dev/cuda: REPOPS_CUDA_DEV=1), got ", clip_version);
  check_exact_path(exact_path, "cuda_select");
  g_matmul_version = matmul_version;
  g_int8_path = int8_path;
  g_clip_version = clip_version;
  g_exact_path = exact_path;
}

Tensor matmul_v(const Tensor& a, const Tensor& b, int64_t version) {
  TORCH_CHECK(version >= 1 && version <= kMatmulVersions, "repops.matmul_v: version must be 1 to ", kMatmulVersions,
              ", got ", version);
  const rpb::MatmulShape s = rpb::matmul_shape(kDev, a, b);
  c10::cuda::CUDAGuard guard(a.device());
  Tensor c = at::empty(s.out, a.options());
  check(rpc_matmul_v((int)version, a.data_ptr<float>(), s.sab, a.stride(-2), a.stride(-1), b.data_ptr<float>(), s.sbb,
                     b.stride(-2), b.stride(-1), c.data_ptr<float>(), s.batch, s.M, s.N, s.K, stream()), "matmul");
  return c;
}
Tensor matmul(const Tensor& a, const Tensor& b) { return matmul_v(a, b, g_matmul_version); }

std::tuple<Tensor, Tensor> rmsnorm(const Tensor& x_, const Tensor& w_, double eps) {
  auto [x, w] = rpb::rmsnorm_args(kDev, x_, w_);
  c10::cuda::CUDAGuard guard(x.device());
  Tensor y = at::empty_like(x), rstd = at::empty({x.size(0)}, x.options());
  check(rpc_rmsnorm(x.data_ptr<float>(), w.data_ptr<float>(), (float)eps, inv(x.size(1)), y.data_ptr<float>(),
                    rstd.data_ptr<float>(), x.size(0), x.size(1), stream()), "rmsnorm");
  return {y, rstd};
}

std::tuple<Tensor, Tensor> rmsnorm_backward(const Tensor& gy_, const Tensor& x_, const Tensor& w_, const Tensor& rstd_) {
  auto [gy, x, w, rstd] = rpb::rmsnorm_backward_args(kDev, gy_, x_, w_, rstd_);
  c10::cuda::CUDAGuard guard(x.device());
  Tensor gx = at::empty_like(x), gw = at::empty_like(w);
  check(rpc_rmsnorm_backward(gy.data_ptr<float>(), x.data_ptr<float>(), w.data_ptr<float>(), rstd.data_ptr<float>(),
                             inv(x.size(1)), gx.data_ptr<float>(), gw.data_ptr<float>(), x.size(0), x.size(1), stream()),
        "rmsnorm_backward");
  return {gx, gw};
}

Tensor rope(const Tensor& x_, const Tensor& c_, const Tensor& s_, bool backward) {
  const rpb::RopeCall r = rpb::rope_args(kDev, x_, c_, s_, backward);  // y on x's device
  c10::cuda::CUDAGuard guard(r.x.device());
  check(rpc_rope(r.x.data_ptr<float>(), r.xs, r.c.data_ptr<float>(), r.s.data_ptr<float>(), r.y.data_ptr<float>(),
                 r.ys, r.B, r.T, r.H, r.Dh, backward, stream()),
        "rope");
  return r.y;
}

Tensor causal_softmax(const Tensor& s_, double scale) {
  Tensor s = rpb::causal_softmax_args(kDev, s_);
  c10::cuda::CUDAGuard guard(s.device());
  Tensor p = at::empty_like(s);
  check(rpc_causal_softmax(s.data_ptr<float>(), (float)scale, p.data_ptr<float>(), s.size(0), s.size(1), stream()),
        "causal_softmax");
  return p;
}

Tensor causal_softmax_backward(const Tensor& gp_, const Tensor& p_, double scale) {
  auto [gp, p] = rpb::causal_softmax_backward_args(kDev, gp_, p_);
  c10::cuda::CUDAGuard guard(p.device());
  Tensor gs = at::empty_like(p);
  check(rpc_causal_softmax_backward(gp.data_ptr<float>(), p.data_ptr<float>(), (float)scale, gs.data_ptr<float>(),
                                    p.size(0), p.size(1), stream()), "causal_softmax_backward");
  return gs;
}

Tensor band_scores(const Tensor& a_, const Tensor& b_, int64_t W) {
  auto [a, b, sh] = rpb::band_scores_args(kDev, a_, b_, W);
  c10::cuda::CUDAGuard guard(a.device());
  Tensor s = at::empty({sh.batch, sh.M, sh.W}, a.options());
  check(rpc_band_scores(a.data_ptr<float>(), b.data_ptr<float>(), s.data_ptr<float>(), sh.batch, sh.M, sh.T, sh.D,
                        sh.W, stream()), "band_scores");
  return s;
}

Tensor band_mix(const Tensor& p_, const Tensor& b_) {
  auto [p, b, sh] = rpb::band_mix_args(kDev, p_, b_);
  c10::cuda::CUDAGuard guard(p.device());
  Tensor o = at::empty({sh.batch, sh.M, sh.D}, p.options());
  check(rpc_band_mix(p.data_ptr<float>(), b.data_ptr<float>(), o.data_ptr<float>(), sh.batch, sh.M, sh.T, sh.D, sh.W,
                     stream()), "band_mix");
  return o;
}

Tensor band_mix_t(const Tensor& p_, const Tensor& a_, int64_t T) {
  auto [p, a, sh] = rpb::band_mix_t_args(kDev, p_, a_, T);
  c10::cuda::CUDAGuard guard(p.device());
  Tensor o = at::empty({sh.batch, sh.T, sh.D}, p.options());
  check(rpc_band_mix_t(p.data_ptr<float>(), a.data_ptr<float>(), o.data_ptr<float>(), sh.batch, sh.M, sh.T, sh.D,
                       sh.W, stream()), "band_mix_t");
  return o;
}

Tensor window_softmax(const Tensor& s_, double scale) {
  Tensor s = rpb::window_softmax_args(kDev, s_);
  c10::cuda::CUDAGuard guard(s.device());
  Tensor p = at::empty_like(s);
  check(rpc_window_softmax(s.data_ptr<float>(), (float)scale, p.data_ptr<float>(), s.size(0) * s.size(1), s.size(1),
                           s.size(2), stream()), "window_softmax");
  return p;
}

Tensor window_softmax_backward(const Tensor& gp_, const Tensor& p_, double scale) {
  auto [gp, p] = rpb::window_softmax_backward_args(kDev, gp_, p_);
  c10::cuda::CUDAGuard guard(p.device());
  Tensor gs = at::empty_like(p);
  check(rpc_window_softmax_backward(gp.data_ptr<float>(), p.data_ptr<float>(), (float)scale, gs.data_ptr<float>(),
                                    p.size(0) * p.size(1), p.size(1), p.size(2), stream()), "window_softmax_backward");
  return gs;
}

Tensor swiglu(const Tensor& u_) {
  Tensor u = rpb::swiglu_args(kDev, u_);
  c10::cuda::CUDAGuard guard(u.device());
  Tensor out = at::empty({u.size(0), u.size(1) / 2}, u.options());
  check(rpc_swiglu(u.data_ptr<float>(), out.data_ptr<float>(), u.size(0), u.size(1) / 2, stream()), "swiglu");
  return out;
}

Tensor swiglu_backward(const Tensor& g_, const Tensor& u_) {
  auto [g, u] = rpb::swiglu_backward_args(kDev, g_, u_);
  c10::cuda::CUDAGuard guard(u.device());
  Tensor gu = at::empty_like(u);
  check(rpc_swiglu_backward(g.data_ptr<float>(), u.data_ptr<float>(), gu.data_ptr<float>(), u.size(0), g.size(1),
                            stream()), "swiglu_backward");
  return gu;
}

std::tuple<Tensor, Tensor> cross_entropy(const Tensor& z_, const Tensor& t_, double zloss, bool check_indices) {
  auto [z, t] = rpb::cross_entropy_args(kDev, z_, t_);
  c10::cuda::CUDAGuard guard(z.device());
  if (check_indices) check_range(t, z.size(1), "targets");
  Tensor loss = at::empty({}, z.options()), lse = at::empty({z.size(0)}, z.options());
  Tensor row_loss = at::empty({z.size(0)}, z.options());
  check(rpc_cross_entropy(z.data_ptr<float>(), t.data_ptr<int64_t>(), (float)zloss, inv(z.size(0)),
                          loss.data_ptr<float>(), lse.data_ptr<float>(), row_loss.data_ptr<float>(), z.size(0),
                          z.size(1), stream()), "cross_entropy");
  return {loss, lse};
}

Tensor cross_entropy_backward(const Tensor& g_, const Tensor& z_, const Tensor& t_, const Tensor& lse_, double zloss,
                              bool check_indices) {
  auto [z, t, lse] = rpb::cross_entropy_backward_args(kDev, g_, z_, t_, lse_);
  Tensor g = g_.to(z.device()).contiguous();  // data movement only (a CPU scalar is accepted)
  c10::cuda::CUDAGuard guard(z.device());
  if (check_indices) check_range(t, z.size(1), "targets");
  const float two_z = (float)(2.0 * (double)(float)zloss);  // host scalar 2*zloss, as the CPU kernel
  Tensor gz = at::empty_like(z);
  check(rpc_cross_entropy_backward(g.data_ptr<float>(), z.data_ptr<float>(), t.data_ptr<int64_t>(),
                                   lse.data_ptr<float>(), inv(z.size(0)), two_z, gz.data_ptr<float>(), z.size(0),
                                   z.size(1), stream()), "cross_entropy_backward");
  return gz;
}

Tensor embedding(const Tensor& w_, const Tensor& idx_, bool check_indices) {
  auto [w, idx] = rpb::embedding_args(kDev, w_, idx_);
  c10::cuda::CUDAGuard guard(w.device());
  if (check_indices) check_range(idx, w.size(0), "token ids");
  Tensor out = at::empty({idx.size(0), w.size(1)}, w.options());
  check(rpc_embedding(w.data_ptr<float>(), idx.data_ptr<int64_t>(), out.data_ptr<float>(), idx.size(0), w.size(1),
                      stream()), "embedding");
  return out;
}

Tensor embedding_backward(const Tensor& g_, const Tensor& idx_, int64_t num_rows, bool check_indices) {
  auto [g, idx] = rpb::embedding_backward_args(kDev, g_, idx_);
  c10::cuda::CUDAGuard guard(g.device());
  if (check_indices) check_range(idx, num_rows, "token ids");
  Tensor gw = at::empty({num_rows, g.size(1)}, g.options());
  check(rpc_embedding_backward(g.data_ptr<float>(), idx.data_ptr<int64_t>(), gw.data_ptr<float>(), g.size(0),
                               num_rows, g.size(1), stream()), "embedding_backward");
  return gw;
}

using BinaryFn = cudaError_t (*)(const float*, const float*, float*, int64_t, cudaStream_t);
Tensor binary(const Tensor& a_, const Tensor& b_, BinaryFn fn, const char* name) {
  auto [a, b] = rpb::binary_args(kDev, a_, b_, name);
  c10::cuda::CUDAGuard guard(a.device());
  Tensor y = at::empty_like(a);
  check(fn(a.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(), a.numel(), stream()), name);
  return y;
}
Tensor add(const Tensor& a, const Tensor& b) { return binary(a, b, rpc_add, "add"); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(a, b, rpc_mul, "mul"); }

Tensor scale(const Tensor& a_, double s) {
  Tensor a = rpb::contig(kDev, a_, "a");
  c10::cuda::CUDAGuard guard(a.device());
  Tensor y = at::empty_like(a);
  check(rpc_scale(a.data_ptr<float>(), (float)s, y.data_ptr<float>(), a.numel(), stream()), "scale");
  return y;
}

template <RpFn F>
Tensor unary(const Tensor& x_) {
  Tensor x = rpb::contig(kDev, x_, "x");
  c10::cuda::CUDAGuard guard(x.device());
  Tensor y = at::empty_like(x);
  check(rpc_unary(F, x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), stream()), "unary");
  return y;
}

Tensor csum(const Tensor& x_) {
  Tensor x = rpb::csum_args(kDev, x_);
  c10::cuda::CUDAGuard guard(x.device());
  Tensor y = at::empty(x.sizes().slice(0, x.dim() - 1), x.options());
  check(rpc_csum_rows(x.data_ptr<float>(), y.data_ptr<float>(), y.numel(), x.size(-1), stream()), "csum");
  return y;
}

Tensor dropout(const Tensor& x_, double p, int64_t seed, int64_t c1, int64_t c2) {
  Tensor x = rpb::contig(kDev, x_, "x");
  const rpb::Dropout d = rpb::dropout_args(p, seed, c1, c2);
  c10::cuda::CUDAGuard guard(x.device());
  Tensor y = at::empty_like(x);
  check(rpc_dropout(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), d.threshold, d.scale, d.seed, d.c1, d.c2,
                    stream()), "dropout");
  return y;
}

void adamw_(const Tensor& p, const Tensor& g_, const Tensor& m, const Tensor& v, double lr, double b1, double b2,
            double omb1, double omb2, double eps, double decay, double bc1, double bc2) {
  Tensor g = rpb::adamw_args(kDev, p, g_, m, v);
  c10::cuda::CUDAGuard guard(g.device());
  check(rpc_adamw(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), g.numel(),
                  (float)lr, (float)b1, (float)b2, (float)omb1, (float)omb2, (float)eps, (float)decay, (float)bc1,
                  (float)bc2, stream()), "adamw_");
}

std::tuple<Tensor, Tensor> clip_grad_v(const Tensor& g_, double max_norm, int64_t version) {
  TORCH_CHECK(version >= 1 && version <= kClipVersions, "repops.clip_grad_v: version must be 1 to ", kClipVersions,
              " in this build (dev/cuda: REPOPS_CUDA_DEV=1), got ", version);
  Tensor g = rpb::contig(kDev, g_, "grad");
  c10::cuda::CUDAGuard guard(g.device());
  Tensor out = at::empty_like(g), norm = at::empty({}, g.options()), coef = at::empty({1}, g.options());
  Tensor sums = at::empty({(g.numel() + kFlatChunk - 1) / kFlatChunk}, g.options());  // §4.5's chunk sums
  check(rpc_clip_grad_v((int)version, g.data_ptr<float>(), (float)max_norm, out.data_ptr<float>(),
                        norm.data_ptr<float>(), coef.data_ptr<float>(), sums.data_ptr<float>(), g.numel(), stream()),
        "clip_grad");
  return {out, norm};
}
std::tuple<Tensor, Tensor> clip_grad(const Tensor& g, double max_norm) { return clip_grad_v(g, max_norm, g_clip_version); }

// ---- the quantized path (contract §10; argument checks in binding_common.h)
Tensor int8_quantize(const Tensor& x_, const Tensor& s_) {
  auto [x, s, R, C] = rpb::int8_rows_args(kDev, x_, s_, "int8_quantize");
  c10::cuda::CUDAGuard guard(x.device());
  Tensor q = at::empty(x.sizes(), x.options().dtype(at::kChar));
  check(rpc_int8_quantize(x.data_ptr<float>(), s.data_ptr<float>(), q.data_ptr<int8_t>(), R, C, stream()),
        "int8_quantize");
  return q;
}

Tensor int8_dequantize(const Tensor& q_, const Tensor& s_) {
  auto [q, s, R] = rpb::int8_dequantize_args(kDev, q_, s_);
  c10::cuda::CUDAGuard guard(q.device());
  Tensor y = at::empty(q.sizes(), s.options());
  check(rpc_int8_dequantize(q.data_ptr<int8_t>(), s.data_ptr<float>(), y.data_ptr<float>(), R, q.numel() / R,
                            stream()), "int8_dequantize");
  return y;
}

// The grid test on the device (a host sync, so quant.py passes check=False for the operands
// int8_quantize made); on failure the operand is copied to the host to name the first -128.
std::tuple<Tensor, Tensor> gemm_operands(const Tensor& a_, const Tensor& b_, bool check_grid, const char* op) {
  auto [a, b] = rpb::int8_gemm_args(kDev, a_, b_, op);
  if (check_grid) {
    for (const Tensor* t : {&a, &b}) {
      Tensor bad = at::empty({1}, t->options().dtype(at::kInt));
      int host_bad = 0;
      check(rpc_int8_find_offgrid(t->data_ptr<int8_t>(), t->numel(), bad.data_ptr<int>(), &host_bad, stream()), op);
      if (host_bad != 0) rpb::check_on_grid(t->cpu(), op);
    }
  }
  return {a, b};
}

// torch._int_mm's shape rules on CUDA (aten/src/ATen/native/cuda/Blas.cpp): more than 16 rows, K and N
// multiples of 8. Tested here, never by catching its error (an exception from an extension op can
// kill the process on some images, README "Backends"); 16-byte aligned operands for cuBLASLt.
bool cublaslt_fits(const Tensor& a, const Tensor& b) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(0);
  const auto aligned = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
  return M > 16 && K > 0 && K % 8 == 0 && N > 0 && N % 8 == 0 && aligned(a) && aligned(b);
}

// C32 [M, N] = a . b^T, exact int32: cuBLASLt's int8 GEMM (path 1, where it fits) or ours. Integer
// sums are exact and the binding's bound keeps every partial sum in int32 (contract §10), so both
// give the same bits; tools/matmul_versions.py checks it on the GPU.
Tensor int8_product(const Tensor& a, const Tensor& b, int64_t path) {
  if (path == 1 && cublaslt_fits(a, b)) return at::_int_mm(a, b.t());
  Tensor c = at::empty({a.size(0), b.size(0)}, a.options().dtype(at::kInt));
  check(rpc_int8_gemm(a.data_ptr<int8_t>(), b.data_ptr<int8_t>(), a.size(0), b.size(0), a.size(1), nullptr, nullptr,
                      c.data_ptr<int32_t>(), nullptr, stream()), "int8_matmul");
  return c;
}

void check_int8_path(int64_t path, const char* op) {
  TORCH_CHECK(path == 0 || path == 1, "repops.", op, ": path must be 0 (mma) or 1 (cublaslt), got ", path);
}

Tensor int8_matmul_v(const Tensor& a_, const Tensor& b_, bool check_grid, int64_t path) {
  check_int8_path(path, "int8_matmul_v");
  auto [a, b] = gemm_operands(a_, b_, check_grid, "int8_matmul");
  c10::cuda::CUDAGuard guard(a.device());
  return int8_product(a, b, path);
}
Tensor int8_matmul(const Tensor& a, const Tensor& b, bool check_grid) {
  return int8_matmul_v(a, b, check_grid, g_int8_path);
}

// sx stays on the device (reading it on the host would sync): the kernel forms sx * sw[j].
Tensor int8_linear_v(const Tensor& a_, const Tensor& b_, const Tensor& sx_, const Tensor& sw_, bool check_grid,
                     int64_t path) {
  check_int8_path(path, "int8_linear_v");
  auto [a, b] = gemm_operands(a_, b_, check_grid, "int8_linear");
  auto [sx, sw] = rpb::int8_scales_args(kDev, b, sx_, sw_);
  c10::cuda::CUDAGuard guard(a.device());
  Tensor y = at::empty({a.size(0), b.size(0)}, sx.options());
  if (path == 1 && cublaslt_fits(a, b)) {  // cuBLASLt's product, then the same epilogue as our kernel's
    Tensor c = at::_int_mm(a, b.t());
    check(rpc_int8_dequantize_cols(c.data_ptr<int32_t>(), sx.data_ptr<float>(), sw.data_ptr<float>(),
                                   y.data_ptr<float>(), a.size(0), b.size(0), stream()), "int8_linear");
    return y;
  }
  check(rpc_int8_gemm(a.data_ptr<int8_t>(), b.data_ptr<int8_t>(), a.size(0), b.size(0), a.size(1),
                      sx.data_ptr<float>(), sw.data_ptr<float>(), nullptr, y.data_ptr<float>(), stream()),
        "int8_linear");
  return y;
}
Tensor int8_linear(const Tensor& a, const Tensor& b, const Tensor& sx, const Tensor& sw, bool check_grid) {
  return int8_linear_v(a, b, sx, sw, check_grid, g_int8_path);
}

void lsq_init_(const Tensor& x_, const Tensor& s) {
  TORCH_CHECK(s.is_contiguous(), "repops.lsq_init_: s must be contiguous");
  auto [x, s2, R, C] = rpb::int8_rows_args(kDev, x_, s, "lsq_init_");
  TORCH_CHECK(C >= 1, "repops.lsq_init_: no elements to take the mean of");
  c10::cuda::CUDAGuard guard(x.device());
  check(rpc_lsq_init(x.data_ptr<float>(), s.data_ptr<float>(), R, C, inv(C), stream()), "lsq_init_");
}

std::tuple<Tensor, Tensor> lsq_backward(const Tensor& x_, const Tensor& s_, const Tensor& gxh_, double g) {
  auto [x, s, R, C] = rpb::int8_rows_args(kDev, x_, s_, "lsq_backward");
  Tensor gxh = rpb::lsq_gxh_args(kDev, x, gxh_);
  c10::cuda::CUDAGuard guard(x.device());
  Tensor gx = at::empty_like(x), gs = at::empty_like(s);
  check(rpc_lsq_backward(x.data_ptr<float>(), s.data_ptr<float>(), gxh.data_ptr<float>(), (float)g,
                         gx.data_ptr<float>(), gs.data_ptr<float>(), R, C, stream()), "lsq_backward");
  return {gx, gs};
}

// ---- int8 P·V (contract §10; quant.py)
Tensor int8_absmax_step(const Tensor& x_) {
  Tensor x = rpb::int8_absmax_step_args(kDev, x_);
  c10::cuda::CUDAGuard guard(x.device());
  Tensor s = at::empty({x.size(0)}, x.options());
  check(rpc_int8_absmax_step(x.data_ptr<float>(), s.data_ptr<float>(), x.size(0), x.size(1), stream()),
        "int8_absmax_step");
  return s;
}

// The operands come from int8_quantize (on the grid by construction).
Tensor int8_band_mix(const Tensor& qp_, const Tensor& qv_, const Tensor& sp_, const Tensor& sv_) {
  auto [qp, qv, sp, sv, sh] = rpb::int8_band_mix_args(kDev, qp_, qv_, sp_, sv_);
  c10::cuda::CUDAGuard guard(qp.device());
  Tensor o = at::empty({sh.batch, sh.M, sh.D}, sp.options());
  check(rpc_int8_band_mix(qp.data_ptr<int8_t>(), qv.data_ptr<int8_t>(), sp.data_ptr<float>(), sv.data_ptr<float>(),
                          o.data_ptr<float>(), sh.batch, sh.M, sh.T, sh.D, sh.W, stream()), "int8_band_mix");
  return o;
}

#if defined(RPC_DEV_VERSIONS)
// exact.cu's residue GEMM on cuBLASLt (path 1; REPOPS_CUDA_EXACT_GEMM=cublaslt, built only with
// REPOPS_CUDA_DEV=1 until a GPU has verified it): the int8 planes viewed as tensors (no copy) and
// at::_int_mm_out straight into the residue sums where cuBLASLt's rules allow (cublaslt_fits and a
// 16-byte aligned C), int8.cu's GEMM elsewhere. Exact int32 sums either way (|sum| < 2^31 by
// exact.cu's k chunks), so the same bits.
cudaError_t exact_gemm_cublaslt(const int8_t* A, const int8_t* B, int32_t* C32, int64_t M, int64_t N, int64_t K,
                                void*, cudaStream_t st) {
  const auto opt = at::TensorOptions().device(at::kCUDA, c10::cuda::current_device());
  const Tensor a = at::from_blob(const_cast<int8_t*>(A), {M, K}, opt.dtype(at::kChar));
  const Tensor b = at::from_blob(const_cast<int8_t*>(B), {N, K}, opt.dtype(at::kChar));
  if (!cublaslt_fits(a, b) || reinterpret_cast<uintptr_t>(C32) % 16 != 0)
    return rpc_int8_gemm(A, B, M, N, K, nullptr, nullptr, C32, nullptr, st);
  Tensor c = at::from_blob(C32, {M, N}, opt.dtype(at::kInt));
  at::_int_mm_out(c, a, b.t());
  return cudaGetLastError();
}
#endif

// Contract §11 (exact.cu), as kernels/cpu/binding.cpp: K-contiguous copies of A and B^T (data
// movement only) with the batch made explicit, and one workspace for every product of the batch;
// path: the residue GEMMs' (0: int8.cu's, 1: cuBLASLt's where it fits).
Tensor exact_matmul_v(const Tensor& a, const Tensor& b, int64_t path) {
  check_exact_path(path, "exact_matmul_v");
  const rpb::MatmulShape s = rpb::matmul_shape(kDev, a, b);
  TORCH_CHECK(s.K < (int64_t(1) << 31), "repops.exact_matmul: K must be < 2^31");
  c10::cuda::CUDAGuard guard(a.device());
  const Tensor a3 = (a.dim() == 2 ? a.unsqueeze(0) : a).expand({s.batch, s.M, s.K}).contiguous();
  const Tensor bt = (b.dim() == 2 ? b.unsqueeze(0) : b).expand({s.batch, s.K, s.N}).transpose(1, 2).contiguous();
  Tensor c = at::empty(s.out, a.options());
  Tensor work = at::empty({rpc_exact_workspace_bytes(s.M, s.N, s.K)}, a.options().dtype(at::kByte));
#if defined(RPC_DEV_VERSIONS)
  const RpcInt8Gemm gemm = path == 1 ? exact_gemm_cublaslt : nullptr;
#else
  const RpcInt8Gemm gemm = nullptr;
#endif
  for (int64_t i = 0; i < s.batch; ++i)
    check(rpc_exact_matmul(a3.data_ptr<float>() + i * s.M * s.K, bt.data_ptr<float>() + i * s.N * s.K,
                           c.data_ptr<float>() + i * s.M * s.N, s.M, s.N, s.K, work.data_ptr(), gemm, nullptr, stream()),
          "exact_matmul");
  return c;
}
Tensor exact_matmul(const Tensor& a, const Tensor& b) { return exact_matmul_v(a, b, g_exact_path); }

// ------------------------------------------------------------ ops without tensor inputs
at::TensorOptions on_cuda(at::ScalarType t) {
  return at::TensorOptions().dtype(t).device(at::kCUDA, c10::cuda::current_device());
}

std::tuple<Tensor, Tensor> rope_tables_cuda(int64_t T, int64_t Dh, double theta) {
  rpb::check_rope_tables(T, Dh);
  Tensor c = at::empty({T, Dh / 2}, on_cuda(at::kFloat)), s = at::empty({T, Dh / 2}, on_cuda(at::kFloat));
  check(rpc_rope_tables(T, Dh, (float)theta, inv(Dh), c.data_ptr<float>(), s.data_ptr<float>(), stream()),
        "rope_tables");
  return {c, s};
}

Tensor philox_cuda(int64_t seed, int64_t c1, int64_t c2, int64_t purpose, int64_t n, int64_t block_offset) {
  const rpb::PhiloxStream s = rpb::philox_args("philox", seed, c1, c2, purpose, n);
  Tensor out = at::empty({n}, on_cuda(at::kLong));
  check(rpc_philox(s.seed, s.c1, s.c2, s.purpose, rpb::u32(block_offset, "block_offset"), out.data_ptr<int64_t>(), n,
                   stream()), "philox");
  return out;
}

Tensor uniform_cuda(int64_t seed, int64_t c1, int64_t c2, int64_t purpose, int64_t n) {
  const rpb::PhiloxStream s = rpb::philox_args("uniform", seed, c1, c2, purpose, n);
  Tensor out = at::empty({n}, on_cuda(at::kFloat));
  check(rpc_uniform(s.seed, s.c1, s.c2, s.purpose, out.data_ptr<float>(), n, stream()), "uniform");
  return out;
}

Tensor normal_cuda(int64_t seed, int64_t c1, int64_t c2, int64_t purpose, int64_t n) {
  const rpb::PhiloxStream s = rpb::philox_args("normal", seed, c1, c2, purpose, n);
  Tensor out = at::empty({n}, on_cuda(at::kFloat));
  check(rpc_normal(s.seed, s.c1, s.c2, s.purpose, out.data_ptr<float>(), n, stream()), "normal");
  return out;
}

Tensor canary_cuda() {
  Tensor out = at::empty({2}, on_cuda(at::kFloat));
  check(rpc_canary(out.data_ptr<float>(), stream()), "canary");
  return out;
}
}  // namespace

// CUDA only: the kernel versions (docs/cuda-speed.md). matmul_v, int8_matmul_v, int8_linear_v,
// clip_grad_v and exact_matmul_v are the plain ops by a named version; cuda_select sets the plain ops' ones.
TORCH_LIBRARY_FRAGMENT(repops, m) {
  RPB_DEF_TENSORLESS_OPS(m, _cuda);
  m.def("matmul_v(Tensor a, Tensor b, int version) -> Tensor");
  m.def("int8_matmul_v(Tensor a, Tensor b, bool check_grid, int path) -> Tensor");
  m.def("int8_linear_v(Tensor a, Tensor b, Tensor sx, Tensor sw, bool check_grid, int path) -> Tensor");
  m.def("clip_grad_v(Tensor g, float max_norm, int version) -> (Tensor, Tensor)");
  m.def("exact_matmul_v(Tensor a, Tensor b, int path) -> Tensor");
  m.def("cuda_select(int matmul_version, int int8_path, int clip_version, int exact_path) -> ()");
}

TORCH_LIBRARY_IMPL(repops, CUDA, m) {
  RPB_IMPL_TENSOR_OPS(m);
  m.impl("matmul_v", matmul_v);
  m.impl("int8_matmul_v", int8_matmul_v);
  m.impl("int8_linear_v", int8_linear_v);
  m.impl("clip_grad_v", clip_grad_v);
  m.impl("exact_matmul", exact_matmul);
  m.impl("exact_matmul_v", exact_matmul_v);
}

// No tensor inputs: nothing to dispatch on, so these run wherever they are called.
TORCH_LIBRARY_IMPL(repops, CompositeExplicitAutograd, m) {
  RPB_IMPL_TENSORLESS_OPS(m, _cuda);
  m.impl("cuda_select", cuda_select);
}
