"""The strict guard of the contract (kernels/README.md): no floating-point arithmetic outside RepOps inside a step,
nor in a sample's decode, for the default model in each of its options.

A TorchDispatchMode records every operator that reaches the dispatcher during one
train.train_step (forward, backward, TreeFold, clipping, AdamW). Each one must be a RepOps
kernel (repops::...), an ATen operator of guard.ALLOWED (the table the contract's guard itself
passes, guard.py: each entry with the reason it does no floating-point arithmetic), or integer
work (no float tensor among its operands and results: recorded as "<op> (integers)"). A copy
(aten::_to_copy, aten::copy_) counts as data movement only when its dtype conversion keeps every
value (guard.exact_cast); a rounding one (float64 -> float32, float32 -> bfloat16, int64 ->
float32) is recorded as "<op> <from> -> <to>", a violation. Anything else, stock arithmetic or
autograd summing gradients on its own, fails the test, which prints the operator counts: the
default model is pure RepOps, so none of stockops.py's mappings may run in its steps either.
model.Llama.generate (its KV cache, the one-row decode, the Gumbel-max pick) runs under the same
recorder, with the one mapped operator of GENERATE_ALLOWED: so a sample's tokens are the
contract's on every backend. Every entry of guard.ALLOWED must be used by a recorded program
(these steps and samples, the models' construction, TreeFold's all-reduce of a step on several
ranks, and a step of a small stock model).
"""
import collections
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import config
import data
import guard
import repops
import train
from guard import ALLOWED, exact_cast
from tiny import TINY, make_corpus


# A sample's decode (model.Llama.generate) also runs model.row_softmax's torch.amax, which the
# guard maps (stockops.reduce_amax: the canonical maximum; row_softmax's docstring says why a sign
# of zero there changes no bit) and sample.py's decode runs under the guard.
GENERATE_ALLOWED = ALLOWED | {
    "aten::amax": "row_softmax's max: selects the row's largest score, the contract's cmax value "
                  "(model.row_softmax: a zero's sign does not change exp(z - m))",
}


def _floats(value):
    if isinstance(value, torch.Tensor):
        return value.is_floating_point()
    if isinstance(value, (list, tuple)):
        return any(_floats(v) for v in value)
    return False


class OpRecorder(TorchDispatchMode):
    """Counts every operator dispatched while active, by its schema name; a copy whose dtype
    conversion rounds as "<op> <from> -> <to>"; an operator without float tensors as "<op>
    (integers)"."""

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
        elif not name.startswith("repops::") and not _floats([args, list((kwargs or {}).values()), out]):
            name += " (integers)"
        self.counts[name] += 1
        return out


def violations(counts, allowed=ALLOWED):
    """The recorded operators that are neither RepOps, nor communication (c10d: moves bytes), nor
    a justified exception, nor integer work."""
    return {op: n for op, n in counts.items() if not op.startswith(("repops::", "c10d::"))
            and op not in allowed and not op.endswith(" (integers)")}


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
def built_and_step_ops(corpus):
    """({name: operator counts of building the tiny model with STEPS[name]}, {name: those of its
    first training step}): the step runs under the contract's guard (guard.Guard.step) inside the
    recorder, which sees what the guard lets through."""
    built, steps = {}, {}
    for name, flags in STEPS.items():
        cfg = config.parse_config([*TINY, f"--data_dir={corpus}", *flags])
        tokens = data.TokenData(corpus, cfg.seed)
        with OpRecorder() as rec:
            state = train.TrainState(cfg, tokens.vocab_size)
        built[name] = rec.counts
        with OpRecorder() as rec:
            train.train_step(state, tokens, cfg)
        assert state.step == 1
        steps[name] = rec.counts
    return built, steps


@pytest.fixture(scope="module")
def step_ops(built_and_step_ops):
    return built_and_step_ops[1]


@pytest.mark.parametrize("name", STEPS)
def test_building_the_model_is_repops_or_justified(built_and_step_ops, name):
    counts = built_and_step_ops[0][name]
    assert "repops::normal" in counts, report(counts)
    assert not violations(counts), f"floating-point work outside RepOps: {violations(counts)}\n" + report(counts)


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


class StockModel(nn.Module):
    """A small GPT-2-style model written with stock PyTorch, as a user writes one: the data movement
    of guard.ALLOWED that stock models need (a QKV split, a causal mask, embeddings, a slice, a
    selected row and a new leading dim, F.dropout's CPU form, nn.init's constants, torch.full,
    torch.triu, masked_fill with a tensor value, flip, roll, repeat)."""

    def __init__(self, vocab=64, d=32, T=16):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(T, d)
        self.ln, self.qkv, self.head = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, vocab, bias=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe.weight[:T][None]             # its backward: aten::squeeze.dim
        q, k, v = self.qkv(self.ln(x)).split(x.shape[-1], dim=2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        att = att.masked_fill(torch.tril(torch.full((T, T), 1.0)) == 0, float("-inf"))
        above = torch.triu(torch.full((T, T), 1.0), diagonal=1) == 1   # the same mask, written the other way
        att = att.masked_fill(above, torch.tensor(float("-inf")))
        x = x + F.dropout(F.softmax(att, dim=-1), 0.1, self.training) @ v
        x = torch.where(x > 0, x, torch.full_like(x, 0.1) * x)     # a leaky relu
        x = x + 0.01 * x.flip(-1).roll(1, dims=1).repeat(1, 1, 2)[..., :x.shape[-1]]   # data movement
        logits = self.head(x)
        last = logits[:, -1]                                       # a loss term on the last position
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1)) + 0.01 * (last * last).mean()


@pytest.fixture(scope="module")
def stock_ops():
    """Operator counts of building StockModel under the guard, of its probe (forward and backward)
    and of an evaluation (train.evaluate's float() of the loss, under the mode)."""
    g = guard.Guard(seed=5)
    with OpRecorder() as rec:
        with g.construction():
            model = StockModel()
        idx = torch.randint(0, 64, (2, 16))
        g.probe(lambda: model(idx, torch.roll(idx, 1, 1)), list(model.parameters()), step=1)
        with torch.no_grad(), g.inference():
            float(model.eval()(idx, torch.roll(idx, 1, 1)))
    assert g.stock
    return rec.counts


@pytest.fixture(scope="module")
def allreduce_ops():
    """Operator counts of TreeFold's all-reduce, what a step on R > 1 ranks adds to one rank's
    (its buffers, its exchanges, its adds), under the guard's mode: on a one-process gloo group,
    which runs the same code with itself as the only peer (torch refuses a batch of no
    point-to-point operations: here it is nothing to wait for)."""
    import torch.distributed as dist
    import treefold
    batch = dist.batch_isend_irecv
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    dist.batch_isend_irecv = lambda ops: batch(ops) if ops else []
    try:
        fold = treefold.Fold(3, 1, 0)
        for _ in fold.leaves:
            fold.push(torch.rand(10))
        with OpRecorder() as rec, guard.ContractMode():
            treefold.allreduce(fold, align=4)
    finally:
        dist.batch_isend_irecv = batch
        dist.destroy_process_group()
    return rec.counts


def test_every_op_of_an_all_reduce_is_repops_or_justified(allreduce_ops):
    assert any(op.startswith("c10d::") for op in allreduce_ops), report(allreduce_ops)
    assert not violations(allreduce_ops), report(allreduce_ops)


def test_no_exception_is_stale(built_and_step_ops, sample_ops, stock_ops, allreduce_ops):
    used = set().union(*built_and_step_ops[0].values(), *built_and_step_ops[1].values(), *sample_ops.values(),
                       stock_ops, allreduce_ops)
    assert set(ALLOWED) <= used, f"exceptions no program needs: {sorted(set(ALLOWED) - used)}"


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
    bad = violations(counts, GENERATE_ALLOWED)
    assert not bad, f"floating-point work outside RepOps in a sample: {bad}\n" + report(counts)


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
