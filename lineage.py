"""A run started from another run's verified state, its parent (SPEC §21).

    python train.py --run_dir=runs/more --init_from=runs/default --max_steps=100   # the parent's latest checkpoint
    python train.py --run_dir=runs/b --init_from=runs/default@150 --lr=1e-3       # the state after step 150
    python audit.py --run_dir runs/more --step 1 --init_from runs/default         # the lineage checked too

--init_from=RUN[@STEP] (a run directory; a Hugging Face folder is hfllama.py's) starts a new run
(a new --run_dir) whose initial state is the parent's state after step STEP (default: its latest
checkpoint): every parameter and Adam moment as the parent's verified checkpoint holds it, the
step counter 0. The child's config is the parent's (its genesis record's decisive keys, its
config.json's bookkeeping keys), with any key the command line gives on top, except the
keys that decide the state's tensors (STATE_KEYS), which must stay the parent's. The child counts
its own steps from 1: its learning-rate schedule (warmup and decay to max_steps), its data
windows and its Adam bias correction are those of its own steps 1, 2, ... (SPEC §21 says what
this means for continuing a finished run). Its genesis record names the parent (`parent`: the
parent's run id, the step, that step's record hash and state hash), and checkpoint 0 holds the
initial state, so the child audits without its parent; with the parent's run directory or the
address of its public copy at hand (`audit.py --init_from RUN`, publish.py) the audit also
checks the lineage (check): the parent's chain up to the step, and that the child's initial
tensors are the parent's state of that step, leaf by leaf (the leaves of the parent's checkpoint
header of that step, proven by its record's state hash; records hold state roots only).

    python audit.py --run_dir runs/more --step 1 --init_from https://host/runs/default
"""
import dataclasses
import os
import re

import config
import hashchain
import published
import receipts
import repops
import rundir
from config import UsageError

# The keys that decide the state's tensors (names and shapes): a child keeps its parent's.
STATE_KEYS = ("vocab_size", "n_layer", "n_head", "n_kv_head", "d_model", "d_hidden", "tie_embeddings",
              "emb_norm", "quant", "lsq_repin")
PARENT_FIELDS = ("run", "step", "record_hash", "state_hash")
_AT_STEP = re.compile(r"^(.*)@(\d+)$")


def split(source):
    """(run directory, step or None) of --init_from=RUN[@STEP]."""
    m = _AT_STEP.match(source)
    return (m.group(1), int(m.group(2))) if m and not os.path.isdir(source) else (source, None)


def names_run(source):
    """Does --init_from name a run directory (it holds chain.jsonl), rather than an HF folder?"""
    return os.path.isfile(os.path.join(split(source)[0], "chain.jsonl"))


def open_parent(source):
    """(Run, step) of the parent --init_from names: its versions this code's, its chain verified up
    to the step, and a checkpoint of that step there (default: the latest with a record);
    UsageError otherwise."""
    run_dir, step = split(source)
    run = rundir.Run(run_dir)
    run.check_versions(repops.CONTRACT)
    ckpts = dict(run.checkpoints())
    if step is None:
        step = max((s for s in ckpts if s < run.chain.lines), default=None)
    if step not in ckpts:
        raise UsageError(f"--init_from={source}: {run_dir} has no checkpoint of step {step} (it has "
                         f"{receipts.ranges(sorted(ckpts)) or 'none'}); a child starts from a checkpointed state")
    try:
        run.chain.verify(upto=step)
    except hashchain.ChainError as e:
        raise UsageError(f"--init_from={source}: the chain of {run_dir} does not verify up to step {step}: "
                         f"{e.message}") from None
    return run, step


def identity(run, step):
    """The child's genesis field `parent`: the parent's run id (its genesis record hash), the
    step, and that step's record hash and state hash."""
    record = run.chain.records[step]
    return {"run": receipts.run_id(run.genesis), "step": step, "record_hash": record["record_hash"],
            "state_hash": record["state_hash"]}


def configure(cfg, argv, given):
    """The config of a new run started from --init_from=RUN[@STEP] (cfg.init_from): the parent's
    decisive keys (its genesis record), its bookkeeping keys (its config.json: the corpus, how
    often to checkpoint, ...), then the command line's keys (argv); a STATE_KEYS key given with
    another value than the parent's is refused, naming both."""
    run, _ = open_parent(cfg.init_from)
    parent = run.cfg
    bookkeeping = {k: run.recorded(k, config.FIELDS[k], getattr(config.Config(), k)) for k in config.BOOKKEEPING}
    bookkeeping.update(run_dir=cfg.run_dir, init_from=cfg.init_from)
    child = config.parse_config(argv, dataclasses.replace(parent, **bookkeeping))
    for key in STATE_KEYS:
        if key in given and getattr(child, key) != getattr(parent, key):
            raise UsageError(f"--{key}={config.spelled(getattr(child, key))} differs from the parent's "
                             f"{config.spelled(getattr(parent, key))} ({cfg.init_from}): a child continues its "
                             "parent's state, whose tensors this key decides; leave it out")
    return child


def started_from(genesis, source):
    """Did the run of `genesis` start from the run --init_from=RUN[@STEP] names (its run id, and
    the step where one is given)? A resume may name its parent again."""
    parent = genesis.get("parent")
    run_dir, step = split(source)
    return (isinstance(parent, dict) and parent.get("run") == receipts.run_id(rundir.Run(run_dir).genesis)
            and step in (None, parent.get("step")))


def load_into(state, source):
    """Set `state` (train.TrainState) to the parent's verified state after the step that source
    names, with the step counter 0; returns the genesis field `parent` (identity)."""
    run, step = open_parent(source)
    path = dict(run.checkpoints())[step]
    try:
        state.load(run.verified_checkpoint(step, path, mmap=state.offloaded))
    except hashchain.StateMismatch as e:
        raise UsageError(f"--init_from={source}: {e.message}") from None
    state.step = 0
    return identity(run, step)


def check(parent_dir, child):
    """What is wrong with the lineage of a child run (rundir.Run, or a published run), or None:
    parent_dir (a run directory, or a published run's address) must be the run its genesis
    `parent` names (else UsageError: the auditor's input), its chain must verify up to the step
    and hold the named record and state hash there, and every leaf of the child's checkpoint 0
    but `step` must be the same leaf of the parent's checkpoint of that step: records hold state
    roots only, so both leaf lists come from checkpoint headers, each proven against its record's
    state hash (Run.published_leaves; no tensor is read). The child's tensors are checked against
    its checkpoint 0's leaves elsewhere (the audit's start)."""
    genesis = child.genesis
    parent = genesis.get("parent")
    if (not isinstance(parent, dict) or set(parent) != set(PARENT_FIELDS) or not hashchain.is_int(parent["step"])
            or parent["step"] < 0):
        return f"genesis field parent is not an object of {', '.join(PARENT_FIELDS)} with a step >= 0"
    run = published.open_run(parent_dir)
    if receipts.run_id(run.genesis) != parent["run"]:
        raise UsageError(f"--init_from {parent_dir} is not this run's parent: its run id (genesis record hash) "
                         f"is {receipts.run_id(run.genesis)}, the genesis names {parent['run']}")
    step = parent["step"]
    try:
        run.chain.verify(upto=step)
    except hashchain.ChainError as e:
        return f"the parent's chain ({parent_dir}) breaks before step {step}: {e.message}"
    if step >= len(run.chain):
        return f"the parent's chain ({parent_dir}) has no step {step}"
    record = run.chain.records[step]
    for field in ("record_hash", "state_hash"):
        if record[field] != parent[field]:
            return (f"genesis field parent.{field} is {parent[field]}, the parent's record of step {step} "
                    f"holds {record[field]}")
    mine, theirs = child.published_leaves(0), run.published_leaves(step)
    if mine is None:
        return "the child's checkpoint 0 is missing, or its header's leaves do not hash to the genesis state hash"
    if theirs is None:
        return (f"the parent's checkpoint of step {step} ({parent_dir}) is missing, or its header's leaves do not "
                "hash to that step's state hash: the lineage cannot be checked without them")
    names = sorted((set(mine) | set(theirs)) - {"step"})
    bad = [n for n in names if mine.get(n) != theirs.get(n)]
    if bad:
        return f"the initial state is not the parent's state after step {step}: tensor {bad[0]} differs"
    return None
