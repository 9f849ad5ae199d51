"""Train a Llama-style model so that every step is bit-reproducible and published as a hash chain.

    python data.py                                   # once: prepare data/shakespeare
    python train.py                                  # ~3 minutes on a 2-core CPU
    python train.py --max_steps=50 --run_dir=runs/x  # override any config key
    python train.py --run_dir=runs/x                 # resume runs/x with its own config
    torchrun --nproc_per_node=4 train.py             # 4 ranks: the same chain, byte for byte
    python audit.py --step 120                       # replay a step and check it
    python train.py --init_from=models/x --data_dir=data/x   # fine-tune a Hugging Face Llama (hfllama.py)
    python train.py --run_dir=runs/y --init_from=runs/x@50   # a new run from runs/x's state after step 50 (lineage.py)

Every step: N micro-batches (a pure function of data, seed, step, index), each giving a fresh
gradient; the gradients are summed with TreeFold's fixed tree (treefold.py), clipped, and
applied with AdamW, all in RepOps. The state hash (parameters, Adam moments, step) goes into
runs/<name>/chain.jsonl; checkpoints every `checkpoint_every` steps (rundir.py lays out the
directory). With --hash_async (the CUDA default) step N is hashed while step N+1 computes and
is published after it (snapshot.py); a record never exists before its state was hashed. Killed
at any moment, `python train.py --run_dir=DIR` resumes from the latest checkpoint that verifies
and re-derives the same chain, with the run's own config (configure: the genesis record's
decisive keys, config.json's bookkeeping); it refuses a run directory that another trainer holds,
a decisive key given with another value (naming both), and another corpus or code. Ctrl-C or
SIGTERM stops it with one line: the last step in the chain and the command that resumes it
(interrupted, exit 130 / 143). The steps run on the thread count threads.py measures fastest.
Each step record also seals a digest of the step's final gradient and post-step state with the
run's secret (step_commit, receipts.py),
so that auditors can prove they replayed the whole step; every `anchor_every` steps the chain
head is appended to anchors.jsonl, for the publisher to copy out of the run, signed by the
publisher's SSH key with --publisher_key (the genesis record then names its public key).
A state larger than memory (--preset=open1b) trains and replays with recompute and offload
(docs/scale.md): per-block recomputation, Adam moments and a waiting gradient on disk.
`train_step` below is the one step function: audit.py imports it.

The step, the records it publishes, and the loop and resume that publish them are this one file,
so a reader sees the whole of what a record vouches for: run() opens the run (open_run), then
train_steps runs the steps and a Publisher publishes each (step_line is the per-step log line:
step i/N, loss, lr, norm, ms, tokens/s, an ETA from the mean of the last 20 steps' times, the
state hash's prefix), and log_end prints the final state hash in full and the command that audits
the last step. train.log gets every line; on a TTY the step lines are one line that each step
rewrites, kept at every evaluation (Logger).
Checkpoint files and the run directory are rundir.py, hashing hashchain.py and snapshot.py, the
config and its schedules config.py.
"""
import collections
import contextlib
import dataclasses
import datetime
import hashlib
import json
import math
import os
import resource
import sys
import time
from pathlib import Path

from config import (OPTIONAL, UsageError, answered_help, decisive_config, differences, duration, given_keys, lr_at,
                    micro_batches_at, out_of_memory, parse_config, phase_counts, python_command, resolve,
                    stop_on_sigterm, stopped_by, validate)

if __name__ == "__main__" and answered_help(sys.argv[1:]):
    sys.exit(0)                 # --help answers here, before torch is imported

import torch  # noqa: E402  (below --help's answer, above)
import torch.distributed as dist  # noqa: E402

import deadcheck  # noqa: E402
import guard
import hashchain
import hfllama
import lineage
import offload
import quant
import receipts
import repops
import rundir
import signing
import snapshot
import threads
import treefold
import units
from data import DataError, TokenData, batch_digest
from model import Llama, ModelConfig, param_shapes
from tokenizer import TokenizerError, get_tokenizer


class StepRefused(Exception):
    """A step produced a non-finite loss, gradient norm or state; nothing of it was written."""


class ReproducibilityError(Exception):
    """Ranks disagree on the state, or a re-derived step differs from its chain record."""


def model_config(cfg, vocab_size):
    """The model of cfg; vocab_size is the corpus's, used when cfg.vocab_size is 0 (unresolved)."""
    names = {f.name for f in dataclasses.fields(ModelConfig)} - {"vocab_size"}
    return ModelConfig(vocab_size=cfg.vocab_size or vocab_size, **{k: getattr(cfg, k) for k in names})


def memory_limit():
    """Bytes this process can ever hold: the machine's memory and swap, or its address-space
    limit (RLIMIT_AS: `ulimit -v`) if lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if os.path.exists("/proc/meminfo"):
        with open("/proc/meminfo") as f:
            swap = [int(line.split()[1]) for line in f if line.startswith("SwapTotal:")]
        total += 1024 * sum(swap)
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return total if soft == resource.RLIM_INFINITY else min(total, soft)


def check_memory(cfg, vocab_size):
    """Refuse (UsageError) a model whose state cannot fit this machine's memory, before any of
    it is allocated: float32 parameters and, unless offloaded, their two Adam moments (a lower
    bound: a step needs gradients and activations too; a step that runs out is out_of_memory's)."""
    n = sum(math.prod(s) for s in param_shapes(model_config(cfg, vocab_size)).values())
    need, limit = 4 * n * (1 if cfg.offload else 3), memory_limit()
    if need > limit:
        held = "parameters" if cfg.offload else "parameters and two Adam moments"
        raise UsageError(f"not enough memory for this model on this machine: its state ({n:,} float32 {held}) "
                         f"is {need / 2**30:,.1f} GiB, and this process can hold {limit / 2**30:,.1f} GiB "
                         "(memory and swap, or its address-space limit)")


def code_digest():
    """SHA-256 over the sources that decide the math, and the kernel build flags."""
    root = os.path.dirname(os.path.abspath(__file__))
    files = ["model.py", "repops.py", "treefold.py", "offload.py", "train.py", "data.py", "hashchain.py",
             "rundir.py", "quant.py", "repops_mps.py", "config.py", "prepare.py", "units.py", "guard.py",
             "stockops.py"]
    files += [os.path.relpath(p, root) for p in repops.KERNEL_FILES]
    h = hashlib.sha256(" ".join(repops.CPU_FLAGS).encode())
    for rel in sorted(files):
        with open(os.path.join(root, rel), "rb") as f:
            h.update(rel.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def other_code(genesis, run_dir):
    """The sentence that says this is not the code a run was started by (its genesis
    code_digest), or None: train.py's resume and the audit say it alike, as bad input."""
    if genesis.get("code_digest") == code_digest():
        return None
    return (f"{run_dir} was started by different code: its genesis code_digest is {genesis.get('code_digest')}, "
            f"this code's is {code_digest()}")


# ----------------------------------------------------------------------------- state
class TrainState:
    """Everything that decides the future: parameters (quantizer step sizes included), Adam
    moments of the trained ones (a re-pinned step size has none), the step counter. With
    cfg.offload the moments live in temp files (offload.MomentStore), mapped one tensor at a
    time by whoever uses them (AdamW, the state hash, the checkpoint writer). moments=False:
    parameters only, for a micro-batch's gradient (the micro-batch audit: load_params)."""

    def __init__(self, cfg, vocab_size, device="cpu", moments=True):
        self.device = torch.device(device)
        check_memory(cfg, vocab_size)
        # Canonical init runs on the CPU kernels, under the contract's guard (a stock model's
        # nn.init draws become Philox, guard.py); the bits then move to the device unchanged.
        self.guard = guard.Guard(cfg.seed, exact=cfg.matmul == "exact")
        with self.guard.construction():
            model = Llama(model_config(cfg, vocab_size), seed=cfg.seed)
        self.model = model.to(self.device)
        self.params = self.model.named_tensors()           # canonical (sorted) order
        trained = [n for n, p in self.params.items() if p.requires_grad]   # the flat gradient's order
        self.trained = trained
        self.offloaded = cfg.offload
        if not moments:
            self.m, self.v = {}, {}
        elif cfg.offload:
            shapes = {n: self.params[n].shape for n in trained}
            self.m, self.v = offload.MomentStore(shapes), offload.MomentStore(shapes)
        else:
            self.m = {n: torch.zeros_like(self.params[n]) for n in trained}
            self.v = {n: torch.zeros_like(self.params[n]) for n in trained}
        self.step = 0
        heads = (cfg.n_head, self.model.n_kv_head, cfg.d_model // cfg.n_head)   # per-head units too
        self.dead = deadcheck.DeadTensors(trained, cfg.dead_tensor_steps, heads)
        self.copy_done = None    # CUDA event: an asynchronous host copy of the state (snapshot.py)
        self.grad_leaf = snapshot.LeafLater(overlap=hash_overlaps(cfg))   # the steps' grad_root

    def wait_for_snapshot(self):
        """Make the update wait until a pending asynchronous copy of the state has read it."""
        if self.copy_done is not None:
            torch.cuda.current_stream(self.device).wait_event(self.copy_done)
            self.copy_done = None

    def tensors(self):
        """{name: tensor} of the whole state; each value is fetched when it is read (an
        offloaded moment is mapped then), so reading them one by one holds one at a time."""
        kinds = {"params": self.params, "adam_m": self.m, "adam_v": self.v}

        def get(name):
            if name == "step":
                return torch.tensor([self.step], dtype=torch.int64)
            kind, _, n = name.partition(".")
            return kinds[kind][n].detach()
        names = [f"{k}.{n}" for k in kinds for n in self.params if k == "params" or n in self.m]
        return offload.LazyTensors(["step"] + names, get)

    def load(self, tensors):
        """Copy a verified checkpoint's tensors in; StateMismatch if they are not the state of
        this config's model (names, shapes, dtypes)."""
        mine = self.tensors()
        for name in sorted(set(mine) | set(tensors)):
            a, b = mine.get(name), tensors.get(name)
            if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype:
                raise hashchain.StateMismatch(
                    f"checkpoint tensor {name} does not fit the state of the run's config "
                    f"(checkpoint {None if b is None else list(b.shape)}, model "
                    f"{None if a is None else list(a.shape)})", name)
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(tensors["params." + n])
                if n in self.m:
                    self.m[n].copy_(tensors["adam_m." + n])
                    self.v[n].copy_(tensors["adam_v." + n])
        self.step = int(tensors["step"][0])

    def load_params(self, tensors, step):
        """Copy in the parameters (params.*) of the state after `step`, already verified against
        that step's state hash (rundir.proved_tensors); StateMismatch if one is missing or does
        not fit."""
        for n, p in self.params.items():
            t = tensors.get("params." + n)
            if t is None or t.shape != p.shape or t.dtype != p.dtype:
                raise hashchain.StateMismatch(f"tensor params.{n} is missing or does not fit the run's "
                                              f"model ({None if t is None else list(t.shape)})", "params." + n)
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(tensors["params." + n])
        self.step = step

    def flat_numel(self):
        """P + 1: the elements of a flat micro-batch gradient with its loss."""
        return sum(self.params[n].numel() for n in self.trained) + 1

    def hash(self):
        return hashchain.state_hash(self.tensors())

    def n_params(self):
        return sum(p.numel() for p in self.params.values())


# ----------------------------------------------------------------------------- the step
def micro_batch_gradient(state, data, cfg, step, micro, witness=None):
    """Flat [P + 1] tensor: micro-batch `micro`'s gradient (parameter order), then its loss.
    witness: a tensor hook given the gradient at the residual stream after block 0 (units.StepUnits).

    Each parameter's gradient is copied into its slice of the one buffer as soon as autograd has
    produced it (a post-accumulate-grad hook), then released: memory holds the buffer and the
    gradients in flight, never all of them twice (as concatenating them at the end would).
    Every parameter is used once in the forward, so autograd hands each gradient over as it
    is, with no accumulation of its own."""
    # host tensors: repops checks their range on the host, once, and moves them to the device
    x, y = data.micro_batch("train", step, micro, cfg.micro_batch_size, cfg.seq_len)
    params = [state.params[n] for n in state.trained]
    flat = torch.empty(sum(p.numel() for p in params) + 1, device=state.device)
    filled = []

    def take(dst):
        def hook(p):
            dst.copy_(p.grad)
            p.grad = None
            filled.append(dst)
        return hook

    offset, hooks = 0, []
    for p in params:
        hooks.append(p.register_post_accumulate_grad_hook(take(flat[offset:offset + p.numel()].view(p.shape))))
        offset += p.numel()
    state.model.witness = witness
    try:
        with state.guard.micro_batch(step, micro):      # keys a stock model's dropout (guard.py)
            loss = state.model(x, y, zloss=cfg.zloss, rng=(step, micro))
            loss.backward(inputs=params)
    finally:
        state.model.witness = None
        for h in hooks:
            h.remove()
    if len(filled) != len(params):
        raise RuntimeError(f"{len(params) - len(filled)} parameters got no gradient")
    flat[-1:].copy_(loss.detach().reshape(1))
    return flat


def train_step(state, data, cfg, rank=0, world=1):
    """Advance `state` by one step; returns the step's record fields. Shared with audit.py.

    Rank r folds its own block of micro-batches into the largest subtrees of the step's tree
    inside it; with world > 1 TreeFold's all-reduce completes the tree, so every rank (and a
    single-device replay) ends with the same bits for any world size that divides N. Buffers of
    P floats are released as soon as they are used (at most two are alive at once after the
    fold, plus one spilled to disk with cfg.offload while the next micro-batch runs). With
    cfg.unit_commits every piece of the step (each micro-batch's gradient and witness, each
    node of the tree) is hashed as it is formed (units.StepUnits); fields["units"] collects them.
    """
    step = state.step + 1
    n = micro_batches_at(cfg, step)         # the step's N (its phase), hence its tree
    state.model.train()
    # the pieces are hashed beside the step where the state hash is (hash_overlaps: a GPU step
    # leaves the host's cores idle), else in the step's own thread, chunks in parallel
    pieces = (units.StepUnits(step, n, state.flat_numel(), world, rank, sync=cfg.offload or not hash_overlaps(cfg))
              if cfg.unit_commits else None)
    fold = treefold.Fold(n, world, rank, spill=cfg.offload, observe=pieces and pieces.node)
    # under the contract's guard where it runs: a stock model's every step, a pure model's first (guard.py)
    with state.guard.step(step):
        for micro in fold.leaves:
            grad = micro_batch_gradient(state, data, cfg, step, micro, pieces and pieces.witness(micro))
            if pieces:
                pieces.leaf(micro, grad)
            fold.push(grad)
            del grad
        sums = [treefold.allreduce(fold, **({"align": units.CHUNK, "observe": pieces.row} if pieces else {}))
                if world > 1 else fold.result()]
        del fold                            # its frontier holds the one-rank total
        fields = update(state, cfg, sums)
    if pieces:
        fields["units"] = pieces
    return fields


def update(state, cfg, sums):
    """The update unit: step state.step + 1 from S, the sum of its micro-batch gradients over
    the tree (flat [P + 1], the loss last), handed over as the one item of the list `sums`,
    which is emptied so that no caller keeps the buffer alive. Mean, clip, AdamW, re-pin; returns
    the record fields. Shared by train_step and the update audit (unitaudit.py)."""
    step = state.step + 1
    n, lr = micro_batches_at(cfg, step), lr_at(cfg, step)     # the step's phase and schedule
    # Contract §4.4: one multiply by f32(1/N) (exact when N is a power of two, a fixed rounding otherwise).
    mean = repops.ops.scale(sums.pop(), repops.f32(1.0 / n))
    loss = mean[-1]
    grad, grad_norm = repops.clip_grad(mean[:-1], cfg.grad_clip)
    offset, grads = 0, {}
    for name in state.trained:              # each trained parameter's slice of the flat gradient
        p = state.params[name]
        grads[name] = grad[offset:offset + p.numel()].view(p.shape)
        offset += p.numel()
    read = [loss.reshape(1), grad_norm.reshape(1)]
    nonzero = state.dead.nonzero_flags(grads)
    # The step's one host sync: loss, norm and the dead-tensor check's flags read together.
    loss_f, norm_f, *nonzero = torch.cat(read if nonzero is None else read + [nonzero]).tolist()
    del mean, loss, read
    if not (math.isfinite(loss_f) and math.isfinite(norm_f)):
        raise StepRefused(f"step {step}: loss {loss_f} / gradient norm {norm_f} is not finite; "
                          "the step is refused and nothing of it is written (lower lr?)")
    state.wait_for_snapshot()
    with torch.no_grad():
        state.dead.observe(step, nonzero)
        for name, g in grads.items():
            p = state.params[name]
            repops.adamw_(p.data, g, state.m[name], state.v[name], lr=lr, beta1=cfg.beta1,
                          beta2=cfg.beta2, eps=cfg.adam_eps,
                          weight_decay=cfg.weight_decay if p.dim() >= 2 else 0.0, step=step)
        if cfg.quant == "int8" and cfg.lsq_repin:
            quant.repin(state.model)     # after the update, before the state hash (quant.py)
    state.step = step
    # grad_root: the digest of the final gradient, which only a replay can compute; it keys the
    # post-step state's result_root, which the trainer seals into step_commit (step_record) and an
    # auditor's receipt proves for its key (receipts.py). A Future: on a GPU with hash_async it is
    # hashed from a host copy while the next step runs.
    return {"loss": loss_f, "loss_bits": hashchain.f32_bits(loss_f), "grad_norm": norm_f,
            "grad_norm_bits": hashchain.f32_bits(norm_f), "lr": repops.f32(lr),
            "lr_bits": hashchain.f32_bits(lr), "grad_root": state.grad_leaf.submit("grad", grad)}


def step_record(step, root, data, cfg, fields, run, secret=None, result_root=None, salt=None):
    """The chain record of `step` (everything but prev/record_hash) of the run whose genesis
    record hash is `run`, whose state hashed to `root` and whose train_step returned `fields`.
    A record holds the state's Merkle root, not its leaves (SPEC §12.3: a record's size does not
    grow with the tensor count; a checkpoint's header holds the leaves). `run` binds the record
    to its genesis, so that an auditor who reaches the record from an anchor by its prev links,
    without the records before it, knows the genesis it belongs to (and an anchor, which pins a
    record hash, names its run through it). result_root (the post-step state's keyed root under
    fields["grad_root"], the gradient's leaf hash) is never published: with the step's salt (from
    the run's secret: the trainer; or revealed) the record holds it sealed, step_commit; without
    it (a replay) the record has no step_commit, which only the salt's holder can make. With unit
    commitments (fields["units"], units.StepUnits) the same salt makes units_root (units.py),
    which a replay without it cannot make either."""
    salt = receipts.salt(secret, step) if salt is None and secret is not None else salt
    n = micro_batches_at(cfg, step)
    windows = [data.window("train", step, m, cfg.micro_batch_size, cfg.seq_len) for m in range(n)]
    record = {"kind": "step", "step": step, "run": run, "state_hash": root,
              "batch_digest": batch_digest(windows), **fields}
    record.pop("grad_root").result()         # result_root is keyed by it; never published
    pieces = record.pop("units", None)
    if salt is not None:
        record["step_commit"] = receipts.step_commit(salt, result_root)
    if pieces is not None:                   # None without the salt: a commitment it cannot make
        record["units_root"] = pieces.finish(salt)[0]   # on R ranks: every rank, in step order
    return record


def genesis_record(state, data, cfg, secret=None, init=None, parent=None, publisher=None):
    """The genesis record; with the run's secret (the trainer) it holds secret_commit, which a
    replay cannot compute (the audit checks it is there and well-formed). init: an imported
    initial state's source (hfllama.load_into); parent: the run whose state it continues
    (lineage.load_into); either way the state's tensors are the record's state (and checkpoint
    0). publisher: the publisher's public key ("TYPE BASE64"), which signs the run's anchors
    (SPEC §11.7); absent by default."""
    root, _ = state.hash()
    record = {"kind": "genesis", "step": 0, "spec": hashchain.SPEC, "contract": repops.CONTRACT,
              "config": decisive_config(cfg),
              "code_digest": code_digest(), **data.commitments(),
              "tokenizer": data.manifest["tokenizer"], "vocab_size": data.vocab_size,
              **({"init": init} if init else {}), **({"parent": parent} if parent is not None else {}),
              **({"publisher": publisher} if publisher else {}), "state_hash": root}
    if secret is not None:
        record["secret_commit"] = receipts.secret_commit(secret)
    return record


def genesis(cfg, data, init=None, initial=None, secret=None, parent=None, publisher=None):
    """(state, record, problem) of a replay's step 0 (audit.py): the genesis state of cfg (an
    imported run's, with init its genesis record's source, or a child's, with parent the run it
    continues, is `initial`: its checkpoint 0's verified tensors), the genesis record recomputed
    from it (naming the publisher key the published one names), and what makes `initial` no
    initial state (None if nothing: its step must be 0, and an imported run's moments zero)."""
    state = TrainState(cfg, data.vocab_size, cfg.device)
    problem = None
    origin = "imported (genesis init)" if init is not None else "continued from a parent run (genesis parent)"
    if (init is not None or parent is not None) and initial is None:
        problem = f"the run was {origin} and its initial state, checkpoint 0, is missing or does not match the genesis record"
    elif init is not None or parent is not None:
        try:
            state.load(initial)
            moving = [n for n, t in state.tensors().items() if init is not None and n.startswith("adam_") and t.any()]
            if moving or state.step != 0:
                problem = f"checkpoint 0 is not an initial state: {(moving or ['step'])[0]} is not zero"
        except hashchain.StateMismatch as e:
            problem = f"checkpoint 0: {e.message}"
    return state, genesis_record(state, data, cfg, secret, init=init, parent=parent, publisher=publisher), problem


def replay(state, data, cfg, upto, salt_of, run, around=None, proved=None, chooser=None):
    """Take steps state.step+1 .. upto of the run whose genesis record hash is `run` again as the
    trainer took them (train_step), yielding (step, record, fields) for each: record is
    step_record's, with step_commit (and units_root) where salt_of(step) knows the step's salt
    (the publisher's secret or a revealed salt), else without them. fields["result_root"]: the
    post-step state keyed by grad_root, which a commitment and a receipt need (a pass over the
    state: made where the salt is known, and for step `proved`, the one a receipt proves; else
    None); fields["leaves"]: the state's tensor leaves, which name the first differing tensor.
    around(step): a context manager the step runs in (a trace), or None. chooser: the steps'
    thread count (threads.Chooser; default: measured on the CPU). Every step runs under the
    contract's guard (guard.Guard.every_step): a replay vouches for no step that ran an operator
    outside the contract, whichever of its steps that is."""
    chooser = chooser or threads.Chooser(measure=cfg.device == "cpu")
    state.guard.every_step = True
    try:
        while state.step < upto:
            step = state.step + 1
            with around(step) if around else contextlib.nullcontext():
                fields = chooser.run(lambda: train_step(state, data, cfg))
            salt = salt_of(step)
            root, leaves = state.hash()
            result_root = (hashchain.keyed_state_root(fields["grad_root"].result(), state.tensors())
                           if salt or step == proved else None)
            record = step_record(step, root, data, cfg, fields, run, result_root=result_root, salt=salt)
            yield step, record, {**fields, "result_root": result_root, "leaves": leaves}
    finally:
        chooser.restore()


@torch.no_grad()
def evaluate(state, data, cfg, n_batches=None):
    """The mean validation loss over cfg.eval_batches micro-batches (or the first n_batches)."""
    state.model.eval()
    batches = (data.micro_batch("val", 0, m, cfg.micro_batch_size, cfg.seq_len)
               for m in range(n_batches or cfg.eval_batches))
    with state.guard.inference():                            # a stock model's operators mapped
        losses = [float(state.model(x, y)) for x, y in batches]   # host ids, as in training
    return sum(losses) / len(losses)


def probe(state, data, cfg, step):
    """The contract's probe (guard.Guard.probe) of the model about to take `step`: one forward and
    backward on the first sequence of that step's micro-batch 0, dropout keyed as in the step, no
    gradient written. guard.ContractError (the refusal line) if the model runs an operator outside
    the contract; returns the stock operators it maps (none: a pure RepOps model)."""
    x, y = data.micro_batch("train", step, 0, cfg.micro_batch_size, cfg.seq_len)
    state.model.train()
    return state.guard.probe(lambda: state.model(x[:1], y[:1], zloss=cfg.zloss, rng=(step, 0)),
                             [state.params[n] for n in state.trained], step)


def probe_inference(state, data, cfg, writer):
    """A stock model's evaluation and end-of-run sample run under the mode (guard.Guard.inference),
    so they are checked with the probe, before any file: the evaluation of one micro-batch (where
    the run evaluates) and two decoded tokens (where this rank samples). An operator only they run
    (F.dropout without the training flag, something in generate) is refused here, not at the first
    evaluation after records are published. A pure model evaluates and samples without the mode."""
    if not state.guard.stock:
        return
    if cfg.eval_every:
        evaluate(state, data, cfg, n_batches=1)
    if writer and cfg.sample_tokens:
        x, _ = data.micro_batch("val", 0, 0, cfg.micro_batch_size, cfg.seq_len)
        state.model.eval()
        with state.guard.inference():
            state.model.generate(x[0, :1].tolist(), 2, seed=cfg.seed)
    state.model.train()


def next_step(cfg):
    """The step a run directory goes on with, as far as its chain file tells without reading it (1
    for a new run): the step after its last record, at most max_steps. The probe's tokens."""
    try:
        with open(Path(cfg.run_dir) / "chain.jsonl", "rb") as f:
            records = sum(1 for _ in f)
    except OSError:
        records = 1
    return max(1, min(cfg.max_steps, records))


# ----------------------------------------------------------------------------- run directory
def check_identity(cfg, data, genesis, secret, init, publisher):
    """A resumed run must be the run its chain started: same decisive config, data, code,
    secret (the genesis record's secret_commit), imported source (init) and publisher key."""
    diff = differences(decisive_config(cfg), genesis.get("config", {}))
    if diff:
        key = diff[0]
        raise UsageError(f"{cfg.run_dir} was started with a different config: {key} is "
                         f"{genesis.get('config', {}).get(key, OPTIONAL.get(key))!r} in its genesis record, "
                         f"{decisive_config(cfg).get(key, OPTIONAL.get(key))!r} here; resume with the same "
                         "settings or choose another --run_dir")
    if problem := data.other_corpus(genesis, cfg.run_dir):
        raise UsageError(f"{problem}; resume with the same data")
    if problem := other_code(genesis, cfg.run_dir):
        raise UsageError(f"{problem}; resume it with that code, or start a new --run_dir")
    if genesis.get("secret_commit") != receipts.secret_commit(secret):
        raise UsageError(f"{cfg.run_dir}/{receipts.SECRET} is not the secret the run's genesis record "
                         "commits to (secret_commit): restore the run's secret, or start a new --run_dir")
    if genesis.get("init") != init:
        raise UsageError(f"{cfg.run_dir} was initialized from " + ("other weights (--init_from: the "
                         "source files' SHA-256s differ)" if genesis.get("init") else "its config")
                         + "; resume with the same --init_from")
    named = genesis.get("publisher")
    if named != publisher and named:
        given = f" (--publisher_key is {signing.fingerprint(publisher)})" if publisher else ""
        raise UsageError(f"{cfg.run_dir}'s genesis record names the publisher key {signing.fingerprint(named)}, "
                         f"which signs its anchors: resume with --publisher_key set to that key{given}")
    if named != publisher:
        raise UsageError(f"{cfg.run_dir} was started without a publisher key (its genesis record names none): "
                         "resume without --publisher_key, or start a new --run_dir")


def restore(run, state, upto, log):
    """Load the latest checkpoint at or before `upto` that verifies; returns its step (0: the
    genesis state, re-created from the config and checked against the genesis record). The
    writer moves a checkpoint that fails verification to rejected/ (evidence, never overwritten)."""
    def on_bad(step, path, error):
        if run.writer:
            log(f"warning: skipping checkpoint {path}: {error}; moved to {run.reject_checkpoint(path)}")

    step, tensors = run.latest_checkpoint(upto, on_bad, mmap=state.offloaded)
    if tensors is not None:
        state.load(tensors)
    elif "init" in run.genesis or "parent" in run.genesis:
        raise UsageError(f"{run.dir} has no checkpoint that verifies, and its initial state (imported or a parent "
                         "run's) is only in checkpoint 0: restore checkpoints/step_00000000.safetensors")
    elif state.hash()[0] != run.genesis["state_hash"]:
        raise UsageError("the initial state recomputed from the config does not match the chain's "
                         "genesis record (different code or kernels?)")
    return step


def open_run(cfg, data, state, rank, world, log, init=None, parent=None, signer=None):
    """The run's verified chain, the step to resume from and the run's secret (init, parent: a new
    run's imported source or parent run, for its genesis record). Rank 0 (the writer, which holds
    the run's lock) starts a new run (secret, config.json, genesis record naming signer's public
    key if there is one, checkpoint 0) or repairs a torn chain tail and restores; the other ranks
    then restore the same checkpoint. A chain without its secret is refused: its commitments
    could not go on; so is a resume with another publisher key."""
    writer = rank == 0
    chain_path = Path(cfg.run_dir) / "chain.jsonl"
    if writer and not chain_path.exists():
        chain_path.touch()
    if world > 1 and not writer:
        dist.barrier()                  # rank 0 has written or repaired everything
    run = rundir.Run(cfg.run_dir, writer=writer)
    if run.chain.note:
        log("resume: " + run.chain.note)
    run.chain.verify()
    if len(run.chain) == 0:
        if init:     # the source's config.json, for export.py's max_position_embeddings (hfllama.py)
            hfllama.keep_source_config(run.dir, cfg.init_from, init)
        secret = receipts.make_secret(run.dir)  # before the genesis: no chain exists without it
        hashchain.write_atomically(run.dir / "config.json", json.dumps(dataclasses.asdict(cfg), indent=2).encode())
        run.chain.append(genesis_record(state, data, cfg, secret, init, parent, signer and signer.public_key))
        start = 0
    else:
        run.check_versions(repops.CONTRACT)   # before all else: another contract's run is not ours
        secret = receipts.read_secret(run.dir, "the chain's commitments (step_commit) cannot be "
                                      "continued without it; restore it, or start a new --run_dir")
        if writer:                   # the publisher key is the writer's alone (it signs the anchors)
            check_identity(cfg, data, run.genesis, secret, init, signer and signer.public_key)
        else:
            check_identity(cfg, data, run.genesis, secret, init, run.genesis.get("publisher"))
        start = restore(run, state, min(cfg.max_steps, len(run.chain) - 1), log)
        log(f"resume: from step {start} ({len(run.chain) - 1} steps in the chain)")
        if len(run.chain) - 1 >= cfg.max_steps:
            log(f"{cfg.run_dir} is finished: its chain holds all {cfg.max_steps} steps. To train on from its "
                f"last state, start a new run from it: {python_command()} train.py --run_dir=NEW "
                f"--init_from={cfg.run_dir} --max_steps=N (docs/continuing.md)")
    if writer and start == 0 and 0 not in dict(run.checkpoints()):
        run.save_checkpoint(state.tensors(), run.chain.records[0], state.hash()[1])
    if world > 1 and writer:
        dist.barrier()
    return run, start, secret


class Logger:
    """train.log gets every line. The terminal gets the same lines, but on a TTY the step lines
    (updating=True) are one line that each step rewrites in place; any other line (a validation
    loss, the sample, the end) first keeps the step line it follows, so the terminal shows the
    step line of every evaluation. Redirected output is train.log's lines."""

    def __init__(self, run_dir, enabled, tty=None):
        self.path = os.path.join(run_dir, "train.log") if enabled else None
        self.enabled = enabled
        self.tty = sys.stdout.isatty() if tty is None else tty
        self.line_open = False          # a step line is on the terminal without its newline

    def __call__(self, msg, updating=False):
        if not self.enabled:
            return
        if self.tty and updating:
            sys.stdout.write(f"\r{msg}\x1b[K")         # back to the line's start, the line, erase its old tail
        else:
            sys.stdout.write(("\n" if self.line_open else "") + msg + "\n")
        self.line_open = self.tty and updating
        sys.stdout.flush()
        with open(self.path, "a") as f:
            f.write(msg + "\n")

    def end_line(self):
        """Keep the open step line (before an error is printed, or the program ends)."""
        if self.line_open:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.line_open = False


def check_same_state(root, world):
    """Every rank must hold the same state hash after each step (treefold.py's promise)."""
    mine = torch.frombuffer(bytearray(bytes.fromhex(root)), dtype=torch.uint8)
    gathered = [torch.empty(32, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(gathered, mine)
    roots = [bytes(g.tolist()).hex() for g in gathered]
    if len(set(roots)) != 1:
        raise ReproducibilityError("ranks disagree on the state hash: " + ", ".join(roots))


def publish(chain, record, writer):
    """Append the step's record; a step the chain already holds (re-derived after a resume)
    must equal its published record field for field."""
    step = record["step"]
    if step < len(chain):
        published = {k: v for k, v in chain.records[step].items() if k not in ("prev", "record_hash")}
        mine = json.loads(json.dumps(record))
        if published != mine:
            if [k for k in set(published) | set(mine) if published.get(k) != mine.get(k)] == ["step_commit"]:
                raise ReproducibilityError(f"step {step} re-derived to its record but for step_commit: the "
                                           "run's secret is not the one its chain was made with")
            raise ReproducibilityError(f"step {step} re-derived differently from the chain record: "
                                       "this machine does not reproduce the run (run audit.py)")
    elif writer:
        chain.append(record)


def hash_overlaps(cfg):
    """Hash a step while the next one computes? On CUDA the state crosses to the host anyway
    and the host's cores are idle; on the CPU the hash would take cores from the step."""
    return cfg.hash_async == "on" or (cfg.hash_async == "auto" and cfg.device == "cuda")


def device_of(cfg, world):
    if cfg.device == "mps":
        return torch.device("mps")
    if cfg.device != "cuda":
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) if world > 1 else 0)
    torch.cuda.set_device(device)
    return device


# ----------------------------------------------------------------------------- the loop
def step_line(step, fields, record, tokens, seconds, total, eta):
    """The log line of a published step: step i/N, loss, learning rate, gradient norm, the wall
    time since the previous step's line, throughput, the estimated time to the last step and the
    state hash's prefix (report.py's STEP_LINE reads the first fields)."""
    ms = seconds * 1000
    return (f"step {step:5d}/{total} | loss {fields['loss']:.4f} | lr {fields['lr']:.2e} | "
            f"norm {fields['grad_norm']:.3f} | {ms:6.0f} ms | {tokens / ms * 1000:7.0f} tok/s | "
            f"ETA {duration(eta)} | state {record['state_hash'][:12]}")


class Progress:
    """How far a run is: the last RECENT steps' wall times give the time per step, and the steps
    left times its mean the ETA (a recent mean follows a machine whose load changes)."""
    RECENT = 20

    def __init__(self, total):
        self.total, self.times, self.first = total, collections.deque(maxlen=self.RECENT), None
        self.last = time.perf_counter()      # when the previous step's line was logged

    def step(self, step):
        """(seconds since the previous step, ETA in seconds) as step `step` is published."""
        now = time.perf_counter()
        seconds, self.last = now - self.last, now
        self.times.append(seconds)
        self.first = self.first or (step, now - seconds)
        return seconds, (self.total - step) * sum(self.times) / len(self.times)

    def summary(self, last):
        """'steps A..B in T', or None when no step ran."""
        if self.first is None:
            return None
        return f"steps {self.first[0]}..{last} in {duration(time.perf_counter() - self.first[1])}"


class Publisher:
    """Publishes each step from its finished hash job, in order: refuses a non-finite state,
    checks that the ranks agree, appends the record, anchors, checkpoints (from the hashed copy)
    and logs the step's line (step_line)."""

    def __init__(self, run, data, cfg, secret, log, world, signer=None):
        self.run, self.data, self.cfg, self.secret, self.log, self.world = run, data, cfg, secret, log, world
        self.signer = signer                  # the publisher's key (signing.Signer): signs the anchors
        self.progress = Progress(cfg.max_steps)

    def __call__(self, fields, job):
        cfg, writer = self.cfg, self.run.writer
        hashed = job.result()
        step = hashed.step
        if hashed.nonfinite:
            raise StepRefused(f"step {step}: the update left non-finite values in {hashed.nonfinite[0]}; "
                              "the step is refused and nothing of it is written")
        record = step_record(step, hashed.root, self.data, cfg, fields, receipts.run_id(self.run.genesis),
                             self.secret, hashed.result_root)
        if self.world > 1:
            check_same_state(record["state_hash"], self.world)
        publish(self.run.chain, record, writer)
        if writer and "units" in fields:     # the step's unit list, beside the chain (units.py)
            units.write_list(units.list_path(cfg.run_dir, step), step,
                             fields["units"].finish(receipts.salt(self.secret, step))[1])
        if writer and cfg.anchor_every and step % cfg.anchor_every == 0:
            receipts.append_anchor(cfg.run_dir, step, self.run.chain.records[step]["record_hash"], self.signer)
        if writer and (step % cfg.checkpoint_every == 0 or step == cfg.max_steps):
            self.run.save_checkpoint(hashed.tensors, record, hashed.leaves)
        seconds, eta = self.progress.step(step)
        self.log(step_line(step, fields, record, tokens_at(cfg, step), seconds, cfg.max_steps, eta), updating=True)


def log_end(chain, cfg, progress, log):
    """The run's last lines: the final state hash in full (the one README's anchor is compared
    with) and the command that audits the cheapest late step: the one after the last checkpoint
    before the final step, one step replayed."""
    last = min(cfg.max_steps, len(chain) - 1)
    ran = progress.summary(last)
    log(f"final state (step {last}{', ' + ran if ran else ''}): {chain.records[last]['state_hash']}")
    cheap = (last - 1) // cfg.checkpoint_every * cfg.checkpoint_every + 1
    log(f"audit a step: {python_command()} audit.py --run_dir {cfg.run_dir} --step {cheap} "
        f"(one step replayed from checkpoint {cheap - 1})")


def tokens_at(cfg, step):
    """Tokens of step `step`: its micro-batches (its phase's N) x micro_batch_size x seq_len."""
    return micro_batches_at(cfg, step) * cfg.micro_batch_size * cfg.seq_len


def train_steps(state, data, cfg, rank, world, start, publish, log, chooser):
    """Steps start+1 .. max_steps, each published by `publish` (a Publisher), each run on the
    thread count `chooser` (threads.Chooser) measures fastest. With an overlapped hash
    (hash_overlaps), step N is published after step N+1 has computed, its hash running
    meanwhile; an evaluation, the last step or a refused step publishes what is pending first."""
    hasher = snapshot.StateHasher(overlap=hash_overlaps(cfg))
    pending = None
    for step in range(start + 1, cfg.max_steps + 1):
        try:
            fields = chooser.run(lambda: train_step(state, data, cfg, rank, world))
        except StepRefused:
            if pending:
                publish(*pending)
            raise
        if pending:
            publish(*pending)
        pending = (fields, hasher.submit(state, fields["grad_root"]))   # keyed by grad_root: result_root
        evaluate_now = cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.max_steps)
        if not hasher.overlap or evaluate_now or step == cfg.max_steps:
            publish(*pending)
            pending = None
        if evaluate_now:
            log(f"step {step:5d} | val loss {evaluate(state, data, cfg):.4f}")  # every rank evaluates


def log_sample(state, data, cfg, log):
    """A sample of cfg.sample_tokens tokens from the final model, decoded with the corpus's tokenizer."""
    tok = data.manifest["tokenizer"]
    enc = get_tokenizer(tok["name"], data.path, tok.get("files"))
    with state.guard.inference():
        ids = state.model.cpu().generate(enc.encode("\n"), cfg.sample_tokens, seed=cfg.seed)
    log("sample:\n" + enc.decode(ids))


def run(cfg, rank, world):
    """Train (or resume) cfg.run_dir up to cfg.max_steps; returns the final state."""
    writer = rank == 0
    # Data, kernels and model first: a bad corpus or a failed build creates no run directory.
    data = TokenData(cfg.data_dir, cfg.seed)
    data.check_leaves()                 # leaves against chunk roots; each chunk as it is read
    cfg = resolve(cfg, data.vocab_size)
    state = TrainState(cfg, data.vocab_size, device_of(cfg, world))
    started = rundir.started_run(cfg.run_dir)
    init = parent = None
    if started is None or "parent" not in started.genesis:    # a child resumes from its own checkpoints
        if cfg.init_from and lineage.names_run(cfg.init_from):
            parent = lineage.load_into(state, cfg.init_from)  # a new run from another run's state
        elif cfg.init_from:
            init = hfllama.load_into(state, cfg.init_from)
    probe(state, data, cfg, next_step(cfg))     # a model outside the contract is refused before any file
    probe_inference(state, data, cfg, writer)
    # the publisher's key signs (a probe) before the run directory exists: a bad key creates nothing
    signer = signing.Signer(cfg.publisher_key, "--publisher_key") if writer and cfg.publisher_key else None
    lock = rundir.hold_lock(cfg.run_dir) if writer else None
    log = Logger(cfg.run_dir, writer)
    opened, start, secret = open_run(cfg, data, state, rank, world, log, init, parent, signer)
    log(f"model {state.n_params() / 1e6:.2f}M params | {tokens_at(cfg, start + 1)} tokens/step | "
        f"{world} rank(s) x {micro_batches_at(cfg, start + 1) // world} micro-batches | "
        f"unigram baseline {data.unigram_entropy('val'):.3f} nats")
    publisher = Publisher(opened, data, cfg, secret, log, world, signer)
    # one CPU rank measures its thread count; torchrun's ranks and a GPU keep theirs (threads.py)
    chooser = threads.Chooser(cfg.threads, measure=world == 1 and cfg.device == "cpu", say=log)
    try:
        train_steps(state, data, cfg, rank, world, start, publisher, log, chooser)
    finally:
        chooser.restore()
        log.end_line()                  # an error's line goes below the last step's
    if world > 1:
        # A rank leaves only once every rank is done with its exchanges: a rank that ends closes
        # its connections, which a peer still inside a collective would see as a broken one.
        dist.barrier()
    if writer and cfg.sample_tokens:
        log_sample(state, data, cfg, log)
    if writer:
        log_end(opened.chain, cfg, publisher.progress, log)
    if lock:
        lock.close()
    return state


def configure(argv, say):
    """The config of a command line. A --run_dir whose chain has begun resumes with its own
    config (rundir.Run.resumed_config: the genesis record's decisive keys, config.json's
    bookkeeping, then the line's keys; say(note) if config.json is unusable); a new run's
    --init_from names a parent run (lineage.py) or a Hugging Face folder (hfllama.py), whose
    config it takes; else the line's keys on the defaults."""
    cfg, given = parse_config(argv), given_keys(argv)
    run = rundir.started_run(cfg.run_dir)
    if run is not None:
        run.check_versions(repops.CONTRACT)        # another version's run is not ours to resume
        if "init_from" in given and lineage.names_run(cfg.init_from):
            if not lineage.started_from(run.genesis, cfg.init_from):
                raise UsageError(f"{cfg.run_dir} holds a run that did not start from --init_from={cfg.init_from}; "
                                 "a new run from it needs its own --run_dir")
        cfg, note = run.resumed_config(argv, given)
        if note:
            say(note)
        return cfg
    if cfg.init_from and lineage.names_run(cfg.init_from):
        return lineage.configure(cfg, argv, given)
    if cfg.init_from:           # the imported model's config decides its keys (hfllama.py)
        return hfllama.configure(cfg, given)
    return cfg


def interrupted(cfg, world, interrupt):
    """The one line of a run stopped by Ctrl-C or SIGTERM: the last step its chain holds, that the
    chain and checkpoints are intact (a step is published whole or not at all), and the command
    that resumes it."""
    what, _ = stopped_by(interrupt)
    run = rundir.started_run(cfg.run_dir) if cfg else None
    if run is None:
        return f"train.py: stopped ({what}) before the run's genesis record; the same command starts it again"
    last = len(run.chain) - 1
    ckpt = max((s for s, _ in run.checkpoints() if s <= last), default=0)
    launch = f"{python_command()} train.py" if world == 1 else f"torchrun --nproc_per_node={world} train.py"
    return (f"train.py: stopped ({what}) after step {last}; the chain and checkpoints are intact (the latest "
            f"checkpoint is step {ckpt}); `{launch} --run_dir={cfg.run_dir}` resumes it")


def main(argv):
    if answered_help(argv):      # every config key, its default and comment (config.py)
        return 0
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))

    def note(line):
        if rank == 0:
            print(f"train.py: note: {line}")
    cfg = None
    try:
        cfg = configure(argv, note)
        validate(cfg, world)
        for n in phase_counts(cfg):                          # every phase's N, before any work
            treefold.check_topology(n, world)
        if world > 1:
            backend = "cpu:gloo,cuda:nccl" if cfg.device == "cuda" else "gloo"
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=cfg.dist_timeout))
        run(cfg, rank, world)
    except (UsageError, DataError, TokenizerError, treefold.TopologyError, hashchain.HashChainError,
            repops.RepOpsBuildError) as e:
        if dist.is_initialized():       # a rank's own error (a chunk only it read): each reports its own
            print(f"train.py: error (rank {rank}): {e}", file=sys.stderr)
        elif rank == 0:                 # before joining: a config every rank refuses, reported once
            print(f"train.py: error: {e}", file=sys.stderr)
        return 2
    except (StepRefused, ReproducibilityError, deadcheck.DeadTensorError) as e:
        print(f"train.py: error (rank {rank}): {e}", file=sys.stderr)
        return 1
    except OSError as e:                # a full disk, a run directory made read-only meanwhile
        print(f"train.py: error (rank {rank}): {e}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as e:
        if line := out_of_memory(e, "train this run"):
            print(f"train.py: error{'' if world == 1 else f' (rank {rank})'}: {line}", file=sys.stderr)
            return 2
        if world == 1:
            raise                      # a bug, not a broken peer: keep the traceback
        print(f"train.py: error (rank {rank}): a peer failed or the connection broke: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:      # Ctrl-C, or SIGTERM (stop_on_sigterm): where the run stands
        if rank == 0:
            print(interrupted(cfg, world, e), file=sys.stderr)
        return stopped_by(e)[1]
    return 0


def end_rank(code):
    """End a rank of a multi-rank run: leave the process group, flush the output and exit at once
    (os._exit), without the interpreter's shutdown.

    The first torch.utils.checkpoint call (--recompute) imports torch._dynamo, which imports
    torch.distributed.nn.functional, whose functions bind the default process group as a default
    argument (group=group.WORLD): destroy_process_group then cannot free the group, and its Gloo
    threads (pt_gloo_runloop, gloo_tcp_loop) live on. The interpreter's shutdown, tearing down
    around them, aborted a rank now and then ("terminate called without an active exception",
    SIGABRT, after a complete run): 5 of 122 two-rank runs of tests/test_scale.py's config, two
    at a time on 2 cores, 2026-12-04; 0 of 150 ending here. Nothing is lost by skipping the
    shutdown: train.log is written line by line, the chain and checkpoints are closed as they
    are written, and the offloaded state's temp files are anonymous. A rank that stops before
    joining a group (a config every rank refuses, reported by rank 0) exits the ordinary way."""
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    stop_on_sigterm()                   # SIGTERM unwinds as Ctrl-C does: main's one line, exit 143
    exit_code = main(sys.argv[1:])
    if dist.is_initialized():           # main joined a process group: a rank of a multi-rank run
        end_rank(exit_code)
    sys.exit(exit_code)
