"""The run's configuration: one commented block, a strict command-line parser, full validation,
the per-step schedules (learning rate, micro-batches per step) that it decides, and the
command-line convention of every other command. It loads without torch (so does --help).

    from config import Config, parse_config, validate
    cfg = parse_config(["--max_steps=50", "--run_dir", "runs/x"])   # UsageError on bad input
    validate(cfg)                       # every field's type and range, before anything is created
    cfg = resolve(cfg, corpus_vocab)    # n_kv_head and vocab_size defaults made explicit
    decisive_config(cfg)                # the fields the genesis record holds

    parse_config(["--preset=open1b", "--seq_len=1024"])   # a preset, then any override

    lr_at(cfg, 120)              # float64 learning rate of step 120 (1-based); adamw_ rounds it once
    micro_batches_at(cfg, 120)   # N of step 120: cfg.micro_batches, or its micro_batch_phases entry
    phase_counts(cfg)            # every N the run uses (the ranks must divide each one)

    ap = CommandLine("audit.py", "Replay steps ...")   # every other command's line (CommandLine)
    ap.add_modes("modes (exactly one)").add_argument("--plan", action="store_true", help="...")
    ap.options_for(("plan",), "the plan (--plan)").add_argument("--auditors", type=int, help="...")
    args = ap.parse_args(argv)      # UsageError for an option given with another mode

Every field can be overridden as --key=value or --key value, spelled as in Config. Unknown
keys (named first, with the closest key: "did you mean --max_steps?"), wrong types and
out-of-range values are refused with one line (UsageError); nothing is
created before the whole config is valid. --preset=NAME (PRESETS) sets a group of keys first,
wherever it stands on the line; every other key overrides it. Bookkeeping fields (where files
live, how often to checkpoint, threads, device) do not decide any step's bits, so they stay out
of the genesis record and may differ when resuming or auditing.

The per-step schedules (lr_at, micro_batches_at) are decisive (in the genesis config) and are
written as exactly specified arithmetic:

* lr_schedule "linear" (the default): linear warmup to lr over warmup_steps, then linear decay
  to min_lr at max_steps, float64 + - * / only (contract §1).
* lr_schedule "cosine": the same warmup, then lr(s) = min_lr + (lr - min_lr) * 0.5 * (1 + c)
  with c = cos(x) the contract's canonical float32 cos (§5.5, ops.cos on one value, the same
  bits on every machine), x = f32(pi * progress) (math.pi is the float64 nearest pi; one
  float64 product, rounded once to float32), progress = min((s - warmup) / (max_steps -
  warmup), 1); the rest in float64 + - * (math.cos is not used: it is not correctly rounded
  everywhere).
* micro-batch phases: micro_batch_phases "N1@S1,N2@S2,..." (S strictly increasing, S1 >= 1, every
  S < max_steps: a phase that no step takes is refused, late_phases; a preset's are cut to
  max_steps, parse_config):
  steps 1..S1 take cfg.micro_batches, steps S1+1..S2 take N1, and so on. On the command line
  --micro_batches=192@0,288@S1,576@S2 sets both keys (micro_batches=192 and the rest).
"""
import argparse
import dataclasses
import difflib
import inspect
import math
import os
import signal
import sys
import textwrap
from dataclasses import dataclass


@dataclass
class Config:
    # run
    run_dir: str = "runs/default"      # chain.jsonl, checkpoints/, secret, anchors.jsonl, ... (rundir.py)
    data_dir: str = "data/shakespeare"  # a corpus prepared by data.py
    seed: int = 1337                    # init, data order and dropout all derive from it
    # model
    vocab_size: int = 0                 # 0: the corpus tokenizer's; larger pads (rows no data indexes)
    n_layer: int = 4                    # transformer blocks
    n_head: int = 4                     # query heads per block
    n_kv_head: int = 0                  # 0: n_head; fewer: grouped-query attention (divides n_head)
    d_model: int = 128                  # the residual stream's width
    d_hidden: int = 384                 # SwiGLU's hidden width
    seq_len: int = 128                  # tokens per sequence (the context)
    rope_theta: float = 10000.0         # RoPE's base
    norm_eps: float = 1e-5              # RMSNorm's epsilon
    dropout: float = 0.0                # residual dropout (Philox masks, replayable)
    init_std: float = 0.02              # standard deviation of the initial weights
    tie_embeddings: bool = False        # one tensor tok_emb is the input and output embedding
    # A Hugging Face Llama folder (hfllama.py): the initial parameters are its weights, mapped;
    # its config.json sets the model keys. Bookkeeping: the genesis record commits to the files'
    # SHA-256s and the resulting tensors, and checkpoint 0 holds the state.
    init_from: str = ""
    quant: str = "none"                 # "int8": W8A8 block linears with LSQ step sizes (quant.py)
    lsq_repin: bool = True              # int8: re-pin weight step sizes after every step (else learned)
    int8_pv: bool = False               # int8: attention's P·V in int8, per-block steps (quant.py)
    attn_window: int = 0                # > 0: sliding-window attention over the last W keys (0: full)
    full_attn_every: int = 0            # with a window, layers i with (i+1) % this == 0 stay full; the last always
    qk_norm: bool = False               # gain-free RMSNorm of each query and key head, before RoPE
    emb_norm: bool = False              # RMSNorm (learned weight emb_norm [d]) after the token embedding
    matmul: str = "fp32"                # "exact": every model matmul is the exact integer matmul (contract §11)
    # Commit to every piece of each step (micro-batch gradients, fold nodes) in the record's
    # units_root, so that one micro-batch, one fold node or the update can be audited alone
    # (units.py, docs/auditing.md); it adds commitments only, the state hashes are the same.
    unit_commits: bool = False
    # batch: a step is micro_batches (N >= 1; the ranks R must divide it) x micro_batch_size sequences
    micro_batches: int = 4              # N, the micro-batches of a step (the first phase's)
    # phases of one run, "N1@S1,N2@S2": N1 micro-batches from step S1+1 on, ... (config.micro_batches_at);
    # --micro_batches=192@0,288@S1 sets micro_batches=192 and this to "288@S1"
    micro_batch_phases: str = ""
    micro_batch_size: int = 8           # sequences per micro-batch
    # optimizer: AdamW, linear warmup then decay to min_lr at max_steps (config.lr_at)
    max_steps: int = 300                # the run's last step
    lr_schedule: str = "linear"         # the decay: linear, or cosine (the contract's canonical cos)
    lr: float = 3e-3                    # peak learning rate, reached after warmup
    min_lr: float = 3e-4                # the learning rate at max_steps
    warmup_steps: int = 20              # steps of linear warmup from 0
    beta1: float = 0.9                  # AdamW's first-moment decay
    beta2: float = 0.95                 # AdamW's second-moment decay
    adam_eps: float = 1e-8              # AdamW's epsilon
    weight_decay: float = 0.1           # on matrices only
    grad_clip: float = 1.0              # the gradient's largest L2 norm (clipped above it)
    zloss: float = 1e-4                 # weight of the z-loss (logsumexp^2) in the loss
    # bookkeeping (does not change the chain)
    checkpoint_every: int = 50          # a checkpoint every N steps (and at max_steps)
    eval_every: int = 100               # validation loss every N steps (0: never)
    eval_batches: int = 4               # micro-batches of validation data per evaluation
    sample_tokens: int = 200            # printed at the end (0: none)
    threads: int = 0                    # CPU threads per process (0: measured, the faster of torch's default and 1)
    device: str = "cpu"                 # "cuda" / "mps": same bits on the GPU kernels (rank r uses GPU r)
    dist_timeout: int = 60              # seconds before a rank gives up on a dead peer
    anchor_every: int = 100             # append the chain head to anchors.jsonl every N steps (0: never)
    hash_async: str = "auto"            # hash step N while step N+1 computes: on, off, auto (= on for cuda)
    dead_tensor_steps: int = 100        # stop when a parameter's gradient is all zero this many steps running (0: off)
    # The publisher's SSH key (a private key file, or the public key of one ssh-agent holds): the
    # genesis record names its public key and every anchor is signed by it (SPEC §11.7, signing.py).
    # Bookkeeping: the genesis record's `publisher` is what counts, and a resume must give that key.
    publisher_key: str = ""
    # Recompute each block's activations in backward instead of holding them (memory ~ one block's
    # attention scores, not n_layer of them). Bookkeeping: recomputation runs the same kernels on
    # the same inputs (dropout masks are Philox functions of their indices), so the bits are the
    # same either way, and an auditor chooses it for their own machine.
    recompute: bool = False
    # Keep the Adam moments in a temp file (under TMPDIR) mapped one tensor at a time, and a
    # waiting micro-batch gradient in another (offload.py): memory ~ parameters + two gradients
    # instead of parameters + moments + several gradients. Bookkeeping for the same reason.
    offload: bool = False


# Keys that do not decide the state of any step: they may differ when resuming or auditing.
BOOKKEEPING = {"run_dir", "data_dir", "checkpoint_every", "eval_every", "eval_batches",
               "sample_tokens", "threads", "device", "dist_timeout", "anchor_every", "hash_async",
               "recompute", "offload", "init_from", "publisher_key",
               # an alarm: it decides whether the run goes on, never a step's bits (deadcheck.py)
               "dead_tensor_steps"}
FIELDS = {f.name: f.type for f in dataclasses.fields(Config)}
# Decisive keys added after the genesis format was fixed: left out of the genesis record at
# their default, so a run that does not use them keeps its genesis bytes (and older runs audit).
OPTIONAL = {"tie_embeddings": False, "int8_pv": False, "matmul": "fp32", "unit_commits": False}
# Named recipes (--preset=NAME). open1b: the OPEN-1B reference run (gensyn-ai/open-transformers,
# configs/train/1b_repop_v2.yaml; docs/open1b-recipe.md lists what still differs): its model
# (1.61B parameters; sliding window 512 with every 5th and the last layer full, gain-free QK-norm,
# embedding norm, RoPE theta 5e5), z-loss 1e-4, AdamW lr 4.5e-4 with 667 warmup steps and cosine
# decay to 10%, clip 1.0, and its token phases: 192 / 288 / 576 micro-batches of 4 x 4096 tokens
# from 0 / 4B / 360B tokens to 400B. Here a micro-batch is 1 x 4096 tokens (what a 24 GiB replay
# holds, with recompute and offload), so the phases are 4x as many: 768 / 1152 / 2304 from steps
# 1 / 1273 / 76719 (the first step to start at or past 4B and 360B tokens), 80957 steps in all;
# 48 ranks divide every phase. open1b-mini: the same structure (GQA 4:1, head size 128, SwiGLU
# hidden 2.75 x width, every recipe option, a phase boundary after step 1) small enough for a
# few steps on 2 cores in seconds (the CI test, tests/test_scale.py). Both commit to every piece
# of each step (unit_commits, units.py): a step of 768 micro-batches is audited one micro-batch at
# a time (off by default: on the default model the hashing costs about 3% of a step,
# docs/auditing.md).
_RECIPE = dict(attn_window=512, full_attn_every=5, qk_norm=True, emb_norm=True, rope_theta=5e5, zloss=1e-4,
               lr=4.5e-4, min_lr=4.5e-5, warmup_steps=667, lr_schedule="cosine", grad_clip=1.0)
PRESETS = {
    "open1b": dict(_RECIPE, n_layer=24, d_model=2048, n_head=16, n_kv_head=4, d_hidden=5632,
                   vocab_size=128256, seq_len=4096, micro_batches=768, micro_batch_size=1,
                   micro_batch_phases="1152@1272,2304@76718", max_steps=80957, seed=42,
                   recompute=True, offload=True, checkpoint_every=1, eval_every=0, sample_tokens=0,
                   unit_commits=True),
    "open1b-mini": dict(_RECIPE, n_layer=2, d_model=512, n_head=4, n_kv_head=1, d_hidden=1408,
                        seq_len=64, attn_window=16, micro_batches=2, micro_batch_phases="4@1",
                        micro_batch_size=1, recompute=True, unit_commits=True),
}

SEED_LIMIT = 1 << 64                    # Philox keys are 64-bit
# The largest value of each integer key (validate; docs/limits.md says why each). The model's
# dimensions are capped 4-64x beyond the largest published models (Llama 3 405B: 126 layers,
# width 16384, hidden 53248, 128 heads; Gemma 3: a 262144-token vocabulary), so that a typo or a
# hostile config.json or genesis record is refused at once, before anything is allocated, and
# never a model no machine holds; what the limits allow but this machine cannot hold is refused
# by the state's size (train.check_memory) or, during a step, by the allocator (out_of_memory).
# Every other integer key (steps, counts, seconds) stays within int32, so that every integer a
# run records is exact in int64 and in a JSON reader's float64.
INT_LIMIT = (1 << 31) - 1
LIMITS = {"vocab_size": 1 << 24, "n_layer": 4096, "n_head": 4096, "n_kv_head": 4096, "d_model": 1 << 16,
          "d_hidden": 1 << 18, "seq_len": 1 << 20, "attn_window": 1 << 20, "micro_batch_size": 1 << 16,
          "micro_batches": 1 << 20}
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
    """Config from --key=value / --key value overrides; unknown keys and bad types refused.
    A --preset's keys are applied first, so the other keys override it in any order. A preset's
    phases that start at or after max_steps are dropped: a preset cut short by --max_steps
    trains its prefix, and the config (the genesis record) holds the phases that train. Phases
    given on the command line are kept as given (validate refuses a late one: late_phases)."""
    cfg = base or Config()
    presets, pairs = _arguments(argv)
    for preset in presets:
        cfg = dataclasses.replace(cfg, **PRESETS[preset])
    cfg = dataclasses.replace(cfg, **dict(pairs))
    if presets and "micro_batch_phases" not in dict(pairs) and isinstance(cfg.max_steps, int):
        kept = [f"{n}@{s}" for n, s in parse_phases(cfg.micro_batch_phases) if s < cfg.max_steps]
        cfg = dataclasses.replace(cfg, micro_batch_phases=",".join(kept))
    return cfg


def given_keys(argv):
    """The config keys the command line sets, a preset's included (parse_config's argv)."""
    presets, pairs = _arguments(argv)
    return {k for p in presets for k in PRESETS[p]} | {k for k, _ in pairs}


def suggestion(name, known):
    """" (did you mean --x?)" for the known option closest to a misspelt `name`, or "" (difflib)."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean --{close[0]}?)" if close else ""


def _unknown_keys(argv):
    """UsageError for the first --key that is not a config key, before any value is read: a
    misspelt key is the mistake to name first, whatever else the line gets wrong."""
    known = ["preset", *FIELDS]
    i = 0
    while i < len(argv):
        key, eq, _ = argv[i][2:].partition("=") if argv[i].startswith("--") else ("", "=", "")
        if key and key not in known:
            raise UsageError(f"unknown config key --{key}{suggestion(key, known)} (train.py --help lists them)")
        i += 1 if eq else 2


def _arguments(argv):
    """([preset names], [(key, value)]) of a command line, in order; UsageError if bad."""
    _unknown_keys(argv)
    presets, pairs, phases = [], [], []     # phases: the arguments that set micro_batch_phases
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
        if key == "micro_batch_phases" or key == "micro_batches" and "@" in value:
            phases.append(f"--{key}={value}")
            if len(phases) > 1:      # two spellings of one setting: neither may silently win
                raise UsageError(f"{phases[0]} and {phases[1]} both set the micro-batch phases: give one")
        if key == "preset":
            if value not in PRESETS:
                raise UsageError(f"unknown preset {value!r} (known: {', '.join(PRESETS)})")
            presets.append(value)
        elif key == "micro_batches" and "@" in value:      # phases: 192@0,288@S1,...
            first, _, rest = value.partition(",")
            n, _, start = first.partition("@")
            if start != "0" or not rest:
                raise UsageError(f"--micro_batches={value}: phases are N0@0,N1@S1,... (the first from step 1)")
            pairs += [("micro_batches", _parse_value(key, int, n)), ("micro_batch_phases", rest)]
        else:
            pairs.append((key, _parse_value(key, FIELDS[key], value)))
        i += 1
    return presets, pairs


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


def validate(cfg, world=1, recorded=False):
    """Raise UsageError naming the first field whose value is out of range. `recorded`: cfg is
    a genesis record's (rundir.Run.cfg), whose phases past max_steps the audit reports as a
    finding at step 0 (audit.Audit.check_genesis: the record says what did not train)."""
    def need(ok, key, rule, *others):
        """Refuse naming `key` (and the `others` a joint rule involves, so that whichever of them
        the user gave is named)."""
        if not ok:
            given = " and ".join(f"--{k}={getattr(cfg, k)!r}" for k in (key, *others))
            raise UsageError(f"{given} {'are' if others else 'is'} out of range: {rule}")

    for key in FIELDS:          # first: no rule below computes with a value beyond its limit
        if FIELDS[key] is int and key != "seed":
            limit = LIMITS.get(key, INT_LIMIT)
            need(getattr(cfg, key) <= limit, key, f"must be <= {limit} (config.LIMITS; docs/limits.md)")
    for key in ("vocab_size", "n_kv_head"):
        need(getattr(cfg, key) >= 0, key, "must be >= 0 (0: the default)")
    for key in ("n_layer", "n_head", "d_model", "d_hidden", "seq_len", "micro_batches",
                "micro_batch_size", "max_steps", "checkpoint_every", "eval_batches", "dist_timeout"):
        need(getattr(cfg, key) >= 1, key, "must be >= 1")
    for key in ("attn_window", "full_attn_every", "warmup_steps", "eval_every", "sample_tokens", "threads", "anchor_every", "dead_tensor_steps"):
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
    need(cfg.lr * cfg.weight_decay < 1, "lr", "lr * weight_decay must be < 1", "weight_decay")
    need(cfg.d_model % cfg.n_head == 0 and (cfg.d_model // cfg.n_head) % 2 == 0, "d_model",
         "d_model must split into n_head heads of even size", "n_head")
    need(cfg.n_kv_head == 0 or cfg.n_head % cfg.n_kv_head == 0, "n_kv_head",
         "n_kv_head must divide n_head (each key/value head serves a group of query heads)", "n_head")
    need(cfg.run_dir != "", "run_dir", "must not be empty")
    need(cfg.data_dir != "", "data_dir", "must not be empty")
    need(cfg.device in ("cpu", "cuda", "mps"), "device", "must be cpu, cuda or mps")
    need(cfg.hash_async in ("on", "off", "auto"), "hash_async", "must be on, off or auto")
    need(cfg.quant in ("none", "int8"), "quant", "must be none or int8")
    need(cfg.lr_schedule in ("linear", "cosine"), "lr_schedule", "must be linear or cosine")
    need(cfg.matmul in ("fp32", "exact"), "matmul", "must be fp32 or exact")
    if cfg.matmul == "exact":   # the combinations the exact matmul has no kernel for yet (docs/exact-matmul.md)
        need(cfg.quant == "none", "matmul", "exact has no int8 form (the int8 block linears are their own GEMM)", "quant")
        need(cfg.attn_window == 0 or cfg.device == "cpu", "matmul", "exact's windowed attention (its band "
             "products) has CPU kernels only", "attn_window", "device")
        need(cfg.device != "mps", "matmul", "exact has no Metal kernels (docs/metal.md): use cpu or cuda", "device")
    try:
        phases = parse_phases(cfg.micro_batch_phases)
    except ScheduleError as e:
        raise UsageError(f"--micro_batch_phases={cfg.micro_batch_phases!r} is out of range: {e}") from None
    need(all(n <= LIMITS["micro_batches"] for n, _ in phases), "micro_batch_phases",
         f"every phase's N must be <= {LIMITS['micro_batches']} (config.LIMITS; docs/limits.md)")
    if cfg.quant == "int8":
        for key in ("d_model", "d_hidden"):   # the K of the int8 GEMMs: exact int32 sums need K * 127^2 < 2^31
            need(getattr(cfg, key) <= 133144, key, "must be <= 133144 with --quant=int8 (K * 127^2 < 2^31)")
    need(not cfg.int8_pv or cfg.quant == "int8", "int8_pv", "needs --quant=int8 (int8 P·V is part of the int8 path)",
         "quant")
    if cfg.int8_pv:   # the K of the int8 P·V sums: T keys (full layers) or W' <= T (windowed)
        need(cfg.seq_len <= 133144, "seq_len", "must be <= 133144 with --int8_pv (T * 127^2 < 2^31)")
        need(cfg.device != "mps", "int8_pv", "has no Metal kernels (docs/metal.md): use cpu or cuda", "device")
    need(not (cfg.offload and cfg.device != "cpu"), "offload", "offloads the state of a cpu run only",
         "device")
    need(not (cfg.offload and cfg.hash_async == "on"), "hash_async",
         "an overlapped hash copies the whole state to memory, which --offload is there to avoid",
         "offload")
    if cfg.device in ("cuda", "mps"):
        import torch        # here, not at the top: config.py (train.py --help) loads without torch
    if cfg.device == "cuda":
        need(torch.cuda.is_available(), "device", "this machine has no CUDA GPU that torch can use")
        need(torch.cuda.device_count() >= world, "device",
             f"{world} ranks need {world} GPUs, this machine has {torch.cuda.device_count()}")
    if cfg.device == "mps":
        need(torch.backends.mps.is_available(), "device", "this machine has no Apple GPU (MPS) that torch can use")
        need(world == 1, "device", "mps runs on one GPU (one rank)")
    if not recorded:
        need(not late_phases(cfg), "micro_batch_phases", late_phases(cfg), "max_steps")


def late_phases(cfg):
    """What is wrong with a phase that starts at or after max_steps (no step of the run takes it,
    so the config would say what did not train), or None."""
    late = [f"{n}@{s}" for n, s in parse_phases(cfg.micro_batch_phases) if s >= cfg.max_steps]
    if not late:
        return None
    return (f"phase {late[0]} starts at or after max_steps {cfg.max_steps}: no step of the run takes it "
                     "(a phase N@S serves steps S+1 on)")


def resolve(cfg, corpus_vocab):
    """cfg with its defaults made explicit (what the genesis record holds): n_kv_head 0 becomes
    n_head, vocab_size 0 the corpus tokenizer's. A vocab smaller than the corpus's is refused:
    its tokens would index rows the model does not have."""
    cfg = dataclasses.replace(cfg, n_kv_head=cfg.n_kv_head or cfg.n_head,
                              vocab_size=cfg.vocab_size or corpus_vocab)
    if cfg.vocab_size < corpus_vocab:
        raise UsageError(f"--vocab_size={cfg.vocab_size} is out of range: the corpus's tokenizer has "
                         f"{corpus_vocab} tokens; the model's vocab must be at least that (larger pads)")
    return cfg


def usage(prog="train.py"):
    """The --help text: every key with its default and the comment it has in the Config block
    above, grouped as that block groups them (read from this file, so the two cannot drift);
    a "*" marks the decisive keys (the genesis record holds them)."""
    lines = [f"usage: {prog} [--preset=NAME] [--KEY=VALUE | --KEY VALUE ...]",
             "",
             "Every key of config.Config, spelled as below (underscores). --preset sets a group of keys",
             f"first ({', '.join(PRESETS)}), any other key overrides it.",
             "* decisive: in the genesis record; a resume or an audit must use the same value.",
             "  (unmarked: bookkeeping, may differ when resuming or auditing)"]
    defaults = dataclasses.asdict(Config())
    comment = []
    for raw in inspect.getsource(Config).splitlines()[1:]:
        text = raw.strip()
        if text.startswith("#"):
            comment.append(text.lstrip("# "))
            continue
        name, colon, rest = text.partition(":")
        if not colon or name not in FIELDS:
            continue
        if len(comment) == 1:            # a one-line comment heads a group of keys
            lines += ["", comment[0]]
            comment = []
        doc = " ".join(comment + [rest.partition("#")[2].strip()]).strip()
        key = f"{' ' if name in BOOKKEEPING else '*'} --{name}={defaults[name]}"
        lines += textwrap.wrap(doc, 100, initial_indent=f"{key:<32} ", subsequent_indent=" " * 33) or [key]
        comment = []
    return "\n".join(lines) + "\n"


def answered_help(argv, prog="train.py"):
    """Print usage() and return True when argv asks for it (-h, --help). train.py asks at the top
    of its file, before it imports torch, so that --help answers at once, and in main."""
    if any(arg in ("-h", "--help") for arg in argv):
        print(usage(prog), end="")
        return True
    return False


def decisive_config(cfg):
    """The config fields that decide the chain (the genesis record holds exactly these, so a
    run's chain does not depend on where it was written or how many threads it used)."""
    return {k: v for k, v in dataclasses.asdict(cfg).items()
            if k not in BOOKKEEPING and not (k in OPTIONAL and v == OPTIONAL[k])}


def spelled(value):
    """A config value as a command line spells it (true/false for a boolean)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def differences(mine, theirs):
    """Sorted keys whose values differ between two decisive-config dicts (an OPTIONAL key
    missing from one stands for its default)."""
    return [k for k in sorted(set(mine) | set(theirs))
            if mine.get(k, OPTIONAL.get(k)) != theirs.get(k, OPTIONAL.get(k))]



# ----------------------------------------------------------------------------- command lines
class CommandLine(argparse.ArgumentParser):
    """The command line of every command but train.py (whose keys are the Config block above:
    parse_config, usage). One convention:

    * one spelling per option, with underscores (--run_dir, --data_dir, --check_receipts): no
      aliases, no abbreviations (allow_abbrev=False), no subcommands;
    * the run is named by --run_dir, the corpus by --data_dir;
    * a command with modes (audit.py, data.py) declares them as one group of mutually exclusive
      flags (add_modes), and every other option that belongs to some modes in an argument group
      whose title names them (options_for); parse_args refuses such an option given with
      another mode (UsageError), so the groups in --help are the rule itself;
    * bad input is one line `PROG: error: ...` and exit 2; an unknown option is named first,
      whatever else the line gets wrong, with the known option closest to it (refuse_unknown);
    * every option's help says what it does and its default (set here, in argparse).

    A command defines its parser before it imports torch and calls answer_early() there, so
    `--help` answers at once.
    """

    def __init__(self, prog, description):
        super().__init__(prog=prog, description=description, allow_abbrev=False)
        self.mode_flags, self.mode_groups = None, []

    def add_modes(self, title, required=True):
        """The group of mutually exclusive mode flags, titled `title` in --help."""
        group = self.add_argument_group(title).add_mutually_exclusive_group(required=required)
        self.mode_flags = _Recorded(group, None)
        return self.mode_flags

    def options_for(self, modes, title):
        """An argument group, titled `title` in --help, of options that go only with the mode
        flags `modes` (their dests; None: no mode flag given)."""
        group = _Recorded(self.add_argument_group(title), tuple(modes))
        self.mode_groups.append(group)
        return group

    def mode(self, args):
        """The dest of the mode flag given in parsed `args` (None: none)."""
        for action in self.mode_flags.actions if self.mode_flags else ():
            value = getattr(args, action.dest)
            if value is not None and value is not False:      # --step 0 is a mode too
                return action.dest
        return None

    def parse_args(self, args=None, namespace=None):
        argv = sys.argv[1:] if args is None else list(args)
        self.refuse_unknown(argv)
        parsed = super().parse_args(argv, namespace)
        mode = self.mode(parsed)
        given = {a.partition("=")[0] for a in argv if a.startswith("--")}
        for group in self.mode_groups:
            for action in group.actions:
                if mode not in group.modes and given & set(action.option_strings):
                    allowed = " or ".join("--" + m if m else "no mode flag" for m in group.modes)
                    raise UsageError(f"{action.option_strings[0]} goes with {allowed}")
        return parsed

    def refuse_unknown(self, argv):
        """An unknown --option is the first error named, with the known one it is closest to
        (argparse would first name a missing mode, or a bad value of a known option)."""
        i = 0
        while i < len(argv):
            name, eq, _ = argv[i].partition("=")
            action = self._option_string_actions.get(name) if name.startswith("--") else None
            if name.startswith("--") and action is None and name != "--":
                known = [o[2:] for o in self._option_string_actions if o.startswith("--")]
                self.error(f"unrecognized option {name}{suggestion(name[2:], known)}")
            i += 2 if action is not None and action.nargs is None and not eq else 1

    def answer_early(self):
        """Parse sys.argv at the top of a command's file, before it imports torch: `--help` and
        bad input answer at once (main parses again, and reports the rest)."""
        try:
            self.parse_args()
        except UsageError as e:
            self.exit(2, f"{self.prog}: error: {e}\n")

    def error(self, message):
        """Bad input is one line and exit 2 (argparse would print the usage first)."""
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def python_command():
    """The interpreter as a printed command should name it: its path relative to this folder when
    it lies below it (.venv/bin/python, as README's commands run it), else "python"."""
    rel = os.path.relpath(sys.executable)
    return rel if not rel.startswith("..") and not os.path.isabs(rel) else "python"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised wherever the program is (stop_on_sigterm), so that it unwinds as from Ctrl-C."""


def _terminated(signum, frame):
    raise Terminated()


def stop_on_sigterm():
    """Make SIGTERM (kill, a scheduler's stop) unwind the program as Ctrl-C does (Terminated).
    A command calls it in its script block only, not in main(): main() may run inside another
    program (a test), whose signals are its own."""
    signal.signal(signal.SIGTERM, _terminated)


def stopped_by(interrupt):
    """(what stopped the program, its exit code) of a KeyboardInterrupt: Ctrl-C 130, SIGTERM 143
    (128 + the signal's number, as a shell reports a program the signal killed)."""
    return ("SIGTERM", 143) if isinstance(interrupt, Terminated) else ("Ctrl-C", 130)


def duration(seconds):
    """A duration as the commands print it (train.py's ETA, report.py's totals): 9s, 4m05s, 2h07m."""
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def out_of_memory(error, what):
    """The one line of bad input for an allocation that failed (`what`: "train this run", ...),
    or None when `error` is not one (a bug: the caller re-raises it). Python raises MemoryError;
    torch's allocators raise RuntimeError ("can't allocate memory" on the CPU, "out of memory"
    on a GPU, torch.OutOfMemoryError). Every command reports it as exit 2, never 1 (the audit's
    MISMATCH) and never a traceback: the machine, not the run, is short."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    if isinstance(error, MemoryError) or "can't allocate memory" in text or "out of memory" in text.lower():
        return f"not enough memory to {what} on this machine ({text})"
    return None


class _Recorded:
    """An argparse group that remembers the actions added to it (CommandLine's mode rule)."""

    def __init__(self, group, modes):
        self.group, self.modes, self.actions = group, modes, []

    def add_argument(self, *args, **kwargs):
        action = self.group.add_argument(*args, **kwargs)
        self.actions.append(action)
        return action


# ----------------------------------------------------------------------------- the per-step schedules
class ScheduleError(ValueError):
    """A micro_batch_phases string that is not N@S,N@S,... with increasing S."""


def parse_phases(text):
    """[(N, S), ...] of a micro_batch_phases string ("" -> [])."""
    if text == "":
        return []
    phases = []
    for part in text.split(","):
        n, at, s = part.strip().partition("@")
        if not at or not n.isdigit() or not s.isdigit():
            raise ScheduleError(f"phase {part!r} is not N@S (N micro-batches from step S+1 on)")
        # the length first: int() of a string of any length is slow
        if max(len(n), len(s)) > len(str(INT_LIMIT)) or max(int(n), int(s)) > INT_LIMIT:
            raise ScheduleError(f"phase {part!r}: N and S must be <= {INT_LIMIT} (config.LIMITS; docs/limits.md)")
        phases.append((int(n), int(s)))
    starts = [s for _, s in phases]
    if any(n < 1 for n, _ in phases) or starts[0] < 1 or any(b <= a for a, b in zip(starts, starts[1:])):
        raise ScheduleError(f"phases {text!r}: every N >= 1, and each S >= 1 and larger than the one before")
    return phases


def micro_batches_at(cfg, step):
    """N, the micro-batch count of step (1-based): the last phase whose start S is below step."""
    n = cfg.micro_batches
    for count, start in parse_phases(cfg.micro_batch_phases):
        if step > start:
            n = count
    return n


def phase_counts(cfg):
    """Every micro-batch count the run's steps use, in phase order."""
    return [cfg.micro_batches] + [n for n, _ in parse_phases(cfg.micro_batch_phases)]


def lr_at(cfg, step):
    """Learning rate of step (1-based), as the module docstring specifies."""
    if step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    span = max(cfg.max_steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    if cfg.lr_schedule == "cosine":
        import repops       # here, not at the top: config.py (train.py --help) loads without torch
        import torch
        c = repops.ops.cos(torch.tensor([repops.f32(math.pi * progress)], dtype=torch.float32)).tolist()[0]
        return cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1.0 + c)
    return cfg.lr - (cfg.lr - cfg.min_lr) * progress
