"""Replay training steps on this machine and check them against the published hash chain.

    python audit.py --step 120                        # run directory runs/default
    python audit.py --step 15 --run_dir runs/x        # another run (--run is an alias)
    python audit.py --range 1:40                      # every step from 1 to 40
    python audit.py --all                             # the whole chain
    python audit.py --step 17 --trace a.jsonl         # also a per-operator trace (optrace.py)

The audit vouches only for what it checked, and checks everything it vouches for:
1. the chain's links up to the last audited step: a malformed, edited, missing, inserted or
   reordered record is a break at its step;
2. the genesis record, field by field, against one recomputed here from its config, this code
   and this corpus (so code, data, tokenizer and initial state are checked), and config.json
   against the genesis config;
3. the checkpoint the replay starts from, and every checkpoint file from there to the last
   audited step, plus the run's latest checkpoint (the model people download): tensors against
   the record's Merkle leaves, metadata against the record;
4. every replayed step's record against the published one, field for field: the state hash
   (naming the first differing tensor), batch digest, loss, gradient norm, learning rate, and
   any field the published record has that a replay does not produce, or lacks.

Replays use train.train_step (the one step function) on one device with no topology emulation.
Each problem prints as "MISMATCH at step S: ..." in step order, then what the audit cost.
Exit code: 0 match, 1 mismatch, 2 bad input (missing run or data, step out of range, malformed
checkpoint or config). The audit only reads the run directory: it creates, renames and deletes
nothing there.
"""
import argparse
import dataclasses
import json
import os
import resource
import sys
import time

import hashchain
import optrace
import repops
import rundir
from config import UsageError, validate
from data import DataError, DataMismatch, TokenData
from train import StepRefused, TrainState, code_digest, genesis_record, step_record, train_step

# Fields compared first: a changed batch explains a changed state, and the state names a tensor.
FIRST_FIELDS = ("kind", "step", "batch_digest", "state_hash")


def _canon(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def compare(replayed, published):
    """The first difference between a replayed record and the published one, or None.

    Every field is compared as exact JSON (floats included); a field the published record has
    and a replay does not produce, or lacks, is a difference. Names the field (and the tensor
    or key inside it)."""
    mine = json.loads(json.dumps(replayed))
    theirs = {k: v for k, v in published.items() if k not in ("prev", "record_hash")}
    keys = [k for k in FIRST_FIELDS if k in mine or k in theirs]
    keys += sorted((set(mine) | set(theirs)) - set(FIRST_FIELDS))
    for key in keys:
        if key not in theirs:
            return f"field {key} is missing from the published record"
        if key not in mine:
            return f"field {key} is not part of a {mine.get('kind', '')} record (published {_canon(theirs[key])[:60]})"
        a, b = mine[key], theirs[key]
        if _canon(a) == _canon(b):
            continue
        if key == "state_hash":
            leaves = theirs.get("tensor_hashes") if isinstance(theirs.get("tensor_hashes"), dict) else {}
            bad = [n for n, h in mine["tensor_hashes"].items() if leaves.get(n) != h]
            what = (f"tensor {bad[0]}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
                    if bad else "the state hash")
            return f"field state_hash: {what} differs from the replay"
        if isinstance(a, dict) and isinstance(b, dict):
            sub = sorted(k for k in set(a) | set(b) if _canon(a.get(k)) != _canon(b.get(k)))[0]
            return (f"field {key}.{sub} differs: replayed {_canon(a.get(sub))[:70]}, "
                    f"published {_canon(b.get(sub))[:70]}")
        return f"field {key} differs: replayed {_canon(a)[:70]}, published {_canon(b)[:70]}"
    return None


def trace_step(state, data, cfg, path, record):
    """train_step under optrace.OpTrace, writing the trace to path; returns the step's fields."""
    with optrace.OpTrace() as rec:
        fields = train_step(state, data, cfg)
    try:
        optrace.write(path, rec.entries, {"step": state.step, "state_hash": record.get("state_hash"),
                                          "code_digest": code_digest()})
    except OSError as e:
        raise UsageError(f"cannot write the trace {path}: {e}") from None
    print(f"trace: {len(rec.entries)} operators of step {state.step} written to {path}")
    return fields


class Audit:
    def __init__(self, run_dir, data_dir=None, device="cpu"):
        self.run = rundir.Run(run_dir)          # reads only: repair=False
        self.device = device
        self.bytes_read = os.path.getsize(self.run.chain.path)
        self.findings = []                       # (step, message), every problem found
        self.checked = set()                     # checkpoint steps already verified
        self.cfg = dataclasses.replace(self.run.cfg, device=device)
        validate(self.cfg)                       # the genesis config, and this machine's device
        self.data = TokenData(data_dir or self.run.recorded_data_dir(), self.cfg.seed)
        try:
            self.data.verify()
        except DataMismatch as e:               # the genesis comparison and the replay say more
            print(f"warning: {e}; the replay shows which steps it affects")

    def find(self, step, message):
        if (step, message) not in self.findings:
            self.findings.append((step, message))

    def steps(self, first, last):
        """Check that steps first..last can be audited: a chain break at or before `last` is a
        finding (the steps from it on cannot be vouched for); returns the last replayable step."""
        chain = self.run.chain
        try:
            chain.verify(upto=last)
        except hashchain.ChainError as e:
            self.find(e.line - 1, e.message)
            return min(last, e.line - 2)
        if last >= len(chain):
            raise UsageError(f"steps {first}..{last} are not in the chain (it holds steps 1..{len(chain) - 1})")
        return last

    def check_genesis(self):
        state = TrainState(self.cfg, self.data.vocab_size, self.device)
        diff = compare(genesis_record(state, self.data, self.cfg), self.run.genesis)
        if diff:
            self.find(0, f"genesis record: {diff}")
        for key in self.run.config_json_differences():
            self.find(0, f"config.json disagrees with the genesis record on {key}")
        return state

    def checkpoint(self, step, path):
        """Verify one checkpoint file against its record (once); a finding if it does not match."""
        if step in self.checked:
            return None
        self.checked.add(step)
        try:
            tensors = self.run.verified_checkpoint(step, path)
        except hashchain.StateMismatch as e:
            self.find(step, f"checkpoint {path} does not match the chain: {e.message}")
            return None
        except hashchain.ChainError as e:       # the chain breaks before this checkpoint
            self.find(e.line - 1, e.message)
            return None
        except hashchain.CheckpointError as e:
            raise UsageError(str(e)) from None
        self.bytes_read += os.path.getsize(path)
        return tensors

    def start_state(self, genesis_state, before):
        """A verified state at the latest checkpoint <= before, else the genesis state."""
        for step, path in reversed(self.run.checkpoints()):
            if step <= before and (tensors := self.checkpoint(step, path)) is not None:
                try:
                    genesis_state.load(tensors)
                    return genesis_state
                except hashchain.StateMismatch as e:
                    self.find(step, f"checkpoint {path}: {e.message}")
        return genesis_state

    def replay(self, first, last, trace=None):
        """Audit steps first..last; findings accumulate in self.findings (empty: MATCH)."""
        last_ok = self.steps(first, last)
        if last_ok < 0:
            return
        state = self.start_state(self.check_genesis(), first - 1)
        checkpoints = dict(self.run.checkpoints())
        while state.step < last_ok:
            step = state.step + 1
            try:
                if trace and step == last:
                    fields = trace_step(state, self.data, self.cfg, trace, self.run.chain.records[step])
                else:
                    fields = train_step(state, self.data, self.cfg)
            except StepRefused as e:        # the published run cannot have recorded this step
                self.find(step, str(e))
                return
            diff = compare(step_record(state, self.data, self.cfg, fields), self.run.chain.records[step])
            if diff:
                self.find(step, diff)
                return
            if step in checkpoints:
                self.checkpoint(step, checkpoints[step])
            if step % 25 == 0 and step < last_ok:       # long audits show progress
                print(f"audit: steps up to {step} match, replaying to {last_ok}", flush=True)
        self.check_later_checkpoints(last_ok)

    def check_later_checkpoints(self, last):
        """The run's latest checkpoint (what people download) and any file beyond the chain."""
        later = [(s, p) for s, p in self.run.checkpoints() if s > last]
        for step, path in later:
            if step >= self.run.chain.lines:
                self.find(step, f"checkpoint {path} has no record in the chain")
        if later and later[-1][0] < self.run.chain.lines:
            self.checkpoint(*later[-1])         # behind a chain break, the break is reported


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
        first, final = args.step, args.step
    if not 1 <= first <= final:
        raise UsageError(f"steps {first}..{final}: steps start at 1 and a range runs forward")
    return first, final


def main(argv):
    ap = argparse.ArgumentParser(description="Replay steps and check them against the hash chain.")
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--step", type=int, help="the step to audit")
    group.add_argument("--range", help="A:B, every step from A to B")
    group.add_argument("--all", action="store_true", help="every step in the chain")
    ap.add_argument("--run_dir", "--run", default="runs/default", help="run directory (default %(default)s)")
    ap.add_argument("--data_dir", "--data", help="corpus directory (default: the run's config.json data_dir)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="replay on cpu (default) or cuda: same bits")
    ap.add_argument("--trace", metavar="FILE", help="with --step: write a per-operator trace of "
                    "the step to FILE (compare two with python optrace.py A B)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        if args.trace and args.step is None:
            raise UsageError("--trace records one step: use it with --step N")
        audit = Audit(args.run_dir, args.data_dir, args.device)
        first, last = parse_steps(args, audit.run.chain.lines - 1)
        audit.replay(first, last, args.trace)
    except DataMismatch as e:       # a bundle chunk is not what the run published
        print(f"MISMATCH: {e}")
        return 1
    except (UsageError, DataError, hashchain.HashChainError, repops.RepOpsBuildError) as e:
        print(f"audit.py: error: {e}", file=sys.stderr)
        return 2
    for step, message in sorted(audit.findings, key=lambda f: f[0]):
        print(f"MISMATCH at step {step}: {message}")
    if not audit.findings:
        print(f"MATCH: steps {first}..{last} of {args.run_dir} replay to the published records "
              f"(step {last}: {audit.run.chain.records[last]['state_hash'][:16]}), and the "
              "checkpoints checked match the chain")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"audit cost: {time.perf_counter() - t0:.1f} s, peak memory {peak_mib:.0f} MiB, "
          f"read {audit.bytes_read / 1e6:.1f} MB (+ token windows)")
    return 1 if audit.findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
