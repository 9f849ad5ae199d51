"""The Metal kernels (kernels/metal) checked on the CPU, in CI: no Apple GPU and no Metal compiler.

    python -m pytest tests/test_metal_emulated.py -q        # about a minute of CPU time

tests/metal_shim/metal_shim.h lets g++ compile every .metal source as C++ and run it, the groups
one after another and the threads of a group as real threads meeting at each barrier (its header
says what this cannot check: the Metal compiler's floating-point behaviour, the GPU's own
arithmetic, real SIMD-group timing). On that emulation:

1. the self-test (kernels/cpu/selftest.cpp), linked against the Metal kernels instead of the CPU
   ones (tests/metal_shim/metal_backend.cpp), prints the CPU backend's digest for every line,
   with the kernel threads' flush-to-zero off (gradual underflow) and on (x86 FTZ/DAZ);
   and the products around 2^-126 (test_selftest.window_pairs) give the contract's bits through
   rp_mul and rp_matmul with flush-to-zero off, on with tininess after rounding (x86) and on with
   tininess before rounding (AArch64 FPCR.FZ, built for AArch64 and run under qemu-user):
   canonical.h's software flush gives the contract's bits whichever rule the GPU has;
2. repops_mps.py itself, with torch.mps.compile_shader replaced by the shim's kernels
   (tests/metal_shim/metal_pyshim.cpp, through ctypes), computes the self-test's digests
   through its ops on CPU tensors: its argument order, host scalars and grids are checked too;
3. the check can fail: a Metal tree without the product flush gives other digests;
4. the sources follow the contract's rules that a scan can see, every op of the bindings has an
   MPS implementation, and every family's source compiles alone, as compile_shader gets it;
5. threadgroup memory is poisoned (NaN bytes) before each group, so a read before the group's
   write shows (a probe kernel checks the poisoning);
6. with every (float) cast rounding toward zero (a conversion mode Metal's compiler options
   allow) the kernels still give the CPU's bits: no int to float conversion of theirs rounds;
7. the fast-math probe .ci/mac runs on a Mac tells g++'s -ffast-math from its default;
8. a model written in stock PyTorch (examples/nanogpt_model.py, its operators mapped by the guard)
   is built and trained one step with every RepOps kernel served by repops_mps on the shim, and
   gets the CPU's state hash.

The same kernels on a real Apple GPU: tests/test_mps.py (skipped without MPS), .ci/mac.
"""
import ctypes
import math
import os
import platform
import re
import shutil
import textwrap
import types
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

import config
import data
import repops
import repops_mps
import stockops
import test_kernels as TK
import test_selftest as ST
import train
from tiny import run_process
from tools import model_changes

ROOT = Path(__file__).resolve().parent.parent
METAL_DIR = ROOT / "kernels" / "metal"
SHIM_DIR = ROOT / "tests" / "metal_shim"
METAL_SOURCES = sorted(METAL_DIR.glob("*.metal"))
FLAGS = ["-std=c++20", "-O1", "-ffp-contract=off", "-fsigned-char", "-pthread", "-Wno-attributes", "-Wno-psabi"]
CPU_INCLUDES = ["-I", str(ROOT / "kernels" / "cpu"), "-I", str(ROOT / "kernels" / "common")]

def _run(cmd, **kw):
    r = run_process([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout}\n{r.stderr}"
    return r


def _digests(stdout):
    return dict(line.split() for line in stdout.splitlines())


@pytest.fixture(scope="module")
def cpu_digests():
    return ST.torch_digests("cpu")


@pytest.fixture(scope="module")
def selftest_object(tmp_path_factory):
    """kernels/cpu/selftest.cpp compiled once (the input generator, the digests, main), without
    the exact matmul's lines (contract §11 has no Metal kernel: --matmul=exact is refused on mps),
    so it prints exactly ST.EXPECTED_NAMES."""
    obj = tmp_path_factory.mktemp("metal_selftest") / "selftest.o"
    _run(["g++", *FLAGS, *CPU_INCLUDES, "-DRP_SELFTEST_NO_CPU_ONLY", "-c", ROOT / "kernels" / "cpu" / "selftest.cpp",
          "-o", obj], timeout=600)
    return obj


def _metal_selftest(selftest_object, metal_dir, out):
    _run(["g++", *FLAGS, *CPU_INCLUDES, "-I", metal_dir, SHIM_DIR / "metal_backend.cpp", selftest_object, "-o", out],
         timeout=600)
    return out


@pytest.fixture(scope="module")
def metal_selftest(selftest_object, tmp_path_factory):
    return _metal_selftest(selftest_object, METAL_DIR, tmp_path_factory.mktemp("metal_exe") / "metal_selftest")


WINDOW_BUILDS = {"x86": ("g++", [], []), "aarch64": (ST.ARM_CXX, ["-static"], [ST.QEMU_ARM])}


@pytest.mark.parametrize("isa,hw_flush", [("x86", False), ("x86", True), ("aarch64", True)],
                         ids=["x86_gradual_underflow", "x86_ftz_daz", "aarch64_fpcr_fz_qemu"])
def test_products_around_2_126_give_the_contract_bits(tmp_path, isa, hw_flush):
    """Contract §3 on the products where the flush rules differ (test_selftest.window_pairs: the
    AArch64 window, the double-rounding band, their edges, both signs), through rp_mul and
    rp_matmul, against exact rationals. The hardware product is printed too: under FPCR.FZ it
    must differ exactly in the window, so the inputs do reach the rule being tested."""
    cxx, flags, runner = WINDOW_BUILDS[isa]
    if isa == "aarch64" and platform.machine() != "x86_64":
        pytest.skip("hardware: the AArch64 build runs under qemu-user from an x86-64 machine")
    if isa == "aarch64" and not (cxx and runner[0]):
        pytest.skip("no aarch64 cross compiler or qemu-user (Debian packages g++-aarch64-linux-gnu, qemu-user)")
    exe = tmp_path / f"metal_window_{isa}"
    _run([cxx, *flags, *FLAGS, "-I", METAL_DIR, SHIM_DIR / "metal_window.cpp", "-o", exe], timeout=600)
    pairs = ST.window_pairs()
    r = run_process([*runner, str(exe)], input="".join(f"{a:08x} {b:08x}\n" for a, b in pairs),
                    capture_output=True, text=True, timeout=600, env=_flush_env(hw_flush), check=True)
    out = [[int(v, 16) for v in line.split()] for line in r.stdout.splitlines()]
    assert len(out) == len(pairs)
    raw_differs = []
    for (a, b), (mul, mm, raw) in zip(pairs, out):
        want = ST.contract_product(a, b)
        mm_want = 0 if want & 0x7FFFFFFF == 0 else want   # acc = +0.0 + product: +0 for -0
        assert (mul, mm) == (want, mm_want), f"{a:08x} * {b:08x}: mul {mul:08x} matmul {mm:08x}, want {want:08x}"
        raw_differs.append(raw != want)
    if isa == "aarch64":
        in_window = [-Fraction(1, 2**25) <= ST._position(a, b) < 0 for a, b in pairs]
        assert raw_differs == in_window and sum(in_window) >= 12




# ------------------------------------------------------------------------------------------------
# 1. the self-test through the Metal kernels
# ------------------------------------------------------------------------------------------------
def _flush_env(hw_flush):
    env = dict(os.environ)
    env.pop("METAL_SHIM_HW_FLUSH", None)
    if hw_flush:
        env["METAL_SHIM_HW_FLUSH"] = "1"
    return env


@pytest.mark.parametrize("hw_flush", [False, True], ids=["gradual_underflow", "ftz_daz"])
def test_emulated_metal_selftest_gives_the_cpu_digests(metal_selftest, cpu_digests, hw_flush):
    r = _run([metal_selftest], timeout=300, env=_flush_env(hw_flush))
    assert r.stderr == "", r.stderr   # no canary complaint
    mine = _digests(r.stdout)
    assert list(mine) == ST.EXPECTED_NAMES
    bad = [f"{n}: cpu {cpu_digests[n][:16]}.. metal {mine[n][:16]}.." for n in ST.EXPECTED_NAMES
           if mine[n] != cpu_digests[n]]
    assert not bad, "the emulated Metal kernels differ from the CPU's:\n" + "\n".join(bad)


def test_emulation_catches_a_missing_flush(selftest_object, cpu_digests, tmp_path):
    """Without the product flush of canonical.h the products in the flush window keep their
    hardware value: the digests of the ops that meet such products change."""
    broken = tmp_path / "metal"
    shutil.copytree(METAL_DIR, broken)
    header = (broken / "canonical.h").read_text()
    line = "  if (t < fl(0x0C800000u)) return fl(s);"
    assert header.count(line) == 1
    (broken / "canonical.h").write_text(header.replace(line, "  if (false) return fl(s);"))
    exe = _metal_selftest(selftest_object, broken, tmp_path / "broken_selftest")
    mine = _digests(run_process([str(exe)], capture_output=True, text=True, timeout=300).stdout)
    changed = {n for n in ST.EXPECTED_NAMES if mine.get(n) != cpu_digests[n]}
    assert {"mul", "scale", "canary"} <= changed, sorted(changed)


# ------------------------------------------------------------------------------------------------
# 2. repops_mps.py on the shim
# ------------------------------------------------------------------------------------------------
class ShimLibrary:
    """What torch.mps.compile_shader returns, for the CPU: lib.<kernel>(*args, threads=[N, 1, 1],
    group_size=[G, 1, 1]) runs the shim's kernel; every argument must be of the kind the kernel
    declares (a tensor for a buffer, an int for constant long&, a float for constant float&)."""

    def __init__(self, so, source, hw_flush=False):
        self.so, self.kernels = so, set(re.findall(r"kernel void (\w+)\(", source))
        self.hw_flush = int(hw_flush)

    def __getattr__(self, name):
        assert name in self.kernels, f"{name} is not a kernel of this source"
        sig = self.so.rp_signature(name.encode())
        assert sig is not None, f"the shim has no kernel {name}"
        sig = sig.decode()

        def call(*args, threads, group_size):
            assert len(threads) == 3 and len(group_size) == 3 and threads[1:] == [1, 1] and group_size[1:] == [1, 1]
            assert threads[0] > 0 and threads[0] % group_size[0] == 0, (threads, group_size)
            assert len(args) == len(sig), f"{name}: {len(args)} arguments for the signature {sig}"
            keep, ptrs = [], []
            for i, (a, kind) in enumerate(zip(args, sig)):
                if kind == "p":
                    assert isinstance(a, torch.Tensor), f"{name} argument {i}: a buffer, got {type(a)}"
                    ptrs.append(ctypes.c_void_p(a.data_ptr()))
                    continue
                want = int if kind == "l" else float
                assert type(a) is want, f"{name} argument {i}: a {want.__name__}, got {type(a).__name__}"
                keep.append(ctypes.c_int64(a) if kind == "l" else ctypes.c_float(a))
                ptrs.append(ctypes.cast(ctypes.pointer(keep[-1]), ctypes.c_void_p))
            argv = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
            assert self.so.rp_launch(name.encode(), argv, threads[0], group_size[0], self.hw_flush) == 0
        return call


def _pyshim(metal_dir, so_path):
    _run(["g++", *FLAGS, "-shared", "-fPIC", "-I", metal_dir, SHIM_DIR / "metal_pyshim.cpp", "-o", so_path],
         timeout=600)
    so = ctypes.CDLL(str(so_path))
    so.rp_signature.restype = ctypes.c_char_p
    so.rp_signature.argtypes = [ctypes.c_char_p]
    so.rp_launch.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_int]
    return so


@pytest.fixture(scope="module")
def pyshim(tmp_path_factory):
    return _pyshim(METAL_DIR, tmp_path_factory.mktemp("metal_pyshim") / "metal_pyshim.so")


@pytest.fixture()
def mps_on_shim(pyshim, monkeypatch):
    """repops_mps's ops with CPU tensors standing in for MPS ones and the shim for Metal."""
    monkeypatch.setattr(repops_mps, "DEVICE_TYPE", "cpu")
    monkeypatch.setattr(repops_mps, "_libs", {})
    monkeypatch.setattr(torch.mps, "compile_shader", lambda source: ShimLibrary(pyshim, source), raising=False)
    tensorless = {schema.split("(")[0]: fn for schema, fn in repops_mps.TENSORLESS_OPS.items()}
    return types.SimpleNamespace(**repops_mps.TENSOR_OPS, **tensorless)


def test_repops_mps_on_the_shim_gives_the_cpu_digests(mps_on_shim, cpu_digests):
    mine = ST.torch_digests("cpu", ops=mps_on_shim, suffix="_mps")
    bad = [f"{n}: cpu {cpu_digests[n][:16]}.. repops_mps {mine[n][:16]}.." for n in ST.EXPECTED_NAMES
           if mine[n] != cpu_digests[n]]
    assert not bad, "repops_mps.py on the emulated kernels differs from the CPU:\n" + "\n".join(bad)


@pytest.fixture(scope="module")
def pyshim_toward_zero(tmp_path_factory):
    """The shim built from a copy of kernels/metal in which every (float) cast is
    (metal_shim::FloatTowardZero): Metal's conversions rounding toward zero, a mode its compiler
    options allow (MTLCompileOptions.floatingPointConversionRoundingMode)."""
    base = tmp_path_factory.mktemp("metal_toward_zero")
    shutil.copytree(METAL_DIR, base / "metal")
    casts = 0
    for path in (base / "metal").iterdir():
        text, n = re.subn(r"\(float\)", "(metal_shim::FloatTowardZero)", path.read_text())
        path.write_text(text)
        casts += n
    assert casts >= 5, casts
    return _pyshim(base / "metal", base / "metal_pyshim.so")


def test_no_int_to_float_conversion_rounds(pyshim_toward_zero, pyshim, monkeypatch, cpu_digests):
    """Metal's (float) of an int above 2^24 rounds by a mode the compiler options decide (to
    nearest even by default, or toward zero): no kernel may depend on it. With every (float) cast
    rounding toward zero, int8_linear whose int32 sums pass 2^24 (K = 2000, |C| up to 3.2e7, odd
    sums that need rounding) still gives the CPU's bits, and so do all the self-test's digests
    through repops_mps. (canonical.h's i32_to_float converts exact pieces and rounds once, in
    fadd; a plain (float) of the sum gives other bits here.)"""
    rng = np.random.default_rng(5)
    M, N, K = 3, 5, 2000
    a = rng.integers(100, 128, (M, K)).astype(np.int8)
    b = rng.integers(100, 128, (N, K)).astype(np.int8)
    a[1] = -a[1]
    b[:, 0] = 127 - (np.arange(N) % 2)                  # odd and even sums alike
    sx, sw = torch.tensor([0.5]), torch.ones(N)
    C = a.astype(np.int64) @ b.astype(np.int64).T
    assert np.abs(C).min() > 2**24 and (C % 2 != 0).any()
    want = torch.ops.repops.int8_linear(torch.from_numpy(a), torch.from_numpy(b), sx, sw)
    ops = {}
    for name, so in (("toward_zero", pyshim_toward_zero), ("nearest", pyshim)):
        monkeypatch.setattr(repops_mps, "DEVICE_TYPE", "cpu")
        monkeypatch.setattr(repops_mps, "_libs", {})
        monkeypatch.setattr(torch.mps, "compile_shader", lambda source, so=so: ShimLibrary(so, source), raising=False)
        got = repops_mps.TENSOR_OPS["int8_linear"](torch.from_numpy(a), torch.from_numpy(b), sx, sw)
        TK.assert_bits(got, TK.N(want), f"int8_linear, (float) rounding {name}")
        if name == "toward_zero":
            tensorless = {schema.split("(")[0]: fn for schema, fn in repops_mps.TENSORLESS_OPS.items()}
            ops = types.SimpleNamespace(**repops_mps.TENSOR_OPS, **tensorless)
            mine = ST.torch_digests("cpu", ops=ops, suffix="_mps")
            bad = [n for n in ST.EXPECTED_NAMES if mine[n] != cpu_digests[n]]
            assert not bad, f"with (float) rounding toward zero these digests differ from the CPU's: {bad}"


def test_threadgroup_memory_is_poisoned_before_each_group(tmp_path):
    """Threadgroup memory starts undefined on a GPU; the shim fills it with 0xFF bytes (NaN) before
    each group. A kernel that reads its array before writing it reads NaN in every group, not the
    zeros of static memory or the previous group's values; what the group wrote it reads back."""
    src = tmp_path / "probe.cpp"
    src.write_text(textwrap.dedent("""
        #include <cstdio>
        kernel void probe(device float* before, device float* after, uint tid, uint lid, uint gid) {
          RP_THREADGROUP float sh[4];
          before[tid] = sh[lid];                      // read before the group wrote it
          threadgroup_barrier(mem_flags::mem_threadgroup);
          sh[lid] = (float)(gid + 1);
          threadgroup_barrier(mem_flags::mem_threadgroup);
          after[tid] = sh[(lid + 1) % 4];
        }
        int main() {
          static float before[12], after[12];
          metal_shim::launch(12, 4, [&](const metal_shim::Pos& p) { probe(before, after, p.tid, p.lid, p.gid); });
          for (int i = 0; i < 12; ++i) std::printf("%08x %g\\n", as_type<uint>(before[i]), after[i]);
        }
    """))
    exe = tmp_path / "probe"
    _run(["g++", *FLAGS, "-include", SHIM_DIR / "metal_shim.h", src, "-o", exe], timeout=300)
    lines = [line.split() for line in _run([exe], timeout=60).stdout.splitlines()]
    assert [b for b, _ in lines] == ["ffffffff"] * 12, lines
    assert [float(a) for _, a in lines] == [1.0] * 4 + [2.0] * 4 + [3.0] * 4


def test_compiler_probe_tells_fast_math_on_from_off(tmp_path):
    """repops_mps.COMPILER_PROBE, which .ci/mac runs on a Mac's compile_shader (fast math must be
    off), compiled here through the shim by g++ without and with -ffast-math (g++'s fast math
    defines __FAST_MATH__ and folds x != x like Metal's): off passes check_fast_math_off, on is
    refused."""
    src = tmp_path / "probe.cpp"
    src.write_text(repops_mps.COMPILER_PROBE + textwrap.dedent("""
        #include <cstdio>
        int main(int argc, char**) {
          float x[3] = {__builtin_nanf(""), 0x1p-100f, 0x1p-40f};
          int n[1] = {16777219};
          uint out[4];
          rp_compiler_probe(x, n, out, (uint)(argc - 1));
          std::printf("%u %u %u %u\\n", out[0], out[1], out[2], out[3]);
        }
    """))
    words = {}
    for mode, extra in (("off", []), ("on", ["-ffast-math"])):
        exe = tmp_path / f"probe_{mode}"
        _run(["g++", *FLAGS, *extra, "-include", SHIM_DIR / "metal_shim.h", src, "-o", exe], timeout=300)
        words[mode] = [int(w) for w in _run([exe], timeout=60).stdout.split()]
    assert words["off"][:3] == repops_mps.PROBE_FAST_MATH_OFF[:3] and words["off"][3] == 0x4B800002, words
    assert "fast math off" in repops_mps.check_fast_math_off(words["off"])
    with pytest.raises(RuntimeError, match="fast math on .*__FAST_MATH__"):
        repops_mps.check_fast_math_off(words["on"])


def test_repops_mps_argument_errors(mps_on_shim):
    ops = mps_on_shim
    with pytest.raises(RuntimeError, match="inner sizes differ"):
        ops.matmul(torch.zeros(2, 3), torch.zeros(4, 5))
    with pytest.raises(RuntimeError, match="must be float32"):
        ops.add(torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="token ids"):   # the CPU binding's message names the bad index
        ops.embedding(torch.zeros(4, 2), torch.tensor([1, 4]))
    with pytest.raises(RuntimeError, match="-128"):
        ops.int8_matmul(torch.full((2, 3), -128, dtype=torch.int8), torch.zeros(2, 3, dtype=torch.int8))
    # and the canary passes on the emulation
    assert ops.canary_mps().tolist() == [0.0, 0.0]


def test_csum_partial_block_is_not_padded_on_the_shim(mps_on_shim):
    """Contract §4.2's unpadded partial block (test_kernels.unpadded_csum_rows) through
    repops_mps on the shim: the threadgroup sum adds only real terms."""
    for what, t, want in TK.unpadded_csum_rows():
        assert int(TK.N(mps_on_shim.csum(TK.T(t))).view(np.uint32)) == want, what


def test_a_stock_model_step_on_the_shim_gives_the_cpu_state(mps_on_shim, corpus, monkeypatch):
    """examples/nanogpt_model.py (GPT-2 in nanoGPT's style, stock PyTorch only: the guard maps its
    operators onto RepOps kernels), built and trained one step (dropout on, tied embeddings, one
    sequence of 16 tokens: the shim runs a kernel's threads as host threads) with every RepOps
    kernel, its construction's included, served by repops_mps on the shim: the state hash of the
    same step on the CPU kernels. Each kernel runs opaque to the guard's mode, as a custom op does
    (the shim's own torch calls are the data movement around a kernel launch)."""
    cfg = config.parse_config([f"--data_dir={corpus}", "--n_layer=2", "--d_model=32", "--n_head=2", "--d_hidden=64",
                               "--seq_len=16", "--micro_batch_size=1", "--micro_batches=1", "--dropout=0.1",
                               "--tie_embeddings=1", "--max_steps=2"])
    tokens = data.TokenData(cfg.data_dir, cfg.seed)
    cfg = config.resolve(cfg, tokens.vocab_size)

    def one_step():
        with model_changes.model_in_place(model_changes.FOREIGN):
            state = train.TrainState(cfg, tokens.vocab_size)
        assert train.probe(state, tokens, cfg, 1), "a stock model: every step under the mode"
        train.train_step(state, tokens, cfg)
        return state.hash()[0]

    cpu = one_step()
    served = {**repops_mps.TENSOR_OPS, **{name.removesuffix("_mps"): fn for name, fn in vars(mps_on_shim).items()
                                          if name.endswith("_mps")}}
    used = set()

    class MetalKernels:
        def __getattr__(self, name):
            if name not in served:
                raise AttributeError(f"repops_mps has no kernel {name}")
            used.add(name)

            def kernel(*args, **kwargs):
                with _disable_current_modes():
                    return served[name](*args, **kwargs)
            return kernel
    monkeypatch.setattr(repops, "ops", MetalKernels())
    monkeypatch.setattr(stockops, "ops", repops.ops)
    assert one_step() == cpu
    assert {"matmul", "gelu", "gelu_grad", "csum", "rsqrt", "philox", "normal", "uniform", "adamw_"} <= used


# The window attention ops (contract §8) are not in the self-test: checked here against the CPU
# ops directly. (batch, G, T, D, W): W = 1, W < T, W = T, W > T, rows of more than 32 and of more
# than 64 valid terms (every lane and the tree; lanes with 3 terms, whose order shows), GQA groups
# of 1 to 3.
WINDOW_SHAPES = [(1, 1, 1, 4, 1), (1, 1, 6, 3, 1), (2, 1, 9, 8, 4), (2, 1, 5, 2, 5), (2, 2, 5, 3, 7),
                 (1, 3, 37, 6, 8), (1, 1, 40, 5, 33), (1, 2, 70, 16, 64), (1, 1, 100, 4, 80)]


def _window_inputs(rng, shape, kind):
    if kind == "adversarial":   # specials (±0, subnormals, FLT_MIN, huge), finite: inf * 0 aside
        return TK.adversarial(rng, shape, frac=0.15, nonfinite=False)
    if kind == "tiny":          # products in FTZ territory
        return TK.tiny(rng, shape)
    return rng.standard_normal(shape).astype(np.float32)


def _window_scores(rng, shape, kind):
    """Scores for window_softmax [BH, T, W]: with infinities and NaNs, and one row whose valid
    terms are all -inf (its max is -inf, its exponentials NaN) in the adversarial kind."""
    if kind == "adversarial":
        s = TK.adversarial(rng, shape, frac=0.15)
        s[0, -1, :] = -np.inf
        return s
    return (rng.standard_normal(shape) * (1e3 if kind == "tiny" else 3.0)).astype(np.float32)


@pytest.mark.parametrize("hw_flush", [False, True], ids=["gradual_underflow", "ftz_daz"])
@pytest.mark.parametrize("grid", ["default", "small"])
@pytest.mark.parametrize("kind", ["normal", "adversarial", "tiny"])
def test_window_ops_on_the_shim_give_the_cpu_bits(mps_on_shim, pyshim, monkeypatch, kind, grid, hw_flush):
    """band_scores, band_mix, band_mix_t, window_softmax and its backward through repops_mps on
    the shim equal the CPU ops bit for bit (NaNs equal, §7), including the invalid columns of
    the first W - 1 rows (+0.0). The small grid (3 groups) makes the grid-stride and row loops
    take several turns; ftz_daz runs the kernel threads with x86 FTZ|DAZ."""
    if grid == "small":
        monkeypatch.setattr(repops_mps, "MAX_GROUPS", 3)
    monkeypatch.setattr(torch.mps, "compile_shader", lambda source: ShimLibrary(pyshim, source, hw_flush),
                        raising=False)
    cpu, mps = torch.ops.repops, mps_on_shim
    for batch, G, Tn, D, W in WINDOW_SHAPES:
        rng = np.random.default_rng([batch, G, Tn, D, W, len(kind)])
        a, b = _window_inputs(rng, (batch, G * Tn, D), kind), _window_inputs(rng, (batch, Tn, D), kind)
        p = _window_inputs(rng, (batch, G * Tn, W), kind)
        s = _window_scores(rng, (batch * G, Tn, W), kind)
        gp = rng.standard_normal((batch * G, Tn, W)).astype(np.float32)
        what = f"{kind} batch={batch} G={G} T={Tn} D={D} W={W}"
        for name, args in [("band_scores", (a, b, W)), ("band_mix", (p, b)), ("band_mix_t", (p, a, Tn)),
                           ("window_softmax", (s, 0.125)), ("window_softmax", (s, 1.0 / math.sqrt(40.0)))]:
            args = [TK.T(x) if isinstance(x, np.ndarray) else x for x in args]
            TK.assert_bits(getattr(mps, name)(*args), TK.N(getattr(cpu, name)(*args)), f"{name} {what}")
        P = cpu.window_softmax(TK.T(s), 0.3)
        TK.assert_bits(mps.window_softmax_backward(TK.T(gp), P, 0.3),
                       TK.N(cpu.window_softmax_backward(TK.T(gp), P, 0.3)), f"window_softmax_backward {what}")


def test_window_ops_refuse_what_the_cpu_refuses(mps_on_shim):
    """The argument checks of binding_common.h, with the same messages."""
    z = torch.zeros
    bad = [("band_scores", (z(1, 6, 4), z(1, 3, 4), 0), "W >= 1"),
           ("band_scores", (z(1, 5, 4), z(1, 3, 4), 2), "keys \\[batch, T"),
           ("band_scores", (z(1, 6, 4), z(1, 3, 5), 2), "a \\[batch, M, D\\]"),
           ("band_mix", (z(6, 2), z(1, 3, 4)), "W >= 1"),
           ("band_mix_t", (z(1, 6, 2), z(1, 6, 4), 4), "p \\[batch, G\\*T, W\\]"),
           ("band_mix_t", (z(1, 6, 2), z(1, 5, 4), 3), "p \\[batch, G\\*T, W\\]"),
           ("window_softmax", (z(2, 3, 0), 1.0), "s \\[BH, T, W\\]"),
           ("window_softmax_backward", (z(2, 3, 4), z(2, 3, 5), 1.0), "shapes"),
           ("band_mix", (z(1, 6, 2, dtype=torch.float64), z(1, 3, 4)), "must be float32")]
    for name, args, message in bad:
        for ops in (torch.ops.repops, mps_on_shim):
            with pytest.raises(RuntimeError, match=message):
                getattr(ops, name)(*args)


# ------------------------------------------------------------------------------------------------
# 4. coverage and the rules a scan can check
# ------------------------------------------------------------------------------------------------
def _binding_op_names(macro):
    text = (ROOT / "kernels" / "common" / "binding_common.h").read_text()
    body = text.split(f"#define {macro}", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r'm\.(?:impl|def)\("(\w+?)(?:" #suffix|")', body))


# CUDA sources that hold no op family of their own: the numbered speed versions of matmul and
# clip_grad (docs/cuda-speed.md), CUDA-only ops (matmul_v, clip_grad_v) with version 1's bits.
CUDA_SPEED_VERSIONS = {"matmul_tiled", "flat_sum"}
# Op families with no Metal kernel: their options are refused on --device=mps with one line
# (config.validate; docs/metal.md): int8 P·V (int8_pv.cu: the step rule and the band mix) and the
# exact matmul (exact.cu, contract §11).
NOT_ON_METAL = {"int8_pv": {"int8_absmax_step", "int8_band_mix"}, "exact": set()}


def test_every_op_family_has_a_metal_source():
    cuda = {p.stem for d in ("kernels/cuda", "dev/cuda") for p in (ROOT / d).glob("*.cu")}   # verified or not
    assert CUDA_SPEED_VERSIONS <= cuda
    assert set(NOT_ON_METAL) <= cuda
    assert {p.stem for p in METAL_SOURCES} == cuda - CUDA_SPEED_VERSIONS - set(NOT_ON_METAL)


def test_every_op_has_an_mps_implementation():
    assert set(repops_mps.TENSOR_OPS) == _binding_op_names("RPB_IMPL_TENSOR_OPS") - set().union(*NOT_ON_METAL.values())
    tensorless = {schema.split("(")[0].removesuffix("_mps") for schema in repops_mps.TENSORLESS_OPS}
    assert tensorless == _binding_op_names("RPB_DEF_TENSORLESS_OPS")


# Metal's own reductions (unspecified order), its math library (not the canonical functions),
# fused operations and fast-math namespaces.
FORBIDDEN = re.compile(r"\b(simd_\w+|quad_\w+|fma|mad|fast|precise|exp2?|log2?|sqrt|rsqrt|sin|cos|tan|pow|powr|"
                       r"divide|fmin|fmax|abs|fabs|copysign|atomic_\w+)\s*(\(|::)")


@pytest.mark.parametrize("path", METAL_SOURCES + [METAL_DIR / "canonical.h"], ids=lambda p: p.name)
def test_metal_source_follows_the_contract(path):
    text = path.read_text()
    code = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("//"))
    first = next(l for l in code.splitlines() if l.strip())
    assert first == "#pragma METAL fp contract(off)", f"{path.name}: the pragma must come first, got {first!r}"
    found = FORBIDDEN.findall(re.sub(r"//.*", "", code))
    assert not found, f"{path.name} uses {sorted({f[0] for f in found})}"
    if path.suffix == ".metal":
        assert code.count('#include "canonical.h"') == 1 and code.count("#include") == 1


def test_every_source_compiles_alone_as_compile_shader_gets_it(pyshim, tmp_path):
    """Each family's text as repops_mps hands it to compile_shader (canonical.h inlined), through
    the shim; and every kernel it defines is one the shim can launch."""
    shutil.copy(SHIM_DIR / "metal_shim.h", tmp_path)   # precompiled once: each check then takes 0.2 s
    _run(["g++", *FLAGS, "-x", "c++-header", tmp_path / "metal_shim.h", "-o", tmp_path / "metal_shim.h.gch"],
         timeout=300)

    def check(path):
        source = repops_mps.metal_source(path.stem)
        r = run_process(["g++", *FLAGS, "-fsyntax-only", "-include", str(tmp_path / "metal_shim.h"),
                         "-x", "c++", "-"], input=source, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{path.name}:\n{r.stderr}"
        return [k for k in re.findall(r"kernel void (\w+)\(", source) if pyshim.rp_signature(k.encode()) is None]

    with ThreadPoolExecutor(2) as pool:
        missing = sum(pool.map(check, METAL_SOURCES), [])
    assert not missing, f"kernels the shim does not know: {missing}"
