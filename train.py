"""Train a Llama-style model so that every step is bit-reproducible and published as a hash chain.

    python data.py                                   # once: prepare data/shakespeare
    python train.py                                  # ~3 minutes on a 2-core CPU
    python train.py --max_steps=50 --run_dir=runs/x  # override any config key
    torchrun --nproc_per_node=4 train.py             # 4 ranks: the same chain, byte for byte
    python audit.py --step 120                       # replay a step and check it

Every step: N micro-batches (a pure function of data, seed, step, index), each giving a fresh
gradient; the gradients are summed with TreeFold's fixed tree (treefold.py), clipped, and
applied with AdamW, all in RepOps. The state hash (parameters, Adam moments, step) goes into
runs/<name>/chain.jsonl; checkpoints every `checkpoint_every` steps. Killed at any moment,
`python train.py` resumes from the latest valid checkpoint and re-derives the same chain.
`train_step` below is the one step function: audit.py imports it.
"""
import dataclasses
import datetime
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

import hashchain
import repops
import treefold
from data import DataError, TokenData, batch_digest
from model import Llama, ModelConfig


# ----------------------------------------------------------------------------- config
@dataclass
class Config:
    # run
    run_dir: str = "runs/default"      # chain.jsonl, checkpoints/, config.json, train.log
    data_dir: str = "data/shakespeare"  # a corpus prepared by data.py
    seed: int = 1337                    # init, data order and dropout all derive from it
    # model (vocab_size comes from the corpus)
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    d_hidden: int = 384
    seq_len: int = 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    dropout: float = 0.0
    init_std: float = 0.02
    # batch: a step is micro_batches (N, a power of two) x micro_batch_size sequences
    micro_batches: int = 4
    micro_batch_size: int = 8
    # optimizer: AdamW, linear warmup then linear decay to min_lr at max_steps
    max_steps: int = 300
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 20
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    weight_decay: float = 0.1           # on matrices only
    grad_clip: float = 1.0
    zloss: float = 1e-4
    # bookkeeping (does not change the chain)
    checkpoint_every: int = 50
    eval_every: int = 100
    eval_batches: int = 4
    sample_tokens: int = 200            # printed at the end (0: none)
    threads: int = 0                    # torch threads per process (0: torch's default)
    device: str = "cpu"                 # "cuda": same bits on the GPU kernels (rank r uses GPU r)
    dist_timeout: int = 60              # seconds before a rank gives up on a dead peer


# Keys that do not decide the state of any step: they may differ when resuming or auditing.
BOOKKEEPING = {"run_dir", "data_dir", "checkpoint_every", "eval_every", "eval_batches",
               "sample_tokens", "threads", "dist_timeout", "device"}


class UsageError(Exception):
    """Bad command line, run directory or data: printed as one line, exit code 2."""


class StepRefused(Exception):
    """A step produced a non-finite loss or gradient norm; nothing of it was written."""


class ReproducibilityError(Exception):
    """Ranks disagree on the state, or a re-derived step differs from its chain record."""


def parse_config(argv, base=None):
    """Config from --key=value / --key value overrides; unknown keys and bad types refused."""
    cfg = base or Config()
    fields = {f.name: f for f in dataclasses.fields(Config)}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise UsageError(f"unexpected argument {arg!r} (use --key=value)")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(argv):
                raise UsageError(f"--{key} needs a value")
            value, i = argv[i + 1], i + 1
        key = key.replace("-", "_")
        if key not in fields:
            raise UsageError(f"unknown config key --{key} (known: {', '.join(fields)})")
        kind = type(getattr(Config(), key))
        try:
            parsed = kind(value) if kind is not int else int(value, 0)
        except ValueError:
            raise UsageError(f"--{key} expects {kind.__name__}, got {value!r}") from None
        cfg = dataclasses.replace(cfg, **{key: parsed})
        i += 1
    return cfg


def model_config(cfg, vocab_size):
    names = {f.name for f in dataclasses.fields(ModelConfig)} - {"vocab_size"}
    return ModelConfig(vocab_size=vocab_size, **{k: getattr(cfg, k) for k in names})


def lr_at(cfg, step):
    """Learning rate of step (1-based), float64 with + - * / only (contract §1)."""
    if step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    span = max(cfg.max_steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    return cfg.lr - (cfg.lr - cfg.min_lr) * progress


def code_digest():
    """SHA-256 over the sources that decide the math, and the kernel build flags."""
    root = os.path.dirname(os.path.abspath(__file__))
    files = ["model.py", "repops.py", "treefold.py", "train.py", "data.py", "hashchain.py"]
    files += [os.path.relpath(p, root) for p in repops.KERNEL_FILES]
    h = hashlib.sha256(" ".join(repops.CPU_FLAGS).encode())
    for rel in sorted(files):
        with open(os.path.join(root, rel), "rb") as f:
            h.update(rel.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


# ----------------------------------------------------------------------------- state
class TrainState:
    """Everything that decides the future: parameters, Adam moments, the step counter."""

    def __init__(self, cfg, vocab_size, device="cpu"):
        self.device = torch.device(device)
        # Canonical init runs on the CPU kernels; the bits then move to the device unchanged.
        self.model = Llama(model_config(cfg, vocab_size), seed=cfg.seed).to(self.device)
        self.params = self.model.named_tensors()           # canonical (sorted) order
        self.m = {n: torch.zeros_like(p) for n, p in self.params.items()}
        self.v = {n: torch.zeros_like(p) for n, p in self.params.items()}
        self.step = 0

    def tensors(self):
        out = {"step": torch.tensor([self.step], dtype=torch.int64)}
        for n, p in self.params.items():
            out["params." + n] = p.detach()
            out["adam_m." + n] = self.m[n]
            out["adam_v." + n] = self.v[n]
        return out

    def load(self, tensors):
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(tensors["params." + n])
                self.m[n].copy_(tensors["adam_m." + n])
                self.v[n].copy_(tensors["adam_v." + n])
        self.step = int(tensors["step"][0])

    def hash(self):
        return hashchain.state_hash(self.tensors())


# ----------------------------------------------------------------------------- the step
def micro_batch_gradient(state, data, cfg, step, micro):
    """Flat [P + 1] tensor: micro-batch `micro`'s gradient (parameter order), then its loss."""
    batch = data.micro_batch("train", step, micro, cfg.micro_batch_size, cfg.seq_len)
    x, y = (t.to(state.device) for t in batch)
    params = list(state.params.values())
    loss = state.model(x, y, zloss=cfg.zloss, rng=(step, micro))
    grads = torch.autograd.grad(loss, params)
    return torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)])


def train_step(state, data, cfg, rank=0, world=1):
    """Advance `state` by one step; returns the step's record fields. Shared with audit.py.

    Rank r folds its own micro-batches; with world > 1 the subtrees meet in TreeFold's
    all-reduce, so every rank (and a single-device replay) ends with the same bits.
    """
    step = state.step + 1
    n = cfg.micro_batches
    state.model.train()
    fold = treefold.LocalFold()
    for micro in treefold.owned_micro_batches(n, world, rank):
        fold.push(micro_batch_gradient(state, data, cfg, step, micro))
    total = fold.result()
    if world > 1:
        total = treefold.allreduce_tree(total)
    mean = repops.ops.scale(total, repops.f32(1.0 / n))     # exact: n is a power of two
    loss = mean[-1]
    grad, grad_norm = repops.clip_grad(mean[:-1], cfg.grad_clip)
    loss_f, norm_f = float(loss), float(grad_norm)
    if not (math.isfinite(loss_f) and math.isfinite(norm_f)):
        raise StepRefused(f"step {step}: loss {loss_f} / gradient norm {norm_f} is not finite; "
                          "the step is refused and nothing of it is written (lower lr?)")
    lr = lr_at(cfg, step)
    offset = 0
    with torch.no_grad():
        for name, p in state.params.items():
            g = grad[offset:offset + p.numel()].view(p.shape)
            offset += p.numel()
            repops.adamw_(p.data, g, state.m[name], state.v[name], lr=lr, beta1=cfg.beta1,
                          beta2=cfg.beta2, eps=cfg.adam_eps,
                          weight_decay=cfg.weight_decay if p.dim() >= 2 else 0.0, step=step)
    state.step = step
    return {"loss": loss_f, "loss_bits": hashchain.f32_bits(loss_f), "grad_norm": norm_f,
            "grad_norm_bits": hashchain.f32_bits(norm_f), "lr": repops.f32(lr),
            "lr_bits": hashchain.f32_bits(lr)}


def step_record(state, data, cfg, fields):
    """The chain record of the step `state` just finished (everything but prev/record_hash)."""
    root, leaves = state.hash()
    windows = [data.window("train", state.step, m, cfg.micro_batch_size, cfg.seq_len)
               for m in range(cfg.micro_batches)]
    return {"kind": "step", "step": state.step, "state_hash": root, "tensor_hashes": leaves,
            "batch_digest": batch_digest(windows), **fields}


def genesis_record(state, data, cfg):
    root, leaves = state.hash()
    return {"kind": "genesis", "step": 0, "config": decisive_config(cfg),
            "code_digest": code_digest(), **data.commitments(),
            "tokenizer": data.manifest["tokenizer"], "vocab_size": data.vocab_size,
            "state_hash": root, "tensor_hashes": leaves}


@torch.no_grad()
def evaluate(state, data, cfg):
    state.model.eval()
    batches = (data.micro_batch("val", 0, m, cfg.micro_batch_size, cfg.seq_len) for m in range(cfg.eval_batches))
    losses = [float(state.model(x.to(state.device), y.to(state.device))) for x, y in batches]
    return sum(losses) / len(losses)


# ----------------------------------------------------------------------------- run directory
def checkpoint_dir(run_dir):
    return os.path.join(run_dir, "checkpoints")


def save_checkpoint(path, state, root, leaves):
    hashchain.save_checkpoint(path, state.tensors(), {"step": state.step, "state_hash": root,
                                                      "tensor_hashes": leaves})


def load_verified_checkpoint(path, record):
    """Load a checkpoint and check it against its chain record (names the bad tensor)."""
    tensors, meta = hashchain.load_checkpoint(path)
    hashchain.verify_state(tensors, record["state_hash"], record.get("tensor_hashes"))
    return tensors


def restore(state, chain, run_dir, log, upto):
    """Load the latest checkpoint at or before `upto` that matches the chain; else re-init.

    Returns the step restored. A checkpoint that fails verification is reported and skipped,
    never deleted (it is evidence)."""
    for step, path in reversed(hashchain.list_checkpoints(checkpoint_dir(run_dir))):
        if step > upto or step >= len(chain):
            continue
        try:
            state.load(load_verified_checkpoint(path, chain.records[step]))
            return step
        except hashchain.HashChainError as e:
            log(f"warning: skipping checkpoint {path}: {e}")
    if state.hash()[0] != chain.records[0]["state_hash"]:   # a fresh state is step 0
        raise UsageError("the initial state recomputed from the config does not match the chain's "
                         "genesis record (different code or kernels?)")
    return 0


def decisive_config(cfg):
    """The config fields that decide the chain (the genesis record holds exactly these, so a
    run's chain does not depend on where it was written or how many threads it used)."""
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in BOOKKEEPING}


def config_differences(cfg, published):
    mine = decisive_config(cfg)
    return [k for k in sorted(set(mine) | set(published)) if mine.get(k) != published.get(k)]


class Logger:
    def __init__(self, run_dir, enabled):
        self.path = os.path.join(run_dir, "train.log") if enabled else None
        self.enabled = enabled

    def __call__(self, msg):
        if not self.enabled:
            return
        print(msg, flush=True)
        with open(self.path, "a") as f:
            f.write(msg + "\n")


def check_same_state(root, world):
    """Every rank must hold the same state hash after each step (DESIGN §5)."""
    mine = torch.frombuffer(bytearray(bytes.fromhex(root)), dtype=torch.uint8)
    gathered = [torch.empty(32, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(gathered, mine)
    roots = [bytes(g.tolist()).hex() for g in gathered]
    if len(set(roots)) != 1:
        raise ReproducibilityError("ranks disagree on the state hash: " + ", ".join(r[:12] for r in roots))


def run(cfg, rank, world):
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    writer = rank == 0
    data = TokenData(cfg.data_dir, cfg.seed)       # before creating anything: bad data, no run dir
    os.makedirs(checkpoint_dir(cfg.run_dir), exist_ok=True)
    log = Logger(cfg.run_dir, writer)
    device = torch.device(cfg.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    state = TrainState(cfg, data.vocab_size, device)
    chain = hashchain.Chain(os.path.join(cfg.run_dir, "chain.jsonl"))
    note = chain.load(repair=writer)
    if note:
        log("resume: " + note)
    if len(chain) == 0:
        if writer:
            with open(os.path.join(cfg.run_dir, "config.json"), "w") as f:
                json.dump(dataclasses.asdict(cfg), f, indent=2)
            chain.append(genesis_record(state, data, cfg))
        start = 0
    else:
        chain.verify()
        genesis = chain.records[0]
        diff = config_differences(cfg, genesis["config"])
        if diff:
            raise UsageError(f"{cfg.run_dir} was started with a different config ({', '.join(diff)}); "
                             "resume with the same settings or choose another --run_dir")
        if genesis["code_digest"] != code_digest():
            log("warning: the code differs from the code that started this run; re-derived "
                "steps are compared with the chain, so any change of bits stops the run")
        start = restore(state, chain, cfg.run_dir, log, upto=cfg.max_steps)
        log(f"resume: from step {start} ({len(chain) - 1} steps in the chain)")
    if world > 1:
        dist.barrier()                  # rank 0 has written the genesis record
        if len(chain) == 0:
            chain.load(repair=False)
    n_params = sum(p.numel() for p in state.params.values())
    tokens_per_step = cfg.micro_batches * cfg.micro_batch_size * cfg.seq_len
    log(f"model {n_params / 1e6:.2f}M params | {tokens_per_step} tokens/step | "
        f"{world} rank(s) x {cfg.micro_batches // world} micro-batches | "
        f"unigram baseline {data.unigram_entropy('val'):.3f} nats")
    ckpt0 = hashchain.checkpoint_path(checkpoint_dir(cfg.run_dir), 0)
    if writer and start == 0 and not os.path.exists(ckpt0):
        save_checkpoint(ckpt0, state, *state.hash())
    for step in range(start + 1, cfg.max_steps + 1):
        t0 = time.perf_counter()
        fields = train_step(state, data, cfg, rank, world)
        record = step_record(state, data, cfg, fields)
        if world > 1:
            check_same_state(record["state_hash"], world)
        if step < len(chain):           # re-deriving a step the chain already holds
            published = {k: v for k, v in chain.records[step].items() if k not in ("prev", "record_hash")}
            if published != json.loads(json.dumps(record)):
                raise ReproducibilityError(f"step {step} re-derived differently from the chain record: "
                                   "this machine does not reproduce the run (run audit.py)")
        elif writer:
            chain.append(record)
        if writer and (step % cfg.checkpoint_every == 0 or step == cfg.max_steps):
            save_checkpoint(hashchain.checkpoint_path(checkpoint_dir(cfg.run_dir), step), state,
                            record["state_hash"], record["tensor_hashes"])
        ms = (time.perf_counter() - t0) * 1000
        log(f"step {step:5d} | loss {fields['loss']:.4f} | lr {fields['lr']:.2e} | "
            f"norm {fields['grad_norm']:.3f} | {ms:6.0f} ms | {tokens_per_step / ms * 1000:7.0f} tok/s | "
            f"state {record['state_hash'][:12]}")
        if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.max_steps):
            val = evaluate(state, data, cfg)   # on every rank: none waits for rank 0 alone
            log(f"step {step:5d} | val loss {val:.4f}")
    if writer and cfg.sample_tokens:
        from sample import generate
        text = generate(state.model.cpu(), data.manifest["tokenizer"]["name"], "\n", cfg.sample_tokens,
                        seed=cfg.seed)
        log("sample:\n" + text)
    return state


def main(argv):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    try:
        cfg = parse_config(argv)
        treefold.check_topology(cfg.micro_batches, world)   # before any work
        if world > 1:
            backend = "cpu:gloo,cuda:nccl" if cfg.device == "cuda" else "gloo"
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=cfg.dist_timeout))
        run(cfg, rank, world)
    except (UsageError, DataError, treefold.TopologyError, hashchain.HashChainError) as e:
        if rank == 0:
            print(f"train.py: error: {e}", file=sys.stderr)
        return 2
    except (StepRefused, ReproducibilityError) as e:
        print(f"train.py: error (rank {rank}): {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        if world == 1:
            raise                      # a bug, not a broken peer: keep the traceback
        print(f"train.py: error (rank {rank}): a peer failed or the connection broke: {e}", file=sys.stderr)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
