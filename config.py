"""The run's configuration: one commented block, a strict command-line parser, full validation.

    from config import Config, parse_config, validate
    cfg = parse_config(["--max_steps=50", "--run_dir", "runs/x"])   # UsageError on bad input
    validate(cfg)                       # every field's type and range, before anything is created
    decisive_config(cfg)                # the fields the genesis record holds

Every field can be overridden as --key=value or --key value (dashes or underscores). Unknown
keys, wrong types and out-of-range values are refused with one line (UsageError); nothing is
created before the whole config is valid. Bookkeeping fields (where files live, how often to
checkpoint, threads, device) do not decide any step's bits, so they stay out of the genesis
record and may differ when resuming or auditing.
"""
import dataclasses
import math
from dataclasses import dataclass

import torch


@dataclass
class Config:
    # run
    run_dir: str = "runs/default"      # chain.jsonl, checkpoints/, secret, anchors.jsonl, ... (rundir.py)
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
    quant: str = "none"                 # "int8": W8A8 block linears with LSQ step sizes (quant.py)
    lsq_repin: bool = True              # int8: re-pin weight step sizes after every step (else learned)
    # batch: a step is micro_batches (N >= 1; the ranks R must divide it) x micro_batch_size sequences
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
    anchor_every: int = 100             # append the chain head to anchors.jsonl every N steps (0: never)
    hash_async: str = "auto"            # hash step N while step N+1 computes: on, off, auto (= on for cuda)
    dead_tensor_steps: int = 100        # stop when a parameter's gradient is all zero this many steps running (0: off)


# Keys that do not decide the state of any step: they may differ when resuming or auditing.
BOOKKEEPING = {"run_dir", "data_dir", "checkpoint_every", "eval_every", "eval_batches",
               "sample_tokens", "threads", "device", "dist_timeout", "anchor_every", "hash_async",
               # an alarm: it decides whether the run goes on, never a step's bits (deadcheck.py)
               "dead_tensor_steps"}
FIELDS = {f.name: f.type for f in dataclasses.fields(Config)}
SEED_LIMIT = 1 << 64                    # Philox keys are 64-bit
TRUE, FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


class UsageError(Exception):
    """Bad command line, config, run directory or data: printed as one line, exit code 2."""


def _parse_value(key, kind, text):
    try:
        if kind is bool:        # bool("False") is True: spell the two sets out
            if text.lower() not in TRUE | FALSE:
                raise ValueError
            return text.lower() in TRUE
        return int(text, 0) if kind is int else kind(text)
    except ValueError:
        raise UsageError(f"--{key} expects {kind.__name__}, got {text!r}") from None


def parse_config(argv, base=None):
    """Config from --key=value / --key value overrides; unknown keys and bad types refused."""
    cfg = base or Config()
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
        if key not in FIELDS:
            raise UsageError(f"unknown config key --{key} (known: {', '.join(FIELDS)})")
        cfg = dataclasses.replace(cfg, **{key: _parse_value(key, FIELDS[key], value)})
        i += 1
    return cfg


def from_record(fields, where):
    """A Config from a JSON object (a genesis record's config), types checked exactly: keys it
    does not name keep their defaults, unknown keys are ignored (the audit's field-by-field
    comparison reports them), and a wrong type is bad input."""
    if not isinstance(fields, dict):
        raise UsageError(f"{where} is not a JSON object")
    values = {}
    for key, kind in FIELDS.items():
        if key not in fields:
            continue
        v = fields[key]
        ok = (isinstance(v, bool) if kind is bool else
              isinstance(v, int) and not isinstance(v, bool) if kind is int else
              isinstance(v, (int, float)) and not isinstance(v, bool) if kind is float else
              isinstance(v, kind))
        if not ok:
            raise UsageError(f"{where}: {key} must be {kind.__name__}, got {v!r}")
        values[key] = float(v) if kind is float else v
    return Config(**values)


def validate(cfg, world=1):
    """Raise UsageError naming the first field whose value is out of range."""
    def need(ok, key, rule):
        if not ok:
            raise UsageError(f"--{key}={getattr(cfg, key)!r} is out of range: {rule}")

    for key in ("n_layer", "n_head", "d_model", "d_hidden", "seq_len", "micro_batches",
                "micro_batch_size", "max_steps", "checkpoint_every", "eval_batches", "dist_timeout"):
        need(getattr(cfg, key) >= 1, key, "must be >= 1")
    for key in ("warmup_steps", "eval_every", "sample_tokens", "threads", "anchor_every", "dead_tensor_steps"):
        need(getattr(cfg, key) >= 0, key, "must be >= 0")
    for key in FIELDS:
        if FIELDS[key] is float:
            need(math.isfinite(getattr(cfg, key)), key, "must be a finite number")
    for key in ("lr", "rope_theta", "norm_eps", "init_std", "adam_eps", "grad_clip"):
        need(getattr(cfg, key) > 0, key, "must be > 0")
    for key in ("min_lr", "weight_decay", "zloss"):
        need(getattr(cfg, key) >= 0, key, "must be >= 0")
    for key in ("beta1", "beta2", "dropout"):
        need(0 <= getattr(cfg, key) < 1, key, "must be in [0, 1)")
    need(0 <= cfg.seed < SEED_LIMIT, "seed", "must be in [0, 2^64)")
    need(cfg.lr * cfg.weight_decay < 1, "weight_decay", "lr * weight_decay must be < 1")
    need(cfg.d_model % cfg.n_head == 0 and (cfg.d_model // cfg.n_head) % 2 == 0, "d_model",
         f"must split into n_head={cfg.n_head} heads of even size")
    need(cfg.run_dir != "", "run_dir", "must not be empty")
    need(cfg.data_dir != "", "data_dir", "must not be empty")
    need(cfg.device in ("cpu", "cuda"), "device", "must be cpu or cuda")
    need(cfg.hash_async in ("on", "off", "auto"), "hash_async", "must be on, off or auto")
    need(cfg.quant in ("none", "int8"), "quant", "must be none or int8")
    if cfg.quant == "int8":
        need(cfg.device == "cpu", "device", "--quant=int8 has CPU kernels only so far; use --device=cpu")
        for key in ("d_model", "d_hidden"):   # the K of the int8 GEMMs: exact int32 sums need K * 127^2 < 2^31
            need(getattr(cfg, key) <= 133144, key, "must be <= 133144 with --quant=int8 (K * 127^2 < 2^31)")
    if cfg.device == "cuda":
        need(torch.cuda.is_available(), "device", "this machine has no CUDA GPU that torch can use")
        need(torch.cuda.device_count() >= world, "device",
             f"{world} ranks need {world} GPUs, this machine has {torch.cuda.device_count()}")


def decisive_config(cfg):
    """The config fields that decide the chain (the genesis record holds exactly these, so a
    run's chain does not depend on where it was written or how many threads it used)."""
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in BOOKKEEPING}


def differences(mine, theirs):
    """Sorted keys whose values differ between two decisive-config dicts."""
    return [k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
