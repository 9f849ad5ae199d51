"""The CUDA kernel versions' CPU side (docs/cuda-speed.md): the harness and the selection.

    python -m pytest tests/test_cuda_versions.py -q      # about 10 s, no GPU needed

tools/matmul_versions.py decides which kernel version may become the default, so its own
machinery is tested here where no GPU is: the bitwise check passes a product computed by the CPU
kernel and catches one computed another way (stock torch.matmul), and the same for the gradient
norm (stock torch.linalg.vector_norm); views keep their strides on the
way to a device; the rows checked cover every tile edge; the promote rule picks the fastest
version that verified and never one that did not. A bad REPOPS_CUDA_MATMUL, REPOPS_CUDA_INT8 or
REPOPS_CUDA_EXACT_GEMM, or a version outside the REPOPS_CUDA_DEV=1 build, is one line and exit 2 from train.py,
before anything is created. The versions themselves are
checked on a GPU: tests/test_cuda.py (matmul_v, ptxas report) and tests/test_cuda_int8.py
(the cuBLASLt path).
"""
import os

import pytest
import torch

import repops
import tools.matmul_versions as MV
from tiny import assert_one_line_error, make_corpus, script, train_args


def test_bitwise_check_passes_the_cpu_kernel_and_catches_another_order():
    repops.load()
    cases = MV.fp32_cases(quick=True)
    runs = {1: lambda a, b: repops.ops.matmul(a, b), 2: lambda a, b: torch.matmul(a, b)}
    bad = MV.verify_fp32(cases, (1, 2), "cpu", run=lambda v, a, b: runs[v](a, b))
    assert bad[1] == [], f"the CPU kernel against itself: {bad[1]}"
    # torch's blocked, fused sums differ somewhere on every case with K >= 2 and finite products
    assert len(bad[2]) >= len(cases) // 2, f"stock torch.matmul passed as the contract on {len(cases) - len(bad[2])} cases"


def test_quick_cases_cover_views_slices_batches_and_edges():
    labels = [c[0] for c in MV.fp32_cases(quick=True)]
    shapes = {(c[1].shape[-2], c[1].shape[-1]) for c in MV.fp32_cases(quick=True)}
    for want in ("aT bT", "step-2 slices", "3d @ 2d (broadcast)", "2d @ 3d (broadcast)", "3d transposed"):
        assert any(want in label for label in labels), want
    assert (7, 0) in shapes and (7, 1) in shapes and (130, 17) in shapes


def test_views_keep_their_strides_on_the_device():
    base = torch.arange(60, dtype=torch.float32).view(6, 10)
    for view in (base.t(), base[::2, 1::3], base[1:, 2:]):
        moved = MV.on(view, "cpu")
        assert moved.stride() == view.stride() and torch.equal(moved, view)


def test_checked_rows_cover_the_tile_edges():
    rows = MV.check_rows(8192)
    for i in (0, 63, 64, 127, 128, 8191, 8190, 8128, 8127, 8064, 8063, 4096):
        assert i in rows
    assert MV.check_rows(5) == [0, 1, 2, 3, 4]


def test_promote_picks_the_fastest_verified_version_only(capsys):
    speeds = {1: [10.0, 10.0], 2: [90.0, 90.0], 3: [20.0, 30.0]}
    MV.promote({1: [], 2: ["8192^3"], 3: []}, speeds, 1, "REPOPS_CUDA_MATMUL")
    out = capsys.readouterr().out
    assert "PROMOTE: REPOPS_CUDA_MATMUL=3 " in out and "MISMATCH in 1 cases (8192^3" in out
    MV.promote({1: [], 2: ["x"], 3: ["y"]}, speeds, 1, "REPOPS_CUDA_MATMUL")
    assert "PROMOTE: REPOPS_CUDA_MATMUL=1 (already the default)" in capsys.readouterr().out
    MV.promote({1: ["x"], 2: ["x"], 3: ["y"]}, speeds, 1, "REPOPS_CUDA_MATMUL")
    assert "PROMOTE: nothing" in capsys.readouterr().out


def test_clip_check_passes_the_cpu_op_and_catches_another_norm(monkeypatch):
    repops.load()

    def clip_v(g, max_norm, version):     # version 1: the CPU op itself; 2: torch's own norm
        if version == 1:
            return repops.ops.clip_grad(g, max_norm)
        norm = torch.linalg.vector_norm(g)
        return g * torch.clamp(max_norm / (norm + 1e-6), max=1.0), norm
    monkeypatch.setattr(repops.ops, "clip_grad_v", clip_v, raising=False)
    bad = MV.verify_clip("cpu", quick=True)
    assert bad[1] == [] and len(bad[2]) >= 5, bad


def test_bad_kernel_version_is_one_line_and_creates_nothing(tmp_path, monkeypatch):
    corpus, run = make_corpus(tmp_path), tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "REPOPS_CUDA_DEV"}
    proc = script("train.py", *train_args(run, corpus), env={**env, "REPOPS_CUDA_MATMUL": "7"})
    assert_one_line_error(proc, "train.py")
    assert "REPOPS_CUDA_MATMUL='7' is not one of its kernel versions (1, 2, 3, 4; more with REPOPS_CUDA_DEV=1)" in proc.stderr and not run.exists()
    # a version of dev/cuda is not selectable outside the harness's build
    proc = script("train.py", *train_args(run, corpus), env={**env, "REPOPS_CUDA_CLIP": "2"})
    assert_one_line_error(proc, "train.py")
    assert "REPOPS_CUDA_CLIP='2'" in proc.stderr and "REPOPS_CUDA_DEV=1" in proc.stderr and not run.exists()
    monkeypatch.setattr(repops, "_loaded", False)       # the same check for the int8 path, in-process
    monkeypatch.setattr(repops, "CUDA_INT8", "fast")
    with pytest.raises(repops.RepOpsBuildError, match="REPOPS_CUDA_INT8='fast' is not one of its kernel versions"):
        repops.load()
    # the exact matmul's cuBLASLt residue GEMMs, not yet verified on a GPU: the harness's build only
    monkeypatch.setattr(repops, "CUDA_INT8", "mma")
    monkeypatch.setattr(repops, "CUDA_EXACT_GEMM_PATHS", ("mma",))
    monkeypatch.setattr(repops, "CUDA_DEV", False)
    monkeypatch.setattr(repops, "CUDA_EXACT_GEMM", "cublaslt")
    with pytest.raises(repops.RepOpsBuildError, match=r"REPOPS_CUDA_EXACT_GEMM='cublaslt' is not one of its kernel "
                       r"versions \(mma; more with REPOPS_CUDA_DEV=1\)"):
        repops.load()
