"""The SIMD canonical functions (kernels/cpu/vmath.h) equal the scalar ones (contract.h) bit for bit.

The kernels call the 8-lane forms (rp::vexp, ...); the contract (kernels/README.md §5) is
written as the scalar forms. tests/vmath_check.cpp runs both on float32 bit patterns and counts
lanes whose bits differ. This file builds it natively (-O2 -march=native: AVX2 or AVX-512VL
registers) and for AArch64 (NEON, run under qemu-user) and requires zero mismatches:

* every float32 of a wide range per function (contiguous bit patterns, including the
  special-case boundaries: exp's thresholds, subnormals and FLT_MIN, the sin/cos domain edge);
* every 61st bit pattern of all 2^32 (every exponent, both signs, NaNs and infinities);
* under qemu, every 2003rd bit pattern of all 2^32 (qemu runs about 100x slower), and the
  digest of the results equals the native build's (the same bits on another instruction set).

Contract §3's product rule (tininess after rounding) is checked by vmath_check's "mul" mode:
rp::mul, scalar and vector, against the contract's product computed in double, on products
within a few ulps of 2^-126 (the AArch64 window and the double-rounding band below it), on
x86, under qemu for AArch64 (FPCR.FZ plus the software fix-up) and riscv64 (no hardware flush:
the software flush), and natively in the software-flush build (-DRP_SOFT_FLUSH). The
cross-builds skip only when the cross compiler or qemu-user is missing.

REPOPS_VMATH_EXHAUSTIVE=1 checks all 2^32 inputs of every function natively instead
(about 25 s per function on one core).
"""
import os
import platform
import shutil

import pytest

from tiny import run_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests", "vmath_check.cpp")
FLAGS = ["-std=c++17", "-ffp-contract=off", "-Wno-psabi", "-I", os.path.join(ROOT, "kernels", "cpu"),
         "-I", os.path.join(ROOT, "kernels", "common"), SRC]
FUNCTIONS = ["exp", "log", "recip", "rsqrt", "sqrt", "sin", "cos", "sigmoid", "tanh", "erf", "gelu", "gelu_tanh",
             "gelu_grad", "gelu_tanh_grad"]


def b(x):  # a float32's bit pattern
    import numpy as np
    return int(np.float32(x).view(np.uint32))


SIGN = 0x80000000
# [lo, hi) bit-pattern ranges checked exhaustively, per function (each about 10^8 inputs at most)
RANGES = {
    "exp": [(b(1.0), b(128.0)), (SIGN + b(1.0), SIGN + b(128.0)), (0, b(2.0**-100))],
    "log": [(0, b(2.0**-123)), (b(0.25), b(4.0)), (b(2.0**125), 0x7F800001)],
    "recip": [(0, b(2.0**-124)), (b(1.0), b(4.0)), (SIGN + b(0.5), SIGN + b(2.0)), (b(2.0**125), 0x7F800001)],
    "rsqrt": [(0, b(2.0**-124)), (b(1.0), b(16.0)), (b(2.0**125), 0x7F800001)],
    "sqrt": [(0, b(2.0**-124)), (b(1.0), b(16.0)), (SIGN, SIGN + b(2.0**-124))],
    "sin": [(b(2.0**-3), b(2.0**17)), (SIGN + b(32768.0), SIGN + b(2.0**17))],
    "cos": [(b(2.0**-3), b(2.0**17)), (SIGN + b(32768.0), SIGN + b(2.0**17))],
    "sigmoid": [(b(0.5), b(128.0)), (SIGN + b(0.5), SIGN + b(128.0))],
    # tanh and erf: every branch (the polynomial, the exp form, saturation) and the tiny inputs
    "tanh": [(b(0.5), b(16.0)), (SIGN + b(0.5), SIGN + b(2.0)), (0, b(2.0**-100))],
    "erf": [(b(0.5), b(8.0)), (SIGN + b(0.5), SIGN + b(4.0)), (0, b(2.0**-100))],
    # the GELU forms: both signs through erf's and tanh's branches and the saturation of both
    "gelu": [(b(0.5), b(8.0)), (SIGN + b(0.5), SIGN + b(8.0))],
    "gelu_tanh": [(b(0.5), b(8.0)), (SIGN + b(0.5), SIGN + b(8.0))],
    "gelu_grad": [(b(0.5), b(8.0)), (SIGN + b(0.5), SIGN + b(8.0))],
    "gelu_tanh_grad": [(b(0.5), b(8.0)), (SIGN + b(0.5), SIGN + b(8.0))],
}


def _build(cxx, flags, out):
    cmd = [cxx, "-O2"] + flags + FLAGS + ["-o", str(out)]
    r = run_process(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"building vmath_check failed: {' '.join(cmd)}\n{r.stderr}"
    return str(out)


def _check(runner, fn, lo, hi, stride):
    """Runs one check; returns its output line (which ends with the digest of the results)."""
    r = run_process(runner + [fn, hex(lo), hex(hi), str(stride)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{fn} [{lo:#x}, {hi:#x}) stride {stride}: vector != scalar\n{r.stdout}{r.stderr}"
    assert "mismatches 0" in r.stdout
    return r.stdout.strip()


def _fields(line):
    """'checked N mismatches M ... digest D' -> {'checked': 'N', ...}"""
    words = line.split()
    return dict(zip(words[::2], words[1::2]))


# rp::mul near 2^-126 (vmath_check "mul": b = the 5 floats nearest 2^-126 / a, both signs):
# every float32 a at a stride, and every a of [2^-70, 2^-56) of both signs, whose partners b
# are normal, so each product lies within a few ulps of 2^-126.
MUL_RANGES = [(b(2.0**-70), b(2.0**-56)), (SIGN + b(2.0**-70), SIGN + b(2.0**-56))]


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    return [_build("g++", ["-march=native"], tmp_path_factory.mktemp("vmath") / "vmath_check")]


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_vector_equals_scalar_on_wide_ranges(native, fn):
    if os.environ.get("REPOPS_VMATH_EXHAUSTIVE") == "1":
        _check(native, fn, 0, 2**32, 1)
        return
    for lo, hi in RANGES[fn]:
        _check(native, fn, lo, hi, 1)
    _check(native, fn, 0, 2**32, 61)


ARM_CXX, QEMU_ARM = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")


@pytest.fixture(scope="module")
def aarch64(tmp_path_factory):
    if platform.machine() != "x86_64":
        pytest.skip("hardware: the AArch64 cross-check runs from an x86-64 machine")
    if not (ARM_CXX and QEMU_ARM):
        pytest.skip("no AArch64 cross compiler or qemu-user (Debian packages g++-aarch64-linux-gnu and qemu-user)")
    return [QEMU_ARM, _build(ARM_CXX, ["-static"], tmp_path_factory.mktemp("vmath_arm") / "vmath_check")]


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_vector_equals_scalar_on_aarch64(aarch64, native, fn):
    """Vector == scalar on NEON, and the results' digest equals x86's (the same bits)."""
    line = _check(aarch64, fn, 0, 2**32, 2003)
    assert _fields(line)["digest"] == _fields(_check(native, fn, 0, 2**32, 2003))["digest"], line


def _check_mul(runner, stride, stride_all, window_must_differ):
    """rp::mul (scalar and vector) equals the contract's product computed in double on MUL_RANGES
    (every stride-th a) and on all 2^32 (every stride_all-th); products land in the AArch64
    window and in the double-rounding band below it. window_must_differ: the plain hardware
    product must be wrong at least there (so the check demonstrably exercises the fix-up).
    Returns the fields of each run (their digests must equal x86's)."""
    runs = [_fields(_check(runner, "mul", lo, hi, stride)) for lo, hi in MUL_RANGES]
    runs.append(_fields(_check(runner, "mul", 0, 2**32, stride_all)))
    for f in runs:
        assert int(f["window"]) > 1000 and int(f["band"]) > 1000, f
        if window_must_differ:
            assert int(f["hardware-differs"]) >= int(f["window"]), f
    return runs


def _digests(runs):
    return [f["digest"] for f in runs]


def test_mul_matches_contract_natively(native):
    """On x86 the plain hardware product is the contract's: it never differs from the reference."""
    assert all(f["hardware-differs"] == "0" for f in _check_mul(native, 1, 61, False))


def test_mul_window_on_aarch64(aarch64, native):
    """Contract §3 on AArch64: products whose exact value lies in [2^-126 (1 - 2^-25), 2^-126) give
    x86's bits (FPCR.FZ alone flushes them: hardware-differs counts them), scalar and NEON."""
    arm = _check_mul(aarch64, 101, 2003, True)
    assert all(f["hardware-differs"] == f["window"] for f in arm)  # the window, and only it
    assert _digests(arm) == _digests(_check_mul(native, 101, 2003, False))


# the software-flush build (-DRP_SOFT_FLUSH: FTZ/DAZ off in hardware, flushing in rp::add/sub/mul)
@pytest.fixture(scope="module")
def soft(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    return [_build("g++", ["-march=native", "-DRP_SOFT_FLUSH"], tmp_path_factory.mktemp("vmath_soft") / "vmath_check")]


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_soft_flush_build_matches_native(soft, native, fn):
    for lo, hi in RANGES[fn][:1]:
        assert _fields(_check(soft, fn, lo, hi, 7))["digest"] == _fields(_check(native, fn, lo, hi, 7))["digest"]
    assert _fields(_check(soft, fn, 0, 2**32, 61))["digest"] == _fields(_check(native, fn, 0, 2**32, 61))["digest"]


def test_soft_flush_mul(soft, native):
    """Every 7th a of MUL_RANGES (the software flush costs ~10x per product; the native build
    is checked at every a by test_mul_matches_contract_natively)."""
    assert _digests(_check_mul(soft, 7, 61, True)) == _digests(_check_mul(native, 7, 61, False))


RISCV_CXX, QEMU_RISCV = shutil.which("riscv64-linux-gnu-g++"), shutil.which("qemu-riscv64")
RISCV_SYSROOT = "/usr/riscv64-linux-gnu"


@pytest.fixture(scope="module")
def riscv64(tmp_path_factory):
    if platform.machine() != "x86_64":
        pytest.skip("hardware: the riscv64 cross-check runs from an x86-64 machine")
    if not (RISCV_CXX and QEMU_RISCV):
        pytest.skip("no riscv64 cross compiler or qemu-user (Debian packages g++-riscv64-linux-gnu and qemu-user)")
    return [QEMU_RISCV, "-L", RISCV_SYSROOT, _build(RISCV_CXX, [], tmp_path_factory.mktemp("vmath_rv") / "vmath_check")]


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_riscv64_matches_native(riscv64, native, fn):
    """riscv64 has no flush-to-zero mode: the software flush gives x86's bits."""
    line = _check(riscv64, fn, 0, 2**32, 2003)
    assert _fields(line)["digest"] == _fields(_check(native, fn, 0, 2**32, 2003))["digest"], line


def test_mul_window_on_riscv64(riscv64, native):
    assert _digests(_check_mul(riscv64, 101, 2003, True)) == _digests(_check_mul(native, 101, 2003, False))


# The canonical sum and max on vectors (vmath.h vcsum_array / vcmax_array) against the scalar
# csum / cmax (contract.h): every length 0..100 of windows of bit patterns, all 2^32 at a stride
# (every exponent, NaN, inf) and [2^-127, 2^-124) with every third value negated (flushed sums),
# plus the window whose partial sums are all -0.0 (vmath_check.cpp "csum"). Natively, in the
# software-flush build, on AArch64 (4 lanes: 8 vectors of partials) and riscv64: vector == scalar
# in every build, and the sums' digest equals x86's. The max's digest is not compared across
# builds: a maximum of subnormal terms only is the DAZ-read zero on x86 (maxss) and the raw
# subnormal elsewhere (kernels/README.md §4.2; every kernel reads that result through DAZ).
REDUCE_RANGES = [(0, 2**32, 4099), (b(2.0**-127), b(2.0**-124), 97)]
REDUCE_SLOW = [(0, 2**32, 400009), (b(2.0**-127), b(2.0**-124), 4999)]   # under qemu


def _reduce_digests(runner, ranges):
    """Runs csum and cmax on every range (each asserts vector == scalar); the sums' digests."""
    for lo, hi, stride in ranges:
        _check(runner, "cmax", lo, hi, stride)
    return [_fields(_check(runner, "csum", lo, hi, stride))["digest"] for lo, hi, stride in ranges]


def test_reductions_vector_equals_scalar(native, soft):
    assert _reduce_digests(native, REDUCE_RANGES) == _reduce_digests(soft, REDUCE_RANGES)


def test_reductions_on_aarch64(aarch64, native):
    assert _reduce_digests(aarch64, REDUCE_SLOW) == _reduce_digests(native, REDUCE_SLOW)


def test_reductions_on_riscv64(riscv64, native):
    assert _reduce_digests(riscv64, REDUCE_SLOW) == _reduce_digests(native, REDUCE_SLOW)


def test_check_catches_a_padded_tail(tmp_path):
    """The reduction check must be able to fail: a tail padded with +0.0 instead of masked turns
    the -0.0 window's sum into +0.0, and a padded max is wrong on negative rows."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    masked = "p[u] = sel(lane < (int32_t)m, op(p[u], term(i + u * VL, m)), p[u]);"
    src = open(os.path.join(ROOT, "kernels", "cpu", "vmath.h")).read()
    assert masked in src
    (tmp_path / "vmath.h").write_text(src.replace(masked, "p[u] = op(p[u], term(i + u * VL, m));"))
    exe = str(tmp_path / "bad")
    run_process(["g++", "-O2", "-I", str(tmp_path)] + FLAGS[:-1] + [SRC, "-o", exe], check=True)
    for fn in ("csum", "cmax"):
        r = run_process([exe, fn, "0", hex(2**32), "4099"], capture_output=True, text=True)
        assert r.returncode == 1 and "mismatches 0" not in r.stdout, (fn, r.stdout)


def test_check_catches_a_difference(tmp_path):
    """The checker must be able to fail: a vector exp off by one ulp in one lane is reported."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    src = open(SRC).read().replace("return rp::v##name(x);", "return rp::v##name(x) * 1.0000001f;")
    bad = tmp_path / "vmath_check_bad.cpp"
    bad.write_text(src)
    exe = str(tmp_path / "bad")
    run_process(["g++", "-O2"] + FLAGS[:-1] + [str(bad), "-o", exe], check=True)
    r = run_process([exe, "exp", hex(b(1.0)), hex(b(2.0)), "997"], capture_output=True, text=True)
    assert r.returncode == 1 and "mismatches 0" not in r.stdout
