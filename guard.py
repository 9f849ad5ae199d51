"""The contract's guard: inside a step, every floating-point operator is RepOps, a stock operator
that the contract maps onto RepOps kernels (stockops.py), or data movement; anything else stops
the program with one line, before a record is written.

    import guard
    g = guard.Guard(seed=1337)
    with g.construction():                        # nn.init.normal_ & co. become Philox draws
        model = Model(cfg, seed=1337)
    g.probe(lambda: model(x, y, rng=(1, 0)), params, step=1)   # ContractError: the refusal line
    with g.step(1):                               # the mode: the stock model's steps, a pure one's first
        with g.micro_batch(1, 0):                 # keys F.dropout's Philox mask (step, micro-batch)
            model(x, y, rng=(1, 0)).backward()
    with g.inference():                           # evaluation, a sample's decode: a stock model's
        ids = model.generate(prompt, 50, seed=7)

The mechanism is a TorchDispatchMode (torch.utils._python_dispatch), ContractMode below, scoped to
what runs inside it. It sits below autograd, so the backward operators autograd runs for a stock
forward (aten::gelu_backward) and autograd's own sums of gradient contributions (aten::add) reach
it too. Each operator that reaches it is a RepOps kernel (repops::*, passed), communication
(c10d::*, passed: TreeFold's all-reduce moves bytes, its additions are RepOps), an ATen operator of
stockops.MAPPED (run as its RepOps composition, contract §12), an entry of ALLOWED below (data
movement, selections and constants, each with the reason it computes no new float value; a copy
only where its dtype conversion keeps every value, exact_cast), an operator with no float tensor
among its operands and results (integer and bool work is exact; torch's random numbers excepted),
or refused: ContractError, whose message is the refusal line (the model's line, the operator,
what to use instead).

When it runs (docs/changing-the-model.md has the measured cost): a pass-through mode costs a few
microseconds per operator, about 10-20% of a default step, against a budget of 2%. So:
- Guard.probe, before a program writes anything (train.py before the run directory, audit.py
  and the micro-batch audit before their replay, sample.py before its decode, which it also
  tries on two tokens under the mode): one forward and backward of the model on one sequence
  under the mode, with anomaly mode on so that a backward operator is traced to the forward line
  that recorded it. It classifies the model: pure RepOps (no mapped operator seen) or stock (some
  seen); anything unmapped is refused.
- A stock model runs every step, evaluation and sample under the mode (the mapping is needed
  for its bits): Guard.step, Guard.inference; train.py checks its evaluation and sample with the
  probe (train.probe_inference).
- A pure model runs the first step each process takes under the mode (so that the fold, clip and
  AdamW, which users edit too, are checked before the process publishes its first record), then
  without it. A checked step that maps an operator makes the model stock from then on. The hole:
  a pure model whose later steps take another code path is not checked by the trainer there.
- The audit's replay (train.replay) runs every step under the mode (Guard.every_step), so that
  it never vouches for a step that ran an operator outside the contract, whichever step of its
  replay that is; it pays the mode's cost on each replayed step.
"""
import collections
import contextlib
import math
import os
import re
import sys
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import stockops
from config import UsageError

ROOT = os.path.dirname(os.path.abspath(__file__))
GUIDE = "docs/changing-the-model.md"

# Every ATen operator that passes unchanged, and why it computes no new float value. Kept to what
# the programs run (tests/test_guard.py reports an entry that none of its recorded programs uses).
ALLOWED = {
    # views: a tensor's shape or strides over the same storage
    "aten::view": "reinterprets a tensor's shape over the same storage",
    "aten::_unsafe_view": "reshape of a strided tensor: a view of the copy clone just made",
    "aten::t": "a transposed view of a weight matrix",
    "aten::transpose.int": "a transposed view (matmul operands and their backward)",
    "aten::permute": "a view reordering the attention heads' dimensions",
    "aten::select.int": "a view of one element (the loss at the end of the folded vector)",
    "aten::slice.Tensor": "a view of a range (input/target windows, each parameter's gradient)",
    "aten::split_with_sizes": "views of q, k and v inside the fused QKV projection",
    "aten::split.Tensor": "views of q, k and v of a stock model's one QKV linear",
    "aten::expand": "a broadcast view (an int8 step size per row; a stock model's broadcasting and "
                    "the backward of a sum or mean)",
    "aten::unsqueeze": "a view with a new dim of size 1 (row_softmax's row sums as a column)",
    "aten::squeeze.dim": "a view without a dim of size 1 (x.squeeze(d); the backward of x.unsqueeze(d) "
                         "and x[None])",
    "aten::alias": "a slice of the whole KV cache (every position filled): a view",
    "aten::unbind.int": "rows of a TreeFold all-reduce buffer (chunks, all-gather slots): views",
    "aten::detach": "an alias without autograd history",
    # copies and constants
    "aten::clone": "contiguous() and reshape of strided views: copy bytes to a dense layout",
    "aten::cat": "split's backward: lays the q, k, v gradients side by side; and the loss and "
                 "gradient norm side by side for the step's one host read (copies)",
    "aten::stack": "the dead-tensor check's P flags side by side (copies)",
    "aten::copy_": "each parameter's gradient, and the loss, into its slice of the flat buffer",
    "aten::_to_copy": "a device move, or a dtype conversion that keeps every value (exact_cast, or an "
                      "integer tensor within 2^24 to float32): the dead-tensor check's flags, bool -> "
                      "float32 0.0/1.0",
    "aten::embedding": "a stock model's token and position embeddings: rows copied",
    "aten::empty.memory_format": "allocates the flat gradient buffer (no values are computed)",
    "aten::empty_like": "allocates F.dropout's mask before bernoulli_ fills it (CPU)",
    "aten::new_empty": "allocates TreeFold's receive and all-gather buffers (the transport fills them)",
    "aten::new_zeros": "TreeFold's all-reduce chunks: +0.0 past the gradient's end, cut off after the sum",
    "aten::lift_fresh": "torch.from_numpy of the int64 token windows (wraps a buffer)",
    "aten::ones_like": "autograd's seed gradient d loss / d loss = 1.0 (writes a constant)",
    "aten::ones": "constant 1.0 tensors: the norm weights at init, a causal mask's source",
    "aten::full": "a constant tensor (torch.full): writes f32(value)",
    "aten::full_like": "a constant tensor shaped like another (torch.full_like): writes f32(value)",
    "aten::zeros": "constant +0.0 tensors: the int8 step sizes before their init",
    "aten::zeros_like": "the +0.0 gradient of where's unselected branch (writes a constant)",
    "aten::fill_.Scalar": "nn.init.ones_ / constant_ at init: writes one value, f32(value)",
    "aten::zero_": "nn.init.zeros_ at init: writes +0.0",
    # selections: each output is one of the inputs (or a constant), chosen by a comparison
    "aten::repeat": "x.repeat(...): copies of x side by side (its backward sums them: a mapped sum)",
    "aten::flip": "x.flip(dims): elements in reverse order (a copy)",
    "aten::roll": "x.roll(shifts, dims): elements shifted cyclically (a copy)",
    "aten::tril": "a causal mask: the lower triangle kept, +0.0 above",
    "aten::triu": "a causal mask's complement: the upper triangle kept, +0.0 below",
    "aten::masked_fill.Scalar": "writes f32(value) where a mask is set (-inf above the diagonal; its "
                                "backward writes +0.0 there)",
    "aten::masked_fill.Tensor": "masked_fill with a one-element tensor as the value: writes f32(value)",
    "aten::where.self": "picks each element from one of two tensors by a bool condition",
    "aten::slice_backward": "the gradient of a slice: +0.0 outside it, the slice's gradient copied in",
    "aten::select_backward": "the gradient of one selected row: +0.0 elsewhere, the row's gradient copied in",
    "aten::scalar_tensor": "the +0.0 of where's backward for the unselected branch (a constant)",
    "aten::any": "the dead-tensor check: does a parameter's gradient have an element that is not "
                 "+-0.0 (comparisons with zero, no arithmetic)",
    "aten::argmax": "the sampled token: the index of the largest score (a selection, on the host)",
    "aten::_local_scalar_dense": "float() of a one-element tensor: a host read (an evaluation's loss)",
}

# The operators of random numbers outside the contract: what the refusal suggests instead.
TORCH_RNG = ("normal", "uniform", "bernoulli", "rand", "randn", "randint", "randperm", "multinomial",
             "exponential", "random", "geometric", "cauchy", "log_normal", "poisson", "native_dropout",
             "rand_like", "randn_like", "randint_like")
INSTEAD = {
    "dtype": stockops.F32_ONLY,
    "rng": "draw with repops.normal / repops.dropout, or use F.dropout in the step and nn.init.normal_ / "
           "uniform_ at construction (both mapped onto Philox)",
    "other": "compose it from the mapped operators or write a RepOps kernel",
}


class ContractError(UsageError):
    """The refusal: one line, `<where> runs <operator> outside the contract; <instead> (GUIDE)`."""


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


def _dtype(dtype):
    return str(dtype).removeprefix("torch.")


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


# ------------------------------------------------------------------ where an operator came from
_SKIPPED = (os.path.dirname(torch.__file__) + os.sep, os.path.join(ROOT, "guard.py"),
            os.path.join(ROOT, "stockops.py"), os.path.dirname(contextlib.__file__) + os.sep)


def _shown(path, line):
    path = os.path.abspath(path)
    return f"{os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path}:{line}"


def _users_line(frames):
    """file:line of the innermost frame outside torch, the standard library, guard.py and
    stockops.py; frames are (path, line), innermost first."""
    for path, line in frames:
        if not os.path.abspath(path).startswith(_SKIPPED):
            return _shown(path, line)
    return None


def where_from():
    """Where the operator now dispatched comes from: the user's line (model.py:212); in backward
    the forward line that recorded its autograd node (anomaly mode's trace, during the probe),
    else the node's name."""
    node = torch._C._current_autograd_node()
    if node is None:
        frame, frames = sys._getframe(1), []
        while frame is not None:
            frames.append((frame.f_code.co_filename, frame.f_lineno))
            frame = frame.f_back
        return _users_line(frames) or "a step"
    trace = node.metadata.get("traceback_") if hasattr(node, "metadata") else None
    if trace:
        frames = [(m.group(1), int(m.group(2))) for entry in reversed(trace)
                  for m in [re.search(r'File "([^"]+)", line (\d+)', entry)] if m]
        line = _users_line(frames)
        if line:
            return f"{line} (its backward)"
    return f"the backward of {node.name()}"


# ------------------------------------------------------------------ the mode
class ContractMode(TorchDispatchMode):
    """RepOps passes, stockops.MAPPED runs as RepOps, ALLOWED passes, anything else is refused
    (ContractError). step, micro: the micro-batch whose F.dropout masks it keys (contract §12.7);
    construction: a model is being built (its initialization draws are mapped, stockops.INIT);
    exact: a matmul is the exact one (contract §11). mapped counts the mapped operators it ran."""

    def __init__(self, seed=0, exact=False, step=None, micro=None, construction=False):
        super().__init__()
        self.seed, self.exact = seed, exact
        self.step, self.micro, self.sites = step, micro, 0
        self.draws = 0 if construction else None
        self.mapped = collections.Counter()

    def key(self, step, micro):
        """Key the next dropout sites by this micro-batch (None: no micro-batch runs)."""
        self.step, self.micro, self.sites = step, micro, 0

    def dropout_counters(self):
        """(c1, c2) of the next dropout site of this micro-batch's forward (contract §12.7)."""
        if self.step is None or self.micro is None:
            raise stockops.Unmapped("with no step to key its mask", "dropout runs in training steps only "
                                    "(model.eval(), or F.dropout(x, p, self.training), for evaluation and sampling)")
        if torch._C._current_autograd_node() is not None:
            raise stockops.Unmapped("while backward recomputes the forward (activation checkpointing: the "
                                    "dropout sites' ordinals would move)", "use repops.dropout with its own "
                                    "counters, or no activation checkpointing around dropout")
        if self.sites >= 1 << 16 or not 0 <= self.micro < 1 << 16:
            raise stockops.Unmapped("at more than 65536 sites, or micro-batch 65536 and beyond")
        site, self.sites = self.sites, self.sites + 1
        return self.step + stockops.DROPOUT_C1, (self.micro << 16) | site

    def init_draw(self):
        """The ordinal of this initialization draw (normal_, uniform_) in the model's construction."""
        draw, self.draws = self.draws, self.draws + 1
        return draw

    def refusal(self, name, form=None, instead=None):
        """The ContractError of operator `name` (in the form `form`, e.g. "on float64")."""
        base = name.removeprefix("aten::").split(".")[0].rstrip("_")
        instead = instead or INSTEAD["rng" if base in TORCH_RNG else "other"]
        return ContractError(f"{where_from()} runs {name}{' ' + form if form else ''} outside the contract; "
                             f"{instead} ({GUIDE})")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.name()
        if name.startswith(("repops::", "c10d::")):     # RepOps kernels; communication moves bytes
            return func(*args, **kwargs)
        mapping = stockops.MAPPED.get(name) or (stockops.INIT.get(name) if self.draws is not None else None)
        if mapping is not None:
            try:
                out = mapping(self, *args, **kwargs)
            except stockops.Unmapped as e:
                raise self.refusal(name, e.form, e.instead) from None
            if out is not stockops.PASS:
                self.mapped[name] += 1
                return out
            out = func(*args, **kwargs)          # integer or bool arithmetic: exact
            if any(t.is_floating_point() for t in _tensors(out)):
                raise self.refusal(name, "with a float result from integers")
            return out
        if name not in ALLOWED:
            base = name.removeprefix("aten::").split(".")[0].rstrip("_")
            if base in TORCH_RNG or any(t.is_floating_point() for t in _tensors([args, list(kwargs.values())])):
                raise self.refusal(name)
            out = func(*args, **kwargs)         # no float operand: integer or bool work, exact
            if any(t.is_floating_point() for t in _tensors(out)):
                raise self.refusal(name)
            return out
        out = func(*args, **kwargs)
        if name in ("aten::_to_copy", "aten::copy_"):
            source = args[0] if name == "aten::_to_copy" else args[1]
            src, dst = source.dtype, out.dtype
            # an integer tensor whose values float32 holds (x.float() of positions) converts, as an
            # operand of a mapped operator does (contract §12)
            if not exact_cast(src, dst) and not (dst == torch.float32 and not src.is_floating_point
                                                 and stockops.fits_f32(source)):
                beyond = "" if src.is_floating_point or dst != torch.float32 else " beyond 2^24"
                raise self.refusal(name, f"{_dtype(src)} -> {_dtype(dst)}{beyond}", INSTEAD["dtype"])
        for t in _tensors(out):
            if t.is_floating_point() and t.dtype != torch.float32:
                raise self.refusal(name, f"on {_dtype(t.dtype)}", INSTEAD["dtype"])
        return out


# ------------------------------------------------------------------ when the mode runs
class Guard:
    """The guard of one model in one process: what its probe found (stock: some mapped operator
    runs, so every step, evaluation and sample runs under the mode) and which step it checks
    (the first the process takes). seed: the run's (Philox key of stock dropout and init);
    exact: the run's matmul is the exact one (contract §11)."""

    def __init__(self, seed, exact=False):
        self.seed, self.exact = seed, exact
        self.stock = False
        self.every_step = False     # an audit's replay: every step under the mode, whatever the model
        self.first_step = None
        self.mode = None            # the mode of the step now running, if any

    def construction(self):
        """The mode a model is built under: its initialization draws become Philox (contract §12.7)."""
        return ContractMode(self.seed, self.exact, construction=True)

    def probe(self, loss_of, params, step):
        """Run loss_of() (the model's loss on one sequence of the step `step`, micro-batch 0) and
        its gradients (torch.autograd.grad: no .grad written) under the mode with anomaly mode on;
        ContractError if anything is refused. Returns the mapped operators seen (their counts):
        none for a pure RepOps model; the model is stock otherwise."""
        mode = ContractMode(self.seed, self.exact, step, 0)
        with warnings.catch_warnings():
            # anomaly mode warns with the forward trace of a failing backward: the refusal names its line
            warnings.simplefilter("ignore")
            with torch.autograd.detect_anomaly(check_nan=False), mode:
                grads = torch.autograd.grad(loss_of(), params, allow_unused=True)
        del grads
        self.stock = self.stock or bool(mode.mapped)
        return mode.mapped

    @contextlib.contextmanager
    def step(self, step):
        """The mode around step `step`, where it runs: every step of a stock model or of an audit's
        replay (every_step), the first step this process takes of a pure one (a step inside which
        it already runs: nothing more)."""
        if self.first_step is None:
            self.first_step = step
        if self.mode is not None or not (self.stock or self.every_step or step == self.first_step):
            yield
            return
        self.mode = ContractMode(self.seed, self.exact, step)
        try:
            with self.mode:
                yield
            self.stock = self.stock or bool(self.mode.mapped)
        finally:
            self.mode = None

    @contextlib.contextmanager
    def micro_batch(self, step, micro):
        """Inside step `step` (Guard.step, opened here when it is not open yet): key the mode's
        dropout sites by (step, micro) for this micro-batch's forward and backward."""
        with self.step(step):
            if self.mode is None:
                yield
                return
            self.mode.key(step, micro)
            try:
                yield
            finally:
                self.mode.key(step, None)

    def inference(self, always=False):
        """The mode around an evaluation or a sample: for a stock model (always: any model)."""
        return ContractMode(self.seed, self.exact) if self.stock or always else contextlib.nullcontext()
