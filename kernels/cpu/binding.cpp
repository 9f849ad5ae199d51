// binding.cpp -- registers the CPU kernels with torch as custom ops (torch.ops.repops.*).
// The only CPU source with torch headers. It checks every argument with the checks it shares
// with the CUDA binding (kernels/common/binding_common.h), allocates outputs, turns host
// scalars into float32 (contract §1) and calls the raw kernels.
// Threads: rp_parallel_for maps onto PyTorch's intra-op pool (at::parallel_for).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "binding_common.h"
#include "kernels.h"

void rp_parallel_for(int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t), void* ctx) {
  at::parallel_for(0, n, grain, [&](int64_t b, int64_t e) { fn(ctx, b, e); });
}

int rp_threads() { return at::get_num_threads(); }

namespace {
using at::Tensor;
constexpr at::DeviceType kDev = at::kCPU;  // where every tensor argument must be

Tensor matmul(const Tensor& a, const Tensor& b) {
  const rpb::MatmulShape s = rpb::matmul_shape(kDev, a, b);
  Tensor c = at::empty(s.out, a.options());
  rp_matmul(a.data_ptr<float>(), s.sab, a.stride(-2), a.stride(-1), b.data_ptr<float>(), s.sbb, b.stride(-2),
            b.stride(-1), c.data_ptr<float>(), s.batch, s.M, s.N, s.K);
  return c;
}

std::tuple<Tensor, Tensor> rmsnorm(const Tensor& x_, const Tensor& w_, double eps) {
  auto [x, w] = rpb::rmsnorm_args(kDev, x_, w_);
  Tensor y = at::empty_like(x), rstd = at::empty({x.size(0)}, x.options());
  rp_rmsnorm(x.data_ptr<float>(), w.data_ptr<float>(), (float)eps, y.data_ptr<float>(), rstd.data_ptr<float>(),
             x.size(0), x.size(1));
  return {y, rstd};
}

std::tuple<Tensor, Tensor> rmsnorm_backward(const Tensor& gy_, const Tensor& x_, const Tensor& w_, const Tensor& rstd_) {
  auto [gy, x, w, rstd] = rpb::rmsnorm_backward_args(kDev, gy_, x_, w_, rstd_);
  Tensor gx = at::empty_like(x), gw = at::empty_like(w);
  rp_rmsnorm_backward(gy.data_ptr<float>(), x.data_ptr<float>(), w.data_ptr<float>(), rstd.data_ptr<float>(),
                      gx.data_ptr<float>(), gw.data_ptr<float>(), x.size(0), x.size(1));
  return {gx, gw};
}

std::tuple<Tensor, Tensor> rope_tables(int64_t T, int64_t Dh, double theta) {
  rpb::check_rope_tables(T, Dh);
  auto opt = at::TensorOptions().dtype(at::kFloat);
  Tensor c = at::empty({T, Dh / 2}, opt), s = at::empty({T, Dh / 2}, opt);
  rp_rope_tables(T, Dh, (float)theta, c.data_ptr<float>(), s.data_ptr<float>());
  return {c, s};
}

Tensor rope(const Tensor& x_, const Tensor& c_, const Tensor& s_, bool backward) {
  const rpb::RopeCall r = rpb::rope_args(kDev, x_, c_, s_, backward);
  rp_rope(r.x.data_ptr<float>(), r.xs, r.c.data_ptr<float>(), r.s.data_ptr<float>(), r.y.data_ptr<float>(), r.ys, r.B,
          r.T, r.H, r.Dh, backward);
  return r.y;
}

Tensor causal_softmax(const Tensor& s_, double scale) {
  Tensor s = rpb::causal_softmax_args(kDev, s_);
  Tensor p = at::empty_like(s);
  rp_causal_softmax(s.data_ptr<float>(), (float)scale, p.data_ptr<float>(), s.size(0), s.size(1));
  return p;
}

Tensor causal_softmax_backward(const Tensor& gp_, const Tensor& p_, double scale) {
  auto [gp, p] = rpb::causal_softmax_backward_args(kDev, gp_, p_);
  Tensor gs = at::empty_like(p);
  rp_causal_softmax_backward(gp.data_ptr<float>(), p.data_ptr<float>(), (float)scale, gs.data_ptr<float>(), p.size(0),
                             p.size(1));
  return gs;
}

// Full causal attention head by head (CPU only: repops.causal_attention composes the ops elsewhere).
// q [batch, G*T, D], k and v [batch, T, D] -> (o [batch, G*T, D], p [batch, G*T, T]).
struct AttentionArgs {
  Tensor q, k, v;
  int64_t batch, G, T, D;
};
AttentionArgs attention_args(const Tensor& q_, const Tensor& k_, const Tensor& v_, const char* op) {
  Tensor q = rpb::contig(kDev, q_, "q"), k = rpb::contig(kDev, k_, "k"), v = rpb::contig(kDev, v_, "v");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && k.sizes() == v.sizes() && q.size(0) == k.size(0) &&
                  q.size(2) == k.size(2) && k.size(1) >= 1 && q.size(1) % k.size(1) == 0,
              "repops.", op, ": q [batch, G*T, D], k and v [batch, T, D]");
  return {q, k, v, q.size(0), q.size(1) / k.size(1), k.size(1), k.size(2)};
}

std::tuple<Tensor, Tensor> causal_attention(const Tensor& q_, const Tensor& k_, const Tensor& v_, double scale) {
  const AttentionArgs a = attention_args(q_, k_, v_, "causal_attention");
  Tensor o = at::empty_like(a.q), p = at::empty({a.batch, a.G * a.T, a.T}, a.q.options());
  rp_causal_attention(a.q.data_ptr<float>(), a.k.data_ptr<float>(), a.v.data_ptr<float>(), (float)scale,
                      o.data_ptr<float>(), p.data_ptr<float>(), a.batch, a.G, a.T, a.D);
  return {o, p};
}

std::tuple<Tensor, Tensor, Tensor> causal_attention_backward(const Tensor& go_, const Tensor& q_, const Tensor& k_,
                                                             const Tensor& v_, const Tensor& p_, double scale) {
  const AttentionArgs a = attention_args(q_, k_, v_, "causal_attention_backward");
  const Tensor go = rpb::contig(kDev, go_, "go"), p = rpb::contig(kDev, p_, "p");
  TORCH_CHECK(go.sizes() == a.q.sizes() && p.dim() == 3 && p.size(0) == a.batch && p.size(1) == a.G * a.T &&
                  p.size(2) == a.T,
              "repops.causal_attention_backward: go like q, p [batch, G*T, T]");
  Tensor gq = at::empty_like(a.q), gk = at::empty_like(a.k), gv = at::empty_like(a.v);
  rp_causal_attention_backward(go.data_ptr<float>(), a.q.data_ptr<float>(), a.k.data_ptr<float>(),
                               a.v.data_ptr<float>(), p.data_ptr<float>(), (float)scale, gq.data_ptr<float>(),
                               gk.data_ptr<float>(), gv.data_ptr<float>(), a.batch, a.G, a.T, a.D);
  return {gq, gk, gv};
}

Tensor band_scores(const Tensor& a_, const Tensor& b_, int64_t W) {
  auto [a, b, sh] = rpb::band_scores_args(kDev, a_, b_, W);
  Tensor s = at::empty({sh.batch, sh.M, sh.W}, a.options());
  rp_band_scores(a.data_ptr<float>(), b.data_ptr<float>(), s.data_ptr<float>(), sh.batch, sh.M, sh.T, sh.D, sh.W);
  return s;
}

Tensor band_mix(const Tensor& p_, const Tensor& b_) {
  auto [p, b, sh] = rpb::band_mix_args(kDev, p_, b_);
  Tensor o = at::empty({sh.batch, sh.M, sh.D}, p.options());
  rp_band_mix(p.data_ptr<float>(), b.data_ptr<float>(), o.data_ptr<float>(), sh.batch, sh.M, sh.T, sh.D, sh.W);
  return o;
}

Tensor band_mix_t(const Tensor& p_, const Tensor& a_, int64_t T) {
  auto [p, a, sh] = rpb::band_mix_t_args(kDev, p_, a_, T);
  Tensor o = at::empty({sh.batch, sh.T, sh.D}, p.options());
  rp_band_mix_t(p.data_ptr<float>(), a.data_ptr<float>(), o.data_ptr<float>(), sh.batch, sh.M, sh.T, sh.D, sh.W);
  return o;
}

Tensor window_softmax(const Tensor& s_, double scale) {
  Tensor s = rpb::window_softmax_args(kDev, s_);
  Tensor p = at::empty_like(s);
  rp_window_softmax(s.data_ptr<float>(), (float)scale, p.data_ptr<float>(), s.size(0) * s.size(1), s.size(1),
                    s.size(2));
  return p;
}

Tensor window_softmax_backward(const Tensor& gp_, const Tensor& p_, double scale) {
  auto [gp, p] = rpb::window_softmax_backward_args(kDev, gp_, p_);
  Tensor gs = at::empty_like(p);
  rp_window_softmax_backward(gp.data_ptr<float>(), p.data_ptr<float>(), (float)scale, gs.data_ptr<float>(),
                             p.size(0) * p.size(1), p.size(1), p.size(2));
  return gs;
}

Tensor swiglu(const Tensor& u_) {
  Tensor u = rpb::swiglu_args(kDev, u_);
  Tensor out = at::empty({u.size(0), u.size(1) / 2}, u.options());
  rp_swiglu(u.data_ptr<float>(), out.data_ptr<float>(), u.size(0), u.size(1) / 2);
  return out;
}

Tensor swiglu_backward(const Tensor& g_, const Tensor& u_) {
  auto [g, u] = rpb::swiglu_backward_args(kDev, g_, u_);
  Tensor gu = at::empty_like(u);
  rp_swiglu_backward(g.data_ptr<float>(), u.data_ptr<float>(), gu.data_ptr<float>(), u.size(0), g.size(1));
  return gu;
}

std::tuple<Tensor, Tensor> cross_entropy(const Tensor& z_, const Tensor& t_, double zloss, bool check_indices) {
  auto [z, t] = rpb::cross_entropy_args(kDev, z_, t_);
  if (check_indices) rpb::check_range(t, z.size(1), "targets");
  Tensor loss = at::empty({}, z.options()), lse = at::empty({z.size(0)}, z.options());
  rp_cross_entropy(z.data_ptr<float>(), t.data_ptr<int64_t>(), (float)zloss, loss.data_ptr<float>(),
                   lse.data_ptr<float>(), z.size(0), z.size(1));
  return {loss, lse};
}

Tensor cross_entropy_backward(const Tensor& g, const Tensor& z_, const Tensor& t_, const Tensor& lse_, double zloss,
                              bool check_indices) {
  auto [z, t, lse] = rpb::cross_entropy_backward_args(kDev, g, z_, t_, lse_);
  if (check_indices) rpb::check_range(t, z.size(1), "targets");
  Tensor gz = at::empty_like(z);
  rp_cross_entropy_backward(g.item<float>(), z.data_ptr<float>(), t.data_ptr<int64_t>(), lse.data_ptr<float>(),
                            (float)zloss, gz.data_ptr<float>(), z.size(0), z.size(1));
  return gz;
}

Tensor embedding(const Tensor& w_, const Tensor& idx_, bool check_indices) {
  auto [w, idx] = rpb::embedding_args(kDev, w_, idx_);
  if (check_indices) rpb::check_range(idx, w.size(0), "token ids");
  Tensor out = at::empty({idx.size(0), w.size(1)}, w.options());
  rp_embedding(w.data_ptr<float>(), idx.data_ptr<int64_t>(), out.data_ptr<float>(), idx.size(0), w.size(1));
  return out;
}

Tensor embedding_backward(const Tensor& g_, const Tensor& idx_, int64_t num_rows, bool check_indices) {
  auto [g, idx] = rpb::embedding_backward_args(kDev, g_, idx_);
  if (check_indices) rpb::check_range(idx, num_rows, "token ids");
  Tensor gw = at::empty({num_rows, g.size(1)}, g.options());
  rp_embedding_backward(g.data_ptr<float>(), idx.data_ptr<int64_t>(), gw.data_ptr<float>(), g.size(0), num_rows,
                        g.size(1));
  return gw;
}

Tensor binary(const Tensor& a_, const Tensor& b_, void (*fn)(const float*, const float*, float*, int64_t), const char* name) {
  auto [a, b] = rpb::binary_args(kDev, a_, b_, name);
  Tensor y = at::empty_like(a);
  fn(a.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(), a.numel());
  return y;
}
Tensor add(const Tensor& a, const Tensor& b) { return binary(a, b, rp_add, "add"); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(a, b, rp_mul, "mul"); }

Tensor scale(const Tensor& a_, double s) {
  Tensor a = rpb::contig(kDev, a_, "a"), y = at::empty_like(a);
  rp_scale(a.data_ptr<float>(), (float)s, y.data_ptr<float>(), a.numel());
  return y;
}

template <RpFn F>
Tensor unary(const Tensor& x_) {
  Tensor x = rpb::contig(kDev, x_, "x"), y = at::empty_like(x);
  rp_unary(F, x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  return y;
}

Tensor csum(const Tensor& x_) {
  Tensor x = rpb::csum_args(kDev, x_);
  const int64_t n = x.size(-1), rows = n == 0 ? 0 : x.numel() / n;
  Tensor y = at::empty(x.sizes().slice(0, x.dim() - 1), x.options());
  if (n == 0) return y.zero_();
  rp_csum_rows(x.data_ptr<float>(), y.data_ptr<float>(), rows, n);
  return y;
}

Tensor dropout(const Tensor& x_, double p, int64_t seed, int64_t c1, int64_t c2) {
  Tensor x = rpb::contig(kDev, x_, "x");
  const rpb::Dropout d = rpb::dropout_args(p, seed, c1, c2);
  Tensor y = at::empty_like(x);
  rp_dropout(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), d.threshold, d.scale, d.seed, d.c1, d.c2);
  return y;
}

void adamw_(const Tensor& p, const Tensor& g_, const Tensor& m, const Tensor& v, double lr, double b1, double b2,
            double omb1, double omb2, double eps, double decay, double bc1, double bc2) {
  Tensor g = rpb::adamw_args(kDev, p, g_, m, v);
  rp_adamw(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), g.numel(), (float)lr,
           (float)b1, (float)b2, (float)omb1, (float)omb2, (float)eps, (float)decay, (float)bc1, (float)bc2);
}

std::tuple<Tensor, Tensor> clip_grad(const Tensor& g_, double max_norm) {
  Tensor g = rpb::contig(kDev, g_, "grad");
  Tensor out = at::empty_like(g), norm = at::empty({}, g.options());
  rp_clip_grad(g.data_ptr<float>(), (float)max_norm, out.data_ptr<float>(), norm.data_ptr<float>(), g.numel());
  return {out, norm};
}

Tensor philox(int64_t seed, int64_t c1, int64_t c2, int64_t purpose, int64_t n, int64_t block_offset) {
  const rpb::PhiloxStream s = rpb::philox_args("philox", seed, c1, c2, purpose, n);
  std::vector<uint32_t> w(n);
  rp_philox(s.seed, s.c1, s.c2, s.purpose, rpb::u32(block_offset, "block_offset"), w.data(), n);
  Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kLong));
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) o[i] = w[i];
  return out;
}

Tensor uniform(int64_t seed, int64_t c1, int64_t c2, int64_t purpose, int64_t n) {
  const rpb::PhiloxStream s = rpb::philox_args("uniform", seed, c1, c2, purpose, n);
  Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
  rp_uniform(s.seed, s.c1, s.c2, s.purpose, out.data_ptr<float>(), n);
  return out;
}

Tensor normal(int64_t seed, int64_t c1, int64_t c2, int64_t purpose, int64_t n) {
  const rpb::PhiloxStream s = rpb::philox_args("normal", seed, c1, c2, purpose, n);
  Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
  rp_normal(s.seed, s.c1, s.c2, s.purpose, out.data_ptr<float>(), n);
  return out;
}

// ---- the quantized path (contract §10; argument checks in binding_common.h)
Tensor int8_quantize(const Tensor& x_, const Tensor& s_) {
  auto [x, s, R, C] = rpb::int8_rows_args(kDev, x_, s_, "int8_quantize");
  Tensor q = at::empty(x.sizes(), x.options().dtype(at::kChar));
  rp_quantize(x.data_ptr<float>(), s.data_ptr<float>(), q.data_ptr<int8_t>(), R, C);
  return q;
}

Tensor int8_dequantize(const Tensor& q_, const Tensor& s_) {
  auto [q, s, R] = rpb::int8_dequantize_args(kDev, q_, s_);
  Tensor y = at::empty(q.sizes(), s.options());
  rp_dequantize(q.data_ptr<int8_t>(), s.data_ptr<float>(), y.data_ptr<float>(), R, q.numel() / R);
  return y;
}

// check=False: the caller vouches that the operands lie on the grid (int8_quantize's outputs do).
std::tuple<Tensor, Tensor> gemm_operands(const Tensor& a_, const Tensor& b_, bool check, const char* op) {
  auto [a, b] = rpb::int8_gemm_args(kDev, a_, b_, op);
  if (check) {
    rpb::check_on_grid(a, op);
    rpb::check_on_grid(b, op);
  }
  return {a, b};
}

Tensor int8_matmul(const Tensor& a_, const Tensor& b_, bool check) {
  auto [a, b] = gemm_operands(a_, b_, check, "int8_matmul");
  Tensor c = at::empty({a.size(0), b.size(0)}, a.options().dtype(at::kInt));
  rp_int8_matmul(a.data_ptr<int8_t>(), b.data_ptr<int8_t>(), c.data_ptr<int32_t>(), a.size(0), b.size(0), a.size(1));
  return c;
}

Tensor int8_linear(const Tensor& a_, const Tensor& b_, const Tensor& sx_, const Tensor& sw_, bool check) {
  auto [a, b] = gemm_operands(a_, b_, check, "int8_linear");
  auto [sx, sw] = rpb::int8_scales_args(kDev, b, sx_, sw_);
  Tensor y = at::empty({a.size(0), b.size(0)}, sx.options());
  rp_int8_linear(a.data_ptr<int8_t>(), b.data_ptr<int8_t>(), sx.item<float>(), sw.data_ptr<float>(),
                 y.data_ptr<float>(), a.size(0), b.size(0), a.size(1));
  return y;
}

void lsq_init_(const Tensor& x_, const Tensor& s) {
  TORCH_CHECK(s.is_contiguous(), "repops.lsq_init_: s must be contiguous");
  auto [x, s2, R, C] = rpb::int8_rows_args(kDev, x_, s, "lsq_init_");
  TORCH_CHECK(C >= 1, "repops.lsq_init_: no elements to take the mean of");
  rp_lsq_init(x.data_ptr<float>(), s.data_ptr<float>(), R, C, (float)(1.0 / (double)C));
}

std::tuple<Tensor, Tensor> lsq_backward(const Tensor& x_, const Tensor& s_, const Tensor& gxh_, double g) {
  auto [x, s, R, C] = rpb::int8_rows_args(kDev, x_, s_, "lsq_backward");
  Tensor gxh = rpb::lsq_gxh_args(kDev, x, gxh_);
  Tensor gx = at::empty_like(x), gs = at::empty_like(s);
  rp_lsq_backward(x.data_ptr<float>(), s.data_ptr<float>(), gxh.data_ptr<float>(), (float)g, gx.data_ptr<float>(),
                  gs.data_ptr<float>(), R, C);
  return {gx, gs};
}

// ---- int8 P·V (contract §10; quant.py)
Tensor int8_absmax_step(const Tensor& x_) {
  Tensor x = rpb::int8_absmax_step_args(kDev, x_);
  Tensor s = at::empty({x.size(0)}, x.options());
  rp_int8_absmax_step(x.data_ptr<float>(), s.data_ptr<float>(), x.size(0), x.size(1));
  return s;
}

// The operands come from int8_quantize (on the grid by construction).
Tensor int8_band_mix(const Tensor& qp_, const Tensor& qv_, const Tensor& sp_, const Tensor& sv_) {
  auto [qp, qv, sp, sv, sh] = rpb::int8_band_mix_args(kDev, qp_, qv_, sp_, sv_);
  Tensor o = at::empty({sh.batch, sh.M, sh.D}, sp.options());
  rp_int8_band_mix(qp.data_ptr<int8_t>(), qv.data_ptr<int8_t>(), sp.data_ptr<float>(), sv.data_ptr<float>(),
                   o.data_ptr<float>(), sh.batch, sh.M, sh.T, sh.D, sh.W);
  return o;
}

// The exact kernel's view of x [batch, rows, K] (§11 operand, kernels.h): rows K-contiguous, or x
// the transpose of a row-major tensor (x^T, g^T of a weight gradient), read in place; any other
// strides are copied first (data movement, no arithmetic).
Tensor exact_operand(const Tensor& x) {
  const bool k_rows = x.size(2) == 1 || x.stride(2) == 1, transposed = x.size(1) == 1 || x.stride(1) == 1;
  return k_rows || transposed ? x : x.contiguous();
}
RpExactOperand exact_view(const Tensor& x, int64_t i) {
  const float* p = x.data_ptr<float>() + i * x.stride(0);
  if (x.size(2) == 1 || x.stride(2) == 1) return {p, x.stride(1), 1};
  return {p, 1, x.stride(2)};
}

// The exact products of a batch, each on one thread where there are at least as many as threads and
// each is small (attention's heads: one small product's split, GEMMs and reconstruction spread over
// all threads wait on each other more than they compute; a small product's residue planes, (M + N)
// K bytes per modulus, at most 8 MB, are all that each thread's kept buffers then grow to); one
// after the other, each over all threads, otherwise. Every product's bits are its own, whoever
// computes it.
template <class F>
void exact_batch(const rpb::MatmulShape& s, const F& product) {
  const int64_t batch = s.batch;
  if (batch >= 2 && batch >= rp_threads() && (s.M + s.N) * s.K * 8 <= (int64_t(8) << 20))
    rp::parallel_for(batch, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) product(i);
    });
  else
    for (int64_t i = 0; i < batch; ++i) product(i);
}

// Contract §11. A 2-D operand of a batched product gives every batch entry the same view.
Tensor exact_matmul(const Tensor& a, const Tensor& b) {
  const rpb::MatmulShape s = rpb::matmul_shape(kDev, a, b);
  TORCH_CHECK(s.K < (int64_t(1) << 31), "repops.exact_matmul: K must be < 2^31");
  const Tensor a3 = exact_operand((a.dim() == 2 ? a.unsqueeze(0) : a).expand({s.batch, s.M, s.K}));
  const Tensor bt = exact_operand((b.dim() == 2 ? b.unsqueeze(0) : b).expand({s.batch, s.K, s.N}).transpose(1, 2));
  Tensor c = at::empty(s.out, a.options());
  float* out = c.data_ptr<float>();
  exact_batch(s, [&](int64_t i) {
    rp_exact_matmul(exact_view(a3, i), exact_view(bt, i), out + i * s.M * s.N, s.M, s.N, s.K);
  });
  return c;
}

// Full causal attention's §11 products (kernels.h RpCausal; form 1 the scores q k^T and gO v^T
// [batch, G*T, T], 2 P v and gS k (a = P [batch, G*T, T]), 3 P^T gO and gS^T q (a = P^T [batch, T,
// G*T])), 3-D operands of one batch. A of form 2 is read by K-contiguous rows and of form 3 as the
// transpose of a row-major P (copied into that layout where it is not).
Tensor exact_matmul_causal(const Tensor& a, const Tensor& b, int64_t form) {
  TORCH_CHECK(form >= 1 && form <= 3, "repops.exact_matmul_causal: form must be 1 (scores), 2 (mix) or 3 (mix_t)");
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3, "repops.exact_matmul_causal: a and b must be 3-D [batch, ., .]");
  const rpb::MatmulShape s = rpb::matmul_shape(kDev, a, b);
  TORCH_CHECK(s.K < (int64_t(1) << 31), "repops.exact_matmul_causal: K must be < 2^31");
  const int64_t T = form == 1 ? s.N : form == 2 ? s.K : s.M, G = form == 3 ? s.K : s.M;
  TORCH_CHECK(T > 0 && G % T == 0, "repops.exact_matmul_causal: form ", form,
              " needs ", form == 3 ? "K" : "M", " (G*T) a multiple of T (", form == 1 ? "N" : form == 2 ? "K" : "M", ")");
  Tensor a3 = exact_operand(a.expand({s.batch, s.M, s.K}));
  if (form == 2 && a3.size(2) > 1 && a3.stride(2) != 1) a3 = a3.contiguous();
  if (form == 3 && a3.size(1) > 1 && a3.stride(1) != 1) a3 = a3.transpose(1, 2).contiguous().transpose(1, 2);
  const Tensor bt = exact_operand(b.expand({s.batch, s.K, s.N}).transpose(1, 2));
  Tensor c = at::empty(s.out, a.options());
  const RpCausal causal = form == 1 ? RpCausal::kScores : form == 2 ? RpCausal::kMix : RpCausal::kMixT;
  float* out = c.data_ptr<float>();
  exact_batch(s, [&](int64_t i) {
    rp_exact_matmul(exact_view(a3, i), exact_view(bt, i), out + i * s.M * s.N, s.M, s.N, s.K, causal);
  });
  return c;
}

// The band products with matmul = "exact" (§11 "Band products"): window attention's shapes.
Tensor exact_band_scores(const Tensor& a_, const Tensor& b_, int64_t W) {
  auto [a, b, sh] = rpb::band_scores_args(kDev, a_, b_, W);
  Tensor s = at::empty({sh.batch, sh.M, sh.W}, a.options());
  rp_exact_band_scores(a.data_ptr<float>(), b.data_ptr<float>(), s.data_ptr<float>(), sh.batch, sh.M, sh.T, sh.D,
                       sh.W);
  return s;
}

Tensor exact_band_mix(const Tensor& p_, const Tensor& b_) {
  auto [p, b, sh] = rpb::band_mix_args(kDev, p_, b_);
  Tensor o = at::empty({sh.batch, sh.M, sh.D}, p.options());
  rp_exact_band_mix(p.data_ptr<float>(), b.data_ptr<float>(), o.data_ptr<float>(), sh.batch, sh.M, sh.T, sh.D, sh.W);
  return o;
}

Tensor exact_band_mix_t(const Tensor& p_, const Tensor& a_, int64_t T) {
  auto [p, a, sh] = rpb::band_mix_t_args(kDev, p_, a_, T);
  Tensor o = at::empty({sh.batch, sh.T, sh.D}, p.options());
  rp_exact_band_mix_t(p.data_ptr<float>(), a.data_ptr<float>(), o.data_ptr<float>(), sh.batch, sh.M, sh.T, sh.D,
                      sh.W);
  return o;
}

Tensor canary() {
  Tensor out = at::empty({2}, at::TensorOptions().dtype(at::kFloat));
  rp_canary(out.data_ptr<float>());
  return out;
}
}  // namespace

TORCH_LIBRARY(repops, m) {
  m.def("cpu_path() -> str", [] { return std::string(rp_cpu_path()) + "; " + rp_int8_path(); });  // ISA, tiles
  // The CPU kernel versions (repops.py: REPOPS_CPU_MATMUL, REPOPS_CPU_INT8; every one gives the
  // same bits): the matmul's vector width (0 = this CPU's default, 256, 512) and the int8 GEMM's
  // path (0 = default, 1 = the build's SIMD path, VNNI on AVX-512 VNNI, 2 = AMX-INT8).
  m.def("cpu_select(int matmul_width, int int8_path) -> str", [](int64_t width, int64_t path) {
    TORCH_CHECK(rp_matmul_select((int)width) > 0, "repops.cpu_select: this build has no ", width,
                "-bit matmul tile (x86 with AVX-512 has 256 and 512, other builds 256)");
    TORCH_CHECK(rp_int8_select((int)path) > 0, "repops.cpu_select: int8 path ", path,
                path == 2 ? " (AMX-INT8) is not usable here: the CPU has no AMX-INT8, the build has no AMX code, or "
                            "Linux refused the tile-data permission (arch_prctl ARCH_REQ_XCOMP_PERM)"
                          : " is not 0 (default), 1 (SIMD/VNNI) or 2 (AMX)");
    return std::string(rp_cpu_path()) + "; " + rp_int8_path();
  });
  // bench.py's port limit: [flop per cycle per core of the contract's matmul, core clock in Hz]
  m.def("cpu_limits() -> float[]", [] { return std::vector<double>{rp_matmul_flop_per_cycle(), rp_cpu_clock_hz()}; });
  m.def("matmul(Tensor a, Tensor b) -> Tensor");
  m.def("rmsnorm(Tensor x, Tensor w, float eps) -> (Tensor, Tensor)");
  m.def("rmsnorm_backward(Tensor gy, Tensor x, Tensor w, Tensor rstd) -> (Tensor, Tensor)");
  m.def("rope(Tensor x, Tensor cos, Tensor sin, bool backward) -> Tensor");
  m.def("causal_softmax(Tensor s, float scale) -> Tensor");
  m.def("causal_softmax_backward(Tensor gp, Tensor p, float scale) -> Tensor");
  // §8 attention head by head on the CPU (attention.cpp); other backends compose matmul and causal_softmax.
  m.def("causal_attention(Tensor q, Tensor k, Tensor v, float scale) -> (Tensor, Tensor)");
  m.def("causal_attention_backward(Tensor go, Tensor q, Tensor k, Tensor v, Tensor p, float scale) -> "
        "(Tensor, Tensor, Tensor)");
  // Window attention (§8): bands [batch, G*T, W] of a sliding window of W keys per query.
  m.def("band_scores(Tensor a, Tensor b, int W) -> Tensor");
  m.def("band_mix(Tensor p, Tensor b) -> Tensor");
  m.def("band_mix_t(Tensor p, Tensor a, int T) -> Tensor");
  m.def("window_softmax(Tensor s, float scale) -> Tensor");
  m.def("window_softmax_backward(Tensor gp, Tensor p, float scale) -> Tensor");
  m.def("swiglu(Tensor u) -> Tensor");
  m.def("swiglu_backward(Tensor g, Tensor u) -> Tensor");
  // check=False: the caller vouches for the indices' range (checked on the host where they came
  // from, or by the forward op whose indices a backward reuses), so CUDA need not sync to test it.
  m.def("cross_entropy(Tensor z, Tensor targets, float zloss, bool check=True) -> (Tensor, Tensor)");
  m.def("cross_entropy_backward(Tensor g, Tensor z, Tensor targets, Tensor lse, float zloss, bool check=True) -> Tensor");
  m.def("embedding(Tensor w, Tensor idx, bool check=True) -> Tensor");
  m.def("embedding_backward(Tensor g, Tensor idx, int num_rows, bool check=True) -> Tensor");
  m.def("check_index(Tensor idx, int hi, str what) -> ()");
  m.def("add(Tensor a, Tensor b) -> Tensor");
  m.def("mul(Tensor a, Tensor b) -> Tensor");
  m.def("scale(Tensor a, float s) -> Tensor");
  m.def("dropout(Tensor x, float p, int seed, int c1, int c2) -> Tensor");
  m.def("adamw_(Tensor(a!) p, Tensor g, Tensor(b!) m, Tensor(c!) v, float lr, float b1, float b2, float omb1, "
        "float omb2, float eps, float decay, float bc1, float bc2) -> ()");
  m.def("clip_grad(Tensor g, float max_norm) -> (Tensor, Tensor)");
  m.def("csum(Tensor x) -> Tensor");
  for (const char* fn : {"exp", "log", "recip", "rsqrt", "sqrt", "sin", "cos", "tanh", "erf", "sigmoid", "gelu",
                         "gelu_tanh", "gelu_grad", "gelu_tanh_grad"})
    m.def((std::string(fn) + "(Tensor x) -> Tensor").c_str());
  m.def("int8_quantize(Tensor x, Tensor s) -> Tensor");
  m.def("int8_dequantize(Tensor q, Tensor s) -> Tensor");
  // check=False: the caller vouches that a and b lie on [-127, 127] (int8_quantize's outputs do),
  // so CUDA need not sync to scan them.
  m.def("int8_matmul(Tensor a, Tensor b, bool check=True) -> Tensor");
  m.def("int8_linear(Tensor a, Tensor b, Tensor sx, Tensor sw, bool check=True) -> Tensor");
  m.def("lsq_init_(Tensor x, Tensor(a!) s) -> ()");
  m.def("lsq_backward(Tensor x, Tensor s, Tensor gxh, float g) -> (Tensor, Tensor)");
  // int8 P·V (§10): a block's step size from its largest |value|; the windowed layers' int8 band mix.
  m.def("int8_absmax_step(Tensor x) -> Tensor");
  m.def("int8_band_mix(Tensor qp, Tensor qv, Tensor sp, Tensor sv) -> Tensor");
  m.def("exact_matmul(Tensor a, Tensor b) -> Tensor");   // §11; CUDA: exact.cu
  m.def("exact_matmul_causal(Tensor a, Tensor b, int form) -> Tensor");   // §11 "Attention's products"; CPU only
  // §11 band products (window attention with matmul = "exact"): CPU only (config.validate)
  m.def("exact_band_scores(Tensor a, Tensor b, int W) -> Tensor");
  m.def("exact_band_mix(Tensor p, Tensor b) -> Tensor");
  m.def("exact_band_mix_t(Tensor p, Tensor a, int T) -> Tensor");
  RPB_DEF_TENSORLESS_OPS(m, );
}

// The range check alone, for host indices bound for another device (repops.py checks them here,
// where they came from, once, so the device op need not).
void check_index(const Tensor& idx_, int64_t hi, c10::string_view what) {
  const Tensor idx = rpb::contig_idx(kDev, idx_, "idx");
  rpb::check_range(idx, hi, std::string(what).c_str());
}

TORCH_LIBRARY_IMPL(repops, CPU, m) {
  RPB_IMPL_TENSOR_OPS(m);
  m.impl("check_index", check_index);
  m.impl("causal_attention", causal_attention);
  m.impl("causal_attention_backward", causal_attention_backward);
  m.impl("exact_matmul", exact_matmul);
  m.impl("exact_matmul_causal", exact_matmul_causal);
  m.impl("exact_band_scores", exact_band_scores);
  m.impl("exact_band_mix", exact_band_mix);
  m.impl("exact_band_mix_t", exact_band_mix_t);
}

// Ops with no tensor inputs cannot be dispatched by device: they are CPU-only backend-select.
TORCH_LIBRARY_IMPL(repops, CompositeExplicitAutograd, m) { RPB_IMPL_TENSORLESS_OPS(m, ); }
