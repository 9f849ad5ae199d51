"""The int8 kernels on CUDA (kernels/cuda/int8.cu, contract §10) give the CPU kernels' bits.

    python -m pytest tests/test_cuda_int8.py -q     # skips without a CUDA GPU, saying so

The compile and PTX checks of int8.cu run with every other .cu in tests/test_cuda.py (they need
only nvcc); the self-test's int8 digest lines on CUDA are in its golden-digest test. Here, with
a GPU: the tensor-core GEMM (both staging paths: 16-byte loads and the byte path for other K or
misaligned operands; tile edges; all +-127 at the largest K), its dequantizing epilogue,
the cuBLASLt path (torch._int_mm, REPOPS_CUDA_INT8=cublaslt) against ours and the CPU's,
quantize/dequantize on adversarial inputs, the LSQ rule and backward, the off-grid error, and a
--quant=int8 training run on CUDA whose chain and checkpoints equal the CPU run's byte for byte.
"""
import numpy as np
import pytest
import torch

import test_int8 as TI
from test_cuda import DEV, C, _train, both, corpus, needs_gpu, ops, same  # noqa: F401 - fixtures

KMAX = TI.KMAX
INT8_FLAGS = ["--quant=int8", "--threads=1"]


def same_all(ops, name, *args):
    """ops.<name> on the CPU and on the GPU: equal bits (float32, NaNs equal) or equal integers."""
    cpu, gpu = both(ops, name, *args)
    cpu, gpu = (cpu, gpu) if isinstance(cpu, (tuple, list)) else ((cpu,), (gpu,))
    for i, (a, b) in enumerate(zip(cpu, gpu)):
        assert b.device.type == DEV and a.dtype == b.dtype, f"{name}: output {i} is {b.dtype} on {b.device}"
        if a.dtype == torch.float32:
            same(a, b, f"{name} output {i}")
        else:
            assert torch.equal(a, b.cpu()), f"{name} output {i}: {int((a != b.cpu()).sum())} elements differ"


def ints(seed, shape, lo=-127, hi=127):
    return TI.i8(np.random.default_rng(seed), shape, lo, hi)


# M, N, K: tile edges (128 x 128 blocks of 8 warps, k steps of 32), K % 16 == 0 (16-byte loads)
# and not (byte path), K below one k step, several row and column blocks.
SHAPES = [(1, 1, 1), (37, 45, 129), (130, 17, 2), (129, 257, 1024), (256, 384, 1031), (513, 130, 48),
          (300, 1000, 4096), (16, 8, 32)]


@needs_gpu
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_int8_gemm_and_linear_bits(ops, M, N, K):
    a, b = ints(M + 7 * N, (M, K)), ints(K + 3, (N, K))
    got = ops.int8_matmul(C(a), C(b))
    assert got.device.type == DEV and got.dtype == torch.int32
    assert np.array_equal(got.cpu().numpy(), a.astype(np.int64) @ b.astype(np.int64).T)
    rng = np.random.default_rng(K)
    sx = np.float32([0.0371])
    sw = (rng.random(N) * 0.01 + 1e-4).astype(np.float32)
    sw[::5] = np.float32(2.0**-100)                      # tiny column scales (sx * sw near 2^-105)
    same_all(ops, "int8_linear", a, b, sx, sw)
    unchecked = ops.int8_linear(C(a), C(b), C(sx), C(sw), False)
    same(ops.int8_linear(TI.T(a), TI.T(b), TI.T(sx), TI.T(sw)), unchecked, "int8_linear check=False")


@needs_gpu
def test_int8_gemm_extremes_at_the_largest_k(ops):
    """Every product is +-127^2 and the sums reach +-KMAX * 127^2, just below 2^31."""
    a = np.full((3, KMAX), 127, np.int8)
    a[1] = -127
    a[2, ::2] = -127
    b = np.full((5, KMAX), 127, np.int8)
    b[3] = -127
    got = ops.int8_matmul(C(a), C(b)).cpu().numpy().astype(np.int64)
    assert np.array_equal(got, a.astype(np.int64) @ b.astype(np.int64).T)
    assert got[0, 0] == KMAX * 127 * 127 and got[1, 0] == -KMAX * 127 * 127


@needs_gpu
def test_int8_gemm_misaligned_operands(ops):
    """Operands that start one byte into an allocation take the byte path; same result."""
    M, N, K = 70, 90, 64
    a, b = ints(1, (M, K)), ints(2, (N, K))
    base_a = torch.zeros(M * K + 1, dtype=torch.int8, device=DEV)
    base_b = torch.zeros(N * K + 1, dtype=torch.int8, device=DEV)
    va, vb = base_a[1:].view(M, K), base_b[1:].view(N, K)
    va.copy_(C(a))
    vb.copy_(C(b))
    assert va.data_ptr() % 16 != 0
    got = ops.int8_matmul(va, vb).cpu().numpy()
    assert np.array_equal(got, a.astype(np.int64) @ b.astype(np.int64).T)


@needs_gpu
@pytest.mark.parametrize("M,N,K", SHAPES + [(32, 64, KMAX), (17, 8, 8)])
def test_int8_cublaslt_path_bits(ops, M, N, K):
    """Path 1 (REPOPS_CUDA_INT8=cublaslt: at::_int_mm where its shape rules allow, our GEMM
    elsewhere) gives path 0's and the CPU's bits: the int32 product and the dequantized linear."""
    a, b = ints(M + 11 * N, (M, K)), ints(K + 5, (N, K))
    if K == KMAX:                                        # sums at +-KMAX * 127^2
        a[:, :], b[:, :] = 127, 127
        a[1], b[3, ::2] = -127, -127
    rng = np.random.default_rng(K + 1)
    sx, sw = np.float32([0.0371]), (rng.random(N) * 0.01 + 1e-4).astype(np.float32)
    want = ops.int8_matmul(TI.T(a), TI.T(b))
    want_y = ops.int8_linear(TI.T(a), TI.T(b), TI.T(sx), TI.T(sw))
    for path in (0, 1):
        got = ops.int8_matmul_v(C(a), C(b), True, path)
        assert got.dtype == torch.int32 and torch.equal(got.cpu(), want), f"int8_matmul path {path}"
        same(want_y, ops.int8_linear_v(C(a), C(b), C(sx), C(sw), True, path), f"int8_linear path {path}")


@needs_gpu
@pytest.mark.parametrize("s", [0.05, 1.0, 3.7e-3, 2.0**-20])
def test_quantize_dequantize_per_tensor_bits(ops, s):
    sv = np.float32([s])
    x = TI.adversarial(np.random.default_rng(7), 5003, sv[0])
    same_all(ops, "int8_quantize", x, sv)
    q = ops.int8_quantize(TI.T(x), TI.T(sv))
    same_all(ops, "int8_dequantize", q, sv)


@needs_gpu
def test_quantize_dequantize_per_row_bits(ops):
    rng = np.random.default_rng(8)
    s = (rng.random(23) * 0.1 + 1e-3).astype(np.float32)
    s[3] = np.float32(2.0**-130)                         # a subnormal step size reads as zero
    x = (rng.standard_normal((23, 77)) * 0.05).astype(np.float32)
    x[5] = TI.adversarial(rng, 77, s[5])
    same_all(ops, "int8_quantize", x, s)
    same_all(ops, "int8_dequantize", ops.int8_quantize(TI.T(x), TI.T(s)), s)


@needs_gpu
@pytest.mark.parametrize("shape,rows", [((31, 1000), 31), ((64, 33), 1), ((1, 100003), 1), ((5, 3), 5)])
def test_lsq_init_bits(ops, shape, rows):
    rng = np.random.default_rng(9)
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[:5] = [0.0, -0.0, 1e-42, np.float32(3e5), -2.5]
    s_cpu, s_gpu = torch.empty(rows), torch.empty(rows, device=DEV)
    ops.lsq_init_(TI.T(x), s_cpu)
    ops.lsq_init_(C(x), s_gpu)
    same(s_cpu, s_gpu, "lsq_init_")


@needs_gpu
@pytest.mark.parametrize("rows,cols", [(1, 515), (17, 515), (1, 70001), (40, 33)])
def test_lsq_backward_bits(ops, rows, cols):
    rng = np.random.default_rng(rows + cols)
    s = (rng.random(rows) * 0.02 + 5e-3).astype(np.float32)
    x = (rng.standard_normal((rows, cols)) * 0.6).astype(np.float32)   # some beyond the clip
    x[0, :6] = [127 * s[0], -127 * s[0], np.inf, 0.0, np.nan, 126.5 * s[0]]
    gxh = rng.standard_normal((rows, cols)).astype(np.float32)
    same_all(ops, "lsq_backward", x, s, gxh, 0.0123)


@needs_gpu
def test_offgrid_error_matches_cpu(ops):
    """-128 is refused on CUDA with the CPU's message (a C++ exception: deselected on machines
    whose image cannot throw from an extension op, see .ci/gpu)."""
    a = np.zeros((2, 8), np.int8)
    a[1, 3] = -128
    b = np.zeros((2, 8), np.int8)
    for dev in ("cpu", DEV):
        with pytest.raises(RuntimeError, match=r"\[-127, 127\]; found -128 at 11"):
            ops.int8_matmul(TI.T(a).to(dev), TI.T(b).to(dev))


@pytest.fixture(scope="module")
def cpu_int8_chain(corpus, tmp_path_factory):  # noqa: F811 - corpus is test_cuda's fixture
    return _train(tmp_path_factory.mktemp("cpu_int8_run"), corpus, *INT8_FLAGS)


@needs_gpu
def test_int8_training_chain_equals_cpu_chain(ops, corpus, cpu_int8_chain, tmp_path):  # noqa: F811
    chain, ckpts = _train(tmp_path, corpus, "--quant=int8", f"--device={DEV}")
    assert chain == cpu_int8_chain[0], "the CUDA --quant=int8 run's chain differs from the CPU run's"
    assert ckpts == cpu_int8_chain[1]
