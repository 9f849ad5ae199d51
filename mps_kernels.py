"""Compiling and launching the Metal kernels of kernels/metal/ for repops_mps.py, and the
argument checks its ops share (those of kernels/common/binding_common.h, in Python).

    import mps_kernels as mk
    mk.launch("elementwise", "rp_add", a, b, y, n, threads=mk.flat(n), group=mk.GROUP)

Launch convention (torch.mps.compile_shader): lib.<kernel>(tensors and scalars in the kernel's
argument order, threads=[total, 1, 1], group_size=[G, 1, 1]); a Python int arrives as a Metal
`constant long&`, a float as `constant float&` (every float scalar here is already float32, so
nothing is rounded on the way). Grids are always whole groups; the kernels loop (grid-stride or
over rows by group), so the grid's size never decides a bit. Each .metal source is compiled once
per process, with canonical.h pasted in place of its #include (compile_shader has no include
path). tests/test_metal_emulated.py sets DEVICE_TYPE to "cpu" and replaces compile_shader with
the CPU shim of tests/metal_shim/.
"""
import os

import numpy as np
import torch

METAL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "metal")
GROUP = 256            # threads per group of the elementwise and matmul kernels
LANES = 32             # threads per group of the row kernels (the contract's 32 lanes, §4.2)
MAX_GROUPS = 1 << 16   # grids stop growing here; the kernels' loops take the rest
FLAT_CHUNK = 32768     # the chunked sum's chunk length L (contract §4.5; kFlatChunk in optim.metal)
DEVICE_TYPE = "mps"   # where the kernels run (tests/test_metal_emulated.py runs them on the CPU shim)
RPFN = {"exp": 0, "log": 1, "recip": 2, "rsqrt": 3, "sqrt": 4, "sin": 5, "cos": 6}   # RpFn, ids.h


def metal_source(family):
    """The text compile_shader gets for kernels/metal/<family>.metal: canonical.h inlined."""
    with open(os.path.join(METAL_DIR, "canonical.h")) as f:
        header = f.read()
    with open(os.path.join(METAL_DIR, family + ".metal")) as f:
        text = f.read()
    include = '#include "canonical.h"'
    if text.count(include) != 1:
        raise RuntimeError(f"kernels/metal/{family}.metal must include canonical.h exactly once")
    return text.replace(include, header.replace("#pragma once\n", ""))   # the pasted header is the main file


_libs = {}


def _lib(family):
    if family not in _libs:
        _libs[family] = torch.mps.compile_shader(metal_source(family))
    return _libs[family]


def launch(family, kernel, *args, threads, group):
    getattr(_lib(family), kernel)(*args, threads=[threads, 1, 1], group_size=[group, 1, 1])


def flat(n):
    """Threads for a grid-stride loop over n items (whole groups)."""
    return min(max((n + GROUP - 1) // GROUP, 1), MAX_GROUPS) * GROUP


def rows(n):
    """Threads for n rows, one group of 32 per row (groups loop past MAX_GROUPS)."""
    return min(max(n, 1), MAX_GROUPS) * LANES


# ------------------------------------------------------------------ the compiler's settings
# What the shim cannot see (docs/metal.md), checked on a Mac by .ci/mac's "fast math off" line and
# tests/test_mps.py: compile_shader must compile with fast math off. canonical.h's product flush
# computes da * (db * 2^24) as written, and NaN tests x != x; fast math may reassociate the first
# (to (da * db) * 2^24, whose da * db is already flushed) and fold the second to false. The probe
# reads its inputs from buffers, so nothing is folded at compile time. out: [1 if the compiler
# defines __FAST_MATH__, (x != x) for x = NaN, the bits of a * (b * 2^24) for a = 2^-100 and
# b = 2^-40 (2^-116 as written, 0 reassociated), the bits of (float) of the int32 2^24 + 3 (2^24 + 4
# rounding to nearest even, 2^24 + 2 toward zero: reported only, no kernel converts an int whose
# float rounds, canonical.h i32_to_float)].
COMPILER_PROBE = """#pragma METAL fp contract(off)
#if defined(__METAL_VERSION__)
#include <metal_stdlib>
using namespace metal;
#endif
kernel void rp_compiler_probe(device const float* x, device const int* n, device uint* out,
                              uint tid [[thread_position_in_grid]]) {
  if (tid != 0) return;
#if defined(__FAST_MATH__)
  out[0] = 1u;
#else
  out[0] = 0u;
#endif
  const float nan_value = x[0];
  out[1] = (nan_value != nan_value) ? 1u : 0u;
  out[2] = as_type<uint>(x[1] * (x[2] * 16777216.0f));
  out[3] = as_type<uint>((float)n[0]);
}
"""
PROBE_INPUTS = ([float("nan"), 2.0 ** -100, 2.0 ** -40], [2 ** 24 + 3])
PROBE_FAST_MATH_OFF = [0, 1, 0x05800000, None]        # 0x05800000 = 2^-116; the last is reported only


def compiler_probe():
    """The probe's four words (COMPILER_PROBE) as torch.mps.compile_shader compiles it here."""
    x = torch.tensor(PROBE_INPUTS[0], dtype=torch.float32, device=DEVICE_TYPE)
    n = torch.tensor(PROBE_INPUTS[1], dtype=torch.int32, device=DEVICE_TYPE)
    out = torch.zeros(4, dtype=torch.int32, device=DEVICE_TYPE)
    torch.mps.compile_shader(COMPILER_PROBE).rp_compiler_probe(x, n, out, threads=[1, 1, 1], group_size=[1, 1, 1])
    return [v & 0xFFFFFFFF for v in out.cpu().tolist()]


def check_fast_math_off(words=None):
    """One line saying how compile_shader compiles (the probe's words, default: run it now);
    RuntimeError if fast math is on in any way the kernels would notice."""
    fast, nan_ne, product, to_float = compiler_probe() if words is None else words
    bad = [what for what, wrong in (("__FAST_MATH__ is defined", fast != 0),
                                    ("x != x is false for a NaN", nan_ne != 1),
                                    (f"a * (b * 2^24) gave 0x{product:08x}, not 2^-116 (reassociated)",
                                     product != PROBE_FAST_MATH_OFF[2])) if wrong]
    if bad:
        raise RuntimeError("torch.mps.compile_shader compiles with fast math on (" + "; ".join(bad)
                           + "): the Metal kernels cannot give the contract's bits")
    mode = {0x4B800001: "toward zero", 0x4B800002: "to nearest even"}.get(to_float, f"0x{to_float:08x}")
    return (f"compile_shader: fast math off (no __FAST_MATH__, NaN != NaN, no reassociation); "
            f"(float) of an int rounds {mode}")


# ------------------------------------------------------------------ argument checks
def need(cond, msg):
    if not cond:
        raise RuntimeError(msg)


def check_f32(t, name, device=None):
    need(t.device.type == DEVICE_TYPE, f"repops: {name} must be a {DEVICE_TYPE} tensor")
    need(t.dtype == torch.float32, f"repops: {name} must be float32, got {t.dtype}")
    need(device is None or t.device == device, f"repops: {name} is on {t.device}, the other operands on {device}")
    return t.contiguous()


def check_i64(t, name, device):
    need(t.device == device and t.dtype == torch.int64, f"repops: {name} must be an int64 tensor on {device}")
    return t.contiguous()


def check_i8(t, name, device=None):
    need(t.device.type == DEVICE_TYPE and t.dtype == torch.int8, f"repops: {name} must be a {DEVICE_TYPE} int8 tensor")
    need(device is None or t.device == device, f"repops: {name} is on {t.device}, the other operands on {device}")
    return t.contiguous()


def band_shape(rows, keys, W, op):
    """(batch, M, T, D, W) of a window op, as binding_common.h's band_shape: rows [batch, G*T, *],
    keys [batch, T, D], W >= 1."""
    need(rows.dim() == 3 and keys.dim() == 3 and rows.shape[0] == keys.shape[0] and keys.shape[1] >= 1
         and rows.shape[1] % keys.shape[1] == 0 and W >= 1,
         f"repops.{op}: rows [batch, G*T, *], keys [batch, T, *], W >= 1")
    return rows.shape[0], rows.shape[1], keys.shape[1], keys.shape[2], W


def f32r(x):
    return float(np.float32(x))   # one rounding of a float64 to float32 (contract §1)


def inv(n):
    return f32r(1.0 / n) if n else float("inf")   # (float)(1.0 / n), as the bindings' shape scalars


def check_range(idx, hi, what):
    """Every index in [0, hi): an integer test on the device (no float arithmetic); on failure
    the CPU op names the first bad index, with the CPU binding's message."""
    if idx.numel() and bool(((idx < 0) | (idx >= hi)).any()):
        torch.ops.repops.check_index(idx.cpu(), hi, what)
