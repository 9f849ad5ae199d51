"""Contract §12 (stock PyTorch operators) in NumPy: each mapped ATen operator as the literal
sequence of float32 operations kernels/README.md §12 writes, on numpy_contract.py's primitives
(add, sub, mul with DAZ/FTZ, csum, recip, exp, ...). Written from the contract's text, not from
stockops.py; tests/test_stockops.py holds stockops.py (through guard.py's mode and autograd) to
it bit for bit.

    import numpy_stock as S
    y = S.softmax(x, dim=-1)                   # NumPy float32 arrays in and out
    gx = S.softmax_backward(g, y, dim=-1)

Operands broadcast as in NumPy (= PyTorch); a Python number operand is rounded once, f32(s).
"""
import math

import numpy as np

import numpy_contract as C

F32 = np.float32


def daz(x):
    """+0.0 for a zero or a subnormal (exponent bits zero), x otherwise (contract §12)."""
    x = np.asarray(x, dtype=F32)
    return np.where((x.view(np.uint32) & 0x7F800000) == 0, F32(0.0), x).astype(F32)


def _bcast(a, b):
    a, b = np.broadcast_arrays(np.asarray(a, dtype=F32), np.asarray(b, dtype=F32))
    return a, b


def neg(x):
    return C.mul(np.asarray(x, dtype=F32), F32(-1.0))


# ---------------------------------------------------------------- §12.1 elementwise
def add(a, b, alpha=1):
    if not isinstance(b, np.ndarray):
        return C.add(*_bcast(a, C.f32(float(b) * float(alpha))))
    if alpha == 1:
        return C.add(*_bcast(a, b))
    if alpha == -1:
        return C.add(*_bcast(a, neg(b)))
    return C.add(*_bcast(a, C.mul(b, C.f32(alpha))))


def sub(a, b, alpha=1):
    return add(a, b, -alpha)


def mul(a, b):
    if not isinstance(b, np.ndarray):
        return C.mul(np.asarray(a, dtype=F32), C.f32(float(b)))
    return C.mul(*_bcast(a, b))


def div(a, b):
    if not isinstance(b, np.ndarray):
        s = float(b)
        return C.mul(np.asarray(a, dtype=F32), C.f32(1.0 / s) if s else F32(math.copysign(math.inf, s)))
    return C.mul(*_bcast(a, C.recip(b)))


def sigmoid(x):
    return C.recip(C.add(F32(1.0), C.exp(neg(x))))


def silu(x):
    return C.mul(x, sigmoid(x))


def relu(x):
    return np.where(daz(x) <= 0, F32(0.0), x).astype(F32)


def absolute(x):
    return (np.asarray(x, dtype=F32).view(np.uint32) & np.uint32(0x7FFFFFFF)).view(F32)


def sign(x):
    d = daz(x)
    return np.where(d > 0, F32(1.0), np.where(d < 0, F32(-1.0), F32(0.0))).astype(F32)


def powi(x, n):
    result, power = None, np.asarray(x, dtype=F32)
    while n:
        if n & 1:
            result = power if result is None else C.mul(result, power)
        n >>= 1
        if n:
            power = C.mul(power, power)
    return result


def power(x, e):
    e = float(e)
    if e == 0.5:
        return C.sqrt(x)
    if e == -0.5:
        return C.rsqrt(x)
    n = int(e)
    assert n == e, "contract §12.1 defines integer exponents, 0.5 and -0.5 only"
    if n == 0:
        return np.ones(np.shape(x), dtype=F32)
    if n == 1:
        return np.array(x, dtype=F32)
    return powi(x, n) if n > 0 else C.recip(powi(x, -n))


def tanh_backward(g, y):
    return mul(g, C.sub(F32(1.0), C.mul(y, y)))


def sigmoid_backward(g, y):
    return mul(g, C.mul(y, C.sub(F32(1.0), y)))


def silu_backward(g, x):
    s = sigmoid(x)
    return mul(g, C.mul(s, C.add(F32(1.0), C.mul(x, C.sub(F32(1.0), s)))))


def threshold_backward(g, x, threshold):
    zeroed = daz(x) <= C.f32(threshold)
    g, zeroed = np.broadcast_arrays(np.asarray(g, dtype=F32), zeroed)
    return np.where(zeroed, F32(0.0), g).astype(F32)


# ---------------------------------------------------------------- §12.2 reductions
def _rows(x, dims):
    x = np.asarray(x, dtype=F32)
    nd = x.ndim
    dims = sorted({d % nd for d in dims}) if dims and nd else list(range(nd))
    kept = [d for d in range(nd) if d not in dims]
    out = [x.shape[d] for d in kept]
    keep_shape = [1 if d in dims else x.shape[d] for d in range(nd)]
    n = math.prod(x.shape[d] for d in dims)
    return np.transpose(x, kept + dims).reshape(math.prod(out), n), n, out, keep_shape


def reduce_sum(x, dims=None, keepdim=False):
    rows, n, out, keep_shape = _rows(x, dims)
    s = C.csum(rows) if n else np.zeros(rows.shape[0], F32)
    return np.asarray(s, dtype=F32).reshape(keep_shape if keepdim else out)


def reduce_mean(x, dims=None, keepdim=False):
    rows, n, out, keep_shape = _rows(x, dims)
    s = np.asarray(C.csum(rows), dtype=F32)
    return C.mul(s, C.f32(1.0 / n)).reshape(keep_shape if keepdim else out)


def cmax_rows(rows):
    """The canonical maximum of each row: §4.2's cmax over the daz terms, NaN read as -inf."""
    t = daz(rows)
    return np.asarray(C.cmax(np.where(np.isnan(t), F32(-np.inf), t)), dtype=F32)


def reduce_amax(x, dims=(), keepdim=False):
    rows, n, out, keep_shape = _rows(x, list(dims))
    return cmax_rows(rows).reshape(keep_shape if keepdim else out)


def max_dim(x, dim, keepdim=False):
    values = reduce_amax(x, [dim], keepdim=True)
    t = daz(x)
    t = np.where(np.isnan(t), F32(-np.inf), t)
    indices = np.argmax(t == values, axis=dim)
    values = values if keepdim else np.squeeze(values, dim)
    return values, (np.expand_dims(indices, dim) if keepdim else indices)


# ---------------------------------------------------------------- §12.3 softmax and the losses
def _last(x, dim):
    x = np.moveaxis(np.asarray(x, dtype=F32), dim, -1)
    return x.reshape(-1, x.shape[-1]), x.shape


def _back(rows, shape, dim):
    return np.ascontiguousarray(np.moveaxis(rows.reshape(shape), -1, dim))


def softmax(x, dim=-1):
    z, shape = _last(x, dim)
    m = cmax_rows(z)[:, None]
    e = C.exp(C.add(z, neg(np.broadcast_to(m, z.shape))))
    inv = C.recip(np.asarray(C.csum(e), dtype=F32))[:, None]
    return _back(C.mul(e, np.broadcast_to(inv, e.shape)), shape, dim)


def log_softmax(x, dim=-1):
    z, shape = _last(x, dim)
    m = cmax_rows(z)
    e = C.exp(C.add(z, neg(np.broadcast_to(m[:, None], z.shape))))
    lse = C.add(m, C.log(np.asarray(C.csum(e), dtype=F32)))[:, None]
    return _back(C.add(z, neg(np.broadcast_to(lse, z.shape))), shape, dim)


def softmax_backward(g, p, dim=-1):
    g, shape = _last(g, dim)
    p, _ = _last(p, dim)
    dot = np.asarray(C.csum(C.mul(p, g)), dtype=F32)[:, None]
    return _back(C.mul(C.add(g, neg(np.broadcast_to(dot, g.shape))), p), shape, dim)


def log_softmax_backward(g, y, dim=-1):
    g, shape = _last(g, dim)
    y, _ = _last(y, dim)
    s = np.asarray(C.csum(g), dtype=F32)[:, None]
    return _back(C.add(g, neg(C.mul(C.exp(y), np.broadcast_to(s, y.shape)))), shape, dim)


def nll_loss(x, t, reduction="mean", ignore_index=-100):
    """(loss, total_weight)."""
    x2 = np.atleast_2d(np.asarray(x, dtype=F32))
    t = np.asarray(t).reshape(-1)
    kept = t != ignore_index
    safe = np.where(kept, t, 0)
    picked = x2[np.arange(len(t)), safe]
    losses = np.where(kept, neg(picked), F32(0.0)).astype(F32)
    count = int(kept.sum())
    if reduction == "none":
        return losses, F32(count)
    s = np.asarray(C.csum(losses), dtype=F32)
    if reduction == "sum":
        return s, F32(count)
    return C.mul(s, C.f32(1.0 / count) if count else F32(np.nan)), F32(count)


def nll_loss_backward(g, x, t, reduction="mean", ignore_index=-100):
    x2 = np.atleast_2d(np.asarray(x, dtype=F32))
    t = np.asarray(t).reshape(-1)
    kept = t != ignore_index
    g = np.asarray(g, dtype=F32).reshape(-1)
    if reduction == "mean":
        g = C.mul(g, C.f32(1.0 / int(kept.sum())))
    values = np.where(kept, neg(np.broadcast_to(g, t.shape)), F32(0.0))
    gx = np.zeros(x2.shape, F32)
    gx[np.arange(len(t)), np.where(kept, t, 0)] = values
    return gx.reshape(np.shape(x))


# ---------------------------------------------------------------- §12.4 layer norm
def layer_norm(x, normalized_shape, w, b, eps):
    """(y, mean [R, 1], rstd [R, 1])."""
    d = math.prod(normalized_shape)
    x2 = np.asarray(x, dtype=F32).reshape(-1, d)
    inv_d = C.f32(1.0 / d)
    mu = C.mul(np.asarray(C.csum(x2), dtype=F32), inv_d)[:, None]
    c = C.add(x2, neg(np.broadcast_to(mu, x2.shape)))
    var = C.mul(np.asarray(C.csum(C.mul(c, c)), dtype=F32), inv_d)
    rstd = C.rsqrt(C.add(var, C.f32(eps)))[:, None]
    y = C.mul(c, np.broadcast_to(rstd, c.shape))
    if w is not None:
        y = C.mul(y, np.broadcast_to(np.asarray(w, F32).reshape(1, d), y.shape))
    if b is not None:
        y = C.add(y, np.broadcast_to(np.asarray(b, F32).reshape(1, d), y.shape))
    return y.reshape(np.shape(x)), mu, rstd


def layer_norm_backward(g, x, normalized_shape, mu, rstd, w):
    """(gx, gw, gb) (gw None without a weight)."""
    d = math.prod(normalized_shape)
    x2, g2 = np.asarray(x, F32).reshape(-1, d), np.asarray(g, F32).reshape(-1, d)
    mu, rstd = np.broadcast_to(mu.reshape(-1, 1), x2.shape), np.broadcast_to(rstd.reshape(-1, 1), x2.shape)
    inv_d = C.f32(1.0 / d)
    h = C.mul(C.add(x2, neg(mu)), rstd)
    a = g2 if w is None else C.mul(g2, np.broadcast_to(np.asarray(w, F32).reshape(1, d), g2.shape))
    s1 = np.broadcast_to(C.mul(np.asarray(C.csum(a), F32), inv_d)[:, None], a.shape)
    s2 = np.broadcast_to(C.mul(np.asarray(C.csum(C.mul(a, h)), F32), inv_d)[:, None], a.shape)
    gx = C.mul(C.add(C.add(a, neg(s1)), neg(C.mul(h, s2))), rstd).reshape(np.shape(x))
    gw = None if w is None else np.asarray(C.csum(C.mul(g2, h).T), F32)
    gb = np.asarray(C.csum(g2.T), F32)
    return gx, gw, gb


# ---------------------------------------------------------------- §12.5 matmul
def addmm(bias, a, b):
    return C.add(*_bcast(C.matmul(a, b), bias))


# ---------------------------------------------------------------- §12.7 random numbers
def keep_mask(seed, step, micro, site, keep, n):
    words = C.philox_words(seed, step + (1 << 31), (micro << 16) | site, C.PURPOSE_DROPOUT, n).astype(np.int64)
    return words < min(round(keep * 2.0 ** 32), 2 ** 32 - 1)


def dropout(x, p, seed, step, micro, site):
    """(y, keep): the dropout of site `site` of micro-batch `micro` of step `step`."""
    x = np.asarray(x, F32)
    keep = keep_mask(seed, step, micro, site, 1.0 - p, x.size).reshape(x.shape)
    scale = C.f32(1.0 / (1.0 - p))
    return C.select(keep, C.mul(x, scale), C.mul(x, F32(0.0))), keep


def dropout_backward(g, keep, p):
    return C.mul(np.asarray(g, F32), np.where(keep, C.f32(1.0 / (1.0 - p)), F32(0.0)).astype(F32))


def init_normal(seed, draw, shape, mean, std):
    z = C.normal(seed, 1, draw, C.PURPOSE_INIT, math.prod(shape))
    x = C.mul(z, C.f32(std))
    return (x if mean == 0 else C.add(x, C.f32(mean))).reshape(shape)


def init_uniform(seed, draw, shape, a, b):
    u = C.uniform(seed, 1, draw, C.PURPOSE_INIT, math.prod(shape))
    x = C.mul(u, C.f32(float(b) - float(a)))
    return (x if a == 0 else C.add(x, C.f32(a))).reshape(shape)
