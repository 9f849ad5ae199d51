"""The NumPy reference of the sliding-window attention kernels (contract §8 window attention):
band_scores, band_mix, band_mix_t, window_softmax and its backward, written with the contract's
operations of numpy_contract (every add and multiply rounded and flushed there, reductions in
the contract's order). Re-exported by tests/reference.py for tests/test_window.py.

    import reference as R
    s = R.band_scores(q, k, W)          # q [batch, G*T, Dh], k [batch, T, Dh] -> [batch, G*T, W]
"""
import numpy as np

from numpy_contract import F32, add, cmax, csum, exp, f32, mul, recip, select, sub


def _window_keys(T, W):
    """[T, W] key position j = t - (W-1) + w of band column w, and whether it exists (j >= 0)."""
    j = np.arange(T)[:, None] - (W - 1) + np.arange(W)[None, :]
    return np.maximum(j, 0), j >= 0


def band_scores(a, b, W):
    """a [batch, M, D] (row r at position t = r % T), b [batch, T, D] -> s [batch, M, W]:
    s[r, w] = sum_d a[r, d] * b[t - (W-1) + w, d] (increasing d), +0.0 where the key is < 0."""
    batch, M, D = a.shape
    T = b.shape[1]
    j, valid = _window_keys(T, W)
    j, valid = np.tile(j, (M // T, 1)), np.tile(valid, (M // T, 1))        # [M, W]
    bg = b[:, j, :]                                                         # [batch, M, W, D]
    acc = np.zeros((batch, M, W), dtype=np.float32)
    for d in range(D):
        acc = add(acc, mul(a[:, :, None, d], bg[..., d]))
    return select(valid, acc, F32(0.0))


def band_mix(p, b):
    """p [batch, M, W], b [batch, T, D] -> [batch, M, D]: sum over the valid w in increasing
    order (increasing key j) of p[r, w] * b[j, d]; absent keys add nothing."""
    batch, M, W = p.shape
    T, D = b.shape[1], b.shape[2]
    j, valid = _window_keys(T, W)
    j, valid = np.tile(j, (M // T, 1)), np.tile(valid, (M // T, 1))
    acc = np.zeros((batch, M, D), dtype=np.float32)
    for w in range(W):
        term = mul(p[:, :, w, None], b[:, j[:, w], :])
        acc = select(valid[None, :, w, None], add(acc, term), acc)
    return acc


def band_mix_t(p, a, T):
    """p [batch, M, W], a [batch, M, D] -> [batch, T, D]: o[j, d] = sum over the rows r = (g, t)
    in increasing order with t in [j, j + W - 1] of p[r, j - t + W - 1] * a[r, d]."""
    batch, M, W = p.shape
    D = a.shape[2]
    acc = np.zeros((batch, T, D), dtype=np.float32)
    jj = np.arange(T)
    for g in range(M // T):
        for u in range(W):                      # t = j + u, increasing
            t = jj + u
            valid = t < T
            r = g * T + np.minimum(t, T - 1)
            term = mul(p[:, r, W - 1 - u][..., None], a[:, r, :])
            acc = select(valid[None, :, None], add(acc, term), acc)
    return acc


def _window_terms(x, W, pad):
    """x [..., T, W] -> the valid terms of each row moved to the front (term i = column
    w0 + i, w0 = max(0, W-1-t)), padded with `pad`: the canonical reductions' lane layout."""
    T = x.shape[-2]
    w0 = np.maximum(W - 1 - np.arange(T), 0)[:, None]                       # [T, 1]
    col = w0 + np.arange(W)[None, :]
    valid = col < W
    g = np.take_along_axis(x, np.broadcast_to(np.minimum(col, W - 1), x.shape), axis=-1)
    return select(valid, g, F32(pad)), valid, w0


def _window_back(terms, w0, W):
    """Inverse of _window_terms: term i back to column w0 + i, +0.0 elsewhere."""
    col = np.arange(W)[None, :] - w0                                        # term index of w
    ok = col >= 0
    g = np.take_along_axis(terms, np.broadcast_to(np.maximum(col, 0), terms.shape), axis=-1)
    return select(ok, g, F32(0.0))


def window_softmax(s, scale):
    """s [BH, T, W] band -> P: row t's softmax over its valid columns (max and sum over the
    valid terms in increasing key order), +0.0 elsewhere."""
    W = s.shape[-1]
    z, valid, w0 = _window_terms(mul(s, f32(scale)), W, -np.inf)
    m = cmax(z)
    e = exp(sub(z, m[..., None]))
    inv = recip(csum(e, where=valid))
    return _window_back(select(valid, mul(e, inv[..., None]), F32(0.0)), w0, W)


def window_softmax_backward(gp, p, scale):
    W = p.shape[-1]
    pt, valid, w0 = _window_terms(p, W, 0.0)
    gt_, _, _ = _window_terms(gp, W, 0.0)
    dot = csum(mul(pt, gt_), where=valid)
    gs = mul(mul(sub(gt_, dot[..., None]), pt), f32(scale))
    return _window_back(select(valid, gs, F32(0.0)), w0, W)
