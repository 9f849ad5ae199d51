"""Stock PyTorch operators under the contract (stockops.py through guard.py's mode; kernels/README.md
§12), operator by operator.

1. Bits: each mapped operator, forward and backward through autograd, inside guard.ContractMode,
   against tests/numpy_stock.py (the contract's §12 sequence in NumPy) bit for bit, on random and
   adversarial inputs (signed zeros, subnormals, huge values, infinities, NaN; all NaNs equal);
   backward as torch's autograd formulas compose the mapped operators (BACKWARD pins them).
2. Accuracy: the same operators against stock PyTorch on ordinary inputs, within tolerances.
3. Refusals: what the mode does not map stops with one line naming the test's own line.
The commands on a changed model (train, audit, sample) are tests/test_model_edits.py and
tests/test_changed_models.py.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import guard
import numpy_contract as C
import numpy_stock as S
import stockops

F32 = np.float32
SEED = 1337
ADVERSARIAL = np.array([0.0, -0.0, 1e-45, -1e-45, 3e-39, -3e-39, 2.0 ** -126, -(2.0 ** -126), 1.0, -1.0, 0.5,
                        -2.5, 3e38, -3e38, np.inf, -np.inf, np.nan, 88.7, -87.4, 1e-20, 65504.0, 7.0,
                        -0.75, 1e5, -1e-5], F32)


def values(seed, n=40):
    """ADVERSARIAL, then n normal values of mixed scales (float32)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([ADVERSARIAL, (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 30.0], n)).astype(F32)])


def positive(seed, n=40):
    return np.abs(values(seed, n)).astype(F32)


def assert_bits(got, exp, what=""):
    got = got.detach().numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    exp = np.asarray(exp, dtype=F32)
    assert got.dtype == F32 and got.shape == exp.shape, (what, got.dtype, got.shape, exp.shape)
    bad = (got.view(np.uint32) != exp.view(np.uint32)) & ~(np.isnan(got) & np.isnan(exp))
    if bad.any():
        i = tuple(int(k) for k in np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())}/{bad.size} differ; first at {i}: {got[i]!r} "
                             f"(0x{int(got.view(np.uint32)[i]):08X}) vs reference {exp[i]!r} "
                             f"(0x{int(exp.view(np.uint32)[i]):08X})")


def mode(step=1, micro=0):
    return guard.ContractMode(SEED, step=step, micro=micro)


def through_autograd(fn, inputs, seed=0):
    """(y, grads, g): y = fn(*inputs) and its gradients against a random upstream g, all under the
    mode; inputs are NumPy arrays (float32 ones get gradients)."""
    ts = [torch.tensor(x, requires_grad=x.dtype == F32) if isinstance(x, np.ndarray) else x for x in inputs]
    with mode() as m:
        y = fn(*ts)
        g = np.random.default_rng(seed).standard_normal(y.shape).astype(F32)
        leaves = [t for t in ts if isinstance(t, torch.Tensor) and t.requires_grad]
        grads = torch.autograd.grad(y, leaves, torch.from_numpy(g), allow_unused=True)
    assert m.mapped, "nothing was mapped: the test would not test the mapping"
    return y, grads, g


# ------------------------------------------------------------------ 1. bits: elementwise
def _pair(seed):
    a = values(seed)
    return a, np.roll(values(seed + 1), 7)


# name -> (inputs(seed), fn(torch...), reference(numpy inputs, y, g) -> (y, [grads]))
ELEMENTWISE = {
    "add": (_pair, lambda a, b: a + b, lambda a, b, g: (S.add(a, b), [g, g])),
    "add alpha 2": (_pair, lambda a, b: torch.add(a, b, alpha=2.0),
                    lambda a, b, g: (S.add(a, b, 2.0), [g, S.mul(g, 2.0)])),
    "sub": (_pair, lambda a, b: a - b, lambda a, b, g: (S.sub(a, b), [g, S.neg(g)])),
    "rsub": (lambda s: (values(s),), lambda a: 1.5 - a, lambda a, g: (S.add(S.neg(a), 1.5), [S.neg(g)])),
    "add scalar": (lambda s: (values(s),), lambda a: a + 0.1, lambda a, g: (S.add(a, 0.1), [g])),
    "mul": (_pair, lambda a, b: a * b, lambda a, b, g: (S.mul(a, b), [S.mul(g, b), S.mul(g, a)])),
    "mul scalar": (lambda s: (values(s),), lambda a: a * 0.3, lambda a, g: (S.mul(a, 0.3), [S.mul(g, 0.3)])),
    "div": (_pair, lambda a, b: a / b,
            lambda a, b, g: (S.div(a, b), [S.div(g, b), S.mul(S.neg(g), S.div(S.div(a, b), b))])),
    "div scalar": (lambda s: (values(s),), lambda a: a / 3.0, lambda a, g: (S.div(a, 3.0), [S.div(g, 3.0)])),
    "neg": (lambda s: (values(s),), lambda a: -a, lambda a, g: (S.neg(a), [S.neg(g)])),
    "reciprocal": (lambda s: (values(s),), torch.reciprocal,
                   lambda a, g: ((y := C.recip(a)), [S.mul(S.neg(g), S.mul(y, y))])),
    "exp": (lambda s: (values(s),), torch.exp, lambda a, g: ((y := C.exp(a)), [S.mul(g, y)])),
    "log": (lambda s: (positive(s),), torch.log, lambda a, g: (C.log(a), [S.div(g, a)])),
    "sqrt": (lambda s: (positive(s),), torch.sqrt, lambda a, g: ((y := C.sqrt(a)), [S.div(g, S.mul(y, 2.0))])),
    "rsqrt": (lambda s: (positive(s),), torch.rsqrt,
              lambda a, g: ((y := C.rsqrt(a)), [S.mul(S.mul(g, -0.5), S.powi(y, 3))])),
    "sin": (lambda s: (values(s)[np.abs(values(s)) < 1e4],), torch.sin,
            lambda a, g: (C.sin(a), [S.mul(g, C.cos(a))])),
    "cos": (lambda s: (values(s)[np.abs(values(s)) < 1e4],), torch.cos,
            lambda a, g: (C.cos(a), [S.mul(g, S.neg(C.sin(a)))])),
    "sigmoid": (lambda s: (values(s),), torch.sigmoid,
                lambda a, g: ((y := S.sigmoid(a)), [S.sigmoid_backward(g, y)])),
    "tanh": (lambda s: (values(s),), torch.tanh, lambda a, g: ((y := C.tanh(a)), [S.tanh_backward(g, y)])),
    "erf": (lambda s: (values(s),), torch.erf,
            lambda a, g: (C.erf(a), [S.mul(S.mul(C.exp(S.neg(S.powi(a, 2))), 2 / math.sqrt(math.pi)), g)])),
    "gelu": (lambda s: (values(s),), F.gelu, lambda a, g: (C.gelu(a), [S.mul(g, C.gelu_grad(a))])),
    "gelu tanh": (lambda s: (values(s),), lambda a: F.gelu(a, approximate="tanh"),
                  lambda a, g: (C.gelu_tanh(a), [S.mul(g, C.gelu_tanh_grad(a))])),
    "silu": (lambda s: (values(s),), F.silu, lambda a, g: (S.silu(a), [S.silu_backward(g, a)])),
    "relu": (lambda s: (values(s),), F.relu, lambda a, g: (S.relu(a), [S.threshold_backward(g, a, 0)])),
    "abs": (lambda s: (values(s),), torch.abs, lambda a, g: (S.absolute(a), [S.mul(g, S.sign(a))])),
    "pow 2": (lambda s: (values(s),), lambda a: a ** 2, lambda a, g: (S.powi(a, 2), [S.mul(S.mul(a, 2.0), g)])),
    "pow 3": (lambda s: (values(s),), lambda a: a.pow(3),
              lambda a, g: (S.powi(a, 3), [S.mul(S.mul(S.powi(a, 2), 3.0), g)])),
    "pow -2": (lambda s: (values(s),), lambda a: a ** -2,
               lambda a, g: (C.recip(S.powi(a, 2)), [S.mul(S.mul(C.recip(S.powi(a, 3)), -2.0), g)])),
    "pow 0.5": (lambda s: (positive(s),), lambda a: a ** 0.5,
                lambda a, g: (C.sqrt(a), [S.mul(S.mul(C.rsqrt(a), 0.5), g)])),
    "pow 13": (lambda s: (values(s),), lambda a: a ** 13, None),
}


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise_bits(name):
    make, fn, ref = ELEMENTWISE[name]
    inputs = make(3)
    y, grads, g = through_autograd(fn, inputs)
    if ref is None:                 # pow 13: the forward's multiply order (binary exponentiation)
        a = inputs[0]
        assert_bits(y, C.mul(C.mul(a, C.mul(C.mul(a, a), C.mul(a, a))),
                             C.mul(C.mul(C.mul(a, a), C.mul(a, a)), C.mul(C.mul(a, a), C.mul(a, a)))), name)
        return
    want_y, want_grads = ref(*inputs, g)
    assert_bits(y, want_y, name)
    for k, (got, want) in enumerate(zip(grads, want_grads)):
        assert_bits(got, want, f"{name}: gradient {k}")


def test_broadcast_and_strides_change_no_bit():
    """Broadcast operands, a transposed view and an in-place form give the elementwise bits."""
    a, b = values(5, 23).reshape(6, 8), values(6, 2)[:8]
    with mode():
        ta = torch.tensor(a)
        sum_ = ta.t() + torch.tensor(b)[:, None]
        prod = torch.tensor(b)[:, None] * ta.t().contiguous()
        quot = ta / torch.tensor(b)
        inplace = torch.tensor(a)
        inplace.mul_(torch.tensor(b))
    assert_bits(sum_, S.add(a.T, b[:, None]), "add")
    assert_bits(prod, S.mul(b[:, None], a.T), "mul")
    assert_bits(quot, S.div(a, b), "div")
    assert_bits(inplace, S.mul(a, b), "mul_")


# ------------------------------------------------------------------ reductions, softmax, losses, norm
@pytest.mark.parametrize("dim,keepdim", [((1,), False), ((0,), True), ((0, 2), False), (None, False)])
def test_sum_and_mean_bits(dim, keepdim):
    x = values(7, 95).reshape(3, 5, 8)
    y_sum, (g_sum,), g1 = through_autograd(lambda t: t.sum(dim, keepdim=keepdim) if dim else t.sum(), [x])
    y_mean, (g_mean,), g2 = through_autograd(lambda t: t.mean(dim, keepdim=keepdim) if dim else t.mean(), [x], 1)
    assert_bits(y_sum, S.reduce_sum(x, dim, keepdim), "sum")
    assert_bits(g_sum, np.broadcast_to(np.asarray(g1).reshape(S.reduce_sum(x, dim, True).shape), x.shape), "sum'")
    n = x.size // S.reduce_sum(x, dim, True).size
    assert_bits(y_mean, S.reduce_mean(x, dim, keepdim), "mean")
    want = S.div(np.asarray(g2).reshape(S.reduce_sum(x, dim, True).shape), float(n))
    assert_bits(g_mean, np.broadcast_to(want, x.shape), "mean'")


def test_sum_of_a_long_row_is_the_canonical_sum():
    """A sum over 100 terms crosses the 32 lanes of contract §4.2: a left-to-right sum differs."""
    x = np.random.default_rng(0).standard_normal((4, 100)).astype(F32) * F32(1e4)
    x[:, ::7] *= F32(1e-4)
    with mode():
        y = torch.tensor(x).sum(-1)
    assert_bits(y, S.reduce_sum(x, [-1]), "sum")
    sequential = x[:, 0].copy()
    for k in range(1, 100):
        sequential = C.add(sequential, x[:, k])
    assert (y.numpy().view(np.uint32) != sequential.view(np.uint32)).any(), "the data cannot tell the orders apart"


def test_amax_and_max_bits():
    x = values(8, 71).reshape(4, 24)
    x[1] = np.where(np.isnan(x[1]), F32(1.0), x[1])
    x[2, :] = -0.0
    x[2, 5] = F32(-1e-45)
    x[3, :] = np.nan
    y, (gx,), g = through_autograd(lambda t: t.amax(-1), [x])
    want = S.reduce_amax(x, [-1])
    assert_bits(y, want, "amax")
    assert want[2].view(np.uint32) == 0 and want[3] == -np.inf       # a zero is +0.0; only NaN: -inf
    maxima = (S.daz(x) == want[:, None]) & ~np.isnan(x)
    count = maxima.sum(-1, keepdims=True).astype(F32)
    assert_bits(gx, S.mul(S.div(g[:, None], count), maxima.astype(F32)), "amax'")
    with torch.no_grad(), mode():
        values_, indices = torch.tensor(x).max(-1)
        everything = torch.tensor(x).max()
    want_v, want_i = S.max_dim(x, -1)
    assert_bits(values_, want_v, "max.dim")
    assert indices.tolist() == want_i.tolist()
    assert_bits(everything, S.reduce_amax(x), "max")


@pytest.mark.parametrize("dim", [-1, 1])
def test_softmax_and_log_softmax_bits(dim):
    x = values(9, 95).reshape(5, 24)
    x = np.where(np.isnan(x) | np.isinf(x) | (np.abs(x) > 1e30), F32(3.0), x)
    x[2, 3] = -np.inf                                                        # a masked score
    y, (gx,), g = through_autograd(lambda t: F.softmax(t, dim=dim), [x])
    assert_bits(y, S.softmax(x, dim), "softmax")
    assert_bits(gx, S.softmax_backward(g, S.softmax(x, dim), dim), "softmax'")
    y, (gx,), g = through_autograd(lambda t: F.log_softmax(t, dim=dim), [x], 1)
    assert_bits(y, S.log_softmax(x, dim), "log_softmax")
    assert_bits(gx, S.log_softmax_backward(g, S.log_softmax(x, dim), dim), "log_softmax'")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_bits(reduction):
    """F.cross_entropy = log_softmax, then nll_loss (ignore_index rows are +0.0 terms)."""
    rng = np.random.default_rng(10)
    z = (rng.standard_normal((7, 11)) * 3).astype(F32)
    t = rng.integers(0, 11, 7)
    t[4] = -100
    y, (gz,), g = through_autograd(lambda x, tt: F.cross_entropy(x, tt, reduction=reduction), [z, torch.tensor(t)])
    logp = S.log_softmax(z, -1)
    loss, _ = S.nll_loss(logp, t, reduction)
    assert_bits(y, loss, "cross_entropy")
    assert_bits(gz, S.log_softmax_backward(S.nll_loss_backward(g, logp, t, reduction), logp, -1), "cross_entropy'")


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_bits(affine):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((2, 3, 40)) * 5 + 1).astype(F32)
    x[1, 2, :4] = [0.0, -0.0, 1e-40, 3e4]
    w, b = (rng.standard_normal(40).astype(F32), rng.standard_normal(40).astype(F32)) if affine else (None, None)
    inputs = [x] + ([w, b] if affine else [])
    y, grads, g = through_autograd(lambda t, *wb: F.layer_norm(t, (40,), *wb, eps=1e-5), inputs)
    want, mu, rstd = S.layer_norm(x, (40,), w, b, 1e-5)
    assert_bits(y, want, "layer_norm")
    gx, gw, gb = S.layer_norm_backward(g, x, (40,), mu, rstd, w)
    assert_bits(grads[0], gx, "layer_norm' x")
    if affine:
        assert_bits(grads[1], gw, "layer_norm' weight")
        assert_bits(grads[2], gb, "layer_norm' bias")


def test_linear_and_batched_matmul_bits():
    """F.linear (addmm: the matmul, then the bias as one add) and q @ k^T on 4-D heads (bmm)."""
    rng = np.random.default_rng(12)
    x, w, b = (rng.standard_normal(s).astype(F32) for s in ((6, 9), (5, 9), (5,)))
    y, (gx, gw, gb), g = through_autograd(F.linear, [x, w, b])
    assert_bits(y, S.addmm(b, x, w.T), "linear")
    assert_bits(gx, C.matmul(g, w), "linear' x")
    assert_bits(gw, C.matmul(g.T, x), "linear' weight")
    assert_bits(gb, S.reduce_sum(g, [0]), "linear' bias")
    q, k = (rng.standard_normal((2, 3, 4, 8)).astype(F32) for _ in range(2))
    s, (gq, gk), g = through_autograd(lambda a, c: a @ c.transpose(-2, -1), [q, k])
    assert_bits(s, C.matmul(q.reshape(6, 4, 8), k.reshape(6, 4, 8).transpose(0, 2, 1)).reshape(2, 3, 4, 4), "q k^T")
    assert_bits(gq, C.matmul(g.reshape(6, 4, 4), k.reshape(6, 4, 8)).reshape(q.shape), "q k^T' q")
    assert_bits(gk, C.matmul(g.reshape(6, 4, 4).transpose(0, 2, 1), q.reshape(6, 4, 8)).reshape(k.shape), "q k^T' k")


def test_exact_matmul_under_the_mode():
    """With the run's matmul = exact, a stock matmul is contract §11's."""
    import numpy_exact
    rng = np.random.default_rng(13)
    a, b = rng.standard_normal((5, 70)).astype(F32), rng.standard_normal((70, 3)).astype(F32)
    with guard.ContractMode(SEED, exact=True):
        y = torch.tensor(a) @ torch.tensor(b)
    assert_bits(y, numpy_exact.exact_matmul(a, b), "exact")


def test_selections_and_embedding_backward_bits():
    """relu, where, masked_fill and comparisons select (DAZ-read comparisons); the embedding's
    gradient is contract §4.3's sequential sum, its padding row +0.0."""
    x = values(14)
    with mode():
        t = torch.tensor(x)
        gt = t > 1e-39                       # a subnormal reads as zero
        where = torch.where(t > 0, t, torch.zeros(()))
        filled = t.masked_fill(t < 0, float("-inf"))
    assert gt.tolist() == (S.daz(x) > 0).tolist()
    assert_bits(where, np.where(S.daz(x) > 0, x, F32(0.0)), "where")
    assert_bits(filled, np.where(S.daz(x) < 0, F32(-np.inf), x), "masked_fill")
    rng = np.random.default_rng(15)
    w, idx = rng.standard_normal((7, 5)).astype(F32), rng.integers(0, 7, (3, 6))
    y, (gw,), g = through_autograd(lambda ww, i: F.embedding(i, ww, padding_idx=2), [w, torch.tensor(idx)])
    want = C.embedding_backward(g.reshape(-1, 5), idx.reshape(-1), 7)
    want[2] = 0.0
    assert_bits(y, w[idx], "embedding")
    assert_bits(gw, want, "embedding'")



def test_squeeze_and_constants_are_data_movement():
    """x[None] and x.unsqueeze(d) (whose backward is aten::squeeze.dim), x.squeeze(d), torch.full
    and torch.full_like compute no value (contract §12.6: views, and constants f32(value)): they
    pass the mode; the product that follows them is the mapped mul. A constant of another float
    dtype is still refused."""
    x, w = values(16, 15)[None, :], values(17, 95).reshape(3, 1, 40)   # [1, 40], [3, 1, 40]
    half, two = np.full((3, 40), 0.5, F32), np.full((1, 40), 2.0, F32)
    y, (gx, gw), g = through_autograd(lambda a, b: (a[None] * b).squeeze(1) * torch.full((3, 40), 0.5)
                                      + torch.full_like(a, 2.0), [x, w])
    assert_bits(y, S.add(S.mul(S.mul(x[None], w)[:, 0], half), two), "y")
    g_product = S.mul(g, half)[:, None, :]                                 # [3, 1, 40]
    assert_bits(gw, S.mul(g_product, x[None]), "b'")
    assert_bits(gx, S.reduce_sum(S.mul(g_product, w), (0,), True)[0], "a' (through squeeze.dim)")
    with mode():
        msg = refusal(lambda: torch.full((2,), 1.0, dtype=torch.float64))
    assert "aten::full on float64" in msg, msg


# ------------------------------------------------------------------ random numbers
def test_dropout_is_philox_keyed_by_step_micro_batch_and_site():
    """F.dropout (its CPU form bernoulli_, mask / (1 - p), x * mask) and aten.native_dropout (its
    CUDA form) give repops dropout's bits at the stock counters; site = the call's ordinal."""
    x = values(16, 300).reshape(13, 25)
    x = np.where(np.isnan(x), F32(1.0), x)
    ts = torch.tensor(x, requires_grad=True)
    with mode(step=3, micro=1) as m:
        y0 = F.dropout(ts, 0.25)
        y1 = F.dropout(ts, 0.25)
        gx, = torch.autograd.grad(y1, [ts], torch.ones(13, 25))
        m.key(3, 1)
        native, keep = torch.ops.aten.native_dropout(torch.tensor(x), 0.25, True)
    want0, _ = S.dropout(x, 0.25, SEED, 3, 1, 0)
    want1, keep1 = S.dropout(x, 0.25, SEED, 3, 1, 1)
    assert_bits(y0, want0, "site 0")
    assert_bits(y1, want1, "site 1")
    assert_bits(native, want0, "native_dropout")
    assert keep.tolist() == S.keep_mask(SEED, 3, 1, 0, 0.75, x.size).reshape(x.shape).tolist()
    assert_bits(gx, S.dropout_backward(np.ones_like(x), keep1, 0.25), "dropout'")
    assert 0.2 < 1 - keep.float().mean().item() < 0.3
    assert (y0.detach().numpy() != y1.detach().numpy()).any()
    with mode(step=3, micro=2):
        other = F.dropout(torch.tensor(x), 0.25)
    assert (other.numpy() != y0.detach().numpy()).any(), "another micro-batch, another mask"


def test_initialization_draws_are_philox():
    """Under Guard.construction, nn.Linear's own init (kaiming uniform_, draws 0 and 1) and
    nn.init.normal_ / zeros_ (draw 2) are contract §12.7's draws."""
    with guard.Guard(SEED).construction() as m:
        layer = nn.Linear(4, 3)
        bias0 = layer.bias.detach().clone()
        nn.init.normal_(layer.weight, mean=0.0, std=0.02)
        nn.init.zeros_(layer.bias)
    assert m.draws == 3
    assert_bits(bias0, S.init_uniform(SEED, 1, (3,), -0.5, 0.5), "bias (kaiming uniform_)")
    assert_bits(layer.weight, S.init_normal(SEED, 2, (3, 4), 0.0, 0.02), "normal_")
    assert layer.bias.detach().numpy().view(np.uint32).tolist() == [0, 0, 0]


# ------------------------------------------------------------------ autograd's sums
def test_autograd_sums_gradient_contributions_with_the_repops_add():
    """A tensor read three times: autograd adds the contributions as they arrive, one RepOps add
    each, in the engine's order (the last-created node first): ((g3 + g2) + g1)."""
    rng = np.random.default_rng(17)
    x = rng.standard_normal(64).astype(F32)
    w1, w2, w3 = (rng.standard_normal(64).astype(F32) * F32(scale) for scale in (1e8, 1.0, -1e8))
    y, (gx, *_), g = through_autograd(lambda a, b, c, d: (a * b) + (a * c) + (a * d), [x, w1, w2, w3])
    g1, g2, g3 = S.mul(g, w1), S.mul(g, w2), S.mul(g, w3)
    assert_bits(gx, C.add(C.add(g3, g2), g1), "three contributions")
    other = C.add(C.add(g1, g2), g3)
    assert (other.view(np.uint32) != gx.numpy().view(np.uint32)).any(), "the data cannot tell the orders apart"


# ------------------------------------------------------------------ backward formulas
class Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.name().removeprefix("aten::"))
        return func(*args, **(kwargs or {}))


# The ATen operators torch's autograd formulas run for a forward operator (torch 2.13, pinned in
# requirements.txt), which kernels/README.md §12.1 writes down: they decide a stock model's bits.
BACKWARD = {
    "mul": (lambda a, b: a * b, ["mul.Tensor", "mul.Tensor"]),
    "div": (lambda a, b: a / b, ["div.Tensor", "div.Tensor", "neg", "mul.Tensor", "div.Tensor"]),
    "reciprocal": (lambda a, b: a.reciprocal(), ["mul.Tensor", "neg", "mul.Tensor"]),
    "exp": (lambda a, b: a.exp(), ["mul.Tensor"]),
    "log": (lambda a, b: a.log(), ["div.Tensor"]),
    "sqrt": (lambda a, b: a.sqrt(), ["mul.Scalar", "div.Tensor"]),
    "rsqrt": (lambda a, b: a.rsqrt(), ["pow.Tensor_Scalar", "mul.Scalar", "mul.Tensor"]),
    "sin": (lambda a, b: a.sin(), ["cos", "mul.Tensor"]),
    "cos": (lambda a, b: a.cos(), ["sin", "neg", "mul.Tensor"]),
    "erf": (lambda a, b: torch.erf(a), ["pow.Tensor_Scalar", "neg", "exp", "mul.Scalar", "mul.Tensor"]),
    "abs": (lambda a, b: a.abs(), ["sgn", "mul.Tensor"]),
    "pow": (lambda a, b: a ** 3, ["pow.Tensor_Scalar", "mul.Scalar", "mul.Tensor"]),
    "mean": (lambda a, b: a.mean(), ["expand", "div.Scalar"]),
    "sub": (lambda a, b: a - b, ["neg"]),
    "tanh": (lambda a, b: a.tanh(), ["tanh_backward"]),
    "sigmoid": (lambda a, b: a.sigmoid(), ["sigmoid_backward"]),
    "gelu": (lambda a, b: F.gelu(a), ["gelu_backward"]),
}


@pytest.mark.parametrize("name", BACKWARD)
def test_backward_formulas_are_the_documented_ones(name):
    """Plain torch (no mode): the ATen operators autograd runs for each forward, as documented."""
    fn, expected = BACKWARD[name]
    a, b = torch.rand(3, requires_grad=True), torch.rand(3, requires_grad=True)
    y = fn(a, b)
    with Recorder() as rec:
        torch.autograd.grad(y, [a, b], torch.ones_like(y), allow_unused=True)
    assert [n for n in rec.names if n not in ("ones_like", "detach")] == expected


# ------------------------------------------------------------------ 2. accuracy against stock PyTorch
ACCURACY = {
    "elementwise": lambda x: torch.sigmoid(x) * (x / 3.0) + F.silu(x) - x.abs().sqrt() + x ** 2 + (-x).exp(),
    "activations": lambda x: torch.tanh(x) + torch.erf(x) + F.gelu(x) + F.gelu(x, approximate="tanh") + F.relu(x),
    "cross_entropy": lambda x: F.cross_entropy(x, torch.arange(16) % 40) * F.cross_entropy(x, torch.arange(16) % 5,
                                                                                      reduction="sum"),
    "softmax": lambda x: F.softmax(x, -1) + F.log_softmax(x, 0),
    "layer_norm": lambda x: F.layer_norm(x, (x.shape[-1],), torch.ones(x.shape[-1]) * 1.5, torch.ones(x.shape[-1])),
    "reductions": lambda x: x.sum(0) + x.mean(-1, keepdim=True) + x.amax(0),
    "matmul": lambda x: F.linear(x, x[:5], x[0, :5]) @ x[:5],
}


@pytest.mark.parametrize("name", ACCURACY)
def test_accuracy_against_stock_pytorch(name):
    x = torch.tensor(np.random.default_rng(18).standard_normal((16, 40)).astype(F32), requires_grad=True)
    fn = ACCURACY[name]
    want = fn(x)
    g_want, = torch.autograd.grad(want.sum(), [x])
    with mode():
        got = fn(x)
        g_got, = torch.autograd.grad(got.sum(), [x])
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(g_got, g_want, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ 3. refusals
def line_of(marker):
    """The line number in this file of the line holding `marker` (a comment)."""
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if marker in text and "line_of(" not in text)


def refusal(fn):
    with pytest.raises(guard.ContractError) as e:
        fn()
    return str(e.value)


def test_an_unmapped_operator_is_refused_with_the_line_that_called_it():
    x = torch.rand(5)
    with mode():
        msg = refusal(lambda: torch.cumsum(x, 0))  # <- cumsum here
    assert msg == (f"tests/test_stockops.py:{line_of('<- cumsum here')} runs aten::cumsum outside the contract; "
                   f"{guard.INSTEAD['other']} (docs/changing-the-model.md)")


def under_autocast(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return F.linear(x, x)


@pytest.mark.parametrize("case,what,instead", [
    ("float64", "aten::_to_copy on float64", "dtype"),
    ("rounding copy", "aten::_to_copy int64 -> float32 beyond 2^24", "dtype"),
    ("half", "aten::_to_copy float32 -> bfloat16", "dtype"),
    ("autocast", "aten::_to_copy float32 -> bfloat16", "dtype"),
    ("torch rng", "aten::randn", "rng"),
    ("alpha on addmm", "aten::addmm with beta=1, alpha=2", None),
    ("class weights", "aten::nll_loss_forward with class weights", None),
    ("other exponent", "aten::pow.Tensor_Scalar with exponent 2.5", None),
])
def test_what_is_refused_and_what_to_use_instead(case, what, instead):
    x = torch.rand(4, 4)
    run = {"float64": lambda: x.double() * 2.0,
           "rounding copy": lambda: (torch.arange(4) + (1 << 24) + 1).float(),
           "half": lambda: x.to(torch.bfloat16),
           "autocast": lambda: under_autocast(x),
           "torch rng": lambda: x + torch.randn(4, 4),
           "alpha on addmm": lambda: torch.addmm(x, x, x, alpha=2),
           "class weights": lambda: F.cross_entropy(x, torch.tensor([0, 1, 2, 3]), weight=torch.ones(4)),
           "other exponent": lambda: x ** 2.5}[case]
    with mode():
        msg = refusal(run)
    assert what in msg and msg.startswith("tests/test_stockops.py:"), msg
    if instead:
        assert guard.INSTEAD[instead] in msg, msg


def test_integers_that_float32_holds_convert():
    """x.float() of an int64 tensor whose values lie in [-2^24, 2^24] (positions, counts) keeps
    every value, as an operand of a mapped operator does (contract §12); 2^24 + 1 is refused above."""
    edge = torch.tensor([-(1 << 24), -1, 0, 3, 1 << 24])
    with mode() as m:
        positions = torch.arange(6).float() * 0.5
        copied = torch.empty(5).copy_(edge)
    assert positions.tolist() == [k * 0.5 for k in range(6)] and copied.tolist() == edge.tolist()
    assert m.mapped["aten::mul.Tensor"] == 1


def test_integer_work_passes_and_needs_no_mapping():
    with mode() as m:
        i = torch.arange(10) * 3 % 7 + torch.tensor([1]) // 2
        mask = (i > 2) & (i < 6)
    assert i.tolist() == [(k * 3 % 7) for k in range(10)] and mask.sum() == 4 and not m.mapped


def test_a_backward_operator_is_traced_to_its_forward_line_by_the_probe():
    """The probe runs anomaly mode: a refused backward operator names the forward line that
    recorded it; in a later step (no anomaly mode) it names the autograd node."""
    x = torch.rand(3, 5, requires_grad=True)

    def loss():
        return x.max(-1).values.sum()  # <- max here

    msg = refusal(lambda: guard.Guard(SEED).probe(loss, [x], step=1))
    assert msg.startswith(f"tests/test_stockops.py:{line_of('<- max here')} (its backward) runs aten::"), msg
    with mode():
        msg = refusal(lambda: torch.autograd.grad(loss(), [x]))
    assert msg.startswith("the backward of MaxBackward0 runs aten::"), msg


def test_dropout_is_refused_outside_a_step_and_in_recomputation():
    x = torch.rand(8, requires_grad=True)
    with guard.ContractMode(SEED):
        assert "with no step to key its mask" in refusal(lambda: F.dropout(x, 0.5))
    with mode():
        y = torch.utils.checkpoint.checkpoint(lambda t: F.dropout(t, 0.5) * 2.0, x, use_reentrant=False,
                                              preserve_rng_state=False)
        assert "recomputes the forward" in refusal(lambda: torch.autograd.grad(y.sum(), [x]))


def test_the_probe_classifies_a_model():
    """Pure RepOps: nothing mapped. Stock operators: the mapped ones, counted."""
    import repops
    w = torch.rand(4, 4, requires_grad=True)
    x = torch.rand(2, 4)
    g = guard.Guard(SEED)
    assert not g.probe(lambda: repops.cross_entropy(repops.linear(x, w), torch.tensor([0, 1])), [w], 1)
    assert not g.stock
    found = g.probe(lambda: F.cross_entropy(torch.sigmoid(x @ w), torch.tensor([0, 1])), [w], 1)
    assert g.stock and found["aten::mm"] == 2 and found["aten::sigmoid"] == 1, found
