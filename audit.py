"""Replay training steps on this machine and check them against the published hash chain.

    python audit.py --step 120                 # run directory runs/default
    python audit.py --step 15 --run runs/x     # another run
    python audit.py --range 1:40               # every step from 1 to 40
    python audit.py --all                      # the whole chain
    python audit.py --step 17 --trace a.jsonl  # also a per-operator trace (see optrace.py)

It verifies the chain's links, loads the latest checkpoint at or before the first step to
check (verified tensor by tensor against the chain), replays with train.train_step (the one
step function, single device, no topology emulation) and compares every replayed record with
the published one. Prints MATCH or the first mismatch (step, and tensor or field), and what
the audit cost. Exit code: 0 match, 1 mismatch, 2 bad input (missing run, step out of range,
unreadable checkpoint or chain).
"""
import argparse
import json
import os
import resource
import sys
import time

import hashchain
from data import DataError, DataMismatch, TokenData
from optrace import trace_step
from train import (Config, StepRefused, TrainState, UsageError, checkpoint_dir, code_digest,
                   load_verified_checkpoint, step_record, train_step)


class Audit:
    def __init__(self, run_dir, data_dir=None, device="cpu"):
        self.device = device
        self.bytes_read = 0
        self.findings = []           # mismatches found while setting up (bad checkpoints)
        path = os.path.join(run_dir, "chain.jsonl")
        if not os.path.isdir(run_dir):
            raise UsageError(f"no run directory {run_dir}")
        if not os.path.exists(path):
            raise UsageError(f"no chain in {run_dir} (chain.jsonl missing)")
        self.run_dir = run_dir
        self.chain = hashchain.Chain(path)
        note = self.chain.load(repair=False)   # an audit never writes to the run
        self.bytes_read += os.path.getsize(path)
        if note:
            print("note: " + note)
        if not self.chain.records or self.chain.records[0].get("kind") != "genesis":
            raise UsageError(f"{path} has no genesis record")
        genesis = self.chain.records[0]
        try:
            self.cfg = Config(**genesis["config"])
        except TypeError as e:
            raise UsageError(f"genesis config is not one this code understands: {e}") from None
        self.data = TokenData(data_dir or recorded_data_dir(run_dir), self.cfg.seed)
        self.data.check_run(genesis)     # DataMismatch unless it is the data the run names
        try:
            self.data.verify()
        except DataMismatch as e:
            print(f"warning: {e}; the replay shows which steps it affects")
        if code_digest() != genesis["code_digest"]:
            print("warning: this code differs from the code that trained the run "
                  "(code digest); a MATCH still proves the steps reproduce")
        self.vocab = genesis["vocab_size"]

    def last_step(self):
        return len(self.chain) - 1

    def chain_mismatch(self):
        """(step, message) of the first broken link, or None."""
        try:
            self.chain.verify()
        except hashchain.ChainError as e:
            return e.line - 1, e.message
        return None

    def start_state(self, before):
        """A verified state at the latest checkpoint <= before (or the genesis state)."""
        state = TrainState(self.cfg, self.vocab, self.device)
        for step, path in reversed(hashchain.list_checkpoints(checkpoint_dir(self.run_dir))):
            if step > before:
                continue
            try:
                state.load(load_verified_checkpoint(path, self.chain.records[step]))
                self.bytes_read += os.path.getsize(path)
                return state
            except hashchain.StateMismatch as e:
                self.findings.append((step, f"checkpoint {path} does not match the chain: {e.message}"))
            except hashchain.CheckpointError as e:
                raise UsageError(str(e)) from None
        if state.hash()[0] != self.chain.records[0]["state_hash"]:
            self.findings.append((0, "the initial state recomputed from the genesis config does not "
                                     "match the genesis record"))
        return state

    def replay(self, first, last, trace=None):
        """Replay up to `last`, comparing every step from the checkpoint on; first mismatch.
        With trace (a path), step `last` is recorded operator by operator there (optrace.py)."""
        state = self.start_state(first - 1)
        while state.step < last:
            try:
                if trace and state.step + 1 == last:
                    fields = trace_step(state, self.data, self.cfg, trace, self.chain.records[last])
                else:
                    fields = train_step(state, self.data, self.cfg)
            except StepRefused as e:    # the published run cannot have recorded this step
                return state.step + 1, str(e)
            replayed = step_record(state, self.data, self.cfg, fields)
            diff = compare(replayed, self.chain.records[state.step])
            if diff:
                return state.step, diff
            if state.step % 25 == 0 and state.step < last:   # long audits show progress
                print(f"audit: steps up to {state.step} match, replaying to {last}", flush=True)
        return None


def recorded_data_dir(run_dir):
    """The corpus the run was trained on, as its config.json names it (not part of the chain:
    where the data lives is not part of what is audited)."""
    try:
        with open(os.path.join(run_dir, "config.json")) as f:
            return json.load(f)["data_dir"]
    except (OSError, ValueError, KeyError):
        return Config.data_dir


def compare(replayed, published):
    """Describe the first difference between a replayed and a published record, or None."""
    if replayed["state_hash"] != published.get("state_hash"):
        theirs = published.get("tensor_hashes", {})
        bad = [n for n, h in replayed["tensor_hashes"].items() if theirs.get(n) != h]
        what = f"tensor {bad[0]}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "") if bad else "state hash"
        extra = " (the batch differs too: data changed)" if replayed["batch_digest"] != published.get("batch_digest") else ""
        return f"{what} differs{extra}"
    for key in ("batch_digest", "loss_bits", "grad_norm_bits", "lr_bits"):
        if replayed[key] != published.get(key):
            return f"{key} differs: replayed {replayed[key]}, published {published.get(key)}"
    return None


def parse_steps(args, last):
    if args.all:
        return 1, last
    if args.range:
        a, _, b = args.range.partition(":")
        try:
            first, final = int(a), int(b)
        except ValueError:
            raise UsageError(f"--range expects A:B, got {args.range!r}") from None
    else:
        first = final = args.step
    if not (1 <= first <= final <= last):
        raise UsageError(f"steps {first}..{final} are not in the chain (it holds steps 1..{last})")
    return first, final


def main(argv):
    ap = argparse.ArgumentParser(description="Replay steps and check them against the hash chain.")
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--step", type=int, help="the step to audit")
    group.add_argument("--range", help="A:B, every step from A to B")
    group.add_argument("--all", action="store_true", help="every step in the chain")
    ap.add_argument("--run", default=Config.run_dir, help="run directory (default %(default)s)")
    ap.add_argument("--data", help="corpus directory (default: the run's data_dir)")
    ap.add_argument("--device", default="cpu", help="replay on cpu (default) or cuda: same bits")
    ap.add_argument("--trace", metavar="FILE", help="with --step: write a per-operator trace of "
                    "the step to FILE (compare two with python optrace.py A B)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        if args.trace and args.step is None:
            raise UsageError("--trace records one step: use it with --step N")
        audit = Audit(args.run, args.data, args.device)
        first, last = parse_steps(args, audit.last_step())
        broken = audit.chain_mismatch()
        result = (broken if broken and broken[0] <= last else None)
        if result is None:
            result = audit.replay(first, last, args.trace)
    except DataMismatch as e:       # a bundle chunk, or the manifest, is not what was published
        print(f"MISMATCH: {e}")
        return 1
    except (UsageError, DataError, hashchain.HashChainError) as e:
        print(f"audit.py: error: {e}", file=sys.stderr)
        return 2
    for step, message in audit.findings:
        print(f"MISMATCH at step {step}: {message}")
    if result:
        print(f"MISMATCH at step {result[0]}: {result[1]}")
    elif audit.findings:
        print(f"steps {first}..{last} replay to the published state hashes from an earlier "
              "checkpoint, but the artifacts above do not match the chain")
    else:
        print(f"MATCH: steps {first}..{last} of {args.run} replay to the published state hashes "
              f"(step {last}: {audit.chain.records[last]['state_hash'][:16]})")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"audit cost: {time.perf_counter() - t0:.1f} s, peak memory {peak_mib:.0f} MiB, "
          f"read {audit.bytes_read / 1e6:.1f} MB (+ token windows)")
    return 1 if result or audit.findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
