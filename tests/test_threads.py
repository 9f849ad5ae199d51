"""Thread-count invariance, FTZ/DAZ in worker threads, and the FMA canary (contract §2-§4).

(a) Every raw kernel (torch.ops.repops.*, the int8 ones of contract §10 included) gives
    identical bits with 1, 2 and 3 intra-op threads (torch.set_num_threads), on inputs large enough to be split across threads, with
    magnitudes spread over many binades so that any change of summation order would show.
(b) FTZ/DAZ hold in PyTorch's worker threads while a kernel runs (a large mul whose every
    product is subnormal gives zeros, a large add of subnormals to zero gives zeros), and the
    caller's FP mode is restored afterwards: stock torch ops and NumPy in this process still
    produce subnormals, in the main thread and in the pool.
(c) The canary: torch.ops.repops.canary() is [0, 0]; and the canary can fail: the same
    expression compiled with g++ -O2 -ffp-contract=fast -mfma gives the fused value 2^-24
    (and 0 with -ffp-contract=off), so its inputs distinguish fused from unfused.
"""
import platform
import shutil

import numpy as np
import pytest
import torch

import repops  # noqa: F401  (tests/conftest.py builds and loads torch.ops.repops)
from tiny import run_process

OPS = torch.ops.repops
THREADS = (1, 2, 3)
SUB_MIN = float(np.array([1], dtype=np.uint32).view(np.float32)[0])   # 2^-149


@pytest.fixture
def restore_threads():
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def spread(shape, seed, lo=-8, hi=8):
    """Normal values times 2^k, k uniform in [lo, hi]: many binades, both signs."""
    g = _gen(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    k = torch.randint(lo, hi + 1, shape, generator=g).to(torch.float64)
    return (x * torch.exp2(k)).to(torch.float32).contiguous()


def positive(shape, seed, lo=-8, hi=8):
    return spread(shape, seed, lo, hi).abs().add_(2.0 ** lo).contiguous()


def as_bits(t):
    t = t.detach().contiguous()
    if t.dtype == torch.float32:
        return t.view(torch.int32).clone()
    return t.clone()


# name -> (make inputs, run(inputs) -> tuple of tensors).  Inputs are built once per test.
def _cases():
    c = {}
    n = 1_000_000

    def mm():
        a, b = spread((256, 256), 1), spread((256, 256), 2)
        a3, b3 = spread((4, 64, 128), 3), spread((4, 128, 96), 4)
        return a, b, a3, b3
    c["matmul"] = (mm, lambda a, b, a3, b3: (
        OPS.matmul(a, b), OPS.matmul(a.t(), b), OPS.matmul(a, b.t()),
        OPS.matmul(a3, b3), OPS.matmul(a3, b[:128, :96])))

    def rn():
        return spread((4096, 256), 5), positive((256,), 6, -2, 2), spread((4096, 256), 7)

    def rn_run(x, w, gy):
        y, rstd = OPS.rmsnorm(x, w, 1e-5)
        gx, gw = OPS.rmsnorm_backward(gy, x, w, rstd)
        return y, rstd, gx, gw
    c["rmsnorm"] = (rn, rn_run)

    def rp():
        return spread((2, 512, 8, 64), 8), spread((2, 8, 512, 64), 9)     # x [B, T, H, Dh], g [B, H, T, Dh]

    def rp_run(x, g):
        cos, sin = OPS.rope_tables(512, 64, 10000.0)
        return cos, sin, OPS.rope(x, cos, sin, False), OPS.rope(g, cos, sin, True)
    c["rope"] = (rp, rp_run)

    def sm():
        return spread((8, 256, 256), 10, -3, 3), spread((8, 256, 256), 11)

    def sm_run(s, gp):
        p = OPS.causal_softmax(s, 0.125)
        return p, OPS.causal_softmax_backward(gp, p, 0.125)
    c["causal_softmax"] = (sm, sm_run)

    def sw():
        return spread((4096, 512), 12, -4, 3), spread((4096, 256), 13)
    c["swiglu"] = (sw, lambda u, g: (OPS.swiglu(u), OPS.swiglu_backward(g, u)))

    def ce():
        z = spread((2048, 512), 14, -4, 3)
        t = torch.randint(0, 512, (2048,), generator=_gen(15))
        return z, t

    def ce_run(z, t):
        loss, lse = OPS.cross_entropy(z, t, 1e-4)
        gz = OPS.cross_entropy_backward(torch.tensor(1.0), z, t, lse, 1e-4)
        return loss, lse, gz
    c["cross_entropy"] = (ce, ce_run)

    def em():
        w = spread((1000, 128), 16)
        idx = torch.randint(0, 1000, (16384,), generator=_gen(17))   # many repeats per row
        return w, idx, spread((16384, 128), 18)
    c["embedding"] = (em, lambda w, idx, g: (OPS.embedding(w, idx), OPS.embedding_backward(g, idx, 1000)))

    def ew():
        return spread((n,), 19), spread((n,), 20)
    c["add_mul_scale"] = (ew, lambda a, b: (OPS.add(a, b), OPS.mul(a, b), OPS.scale(a, 0.3)))
    c["dropout"] = (lambda: (spread((n,), 21),), lambda x: (OPS.dropout(x, 0.1, 1234, 5, 6),))

    def ad():
        return spread((n,), 22), spread((n,), 23, -12, 0), spread((n,), 24, -12, 0), positive((n,), 25, -20, -8)

    def ad_run(p, g, m, v):
        p, m, v = p.clone(), m.clone(), v.clone()
        OPS.adamw_(p, g, m, v, 1e-3, 0.9, 0.95, 0.1, 0.05, 1e-8, 1 - 1e-4, 1 / (1 - 0.9 ** 3), 1 / (1 - 0.95 ** 3))
        return p, m, v
    c["adamw_"] = (ad, ad_run)
    c["clip_grad"] = (lambda: (spread((n,), 26),), lambda g: OPS.clip_grad(g, 1.0))
    c["csum"] = (lambda: (spread((64, 20_000), 27), spread((n,), 28)),
                 lambda a, b: (OPS.csum(a), OPS.csum(b)))

    def un():
        x = spread((n,), 29, -10, 6)
        return (x, x.abs(), spread((n,), 30, -10, 16).clamp(-65536, 65536))
    c["exp_log_recip_rsqrt_sqrt"] = (un, lambda x, xa, xs: (
        OPS.exp(x), OPS.log(xa), OPS.recip(x), OPS.rsqrt(xa), OPS.sqrt(xa)))
    c["sin_cos"] = (un, lambda x, xa, xs: (OPS.sin(xs), OPS.cos(xs)))
    c["random"] = (lambda: (), lambda: (
        OPS.philox(-5, 1, 2, 3, n, 7), OPS.uniform(9, 1, 2, 1, n), OPS.normal(9, 1, 2, 1, n)))
    c["canary"] = (lambda: (), lambda: (OPS.canary(),))

    def i8():
        # activations [M, K] with one step size, weights [N, K] with one per row (contract §10)
        x, w = spread((512, 1024), 31, -6, 2), spread((384, 1024), 32, -8, 0)
        return x, w, spread((512, 1024), 33), spread((384, 1024), 34)

    def i8_run(x, w, gx, gw):
        sx, sw = torch.zeros(1), torch.zeros(w.shape[0])
        OPS.lsq_init_(x, sx)
        OPS.lsq_init_(w, sw)
        qx, qw = OPS.int8_quantize(x, sx), OPS.int8_quantize(w, sw)
        return (sx, sw, qx, qw, OPS.int8_dequantize(qx, sx), OPS.int8_dequantize(qw, sw),
                OPS.int8_matmul(qx, qw), OPS.int8_linear(qx, qw, sx, sw),
                *OPS.lsq_backward(x, sx.expand(x.shape[0]).contiguous(), gx, 1.0),
                *OPS.lsq_backward(w, sw, gw, 0.01))
    c["int8"] = (i8, i8_run)
    return c


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_thread_count_invariance(name, restore_threads):
    make, run = CASES[name]
    inputs = make()
    results = {}
    for t in THREADS:
        torch.set_num_threads(t)
        assert torch.get_num_threads() == t
        out = run(*inputs)
        out = out if isinstance(out, (tuple, list)) else (out,)
        results[t] = [as_bits(o) for o in out]
    ref = results[THREADS[0]]
    for t in THREADS[1:]:
        assert len(results[t]) == len(ref)
        for i, (a, b) in enumerate(zip(ref, results[t])):
            assert a.shape == b.shape and a.dtype == b.dtype
            if not torch.equal(a, b):
                nbad = int((a != b).sum())
                pytest.fail(f"{name}: output {i} differs between 1 and {t} threads in {nbad} elements")


# ---------------------------------------------------------------------------------------- (b)

def _stock_makes_subnormals():
    """Stock torch (main thread and pool) and NumPy produce subnormals: FP mode not leaked."""
    a = torch.full((1_000_000,), 2.0 ** -70)
    b = torch.full((1_000_000,), 2.0 ** -70)
    prod = torch.mul(a, b)                                # 2^-140: subnormal
    assert torch.all(prod == 2.0 ** -140), "stock torch.mul flushed a subnormal product"
    s = torch.add(torch.full((1_000_000,), SUB_MIN), torch.zeros(1_000_000))
    assert torch.all(s == SUB_MIN), "stock torch.add flushed a subnormal input"
    small = torch.tensor([2.0 ** -70]) * torch.tensor([2.0 ** -70])
    assert small.item() == 2.0 ** -140
    assert np.float32(2.0 ** -70) * np.float32(2.0 ** -70) == np.float32(2.0 ** -140)


def test_ftz_daz_in_worker_threads(restore_threads):
    torch.set_num_threads(2)
    n = 2_000_000
    _stock_makes_subnormals()
    g = _gen(40)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    a = (sign * (1 + torch.rand(n, generator=g)) * 2.0 ** -70).contiguous()
    b = ((1 + torch.rand(n, generator=g)) * 2.0 ** -70).contiguous()
    # without FTZ every product is a nonzero subnormal
    assert torch.all((a * b) != 0) and torch.all((a * b).abs() < 2.0 ** -126)
    for _ in range(3):
        p = OPS.mul(a, b)
        bits = p.view(torch.int32)
        assert torch.all(p == 0), f"{int((p != 0).sum())} subnormal products were not flushed"
        # FTZ keeps the sign: -0 where the product is negative
        assert torch.equal(bits, torch.where(sign < 0, torch.tensor(-2 ** 31, dtype=torch.int32),
                                             torch.tensor(0, dtype=torch.int32)))
    # DAZ: subnormal inputs read as zero
    sub = torch.randint(1, 1 << 23, (n,), generator=g, dtype=torch.int32).view(torch.float32)
    assert torch.all(sub != 0) and torch.all(sub.abs() < 2.0 ** -126)
    s = OPS.add(sub, torch.zeros(n))
    assert torch.all(s.view(torch.int32) == 0), f"{int((s != 0).sum())} subnormal inputs were not read as 0"
    s2 = OPS.scale(sub, 1.0)
    assert torch.all(s2 == 0)
    # and the FP mode of this process is unchanged afterwards (main thread and pool)
    _stock_makes_subnormals()
    torch.set_num_threads(1)
    _stock_makes_subnormals()


# ---------------------------------------------------------------------------------------- (c)

def test_canary_is_clean():
    c = OPS.canary()
    assert c.dtype == torch.float32 and tuple(c.shape) == (2,)
    assert c.tolist() == [0.0, 0.0], f"canary {c.tolist()}: [a*b+c fused?, subnormal in a worker?]"


CANARY_CPP = r"""
#include <cstdio>
int main() {
  volatile float va = 1.0f + 0x1p-12f, vc = -(1.0f + 0x1p-11f);  // contract §2 canary inputs
  float a = va, b = va, c = vc;
  float r = a * b + c;
  std::printf("%a\n", (double)r);
  return 0;
}
"""


def _fma_flags():
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        try:
            with open("/proc/cpuinfo") as f:
                flags = next((l for l in f if l.startswith("flags")), "").split()
        except OSError:
            flags = []
        if "fma" not in flags:
            pytest.skip("hardware: this x86-64 CPU has no FMA instruction: a fused build cannot be made here")
        return ["-mfma"]
    if machine in ("aarch64", "arm64"):
        return []                   # FMA is part of the base AArch64 ISA
    pytest.skip(f"hardware: no known FMA flag for {machine}")


def test_canary_can_fail(tmp_path):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ not found: cannot build a fused probe")
    flags = _fma_flags()
    src = tmp_path / "probe.cpp"
    src.write_text(CANARY_CPP)
    results = {}
    for contract in ("fast", "off"):
        exe = tmp_path / f"probe_{contract}"
        run_process([cxx, "-O2", f"-ffp-contract={contract}", *flags, str(src), "-o", str(exe)],
                    check=True, capture_output=True, timeout=120)
        out = run_process([str(exe)], check=True, capture_output=True, text=True, timeout=30).stdout
        results[contract] = float.fromhex(out.strip())
    assert results["fast"] == 2.0 ** -24, f"-ffp-contract=fast gave {results['fast']!r}, not the fused 2^-24"
    assert results["off"] == 0.0, f"-ffp-contract=off gave {results['off']!r}"
