"""The strict guard of the contract (kernels/README.md): no floating-point arithmetic outside RepOps inside a step,
nor in a sample's decode.

A TorchDispatchMode records every operator that reaches the dispatcher during one
train.train_step (forward, backward, TreeFold, clipping, AdamW). Each one must be a RepOps
kernel (repops::...) or an ATen operator listed in ALLOWED with the reason it does no
floating-point arithmetic. A copy (aten::_to_copy, aten::copy_) counts as data movement only
when its dtype conversion keeps every value (exact_cast); a rounding one (float64 -> float32,
float32 -> bfloat16, int64 -> float32) is recorded as "<op> <from> -> <to>", a violation. Anything else, stock arithmetic or autograd summing gradients on
its own, fails the test, which prints the operator counts. model.Llama.generate (its KV cache,
the one-row decode, the Gumbel-max pick) runs under the same recorder, with the few exceptions
of GENERATE_ALLOWED: so a sample's tokens are the contract's on every backend.
"""
import collections
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import config
import data
import repops
import train
from tiny import TINY, make_corpus

# Every exception, and why it is not arithmetic. Keep it to what a step actually runs: an
# unused entry is reported too.
ALLOWED = {
    "aten::view": "reinterprets a tensor's shape over the same storage",
    "aten::_unsafe_view": "reshape of a strided tensor: a view of the copy clone just made",
    "aten::t": "a transposed view of a weight matrix",
    "aten::transpose.int": "a transposed view (matmul operands and their backward)",
    "aten::permute": "a view reordering the attention heads' dimensions",
    "aten::select.int": "a view of one element (the loss at the end of the folded vector)",
    "aten::slice.Tensor": "a view of a range (input/target windows, each parameter's gradient)",
    "aten::split_with_sizes": "views of q, k and v inside the fused QKV projection",
    "aten::detach": "an alias without autograd history",
    "aten::clone": "contiguous() and reshape of strided views: copy bytes to a dense layout",
    "aten::cat": "split's backward: lays the q, k, v gradients side by side; and the loss and "
                 "gradient norm side by side for the step's one host read (copies)",
    "aten::copy_": "each parameter's gradient, and the loss, into its slice of the flat buffer",
    "aten::empty.memory_format": "allocates the flat gradient buffer (no values are computed)",
    "aten::lift_fresh": "torch.from_numpy of the int64 token windows (wraps a buffer)",
    "aten::ones_like": "autograd's seed gradient d loss / d loss = 1.0 (writes a constant)",
    "aten::expand": "int8: an activation's step size s_x viewed once per row (its LSQ gradient "
                    "sums row by row, quant.activation_lsq_backward)",
    "aten::any": "the dead-tensor check: does a parameter's gradient have an element that is not "
                 "+-0.0 (comparisons with zero, no arithmetic)",
    "aten::stack": "the dead-tensor check's P flags side by side (copies)",
    "aten::_to_copy": "the dead-tensor check's flags, bool -> float32 0.0/1.0 (exact), for the one "
                      "host read",
}


# A sample's decode (model.Llama.generate) also runs these: selections, host reads and views.
GENERATE_ALLOWED = ALLOWED | {
    "aten::amax": "row_softmax's max: selects the row's largest score, the contract's cmax value "
                  "(model.row_softmax: a zero's sign does not change exp(z - m))",
    "aten::argmax": "the sampled token: the index of the largest score (a selection, on the host)",
    "aten::_local_scalar_dense": "int() of that index: a host read",
    "aten::unsqueeze": "a view of the row sums as a column (row_softmax scales each row by its own)",
    "aten::alias": "a slice of the whole KV cache (every position filled): a view",
}


def exact_cast(src, dst):
    """Does converting dtype src to dst keep every value? (Widening only: bool to anything,
    float to a float with at least its precision and range, int to an int of wider range or to
    a float whose significand holds it.)"""
    if src == dst or src == torch.bool:
        return True
    if src.is_floating_point:
        a, b = torch.finfo(src), torch.finfo(dst) if dst.is_floating_point else None
        return b is not None and b.eps <= a.eps and b.max >= a.max and b.smallest_normal <= a.smallest_normal
    a = torch.iinfo(src)
    if dst.is_floating_point:
        return max(abs(a.min), a.max) <= 2 ** (-math.log2(torch.finfo(dst).eps) + 1)
    return dst != torch.bool and torch.iinfo(dst).min <= a.min and torch.iinfo(dst).max >= a.max


class OpRecorder(TorchDispatchMode):
    """Counts every operator dispatched while active, by its schema name; a copy whose dtype
    conversion rounds as "<op> <from> -> <to>"."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.name()
        if name in ("aten::_to_copy", "aten::copy_"):
            src, dst = (args[0].dtype, out.dtype) if name == "aten::_to_copy" else (args[1].dtype, args[0].dtype)
            if not exact_cast(src, dst):
                name = f"{name} {src} -> {dst}"
        self.counts[name] += 1
        return out


def violations(counts):
    """The recorded operators that are neither RepOps nor a justified exception."""
    return {op: n for op, n in counts.items() if not op.startswith("repops::") and op not in ALLOWED}


def report(counts):
    return "operators recorded during the step:\n" + "\n".join(
        f"  {n:6d}  {op}" for op, n in sorted(counts.items()))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("guard"), seed=3)


# name -> the flags of one guarded step (int8: the quantized linears, their LSQ backward, re-pin)
# recipe: the OPEN-1B options (window, QK-norm, embedding norm, the cosine schedule's canonical cos)
# tied: tok_emb is the embedding and the output linear (its two gradients meet in repops.tie's add)
# exact: every matmul is the exact integer matmul (contract §11)
# int8_pv: attention's P·V in int8 (quant.py), windowed and full layers
STEPS = {"no_dropout": [], "dropout": ["--dropout=0.1"], "int8": ["--quant=int8"],
         "recipe": ["--attn_window=4", "--qk_norm=true", "--emb_norm=true", "--lr_schedule=cosine",
                    "--warmup_steps=0"],
         "tied": ["--tie_embeddings=true"], "exact": ["--matmul=exact"],
         # int8 P·V: a windowed layer (band mix) and the full last layer (int8 linear on P, V)
         "int8_pv": ["--quant=int8", "--int8_pv=1", "--attn_window=4"],
         # unit commitments: every piece hashed from host memory as the step runs (units.StepUnits)
         "units": ["--unit_commits=true"]}


@pytest.fixture(scope="module")
def step_ops(corpus):
    """{name: operator counts of one training step of a tiny model with STEPS[name]}."""
    out = {}
    for name, flags in STEPS.items():
        cfg = config.parse_config([*TINY, f"--data_dir={corpus}", *flags])
        tokens = data.TokenData(corpus, cfg.seed)
        state = train.TrainState(cfg, tokens.vocab_size)
        with OpRecorder() as rec:
            train.train_step(state, tokens, cfg)
        assert state.step == 1
        out[name] = rec.counts
    return out


@pytest.mark.parametrize("name", STEPS)
def test_every_op_of_a_step_is_repops_or_justified(step_ops, name):
    counts = step_ops[name]
    # The recorder really sees the step: its forward, backward, fold and optimizer kernels.
    matmul = "repops::exact_matmul" if name == "exact" else "repops::matmul"
    needed = {matmul, "repops::cross_entropy_backward", "repops::add",
              "repops::clip_grad", "repops::adamw_"}
    needed |= {"dropout": {"repops::dropout"}, "no_dropout": set(), "tied": set(), "exact": set(), "units": set(),
               "int8": {"repops::int8_quantize", "repops::int8_linear", "repops::lsq_backward",
                        "repops::int8_dequantize", "repops::lsq_init_"},
               "recipe": {"repops::band_scores", "repops::band_mix", "repops::band_mix_t",
                          "repops::window_softmax", "repops::window_softmax_backward", "repops::cos"},
               "int8_pv": {"repops::int8_absmax_step", "repops::int8_band_mix", "repops::int8_linear",
                           "repops::int8_quantize", "repops::int8_dequantize", "repops::band_scores",
                           "repops::band_mix_t"}}[name]
    assert needed <= set(counts), report(counts)
    assert name != "exact" or "repops::matmul" not in counts, "an fp32 matmul in an exact step:\n" + report(counts)
    assert not violations(counts), (f"floating-point work outside RepOps: {violations(counts)}\n"
                                    + report(counts))


def test_no_exception_is_stale(step_ops):
    used = set().union(*step_ops.values())
    assert set(ALLOWED) <= used, f"exceptions no step needs: {sorted(set(ALLOWED) - used)}"


# name -> the model options of one guarded sample (a context that grows, then slides)
SAMPLES = {"plain": {}, "recipe": {"n_kv_head": 1, "attn_window": 4, "qk_norm": True, "emb_norm": True},
           "int8": {"quant": "int8"}, "tied": {"tie_embeddings": True},
           "int8_pv": {"quant": "int8", "int8_pv": True}, "exact": {"matmul": "exact"}}


@pytest.fixture(scope="module")
def sample_ops():
    """{name: operator counts of generate() on a tiny random model with SAMPLES[name]}."""
    from model import Llama, ModelConfig
    out = {}
    for name, options in SAMPLES.items():
        model = Llama(ModelConfig(n_layer=2, d_model=32, n_head=4, d_hidden=64, seq_len=16, vocab_size=64,
                                  **options), seed=1).eval()
        with OpRecorder() as rec:
            ids = model.generate(list(range(5)), 20, seed=1)
        assert len(ids) == 25
        out[name] = rec.counts
    return out


@pytest.mark.parametrize("name", SAMPLES)
def test_every_op_of_a_sample_is_repops_or_justified(sample_ops, name):
    counts = sample_ops[name]
    needed = {"repops::uniform", "repops::log", "aten::argmax"}
    if name not in ("int8_pv", "exact"):       # the cached decode's one row (the others have none)
        needed |= {"repops::exp", "repops::csum", "repops::recip", "repops::mul", "aten::amax"}
    assert needed <= set(counts), report(counts)
    bad = {op: n for op, n in counts.items() if not op.startswith("repops::") and op not in GENERATE_ALLOWED}
    assert not bad, f"floating-point work outside RepOps in a sample: {bad}\n" + report(counts)


def test_no_sample_exception_is_stale(sample_ops):
    used = set().union(*sample_ops.values())
    assert set(GENERATE_ALLOWED) - set(ALLOWED) <= used, sorted(set(GENERATE_ALLOWED) - set(ALLOWED) - used)


def test_guard_flags_stock_arithmetic():
    a, b = torch.rand(8), torch.rand(8)
    with OpRecorder() as rec:
        torch.add(a, b)
    assert "aten::add.Tensor" in violations(rec.counts), report(rec.counts)


def test_guard_flags_autograd_summing_gradients():
    # A weight read twice gets two gradient contributions that autograd itself adds with
    # stock ATen: the reason model.py routes every fork through a RepOps add.
    w = torch.nn.Parameter(torch.rand(4, 4))
    x, targets = torch.rand(2, 4), torch.zeros(2, dtype=torch.int64)
    with OpRecorder() as rec:
        y = repops.add(repops.linear(x, w), repops.linear(x, w))
        torch.autograd.grad(repops.cross_entropy(y, targets), [w])
    assert "aten::add.Tensor" in violations(rec.counts), report(rec.counts)


def test_guard_flags_rounding_copies():
    """A copy that converts with rounding is arithmetic; one that widens (the positive control)
    is data movement."""
    x64, x32, flags = torch.rand(8, dtype=torch.float64), torch.rand(8), torch.rand(8) > 0.5
    i64, i8 = torch.arange(8), torch.arange(8, dtype=torch.int8)
    with OpRecorder() as rec:
        x64.float(), x32.to(torch.bfloat16), i64.float(), torch.empty(8).copy_(x64)
    assert {"aten::_to_copy torch.float64 -> torch.float32", "aten::_to_copy torch.float32 -> torch.bfloat16",
            "aten::_to_copy torch.int64 -> torch.float32", "aten::copy_ torch.float64 -> torch.float32"} \
        <= set(violations(rec.counts)), report(rec.counts)
    with OpRecorder() as rec:
        x32.double(), flags.float(), torch.empty(8).copy_(x32), i8.float()
    assert not violations(rec.counts) and rec.counts["aten::_to_copy"] == 3, report(rec.counts)
