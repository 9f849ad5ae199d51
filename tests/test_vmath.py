"""The SIMD canonical functions (kernels/cpu/vmath.h) equal the scalar ones (contract.h) bit for bit.

The kernels call the 8-lane forms (rp::vexp, ...); the contract (kernels/README.md §5) is
written as the scalar forms. tests/vmath_check.cpp runs both on float32 bit patterns and counts
lanes whose bits differ. This file builds it natively (-O2 -march=native: AVX2 or AVX-512VL
registers) and for AArch64 (NEON, run under qemu-user) and requires zero mismatches:

* every float32 of a wide range per function (contiguous bit patterns, including the
  special-case boundaries: exp's thresholds, subnormals and FLT_MIN, the sin/cos domain edge);
* every 61st bit pattern of all 2^32 (every exponent, both signs, NaNs and infinities);
* under qemu, every 2003rd bit pattern of all 2^32 (qemu runs about 100x slower).

REPOPS_VMATH_EXHAUSTIVE=1 checks all 2^32 inputs of every function natively instead
(about 25 s per function on one core).
"""
import os
import platform
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests", "vmath_check.cpp")
FLAGS = ["-std=c++17", "-ffp-contract=off", "-Wno-psabi", "-I", os.path.join(ROOT, "kernels", "cpu"),
         "-I", os.path.join(ROOT, "kernels", "common"), SRC]
FUNCTIONS = ["exp", "log", "recip", "rsqrt", "sqrt", "sin", "cos", "sigmoid"]


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
}


def _build(cxx, flags, out):
    cmd = [cxx, "-O2"] + flags + FLAGS + ["-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"building vmath_check failed: {' '.join(cmd)}\n{r.stderr}"
    return str(out)


def _check(runner, fn, lo, hi, stride):
    r = subprocess.run(runner + [fn, hex(lo), hex(hi), str(stride)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{fn} [{lo:#x}, {hi:#x}) stride {stride}: vector != scalar\n{r.stdout}{r.stderr}"
    assert "mismatches 0" in r.stdout


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
        pytest.skip("the AArch64 cross-check runs from an x86-64 machine")
    if not (ARM_CXX and QEMU_ARM):
        pytest.skip("no AArch64 cross compiler or qemu-user (Debian packages g++-aarch64-linux-gnu and qemu-user)")
    return [QEMU_ARM, _build(ARM_CXX, ["-static"], tmp_path_factory.mktemp("vmath_arm") / "vmath_check")]


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_vector_equals_scalar_on_aarch64(aarch64, fn):
    _check(aarch64, fn, 0, 2**32, 2003)


def test_check_catches_a_difference(tmp_path):
    """The checker must be able to fail: a vector exp off by one ulp in one lane is reported."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    src = open(SRC).read().replace("return rp::v##name(x);", "return rp::v##name(x) * 1.0000001f;")
    bad = tmp_path / "vmath_check_bad.cpp"
    bad.write_text(src)
    exe = str(tmp_path / "bad")
    subprocess.run(["g++", "-O2"] + FLAGS[:-1] + [str(bad), "-o", exe], check=True)
    r = subprocess.run([exe, "exp", hex(b(1.0)), hex(b(2.0)), "997"], capture_output=True, text=True)
    assert r.returncode == 1 and "mismatches 0" not in r.stdout
