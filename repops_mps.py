"""RepOps on Apple GPUs: the Metal kernels of kernels/metal/ registered for torch's MPS device.

    import repops
    repops.load()                      # where torch has MPS, this registers the MPS kernels
    y = repops.ops.matmul(a.to("mps"), b.to("mps"))   # the CPU op's bits, on the GPU

Every tensor op of torch.ops.repops gets an MPS implementation here (torch.library, dispatch key
MPS): it checks the arguments like kernels/common/binding_common.h does (dtype, device, shapes;
the messages name the same things), allocates the outputs on the operands' device, and
launches the Metal kernel of the op's family through torch.mps.compile_shader. Ops without
tensor inputs (rope_tables, philox, uniform, normal, canary) cannot dispatch on a device; as on
CUDA they get twins, <name>_mps, that return MPS tensors.

Compiling and launching (the calling convention, the grids) is mps_kernels.py. Verification
level: emulated on the CPU in CI (tests/test_metal_emulated.py), not yet run on Apple hardware
(docs/metal.md).

Why over ~450 lines: one registration per op of torch.ops.repops, each a few lines beside its
argument check; splitting the families over files would only scatter the list that the
coverage test (tests/test_metal_emulated.py) holds against kernels/cpu/binding.cpp.
"""
import torch

import mps_kernels as mk


# ------------------------------------------------------------------ the tensor ops
def matmul(a, b):
    mk.check_f32(a, "a"), mk.check_f32(b, "b", a.device)
    mk.need(2 <= a.dim() <= 3 and 2 <= b.dim() <= 3, "repops.matmul: 2-D or 3-D operands")
    mk.need(a.shape[-1] == b.shape[-2], f"repops.matmul: inner sizes differ: {list(a.shape)} @ {list(b.shape)}")
    batch = a.shape[0] if a.dim() == 3 else (b.shape[0] if b.dim() == 3 else 1)
    mk.need((a.dim() == 2 or a.shape[0] == batch) and (b.dim() == 2 or b.shape[0] == batch),
             "repops.matmul: batch sizes differ")
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    c = torch.empty(([batch] if max(a.dim(), b.dim()) == 3 else []) + [M, N], device=a.device)
    tiles = batch * -(-M // 16) * -(-N // 16)
    if tiles:
        mk.launch("matmul", "rp_matmul", a, b, c, a.stride(0) if a.dim() == 3 else 0, a.stride(-2), a.stride(-1),
                   b.stride(0) if b.dim() == 3 else 0, b.stride(-2), b.stride(-1), batch, M, N, K,
                   threads=min(tiles, mk.MAX_GROUPS) * mk.GROUP, group=mk.GROUP)
    return c


def rmsnorm(x, w, eps):
    x, w = mk.check_f32(x, "x"), mk.check_f32(w, "w", x.device)
    mk.need(x.dim() == 2 and w.dim() == 1 and w.shape[0] == x.shape[1], "repops.rmsnorm: x [R, D], w [D]")
    R, D = x.shape
    y, rstd = torch.empty_like(x), torch.empty(R, device=x.device)
    if R:
        mk.launch("norm", "rp_rmsnorm", x, w, y, rstd, float(eps), mk.inv(D), R, D, threads=mk.rows(R), group=mk.LANES)
    return y, rstd


def rmsnorm_backward(gy, x, w, rstd):
    gy = mk.check_f32(gy, "gy")
    x, w, rstd = mk.check_f32(x, "x", gy.device), mk.check_f32(w, "w", gy.device), mk.check_f32(rstd, "rstd", gy.device)
    mk.need(gy.shape == x.shape and x.dim() == 2 and rstd.numel() == x.shape[0], "repops.rmsnorm_backward: shapes")
    mk.need(w.dim() == 1 and w.shape[0] == x.shape[1], "repops.rmsnorm_backward: w [D]")
    R, D = x.shape
    gx, gw = torch.empty_like(x), torch.empty_like(w)
    if R:
        mk.launch("norm", "rp_rmsnorm_backward", gy, x, w, rstd, gx, mk.inv(D), R, D,
                  threads=mk.rows(R), group=mk.LANES)
    if D:
        mk.launch("norm", "rp_rmsnorm_gw", gy, x, rstd, gw, R, D, threads=mk.rows(D), group=mk.LANES)
    return gx, gw


def rope(x, c, s, backward):
    x, c, s = mk.check_f32(x, "x"), mk.check_f32(c, "cos", x.device), mk.check_f32(s, "sin", x.device)
    mk.need(x.dim() == 4 and x.shape[3] % 2 == 0, "repops.rope: x [B, T, H, Dh] with even Dh")
    mk.need(c.dim() == 2 and c.shape[0] >= x.shape[1] and c.shape[1] == x.shape[3] // 2 and s.shape == c.shape,
             "repops.rope: cos, sin [>= T, Dh/2]")
    B, T, H, Dh = x.shape
    y = torch.empty_like(x)
    # the kernel indexes the tables with the row stride Dh/2 of the first T rows
    if y.numel():
        mk.launch("rope", "rp_rope", x, c, s, y, B * T * H, T, H, Dh // 2, int(bool(backward)),
                   threads=mk.flat(y.numel() // 2), group=mk.GROUP)
    return y


def causal_softmax(s, scale):
    s = mk.check_f32(s, "s")
    mk.need(s.dim() == 3 and s.shape[1] == s.shape[2], "repops.causal_softmax: s [BH, T, T]")
    p = torch.empty_like(s)
    rows = s.shape[0] * s.shape[1]
    if rows:
        mk.launch("attention", "rp_causal_softmax", s, p, float(scale), rows, s.shape[1],
                  threads=mk.rows(rows), group=mk.LANES)
    return p


def causal_softmax_backward(gp, p, scale):
    gp, p = mk.check_f32(gp, "gp"), mk.check_f32(p, "p", gp.device)
    mk.need(p.dim() == 3 and p.shape[1] == p.shape[2] and gp.shape == p.shape, "repops.causal_softmax_backward: shapes")
    gs = torch.empty_like(p)
    rows = p.shape[0] * p.shape[1]
    if rows:
        mk.launch("attention", "rp_causal_softmax_backward", gp, p, gs, float(scale), rows, p.shape[1],
                   threads=mk.rows(rows), group=mk.LANES)
    return gs


# ---- window attention (contract §8): bands [batch, G*T, W], column w of row r is the key t - (W-1) + w, t = r % T
def band_scores(a, b, W):
    a, b = mk.check_f32(a, "a"), mk.check_f32(b, "b", a.device)
    batch, M, T, D, W = mk.band_shape(a, b, W, "band_scores")
    mk.need(a.shape[2] == D, "repops.band_scores: a [batch, M, D], b [batch, T, D]")
    s = torch.empty(batch, M, W, device=a.device)
    if s.numel():
        mk.launch("window", "rp_band_scores", a, b, s, batch, M, T, D, W, threads=mk.flat(s.numel()), group=mk.GROUP)
    return s


def band_mix(p, b):
    p, b = mk.check_f32(p, "p"), mk.check_f32(b, "b", p.device)
    batch, M, T, D, W = mk.band_shape(p, b, p.shape[2] if p.dim() == 3 else 0, "band_mix")
    o = torch.empty(batch, M, D, device=p.device)
    if o.numel():
        mk.launch("window", "rp_band_mix", p, b, o, batch, M, T, D, W, threads=mk.flat(o.numel()), group=mk.GROUP)
    return o


def band_mix_t(p, a, T):
    p, a = mk.check_f32(p, "p"), mk.check_f32(a, "a", p.device)
    mk.need(p.dim() == 3 and a.dim() == 3 and p.shape[0] == a.shape[0] and p.shape[1] == a.shape[1] and T >= 1
            and p.shape[1] % T == 0 and p.shape[2] >= 1, "repops.band_mix_t: p [batch, G*T, W], a [batch, G*T, D]")
    (batch, M, W), D = p.shape, a.shape[2]
    o = torch.empty(batch, T, D, device=p.device)
    if o.numel():
        mk.launch("window", "rp_band_mix_t", p, a, o, batch, M, T, D, W, threads=mk.flat(o.numel()), group=mk.GROUP)
    return o


def window_softmax(s, scale):
    s = mk.check_f32(s, "s")
    mk.need(s.dim() == 3 and s.shape[2] >= 1, "repops.window_softmax: s [BH, T, W]")
    p = torch.empty_like(s)
    rows = s.shape[0] * s.shape[1]
    if rows:
        mk.launch("window", "rp_window_softmax", s, p, mk.f32r(scale), rows, s.shape[1], s.shape[2],
                  threads=mk.rows(rows), group=mk.LANES)
    return p


def window_softmax_backward(gp, p, scale):
    gp, p = mk.check_f32(gp, "gp"), mk.check_f32(p, "p", gp.device)
    mk.need(p.dim() == 3 and gp.shape == p.shape, "repops.window_softmax_backward: shapes")
    gs = torch.empty_like(p)
    rows = p.shape[0] * p.shape[1]
    if rows:
        mk.launch("window", "rp_window_softmax_backward", gp, p, gs, mk.f32r(scale), rows, p.shape[1], p.shape[2],
                  threads=mk.rows(rows), group=mk.LANES)
    return gs

def swiglu(u):
    u = mk.check_f32(u, "u")
    mk.need(u.dim() == 2 and u.shape[1] % 2 == 0, "repops.swiglu: u [R, 2H]")
    R, H = u.shape[0], u.shape[1] // 2
    out = torch.empty(R, H, device=u.device)
    if out.numel():
        mk.launch("mlp", "rp_swiglu", u, out, R, H, threads=mk.flat(R * H), group=mk.GROUP)
    return out


def swiglu_backward(g, u):
    g, u = mk.check_f32(g, "g"), mk.check_f32(u, "u", g.device)
    mk.need(u.dim() == 2 and g.dim() == 2 and g.shape[0] == u.shape[0] and 2 * g.shape[1] == u.shape[1],
             "repops.swiglu_backward: g [R, H], u [R, 2H]")
    gu = torch.empty_like(u)
    if g.numel():
        mk.launch("mlp", "rp_swiglu_backward", g, u, gu, g.shape[0], g.shape[1],
                  threads=mk.flat(g.numel()), group=mk.GROUP)
    return gu


def cross_entropy(z, targets, zloss, check=True):
    z = mk.check_f32(z, "z")
    t = mk.check_i64(targets, "targets", z.device)
    mk.need(z.dim() == 2 and t.dim() == 1 and t.shape[0] == z.shape[0] and z.shape[1] > 0,
             "repops.cross_entropy: z [R, V], targets [R]")
    R, V = z.shape
    if check:
        mk.check_range(t, V, "targets")
    loss, lse, row_loss = (torch.empty(shape, device=z.device) for shape in ((), R, R))
    if R:
        mk.launch("loss", "rp_cross_entropy_rows", z, t, lse, row_loss, float(zloss), R, V,
                  threads=mk.rows(R), group=mk.LANES)
    mk.launch("loss", "rp_cross_entropy_mean", row_loss, loss, mk.inv(R), R, threads=mk.LANES, group=mk.LANES)
    return loss, lse


def cross_entropy_backward(g, z, targets, lse, zloss, check=True):
    z = mk.check_f32(z, "z")
    t, lse = mk.check_i64(targets, "targets", z.device), mk.check_f32(lse, "lse", z.device)
    mk.need(g.numel() == 1 and g.dtype == torch.float32, "repops.cross_entropy_backward: g is a float32 scalar")
    mk.need(z.dim() == 2 and t.numel() == z.shape[0] and lse.numel() == z.shape[0],
            "repops.cross_entropy_backward: shapes")
    g = g.to(z.device).contiguous()   # data movement only (a CPU scalar is accepted)
    R, V = z.shape
    if check:
        mk.check_range(t, V, "targets")
    two_z = mk.f32r(2.0 * float(zloss))   # host scalar 2*zloss, as the CPU
    gz = torch.empty_like(z)
    if z.numel():
        mk.launch("loss", "rp_cross_entropy_backward", g, z, t, lse, gz, mk.inv(R), two_z, R, V, threads=mk.flat(R * V),
                   group=mk.GROUP)
    return gz


def embedding(w, idx, check=True):
    w = mk.check_f32(w, "weight")
    idx = mk.check_i64(idx, "idx", w.device)
    mk.need(w.dim() == 2 and idx.dim() == 1, "repops.embedding: weight [V, D], idx [N]")
    if check:
        mk.check_range(idx, w.shape[0], "token ids")
    N, D = idx.shape[0], w.shape[1]
    out = torch.empty(N, D, device=w.device)
    if out.numel():
        mk.launch("embedding", "rp_embedding", w, idx, out, N, D, threads=mk.flat(N * D), group=mk.GROUP)
    return out


def embedding_backward(g, idx, num_rows, check=True):
    g = mk.check_f32(g, "g")
    idx = mk.check_i64(idx, "idx", g.device)
    mk.need(g.dim() == 2 and idx.dim() == 1 and idx.shape[0] == g.shape[0],
            "repops.embedding_backward: g [N, D], idx [N]")
    if check:
        mk.check_range(idx, num_rows, "token ids")
    N, D = g.shape
    gw = torch.empty(num_rows, D, device=g.device)
    chunks = -(-num_rows // 64) * D   # kVC = 64 rows of gw per thread (embedding.metal)
    if chunks:
        mk.launch("embedding", "rp_embedding_backward", g, idx, gw, N, num_rows, D,
                  threads=mk.flat(chunks), group=mk.GROUP)
    return gw


def _binary(kernel, name):
    def op(a, b):
        a = mk.check_f32(a, "a")
        b = mk.check_f32(b, "b", a.device)
        mk.need(a.shape == b.shape, f"repops.{name}: shapes differ: {list(a.shape)} vs {list(b.shape)}")
        y = torch.empty_like(a)
        if y.numel():
            mk.launch("elementwise", kernel, a, b, y, y.numel(), threads=mk.flat(y.numel()), group=mk.GROUP)
        return y
    return op


def scale(a, s):
    a = mk.check_f32(a, "a")
    y = torch.empty_like(a)
    if y.numel():
        mk.launch("elementwise", "rp_scale", a, y, float(s), y.numel(), threads=mk.flat(y.numel()), group=mk.GROUP)
    return y


def _unary(fn):
    def op(x):
        x = mk.check_f32(x, "x")
        y = torch.empty_like(x)
        if y.numel():
            mk.launch("elementwise", "rp_unary", x, y, y.numel(), mk.RPFN[fn],
                      threads=mk.flat(y.numel()), group=mk.GROUP)
        return y
    return op


def csum(x):
    x = mk.check_f32(x, "x")
    mk.need(x.dim() >= 1, "repops.csum: at least 1-D")
    y = torch.empty(x.shape[:-1], device=x.device)
    if y.numel():
        mk.launch("elementwise", "rp_csum_rows", x, y, y.numel(), x.shape[-1],
                  threads=mk.rows(y.numel()), group=mk.LANES)
    return y


def _dropout_scalars(p):
    """(threshold, scale) of contract §6, as binding_common.h's dropout_args computes them."""
    mk.need(0.0 <= p < 1.0, "repops.dropout: p must be in [0, 1)")
    th = round((1.0 - p) * 4294967296.0)   # Python's round is half to even, like nearbyint
    threshold = 0xFFFFFFFF if th >= 4294967295 else int(th)
    return threshold, mk.f32r(1.0 / (1.0 - p))


def dropout(x, p, seed, c1, c2):
    x = mk.check_f32(x, "x")
    threshold, sc = _dropout_scalars(p)
    seed, c1, c2 = seed & (1 << 64) - 1, c1 & 0xFFFFFFFF, c2 & 0xFFFFFFFF   # as the binding's casts
    y = torch.empty_like(x)
    if y.numel():
        mk.launch("elementwise", "rp_dropout", x, y, y.numel(), threshold, sc, seed & 0xFFFFFFFF, seed >> 32, c1, c2,
                   threads=mk.flat((y.numel() + 3) // 4), group=mk.GROUP)
    return y


def adamw_(p, g, m, v, lr, b1, b2, omb1, omb2, eps, decay, bc1, bc2):
    g = mk.check_f32(g, "g")
    for t, name in ((p, "p"), (m, "m"), (v, "v")):
        mk.check_f32(t, name, g.device)
        mk.need(t.is_contiguous() and t.shape == g.shape, "repops.adamw_: p, m, v must be contiguous and match g")
    if g.numel():
        mk.launch("optim", "rp_adamw", p, g, m, v, *(float(s) for s in (lr, b1, b2, omb1, omb2, eps, decay, bc1, bc2)),
                   g.numel(), threads=mk.flat(g.numel()), group=mk.GROUP)


def clip_grad(g, max_norm):
    g = mk.check_f32(g, "grad")
    out, norm, coef = torch.empty_like(g), torch.empty((), device=g.device), torch.empty(1, device=g.device)
    chunks = -(-g.numel() // mk.FLAT_CHUNK)                  # the norm is the chunked sum (§4.5)
    sums = torch.empty(max(chunks, 1), device=g.device)      # [chunks] chunk sums (one spare when n = 0)
    if chunks:
        mk.launch("optim", "rp_grad_norm_chunks", g, sums, g.numel(), threads=mk.rows(chunks), group=mk.LANES)
    mk.launch("optim", "rp_grad_norm", sums, norm, coef, float(max_norm), chunks, threads=mk.LANES, group=mk.LANES)
    if g.numel():
        mk.launch("optim", "rp_apply_coef", g, coef, out, g.numel(), threads=mk.flat(g.numel()), group=mk.GROUP)
    return out, norm


# ---- the quantized path (contract §10)
def _int8_rows(x, s, op):
    x = mk.check_f32(x, "x")
    s = mk.check_f32(s, "s", x.device)
    mk.need(x.dim() >= 1 and s.dim() == 1, f"repops.{op}: x [R, C] (or any shape with one step size), s [R]")
    R = s.shape[0]
    mk.need(R >= 1 and (R == 1 or (x.dim() == 2 and x.shape[0] == R)),
            f"repops.{op}: one step size per row of x, or one")
    return x, s, R, x.numel() // R


def int8_quantize(x, s):
    x, s, R, C = _int8_rows(x, s, "int8_quantize")
    q = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    if q.numel():
        mk.launch("int8", "rp_int8_quantize", x, s, q, q.numel(), C, threads=mk.flat(q.numel()), group=mk.GROUP)
    return q


def int8_dequantize(q, s):
    q = mk.check_i8(q, "q")
    s = mk.check_f32(s, "s", q.device)
    R = s.shape[0]
    mk.need(s.dim() == 1 and R >= 1 and (R == 1 or (q.dim() == 2 and q.shape[0] == R)),
             "repops.int8_dequantize: one step size per row of q, or one")
    y = torch.empty(q.shape, device=q.device)
    if y.numel():
        mk.launch("int8", "rp_int8_dequantize", q, s, y, y.numel(), q.numel() // R,
                  threads=mk.flat(y.numel()), group=mk.GROUP)
    return y


def _gemm_operands(a, b, check, op):
    a = mk.check_i8(a, "a")
    b = mk.check_i8(b, "b", a.device)
    mk.need(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[1], f"repops.{op}: a [M, K], b [N, K]")
    mk.need(a.shape[1] <= 133144, f"repops.{op}: K = {a.shape[1]} > 133144 (K * 127^2 must stay below 2^31)")
    if check and any(t.numel() and bool((t == -128).any()) for t in (a, b)):
        torch.ops.repops.int8_matmul(a.cpu(), b.cpu(), True)   # raises with the CPU binding's message
    return a, b


def int8_matmul(a, b, check=True):
    a, b = _gemm_operands(a, b, check, "int8_matmul")
    c = torch.empty(a.shape[0], b.shape[0], dtype=torch.int32, device=a.device)
    if c.numel():
        mk.launch("int8", "rp_int8_gemm", a, b, c, a.shape[0], b.shape[0], a.shape[1], threads=mk.flat(c.numel()),
                   group=mk.GROUP)
    return c


def int8_linear(a, b, sx, sw, check=True):
    a, b = _gemm_operands(a, b, check, "int8_linear")
    sx, sw = mk.check_f32(sx, "sx", a.device), mk.check_f32(sw, "sw", a.device)
    mk.need(sx.numel() == 1 and sw.dim() == 1 and sw.shape[0] == b.shape[0], "repops.int8_linear: sx [1], sw [N]")
    y = torch.empty(a.shape[0], b.shape[0], device=a.device)
    if y.numel():
        mk.launch("int8", "rp_int8_linear", a, b, sx, sw, y, a.shape[0], b.shape[0], a.shape[1],
                   threads=mk.flat(y.numel()), group=mk.GROUP)
    return y


def lsq_init_(x, s):
    mk.need(s.is_contiguous(), "repops.lsq_init_: s must be contiguous")
    x, s2, R, C = _int8_rows(x, s, "lsq_init_")
    mk.need(C >= 1, "repops.lsq_init_: no elements to take the mean of")
    mk.launch("int8", "rp_lsq_init", x, s, mk.inv(C), R, C, threads=mk.rows(R), group=mk.LANES)


def lsq_backward(x, s, gxh, g):
    x, s, R, C = _int8_rows(x, s, "lsq_backward")
    gxh = mk.check_f32(gxh, "gxh", x.device)
    mk.need(gxh.shape == x.shape, "repops.lsq_backward: gxh must match x")
    gx, gs = torch.empty_like(x), torch.empty_like(s)
    if x.numel():
        mk.launch("int8", "rp_lsq_gx", x, s, gxh, gx, x.numel(), C, threads=mk.flat(x.numel()), group=mk.GROUP)
    mk.launch("int8", "rp_lsq_gs", x, s, gxh, gs, float(g), R, C, threads=mk.rows(R), group=mk.LANES)
    return gx, gs


TENSOR_OPS = {
    "matmul": matmul, "rmsnorm": rmsnorm, "rmsnorm_backward": rmsnorm_backward, "rope": rope,
    "causal_softmax": causal_softmax, "causal_softmax_backward": causal_softmax_backward, "swiglu": swiglu,
    "band_scores": band_scores, "band_mix": band_mix, "band_mix_t": band_mix_t, "window_softmax": window_softmax,
    "window_softmax_backward": window_softmax_backward,
    "swiglu_backward": swiglu_backward, "cross_entropy": cross_entropy,
    "cross_entropy_backward": cross_entropy_backward, "embedding": embedding,
    "embedding_backward": embedding_backward, "add": _binary("rp_add", "add"), "mul": _binary("rp_mul", "mul"),
    "scale": scale, "dropout": dropout, "adamw_": adamw_, "clip_grad": clip_grad, "csum": csum,
    **{fn: _unary(fn) for fn in mk.RPFN},
    "int8_quantize": int8_quantize, "int8_dequantize": int8_dequantize, "int8_matmul": int8_matmul,
    "int8_linear": int8_linear, "lsq_init_": lsq_init_, "lsq_backward": lsq_backward,
}


# ------------------------------------------------------------------ ops without tensor inputs
def _mps():
    return torch.device(mk.DEVICE_TYPE)


def rope_tables_mps(T, head_dim, theta):
    mk.need(T >= 0 and head_dim > 0 and head_dim % 2 == 0, "repops.rope_tables: head_dim must be even")
    c, s = torch.empty(T, head_dim // 2, device=_mps()), torch.empty(T, head_dim // 2, device=_mps())
    if c.numel():
        mk.launch("rope", "rp_rope_tables", c, s, T, head_dim // 2, float(theta), mk.inv(head_dim),
                   threads=mk.flat(c.numel()), group=mk.GROUP)
    return c, s


def _stream(name, seed, c1, c2, purpose, n):
    mk.need(n >= 0, f"repops.{name}: n >= 0")
    for v, what in ((c1, "c1"), (c2, "c2"), (purpose, "purpose")):
        mk.need(0 <= v < 1 << 32, f"repops: {what} must fit in 32 unsigned bits, got {v}")
    seed &= (1 << 64) - 1
    return seed & 0xFFFFFFFF, seed >> 32


def philox_mps(seed, c1, c2, purpose, n, block_offset=0):
    k0, k1 = _stream("philox", seed, c1, c2, purpose, n)
    mk.need(0 <= block_offset < 1 << 32, f"repops: block_offset must fit in 32 unsigned bits, got {block_offset}")
    out = torch.empty(n, dtype=torch.int64, device=_mps())
    if n:
        mk.launch("random", "rp_philox", out, k0, k1, c1, c2, purpose, block_offset, n, threads=mk.flat((n + 3) // 4),
                   group=mk.GROUP)
    return out


def _floats(kernel, name):
    def op(seed, c1, c2, purpose, n):
        k0, k1 = _stream(name, seed, c1, c2, purpose, n)
        out = torch.empty(n, device=_mps())
        if n:
            mk.launch("random", kernel, out, k0, k1, c1, c2, purpose, n, threads=mk.flat((n + 3) // 4), group=mk.GROUP)
        return out
    return op


def canary_mps():
    """[fused, flush missing], as canary_cuda: both 0.0 unless the Metal compiler contracted
    a*b + c or the software flush let a subnormal product through."""
    out = torch.empty(2, device=_mps())
    mk.launch("elementwise", "rp_canary", out, 1.0 + 2.0**-12, -(1.0 + 2.0**-11), 2.0**-100, 2.0**-30,
               threads=mk.LANES, group=mk.LANES)
    return out


TENSORLESS_OPS = {
    "rope_tables_mps(int T, int head_dim, float theta) -> (Tensor, Tensor)": rope_tables_mps,
    "philox_mps(int seed, int c1, int c2, int purpose, int n, int block_offset=0) -> Tensor": philox_mps,
    "uniform_mps(int seed, int c1, int c2, int purpose, int n) -> Tensor": _floats("rp_uniform", "uniform"),
    "normal_mps(int seed, int c1, int c2, int purpose, int n) -> Tensor": _floats("rp_normal", "normal"),
    "canary_mps() -> Tensor": canary_mps,
}

_registered = []   # the torch.library.Library objects (registrations live as long as they do)


def register():
    """Register every op's MPS implementation with torch (once; repops.load() calls it where
    torch has MPS), then run the Metal canary."""
    if _registered:
        return
    impl = torch.library.Library("repops", "IMPL")
    for name, fn in TENSOR_OPS.items():
        impl.impl(name, fn, "MPS")
    frag = torch.library.Library("repops", "FRAGMENT")
    for schema, fn in TENSORLESS_OPS.items():
        frag.define(schema)
        frag.impl(schema.split("(")[0], fn, "CompositeExplicitAutograd")
    _registered.extend([impl, frag])
    fused, flush_missing = torch.ops.repops.canary_mps().tolist()
    if fused != 0.0 or flush_missing != 0.0:
        raise RuntimeError("RepOps Metal canary: the Metal compiler contracted a*b+c into an FMA or the software "
                           "flush let a subnormal through; the MPS kernels cannot give the contract's bits")
