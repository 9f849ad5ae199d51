"""The NumPy reference of the exact matmul (kernels/README.md §11, Ozaki scheme II): the float
operands become integers by a power-of-two scale per row of A and per column of B, their
integer product is computed as int8 residue GEMMs modulo eight coprime moduli, reconstructed
exactly by the Chinese remainder theorem (Garner) and rounded to float32 once. Integer parts in
NumPy int64/uint64 only; no float arithmetic at all. Re-exported by tests/reference.py.

    import reference as R
    c = R.exact_matmul(a, b)      # a [..., M, K] @ b [..., K, N] float32 -> float32 (batch broadcasts)
    ints = R.exact_split(a)       # (a' int64 [M, K], e [M] row exponents, bad [M] non-finite rows)
    s = R.exact_band_scores(q, k, W)   # window attention's band products (also _mix, _mix_t)
"""
import numpy as np

# §11 constants: odd, pairwise coprime, <= 255, so every residue lies in [-127, 127]
MODULI = (255, 253, 251, 247, 241, 239, 233, 229)
PRODUCT = 12292429416557426565          # prod(MODULI) < 2^64
HALF = (PRODUCT - 1) // 2               # C' lies in [-HALF, HALF]
K_CHUNK = 131072                        # §10's int8 GEMM is exact for K <= 133144
QNAN = np.uint32(0x7FC00000)


def beta_of(K):
    """The integer width beta of §11 for a contraction length K >= 1: (62 - ceil(log2 K)) // 2,
    so that |C'| <= K 2^(2 beta) <= 2^62 < PRODUCT / 2."""
    c = max(0, int(K - 1).bit_length())          # ceil(log2 K)
    return (62 - c) // 2


def _fields(x):
    """(sign, biased exponent E, mantissa m with the hidden bit; 0 for zeros and subnormals,
    which DAZ reads as zero) of a float32 array, as int64 arrays; E = 255 marks NaN/inf."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)
    sign, E, frac = u >> 31, (u >> 23) & 0xFF, u & 0x7FFFFF
    m = np.where((E == 0) | (E == 255), 0, frac | 0x800000)
    return sign, E, m


def exact_split(x, beta=None, axis=-1):
    """§11 steps 1-3 along `axis` (the contraction index): x [rows, K] (axis -1, A) or [K, cols]
    (axis 0, B) -> (q int64 of x's shape, e int64 per row/column, bad bool per row/column).
    e = max biased exponent of the finite nonzero entries (0 if none); q = the signed magnitude
    m 2^(E - e + beta - 24) rounded half away from zero, |q| <= 2^beta; 0 for zeros, subnormals
    and non-finite entries (whose rows/columns `bad` marks)."""
    x = np.moveaxis(np.asarray(x, dtype=np.float32), axis, -1)
    K = x.shape[-1]
    beta = beta_of(K) if beta is None else beta
    sign, E, m = _fields(x)
    bad = np.any(E == 255, axis=-1)
    live = m != 0
    e = np.max(np.where(live, E, 0), axis=-1, initial=0)
    sh = e[..., None] - E + 24 - beta                     # right shift of m (negative: left)
    left = m << np.clip(-sh, 0, 62)
    shr = np.clip(sh, 1, 62)
    right = np.where(sh > 24, 0, (m + (np.int64(1) << (shr - 1))) >> shr)
    q = np.where(live, np.where(sh <= 0, left, right), 0)
    q = np.where(sign == 1, -q, q)
    return np.moveaxis(q, -1, axis), e, bad


def residue(q, p):
    """The representative of q mod p in [-(p-1)/2, (p-1)/2] (p odd): what the int8 planes hold."""
    r = np.mod(np.abs(q), p)
    r = np.where(r > (p - 1) // 2, r - p, r)
    return np.where(q < 0, -r, r).astype(np.int64)


def _inverse(a, p):
    return pow(int(a) % p, -1, p)


def crt(res):
    """Garner: the residues R_t mod MODULI[t] (int64 arrays, any sign) -> the unique integer
    C' in [-HALF, HALF] congruent to all of them (int64). Mixed-radix digits v_t in
    [0, p_t), X = v_0 + p_0 (v_1 + p_1 (v_2 + ...)) in [0, PRODUCT) as uint64."""
    v = []
    for t, p in enumerate(MODULI):
        w = np.mod(res[t], p)
        for s in range(t):
            w = np.mod((w - v[s]) * _inverse(MODULI[s], p), p)
        v.append(w)
    X = np.zeros(np.shape(res[0]), dtype=np.uint64)
    for t in range(len(MODULI) - 1, -1, -1):
        X = X * np.uint64(MODULI[t]) + v[t].astype(np.uint64)   # < PRODUCT < 2^64: no wrap
    neg = X > np.uint64(HALF)
    return np.where(neg, X - np.uint64(PRODUCT), X).view(np.int64)  # X - P wraps to the negative C'


def to_float(c, e):
    """§11 step 7: round the integer c (int64) times 2^e (int64, any range) to float32 once:
    24 significant bits, round half to even; exponent > 127 -> +-inf; a rounded value below
    2^-126 -> a zero of c's sign (the §3 flush, tininess after rounding); c = 0 -> +0.0."""
    c, e = np.broadcast_arrays(np.asarray(c, dtype=np.int64), np.asarray(e, dtype=np.int64))
    neg = c < 0
    u = np.abs(c).astype(np.uint64)                      # |c| <= 2^62
    n = np.zeros(u.shape, dtype=np.int64)                # bit length of u
    for b in range(64):
        n = np.where((u >> np.uint64(b)) != 0, b + 1, n)
    sh = np.maximum(n - 24, 0).astype(np.uint64)
    q = u >> sh
    rem = u - (q << sh)
    half = np.where(sh > 0, np.uint64(1) << np.maximum(sh, 1).astype(np.uint64) - np.uint64(1), 0).astype(np.uint64)
    up = (sh > 0) & ((rem > half) | ((rem == half) & ((q & np.uint64(1)) == 1)))
    q = q + up.astype(np.uint64)
    q = np.where(n < 24, u << (24 - np.minimum(n, 24)).astype(np.uint64), q)   # exact: widen to 24 bits
    carry = q == np.uint64(1 << 24)
    q = np.where(carry, np.uint64(1 << 23), q)
    E = n - 1 + e + carry                                # unbiased exponent of the rounded value
    out = (np.clip(E + 127, 1, 254).astype(np.uint64) << np.uint64(23)) | (q & np.uint64(0x7FFFFF))
    out = np.where(E > 127, np.uint64(0x7F800000), out)
    out = np.where((E < -126) | (u == 0), np.uint64(0), out)
    out = out | np.where(neg & (u != 0), np.uint64(0x80000000), np.uint64(0))
    return out.astype(np.uint32).view(np.float32)


def exact_matmul_2d(a, b):
    """§11 for a [M, K] @ b [K, N]."""
    M, K = a.shape
    N = b.shape[1]
    if K == 0:
        return np.zeros((M, N), dtype=np.float32)
    beta = beta_of(K)
    qa, ea, bad_a = exact_split(a, beta, axis=-1)        # [M, K], [M]
    qb, eb, bad_b = exact_split(b, beta, axis=0)         # [K, N], [N]
    res = []
    for p in MODULI:                                     # the residue GEMMs, exact in int64
        ra, rb = residue(qa, p), residue(qb, p)
        acc = np.zeros((M, N), dtype=np.int64)
        for k0 in range(0, K, K_CHUNK):                  # the chunks of K (each an exact int32 GEMM)
            acc += ra[:, k0:k0 + K_CHUNK] @ rb[k0:k0 + K_CHUNK, :]
        res.append(acc)
    c = crt(res)
    e = (ea[:, None] - 126 - beta) + (eb[None, :] - 126 - beta)
    out = to_float(c, e)
    nan = (bad_a[:, None] | bad_b[None, :])
    out.view(np.uint32)[nan] = QNAN
    return out


def exact_matmul(a, b):
    """§11 exact matmul of a [..., M, K] and b [..., K, N] (batch dims broadcast)."""
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    n = int(np.prod(batch))
    a = np.broadcast_to(a, batch + a.shape[-2:]).reshape((n,) + a.shape[-2:])
    b = np.broadcast_to(b, batch + b.shape[-2:]).reshape((n,) + b.shape[-2:])
    out = [exact_matmul_2d(a[i], b[i]) for i in range(a.shape[0])]
    shape = batch + (a.shape[-2], b.shape[-1])
    return np.stack(out).reshape(shape) if out else np.zeros(shape, dtype=np.float32)


def _band_to_full(p, T):
    """A band p [batch, M, W] (row r at position t = r % T, column w: key t - (W-1) + w) written
    out as P_full [batch, M, T], +0.0 outside the window (§11 "Band products")."""
    batch, M, W = p.shape
    t = np.arange(M) % T
    full = np.zeros((batch, M, T), dtype=np.float32)
    for w in range(W):
        j = t - (W - 1) + w
        ok = j >= 0
        full[:, np.nonzero(ok)[0], j[ok]] = p[:, ok, w]
    return full


def exact_band_scores(a, b, W):
    """a [batch, M, D], b [batch, T, D] -> the band [batch, M, W] of the §11 product a @ b^T
    (+0.0 where the key j = t - (W-1) + w is < 0)."""
    T, M = b.shape[1], a.shape[1]
    full = exact_matmul(a, np.swapaxes(b, 1, 2))          # [batch, M, T]
    t = np.arange(M) % T
    out = np.zeros(a.shape[:2] + (W,), dtype=np.float32)
    for w in range(W):
        j = t - (W - 1) + w
        ok = j >= 0
        out[:, ok, w] = full[:, np.nonzero(ok)[0], j[ok]]
    return out


def exact_band_mix(p, b):
    """p [batch, M, W], b [batch, T, D] -> the §11 product P_full @ b [batch, M, D] (K = T)."""
    return exact_matmul(_band_to_full(p, b.shape[1]), b)


def exact_band_mix_t(p, a, T):
    """p [batch, M, W], a [batch, M, D] -> the §11 product P_full^T @ a [batch, T, D] (K = M)."""
    return exact_matmul(np.swapaxes(_band_to_full(p, T), 1, 2), a)
