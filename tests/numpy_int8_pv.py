"""The NumPy reference of int8 P·V (contract §10 "int8 P·V"), written from the contract with the
operations of numpy_contract and numpy_window: the block step rule, the full layers' int8 P·V,
the windowed layers' int8 band mix, and the float-shadow backward of both. Re-exported by
tests/reference.py for tests/test_int8_pv.py.

    import reference as R
    o = R.int8_pv_full(p, v)         # p [batch, M, T], v [batch, T, D] -> [batch, M, D]
    o = R.int8_pv_band(p, v)         # band p [batch, M, W] -> [batch, M, D]
"""
import numpy as np

from numpy_contract import F32, cmax, gt, int8_dequantize, int8_quantize, matmul, mul, recip, select
from numpy_window import _window_keys, band_mix_t, band_scores


def int8_absmax_step(x2):
    """x2 [R, C] -> s [R]: s = cmax_c |x| * recip(127), 1.0 where that is not > 0."""
    s = mul(cmax(np.abs(np.asarray(x2, dtype=np.float32))), recip(F32(127.0)))
    return select(gt(s, F32(0.0)), s, F32(1.0)).astype(np.float32).reshape(-1)


def pv_codes(p, v):
    """(qp [batch*M, K], sp [batch*M], qv [batch, T*D], sv [batch]): P per row, V per block."""
    batch, M, K = p.shape
    p2, v2 = p.reshape(batch * M, K), v.reshape(batch, -1)
    sp, sv = int8_absmax_step(p2), int8_absmax_step(v2)
    return int8_quantize(p2, sp), sp, int8_quantize(v2, sv), sv


def _dequantized(p, v, qp, sp, qv, sv):
    return int8_dequantize(qp, sp).reshape(p.shape), int8_dequantize(qv, sv).reshape(v.shape)


def int8_pv_full(p, v):
    """O[r, d] = float(sum_k qp[r, k] qv[k, d]) * (sv * sp[r]), the int32 sum exact (int64 here)."""
    batch, M, T = p.shape
    qp, sp, qv, sv = pv_codes(p, v)
    c = np.einsum("bmk,bkd->bmd", qp.reshape(batch, M, T).astype(np.int64), qv.reshape(v.shape).astype(np.int64))
    assert np.all(np.abs(c) < 2**31)
    sc = mul(sv.reshape(batch, 1), sp.reshape(batch, M))                  # [batch, M]
    return mul(c.astype(np.float32), sc[..., None])


def int8_pv_band(p, v):
    """The band form: the sum over the valid columns w (key j = t - (W-1) + w >= 0)."""
    batch, M, W = p.shape
    T = v.shape[1]
    qp, sp, qv, sv = pv_codes(p, v)
    j, valid = _window_keys(T, W)
    j, valid = np.tile(j, (M // T, 1)), np.tile(valid, (M // T, 1))      # [M, W]
    qv3 = qv.reshape(v.shape).astype(np.int64)
    terms = qp.reshape(p.shape).astype(np.int64)[..., None] * qv3[:, j, :] * valid[None, :, :, None]
    c = terms.sum(axis=2)                                                 # [batch, M, D]
    assert np.all(np.abs(c) < 2**31)
    sc = mul(sv.reshape(batch, 1), sp.reshape(batch, M))
    return mul(c.astype(np.float32), sc[..., None])


def int8_pv_full_backward(g, p, v):
    """(gP, gV) = (gO @ Vh^T, Ph^T @ gO): §4.1 matmuls through the dequantized operands."""
    ph, vh = _dequantized(p, v, *pv_codes(p, v))
    return matmul(g, np.swapaxes(vh, 1, 2)), matmul(np.swapaxes(ph, 1, 2), g)


def int8_pv_band_backward(g, p, v):
    """(gP, gV) = (band_scores(gO, Vh), band_mix_t(Ph, gO))."""
    ph, vh = _dequantized(p, v, *pv_codes(p, v))
    return band_scores(g, vh, p.shape[2]), band_mix_t(ph, g, v.shape[1])
