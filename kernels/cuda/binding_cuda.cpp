// binding_cuda.cpp -- registers the CUDA kernels with torch under the CPU ops' names
// (TORCH_LIBRARY_IMPL(repops, CUDA, m)): a CUDA tensor passed to torch.ops.repops.<name> runs
// the kernel of kernels/cuda that follows the same contract (kernels/README.md) and gives the
// same bits as the CPU kernel. The only CUDA file with torch headers. It checks shapes, dtypes
// and devices like kernels/cpu/binding.cpp, allocates outputs, turns host scalars into float32
// exactly as the CPU binding does (contract §1), and launches on PyTorch's current stream.
//
// Ops without tensor inputs (rope_tables, philox, uniform, normal, canary) cannot be dispatched
// by device; their CUDA versions are separate ops, <name>_cuda, that return tensors on the
// current CUDA device (the CPU versions give the same bits; the model builds tables and the
// initialization on the CPU and moves them, which is data movement only).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "kernels_cuda.h"

namespace {
using at::Tensor;

cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

void check(cudaError_t err, const char* name) {
  TORCH_CHECK(err == cudaSuccess, "repops.", name, " (CUDA): ", cudaGetErrorString(err));
}

void check_f32(const Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "repops: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat, "repops: ", name, " must be float32, got ", t.scalar_type());
}
Tensor contig(const Tensor& t, const char* name) { check_f32(t, name); return t.contiguous(); }
Tensor contig_idx(const Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kLong, "repops: ", name, " must be a CUDA int64 tensor");
  return t.contiguous();
}
void same_device(const Tensor& a, const Tensor& b, const char* what) {
  TORCH_CHECK(a.device() == b.device(), "repops.", what, ": tensors on different devices: ", a.device(), " and ",
              b.device());
}
// Every index in [0, hi); on failure the same message as the CPU binding (the slow path copies
// the indices to the host to name the first bad one).
void check_range(const Tensor& idx, int64_t hi, const char* name) {
  if (idx.numel() == 0) return;
  Tensor bad = at::empty({1}, idx.options().dtype(at::kInt));
  int host_bad = 0;
  check(rpc_check_index(idx.data_ptr<int64_t>(), idx.numel(), hi, bad.data_ptr<int>(), &host_bad, stream()),
        "check_index");
  if (host_bad == 0) return;
  Tensor h = idx.cpu();
  const int64_t* p = h.data_ptr<int64_t>();
  for (int64_t i = 0; i < h.numel(); ++i)
    TORCH_CHECK(p[i] >= 0 && p[i] < hi, "repops: ", name, " out of range [0, ", hi, "): found ", p[i], " at ", i);
}
float inv(int64_t n) { return (float)(1.0 / (double)n); }  // contract §1: shape scalars

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_f32(a, "a");
  check_f32(b, "b");
  same_device(a, b, "matmul");
  TORCH_CHECK(a.dim() >= 2 && a.dim() <= 3 && b.dim() >= 2 && b.dim() <= 3, "repops.matmul: 2-D or 3-D operands");
  TORCH_CHECK(a.size(-1) == b.size(-2), "repops.matmul: inner sizes differ: ", a.sizes(), " @ ", b.sizes());
  const int64_t batch = a.dim() == 3 ? a.size(0) : (b.dim() == 3 ? b.size(0) : 1);
  TORCH_CHECK((a.dim() == 2 || a.size(0) == batch) && (b.dim() == 2 || b.size(0) == batch), "repops.matmul: batch sizes differ");
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  const int64_t sab = a.dim() == 3 ? a.stride(0) : 0, sbb = b.dim() == 3 ? b.stride(0) : 0;
  c10::cuda::CUDAGuard guard(a.device());
  Tensor c = (a.dim() == 3 || b.dim() == 3) ? at::empty({batch, M, N}, a.options()) : at::empty({M, N}, a.options());
  check(rpc_matmul(a.data_ptr<float>(), sab, a.stride(-2), a.stride(-1), b.data_ptr<float>(), sbb, b.stride(-2),
                   b.stride(-1), c.data_ptr<float>(), batch, M, N, K, stream()), "matmul");
  return c;
}

std::tuple<Tensor, Tensor> rmsnorm(const Tensor& x_, const Tensor& w_, double eps) {
  Tensor x = contig(x_, "x"), w = contig(w_, "w");
  same_device(x, w, "rmsnorm");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 1 && w.size(0) == x.size(1), "repops.rmsnorm: x [R, D], w [D]");
  c10::cuda::CUDAGuard guard(x.device());
  Tensor y = at::empty_like(x), rstd = at::empty({x.size(0)}, x.options());
  check(rpc_rmsnorm(x.data_ptr<float>(), w.data_ptr<float>(), (float)eps, inv(x.size(1)), y.data_ptr<float>(),
                    rstd.data_ptr<float>(), x.size(0), x.size(1), stream()), "rmsnorm");
  return {y, rstd};
}

std::tuple<Tensor, Tensor> rmsnorm_backward(const Tensor& gy_, const Tensor& x_, const Tensor& w_, const Tensor& rstd_) {
  Tensor gy = contig(gy_, "gy"), x = contig(x_, "x"), w = contig(w_, "w"), rstd = contig(rstd_, "rstd");
  TORCH_CHECK(gy.sizes() == x.sizes() && x.dim() == 2 && rstd.numel() == x.size(0), "repops.rmsnorm_backward: shapes");
  // w [D] too: the kernels read w[j] for every column j < D, and on the GPU a short w is an
  // illegal address that poisons the whole CUDA context, not just this op.
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(1), "repops.rmsnorm_backward: w [D]");
  for (const Tensor* t : {&x, &w, &rstd}) same_device(gy, *t, "rmsnorm_backward");
  c10::cuda::CUDAGuard guard(x.device());
  Tensor gx = at::empty_like(x), gw = at::empty_like(w);
  check(rpc_rmsnorm_backward(gy.data_ptr<float>(), x.data_ptr<float>(), w.data_ptr<float>(), rstd.data_ptr<float>(),
                             inv(x.size(1)), gx.data_ptr<float>(), gw.data_ptr<float>(), x.size(0), x.size(1), stream()),
        "rmsnorm_backward");
  return {gx, gw};
}

Tensor rope(const Tensor& x_, const Tensor& c_, const Tensor& s_, bool backward) {
  Tensor x = contig(x_, "x"), c = contig(c_, "cos"), s = contig(s_, "sin");
  same_device(x, c, "rope");
  same_device(x, s, "rope");
  TORCH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "repops.rope: x [B, T, H, Dh] with even Dh");
  TORCH_CHECK(c.dim() == 2 && c.size(0) >= x.size(1) && c.size(1) == x.size(3) / 2 && s.sizes() == c.sizes(),
              "repops.rope: tables [>=T, Dh/2]");
  c10::cuda::CUDAGuard guard(x.device());
  Tensor y = at::empty_like(x);
  check(rpc_rope(x.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(), y.data_ptr<float>(), x.size(0),
                 x.size(1), x.size(2), x.size(3), backward, stream()), "rope");
  return y;
}

Tensor causal_softmax(const Tensor& s_, double scale) {
  Tensor s = contig(s_, "s");
  TORCH_CHECK(s.dim() == 3 && s.size(1) == s.size(2), "repops.causal_softmax: s [BH, T, T]");
  c10::cuda::CUDAGuard guard(s.device());
  Tensor p = at::empty_like(s);
  check(rpc_causal_softmax(s.data_ptr<float>(), (float)scale, p.data_ptr<float>(), s.size(0), s.size(1), stream()),
        "causal_softmax");
  return p;
}

Tensor causal_softmax_backward(const Tensor& gp_, const Tensor& p_, double scale) {
  Tensor gp = contig(gp_, "gp"), p = contig(p_, "p");
  same_device(gp, p, "causal_softmax_backward");
  TORCH_CHECK(p.dim() == 3 && p.size(1) == p.size(2) && gp.sizes() == p.sizes(), "repops.causal_softmax_backward: shapes");
  c10::cuda::CUDAGuard guard(p.device());
  Tensor gs = at::empty_like(p);
  check(rpc_causal_softmax_backward(gp.data_ptr<float>(), p.data_ptr<float>(), (float)scale, gs.data_ptr<float>(),
                                    p.size(0), p.size(1), stream()), "causal_softmax_backward");
  return gs;
}

Tensor swiglu(const Tensor& u_) {
  Tensor u = contig(u_, "u");
  TORCH_CHECK(u.dim() == 2 && u.size(1) % 2 == 0, "repops.swiglu: u [R, 2H]");
  c10::cuda::CUDAGuard guard(u.device());
  Tensor out = at::empty({u.size(0), u.size(1) / 2}, u.options());
  check(rpc_swiglu(u.data_ptr<float>(), out.data_ptr<float>(), u.size(0), u.size(1) / 2, stream()), "swiglu");
  return out;
}

Tensor swiglu_backward(const Tensor& g_, const Tensor& u_) {
  Tensor g = contig(g_, "g"), u = contig(u_, "u");
  same_device(g, u, "swiglu_backward");
  TORCH_CHECK(u.dim() == 2 && g.dim() == 2 && g.size(0) == u.size(0) && 2 * g.size(1) == u.size(1),
              "repops.swiglu_backward: shapes");
  c10::cuda::CUDAGuard guard(u.device());
  Tensor gu = at::empty_like(u);
  check(rpc_swiglu_backward(g.data_ptr<float>(), u.data_ptr<float>(), gu.data_ptr<float>(), u.size(0), g.size(1),
                            stream()), "swiglu_backward");
  return gu;
}

std::tuple<Tensor, Tensor> cross_entropy(const Tensor& z_, const Tensor& t_, double zloss) {
  Tensor z = contig(z_, "logits"), t = contig_idx(t_, "targets");
  same_device(z, t, "cross_entropy");
  TORCH_CHECK(z.dim() == 2 && t.dim() == 1 && t.size(0) == z.size(0) && z.size(1) > 0, "repops.cross_entropy: z [R, V], targets [R]");
  c10::cuda::CUDAGuard guard(z.device());
  check_range(t, z.size(1), "targets");
  Tensor loss = at::empty({}, z.options()), lse = at::empty({z.size(0)}, z.options());
  Tensor row_loss = at::empty({z.size(0)}, z.options());
  check(rpc_cross_entropy(z.data_ptr<float>(), t.data_ptr<int64_t>(), (float)zloss, inv(z.size(0)),
                          loss.data_ptr<float>(), lse.data_ptr<float>(), row_loss.data_ptr<float>(), z.size(0),
                          z.size(1), stream()), "cross_entropy");
  return {loss, lse};
}

Tensor cross_entropy_backward(const Tensor& g_, const Tensor& z_, const Tensor& t_, const Tensor& lse_, double zloss) {
  Tensor z = contig(z_, "logits"), t = contig_idx(t_, "targets"), lse = contig(lse_, "lse");
  TORCH_CHECK(g_.numel() == 1 && g_.scalar_type() == at::kFloat, "repops.cross_entropy_backward: g is a float32 scalar");
  Tensor g = g_.to(z.device()).contiguous();  // data movement only (a CPU scalar is accepted)
  TORCH_CHECK(z.dim() == 2 && t.numel() == z.size(0) && lse.numel() == z.size(0), "repops.cross_entropy_backward: shapes");
  same_device(z, t, "cross_entropy_backward");
  same_device(z, lse, "cross_entropy_backward");
  c10::cuda::CUDAGuard guard(z.device());
  check_range(t, z.size(1), "targets");
  const float two_z = (float)(2.0 * (double)(float)zloss);  // host scalar 2*zloss, as the CPU kernel
  Tensor gz = at::empty_like(z);
  check(rpc_cross_entropy_backward(g.data_ptr<float>(), z.data_ptr<float>(), t.data_ptr<int64_t>(),
                                   lse.data_ptr<float>(), inv(z.size(0)), two_z, gz.data_ptr<float>(), z.size(0),
                                   z.size(1), stream()), "cross_entropy_backward");
  return gz;
}

Tensor embedding(const Tensor& w_, const Tensor& idx_) {
  Tensor w = contig(w_, "weight"), idx = contig_idx(idx_, "idx");
  same_device(w, idx, "embedding");
  TORCH_CHECK(w.dim() == 2 && idx.dim() == 1, "repops.embedding: weight [V, D], idx [N]");
  c10::cuda::CUDAGuard guard(w.device());
  check_range(idx, w.size(0), "token ids");
  Tensor out = at::empty({idx.size(0), w.size(1)}, w.options());
  check(rpc_embedding(w.data_ptr<float>(), idx.data_ptr<int64_t>(), out.data_ptr<float>(), idx.size(0), w.size(1),
                      stream()), "embedding");
  return out;
}

Tensor embedding_backward(const Tensor& g_, const Tensor& idx_, int64_t num_rows) {
  Tensor g = contig(g_, "g"), idx = contig_idx(idx_, "idx");
  same_device(g, idx, "embedding_backward");
  TORCH_CHECK(g.dim() == 2 && idx.dim() == 1 && idx.size(0) == g.size(0), "repops.embedding_backward: g [N, D], idx [N]");
  c10::cuda::CUDAGuard guard(g.device());
  check_range(idx, num_rows, "token ids");
  Tensor gw = at::empty({num_rows, g.size(1)}, g.options());
  check(rpc_embedding_backward(g.data_ptr<float>(), idx.data_ptr<int64_t>(), gw.data_ptr<float>(), g.size(0),
                               num_rows, g.size(1), stream()), "embedding_backward");
  return gw;
}

using BinaryFn = cudaError_t (*)(const float*, const float*, float*, int64_t, cudaStream_t);
Tensor binary(const Tensor& a_, const Tensor& b_, BinaryFn fn, const char* name) {
  Tensor a = contig(a_, "a"), b = contig(b_, "b");
  same_device(a, b, name);
  TORCH_CHECK(a.sizes() == b.sizes(), "repops.", name, ": shapes differ: ", a.sizes(), " vs ", b.sizes());
  c10::cuda::CUDAGuard guard(a.device());
  Tensor y = at::empty_like(a);
  check(fn(a.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(), a.numel(), stream()), name);
  return y;
}
Tensor add(const Tensor& a, const Tensor& b) { return binary(a, b, rpc_add, "add"); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(a, b, rpc_mul, "mul"); }

Tensor scale(const Tensor& a_, double s) {
  Tensor a = contig(a_, "a");
  c10::cuda::CUDAGuard guard(a.device());
  Tensor y = at::empty_like(a);
  check(rpc_scale(a.data_ptr<float>(), (float)s, y.data_ptr<float>(), a.numel(), stream()), "scale");
  return y;
}

Tensor unary(const Tensor& x_, RpFn fn) {
  Tensor x = contig(x_, "x");
  c10::cuda::CUDAGuard guard(x.device());
  Tensor y = at::empty_like(x);
  check(rpc_unary(fn, x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), stream()), "unary");
  return y;
}

Tensor csum(const Tensor& x_) {
  Tensor x = contig(x_, "x");
  TORCH_CHECK(x.dim() >= 1, "repops.csum: at least 1-D");
  c10::cuda::CUDAGuard guard(x.device());
  Tensor y = at::empty(x.sizes().slice(0, x.dim() - 1), x.options());
  check(rpc_csum_rows(x.data_ptr<float>(), y.data_ptr<float>(), y.numel(), x.size(-1), stream()), "csum");
  return y;
}

Tensor dropout(const Tensor& x_, double p, int64_t seed, int64_t c1, int64_t c2) {
  Tensor x = contig(x_, "x");
  TORCH_CHECK(p >= 0.0 && p < 1.0, "repops.dropout: p must be in [0, 1)");
  // Host scalars (contract §6), exactly as kernels/cpu/binding.cpp computes them.
  const double th = std::nearbyint((1.0 - p) * 4294967296.0);
  const uint32_t threshold = th >= 4294967295.0 ? 0xFFFFFFFFu : (uint32_t)th;
  const float sc = (float)(1.0 / (1.0 - p));
  c10::cuda::CUDAGuard guard(x.device());
  Tensor y = at::empty_like(x);
  check(rpc_dropout(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), threshold, sc, (uint64_t)seed, (uint32_t)c1,
                    (uint32_t)c2, stream()), "dropout");
  return y;
}

void adamw_(const Tensor& p, const Tensor& g_, const Tensor& m, const Tensor& v, double lr, double b1, double b2,
            double omb1, double omb2, double eps, double decay, double bc1, double bc2) {
  Tensor g = contig(g_, "grad");
  for (auto* t : {&p, &m, &v}) {
    check_f32(*t, "adamw state");
    same_device(g, *t, "adamw_");
    TORCH_CHECK(t->is_contiguous() && t->sizes() == g.sizes(), "repops.adamw_: p, m, v must be contiguous and match g");
  }
  c10::cuda::CUDAGuard guard(g.device());
  check(rpc_adamw(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), g.numel(),
                  (float)lr, (float)b1, (float)b2, (float)omb1, (float)omb2, (float)eps, (float)decay, (float)bc1,
                  (float)bc2, stream()), "adamw_");
}

std::tuple<Tensor, Tensor> clip_grad(const Tensor& g_, double max_norm) {
  Tensor g = contig(g_, "grad");
  c10::cuda::CUDAGuard guard(g.device());
  Tensor out = at::empty_like(g), norm = at::empty({}, g.options()), coef = at::empty({1}, g.options());
  check(rpc_clip_grad(g.data_ptr<float>(), (float)max_norm, out.data_ptr<float>(), norm.data_ptr<float>(),
                      coef.data_ptr<float>(), g.numel(), stream()), "clip_grad");
  return {out, norm};
}

// ------------------------------------------------------------ ops without tensor inputs
uint32_t u32(int64_t v, const char* name) {
  TORCH_CHECK(v >= 0 && v <= 0xFFFFFFFFLL, "repops: ", name, " must fit in 32 unsigned bits, got ", v);
  return (uint32_t)v;
}
at::TensorOptions on_cuda(at::ScalarType t) {
  return at::TensorOptions().dtype(t).device(at::kCUDA, c10::cuda::current_device());
}

std::tuple<Tensor, Tensor> rope_tables_cuda(int64_t T, int64_t Dh, double theta) {
  TORCH_CHECK(T >= 0 && Dh > 0 && Dh % 2 == 0, "repops.rope_tables: head_dim must be even");
  Tensor c = at::empty({T, Dh / 2}, on_cuda(at::kFloat)), s = at::empty({T, Dh / 2}, on_cuda(at::kFloat));
  check(rpc_rope_tables(T, Dh, (float)theta, inv(Dh), c.data_ptr<float>(), s.data_ptr<float>(), stream()),
        "rope_tables");
  return {c, s};
}

Tensor philox_cuda(int64_t seed, int64_t c1, int64_t c2, int64_t purpose, int64_t n, int64_t block_offset) {
  TORCH_CHECK(n >= 0, "repops.philox: n >= 0");
  Tensor out = at::empty({n}, on_cuda(at::kLong));
  check(rpc_philox((uint64_t)seed, u32(c1, "c1"), u32(c2, "c2"), u32(purpose, "purpose"),
                   u32(block_offset, "block_offset"), out.data_ptr<int64_t>(), n, stream()), "philox");
  return out;
}

Tensor uniform_cuda(int64_t seed, int64_t c1, int64_t c2, int64_t purpose, int64_t n) {
  Tensor out = at::empty({n}, on_cuda(at::kFloat));
  check(rpc_uniform((uint64_t)seed, u32(c1, "c1"), u32(c2, "c2"), u32(purpose, "purpose"), out.data_ptr<float>(), n,
                    stream()), "uniform");
  return out;
}

Tensor normal_cuda(int64_t seed, int64_t c1, int64_t c2, int64_t purpose, int64_t n) {
  Tensor out = at::empty({n}, on_cuda(at::kFloat));
  check(rpc_normal((uint64_t)seed, u32(c1, "c1"), u32(c2, "c2"), u32(purpose, "purpose"), out.data_ptr<float>(), n,
                   stream()), "normal");
  return out;
}

Tensor canary_cuda() {
  Tensor out = at::empty({2}, on_cuda(at::kFloat));
  check(rpc_canary(out.data_ptr<float>(), stream()), "canary");
  return out;
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(repops, m) {
  m.def("rope_tables_cuda(int T, int head_dim, float theta) -> (Tensor, Tensor)");
  m.def("philox_cuda(int seed, int c1, int c2, int purpose, int n, int block_offset=0) -> Tensor");
  m.def("uniform_cuda(int seed, int c1, int c2, int purpose, int n) -> Tensor");
  m.def("normal_cuda(int seed, int c1, int c2, int purpose, int n) -> Tensor");
  m.def("canary_cuda() -> Tensor");
}

TORCH_LIBRARY_IMPL(repops, CUDA, m) {
  m.impl("matmul", matmul);
  m.impl("rmsnorm", rmsnorm);
  m.impl("rmsnorm_backward", rmsnorm_backward);
  m.impl("rope", rope);
  m.impl("causal_softmax", causal_softmax);
  m.impl("causal_softmax_backward", causal_softmax_backward);
  m.impl("swiglu", swiglu);
  m.impl("swiglu_backward", swiglu_backward);
  m.impl("cross_entropy", cross_entropy);
  m.impl("cross_entropy_backward", cross_entropy_backward);
  m.impl("embedding", embedding);
  m.impl("embedding_backward", embedding_backward);
  m.impl("add", add);
  m.impl("mul", mul);
  m.impl("scale", scale);
  m.impl("dropout", dropout);
  m.impl("adamw_", adamw_);
  m.impl("clip_grad", clip_grad);
  m.impl("csum", csum);
  m.impl("exp", [](const Tensor& x) { return unary(x, RpFn::Exp); });
  m.impl("log", [](const Tensor& x) { return unary(x, RpFn::Log); });
  m.impl("recip", [](const Tensor& x) { return unary(x, RpFn::Recip); });
  m.impl("rsqrt", [](const Tensor& x) { return unary(x, RpFn::Rsqrt); });
  m.impl("sqrt", [](const Tensor& x) { return unary(x, RpFn::Sqrt); });
  m.impl("sin", [](const Tensor& x) { return unary(x, RpFn::Sin); });
  m.impl("cos", [](const Tensor& x) { return unary(x, RpFn::Cos); });
}

// No tensor inputs: nothing to dispatch on, so these run wherever they are called.
TORCH_LIBRARY_IMPL(repops, CompositeExplicitAutograd, m) {
  m.impl("rope_tables_cuda", rope_tables_cuda);
  m.impl("philox_cuda", philox_cuda);
  m.impl("uniform_cuda", uniform_cuda);
  m.impl("normal_cuda", normal_cuda);
  m.impl("canary_cuda", canary_cuda);
}
