"""Sliding-window attention, QK-norm and the embedding norm (contract §8 window attention).

    python -m pytest tests/test_window.py -q

1. Each window kernel (band_scores, band_mix, band_mix_t, window_softmax and its backward)
   equals the NumPy reference bit for bit, on plain and adversarial inputs (specials, FTZ
   territory), windows narrower and wider than the sequence, GQA groups of 1 and 3.
2. repops.window_attention with W = T gives the bits of the full causal path (matmul,
   causal_softmax, matmul), forward and every gradient: skipping the masked terms is exact;
   with exact=True (contract §11 band products) likewise against exact full attention.
3. Accuracy against stock PyTorch (float64 attention with the window mask), with tolerances,
   fp32 and exact.
4. Memory is O(T * W): no tensor autograd saves for a window layer has T x T elements, fp32 and
   exact.
5. The model's options: which layers are windowed, qk_norm is gain-free RMSNorm before RoPE
   (rmsnorm with w = 1), emb_norm adds one weight, and the defaults leave the model unchanged.
"""
import math

import numpy as np
import pytest
import torch

import reference as R
import repops
import test_kernels as TK
from model import Llama, ModelConfig, windowed

assert_bits, T, N = TK.assert_bits, TK.T, TK.N
ops = torch.ops.repops


def _inputs(rng, shape, kind):
    if kind == "adv":
        return TK.adversarial(rng, shape, frac=0.1, nonfinite=False)
    if kind == "tiny":
        return TK.tiny(rng, shape)
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("batch,G,Tn,D,W", [(1, 1, 1, 4, 1), (2, 1, 9, 8, 4), (1, 3, 37, 6, 8),
                                            (2, 2, 5, 3, 7), (1, 1, 40, 5, 33)])
@pytest.mark.parametrize("kind", ["normal", "adv", "tiny"])
def test_band_kernels_bits(batch, G, Tn, D, W, kind):
    rng = np.random.default_rng(batch * 7919 + G * 131 + Tn * 17 + W)
    a = _inputs(rng, (batch, G * Tn, D), kind)
    b = _inputs(rng, (batch, Tn, D), kind)
    p = _inputs(rng, (batch, G * Tn, W), kind)
    assert_bits(ops.band_scores(T(a), T(b), W), R.band_scores(a, b, W), f"band_scores {kind}")
    assert_bits(ops.band_mix(T(p), T(b)), R.band_mix(p, b), f"band_mix {kind}")
    assert_bits(ops.band_mix_t(T(p), T(a), Tn), R.band_mix_t(p, a, Tn), f"band_mix_t {kind}")


@pytest.mark.parametrize("BH,Tn,W", [(1, 1, 1), (2, 7, 3), (3, 40, 33), (1, 70, 64), (2, 5, 9)])
@pytest.mark.parametrize("kind", ["normal", "adv", "large"])
def test_window_softmax_bits(BH, Tn, W, kind):
    rng = np.random.default_rng(BH * 100 + Tn + W)
    shape = (BH, Tn, W)
    s = (rng.standard_normal(shape) * (1e3 if kind == "large" else 3)).astype(np.float32)
    if kind == "adv":
        s = TK.adversarial(rng, shape, frac=0.15)
    gp = rng.standard_normal(shape).astype(np.float32)
    for scale in (0.125, 1.0 / math.sqrt(40.0)):
        P = ops.window_softmax(T(s), scale)
        eP = R.window_softmax(s, scale)
        assert_bits(P, eP, f"window_softmax {kind}")
        assert_bits(ops.window_softmax_backward(T(gp), T(eP), scale), R.window_softmax_backward(gp, eP, scale),
                    f"window_softmax_backward {kind}")


def test_window_softmax_full_width_is_causal_softmax():
    """A window as wide as the sequence is causal attention: the same terms in the same lanes."""
    rng = np.random.default_rng(3)
    s = (rng.standard_normal((2, 45, 45)) * 4).astype(np.float32)
    full = R.causal_softmax(s, 0.25)
    # band column w of row t is key t - (T-1) + w: shift each row's causal prefix to the right
    band = np.stack([np.roll(s[:, t], 44 - t, axis=-1) for t in range(45)], axis=1)
    got = N(ops.window_softmax(T(band), 0.25))
    for t in range(45):
        assert_bits(got[:, t, 44 - t:], full[:, t, :t + 1], f"row {t}")


def _full_attention(q, k, v, scale, G, exact=False):
    Tn = k.shape[1]
    s = repops.matmul(q, k.transpose(1, 2), exact).view(-1, Tn, Tn)
    p = repops.causal_softmax(s, scale)
    return repops.matmul(p.view(q.shape[0], G * Tn, Tn), v, exact)


def _grads(fn, *xs):
    xs = [x.clone().requires_grad_(True) for x in xs]
    out = fn(*xs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    out.backward(g)
    return out.detach(), [x.grad for x in xs]


# exact: the §11 band products against exact full attention (no exception there: integer sums
# have no signed zero); T = 100 spans two of the CPU kernel's row blocks.
@pytest.mark.parametrize("G,Tn,exact", [(1, 24, False), (2, 24, False), (1, 24, True), (2, 24, True), (1, 100, True)])
def test_full_width_window_is_full_attention(G, Tn, exact):
    gen = torch.Generator().manual_seed(G + (Tn if exact else 0))
    Dh = 8
    q, k, v = (torch.randn(3, n * Tn, Dh, generator=gen) for n in (G, 1, 1))
    scale = 1.0 / math.sqrt(Dh)
    o1, g1 = _grads(lambda q, k, v: repops.window_attention(q, k, v, Tn, scale, exact=exact), q, k, v)
    o2, g2 = _grads(lambda q, k, v: _full_attention(q, k, v, scale, G, exact), q, k, v)
    assert_bits(o1, N(o2), "output")
    for name, a, b in zip("qkv", g1, g2):
        assert_bits(a, N(b), f"grad {name}")


@pytest.mark.parametrize("exact,Tn", [(False, 33), (True, 90)])
def test_window_attention_vs_torch(exact, Tn):
    gen = torch.Generator().manual_seed(11)
    G, Dh, W = 2, 16, 8
    q, k, v = (torch.randn(2, n * Tn, Dh, generator=gen) for n in (G, 1, 1))
    scale = 1.0 / math.sqrt(Dh)
    o1, g1 = _grads(lambda q, k, v: repops.window_attention(q, k, v, W, scale, exact=exact), q, k, v)

    def torch_ref(q, k, v):
        t = torch.arange(Tn)
        keep = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - W)
        s = (q.double() @ k.double().transpose(1, 2)).view(2, G, Tn, Tn) * scale
        p = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1).view(2, G * Tn, Tn)
        return (p @ v.double()).float()
    o2, g2 = _grads(torch_ref, q, k, v)
    torch.testing.assert_close(o1, o2, rtol=1e-5, atol=1e-6)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("exact", [False, True])
def test_window_memory_is_t_times_w(exact):
    """Every tensor a window layer keeps for backward has O(T * W) elements, never T x T."""
    Tn, W = 256, 16
    q, k, v = (torch.randn(1, Tn, 8, requires_grad=True) for _ in range(3))
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
        repops.window_attention(q, k, v, W, 0.3, exact=exact).sum().backward()
    assert sizes and max(sizes) <= Tn * max(W, 8), sizes


def _model(**kw):
    return Llama(ModelConfig(n_layer=5, n_head=4, n_kv_head=2, d_model=32, d_hidden=64, seq_len=16, **kw), seed=3)


def test_which_layers_are_windowed():
    cfg = _model(attn_window=4, full_attn_every=2).cfg
    assert [windowed(cfg, i) for i in range(5)] == [True, False, True, False, False]   # 2nd, 4th, last full
    assert [windowed(_model(attn_window=4).cfg, i) for i in range(5)] == [True] * 4 + [False]
    assert not any(windowed(_model().cfg, i) for i in range(5))


def test_options_change_the_model_and_defaults_do_not():
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    base = _model()
    same = _model(attn_window=16, full_attn_every=0)        # a window as wide as seq_len: full bits
    assert "emb_norm" not in base.named_tensors()
    assert torch.equal(base(idx, idx), same(idx, idx))
    losses = {}
    for kw in ({}, {"attn_window": 3}, {"qk_norm": True}, {"emb_norm": True}):
        m = _model(**kw)
        loss = m(idx, idx)
        loss.backward()
        assert all(p.grad is not None for p in m.parameters()), kw
        losses[str(kw)] = float(loss.detach())
    assert len(set(losses.values())) == len(losses), losses
    assert _model(emb_norm=True).named_tensors()["emb_norm"].shape == (32,)


def test_qk_norm_is_gain_free_rmsnorm():
    """rmsnorm with w = 1 is the gain-free norm: (x * rstd) * 1.0 is exact, so its bits are
    the reference's x * rstd, and its gradient the reference's with a = gy."""
    rng = np.random.default_rng(8)
    x, gy = (rng.standard_normal((12, 16)).astype(np.float32) for _ in range(2))
    ones = np.ones(16, np.float32)
    y, rstd = R.rmsnorm(x, ones, R.f32(1e-5))
    assert_bits(y, R.mul(x, rstd[:, None]), "gain-free forward")
    xt = T(x).requires_grad_(True)
    out = repops.rmsnorm(xt, torch.ones(16), 1e-5)
    out.backward(T(gy))
    assert_bits(out.detach(), y, "repops.rmsnorm with unit gain")
    assert_bits(xt.grad, R.rmsnorm_backward(gy, x, ones, rstd)[0], "gain-free backward")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="hardware: no CUDA GPU on this machine (CPU = CUDA bits)")
@pytest.mark.parametrize("batch,G,Tn,D,W", [(2, 1, 9, 8, 4), (1, 3, 37, 6, 8), (1, 2, 70, 16, 64)])
def test_window_kernels_cpu_equals_cuda(batch, G, Tn, D, W):
    rng = np.random.default_rng(Tn)
    a = TK.adversarial(rng, (batch, G * Tn, D), frac=0.1, nonfinite=False)
    b = TK.adversarial(rng, (batch, Tn, D), frac=0.1, nonfinite=False)
    p = rng.standard_normal((batch, G * Tn, W)).astype(np.float32)
    cases = [("band_scores", (a, b, W)), ("band_mix", (p, b)), ("band_mix_t", (p, a, Tn)),
             ("window_softmax", (p.reshape(-1, Tn, W), 0.3)),
             ("window_softmax_backward", (p.reshape(-1, Tn, W), N(ops.window_softmax(T(p.reshape(-1, Tn, W)), 0.3)),
                                          0.3))]
    for name, args in cases:
        cpu = getattr(ops, name)(*[T(x) if isinstance(x, np.ndarray) else x for x in args])
        gpu = getattr(ops, name)(*[T(x).cuda() if isinstance(x, np.ndarray) else x for x in args])
        assert gpu.is_cuda
        assert_bits(gpu, N(cpu), f"{name} CUDA vs CPU")
