// binding_common.h -- what the two torch bindings share: kernels/cpu/binding.cpp (the CPU
// dispatch key) and kernels/cuda/binding_cuda.cpp (CUDA). Every op's argument checks are written
// here once, parameterized by the device the binding serves, so both backends accept the same
// calls and refuse the others with the same message; dropout's host scalars (contract §1, §6)
// are computed here once, so both hand their kernels the same bits. The op registration lists
// are here too (macros at the end). Kernel launches, streams and device guards stay in the
// bindings.
#pragma once
#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "ids.h"

namespace rpb {
using at::Tensor;

// ------------------------------------------------------------------ one argument
inline void check_f32(at::DeviceType dev, const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().type() == dev, "repops: ", name, " must be a ", c10::DeviceTypeName(dev), " tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat, "repops: ", name, " must be float32, got ", t.scalar_type());
}
inline Tensor contig(at::DeviceType dev, const Tensor& t, const char* name) {
  check_f32(dev, t, name);
  return t.contiguous();
}
inline Tensor contig_idx(at::DeviceType dev, const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().type() == dev && t.scalar_type() == at::kLong, "repops: ", name, " must be a ",
              c10::DeviceTypeName(dev), " int64 tensor");
  return t.contiguous();
}
// A kernel reads all its operands on one device (two GPUs are both "CUDA"; on the CPU the
// device checks above already imply it).
inline void same_device(const Tensor& a, const Tensor& b, const char* op) {
  TORCH_CHECK(a.device() == b.device(), "repops.", op, ": tensors on different devices: ", a.device(), " and ",
              b.device());
}
// Every index of idx, a host tensor, in [0, hi): the kernels index rows with it unchecked. The
// CUDA binding tests on the device and comes here only to name the first bad index.
inline void check_range(const Tensor& idx, int64_t hi, const char* name) {
  const int64_t* p = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i)
    TORCH_CHECK(p[i] >= 0 && p[i] < hi, "repops: ", name, " out of range [0, ", hi, "): found ", p[i], " at ", i);
}
// Philox counter words and the like: refused, never wrapped, when they do not fit.
inline uint32_t u32(int64_t v, const char* name) {
  TORCH_CHECK(v >= 0 && v <= 0xFFFFFFFFLL, "repops: ", name, " must fit in 32 unsigned bits, got ", v);
  return (uint32_t)v;
}

// ------------------------------------------------------------------ each op (contract §8)
// The *_args functions check an op's tensors (device, dtype, one device for all, the shapes the
// kernels assume) and return them contiguous, in argument order.

// a [M, K] or [batch, M, K] @ b [K, N] or [batch, K, N], any strides (the kernel takes them);
// a 2-D operand has batch stride 0: every batch shares it. out: the sizes of c.
struct MatmulShape {
  int64_t batch, M, N, K, sab, sbb;
  std::vector<int64_t> out;
};
inline MatmulShape matmul_shape(at::DeviceType dev, const Tensor& a, const Tensor& b) {
  check_f32(dev, a, "a");
  check_f32(dev, b, "b");
  same_device(a, b, "matmul");
  TORCH_CHECK(a.dim() >= 2 && a.dim() <= 3 && b.dim() >= 2 && b.dim() <= 3, "repops.matmul: 2-D or 3-D operands");
  TORCH_CHECK(a.size(-1) == b.size(-2), "repops.matmul: inner sizes differ: ", a.sizes(), " @ ", b.sizes());
  const int64_t batch = a.dim() == 3 ? a.size(0) : (b.dim() == 3 ? b.size(0) : 1);
  TORCH_CHECK((a.dim() == 2 || a.size(0) == batch) && (b.dim() == 2 || b.size(0) == batch), "repops.matmul: batch sizes differ");
  const int64_t M = a.size(-2), N = b.size(-1);
  std::vector<int64_t> out = {M, N};
  if (a.dim() == 3 || b.dim() == 3) out.insert(out.begin(), batch);
  return {batch, M, N, a.size(-1), a.dim() == 3 ? a.stride(0) : 0, b.dim() == 3 ? b.stride(0) : 0, out};
}

inline std::tuple<Tensor, Tensor> rmsnorm_args(at::DeviceType dev, const Tensor& x_, const Tensor& w_) {
  Tensor x = contig(dev, x_, "x"), w = contig(dev, w_, "w");
  same_device(x, w, "rmsnorm");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 1 && w.size(0) == x.size(1), "repops.rmsnorm: x [R, D], w [D]");
  return {x, w};
}

inline std::tuple<Tensor, Tensor, Tensor, Tensor> rmsnorm_backward_args(at::DeviceType dev, const Tensor& gy_,
                                                                        const Tensor& x_, const Tensor& w_,
                                                                        const Tensor& rstd_) {
  Tensor gy = contig(dev, gy_, "gy"), x = contig(dev, x_, "x"), w = contig(dev, w_, "w"),
         rstd = contig(dev, rstd_, "rstd");
  TORCH_CHECK(gy.sizes() == x.sizes() && x.dim() == 2 && rstd.numel() == x.size(0), "repops.rmsnorm_backward: shapes");
  // w [D] too: the kernels read w[j] for every column j < D, and on the GPU a short w is an
  // illegal address that poisons the whole CUDA context, not just this op.
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(1), "repops.rmsnorm_backward: w [D]");
  for (const Tensor* t : {&x, &w, &rstd}) same_device(gy, *t, "rmsnorm_backward");
  return {gy, x, w, rstd};
}

inline void check_rope_tables(int64_t T, int64_t Dh) {
  TORCH_CHECK(T >= 0 && Dh > 0 && Dh % 2 == 0, "repops.rope_tables: head_dim must be even");
}

// rope moves the heads as it rotates: the forward reads x [B, T, H, Dh] (the qkv linear's
// columns, any strides with unit stride along Dh) and returns y [B, H, T, Dh] contiguous, the
// layout attention's matmuls read; the backward reads g [B, H, T, Dh] (any such strides) and
// returns [B, T, H, Dh] contiguous, the layout of the qkv linear's gradient. y is allocated here;
// xs and ys say where the kernel finds row (b, t, h) of each.
struct RopeCall {
  Tensor x, c, s, y;
  RpRows xs, ys;
  int64_t B, T, H, Dh;
};
inline RopeCall rope_args(at::DeviceType dev, const Tensor& x_, const Tensor& c_, const Tensor& s_, bool backward) {
  check_f32(dev, x_, "x");
  Tensor x = x_.dim() == 4 && x_.stride(3) != 1 ? x_.contiguous() : x_;
  Tensor c = contig(dev, c_, "cos"), s = contig(dev, s_, "sin");
  same_device(x, c, "rope");
  same_device(x, s, "rope");
  TORCH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, backward ? "repops.rope: g [B, H, T, Dh] with even Dh"
                                                            : "repops.rope: x [B, T, H, Dh] with even Dh");
  const int t = backward ? 2 : 1, h = backward ? 1 : 2;  // x's dims of positions and heads
  const int64_t B = x.size(0), T = x.size(t), H = x.size(h), Dh = x.size(3);
  TORCH_CHECK(c.dim() == 2 && c.size(0) >= T && c.size(1) == Dh / 2 && s.sizes() == c.sizes(),
              "repops.rope: tables [>=T, Dh/2]");
  Tensor y = backward ? at::empty({B, T, H, Dh}, x.options()) : at::empty({B, H, T, Dh}, x.options());
  const RpRows xs{x.stride(0), x.stride(t), x.stride(h)};
  const RpRows ys = backward ? RpRows{T * H * Dh, H * Dh, Dh} : RpRows{H * T * Dh, Dh, T * Dh};
  return {x, c, s, y, xs, ys, B, T, H, Dh};
}

inline Tensor causal_softmax_args(at::DeviceType dev, const Tensor& s_) {
  Tensor s = contig(dev, s_, "s");
  TORCH_CHECK(s.dim() == 3 && s.size(1) == s.size(2), "repops.causal_softmax: s [BH, T, T]");
  return s;
}

inline std::tuple<Tensor, Tensor> causal_softmax_backward_args(at::DeviceType dev, const Tensor& gp_,
                                                               const Tensor& p_) {
  Tensor gp = contig(dev, gp_, "gp"), p = contig(dev, p_, "p");
  same_device(gp, p, "causal_softmax_backward");
  TORCH_CHECK(p.dim() == 3 && p.size(1) == p.size(2) && gp.sizes() == p.sizes(), "repops.causal_softmax_backward: shapes");
  return {gp, p};
}

// Window attention (§8): a query band a [batch, M, D] (M = G*T rows, G query heads of one
// key/value head), keys or values b [batch, T, D], bands [batch, M, W] with 1 <= W.
struct BandShape {
  int64_t batch, M, T, D, W;
};
inline BandShape band_shape(const Tensor& rows, const Tensor& keys, int64_t W, const char* op) {
  TORCH_CHECK(rows.dim() == 3 && keys.dim() == 3 && rows.size(0) == keys.size(0) && keys.size(1) >= 1 &&
                  rows.size(1) % keys.size(1) == 0 && W >= 1,
              "repops.", op, ": rows [batch, G*T, *], keys [batch, T, *], W >= 1");
  return {rows.size(0), rows.size(1), keys.size(1), keys.size(2), W};
}
inline std::tuple<Tensor, Tensor, BandShape> band_scores_args(at::DeviceType dev, const Tensor& a_, const Tensor& b_,
                                                              int64_t W) {
  Tensor a = contig(dev, a_, "a"), b = contig(dev, b_, "b");
  same_device(a, b, "band_scores");
  BandShape sh = band_shape(a, b, W, "band_scores");
  TORCH_CHECK(a.size(2) == b.size(2), "repops.band_scores: a [batch, M, D], b [batch, T, D]");
  return {a, b, sh};
}
inline std::tuple<Tensor, Tensor, BandShape> band_mix_args(at::DeviceType dev, const Tensor& p_, const Tensor& b_) {
  Tensor p = contig(dev, p_, "p"), b = contig(dev, b_, "b");
  same_device(p, b, "band_mix");
  BandShape sh = band_shape(p, b, p.dim() == 3 ? p.size(2) : 0, "band_mix");
  return {p, b, sh};
}
inline std::tuple<Tensor, Tensor, BandShape> band_mix_t_args(at::DeviceType dev, const Tensor& p_, const Tensor& a_,
                                                             int64_t T) {
  Tensor p = contig(dev, p_, "p"), a = contig(dev, a_, "a");
  same_device(p, a, "band_mix_t");
  TORCH_CHECK(p.dim() == 3 && a.dim() == 3 && p.size(0) == a.size(0) && p.size(1) == a.size(1) && T >= 1 &&
                  p.size(1) % T == 0 && p.size(2) >= 1,
              "repops.band_mix_t: p [batch, G*T, W], a [batch, G*T, D]");
  return {p, a, {p.size(0), p.size(1), T, a.size(2), p.size(2)}};
}
inline Tensor window_softmax_args(at::DeviceType dev, const Tensor& s_) {
  Tensor s = contig(dev, s_, "s");
  TORCH_CHECK(s.dim() == 3 && s.size(2) >= 1, "repops.window_softmax: s [BH, T, W]");
  return s;
}
inline std::tuple<Tensor, Tensor> window_softmax_backward_args(at::DeviceType dev, const Tensor& gp_, const Tensor& p_) {
  Tensor gp = contig(dev, gp_, "gp"), p = contig(dev, p_, "p");
  same_device(gp, p, "window_softmax_backward");
  TORCH_CHECK(p.dim() == 3 && gp.sizes() == p.sizes(), "repops.window_softmax_backward: shapes");
  return {gp, p};
}

inline Tensor swiglu_args(at::DeviceType dev, const Tensor& u_) {
  Tensor u = contig(dev, u_, "u");
  TORCH_CHECK(u.dim() == 2 && u.size(1) % 2 == 0, "repops.swiglu: u [R, 2H]");
  return u;
}

inline std::tuple<Tensor, Tensor> swiglu_backward_args(at::DeviceType dev, const Tensor& g_, const Tensor& u_) {
  Tensor g = contig(dev, g_, "g"), u = contig(dev, u_, "u");
  same_device(g, u, "swiglu_backward");
  TORCH_CHECK(u.dim() == 2 && g.dim() == 2 && g.size(0) == u.size(0) && 2 * g.size(1) == u.size(1),
              "repops.swiglu_backward: shapes");
  return {g, u};
}

// The targets' range is checked by each binding (on the device for CUDA) with check_range.
inline std::tuple<Tensor, Tensor> cross_entropy_args(at::DeviceType dev, const Tensor& z_, const Tensor& t_) {
  Tensor z = contig(dev, z_, "logits"), t = contig_idx(dev, t_, "targets");
  same_device(z, t, "cross_entropy");
  TORCH_CHECK(z.dim() == 2 && t.dim() == 1 && t.size(0) == z.size(0) && z.size(1) > 0, "repops.cross_entropy: z [R, V], targets [R]");
  return {z, t};
}

// g, the incoming gradient, is a float32 scalar on any device (autograd may hand a CPU scalar to
// the CUDA op); the binding reads or moves it. Returns z, targets, lse.
inline std::tuple<Tensor, Tensor, Tensor> cross_entropy_backward_args(at::DeviceType dev, const Tensor& g,
                                                                      const Tensor& z_, const Tensor& t_,
                                                                      const Tensor& lse_) {
  Tensor z = contig(dev, z_, "logits"), t = contig_idx(dev, t_, "targets"), lse = contig(dev, lse_, "lse");
  TORCH_CHECK(g.numel() == 1 && g.scalar_type() == at::kFloat, "repops.cross_entropy_backward: g is a float32 scalar");
  TORCH_CHECK(z.dim() == 2 && t.numel() == z.size(0) && lse.numel() == z.size(0), "repops.cross_entropy_backward: shapes");
  same_device(z, t, "cross_entropy_backward");
  same_device(z, lse, "cross_entropy_backward");
  return {z, t, lse};
}

// The token ids' range is checked by each binding with check_range, against V or num_rows.
inline std::tuple<Tensor, Tensor> embedding_args(at::DeviceType dev, const Tensor& w_, const Tensor& idx_) {
  Tensor w = contig(dev, w_, "weight"), idx = contig_idx(dev, idx_, "idx");
  same_device(w, idx, "embedding");
  TORCH_CHECK(w.dim() == 2 && idx.dim() == 1, "repops.embedding: weight [V, D], idx [N]");
  return {w, idx};
}

inline std::tuple<Tensor, Tensor> embedding_backward_args(at::DeviceType dev, const Tensor& g_, const Tensor& idx_) {
  Tensor g = contig(dev, g_, "g"), idx = contig_idx(dev, idx_, "idx");
  same_device(g, idx, "embedding_backward");
  TORCH_CHECK(g.dim() == 2 && idx.dim() == 1 && idx.size(0) == g.size(0), "repops.embedding_backward: g [N, D], idx [N]");
  return {g, idx};
}

// add, mul: a and b of one shape (no broadcasting).
inline std::tuple<Tensor, Tensor> binary_args(at::DeviceType dev, const Tensor& a_, const Tensor& b_, const char* op) {
  Tensor a = contig(dev, a_, "a"), b = contig(dev, b_, "b");
  same_device(a, b, op);
  TORCH_CHECK(a.sizes() == b.sizes(), "repops.", op, ": shapes differ: ", a.sizes(), " vs ", b.sizes());
  return {a, b};
}

inline Tensor csum_args(at::DeviceType dev, const Tensor& x_) {
  Tensor x = contig(dev, x_, "x");
  TORCH_CHECK(x.dim() >= 1, "repops.csum: at least 1-D");
  return x;
}

// adamw_ updates p, m, v in place through their pointers: they cannot be copied to contiguous
// ones. Returns g contiguous.
inline Tensor adamw_args(at::DeviceType dev, const Tensor& p, const Tensor& g_, const Tensor& m, const Tensor& v) {
  Tensor g = contig(dev, g_, "grad");
  for (const Tensor* t : {&p, &m, &v}) {
    check_f32(dev, *t, "adamw state");
    same_device(g, *t, "adamw_");
    TORCH_CHECK(t->is_contiguous() && t->sizes() == g.sizes(), "repops.adamw_: p, m, v must be contiguous and match g");
  }
  return g;
}

// ------------------------------------------------------------------ the quantized path (§10)
constexpr int64_t kMaxInt8K = 133144;  // the largest K with K * 127^2 < 2^31 (exact int32 sums)

// x viewed as [R, C] with a step size per row (R = s.numel(); a per-tensor one is R = 1).
inline std::tuple<Tensor, Tensor, int64_t, int64_t> int8_rows_args(at::DeviceType dev, const Tensor& x_,
                                                                   const Tensor& s_, const char* op) {
  Tensor x = contig(dev, x_, "x"), s = contig(dev, s_, "s");
  same_device(x, s, op);
  const int64_t R = s.numel();
  TORCH_CHECK(s.dim() == 1 && R >= 1 && x.numel() % R == 0 && (R == 1 || (x.dim() == 2 && x.size(0) == R)),
              "repops.", op, ": s must be [1] (one step size) or [R] for x [R, C]");
  return {x, s, R, x.numel() / R};
}
inline std::tuple<Tensor, Tensor, int64_t> int8_dequantize_args(at::DeviceType dev, const Tensor& q_,
                                                                const Tensor& s_) {
  TORCH_CHECK(q_.device().type() == dev && q_.scalar_type() == at::kChar, "repops.int8_dequantize: q must be an int8 ",
              c10::DeviceTypeName(dev), " tensor");
  Tensor q = q_.contiguous(), s = contig(dev, s_, "s");
  same_device(q, s, "int8_dequantize");
  const int64_t R = s.numel();
  TORCH_CHECK(s.dim() == 1 && R >= 1 && (R == 1 || (q.dim() == 2 && q.size(0) == R)),
              "repops.int8_dequantize: s must be [1] or [R] for q [R, C]");
  return {q, s, R};
}
// a [M, K], b [N, K]: 2-D int8, K small enough for exact int32 sums. Whether they hold -128 (off
// the grid: 128^2 K could overflow int32) is check_on_grid's question, asked where the data is.
inline std::tuple<Tensor, Tensor> int8_gemm_args(at::DeviceType dev, const Tensor& a_, const Tensor& b_,
                                                 const char* op) {
  for (const Tensor* t : {&a_, &b_})
    TORCH_CHECK(t->device().type() == dev && t->scalar_type() == at::kChar && t->dim() == 2, "repops.", op,
                ": operands must be 2-D int8 ", c10::DeviceTypeName(dev), " tensors");
  same_device(a_, b_, op);
  TORCH_CHECK(a_.size(1) == b_.size(1), "repops.", op, ": a [M, K] and b [N, K] differ in K: ", a_.sizes(), ", ",
              b_.sizes());
  TORCH_CHECK(a_.size(1) <= kMaxInt8K, "repops.", op, ": K = ", a_.size(1), " is too large for exact int32 sums "
              "(K * 127^2 must be < 2^31, so K <= ", kMaxInt8K, ")");
  return {a_.contiguous(), b_.contiguous()};
}
// t, a contiguous host int8 tensor, lies on the grid [-127, 127]; the message names the first -128.
inline void check_on_grid(const Tensor& t, const char* op) {
  const int8_t* p = t.data_ptr<int8_t>();
  const int64_t n = t.numel();
  int8_t lo = 0;  // the minimum, a loop the compiler vectorizes; the index only on failure
  for (int64_t i = 0; i < n; ++i) lo = p[i] < lo ? p[i] : lo;
  if (lo == -128)
    for (int64_t i = 0; i < n; ++i)
      TORCH_CHECK(p[i] != -128, "repops.", op, ": operands must lie in [-127, 127]; found -128 at ", i);
}
inline std::tuple<Tensor, Tensor> int8_scales_args(at::DeviceType dev, const Tensor& b, const Tensor& sx_,
                                                   const Tensor& sw_) {
  Tensor sx = contig(dev, sx_, "sx"), sw = contig(dev, sw_, "sw");
  same_device(b, sx, "int8_linear");
  same_device(b, sw, "int8_linear");
  TORCH_CHECK(sx.numel() == 1 && sw.dim() == 1 && sw.size(0) == b.size(0), "repops.int8_linear: sx [1], sw [N]");
  return {sx, sw};
}
// int8 P·V (§10): the step rule over the rows of x [R, C]; the band mix of qp [batch, M, W] int8
// (M = G*T) with qv [batch, T, D] int8, sp [batch * M], sv [batch].
inline Tensor int8_absmax_step_args(at::DeviceType dev, const Tensor& x_) {
  Tensor x = contig(dev, x_, "x");
  TORCH_CHECK(x.dim() == 2 && x.size(1) >= 1, "repops.int8_absmax_step: x [R, C] with C >= 1");
  return x;
}
inline std::tuple<Tensor, Tensor, Tensor, Tensor, BandShape> int8_band_mix_args(at::DeviceType dev, const Tensor& qp_,
                                                                               const Tensor& qv_, const Tensor& sp_,
                                                                               const Tensor& sv_) {
  for (const Tensor* t : {&qp_, &qv_})
    TORCH_CHECK(t->device().type() == dev && t->scalar_type() == at::kChar && t->dim() == 3,
                "repops.int8_band_mix: qp and qv must be 3-D int8 ", c10::DeviceTypeName(dev), " tensors");
  Tensor qp = qp_.contiguous(), qv = qv_.contiguous(), sp = contig(dev, sp_, "sp"), sv = contig(dev, sv_, "sv");
  for (const Tensor* t : {&qv, &sp, &sv}) same_device(qp, *t, "int8_band_mix");
  BandShape sh = band_shape(qp, qv, qp.size(2), "int8_band_mix");
  TORCH_CHECK(sp.dim() == 1 && sp.size(0) == sh.batch * sh.M && sv.dim() == 1 && sv.size(0) == sh.batch,
              "repops.int8_band_mix: sp [batch * M], sv [batch]");
  TORCH_CHECK(sh.W <= kMaxInt8K, "repops.int8_band_mix: W = ", sh.W, " is too large for exact int32 sums "
              "(W * 127^2 must be < 2^31, so W <= ", kMaxInt8K, ")");
  return {qp, qv, sp, sv, sh};
}
inline Tensor lsq_gxh_args(at::DeviceType dev, const Tensor& x, const Tensor& gxh_) {
  Tensor gxh = contig(dev, gxh_, "gxh");
  same_device(x, gxh, "lsq_backward");
  TORCH_CHECK(gxh.sizes() == x.sizes(), "repops.lsq_backward: gxh must have x's shape");
  return gxh;
}

// ------------------------------------------------------------------ host scalars and streams
// Dropout (contract §6): keep threshold round((1-p) 2^32) clamped to 2^32 - 1 and scale
// f32(1/(1-p)), both from float64 on the host (§1); the stream (seed, c1, c2) as the kernels take it.
struct Dropout {
  uint32_t threshold;
  float scale;
  uint64_t seed;
  uint32_t c1, c2;
};
inline Dropout dropout_args(double p, int64_t seed, int64_t c1, int64_t c2) {
  TORCH_CHECK(p >= 0.0 && p < 1.0, "repops.dropout: p must be in [0, 1)");
  const double th = std::nearbyint((1.0 - p) * 4294967296.0);
  return {th >= 4294967295.0 ? 0xFFFFFFFFu : (uint32_t)th, (float)(1.0 / (1.0 - p)), (uint64_t)seed, (uint32_t)c1,
          (uint32_t)c2};
}

// philox, uniform, normal (contract §6): n values of the stream keyed by the 64-bit seed, with
// counter words c1, c2 and the purpose tag (RpPurpose).
struct PhiloxStream {
  uint64_t seed;
  uint32_t c1, c2, purpose;
};
inline PhiloxStream philox_args(const char* op, int64_t seed, int64_t c1, int64_t c2, int64_t purpose, int64_t n) {
  TORCH_CHECK(n >= 0, "repops.", op, ": n >= 0");
  return {(uint64_t)seed, u32(c1, "c1"), u32(c2, "c2"), u32(purpose, "purpose")};
}
}  // namespace rpb

// The ops with tensor inputs, under the names both bindings give their implementations (unary
// is a template over RpFn): TORCH_LIBRARY_IMPL(repops, <key>, m) { RPB_IMPL_TENSOR_OPS(m); }
// registers a backend, and one list means no backend misses an op.
#define RPB_IMPL_TENSOR_OPS(m)                                \
  m.impl("matmul", matmul);                                   \
  m.impl("rmsnorm", rmsnorm);                                 \
  m.impl("rmsnorm_backward", rmsnorm_backward);               \
  m.impl("rope", rope);                                       \
  m.impl("causal_softmax", causal_softmax);                   \
  m.impl("causal_softmax_backward", causal_softmax_backward); \
  m.impl("band_scores", band_scores);                         \
  m.impl("band_mix", band_mix);                               \
  m.impl("band_mix_t", band_mix_t);                           \
  m.impl("window_softmax", window_softmax);                   \
  m.impl("window_softmax_backward", window_softmax_backward); \
  m.impl("swiglu", swiglu);                                   \
  m.impl("swiglu_backward", swiglu_backward);                 \
  m.impl("cross_entropy", cross_entropy);                     \
  m.impl("cross_entropy_backward", cross_entropy_backward);   \
  m.impl("embedding", embedding);                             \
  m.impl("embedding_backward", embedding_backward);           \
  m.impl("add", add);                                         \
  m.impl("mul", mul);                                         \
  m.impl("scale", scale);                                     \
  m.impl("dropout", dropout);                                 \
  m.impl("adamw_", adamw_);                                   \
  m.impl("clip_grad", clip_grad);                             \
  m.impl("csum", csum);                                       \
  m.impl("exp", unary<RpFn::Exp>);                            \
  m.impl("log", unary<RpFn::Log>);                            \
  m.impl("recip", unary<RpFn::Recip>);                        \
  m.impl("rsqrt", unary<RpFn::Rsqrt>);                        \
  m.impl("sqrt", unary<RpFn::Sqrt>);                          \
  m.impl("sin", unary<RpFn::Sin>);                            \
  m.impl("cos", unary<RpFn::Cos>);                            \
  m.impl("tanh", unary<RpFn::Tanh>);                          \
  m.impl("erf", unary<RpFn::Erf>);                            \
  m.impl("sigmoid", unary<RpFn::Sigmoid>);                    \
  m.impl("gelu", unary<RpFn::Gelu>);                          \
  m.impl("gelu_tanh", unary<RpFn::GeluTanh>);                 \
  m.impl("gelu_grad", unary<RpFn::GeluGrad>);                 \
  m.impl("gelu_tanh_grad", unary<RpFn::GeluTanhGrad>);        \
  m.impl("int8_quantize", int8_quantize);                     \
  m.impl("int8_dequantize", int8_dequantize);                 \
  m.impl("int8_matmul", int8_matmul);                         \
  m.impl("int8_linear", int8_linear);                         \
  m.impl("lsq_init_", lsq_init_);                             \
  m.impl("int8_absmax_step", int8_absmax_step);               \
  m.impl("int8_band_mix", int8_band_mix);                     \
  m.impl("lsq_backward", lsq_backward)

// The ops without tensor inputs: nothing to dispatch on, so each backend defines its own op,
// named with a suffix (none for the CPU, _cuda for CUDA), from one schema; the implementations
// are named the same way (philox, philox_cuda). RPB_DEF_TENSORLESS_OPS goes in the backend's
// TORCH_LIBRARY(_FRAGMENT) block, RPB_IMPL_TENSORLESS_OPS in its CompositeExplicitAutograd one.
#define RPB_DEF_TENSORLESS_OPS(m, suffix)                                                                 \
  m.def("rope_tables" #suffix "(int T, int head_dim, float theta) -> (Tensor, Tensor)");                  \
  m.def("philox" #suffix "(int seed, int c1, int c2, int purpose, int n, int block_offset=0) -> Tensor"); \
  m.def("uniform" #suffix "(int seed, int c1, int c2, int purpose, int n) -> Tensor");                    \
  m.def("normal" #suffix "(int seed, int c1, int c2, int purpose, int n) -> Tensor");                     \
  m.def("canary" #suffix "() -> Tensor")
#define RPB_IMPL_TENSORLESS_OPS(m, suffix)            \
  m.impl("rope_tables" #suffix, rope_tables##suffix); \
  m.impl("philox" #suffix, philox##suffix);           \
  m.impl("uniform" #suffix, uniform##suffix);         \
  m.impl("normal" #suffix, normal##suffix);           \
  m.impl("canary" #suffix, canary##suffix)
