"""The exact matmul (contract §11, Ozaki scheme II): the NumPy reference against an independent
exact computation of the same definition, the reference's accuracy against float64 next to the
fp32-sequential matmul's, and the CPU kernel (torch.ops.repops.exact_matmul, kernels/cpu/exact.cpp)
against the reference bit for bit.

    .venv/bin/python -m pytest tests/test_exact_matmul.py -q -x

The independent computation uses Python integers and fractions only: each operand is the exact
rational its float32 bits denote, the row/column grid step 2^(floor(log2 max|x|) + 1 - beta), the
integer product summed in Python ints, the result rounded to float32 by exact rational
arithmetic. It shares no code with tests/numpy_exact.py (no residues, no CRT there).
"""
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import reference as ref
import repops


def same_bits(a, b):
    """Equal float32 bit patterns, every NaN equal to every NaN."""
    a = np.asarray(a, dtype=np.float32).reshape(-1)
    b = np.asarray(b, dtype=np.float32).reshape(-1)
    if a.shape != b.shape:
        return False
    both_nan = np.isnan(a) & np.isnan(b)
    return bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | both_nan))


# ------------------------------------------------------------------ the independent definition
def _value(x):
    """The exact rational of a float32, DAZ applied (a subnormal reads as zero)."""
    f = float(x)
    return Fraction(0) if abs(f) < 2.0 ** -126 else Fraction(f)


def _grid(values, beta):
    """The grid step of a row (or column): 2^(floor(log2 max|x|) + 1 - beta); None if all zero."""
    top = max((abs(v) for v in values), default=Fraction(0))
    if top == 0:
        return None
    k = math.frexp(float(top))[1] - 1          # floor(log2 top): top is a float32 value
    return Fraction(2) ** (k + 1 - beta)


def _round_half_away(f):
    n = math.floor(abs(f) + Fraction(1, 2))
    return n if f >= 0 else -n


def _to_f32(v):
    """The exact rational v rounded to float32 once (24 bits, half to even), with the §3 flush
    (a rounded value below 2^-126 becomes a zero of v's sign) and overflow to +-inf."""
    if v == 0:
        return np.float32(0.0)
    a = abs(v)
    k = math.floor(math.log2(a))
    while Fraction(2) ** k > a:
        k -= 1
    while Fraction(2) ** (k + 1) <= a:
        k += 1
    q = round(a / Fraction(2) ** (k - 23))     # Python rounds a Fraction half to even
    if q == 1 << 24:
        q, k = 1 << 23, k + 1
    if k > 127:
        r = np.float32(np.inf)
    elif k < -126:
        r = np.float32(0.0)
    else:
        r = np.float32(q * 2.0 ** (k - 23))    # exact: 24 bits in the normal range
    return -r if v < 0 else r


def independent_exact(a, b):
    """§11 from its meaning: C = fl32(sum_k a'_ik b'_kj * step_i * step_j)."""
    M, K = a.shape
    N = b.shape[1]
    out = np.zeros((M, N), dtype=np.float32)
    if K == 0:
        return out
    beta = (62 - max(0, (K - 1).bit_length())) // 2
    bad_a = [not np.all(np.isfinite(a[i])) for i in range(M)]
    bad_b = [not np.all(np.isfinite(b[:, j])) for j in range(N)]
    va = [[_value(x) if np.isfinite(x) else Fraction(0) for x in a[i]] for i in range(M)]
    vb = [[_value(x) if np.isfinite(x) else Fraction(0) for x in b[:, j]] for j in range(N)]
    ga, gb = [_grid(r, beta) for r in va], [_grid(c, beta) for c in vb]
    ia = [[_round_half_away(x / g) for x in r] if g else [0] * K for r, g in zip(va, ga)]
    ib = [[_round_half_away(x / g) for x in c] if g else [0] * K for c, g in zip(vb, gb)]
    for i in range(M):
        for j in range(N):
            if bad_a[i] or bad_b[j]:
                out[i, j] = np.nan
                continue
            c = sum(x * y for x, y in zip(ia[i], ib[j]))
            out[i, j] = _to_f32(Fraction(c) * ga[i] * gb[j]) if c else np.float32(0.0)
    return out


def adversarial(rng, M, K, N):
    """Operands with zeros, subnormals, +-0, tiny and huge exponents, exact ties of the rounding
    and whole zero rows/columns."""
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    a[::3, ::2] *= np.float32(2.0 ** -60)
    b[1::4, :] *= np.float32(2.0 ** 50)
    a[0, :] = 0.0
    if N > 1:
        b[:, 1] = -0.0
    a.reshape(-1)[5::7] = np.float32(1e-40)          # subnormal: reads as zero
    b.reshape(-1)[3::11] = np.float32(-3e-39)
    return a, b


CASES = [(1, 1, 1), (2, 3, 1), (3, 5, 4), (4, 2, 7), (5, 6, 3), (7, 9, 8), (3, 33, 2)]


@pytest.mark.parametrize("M,K,N", CASES)
def test_reference_is_the_definition(M, K, N):
    rng = np.random.default_rng(M * 100 + K * 10 + N)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    assert same_bits(ref.exact_matmul(a, b), independent_exact(a, b))
    a, b = adversarial(rng, M, K, N)
    assert same_bits(ref.exact_matmul(a, b), independent_exact(a, b))


def test_reference_special_values():
    """Non-finite rows/columns give NaN, K = 0 gives +0.0, results that round below 2^-126 flush
    to a signed zero, results above the float range overflow to +-inf."""
    a = np.array([[1.0, np.inf], [1.0, 2.0], [np.nan, 0.0]], np.float32)
    b = np.array([[1.0, 1.0], [1.0, np.float32(-np.inf)]], np.float32)
    c = ref.exact_matmul(a, b)
    assert np.isnan(c[0]).all() and np.isnan(c[2]).all() and np.isnan(c[:, 1]).all()
    assert c[1, 0] == 3.0
    z = ref.exact_matmul(np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32))
    assert z.shape == (2, 3) and np.all(z.view(np.uint32) == 0)
    tiny = np.float32(2.0 ** -70)
    c = ref.exact_matmul(np.array([[tiny, -tiny]], np.float32), np.array([[tiny], [2 * tiny]], np.float32))
    assert c.view(np.uint32)[0, 0] == 0x80000000            # -2^-140: flushed, sign kept
    big = np.float32(2.0 ** 100)
    c = ref.exact_matmul(np.array([[big]], np.float32), np.array([[-big]], np.float32))
    assert c[0, 0] == -np.inf
    # 2^-126 (1 - 2^-25) exactly (a tie) rounds to 2^-126 and is kept (tininess after rounding);
    # 2^-126 (1 - 2^-24) rounds to itself, below 2^-126: flushed
    a = np.full((1, 2), np.float32(2.0 ** -63))
    for low, want in ((2.0 ** -88, 2.0 ** -126), (2.0 ** -87, 0.0)):
        b = np.array([[2.0 ** -63], [-low]], np.float32)
        c = ref.exact_matmul(a, b)
        assert c[0, 0] == np.float32(want) and same_bits(c, independent_exact(a, b))


def test_crt_recovers_every_integer_of_the_range():
    """Garner gives back C' from its residues at the ends of [-HALF, HALF] and inside."""
    rng = np.random.default_rng(3)
    vals = [0, 1, -1, ref.HALF, -ref.HALF, 2**62, -(2**62)] + [int(v) for v in rng.integers(-(2**62), 2**62, 200)]
    c = np.array(vals, dtype=np.int64)
    res = [np.array([v % p for v in vals], dtype=np.int64) - p * 3 for p in ref.MODULI]   # any representative
    assert np.array_equal(ref.crt(res), c)


def test_integer_product_is_recovered_exactly_at_the_bound():
    """The largest |C'| the width allows (every |a'| = |b'| = 2^beta, K = 2^c) is recovered: the
    reference's C' equals the direct Python-integer product."""
    for K in (1, 2, 3, 1000, 4096):
        beta = ref.beta_of(K)
        assert K * 4**beta <= 2**62 < ref.PRODUCT // 2
        a = np.full((2, K), np.float32(1.0))
        a[1, ::2] = -1.0
        b = np.full((K, 1), np.float32(1.0))
        qa, _, _ = ref.exact_split(a, beta)
        qb, _, _ = ref.exact_split(b, beta, axis=0)
        assert qa.max() == 2**(beta - 1)      # 1.0 is the row max: 2^(beta-1), below the bound
        res = [ref.residue(qa, p) @ ref.residue(qb, p) for p in ref.MODULI]
        direct = [[sum(int(x) * int(y) for x, y in zip(qa[i], qb[:, 0]))] for i in range(2)]
        assert ref.crt(res).tolist() == direct


# ------------------------------------------------------------------ accuracy against float64
def rel_err(c, exact):
    return np.abs(c.astype(np.float64) - exact) / np.maximum(np.abs(exact), 1e-300)


@pytest.mark.parametrize("K", [128, 384, 1024])
def test_reference_at_least_as_accurate_as_fp32_sequential(K):
    """Median and max elementwise relative error against float64 at the model's K: exact <= fp32."""
    rng = np.random.default_rng(K)
    a = rng.standard_normal((24, K)).astype(np.float32)
    b = (rng.standard_normal((K, 20)) * rng.exponential(1.0, (K, 1))).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    e_ex, e_fp = rel_err(ref.exact_matmul(a, b), exact), rel_err(ref.matmul(a, b), exact)
    assert np.median(e_ex) <= np.median(e_fp) and e_ex.max() <= e_fp.max()
    assert np.median(e_ex) < 1e-7


# ------------------------------------------------------------------ the CPU kernel = the reference
def kernel(a, b):
    return repops.ops.exact_matmul(torch.from_numpy(np.ascontiguousarray(a)), torch.from_numpy(np.ascontiguousarray(b))).numpy()


SHAPES = [(1, 1, 1), (1, 7, 1), (5, 1, 9), (3, 0, 4), (17, 33, 31), (8, 128, 32), (33, 129, 65), (40, 384, 24),
          (9, 1030, 70), (64, 64, 64)]


@pytest.mark.parametrize("M,K,N", SHAPES)
def test_kernel_matches_reference(M, K, N, int8_path):
    rng = np.random.default_rng(M + 7 * K + 13 * N)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = (rng.standard_normal((K, N)) * rng.exponential(1.0, (K, 1))).astype(np.float32)
    assert same_bits(kernel(a, b), ref.exact_matmul(a, b))
    if min(M, K, N) > 0:
        a, b = adversarial(rng, M, K, N)
        assert same_bits(kernel(a, b), ref.exact_matmul(a, b))


def test_kernel_special_values_and_exponent_extremes(int8_path):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((12, 40)).astype(np.float32)
    b = rng.standard_normal((40, 10)).astype(np.float32)
    a[1, 3], a[4, 0], b[7, 2], b[0, 6] = np.nan, np.inf, -np.inf, np.nan
    a[2] *= np.float32(2.0 ** 120)             # overflow to inf with the big column
    b[:, 3] *= np.float32(2.0 ** 100)
    a[5] *= np.float32(2.0 ** -100)            # products far below 2^-126: flushed
    b[:, 4] *= np.float32(2.0 ** -60)
    a[6, ::2] = np.float32(2.0 ** -126)        # the smallest normal next to ordinary values
    a[7] = np.float32(3e-39)                   # an all-subnormal row reads as zero
    a[8] = np.float32(np.finfo(np.float32).max)
    for x, y in ((a, b), (-a, b), (a, -b)):
        c = kernel(x, y)
        assert same_bits(c, ref.exact_matmul(x, y))
    assert np.isinf(c[2, 3]) and np.all(c[7, [0, 1, 3, 4, 5, 7, 8, 9]].view(np.uint32) == 0)
    assert np.isnan(c[:, 2]).all() and np.isnan(c[1]).all()


def test_kernel_views_batches_and_grad_shapes(int8_path):
    """Transposed views, a batch against a 2-D operand (broadcast) and the batched 3-D products of
    attention give the reference's bits."""
    rng = np.random.default_rng(6)
    at = torch.from_numpy(rng.standard_normal((20, 13)).astype(np.float32))
    bt = torch.from_numpy(rng.standard_normal((9, 20)).astype(np.float32))
    got = repops.ops.exact_matmul(at.t(), bt.t()).numpy()
    assert same_bits(got, ref.exact_matmul(at.numpy().T, bt.numpy().T))
    a3 = rng.standard_normal((3, 6, 11)).astype(np.float32)
    b2 = rng.standard_normal((11, 5)).astype(np.float32)
    assert same_bits(kernel(a3, b2), ref.exact_matmul(a3, b2))
    b3 = rng.standard_normal((3, 11, 4)).astype(np.float32)
    got = repops.ops.exact_matmul(torch.from_numpy(a3), torch.from_numpy(b3).transpose(1, 2).contiguous().transpose(1, 2)).numpy()
    assert same_bits(got, ref.exact_matmul(a3, b3))


def test_kernel_transposed_operands_in_blocks_and_edges(int8_path):
    """A weight gradient's operands, x^T and g with K the shared leading dim, are read in place (16
    x 16 register transposes of 16 rows, the edges value by value; 256-value blocks; exponents in
    slabs of 1024 rows): the bits of the reference, batched too."""
    rng = np.random.default_rng(12)
    for K, M, N in ((70, 45, 33), (64, 32, 48), (33, 17, 100), (600, 40, 20), (50, 1030, 3)):
        x = torch.from_numpy(rng.standard_normal((K, M)).astype(np.float32))
        g = torch.from_numpy(rng.standard_normal((K, N)).astype(np.float32))
        got = repops.ops.exact_matmul(x.t(), g).numpy()
        assert same_bits(got, ref.exact_matmul(x.numpy().T, g.numpy()))
    x3 = torch.from_numpy(rng.standard_normal((3, 40, 20)).astype(np.float32))
    g3 = torch.from_numpy(rng.standard_normal((3, 40, 18)).astype(np.float32))
    got = repops.ops.exact_matmul(x3.transpose(1, 2), g3).numpy()
    assert same_bits(got, ref.exact_matmul(x3.numpy().transpose(0, 2, 1), g3.numpy()))


def _mantissa_for_residue(beta, p, r):
    """The smallest float32 in [1, 2) whose integer in a row of equal values, q = m 2^(beta-24)
    (§11 step 4: the row's own exponent), is r mod p."""
    m = next(m for m in range(1 << 23, 1 << 24) if (m << (beta - 24)) % p == r)
    return np.float32(m * 2.0 ** -23)


@pytest.mark.parametrize("K", [256, 1024, 2048])
def test_kernel_residue_sums_at_their_bounds(K, int8_path):
    """Rows of one value whose residue mod 255 is 127: the residue sums R_0 reach +-K * 127^2,
    4129024 at K = 256 (the largest K whose sums enter Garner's sum unreduced, Sums::kScaled in
    kernels/cpu/exact.cpp), 16516096 at K = 1024 (just below 2^24: converted without the fold,
    Sums::kSmall) and twice that at K = 2048 (folded). The reference's bits."""
    beta = ref.beta_of(K)
    v = _mantissa_for_residue(beta, 255, 127)
    a = np.full((3, K), v, np.float32)
    a[1] = -v
    a[2, ::3] = np.float32(1.5)                # a mixed row beside them
    b = np.full((K, 2), v, np.float32)
    b[::2, 1] = -v
    qa, _, _ = ref.exact_split(a, beta)
    qb, _, _ = ref.exact_split(b, beta, axis=0)
    r = ref.residue(qa, 255) @ ref.residue(qb, 255)
    assert r[0, 0] == K * 127 ** 2 and r[1, 0] == -K * 127 ** 2
    assert same_bits(kernel(a, b), ref.exact_matmul(a, b))


def _garner_q(t):
    """Q_t = (p_0 ... p_{t-1})^-1 mod p_t (Garner's coefficient of R_t)."""
    return pow(math.prod(ref.MODULI[:t]), -1, ref.MODULI[t])


@pytest.mark.parametrize("t", range(8))
def test_kernel_scaled_residue_sums_at_their_bound(t, int8_path):
    """K = 256: the operand with fewer rows is split into its residues times Q_t (Sums::kScaled in
    kernels/cpu/exact.cpp). Its rows hold one value whose scaled residue is (p_t - 1)/2, the other
    operand's one value whose residue is (p_t - 1)/2, so R_t reaches +-K ((p_t - 1)/2)^2 next to the
    Garner digits below it; both orientations (the scaled operand as A and as B). The reference's
    bits."""
    K, p = 256, ref.MODULI[t]
    beta, h = ref.beta_of(K), (p - 1) // 2
    ms = next(m for m in range(1 << 23, 1 << 24) if (m << (beta - 24)) * _garner_q(t) % p == h)
    s = np.full((2, K), np.float32(ms * 2.0 ** -23), np.float32)   # the scaled operand's rows
    s[1] = -s[1]
    o = np.full((K, 3), _mantissa_for_residue(beta, p, h), np.float32)
    o[::2, 1] = -o[::2, 1]
    o[::5, 2] = np.float32(1.75)               # a mixed column beside them
    qs, _, _ = ref.exact_split(s, beta)
    qo, _, _ = ref.exact_split(o, beta, axis=0)
    r = (ref.residue(qs, p) * _garner_q(t) % p + p // 2) % p - p // 2   # the scaled residues
    assert (r @ ref.residue(qo, p))[0, 0] == K * h * h
    assert same_bits(kernel(s, o), ref.exact_matmul(s, o))
    assert same_bits(kernel(o.T, s.T), ref.exact_matmul(o.T, s.T))


def _near(x, p, fused):
    """exact.cpp's near(x) for integers x held as float32: x - p * round(x * fl(1/p)), the round by
    adding and subtracting 1.5 * 2^23 in float32 (two roundings), or fused (x * fl(1/p) exact,
    rounded once to an integer, ties to even). float64 holds x - q p exactly."""
    inv = np.float32(1.0) / np.float32(p)
    if fused:
        q = np.rint(x.astype(np.float64) * np.float64(inv))
    else:
        big = np.float32(1.5 * 2 ** 23)
        q = ((x * inv) + big) - big
    return x.astype(np.float64) - q.astype(np.float64) * p


def test_float_lane_reductions_keep_their_bounds():
    """The bounds that make the CPU kernel's float32-lane reductions exact (kernels/cpu/exact.cpp,
    beside near), fused and unfused: near(x) is congruent to x; below 2^22 in magnitude (split
    values, Garner sums) it is the representative in [-(p-1)/2, (p-1)/2]; below 2^24 (residue sums,
    folded or not) within 3p/2 of 0. Every x below 2^22, and the 2^19 largest below 2^23 and
    below 2^24 and 2^20 sampled others."""
    rng = np.random.default_rng(13)
    small = np.arange(-(2 ** 22) + 1, 2 ** 22, dtype=np.int64)
    top = np.concatenate([np.arange(2 ** c - 2 ** 19, 2 ** c, dtype=np.int64) for c in (23, 24)])
    large = np.concatenate([top, -top, rng.integers(-(2 ** 24) + 1, 2 ** 24, 2 ** 20)])
    for p in ref.MODULI:
        for fused in (False, True):
            for xs, bound in ((small, (p - 1) / 2), (large, 1.5 * p)):
                r = _near(xs.astype(np.float32), p, fused)
                assert np.all((r.astype(np.int64) - xs) % p == 0)
                assert np.abs(r).max() <= bound, (p, fused, np.abs(r).max())


def test_kernel_k_beyond_one_residue_gemm(int8_path):
    """K > 131072 takes two chunks of residue GEMMs whose sums add up: the reference's bits (it
    sums the int64 products in one piece)."""
    rng = np.random.default_rng(8)
    K = 131072 + 999
    a = rng.standard_normal((2, K)).astype(np.float32)
    b = rng.standard_normal((K, 3)).astype(np.float32)
    b[:, 1] = np.abs(b[:, 1])
    a[1] = np.abs(a[1])                       # all-positive sums: large |C'| near the bound
    assert same_bits(kernel(a, b), ref.exact_matmul(a, b))


def test_kernel_output_panels(int8_path):
    """A wide output (N = 70000) is computed in panels of 14 rows (the residue sums of a panel
    stay near 32 MB): 17 rows = panels of 14 and 3, the reference's bits."""
    rng = np.random.default_rng(10)
    a = rng.standard_normal((17, 5)).astype(np.float32)
    b = rng.standard_normal((5, 70000)).astype(np.float32)
    a[16, 2] = np.nan
    assert same_bits(kernel(a, b), ref.exact_matmul(a, b))


@pytest.mark.parametrize("M,K,N", [(300, 2000, 600), (150, 8192, 40)])
def test_kernel_b_in_row_chunks_and_a_in_row_panels(M, K, N, int8_path):
    """K above the AMX path's fused limit (1024): eight separate residue GEMMs per panel. On AMX,
    B's planes are split and packed in chunks of 4 MB (256 rows at Kp = 2048), C's rows run in
    panels of twice that and each panel's columns in chunks whose residue sums take 4 MB: at
    K = 2000, B's chunks of 256, 256 and 88 rows, one panel of 300 rows, column chunks of 256,
    256 and 88 (an edge block at column 576); at K = 8192, panels of 128 and 22 rows. The
    reference's bits."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = (rng.standard_normal((K, N)) * rng.exponential(1.0, (K, 1))).astype(np.float32)
    b[:, N - 1] = np.abs(b[:, N - 1])
    a[M - 1] = np.abs(a[M - 1])               # all-positive sums in the last row and column
    assert same_bits(kernel(a, b), ref.exact_matmul(a, b))


@pytest.mark.parametrize("M,K,N", [(300, 200, 530), (530, 131, 70), (150, 700, 300), (40, 1000, 600)])
def test_kernel_fused_blocks_and_edges(M, K, N, int8_path):
    """The eight residue GEMMs of each block of C one after the other, the block reconstructed at
    once (kernels/cpu/exact.cpp, exact_product_tiled): on the SIMD path for 64 <= K <= 256, in
    tasks of 256 columns by 128 rows (int8.cpp, rp_int8_gemm_packed) of 8 x 32 tiles with AVX-512
    (4 x 16 otherwise), the scaled operand A (M <= N) or B; on AMX for K <= 1024 (blocks of
    32 x 32; at K = 1000 B split and packed 512 rows at a time). Edges of every kind, a NaN row and
    an infinite column at the edges, all-positive sums in a row and a column: the reference's
    bits."""
    rng = np.random.default_rng(M + K + N)
    a = (rng.standard_normal((M, K)) * rng.exponential(1.0, (M, 1))).astype(np.float32)
    b = (rng.standard_normal((K, N)) * rng.exponential(1.0, (1, N))).astype(np.float32)
    a[M - 1, K // 2], b[K - 1, N - 1] = np.nan, np.inf
    a[M // 2] = np.abs(a[M // 2])
    b[:, 0] = np.abs(b[:, 0])                 # all-positive sums in a row and a column
    assert same_bits(kernel(a, b), ref.exact_matmul(a, b))


@pytest.mark.parametrize("M,K,N", [(70, 300, 90), (300, 200, 530)])
def test_kernel_bits_do_not_depend_on_threads(M, K, N, int8_path):
    """One and two threads (K = 200: the fused blocks, nine tasks on the SIMD path): the same bits,
    the reference's."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    saved = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append(kernel(a, b))
    finally:
        torch.set_num_threads(saved)
    assert same_bits(outs[0], outs[1]) and same_bits(outs[0], ref.exact_matmul(a, b))


# ------------------------------------------------------------------ attention's products
def causal_case(batch, G, T, D, seed):
    """q, k, v, go and a P like causal_softmax's ([batch, G*T, T], +0.0 above each head's diagonal)."""
    rng = np.random.default_rng(seed)
    q, go = (rng.standard_normal((batch, G * T, D)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((batch, T, D)).astype(np.float32) for _ in range(2))
    p = rng.exponential(1.0, (batch, G * T, T)).astype(np.float32) * above(G, T, keep=True)
    return q, k, v, go, p


def above(G, T, keep=False):
    """[G*T, T]: True where column j > t = r % T (or, keep, where j <= t)."""
    t = np.arange(G * T) % T
    up = np.arange(T)[None, :] > t[:, None]
    return ~up if keep else up


CAUSAL_SHAPES = [(2, 1, 128, 32), (3, 2, 97, 16), (1, 1, 1, 8), (2, 4, 33, 8), (2, 1, 200, 64), (1, 3, 64, 300),
                 (1, 1, 130, 40), (1, 90, 97, 32)]


@pytest.mark.parametrize("batch,G,T,D", CAUSAL_SHAPES)
def test_kernel_causal_products(batch, G, T, D, int8_path):
    """exact_matmul_causal (kernels/README.md §11 "Attention's products") against the reference:
    form 1, the scores q k^T: the reference's bits on and below each head's diagonal, +0.0 above
    it (NaN rows and columns included); forms 2 and 3, P v and P^T gO with P +0.0 above the
    diagonal: the reference's bits, and the same where P holds NaN, infinities and huge values
    there instead (read as +0.0). On AMX the 32 x 32 score blocks wholly above the diagonal and
    the 64-k steps of P's zeros are skipped (also where a block holds rows of two heads, T = 97,
    33, and across the fused path's panels of 8192 rows, G = 90, where a panel starts at t = 44);
    the other paths compute them. One thread, and two (a batch's products one per thread)."""
    q, k, v, go, p = causal_case(batch, G, T, D, batch + 100 * G + 7 * T + D)
    if T > 2:
        q[0, T + 1 if G > 1 else 1, D // 2] = np.nan      # a bad row (NaN on and below its diagonal)
        k[-1, T - 2, 0] = np.inf                          # a bad column
    garbage = p.copy()
    garbage[:, above(G, T)] = np.resize(np.array([np.nan, np.inf, -np.inf, 3e38, 1.0], np.float32),
                                        garbage[:, above(G, T)].shape)
    want = {"scores": np.where(above(G, T), np.float32(0.0), ref.exact_matmul(q, np.swapaxes(k, 1, 2))),
            "mix": ref.exact_matmul(p, v), "mix_t": ref.exact_matmul(np.swapaxes(p, 1, 2), go)}
    ops, tt = repops.ops, torch.from_numpy
    saved = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            got = ops.exact_matmul_causal(tt(q), tt(k).transpose(1, 2), 1).numpy()
            assert same_bits(got, want["scores"]), f"scores, {threads} threads"
            for pp, what in ((p, "P"), (garbage, "garbage above the diagonal")):
                got = ops.exact_matmul_causal(tt(pp), tt(v), 2).numpy()
                assert same_bits(got, want["mix"]), f"mix, {what}, {threads} threads"
                got = ops.exact_matmul_causal(tt(pp).transpose(1, 2), tt(go), 3).numpy()
                assert same_bits(got, want["mix_t"]), f"mix_t, {what}, {threads} threads"
    finally:
        torch.set_num_threads(saved)


def test_kernel_causal_products_refuse_bad_shapes():
    z = torch.zeros
    with pytest.raises(RuntimeError, match=r"form 1 needs M \(G\*T\) a multiple of T \(N\)"):
        repops.ops.exact_matmul_causal(z(2, 10, 8), z(2, 8, 4), 1)
    with pytest.raises(RuntimeError, match=r"form 2 needs M \(G\*T\) a multiple of T \(K\)"):
        repops.ops.exact_matmul_causal(z(2, 7, 3), z(2, 3, 4), 2)
    with pytest.raises(RuntimeError, match=r"form 3 needs K \(G\*T\) a multiple of T \(M\)"):
        repops.ops.exact_matmul_causal(z(2, 4, 7), z(2, 7, 3), 3)
    with pytest.raises(RuntimeError, match="form must be 1"):
        repops.ops.exact_matmul_causal(z(2, 4, 4), z(2, 4, 4), 0)


@pytest.mark.parametrize("batch,G,T,D", [(2, 1, 128, 32), (3, 2, 97, 16), (2, 4, 33, 8), (1, 1, 1, 8)])
@pytest.mark.parametrize("threads", [1, 2])
def test_exact_attention_is_the_composed_ops(batch, G, T, D, threads, int8_path, monkeypatch):
    """repops.causal_attention(exact=True) on the CPU (_ExactCausalAttention: every product told its
    causal form) gives the composed ops' bits (exact_matmul, causal_softmax, exact_matmul, as
    optrace runs them), forward and backward."""
    q, k, v, go, _ = (torch.from_numpy(x) for x in causal_case(batch, G, T, D, batch + 10 * G + T + D))
    saved = torch.get_num_threads()
    outs = []
    try:
        torch.set_num_threads(threads)
        for composed in (False, True):
            monkeypatch.setattr(repops, "COMPOSED_ATTENTION", composed)
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            o = repops.causal_attention(*leaves, 1.0 / math.sqrt(D), exact=True)
            o.backward(go.transpose(1, 2).contiguous().transpose(1, 2))   # a strided gradient, as a step's
            outs.append([o.detach()] + [x.grad for x in leaves])
    finally:
        torch.set_num_threads(saved)
    for name, got, exp in zip(("o", "gq", "gk", "gv"), *outs):
        assert same_bits(got.numpy(), exp.numpy()), name
