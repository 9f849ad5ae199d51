"""The standalone kernel self-test (kernels/cpu/selftest.cpp; contract in kernels/README.md).

selftest.cpp runs every CPU kernel on inputs generated from integer counters and prints one line
`name sha256hex` per kernel call (SHA-256 of the outputs' little-endian float32 bytes, every NaN
hashed as 0x7FC00000, contract §7). This file

1. builds it with g++ -O0, with g++ -O3 -march=native, with g++ -O3 -march=x86-64-v3 (the AVX2
   path, where the CPU can run it), with g++ -O3 -march=skylake-avx512 (AVX-512 without VNNI:
   the int8 GEMM's vpmaddwd path, where the CPU can run it) and with clang++ -O2 where installed
   (all with the contract's -ffp-contract=off), and requires identical lines: optimisation
   level, SIMD width (the matmul tiles and the int8 GEMM's path follow -march) and compiler must
   not change a bit. The kernel versions a CPU chooses at run time (the 256- or 512-bit matmul
   tile, the int8 GEMM on AMX-INT8 or the SIMD path) are forced by the self-test's options: the
   AVX2, Skylake-SP and clang builds run their SIMD int8 path (--int8=vnni), the native build
   every combination this CPU has; a build with tests/amx_emulate.cpp in place of int8_amx.cpp
   runs the AMX path's host code (--int8=amx) on any CPU;
2. regenerates the same inputs in NumPy (a second implementation of the generator documented at
   the top of selftest.cpp), runs them through the torch extension (torch.ops.repops.*, built by
   `import repops`) and requires the same digest, kernel by kernel;
3. builds it with -ffp-contract=fast -mfma and requires the matmul digests to change, so the
   digests demonstrably catch contraction into FMA.

Inputs and call parameters of every digest line (gen/bitsgen/index as in selftest.cpp; FIN(b)
is the finite adversarial table with big value b, SPEC the table for the canonical functions,
SPEC_FN the one for tanh, erf and the derived functions, selftest.cpp's SPECIAL_FN):

| line                    | call                                                   | inputs (stream, shape, emin, erange, period, table) |
|-------------------------|--------------------------------------------------------|------------------------------------------------------|
| matmul_nn               | A @ B                                                  | A 1 [37,129]; B 2 [129,45]; all -2,4,16,FIN(2^20)     |
| matmul_tn               | At.T @ B                                               | At 3 [129,37]                                         |
| matmul_nt               | A @ Bt.T                                               | Bt 4 [45,129]                                         |
| matmul_tt               | At.T @ Bt.T                                            |                                                      |
| matmul_batched          | A3 @ B3                                                | A3 5 [3,19,70]; B3 6 [3,70,33]                        |
| matmul_bcast_b          | A3 @ B2                                                | B2 7 [70,33]                                          |
| matmul_bcast_a          | A2t.T @ B3                                             | A2t 8 [70,19]                                         |
| matmul_big              | A @ Bt.T (M 100, K 300, N 260)                         | A 9 [100,300]; Bt 10 [260,300]                        |
| rmsnorm                 | rmsnorm(x, w, eps=f32(1e-5)) -> y, rstd                | x 20 [37,129] -3,8,16,FIN(2^20); w 21 [129] -1,2,0   |
| rmsnorm_backward        | rmsnorm_backward(gy, x, w, rstd) -> gx, gw             | gy 22 [37,129] -3,8,16,FIN(2^10)                     |
| rope_tables_long        | rope_tables(3000, 8, 500000) -> cos, sin               |                                                      |
| rope_tables             | rope_tables(37, 18, 10000) -> cos, sin                 |                                                      |
| rope                    | rope(x, cos, sin, False) -> [2,3,37,18]                | x 30 [2,37,3,18] -3,8,16,FIN(2^20)                   |
| rope_backward           | rope(g, cos, sin, True) -> [2,37,3,18]                 | g 31 [2,3,37,18] -3,8,16,FIN(2^20)                   |
| causal_softmax          | causal_softmax(S, f32(1/sqrt(32))) -> P                | S 40 [3,37,37] -4,10,16,FIN(2^12)                    |
| causal_softmax_backward | causal_softmax_backward(gP, P, same scale)             | gP 41 [3,37,37] -4,8,16,FIN(2^10)                    |
| swiglu                  | swiglu(u)                                              | u 50 [37,90] -6,14,16,FIN(2^7)                       |
| swiglu_backward         | swiglu_backward(g, u)                                  | g 51 [37,45] -3,8,16,FIN(2^10)                       |
| cross_entropy           | cross_entropy(z, t, zloss=f32(1e-4)) -> loss, lse      | z 60 [37,131] -3,9,16,FIN(2^10); t = index(61,37,131)|
| cross_entropy_backward  | cross_entropy_backward(0.75, z, t, lse, zloss)         |                                                      |
| embedding               | embedding(w, idx)                                      | w 70 [23,129] -3,8,16,FIN(2^20); idx = index(71,70,20)|
| embedding_backward      | embedding_backward(g, idx, 23)                         | g 72 [70,129] -3,8,16,FIN(2^20)                      |
| add, mul                | a + b, a * b                                           | a 80, b 81 [10007] -4,12,8,FIN(2^100)                |
| scale                   | a * -0x1.3p-110                                        | a 80                                                 |
| dropout                 | dropout(x, 0.1, seed64, 7, 11)                         | x 82 [10007] -4,12,8,FIN(2^20)                       |
| csum_rows               | csum(x) over rows                                      | x 100 [37,129] -3,8,16,FIN(2^20)                     |
| csum_rows_long          | csum(x)                                                | x 101 [3,1000] -3,8,16,FIN(2^20)                     |
| adamw                   | adamw_(p, g, m, v, ADAMW...) -> p, m, v                | p 90 -3,8; g 91 -12,14; m 92 -12,10; v = abs(93 -24,20); [10007], 16, FIN(2^20) |
| clip_grad               | clip_grad(g, 0.5) -> out, norm                         | g 94 [10007] -4,8,16,FIN(2^10)                       |
| clip_grad_chunks        | clip_grad(g, 0.5) -> out, norm (chunks L, L, 77)       | g 95 [65613] -4,8,16,FIN(2^10)                       |
| exp                     | exp(x)                                                 | x 110 [20011] -20,28,8,SPEC                          |
| log, recip, rsqrt, sqrt | fn(x)                                                  | bitsgen 111, 112, 113, 114 [20011] 8,SPEC            |
| sin, cos                | fn(x)                                                  | x 115, 116 [20011] -20,38,8,SPEC                     |
| tanh, erf, sigmoid, gelu, gelu_tanh, gelu_grad, gelu_tanh_grad | fn(x)           | x 160 .. 166 [20011] -20,27,8,SPEC_FN                |
| philox                  | philox(seed64, 3, 5, 1, n=1001, block_offset=7) words  |                                                      |
| uniform                 | uniform(seed64, 4, 6, 3, 1001)                         |                                                      |
| normal                  | normal(seed64, 8, 9, 1, 1003)                          |                                                      |
| canary                  | canary() -> [fused, ftz_missing]                       |                                                      |
| int8_matmul             | A @ B^T int32 (M 37, N 45, K 1031)                     | A = index(120, M*K, 255) - 127, every 7th +-127; B = index(121, N*K, 255) - 127 |
| int8_linear             | int8_linear(A, B, sx = 0x1.2p-7, sw)                   | sw = abs(gen(122, [45], -8, 4, 0))                    |
| int8_quantize           | quantize(x, s) per row                                 | x 123 [37,129] -8,12,16,FIN(2^20); s = abs(gen(124, [37], -6, 4, 0)) |
| int8_dequantize         | dequantize(q, s)                                       | q from int8_quantize                                  |
| lsq_init                | lsq_init(x) per row (inv_c = f32(1/129))               | x 123                                                 |
| lsq_backward            | lsq_backward(x, s, gxh, f32(1/sqrt(129*127))) -> gx, gs | gxh 125 [37,129] -3,8,16,FIN(2^10)                  |
| causal_attention        | causal_attention(q, k, v, f32(1/3)) -> o, p            | q 150 [3,200,9], k 151 [3,100,9] -3,6,16,FIN(2^10); v 152 [3,100,9] -3,8,16,FIN(2^20) |
| causal_attention_backward | causal_attention_backward(go, q, k, v, p, same scale) -> gq, gk, gv | go 153 [3,200,9] -3,8,16,FIN(2^10) |
| exact_matmul            | exact_matmul(A, Bt.T) (contract §11)                   | A 130 [37,129], Bt 131 [45,129] -20,40,16,FIN(2^20)  |
| exact_matmul_special    | exact_matmul(A, Bt.T)                                  | A 132 [19,70], Bt 133 [33,70] -60,120,512,SPEC       |
| exact_matmul_k1031      | exact_matmul(A, Bt.T)                                  | A 134 [9,1031], Bt 135 [7,1031] -2,4,16,FIN(2^20)    |
| exact_matmul_chunks     | exact_matmul(A, Bt.T), two residue chunks of K         | A 136 [2,140000], Bt 137 [3,140000] -2,4,0           |
| exact_band_scores, _mix, _mix_t | the §11 band products, batch 2, G 2, T 150, D 5, W 70 | a 138 [2,300,5], b 139 [2,150,5] -20,40,16,FIN(2^20); p 210 [2,300,70] -30,30,16,FIN(2^20), +0.0 before key 0 |
| exact_band_*_wide       | the same, W 200 (> T)                                  | p 340 [2,300,200]                                     |

seed = 0x5EED2024, seed64 = (mix(seed ^ 0x01234567) << 32) | mix(seed). Multiple outputs are
hashed concatenated in the order listed; int8 and int32 outputs as sign-extended int32 words.
"""

import functools
import hashlib
import os
import platform
import shutil
import sys
import time
from fractions import Fraction
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from tiny import run_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_DIR = os.path.join(ROOT, "kernels", "cpu")
COMMON_DIR = os.path.join(ROOT, "kernels", "common")  # ids.h, shared with the CUDA kernels
SOURCES = sorted(os.path.join(CPU_DIR, f) for f in os.listdir(CPU_DIR)
                 if f.endswith(".cpp") and f != "binding.cpp")
BASE_FLAGS = ["-std=c++17", "-pthread", "-Wno-psabi", "-I", CPU_DIR, "-I", COMMON_DIR]
CONTRACT = ["-ffp-contract=off"]

SEED = 0x5EED2024
M32 = 0xFFFFFFFF


def _cpu_flags():
    """The CPU's feature flags (/proc/cpuinfo), less those REPOPS_TEST_CPU_LACKS names (a
    comma-separated list: tests/test_selftest.py's own check of what a CPU without them reports)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((l for l in f if l.startswith(("flags", "Features"))), "")
    except OSError:
        line = ""
    return set(line.split(":", 1)[-1].split()) - set(os.environ.get("REPOPS_TEST_CPU_LACKS", "").split(","))


def _has_fma():
    if platform.machine() in ("aarch64", "arm64"):
        return True  # FMA is part of AArch64; -ffp-contract=fast alone uses it
    return "fma" in _cpu_flags()


def _fma_flags():
    return [] if platform.machine() in ("aarch64", "arm64") else ["-mfma"]


# name -> (compiler, flags); None compiler = not available (the test using it skips)
VARIANTS = {
    "gcc_O0": ("g++", ["-O0"] + CONTRACT),
    "gcc_O3_native": ("g++", ["-O3", "-march=native"] + CONTRACT),
    # the AVX2 path (6x16 matmul tile) even where native is AVX-512 (8x16)
    "gcc_O3_avx2": ("g++" if {"avx2", "fma"} <= _cpu_flags() else None, ["-O3", "-march=x86-64-v3"] + CONTRACT),
    # AVX-512 without VNNI (Skylake-SP): the int8 GEMM's vpmaddwd path, where native has VNNI
    # (vpdpbusd); on AVX-512 machines without VNNI this is the native path again
    "gcc_O3_avx512_novnni": ("g++" if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= _cpu_flags() else None,
                             ["-O3", "-march=skylake-avx512"] + CONTRACT),
    "clang_O2": ("clang++" if shutil.which("clang++") else None, ["-O2"] + CONTRACT),
    "gcc_O2_fma_contract": ("g++" if _has_fma() else None, ["-O2", "-march=native", "-ffp-contract=fast"] + _fma_flags()),
    # FTZ/DAZ off in hardware, flushing in rp::add/sub/mul (contract.h RP_FLUSH_SOFT: riscv64's path)
    "gcc_O2_soft_flush": ("g++", ["-O2", "-march=native", "-DRP_SOFT_FLUSH"] + CONTRACT),
    # the AMX-INT8 path's host code (int8.cpp's gemm_amx, exact.cpp's exact_product_tiled) on any CPU:
    # tests/amx_emulate.cpp in place of int8_amx.cpp (EMULATED), run with --int8=amx
    "gcc_O2_amx_emulated": ("g++", ["-O2", "-march=native"] + CONTRACT),
}
AMX_EMULATOR = os.path.join(ROOT, "tests", "amx_emulate.cpp")
EMULATED = {"gcc_O2_amx_emulated": ("int8_amx.cpp", AMX_EMULATOR)}   # build: (source replaced, by)


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    """Builds every available variant, two compilers at a time (the machine may be shared)."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    out_dir = tmp_path_factory.mktemp("selftest")

    def build(item):
        name, (cxx, flags) = item
        if cxx is None:
            return name, None
        exe = str(out_dir / name)
        sources = SOURCES
        if name in EMULATED:
            replaced, by = EMULATED[name]
            sources = [s for s in SOURCES if os.path.basename(s) != replaced] + [by]
        cmd = [cxx] + flags + BASE_FLAGS + sources + ["-o", exe]
        r = run_process(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError(f"building the self-test failed: {' '.join(cmd)}\n{r.stderr}")
        return name, exe

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(build, VARIANTS.items()))


def _run(*cmd):
    t0 = time.perf_counter()
    r = run_process(list(cmd), capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - t0
    assert r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr}"
    lines = r.stdout.splitlines()
    digests = {}
    for line in lines:
        name, hexd = line.split()
        assert len(hexd) == 64 and name not in digests, line
        digests[name] = hexd
    return lines, digests, r.stderr, elapsed


# The self-test's options per build: these run the build's own SIMD int8 GEMM (VNNI, vpmaddwd, or
# plain C) where AMX-INT8 would otherwise be chosen at run time. The FMA-contracted build runs the
# 256-bit matmul tile, whose multiplies the compiler emits (and so fuses with the adds): the
# 512-bit tile's multiply is an asm instruction (matmul.cpp's product), which no compiler fuses.
RUN_ARGS = {"gcc_O3_avx2": ["--int8=vnni"], "gcc_O3_avx512_novnni": ["--int8=vnni"], "clang_O2": ["--int8=vnni"],
            "gcc_O2_fma_contract": ["--matmul=256"], "gcc_O2_amx_emulated": ["--int8=amx"]}


@pytest.fixture(scope="module")
def results(binaries):
    return {name: _run(exe, *RUN_ARGS.get(name, [])) for name, exe in binaries.items() if exe is not None}


# ------------------------------------------------------------------------------------------------
# 1. builds agree
# ------------------------------------------------------------------------------------------------
def test_o0_runs_fast_and_clean(results):
    lines, digests, stderr, elapsed = results["gcc_O0"]
    assert stderr == "", stderr  # no canary complaint under the contract's flags
    assert list(digests) == EXPECTED_NAMES + CPU_ONLY_NAMES
    assert elapsed < 10.0, f"the -O0 self-test took {elapsed:.1f} s (meant to be < 2 s)"


def test_gcc_O3_native_matches_O0(results):
    assert results["gcc_O3_native"][0] == results["gcc_O0"][0]
    assert results["gcc_O3_native"][2] == ""


@pytest.mark.parametrize("options", [("--matmul=256", "--int8=vnni"), ("--matmul=512", "--int8=vnni"),
                                     ("--matmul=256", "--int8=amx"), ("--matmul=512", "--int8=amx")])
def test_native_kernel_versions_match_O0(binaries, results, options):
    """The native build with each matmul tile (256- or 512-bit vectors) and int8 GEMM path (the
    SIMD path, VNNI here, or AMX-INT8) this CPU has, chosen at run time: the same digests."""
    r = run_process([binaries["gcc_O3_native"], *options], capture_output=True, text=True, timeout=120)
    if r.returncode == 3:
        pytest.skip(f"hardware: {' '.join(options)}: {r.stderr.strip()}")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.splitlines() == results["gcc_O0"][0]


def test_amx_host_code_emulated_matches_O0(results):
    """The AMX-INT8 path's code around the tiles (int8.cpp's gemm_amx; exact.cpp's fused blocks of
    eight residue GEMMs, its panels and scaled residues; K = 1031 unfused), with the tile GEMM
    emulated in plain C++ (tests/amx_emulate.cpp): the same digests. Runs on every CPU; the tiles
    themselves are checked on AMX hardware (test_native_kernel_versions_match_O0, --int8=amx)."""
    assert results["gcc_O2_amx_emulated"][0] == results["gcc_O0"][0]
    assert results["gcc_O2_amx_emulated"][2] == ""


def test_gcc_O3_avx2_matches_O0(results):
    if "gcc_O3_avx2" not in results:
        pytest.skip("hardware: this CPU has no AVX2 + FMA (x86-64-v3), so the AVX2 build cannot run here")
    assert results["gcc_O3_avx2"][0] == results["gcc_O0"][0]
    assert results["gcc_O3_avx2"][2] == ""


def test_gcc_O3_avx512_without_vnni_matches_O0(results):
    if "gcc_O3_avx512_novnni" not in results:
        pytest.skip("hardware: this CPU has no AVX-512 (F, BW, VL, DQ), so the Skylake-SP build cannot run here")
    assert results["gcc_O3_avx512_novnni"][0] == results["gcc_O0"][0]
    assert results["gcc_O3_avx512_novnni"][2] == ""


def test_clang_matches_gcc(results):
    if "clang_O2" not in results:
        pytest.skip("clang++ is not installed (Debian/Ubuntu package: clang)")
    assert results["clang_O2"][0] == results["gcc_O0"][0]
    assert results["clang_O2"][2] == ""


def test_digests_catch_contraction(results):
    """With a*b+c fused into FMA the matmul digests (and the canary) must change."""
    if "gcc_O2_fma_contract" not in results:
        pytest.skip("hardware: this CPU has no FMA")
    ref = results["gcc_O0"][1]
    fused = results["gcc_O2_fma_contract"][1]
    changed = [n for n in ref if fused[n] != ref[n]]
    assert "matmul_nn" in changed, "an FMA build left the matmul digest unchanged: the digest does not catch contraction"
    assert all(n in changed for n in EXPECTED_NAMES if n.startswith("matmul_"))
    assert "canary" in changed


ARM_CXX, QEMU_ARM = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
RISCV_CXX, QEMU_RISCV = shutil.which("riscv64-linux-gnu-g++"), shutil.which("qemu-riscv64")
RISCV_SYSROOT = "/usr/riscv64-linux-gnu"  # the cross toolchain's libraries, for qemu-riscv64 -L
# name -> (cross compiler, its flags, qemu-user command, Debian packages): AArch64 (NEON,
# FPCR.FZ plus the product fix-up) and riscv64 (no flush-to-zero mode: contract.h switches to
# the software flush, RP_FLUSH_SOFT), each another code generator.
CROSS = {"aarch64": (ARM_CXX, ["-O3", "-static"], [QEMU_ARM], "g++-aarch64-linux-gnu and qemu-user"),
         "riscv64": (RISCV_CXX, ["-O2"], [QEMU_RISCV, "-L", RISCV_SYSROOT], "g++-riscv64-linux-gnu and qemu-user")}


@pytest.mark.parametrize("isa", CROSS)
def test_cross_build_matches(results, tmp_path, isa):
    """The program built for another instruction set and run under qemu-user prints the same
    digests: the contract holds across instruction sets."""
    cxx, flags, runner, packages = CROSS[isa]
    if platform.machine() != "x86_64":
        pytest.skip(f"hardware: the {isa} cross-check runs from an x86-64 machine")
    if not (cxx and runner[0]):
        pytest.skip(f"no {isa} cross compiler or qemu-user (Debian packages {packages})")
    exe = str(tmp_path / f"selftest_{isa}")
    cmd = [cxx] + flags + CONTRACT + BASE_FLAGS + SOURCES + ["-o", exe]
    r = run_process(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"building for {isa} failed: {' '.join(cmd)}\n{r.stderr}"
    lines, _, stderr, _ = _run(*runner, exe)
    assert stderr == "" and lines == results["gcc_O0"][0]


def test_soft_flush_build_matches(results):
    """-DRP_SOFT_FLUSH: FTZ/DAZ off in hardware, rp::add/sub/mul flush in software (the riscv64
    path, natively): the same digests."""
    assert results["gcc_O2_soft_flush"][0] == results["gcc_O0"][0]
    assert results["gcc_O2_soft_flush"][2] == ""


def test_soft_flush_is_needed(results, tmp_path):
    """The digests catch a software-flush build that does not flush: with rp::mul and rp::add
    reduced to the plain operators (and FTZ/DAZ still off) they change."""
    src = tmp_path / "cpu"
    shutil.copytree(CPU_DIR, src)
    h = (src / "contract.h").read_text()
    for old, new in (("return mul_fix(a * b, a * (b * 0x1p24f));", "return a * b;"),
                     ("{ return flush_sum(daz(a) + daz(b)); }", "{ return a + b; }")):
        assert old in h, f"contract.h no longer contains {old!r}: update this test"
        h = h.replace(old, new)
    (src / "contract.h").write_text(h)
    exe = str(tmp_path / "no_flush")
    srcs = [str(src / os.path.basename(f)) for f in SOURCES]
    flags = ["-std=c++17", "-pthread", "-Wno-psabi", "-I", str(src), "-I", COMMON_DIR]
    run_process(["g++", "-O1", "-DRP_SOFT_FLUSH"] + CONTRACT + flags + srcs + ["-o", exe], check=True)
    _, digests, _, _ = _run(exe)
    ref = results["gcc_O0"][1]
    changed = [n for n in ref if digests[n] != ref[n]]
    # (the matmul lines do not notice: a subnormal term is lost when added to their sums)
    assert {"mul", "add", "scale", "canary", "rope", "swiglu"} <= set(changed), changed


# contract §3 at the edge of the normal range: products whose exact value is near 2^-126.
WINDOW_PROGRAM = r"""
#include <cstdio>
#include "kernels.h"
void rp_parallel_for(int64_t n, int64_t, void (*fn)(void*, int64_t, int64_t), void* ctx) { fn(ctx, 0, n); }
int rp_threads() { return 1; }
static const uint32_t kPairs[][2] = {PAIRS};
int main() {
  constexpr int n = sizeof(kPairs) / sizeof(kPairs[0]);
  static float a[n], b[n], scalar[n], vec[n + rp::VL], kern[n], raw[n], A[n * n], B[n * 16], C[n * 16];
  for (int i = 0; i < n; ++i) a[i] = rp::fl(kPairs[i][0]), b[i] = rp::fl(kPairs[i][1]);
  rp_mul(a, b, kern, n);                                      // the elementwise kernel
  for (int i = 0; i < n; ++i) {                               // C[i, j] = 0 + ... + a[i] b[i] + ... 0
    for (int k = 0; k < n; ++k) A[i * n + k] = k == i ? a[i] : 0.0f;
    for (int j = 0; j < 16; ++j) B[i * 16 + j] = b[i];
  }
  rp_matmul(A, 0, n, 1, B, 0, 16, 1, C, 1, n, 16, n);        // the matmul (SIMD micro-kernel)
  rp::FpModeGuard guard;
  for (int i = 0; i < n; ++i) {
    volatile float x = a[i], y = b[i];
    raw[i] = x * y;                                           // the plain hardware product
    scalar[i] = rp::mul(a[i], b[i]);
  }
  for (int i = 0; i < n; i += rp::VL)                        // SIMD, VL lanes at a time
    rp::storen(vec + i, rp::mul(rp::loadn(a + i, n - i), rp::loadn(b + i, n - i)), n - i);
  // an ordinary matmul (exponents in [-8, 8): every product >= 2^-126, so AArch64 and the
  // software flush run the plain micro-kernel, matmul.cpp plain_ok) against the contract's loop
  constexpr int M = 37, K = 300, N = 45;
  static float X[M * K], Y[K * N], Z[M * N];
  uint32_t h = 12345;
  auto next = [&h]() { h = h * 1664525u + 1013904223u; return h; };
  for (int i = 0; i < M * K + K * N; ++i)
    (i < M * K ? X[i] : Y[i - M * K]) = (float)((int32_t)(next() >> 8) - 0x800000) * rp::pow2((int32_t)(next() >> 28) - 31);
  rp_matmul(X, 0, K, 1, Y, 0, N, 1, Z, 1, M, N, K);
  int plain_bad = 0;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float acc = 0.0f;
      for (int k = 0; k < K; ++k) acc = rp::add(acc, rp::mul(X[i * K + k], Y[k * N + j]));
      plain_bad += rp::bits(acc) != rp::bits(Z[i * N + j]);
    }
  std::printf("ordinary-matmul-mismatches %d\n", plain_bad);
  for (int i = 0; i < n; ++i) {
    bool same_row = true;
    for (int j = 1; j < 16; ++j) same_row = same_row && rp::bits(C[i * 16 + j]) == rp::bits(C[i * 16]);
    std::printf("%08x %08x %08x %08x %s %08x\n", rp::bits(scalar[i]), rp::bits(vec[i]), rp::bits(kern[i]),
                rp::bits(C[i * 16]), same_row ? "row" : "ROW-DIFFERS", rp::bits(raw[i]));
  }
}
"""


def _f32_bits(x):
    return int(np.array(x, dtype=np.float32).view(np.uint32))


def _exact(u):
    """The float32 with bit pattern u as an exact Fraction (a, b below are normal)."""
    from fractions import Fraction
    e, m = (u >> 23) & 0xFF, u & 0x7FFFFF
    v = Fraction((m | 0x800000) if e else m, 2**23) * Fraction(2) ** ((e if e else 1) - 127)
    return -v if u >> 31 else v


def contract_product(ua, ub):
    """Contract §3 for a * b (normal a, b): round the exact product to 24 significant bits with
    an unbounded exponent (nearest, ties to even), flush to a signed zero if below 2^-126."""
    from fractions import Fraction
    p = _exact(ua) * _exact(ub)
    sign = ((ua ^ ub) >> 31) << 31
    q, e = abs(p), 0
    while q >= 2**24:
        q, e = q / 2, e + 1
    while q < 2**23:
        q, e = q * 2, e - 1
    r = q.numerator // q.denominator  # q in [2^23, 2^24): round to an integer, ties to even
    frac = q - r
    if frac > Fraction(1, 2) or (frac == Fraction(1, 2) and r % 2 == 1):
        r += 1
    value = Fraction(r) * Fraction(2) ** e
    if value < Fraction(1, 2**126):
        return sign
    return sign | _f32_bits(float(value))  # value is a float32, exactly representable in float64


def _position(ua, ub):
    """Where the exact |a * b| lies relative to 2^-126, as 2^126 |a b| - 1 (a Fraction)."""
    return abs(_exact(ua) * _exact(ub)) * 2**126 - 1


def window_pairs():
    """(a, b) bit patterns whose exact products lie in each band around 2^-126, both signs: below
    the double-rounding band, in it ([1 - 2^-24, 1 - 2^-25) times 2^-126: x86 flushes, IEEE
    gradual underflow rounds up to 2^-126), in the AArch64 window ([1 - 2^-25, 1): x86 rounds up
    to 2^-126, FPCR.FZ flushes), [1, 1 + 2^-24] (2^-126 everywhere) and above; plus the exact
    edges 2^-126 (1 - 2^-24), (1 - 2^-25) (a tie, to even: 2^-126), 1, (1 + 2^-24)."""
    from fractions import Fraction
    f = lambda x: _f32_bits(x)  # noqa: E731
    edges = [(f(1 - 2.0**-24), f(2.0**-126)),                      # 1 - 2^-24 exactly
             (f(18631 * 2.0**-75), f(1801 * 2.0**-76)),            # (2^25 - 1) 2^-151 = 1 - 2^-25
             (f(2.0**-63), f(2.0**-63)),                           # 1
             (f(24929 * 2.0**-75), f(673 * 2.0**-75)),             # (2^24 + 1) 2^-150 = 1 + 2^-24
             (0x1FFFFFFF, 0x20000000), (0x20000001, 0x1FFFFFFE)]
    bands = [(-Fraction(1, 2**22), -Fraction(1, 2**24)), (-Fraction(1, 2**24), -Fraction(1, 2**25)),
             (-Fraction(1, 2**25), Fraction(0)), (Fraction(0), Fraction(1, 2**24) + Fraction(1, 2**60)),
             (Fraction(1, 2**24) + Fraction(1, 2**60), Fraction(1, 2**21))]
    found = [[] for _ in bands]
    rng = np.random.default_rng(13)
    while min(len(x) for x in found) < 6:
        ua = int(rng.integers(0x3F800000, 0x40000000)) - (int(rng.integers(40, 80)) << 23)
        ub0 = _f32_bits(2.0**-126 / float(np.array(ua, dtype=np.uint32).view(np.float32)))
        for ub in range(ub0 - 2, ub0 + 3):
            pos = _position(ua, ub)
            for k, (lo, hi) in enumerate(bands):
                if lo <= pos < hi and len(found[k]) < 6:
                    found[k].append((ua, ub))
    pairs = edges + [p for band in found for p in band]
    # both signs: negate a, b or both
    signed = []
    for i, (ua, ub) in enumerate(pairs):
        signed += [(ua, ub), (ua | (1 << 31), ub), (ua, ub | (1 << 31)), (ua | (1 << 31), ub | (1 << 31))][: 2 + (i % 3)]
    return signed


# Every self-test build under the contract's flags: VARIANTS without the deliberately fused one
# and the AMX-emulating one (a source swapped, not a compiler or flag), then the two cross builds.
# Each is its own case of test_ftz_window_gives_x86_bits_everywhere, so the test report names
# every build that ran and every one that could not (its own skip).
WINDOW_BUILDS = [name for name in VARIANTS if name != "gcc_O2_fma_contract" and name not in EMULATED] + list(CROSS)


def window_build(name):
    """(compiler, flags, runner, kind) of a window build, or the reason this machine cannot make
    it (a hardware reason starts with "hardware: ", a missing tool's does not)."""
    if name in CROSS:
        cxx, flags, runner, packages = CROSS[name]
        if platform.machine() != "x86_64":
            return f"hardware: the {name} window build is cross-checked from an x86-64 machine only"
        if not (cxx and runner[0]):
            return f"the {name} window build needs {packages}"
        return cxx, flags + CONTRACT, runner, name
    cxx, flags = VARIANTS[name]
    if cxx is None:
        return ("clang++ is not installed (Debian/Ubuntu package: clang)" if name == "clang_O2" else
                f"hardware: this CPU cannot run the {name} window build ({' '.join(flags[:2])})")
    return cxx, flags, [], "soft" if "-DRP_SOFT_FLUSH" in flags else "native"


@functools.lru_cache(maxsize=None)
def window_case():
    """(pairs, contract bits, in the AArch64 window?, in the double-rounding band?) of
    window_pairs, computed once for all the builds."""
    pairs = window_pairs()
    want = [contract_product(a, b) for a, b in pairs]
    in_window = [-Fraction(1, 2**25) <= _position(a, b) < 0 for a, b in pairs]
    in_band = [-Fraction(1, 2**24) <= _position(a, b) < -Fraction(1, 2**25) for a, b in pairs]
    assert sum(in_window) >= 12 and sum(in_band) >= 12
    return pairs, want, in_window, in_band


def test_window_builds_are_the_self_tests():
    """The window cases are the self-test's 8 builds under the contract's flags, the AMX-emulating
    one aside (docs/testing.md says 8), each a case of its own."""
    assert WINDOW_BUILDS == ["gcc_O0", "gcc_O3_native", "gcc_O3_avx2", "gcc_O3_avx512_novnni", "clang_O2",
                             "gcc_O2_soft_flush", "aarch64", "riscv64"]


def test_a_cpu_without_avx512_reports_the_window_build_it_cannot_run():
    """This machine seen without AVX-512 (REPOPS_TEST_CPU_LACKS=avx512f, in a pytest subprocess
    under REPOPS_STRICT=1): the window check still has its 8 cases, and the Skylake-SP build's is
    a hardware skip of its own that names the build, not a build quietly left out."""
    env = dict(os.environ, REPOPS_TEST_CPU_LACKS="avx512f", REPOPS_STRICT="1", COLUMNS="1000")
    test = f"{os.path.abspath(__file__)}::test_ftz_window_gives_x86_bits_everywhere"

    def pytest_run(*args):
        return run_process([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)

    proc = pytest_run("--collect-only", test)
    assert proc.returncode == 0 and "8 tests collected" in proc.stdout, proc.stdout + proc.stderr
    proc = pytest_run("-rs", test + "[gcc_O3_avx512_novnni]")
    assert proc.returncode == 0 and "1 skipped" in proc.stdout, proc.stdout + proc.stderr
    assert "hardware: this CPU cannot run the gcc_O3_avx512_novnni window build" in proc.stdout, proc.stdout


@pytest.mark.parametrize("build", WINDOW_BUILDS)
def test_ftz_window_gives_x86_bits_everywhere(tmp_path, build):
    """Contract §3 with no exception: products whose exact value lies around 2^-126 (the AArch64
    window, both sides of its edges, the double-rounding band below it) give the contract's bits
    through rp::mul (scalar and SIMD), the elementwise kernel and the matmul, on each build the
    self-test makes (g++ -O0 / -O3 native / AVX2 / AVX-512 without VNNI, clang++, the
    software-flush build, and under qemu-user AArch64 (FPCR.FZ + fix-up) and riscv64 (no hardware
    flush)), one case per build: a build this machine cannot make or run is that case's skip. The
    expected bits are computed here with exact rationals. The plain hardware product is printed
    too: on AArch64 it must differ in the window (else the inputs miss it)."""
    spec = window_build(build)
    if isinstance(spec, str):
        pytest.skip(spec)
    cxx, flags, runner, kind = spec
    pairs, want, in_window, in_band = window_case()
    src = tmp_path / "window.cpp"
    src.write_text(WINDOW_PROGRAM.replace("PAIRS", ", ".join(f"{{{a:#x}u, {b:#x}u}}" for a, b in pairs)))
    sources = [str(src), os.path.join(CPU_DIR, "elementwise.cpp"), os.path.join(CPU_DIR, "matmul.cpp")]
    exe = str(tmp_path / build)
    run_process([cxx] + flags + BASE_FLAGS + sources + ["-o", exe], check=True)
    out = run_process(runner + [exe], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "ordinary-matmul-mismatches 0", f"{build}: {out[0]}"
    out = out[1:]
    assert len(out) == len(pairs)
    raw_differs = []
    for (a, b), w, line in zip(pairs, want, out):
        scalar, vec, kern, mm, row, raw = line.split()
        mm_want = w & 0x7FFFFFFF if w & 0x7FFFFFFF == 0 else w  # acc = +0.0 + product: +0 for -0
        assert (int(scalar, 16), int(vec, 16), int(kern, 16)) == (w, w, w), f"{build}: {a:08x} * {b:08x}: {line}, want {w:08x}"
        assert int(mm, 16) == mm_want and row == "row", f"{build}: matmul {a:08x} * {b:08x}: {line}, want {mm_want:08x}"
        raw_differs.append(int(raw, 16) != w)
        if kind == "native" and platform.machine() == "x86_64":
            assert int(raw, 16) == w, f"{build}: x86 hardware {a:08x} * {b:08x} = {raw}, the contract says {w:08x}"
    if kind == "aarch64":  # FPCR.FZ alone flushes every window product, and only those
        assert raw_differs == in_window
    if kind in ("soft", "riscv64"):  # IEEE subnormals round the band up to 2^-126
        assert all(d for d, band in zip(raw_differs, in_band) if band)
    print(f"window build {build}: {len(pairs)} products give the contract's bits")


# ------------------------------------------------------------------------------------------------
# 2. the same digests through the torch extension, from a NumPy copy of the generator
# ------------------------------------------------------------------------------------------------
def _mix_int(x):
    x &= M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    x ^= x >> 16
    return x


def _mix(x):
    x = x.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def _hashes(stream, n):
    i = np.arange(n, dtype=np.uint64)
    h1 = _mix((i * np.uint64(0x9E3779B9) + np.uint64(_mix_int(stream ^ SEED))) & np.uint64(M32))
    h2 = _mix((h1.astype(np.uint64) + np.uint64(0x632BE5AB)) & np.uint64(M32))
    return h1, h2


def _f32hex(*hexes):
    return np.array([float.fromhex(h) for h in hexes], dtype=np.float32)


def _fin(big):
    t = _f32hex("0x0p+0", "-0x0p+0", "0x1p-149", "-0x1p-149", "0x1.fffffcp-127", "-0x1.fffffcp-127",
                "0x1p-126", "-0x1p-126", "0x0p+0", "0x0p+0", "0x1p+0", "-0x1p+0", "0x1.000002p+0",
                "0x1p-60", "-0x1p-60", "0x1p-1")
    t[8], t[9] = np.float32(big), np.float32(-big)
    return t


SPEC = _f32hex("0x0p+0", "-0x0p+0", "inf", "-inf", "nan", "0x1p-149", "-0x1.fffffcp-127", "0x1p-126",
               "0x1.fffffep+127", "-0x1.fffffep+127", "0x1.62e43p+6", "-0x1.5d589ep+6", "0x1.62e432p+6",
               "0x1p+16", "0x1.000002p+16", "0x1p+0")
SPEC[4] = np.uint32(0x7FC00000).view(np.float32)
SPEC_FN = _f32hex("0x0p+0", "-0x0p+0", "inf", "-inf", "nan", "0x1p-149", "-0x1.fffffcp-127", "-0x1p-126",
                  "0x1.fffffep+127", "-0x1.fffffep+127", "0x1.8p-1", "-0x1.7ffffep-1", "0x1.4p+3", "0x1.cp-1",
                  "-0x1.f5c29p+1", "0x1p+64")
SPEC_FN[4] = np.uint32(0x7FC00000).view(np.float32)


def _apply_specials(x, h2, period, table):
    if period:
        sel = (h2 >> np.uint32(20)) % np.uint32(period) == 0
        x[sel] = table[(h2 & np.uint32(15))[sel]]
    return x


def gen(stream, shape, emin, erange, period=0, table=None):
    n = int(np.prod(shape))
    h1, h2 = _hashes(stream, n)
    mant = ((h1 >> np.uint32(8)).astype(np.int64) - 0x800000).astype(np.float32)  # exact
    e = emin + ((h2 >> np.uint32(4)) % np.uint32(erange)).astype(np.int64)
    scale = ((e - 23 + 127) << 23).astype(np.uint32).view(np.float32)  # 2^(e-23), exact
    x = mant * scale  # exact: a 24-bit integer times a power of two, never subnormal
    return _apply_specials(x, h2, period, table).reshape(shape)


def bitsgen(stream, n, period, table):
    h1, h2 = _hashes(stream, n)
    return _apply_specials(h1.view(np.float32).copy(), h2, period, table)


def index(stream, n, mod):
    h1, _ = _hashes(stream, n)
    return (h1 % np.uint32(mod)).astype(np.int64)


def _seed64():
    return (_mix_int(SEED ^ 0x01234567) << 32) | _mix_int(SEED)


def _f32_bytes(t):
    u = np.ascontiguousarray(t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t, dtype=np.float32)
    u = u.reshape(-1).view(np.uint32).copy()
    nan = ((u & np.uint32(0x7F800000)) == np.uint32(0x7F800000)) & ((u & np.uint32(0x007FFFFF)) != 0)
    u[nan] = np.uint32(0x7FC00000)
    return u.astype("<u4").tobytes()


def _digest(*outs):
    h = hashlib.sha256()
    for o in outs:
        h.update(_f32_bytes(o))
    return h.hexdigest()


def to_tensor(a):
    return torch.from_numpy(np.ascontiguousarray(a).copy())


# Host scalars of the adamw line: lr 3e-4, betas (0.9, 0.95), eps 1e-8, wd 0.1, step 3.
ADAMW_HEX = ["0x1.3a92a4p-12", "0x1.ccccccp-1", "0x1.e66666p-1", "0x1.99999ap-4", "0x1.99999ap-5",
             "0x1.5798eep-27", "0x1.fffc12p-1", "0x1.d85322p+1", "0x1.c0baacp+2"]

# tanh, erf and the functions derived from the canonical ones (contract §5.6, §5.8, §5.9), streams 160..
DERIVED_FUNCTIONS = ["tanh", "erf", "sigmoid", "gelu", "gelu_tanh", "gelu_grad", "gelu_tanh_grad"]
EXPECTED_NAMES = [
    "matmul_nn", "matmul_tn", "matmul_nt", "matmul_tt", "matmul_batched", "matmul_bcast_b",
    "matmul_bcast_a", "matmul_big", "rmsnorm", "rmsnorm_backward", "rope_tables_long", "rope_tables",
    "rope", "rope_backward", "causal_softmax", "causal_softmax_backward", "swiglu", "swiglu_backward",
    "cross_entropy", "cross_entropy_backward", "embedding", "embedding_backward", "add", "mul", "scale",
    "dropout", "csum_rows", "csum_rows_long", "adamw", "clip_grad", "clip_grad_chunks", "exp", "log", "recip", "rsqrt",
    "sqrt", "sin", "cos", "tanh", "erf", "sigmoid", "gelu", "gelu_tanh", "gelu_grad", "gelu_tanh_grad", "philox", "uniform", "normal", "canary", "int8_matmul", "int8_linear",
    "int8_quantize", "int8_dequantize", "lsq_init", "lsq_backward"]
# The lines of kernels only the CPU has, printed last (the CUDA and Metal comparisons check
# EXPECTED_NAMES): attention head by head (§8 attention; the model composes it from matmul and
# causal_softmax elsewhere) and the exact matmul (contract §11).
CPU_ONLY_NAMES = ["causal_attention", "causal_attention_backward",
                  "exact_matmul", "exact_matmul_special", "exact_matmul_k1031", "exact_matmul_chunks",
                  "exact_band_scores", "exact_band_mix", "exact_band_mix_t",
                  "exact_band_scores_wide", "exact_band_mix_wide", "exact_band_mix_t_wide"]


def torch_digests(device="cpu", ops=None, suffix=None):
    """The self-test's digests computed through torch.ops.repops (or `ops`, an object with the
    same functions) on `device` (tests/test_cuda.py and tests/test_mps.py run this on a GPU). Ops
    without tensor inputs use their <name>_<device type> twins on a GPU (or <name><suffix>)."""
    import repops

    def T(a):  # noqa: N802 - short: it wraps every input below
        return to_tensor(a).to(device)

    ops = ops or torch.ops.repops
    if suffix is None:
        suffix = "" if device == "cpu" else "_" + torch.device(device).type

    def no_tensor_op(name):
        return getattr(ops, name + suffix)

    d = {}
    fin20 = _fin(2.0**20)

    # matmul
    G = lambda s, shape: T(gen(s, shape, -2, 4, 16, fin20))  # noqa: E731
    A, B, At, Bt = G(1, (37, 129)), G(2, (129, 45)), G(3, (129, 37)), G(4, (45, 129))
    d["matmul_nn"] = _digest(ops.matmul(A, B))
    d["matmul_tn"] = _digest(ops.matmul(At.t(), B))
    d["matmul_nt"] = _digest(ops.matmul(A, Bt.t()))
    d["matmul_tt"] = _digest(ops.matmul(At.t(), Bt.t()))
    A3, B3, B2, A2t = G(5, (3, 19, 70)), G(6, (3, 70, 33)), G(7, (70, 33)), G(8, (70, 19))
    d["matmul_batched"] = _digest(ops.matmul(A3, B3))
    d["matmul_bcast_b"] = _digest(ops.matmul(A3, B2))
    d["matmul_bcast_a"] = _digest(ops.matmul(A2t.t(), B3))
    d["matmul_big"] = _digest(ops.matmul(G(9, (100, 300)), G(10, (260, 300)).t()))

    # rmsnorm
    eps = float.fromhex("0x1.4f8b58p-17")
    assert eps == repops.f32(1e-5)
    x, w = T(gen(20, (37, 129), -3, 8, 16, fin20)), T(gen(21, (129,), -1, 2))
    gy = T(gen(22, (37, 129), -3, 8, 16, _fin(2.0**10)))
    y, rstd = ops.rmsnorm(x, w, eps)
    d["rmsnorm"] = _digest(y, rstd)
    d["rmsnorm_backward"] = _digest(*ops.rmsnorm_backward(gy, x, w, rstd))

    # rope
    d["rope_tables_long"] = _digest(*no_tensor_op("rope_tables")(3000, 8, 500000.0))
    c, s = no_tensor_op("rope_tables")(37, 18, 10000.0)
    d["rope_tables"] = _digest(c, s)
    d["rope"] = _digest(ops.rope(T(gen(30, (2, 37, 3, 18), -3, 8, 16, fin20)), c, s, False))
    d["rope_backward"] = _digest(ops.rope(T(gen(31, (2, 3, 37, 18), -3, 8, 16, fin20)), c, s, True))

    # causal softmax
    scale = float.fromhex("0x1.6a09e6p-3")
    assert scale == repops.f32(1.0 / 32**0.5)
    P = ops.causal_softmax(T(gen(40, (3, 37, 37), -4, 10, 16, _fin(2.0**12))), scale)
    d["causal_softmax"] = _digest(P)
    gP = T(gen(41, (3, 37, 37), -4, 8, 16, _fin(2.0**10)))
    d["causal_softmax_backward"] = _digest(ops.causal_softmax_backward(gP, P, scale))

    # swiglu
    u = T(gen(50, (37, 90), -6, 14, 16, _fin(2.0**7)))
    d["swiglu"] = _digest(ops.swiglu(u))
    d["swiglu_backward"] = _digest(ops.swiglu_backward(T(gen(51, (37, 45), -3, 8, 16, _fin(2.0**10))), u))

    # cross-entropy
    zloss = float.fromhex("0x1.a36e2ep-14")
    assert zloss == repops.f32(1e-4)
    z, t = T(gen(60, (37, 131), -3, 9, 16, _fin(2.0**10))), T(index(61, 37, 131))
    loss, lse = ops.cross_entropy(z, t, zloss)
    d["cross_entropy"] = _digest(loss, lse)
    d["cross_entropy_backward"] = _digest(
        ops.cross_entropy_backward(torch.tensor(0.75, dtype=torch.float32, device=device), z, t, lse, zloss))

    # embedding
    idx = T(index(71, 70, 20))
    d["embedding"] = _digest(ops.embedding(T(gen(70, (23, 129), -3, 8, 16, fin20)), idx))
    d["embedding_backward"] = _digest(ops.embedding_backward(T(gen(72, (70, 129), -3, 8, 16, fin20)), idx, 23))

    # elementwise, dropout, csum
    a, b = T(gen(80, (10007,), -4, 12, 8, _fin(2.0**100))), T(gen(81, (10007,), -4, 12, 8, _fin(2.0**100)))
    d["add"] = _digest(ops.add(a, b))
    d["mul"] = _digest(ops.mul(a, b))
    d["scale"] = _digest(ops.scale(a, float.fromhex("-0x1.3p-110")))
    seed64 = repops._signed64(_seed64())
    d["dropout"] = _digest(ops.dropout(T(gen(82, (10007,), -4, 12, 8, fin20)), 0.1, seed64, 7, 11))
    d["csum_rows"] = _digest(ops.csum(T(gen(100, (37, 129), -3, 8, 16, fin20))))
    d["csum_rows_long"] = _digest(ops.csum(T(gen(101, (3, 1000), -3, 8, 16, fin20))))

    # optimizer
    hp = [float.fromhex(h) for h in ADAMW_HEX]
    lr, b1, b2, wd, e, step = 3e-4, 0.9, 0.95, 0.1, 1e-8, 3
    f32 = repops.f32
    assert hp == [f32(lr), f32(b1), f32(b2), f32(1 - b1), f32(1 - b2), f32(e), f32(1 - lr * wd),
                  f32(1 / (1 - repops.powi(b1, step))), f32(1 / (1 - repops.powi(b2, step)))]
    p = T(gen(90, (10007,), -3, 8, 16, fin20))
    g = T(gen(91, (10007,), -12, 14, 16, fin20))
    m = T(gen(92, (10007,), -12, 10, 16, fin20))
    v = T(np.abs(gen(93, (10007,), -24, 20, 16, fin20)))  # sign bit cleared
    ops.adamw_(p, g, m, v, *hp)
    d["adamw"] = _digest(p, m, v)
    d["clip_grad"] = _digest(*ops.clip_grad(T(gen(94, (10007,), -4, 8, 16, _fin(2.0**10))), 0.5))
    d["clip_grad_chunks"] = _digest(*ops.clip_grad(T(gen(95, (65613,), -4, 8, 16, _fin(2.0**10))), 0.5))

    # canonical functions
    n = 20011
    d["exp"] = _digest(ops.exp(T(gen(110, (n,), -20, 28, 8, SPEC))))
    for name, stream in (("log", 111), ("recip", 112), ("rsqrt", 113), ("sqrt", 114)):
        d[name] = _digest(getattr(ops, name)(T(bitsgen(stream, n, 8, SPEC))))
    for name, stream in (("sin", 115), ("cos", 116)):
        d[name] = _digest(getattr(ops, name)(T(gen(stream, (n,), -20, 38, 8, SPEC))))
    for stream, name in enumerate(DERIVED_FUNCTIONS, start=160):
        d[name] = _digest(getattr(ops, name)(T(gen(stream, (n,), -20, 27, 8, SPEC_FN))))

    # random numbers
    words = no_tensor_op("philox")(seed64, 3, 5, 1, 1001, 7).cpu().numpy().astype("<u4")
    d["philox"] = hashlib.sha256(words.tobytes()).hexdigest()
    d["uniform"] = _digest(no_tensor_op("uniform")(seed64, 4, 6, 3, 1001))
    d["normal"] = _digest(no_tensor_op("normal")(seed64, 8, 9, 1, 1003))
    d["canary"] = _digest(no_tensor_op("canary")())
    d.update(int8_digests(device, ops))
    return d


def _int_digest(t):
    return hashlib.sha256(np.asarray(t, dtype=np.int64).astype("<i4").tobytes()).hexdigest()


def int8_digests(device="cpu", ops=None):
    """The int8 lines (contract §10) through torch.ops.repops (or `ops`) on `device`."""
    import repops
    ops = ops or torch.ops.repops

    def T(a):  # noqa: N802 - short: it wraps every input below
        return to_tensor(a).to(device)

    ints = lambda s, shape: (index(s, int(np.prod(shape)), 255) - 127).astype(np.int8).reshape(shape)  # noqa: E731
    A, B = ints(120, (37, 1031)), ints(121, (45, 1031))
    flat = A.reshape(-1)
    flat[::7] = np.where(np.arange(flat[::7].size) % 2, -127, 127)
    sw = np.abs(gen(122, (45,), -8, 4))
    d = {"int8_matmul": _int_digest(ops.int8_matmul(T(A), T(B)).cpu())}
    d["int8_linear"] = _digest(ops.int8_linear(T(A), T(B), T(_f32hex("0x1.2p-7")), T(sw)))
    x, s = T(gen(123, (37, 129), -8, 12, 16, _fin(2.0**20))), T(np.abs(gen(124, (37,), -6, 4)))
    q = ops.int8_quantize(x, s)
    d["int8_quantize"] = _int_digest(q.cpu())
    d["int8_dequantize"] = _digest(ops.int8_dequantize(q, s))
    s1 = torch.empty(37, device=device)
    ops.lsq_init_(x, s1)
    d["lsq_init"] = _digest(s1)
    g = float.fromhex("0x1.0002p-7")
    assert g == repops.f32(1.0 / (129 * 127) ** 0.5)
    d["lsq_backward"] = _digest(*ops.lsq_backward(x, s, T(gen(125, (37, 129), -3, 8, 16, _fin(2.0**10))), g))
    return d


def cpu_only_digests(ops=None):
    """The CPU-only lines (CPU_ONLY_NAMES) through torch.ops.repops (or `ops`) on the CPU."""
    import repops
    ops = ops or torch.ops.repops
    d = {}
    batch, G, Tn, D = 3, 2, 100, 9                       # attention: three slices, GQA 2
    scale = float.fromhex("0x1.555556p-2")
    assert scale == repops.f32(1.0 / 3.0)
    q = to_tensor(gen(150, (batch, G * Tn, D), -3, 6, 16, _fin(2.0**10)))
    k = to_tensor(gen(151, (batch, Tn, D), -3, 6, 16, _fin(2.0**10)))
    v = to_tensor(gen(152, (batch, Tn, D), -3, 8, 16, _fin(2.0**20)))
    go = to_tensor(gen(153, (batch, G * Tn, D), -3, 8, 16, _fin(2.0**10)))
    o, p = ops.causal_attention(q, k, v, scale)
    d["causal_attention"] = _digest(o, p)
    d["causal_attention_backward"] = _digest(*ops.causal_attention_backward(go, q, k, v, p, scale))
    for name, M, N, K, s, emin, erange, period, table in (
            ("exact_matmul", 37, 45, 129, 130, -20, 40, 16, _fin(2.0**20)),
            ("exact_matmul_special", 19, 33, 70, 132, -60, 120, 512, SPEC),
            ("exact_matmul_k1031", 9, 7, 1031, 134, -2, 4, 16, _fin(2.0**20)),
            ("exact_matmul_chunks", 2, 3, 140000, 136, -2, 4, 0, None)):
        A = to_tensor(gen(s, (M, K), emin, erange, period, table))
        Bt = to_tensor(gen(s + 1, (N, K), emin, erange, period, table))
        d[name] = _digest(ops.exact_matmul(A, Bt.t()))
    batch, G, Tn, D = 2, 2, 150, 5                       # the band products: three row blocks, GQA 2
    a = to_tensor(gen(138, (batch, G * Tn, D), -20, 40, 16, _fin(2.0**20)))
    b = to_tensor(gen(139, (batch, Tn, D), -20, 40, 16, _fin(2.0**20)))
    for W, tag in ((70, ""), (200, "_wide")):
        p = gen(140 + W, (batch, G * Tn, W), -30, 30, 16, _fin(2.0**20))
        t = np.arange(G * Tn) % Tn
        p[:, np.arange(W)[None, :] < (W - 1 - t)[:, None]] = 0.0   # +0.0 before key 0, as a band is
        p = to_tensor(p)
        d["exact_band_scores" + tag] = _digest(ops.exact_band_scores(a, b, W))
        d["exact_band_mix" + tag] = _digest(ops.exact_band_mix(p, b))
        d["exact_band_mix_t" + tag] = _digest(ops.exact_band_mix_t(p, a, Tn))
    return d


def test_numpy_generator_is_exact():
    """The NumPy generator's float steps are exact, so it cannot depend on FTZ or rounding."""
    x = gen(20, (4096,), -3, 8)
    h1, h2 = _hashes(20, 4096)
    mant = (h1 >> np.uint32(8)).astype(np.int64) - 0x800000
    e = -3 + ((h2 >> np.uint32(4)) % np.uint32(8)).astype(np.int64)
    assert np.array_equal(x.astype(np.float64), np.ldexp(mant.astype(np.float64), e - 23))


def test_selftest_matches_torch_extension(results):
    program = results["gcc_O0"][1]
    ours = torch_digests()
    assert list(ours) == EXPECTED_NAMES
    bad = [f"{n}: selftest {program[n][:16]}.. torch {ours[n][:16]}.." for n in EXPECTED_NAMES if program[n] != ours[n]]
    assert not bad, "self-test digests differ from the torch extension's:\n" + "\n".join(bad)
    cpu_only = cpu_only_digests()
    assert list(cpu_only) == CPU_ONLY_NAMES
    bad = [f"{n}: selftest {program[n][:16]}.. torch {cpu_only[n][:16]}.." for n in CPU_ONLY_NAMES
           if program[n] != cpu_only[n]]
    assert not bad, "CPU-only digests differ from the torch extension's:\n" + "\n".join(bad)
