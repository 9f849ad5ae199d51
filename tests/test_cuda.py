"""The CUDA backend (kernels/cuda; docs/performance.md, "Backends"): checks that need no GPU, then GPU tests.

Without a GPU (they need nvcc; skipped with the reason where it is missing):

1. every kernels/cuda/*.cu compiles for sm_80 and sm_90 with the contract's flags, so a syntax
   or type error fails CI on machines without a GPU; the numbered matmul versions neither spill
   registers nor overflow static shared memory (ptxas's report);
2. the PTX of every kernel uses only the float instructions the contract allows: add/sub/mul
   with explicit .rn and .ftz (never contracted, subnormals flushed), exact conversions,
   compares, selects, min/max; no fma/mad, div, sqrt, rcp, rsqrt, ex2, lg2, sin, cos, no
   .f64 arithmetic, no abs/neg.ftz (the CPU's sign flips do not flush);
3. binding_cuda.cpp passes a C++ syntax check against torch's headers and the toolkit's;
4. kernels/cuda/canonical.cuh, compiled as host C++, agrees bit for bit with
   kernels/cpu/contract.h (exp, log, recip, rsqrt, sqrt, sin, cos, sigmoid, tanh, erf, the GELU
   forms, Philox, normals)
   on millions of inputs: the CUDA mirror of the canonical functions cannot drift;
5. (needs only the CPU build) this file's copy of the self-test digest calls, run on the CPU,
   reproduces tests/test_selftest.py's digests, so the GPU digest test below is meaningful.

With a CUDA GPU (skipped otherwise, with the reason): every op on CUDA tensors gives the CPU
op's bits on random, awkward-size and adversarial inputs, and so does every numbered matmul and
clip_grad version (docs/cuda-speed.md); the self-test's digests as the CPU computes them; a
short training run on CUDA whose chain is byte-identical to the CPU chain; torchrun with NCCL
for R=2 when two GPUs exist.
"""
import hashlib
import math
import os
import re
import shutil
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils.cpp_extension

import repops
import test_kernels as TK
import tools.matmul_versions as MV
import test_selftest as ST
from tiny import TINY, make_corpus, run_process

ROOT = Path(__file__).resolve().parent.parent
CUDA_DIR = ROOT / "kernels" / "cuda"
DEV_CUDA_DIR = ROOT / "dev" / "cuda"      # versions outside the default build (REPOPS_CUDA_DEV=1 builds them)
CPU_DIR = ROOT / "kernels" / "cpu"
COMMON_DIR = ROOT / "kernels" / "common"  # headers both backends include
CU_SOURCES = sorted(CUDA_DIR.glob("*.cu")) + sorted(DEV_CUDA_DIR.glob("*.cu"))   # all must compile
# The contract's nvcc flags (kernels/README.md §2, §3; repops.py builds with the same).
NVCC_FLAGS = ["-O3", "-std=c++17", "--fmad=false", "-ftz=true", "-prec-div=true", "-prec-sqrt=true",
              "-Xcompiler", "-ffp-contract=off"]
ARCHS = ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90"]
F32 = np.float32
DEV = "cuda"  # the device under test (every GPU test below names it only through DEV)


def _nvcc():
    for cand in (shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_HOME", ""), "bin", "nvcc"),
                 os.path.join(torch.utils.cpp_extension.CUDA_HOME or "", "bin", "nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


NVCC = _nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (the CUDA toolkit) is not installed")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="hardware: no CUDA GPU on this machine")
# The versions of dev/cuda exist only in the build REPOPS_CUDA_DEV=1 makes, the GPU session's (.ci/gpu
# exports it); on a GPU without it their tests skip, and REPOPS_STRICT=1 fails them.
needs_dev_build = pytest.mark.skipif(torch.cuda.is_available() and not repops.CUDA_DEV,
                                     reason="dev/cuda is built only with REPOPS_CUDA_DEV=1 (as .ci/gpu does)")


def _run(cmd, **kw):
    r = run_process(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout}\n{r.stderr}"
    return r


# ================================================================================================
# 1-3. compile checks (no GPU)
# ================================================================================================
@pytest.fixture(scope="module")
def ptx_dir(tmp_path_factory):
    """Compiles every .cu for sm_80 + sm_90 (objects) and to compute_80 PTX, two at a time."""
    if NVCC is None:
        pytest.skip("nvcc (the CUDA toolkit) is not installed")
    out = tmp_path_factory.mktemp("cuda_build")

    def build(src):
        base = ["-I", str(CUDA_DIR), "-I", str(DEV_CUDA_DIR), "-I", str(COMMON_DIR)] + NVCC_FLAGS
        base += ["-DRPC_DEV_VERSIONS"] * (src.parent == DEV_CUDA_DIR or src.stem in ("optim", "matmul_tiled"))
        r = _run([NVCC, "-c", "-Xptxas", "-v"] + base + ARCHS + [str(src), "-o", str(out / (src.stem + ".o"))])
        (out / (src.stem + ".ptxas")).write_text(r.stdout + r.stderr)  # registers, spills, shared memory
        _run([NVCC, "-ptx", "-arch=compute_80"] + base + [str(src), "-o", str(out / (src.stem + ".ptx"))])
        return src.name

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(build, CU_SOURCES))
    return out


def test_every_op_family_has_a_cuda_source():
    names = {p.stem for p in CU_SOURCES}
    want = {"matmul", "norm", "rope", "attention", "mlp", "loss", "embedding", "elementwise", "optim", "random",
            "int8"}
    assert want <= names, f"missing kernels/cuda/*.cu: {sorted(want - names)}"
    assert not {p.name for p in CUDA_DIR.glob("*.cu")} & {p.name for p in DEV_CUDA_DIR.glob("*.cu")}
    # int8_amx.cpp is int8.cpp's GEMM on AMX tiles, an x86 path of the int8 family (CUDA: int8.cu)
    cpu = {p.stem.removesuffix("_amx") for p in CPU_DIR.glob("*.cpp")} - {"binding", "selftest"}
    assert cpu <= names, f"CPU kernels without a CUDA twin: {sorted(cpu - names)}"


@needs_nvcc
def test_cu_sources_compile_for_sm80_and_sm90(ptx_dir):
    for src in CU_SOURCES:
        assert (ptx_dir / (src.stem + ".o")).stat().st_size > 0


def ptxas_report(path):
    """[(kernel, arch, spill bytes stored + loaded, registers, static shared memory bytes)] from nvcc -Xptxas -v."""
    rows, cur = [], None
    for line in path.read_text().splitlines():
        if m := re.search(r"Compiling entry function '(\w+)' for '(sm_\d+)'", line):
            cur = [m.group(1), m.group(2), None]
        elif cur and (m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            cur[2] = int(m.group(1)) + int(m.group(2))
        elif cur and (m := re.search(r"Used (\d+) registers", line)):
            smem = re.search(r"(\d+) bytes smem", line)
            rows.append((cur[0], cur[1], cur[2], int(m.group(1)), int(smem.group(1)) if smem else 0))
            cur = None
    return rows


@needs_nvcc
def test_matmul_versions_do_not_spill(ptx_dir):
    """Every instantiation of matmul_tiled.cu (versions 2, 3 and 5, four operand layouts each) keeps
    its accumulators (64, or 16 in version 5) and operand fragments in registers on sm_80 and sm_90
    (a spill to local memory would cost the version its speed) and fits the 48 KiB of static shared
    memory; so does flat_sum.cu's streamed norm (clip_grad version 2)."""
    rows = [r for r in ptxas_report(ptx_dir / "matmul_tiled.ptxas") if "tiled_kernel" in r[0]]
    assert len(rows) == 24, f"expected 3 versions x 4 layouts x 2 archs, got {len(rows)}: {rows}"
    norm = [r for r in ptxas_report(ptx_dir / "flat_sum.ptxas") if "norm_stream_kernel" in r[0]]
    assert len(norm) == 2, f"expected clip_grad version 2's kernel for 2 archs, got {norm}"
    bad = [r for r in rows + norm if r[2] != 0 or r[4] > 48 * 1024]
    assert not bad, f"tiled matmul kernels that spill or need too much shared memory: {bad}"


# Float instructions the contract allows in device code (PTX opcodes, modifiers included).
_ALLOWED_F32 = re.compile(
    r"^(add|sub|mul)\.rn\.ftz\.f32$"
    r"|^cvt\.rn\.f32\.[su](8|16|32|64)$"                 # integer -> float: exact for our ranges
    r"|^(ld|st|mov|selp)(\.[a-z0-9]+)*\.(f32|b32)$"      # data movement, selects
    r"|^setp\.[a-z]+\.ftz\.f32$"                         # compares, DAZ like the CPU's
    r"|^(min|max)\.ftz\.f32$")                           # only from compare-and-select (exact)


@needs_nvcc
def test_ptx_uses_only_contract_float_instructions(ptx_dir):
    bad = {}
    for src in CU_SOURCES:
        for line in (ptx_dir / (src.stem + ".ptx")).read_text().splitlines():
            m = re.match(r"\s*(?:@!?%p\d+\s+)?([a-z][a-z0-9_.]*)\s", line)
            if not m:
                continue
            op = m.group(1)
            floaty = re.search(r"\.(f16|bf16|f32|f64)\b", op) or op.split(".")[0] in (
                "fma", "rcp", "sqrt", "rsqrt", "ex2", "lg2", "sin", "cos", "tanh")
            if floaty and not _ALLOWED_F32.match(op) and not re.match(r"^(ld|st|mov)\.", op):
                bad.setdefault(src.name, set()).add(op)
            if re.search(r"\.f64\b", op) and not re.match(r"^(ld|st|mov)\.", op):
                bad.setdefault(src.name, set()).add(op)
    assert not bad, f"device code uses float instructions outside the contract: {bad}"


@needs_nvcc
def test_ptx_check_catches_contraction(tmp_path):
    """The same check on a build with --fmad=true must see an FMA (the canary's a*b + c)."""
    src, out = CUDA_DIR / "elementwise.cu", tmp_path / "fused.ptx"
    flags = [f for f in NVCC_FLAGS if f != "--fmad=false"] + ["--fmad=true"]
    _run([NVCC, "-ptx", "-arch=compute_80", "-I", str(CUDA_DIR), "-I", str(COMMON_DIR)] + flags + [str(src), "-o", str(out)])
    assert re.search(r"\bfma\.rn(\.ftz)?\.f32\b", out.read_text())


def _cuda_include_dir():
    """The toolkit's include directory, as nvcc reports it."""
    r = run_process([NVCC, "--dryrun", "-c", "x.cu"], capture_output=True, text=True)
    for line in (r.stdout + r.stderr).splitlines():
        m = re.search(r'INCLUDES="-I([^"]+)"', line)
        if m and os.path.exists(os.path.join(m.group(1).strip(), "cuda_runtime_api.h")):
            return m.group(1).strip()
    return None


@needs_nvcc
def test_binding_compiles_against_torch_headers(tmp_path):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    inc = _cuda_include_dir()
    if inc is None:
        pytest.skip("the CUDA toolkit's cuda_runtime_api.h was not found next to nvcc")
    torch_inc = torch.utils.cpp_extension.include_paths()
    if not any(os.path.exists(os.path.join(p, "c10", "cuda", "CUDAStream.h")) for p in torch_inc):
        pytest.skip("this torch install ships no c10/cuda headers: binding_cuda.cpp cannot be checked here")
    defs = []
    if not any(os.path.exists(os.path.join(p, "c10", "cuda", "impl", "cuda_cmake_macros.h")) for p in torch_inc):
        # A CPU-only torch wheel lacks this one generated header; its macros only matter for
        # Windows DLL exports, so a syntax check without it is still a full type check.
        defs.append("-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE")
    cmd = ["g++", "-std=c++17", "-fsyntax-only", "-w"] + defs + [f"-I{p}" for p in torch_inc]
    cmd += [f"-I{inc}", f"-I{CUDA_DIR}", f"-I{COMMON_DIR}", str(CUDA_DIR / "binding_cuda.cpp")]
    _run(cmd, timeout=300)
    _run(cmd + ["-DRPC_DEV_VERSIONS"], timeout=300)      # the harness's build, with dev/cuda's versions


# ================================================================================================
# 4. the CUDA mirror of the canonical functions == contract.h, as host code (no GPU)
# ================================================================================================
MIRROR_CHECK = r"""
#include <cstdio>
#include <cstdlib>
#include "contract.h"
#include "canonical.cuh"

void rp_parallel_for(int64_t, int64_t, void (*)(void*, int64_t, int64_t), void*) {}

static bool same(float a, float b) { return (a != a && b != b) || rp::bits(a) == rp::bits(b); }

struct Count { const char* name; long bad = 0; uint32_t first = 0; };

int main(int argc, char** argv) {
  rp::FpModeGuard guard;  // FTZ/DAZ, as every kernel runs (device: -ftz=true)
  const uint64_t stride = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1009;
  constexpr int kFns = 14;  // the functions compared, then the normals (c[kFns])
  Count c[kFns + 1] = {{"exp"}, {"log"}, {"recip"}, {"rsqrt"}, {"sqrt"}, {"sin"}, {"cos"}, {"sigmoid"}, {"tanh"},
                       {"erf"}, {"gelu"}, {"gelu_tanh"}, {"gelu_grad"}, {"gelu_tanh_grad"}, {"normal"}};
  long n = 0;
  auto one = [&](uint32_t u) {
    const float x = rp::fl(u);
    const float got[kFns] = {rpc::exp(x), rpc::log(x), rpc::recip(x), rpc::rsqrt(x), rpc::sqrt(x), rpc::sin(x),
                             rpc::cos(x), rpc::sigmoid(x), rpc::tanh(x), rpc::erf(x), rpc::gelu(x),
                             rpc::gelu_tanh(x), rpc::gelu_grad(x), rpc::gelu_tanh_grad(x)};
    const float want[kFns] = {rp::exp(x), rp::log(x), rp::recip(x), rp::rsqrt(x), rp::sqrt(x), rp::sin(x),
                              rp::cos(x), rp::sigmoid(x), rp::tanh(x), rp::erf(x), rp::gelu(x),
                              rp::gelu_tanh(x), rp::gelu_grad(x), rp::gelu_tanh_grad(x)};
    for (int f = 0; f < kFns; ++f)
      if (!same(got[f], want[f]) && c[f].bad++ == 0) c[f].first = u;
    ++n;
  };
  for (uint64_t u = 0; u < (1ull << 32); u += stride) one((uint32_t)u);       // every class of float
  for (uint32_t u = 0x3E000000u; u < 0x43000000u; u += 61) one(u), one(u | 0x80000000u);  // |x| in [1/8, 128)
  for (uint32_t u = 0; u < 0x00800000u; u += 4099) one(u), one(u | 0x80000000u);           // subnormals
  const uint32_t specials[] = {0x0u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x42B17218u,
                               0x42B17219u, 0xC2AEAC4Fu, 0xC2AEAC50u, 0x47800000u, 0x47800001u, 0x3FB504F3u,
                               0x3FB504F4u, 0x00800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x3F800000u,
                               // tanh's and erf's branch points (0.75, 10, 0.875, 3.92) and their
                               // neighbours below, 2^64 (x * x overflows in the GELU forms)
                               0x3F400000u, 0x3F3FFFFFu, 0x41200000u, 0x411FFFFFu, 0x3F600000u, 0x3F5FFFFFu,
                               0x407AE148u, 0x407AE147u, 0xBF400000u, 0xC07AE148u, 0x5F800000u, 0xDF800000u};
  for (uint32_t u : specials) one(u);
  long words_bad = 0;
  for (uint32_t b = 0; b < 200000; ++b) {
    const uint32_t k0 = b * 2654435761u, k1 = ~b, c1 = b >> 3, c2 = b * 7u;
    const rp::Philox4 w = rp::philox4x32_10(b, c1, c2, b & 3u, k0, k1);
    const rpc::Philox4 v = rpc::philox4x32_10(b, c1, c2, b & 3u, k0, k1);
    for (int q = 0; q < 4; ++q) words_bad += w.w[q] != v.w[q];
    float a0, a1, b0, b1;
    rp::normal_pair(w.w[0], w.w[1], &a0, &a1);
    rpc::normal_pair(w.w[0], w.w[1], &b0, &b1);
    if ((!same(a0, b0) || !same(a1, b1)) && c[kFns].bad++ == 0) c[kFns].first = b;
    if (!same(rp::uniform_from_word(w.w[2]), rpc::uniform_from_word(w.w[2]))) ++words_bad;
  }
  std::printf("inputs %ld\n", n);
  std::printf("philox %ld 0\n", words_bad);
  for (auto& e : c) std::printf("%s %ld %08x\n", e.name, e.bad, e.first);
  return 0;
}
"""


def test_canonical_mirror_matches_contract_h(tmp_path):
    """canonical.cuh (CUDA) and contract.h (CPU) compute the same bits, checked on the host."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++ or clang++)")
    src, exe = tmp_path / "mirror_check.cpp", tmp_path / "mirror_check"
    src.write_text(MIRROR_CHECK)
    _run([cxx, "-O2", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-I", str(CPU_DIR), "-I", str(CUDA_DIR),
          str(src), "-o", str(exe)], timeout=300)
    out = _run([str(exe), "251"], timeout=300).stdout.split("\n")
    assert int(out[0].split()[1]) > 15_000_000
    bad = [line for line in out[1:] if line and int(line.split()[1]) != 0]
    assert not bad, "canonical.cuh differs from contract.h (name, mismatches, first input bits):\n" + "\n".join(bad)


# ================================================================================================
# 5. the self-test digests, computed on the CPU at run time: the values the GPU must reproduce
# ================================================================================================
@pytest.fixture(scope="module")
def cpu_digests():
    return ST.torch_digests()


# ================================================================================================
# GPU tests: CUDA op == CPU op, bit for bit (all NaNs equal, contract §7)
# ================================================================================================
@pytest.fixture(scope="module")
def ops():
    if not torch.cuda.is_available():
        pytest.skip("hardware: no CUDA GPU on this machine")
    o = torch.ops.repops
    try:
        canary = o.canary_cuda()
    except (AttributeError, RuntimeError) as e:
        pytest.fail(f"repops did not build/register kernels/cuda although a GPU is present: {e}")
    fused, ftz_missing = canary.cpu().tolist()
    assert fused == 0.0, "CUDA kernels were built with contraction (--fmad=true)"
    assert ftz_missing == 0.0, "CUDA kernels were built without -ftz=true"
    return o


def C(a):
    """NumPy -> tensor on the device under test."""
    return TK.T(a).to(DEV)


def same(cpu_out, cuda_out, what):
    TK.assert_bits(cuda_out, TK.N(cpu_out), what)


def both(ops, name, *args):
    """(CPU result, CUDA result) of ops.<name> on the same inputs (NumPy arrays become tensors)."""
    def conv(a, dev):
        if isinstance(a, np.ndarray):
            return TK.T(a).to(dev)
        if isinstance(a, torch.Tensor):
            return a.to(dev)
        return a
    fn = getattr(ops, name)
    return fn(*(conv(a, "cpu") for a in args)), fn(*(conv(a, DEV) for a in args))


def same_all(ops, name, *args, what=None):
    cpu, gpu = both(ops, name, *args)
    cpu = cpu if isinstance(cpu, (tuple, list)) else (cpu,)
    gpu = gpu if isinstance(gpu, (tuple, list)) else (gpu,)
    for i, (a, b) in enumerate(zip(cpu, gpu)):
        assert b.device.type == DEV, f"{name}: output {i} is not on the GPU"
        same(a, b, f"{what or name} output {i}")


def ftz_window_pairs(n=64):
    """Normal float pairs whose exact product lies in [2^-126 (1 - 2^-25), 2^-126): flushed to
    zero if tininess is decided before rounding, 2^-126 after rounding (x86, contract §3)."""
    rng = np.random.default_rng(3)
    m1 = (1.0 + rng.integers(1, 2**23, 20000) * 2.0**-23).astype(np.float64)
    m2 = (1.0 / m1).astype(np.float32).astype(np.float64)
    m2 = np.where(m1 * m2 >= 1.0, np.nextafter(m2.astype(np.float32), np.float32(0)), m2)  # below 1
    prod = m1 * m2  # exact in float64 (24 x 24 bits)
    ok = (prod >= 1.0 - 2.0**-25) & (prod < 1.0)
    a = (m1[ok][:n] * 2.0**-63).astype(np.float32)
    b = (m2[ok][:n] * 2.0**-63).astype(np.float32)
    assert len(a) == n
    return a, b


@needs_gpu
@pytest.mark.parametrize("name", TK.ELEMENTWISE)
def test_unary_bits(ops, name):
    x = TK._elementwise_inputs(name, seed=zlib.crc32(name.encode()))
    same_all(ops, name, x)
    same_all(ops, name, x[:7 * 129].reshape(7, 129), what=name + " 2-D")


@needs_gpu
@pytest.mark.parametrize("op", ["add", "mul"])
def test_binary_bits(ops, op):
    rng = np.random.default_rng(10)
    fa, fb = ftz_window_pairs()
    cases = [(TK.rbits(rng, 30_000), TK.rbits(rng, 30_000)), (TK.adversarial(rng, (7, 33)), TK.adversarial(rng, (7, 33))),
             (TK.tiny(rng, 20_000), TK.tiny(rng, 20_000)), (fa, fb), (np.zeros(0, F32), np.zeros(0, F32))]
    for a, b in cases:
        same_all(ops, op, a, b)
    same_all(ops, op, TK.T(cases[1][0]).t(), TK.T(cases[1][1]).t(), what=op + " transposed views")


@needs_gpu
def test_scale_bits(ops):
    rng = np.random.default_rng(11)
    fa, fb = ftz_window_pairs(1)
    for x in (TK.rbits(rng, 10_000), TK.adversarial(rng, (33, 7)), TK.tiny(rng, 1000), np.full(4, fb[0], F32)):
        for s in (0.1, -3.0, 1.0, 0.0, 1e-20, 1e30, 1.0 / 3.0, float(fa[0])):
            same_all(ops, "scale", x, s, what=f"scale {s}")


@needs_gpu
@pytest.mark.parametrize("n", [0, 1, 7, 31, 32, 33, 129, 1000, 5000])
def test_csum_bits(ops, n):
    rng = np.random.default_rng(n)
    for x in (rng.standard_normal((3, n)).astype(F32), TK.adversarial(rng, (5, n)),
              (rng.standard_normal((2, 3, n)) * 1e30).astype(F32), TK.tiny(rng, (3, n)) ** 2,
              rng.choice(np.array([-0.0, 0.0, 1e-40, -1e-40], F32), (4, n)), rng.standard_normal(n).astype(F32)):
        same_all(ops, "csum", x, what=f"csum n={n}")


@needs_gpu
def test_csum_partial_block_is_not_padded(ops):
    """Contract §4.2's unpadded partial block (test_kernels.unpadded_csum_rows): the GPU sum has the
    expected sign of zero, where a sum padded with +0.0 (or lanes started at -0.0) differs."""
    for what, t, want in TK.unpadded_csum_rows():
        cpu, gpu = both(ops, "csum", t)
        assert int(TK.N(gpu).view(np.uint32)) == want, what
        same(cpu, gpu, what)


@needs_gpu
@pytest.mark.parametrize("M", [1, 7, 33, 65, 129])
@pytest.mark.parametrize("N_", [1, 7, 64, 129])
@pytest.mark.parametrize("K", [0, 1, 15, 16, 17, 129, 300])
def test_matmul_bits(ops, M, N_, K):
    rng = np.random.default_rng(M * 10000 + N_ * 100 + K)
    a, b = rng.standard_normal((M, K)).astype(F32), rng.standard_normal((K, N_)).astype(F32)
    same_all(ops, "matmul", a, b, what=f"matmul {M}x{K}x{N_}")


@needs_gpu
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("MNK", [(7, 33, 129), (33, 1, 7), (129, 65, 33), (70, 130, 300)])
def test_matmul_strided_bits(ops, ta, tb, MNK):
    M, N_, K = MNK
    rng = np.random.default_rng(M + N_ + K + 2 * ta + tb)
    a, b = TK.adversarial(rng, (M, K), frac=0.05), rng.standard_normal((K, N_)).astype(F32)
    at = TK.T(a.T.copy()).t() if ta else TK.T(a)
    bt = TK.T(b.T.copy()).t() if tb else TK.T(b)
    same_all(ops, "matmul", at, bt, what=f"matmul ta={ta} tb={tb} {MNK}")
    a2 = rng.standard_normal((2 * M, 2 * K)).astype(F32)  # step-2 slices, sliced on each device
    same(ops.matmul(TK.T(a2)[::2, ::2], bt), ops.matmul(C(a2)[::2, ::2], bt.to(DEV)), "matmul sliced a")


@needs_gpu
def test_matmul_batched_and_special_bits(ops):
    rng = np.random.default_rng(12)
    r = lambda *s: rng.standard_normal(s).astype(F32)  # noqa: E731
    same_all(ops, "matmul", r(3, 7, 33), r(3, 33, 129), what="3d@3d")
    same_all(ops, "matmul", r(2, 33, 129), r(129, 7), what="3d@2d")
    same_all(ops, "matmul", TK.T(r(70, 19)).t(), r(3, 70, 33), what="2d@3d")
    same_all(ops, "matmul", TK.T(r(3, 33, 7)).transpose(1, 2), TK.T(r(3, 129, 33)).transpose(1, 2), what="3d_t")
    same_all(ops, "matmul", TK.adversarial(rng, (33, 129)), TK.adversarial(rng, (129, 7), frac=0.05), what="adv")
    same_all(ops, "matmul", TK.tiny(rng, (33, 129)), TK.tiny(rng, (129, 33)), what="tiny")
    same_all(ops, "matmul", (r(7, 129) * 1e19).astype(F32), (r(129, 33) * 1e19).astype(F32), what="huge")
    fa, fb = ftz_window_pairs(33)
    same_all(ops, "matmul", fa.reshape(33, 1), fb.reshape(1, 33), what="ftz window products")
    same_all(ops, "matmul", np.zeros((7, 0), F32), np.zeros((0, 33), F32), what="K = 0")


@needs_gpu
@pytest.mark.parametrize("version", MV.VERSIONS)
def test_matmul_past_the_grid_limits_bits(ops, version):
    """More than 65535 batches, and more than 65535 row tiles of 64 and of 128 (grid.z and grid.y
    limits): every version's launcher splits the work into several launches (grid_slices.cuh);
    every element keeps its bits."""
    rng = np.random.default_rng(14)
    r = lambda *s: TK.T(rng.standard_normal(s).astype(F32))  # noqa: E731
    for what, a, b in (("batch > 65535", r(65535 + 7, 2, 3), r(3, 2)),
                       ("rows > 65535 * 128", r(65535 * 128 + 33, 3), r(3, 2))):
        same(ops.matmul(a, b), ops.matmul_v(a.to(DEV), b.to(DEV), version), f"{what}, version {version}")


@needs_gpu
@pytest.mark.parametrize("version", MV.VERSIONS)
def test_matmul_versions_bits(ops, version):
    """Every numbered matmul kernel (repops.ops.matmul_v) on tools/matmul_versions.py's quick cases:
    odd sizes, K = 0 and 1, transposed views, step-2 slices, batch broadcast, specials, tiny values."""
    bad = MV.verify_fp32(MV.fp32_cases(quick=True), (version,), DEV)
    assert not bad[version], f"matmul version {version} differs from the CPU on: {bad[version]}"


@needs_gpu
@needs_dev_build
def test_clip_grad_versions_bits(ops):
    """Both gradient-norm kernels (repops.ops.clip_grad_v) on tools/matmul_versions.py's quick
    lengths (around 32, 2048 and the chunk of §4.5, specials, flushing squares, a misaligned start)."""
    bad = MV.verify_clip(DEV, quick=True)
    assert not any(bad.values()), f"clip_grad versions differ from the CPU on: {bad}"


@needs_gpu
@pytest.mark.parametrize("RD", [(1, 1), (7, 33), (33, 7), (3, 129), (1, 1000), (70, 129)])
@pytest.mark.parametrize("kind", ["normal", "adv", "zero_rows", "huge", "tiny"])
@pytest.mark.parametrize("eps", [1e-5, 0.0])
def test_rmsnorm_bits(ops, RD, kind, eps):
    R_, D = RD
    x, w, gy = TK._rms_inputs(np.random.default_rng(R_ * 1000 + D), R_, D, kind)
    same_all(ops, "rmsnorm", x, w, eps, what=f"rmsnorm {kind}")
    _, rstd = ops.rmsnorm(TK.T(x), TK.T(w), eps)
    same_all(ops, "rmsnorm_backward", gy, x, w, TK.N(rstd), what=f"rmsnorm_backward {kind}")


@needs_gpu
@pytest.mark.parametrize("Tn,Dh,theta", [(1, 2, 10000.0), (7, 8, 10000.0), (129, 64, 10000.0),
                                         (2048, 128, 500000.0), (33, 6, 1e6), (70000, 4, 10.0)])
def test_rope_tables_bits(ops, Tn, Dh, theta):
    for a, b in zip(ops.rope_tables(Tn, Dh, theta), ops.rope_tables_cuda(Tn, Dh, theta)):
        assert b.device.type == DEV
        same(a, b, f"rope_tables {Tn} {Dh}")


@needs_gpu
@pytest.mark.parametrize("shape", [(1, 1, 1, 2), (2, 7, 3, 8), (1, 33, 2, 64), (3, 5, 1, 6)])
@pytest.mark.parametrize("kind", ["normal", "adv"])
def test_rope_bits(ops, shape, kind):
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(F32) if kind == "normal" else TK.adversarial(rng, shape)
    c, s = (TK.N(t) for t in ops.rope_tables(shape[1] + 3, shape[3], 10000.0))  # longer tables than T
    if kind == "adv":
        c, s = TK.adversarial(rng, c.shape, frac=0.2), TK.adversarial(rng, s.shape, frac=0.2)
    for bw in (False, True):
        same_all(ops, "rope", x, c, s, bw, what=f"rope backward={bw}")
    # strided operands, read in place: a transposed view (kept by .to) and a column slice
    same_all(ops, "rope", TK.T(x).transpose(1, 2), c, s, True, what="rope backward of a transposed view")
    wide, H = TK.T(np.concatenate([x, x[:, :, ::-1]], axis=2)), shape[2]
    cpu = ops.rope(wide[:, :, H:], TK.T(c), TK.T(s), False)
    gpu = ops.rope(wide.to(DEV)[:, :, H:], TK.T(c).to(DEV), TK.T(s).to(DEV), False)
    same(cpu, gpu, "rope of a column slice")


@needs_gpu
@pytest.mark.parametrize("BH,Tn", [(1, 1), (2, 7), (3, 33), (1, 129), (2, 100)])
@pytest.mark.parametrize("kind", ["normal", "adv", "large", "masked_garbage"])
def test_causal_softmax_bits(ops, BH, Tn, kind):
    rng = np.random.default_rng(BH * 1000 + Tn)
    shape = (BH, Tn, Tn)
    up = np.triu(np.ones((Tn, Tn), bool), 1)
    if kind == "normal":
        s = (rng.standard_normal(shape) * 3).astype(F32)
    elif kind == "adv":
        s = TK.adversarial(rng, shape, frac=0.15)
    elif kind == "large":
        s = (rng.standard_normal(shape) * 1e3).astype(F32)
    else:
        s = rng.standard_normal(shape).astype(F32)
        s[:, up] = rng.choice(np.array([np.nan, np.inf, -np.inf, 1e38], F32), (BH, int(up.sum())))
    gp = TK.adversarial(rng, shape, frac=0.1) if kind == "adv" else rng.standard_normal(shape).astype(F32)
    if kind == "masked_garbage":
        gp[:, up] = np.nan
    for scale in (0.125, 1.0 / math.sqrt(40.0)):
        same_all(ops, "causal_softmax", s, scale, what=f"causal_softmax {kind}")
        P = TK.N(ops.causal_softmax(TK.T(s), scale))
        same_all(ops, "causal_softmax_backward", gp, P, scale, what=f"causal_softmax_backward {kind}")


@needs_gpu
@pytest.mark.parametrize("Rn,H", [(1, 1), (7, 33), (33, 129), (2, 7)])
@pytest.mark.parametrize("kind", ["normal", "adv", "wide"])
def test_swiglu_bits(ops, Rn, H, kind):
    rng = np.random.default_rng(Rn * 1000 + H)
    shape = (Rn, 2 * H)
    u = {"normal": lambda: rng.standard_normal(shape).astype(F32), "adv": lambda: TK.adversarial(rng, shape),
         "wide": lambda: (rng.standard_normal(shape) * 60).astype(F32)}[kind]()
    g = TK.adversarial(rng, (Rn, H), frac=0.1) if kind == "adv" else rng.standard_normal((Rn, H)).astype(F32)
    same_all(ops, "swiglu", u)
    same_all(ops, "swiglu_backward", g, u)


@needs_gpu
@pytest.mark.parametrize("Rn,V", [(1, 1), (7, 33), (33, 129), (3, 1000), (70, 65)])
@pytest.mark.parametrize("kind", ["normal", "adv", "large"])
@pytest.mark.parametrize("zloss", [0.0, 1e-4])
def test_cross_entropy_bits(ops, Rn, V, kind, zloss):
    rng = np.random.default_rng(Rn * 10000 + V)
    z = {"normal": lambda: (rng.standard_normal((Rn, V)) * 2).astype(F32),
         "adv": lambda: TK.adversarial(rng, (Rn, V), frac=0.1),
         "large": lambda: (rng.standard_normal((Rn, V)) * 1e4).astype(F32)}[kind]()
    t = rng.integers(0, V, Rn).astype(np.int64)
    same_all(ops, "cross_entropy", z, t, zloss, what=f"cross_entropy {kind}")
    _, lse = ops.cross_entropy(TK.T(z), torch.from_numpy(t), zloss)
    for g in (1.0, 0.37):
        same_all(ops, "cross_entropy_backward", torch.tensor(g, dtype=torch.float32), z, t, TK.N(lse), zloss,
                 what=f"cross_entropy_backward {kind}")


@needs_gpu
@pytest.mark.parametrize("V,D,Nn", [(1, 1, 1), (7, 33, 129), (33, 7, 7), (129, 1, 1000), (300, 65, 500)])
def test_embedding_bits(ops, V, D, Nn):
    rng = np.random.default_rng(V + D + Nn)
    w, idx = TK.adversarial(rng, (V, D)), rng.integers(0, V, Nn).astype(np.int64)
    same_all(ops, "embedding", w, idx)
    for g in (rng.standard_normal((Nn, D)).astype(F32), TK.adversarial(rng, (Nn, D)),
              rng.choice(np.array([-0.0, 1e-40, -1e-40, 1.0, 2.0 ** -24], F32), (Nn, D))):
        for rows in (V, V + 3):
            same_all(ops, "embedding_backward", g, idx, rows, what=f"embedding_backward rows={rows}")


@needs_gpu
def test_index_errors_match_cpu(ops):
    z, w = torch.zeros(3, 5), torch.zeros(5, 2)
    t = torch.tensor([0, 5, 1])
    for call in (lambda d: ops.cross_entropy(z.to(d), t.to(d), 0.0), lambda d: ops.embedding(w.to(d), t.to(d)),
                 lambda d: ops.embedding_backward(torch.zeros(3, 2, device=d), t.to(d), 5)):
        with pytest.raises(RuntimeError) as cpu_err:
            call("cpu")
        with pytest.raises(RuntimeError) as gpu_err:
            call(DEV)
        assert str(cpu_err.value).splitlines()[0] == str(gpu_err.value).splitlines()[0]
    # host indices bound for the GPU are checked on the host, with the same message
    for call in (lambda d: repops.cross_entropy(z.to(d), t), lambda d: repops.embedding(w.to(d), t)):
        with pytest.raises(RuntimeError) as cpu_err:
            call("cpu")
        with pytest.raises(RuntimeError) as gpu_err:
            call(DEV)
        assert str(cpu_err.value).splitlines()[0] == str(gpu_err.value).splitlines()[0]


@needs_gpu
def test_host_indices_give_the_device_indices_bits():
    """repops moves host ids to the GPU after checking them on the host; forward and backward
    are the same bits as with ids already on the GPU (whose range the op tests itself)."""
    rng = np.random.default_rng(5)
    w_np, z_np = rng.standard_normal((50, 8), dtype=np.float32), rng.standard_normal((12, 50), dtype=np.float32)
    idx = torch.from_numpy(rng.integers(0, 50, 12))
    results = []
    for ids in (idx, idx.to(DEV)):
        w = torch.tensor(w_np, device=DEV, requires_grad=True)
        z = torch.tensor(z_np, device=DEV, requires_grad=True)
        loss = repops.cross_entropy(z, ids, 1e-4)
        emb = repops.embedding(w, ids)
        g_w, g_z = torch.autograd.grad((loss, emb), (w, z), (torch.ones((), device=DEV), torch.ones_like(emb)))
        results.append([t.detach().cpu().numpy().tobytes() for t in (loss, emb, g_w, g_z)])
    assert results[0] == results[1]


@needs_gpu
@pytest.mark.parametrize("p", [0.1, 0.5, 1.0 / 3.0])
@pytest.mark.parametrize("shape", [(1,), (7, 33), (3, 5, 129)])
def test_dropout_bits(ops, p, shape):
    x = TK.adversarial(np.random.default_rng(len(shape)), shape)
    for seed, c1, c2 in ((0, 0, 0), (1234, 5, 6), (-1, 2 ** 32 - 1, 7), (-(2 ** 63) + 5, 1, 2 ** 31)):
        same_all(ops, "dropout", x, p, seed, c1, c2, what=f"dropout p={p} seed={seed}")


@needs_gpu
@pytest.mark.parametrize("n", [1, 33, 10007, 32768, 65613, 100_003])   # clip: 1, 2, 3 chunks + 77, 4 (§4.5)
def test_adamw_and_clip_bits(ops, n):
    rng = np.random.default_rng(n)
    p, g, m = (TK.adversarial(rng, (n,), frac=0.05, nonfinite=False) for _ in range(3))
    v = np.abs(TK.adversarial(rng, (n,), frac=0.05, nonfinite=False))
    hp = [float(F32(h)) for h in (3e-4, 0.9, 0.95, 0.1, 0.05, 1e-8, 1 - 3e-5, 1 / (1 - 0.9 ** 3), 1 / (1 - 0.95 ** 3))]
    tc, tg = [TK.T(a) for a in (p, g, m, v)], [C(a) for a in (p, g, m, v)]
    ops.adamw_(tc[0], tc[1], tc[2], tc[3], *hp)
    ops.adamw_(tg[0], tg[1], tg[2], tg[3], *hp)
    for name, a, b in zip("pgmv", tc, tg):
        same(a, b, f"adamw_ {name}")
    gs = (rng.standard_normal(n) * 0.01).astype(F32)
    for max_norm in (0.5, 1e9):
        for gg in (g, gs):
            same_all(ops, "clip_grad", gg, max_norm, what=f"clip_grad n={n}")


@needs_gpu
def test_random_streams_bits(ops):
    for seed in (0, 1, -1, -0x2152411035014111):
        for purpose in (1, 2, 3, 4):
            for n, off, c1, c2 in ((1, 0, 0, 0), (7, 3, 1, 2), (129, 2 ** 32 - 1, 2 ** 32 - 1, 5), (1001, 17, 9, 2 ** 31)):
                a, b = ops.philox(seed, c1, c2, purpose, n, off), ops.philox_cuda(seed, c1, c2, purpose, n, off)
                assert b.device.type == DEV and b.dtype == torch.int64
                assert torch.equal(a, b.cpu()), f"philox seed={seed} n={n}"
            for name in ("uniform", "normal"):
                a = getattr(ops, name)(seed, 3, 4, purpose, 1003)
                same(a, getattr(ops, name + "_cuda")(seed, 3, 4, purpose, 1003), name)


@needs_gpu
def test_kernels_launch_on_the_current_stream(ops):
    """Captured into a CUDA graph (which fails on any launch outside the capturing stream, the
    current one) and replayed: the results are the CPU's."""
    rng = np.random.default_rng(13)
    x, w = rng.standard_normal((65, 129)).astype(F32), rng.standard_normal(129).astype(F32)
    xd, wd = C(x), C(w)

    def work():
        n, rstd = ops.rmsnorm(xd, wd, 1e-5)
        return ops.matmul(xd, xd.t()), rstd, ops.csum(ops.add(n, n))

    work()  # loads the kernels before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, rstd, s = work()
    graph.replay()
    torch.cuda.synchronize()
    same(ops.matmul(TK.T(x), TK.T(x).t()), y, "matmul in a graph")
    n_cpu, rstd_cpu = ops.rmsnorm(TK.T(x), TK.T(w), 1e-5)
    same(rstd_cpu, rstd, "rmsnorm in a graph")
    same(ops.csum(ops.add(n_cpu, n_cpu)), s, "add + csum in a graph")


# ================================================================================================
# GPU: the self-test digests against the CPU's, training chain, NCCL
# ================================================================================================
@needs_gpu
def test_selftest_digests_on_cuda_match_cpu(ops, cpu_digests, tmp_path):
    mine = ST.torch_digests(DEV)
    bad = [f"{n}: cpu {cpu_digests[n][:16]}.. cuda {mine[n][:16]}.." for n in ST.EXPECTED_NAMES if mine[n] != cpu_digests[n]]
    assert not bad, "CUDA digests differ from the CPU's:\n" + "\n".join(bad)
    if shutil.which("g++"):  # and from the standalone self-test program itself
        exe = tmp_path / "selftest"
        _run(["g++", "-O2"] + ST.BASE_FLAGS + ST.CONTRACT + ST.SOURCES + ["-o", str(exe)], timeout=600)
        program = dict(line.split() for line in _run([str(exe)], timeout=120).stdout.splitlines())
        assert {n: program[n] for n in ST.EXPECTED_NAMES} == mine


RUN_FLAGS = [*TINY, "--max_steps=6", "--checkpoint_every=3", "--eval_every=0", "--sample_tokens=0"]
SECRET = bytes(range(32))           # every run here under one secret, so their chains can be equal


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("cuda_corpus"), seed=7, lines=400)


def _train(work, corpus, *extra, launcher=None):
    (work / "run").mkdir(parents=True, exist_ok=True)
    (work / "run" / "secret").write_bytes(SECRET)   # the chain bytes depend on it (step_commit)
    cmd = (launcher or [sys.executable]) + [str(ROOT / "train.py"), "--run_dir=run", f"--data_dir={corpus}", *RUN_FLAGS, *extra]
    r = run_process(cmd, cwd=work, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    run = work / "run"
    return (run / "chain.jsonl").read_bytes(), {p.name: p.read_bytes() for p in sorted((run / "checkpoints").iterdir())}


@pytest.fixture(scope="module")
def cpu_chain(corpus, tmp_path_factory):
    return _train(tmp_path_factory.mktemp("cpu_run"), corpus, "--threads=1")


@needs_gpu
def test_cuda_training_chain_equals_cpu_chain(ops, corpus, cpu_chain, tmp_path):
    chain, ckpts = _train(tmp_path, corpus, f"--device={DEV}")
    assert chain == cpu_chain[0], "the CUDA run's chain differs from the CPU run's"
    assert ckpts == cpu_chain[1]


@needs_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="hardware: needs two CUDA GPUs for torchrun R=2 with NCCL")
def test_torchrun_nccl_two_ranks_equals_cpu_chain(ops, corpus, cpu_chain, tmp_path):
    if not torch.distributed.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    chain, ckpts = _train(tmp_path, corpus, f"--device={DEV}", launcher=torchrun)
    assert chain == cpu_chain[0], "the 2-GPU NCCL run's chain differs from the CPU run's"
    assert ckpts == cpu_chain[1]
