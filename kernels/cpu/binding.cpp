// binding.cpp -- registers the CPU kernels with torch as custom ops (torch.ops.repops.*).
// The only file that includes torch headers. It checks shapes, dtypes and devices, allocates
// outputs, turns host scalars into float32 (contract §1) and calls the raw kernels.
// Threads: rp_parallel_for maps onto PyTorch's intra-op pool (at::parallel_for).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>

#include "kernels.h"

void rp_parallel_for(int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t), void* ctx) {
  at::parallel_for(0, n, grain, [&](int64_t b, int64_t e) { fn(ctx, b, e); });
}

namespace {
using at::Tensor;

void check_f32(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "repops: ", name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat, "repops: ", name, " must be float32, got ", t.scalar_type());
}
Tensor contig(const Tensor& t, const char* name) { check_f32(t, name); return t.contiguous(); }
Tensor contig_idx(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kLong, "repops: ", name, " must be a CPU int64 tensor");
  return t.contiguous();
}
void check_range(const Tensor& idx, int64_t hi, const char* name) {
  const int64_t* p = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i)
    TORCH_CHECK(p[i] >= 0 && p[i] < hi, "repops: ", name, " out of range [0, ", hi, "): found ", p[i], " at ", i);
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_f32(a, "a");
  check_f32(b, "b");
  TORCH_CHECK(a.dim() >= 2 && a.dim() <= 3 && b.dim() >= 2 && b.dim() <= 3, "repops.matmul: 2-D or 3-D operands");
  TORCH_CHECK(a.size(-1) == b.size(-2), "repops.matmul: inner sizes differ: ", a.sizes(), " @ ", b.sizes());
  const int64_t batch = a.dim() == 3 ? a.size(0) : (b.dim() == 3 ? b.size(0) : 1);
  TORCH_CHECK((a.dim() == 2 || a.size(0) == batch) && (b.dim() == 2 || b.size(0) == batch), "repops.matmul: batch sizes differ");
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  const int64_t sab = a.dim() == 3 ? a.stride(0) : 0, sbb = b.dim() == 3 ? b.stride(0) : 0;
  Tensor c = (a.dim() == 3 || b.dim() == 3) ? at::empty({batch, M, N}, a.options()) : at::empty({M, N}, a.options());
  rp_matmul(a.data_ptr<float>(), sab, a.stride(-2), a.stride(-1), b.data_ptr<float>(), sbb, b.stride(-2),
            b.stride(-1), c.data_ptr<float>(), batch, M, N, K);
  return c;
}

std::tuple<Tensor, Tensor> rmsnorm(const Tensor& x_, const Tensor& w_, double eps) {
  Tensor x = contig(x_, "x"), w = contig(w_, "w");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 1 && w.size(0) == x.size(1), "repops.rmsnorm: x [R, D], w [D]");
  Tensor y = at::empty_like(x), rstd = at::empty({x.size(0)}, x.options());
  rp_rmsnorm(x.data_ptr<float>(), w.data_ptr<float>(), (float)eps, y.data_ptr<float>(), rstd.data_ptr<float>(),
             x.size(0), x.size(1));
  return {y, rstd};
}

std::tuple<Tensor, Tensor> rmsnorm_backward(const Tensor& gy_, const Tensor& x_, const Tensor& w_, const Tensor& rstd_) {
  Tensor gy = contig(gy_, "gy"), x = contig(x_, "x"), w = contig(w_, "w"), rstd = contig(rstd_, "rstd");
  TORCH_CHECK(gy.sizes() == x.sizes() && x.dim() == 2 && rstd.numel() == x.size(0) && w.dim() == 1 &&
                  w.size(0) == x.size(1),
              "repops.rmsnorm_backward: shapes");
  Tensor gx = at::empty_like(x), gw = at::empty_like(w);
  rp_rmsnorm_backward(gy.data_ptr<float>(), x.data_ptr<float>(), w.data_ptr<float>(), rstd.data_ptr<float>(),
                      gx.data_ptr<float>(), gw.data_ptr<float>(), x.size(0), x.size(1));
  return {gx, gw};
}

std::tuple<Tensor, Tensor> rope_tables(int64_t T, int64_t Dh, double theta) {
  TORCH_CHECK(T >= 0 && Dh > 0 && Dh % 2 == 0, "repops.rope_tables: head_dim must be even");
  auto opt = at::TensorOptions().dtype(at::kFloat);
  Tensor c = at::empty({T, Dh / 2}, opt), s = at::empty({T, Dh / 2}, opt);
  rp_rope_tables(T, Dh, (float)theta, c.data_ptr<float>(), s.data_ptr<float>());
  return {c, s};
}

Tensor rope(const Tensor& x_, const Tensor& c_, const Tensor& s_, bool backward) {
  Tensor x = contig(x_, "x"), c = contig(c_, "cos"), s = contig(s_, "sin");
  TORCH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "repops.rope: x [B, T, H, Dh] with even Dh");
  TORCH_CHECK(c.dim() == 2 && c.size(0) >= x.size(1) && c.size(1) == x.size(3) / 2 && s.sizes() == c.sizes(),
              "repops.rope: tables [>=T, Dh/2]");
  Tensor y = at::empty_like(x);
  rp_rope(x.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1),
          x.size(2), x.size(3), backward);
  return y;
}

Tensor causal_softmax(const Tensor& s_, double scale) {
  Tensor s = contig(s_, "s");
  TORCH_CHECK(s.dim() == 3 && s.size(1) == s.size(2), "repops.causal_softmax: s [BH, T, T]");
  Tensor p = at::empty_like(s);
  rp_causal_softmax(s.data_ptr<float>(), (float)scale, p.data_ptr<float>(), s.size(0), s.size(1));
  return p;
}

Tensor causal_softmax_backward(const Tensor& gp_, const Tensor& p_, double scale) {
  Tensor gp = contig(gp_, "gp"), p = contig(p_, "p");
  TORCH_CHECK(p.dim() == 3 && p.size(1) == p.size(2) && gp.sizes() == p.sizes(), "repops.causal_softmax_backward: shapes");
  Tensor gs = at::empty_like(p);
  rp_causal_softmax_backward(gp.data_ptr<float>(), p.data_ptr<float>(), (float)scale, gs.data_ptr<float>(), p.size(0),
                             p.size(1));
  return gs;
}

Tensor swiglu(const Tensor& u_) {
  Tensor u = contig(u_, "u");
  TORCH_CHECK(u.dim() == 2 && u.size(1) % 2 == 0, "repops.swiglu: u [R, 2H]");
  Tensor out = at::empty({u.size(0), u.size(1) / 2}, u.options());
  rp_swiglu(u.data_ptr<float>(), out.data_ptr<float>(), u.size(0), u.size(1) / 2);
  return out;
}

Tensor swiglu_backward(const Tensor& g_, const Tensor& u_) {
  Tensor g = contig(g_, "g"), u = contig(u_, "u");
  TORCH_CHECK(u.dim() == 2 && g.dim() == 2 && g.size(0) == u.size(0) && 2 * g.size(1) == u.size(1),
              "repops.swiglu_backward: shapes");
  Tensor gu = at::empty_like(u);
  rp_swiglu_backward(g.data_ptr<float>(), u.data_ptr<float>(), gu.data_ptr<float>(), u.size(0), g.size(1));
  return gu;
}

std::tuple<Tensor, Tensor> cross_entropy(const Tensor& z_, const Tensor& t_, double zloss) {
  Tensor z = contig(z_, "logits"), t = contig_idx(t_, "targets");
  TORCH_CHECK(z.dim() == 2 && t.dim() == 1 && t.size(0) == z.size(0) && z.size(1) > 0, "repops.cross_entropy: z [R, V], targets [R]");
  check_range(t, z.size(1), "targets");
  Tensor loss = at::empty({}, z.options()), lse = at::empty({z.size(0)}, z.options());
  rp_cross_entropy(z.data_ptr<float>(), t.data_ptr<int64_t>(), (float)zloss, loss.data_ptr<float>(),
                   lse.data_ptr<float>(), z.size(0), z.size(1));
  return {loss, lse};
}

Tensor cross_entropy_backward(const Tensor& g_, const Tensor& z_, const Tensor& t_, const Tensor& lse_, double zloss) {
  Tensor g = contig(g_, "g"), z = contig(z_, "logits"), t = contig_idx(t_, "targets"), lse = contig(lse_, "lse");
  TORCH_CHECK(g.numel() == 1 && z.dim() == 2 && t.numel() == z.size(0) && lse.numel() == z.size(0),
              "repops.cross_entropy_backward: shapes");
  check_range(t, z.size(1), "targets");
  Tensor gz = at::empty_like(z);
  rp_cross_entropy_backward(g.item<float>(), z.data_ptr<float>(), t.data_ptr<int64_t>(), lse.data_ptr<float>(),
                            (float)zloss, gz.data_ptr<float>(), z.size(0), z.size(1));
  return gz;
}

Tensor embedding(const Tensor& w_, const Tensor& idx_) {
  Tensor w = contig(w_, "weight"), idx = contig_idx(idx_, "idx");
  TORCH_CHECK(w.dim() == 2 && idx.dim() == 1, "repops.embedding: weight [V, D], idx [N]");
  check_range(idx, w.size(0), "token ids");
  Tensor out = at::empty({idx.size(0), w.size(1)}, w.options());
  rp_embedding(w.data_ptr<float>(), idx.data_ptr<int64_t>(), out.data_ptr<float>(), idx.size(0), w.size(1));
  return out;
}

Tensor embedding_backward(const Tensor& g_, const Tensor& idx_, int64_t num_rows) {
  Tensor g = contig(g_, "g"), idx = contig_idx(idx_, "idx");
  TORCH_CHECK(g.dim() == 2 && idx.dim() == 1 && idx.size(0) == g.size(0), "repops.embedding_backward: g [N, D], idx [N]");
  check_range(idx, num_rows, "token ids");
  Tensor gw = at::empty({num_rows, g.size(1)}, g.options());
  rp_embedding_backward(g.data_ptr<float>(), idx.data_ptr<int64_t>(), gw.data_ptr<float>(), g.size(0), num_rows,
                        g.size(1));
  return gw;
}

Tensor binary(const Tensor& a_, const Tensor& b_, void (*fn)(const float*, const float*, float*, int64_t), const char* name) {
  Tensor a = contig(a_, "a"), b = contig(b_, "b");
  TORCH_CHECK(a.sizes() == b.sizes(), "repops.", name, ": shapes differ: ", a.sizes(), " vs ", b.sizes());
  Tensor y = at::empty_like(a);
  fn(a.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(), a.numel());
  return y;
}
Tensor add(const Tensor& a, const Tensor& b) { return binary(a, b, rp_add, "add"); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(a, b, rp_mul, "mul"); }

Tensor scale(const Tensor& a_, double s) {
  Tensor a = contig(a_, "a"), y = at::empty_like(a);
  rp_scale(a.data_ptr<float>(), (float)s, y.data_ptr<float>(), a.numel());
  return y;
}

Tensor unary(const Tensor& x_, RpFn fn) {
  Tensor x = contig(x_, "x"), y = at::empty_like(x);
  rp_unary(fn, x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  return y;
}

Tensor csum(const Tensor& x_) {
  Tensor x = contig(x_, "x");
  TORCH_CHECK(x.dim() >= 1, "repops.csum: at least 1-D");
  const int64_t n = x.size(-1), rows = n == 0 ? 0 : x.numel() / n;
  Tensor y = at::empty(x.sizes().slice(0, x.dim() - 1), x.options());
  if (n == 0) return y.zero_();
  rp_csum_rows(x.data_ptr<float>(), y.data_ptr<float>(), rows, n);
  return y;
}

Tensor dropout(const Tensor& x_, double p, int64_t seed, int64_t c1, int64_t c2) {
  Tensor x = contig(x_, "x");
  TORCH_CHECK(p >= 0.0 && p < 1.0, "repops.dropout: p must be in [0, 1)");
  // Host scalars (contract §6): keep threshold round((1-p) 2^32) clamped, scale f32(1/(1-p)).
  const double th = std::nearbyint((1.0 - p) * 4294967296.0);
  const uint32_t threshold = th >= 4294967295.0 ? 0xFFFFFFFFu : (uint32_t)th;
  const float sc = (float)(1.0 / (1.0 - p));
  Tensor y = at::empty_like(x);
  rp_dropout(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), threshold, sc, (uint64_t)seed, (uint32_t)c1,
             (uint32_t)c2);
  return y;
}

void adamw_(const Tensor& p, const Tensor& g_, const Tensor& m, const Tensor& v, double lr, double b1, double b2,
            double omb1, double omb2, double eps, double decay, double bc1, double bc2) {
  Tensor g = contig(g_, "grad");
  for (auto* t : {&p, &m, &v}) {
    check_f32(*t, "adamw state");
    TORCH_CHECK(t->is_contiguous() && t->sizes() == g.sizes(), "repops.adamw_: p, m, v must be contiguous and match g");
  }
  rp_adamw(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), g.numel(), (float)lr,
           (float)b1, (float)b2, (float)omb1, (float)omb2, (float)eps, (float)decay, (float)bc1, (float)bc2);
}

std::tuple<Tensor, Tensor> clip_grad(const Tensor& g_, double max_norm) {
  Tensor g = contig(g_, "grad");
  Tensor out = at::empty_like(g), norm = at::empty({}, g.options());
  rp_clip_grad(g.data_ptr<float>(), (float)max_norm, out.data_ptr<float>(), norm.data_ptr<float>(), g.numel());
  return {out, norm};
}

uint32_t u32(int64_t v, const char* name) {
  TORCH_CHECK(v >= 0 && v <= 0xFFFFFFFFLL, "repops: ", name, " must fit in 32 unsigned bits, got ", v);
  return (uint32_t)v;
}

Tensor philox(int64_t seed, int64_t c1, int64_t c2, int64_t purpose, int64_t n, int64_t block_offset) {
  TORCH_CHECK(n >= 0, "repops.philox: n >= 0");
  std::vector<uint32_t> w(n);
  rp_philox((uint64_t)seed, u32(c1, "c1"), u32(c2, "c2"), u32(purpose, "purpose"), u32(block_offset, "block_offset"),
            w.data(), n);
  Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kLong));
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) o[i] = w[i];
  return out;
}

Tensor uniform(int64_t seed, int64_t c1, int64_t c2, int64_t purpose, int64_t n) {
  Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
  rp_uniform((uint64_t)seed, u32(c1, "c1"), u32(c2, "c2"), u32(purpose, "purpose"), out.data_ptr<float>(), n);
  return out;
}

Tensor normal(int64_t seed, int64_t c1, int64_t c2, int64_t purpose, int64_t n) {
  Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
  rp_normal((uint64_t)seed, u32(c1, "c1"), u32(c2, "c2"), u32(purpose, "purpose"), out.data_ptr<float>(), n);
  return out;
}

Tensor canary() {
  Tensor out = at::empty({2}, at::TensorOptions().dtype(at::kFloat));
  rp_canary(out.data_ptr<float>());
  return out;
}
}  // namespace

TORCH_LIBRARY(repops, m) {
  m.def("matmul(Tensor a, Tensor b) -> Tensor");
  m.def("rmsnorm(Tensor x, Tensor w, float eps) -> (Tensor, Tensor)");
  m.def("rmsnorm_backward(Tensor gy, Tensor x, Tensor w, Tensor rstd) -> (Tensor, Tensor)");
  m.def("rope_tables(int T, int head_dim, float theta) -> (Tensor, Tensor)");
  m.def("rope(Tensor x, Tensor cos, Tensor sin, bool backward) -> Tensor");
  m.def("causal_softmax(Tensor s, float scale) -> Tensor");
  m.def("causal_softmax_backward(Tensor gp, Tensor p, float scale) -> Tensor");
  m.def("swiglu(Tensor u) -> Tensor");
  m.def("swiglu_backward(Tensor g, Tensor u) -> Tensor");
  m.def("cross_entropy(Tensor z, Tensor targets, float zloss) -> (Tensor, Tensor)");
  m.def("cross_entropy_backward(Tensor g, Tensor z, Tensor targets, Tensor lse, float zloss) -> Tensor");
  m.def("embedding(Tensor w, Tensor idx) -> Tensor");
  m.def("embedding_backward(Tensor g, Tensor idx, int num_rows) -> Tensor");
  m.def("add(Tensor a, Tensor b) -> Tensor");
  m.def("mul(Tensor a, Tensor b) -> Tensor");
  m.def("scale(Tensor a, float s) -> Tensor");
  m.def("dropout(Tensor x, float p, int seed, int c1, int c2) -> Tensor");
  m.def("adamw_(Tensor(a!) p, Tensor g, Tensor(b!) m, Tensor(c!) v, float lr, float b1, float b2, float omb1, "
        "float omb2, float eps, float decay, float bc1, float bc2) -> ()");
  m.def("clip_grad(Tensor g, float max_norm) -> (Tensor, Tensor)");
  m.def("csum(Tensor x) -> Tensor");
  for (const char* fn : {"exp", "log", "recip", "rsqrt", "sqrt", "sin", "cos"})
    m.def((std::string(fn) + "(Tensor x) -> Tensor").c_str());
  m.def("philox(int seed, int c1, int c2, int purpose, int n, int block_offset=0) -> Tensor");
  m.def("uniform(int seed, int c1, int c2, int purpose, int n) -> Tensor");
  m.def("normal(int seed, int c1, int c2, int purpose, int n) -> Tensor");
  m.def("canary() -> Tensor");
}

TORCH_LIBRARY_IMPL(repops, CPU, m) {
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

// Ops with no tensor inputs cannot be dispatched by device: they are CPU-only backend-select.
TORCH_LIBRARY_IMPL(repops, CompositeExplicitAutograd, m) {
  m.impl("rope_tables", rope_tables);
  m.impl("philox", philox);
  m.impl("uniform", uniform);
  m.impl("normal", normal);
  m.impl("canary", canary);
}
