"""RepOps: reproducible operators. Every floating-point operation of a training step runs here.

The arithmetic contract that all kernels obey is kernels/README.md (IEEE float32, no fused
multiply-add, flush-to-zero, one canonical order for every sum, canonical exp/log/rsqrt/sin/cos,
Philox random numbers). This module exposes each operator as a differentiable Python function;
the kernels are built on first use (or by repops.load()) and checked with a runtime canary:

    import repops
    y = repops.linear(x, w)                  # x [R, in], w [out, in]
    y = repops.linear(x, w, exact=True)      # the exact integer matmul (contract §11), CPU
    loss = repops.cross_entropy(logits, targets)
    loss.backward()                           # backward passes are RepOps kernels too

Raw kernels are torch custom ops: repops.ops.<name> is torch.ops.repops.<name> (see
kernels/cpu/binding.cpp), loaded on first access. A failed build raises RepOpsBuildError with a
one-line message; importing this module has no side effects.
Host-side scalars are rounded to float32 with f32() after float64 IEEE arithmetic (contract §1).
Backends: CPU (kernels/cpu, C++); CUDA (kernels/cuda) registers the same op names with CUDA
implementations where torch has CUDA; Metal (kernels/metal, registered by repops_mps.py) where
torch has MPS (an Apple GPU).

Every operator's autograd rule stands next to its forward, so a backward is checked against its
forward in one place; the kernels are in kernels/, and the CUDA kernel versions kept out of the
default build in dev/cuda/ (built, selectable and hashed only with REPOPS_CUDA_DEV=1).
"""
import contextlib
import fcntl
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys

import numpy as np
import torch
import torch.utils.cpp_extension

CONTRACT = 2  # the arithmetic contract's version (kernels/README.md); a run's genesis names it
ROOT = os.path.dirname(os.path.abspath(__file__))
CPU_DIR = os.path.join(ROOT, "kernels", "cpu")
CPU_SOURCES = sorted(
    os.path.join(CPU_DIR, f) for f in os.listdir(CPU_DIR)
    if f.endswith(".cpp") and f != "selftest.cpp")
CUDA_DIR = os.path.join(ROOT, "kernels", "cuda")
# CUDA kernel versions kept out of the default build (not yet verified on a GPU, or verified and
# slower than the default): built, selectable and hashed only with REPOPS_CUDA_DEV=1, the GPU
# session that verifies them (tools/matmul_versions.py, .ci/gpu). Promotion moves a verified
# version from dev/cuda into kernels/cuda (docs/cuda-speed.md).
DEV_CUDA_DIR = os.path.join(ROOT, "dev", "cuda")
CUDA_DEV = os.environ.get("REPOPS_CUDA_DEV", "") == "1"
CUDA_SOURCES = sorted(os.path.join(d, f) for d in [CUDA_DIR] + [DEV_CUDA_DIR] * CUDA_DEV
                      for f in os.listdir(d) if f.endswith((".cu", ".cpp")))
# Headers both backends include: the ids they share (CPU kernels, CUDA kernels) and the
# bindings' common argument checks.
COMMON_DIR = os.path.join(ROOT, "kernels", "common")
# The Metal kernels (compiled at run time by torch.mps.compile_shader, see repops_mps.py).
METAL_DIR = os.path.join(ROOT, "kernels", "metal")
METAL_FILES = sorted(os.path.join(METAL_DIR, f) for f in os.listdir(METAL_DIR) if f.endswith((".metal", ".h")))


def _headers(folder):
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith((".h", ".cuh")))


# What decides the kernels' bits: every kernel file a run can execute (the code digest of a run
# covers these; SPEC.md §14). The CUDA and Metal files count on every machine, so a CPU, a CUDA and
# an MPS run of the same code share one digest; dev/cuda counts only where it is built.
KERNEL_FILES = (CPU_SOURCES + _headers(CPU_DIR) + CUDA_SOURCES + _headers(CUDA_DIR) + _headers(COMMON_DIR)
                + (_headers(DEV_CUDA_DIR) if CUDA_DEV else []) + METAL_FILES)
# The instruction set the CPU kernels are built for: this CPU's (native) unless REPOPS_CPU_ARCH
# names another -march value, e.g. REPOPS_CPU_ARCH=x86-64-v3 (AVX2 + FMA, no AVX-512) to run the
# AVX2 code path on an AVX-512 machine. Each value builds into its own folder under build/.
CPU_ARCH = os.environ.get("REPOPS_CPU_ARCH", "") or "native"
# Contract §2-§3: no contraction into FMA, no fast-math reassociation. -march only picks the
# SIMD width and the matmul tile; it cannot change bits because nothing is fused or reordered.
# -fopenmp: at::parallel_for (binding.cpp) is an inline OpenMP loop; without it, it runs serially.
# -falign-loops=64: every loop starts on a 64-byte line. Where the matmul's inner loop started 48
# bytes into a line, a whole build ran its fp32 products 8% slower on AMD Zen 3 (AVX2), so speed
# changed with unrelated code moving the loop; aligned, two builds of one source measure the same
# (docs/performance.md). No arithmetic changes.
CPU_FLAGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", f"-march={CPU_ARCH}", "-fopenmp", "-falign-loops=64"]
# CUDA (contract §2-§3): no FMA contraction, flush-to-zero; the kernels also round every add
# and multiply explicitly (__fadd_rn, __fmul_rn), so no flag can fuse them.
CUDA_FLAGS = ["-O3", "-std=c++17", "--fmad=false", "-ftz=true", "-prec-div=true", "-prec-sqrt=true",
              "-Xcompiler", "-ffp-contract=off", "-gencode=arch=compute_80,code=sm_80",
              "-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90"]
HAS_CUDA = torch.cuda.is_available()   # the CUDA kernels are built only where torch has CUDA
HAS_MPS = torch.backends.mps.is_available()   # the Metal kernels are registered only where torch has MPS
# The CUDA kernel versions the plain ops use, read once (docs/cuda-speed.md): all give the same bits;
# a default is the fastest version tools/matmul_versions.py verified on a GPU (H200, 2026-12-04).
# MATMUL: 1 (kernels/cuda/matmul.cu), 2-4 (matmul_tiled.cu), default 3, with REPOPS_CUDA_DEV=1 also
# 5-6 (matmul_tiled.cu's 32 x 32 tiles, not yet verified on a GPU); INT8: mma (int8.cu) or
# cublaslt (torch._int_mm where it fits, else mma), default cublaslt; CLIP: 1 (optim.cu's gradient
# norm), with REPOPS_CUDA_DEV=1 also 2 (dev/cuda/flat_sum.cu, streamed through one block: slower);
# EXACT_GEMM, the exact matmul's residue GEMMs: mma (int8.cu), with REPOPS_CUDA_DEV=1 also cublaslt
# (not yet verified on a GPU: tools/exact_cuda.py).
CUDA_MATMUL_VERSIONS = ("1", "2", "3", "4", "5", "6") if CUDA_DEV else ("1", "2", "3", "4")
CUDA_INT8_PATHS = ("mma", "cublaslt")
CUDA_CLIP_VERSIONS = ("1", "2") if CUDA_DEV else ("1",)
CUDA_EXACT_GEMM_PATHS = ("mma", "cublaslt") if CUDA_DEV else ("mma",)
CUDA_MATMUL = os.environ.get("REPOPS_CUDA_MATMUL", "") or "3"
CUDA_INT8 = os.environ.get("REPOPS_CUDA_INT8", "") or "cublaslt"
CUDA_CLIP = os.environ.get("REPOPS_CUDA_CLIP", "") or "1"
CUDA_EXACT_GEMM = os.environ.get("REPOPS_CUDA_EXACT_GEMM", "") or "mma"

# The CPU kernel versions, chosen at load (kernels/cpu; every one gives the same bits, so the choice
# is speed only): REPOPS_CPU_MATMUL = auto | 256 | 512, the fp32 matmul's vector width (auto: 512
# on x86 CPUs with AVX-512, 256 elsewhere, matmul.cpp); REPOPS_CPU_INT8 = auto | vnni | amx, the
# int8 GEMM of §10 and §11 (auto: AMX-INT8 where the CPU and Linux give it, else the build's SIMD
# path, "vnni": VNNI on AVX-512 VNNI CPUs, vpmaddwd / smlal / C elsewhere). select_cpu() switches.
CPU_MATMUL_VERSIONS = {"auto": 0, "256": 256, "512": 512}
CPU_INT8_PATHS = {"auto": 0, "vnni": 1, "amx": 2}
CPU_MATMUL = os.environ.get("REPOPS_CPU_MATMUL", "") or "auto"
CPU_INT8 = os.environ.get("REPOPS_CPU_INT8", "") or "auto"

# Philox purpose tags (contract §6), the numbers of RpPurpose in kernels/common/ids.h.
PURPOSE_INIT, PURPOSE_DROPOUT, PURPOSE_DATA, PURPOSE_SAMPLE = 1, 2, 3, 4


class RepOpsBuildError(RuntimeError):
    """The kernels could not be built or failed their canary; the message says what to do."""


def _cpu_isa_tag():
    """A short digest of what -march sees (this CPU's flags and CPU_ARCH), so builds for
    different CPUs or instruction sets never mix."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((l for l in f if l.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    compiler = os.environ.get("CXX", "c++")
    tag = hashlib.sha256((platform.machine() + flags + compiler + CPU_ARCH).encode()).hexdigest()[:12]
    return tag if CPU_ARCH == "native" else CPU_ARCH + "_" + tag


def _check_toolchain():
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise RepOpsBuildError(
            f"RepOps builds its kernels on first use and needs a C++17 compiler, but '{compiler}' "
            "was not found. Install one (Debian/Ubuntu: apt-get install g++; macOS: xcode-select "
            "--install) or set CXX to its path.")
    if shutil.which("ninja") is None and not os.path.exists(os.path.join(os.path.dirname(sys.executable), "ninja")):
        raise RepOpsBuildError("RepOps needs ninja to build its kernels: pip install ninja")


@contextlib.contextmanager
def build_lock(build_dir):
    """Hold build_dir's flock while building there (another process waits). torch's own build
    lock (the file `lock`, made and removed by each build) is left behind when a build is
    killed, and then every later build waits on it forever; the kernel frees an flock with its
    process, so under it a `lock` file can only be such a leftover, and is removed."""
    with open(os.path.join(build_dir, "flock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        stale = os.path.join(build_dir, "lock")
        if os.path.exists(stale):
            os.remove(stale)
            print(f"repops: removed {stale}, left by a kernel build that was stopped", file=sys.stderr)
        yield


_loaded = False


def load():
    """Build (once per CPU type; cached in build/) and load the kernels, then run the canaries.
    Idempotent; called on first use of `ops`. Raises RepOpsBuildError."""
    global _loaded
    if _loaded:
        return
    _check_toolchain()
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", CPU_ARCH):
        raise RepOpsBuildError(f"REPOPS_CPU_ARCH={CPU_ARCH!r} is not a -march value (e.g. x86-64-v3, armv8.2-a)")
    for var, value, known in (("REPOPS_CUDA_MATMUL", CUDA_MATMUL, CUDA_MATMUL_VERSIONS),
                              ("REPOPS_CUDA_INT8", CUDA_INT8, CUDA_INT8_PATHS), ("REPOPS_CUDA_CLIP", CUDA_CLIP, CUDA_CLIP_VERSIONS),
                              ("REPOPS_CUDA_EXACT_GEMM", CUDA_EXACT_GEMM, CUDA_EXACT_GEMM_PATHS),
                              ("REPOPS_CPU_MATMUL", CPU_MATMUL, CPU_MATMUL_VERSIONS), ("REPOPS_CPU_INT8", CPU_INT8, CPU_INT8_PATHS)):
        if value not in known:
            raise RepOpsBuildError(f"{var}={value!r} is not one of its kernel versions ({', '.join(known)}"
                                   + ("" if CUDA_DEV or var not in ("REPOPS_CUDA_MATMUL", "REPOPS_CUDA_CLIP", "REPOPS_CUDA_EXACT_GEMM")
                                      else "; more with REPOPS_CUDA_DEV=1")
                                   + ")")
    name = ("repops_cuda_dev" if CUDA_DEV else "repops_cuda") if HAS_CUDA else "repops_cpu"
    dev_flags = ["-DRPC_DEV_VERSIONS"] if CUDA_DEV and HAS_CUDA else []   # binding_cuda.cpp and the launchers
    build_dir = os.path.join(ROOT, "build", name + "_" + _cpu_isa_tag())
    os.makedirs(build_dir, exist_ok=True)
    # The build finds ninja on PATH: a virtual environment's bin/ need not be activated. PATH is
    # restored afterwards, so importing repops changes nothing in the caller's environment.
    saved_path = os.environ.get("PATH", "")
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + saved_path
    try:
        with build_lock(build_dir):
            torch.utils.cpp_extension.load(
                name=name, sources=CPU_SOURCES + (CUDA_SOURCES if HAS_CUDA else []),
                extra_cflags=CPU_FLAGS + dev_flags, extra_cuda_cflags=CUDA_FLAGS + dev_flags if HAS_CUDA else None,
                extra_ldflags=["-fopenmp"], extra_include_paths=[CPU_DIR, CUDA_DIR, COMMON_DIR] + [DEV_CUDA_DIR] * CUDA_DEV,
                build_directory=build_dir, is_python_module=False, verbose=False)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RepOpsBuildError(f"building the RepOps kernels failed (build dir {build_dir}): {first}") from e
    finally:
        os.environ["PATH"] = saved_path
    fused, ftz_missing = torch.ops.repops.canary().tolist()
    if fused != 0.0:
        raise RepOpsBuildError("RepOps canary: the kernels were built with floating-point contraction "
                               "(a*b+c fused into an FMA); rebuild with -ffp-contract=off")
    if ftz_missing != 0.0:
        raise RepOpsBuildError("RepOps canary: flush-to-zero is not active in kernel worker threads")
    if HAS_CUDA and torch.ops.repops.canary_cuda().tolist() != [0.0, 0.0]:
        raise RepOpsBuildError("RepOps CUDA canary: the CUDA kernels were built with contraction or "
                               "without flush-to-zero; rebuild with repops.CUDA_FLAGS")
    try:
        torch.ops.repops.cpu_select(CPU_MATMUL_VERSIONS[CPU_MATMUL], CPU_INT8_PATHS[CPU_INT8])
    except RuntimeError as e:
        raise RepOpsBuildError(f"REPOPS_CPU_MATMUL={CPU_MATMUL}, REPOPS_CPU_INT8={CPU_INT8}: "
                               f"{str(e).strip().splitlines()[0]}") from e
    if HAS_CUDA:
        torch.ops.repops.cuda_select(int(CUDA_MATMUL), CUDA_INT8_PATHS.index(CUDA_INT8), int(CUDA_CLIP),
                                     CUDA_EXACT_GEMM_PATHS.index(CUDA_EXACT_GEMM))
    if HAS_MPS:
        import repops_mps   # here, not at the top: only a machine with MPS compiles Metal
        try:
            repops_mps.register()
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise RepOpsBuildError(f"the RepOps Metal kernels failed: {first}") from e
    _loaded = True


def select_cpu(matmul=None, int8=None):
    """Switch the CPU kernel versions of this process (names as REPOPS_CPU_MATMUL / REPOPS_CPU_INT8;
    None: the environment's choice) and return the kernel banner. RuntimeError where this build or
    CPU has no such version (e.g. int8="amx" without AMX-INT8)."""
    return ops.cpu_select(CPU_MATMUL_VERSIONS[matmul or CPU_MATMUL], CPU_INT8_PATHS[int8 or CPU_INT8])


class _Kernels:
    """torch.ops.repops, loaded on first attribute access (then cached on this object)."""

    def __getattr__(self, name):
        load()
        op = getattr(torch.ops.repops, name)
        setattr(self, name, op)
        return op


ops = _Kernels()


# ------------------------------------------------------------------ host scalars (contract §1)
def f32(x):
    """Round a Python float (float64) to the nearest float32, returned as a Python float."""
    return float(np.float32(x))


def powi(x, n):
    """x**n for integer n >= 0 by binary exponentiation in float64 (IEEE multiplies only)."""
    result, base = 1.0, float(x)
    while n > 0:
        if n & 1:
            result *= base
        base *= base
        n >>= 1
    return result


def _signed64(seed):
    seed &= (1 << 64) - 1
    return seed - (1 << 64) if seed >= 1 << 63 else seed


# ------------------------------------------------------------------ random numbers (contract §6)
def philox_words(seed, c1, c2, purpose, n):
    """n uint32 Philox4x32-10 words (as int64): counter (i//4, c1, c2, purpose), key = seed."""
    return ops.philox(_signed64(seed), c1, c2, purpose, n)


def uniform(seed, c1, c2, purpose, n):
    return ops.uniform(_signed64(seed), c1, c2, purpose, n)


def normal(seed, c1, c2, purpose, n):
    return ops.normal(_signed64(seed), c1, c2, purpose, n)


# ------------------------------------------------------------------ differentiable operators
class _MatMul(torch.autograd.Function):
    """The contract's matmul (§4.1), or with exact the exact matmul (§11): forward and both
    backward products alike."""

    @staticmethod
    def forward(ctx, a, b, exact):
        ctx.save_for_backward(a, b)
        ctx.op = ops.exact_matmul if exact else ops.matmul
        return ctx.op(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        ga = _product_in_layout_of(a, ctx.op, g, b.transpose(-1, -2)) if ctx.needs_input_grad[0] else None
        gb = _product_in_layout_of(b, ctx.op, a.transpose(-1, -2), g) if ctx.needs_input_grad[1] else None
        return ga, gb, None


def _product_in_layout_of(like, op, l, r):
    """op(l, r), laid out in memory as `like` is: where like is a transposed view (unit stride
    along its second-last dim, as w.t() in linear and k^T in attention) it is op(r^T, l^T)^T.
    The bits are the same (§4.1 and §11: each term is one product, x*y = y*x, and the terms of
    an output are summed in the same order of k), and the gradient reaches its parameter or
    tensor in that tensor's own layout, so autograd copies nothing to accumulate it."""
    if like.stride(-2) == 1 and like.stride(-1) != 1 and like.shape[-1] > 1:
        return op(r.transpose(-1, -2), l.transpose(-1, -2)).transpose(-1, -2)
    return op(l, r)


def matmul(a, b, exact=False):
    """a @ b for 2-D or equally batched 3-D operands (any strides); exact: contract §11."""
    if a.dim() != b.dim():
        raise ValueError("repops.matmul: operands must have the same number of dims for autograd")
    return _MatMul.apply(a, b, exact)


def linear(x, w, exact=False):
    """x @ w.T with w [out, in]; leading dims of x are flattened to rows; exact: contract §11."""
    y = _MatMul.apply(x.reshape(-1, x.shape[-1]), w.t(), exact)
    return y.view(*x.shape[:-1], w.shape[0])


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps, fork):
        ctx.set_materialize_grads(False)
        x2 = x.reshape(-1, x.shape[-1])
        y, rstd = ops.rmsnorm(x2, w, eps)
        ctx.save_for_backward(x2, w, rstd)
        ctx.fork = fork
        y = y.view(x.shape)
        return (x.view_as(x), y) if fork else y

    @staticmethod
    def backward(ctx, *grads):
        x2, w, rstd = ctx.saved_tensors
        g_res, gy = grads if ctx.fork else (None, grads[0])
        gx = gw = None
        if gy is not None:
            gx, gw = ops.rmsnorm_backward(gy.reshape(x2.shape), x2, w, rstd)
            gx = gx.view(g_res.shape if g_res is not None else gy.shape)
        if g_res is not None:
            gx = g_res if gx is None else ops.add(g_res, gx)  # contract §8 rmsnorm_fork
        return gx, gw, None, None


def rmsnorm(x, w, eps):
    return _RMSNorm.apply(x, w, eps, False)


def rmsnorm_fork(x, w, eps):
    """(x, rmsnorm(x)): the residual stream feeds the norm and the residual add, and the two
    gradients meet in one RepOps add here instead of in autograd's accumulation."""
    return _RMSNorm.apply(x, w, eps, True)


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return ops.rope(x, cos, sin, False)

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        return ops.rope(g, cos, sin, True), None, None


def rope_tables(seq_len, head_dim, theta):
    return ops.rope_tables(seq_len, head_dim, theta)


def rope(x, cos, sin):
    """Rotate interleaved pairs of x [B, T, H, Dh] (any strides with unit stride along Dh, such as
    the q or k columns of the qkv linear's output) by the position angles of the tables; returns
    them heads-major, [B, H, T, Dh] contiguous: the layout attention's matmuls read. One pass of
    the kernel rotates the pairs and moves the heads, so no copy precedes or follows it; its
    backward returns the gradient [B, T, H, Dh] contiguous."""
    return _Rope.apply(x, cos, sin)


class _CausalSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s, scale):
        p = ops.causal_softmax(s, scale)
        ctx.save_for_backward(p)
        ctx.scale = scale
        return p

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        return ops.causal_softmax_backward(g, p, ctx.scale), None


def causal_softmax(s, scale):
    """softmax(s * scale) over columns j <= t of each row t of s [BH, T, T]; zeros above."""
    return _CausalSoftmax.apply(s, f32(scale))


# While set, causal_attention runs the composed operators (matmul, causal_softmax, matmul) on every
# backend: optrace.OpTrace sets it while it records a step, so that a trace lists the same
# operators on a CPU as on a GPU, and two traces diff operator by operator.
COMPOSED_ATTENTION = False


class _CausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale):
        o, p = ops.causal_attention(q, k, v, scale)
        ctx.save_for_backward(q, k, v, p)
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx, go):
        q, k, v, p = ctx.saved_tensors
        gq, gk, gv = ops.causal_attention_backward(go, q, k, v, p, ctx.scale)
        return gq, gk, gv, None


# exact_matmul_causal's forms (kernels/README.md §11 "Attention's products")
SCORES, MIX, MIX_T = 1, 2, 3


class _ExactCausalAttention(torch.autograd.Function):
    """The composed ops of exact attention (§11 products) on the CPU, with their bits, each product
    told its causal form (ops.exact_matmul_causal): the scores S = q k^T and gP = gO v^T on and
    below the diagonal only (+0.0 above it, where causal_softmax and its backward read nothing);
    the products with P and gS (+0.0 above the diagonal) without their zeros."""
    @staticmethod
    def forward(ctx, q, k, v, scale):
        T = k.shape[1]
        s = ops.exact_matmul_causal(q, k.transpose(1, 2), SCORES)                # [batch, G*T, T]
        p = ops.causal_softmax(s.view(-1, T, T), scale).view(s.shape)
        ctx.save_for_backward(q, k, v, p)
        ctx.scale = scale
        return ops.exact_matmul_causal(p, v, MIX)                                # [batch, G*T, Dh]

    @staticmethod
    def backward(ctx, go):
        q, k, v, p = ctx.saved_tensors
        T = k.shape[1]
        gp = ops.exact_matmul_causal(go, v.transpose(1, 2), SCORES)
        gs = ops.causal_softmax_backward(gp.view(-1, T, T), p.view(-1, T, T), ctx.scale).view(gp.shape)
        need = ctx.needs_input_grad
        gq = ops.exact_matmul_causal(gs, k, MIX) if need[0] else None
        gk = ops.exact_matmul_causal(gs.transpose(1, 2), q, MIX_T) if need[1] else None
        gv = ops.exact_matmul_causal(p.transpose(1, 2), go, MIX_T) if need[2] else None
        return gq, gk, gv, None


def causal_attention(q, k, v, scale, mix=None, exact=False):
    """Full causal attention (contract §8 attention): q [batch, G*T, Dh] (the G query heads of one
    key/value head stacked as rows), k, v [batch, T, Dh] -> o [batch, G*T, Dh] =
    matmul(causal_softmax(matmul(q, k^T) viewed [G, T, T] per slice, scale), v), with the
    gradients of those ops. mix(p, v): the P·V product (default matmul; quant.matmul_pv with
    int8_pv). exact: every product is §11's. On the CPU, without mix, one op runs them: fp32 head
    by head, each head's scores in L2 (kernels/cpu/attention.cpp); exact with the scores below the
    diagonal only (_ExactCausalAttention); otherwise, and while COMPOSED_ATTENTION is set, the ops
    run over all heads at once. The same bits."""
    scale = f32(scale)
    if q.device.type == "cpu" and mix is None and not COMPOSED_ATTENTION:
        return (_ExactCausalAttention if exact else _CausalAttention).apply(q, k, v, scale)
    batch, rows, T = q.shape[0], q.shape[1], k.shape[1]
    p = causal_softmax(matmul(q, k.transpose(1, 2), exact).view(-1, T, T), scale).view(batch, rows, T)
    return mix(p, v) if mix else matmul(p, v, exact)


def _band_ops(exact):
    """(band_scores, band_mix, band_mix_t): the §8 window kernels, or with exact their §11 band
    products (CPU only)."""
    if exact:
        return ops.exact_band_scores, ops.exact_band_mix, ops.exact_band_mix_t
    return ops.band_scores, ops.band_mix, ops.band_mix_t


class _BandScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, W, exact):
        ctx.save_for_backward(a, b)
        ctx.ops = _band_ops(exact)
        return ctx.ops[0](a, b, W)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        _, mix, mix_t = ctx.ops
        g = g.contiguous()
        ga = mix(g, b) if ctx.needs_input_grad[0] else None
        gb = mix_t(g, a, b.shape[1]) if ctx.needs_input_grad[1] else None
        return ga, gb, None, None


class _BandMix(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p, b, exact):
        ctx.save_for_backward(p, b)
        ctx.ops = _band_ops(exact)
        return ctx.ops[1](p, b)

    @staticmethod
    def backward(ctx, g):
        p, b = ctx.saved_tensors
        scores, _, mix_t = ctx.ops
        g = g.contiguous()
        gp = scores(g, b, p.shape[2]) if ctx.needs_input_grad[0] else None
        gb = mix_t(p, g, b.shape[1]) if ctx.needs_input_grad[1] else None
        return gp, gb, None


class _WindowSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s, scale):
        p = ops.window_softmax(s, scale)
        ctx.save_for_backward(p)
        ctx.scale = scale
        return p

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        return ops.window_softmax_backward(g, p, ctx.scale), None


def window_attention(q, k, v, window, scale, mix=None, exact=False):
    """Causal attention of each query over the last `window` keys (its own position included),
    in O(T * window) memory and time (contract §8 window attention). q [batch, G*T, Dh] (the G
    query heads of a key/value head, g-major), k, v [batch, T, Dh]; returns o [batch, G*T, Dh].
    Band [batch, G*T, W], W = min(window, T): column w is key t - (W-1) + w. With W = T it gives
    the bits of full causal attention (matmul, causal_softmax, matmul). mix(p, v): the band mix
    (default the fp32 band_mix; quant.band_mix with int8_pv). exact: the band products are
    §11's (contract §11 "Band products"), whose W = T gives the bits of exact full attention."""
    T = k.shape[1]
    W = min(window, T)
    s = _BandScores.apply(q, k, W, exact)                              # [batch, G*T, W]
    p = _WindowSoftmax.apply(s.view(-1, T, W), f32(scale)).view(s.shape)
    return mix(p, v) if mix else _BandMix.apply(p, v, exact)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u):
        ctx.save_for_backward(u)
        return ops.swiglu(u)

    @staticmethod
    def backward(ctx, g):
        (u,) = ctx.saved_tensors
        return ops.swiglu_backward(g.contiguous(), u)


def swiglu(u):
    """silu(gate) * up for u [..., 2H] = [gate | up]; leading dims are flattened to rows."""
    out = _SwiGLU.apply(u.reshape(-1, u.shape[-1]))
    return out.view(*u.shape[:-1], u.shape[-1] // 2)


def _indices_on(idx, device, hi, what):
    """(idx on `device`, whether the op must still check its range). Indices that come from the
    host bound for a GPU are checked here, on the host, once: the GPU op then need not wait for
    the device to test them (a host sync per call)."""
    if idx.device == device or idx.device.type != "cpu":
        return idx, True
    ops.check_index(idx.reshape(-1), hi, what)
    if device.type != "cuda":   # MPS: a plain copy (pinned memory is a CUDA notion)
        return idx.to(device), False
    # from pinned memory the copy is truly asynchronous (no wait for the device's queue)
    return idx.pin_memory().to(device, non_blocking=True), False


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, targets, zloss):
        targets, check = _indices_on(targets, z.device, z.shape[-1], "targets")
        loss, lse = ops.cross_entropy(z, targets, zloss, check)
        ctx.save_for_backward(z, targets, lse)
        ctx.zloss = zloss
        return loss

    @staticmethod
    def backward(ctx, g):
        z, targets, lse = ctx.saved_tensors
        # the forward checked these targets
        return ops.cross_entropy_backward(g, z, targets, lse, ctx.zloss, False), None, None


def cross_entropy(z, targets, zloss=0.0):
    """Mean over rows of -log softmax(z)[target] + zloss * logsumexp(z)^2. targets may be a host
    tensor for a GPU z (checked on the host, then moved)."""
    return _CrossEntropy.apply(z, targets, f32(zloss))


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, idx):
        idx, check = _indices_on(idx, w.device, w.shape[0], "token ids")
        ctx.save_for_backward(idx)
        ctx.num_rows = w.shape[0]
        return ops.embedding(w, idx.reshape(-1), check).view(*idx.shape, w.shape[1])

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        # the forward checked these indices
        return ops.embedding_backward(g.reshape(-1, g.shape[-1]), idx.reshape(-1), ctx.num_rows, False), None


def embedding(w, idx):
    """Rows of w [V, D] at idx (int64, any shape). idx may be a host tensor for a GPU w."""
    return _Embedding.apply(w, idx)


class _Add(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        return ops.add(a, b)

    @staticmethod
    def backward(ctx, g):
        return g, g


def add(a, b):
    return _Add.apply(a, b)


class _Tie(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w):
        ctx.set_materialize_grads(False)
        return w.view_as(w), w.view_as(w)

    @staticmethod
    def backward(ctx, g_in, g_out):
        if g_in is None or g_out is None:
            return g_out if g_in is None else g_in
        return ops.add(g_in, g_out)     # contract §8 tie: one add, not autograd's accumulation


def tie(w):
    """(w, w) as two uses of one tensor (tied input and output embeddings): their gradients
    meet in one RepOps add here instead of in autograd's accumulation."""
    return _Tie.apply(w)


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, s):
        ctx.s = s
        return ops.scale(a, s)

    @staticmethod
    def backward(ctx, g):
        return ops.scale(g, ctx.s), None


def scale(a, s):
    return _Scale.apply(a, f32(s))


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p, seed, c1, c2):
        ctx.args = (p, seed, c1, c2)
        return ops.dropout(x, p, seed, c1, c2)

    @staticmethod
    def backward(ctx, g):
        return ops.dropout(g.contiguous(), *ctx.args), None, None, None, None


def dropout(x, p, seed, c1, c2):
    """Philox dropout (contract §6): the mask is a function of (seed, c1, c2, element index).
    p = 0 is the identity and runs no kernel."""
    if p == 0.0:
        return x
    return _Dropout.apply(x, p, _signed64(seed), c1, c2)


# ------------------------------------------------------------------ optimizer and gradient norm
def adamw_(p, g, m, v, *, lr, beta1, beta2, eps, weight_decay, step):
    """One AdamW update in place (contract §8 adamw); all scalars rounded here, once."""
    ops.adamw_(p, g, m, v, f32(lr), f32(beta1), f32(beta2), f32(1.0 - beta1), f32(1.0 - beta2), f32(eps),
               f32(1.0 - lr * weight_decay), f32(1.0 / (1.0 - powi(beta1, step))),
               f32(1.0 / (1.0 - powi(beta2, step))))


def clip_grad(flat_grad, max_norm):
    """(clipped flat gradient, its norm before clipping) over one flat gradient vector."""
    return ops.clip_grad(flat_grad, f32(max_norm))

