"""Kernels vs the contract (kernels/README.md).

Three groups of tests:

1. The reference itself (`tests/reference.py`): accuracy against float64, Philox known-answer
   vectors, and sensitivity checks showing that a bitwise comparison does catch a different
   summation order.  These need no compiled code.
2. Bit-for-bit equality of every raw kernel (`torch.ops.repops.*`) with the reference, on random
   inputs of awkward sizes and on adversarial values (subnormals, signed zeros, huge values,
   infinities, NaN, thresholds of the canonical functions).  All NaNs compare equal (§7).
3. Accuracy of the autograd wrappers in `repops` against stock PyTorch on the same float32 data
   (forward and gradients), within tolerances.
"""

import math
import os
import re
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import reference as R
import repops  # built and loaded by conftest.py

F32 = np.float32
FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN = float(np.finfo(np.float32).tiny)

# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------



@pytest.fixture(scope="session")
def rp():
    return repops


@pytest.fixture(scope="session")
def ops(rp):
    return torch.ops.repops


def T(a):
    """NumPy -> torch (copy, contiguous, same shape, 0-d included)."""
    return torch.from_numpy(np.array(a, copy=True, order="C"))


def N(t):
    return t.detach().cpu().numpy()


def hexf(v):
    return f"{float(v)!r} (0x{int(np.asarray(v, np.float32).view(np.uint32)):08X})"


def assert_bits(got, exp, what="", inputs=None):
    """Bitwise equality of float32 arrays; all NaNs are equal (§7)."""
    got = np.asarray(N(got) if isinstance(got, torch.Tensor) else got)
    exp = np.asarray(exp)
    assert got.dtype == np.float32, f"{what}: kernel dtype {got.dtype}"
    exp = exp.astype(np.float32)
    assert got.shape == exp.shape, f"{what}: shape {got.shape} != {exp.shape}"
    g, e = got.view(np.uint32), exp.view(np.uint32)
    bad = (g != e) & ~(np.isnan(got) & np.isnan(exp))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        msg = (f"{what}: {int(bad.sum())}/{bad.size} elements differ; first at {idx}: "
               f"kernel {hexf(got[idx])} vs reference {hexf(exp[idx])}")
        if inputs is not None:
            msg += f"; input there {inputs(idx)}"
        raise AssertionError(msg)


def rbits(rng, n):
    """Uniformly random bit patterns: every class of float (subnormal, inf, NaN...)."""
    return rng.integers(0, 2 ** 32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32)


SPECIALS = np.array(
    [0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, 1.1754942e-38, -1.1754942e-38, FLT_MIN, -FLT_MIN,
     FLT_MAX, -FLT_MAX, 3e38, -3e38, 1e30, -1e30, 1e-30, np.inf, -np.inf, np.nan, 1.0, -1.0,
     0.5, 2.0, 88.72283935546875, 88.72284, 88.7228, 89.0, -87.33654022216797, -87.33655,
     -87.3365, -103.9, -104.0, 65536.0, -65536.0, 65536.01, 1.5, 3.0, 1.4142135, 1.4142137],
    dtype=np.float32)


def adversarial(rng, shape, frac=0.25, scale=1.0, nonfinite=True):
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    pool = SPECIALS if nonfinite else SPECIALS[np.isfinite(SPECIALS)]
    mask = rng.random(shape) < frac
    x[mask] = rng.choice(pool, size=int(mask.sum()))
    return x


def tiny(rng, shape):
    """Values ~1e-20 whose products are subnormal (FTZ territory) or just above FLT_MIN."""
    return (rng.standard_normal(shape) * 1.5e-19).astype(np.float32)


# ------------------------------------------------------------------------------------------------
# 1. the reference itself (runs without the kernels)
# ------------------------------------------------------------------------------------------------

def ulp_err(got, ref64):
    got = np.asarray(got, np.float64)
    sp = np.spacing(np.abs(ref64).astype(np.float32)).astype(np.float64)
    return np.max(np.abs(got - ref64) / sp)


class TestReference:
    def test_ftz_helpers(self):
        sub_ = np.float32(1e-40)
        assert R.add(sub_, F32(0.0)).view(np.uint32) == 0
        assert R.mul(F32(-1e-40), F32(1.0)).view(np.uint32) == 0x80000000
        assert R.mul(F32(1e-20), F32(1e-20)) == 0          # subnormal product flushed
        assert R.mul(F32(-1e-20), F32(1e-20)).view(np.uint32) == 0x80000000
        assert R.sub(F32(1.0), F32(1.0)).view(np.uint32) == 0
        assert R.add(F32(FLT_MAX), F32(FLT_MAX)) == np.inf
        with pytest.raises(TypeError):
            R.add(np.float64(1.0), F32(1.0))

    def test_exp(self):
        x = np.random.default_rng(1).uniform(-87.3, 88.7, 100_000).astype(np.float32)
        assert ulp_err(R.exp(x), np.exp(x.astype(np.float64))) <= 2

    def test_log(self):
        x = np.exp(np.random.default_rng(2).uniform(-87, 88.7, 100_000)).astype(np.float32)
        assert ulp_err(R.log(x), np.log(x.astype(np.float64))) <= 2

    def test_recip(self):
        rng = np.random.default_rng(3)
        x = (np.exp(rng.uniform(-87, 87, 100_000)) * rng.choice([-1, 1], 100_000)).astype(np.float32)
        err = ulp_err(R.recip(x), 1.0 / x.astype(np.float64))
        assert err <= 2, (f"recip max error {err} ulp; recip(1.5) = {R.recip(F32(1.5))}, "
                          f"recip(1.25) = {R.recip(F32(1.25))}, recip(3.0) = {R.recip(F32(3.0))}")

    def test_rsqrt_sqrt(self):
        x = np.exp(np.random.default_rng(4).uniform(-87, 88, 100_000)).astype(np.float32)
        x64 = x.astype(np.float64)
        assert ulp_err(R.rsqrt(x), 1.0 / np.sqrt(x64)) <= 3
        assert ulp_err(R.sqrt(x), np.sqrt(x64)) <= 3

    def test_sin_cos(self):
        rng = np.random.default_rng(5)
        x = rng.uniform(-65536, 65536, 100_000).astype(np.float32)
        s, c = R._sincos(x)
        x64 = x.astype(np.float64)
        assert np.max(np.abs(s - np.sin(x64))) < 2e-7
        assert np.max(np.abs(c - np.cos(x64))) < 2e-7
        x = rng.uniform(-3.2, 3.2, 100_000).astype(np.float32)
        x = x[np.abs(np.sin(x.astype(np.float64))) > 1e-2]
        assert ulp_err(R.sin(x), np.sin(x.astype(np.float64))) <= 3

    def test_tanh_erf_gelu(self):
        x = np.random.default_rng(6).uniform(-6, 6, 100_000).astype(np.float32)
        x64 = x.astype(np.float64)
        assert ulp_err(R.tanh(x), np.tanh(x64)) <= 2
        assert ulp_err(R.erf(x), torch.erf(torch.from_numpy(x64)).numpy()) <= 2
        gelu64 = x64 * 0.5 * torch.erfc(torch.from_numpy(-x64 / math.sqrt(2))).numpy()
        assert np.max(np.abs(R.gelu(x) - gelu64)) < 5e-7

    def test_special_values(self):
        nan = np.nan
        v = lambda a: np.array(a, np.float32)
        np.testing.assert_array_equal(
            R.exp(v([0.0, -0.0, np.inf, -np.inf, 89.0, -88.0, 1e-40])), v([1, 1, np.inf, 0, np.inf, 0, 1]))
        assert np.isnan(R.exp(v([nan])))[0]
        np.testing.assert_array_equal(R.log(v([0.0, -0.0, 1e-40, np.inf, 1.0])),
                                      v([-np.inf, -np.inf, -np.inf, np.inf, 0.0]))
        assert R.log(v([-1.0])).view(np.uint32)[0] == 0x7FC00000
        assert list(R.recip(v([0.0, -0.0, np.inf, -np.inf, 1e-40])).view(np.uint32)) == \
            [0x7F800000, 0xFF800000, 0, 0x80000000, 0x7F800000]
        assert list(R.rsqrt(v([0.0, -0.0, np.inf]))) == [np.inf, np.inf, 0.0]
        assert abs(R.rsqrt(v([4.0]))[0] - 0.5) <= 2.0 ** -24
        assert list(R.sqrt(v([-0.0, np.inf])).view(np.uint32)) == [0x80000000, 0x7F800000]
        assert np.isnan(R.sqrt(v([-1.0])))[0]
        assert np.all(np.isnan(R.sin(v([65536.01, np.inf, nan, -70000]))))
        assert R.sin(v([-0.0]))[0] == 0 and R.cos(v([-0.0]))[0] == 1

    def test_csum_order_and_accuracy(self):
        rng = np.random.default_rng(6)
        for n in (0, 1, 31, 32, 33, 1000):
            x = rng.standard_normal((3, n)).astype(np.float32)
            ref = x.astype(np.float64).sum(-1)
            assert np.all(np.abs(R.csum(x) - ref) <= 1e-6 * max(n, 1) * np.abs(x).sum(-1) + 1e-30)
        assert R.csum(np.zeros((0,), np.float32)).view(np.uint32) == 0
        assert R.csum(np.array([-0.0, -0.0], np.float32)).view(np.uint32) == 0  # never -0.0
        # lane structure: t[0] and t[32] share lane 0, t[1] is lane 1
        x = np.zeros(33, np.float32)
        x[0], x[32], x[1] = 1.0, 2.0 ** -24, 2.0 ** -24
        # lane0 = 1 + 2^-24 = 1 (tie to even), lane1 = 2^-24; tree: 1 + 2^-24 = 1
        assert R.csum(x) == 1.0
        x[1] = 0.0
        x[16] = 2.0 ** -24  # lane 16 folds into lane 0 first: 1 + 2^-24 -> 1
        assert R.csum(x) == 1.0
        x = np.zeros(34, np.float32)
        x[0], x[32], x[33] = 1.0, 2.0 ** -24, 2.0 ** -24   # lane 1 = 2^-24; lane0 = 1
        x[1] = 2.0 ** -24                                  # lane 1 = 2^-23
        assert R.csum(x) == np.float32(1.0 + 2.0 ** -23)   # tree adds lane 1 (=2^-23) to lane 0

    def test_cmax(self):
        x = np.array([[-0.0, 0.0], [0.0, -0.0], [np.nan, 1.0], [-np.inf, -np.inf]], np.float32)
        m = R.cmax(x)
        assert list(m.view(np.uint32)[:2]) == [0x80000000, 0x00000000]  # first seen wins ties
        assert m[2] == 1.0 and m[3] == -np.inf
        assert R.cmax(np.zeros((2, 0), np.float32)).tolist() == [-np.inf, -np.inf]

    def test_matmul_accuracy(self):
        rng = np.random.default_rng(7)
        a = rng.standard_normal((2, 33, 129)).astype(np.float32)
        b = rng.standard_normal((129, 7)).astype(np.float32)
        c = R.matmul(a, b)
        ref = a.astype(np.float64) @ b
        bound = 129 * 2.0 ** -24 * (np.abs(a).astype(np.float64) @ np.abs(b))
        assert c.shape == (2, 33, 7) and np.all(np.abs(c - ref) <= bound)
        assert R.matmul(np.zeros((3, 0), np.float32), np.zeros((0, 2), np.float32)).tolist() == [[0, 0]] * 3

    def test_matmul_is_order_sensitive(self):
        """The bitwise comparison is sensitive: a pairwise-summed matmul differs somewhere."""
        rng = np.random.default_rng(8)
        a = rng.standard_normal((16, 64)).astype(np.float32)
        b = rng.standard_normal((64, 16)).astype(np.float32)
        prod = R.mul(a[:, :, None], b[None, :, :])  # [M, K, N]

        def pairwise(t):  # over axis 1
            while t.shape[1] > 1:
                t = R.add(t[:, 0::2], t[:, 1::2])
            return t[:, 0]
        alt = pairwise(prod)
        with pytest.raises(AssertionError):
            assert_bits(alt, R.matmul(a, b), "pairwise matmul")
        with pytest.raises(AssertionError):  # csum is not a sequential sum either
            x = rng.standard_normal((64, 100)).astype(np.float32)
            seq = np.zeros(64, np.float32)
            for i in range(100):
                seq = R.add(seq, x[:, i])
            assert_bits(seq, R.csum(x), "sequential csum")

    def test_philox_known_answers(self):
        # Random123 kat_vectors, philox4x32 10 rounds
        kat = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
               ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
               ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
                (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
        for ctr, key, want in kat:
            got = R.philox4x32_10(*ctr, *key)
            assert tuple(int(w) for w in got) == want

    def test_random_distributions(self):
        u = R.uniform(123, 4, 5, R.PURPOSE_INIT, 40_000)
        assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
        z = R.normal(123, 4, 5, R.PURPOSE_INIT, 40_001)
        assert z.shape == (40_001,) and abs(z.mean()) < 0.02 and abs(z.std() - 1) < 0.02
        x = np.ones(100_000, np.float32)
        y = R.dropout(x, 0.25, 9, 1, 2)
        assert abs((y == 0).mean() - 0.25) < 0.01 and set(np.unique(y)) == {0.0, np.float32(1 / 0.75)}

    def test_ops_vs_float64(self):
        rng = np.random.default_rng(9)
        x = rng.standard_normal((7, 33)).astype(np.float32)
        w = rng.standard_normal(33).astype(np.float32)
        y, rstd = R.rmsnorm(x, w, 1e-5)
        x64 = x.astype(np.float64)
        r64 = 1 / np.sqrt((x64 ** 2).mean(-1) + 1e-5)
        np.testing.assert_allclose(rstd, r64, rtol=1e-5)
        np.testing.assert_allclose(y, x64 * r64[:, None] * w, rtol=1e-5, atol=1e-6)
        s = rng.standard_normal((2, 9, 9)).astype(np.float32)
        P = R.causal_softmax(s, 0.5)
        z = np.where(np.tril(np.ones((9, 9), bool)), s.astype(np.float64) * 0.5, -np.inf)
        P64 = np.exp(z - z.max(-1, keepdims=True))
        P64 /= P64.sum(-1, keepdims=True)
        np.testing.assert_allclose(P, P64, rtol=1e-5, atol=1e-7)
        zz = rng.standard_normal((5, 40)).astype(np.float32) * 3
        t = rng.integers(0, 40, 5)
        loss, lse = R.cross_entropy(zz, t, 1e-3)
        lse64 = np.log(np.exp(zz.astype(np.float64)).sum(-1))
        np.testing.assert_allclose(lse, lse64, rtol=1e-6)
        np.testing.assert_allclose(loss, np.mean(lse64 - zz[np.arange(5), t] + 1e-3 * lse64 ** 2), rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# 2. bit-for-bit: kernels vs reference
# ------------------------------------------------------------------------------------------------

def test_canary(ops):
    c = N(ops.canary())
    assert c.shape == (2,) and c[0] == 0 and c[1] == 0


def test_caller_fp_mode_restored(ops):
    """The kernels' FTZ/DAZ guard must not leak into the calling thread (§3)."""
    ops.matmul(torch.ones(64, 64), torch.ones(64, 64))
    ops.exp(torch.ones(10_000))
    assert np.float32(1e-30) * np.float32(1e-10) != 0           # NumPy still has subnormals
    assert (torch.tensor([1e-30]) * 1e-10).item() != 0          # so does torch
    assert float(np.float32(1e-40)) != 0


ELEMENTWISE = ["exp", "log", "recip", "rsqrt", "sqrt", "sin", "cos", "tanh", "erf", "sigmoid", "gelu", "gelu_tanh",
               "gelu_grad", "gelu_tanh_grad"]
DOMAIN = {"exp": (-90, 90), "log": (0, 100), "recip": (-4, 4), "rsqrt": (0, 8), "sqrt": (0, 8),
          "sin": (-70000, 70000), "cos": (-70000, 70000), "tanh": (-12, 12), "erf": (-5, 5), "sigmoid": (-90, 90),
          "gelu": (-8, 8), "gelu_tanh": (-8, 8), "gelu_grad": (-8, 8), "gelu_tanh_grad": (-8, 8)}


def _elementwise_inputs(name, seed):
    rng = np.random.default_rng(seed)
    lo, hi = DOMAIN[name]
    parts = [rbits(rng, 20_000), rng.uniform(lo, hi, 20_000).astype(np.float32), SPECIALS,
             np.exp(rng.uniform(-88, 88, 5000)).astype(np.float32)]
    # neighbourhoods of thresholds and exact points
    # (tanh's branch points 0.75 and 10, erf's 0.875 and 3.92, their images under the GELU forms'
    # x * f32(1/sqrt 2), and 2^64, where x * x overflows)
    for c in (88.72283935546875, -87.33654022216797, 1.0, 1.41421356, 65536.0, 0.0, FLT_MIN,
              2.0, 1.5, 3.0, math.pi / 2, math.pi, 0.75, 10.0, 0.875, 3.92, 0.875 * math.sqrt(2),
              3.92 * math.sqrt(2), 2.0**64):
        c = np.float32(c)
        for d in (-np.inf, np.inf):
            parts.append(np.nextafter(c, np.float32(d)))
        parts += [c, -c]
    parts.append(np.arange(-64, 64, dtype=np.float32) * np.float32(math.pi / 4))
    return np.concatenate([np.ravel(p).astype(np.float32) for p in parts])


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise_bits(ops, name):
    x = _elementwise_inputs(name, seed=zlib.crc32(name.encode()))
    got = getattr(ops, name)(T(x))
    exp = getattr(R, name)(x)
    assert_bits(got, exp, name, inputs=lambda i: hexf(x[i]))
    # 2-D / odd shape
    x2 = x[:7 * 129].reshape(7, 129)
    assert_bits(getattr(ops, name)(T(x2)), getattr(R, name)(x2), name + " 2-D")


@pytest.mark.parametrize("op", ["add", "mul"])
def test_binary_bits(ops, op):
    rng = np.random.default_rng(10)
    a, b = rbits(rng, 30_000), rbits(rng, 30_000)
    a2, b2 = adversarial(rng, (7, 33)), adversarial(rng, (7, 33))
    t1, t2 = tiny(rng, 20_000), tiny(rng, 20_000)
    for x, y in ((a, b), (a2, b2), (t1, t2), (t1 * F32(1e19), t2)):
        got = getattr(ops, op)(T(x), T(y))
        exp = getattr(R, op)(x, y) if op == "add" else R.mul(x, y)
        assert_bits(got, exp, op, inputs=lambda i: (hexf(x[i]), hexf(y[i])))


def test_scale_bits(ops):
    rng = np.random.default_rng(11)
    for x in (rbits(rng, 10_000), adversarial(rng, (33, 7)), tiny(rng, 1000)):
        for s in (0.1, -3.0, 1.0, 0.0, 1e-20, 1e30, 1.0 / 3.0):
            assert_bits(ops.scale(T(x), s), R.scale_op(x, s), f"scale {s}")


@pytest.mark.parametrize("n", [0, 1, 7, 31, 32, 33, 129, 1000])
def test_csum_bits(ops, n):
    rng = np.random.default_rng(n)
    for x in (rng.standard_normal((3, n)).astype(np.float32), adversarial(rng, (5, n)),
              (rng.standard_normal((2, 3, n)) * 1e30).astype(np.float32), tiny(rng, (3, n)) ** 2,
              rng.choice(np.array([-0.0, 0.0, 1e-40, -1e-40], np.float32), (4, n))):
        assert_bits(ops.csum(T(x)), R.csum(x), f"csum n={n}")
    x = rng.standard_normal(n).astype(np.float32)
    assert_bits(ops.csum(T(x)), R.csum(x), "csum 1-D")


def unpadded_csum_rows():
    """[(what, terms, expected bits)]: canonical sums (contract §4.2) whose bits show whether a
    partial block of 32 is padded. 64 terms first leave every lane at -0.0 (1.25 * 2^-126 then
    -1.5 * 2^-126: the exact -2^-128 flushes to -0.0), then a partial block of r terms, all -0.0:
    lanes 0..r-1 add -0.0 and stay -0.0, lanes r..31 get no term, so the sum is -0.0; padding the
    block with +0.0 would turn lanes r..31 to +0.0 (-0.0 + +0.0) and the sum to +0.0. A lone
    partial block of -0.0 terms sums to +0.0: the lanes start at +0.0, and +0.0 + -0.0 = +0.0
    (lanes started at -0.0, or loaded with the first terms and padded with -0.0, give -0.0)."""
    lanes_negative_zero = np.concatenate([np.full(32, 1.25 * 2.0**-126), np.full(32, -1.5 * 2.0**-126)])
    rows = [(f"64 terms to -0.0 lanes, then {r} -0.0 terms",
             np.concatenate([lanes_negative_zero, np.full(r, -0.0)]).astype(np.float32), 0x80000000)
            for r in (1, 5, 31)]
    rows += [(f"{n} -0.0 terms", np.full(n, -0.0, np.float32), 0x00000000) for n in (1, 7, 31, 33)]
    return rows


def test_csum_partial_block_is_not_padded(ops):
    """The reference and the CPU kernel sum only the real terms of a partial block (the cases of
    unpadded_csum_rows, one row each and as rows of one tensor); a sum padded with +0.0 gives
    other bits there."""
    cases = unpadded_csum_rows()
    for what, t, want in cases:
        assert int(R.bits(R.csum(t))) == want, what
        if t.size > 64:
            padded = np.concatenate([t, np.zeros(-t.size % 32, np.float32)])
            assert int(R.bits(R.csum(padded))) == 0, what          # padded: another sum
        assert int(R.bits(N(ops.csum(T(t))))) == want, f"CPU kernel: {what}"
        assert_bits(ops.csum(T(np.stack([t, -t]))), R.csum(np.stack([t, -t])), f"rows: {what}")


SIZES = [1, 7, 33, 129]


@pytest.mark.parametrize("M", SIZES)
@pytest.mark.parametrize("N_", SIZES)
@pytest.mark.parametrize("K", SIZES)
def test_matmul_bits(ops, M, N_, K):
    rng = np.random.default_rng(M * 10000 + N_ * 100 + K)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N_)).astype(np.float32)
    assert_bits(ops.matmul(T(a), T(b)), R.matmul(a, b), f"matmul {M}x{K}x{N_}")


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("MNK", [(7, 33, 129), (33, 1, 7), (129, 33, 33), (1, 7, 1), (40, 70, 600)])
def test_matmul_strided_bits(ops, ta, tb, MNK):
    M, N_, K = MNK
    rng = np.random.default_rng(M + N_ + K + 2 * ta + tb)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N_)).astype(np.float32)
    at = T(a.T.copy()).t() if ta else T(a)
    bt = T(b.T.copy()).t() if tb else T(b)
    assert_bits(ops.matmul(at, bt), R.matmul(a, b), f"matmul ta={ta} tb={tb} {MNK}")
    # sliced (step-2) views
    a2 = rng.standard_normal((2 * M, 2 * K)).astype(np.float32)
    ta2 = T(a2)[::2, ::2]
    assert_bits(ops.matmul(ta2, bt), R.matmul(a2[::2, ::2], b), "matmul sliced a")


# attention's six products (model.py, repops._MatMul's backward) in the step's three operand
# layouts: q, k, v, gO [2, T, 32] and P, gS [2, T, T] contiguous. T = 128 ends the 512-bit tile's
# rows with an 8-row edge tile; N = 32 is one column panel, where A with rows contiguous in k is read
# in place (matmul.cpp, kRows); at T = 512 those rows are 2 KB apart, and A is packed.
ATTENTION = {"q@k.T gO@v.T": ("q", "k.T"), "P@v gS@k": ("P", "v"), "P.T@gO gS.T@q": ("P.T", "v")}


@pytest.mark.parametrize("products", list(ATTENTION))
@pytest.mark.parametrize("Tn", [20, 128, 512])
def test_matmul_attention_bits(ops, products, Tn):
    rng = np.random.default_rng(zlib.crc32(f"{products} {Tn}".encode()))
    heads = rng.standard_normal((2, Tn, 32)).astype(F32)           # q, k, v or gO
    scores = rng.standard_normal((2, Tn, Tn)).astype(F32)          # P or gS
    views = {"q": (T(heads), heads), "k.T": (T(heads).transpose(1, 2), np.swapaxes(heads, 1, 2)),
             "v": (T(heads), heads), "P": (T(scores), scores),
             "P.T": (T(scores).transpose(1, 2), np.swapaxes(scores, 1, 2))}
    (ta, a), (tb, b) = (views[name] for name in ATTENTION[products])
    assert_bits(ops.matmul(ta, tb), R.matmul(np.ascontiguousarray(a), np.ascontiguousarray(b)),
                f"attention {products} T={Tn}")


@pytest.mark.parametrize("case", ["3d3d", "3d2d", "3d3d_t", "3d2d_t", "k0", "adv", "tiny", "huge"])
def test_matmul_special_bits(ops, case):
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    if case == "3d3d":
        a, b = rng.standard_normal((3, 7, 33)), rng.standard_normal((3, 33, 129))
        ta, tb = T(a.astype(F32)), T(b.astype(F32))
    elif case == "3d2d":
        a, b = rng.standard_normal((2, 33, 129)), rng.standard_normal((129, 7))
        ta, tb = T(a.astype(F32)), T(b.astype(F32))
    elif case == "3d3d_t":
        a, b = rng.standard_normal((3, 7, 33)), rng.standard_normal((3, 33, 129))
        ta = T(np.swapaxes(a, 1, 2).astype(F32)).transpose(1, 2)
        tb = T(np.swapaxes(b, 1, 2).astype(F32)).transpose(1, 2)
    elif case == "3d2d_t":
        a, b = rng.standard_normal((2, 33, 129)), rng.standard_normal((129, 7))
        ta = T(np.swapaxes(a, 1, 2).astype(F32)).transpose(1, 2)
        tb = T(b.T.astype(F32)).t()
    elif case == "k0":
        a, b = np.zeros((7, 0)), np.zeros((0, 33))
        ta, tb = T(a.astype(F32)), T(b.astype(F32))
    elif case == "adv":
        a, b = adversarial(rng, (33, 129)), adversarial(rng, (129, 7), frac=0.05)
        ta, tb = T(a), T(b)
    elif case == "tiny":
        a, b = tiny(rng, (33, 129)), tiny(rng, (129, 33))
        ta, tb = T(a), T(b)
    else:
        a, b = (rng.standard_normal((7, 129)) * 1e19), (rng.standard_normal((129, 33)) * 1e19)
        ta, tb = T(a.astype(F32)), T(b.astype(F32))
    a, b = a.astype(F32), b.astype(F32)
    assert_bits(ops.matmul(ta, tb), R.matmul(a, b), f"matmul {case}")


RD = [(1, 1), (7, 33), (33, 7), (3, 129), (1, 1000)]


def _rms_inputs(rng, R_, D, kind):
    if kind == "normal":
        x = rng.standard_normal((R_, D)).astype(np.float32)
    elif kind == "adv":
        x = adversarial(rng, (R_, D), frac=0.1)
    elif kind == "zero_rows":
        x = rng.choice(np.array([0.0, -0.0, 1e-40, -1e-40], np.float32), (R_, D))
    elif kind == "huge":
        x = (rng.standard_normal((R_, D)) * 1e20).astype(np.float32)
    else:  # tiny
        x = tiny(rng, (R_, D))
    w = adversarial(rng, (D,), frac=0.1, nonfinite=False) if kind == "adv" else \
        rng.standard_normal(D).astype(np.float32)
    gy = adversarial(rng, (R_, D), frac=0.1) if kind == "adv" else \
        rng.standard_normal((R_, D)).astype(np.float32)
    return x, w, gy


@pytest.mark.parametrize("RDs", RD)
@pytest.mark.parametrize("kind", ["normal", "adv", "zero_rows", "huge", "tiny"])
@pytest.mark.parametrize("eps", [1e-5, 1e-6, 0.0])
def test_rmsnorm_bits(ops, RDs, kind, eps):
    R_, D = RDs
    rng = np.random.default_rng(R_ * 1000 + D)
    x, w, gy = _rms_inputs(rng, R_, D, kind)
    y, rstd = ops.rmsnorm(T(x), T(w), eps)
    ey, erstd = R.rmsnorm(x, w, eps)
    assert_bits(rstd, erstd, "rmsnorm rstd")
    assert_bits(y, ey, "rmsnorm y")
    gx, gw = ops.rmsnorm_backward(T(gy), T(x), T(w), T(erstd))
    egx, egw = R.rmsnorm_backward(gy, x, w, erstd)
    assert_bits(gx, egx, "rmsnorm gx")
    assert_bits(gw, egw, "rmsnorm gw")


@pytest.mark.parametrize("Tn,Dh,theta", [(1, 2, 10000.0), (7, 8, 10000.0), (129, 64, 10000.0),
                                         (2048, 128, 500000.0), (33, 6, 1e6), (70000, 4, 10.0)])
def test_rope_tables_bits(ops, Tn, Dh, theta):
    c, s = ops.rope_tables(Tn, Dh, theta)
    ec, es = R.rope_tables(Tn, Dh, theta)
    assert_bits(c, ec, "rope cos")
    assert_bits(s, es, "rope sin")


@pytest.mark.parametrize("shape", [(1, 1, 1, 2), (2, 7, 3, 8), (1, 33, 2, 64), (3, 5, 1, 6)])
@pytest.mark.parametrize("kind", ["normal", "adv"])
def test_rope_bits(ops, shape, kind):
    rng = np.random.default_rng(sum(shape))
    B, Tn, H, Dh = shape
    x = rng.standard_normal(shape).astype(np.float32) if kind == "normal" else adversarial(rng, shape)
    c, s = R.rope_tables(Tn, Dh, 10000.0)
    if kind == "adv":  # adversarial tables too
        c = adversarial(rng, c.shape, frac=0.2)
        s = adversarial(rng, s.shape, frac=0.2)
    exp, exp_bw = R.rope(x, c, s), R.rope(x, c, s, backward=True)
    # the forward moves the heads first ([B, T, H, Dh] -> [B, H, T, Dh]), the backward back
    got = ops.rope(T(x), T(c), T(s), False)
    assert got.shape == (B, H, Tn, Dh) and got.is_contiguous()
    assert_bits(got.transpose(1, 2), exp, "rope")
    got = ops.rope(T(x).transpose(1, 2).contiguous(), T(c), T(s), True)
    assert got.shape == shape and got.is_contiguous()
    assert_bits(got, exp_bw, "rope backward")
    # strided operands, read in place: x as the middle columns of a qkv-like tensor [B, T, 3H, Dh]
    # (the q or k of the split), g as the transposed view of a token-major tensor
    wide = np.concatenate([rng.standard_normal(shape).astype(np.float32), x, x[:, :, ::-1]], axis=2)
    got = ops.rope(T(wide)[:, :, H:2 * H], T(c), T(s), False)
    assert_bits(got.transpose(1, 2), exp, "rope of a column slice")
    got = ops.rope(T(x).transpose(1, 2), T(c), T(s), True)
    assert_bits(got, exp_bw, "rope backward of a transposed view")
    # longer tables than T positions: rows t < T are read
    c2, s2 = np.concatenate([c, c[::-1] + 1]), np.concatenate([s, s[::-1] - 1])
    assert_bits(ops.rope(T(x), T(c2), T(s2), False).transpose(1, 2), exp, "rope with longer tables")


@pytest.mark.parametrize("BH,Tn", [(1, 1), (2, 7), (3, 33), (1, 129)])
@pytest.mark.parametrize("kind", ["normal", "adv", "large", "masked_garbage"])
def test_causal_softmax_bits(ops, BH, Tn, kind):
    rng = np.random.default_rng(BH * 1000 + Tn)
    shape = (BH, Tn, Tn)
    if kind == "normal":
        s = (rng.standard_normal(shape) * 3).astype(np.float32)
    elif kind == "adv":
        s = adversarial(rng, shape, frac=0.15)
    elif kind == "large":
        s = (rng.standard_normal(shape) * 1e3).astype(np.float32)
    else:  # NaN/inf above the diagonal must not leak into the result
        s = rng.standard_normal(shape).astype(np.float32)
        up = np.triu(np.ones((Tn, Tn), bool), 1)
        s[:, up] = rng.choice(np.array([np.nan, np.inf, -np.inf, 1e38], np.float32), (BH, int(up.sum())))
    gp = adversarial(rng, shape, frac=0.1) if kind == "adv" else rng.standard_normal(shape).astype(np.float32)
    if kind == "masked_garbage":
        gp[:, np.triu(np.ones((Tn, Tn), bool), 1)] = np.nan
    for scale in (0.125, 1.0 / math.sqrt(40.0)):
        P = ops.causal_softmax(T(s), scale)
        eP = R.causal_softmax(s, scale)
        assert_bits(P, eP, f"causal_softmax {kind} scale={scale}")
        gs = ops.causal_softmax_backward(T(gp), T(eP), scale)
        assert_bits(gs, R.causal_softmax_backward(gp, eP, scale), f"causal_softmax_backward {kind}")


def reference_attention(q, k, v, go, scale):
    """§8 attention composed in NumPy (matmul, causal_softmax over each slice's G blocks, matmul)
    and its backward: q, go [batch, G*T, D], k, v [batch, T, D] -> o, p, gq, gk, gv."""
    batch, M, D = q.shape
    Tn = k.shape[1]
    G = M // Tn
    kt, vt = np.swapaxes(k, 1, 2), np.swapaxes(v, 1, 2)
    p = R.causal_softmax(R.matmul(q, kt).reshape(batch * G, Tn, Tn), scale).reshape(batch, M, Tn)
    gs = R.causal_softmax_backward(R.matmul(go, vt).reshape(batch * G, Tn, Tn), p.reshape(batch * G, Tn, Tn),
                                   scale).reshape(batch, M, Tn)
    return (R.matmul(p, v), p, R.matmul(gs, k), R.matmul(np.swapaxes(gs, 1, 2), q),
            R.matmul(np.swapaxes(p, 1, 2), go))


@pytest.mark.parametrize("batch,G,Tn,D", [(1, 1, 1, 8), (2, 1, 20, 32), (3, 2, 5, 16), (2, 4, 33, 8),
                                          (2, 1, 128, 32), (1, 2, 97, 16)])
@pytest.mark.parametrize("kind", ["normal", "adv"])
@pytest.mark.parametrize("threads", [1, 2])
def test_causal_attention_bits(ops, batch, G, Tn, D, kind, threads):
    """The CPU's head-by-head attention (forward and backward) gives the composed ops' bits."""
    rng = np.random.default_rng(zlib.crc32(f"{batch} {G} {Tn} {D} {kind}".encode()))
    make = (lambda shape: adversarial(rng, shape, frac=0.05)) if kind == "adv" else \
        (lambda shape: rng.standard_normal(shape).astype(F32))
    q, go = make((batch, G * Tn, D)), make((batch, G * Tn, D))
    k, v = make((batch, Tn, D)), make((batch, Tn, D))
    scale = repops.f32(1.0 / math.sqrt(D))
    o, p, gq, gk, gv = reference_attention(q, k, v, go, scale)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        to, tp = ops.causal_attention(T(q), T(k), T(v), scale)
        # go as the step hands it: a non-contiguous view is read as its values
        tgo = T(np.swapaxes(go, 1, 2)).transpose(1, 2)
        tgq, tgk, tgv = ops.causal_attention_backward(tgo, T(q), T(k), T(v), tp, scale)
    finally:
        torch.set_num_threads(previous)
    what = f"causal_attention batch={batch} G={G} T={Tn} D={D} {kind} threads={threads}"
    for name, got, exp in (("o", to, o), ("p", tp, p), ("gq", tgq, gq), ("gk", tgk, gk), ("gv", tgv, gv)):
        assert_bits(got, exp, f"{what}: {name}")


def test_causal_attention_refuses_bad_shapes(ops):
    q, k = torch.zeros(2, 10, 8), torch.zeros(2, 4, 8)
    with pytest.raises(RuntimeError, match=r"q \[batch, G\*T, D\], k and v \[batch, T, D\]"):
        ops.causal_attention(q, k, k, 0.5)          # 10 rows are not G * 4
    with pytest.raises(RuntimeError, match="go like q"):
        ops.causal_attention_backward(torch.zeros(2, 8, 8), torch.zeros(2, 8, 8), k, k, torch.zeros(2, 8, 3), 0.5)


@pytest.mark.parametrize("Rn,H", [(1, 1), (7, 33), (33, 129), (2, 7)])
@pytest.mark.parametrize("kind", ["normal", "adv", "wide"])
def test_swiglu_bits(ops, Rn, H, kind):
    rng = np.random.default_rng(Rn * 1000 + H)
    shape = (Rn, 2 * H)
    if kind == "normal":
        u = rng.standard_normal(shape).astype(np.float32)
    elif kind == "adv":
        u = adversarial(rng, shape)
    else:
        u = (rng.standard_normal(shape) * 60).astype(np.float32)
    g = adversarial(rng, (Rn, H), frac=0.1) if kind == "adv" else rng.standard_normal((Rn, H)).astype(np.float32)
    assert_bits(ops.swiglu(T(u)), R.swiglu(u), f"swiglu {kind}")
    assert_bits(ops.swiglu_backward(T(g), T(u)), R.swiglu_backward(g, u), f"swiglu_backward {kind}")


@pytest.mark.parametrize("Rn,V", [(1, 1), (7, 33), (33, 129), (3, 1000), (1, 7)])
@pytest.mark.parametrize("kind", ["normal", "adv", "large"])
@pytest.mark.parametrize("zloss", [0.0, 1e-4])
def test_cross_entropy_bits(ops, Rn, V, kind, zloss):
    rng = np.random.default_rng(Rn * 10000 + V)
    if kind == "normal":
        z = (rng.standard_normal((Rn, V)) * 2).astype(np.float32)
    elif kind == "adv":
        z = adversarial(rng, (Rn, V), frac=0.1)
    else:
        z = (rng.standard_normal((Rn, V)) * 1e4).astype(np.float32)
    t = rng.integers(0, V, Rn).astype(np.int64)
    loss, lse = ops.cross_entropy(T(z), torch.from_numpy(t), zloss)
    eloss, else_ = R.cross_entropy(z, t, zloss)
    assert_bits(lse, else_, f"cross_entropy lse {kind}")
    assert_bits(loss, eloss, f"cross_entropy loss {kind}")
    for g in (1.0, 0.37):
        gz = ops.cross_entropy_backward(torch.tensor(g, dtype=torch.float32), T(z), torch.from_numpy(t),
                                        T(else_), zloss)
        assert_bits(gz, R.cross_entropy_backward(F32(g), z, t, else_, zloss), f"cross_entropy_backward {kind}")


@pytest.mark.parametrize("V,D,Nn", [(1, 1, 1), (7, 33, 129), (33, 7, 7), (129, 1, 1000)])
def test_embedding_bits(ops, V, D, Nn):
    rng = np.random.default_rng(V + D + Nn)
    w = adversarial(rng, (V, D))
    idx = rng.integers(0, V, Nn).astype(np.int64)
    assert_bits(ops.embedding(T(w), torch.from_numpy(idx)), R.embedding(w, idx), "embedding")
    for g in (rng.standard_normal((Nn, D)).astype(np.float32), adversarial(rng, (Nn, D)),
              rng.choice(np.array([-0.0, 1e-40, -1e-40, 1.0, 2.0 ** -24], np.float32), (Nn, D))):
        for rows in (V, V + 3):
            got = ops.embedding_backward(T(g), torch.from_numpy(idx), rows)
            assert_bits(got, R.embedding_backward(g, idx, rows), f"embedding_backward rows={rows}")


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 1.0 / 3.0])
@pytest.mark.parametrize("shape", [(1,), (7, 33), (3, 5, 129)])
def test_dropout_bits(ops, p, shape):
    rng = np.random.default_rng(len(shape))
    x = adversarial(rng, shape)
    for seed, c1, c2 in ((0, 0, 0), (1234, 5, 6), (2 ** 64 - 1, 2 ** 32 - 1, 7), (2 ** 63 + 5, 1, 2 ** 31)):
        sd = seed - 2 ** 64 if seed >= 2 ** 63 else seed
        got = ops.dropout(T(x), p, sd, c1, c2)
        assert_bits(got, R.dropout(x, p, seed, c1, c2), f"dropout p={p} seed={seed}")


@pytest.mark.parametrize("seed", [0, 1, 0xDEADBEEFCAFEF00D, 2 ** 64 - 1])
@pytest.mark.parametrize("purpose", [1, 2, 3, 4])
def test_philox_words(ops, seed, purpose):
    sd = seed - 2 ** 64 if seed >= 2 ** 63 else seed
    for n, off, c1, c2 in ((1, 0, 0, 0), (7, 3, 1, 2), (129, 2 ** 32 - 1, 2 ** 32 - 1, 5), (1000, 17, 9, 2 ** 31)):
        got = N(ops.philox(sd, c1, c2, purpose, n, off))
        assert got.dtype == np.int64 and got.shape == (n,)
        exp = R.philox_words(seed, c1, c2, purpose, n, off)
        np.testing.assert_array_equal(got, exp.astype(np.int64), f"philox n={n} off={off}")


def test_philox_kat_through_kernel(ops):
    # counter (0,0,0,0) key (0,0) and the all-ones vector of Random123
    got = N(ops.philox(0, 0, 0, 0, 4, 0))
    assert [int(v) for v in got] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    got = N(ops.philox(-1, 2 ** 32 - 1, 2 ** 32 - 1, 2 ** 32 - 1, 4, 2 ** 32 - 1))
    assert [int(v) for v in got] == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


def test_purpose_tags_match_ids_h(rp):
    """The Philox purpose tags Python passes (repops.PURPOSE_*, and the reference's) are the
    numbers the C++ and CUDA kernels use (RpPurpose in kernels/common/ids.h)."""
    with open(os.path.join(rp.COMMON_DIR, "ids.h")) as f:
        tags = {name.upper(): int(v) for name, v in re.findall(r"kPurpose(\w+) = (\d+)", f.read())}
    assert set(tags) == {"INIT", "DROPOUT", "DATA", "SAMPLE"}, tags
    for name, value in tags.items():
        assert getattr(rp, "PURPOSE_" + name) == getattr(R, "PURPOSE_" + name) == value, name


@pytest.mark.parametrize("n", [1, 3, 4, 7, 129, 10_000])
def test_uniform_normal_bits(ops, n):
    for seed, c1, c2, purpose in ((0, 0, 0, 1), (99, 3, 4, 4), (2 ** 63 + 1, 2 ** 32 - 1, 1, 3)):
        sd = seed - 2 ** 64 if seed >= 2 ** 63 else seed
        assert_bits(ops.uniform(sd, c1, c2, purpose, n), R.uniform(seed, c1, c2, purpose, n), "uniform")
        assert_bits(ops.normal(sd, c1, c2, purpose, n), R.normal(seed, c1, c2, purpose, n), "normal")


@pytest.mark.parametrize("P", [1, 7, 33, 1000])
@pytest.mark.parametrize("kind", ["normal", "adv", "tiny_g"])
@pytest.mark.parametrize("t", [1, 10])
def test_adamw_bits(ops, P, kind, t):
    rng = np.random.default_rng(P + t)
    p = rng.standard_normal(P).astype(np.float32)
    m = (rng.standard_normal(P) * 0.1).astype(np.float32)
    v = np.abs(rng.standard_normal(P) * 0.01).astype(np.float32)
    if kind == "normal":
        g = rng.standard_normal(P).astype(np.float32)
    elif kind == "adv":
        g = adversarial(rng, (P,), nonfinite=False)
    else:
        g = tiny(rng, P)
        v[: P // 2] = 0
        m[: P // 2] = rng.choice(np.array([0.0, -0.0, 1e-40], np.float32), P // 2)
    for lr, b1, b2, eps, wd in ((1e-3, 0.9, 0.95, 1e-8, 0.1), (3e-4, 0.9, 0.999, 1e-6, 0.0),
                                (0.1, 0.8, 0.99, 1e-3, 0.3)):
        hs = R.adamw_host_scalars(lr, b1, b2, eps, wd, t)
        tp, tm, tv = T(p), T(m), T(v)
        ops.adamw_(tp, T(g), tm, tv, hs["lr"], hs["b1"], hs["b2"], hs["omb1"], hs["omb2"], hs["eps"],
                   hs["decay"], hs["bc1"], hs["bc2"])
        ep, em, ev = R.adamw_(p, g, m, v, **hs)
        assert_bits(tm, em, "adamw m")
        assert_bits(tv, ev, "adamw v")
        assert_bits(tp, ep, "adamw p")
        # the repops wrapper computes the host scalars itself (contract §1/§8)
        rp = repops
        tp, tm, tv = T(p), T(m), T(v)
        rp.adamw_(tp, T(g), tm, tv, lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd, step=t)
        assert_bits(tm, em, "repops.adamw_ m")
        assert_bits(tv, ev, "repops.adamw_ v")
        assert_bits(tp, ep, "repops.adamw_ p")


@pytest.mark.parametrize("P", [1, 7, 33, 129, 5000])
@pytest.mark.parametrize("kind", ["small", "large", "adv", "subnormal"])
def test_clip_grad_bits(ops, P, kind):
    rng = np.random.default_rng(P)
    g = rng.standard_normal(P).astype(np.float32)
    if kind == "small":
        g *= F32(1e-3)
    elif kind == "large":
        g *= F32(1e3)
    elif kind == "adv":
        g = adversarial(rng, (P,), frac=0.05)
    else:  # norm below max_norm (c == 1.0) yet subnormal entries must still be flushed
        g *= F32(1e-3)
        g[::3] = np.float32(1e-40)
        g[1::5] = np.float32(-1e-41)
    for max_norm in (1.0, 0.5, 1e30):
        gc, norm = ops.clip_grad(T(g), max_norm)
        egc, enorm = R.clip_grad(g, max_norm)
        assert_bits(norm, enorm, f"clip_grad norm {kind}")
        assert_bits(gc, egc, f"clip_grad g {kind} max_norm={max_norm}")


L = R.FLAT_CHUNK  # §4.5's chunk length


@pytest.mark.parametrize("n", [0, 1, 31, 32, 33, L - 1, L, L + 1, 2 * L + 77, 3 * L])
def test_clip_grad_chunked_sum(ops, n):
    """§4.5: the norm's sum of squares is the chunked sum. CPU = reference bit for bit at lengths
    around the lanes and the chunks (a short last chunk), and within 1e-5 of float64."""
    rng = np.random.default_rng(n + 3)
    g = (rng.standard_normal(n) * np.exp2(rng.integers(-6, 6, n))).astype(np.float32)
    for max_norm in (0.5, 1e30):
        gc, norm = ops.clip_grad(T(g), max_norm)
        egc, enorm = R.clip_grad(g, max_norm)
        assert_bits(norm, enorm, f"clip_grad norm n={n}")
        assert_bits(gc, egc, f"clip_grad g n={n} max_norm={max_norm}")
    exact = math.sqrt(float(np.sum(g.astype(np.float64) ** 2)))
    assert abs(float(norm) - exact) <= 1e-5 * exact, (float(norm), exact)


def test_chunked_sum_is_not_the_flat_sum():
    """The two definitions differ on long vectors (so the tests above can tell them apart)."""
    differ = 0
    for seed in range(8):
        rng = np.random.default_rng(seed)
        g = (rng.standard_normal(2 * L + 77) * np.exp2(rng.integers(-6, 6, 2 * L + 77))).astype(np.float32)
        sq = R.mul(g, g)
        differ += int(R.bits(R.csum_chunked(sq))) != int(R.bits(R.csum(sq)))
    assert differ >= 2, differ


def test_chunked_sum_ftz_last_chunk_flushes_to_minus_zero(ops):
    """§4.5 under FTZ: a last chunk of 64 terms where every lane adds 1.25 * 2^-126, then
    -1.5 * 2^-126 (exact sum -2^-128, subnormal) flushes to -0.0 in all 32 lanes, so the chunk's
    sum is -0.0; padded with +0.0 terms to L it would be +0.0 (hence: never padded). The chunked
    sum composed from the CPU's canonical row sums ([C-1, L] rows, the last chunk, the chunk sums)
    equals the reference's bit for bit. (clip_grad's terms are squares, >= +0.0, so its chunk
    sums are never -0.0; this checks the definition itself.)"""
    head = np.random.default_rng(2).standard_normal(L).astype(np.float32)
    tail = np.concatenate([np.full(32, 1.25 * 2.0**-126), np.full(32, -1.5 * 2.0**-126)]).astype(np.float32)
    t = np.concatenate([head, tail])
    last = ops.csum(T(tail))
    assert int(R.bits(last.numpy())) == int(R.bits(R.csum(tail))) == 0x80000000
    padded = np.concatenate([tail, np.zeros(L - tail.size, np.float32)])
    assert int(R.bits(R.csum(padded))) == 0
    sums = torch.cat([ops.csum(T(head).view(1, L)), last.reshape(1)])
    assert_bits(ops.csum(sums), R.csum_chunked(t), "chunked sum from the CPU's row sums")


# ------------------------------------------------------------------------------------------------
# 2b. bit-for-bit through the autograd wrappers (forward and gradients)
# ------------------------------------------------------------------------------------------------

def _run(fn, xs, gouts):
    xs = [T(x).requires_grad_(True) if x.dtype == np.float32 else torch.from_numpy(x) for x in xs]
    out = fn(*xs)
    outs = out if isinstance(out, tuple) else (out,)
    torch.autograd.backward(list(outs), [T(g) for g in gouts])
    return [N(o) for o in outs], [N(x.grad) for x in xs if x.is_floating_point()]


def test_wrappers_bits(rp):
    rng = np.random.default_rng(20)
    # matmul: ga = g @ b^T, gb = a^T @ g (strided views of the saved operands)
    a, b, g = (rng.standard_normal(s).astype(F32) for s in ((7, 33), (33, 129), (7, 129)))
    (o,), (ga, gb) = _run(rp.matmul, [a, b], [g])
    assert_bits(o, R.matmul(a, b), "repops.matmul")
    assert_bits(ga, R.matmul(g, b.T), "repops.matmul grad a")
    assert_bits(gb, R.matmul(a.T, g), "repops.matmul grad b")
    # linear with 3-D x
    x, w, g = (rng.standard_normal(s).astype(F32) for s in ((2, 7, 33), (129, 33), (2, 7, 129)))
    (o,), (gx, gw) = _run(rp.linear, [x, w], [g])
    x2, g2 = x.reshape(-1, 33), g.reshape(-1, 129)
    assert_bits(o, R.matmul(x2, w.T).reshape(2, 7, 129), "repops.linear")
    assert_bits(gx, R.matmul(g2, w).reshape(x.shape), "repops.linear grad x")
    assert_bits(gw, R.matmul(g2.T, x2), "repops.linear grad w")
    # rmsnorm_fork: gx = gres + gx_norm (one add)
    x, w = rng.standard_normal((2, 7, 33)).astype(F32), rng.standard_normal(33).astype(F32)
    gres, gy = rng.standard_normal((2, 7, 33)).astype(F32), rng.standard_normal((2, 7, 33)).astype(F32)
    (xa, y), (gx, gw) = _run(lambda x, w: rp.rmsnorm_fork(x, w, 1e-5), [x, w], [gres, gy])
    ey, rstd = R.rmsnorm(x.reshape(-1, 33), w, 1e-5)
    egx, egw = R.rmsnorm_backward(gy.reshape(-1, 33), x.reshape(-1, 33), w, rstd)
    assert_bits(xa, x, "rmsnorm_fork alias")
    assert_bits(y, ey.reshape(x.shape), "rmsnorm_fork y")
    assert_bits(gx, R.add(gres, egx.reshape(x.shape)), "rmsnorm_fork grad x")
    assert_bits(gw, egw, "rmsnorm_fork grad w")
    # cross-entropy with z-loss (host scalars rounded once)
    z = (rng.standard_normal((7, 129)) * 3).astype(F32)
    t = rng.integers(0, 129, 7).astype(np.int64)
    (loss,), (gz,) = _run(lambda z, t: rp.cross_entropy(z, t, zloss=1e-4), [z, t], [np.array(0.5, F32)])
    el, lse = R.cross_entropy(z, t, 1e-4)
    assert_bits(loss, el, "repops.cross_entropy")
    assert_bits(gz, R.cross_entropy_backward(F32(0.5), z, t, lse, float(F32(1e-4))), "repops.cross_entropy grad")
    # causal softmax, swiglu, rope, embedding (2-D idx), dropout
    s = rng.standard_normal((3, 33, 33)).astype(F32)
    gp = rng.standard_normal((3, 33, 33)).astype(F32)
    sc = 1 / math.sqrt(48)
    (P,), (gs,) = _run(lambda s: rp.causal_softmax(s, sc), [s], [gp])
    assert_bits(P, R.causal_softmax(s, sc), "repops.causal_softmax")
    assert_bits(gs, R.causal_softmax_backward(gp, R.causal_softmax(s, sc), sc), "repops.causal_softmax grad")
    u, g = rng.standard_normal((7, 66)).astype(F32), rng.standard_normal((7, 33)).astype(F32)
    (o,), (gu,) = _run(rp.swiglu, [u], [g])
    assert_bits(o, R.swiglu(u), "repops.swiglu")
    assert_bits(gu, R.swiglu_backward(g, u), "repops.swiglu grad")
    c, sn = R.rope_tables(7, 8, 10000.0)
    x, g = rng.standard_normal((2, 7, 3, 8)).astype(F32), rng.standard_normal((2, 7, 3, 8)).astype(F32)
    # rope returns [B, H, T, Dh]; its gradient is given as the transpose of g's [B, T, H, Dh]
    (o,), (gx,) = _run(lambda x: rp.rope(x, T(c), T(sn)).transpose(1, 2), [x], [g])
    assert_bits(o, R.rope(x, c, sn), "repops.rope")
    assert_bits(gx, R.rope(g, c, sn, backward=True), "repops.rope grad")
    w = rng.standard_normal((33, 7)).astype(F32)
    idx = rng.integers(0, 33, (3, 5)).astype(np.int64)
    g = rng.standard_normal((3, 5, 7)).astype(F32)
    (o,), (gw,) = _run(lambda w, i: rp.embedding(w, i), [w, idx], [g])
    assert_bits(o, w[idx], "repops.embedding")
    assert_bits(gw, R.embedding_backward(g.reshape(-1, 7), idx.reshape(-1), 33), "repops.embedding grad")
    x, g = adversarial(rng, (7, 33)), rng.standard_normal((7, 33)).astype(F32)
    (o,), (gx,) = _run(lambda x: rp.dropout(x, 0.3, 77, 1, 2), [x], [g])
    assert_bits(o, R.dropout(x, 0.3, 77, 1, 2), "repops.dropout")
    assert_bits(gx, R.dropout(g, 0.3, 77, 1, 2), "repops.dropout grad")
    # add / scale
    a, b, g = adversarial(rng, (7, 33)), adversarial(rng, (7, 33)), adversarial(rng, (7, 33))
    (o,), (ga, gb) = _run(rp.add, [a, b], [g])
    assert_bits(o, R.add(a, b), "repops.add")
    assert_bits(ga, g, "repops.add grad a")     # d(a + b)/da = d(a + b)/db = 1: the incoming gradient
    assert_bits(gb, g, "repops.add grad b")
    (o,), (ga,) = _run(lambda a: rp.scale(a, 0.1), [a], [g])
    assert_bits(o, R.scale_op(a, 0.1), "repops.scale")
    assert_bits(ga, R.scale_op(g, 0.1), "repops.scale grad")
    # clip_grad and host-scalar helpers
    gflat = rng.standard_normal(1000).astype(F32)
    gc, nrm = rp.clip_grad(T(gflat), 0.7)
    egc, enrm = R.clip_grad(gflat, 0.7)
    assert_bits(gc, egc, "repops.clip_grad")
    assert_bits(nrm, enrm, "repops.clip_grad norm")
    b1 = 0.9 * 0.9
    b3 = (b1 * b1) * (b1 * b1)
    assert rp.f32(0.1) == float(F32(0.1)) and rp.powi(0.9, 10) == b1 * b3  # 10 = 0b1010


# ------------------------------------------------------------------------------------------------
# 3. accuracy of the autograd wrappers vs stock PyTorch
# ------------------------------------------------------------------------------------------------

def close(got, exp, rtol, atol, what):
    torch.testing.assert_close(got.detach(), exp.detach(), rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("exact", [False, True])
def test_matmul_gradient_in_its_operands_layout(rp, exact):
    """A transposed operand (w.t() in linear, k^T in attention) gets its gradient in its own layout,
    computed as (g^T a)^T, so autograd copies nothing to hand it on; the bits are those of a^T g,
    which a contiguous operand gets."""
    rng = np.random.default_rng(21)
    a, k, g = (T(rng.standard_normal(s).astype(F32)) for s in ((3, 7, 33), (3, 129, 33), (3, 7, 129)))
    grads_of = {}
    for layout in ("transposed view", "contiguous"):
        kk = k.clone().requires_grad_(True)
        b = kk.transpose(1, 2) if layout == "transposed view" else kk.transpose(1, 2).contiguous()
        strides = []
        b.register_hook(lambda gb: strides.append(gb.stride()))
        rp.matmul(a, b, exact).backward(g)
        assert strides == [b.stride()], (layout, strides, b.stride())
        grads_of[layout] = kk.grad
    assert_bits(grads_of["transposed view"], grads_of["contiguous"], "k's gradient in both layouts")
    if not exact:
        assert_bits(grads_of["contiguous"], np.stack([R.matmul(N(a)[i].T, N(g)[i]).T for i in range(3)]), "vs NumPy")


def grads(fn, *xs, gout=None, seed=0):
    xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in xs]
    out = fn(*xs)
    outs = out if isinstance(out, tuple) else (out,)
    gen = torch.Generator().manual_seed(seed)
    gos = [torch.randn(o.shape, generator=gen) for o in outs]
    torch.autograd.backward(list(outs), gos)
    return outs, [x.grad for x in xs if x.is_floating_point()]


@pytest.mark.parametrize("shapes", [((7, 33), (33, 129)), ((129, 1), (1, 7)), ((3, 7, 33), (3, 33, 7))])
def test_matmul_vs_torch(rp, shapes):
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(shapes[0], generator=gen), torch.randn(shapes[1], generator=gen)
    K = shapes[0][-1]
    tol = dict(rtol=1e-5 * math.sqrt(K), atol=2e-6 * math.sqrt(K) * 4)
    (o1,), g1 = grads(rp.matmul, a, b)
    (o2,), g2 = grads(torch.matmul, a, b)
    close(o1, o2, what="matmul", **tol)
    close(g1[0], g2[0], what="matmul grad a", rtol=1e-4, atol=1e-4 * math.sqrt(shapes[1][-1]))
    close(g1[1], g2[1], what="matmul grad b", rtol=1e-4, atol=1e-4 * math.sqrt(a.numel() / K))


def test_matmul_3d2d_vs_torch(ops):
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 33, 129, generator=gen), torch.randn(129, 7, generator=gen)
    close(ops.matmul(a, b), a @ b, rtol=1e-4, atol=1e-4, what="matmul 3-D @ 2-D")
    close(ops.matmul(a, b.t().contiguous().t()), a @ b, rtol=1e-4, atol=1e-4, what="matmul 3-D @ 2-D^T")


def test_linear_vs_torch(rp):
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(2, 7, 33, generator=gen), torch.randn(129, 33, generator=gen)
    (o1,), g1 = grads(rp.linear, x, w)
    (o2,), g2 = grads(F.linear, x, w)
    close(o1, o2, rtol=1e-4, atol=1e-4, what="linear")
    for a, b, n in zip(g1, g2, ("x", "w")):
        close(a, b, rtol=1e-4, atol=2e-4, what=f"linear grad {n}")


def torch_rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("shape", [(7, 33), (2, 5, 129), (1, 1)])
def test_rmsnorm_vs_torch(rp, shape):
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(shape, generator=gen), torch.randn(shape[-1], generator=gen)
    (o1,), g1 = grads(lambda x, w: rp.rmsnorm(x, w, 1e-5), x, w)
    (o2,), g2 = grads(lambda x, w: torch_rmsnorm(x, w, 1e-5), x, w)
    close(o1, o2, rtol=1e-5, atol=1e-5, what="rmsnorm")
    close(g1[0], g2[0], rtol=1e-4, atol=1e-4, what="rmsnorm grad x")
    close(g1[1], g2[1], rtol=1e-4, atol=1e-4, what="rmsnorm grad w")


def test_rmsnorm_fork_vs_torch(rp):
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(7, 33, generator=gen), torch.randn(33, generator=gen)
    outs1, g1 = grads(lambda x, w: rp.rmsnorm_fork(x, w, 1e-5), x, w)
    outs2, g2 = grads(lambda x, w: (x * 1.0, torch_rmsnorm(x, w, 1e-5)), x, w)
    close(outs1[0], outs2[0], rtol=0, atol=0, what="rmsnorm_fork alias")
    close(outs1[1], outs2[1], rtol=1e-5, atol=1e-5, what="rmsnorm_fork y")
    close(g1[0], g2[0], rtol=1e-4, atol=1e-4, what="rmsnorm_fork grad x")
    close(g1[1], g2[1], rtol=1e-4, atol=1e-4, what="rmsnorm_fork grad w")


def torch_rope_tables(Tn, Dh, theta):
    inv = 1.0 / (theta ** (torch.arange(0, Dh, 2, dtype=torch.float64) / Dh))
    a = torch.outer(torch.arange(Tn, dtype=torch.float64), inv)
    return torch.cos(a), torch.sin(a)


def torch_rope(x, c, s):
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = c[None, :, None, :], s[None, :, None, :]
    return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)


@pytest.mark.parametrize("Tn,Dh,theta", [(7, 8, 10000.0), (129, 64, 10000.0), (2048, 128, 500000.0)])
def test_rope_vs_torch(rp, ops, Tn, Dh, theta):
    c, s = ops.rope_tables(Tn, Dh, theta)
    c64, s64 = torch_rope_tables(Tn, Dh, theta)
    # angle t*f is rounded to float32 first: absolute error ~ t * 2^-23
    atol = 4 * Tn * 2.0 ** -24 + 1e-6
    close(c.double(), c64, rtol=0, atol=atol, what="rope cos table")
    close(s.double(), s64, rtol=0, atol=atol, what="rope sin table")
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, Tn, 3, Dh, generator=gen)
    (o1,), g1 = grads(lambda x: rp.rope(x, c, s).transpose(1, 2), x)   # [B, H, T, Dh] back to x's order
    (o2,), g2 = grads(lambda x: torch_rope(x, c, s), x)
    close(o1, o2, rtol=1e-5, atol=1e-5, what="rope")
    close(g1[0], g2[0], rtol=1e-5, atol=1e-5, what="rope grad")
    (o3,), _ = grads(lambda x: torch_rope(x.double(), c64, s64), x)
    close(o1.double(), o3, rtol=0, atol=4 * atol * 4, what="rope vs float64")


@pytest.mark.parametrize("BH,Tn", [(1, 1), (3, 7), (2, 129)])
def test_causal_softmax_vs_torch(rp, BH, Tn):
    gen = torch.Generator().manual_seed(5)
    s = torch.randn(BH, Tn, Tn, generator=gen) * 3
    scale = 1 / math.sqrt(64)
    mask = torch.ones(Tn, Tn, dtype=torch.bool).tril()

    def ref(s):
        return torch.softmax((s * scale).masked_fill(~mask, float("-inf")), dim=-1)
    (o1,), g1 = grads(lambda s: rp.causal_softmax(s, scale), s)
    (o2,), g2 = grads(ref, s)
    close(o1, o2, rtol=1e-5, atol=1e-6, what="causal_softmax")
    close(g1[0], g2[0], rtol=1e-4, atol=1e-6, what="causal_softmax grad")


@pytest.mark.parametrize("shape", [(7, 66), (2, 3, 258), (1, 2)])
def test_swiglu_vs_torch(rp, shape):
    gen = torch.Generator().manual_seed(6)
    u = torch.randn(shape, generator=gen) * 3

    def ref(u):
        a, b = u.chunk(2, dim=-1)
        return F.silu(a) * b
    (o1,), g1 = grads(rp.swiglu, u)
    (o2,), g2 = grads(ref, u)
    close(o1, o2, rtol=1e-5, atol=1e-6, what="swiglu")
    close(g1[0], g2[0], rtol=1e-5, atol=1e-5, what="swiglu grad")


@pytest.mark.parametrize("Rn,V", [(1, 7), (7, 33), (33, 1000)])
@pytest.mark.parametrize("zloss", [0.0, 1e-4, 0.1])
def test_cross_entropy_vs_torch(rp, Rn, V, zloss):
    gen = torch.Generator().manual_seed(7)
    z = torch.randn(Rn, V, generator=gen) * 3
    t = torch.randint(0, V, (Rn,), generator=gen)

    def ref(z):
        return F.cross_entropy(z, t) + zloss * (torch.logsumexp(z, -1) ** 2).mean()
    (o1,), g1 = grads(lambda z: rp.cross_entropy(z, t, zloss=zloss), z)
    (o2,), g2 = grads(ref, z)
    close(o1, o2, rtol=1e-5, atol=1e-6, what="cross_entropy")
    close(g1[0], g2[0], rtol=1e-4, atol=1e-7, what="cross_entropy grad")


def test_embedding_vs_torch(rp):
    gen = torch.Generator().manual_seed(8)
    w = torch.randn(33, 7, generator=gen)
    idx = torch.randint(0, 33, (2, 129), generator=gen)
    (o1,), g1 = grads(lambda w: rp.embedding(w, idx), w)
    (o2,), g2 = grads(lambda w: F.embedding(idx, w), w)
    close(o1, o2, rtol=0, atol=0, what="embedding")
    close(g1[0], g2[0], rtol=1e-5, atol=1e-5, what="embedding grad")


def test_elementwise_vs_torch(rp):
    gen = torch.Generator().manual_seed(9)
    a, b = torch.randn(7, 33, generator=gen), torch.randn(7, 33, generator=gen)
    for f1, f2, n in ((rp.add, torch.add, "add"),):
        o1, g1 = grads(f1, a, b)
        o2, g2 = grads(f2, a, b)
        close(o1[0], o2[0], rtol=0, atol=0, what=n)
        for x, y in zip(g1, g2):
            close(x, y, rtol=0, atol=0, what=n + " grad")
    o1, g1 = grads(lambda a: rp.scale(a, 0.3), a)
    o2, g2 = grads(lambda a: a * float(np.float32(0.3)), a)
    close(o1[0], o2[0], rtol=0, atol=0, what="scale")
    close(g1[0], g2[0], rtol=0, atol=0, what="scale grad")


def test_canonical_functions_vs_torch(ops):
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(10_000, generator=gen) * 10
    pos = x.abs() + 1e-3
    close(ops.exp(x), torch.exp(x), rtol=3e-7, atol=0, what="exp")
    close(ops.tanh(x), torch.tanh(x), rtol=3e-7, atol=0, what="tanh")
    close(ops.erf(x / 4), torch.erf(x / 4), rtol=3e-7, atol=0, what="erf")
    close(ops.sigmoid(x), torch.sigmoid(x), rtol=5e-7, atol=0, what="sigmoid")
    close(ops.log(pos), torch.log(pos), rtol=3e-7, atol=1e-7, what="log")
    close(ops.recip(x), 1 / x, rtol=3e-7, atol=0, what="recip")
    close(ops.rsqrt(pos), torch.rsqrt(pos), rtol=3e-7, atol=0, what="rsqrt")
    close(ops.sqrt(pos), torch.sqrt(pos), rtol=3e-7, atol=0, what="sqrt")
    close(ops.sin(x), torch.sin(x), rtol=0, atol=2e-7, what="sin")
    close(ops.cos(x), torch.cos(x), rtol=0, atol=2e-7, what="cos")
    y = torch.randn(5, 1000, generator=gen)
    close(ops.csum(y), y.double().sum(-1).float(), rtol=1e-5, atol=1e-5, what="csum")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_forms_vs_torch(ops, approximate):
    """The GELU forms (contract §5.6) against torch's float32 F.gelu and its autograd backward
    (gelu_backward): the same formulas, with canonical erf/tanh/exp in place of torch's. Torch's
    own vectorized float32 erf and tanh are further off than the canonical ones (contract §5.7):
    F.gelu differs by up to 4e-7 relative for x > 0 and 1.04e-6 absolute in the negative tail
    (x = -3.49: 1 + erf cancels), and torch's tanh gives -1.0 where the canonical one gives
    -0.99999994, which gelu_tanh_grad's 1 - t * t turns into 1.1e-6 at x = -5.16."""
    gen = torch.Generator().manual_seed(12)
    x = torch.cat([torch.randn(20_000, generator=gen) * 3, torch.linspace(-12, 12, 4001)]).requires_grad_(True)
    g = torch.randn(x.shape, generator=gen)
    y = F.gelu(x, approximate=approximate)
    (gx,) = torch.autograd.grad(y, x, g)
    (ones,) = torch.autograd.grad(F.gelu(x, approximate=approximate), x, torch.ones_like(x))
    fwd, grad = (ops.gelu, ops.gelu_grad) if approximate == "none" else (ops.gelu_tanh, ops.gelu_tanh_grad)
    x = x.detach()
    close(fwd(x), y, rtol=1e-6, atol=1.5e-6, what=f"gelu ({approximate})")
    close(grad(x), ones, rtol=1e-6, atol=1.5e-6, what=f"gelu grad ({approximate})")
    close(ops.mul(g, grad(x)), gx, rtol=1e-6, atol=6e-6, what=f"gelu_backward ({approximate})")


def test_dropout_vs_semantics(rp):
    x = torch.randn(64, 257, generator=torch.Generator().manual_seed(11))
    p = 0.2
    (y,), (gx,) = grads(lambda x: rp.dropout(x, p, 42, 3, 4), x)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.01
    close(y[kept], x[kept] * np.float32(1 / (1 - p)), rtol=0, atol=0, what="dropout kept values")
    gen = torch.Generator().manual_seed(0)
    go = torch.randn(y.shape, generator=gen)
    close(gx, torch.where(kept, go * np.float32(1 / (1 - p)), torch.zeros(())), rtol=0, atol=0,
          what="dropout grad uses the same mask")
    y2 = rp.dropout(x, p, 42, 3, 4)
    assert torch.equal(y, y2) and not torch.equal(y, rp.dropout(x, p, 43, 3, 4))


@pytest.mark.parametrize("wd", [0.0, 0.1])
@pytest.mark.parametrize("steps", [1, 5])
def test_adamw_vs_torch(rp, wd, steps):
    gen = torch.Generator().manual_seed(12)
    p0 = torch.randn(1000, generator=gen)
    lr, b1, b2, eps = 1e-3, 0.9, 0.95, 1e-8
    tp = p0.clone().requires_grad_(True)
    opt = torch.optim.AdamW([tp], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    p, m, v = p0.clone(), torch.zeros(1000), torch.zeros(1000)
    for t in range(1, steps + 1):
        g = torch.randn(1000, generator=gen)
        tp.grad = g.clone()
        opt.step()
        rp.adamw_(p, g, m, v, lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd, step=t)
    st = opt.state[tp]
    close(m, st["exp_avg"], rtol=1e-5, atol=1e-7, what="adamw m")
    close(v, st["exp_avg_sq"], rtol=1e-5, atol=1e-9, what="adamw v")
    close(p, tp.detach(), rtol=1e-6, atol=1e-6, what="adamw p")


@pytest.mark.parametrize("max_norm", [0.5, 1.0, 1e3])
def test_clip_grad_vs_torch(rp, max_norm):
    gen = torch.Generator().manual_seed(13)
    gs = [torch.randn(33, 7, generator=gen) * 0.1, torch.randn(129, generator=gen) * 0.1]
    flat = torch.cat([g.flatten() for g in gs])
    params = [torch.zeros_like(g, requires_grad=True) for g in gs]
    for p_, g in zip(params, gs):
        p_.grad = g.clone()
    tn = torch.nn.utils.clip_grad_norm_(params, max_norm)
    gc, norm = rp.clip_grad(flat, max_norm)
    close(norm, tn, rtol=1e-5, atol=0, what="clip_grad norm")
    close(gc, torch.cat([p_.grad.flatten() for p_ in params]), rtol=1e-5, atol=1e-8, what="clip_grad g")


# ------------------------------------------------------------------------------------------------
# 4. contract edge cases (last, so that `pytest -x` runs everything else first)
# ------------------------------------------------------------------------------------------------

# FTZ boundary: exact products just below FLT_MIN. Contract §3 decides tininess after rounding
# (the x86 rule): the first rounds (24 bits, unbounded exponent) to 2^-126 (1 - 2^-24), still
# tiny, so it flushes; the second rounds up to 2^-126 = FLT_MIN and is kept.
FTZ_EDGE = [
    (2.0 ** -63 * (1 - 2.0 ** -24), 2.0 ** -63),                   # exact 2^-126 (1 - 2^-24)
    (2.0 ** -63 * (1 + 2.0 ** -23), 2.0 ** -63 * (1 - 2.0 ** -23)),  # exact 2^-126 (1 - 2^-46)
]


@pytest.mark.parametrize("a,b", FTZ_EDGE, ids=["exact_2^-126(1-2^-24)", "exact_2^-126(1-2^-46)"])
def test_ftz_boundary_mul(ops, a, b):
    x, y = np.array([a], np.float32), np.array([b], np.float32)
    assert x[0] * np.float64(y[0]) < FLT_MIN
    assert_bits(ops.mul(T(x), T(y)), R.mul(x, y), f"mul {a!r} * {b!r}")


@pytest.mark.parametrize("bad", [5, -1, 2**40])
def test_out_of_range_ids_are_refused(bad):
    """The CPU side of .ci/gpu's deselected test_index_errors_match_cpu: an id outside [0, rows)
    in cross_entropy's targets or embedding's ids (forward and backward, raw op and wrapper) is
    one RuntimeError naming the range, the id and its position; the same call with the id in
    range (the positive control) runs."""
    z, w = torch.zeros(3, 5), torch.zeros(5, 2)
    ops = torch.ops.repops
    calls = {"targets": [lambda t: ops.cross_entropy(z, t, 0.0), lambda t: repops.cross_entropy(z, t)],
             "token ids": [lambda t: ops.embedding(w, t), lambda t: repops.embedding(w, t),
                           lambda t: ops.embedding_backward(torch.zeros(3, 2), t, 5)]}
    for what, fns in calls.items():
        for fn in fns:
            fn(torch.tensor([0, 4, 1]))
            with pytest.raises(RuntimeError) as err:
                fn(torch.tensor([0, bad, 1]))
            assert str(err.value).splitlines()[0] == f"repops: {what} out of range [0, 5): found {bad} at 1"
