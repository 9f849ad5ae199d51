"""The exact matmul on CUDA (kernels/cuda/exact.cu, contract §11) gives the CPU kernel's bits.

    python -m pytest tests/test_cuda_exact.py -q        # emulated here (g++ + CUDA headers); GPU tests on a GPU

Without a GPU: tests/cuda_exact_emulate.cpp compiles exact.cu as host C++ (RPC_EMULATE), so its
element functions (the row exponents lane by lane and the warp's max / or, the split into residue
planes, the chunk combine, Garner's reconstruction and the one rounding) and its orchestration
(workspace layout, panels of rows, k chunks) run on the host with a plain int32 residue GEMM, and
every output must equal the CPU op's (torch.ops.repops.exact_matmul, kernels/cpu/exact.cpp) and
the NumPy reference's (tests/numpy_exact.py) bit for bit: zeros, NaN/inf rows and columns,
huge and tiny exponents, subnormals, overflow, flushes, K = 0 and 1, K past the 131072-k chunk, and
small chunks and panels (any split gives the same bits). nvcc compilation for sm_80/sm_90 and the
PTX float check are tests/test_cuda.py's (every kernels/cuda/*.cu). On a GPU: the CUDA op against
the CPU op on many shapes, views and batches (int8.cu's real mma.sync GEMM, the real warps), and
a short --matmul=exact training run whose chain and checkpoints equal the CPU run's.
"""
import shutil

import numpy as np
import pytest
import torch

import reference as ref
import repops
from test_cuda import CUDA_DIR, COMMON_DIR, _cuda_include_dir, _train, corpus, needs_nvcc  # noqa: F401 - fixture
from test_exact_matmul import adversarial, same_bits
from tiny import run_process

ROOT = CUDA_DIR.parent.parent
CHUNK, RES_BYTES = 131072, 2 << 30   # exact.cu's kChunk and kResBytes (the device build's)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    inc = _cuda_include_dir()
    if shutil.which("g++") is None or inc is None:
        pytest.skip("needs g++ and the CUDA toolkit's headers (cuda_runtime_api.h)")
    exe = tmp_path_factory.mktemp("exact") / "cuda_exact_emulate"
    run_process(["g++", "-std=c++20", "-O2", "-ffp-contract=off", "-fno-fast-math", "-fno-strict-aliasing",
                 "-DRPC_EMULATE", "-Wall", "-Werror", f"-I{CUDA_DIR}", f"-I{COMMON_DIR}", f"-I{inc}",
                 str(ROOT / "tests" / "cuda_exact_emulate.cpp"), "-o", str(exe)], check=True, timeout=300)
    return exe


def emulate(exe, tmp_path, cases):
    """cases: [(a [M, K], b [K, N], chunk, res_bytes)] -> the emulated C of each."""
    blob = b""
    for a, b, chunk, res_bytes in cases:
        (M, K), N = a.shape, b.shape[1]
        blob += np.array([M, N, K, chunk, res_bytes], np.int64).tobytes()
        blob += np.ascontiguousarray(a, np.float32).tobytes() + np.ascontiguousarray(b.T, np.float32).tobytes()
    (tmp_path / "in.bin").write_bytes(blob)
    run_process([str(exe), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True, timeout=600)
    got, outs, at = np.fromfile(tmp_path / "out.bin", np.float32), [], 0
    for a, b, _, _ in cases:
        n = a.shape[0] * b.shape[1]
        outs.append(got[at:at + n].reshape(a.shape[0], b.shape[1]))
        at += n
    assert at == got.size
    return outs


def cpu(a, b):
    return repops.ops.exact_matmul(torch.from_numpy(np.ascontiguousarray(a)),
                                   torch.from_numpy(np.ascontiguousarray(b))).numpy()


def specials(rng):
    """exact_matmul's special-value case (test_exact_matmul.py): NaN/inf rows and columns,
    overflow, flushed products, the smallest normal, an all-subnormal row, the largest float."""
    a = rng.standard_normal((12, 40)).astype(np.float32)
    b = rng.standard_normal((40, 10)).astype(np.float32)
    a[1, 3], a[4, 0], b[7, 2], b[0, 6] = np.nan, np.inf, -np.inf, np.nan
    a[2] *= np.float32(2.0 ** 120)
    b[:, 3] *= np.float32(2.0 ** 100)
    a[5] *= np.float32(2.0 ** -100)
    b[:, 4] *= np.float32(2.0 ** -60)
    a[6, ::2] = np.float32(2.0 ** -126)
    a[7] = np.float32(3e-39)
    a[8] = np.float32(np.finfo(np.float32).max)
    return a, b


SHAPES = [(1, 1, 1), (1, 7, 1), (5, 1, 9), (3, 0, 4), (0, 3, 2), (17, 33, 31), (8, 128, 32), (33, 129, 65),
          (40, 384, 24), (9, 1030, 70)]


@needs_nvcc
def test_emulated_exact_matmul_gives_the_cpu_bits(emulator, tmp_path):
    repops.load()
    rng = np.random.default_rng(26)
    cases, labels = [], []
    for M, K, N in SHAPES:
        a = rng.standard_normal((M, K)).astype(np.float32)
        b = (rng.standard_normal((K, N)) * rng.exponential(1.0, (K, 1))).astype(np.float32)
        cases.append((a, b, CHUNK, RES_BYTES))
        labels.append(f"{M}x{K}x{N} normal")
        if min(M, K, N) > 0:
            cases.append((*adversarial(rng, M, K, N), CHUNK, RES_BYTES))
            labels.append(f"{M}x{K}x{N} adversarial")
            cases.append((*adversarial(rng, M, K, N), 7, 4 * 8 * N * 3))   # k chunks of 7, panels of 3 rows
            labels.append(f"{M}x{K}x{N} adversarial, chunk 7, panel 3")
    a, b = specials(rng)
    for x, y in ((a, b), (-a, b), (a, -b)):
        for chunk, res_bytes in ((CHUNK, RES_BYTES), (16, 4 * 8 * 10 * 5)):
            cases.append((x, y, chunk, res_bytes))
            labels.append(f"specials chunk {chunk}")
    K = CHUNK + 999                                  # two real chunks: the combine mod p
    a = rng.standard_normal((2, K)).astype(np.float32)
    b = rng.standard_normal((K, 3)).astype(np.float32)
    b[:, 1], a[1] = np.abs(b[:, 1]), np.abs(a[1])    # all-positive sums: |C'| near the bound
    cases.append((a, b, CHUNK, RES_BYTES))
    labels.append(f"2x{K}x3 past the chunk")
    outs = emulate(emulator, tmp_path, cases)
    bad = [label for label, (a, b, _, _), c in zip(labels, cases, outs)
           if not (same_bits(c, cpu(a, b)) and same_bits(c, ref.exact_matmul(a, b)))]
    assert not bad, f"emulated exact.cu differs from the CPU op / NumPy reference on: {bad}"


@needs_nvcc
def test_emulation_can_fail(emulator, tmp_path):
    """The comparison sees a one-ulp change: the emulated output is compared, not re-derived."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((4, 9)).astype(np.float32), rng.standard_normal((9, 5)).astype(np.float32)
    (c,) = emulate(emulator, tmp_path, [(a, b, CHUNK, RES_BYTES)])
    assert same_bits(c, cpu(a, b))
    c.view(np.uint32)[1, 2] ^= 1
    assert not same_bits(c, cpu(a, b))


# ------------------------------------------------------------------ on a GPU: CUDA op = CPU op
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="hardware: no CUDA device")


def both(a, b):
    """(CPU, CUDA) exact_matmul of the same tensors (views kept: the bindings make them contiguous)."""
    return repops.ops.exact_matmul(a, b).numpy(), repops.ops.exact_matmul(a.cuda(), b.cuda()).cpu().numpy()


@needs_gpu
@pytest.mark.parametrize("M,K,N", SHAPES + [(64, 64, 64), (129, 4096, 257), (1000, 768, 300), (256, 3072, 768),
                                            (4, 70000, 3), (7, 131073, 5)])
def test_cuda_exact_matmul_bits(M, K, N):
    repops.load()
    rng = np.random.default_rng(M + 3 * K + 11 * N)
    a = torch.from_numpy(rng.standard_normal((M, K)).astype(np.float32))
    b = torch.from_numpy((rng.standard_normal((K, N)) * rng.exponential(1.0, (K, 1))).astype(np.float32))
    c, g = both(a, b)
    assert same_bits(c, g), f"{M}x{K}x{N}: CUDA exact_matmul differs from the CPU's"
    if min(M, K, N) > 0:
        c, g = both(*(torch.from_numpy(x) for x in adversarial(rng, M, K, N)))
        assert same_bits(c, g), f"{M}x{K}x{N} adversarial: CUDA exact_matmul differs from the CPU's"


@needs_gpu
def test_cuda_exact_matmul_specials_views_batches():
    repops.load()
    rng = np.random.default_rng(11)
    a, b = specials(rng)
    for x, y in ((a, b), (-a, b), (a, -b)):
        c, g = both(torch.from_numpy(x), torch.from_numpy(y))
        assert same_bits(c, g), "specials"
    at = torch.from_numpy(rng.standard_normal((20, 13)).astype(np.float32))
    bt = torch.from_numpy(rng.standard_normal((9, 20)).astype(np.float32))
    assert same_bits(*both(at.t(), bt.t())), "transposed views"
    a3 = torch.from_numpy(rng.standard_normal((3, 6, 11)).astype(np.float32))
    assert same_bits(*both(a3, torch.from_numpy(rng.standard_normal((11, 5)).astype(np.float32)))), "batch x 2-D"
    b3 = torch.from_numpy(rng.standard_normal((3, 11, 4)).astype(np.float32))
    assert same_bits(*both(a3, b3)), "batched"
    assert same_bits(*both(torch.zeros(5, 0), torch.zeros(0, 3))), "K = 0"


@pytest.fixture(scope="module")
def cpu_exact_chain(corpus, tmp_path_factory):  # noqa: F811 - corpus is test_cuda's fixture
    return _train(tmp_path_factory.mktemp("cpu_exact_run"), corpus, "--matmul=exact", "--threads=1")


@needs_gpu
def test_exact_training_chain_equals_cpu_chain(corpus, cpu_exact_chain, tmp_path):  # noqa: F811
    """A --matmul=exact run on CUDA (exact.cu for every product, attention's composed) has the CPU
    run's chain and checkpoints byte for byte (the CPU runs attention as one op, told its causal form)."""
    chain, ckpts = _train(tmp_path, corpus, "--matmul=exact", "--device=cuda")
    assert chain == cpu_exact_chain[0], "the CUDA --matmul=exact run's chain differs from the CPU run's"
    assert ckpts == cpu_exact_chain[1]


# ------------------------------------------------------------------ what config accepts
def test_cuda_exact_run_is_accepted_where_a_gpu_is(monkeypatch):
    """--device=cuda --matmul=exact is a valid config (exact.cu was verified on an H200,
    docs/exact-matmul.md); without a GPU only the missing GPU is refused; mps has no exact kernels."""
    from config import UsageError, parse_config, validate
    monkeypatch.delenv("REPOPS_CUDA_DEV", raising=False)
    if torch.cuda.is_available():
        validate(parse_config(["--matmul=exact", "--device=cuda"]))
    else:
        with pytest.raises(UsageError, match="no CUDA GPU") as e:
            validate(parse_config(["--matmul=exact", "--device=cuda"]))
        assert "matmul" not in str(e.value)
    with pytest.raises(UsageError, match="exact has no Metal kernels"):
        validate(parse_config(["--matmul=exact", "--device=mps"]))
