"""The receipt protocol's commands, which audit.py runs (its docstring shows the command lines);
the protocol's logic is receipts.py, the replay that makes a receipt is audit.py.

    python audit.py --check_receipts receipts/        # check_receipts_command
    python audit.py --coverage receipts/ --redundancy 2          # coverage_command
    python audit.py --reveal_salts 1:40 --out s.json  # reveal_command
    python audit.py --plan --auditors 8 --redundancy 2 --seed 42 # plan_command
    python audit.py --anchors anchors.jsonl           # anchors_command

Each command takes audit.py's parsed arguments and returns the exit code; bad input raises
UsageError (or a DataError, HashChainError), which audit.main reports as one line, exit 2.
"""
import dataclasses
import json
import os
import secrets
import statistics
import sys
import time

import receipts
import rundir
from config import Config, UsageError, micro_batches_at, validate
from data import TokenData
from train import TrainState, train_step


# ----------------------------------------------------------------------------- receipts
def receipt_results(args):
    """The opened run and [receipts.Result] for every receipt under the directory given,
    checked with the run's secret or with revealed salts (--salts)."""
    run = rundir.Run(args.run_dir)
    run.chain.verify()
    salt_of = receipts.salt_lookup(run.dir, run.genesis, args.salts)
    return run, receipts.check_receipts(args.check_receipts or args.coverage, run.chain, salt_of)


def summarize(results, directory):
    """Print the count of each status; refuse (exit 2) if any receipt is malformed."""
    counts = {s: sum(r.status == s for r in results) for s in ("accepted", "rejected", "malformed", "unchecked")}
    print(f"receipts under {directory}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n or s != "unchecked"))
    if counts["malformed"]:
        raise UsageError(f"{counts['malformed']} malformed receipt(s) under {directory} (listed above)")
    return counts


def check_receipts_command(args):
    _, results = receipt_results(args)
    for r in results:
        about = [f"step {r.receipt['step']} by {receipts.shown(r.receipt['auditor'])}"] if r.receipt else []
        print(f"{r.status:9s} {receipts.shown(r.path)}: "
              + ": ".join(about + [receipts.shown(r.reason)] * bool(r.reason)))
    return 1 if summarize(results, args.check_receipts)["rejected"] else 0


def coverage_command(args):
    run, results = receipt_results(args)
    first, last = rundir.chain_steps(run, args.steps)
    counts = receipts.coverage(results, first, last)
    summarize(results, args.coverage)
    total = last - first + 1
    for need in sorted({1, args.redundancy}):
        steps = [s for s, n in counts.items() if n >= need]
        print(f"steps {first}..{last} with >= {need} accepted receipt{'s' * (need > 1)} from distinct auditors: "
              f"{len(steps)}/{total} ({100 * len(steps) / total:.1f}%): {receipts.ranges(steps)}")
    print(f"steps with none: {receipts.ranges(s for s, n in counts.items() if n == 0)}")
    return 0 if all(n >= args.redundancy for n in counts.values()) else 1


def reveal_command(args):
    run = rundir.Run(args.run_dir)
    first, last = rundir.chain_steps(run, args.reveal_salts, "--reveal_salts")
    secret = receipts.read_secret(run.dir, "revealing salts needs the publisher's secret")
    text = json.dumps(receipts.reveal(secret, receipts.run_id(run.genesis), first, last), indent=1) + "\n"
    if not args.out:
        sys.stdout.write(text)
        return 0
    try:
        with open(args.out, "w") as f:
            f.write(text)
    except OSError as e:
        raise UsageError(f"cannot write {args.out}: {e.strerror}") from None
    print(f"salts of steps {first}..{last} written to {args.out}: anyone can now check those steps' "
          f"receipts with --check_receipts DIR --salts {args.out}")
    return 0


# ----------------------------------------------------------------------------- plan
def tokens(cfg):
    """Tokens of one micro-batch (a step has micro_batches_at(cfg, step) of them)."""
    return cfg.micro_batch_size * cfg.seq_len


def probe_step(cfg, state, data, repeats=5):
    """Seconds of one replayed step of `state` under `cfg` on this machine: the median of
    `repeats` steps after a warm-up one."""
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        train_step(state, data, cfg)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def plan_command(args):
    """Every step of --steps to --redundancy C distinct auditors of --auditors K, balanced by
    replay cost; the estimated hours per auditor (receipts.replay_hours, from probe_step); and
    the chance that a tampered step goes undetected: f^C, if each auditor is absent or
    dishonest with probability f independently of the others and of the step (the seed, kept
    private, is what makes the assignment unpredictable). f^C is an upper bound: an audit of a
    later step also replays the steps between it and its checkpoint."""
    if args.auditors is None:
        raise UsageError("--plan needs --auditors K")
    if not 0 <= args.absent <= 1:
        raise UsageError(f"--absent {args.absent}: a fraction of the auditors, in [0, 1]")
    run = rundir.Run(args.run_dir)
    first, last = rundir.chain_steps(run, args.steps)
    seed = secrets.randbits(63) if args.seed is None else args.seed
    cfg, vocab = run.cfg, run.vocab_size
    validate(cfg)
    ckpts = [s for s, _ in run.checkpoints() if s < len(run.chain)]
    steps_replayed = receipts.replay_costs(first, last, ckpts)
    # a step's cost is its micro-batches (phases change their number from step to step)
    costs = receipts.replay_costs(first, last, ckpts, lambda s: micro_batches_at(cfg, s))
    assignment = receipts.plan(costs, args.auditors, args.redundancy, seed)
    # The probe: one micro-batch of the run's model, or of the default model where that is less
    # work (a large run's model need not be timed here; a small one's overheads are measured).
    run_state = TrainState(cfg, vocab, args.device)
    probes = [(dataclasses.replace(c, micro_batches=1, micro_batch_phases=""), s) for c, s in
              ((cfg, run_state), (Config(), TrainState(Config(), vocab, args.device)))]
    probe_cfg, probe_state = min(probes, key=lambda p: p[1].n_params() * tokens(p[0]))
    probe_s = probe_step(probe_cfg, probe_state, TokenData(args.data_dir or run.recorded_data_dir(), cfg.seed))
    run_work = run_state.n_params() * tokens(cfg)
    probe_work = probe_state.n_params() * tokens(probe_cfg)
    print(f"plan: steps {first}..{last} of {args.run_dir} for {args.auditors} auditors, each step replayed "
          f"by {args.redundancy} of them, seed {seed}" + (" (drawn now: keep it private)" if args.seed is None else ""))
    print(f"replay cost: a probe step ({probe_state.n_params():,} params x {tokens(probe_cfg)} tokens) took "
          f"{probe_s:.3f} s here; a step of this run ({run_state.n_params():,} params x "
          f"{tokens(cfg) * micro_batches_at(cfg, last)} tokens) about "
          f"{receipts.replay_hours(micro_batches_at(cfg, last), probe_s, probe_work, run_work) * 3600:.3f} s")
    print("auditor  steps  replayed  est. hours  assigned steps")
    for a, steps in enumerate(assignment, start=1):
        replayed = sum(steps_replayed[s] for s in steps)
        hours = receipts.replay_hours(sum(costs[s] for s in steps), probe_s, probe_work, run_work)
        print(f"{a:7d}  {len(steps):5d}  {replayed:8d}  {hours:10.2g}  {receipts.ranges(steps)}")
    print(f"a tampered step goes undetected only if all {args.redundancy} of its auditors are absent or "
          f"dishonest: with each so with probability f = {args.absent} independently, "
          f"f^{args.redundancy} = {args.absent ** args.redundancy:.3g}")
    return 0


# ----------------------------------------------------------------------------- anchors
def anchors_command(args):
    run = rundir.Run(args.run_dir)
    anchors = receipts.read_anchors(args.anchors)
    if os.path.realpath(args.anchors) == os.path.realpath(run.dir / receipts.ANCHORS):
        print("note: this is the run's own anchors.jsonl; anchors pin the chain only as copies "
              "published outside the run")
    found = receipts.first_contradiction(run.chain, anchors)
    if found:
        print(f"MISMATCH at step {found[0]}: {found[1]}")
        return 1
    latest = max(anchors, key=lambda a: a["step"])
    print(f"ANCHORED: the chain agrees with all {len(anchors)} anchors of {args.anchors} (latest: step "
          f"{latest['step']}, anchored at {latest['utc']})")
    return 0
