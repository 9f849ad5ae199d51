"""The tiled CUDA matmul versions and the streamed gradient norm, run as host threads, give the CPU's bits.

    python -m pytest tests/test_cuda_emulate.py -q      # no GPU; needs g++ (C++20) and the CUDA headers

tests/cuda_emulate.cpp compiles kernels/cuda/matmul_tiled.cu and dev/cuda/flat_sum.cu as C++ (RPC_EMULATE: each CUDA thread a host
thread, __syncthreads a barrier, cp.async a zero-filling copy: made when issued for version 2,
so a stage refilled while another thread reads it would show; made only at the cp.async wait that
covers it for version 3, so a stage read before its wait would show; version 5, built with
RPC_DEV_VERSIONS, both ways) and runs versions 2, 3 and 5 on
tools/matmul_versions.py's quick cases: odd sizes, K = 0 and 1, the four transposed-view layouts,
step-2 slices and a misaligned base (the 4-byte staging path), batch broadcast, specials and
values whose products flush. Every output must equal the CPU kernel's bit for bit: the tiling,
the staging layouts, the double buffering, the edge tiles and the k order are those of the GPU
build. The same for clip_grad version 2 (flat_sum.cu): its norm on lengths around its staging
block of 2048, its 32 lanes and the chunk of §4.5 (32768), 16- and 4-byte copies, both copy
timings, against the CPU's clip_grad.
What only a GPU can show (the real FADD/FMUL units, the grid limits, speed) is
tools/matmul_versions.py's and tests/test_cuda.py's job on a GPU.
"""
import platform
import shutil

import numpy as np
import pytest
import torch

import repops
import tools.matmul_versions as MV
from test_cuda import CUDA_DIR, COMMON_DIR, DEV_CUDA_DIR, _cuda_include_dir, needs_nvcc
from tiny import run_process

ROOT = CUDA_DIR.parent.parent
# (version, copies made only at the wait that covers them): version 2 with copies made at once, 3
# with copies made at the wait, 5 (32 x 32 tiles, 4 x 4 per thread; REPOPS_CUDA_DEV=1) both ways.
EMULATED = ((2, False), (3, True), (5, False), (5, True))


def operand(t):
    """(storage offset, strides of the last two dims, batch stride or 0, the storage as float32)."""
    storage = torch.empty(0, dtype=torch.float32).set_(t.untyped_storage())
    return t.storage_offset(), t.stride(-2), t.stride(-1), t.stride(0) if t.dim() == 3 else 0, storage.numpy()


def record(version, a, b, deferred):
    a_off, sam, sak, sab, a_st = operand(a)
    b_off, sbk, sbn, sbb, b_st = operand(b)
    batch = max(a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1)
    head = [version, batch, a.shape[-2], b.shape[-1], a.shape[-1], sab, sam, sak, sbb, sbk, sbn, a_off, b_off,
            a_st.size, b_st.size, int(deferred)]
    return np.array(head, np.int64).tobytes() + a_st.tobytes() + b_st.tobytes(), (batch, a.shape[-2], b.shape[-1])


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("hardware: the emulator sets x86 MXCSR FTZ|DAZ, the flush rule of the CPU kernel it is compared with")
    inc = _cuda_include_dir()
    if shutil.which("g++") is None or inc is None:
        pytest.skip("needs g++ and the CUDA toolkit's headers (cuda_runtime.h)")
    exe = tmp_path_factory.mktemp("emulate") / "cuda_emulate"
    run_process(["g++", "-std=c++20", "-O2", "-ffp-contract=off", "-fno-fast-math", "-fno-strict-aliasing",
                 "-pthread", "-DRPC_EMULATE", "-DRPC_DEV_VERSIONS", "-w", f"-I{DEV_CUDA_DIR}", f"-I{CUDA_DIR}", f"-I{COMMON_DIR}", f"-I{inc}",
                 str(ROOT / "tests" / "cuda_emulate.cpp"), "-o", str(exe)], check=True, timeout=300)
    return exe


def with_misaligned_base(rng):
    """A [33, 40] operand starting one float into its storage: not 16-byte aligned."""
    base = torch.from_numpy(rng.standard_normal(33 * 40 + 1).astype(np.float32))
    return base[1:].view(33, 40)


@needs_nvcc
def test_tiled_versions_emulated_give_the_cpu_bits(emulator, tmp_path):
    repops.load()
    rng = np.random.default_rng(5)
    cases = [c for c in MV.fp32_cases(quick=True) if MV.macs(c[1], c[2]) <= 2e7]
    cases.append(("misaligned base", with_misaligned_base(rng), torch.from_numpy(rng.standard_normal((40, 65)).astype(np.float32))))
    blobs, shapes = [], []
    for version, deferred in EMULATED:
        for _, a, b in cases:
            blob, shape = record(version, a, b, deferred=deferred)
            blobs.append(blob)
            shapes.append(shape)
    (tmp_path / "in.bin").write_bytes(b"".join(blobs))
    run_process([str(emulator), "matmul", str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True,
                timeout=600)
    got = np.fromfile(tmp_path / "out.bin", np.float32)
    bad, at = [], 0
    for i, shape in enumerate(shapes):
        label, a, b = cases[i % len(cases)]
        n = int(np.prod(shape))
        out = torch.from_numpy(got[at:at + n].reshape(shape).copy()).squeeze(0) if a.dim() == b.dim() == 2 else \
            torch.from_numpy(got[at:at + n].reshape(shape).copy())
        at += n
        if not MV.same_bits(out, repops.ops.matmul(a, b)):
            bad.append(f"v{EMULATED[i // len(cases)][0]}{' deferred' * EMULATED[i // len(cases)][1]} {label}")
    assert at == got.size and len(cases) >= 25
    assert not bad, f"emulated tiled matmul differs from the CPU kernel on: {bad}"


@needs_nvcc
def test_streamed_norm_emulated_gives_the_cpu_bits(emulator, tmp_path):
    """flat_sum.cu's norm (clip_grad version 2) against the CPU clip_grad's norm: lengths around
    the staging block (2048), the lanes (32) and §4.5's chunk (32768: one to three chunks, a short
    last one), normal values, specials, values whose squares flush;
    the 16-byte path (aligned) and the 4-byte one (one float into the storage); copies made at
    once and at the wait, alternately."""
    repops.load()
    rng = np.random.default_rng(8)
    kinds = (lambda n: rng.standard_normal(n).astype(np.float32),
             lambda n: MV.awkward(rng, (n,)).numpy(),
             lambda n: (rng.standard_normal(n) * 1.1e-19).astype(np.float32))
    cases, blob = [], b""
    for i, n in enumerate((0, 1, 31, 33, 2047, 2048, 2049, 6149, 8192, 20011, 32767, 32768, 32769, 65613, 98304)):
        for k, kind in enumerate(kinds):
            off = (i + k) % 2
            data = np.concatenate([np.float32([7.0] * off), kind(n)]).astype(np.float32)
            blob += np.array([n, off, data.size, (i + k) % 2], np.int64).tobytes() + np.float32(1.0).tobytes()
            blob += data.tobytes()
            cases.append((f"n={n} kind={k} offset={off}", torch.from_numpy(data[off:].copy())))
    (tmp_path / "in.bin").write_bytes(blob)
    run_process([str(emulator), "clip", str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True,
                timeout=600)
    got = np.fromfile(tmp_path / "out.bin", np.float32).reshape(-1, 2)
    assert len(got) == len(cases)
    bad = [label for (label, g), (norm, _) in zip(cases, got)
           if not MV.same_bits(torch.tensor([norm]), repops.ops.clip_grad(g, 1.0)[1].reshape(1))]
    assert not bad, f"emulated streamed norm differs from the CPU's on: {bad}"
