"""The publisher's side of the unit audits: any state, or what one unit audit needs, by replay.

    p = Publisher("runs/x")                         # the run, its chain verified
    p.materialize(11, "pub/", params_only=True)     # pub/params_00000011.safetensors (params.* only)
    p.reveal(12, "micro_batch:3", "pub/")           # the parameters after step 11, the unit list
    p.reveal(12, "fold:0:4", "pub/")                # fold:0:2 and fold:2:2, the unit list
    p.reveal(12, "update", "pub/")                  # S (fold:0:4), the whole state after 11, the list

A state is replayed from the latest checkpoint at or before it that verifies, step by step with
train.train_step (the trainer's step), each replayed state checked against its record's state
hash; a piece of step s (a micro-batch gradient or a fold node) is made from the state after
s - 1 by train.micro_batch_gradient and treefold's Fold over the node's own subtree (a node's
subtree is the left-complete tree of its size). Nothing extra has to be stored to serve any
step. The witnesses are never revealed: they are what a micro-batch receipt proves.

The files (SPEC §20.6): units.state_file (SPEC §13's layout: the state's tensors, all or the
params.* ones, with the record's metadata), units.unit_file (one float32 tensor [P + 1] named by
the unit; metadata {"step", "unit"}) and units.list_file (the step's unit list, as the trainer
writes it, checked against units_root; made again by replaying the step when the run has lost
it). They go to a directory outside the run (rundir.check_outside): readers never write into it.
"""
import dataclasses

import receipts
import rundir
import train
import treefold
import units
from config import UsageError, micro_batches_at, resolve, validate
from data import TokenData


class Publisher:
    def __init__(self, run_dir, data_dir=None, device="cpu"):
        self.run = rundir.Run(run_dir)
        self.run.chain.verify()
        self.cfg = dataclasses.replace(self.run.cfg, device=device, dead_tensor_steps=0)
        validate(self.cfg)
        self.cfg = resolve(self.cfg, self.run.vocab_size)
        self.data_dir = data_dir or self.run.recorded_data_dir()
        self.device = device
        self._corpus = None

    @property
    def corpus(self):
        if self._corpus is None:
            self._corpus = TokenData(self.data_dir, self.cfg.seed)
        return self._corpus

    def check_step(self, step, first=0):
        if not first <= step < len(self.run.chain):
            raise UsageError(f"step {step} is not in the chain (it holds steps {first}..{len(self.run.chain) - 1})")

    # ------------------------------------------------------------------------- states
    def state(self, step):
        """The verified TrainState after `step`: the latest checkpoint at or before it that
        verifies (else the genesis state), then the trainer's step up to `step`, each replayed
        state against its record (the replay needs no unit commitments: they change no state)."""
        def bad(s, path, error):
            raise UsageError(f"checkpoint {path} does not verify: {error}")

        cfg = dataclasses.replace(self.cfg, unit_commits=False)
        state = train.TrainState(cfg, self.run.vocab_size, self.device)
        _, tensors = self.run.latest_checkpoint(step, bad, mmap=cfg.offload)
        if tensors is not None:
            state.load(tensors)
        records = self.run.chain.records
        while state.step < step:
            fields = train.train_step(state, self.corpus, cfg)
            fields["grad_root"].result()
            if state.hash()[0] != records[state.step]["state_hash"]:
                raise UsageError(f"the replay of step {state.step} does not reach its record's state hash: "
                                 "this machine or code does not reproduce the run (audit.py --step "
                                 f"{state.step})")
        if state.hash()[0] != records[step]["state_hash"]:
            raise UsageError(f"the state of step {step} does not match its record (a genesis state "
                             "recomputed by other code?)")
        return state

    def materialize(self, step, out, params_only=False):
        """Write the state after `step` to units.state_file(out, step); returns the path."""
        self.check_step(step)
        tensors = self.state(step).tensors()
        if params_only:
            tensors = {n: tensors[n] for n in tensors if n.startswith("params.")}
        record = self.run.chain.records[step]
        path = units.state_file(out, step, params_only)
        rundir.save_checkpoint(path, tensors, {"step": step, "state_hash": record["state_hash"],
                                                   "tensor_hashes": record["tensor_hashes"]})
        return path

    # ------------------------------------------------------------------------- pieces
    def pieces(self, state, step, lo, size, wanted):
        """{name: tensor} of the units in `wanted` inside the node (lo, size) of step `step`: its
        micro-batches' gradients from `state` (after step - 1), folded over the node's subtree."""
        found = {}

        def observe(sub_lo, sub_size, t):
            name = units.node_name(lo + sub_lo, sub_size)
            if name in wanted:
                found[name] = t

        fold = treefold.Fold(size, observe=observe)
        for i in range(size):
            grad = train.micro_batch_gradient(state, self.corpus, self.cfg, step, lo + i)
            if units.node_name(lo + i, 1) in wanted:
                found[units.node_name(lo + i, 1)] = grad
            fold.push(grad)
        return found

    def unit_list(self, step, state=None):
        """The step's unit list: the run's (units/), checked against units_root, or made again by
        replaying the step with the run's secret (it commits the witnesses)."""
        n = micro_batches_at(self.cfg, step)
        record = self.run.chain.records[step]
        path = units.list_path(self.run.dir, step)
        if path.exists():
            entries = units.read_list(path, step)
            units.check_list(entries, step, n, record.get("units_root"))
            return entries
        secret = receipts.read_secret(self.run.dir, "the unit list of a step is made again with the "
                                      "run's secret (the publisher's)")
        state = state or self.state(step - 1)
        fields = train.train_step(state, self.corpus, self.cfg)
        fields["grad_root"].result()
        _, entries = fields["units"].finish(receipts.salt(secret, step))
        units.check_list(entries, step, n, record.get("units_root"))
        return entries

    def reveal(self, step, name, out):
        """Write what the audit of unit `name` of `step` needs to `out`; returns the paths."""
        self.check_step(step, first=1)
        if not self.cfg.unit_commits:
            raise UsageError(f"{self.run.dir} has no unit commitments (unit_commits): there are no units to reveal")
        n = micro_batches_at(self.cfg, step)
        try:
            kind = units.parse(name, n)
        except units.UnitsError as e:
            raise UsageError(f"step {step}: {e}") from None
        paths = []
        entries = self.unit_list(step)
        units.write_list(units.list_file(out, step), step, entries)
        paths.append(units.list_file(out, step))
        if kind[0] == "micro_batch":
            paths.append(self.materialize(step - 1, out, params_only=True))
            return paths
        state = self.state(step - 1)
        if kind[0] == "fold":
            lo, size = kind[1:]
            wanted = set(units.children(lo, size))
        else:
            lo, size, wanted = 0, n, {units.root_name(n)}
            path = units.state_file(out, step - 1)
            record = self.run.chain.records[step - 1]
            rundir.save_checkpoint(path, state.tensors(), {"step": step - 1, "state_hash": record["state_hash"],
                                                               "tensor_hashes": record["tensor_hashes"]})
            paths.append(path)
        for unit, t in sorted(self.pieces(state, step, lo, size, wanted).items()):
            path = units.unit_file(out, step, unit)
            rundir.save_checkpoint(path, {unit: t}, {"step": step, "unit": unit})
            paths.append(path)
        return paths


# ----------------------------------------------------------------------------- the commands
def materialize_command(args):
    """audit.py --materialize S --out DIR [--params_only]: the state after step S, by replay."""
    if not args.out:
        raise UsageError("--materialize needs --out DIR (a directory outside the run)")
    path = Publisher(args.run_dir, args.data_dir, args.device).materialize(args.materialize, args.out,
                                                                          args.params_only)
    print(f"state of step {args.materialize} ({'parameters only' if args.params_only else 'all tensors'}) "
          f"written to {path}")
    return 0


def reveal_command(args):
    """audit.py --reveal_unit S:UNIT --out DIR: what the audit of that unit needs."""
    if not args.out:
        raise UsageError("--reveal_unit needs --out DIR (a directory outside the run)")
    if args.params_only:
        raise UsageError("--params_only goes with --materialize")
    step, _, unit = args.reveal_unit.partition(":")
    if not step.isdigit() or not unit:
        raise UsageError(f"--reveal_unit expects STEP:UNIT (12:micro_batch:3, 12:fold:0:4, 12:update), "
                         f"got {args.reveal_unit!r}")
    paths = Publisher(args.run_dir, args.data_dir, args.device).reveal(int(step), unit, args.out)
    print(f"revealed for the audit of {unit} of step {step}: " + ", ".join(p.name for p in paths) + f" in {args.out}")
    return 0
