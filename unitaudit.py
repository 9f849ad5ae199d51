"""Audit one unit of a step (units.py): one micro-batch, one fold node or the update; and the
publisher's side, which serves any state or any unit's inputs by replay.

    audit = UnitAudit("runs/x", step=12)     # the chain up to 12 and step 12's unit list, verified
    audit.micro_batch(3)                     # replay micro-batch 3 alone from the state after step 11
    audit.micro_batch(3, state="pub/params_00000011.safetensors")  # its parameters, from the publisher
    audit.fold(0, 4, "pub/")                 # fold:0:4 = the contract's sum of its revealed children
    audit.update("pub/")                     # clip, AdamW, re-pin and the record from the revealed S
    audit.findings                           # [] (MATCH) or ["field loss differs: ...", ...]
    audit.receipt(signer.public_key, machine, cost, code_digest)   # unsigned (receipts.sign_receipt)

Every tensor handed in is checked before it is used: a state against the previous record's
state hash, through its file header's leaves (rundir.proved_tensors), tensor by tensor (a
micro-batch needs only the params.* tensors: no Adam moments), a revealed unit tensor against
its digest in the step's unit list, and the unit list against the record's units_root. The run
may be a published run's address (published.py): its chain records, unit lists, checkpoint
tensors and tokens are then fetched by ranges, each checked the same way before use. The
replays use the trainer's own functions (train.micro_batch_gradient, repops' add as treefold's
Fold does, train.update): no second copy of the step's math. The state before the step comes from a file the publisher revealed
(audit.py --materialize, Publisher below) or from the run's checkpoint of that step.

Bad input (a missing file, a unit that is not in the step, a run without unit commitments)
raises config.UsageError; what does not match the chain becomes a finding.

The publisher (audit.py --materialize S / --reveal_unit S:UNIT) writes what a unit audit needs:

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
import json
import os
import re
import time

import torch

import byterange
import hashchain
import optrace
import published
import receipts
import repops
import rundir
import signing
import train
import treefold
import units
from config import UsageError, micro_batches_at, resolve
from data import DataMismatch, TokenData, batch_digest

STATE_FILE = re.compile(r"state_([0-9]{8,})\.safetensors")     # units.state_file's whole states
RECORD_FIELDS = ("loss", "loss_bits", "grad_norm", "grad_norm_bits", "lr", "lr_bits")


class UnitAudit:
    def __init__(self, run_dir, step, data_dir=None, device="cpu", units_file=None, recompute=None,
                 offload=None):
        self.run = published.open_run(run_dir)
        self.run.check_versions(repops.CONTRACT)
        self.step, self.data_dir, self.device = step, data_dir, device
        self.findings = []
        self.witness = None              # a micro-batch's witness digest W_M, once replayed (raw 32 bytes)
        self.result_root = None          # the update's result_root, once updated (hex)
        self.node = None                 # a fold node's value, once summed (its receipt's keyed digest)
        self.unit = None
        self.bytes_read = 0
        chain = self.run.chain
        if step < 1 or step >= chain.lines:
            raise UsageError(f"step {step} is not in the chain (it holds steps 1..{chain.lines - 1})")
        self.cfg = resolve(self.run.replay_config(device, recompute=recompute, offload=offload), self.run.vocab_size)
        if not self.cfg.unit_commits:
            raise UsageError(f"{run_dir} has no unit commitments (its genesis config has no unit_commits): "
                             "audit whole steps (--step S)")
        self.n = micro_batches_at(self.cfg, step)
        try:
            chain.verify(upto=step)
        except hashchain.ChainError as e:
            self.find(f"the chain breaks at step {e.line - 1}: {e.message}")
            self.entries = None
            return
        self.record, self.before = chain.records[step], chain.records[step - 1]
        try:
            listed = units_file or self.run.file(units.list_name(step), self.check_list)
        except units.UnitsError as e:           # a published run's list, which did not check
            self.find(f"field units_root: {e}")
            self.entries = None
            return
        self.entries = self.unit_list(listed)

    def find(self, message):
        if message not in self.findings:
            self.findings.append(message)

    def check_list(self, raw):
        """UnitsError unless `raw` is the step's unit list and gives its record's units_root."""
        units.check_list(units.parse_list(raw, units.list_name(self.step), self.step), self.step, self.n,
                         self.record.get("units_root"))

    def unit_list(self, path):
        """{unit: entry} of the step's unit list, checked against the record's units_root."""
        if path is None or not os.path.exists(path):
            raise UsageError(f"no unit list of step {self.step} at {path or self.run.dir}: the publisher "
                             f"reveals it (audit.py --reveal_unit) or the run's units/ folder holds it")
        entries = units.read_list(path, self.step)
        try:
            return units.check_list(entries, self.step, self.n, self.record.get("units_root"))
        except units.UnitsError as e:
            self.find(f"field units_root: {e}")
            return None

    # ------------------------------------------------------------------------- inputs
    def state_before(self, path, params_only, directory=None):
        """{name: tensor} of the state after step - 1 from `path`, else the publisher's file of it
        in `directory`, else the run's checkpoint of that step (a published run's: only the
        tensors used are fetched); each tensor used is checked against that record's state hash
        (rundir.proved_tensors: the file header's leaves, proven against it). None on a finding."""
        before = self.step - 1
        if path is None and directory is not None:
            found = [units.state_file(directory, before, only) for only in (False, True)[:1 + params_only]]
            path = next((p for p in found if p.exists()), None)
        opener = lambda p: byterange.LocalFile(p, "state", rundir.CheckpointError)    # noqa: E731
        if path is None:
            path, opener = dict(self.run.checkpoints()).get(before), self.run.open_file
            if path is None:
                raise UsageError(f"the run has no checkpoint of step {before}: get that state from the "
                                 f"publisher (audit.py --materialize {before}) and give it with --state FILE")
        try:
            with opener(path) as f:
                tensors = rundir.proved_tensors(f, self.before, f.path,
                                                lambda name: name.startswith("params.") or not params_only)
                local = isinstance(f, byterange.LocalFile)      # a published run's: counted by byterange
        except rundir.CheckpointError as e:
            raise UsageError(str(e)) from None
        except hashchain.StateMismatch as e:
            self.find(f"the state of step {before}: {e.message}")
            return None
        self.bytes_read += local * sum(t.numel() * t.element_size() for t in tensors.values())
        return tensors

    def revealed(self, directory, name):
        """The unit tensor `name` the publisher revealed in `directory`, checked against its digest
        and loss bits in the unit list; None on a finding."""
        path = units.unit_file(directory, self.step, name)
        try:
            tensors, _ = rundir.load_checkpoint(path)
        except rundir.CheckpointError as e:
            raise UsageError(f"{e} (the publisher reveals it: audit.py --reveal_unit)") from None
        t = tensors.get(name)
        if set(tensors) != {name} or t.dtype != torch.float32 or t.dim() != 1:
            raise UsageError(f"{path} does not hold one float32 vector named {name}")
        self.bytes_read += t.numel() * 4
        entry = self.entries[name]
        if units.digest(units.uid(self.step, name), t).hex() != entry["digest"] or units.loss_bits(t) != entry["loss_bits"]:
            self.find(f"the revealed {name} ({path}) does not match its commitment (its digest in the unit list)")
            return None
        return t

    def data(self):
        corpus = TokenData(self.data_dir or self.run.recorded_data_dir(), self.cfg.seed)
        if problem := corpus.other_corpus(self.run.genesis, self.run.dir):   # the auditor's input: exit 2
            raise UsageError(f"{problem}; audit with the run's corpus (--data_dir DIR)")
        try:
            corpus.check_run(self.run.genesis)
        except DataMismatch as e:
            self.find(str(e))
            return None
        return corpus

    # ------------------------------------------------------------------------- the units
    def micro_batch(self, m, state=None, directory=None):
        """Replay micro-batch m from the parameters after step - 1 (state_before): its loss, its
        gradient's digest and the step's batch digest against the published ones; proof: its
        witness W_m."""
        name = f"micro_batch:{m}"
        self.check_unit(name)
        if self.entries is None:
            return
        corpus = self.data()
        tensors = self.state_before(state, True, directory)
        if corpus is None or tensors is None:
            return
        model = train.TrainState(self.cfg, self.run.vocab_size, self.device, moments=False)
        model.load_params(tensors, self.step - 1)
        del tensors
        witness = []
        try:
            train.probe(model, corpus, self.cfg, self.step)     # the contract's guard, before the replay
            grad = train.micro_batch_gradient(model, corpus, self.cfg, self.step, m, witness.append)
        except DataMismatch as e:
            self.find(f"the micro-batch reads data that is not the corpus's: {e}")
            return
        self.compare(name, grad.cpu(), "the replayed micro-batch")
        windows = [corpus.window("train", self.step, k, self.cfg.micro_batch_size, self.cfg.seq_len)
                   for k in range(self.n)]
        if batch_digest(windows) != self.record.get("batch_digest"):
            self.find("field batch_digest differs from the step's windows")
        self.witness = units.digest(units.witness_uid(self.step, m), witness[0].cpu())

    def fold(self, lo, size, directory):
        """Check the fold node (lo, size): its two revealed children against their commitments,
        and the node against the contract's sum of them (one RepOps add, left first)."""
        name = f"fold:{lo}:{size}"
        self.check_unit(name)
        if self.entries is None:
            return
        left, right = (self.revealed(directory, child) for child in units.children(lo, size))
        if left is None or right is None:
            return
        node = repops.ops.add(left, right)
        self.compare(name, node, "the sum of its children")
        self.node = node

    def update(self, directory, state=None):
        """The update from the revealed S (the tree's root) and the state after step - 1: clip,
        AdamW, re-pin, then the record's state hash, loss, gradient norm and learning rate."""
        self.check_unit("update")
        if self.entries is None:
            return
        total = self.revealed(directory, units.root_name(self.n))
        tensors = self.state_before(state, False, directory)
        if total is None or tensors is None:
            return
        model = train.TrainState(self.cfg, self.run.vocab_size, self.device)
        model.load(tensors)
        del tensors
        try:
            with model.guard.step(self.step):       # checked by the contract's guard (guard.py)
                fields = train.update(model, self.cfg, [total.to(model.device)])
        except train.StepRefused as e:
            self.find(str(e))
            return
        root, leaves = model.hash()
        if root != self.record.get("state_hash"):
            self.find(rundir.state_difference(leaves, self.run.published_leaves(self.step), self.step, "the update"))
        for key in RECORD_FIELDS:
            if _canon(fields[key]) != _canon(self.record.get(key)):
                self.find(f"field {key} differs: updated {_canon(fields[key])}, published {_canon(self.record.get(key))}")
        self.result_root = hashchain.keyed_state_root(fields["grad_root"].result(), model.tensors())

    def receipt(self, signer, machine, cost, code_digest):
        """The unit's receipt by the public key `signer` ("TYPE BASE64"; unsigned:
        receipts.sign_receipt signs it), or None when the audit stopped before it had the unit's
        value. Its proof is bound to the key and the run: a micro-batch's of its witness digest, the
        update's of its result_root, a fold node's its keyed digest under the key (keyed)."""
        run, blob = receipts.run_id(self.run.genesis), signing.parse_public_key(signer)[1]
        if self.unit.startswith("fold:") and self.node is not None:
            proof = {"keyed": self.keyed(blob)}
        elif self.unit.startswith("micro_batch:") and self.witness is not None:
            proof = {"witness": receipts.witness_proof(run, self.step, int(self.unit.partition(":")[2]), blob,
                                                       self.witness)}
        elif self.unit == "update" and self.result_root is not None:
            proof = {"result": receipts.result_proof(run, self.step, True, blob, self.result_root)}
        else:
            return None
        findings = [f"MISMATCH at step {self.step}, {label(self.unit)}: {f}" for f in self.findings]
        return receipts.make_receipt(self.run.genesis, self.record, self.unit, proof, signer, machine, cost,
                                     code_digest, self.run.genesis.get("data_manifest"), findings)

    def keyed(self, signer):
        """The fold node's chunked digest keyed by units.signer_key(run, node, signer key blob)."""
        piece = units.uid(self.step, self.unit)
        key = units.signer_key(self.run.genesis["record_hash"], piece, signer)
        return units.digest(piece, self.node, key).hex()

    # ------------------------------------------------------------------------- helpers
    def check_unit(self, name):
        """units.parse(name) for this step; UsageError if it is not one of its units."""
        try:
            parsed = units.parse(name, self.n)
        except units.UnitsError as e:
            raise UsageError(f"step {self.step}: {e}") from None
        self.unit = name
        return parsed

    def compare(self, name, t, what):
        """Findings where t (a unit's value as replayed) is not what the unit list commits to."""
        entry, bits = self.entries[name], units.loss_bits(t)
        if bits != entry["loss_bits"]:
            self.find(f"field loss differs: {what} has {_loss(bits)} ({bits}), published {_loss(entry['loss_bits'])} "
                      f"({entry['loss_bits']})")
            return
        got = units.digest(units.uid(self.step, name), t).hex()
        if got != entry["digest"]:
            self.find(f"field digest differs: {what} has {got}, published {entry['digest']}")


def _loss(bits):
    return hashchain.bits_f32(bits)


def _canon(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# ----------------------------------------------------------------------------- the command
def label(unit):
    """How a unit is named in the audit's lines: micro-batch 3, fold node 0:4, update."""
    kind, _, rest = unit.partition(":")
    return {"micro_batch": f"micro-batch {rest}", "fold": f"fold node {rest}"}.get(kind, unit)


def command(args, unit, code_digest):
    """Audit one unit of step args.step (audit.py --step S --micro_batch M | --fold_node LO:SIZE |
    --update): print MATCH or each "MISMATCH at step S, <unit>: ...", the cost, and with
    args.receipt the unit's receipt. Returns the exit code (0 match, 1 mismatch)."""
    t0 = time.perf_counter()
    listed = args.units
    if listed is None and args.revealed is not None and units.list_file(args.revealed, args.step).exists():
        listed = units.list_file(args.revealed, args.step)      # the publisher's copy, checked like any
    audit = UnitAudit(args.run_dir, args.step, args.data_dir, args.device, listed,
                      **{k: None if getattr(args, k) is None else getattr(args, k) == "on" for k in ("recompute", "offload")})
    kind, *where = audit.check_unit(unit)
    if audit.entries is None:
        pass                                                  # the chain or the unit list did not check
    elif kind == "micro_batch":
        audit.micro_batch(where[0], args.state, args.revealed)
    elif kind == "fold":
        if args.revealed is None:
            raise UsageError(f"--fold_node {where[0]}:{where[1]} needs --revealed DIR: its two children, "
                             "from the publisher (audit.py --reveal_unit)")
        audit.fold(where[0], where[1], args.revealed)
    else:
        if args.revealed is None:
            raise UsageError("--update needs --revealed DIR: S (the tree's root), from the publisher "
                             "(audit.py --reveal_unit S:update)")
        audit.update(args.revealed, args.state)
    where_text = f"step {args.step}, {label(unit)}"
    for note in audit.run.walk_notes:
        print(f"note: {note}")
    for finding in audit.findings:
        print(f"MISMATCH at {where_text}: {finding}")
    if not audit.findings:
        print(f"MATCH: {label(unit)} of step {args.step} of {args.run_dir} replays to its commitment "
              f"(units_root {audit.record['units_root']})")
    receipts.close_audit(t0, audit.bytes_read + published.delivered(), args.receipt,
                         lambda cost: None if audit.entries is None else audit.receipt(
                             args.signer.public_key, optrace.machine(), cost, code_digest),
                         f"the audit of {label(unit)} stopped before its proof", f"step {args.step}, {unit}",
                         args.signer, windows=kind == "micro_batch")
    return 1 if audit.findings else 0


def judging(run, revealed):
    """(unit_list, fold_keyed) for receipts.check_receipts on the opened run: unit_list(step) is the
    step's unit list (the run's units/ folder, else the one in `revealed`) checked against its
    units_root, or None; fold_keyed(step, unit, signer) the node's keyed digest under the signer's
    key blob made from its children revealed in `revealed` (checked against their commitments),
    or None."""
    lists, nodes = {}, {}

    def unit_list(step):
        if step not in lists:
            lists[step] = None
            n, root = micro_batches_at(run.cfg, step), run.chain.records[step].get("units_root")

            def checked(raw):
                return units.check_list(units.parse_list(raw, units.list_name(step), step), step, n, root)
            try:
                ours = run.file(units.list_name(step), checked)
            except units.UnitsError:
                ours = None
            for path in (ours, revealed and units.list_file(revealed, step)):
                if path and os.path.exists(path):
                    try:
                        lists[step] = checked(hashchain.read_bytes(path, "unit list", units.MAX_LIST, units.UnitsError))
                        break
                    except units.UnitsError:
                        continue
        return lists[step]

    def fold_keyed(step, unit, signer):
        if revealed is None:
            return None
        if (step, unit) not in nodes:
            _, lo, size = units.parse(unit, micro_batches_at(run.cfg, step))
            listed = units.list_file(revealed, step)
            try:
                audit = UnitAudit(run.dir, step, units_file=listed if listed.exists() else None)
                audit.fold(lo, size, revealed)
                nodes[(step, unit)] = None if audit.findings else audit
            except UsageError:                  # its children (or the unit list) are not at hand
                nodes[(step, unit)] = None
        audit = nodes[(step, unit)]
        return None if audit is None else audit.keyed(signer)

    return unit_list, fold_keyed


def public_states(run, revealed=None):
    """The steps whose post-step state is public, so that their update is provable by no receipt
    (docs/auditing.md): the run's checkpoints, and the whole states revealed in `revealed`
    (units.state_file: the input of the next step's update audit, or --materialize)."""
    steps = {s for s, _ in run.checkpoints()}
    if revealed and os.path.isdir(revealed):
        steps |= {int(m.group(1)) for name in os.listdir(revealed) for m in [STATE_FILE.fullmatch(name)] if m}
    return steps


def hash_rate(size=64 << 20):
    """Bytes per second of a unit digest here, on HASH_POOL's threads (a plan's cost estimate)."""
    t = torch.zeros(size // 4)
    t0 = time.perf_counter()
    units.digest(b"0/rate", t)
    return size / (time.perf_counter() - t0)


# ----------------------------------------------------------------------------- the publisher
class Publisher:
    def __init__(self, run_dir, data_dir=None, device="cpu"):
        self.run = rundir.Run(run_dir)
        self.run.chain.verify()
        # in memory, as a plain replay (an offloaded trainer's choice would refuse --device cuda)
        self.cfg = resolve(self.run.replay_config(device, recompute=False, offload=False), self.run.vocab_size)
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
        if state.step < step:
            train.probe(state, self.corpus, cfg, state.step + 1)    # the contract's guard, before the replay
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
        state = self.state(step)
        root, leaves = state.hash()
        tensors = state.tensors()
        if params_only:
            tensors = {n: tensors[n] for n in tensors if n.startswith("params.")}
        path = units.state_file(out, step, params_only)
        rundir.save_checkpoint(path, tensors, {"step": step, "state_hash": root, "tensor_hashes": leaves})
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
            root, leaves = state.hash()
            rundir.save_checkpoint(path, state.tensors(), {"step": step - 1, "state_hash": root, "tensor_hashes": leaves})
            paths.append(path)
        for unit, t in sorted(self.pieces(state, step, lo, size, wanted).items()):
            path = units.unit_file(out, step, unit)
            rundir.save_checkpoint(path, {unit: t}, {"step": step, "unit": unit})
            paths.append(path)
        return paths


# ----------------------------------------------------------------------------- the commands
def materialize_command(args):
    """audit.py --materialize S --out DIR [--params_only]: the state after step S, by replay (audit.py
    checked --out, or made it, before this)."""
    path = Publisher(args.run_dir, args.data_dir, args.device).materialize(args.materialize, args.out,
                                                                          args.params_only)
    print(f"state of step {args.materialize} ({'parameters only' if args.params_only else 'all tensors'}) "
          f"written to {path}")
    return 0


def reveal_command(args):
    """audit.py --reveal_unit S:UNIT --out DIR: what the audit of that unit needs (audit.py checked
    --out, or made it, before this)."""
    step, _, unit = args.reveal_unit.partition(":")
    if not step.isdigit() or not unit:
        raise UsageError(f"--reveal_unit expects STEP:UNIT (12:micro_batch:3, 12:fold:0:4, 12:update), "
                         f"got {args.reveal_unit!r}")
    paths = Publisher(args.run_dir, args.data_dir, args.device).reveal(int(step), unit, args.out)
    print(f"revealed for the audit of {unit} of step {step}: " + ", ".join(p.name for p in paths) + f" in {args.out}")
    return 0
