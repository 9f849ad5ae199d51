"""Native int8 training (W8A8) with LSQ step sizes, and int8 P·V: the model side of contract §10.

    import quant
    quant.attach(model)              # adds step sizes to every block linear, calibrates s_x
    y = quant.linear(x, w, sx, sw)   # x [..., K] fp32, w [N, K] fp32 -> [..., N] fp32 via int8
    quant.repin(model)               # s_w[row] = 2 mean|w_row| / sqrt(Qp), after each optimizer step
    o = quant.matmul_pv(p, v)        # --int8_pv, full layers: p [batch, G*T, T], v [batch, T, Dh]
    o = repops.window_attention(q, k, v, W, scale, mix=quant.band_mix)   # windowed layers

Every block linear (wqkv, wo, w_gate_up, w_down) computes y = float(qx @ qw^T) * (s_x * s_w[n]),
with qx = Q(x * recip(s_x)) per tensor and qw = Q(w * recip(s_w[n])) per output row, both on
the symmetric grid [-127, 127] (Qn = Qp = 127); the integer products are summed exactly in int32.
The token embedding and lm_head stay fp32. The backward is the straight-through estimator in
fp32 RepOps (gradients reach x and w where x / s lies strictly inside (-Qp, Qp)) plus the LSQ
gradient of each step size (Esser et al. 2019), scaled by g = f32(1 / sqrt(N * Qp)), N the
number of elements that share the step size (K for a weight row, the micro-batch's x.numel()
for an activation), computed on the host in float64 (contract §1). An activation's gradient
sums row by row, then over the rows (activation_lsq_backward), so the sum runs in parallel.

Step sizes are parameters named `<linear>_sx` [1] and `<linear>_sw` [out] next to their weight
(e.g. layers.0.wqkv_sw), so they are in the state hash, the checkpoints and the audit like any
parameter. Their initial values (the genesis state):
- s_w: the re-pin rule on the initial weights;
- s_x: the same rule, 2 mean|x| / sqrt(Qp) over the whole tensor, on the inputs each linear sees
  in one forward pass (eval mode, layers in order, each already using the s_x just set) of a
  calibration batch of Philox tokens: [4, seq_len] ids = philox(seed, 0, CALIBRATION_STREAM,
  INIT) mod vocab. A pure function of (seed, config): no data read, the same on every rank and
  in every replay.
s_x is always learned (AdamW, no weight decay: it is 1-D). With lsq_repin (the default) s_w is
not learned (requires_grad False, no Adam moments) but re-pinned after every optimizer step,
before the state hash; with lsq_repin off it is learned like s_x (plain LSQ).

int8 P·V (`--int8_pv=1`, with `--quant=int8`; contract §10 "int8 P·V"): attention's P·V in int8.
Forward: P is quantized with one step size per query row (a row of P [G*T, T] or of its band
[G*T, W']), V with one per key/value head block (all T keys x Dh; `batch` = B * Hkv blocks). A
block's step size is s = cmax|x| * recip(127), or 1.0 when that is not > 0 (an all-zero block):
a function of the block's values, computed again in every forward (re-pinned, never learned, no
parameter, no gradient). Codes q = Q(x * recip(s)) on [-127, 127] (§10 Q()). Then
O[r, d] = float(sum_k qP[r, k] * qV[k, d]) * (s_V * s_P[r]): an exact int32 sum (K = T or W'
keys, K * 127^2 < 2^31), one conversion, one multiply. The full layers use the int8 linear of
§10 with A = qV^T [Dh, T] (s_x = s_V) and B = qP [G*T, T] (s_w = s_P per row), which gives O^T;
the windowed layers the int8 band mix kernel (only the valid keys of each band row).

Backward (the float-shadow straight-through estimator, fp32 RepOps): Ph = float(qP) * s_P and
Vh = float(qV) * s_V (dequantize); full: gP = gO @ Vh^T, gV = Ph^T @ gO (the matmul backward of
§8 attention with Ph, Vh in place of P, V); windowed: gP = band_scores(gO, Vh), gV =
band_mix_t(Ph, gO). gP then enters the softmax backward, which uses the unquantized P it saved,
exactly as without int8_pv. Nothing is clipped (a step is its block's max / 127, so no code
saturates beyond rounding) and no step size receives a gradient.
"""
import math

import torch

import repops

QP = 127                                  # symmetric grid [-QP, QP]
LINEARS = ("wqkv", "wo", "w_gate_up", "w_down")
CALIBRATION_STREAM = 0x15C0               # Philox c2 of the calibration tokens (purpose INIT)
CALIBRATION_ROWS = 4
MAX_K = (2**31 - 1) // (QP * QP)          # 133144: K * 127^2 < 2^31 keeps int32 sums exact


def grad_scale(n):
    """LSQ's g = 1/sqrt(n * Qp), float64 (sqrt and / are correctly rounded), rounded once."""
    return repops.f32(1.0 / math.sqrt(n * QP))


class _Int8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, w, sx, sw):
        qx = repops.ops.int8_quantize(x2, sx)          # [M, K] int8, one step size
        qw = repops.ops.int8_quantize(w, sw)           # [N, K] int8, one per row
        ctx.save_for_backward(x2, w, sx, sw, qx, qw)
        return repops.ops.int8_linear(qx, qw, sx, sw, False)  # [M, N]; on the grid by construction

    @staticmethod
    def backward(ctx, g):
        x2, w, sx, sw, qx, qw = ctx.saved_tensors
        xh = repops.ops.int8_dequantize(qx, sx)        # the values the forward used, fp32
        wh = repops.ops.int8_dequantize(qw, sw)
        gxh = repops.ops.matmul(g, wh)                 # [M, N] @ [N, K]
        gwh = repops.ops.matmul(g.t(), xh)             # [N, M] @ [M, K]
        gx, gsx = activation_lsq_backward(x2, sx, gxh, grad_scale(x2.numel()))
        gw, gsw = repops.ops.lsq_backward(w, sw, gwh, grad_scale(w.shape[1]))
        return gx, gw, gsx, (gsw if ctx.needs_input_grad[3] else None)


def activation_lsq_backward(x2, sx, gxh, g):
    """lsq_backward for the one step size of x2 [M, K]: gx as the kernel's, and
    g_sx = csum_r(csum_k(gxh * term)[r]) * g -- each row's canonical sum, then the canonical sum
    of the M row sums, then one multiply by g (contract §10). Rows are independent, so the
    kernels run them in parallel (one warp per row on CUDA) instead of one sequential chain of
    M * K / 32 adds per lane. s_x is repeated per row (data movement) and g = 1.0 is exact."""
    per_row_s = sx.expand(x2.shape[0]).contiguous()                  # [M] copies of s_x
    gx, row_sums = repops.ops.lsq_backward(x2, per_row_s, gxh, 1.0)  # row_sums [M]
    return gx, repops.ops.scale(repops.ops.csum(row_sums), g).reshape(1)


def linear(x, w, sx, sw, calibrate=False):
    """x @ w.T through int8 (leading dims of x flattened to rows). calibrate: first set s_x
    from this x (the init rule above)."""
    x2 = x.reshape(-1, x.shape[-1])
    if calibrate:
        with torch.no_grad():
            repops.ops.lsq_init_(x2, sx.data)
    y = _Int8Linear.apply(x2, w, sx, sw)
    return y.view(*x.shape[:-1], w.shape[0])


def step_sizes(model):
    """[(layer, linear name)] of every quantized linear, in layer order."""
    return [(layer, name) for layer in model.layers for name in LINEARS]


def attach(model):
    """Register the step sizes of every block linear and give them their initial values."""
    learn_sw = not model.cfg.lsq_repin
    for layer, name in step_sizes(model):
        w = getattr(layer, name)
        layer.register_parameter(name + "_sx", torch.nn.Parameter(torch.zeros(1)))
        layer.register_parameter(name + "_sw", torch.nn.Parameter(torch.zeros(w.shape[0]), requires_grad=learn_sw))
    repin(model)
    ids = repops.philox_words(model.seed, 0, CALIBRATION_STREAM, repops.PURPOSE_INIT,
                              CALIBRATION_ROWS * model.cfg.seq_len)
    ids = torch.remainder(ids, model.cfg.vocab_size).view(CALIBRATION_ROWS, -1)  # exact integers
    was_training = model.training
    model.eval()
    model.calibrating = True
    try:
        with torch.no_grad():
            model.hidden(ids)
    finally:
        model.calibrating = False
        model.train(was_training)


@torch.no_grad()
def repin(model):
    """s_w[row] = 2 mean|w_row| / sqrt(Qp) for every quantized linear (kernels: lsq_init_)."""
    for layer, name in step_sizes(model):
        repops.ops.lsq_init_(getattr(layer, name), getattr(layer, name + "_sw").data)


# ----------------------------------------------------------------------------- int8 P·V (--int8_pv)
def quantize_blocks(x2):
    """x2 [R, C] -> (codes [R, C] int8, step sizes [R]): one block per row."""
    s = repops.ops.int8_absmax_step(x2)
    return repops.ops.int8_quantize(x2, s), s


class _MatmulPV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p, v):
        batch, M, T = p.shape
        D = v.shape[2]
        qp, sp = quantize_blocks(p.reshape(batch * M, T))            # [batch*M, T], [batch*M]
        qv, sv = quantize_blocks(v.reshape(batch, T * D))            # [batch, T*D], [batch]
        qvt = qv.view(batch, T, D).transpose(1, 2).contiguous()      # [batch, D, T]: rows along the keys
        qp3, sp2 = qp.view(batch, M, T), sp.view(batch, M)
        ot = torch.stack([repops.ops.int8_linear(qvt[b], qp3[b], sv[b:b + 1], sp2[b], False)
                          for b in range(batch)])                    # [batch, D, M] = O^T
        ctx.save_for_backward(qp, sp, qv, sv)
        ctx.shape = batch, M, T, D
        return ot.transpose(1, 2).contiguous()                       # [batch, M, D]

    @staticmethod
    def backward(ctx, g):
        qp, sp, qv, sv = ctx.saved_tensors
        batch, M, T, D = ctx.shape
        ph = repops.ops.int8_dequantize(qp, sp).view(batch, M, T)
        vh = repops.ops.int8_dequantize(qv, sv).view(batch, T, D)
        gp = repops.ops.matmul(g, vh.transpose(-1, -2)) if ctx.needs_input_grad[0] else None
        gv = repops.ops.matmul(ph.transpose(-1, -2), g) if ctx.needs_input_grad[1] else None
        return gp, gv


class _BandMixPV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p, v):
        batch, M, W = p.shape
        T, D = v.shape[1], v.shape[2]
        qp, sp = quantize_blocks(p.reshape(batch * M, W))            # band rows; invalid entries are +0.0
        qv, sv = quantize_blocks(v.reshape(batch, T * D))
        ctx.save_for_backward(qp, sp, qv, sv)
        ctx.shape = batch, M, W, T, D
        return repops.ops.int8_band_mix(qp.view(batch, M, W), qv.view(batch, T, D), sp, sv)

    @staticmethod
    def backward(ctx, g):
        qp, sp, qv, sv = ctx.saved_tensors
        batch, M, W, T, D = ctx.shape
        ph = repops.ops.int8_dequantize(qp, sp).view(batch, M, W)
        vh = repops.ops.int8_dequantize(qv, sv).view(batch, T, D)
        g = g.contiguous()
        gp = repops.ops.band_scores(g, vh, W) if ctx.needs_input_grad[0] else None
        gv = repops.ops.band_mix_t(ph, g, T) if ctx.needs_input_grad[1] else None
        return gp, gv


def matmul_pv(p, v):
    """O = P @ V through int8: p [batch, M, T] (M = G*T rows), v [batch, T, D] -> [batch, M, D]."""
    return _MatmulPV.apply(p, v)


def band_mix(p, v):
    """The windowed O through int8: band p [batch, M, W], v [batch, T, D] -> [batch, M, D]."""
    return _BandMixPV.apply(p, v)
