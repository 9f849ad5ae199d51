"""int8 P·V inside attention (`--quant=int8 --int8_pv=1`): contract §10 "int8 P·V".

    import quant_pv
    o = quant_pv.matmul_pv(p, v)   # full layers: p [batch, G*T, T] probabilities, v [batch, T, Dh]
    o = repops.window_attention(q, k, v, W, scale, mix=quant_pv.band_mix)   # windowed layers

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
import torch

import repops

ops = repops.ops


def quantize_blocks(x2):
    """x2 [R, C] -> (codes [R, C] int8, step sizes [R]): one block per row."""
    s = ops.int8_absmax_step(x2)
    return ops.int8_quantize(x2, s), s


class _MatmulPV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p, v):
        batch, M, T = p.shape
        D = v.shape[2]
        qp, sp = quantize_blocks(p.reshape(batch * M, T))            # [batch*M, T], [batch*M]
        qv, sv = quantize_blocks(v.reshape(batch, T * D))            # [batch, T*D], [batch]
        qvt = qv.view(batch, T, D).transpose(1, 2).contiguous()      # [batch, D, T]: rows along the keys
        qp3, sp2 = qp.view(batch, M, T), sp.view(batch, M)
        ot = torch.stack([ops.int8_linear(qvt[b], qp3[b], sv[b:b + 1], sp2[b], False)
                          for b in range(batch)])                    # [batch, D, M] = O^T
        ctx.save_for_backward(qp, sp, qv, sv)
        ctx.shape = batch, M, T, D
        return ot.transpose(1, 2).contiguous()                       # [batch, M, D]

    @staticmethod
    def backward(ctx, g):
        qp, sp, qv, sv = ctx.saved_tensors
        batch, M, T, D = ctx.shape
        ph = ops.int8_dequantize(qp, sp).view(batch, M, T)
        vh = ops.int8_dequantize(qv, sv).view(batch, T, D)
        gp = ops.matmul(g, vh.transpose(-1, -2)) if ctx.needs_input_grad[0] else None
        gv = ops.matmul(ph.transpose(-1, -2), g) if ctx.needs_input_grad[1] else None
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
        return ops.int8_band_mix(qp.view(batch, M, W), qv.view(batch, T, D), sp, sv)

    @staticmethod
    def backward(ctx, g):
        qp, sp, qv, sv = ctx.saved_tensors
        batch, M, W, T, D = ctx.shape
        ph = ops.int8_dequantize(qp, sp).view(batch, M, W)
        vh = ops.int8_dequantize(qv, sv).view(batch, T, D)
        g = g.contiguous()
        gp = ops.band_scores(g, vh, W) if ctx.needs_input_grad[0] else None
        gv = ops.band_mix_t(ph, g, T) if ctx.needs_input_grad[1] else None
        return gp, gv


def matmul_pv(p, v):
    """O = P @ V through int8: p [batch, M, T] (M = G*T rows), v [batch, T, D] -> [batch, M, D]."""
    return _MatmulPV.apply(p, v)


def band_mix(p, v):
    """The windowed O through int8: band p [batch, M, W], v [batch, T, D] -> [batch, M, D]."""
    return _BandMixPV.apply(p, v)
