"""The arithmetic contract (kernels/README.md) in NumPy: the first half of the NumPy replay.

This module and tests/numpy_replay.py are an implementation of a training run written from the
documents alone (the contract and SPEC.md); they import nothing from the project (stdlib and
NumPy only). This half is the slow, obviously correct twin of the C++/CUDA/Metal kernels, and
the project's NumPy reference of every kernel (tests/reference.py re-exports it). Every
operator of the contract (§4 reductions, §5 canonical functions, §6 Philox random numbers, §8
operators, §10 the quantized path) is written here as the contract's literal sequence of
float32 operations:

* All floating-point arithmetic goes through the three helpers `add`, `sub`, `mul` below.
  Each one flushes subnormal operands to signed zero (DAZ), performs one correctly rounded
  IEEE binary32 operation in NumPy, and flushes a subnormal result to signed zero (FTZ), which
  emulates §3 on any machine.  Comparisons/selects, negation, `fabs` and bit manipulation
  (through `.view(np.uint32)`) are exact and used directly, as §2 allows.
* Vectorisation runs across independent output elements (rows, columns, lanes) only; every
  reduction loops over its reduction index in the contract's order (k for matmul, the 32-lane
  canonical sum of §4.2, token positions for the embedding gradient).
* Host scalars are computed as the contract says: Python float64 arithmetic rounded once to
  float32 (`f32(x)` = `np.float32(x)`, RNE); shape-derived ones as `f32(1.0 / D)`.
* Philox4x32-10 is computed with NumPy uint64 (32x32->64 products) and masked to 32 bits.

    import numpy_contract as C
    y, rstd = C.rmsnorm(x, w, eps)            # NumPy float32 arrays in, out
    c = C.matmul(a, b)                        # a [M, K] @ b [K, N], k in increasing order

`tests/test_kernels.py` compares every raw kernel (`torch.ops.repops.*`) with the function of
the same name here **bit for bit** (uint32 patterns equal, all NaNs treated as equal) on random
and adversarial inputs, and checks this module itself against float64 NumPy to make sure it
computes what it should; `tests/test_spec.py` runs the whole replay against real runs. All
functions take and return NumPy arrays (float32, or int64 for indices) and never modify their
arguments, except `adamw_` which returns new arrays.
"""

import math

import numpy as np

F32 = np.float32
U32 = np.uint32

SIGN = U32(0x80000000)
EXP_MASK = U32(0x7F800000)
FLT_MIN = 2.0 ** -126  # smallest normal float32
MANT_MASK = U32(0x007FFFFF)
QNAN = U32(0x7FC00000)

PURPOSE_INIT, PURPOSE_DROPOUT, PURPOSE_DATA, PURPOSE_SAMPLE = 1, 2, 3, 4


# ----------------------------------------------------------------------------------------------
# §1 host scalars and bit helpers
# ----------------------------------------------------------------------------------------------

def f32(x):
    """Round a Python float (float64) to float32, RNE: the contract's host-scalar rounding."""
    return F32(x)


def fl(u):
    """The float32 with bit pattern u (scalar or array)."""
    return np.asarray(u, dtype=np.uint32).view(np.float32)[()]


def bits(x):
    """Bit pattern (uint32) of a float32 scalar/array."""
    return np.asarray(x, dtype=np.float32).view(np.uint32)[()]


def _arr(x):
    a = np.asarray(x)
    if a.dtype != np.float32:
        raise TypeError(f"reference arithmetic needs float32 operands, got {a.dtype}")
    return a


def ftz(x):
    """Replace subnormals by zero of the same sign (DAZ on inputs, FTZ on results)."""
    a = np.array(_arr(x), dtype=np.float32, copy=True)
    u = a.view(np.uint32)
    sub = ((u & EXP_MASK) == 0) & ((u & MANT_MASK) != 0)
    u[sub] &= SIGN
    return a[()] if a.ndim == 0 else a


def pow2(n):
    """fl((n + 127) << 23) for -126 <= n <= 127 (exact)."""
    n = np.asarray(n, dtype=np.int64)
    assert np.all((n >= -126) & (n <= 127)), "pow2 exponent out of range"
    return fl(((n + 127) << 23).astype(np.uint32))


# ----------------------------------------------------------------------------------------------
# §2/§3 primitive operations with FTZ/DAZ
# ----------------------------------------------------------------------------------------------

def add(a, b):
    with np.errstate(all="ignore"):
        return ftz(np.add(ftz(a), ftz(b), dtype=np.float32))


def sub(a, b):
    with np.errstate(all="ignore"):
        return ftz(np.subtract(ftz(a), ftz(b), dtype=np.float32))


def mul(a, b):
    """Product with §3's tininess-after-rounding rule: a result whose exact value rounds (to 24
    bits, unbounded exponent) up to 2^-126 is FLT_MIN; anything below flushes to signed zero."""
    a, b = ftz(a), ftz(b)
    with np.errstate(all="ignore"):
        r = np.multiply(a, b, dtype=np.float32)
        exact = np.multiply(a, b, dtype=np.float64)      # exact: 24 + 24 bits fit in 53
        tiny = (np.abs(exact) < FLT_MIN) & (exact != 0)
        if np.any(tiny):
            rounded = (exact * 2.0 ** 64).astype(np.float32).astype(np.float64) * 2.0 ** -64
            kept = np.where(np.abs(rounded) >= FLT_MIN, rounded, np.copysign(0.0, exact))
            r = np.where(tiny, kept.astype(np.float32), r)
    return ftz(r)


def neg(a):
    return np.negative(_arr(a))  # exact (sign flip)


def gt(a, b):
    """Comparison x > y as the hardware does it under DAZ."""
    with np.errstate(all="ignore"):
        return np.greater(ftz(a), ftz(b))


def select(c, x, y):
    return np.where(c, _arr(x), _arr(y)).astype(np.float32)


def _qnan_like(x):
    return np.full(np.shape(x), QNAN, dtype=np.uint32).view(np.float32)


# ----------------------------------------------------------------------------------------------
# §4 reductions
# ----------------------------------------------------------------------------------------------

def csum(t, axis=-1, where=None):
    """§4.2 canonical sum over `axis`: 32 lane-strided sequential sums, then the fixed tree.

    Lane l accumulates t[l], t[l+32], t[l+64], ... in increasing index order (the 32 lanes are
    independent accumulators, so they are updated side by side; that does not reorder any sum).
    `where` (a mask broadcastable to t): the terms to sum, the others are skipped, not added as
    +0.0 -- a lane can hold -0.0 under FTZ and -0.0 + +0.0 is +0.0 (kernels sum only real terms).
    """
    t = ftz(t)
    keep = None if where is None else np.moveaxis(np.broadcast_to(where, np.shape(t)), axis, -1)
    t = np.moveaxis(t, axis, -1)
    n = t.shape[-1]
    p = np.zeros(t.shape[:-1] + (32,), dtype=np.float32)
    for i0 in range(0, n, 32):
        blk = t[..., i0:i0 + 32]          # term i0 + l goes to lane l
        w = blk.shape[-1]
        s = add(p[..., :w], blk)
        p[..., :w] = s if keep is None else np.where(keep[..., i0:i0 + 32], s, p[..., :w])
    for w in (16, 8, 4, 2, 1):
        p[..., :w] = add(p[..., :w], p[..., w:2 * w])
    return np.array(p[..., 0], dtype=np.float32)[()]


FLAT_CHUNK = 32768  # §4.5: the chunk length L of the chunked sum


def csum_chunked(t):
    """§4.5 chunked sum of a flat vector t [n]: the §4.2 canonical sum of each chunk of L terms
    (rows of the [C-1, L] view, then the short last chunk on its own, never padded), then the
    canonical sum of the C = ceil(n / L) chunk sums. n = 0: C = 0, the csum of nothing, +0.0."""
    t = ftz(np.asarray(t, dtype=np.float32).reshape(-1))
    n = t.size
    full = max(-(-n // FLAT_CHUNK) - 1, 0)                            # C - 1 whole chunks
    sums = [np.atleast_1d(csum(t[:full * FLAT_CHUNK].reshape(full, FLAT_CHUNK)))] if full else []
    if n:
        sums.append(np.atleast_1d(csum(t[full * FLAT_CHUNK:])))     # the last chunk, 1..L terms
    return csum(np.concatenate(sums) if sums else np.zeros(0, np.float32))


def cmax(t, axis=-1):
    """§4.2 canonical max: lanes start at -inf, m = (x > m) ? x : m, then the same tree."""
    t = np.moveaxis(ftz(t), axis, -1)
    n = t.shape[-1]
    p = np.full(t.shape[:-1] + (32,), -np.inf, dtype=np.float32)
    for i0 in range(0, n, 32):
        blk = t[..., i0:i0 + 32]
        w = blk.shape[-1]
        p[..., :w] = select(gt(blk, p[..., :w]), blk, p[..., :w])
    for w in (16, 8, 4, 2, 1):
        x = p[..., w:2 * w]
        m = p[..., :w]
        p[..., :w] = select(gt(x, m), x, m)
    return np.array(p[..., 0], dtype=np.float32)[()]


def matmul(a, b):
    """§4.1 / §8 matmul: C[i,j] = sum_k in increasing k of A[i,k]*B[k,j], acc from +0.0.

    a [M,K] or [Bt,M,K]; b [K,N] or [Bt,K,N] (batch broadcast when one side is 2-D).
    """
    a = ftz(a)
    b = ftz(b)
    K = a.shape[-1]
    assert b.shape[-2] == K
    out_shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    acc = np.zeros(out_shape, dtype=np.float32)
    for k in range(K):
        acc = add(acc, mul(a[..., :, k:k + 1], b[..., k:k + 1, :]))
    return acc


# ----------------------------------------------------------------------------------------------
# §5 canonical functions (elementwise, vectorised across elements)
# ----------------------------------------------------------------------------------------------

MAGIC = fl(0x4B400000)


def round_to_int(y):
    t = add(y, MAGIC)
    n = bits(t).astype(np.int64) - np.int64(bits(MAGIC))
    nf = sub(t, MAGIC)
    return n, nf


def _out(x):
    return np.array(x, dtype=np.float32, copy=True)


def exp(x):
    x = ftz(x)
    out = _out(x)
    nan = np.isnan(x)
    hi = x > fl(0x42B17218)
    lo = x < fl(0xC2AEAC4F)
    ok = ~(nan | hi | lo)
    out[nan] = add(x[nan], x[nan])
    out[hi] = np.inf
    out[lo] = 0.0
    xv = x[ok]
    n, nf = round_to_int(mul(xv, fl(0x3FB8AA3B)))
    r = sub(xv, mul(nf, fl(0x3F318000)))
    r = sub(r, mul(nf, fl(0xB95E8083)))
    z = mul(r, r)
    p = np.full_like(r, fl(0x39506967))
    for c in (0x3AB743CE, 0x3C088908, 0x3D2AA9C1, 0x3E2AAAAA, 0x3F000000):
        p = add(mul(p, r), fl(c))
    y = add(add(mul(p, z), r), F32(1.0))
    n1 = n >> 1
    n2 = n - n1
    out[ok] = mul(mul(y, pow2(n1)), pow2(n2))
    return out[()]


def log(x):
    x = ftz(x)
    out = _out(x)
    nan = np.isnan(x)
    negv = (x < 0) & ~nan
    zero = x == 0
    pinf = x == np.inf
    ok = ~(nan | negv | zero | pinf)
    out[nan] = add(x[nan], x[nan])
    out[negv] = fl(QNAN)
    out[zero] = -np.inf
    out[pinf] = np.inf
    xv = x[ok]
    bx = bits(xv).astype(np.int64)
    e = ((bx >> 23) & 0xFF) - 127
    m = fl(((bx & 0x007FFFFF) | 0x3F800000).astype(np.uint32))
    big = m > fl(0x3FB504F3)
    m = select(big, mul(m, F32(0.5)), m)
    e = e + big.astype(np.int64)
    f = sub(m, F32(1.0))
    ef = e.astype(np.float32)  # exact
    z = mul(f, f)
    p = np.full_like(f, fl(0x3D9021BB))
    for c in (0xBDEBD1B8, 0x3DEF251A, 0xBDFE5D4F, 0x3E11E9BF, 0xBE2AAE50, 0x3E4CCEAC,
              0xBE7FFFFC, 0x3EAAAAAA):
        p = add(mul(p, f), fl(c))
    y = mul(mul(f, z), p)
    y = add(y, mul(ef, fl(0xB95E8083)))
    y = sub(y, mul(F32(0.5), z))
    y = add(f, y)
    out[ok] = add(y, mul(ef, fl(0x3F318000)))
    return out[()]


# §5.3 seed `y = C0 - C1 * m` = 24/17 - 8/17 m (m in [1, 2)), constants as the contract gives them.
RECIP_SEED_C0 = 0x3FB4B4B5
RECIP_SEED_C1 = 0x3EF0F0F1


def recip(x):
    x = ftz(x)
    out = _out(x)
    nan = np.isnan(x)
    zero = x == 0
    inf = np.isinf(x)
    ok = ~(nan | zero | inf)
    out[nan] = add(x[nan], x[nan])
    out[zero] = np.copysign(F32(np.inf), x[zero])
    out[inf] = np.copysign(F32(0.0), x[inf])
    xv = x[ok]
    bx = bits(xv).astype(np.int64)
    s = bx & 0x80000000
    k = ((bx >> 23) & 0xFF) - 127
    m = fl(((bx & 0x007FFFFF) | 0x3F800000).astype(np.uint32))
    y = sub(fl(RECIP_SEED_C0), mul(fl(RECIP_SEED_C1), m))
    for _ in range(3):
        e = sub(F32(1.0), mul(m, y))
        y = add(y, mul(y, e))
    k1 = (-k) >> 1
    k2 = (-k) - k1
    r = mul(mul(y, pow2(k1)), pow2(k2))
    out[ok] = fl((bits(r).astype(np.int64) | s).astype(np.uint32))
    return out[()]


def rsqrt(x):
    x = ftz(x)
    out = _out(x)
    nan = np.isnan(x)
    negv = (x < 0) & ~nan
    zero = x == 0
    pinf = x == np.inf
    ok = ~(nan | negv | zero | pinf)
    out[nan] = add(x[nan], x[nan])
    out[negv] = fl(QNAN)
    out[zero] = np.inf
    out[pinf] = 0.0
    xv = x[ok]
    bx = bits(xv).astype(np.int64)
    k = ((bx >> 23) & 0xFF) - 127
    even = (k % 2) == 0
    mb = np.where(even, (bx & 0x007FFFFF) | 0x3F800000, (bx & 0x007FFFFF) | 0x40000000)
    m = fl(mb.astype(np.uint32))
    j = np.where(even, k // 2, (k - 1) // 2)
    y = fl((0x5F375A86 - (mb >> 1)).astype(np.uint32))
    h = mul(F32(0.5), m)
    for _ in range(3):
        y = mul(y, sub(F32(1.5), mul(mul(h, y), y)))
    out[ok] = mul(y, pow2(-j))
    return out[()]


def sqrt(x):
    x = ftz(x)
    out = _out(x)
    zero = x == 0
    pinf = x == np.inf
    ok = ~(zero | pinf)
    # zero -> x (sign kept), +inf -> +inf: out already holds x there
    xv = x[ok]
    out[ok] = mul(xv, rsqrt(xv))
    return out[()]


def _sincos(x):
    """Returns (sin, cos) of the canonical §5.5 algorithm."""
    x = ftz(x)
    sin_o = _out(x)
    cos_o = _out(x)
    with np.errstate(invalid="ignore"):
        ok = np.abs(x) <= F32(65536.0)
    sin_o[~ok] = fl(QNAN)
    cos_o[~ok] = fl(QNAN)
    xv = x[ok]
    j, jf = round_to_int(mul(xv, fl(0x3F22F983)))
    r = sub(xv, mul(jf, fl(0x3FC90000)))
    r = sub(r, mul(jf, fl(0x39FE0000)))
    r = sub(r, mul(jf, fl(0xB52C0000)))
    r = sub(r, mul(jf, fl(0x30885A31)))
    z = mul(r, r)
    s = mul(add(mul(add(mul(fl(0xB94CA1F9), z), fl(0x3C08839E)), z), fl(0xBE2AAAA3)), z)
    sinr = add(mul(s, r), r)
    c = mul(add(mul(add(mul(fl(0x37CCF5CE), z), fl(0xBAB6061A)), z), fl(0x3D2AAAA5)), z)
    cosr = add(sub(mul(c, z), mul(F32(0.5), z)), F32(1.0))
    q = j & 3
    sin_o[ok] = np.select([q == 0, q == 1, q == 2, q == 3], [sinr, cosr, -sinr, -cosr])
    cos_o[ok] = np.select([q == 0, q == 1, q == 2, q == 3], [cosr, -sinr, -cosr, sinr])
    return sin_o[()], cos_o[()]


def sin(x):
    return _sincos(x)[0]


def cos(x):
    return _sincos(x)[1]


def _horner(coeffs, v):
    """c[0] v^n + ... as the contract's `p = c[0]; p = p * v + c[i]` (each * and + rounded)."""
    p = np.full(np.shape(v), fl(coeffs[0]), dtype=np.float32)
    for c in coeffs[1:]:
        p = add(mul(p, v), fl(c))
    return p


def _odd(x, small_max, small, large_max, large):
    """§5.8/§5.9's shape: on a = |x| (after DAZ), small(a) below small_max, large(a) below
    large_max, 1.0 from there on (infinity included); x's sign on the result; NaN propagates."""
    x = ftz(x)
    out = _out(x)
    nan = np.isnan(x)
    out[nan] = add(x[nan], x[nan])
    a = np.abs(x)
    sign = bits(x) & SIGN
    y = np.ones(np.shape(x), dtype=np.float32)
    lo = ~nan & (a < small_max)
    mid = ~nan & (a >= small_max) & (a < large_max)
    y[lo] = small(a[lo])
    y[mid] = large(a[mid])
    ok = ~nan
    out[ok] = fl(bits(y)[ok] | sign[ok])
    return out[()]


# §5.8 tanh: P's coefficients, highest degree first.
TANH_P = (0x3AE3A9AC, 0xBBFAE9A1, 0x3CAFBC2A, 0xBD5CBE9E, 0x3E0886DC, 0xBEAAAAA5)


def tanh(x):
    def small(a):
        z = mul(a, a)
        return add(a, mul(a, mul(z, _horner(TANH_P, z))))

    def large(a):
        e = exp(add(a, a))
        return sub(F32(1.0), mul(F32(2.0), recip(add(e, F32(1.0)))))

    return _odd(x, fl(0x3F400000), small, fl(0x41200000), large)


# §5.9 erf: P (near 0) and Q (the tail), highest degree first.
ERF_P = (0xBA229D55, 0x3BA4E4FF, 0xBCDB79C5, 0x3DE7108F, 0xBEC09386, 0x3E0375D4)
ERF_Q = (0xB81FAC2E, 0x386ED0CB, 0xB90EBE3C, 0x3A2242CE, 0xBAF34985, 0x3BB193C6, 0xBC7D4EB8,
         0x3D2B3C87, 0xBDDAB7DE, 0x3E82C338)


def erf(x):
    def small(a):
        p = _horner(ERF_P, mul(a, a))
        b = mul(a, fl(0x4B800000))                      # a * 2^24
        return mul(add(b, mul(b, p)), fl(0x33800000))   # * 2^-24

    def large(a):
        e = exp(neg(mul(a, a)))
        q = _horner(ERF_Q, sub(a, F32(2.0)))
        return sub(F32(1.0), mul(e, q))

    return _odd(x, fl(0x3F600000), small, fl(0x407AE148), large)


def sigmoid(x):
    return recip(add(F32(1.0), exp(neg(ftz(x)))))


def silu(x):
    return mul(x, sigmoid(x))


# §5.6 the GELU forms' host constants: f32(1/sqrt(2)), f32(sqrt(2/pi)), f32(0.044715),
# f32(3 * f32(0.044715)), f32(1/sqrt(2 pi)).
GELU_RSQRT2, GELU_BETA, GELU_KAPPA = fl(0x3F3504F3), fl(0x3F4C422A), fl(0x3D372713)
GELU_KAPPA3, GELU_RSQRT2PI = fl(0x3E095D4E), fl(0x3ECC422A)
HALF, ONE = F32(0.5), F32(1.0)


def gelu(x):
    return mul(mul(x, HALF), add(ONE, erf(mul(x, GELU_RSQRT2))))


def gelu_tanh(x):
    w = mul(GELU_BETA, add(x, mul(GELU_KAPPA, mul(mul(x, x), x))))
    return mul(mul(HALF, x), add(ONE, tanh(w)))


def gelu_grad(x):
    cdf = mul(HALF, add(ONE, erf(mul(x, GELU_RSQRT2))))
    pdf = mul(GELU_RSQRT2PI, exp(mul(mul(x, x), F32(-0.5))))
    return add(cdf, mul(x, pdf))


def gelu_tanh_grad(x):
    x2 = mul(x, x)
    t = tanh(mul(GELU_BETA, add(x, mul(GELU_KAPPA, mul(x2, x)))))
    left_derivative = mul(HALF, add(ONE, t))
    tanh_derivative = sub(ONE, mul(t, t))
    inner_derivative = mul(GELU_BETA, add(ONE, mul(GELU_KAPPA3, x2)))
    return add(left_derivative, mul(mul(mul(HALF, x), tanh_derivative), inner_derivative))


# ----------------------------------------------------------------------------------------------
# §6 Philox4x32-10, uniform, normal, dropout
# ----------------------------------------------------------------------------------------------

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on counter words (arrays or ints < 2^32) and key (k0, k1).

    Returns four uint32 arrays (x0, x1, x2, x3).
    """
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & _MASK32 for c in (c0, c1, c2, c3))
    c0, c1, c2, c3 = np.broadcast_arrays(c0, c1, c2, c3)
    k0 = np.uint64(int(k0) & 0xFFFFFFFF)
    k1 = np.uint64(int(k1) & 0xFFFFFFFF)
    for rnd in range(10):
        if rnd > 0:
            k0 = (k0 + _W0) & _MASK32
            k1 = (k1 + _W1) & _MASK32
        p0 = _M0 * c0           # < 2^64: exact in uint64
        p1 = _M1 * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & _MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return tuple(c.astype(np.uint32) for c in (c0, c1, c2, c3))


def _key(seed):
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    return seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF


def philox_words(seed, c1, c2, purpose, n, block_offset=0):
    """n uint32 words: element i = word i%4 of block (block_offset + i//4, c1, c2, purpose)."""
    nblk = (n + 3) // 4
    k0, k1 = _key(seed)
    blocks = np.arange(nblk, dtype=np.uint64) + np.uint64(block_offset)
    w = philox4x32_10(blocks, int(c1) & 0xFFFFFFFF, int(c2) & 0xFFFFFFFF, purpose, k0, k1)
    return np.stack(w, axis=1).reshape(-1)[:n]


_TWO_M24 = F32(2.0 ** -24)


def uniform(seed, c1, c2, purpose, n):
    w = philox_words(seed, c1, c2, purpose, n)
    return mul((w >> 8).astype(np.float32), _TWO_M24)  # exact


def normal(seed, c1, c2, purpose, n):
    nblk = (n + 3) // 4
    w = philox_words(seed, c1, c2, purpose, 4 * nblk).reshape(nblk, 4)
    out = np.empty((nblk, 4), dtype=np.float32)
    for a, b in ((0, 1), (2, 3)):
        u1 = mul(((w[:, a] >> 8) + 1).astype(np.float32), _TWO_M24)
        u2 = mul((w[:, b] >> 8).astype(np.float32), _TWO_M24)
        rad = sqrt(mul(F32(-2.0), log(u1)))
        th = mul(u2, fl(0x40C90FDB))
        s, c = _sincos(th)
        out[:, a] = mul(rad, c)
        out[:, b] = mul(rad, s)
    return out.reshape(-1)[:n]


def dropout_threshold(p):
    t = round((1.0 - p) * 2.0 ** 32)
    return min(max(t, 0), 2 ** 32 - 1)


def dropout(x, p, seed, c1, c2):
    """§6/§8 dropout of x (any shape; element index = flat row-major index); also its backward."""
    x = _arr(x)
    n = x.size
    w = philox_words(seed, c1, c2, PURPOSE_DROPOUT, n).astype(np.int64)
    keep = (w < dropout_threshold(p)).reshape(x.shape)
    scale = f32(1.0 / (1.0 - p))
    return select(keep, mul(x, scale), mul(x, F32(0.0)))


# ----------------------------------------------------------------------------------------------
# §8 operators
# ----------------------------------------------------------------------------------------------

def rmsnorm(x, w, eps):
    """x [R, D], w [D] -> (y [R, D], rstd [R])."""
    R, D = x.shape
    inv_d = f32(1.0 / D)
    ss = csum(mul(x, x))
    rstd = rsqrt(add(mul(ss, inv_d), f32(eps)))
    y = mul(mul(x, rstd[:, None]), w[None, :])
    return y, rstd


def rmsnorm_backward(gy, x, w, rstd):
    R, D = x.shape
    inv_d = f32(1.0 / D)
    gw = csum(mul(gy, mul(x, rstd[:, None])), axis=0)
    a = mul(gy, w[None, :])
    dot = csum(mul(a, x))
    c = mul(mul(mul(mul(dot, inv_d), rstd), rstd), rstd)
    gx = sub(mul(a, rstd[:, None]), mul(x, c[:, None]))
    return gx, gw


def rope_tables(T, head_dim, theta):
    inv_dh = f32(1.0 / head_dim)
    lt = log(f32(theta))
    half = head_dim // 2
    i = np.arange(half)
    f = exp(mul((-2 * i).astype(np.float32), mul(lt, inv_dh)))
    t = np.arange(T).astype(np.float32)
    a = mul(t[:, None], f[None, :])
    s, c = _sincos(a)
    return np.ascontiguousarray(c), np.ascontiguousarray(s)


def rope(x, cos_t, sin_t, backward=False):
    """x [B, T, H, Dh]; cos/sin [T, Dh/2]; interleaved pairs (x[2i], x[2i+1])."""
    x0 = x[..., 0::2]
    x1 = x[..., 1::2]
    c = cos_t[None, :, None, :]
    s = sin_t[None, :, None, :]
    if not backward:
        y0 = sub(mul(x0, c), mul(x1, s))
        y1 = add(mul(x0, s), mul(x1, c))
    else:
        y0 = add(mul(x0, c), mul(x1, s))
        y1 = sub(mul(x1, c), mul(x0, s))
    out = np.empty(x.shape, dtype=np.float32)
    out[..., 0::2] = y0
    out[..., 1::2] = y1
    return out


def _causal_mask(T):
    return np.tril(np.ones((T, T), dtype=bool))  # [t, j]: j <= t


def causal_softmax(s, scale):
    """s [BH, T, T] -> P. Row t uses columns j <= t only: the masked tail is padded with -inf
    for the max (exact: no lane ever prefers -inf) and skipped by the sum, and is +0.0 in the output."""
    T = s.shape[-1]
    mask = _causal_mask(T)
    z = mul(s, f32(scale))
    m = cmax(select(mask, z, F32(-np.inf)))
    e = exp(sub(z, m[..., None]))
    ssum = csum(e, where=mask)
    inv = recip(ssum)
    P = mul(e, inv[..., None])
    return select(mask, P, F32(0.0))


def causal_softmax_backward(gp, p, scale):
    T = p.shape[-1]
    mask = _causal_mask(T)
    dot = csum(mul(p, gp), where=mask)
    gs = mul(mul(sub(gp, dot[..., None]), p), f32(scale))
    return select(mask, gs, F32(0.0))


def swiglu(u):
    H = u.shape[-1] // 2
    a, b = u[..., :H], u[..., H:]
    sg = sigmoid(a)
    return mul(mul(a, sg), b)


def swiglu_backward(g, u):
    H = u.shape[-1] // 2
    a, b = u[..., :H], u[..., H:]
    sg = sigmoid(a)
    sa = mul(a, sg)
    gb = mul(g, sa)
    ga = mul(mul(g, b), mul(sg, add(F32(1.0), mul(a, sub(F32(1.0), sg)))))
    return np.concatenate([ga, gb], axis=-1)


def cross_entropy(z, targets, zloss=0.0):
    """z [R, V], targets int64 [R] -> (loss 0-d float32, lse [R])."""
    R, V = z.shape
    inv_r = f32(1.0 / R)
    zl = f32(zloss)
    m = cmax(z)
    s = csum(exp(sub(z, m[:, None])))
    lse = add(m, log(s))
    zt = z[np.arange(R), targets]
    l = add(sub(lse, zt), mul(mul(zl, lse), lse))
    loss = mul(csum(l), inv_r)
    return np.asarray(loss, dtype=np.float32), lse


def cross_entropy_backward(g, z, targets, lse, zloss=0.0):
    R, V = z.shape
    inv_r = f32(1.0 / R)
    gs = mul(F32(g), inv_r)
    k = add(F32(1.0), mul(f32(2.0 * zloss), lse))
    p = exp(sub(z, lse[:, None]))
    pk = mul(p, k[:, None])
    onehot = np.zeros((R, V), dtype=bool)
    onehot[np.arange(R), targets] = True
    d = select(onehot, sub(pk, F32(1.0)), pk)
    return mul(d, gs)


def embedding(w, idx):
    return w[idx].copy()


def embedding_backward(g, idx, num_rows):
    """gW[v] = sequential sum (§4.3), in increasing position, of g[i] with idx[i] == v."""
    D = g.shape[-1]
    gw = np.zeros((num_rows, D), dtype=np.float32)
    for i, v in enumerate(np.asarray(idx).tolist()):
        gw[v] = add(gw[v], g[i])
    return gw


def add_op(a, b):
    return add(a, b)


def mul_op(a, b):
    return mul(a, b)


def scale_op(a, s):
    return mul(a, f32(s))


def adamw_host_scalars(lr, b1, b2, eps, wd, t):
    """The contract's host scalars for step t (1-based), computed in float64 then rounded.
    Returned as Python floats that are exactly float32 values."""
    def powi(x, n):
        r = 1.0
        while n:
            if n & 1:
                r *= x
            x *= x
            n >>= 1
        return r
    return dict(lr=float(f32(lr)), b1=float(f32(b1)), b2=float(f32(b2)),
                omb1=float(f32(1.0 - b1)), omb2=float(f32(1.0 - b2)), eps=float(f32(eps)),
                decay=float(f32(1.0 - lr * wd)), bc1=float(f32(1.0 / (1.0 - powi(b1, t)))),
                bc2=float(f32(1.0 / (1.0 - powi(b2, t)))))


def adamw_(p, g, m, v, lr, b1, b2, omb1, omb2, eps, decay, bc1, bc2):
    """One AdamW step; returns new (p, m, v)."""
    lr, b1, b2, omb1, omb2, eps, decay, bc1, bc2 = (
        f32(s) for s in (lr, b1, b2, omb1, omb2, eps, decay, bc1, bc2))
    m = add(mul(b1, m), mul(omb1, g))
    v = add(mul(b2, v), mul(omb2, mul(g, g)))
    den = add(sqrt(mul(v, bc2)), eps)
    u = mul(mul(m, bc1), recip(den))
    p = sub(mul(p, decay), mul(lr, u))
    return p, m, v


def clip_grad(g, max_norm):
    """g flat [P] -> (g * c, norm); the sum of squares is the chunked sum (§4.5)."""
    norm = sqrt(csum_chunked(mul(g, g)))
    x = mul(f32(max_norm), recip(add(norm, f32(1e-6))))
    # min(1.0, x) as a select, read as C++ std::min(a, b) = (b < a) ? b : a, i.e.
    # (x < 1.0) ? x : 1.0 -- a NaN x gives 1.0 (the contract does not spell out the operand order).
    c = select(x < F32(1.0), x, F32(1.0))
    return mul(g, c), np.asarray(norm, dtype=np.float32)


# ----------------------------------------------------------------------------------------------
# §10 the quantized path (int8, symmetric grid [-QP, QP])
# ----------------------------------------------------------------------------------------------

QP = 127
INV_SQRT_QP = f32(1.0 / math.sqrt(QP))   # 0x1.6b7612p-4


def int8_quant(v):
    """Q(v): 127 if v >= 127, -127 if v <= -127, 0 for NaN, else round half to even (int64)."""
    v = ftz(v)
    n, _ = round_to_int(np.clip(np.nan_to_num(v, nan=0.0), -QP, QP).astype(np.float32))
    with np.errstate(invalid="ignore"):
        return np.where(v >= QP, QP, np.where(v <= -QP, -QP, np.where(np.isnan(v), 0, n))).astype(np.int64)


def _rows(x, s):
    """x viewed as [R, C] for R = s.size step sizes, and recip(s) as a column [R, 1]."""
    return np.asarray(x).reshape(s.size, -1), recip(s.astype(np.float32)).reshape(-1, 1)


def int8_quantize(x, s):
    x2, inv = _rows(x, s)
    return int8_quant(mul(x2, inv)).reshape(np.shape(x)).astype(np.int8)


def int8_dequantize(q, s):
    q2 = np.asarray(q).reshape(s.size, -1)
    return mul(q2.astype(np.float32), s.astype(np.float32).reshape(-1, 1)).reshape(np.shape(q))


def int8_matmul(a, b):
    """a [M, K] @ b [N, K]^T in int64 (exact), as int32 after checking that it fits."""
    c = a.astype(np.int64) @ b.astype(np.int64).T
    assert np.all(np.abs(c) < 2**31)
    return c.astype(np.int32)


def int8_linear(a, b, sx, sw):
    """float(int8_matmul(a, b)[i, j]) * (sx * sw[j]); the int32 -> float conversion rounds RNE."""
    sc = mul(np.float32(sx).reshape(()), sw.astype(np.float32))
    return mul(int8_matmul(a, b).astype(np.float32), sc.reshape(1, -1))


def lsq_init(x, rows):
    """s[r] = (2 * (csum |x[r, :]| * f32(1/C))) * INV_SQRT_QP for x viewed as [rows, C]."""
    x2 = _arr(x).reshape(rows, -1)
    mean = mul(csum(np.abs(x2)), f32(1.0 / x2.shape[1]))
    return mul(mul(F32(2.0), mean), INV_SQRT_QP).reshape(rows)


def lsq_backward(x, s, gxh, g):
    """(gx, gs): STE gx = gxh where -QP < v < QP else +0.0, v = x * recip(s);
    gs[r] = csum_c(gxh * term) * g with term = Q(v) - v inside the grid and Q(v) at the clip."""
    x2, inv = _rows(x, s)
    gx2 = np.asarray(gxh).reshape(x2.shape)
    v = mul(x2, inv)
    with np.errstate(invalid="ignore"):
        inside = gt(v, F32(-QP)) & gt(F32(QP), v)
    qf = int8_quant(v).astype(np.float32)
    term = select(inside, sub(qf, v), qf)
    gx = select(inside, gx2, F32(0.0)).reshape(np.shape(x))
    gs = mul(np.atleast_1d(csum(mul(gx2, term))), f32(g))
    return gx, gs.reshape(s.shape)
