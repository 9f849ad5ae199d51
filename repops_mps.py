"""RepOps on Apple GPUs: the Metal kernels of kernels/metal/ registered for torch's MPS device,
with their compiler and launcher.

    import repops
    repops.load()                      # where torch has MPS, this registers the MPS kernels
    y = repops.ops.matmul(a.to("mps"), b.to("mps"))   # the CPU op's bits, on the GPU

Every tensor op of torch.ops.repops gets an MPS implementation here (torch.library, dispatch key
MPS): it checks the arguments like kernels/common/binding_common.h does (dtype, device, shapes;
the messages name the same things), allocates the outputs on the operands' device, and
launches the Metal kernel of the op's family through torch.mps.compile_shader. Ops without
tensor inputs (rope_tables, philox, uniform, normal, canary) cannot dispatch on a device; as on
CUDA they get twins, <name>_mps, that return MPS tensors.

Launch convention (launch(); torch.mps.compile_shader): lib.<kernel>(tensors and scalars in the
kernel's argument order, threads=[total, 1, 1], group_size=[G, 1, 1]); a Python int arrives as a
Metal `constant long&`, a float as `constant float&` (every float scalar here is already
float32, so nothing is rounded on the way). Grids are always whole groups (flat_grid,
row_grid); the kernels loop (grid-stride or over rows by group), so the grid's size never
decides a bit. Each .metal source is compiled once per process, with canonical.h pasted in
place of its #include (compile_shader has no include path).

The file is one registration per op of torch.ops.repops, each a few lines beside its argument
check, in the order of kernels/cpu/binding.cpp: tests/test_metal_emulated.py holds this list
against that file, sets DEVICE_TYPE to "cpu" and replaces compile_shader with the CPU shim of
tests/metal_shim/. Verification level: emulated on the CPU in CI, not yet run on Apple hardware
(docs/metal.md).
"""
import os

import numpy as np
import torch

# ------------------------------------------------------------------ compiling and launching
METAL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "metal")
GROUP = 256            # threads per group of the elementwise and matmul kernels
LANES = 32             # threads per group of the row kernels (the contract's 32 lanes, §4.2)
MAX_GROUPS = 1 << 16   # grids stop growing here; the kernels' loops take the rest
FLAT_CHUNK = 32768     # the chunked sum's chunk length L (contract §4.5; kFlatChunk in optim.metal)
DEVICE_TYPE = "mps"   # where the kernels run (tests/test_metal_emulated.py runs them on the CPU shim)
RPFN = {"exp": 0, "log": 1, "recip": 2, "rsqrt": 3, "sqrt": 4, "sin": 5, "cos": 6, "tanh": 7, "erf": 8,   # RpFn, ids.h
        "sigmoid": 9, "gelu": 10, "gelu_tanh": 11, "gelu_grad": 12, "gelu_tanh_grad": 13}


def metal_source(family):
    """The text compile_shader gets for kernels/metal/<family>.metal: canonical.h inlined."""
    with open(os.path.join(METAL_DIR, "canonical.h")) as f:
        header = f.read()
    with open(os.path.join(METAL_DIR, family + ".metal")) as f:
        text = f.read()
    include = '#include "canonical.h"'
    if text.count(include) != 1:
        raise RuntimeError(f"kernels/metal/{family}.metal must include canonical.h exactly once")
    return text.replace(include, header.replace("#pragma once\n", ""))   # the pasted header is the main file


_libs = {}


def _lib(family):
    if family not in _libs:
        _libs[family] = torch.mps.compile_shader(metal_source(family))
    return _libs[family]


def launch(family, kernel, *args, threads, group):
    getattr(_lib(family), kernel)(*args, threads=[threads, 1, 1], group_size=[group, 1, 1])


def flat_grid(n):
    """Threads for a grid-stride loop over n items (whole groups)."""
    return min(max((n + GROUP - 1) // GROUP, 1), MAX_GROUPS) * GROUP


def row_grid(n):
    """Threads for n rows, one group of 32 per row (groups loop past MAX_GROUPS)."""
    return min(max(n, 1), MAX_GROUPS) * LANES


# ------------------------------------------------------------------ the compiler's settings
# What the shim cannot see (docs/metal.md), checked on a Mac by .ci/mac's "fast math off" line and
# tests/test_mps.py: compile_shader must compile with fast math off. canonical.h's product flush
# computes da * (db * 2^24) as written, and NaN tests x != x; fast math may reassociate the first
# (to (da * db) * 2^24, whose da * db is already flushed) and fold the second to false. The probe
# reads its inputs from buffers, so nothing is folded at compile time. out: [1 if the compiler
# defines __FAST_MATH__, (x != x) for x = NaN, the bits of a * (b * 2^24) for a = 2^-100 and
# b = 2^-40 (2^-116 as written, 0 reassociated), the bits of (float) of the int32 2^24 + 3 (2^24 + 4
# rounding to nearest even, 2^24 + 2 toward zero: reported only, no kernel converts an int whose
# float rounds, canonical.h i32_to_float)].
COMPILER_PROBE = """#pragma METAL fp contract(off)
#if defined(__METAL_VERSION__)
#include <metal_stdlib>
using namespace metal;
#endif
kernel void rp_compiler_probe(device const float* x, device const int* n, device uint* out,
                              uint tid [[thread_position_in_grid]]) {
  if (tid != 0) return;
#if defined(__FAST_MATH__)
  out[0] = 1u;
#else
  out[0] = 0u;
#endif
  const float nan_value = x[0];
  out[1] = (nan_value != nan_value) ? 1u : 0u;
  out[2] = as_type<uint>(x[1] * (x[2] * 16777216.0f));
  out[3] = as_type<uint>((float)n[0]);
}
"""
PROBE_INPUTS = ([float("nan"), 2.0 ** -100, 2.0 ** -40], [2 ** 24 + 3])
PROBE_FAST_MATH_OFF = [0, 1, 0x05800000, None]        # 0x05800000 = 2^-116; the last is reported only


def compiler_probe():
    """The probe's four words (COMPILER_PROBE) as torch.mps.compile_shader compiles it here."""
    x = torch.tensor(PROBE_INPUTS[0], dtype=torch.float32, device=DEVICE_TYPE)
    n = torch.tensor(PROBE_INPUTS[1], dtype=torch.int32, device=DEVICE_TYPE)
    out = torch.zeros(4, dtype=torch.int32, device=DEVICE_TYPE)
    torch.mps.compile_shader(COMPILER_PROBE).rp_compiler_probe(x, n, out, threads=[1, 1, 1], group_size=[1, 1, 1])
    return [v & 0xFFFFFFFF for v in out.cpu().tolist()]


def check_fast_math_off(words=None):
    """One line saying how compile_shader compiles (the probe's words, default: run it now);
    RuntimeError if fast math is on in any way the kernels would notice."""
    fast, nan_ne, product, to_float = compiler_probe() if words is None else words
    bad = [what for what, wrong in (("__FAST_MATH__ is defined", fast != 0),
                                    ("x != x is false for a NaN", nan_ne != 1),
                                    (f"a * (b * 2^24) gave 0x{product:08x}, not 2^-116 (reassociated)",
                                     product != PROBE_FAST_MATH_OFF[2])) if wrong]
    if bad:
        raise RuntimeError("torch.mps.compile_shader compiles with fast math on (" + "; ".join(bad)
                           + "): the Metal kernels cannot give the contract's bits")
    mode = {0x4B800001: "toward zero", 0x4B800002: "to nearest even"}.get(to_float, f"0x{to_float:08x}")
    return (f"compile_shader: fast math off (no __FAST_MATH__, NaN != NaN, no reassociation); "
            f"(float) of an int rounds {mode}")


# ------------------------------------------------------------------ argument checks (binding_common.h's)
def need(cond, msg):
    if not cond:
        raise RuntimeError(msg)


def check_f32(t, name, device=None):
    need(t.device.type == DEVICE_TYPE, f"repops: {name} must be a {DEVICE_TYPE} tensor")
    need(t.dtype == torch.float32, f"repops: {name} must be float32, got {t.dtype}")
    need(device is None or t.device == device, f"repops: {name} is on {t.device}, the other operands on {device}")
    return t.contiguous()


def check_i64(t, name, device):
    need(t.device == device and t.dtype == torch.int64, f"repops: {name} must be an int64 tensor on {device}")
    return t.contiguous()


def check_i8(t, name, device=None):
    need(t.device.type == DEVICE_TYPE and t.dtype == torch.int8, f"repops: {name} must be a {DEVICE_TYPE} int8 tensor")
    need(device is None or t.device == device, f"repops: {name} is on {t.device}, the other operands on {device}")
    return t.contiguous()


def band_shape(rows, keys, W, op):
    """(batch, M, T, D, W) of a window op, as binding_common.h's band_shape: rows [batch, G*T, *],
    keys [batch, T, D], W >= 1."""
    need(rows.dim() == 3 and keys.dim() == 3 and rows.shape[0] == keys.shape[0] and keys.shape[1] >= 1
         and rows.shape[1] % keys.shape[1] == 0 and W >= 1,
         f"repops.{op}: rows [batch, G*T, *], keys [batch, T, *], W >= 1")
    return rows.shape[0], rows.shape[1], keys.shape[1], keys.shape[2], W


def f32r(x):
    return float(np.float32(x))   # one rounding of a float64 to float32 (contract §1)


def inv(n):
    return f32r(1.0 / n) if n else float("inf")   # (float)(1.0 / n), as the bindings' shape scalars


def check_range(idx, hi, what):
    """Every index in [0, hi): an integer test on the device (no float arithmetic); on failure
    the CPU op names the first bad index, with the CPU binding's message."""
    if idx.numel() and bool(((idx < 0) | (idx >= hi)).any()):
        torch.ops.repops.check_index(idx.cpu(), hi, what)

# ------------------------------------------------------------------ the tensor ops
def matmul(a, b):
    check_f32(a, "a"), check_f32(b, "b", a.device)
    need(2 <= a.dim() <= 3 and 2 <= b.dim() <= 3, "repops.matmul: 2-D or 3-D operands")
    need(a.shape[-1] == b.shape[-2], f"repops.matmul: inner sizes differ: {list(a.shape)} @ {list(b.shape)}")
    batch = a.shape[0] if a.dim() == 3 else (b.shape[0] if b.dim() == 3 else 1)
    need((a.dim() == 2 or a.shape[0] == batch) and (b.dim() == 2 or b.shape[0] == batch),
             "repops.matmul: batch sizes differ")
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    c = torch.empty(([batch] if max(a.dim(), b.dim()) == 3 else []) + [M, N], device=a.device)
    tiles = batch * -(-M // 16) * -(-N // 16)
    if tiles:
        launch("matmul", "rp_matmul", a, b, c, a.stride(0) if a.dim() == 3 else 0, a.stride(-2), a.stride(-1),
                   b.stride(0) if b.dim() == 3 else 0, b.stride(-2), b.stride(-1), batch, M, N, K,
                   threads=min(tiles, MAX_GROUPS) * GROUP, group=GROUP)
    return c


def rmsnorm(x, w, eps):
    x, w = check_f32(x, "x"), check_f32(w, "w", x.device)
    need(x.dim() == 2 and w.dim() == 1 and w.shape[0] == x.shape[1], "repops.rmsnorm: x [R, D], w [D]")
    R, D = x.shape
    y, rstd = torch.empty_like(x), torch.empty(R, device=x.device)
    if R:
        launch("norm", "rp_rmsnorm", x, w, y, rstd, float(eps), inv(D), R, D, threads=row_grid(R), group=LANES)
    return y, rstd


def rmsnorm_backward(gy, x, w, rstd):
    gy = check_f32(gy, "gy")
    x, w, rstd = check_f32(x, "x", gy.device), check_f32(w, "w", gy.device), check_f32(rstd, "rstd", gy.device)
    need(gy.shape == x.shape and x.dim() == 2 and rstd.numel() == x.shape[0], "repops.rmsnorm_backward: shapes")
    need(w.dim() == 1 and w.shape[0] == x.shape[1], "repops.rmsnorm_backward: w [D]")
    R, D = x.shape
    gx, gw = torch.empty_like(x), torch.empty_like(w)
    if R:
        launch("norm", "rp_rmsnorm_backward", gy, x, w, rstd, gx, inv(D), R, D,
                  threads=row_grid(R), group=LANES)
    if D:
        launch("norm", "rp_rmsnorm_gw", gy, x, rstd, gw, R, D, threads=row_grid(D), group=LANES)
    return gx, gw


def rope(x, c, s, backward):
    """The forward x [B, T, H, Dh] -> [B, H, T, Dh], the backward g [B, H, T, Dh] -> [B, T, H, Dh]
    (binding_common.h rope_args). x is made contiguous here; the kernel reads and writes each row
    (b, t, h) at the strides given."""
    x, c, s = check_f32(x, "x"), check_f32(c, "cos", x.device), check_f32(s, "sin", x.device)
    need(x.dim() == 4 and x.shape[3] % 2 == 0,
         f"repops.rope: {'g [B, H, T, Dh]' if backward else 'x [B, T, H, Dh]'} with even Dh")
    t, h = (2, 1) if backward else (1, 2)                # x's dims of positions and heads
    B, T, H, Dh = x.shape[0], x.shape[t], x.shape[h], x.shape[3]
    need(c.dim() == 2 and c.shape[0] >= T and c.shape[1] == Dh // 2 and s.shape == c.shape,
             "repops.rope: cos, sin [>= T, Dh/2]")
    y = torch.empty((B, T, H, Dh) if backward else (B, H, T, Dh), dtype=x.dtype, device=x.device)
    ys = (T * H * Dh, H * Dh, Dh) if backward else (H * T * Dh, Dh, T * Dh)
    # the kernel indexes the tables with the row stride Dh/2 of the first T rows
    if y.numel():
        launch("rope", "rp_rope", x, c, s, y, B * T * H, T, H, Dh // 2, int(bool(backward)),
               x.stride(0), x.stride(t), x.stride(h), *ys, threads=flat_grid(y.numel() // 2), group=GROUP)
    return y


def causal_softmax(s, scale):
    s = check_f32(s, "s")
    need(s.dim() == 3 and s.shape[1] == s.shape[2], "repops.causal_softmax: s [BH, T, T]")
    p = torch.empty_like(s)
    rows = s.shape[0] * s.shape[1]
    if rows:
        launch("attention", "rp_causal_softmax", s, p, float(scale), rows, s.shape[1],
                  threads=row_grid(rows), group=LANES)
    return p


def causal_softmax_backward(gp, p, scale):
    gp, p = check_f32(gp, "gp"), check_f32(p, "p", gp.device)
    need(p.dim() == 3 and p.shape[1] == p.shape[2] and gp.shape == p.shape, "repops.causal_softmax_backward: shapes")
    gs = torch.empty_like(p)
    rows = p.shape[0] * p.shape[1]
    if rows:
        launch("attention", "rp_causal_softmax_backward", gp, p, gs, float(scale), rows, p.shape[1],
                   threads=row_grid(rows), group=LANES)
    return gs


# ---- window attention (contract §8): bands [batch, G*T, W], column w of row r is the key t - (W-1) + w, t = r % T
def band_scores(a, b, W):
    a, b = check_f32(a, "a"), check_f32(b, "b", a.device)
    batch, M, T, D, W = band_shape(a, b, W, "band_scores")
    need(a.shape[2] == D, "repops.band_scores: a [batch, M, D], b [batch, T, D]")
    s = torch.empty(batch, M, W, device=a.device)
    if s.numel():
        launch("window", "rp_band_scores", a, b, s, batch, M, T, D, W, threads=flat_grid(s.numel()), group=GROUP)
    return s


def band_mix(p, b):
    p, b = check_f32(p, "p"), check_f32(b, "b", p.device)
    batch, M, T, D, W = band_shape(p, b, p.shape[2] if p.dim() == 3 else 0, "band_mix")
    o = torch.empty(batch, M, D, device=p.device)
    if o.numel():
        launch("window", "rp_band_mix", p, b, o, batch, M, T, D, W, threads=flat_grid(o.numel()), group=GROUP)
    return o


def band_mix_t(p, a, T):
    p, a = check_f32(p, "p"), check_f32(a, "a", p.device)
    need(p.dim() == 3 and a.dim() == 3 and p.shape[0] == a.shape[0] and p.shape[1] == a.shape[1] and T >= 1
            and p.shape[1] % T == 0 and p.shape[2] >= 1, "repops.band_mix_t: p [batch, G*T, W], a [batch, G*T, D]")
    (batch, M, W), D = p.shape, a.shape[2]
    o = torch.empty(batch, T, D, device=p.device)
    if o.numel():
        launch("window", "rp_band_mix_t", p, a, o, batch, M, T, D, W, threads=flat_grid(o.numel()), group=GROUP)
    return o


def window_softmax(s, scale):
    s = check_f32(s, "s")
    need(s.dim() == 3 and s.shape[2] >= 1, "repops.window_softmax: s [BH, T, W]")
    p = torch.empty_like(s)
    rows = s.shape[0] * s.shape[1]
    if rows:
        launch("window", "rp_window_softmax", s, p, f32r(scale), rows, s.shape[1], s.shape[2],
                  threads=row_grid(rows), group=LANES)
    return p


def window_softmax_backward(gp, p, scale):
    gp, p = check_f32(gp, "gp"), check_f32(p, "p", gp.device)
    need(p.dim() == 3 and gp.shape == p.shape, "repops.window_softmax_backward: shapes")
    gs = torch.empty_like(p)
    rows = p.shape[0] * p.shape[1]
    if rows:
        launch("window", "rp_window_softmax_backward", gp, p, gs, f32r(scale), rows, p.shape[1], p.shape[2],
                  threads=row_grid(rows), group=LANES)
    return gs

def swiglu(u):
    u = check_f32(u, "u")
    need(u.dim() == 2 and u.shape[1] % 2 == 0, "repops.swiglu: u [R, 2H]")
    R, H = u.shape[0], u.shape[1] // 2
    out = torch.empty(R, H, device=u.device)
    if out.numel():
        launch("mlp", "rp_swiglu", u, out, R, H, threads=flat_grid(R * H), group=GROUP)
    return out


def swiglu_backward(g, u):
    g, u = check_f32(g, "g"), check_f32(u, "u", g.device)
    need(u.dim() == 2 and g.dim() == 2 and g.shape[0] == u.shape[0] and 2 * g.shape[1] == u.shape[1],
             "repops.swiglu_backward: g [R, H], u [R, 2H]")
    gu = torch.empty_like(u)
    if g.numel():
        launch("mlp", "rp_swiglu_backward", g, u, gu, g.shape[0], g.shape[1],
                  threads=flat_grid(g.numel()), group=GROUP)
    return gu


def cross_entropy(z, targets, zloss, check=True):
    z = check_f32(z, "z")
    t = check_i64(targets, "targets", z.device)
    need(z.dim() == 2 and t.dim() == 1 and t.shape[0] == z.shape[0] and z.shape[1] > 0,
             "repops.cross_entropy: z [R, V], targets [R]")
    R, V = z.shape
    if check:
        check_range(t, V, "targets")
    loss, lse, row_loss = (torch.empty(shape, device=z.device) for shape in ((), R, R))
    if R:
        launch("loss", "rp_cross_entropy_rows", z, t, lse, row_loss, float(zloss), R, V,
                  threads=row_grid(R), group=LANES)
    launch("loss", "rp_cross_entropy_mean", row_loss, loss, inv(R), R, threads=LANES, group=LANES)
    return loss, lse


def cross_entropy_backward(g, z, targets, lse, zloss, check=True):
    z = check_f32(z, "z")
    t, lse = check_i64(targets, "targets", z.device), check_f32(lse, "lse", z.device)
    need(g.numel() == 1 and g.dtype == torch.float32, "repops.cross_entropy_backward: g is a float32 scalar")
    need(z.dim() == 2 and t.numel() == z.shape[0] and lse.numel() == z.shape[0],
            "repops.cross_entropy_backward: shapes")
    g = g.to(z.device).contiguous()   # data movement only (a CPU scalar is accepted)
    R, V = z.shape
    if check:
        check_range(t, V, "targets")
    two_z = f32r(2.0 * float(zloss))   # host scalar 2*zloss, as the CPU
    gz = torch.empty_like(z)
    if z.numel():
        launch("loss", "rp_cross_entropy_backward", g, z, t, lse, gz, inv(R), two_z, R, V, threads=flat_grid(R * V),
                   group=GROUP)
    return gz


def embedding(w, idx, check=True):
    w = check_f32(w, "weight")
    idx = check_i64(idx, "idx", w.device)
    need(w.dim() == 2 and idx.dim() == 1, "repops.embedding: weight [V, D], idx [N]")
    if check:
        check_range(idx, w.shape[0], "token ids")
    N, D = idx.shape[0], w.shape[1]
    out = torch.empty(N, D, device=w.device)
    if out.numel():
        launch("embedding", "rp_embedding", w, idx, out, N, D, threads=flat_grid(N * D), group=GROUP)
    return out


def embedding_backward(g, idx, num_rows, check=True):
    g = check_f32(g, "g")
    idx = check_i64(idx, "idx", g.device)
    need(g.dim() == 2 and idx.dim() == 1 and idx.shape[0] == g.shape[0],
            "repops.embedding_backward: g [N, D], idx [N]")
    if check:
        check_range(idx, num_rows, "token ids")
    N, D = g.shape
    gw = torch.empty(num_rows, D, device=g.device)
    chunks = -(-num_rows // 64) * D   # kVC = 64 rows of gw per thread (embedding.metal)
    if chunks:
        launch("embedding", "rp_embedding_backward", g, idx, gw, N, num_rows, D,
                  threads=flat_grid(chunks), group=GROUP)
    return gw


def _binary(kernel, name):
    def op(a, b):
        a = check_f32(a, "a")
        b = check_f32(b, "b", a.device)
        need(a.shape == b.shape, f"repops.{name}: shapes differ: {list(a.shape)} vs {list(b.shape)}")
        y = torch.empty_like(a)
        if y.numel():
            launch("elementwise", kernel, a, b, y, y.numel(), threads=flat_grid(y.numel()), group=GROUP)
        return y
    return op


def scale(a, s):
    a = check_f32(a, "a")
    y = torch.empty_like(a)
    if y.numel():
        launch("elementwise", "rp_scale", a, y, float(s), y.numel(), threads=flat_grid(y.numel()), group=GROUP)
    return y


def _unary(fn):
    def op(x):
        x = check_f32(x, "x")
        y = torch.empty_like(x)
        if y.numel():
            launch("elementwise", "rp_unary", x, y, y.numel(), RPFN[fn],
                      threads=flat_grid(y.numel()), group=GROUP)
        return y
    return op


def csum(x):
    x = check_f32(x, "x")
    need(x.dim() >= 1, "repops.csum: at least 1-D")
    y = torch.empty(x.shape[:-1], device=x.device)
    if y.numel():
        launch("elementwise", "rp_csum_rows", x, y, y.numel(), x.shape[-1],
                  threads=row_grid(y.numel()), group=LANES)
    return y


def _dropout_scalars(p):
    """(threshold, scale) of contract §6, as binding_common.h's dropout_args computes them."""
    need(0.0 <= p < 1.0, "repops.dropout: p must be in [0, 1)")
    th = round((1.0 - p) * 4294967296.0)   # Python's round is half to even, like nearbyint
    threshold = 0xFFFFFFFF if th >= 4294967295 else int(th)
    return threshold, f32r(1.0 / (1.0 - p))


def dropout(x, p, seed, c1, c2):
    x = check_f32(x, "x")
    threshold, sc = _dropout_scalars(p)
    seed, c1, c2 = seed & (1 << 64) - 1, c1 & 0xFFFFFFFF, c2 & 0xFFFFFFFF   # as the binding's casts
    y = torch.empty_like(x)
    if y.numel():
        launch("elementwise", "rp_dropout", x, y, y.numel(), threshold, sc, seed & 0xFFFFFFFF, seed >> 32, c1, c2,
                   threads=flat_grid((y.numel() + 3) // 4), group=GROUP)
    return y


def adamw_(p, g, m, v, lr, b1, b2, omb1, omb2, eps, decay, bc1, bc2):
    g = check_f32(g, "g")
    for t, name in ((p, "p"), (m, "m"), (v, "v")):
        check_f32(t, name, g.device)
        need(t.is_contiguous() and t.shape == g.shape, "repops.adamw_: p, m, v must be contiguous and match g")
    if g.numel():
        launch("optim", "rp_adamw", p, g, m, v, *(float(s) for s in (lr, b1, b2, omb1, omb2, eps, decay, bc1, bc2)),
                   g.numel(), threads=flat_grid(g.numel()), group=GROUP)


def clip_grad(g, max_norm):
    g = check_f32(g, "grad")
    out, norm, coef = torch.empty_like(g), torch.empty((), device=g.device), torch.empty(1, device=g.device)
    chunks = -(-g.numel() // FLAT_CHUNK)                  # the norm is the chunked sum (§4.5)
    sums = torch.empty(max(chunks, 1), device=g.device)      # [chunks] chunk sums (one spare when n = 0)
    if chunks:
        launch("optim", "rp_grad_norm_chunks", g, sums, g.numel(), threads=row_grid(chunks), group=LANES)
    launch("optim", "rp_grad_norm", sums, norm, coef, float(max_norm), chunks, threads=LANES, group=LANES)
    if g.numel():
        launch("optim", "rp_apply_coef", g, coef, out, g.numel(), threads=flat_grid(g.numel()), group=GROUP)
    return out, norm


# ---- the quantized path (contract §10)
def _int8_rows(x, s, op):
    x = check_f32(x, "x")
    s = check_f32(s, "s", x.device)
    need(x.dim() >= 1 and s.dim() == 1, f"repops.{op}: x [R, C] (or any shape with one step size), s [R]")
    R = s.shape[0]
    need(R >= 1 and (R == 1 or (x.dim() == 2 and x.shape[0] == R)),
            f"repops.{op}: one step size per row of x, or one")
    return x, s, R, x.numel() // R


def int8_quantize(x, s):
    x, s, R, C = _int8_rows(x, s, "int8_quantize")
    q = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    if q.numel():
        launch("int8", "rp_int8_quantize", x, s, q, q.numel(), C, threads=flat_grid(q.numel()), group=GROUP)
    return q


def int8_dequantize(q, s):
    q = check_i8(q, "q")
    s = check_f32(s, "s", q.device)
    R = s.shape[0]
    need(s.dim() == 1 and R >= 1 and (R == 1 or (q.dim() == 2 and q.shape[0] == R)),
             "repops.int8_dequantize: one step size per row of q, or one")
    y = torch.empty(q.shape, device=q.device)
    if y.numel():
        launch("int8", "rp_int8_dequantize", q, s, y, y.numel(), q.numel() // R,
                  threads=flat_grid(y.numel()), group=GROUP)
    return y


def _gemm_operands(a, b, check, op):
    a = check_i8(a, "a")
    b = check_i8(b, "b", a.device)
    need(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[1], f"repops.{op}: a [M, K], b [N, K]")
    need(a.shape[1] <= 133144, f"repops.{op}: K = {a.shape[1]} > 133144 (K * 127^2 must stay below 2^31)")
    if check and any(t.numel() and bool((t == -128).any()) for t in (a, b)):
        torch.ops.repops.int8_matmul(a.cpu(), b.cpu(), True)   # raises with the CPU binding's message
    return a, b


def int8_matmul(a, b, check=True):
    a, b = _gemm_operands(a, b, check, "int8_matmul")
    c = torch.empty(a.shape[0], b.shape[0], dtype=torch.int32, device=a.device)
    if c.numel():
        launch("int8", "rp_int8_gemm", a, b, c, a.shape[0], b.shape[0], a.shape[1], threads=flat_grid(c.numel()),
                   group=GROUP)
    return c


def int8_linear(a, b, sx, sw, check=True):
    a, b = _gemm_operands(a, b, check, "int8_linear")
    sx, sw = check_f32(sx, "sx", a.device), check_f32(sw, "sw", a.device)
    need(sx.numel() == 1 and sw.dim() == 1 and sw.shape[0] == b.shape[0], "repops.int8_linear: sx [1], sw [N]")
    y = torch.empty(a.shape[0], b.shape[0], device=a.device)
    if y.numel():
        launch("int8", "rp_int8_linear", a, b, sx, sw, y, a.shape[0], b.shape[0], a.shape[1],
                   threads=flat_grid(y.numel()), group=GROUP)
    return y


def lsq_init_(x, s):
    need(s.is_contiguous(), "repops.lsq_init_: s must be contiguous")
    x, s2, R, C = _int8_rows(x, s, "lsq_init_")
    need(C >= 1, "repops.lsq_init_: no elements to take the mean of")
    launch("int8", "rp_lsq_init", x, s, inv(C), R, C, threads=row_grid(R), group=LANES)


def lsq_backward(x, s, gxh, g):
    x, s, R, C = _int8_rows(x, s, "lsq_backward")
    gxh = check_f32(gxh, "gxh", x.device)
    need(gxh.shape == x.shape, "repops.lsq_backward: gxh must match x")
    gx, gs = torch.empty_like(x), torch.empty_like(s)
    if x.numel():
        launch("int8", "rp_lsq_gx", x, s, gxh, gx, x.numel(), C, threads=flat_grid(x.numel()), group=GROUP)
    launch("int8", "rp_lsq_gs", x, s, gxh, gs, float(g), R, C, threads=row_grid(R), group=LANES)
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
    **{fn: _unary(fn) for fn in RPFN},
    "int8_quantize": int8_quantize, "int8_dequantize": int8_dequantize, "int8_matmul": int8_matmul,
    "int8_linear": int8_linear, "lsq_init_": lsq_init_, "lsq_backward": lsq_backward,
}


# ------------------------------------------------------------------ ops without tensor inputs
def _mps():
    return torch.device(DEVICE_TYPE)


def rope_tables_mps(T, head_dim, theta):
    need(T >= 0 and head_dim > 0 and head_dim % 2 == 0, "repops.rope_tables: head_dim must be even")
    c, s = torch.empty(T, head_dim // 2, device=_mps()), torch.empty(T, head_dim // 2, device=_mps())
    if c.numel():
        launch("rope", "rp_rope_tables", c, s, T, head_dim // 2, float(theta), inv(head_dim),
                   threads=flat_grid(c.numel()), group=GROUP)
    return c, s


def _stream(name, seed, c1, c2, purpose, n):
    need(n >= 0, f"repops.{name}: n >= 0")
    for v, what in ((c1, "c1"), (c2, "c2"), (purpose, "purpose")):
        need(0 <= v < 1 << 32, f"repops: {what} must fit in 32 unsigned bits, got {v}")
    seed &= (1 << 64) - 1
    return seed & 0xFFFFFFFF, seed >> 32


def philox_mps(seed, c1, c2, purpose, n, block_offset=0):
    k0, k1 = _stream("philox", seed, c1, c2, purpose, n)
    need(0 <= block_offset < 1 << 32, f"repops: block_offset must fit in 32 unsigned bits, got {block_offset}")
    out = torch.empty(n, dtype=torch.int64, device=_mps())
    if n:
        launch("random", "rp_philox", out, k0, k1, c1, c2, purpose, block_offset, n, threads=flat_grid((n + 3) // 4),
                   group=GROUP)
    return out


def _floats(kernel, name):
    def op(seed, c1, c2, purpose, n):
        k0, k1 = _stream(name, seed, c1, c2, purpose, n)
        out = torch.empty(n, device=_mps())
        if n:
            launch("random", kernel, out, k0, k1, c1, c2, purpose, n, threads=flat_grid((n + 3) // 4), group=GROUP)
        return out
    return op


def canary_mps():
    """[fused, flush missing], as canary_cuda: both 0.0 unless the Metal compiler contracted
    a*b + c or the software flush let a subnormal product through."""
    out = torch.empty(2, device=_mps())
    launch("elementwise", "rp_canary", out, 1.0 + 2.0**-12, -(1.0 + 2.0**-11), 2.0**-100, 2.0**-30,
               threads=LANES, group=LANES)
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
