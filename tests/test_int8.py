"""The int8 kernels (contract §10, kernels/cpu/int8.cpp) against the NumPy reference, bit for bit.

    .venv/bin/python -m pytest tests/test_int8.py -q -x

The GEMM is checked against NumPy int64 products (exact), including the extreme case: all
operands +-127 at the largest K the kernel accepts (K * 127^2 < 2^31), where every output is
+-K * 127^2, on each int8 path of this CPU (the int8_path fixture of conftest.py: the SIMD path,
VNNI here, and AMX-INT8 where the CPU has it), and the AMX path against the VNNI path on odd
shapes (M, N, K off the 16 x 64 tiles, tiny, 1). Quantize, dequantize, the fused int8 linear, the LSQ step-size rule and the LSQ
backward are checked against tests/reference.py (the contract's float32 sequence) bit for bit,
and the reference itself against float64 formulas with a tolerance.
"""
import math

import numpy as np
import pytest
import torch

import reference as ref
import repops

KMAX = 133144   # the largest K with K * 127^2 < 2^31


def i8(rng, shape, lo=-127, hi=127):
    return rng.integers(lo, hi + 1, size=shape, dtype=np.int64).astype(np.int8)


def same_bits(a, b):
    a = np.asarray(a, dtype=np.float32).reshape(-1).view(np.uint32)
    b = np.asarray(b, dtype=np.float32).reshape(-1).view(np.uint32)
    nan_a = (a & 0x7F800000) == 0x7F800000
    return a.shape == b.shape and bool(np.all((a == b) | (nan_a & (a & 0x7FFFFF != 0) & (b & 0x7FFFFF != 0))))


def T(a):  # noqa: N802
    return torch.from_numpy(np.ascontiguousarray(a).copy())


# ------------------------------------------------------------------------------------- the GEMM
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (37, 45, 129), (9, 33, 3), (70, 300, 1030), (130, 17, 2)])
def test_int8_matmul_is_exact(M, N, K, int8_path):
    rng = np.random.default_rng(M * 1000 + K)
    a, b = i8(rng, (M, K)), i8(rng, (N, K))
    got = repops.ops.int8_matmul(T(a), T(b)).numpy()
    assert got.dtype == np.int32
    assert np.array_equal(got, ref.int8_matmul(a, b))


def test_int8_matmul_extremes_at_the_largest_k(int8_path):
    """Every product is +-127^2 and every sum reaches +-KMAX * 127^2 (just below 2^31): any
    int16 saturation (vpmaddubsw) or int32 overflow would show."""
    K = KMAX
    assert K * 127 * 127 < 2**31 <= (K + 1) * 127 * 127
    a = np.full((3, K), 127, np.int8)
    a[1] = -127
    a[2, ::2] = -127                 # alternating signs: partial sums cancel pairwise
    b = np.full((5, K), 127, np.int8)
    b[3] = -127
    got = repops.ops.int8_matmul(T(a), T(b)).numpy().astype(np.int64)
    assert np.array_equal(got, a.astype(np.int64) @ b.astype(np.int64).T)
    assert got[0, 0] == K * 127 * 127 and got[1, 0] == -K * 127 * 127


def test_int8_matmul_vnni_offset_wraps_and_stays_exact(int8_path):
    """The AVX-512 VNNI path (vpdpbusd, u8 x s8) multiplies a + 128 by b and starts every sum at
    -128 * colsum(b). At large K both the start and the running sums leave int32 (up to about
    2 * 127^2 * K), and two's-complement wraparound (modulo 2^32) brings the end back to the
    exact result, which lies in int32. Every path must give these bits; the VNNI one is where
    they are at stake. K = KMAX - 1 is not a multiple of 4 (a partial k group); M and N are off
    the tile sizes."""
    K, M, N = KMAX - 1, 11, 35
    rng = np.random.default_rng(12)
    a = np.where(rng.random((M, K)) < 0.5, 127, -127).astype(np.int8)
    b = np.where(rng.random((N, K)) < 0.5, 127, -127).astype(np.int8)
    a[0], b[0] = 127, 127      # a + 128 = 255: sum (a + 128) b = 255 * 127 * K > 2^32, start -128 * 127 * K < -2^31
    a[1], b[1] = -127, -127    # a + 128 = 1: the start +128 * 127 * K > 2^31
    a[2], b[2] = 127, -127
    a[3] = i8(rng, K)          # random values on the whole grid
    b[3] = i8(rng, K)
    got = repops.ops.int8_matmul(T(a), T(b)).numpy()
    want = a.astype(np.int64) @ b.astype(np.int64).T
    assert got.dtype == np.int32 and np.array_equal(got.astype(np.int64), want)
    assert want[0, 0] == K * 127 * 127 and want[1, 1] == K * 127 * 127 and want[2, 2] == -K * 127 * 127
    # the linear (same GEMM, then dequantized) at the same operands
    sw = np.full(N, 2.0 ** -30, np.float32)
    y = repops.ops.int8_linear(T(a), T(b), T(np.float32([1.0])), T(sw)).numpy()
    assert same_bits(y, ref.int8_linear(a, b, np.float32(1.0), sw))


def test_int8_matmul_refuses_too_large_k_and_off_grid_values(int8_path):
    with pytest.raises(RuntimeError, match=r"K = 133145 is too large .*K <= 133144"):
        repops.ops.int8_matmul(torch.zeros(1, KMAX + 1, dtype=torch.int8), torch.zeros(1, KMAX + 1, dtype=torch.int8))
    a = torch.zeros(2, 8, dtype=torch.int8)
    a[1, 3] = -128
    with pytest.raises(RuntimeError, match=r"\[-127, 127\]; found -128"):
        repops.ops.int8_matmul(a, torch.zeros(2, 8, dtype=torch.int8))


def paths_or_skip():
    """The int8 GEMM paths to compare: the SIMD path and AMX-INT8 (a hardware skip without AMX)."""
    try:
        repops.select_cpu(int8="amx")
    except RuntimeError as e:
        pytest.skip(f"hardware: {str(e).strip().splitlines()[0]}")
    finally:
        repops.select_cpu()
    return ["vnni", "amx"]


def on_each_path(fn):
    """fn() under each int8 path, the default restored after."""
    outs = []
    try:
        for path in paths_or_skip():
            repops.select_cpu(int8=path)
            outs.append(fn())
    finally:
        repops.select_cpu()
    return outs


ODD_SHAPES = [(1, 1, 1), (1, 1, 64), (1, 17, 65), (16, 16, 64), (17, 15, 63), (31, 33, 129), (32, 32, 128),
              (33, 1, 200), (65, 97, 1031), (100, 260, 300), (1024, 128, 384), (3, 70, 0)]


@pytest.mark.parametrize("M,N,K", ODD_SHAPES)
def test_amx_equals_vnni_and_numpy_on_odd_shapes(M, N, K):
    """AMX-INT8 (int8_amx.cpp: 2 x 2 tiles of 16 x 16 int32, k in steps of 64, edges padded with
    zeros) against the VNNI path and NumPy: int32 outputs and the dequantized linear, bit for bit."""
    rng = np.random.default_rng(M * 7 + N * 11 + K)
    a, b = i8(rng, (M, K)), i8(rng, (N, K))
    if K:
        a[0, 0], b[-1, -1] = 127, -127
    sw = (rng.random(N) * 0.01 + 1e-4).astype(np.float32)
    sx = np.float32([0.0371])
    gemm = on_each_path(lambda: repops.ops.int8_matmul(T(a), T(b)).numpy())
    lin = on_each_path(lambda: repops.ops.int8_linear(T(a), T(b), T(sx), T(sw)).numpy())
    assert np.array_equal(gemm[0], gemm[1]) and np.array_equal(gemm[1].astype(np.int64), ref.int8_matmul(a, b))
    assert same_bits(lin[0], lin[1]) and same_bits(lin[1], ref.int8_linear(a, b, sx[0], sw))


def test_amx_equals_vnni_at_the_largest_k_with_odd_shapes():
    """+-127 everywhere at K = 133144 (every sum up to +-K * 127^2, just below 2^31; K is not a
    multiple of 64), M and N off the tiles: AMX = VNNI = NumPy."""
    K, M, N = KMAX, 33, 19
    rng = np.random.default_rng(21)
    a = np.where(rng.random((M, K)) < 0.5, 127, -127).astype(np.int8)
    b = np.where(rng.random((N, K)) < 0.5, 127, -127).astype(np.int8)
    a[0], b[0], a[1], b[1] = 127, 127, -127, 127
    got = on_each_path(lambda: repops.ops.int8_matmul(T(a), T(b)).numpy())
    want = a.astype(np.int64) @ b.astype(np.int64).T
    assert np.array_equal(got[0], got[1]) and np.array_equal(got[1].astype(np.int64), want)
    assert want[0, 0] == K * 127 * 127 and want[1, 0] == -K * 127 * 127


def test_minus_128_refused_by_both_paths_and_exact_beyond_the_contract():
    """Contract §10 refuses -128 (checked); with check=False (the caller vouches for the grid) both
    GEMMs are still exact on -128 wherever K * 128^2 < 2^31 (K <= 131071): vpdpbusd reads a = -128
    as the byte 0, tdpbssd as -128. Not a contract case; it shows that neither path saturates."""
    def refused():
        a = torch.zeros(2, 8, dtype=torch.int8)
        a[1, 3] = -128
        with pytest.raises(RuntimeError, match=r"\[-127, 127\]; found -128"):
            repops.ops.int8_matmul(a, torch.zeros(2, 8, dtype=torch.int8))
        return True
    assert on_each_path(refused) == [True, True]
    K = 131071
    assert K * 128 * 128 < 2**31
    a = np.full((3, K), -128, np.int8)
    a[2, ::3] = 127
    b = np.full((17, K), -128, np.int8)
    b[5] = 127
    got = on_each_path(lambda: repops.ops.int8_matmul(T(a), T(b), False).numpy())
    want = a.astype(np.int64) @ b.astype(np.int64).T
    assert want[0, 0] == K * 128 * 128 and want[0, 5] == -K * 128 * 127
    assert np.array_equal(got[0].astype(np.int64), want) and np.array_equal(got[1].astype(np.int64), want)


def test_int8_linear_dequantizes_in_the_written_order(int8_path):
    rng = np.random.default_rng(5)
    a, b = i8(rng, (37, 129)), i8(rng, (45, 129))
    sx = np.float32([0.0371])
    sw = (rng.random(45) * 0.01 + 1e-4).astype(np.float32)
    got = repops.ops.int8_linear(T(a), T(b), T(sx), T(sw)).numpy()
    assert same_bits(got, ref.int8_linear(a, b, sx[0], sw))
    exact = (a.astype(np.float64) @ b.astype(np.float64).T) * (float(sx[0]) * sw.astype(np.float64))
    np.testing.assert_allclose(got, exact, rtol=3e-7)


# ------------------------------------------------------------------------------ quantization
def adversarial(rng, n, s):
    """Values around every rounding and clipping decision of Q(x * recip(s))."""
    k = rng.integers(-130, 131, size=n).astype(np.float32)
    x = (k + np.float32(0.5)) * np.float32(s)          # ties (up to the product's rounding)
    x[::7] = k[::7] * np.float32(s)                       # exact grid points, +-127 included
    x[::11] = rng.standard_normal(x[::11].shape).astype(np.float32) * 1e4
    specials = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-40, 127 * s, -127 * s,
                           126.5 * s, -126.5 * s, 3e38, -3e38])
    x[:len(specials)] = specials
    return x


@pytest.mark.parametrize("s", [0.05, 1.0, 3.7e-3, 2.0**-20])
def test_quantize_per_tensor(s):
    rng = np.random.default_rng(7)
    sv = np.float32([s])
    x = adversarial(rng, 5003, sv[0])
    got = repops.ops.int8_quantize(T(x), T(sv)).numpy()
    want = ref.int8_quantize(x, sv)
    assert got.dtype == np.int8 and np.array_equal(got, want)
    assert got.min() >= -127 and got[4] == 0            # never -128; NaN -> 0
    # the reference means round-half-even of x / s, clamped, where x / s is a float32 product
    ok = np.isfinite(x) & (np.abs(x) < 1e30)
    v = x[ok].astype(np.float64) * float(ref.recip(sv)[0])
    assert np.all(np.abs(want[ok] - np.clip(np.round(v), -127, 127)) <= 1)


def test_quantize_per_row_and_dequantize():
    rng = np.random.default_rng(8)
    s = (rng.random(23) * 0.1 + 1e-3).astype(np.float32)
    x = (rng.standard_normal((23, 77)) * 0.05).astype(np.float32)
    q = repops.ops.int8_quantize(T(x), T(s)).numpy()
    assert np.array_equal(q, ref.int8_quantize(x, s))
    y = repops.ops.int8_dequantize(T(q), T(s)).numpy()
    assert same_bits(y, ref.int8_dequantize(q, s))
    within = np.abs(y - x) <= s[:, None] * 0.5 * (1 + 1e-5)     # half a step, off the clip
    assert np.all(within[np.abs(q) < 127])


def test_lsq_init_is_two_mean_abs_over_sqrt_qp():
    rng = np.random.default_rng(9)
    for rows, shape in ((31, (31, 1000)), (1, (64, 33))):
        x = rng.standard_normal(shape).astype(np.float32)
        x[0, :5] = [0.0, -0.0, 1e-42, np.float32(3e5), -2.5]
        s = torch.empty(rows)
        repops.ops.lsq_init_(T(x), s)
        assert same_bits(s.numpy(), ref.lsq_init(x, rows))
        want = 2 * np.abs(x.astype(np.float64)).reshape(rows, -1).mean(1) / math.sqrt(127)
        np.testing.assert_allclose(s.numpy(), want, rtol=1e-5)


@pytest.mark.parametrize("rows", [1, 17])
def test_lsq_backward(rows):
    rng = np.random.default_rng(rows)
    s = (rng.random(rows) * 0.02 + 5e-3).astype(np.float32)
    x = (rng.standard_normal((rows, 515)) * 0.6).astype(np.float32)   # some beyond the clip
    x[0, :4] = [127 * s[0], -127 * s[0], np.inf, 0.0]
    gxh = rng.standard_normal((rows, 515)).astype(np.float32)
    g = repops.f32(1.0 / math.sqrt(515 * 127))
    gx, gs = repops.ops.lsq_backward(T(x), T(s), T(gxh), g)
    rgx, rgs = ref.lsq_backward(x, s, gxh, g)
    assert same_bits(gx.numpy(), rgx) and same_bits(gs.numpy(), rgs)
    # Esser et al.: d xhat / d s = -v + round(v) inside (-Qp, Qp), +-Qp outside, v = x / s
    # (v as the kernel rounds it: the clip decision at exactly +-127 s depends on that rounding)
    v = ref.mul(x, ref.recip(s)[:, None]).astype(np.float64)
    assert np.allclose(v[np.isfinite(v)], (x.astype(np.float64) / s[:, None])[np.isfinite(v)], rtol=1e-6)
    inside = (v > -127) & (v < 127)
    term = np.where(inside, np.round(v) - v, np.clip(np.round(v), -127, 127))
    want = (gxh * term).sum(1) * g
    np.testing.assert_allclose(gs.numpy(), want, rtol=1e-4, atol=1e-4)
    assert np.array_equal(gx.numpy() != 0, inside & (gxh != 0))


def test_activation_step_size_gradient_sums_row_by_row():
    """quant.activation_lsq_backward (contract §10, per-tensor step size over x [M, K]): gx is
    the kernel's with one step size, g_sx = csum over rows of each row's csum, times g, against
    the NumPy reference; and it is not the flat sum's bits in general (the order is decisive)."""
    import quant
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((67, 129)) * 0.6).astype(np.float32)
    x[3, :3] = [np.inf, 0.0, -127 * 0.01]
    gxh = rng.standard_normal((67, 129)).astype(np.float32)
    s = np.float32([0.01])
    g = repops.f32(1.0 / math.sqrt(x.size * 127))
    gx, gs = quant.activation_lsq_backward(T(x), T(s), T(gxh), g)
    rgx, _ = ref.lsq_backward(x.reshape(-1), s, gxh.reshape(-1), g)
    _, rows = ref.lsq_backward(x, np.full(67, s[0], np.float32), gxh, 1.0)
    want = ref.mul(ref.csum(rows), ref.f32(g)).reshape(1)
    assert gs.shape == (1,) and same_bits(gs.numpy(), want)
    assert same_bits(gx.numpy().reshape(-1), rgx)
    _, flat = ref.lsq_backward(x.reshape(-1), s, gxh.reshape(-1), g)
    assert not same_bits(gs.numpy(), flat)
