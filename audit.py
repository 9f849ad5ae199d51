"""Replay training steps on this machine and check them against the published hash chain;
prove the replays (receipts), plan them across many auditors, and pin the chain (anchors).

    python audit.py --step 120                        # run directory runs/default
    python audit.py --step 15 --run_dir runs/x        # another run
    python audit.py --range 1:40                      # every step from 1 to 40
    python audit.py --all                             # the whole chain
    python audit.py --step 17 --trace a.jsonl         # also a per-operator trace (optrace.py)
    python audit.py --step 1 --recompute on --offload on  # less memory, same bits (default: the trainer's)
    python audit.py --step 1 --init_from models/x     # an imported run: also check its source folder
    python audit.py --step 1 --init_from runs/x       # a run started from runs/x: also check the lineage

    python audit.py --step 17 --receipt r.json --key ~/.ssh/id_ed25519   # signed proof of the replay
    python audit.py --check_receipts receipts/ --roster roster   # publisher (the secret): accept or reject
    python audit.py --reveal_salts 1:40 --out s.json  # publisher, once their receipts are in: anyone checks
    python audit.py --check_receipts receipts/ --salts s.json    # anyone, after a reveal
    python audit.py --plan --roster roster --redundancy 2 --seed 42   # which roster key audits what
    python audit.py --plan --roster roster --out out/plan.json   # ... and the assignment as JSON
    python audit.py --coverage receipts/ --roster roster --redundancy 2   # what the roster's keys cover
    python audit.py --coverage receipts/ --roster roster --out out/cov.json   # ... and per step, as JSON
    python audit.py --anchors anchors.jsonl           # the chain against published (signed) chain heads

    # a published run (publish.py) at its address: only the bytes an audit needs are fetched
    python audit.py --run_dir https://host/runs/x --step 120 [--cache DIR] [--timeout 30]
    python audit.py --run_dir hf://datasets/org/run --step 12 --micro_batch 3

    # a run with unit commitments (--unit_commits, units.py): one unit of a step at a time
    python audit.py --step 12 --micro_batch 3 --revealed pub/      # micro-batch 3 alone (unitaudit.py)
    python audit.py --step 12 --fold_node 0:4 --revealed pub/      # a fold node from its revealed children
    python audit.py --step 12 --update --revealed pub/             # the update from the revealed S
    python audit.py --reveal_unit 12:fold:0:4 --out pub/          # publisher: what that audit needs (unitaudit.py)
    python audit.py --materialize 11 --params_only --out pub/     # publisher: any state, by replay

One mode flag per call (the first group of `python audit.py --help`); every other option
belongs to the modes its group names, and is refused with any other (config.CommandLine).

The audit vouches only for what it checked, and checks everything it vouches for:
1. the chain's links up to the last audited step: a malformed, edited, missing, inserted or
   reordered record is a break at its step;
2. the genesis record, field by field, against one recomputed here from its config, this code
   and this corpus (so code, data, tokenizer and initial state are checked), and config.json
   against the genesis config; an imported run's (train.py --init_from) initial state is its
   checkpoint 0, checked against the record (moments zero, step 0), and with --init_from DIR its
   source folder against the record's file SHA-256s and the mapped weights;
3. the checkpoint the replay starts from, and every checkpoint file from there to the last
   audited step, plus the run's latest checkpoint (the model people download): metadata against
   the record, the header's leaves against the record's state hash, tensors against the leaves;
4. every replayed step's record against the published one, field for field: the state hash
   (naming the first differing tensor where a checkpoint of the step gives the published
   leaves: a record holds the state's root only), batch digest, loss, gradient norm, learning
   rate, and any field the published record has that a replay does not produce, or lacks.
   step_commit, the seal of the step's result (its post-step state keyed by its gradient; and
   units_root, its pieces'), is made and compared too where the step's salt is known: from the run's secret (the
   publisher's run directory) or revealed salts (--salts FILE); elsewhere it must be there and
   well-formed, and the MATCH line says it was not checked. The genesis record's secret_commit
   is compared where the run's secret is at hand, and must be there and well-formed anyway.

A published run's address (http(s)://, hf://; published.py) is audited like its directory: the
records it needs are reached from the nearest anchor by their links, a checkpoint's header and
the tensors used and the step's token windows are fetched by range requests, each checked
before use (a byte that does not check is a MISMATCH naming its file), and kept in the cache
(--cache) so that the next unit of the step fetches nothing twice; a checkpoint the audit
vouches for but does not start from is checked by its header (a note says so); a network fault
is one line, exit 2, after bounded retries, every request under --timeout.

Replays use train.train_step (the one step function) on one device with no topology emulation.
Each problem prints as "MISMATCH at step S: ..." in step order, then what the audit cost.
Exit code: 0 match, 1 mismatch, 2 bad input (missing run or data, step out of range, malformed
checkpoint or config). The audit only reads the run directory: it creates, renames and deletes
nothing there, and the files it writes (traces, receipts, salts) must lie outside it.

The protocol's commands (receipts.py holds its logic; signing.py the SSH signatures): a receipt
is signed with --key (checked, with every output path, before the replay starts).
--check_receipts exits 0 when every well-formed receipt it could check is accepted, 1 if any is
rejected or unsigned (a receipt whose step has no revealed salt is listed as unchecked and counts
for neither); with --roster it names each signer. --coverage counts, per step or unit, the
distinct keys of --roster (an allowed_signers file) with accepted receipts, lists unsigned
receipts, malformed ones and keys not in the roster apart (never counted), and exits 0 when every
provable unit has --redundancy of them, 1 otherwise. A malformed receipt (not JSON, a wrong type, a
field missing or unknown, another format) is listed with the others; --check_receipts then exits 2
with one error line (it is bad input, not evidence about the run), while --coverage counts the
rest: one junk file among many auditors' submissions must not stop the count. --anchors exits 1
at the first anchor the chain contradicts (when the genesis names a publisher key: an anchor it
did not sign). --plan assigns every step (or unit) to --redundancy of the roster's keys (or of
--auditors K), balanced by cost, and prints the chance that a tampered step goes undetected.
"""
import contextlib
import dataclasses
import json
import os
import secrets
import statistics
import sys
import time

import byterange
from config import (CommandLine, Config, UsageError, late_phases, micro_batches_at, out_of_memory, resolve,
                    stop_on_sigterm, stopped_by)

REPLAY = ("step", "range", "all")


def parser():
    """The audit's command line (config.CommandLine's convention); main, at the end, runs it."""
    ap = CommandLine("audit.py", "Replay steps and check them against the run's hash chain; receipts, "
                     "coverage plans and anchors for many auditors.")
    mode = ap.add_modes("modes (exactly one)")
    mode.add_argument("--step", type=int, metavar="N", help="replay step N (from the latest checkpoint before "
                      "it) and check it, and the checkpoints on the way, against the chain")
    mode.add_argument("--range", metavar="A:B", help="replay and check every step from A to B")
    mode.add_argument("--all", action="store_true", help="replay and check every step of the chain")
    mode.add_argument("--check_receipts", metavar="DIR", help="check every receipt (*.json) under DIR: "
                      "with the run's secret (the publisher), or with --salts")
    mode.add_argument("--coverage", metavar="DIR", help="which steps the accepted receipts under DIR cover, "
                      "by how many distinct auditors")
    mode.add_argument("--reveal_salts", metavar="A:B", help="the publisher: print the salts of steps A..B "
                      "(JSON), with which anyone can check those steps' receipts")
    mode.add_argument("--plan", action="store_true", help="assign every step to --redundancy of --auditors, "
                      "balanced by the replay cost measured here")
    mode.add_argument("--anchors", metavar="FILE", help="check the chain against anchors (chain heads) "
                      "obtained outside the run")
    mode.add_argument("--materialize", type=int, metavar="S", help="the publisher: write the state after "
                      "step S (replayed from the latest checkpoint before it) to --out DIR")
    mode.add_argument("--reveal_unit", metavar="S:UNIT", help="the publisher: write what the audit of one "
                      "unit of step S needs (S:micro_batch:M, S:fold:LO:SIZE, S:update) to --out DIR")
    ap.add_argument("--run_dir", metavar="DIR", default="runs/default", help="the run (only read): a directory, or "
                    "the http(s):// or hf:// address of its published copy (publish.py) (default %(default)s)")
    ap.add_argument("--cache", metavar="DIR", help="with --run_dir URL: where fetched and checked bytes are kept "
                    "(default $XDG_CACHE_HOME/repops, else ~/.cache/repops)")
    ap.add_argument("--timeout", type=float, default=byterange.TIMEOUT, metavar="S",
                    help="with --run_dir URL: seconds a connection or a read may wait (default %(default)s)")
    replayed = ap.options_for(REPLAY + ("plan", "materialize", "reveal_unit"),
                              "replaying (--step, --range, --all, --materialize, --reveal_unit; --plan times one step)")
    replayed.add_argument("--data_dir", metavar="DIR", help="the run's corpus, or a bundle of it (default: "
                          "the data_dir the run's config.json names)")
    replayed.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"),
                          help="where the steps replay; every device gives the same bits (default %(default)s)")
    replayed.add_argument("--threads", type=int, default=0, metavar="N", help="CPU threads; the bits are the same "
                          "for any number (default 0: measured, the faster of torch's default and 1; threads.py)")
    memory = ap.options_for(REPLAY, "the replay's memory and source (--step, --range, --all)")
    memory.add_argument("--recompute", choices=("on", "off"), help="recompute each block's activations in "
                        "backward: same bits, less memory (default: what the trainer used)")
    memory.add_argument("--offload", choices=("on", "off"), help="keep the Adam moments and a waiting gradient "
                        "in temp files under TMPDIR: same bits (default: what the trainer used)")
    memory.add_argument("--init_from", metavar="DIR", help="an imported run: check that DIR is its source "
                        "folder (the genesis record's file SHA-256s, and its weights mapped = checkpoint 0); a run "
                        "started from a parent run: check that DIR is the parent's run directory and the lineage")
    one = ap.options_for(("step",), "one step's evidence (--step)")
    one.add_argument("--trace", metavar="FILE", help="write a per-operator trace of the step to FILE "
                     "(compare two with python optrace.py A B)")
    one.add_argument("--receipt", metavar="FILE", help="write the step's signed receipt to FILE (with --key); its "
                     "folder is made, or refused, before the replay")
    one.add_argument("--key", metavar="KEYFILE", help="your SSH key that signs the receipt: a private key, or the "
                     "public key of one ssh-agent holds (with --receipt; checked before the replay)")
    unit = ap.options_for(("step",), "one unit of the step, with unit commitments (--step)")
    unit.add_argument("--micro_batch", type=int, metavar="M", help="audit micro-batch M of the step alone, "
                      "from the state before it (--revealed, --state or the run's checkpoint)")
    unit.add_argument("--fold_node", metavar="LO:SIZE", help="audit the fold node over micro-batches "
                      "LO..LO+SIZE-1: the contract's sum of its children revealed in --revealed DIR")
    unit.add_argument("--update", action="store_true", help="audit the update: clip, AdamW and the record "
                      "from S (the tree's root) revealed in --revealed DIR and the state before the step")
    unit.add_argument("--state", metavar="FILE", help="the state before the step, from the publisher "
                      "(--materialize); default: the one in --revealed DIR, else the run's checkpoint")
    unit.add_argument("--units", metavar="FILE", help="the step's unit list (default: the one in --revealed "
                      "DIR, else the run's units/ folder); checked against units_root")
    revealed = ap.options_for(("step", "check_receipts", "coverage"),
                              "revealed pieces (--step with a unit, --check_receipts, --coverage)")
    revealed.add_argument("--revealed", metavar="DIR", help="what the publisher revealed (--reveal_unit): a "
                          "unit audit's inputs; when checking receipts, the fold nodes' children")
    roster = ap.options_for(("check_receipts", "coverage", "plan"), "the auditors (--check_receipts, --coverage, --plan)")
    roster.add_argument("--roster", metavar="ROSTER", help="the auditors' keys: an allowed_signers file, one line "
                        "NAME TYPE BASE64 per auditor (required by --coverage); only its keys are counted")
    checked = ap.options_for(REPLAY + ("check_receipts", "coverage"),
                             "salts (--step, --range, --all, --check_receipts, --coverage)")
    checked.add_argument("--salts", metavar="FILE", help="revealed salts (--reveal_salts): with them a "
                         "replay checks step_commit, and receipts are checked without the run's secret")
    shared = ap.options_for(("plan", "coverage"), "sharing the steps (--plan, --coverage)")
    shared.add_argument("--redundancy", type=int, default=2, metavar="C",
                        help="distinct auditors' keys per step or unit (default %(default)s)")
    shared.add_argument("--steps", metavar="A:B", help="the steps (default: the whole chain)")
    plan = ap.options_for(("plan",), "the plan (--plan)")
    plan.add_argument("--auditors", type=int, metavar="K", help="how many auditors, unnamed (or --roster: its keys)")
    plan.add_argument("--seed", type=int, help="the plan's private seed (default: drawn now, and printed)")
    plan.add_argument("--absent", type=float, default=0.25, metavar="F", help="the fraction of auditors "
                      "assumed absent or dishonest, for the chance of a miss (default %(default)s)")
    output = ap.options_for(("reveal_salts", "materialize", "reveal_unit", "plan", "coverage"),
                            "output (--reveal_salts, --materialize, --reveal_unit, --plan, --coverage)")
    output.add_argument("--out", metavar="PATH", help="--reveal_salts: write the salts to PATH (default: "
                        "standard output); --plan, --coverage: also write the assignment or the coverage to PATH "
                        "as JSON, for a coordinator's tools (default: none); --materialize, --reveal_unit: the "
                        "directory to write to (required)")
    state = ap.options_for(("materialize",), "the state (--materialize)")
    state.add_argument("--params_only", action="store_true", help="the parameters only, all a micro-batch audit "
                       "needs (default: the whole state)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import hashchain  # noqa: E402  (below the command line's first answer, above)
import hfllama  # noqa: E402
import lineage  # noqa: E402
import optrace  # noqa: E402
import published  # noqa: E402
import receipts  # noqa: E402
import repops  # noqa: E402
import rundir  # noqa: E402
import signing  # noqa: E402
import threads  # noqa: E402
import unitaudit  # noqa: E402
from data import DataError, DataMismatch, TokenData  # noqa: E402
import train  # noqa: E402
from train import StepRefused, TrainState, code_digest, train_step  # noqa: E402


# Fields compared first: a changed batch explains a changed state, and the state names a tensor.
FIRST_FIELDS = ("kind", "step", "batch_digest", "state_hash")
# The one field of each kind of record that a replay cannot recompute: it commits with the run's
# secret (to the secret; to the step's gradient and result). Here it must be present and
# well-formed; --check_receipts opens the step's (receipts.py). A field a replay leaves None
# (units_root without the step's salt, units.py) is such a commitment too.
COMMITMENTS = {"genesis": "secret_commit", "step": "step_commit"}


def _canon(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def shown(value):
    """A JSON value as a message shows it: whole (a hash is never cut), or, when longer than
    a line can hold, what it is (an object of N keys, a list of N items, N characters)."""
    text = _canon(value)
    if len(text) <= 100:
        return text
    kind = (f"an object of {len(value)} keys" if isinstance(value, dict) else
            f"a list of {len(value)} items" if isinstance(value, list) else f"a string of {len(value)} characters")
    return f"({kind})"


def leaf_difference(a, b, path):
    """(path, a's value, b's value) of the first place two JSON values differ: into objects by
    sorted key and into lists of equal length by index, down to the first differing value."""
    if isinstance(a, dict) and isinstance(b, dict):
        key = sorted(k for k in set(a) | set(b) if _canon(a.get(k)) != _canon(b.get(k)))[0]
        return leaf_difference(a.get(key), b.get(key), f"{path}.{key}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        i = next(i for i, (x, y) in enumerate(zip(a, b)) if _canon(x) != _canon(y))
        return leaf_difference(a[i], b[i], f"{path}[{i}]")
    return path, a, b


def compare(replayed, published, leaves=None):
    """The first difference between a replayed record and the published one, or None.

    Every field is compared as exact JSON (floats included); a field the published record has
    and a replay does not produce, or lacks, is a difference. Names the field (and the key
    inside it; for the state hash the first differing tensor, where leaves() gives the replay's
    and the published state's leaves: rundir.state_difference). A record's commitment
    (COMMITMENTS) that the replay could not make (None:
    neither the run's secret nor the step's revealed salt at hand) must be there as 64 hex
    digits, and only a receipt check tells whether it commits to this step's gradient and
    result; where the salt is known the replay makes it, and it is compared as any field."""
    mine = json.loads(json.dumps(replayed))
    theirs = {k: v for k, v in published.items() if k not in ("prev", "record_hash")}
    commitments = {k for k, v in mine.items() if v is None}
    commitments |= {COMMITMENTS[mine["kind"]]} - set(mine) if mine.get("kind") in COMMITMENTS else set()
    expected = set(mine) | commitments
    keys = [k for k in FIRST_FIELDS if k in expected or k in theirs]
    keys += sorted((expected | set(theirs)) - set(FIRST_FIELDS))
    for key in keys:
        if key not in theirs:
            return f"field {key} is missing from the published record"
        if key in commitments:
            if not receipts.is_hex64(theirs[key]):
                return f"field {key} is not a commitment (64 hex digits): published {shown(theirs[key])}"
            continue
        if key not in mine:
            return f"field {key} is not part of a {mine.get('kind', '')} record (published {shown(theirs[key])})"
        a, b = mine[key], theirs[key]
        if _canon(a) == _canon(b):
            continue
        if key == "state_hash" and leaves:
            return rundir.state_difference(*leaves(), mine["step"], "the replay")
        where, a, b = leaf_difference(a, b, key)
        return f"field {where} differs: replayed {shown(a)}, published {shown(b)}"
    return None


@contextlib.contextmanager
def traced(path, step, record):
    """Run the step inside under optrace.OpTrace and write its per-operator trace to path."""
    with optrace.OpTrace() as rec:
        yield
    try:
        optrace.write(path, rec.entries, {"step": step, "state_hash": record.get("state_hash"),
                                          "code_digest": code_digest()})
    except OSError as e:
        raise UsageError(f"cannot write the trace {path}: {e}") from None
    print(f"trace: {len(rec.entries)} operators of step {step} written to {path}")


class Audit:
    """An audit of one run on this machine: open it (the run, its config, its corpus), then replay
    steps (replay); every problem found is a finding (step, message), in self.findings.

    A replay asks each module for one thing: the run directory for the chain's links and the
    verified checkpoint files (checkpoints), train.py for the genesis state and record
    (genesis) and then for the replayed steps' records (train.replay); it compares them."""

    def __init__(self, run_dir, data_dir=None, device="cpu", recompute=None, offload=None, source=None,
                 salts=None, threads=0):
        self.run = published.open_run(run_dir)  # a reader: it changes nothing in the run
        self.run.check_versions(repops.CONTRACT)
        # decisive keys on which config.json (for people) disagrees with the genesis record
        self.config_json_differences = self.run.config_json_differences()
        data_dir = data_dir or self.run.recorded_data_dir()
        cfg = self.run.replay_config(device, recompute=recompute, offload=offload)
        if source and "init" not in self.run.genesis and "parent" not in self.run.genesis:
            raise UsageError(f"--init_from {source}: {run_dir} was neither imported nor started from a parent run "
                             "(its genesis record has no init and no parent)")
        self.data = TokenData(data_dir, cfg.seed)
        # another corpus, other code: the auditor's input, not the run's (exit 2, not MISMATCH)
        if problem := self.data.other_corpus(self.run.genesis, run_dir):
            raise UsageError(f"{problem}; audit with the run's corpus (--data_dir DIR)")
        if problem := train.other_code(self.run.genesis, run_dir):
            raise UsageError(f"{problem}; audit with the code that started it (SPEC §14: the commit whose "
                             "files hash to it)")
        # the corpus's tokens must index rows of the model (the genesis vocab_size is checked later)
        self.cfg = resolve(cfg, self.data.vocab_size)
        # salt_of(step): from the run's secret (the publisher) or revealed salts (--salts FILE);
        # where it is known the replay makes step_commit (and units_root) and compares them too.
        # secret: the run's, where this is the publisher's run directory (then secret_commit too)
        self.salt_of, self.secret = receipts.replay_keys(run_dir, self.run.genesis, salts)
        self.bytes_read = self.run.size(self.run.chain.path)
        self.findings = []                       # (step, message), every problem found
        self.notes = []                          # what was not checked: printed before the verdict
        self.lineage = None                      # the parent a checked lineage leads to, for the verdict
        self.replayed = {}                       # step: (state hash, grad_root, result_root, witnesses)
        self.unchecked = []                      # replayed steps whose step_commit no salt opened
        self.state = None                        # the replay's state (after its last replayed step)
        self.source = source                     # an imported run's source folder, to check
        self.threads = threads                   # the replay's CPU threads (0: measured, threads.py)

    def find(self, step, message):
        if (step, message) not in self.findings:
            self.findings += [(step, message)]

    def steps(self, first, last):
        """Check that steps first..last can be audited: a chain break at or before `last` is a
        finding (the steps from it on cannot be vouched for); returns the last replayable step."""
        chain = self.run.chain
        try:
            chain.verify(upto=last)
        except hashchain.ChainError as e:
            self.find(e.line - 1, e.message)
            # a published run's records are reached from above (published.py): a break above `last`
            # leaves none of the steps vouched for
            return min(last, e.line - 2) if e.line - 1 <= last else -1
        if last >= len(chain):
            raise UsageError(f"steps {first}..{last} are not in the chain (it holds steps 1..{len(chain) - 1})")
        return last

    def checkpoints(self, before=None, last=None):
        """Verify the checkpoint files the audit of steps before+1..last reads or vouches for,
        each against its record (a finding for each that does not match): the latest at or
        before `before` that verifies (where the replay starts), an imported run's checkpoint 0
        (its initial state), every one in before+1..last, and the run's latest (the model people
        download; a file beyond the chain is a finding). None: no start, no range. Returns
        {step: tensors} of the start and of an imported run's checkpoint 0."""
        files, lines = self.run.checkpoints(), self.run.chain.lines
        imported = "init" in self.run.genesis or "parent" in self.run.genesis   # checkpoint 0 is the start
        starts = [(s, p) for s, p in reversed(files) if before is not None and s <= before]
        vouched = [(s, p) for s, p in files if (s == 0 and imported)
                   or (last is not None and before < s <= last)]
        later = [(s, p) for s, p in files if last is not None and s > last]
        for step, path in later:
            if step >= lines:
                self.find(step, f"checkpoint {path} has no record in the chain")
        vouched += later[-1:] if later and later[-1][0] < lines else []   # behind a break, the break is found
        kept, tried, start = {}, set(), None
        for role, step, path in [("start", s, p) for s, p in starts] + [("vouched", s, p) for s, p in vouched]:
            if step in tried or (role == "start" and start is not None):
                continue                        # checked already, or older than the start
            tried.add(step)
            try:                                # checkpoint 0 is mapped: it may be held beside the start
                if role == "start" or (step == 0 and imported):
                    tensors = self.run.verified_checkpoint(step, path, mmap=self.cfg.offload or step == 0)
                elif note := self.run.vouch_checkpoint(step, path):
                    self.notes.append(note)
            except hashchain.StateMismatch as e:
                self.find(step, f"checkpoint {path} does not match the chain: {e.message}")
                continue
            except hashchain.ChainError as e:   # the chain breaks before this checkpoint
                self.find(e.line - 1, e.message)
                continue
            except rundir.CheckpointError as e:
                raise UsageError(str(e)) from None
            self.bytes_read += self.run.size(path)
            if role == "start":
                start = step
            if role == "start" or (step == 0 and imported):
                kept[step] = tensors
        return kept

    def check_genesis(self, initial=None):
        """The genesis state (an imported run's: `initial`, its verified checkpoint 0), checked:
        the genesis record recomputed from it, the config, this code and this corpus against the
        published one, the config's phases, config.json, and an imported run's source folder."""
        init, parent = self.run.genesis.get("init"), self.run.genesis.get("parent")
        publisher = self.run.genesis.get("publisher")
        state, record, problem = train.genesis(self.cfg, self.data, init, initial, self.secret, parent, publisher)
        if publisher is not None and not signing.is_public_key(publisher):
            self.find(0, "genesis record: field publisher is not an SSH public key written TYPE BASE64")
        if problem:
            self.find(0, problem)
        elif parent is not None and self.source:
            if lineage_problem := lineage.check(self.source, self.run):
                self.find(0, f"lineage: {lineage_problem}")
            else:
                self.lineage = f"step {parent['step']} of {self.source}"
        elif parent is not None:
            self.notes.append("the run continues a parent run's state (genesis parent); the lineage was not "
                              "checked (--init_from RUN_DIR names the parent's run directory and checks it)")
        elif init is not None and self.source:
            if diff := hfllama.source_difference(self.source, init, state.params, self.cfg):
                self.find(0, diff)
        elif init is not None:
            self.notes.append("the run was imported (genesis init); its source files were not checked "
                              "(--init_from DIR checks them)")
        diff = compare(record, self.run.genesis, lambda: (state.hash()[1], self.run.published_leaves(0)))
        if diff:
            self.find(0, f"genesis record: {diff}")
        if late := late_phases(self.cfg):       # the record says what did not train
            self.find(0, f"genesis config: {late}")
        for key in self.config_json_differences:
            self.find(0, f"config.json disagrees with the genesis record on {key}")
        return state

    def replay(self, first, last, around=None, receipt=True):
        """Audit steps first..last; findings accumulate in self.findings (empty: MATCH).
        around(step): a context manager each replayed step runs in (audit.py --trace: traced).
        receipt: step `last` is proved for its receipt (self.receipt): its post-step state is
        keyed by grad_root, one more pass over the state where no salt asked for it."""
        last_ok = self.steps(first, last)
        if last_ok < 0:
            return
        verified = self.checkpoints(first - 1, last_ok)
        from_checkpoint = "init" in self.run.genesis or "parent" in self.run.genesis
        state = self.state = self.check_genesis(verified.pop(0, None) if from_checkpoint else None)
        for step, tensors in verified.items():   # the start, if any checkpoint before `first` verified
            try:
                state.load(tensors)
            except hashchain.StateMismatch as e:
                self.find(step, f"checkpoint {step}: {e.message}")
        del verified
        records = self.run.chain.records
        try:
            if state.step < last_ok:    # the contract's guard (guard.py): a model outside it is refused, exit 2
                train.probe(state, self.data, self.cfg, state.step + 1)     # (it reads the step's first tokens)
            chooser = threads.Chooser(self.threads, measure=self.cfg.device == "cpu")
            for step, record, fields in train.replay(state, self.data, self.cfg, last_ok, self.salt_of,
                                                     receipts.run_id(self.run.genesis), around,
                                                     proved=last if receipt else None, chooser=chooser):
                pieces = fields.get("units")          # the step's witnesses: a v3 receipt's proof
                self.replayed[step] = (record["state_hash"], fields["grad_root"].result(), fields["result_root"],
                                       pieces and [w.hex() for w in pieces.witness_digests])
                if "step_commit" not in record:
                    self.unchecked.append(step)
                if diff := compare(record, records[step],
                                   lambda: (fields["leaves"], self.run.published_leaves(step))):
                    self.find(step, diff)
                    return
                if step % 25 == 0 and step < last_ok:       # long audits show progress
                    print(f"audit: steps up to {step} match, replaying to {last_ok}", flush=True)
        except StepRefused as e:        # the published run cannot have recorded this step
            self.find(state.step + 1, str(e))
        except DataMismatch as e:       # a chunk the step reads is not the manifest's
            self.find(state.step + 1, f"the step reads data that is not the corpus's: {e}")

    def receipt(self, step, signer, cost):
        """The receipt of replayed step `step` by the public key `signer` (unsigned:
        receipts.sign_receipt signs it), or None if the replay stopped before it. Its proofs,
        bound to the key and the run, are of what only the replay of the whole step computes:
        the step's result_root and, with unit commitments, every micro-batch's witness digest."""
        if step not in self.replayed or self.state.step != step:
            return None
        _, _, result_root, witnesses = self.replayed[step]
        assert result_root is not None, "replay(..., receipt=True) proves the step a receipt is made of"
        findings = [f"MISMATCH at step {s}: {m}" for s, m in sorted(self.findings, key=lambda f: f[0])]
        run, blob = receipts.run_id(self.run.genesis), signing.parse_public_key(signer)[1]
        proof = {"result": receipts.result_proof(run, step, witnesses is not None, blob, result_root)}
        if witnesses is not None:               # a run with unit commitments: every micro-batch's proof
            proof["witnesses"] = [receipts.witness_proof(run, step, m, blob, bytes.fromhex(w))
                                  for m, w in enumerate(witnesses)]
        return receipts.make_receipt(self.run.genesis, self.run.chain.records[step], "step", proof, signer,
                                     optrace.machine(), cost, code_digest(), self.data.digest, findings)


# ----------------------------------------------------------------------------- the commands
def unit_of(args):
    """The unit --micro_batch, --fold_node or --update names (None: the whole step)."""
    given = [u for u in (args.micro_batch is not None and f"micro_batch:{args.micro_batch}",
                         args.fold_node and f"fold:{args.fold_node}", args.update and "update") if u]
    if len(given) > 1:
        raise UsageError("--micro_batch, --fold_node and --update: one unit per audit")
    if given:
        for option in ("trace", "init_from", "salts"):
            if getattr(args, option):
                raise UsageError(f"--{option} goes with a whole step's replay, not with {given[0]}")
    elif args.state or args.units or args.revealed:
        raise UsageError("--state, --units and --revealed go with one unit (--micro_batch, --fold_node or --update)")
    return given[0] if given else None


def unit_command(args):
    """--step S with --micro_batch M, --fold_node LO:SIZE or --update: one unit (unitaudit.py);
    a whole step otherwise (replay_command)."""
    unit = unit_of(args)
    return replay_command(args) if unit is None else unitaudit.command(args, unit, code_digest())


def replay_command(args):
    """--step, --range, --all: replay the steps and check them (Audit.replay); print each
    finding, else MATCH, then the cost; write the receipt of --step with --receipt."""
    t0 = time.perf_counter()
    if args.step is not None and args.step < 1:
        raise UsageError(f"--step {args.step}: steps start at 1")
    first, last = ((args.step, args.step) if args.step is not None else (1, None) if args.all
                   else parse_range(args.range, "--range"))
    audit = Audit(args.run_dir, args.data_dir, args.device,
                  **{k: None if getattr(args, k) is None else getattr(args, k) == "on" for k in ("recompute", "offload")},
                  source=args.init_from, salts=args.salts, threads=args.threads)
    records = audit.run.chain.records
    last = audit.run.chain.lines - 1 if last is None else last       # --all
    audit.replay(first, last, args.trace and (lambda s: traced(args.trace, s, records[s]) if s == last
                                              else contextlib.nullcontext()), receipt=args.receipt is not None)
    for note in audit.notes + list(audit.run.walk_notes):
        print(f"note: {note}")
    for step, message in sorted(audit.findings, key=lambda f: f[0]):
        print(f"MISMATCH at step {step}: {message}")
    if not audit.findings:
        commitments = "step_commit and units_root" if audit.cfg.unit_commits else "step_commit"
        unchecked = receipts.ranges(audit.unchecked)
        checked = (f"{commitments} checked" if not audit.unchecked else
                   f"{commitments} not checked: no secret or salt" if len(audit.unchecked) == len(audit.replayed)
                   else f"{commitments} checked, but for steps {unchecked}: no secret or salt")
        print(f"MATCH: steps {first}..{last} of {args.run_dir} replay to the published records "
              f"(step {last}: {records[last]['state_hash']}), and the "
              f"checkpoints checked match the chain; {checked}"
              + (f"; the lineage checked: it starts from {audit.lineage}" if audit.lineage else ""))
    receipts.close_audit(t0, audit.bytes_read + published.delivered(), args.receipt,
                         lambda cost: audit.receipt(last, args.signer.public_key, cost),
                         f"the replay stopped before step {last}", f"step {last}", args.signer,
                         steps_replayed=len(audit.replayed))
    return 1 if audit.findings else 0


def parse_range(text, flag):
    """(first, last) of a command line's A:B step range (UsageError unless 1 <= A <= B)."""
    a, _, b = text.partition(":")
    try:
        first, last = int(a), int(b)
    except ValueError:
        raise UsageError(f"{flag} expects A:B, got {text!r}") from None
    if not 1 <= first <= last:
        raise UsageError(f"{flag} {text}: steps start at 1 and a range runs forward")
    return first, last


def chain_steps(run, steps, flag="--steps"):
    """(first, last) of `steps` (A:B, default: every step), refused unless in the chain."""
    run.chain.verify()
    last_step = len(run.chain) - 1
    first, last = parse_range(steps, flag) if steps else (1, last_step)
    if last > last_step:
        raise UsageError(f"{flag}: steps {first}..{last} are not in the chain (it holds steps 1..{last_step})")
    return first, last


# ---- receipts, coverage, salts (receipts.py holds the protocol's logic)
def receipt_results(args):
    """The opened run and [receipts.Result] for every receipt under the directory given,
    checked with the run's secret or with revealed salts (--salts); a unit's receipt with the
    step's unit list and, for a fold node, the children revealed in --revealed DIR; each signer
    named by --roster, where given."""
    run = published.open_run(args.run_dir)
    run.chain.verify()
    roster = signing.read_roster(args.roster) if args.roster else None
    salt_of = receipts.salt_lookup(run.dir, run.genesis, args.salts)
    unit_list, fold_keyed = unitaudit.judging(run, args.revealed)
    return run, receipts.check_receipts(args.check_receipts or args.coverage, run.chain, salt_of, unit_list,
                                        fold_keyed, roster)


STATUSES = ("accepted", "rejected", "unsigned", "malformed", "unchecked")


def summarize(results, directory, roster=True, malformed_refused=True):
    """Print the count of each status (and, with a roster, the accepted receipts whose key is not
    in it: never counted); refuse (exit 2) if any receipt is malformed and malformed_refused."""
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    unknown = sum(r.status == "accepted" and r.name is None for r in results)
    print(f"receipts under {directory}: " + ", ".join(f"{n} {s}" for s, n in counts.items()
                                                         if n or s in ("accepted", "rejected", "malformed"))
          + (f" ({unknown} accepted by keys not in the roster)" if roster and unknown else ""))
    if counts["malformed"] and malformed_refused:
        raise UsageError(f"{counts['malformed']} malformed receipt(s) under {directory} (listed above)")
    return counts


def check_receipts_command(args):
    _, results = receipt_results(args)
    for r in results:
        unit = f", {r.receipt['unit']}" if r.receipt and r.receipt["unit"] != "step" else ""
        about = [f"step {r.receipt['step']}{unit} by {r.who() if args.roster or r.status == 'unsigned' else key_of(r)}"] \
            if r.receipt else []
        print(f"{r.status:9s} {receipts.shown(r.path)}: "
              + ": ".join(about + [receipts.shown(r.reason)] * bool(r.reason)))
    counts = summarize(results, args.check_receipts, roster=bool(args.roster))
    return 1 if counts["rejected"] or counts["unsigned"] else 0


def key_of(result):
    """A signer as printed without a roster: its key's fingerprint."""
    return f"key {signing.fingerprint(result.receipt['signer'])}"


def not_counted(results):
    """Print the receipts that coverage does not count: malformed and unsigned ones, and the
    accepted ones whose key is not in the roster (by key)."""
    strangers = {}
    for r in results:
        if r.status == "accepted" and r.name is None:
            strangers.setdefault(r.receipt["signer"], []).append(r)
    for status, why in (("malformed", "not a repops-receipt-v4 receipt"), ("unsigned", "no valid signature")):
        if found := [r for r in results if r.status == status]:
            print(f"not counted, {status} ({why}): {len(found)} receipt(s): "
                  + ", ".join(receipts.shown(r.path) for r in found[:10]) + (", ..." if len(found) > 10 else ""))
    for key, found in strangers.items():
        print(f"not counted, key {signing.fingerprint(key)} is not in the roster: {len(found)} accepted receipt(s), "
              f"steps {receipts.ranges(sorted({r.receipt['step'] for r in found}))}")


def coverage_command(args):
    if not args.roster:
        raise UsageError("--coverage counts the keys of a roster: give --roster FILE (an allowed_signers file, "
                         "one line NAME TYPE BASE64 per auditor)")
    run, results = receipt_results(args)
    first, last = chain_steps(run, args.steps)
    summarize(results, args.coverage, malformed_refused=False)   # a submitter's junk file must not stop the count
    not_counted(results)
    public = unitaudit.public_states(run, args.revealed)
    if run.cfg.unit_commits:
        covered = receipts.covered(results, run.chain, first, last, public)
        write_json(args, run, first, last, "coverage", {str(s): {u: sorted(k) for u, k in units_.items()}
                                                        for s, units_ in covered.items()})
        return unit_coverage(covered, first, last, args.redundancy, sorted(s for s in public if first <= s <= last))
    counts = receipts.coverage(results, first, last)
    write_json(args, run, first, last, "coverage", {str(s): n for s, n in counts.items()})
    total = last - first + 1
    for need in sorted({1, args.redundancy}):
        steps = [s for s, n in counts.items() if n >= need]
        print(f"steps {first}..{last} with >= {need} accepted receipt{'s' * (need > 1)} from distinct roster keys: "
              f"{len(steps)}/{total} ({100 * len(steps) / total:.1f}%): {receipts.ranges(steps)}")
    print(f"steps with none: {receipts.ranges(s for s, n in counts.items() if n == 0)}")
    if shown := [s for s in sorted(public) if first <= s <= last]:
        print(f"steps whose post-step state is public ({receipts.ranges(shown)}): their receipts prove the "
              "gradient's replay, not the update (anyone can check it from the published states)")
    return 0 if all(n >= args.redundancy for n in counts.values()) else 1


def unit_coverage(covered, first, last, redundancy, public):
    """Print what the counted receipts cover, unit by unit (a step is covered when every one of
    its provable units is: the update of a step whose post-step state is public is listed apart);
    exit code 0 when every provable unit has `redundancy` distinct roster keys."""
    n_units = sum(len(u) for u in covered.values())
    for need in sorted({1, redundancy}):
        done = sum(len(a) >= need for u in covered.values() for a in u.values())
        steps = [s for s, u in covered.items() if all(len(a) >= need for a in u.values())]
        print(f"units of steps {first}..{last} with >= {need} accepted receipt{'s' * (need > 1)} from distinct "
              f"roster keys: {done}/{n_units} ({100 * done / max(n_units, 1):.1f}%); steps all of whose units have "
              f"them: {len(steps)}/{last - first + 1}: {receipts.ranges(steps)}")
    short = [(s, u) for s, units_ in covered.items() for u, a in units_.items() if len(a) < redundancy]
    print(f"units with fewer than {redundancy}: {receipts.describe(short)}")
    if public:
        print(f"updates not provable by a receipt (post-step state public: steps {receipts.ranges(public)}): "
              "not counted; anyone checks them in seconds (--step S --update)")
    return 0 if not short else 1


def reveal_command(args):
    run = rundir.Run(args.run_dir)
    first, last = chain_steps(run, args.reveal_salts, "--reveal_salts")
    secret = receipts.read_secret(run.dir, "revealing salts needs the publisher's secret")
    text = json.dumps(receipts.reveal(secret, receipts.run_id(run.genesis), first, last), indent=1) + "\n"
    if not args.out:
        sys.stdout.write(text)
        return 0
    write_output(args.out, text)
    print(f"salts of steps {first}..{last} written to {args.out}: anyone can now check those steps' "
          f"receipts with --check_receipts DIR --salts {args.out} (and make new proofs for them: count only "
          "the receipts collected before this reveal)")
    return 0


def write_output(path, text):
    """Write `text` to the output file `path` (its folder made by prepare_output) through
    hashchain.write_atomically; UsageError if it cannot."""
    try:
        hashchain.write_atomically(path, text.encode())
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror}") from None


def write_json(args, run, first, last, what, value):
    """--plan's or --coverage's --out FILE: {"run": run id, "steps": [first, last], "redundancy",
    what: value} as JSON, for a coordinator's tools. The assignment maps each auditor (its roster
    name, or 1..K) to its steps or units; the coverage maps each step to its count of distinct
    roster keys, or, with unit commitments, each unit to the roster keys that cover it."""
    if args.out:
        write_output(args.out, json.dumps({"run": receipts.run_id(run.genesis), "steps": [first, last],
                                           "redundancy": args.redundancy, what: value}, indent=1) + "\n")
        print(f"{what} written to {args.out}")


# ---- the plan
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


def auditor_labels(args):
    """The plan's auditors: the roster's names (--roster; their keys printed now), else 1..K
    (--auditors K). UsageError unless exactly one of the two is given."""
    if (args.roster is None) == (args.auditors is None):
        raise UsageError("--plan needs the auditors: --roster FILE (their keys) or --auditors K, one of the two")
    if args.auditors is not None:
        receipts.plan({}, args.auditors, args.redundancy, 0)          # range-checked before any work
        return [str(a) for a in range(1, args.auditors + 1)]
    roster = signing.read_roster(args.roster)
    receipts.plan({}, len(roster), args.redundancy, 0)
    print("auditors (the roster's keys): " + ", ".join(f"{name} {signing.fingerprint(key)}" for key, name in roster.items()))
    return list(roster.values())


def plan_command(args):
    """Every step of --steps to --redundancy C distinct auditors of --auditors K, balanced by
    replay cost; the estimated hours per auditor (receipts.replay_hours, from probe_step); and
    the chance that a tampered step goes undetected: f^C, if each auditor is absent or
    dishonest with probability f independently of the others and of the step (the seed, kept
    private, is what makes the assignment unpredictable). f^C is an upper bound: an audit of a
    later step also replays the steps between it and its checkpoint."""
    labels = auditor_labels(args)
    if not 0 <= args.absent <= 1:
        raise UsageError(f"--absent {args.absent}: a fraction of the auditors, in [0, 1]")
    run = rundir.Run(args.run_dir)
    first, last = chain_steps(run, args.steps)
    seed = secrets.randbits(63) if args.seed is None else args.seed
    cfg, vocab = run.replay_config(args.device), run.vocab_size      # the probe's device checked too
    ckpts = [s for s, _ in run.checkpoints() if s < len(run.chain)]
    steps_replayed = receipts.replay_costs(first, last, ckpts)
    # a step's cost is its micro-batches (phases change their number from step to step)
    costs = receipts.replay_costs(first, last, ckpts, lambda s: micro_batches_at(cfg, s))
    assignment = receipts.plan(costs, len(labels), args.redundancy, seed)
    # The probe: one micro-batch of the run's model, or of the default model where that is less
    # work (a large run's model need not be timed here; a small one's overheads are measured).
    run_state = TrainState(cfg, vocab, args.device)
    probes = [(dataclasses.replace(c, micro_batches=1, micro_batch_phases=""), s) for c, s in
              ((cfg, run_state), (Config(), TrainState(Config(), vocab, args.device)))]
    probe_cfg, probe_state = min(probes, key=lambda p: p[1].n_params() * tokens(p[0]))
    probe_s = probe_step(probe_cfg, probe_state, TokenData(args.data_dir or run.recorded_data_dir(), cfg.seed))
    run_work = run_state.n_params() * tokens(cfg)
    probe_work = probe_state.n_params() * tokens(probe_cfg)
    if cfg.unit_commits:
        return plan_units(args, run, first, last, seed, receipts.replay_hours(1, probe_s, probe_work, run_work) * 3600,
                          run_state.flat_numel(), labels)
    print(f"plan: steps {first}..{last} of {args.run_dir} for {len(labels)} auditors, each step replayed "
          f"by {args.redundancy} of them, seed {seed}" + (" (drawn now: keep it private)" if args.seed is None else ""))
    print(f"replay cost: a probe step ({probe_state.n_params():,} params x {tokens(probe_cfg)} tokens) took "
          f"{probe_s:.3f} s here; a step of this run ({run_state.n_params():,} params x "
          f"{tokens(cfg) * micro_batches_at(cfg, last)} tokens) about "
          f"{receipts.replay_hours(micro_batches_at(cfg, last), probe_s, probe_work, run_work) * 3600:.3f} s")
    print("auditor  steps  replayed  est. hours  assigned steps")
    for a, steps in zip(labels, assignment):
        replayed = sum(steps_replayed[s] for s in steps)
        hours = receipts.replay_hours(sum(costs[s] for s in steps), probe_s, probe_work, run_work)
        print(f"{a:>7s}  {len(steps):5d}  {replayed:8d}  {hours:10.2g}  {receipts.ranges(steps)}")
    print(f"a tampered step goes undetected only if all {args.redundancy} of its auditors are absent or "
          f"dishonest: with each so with probability f = {args.absent} independently, "
          f"f^{args.redundancy} = {args.absent ** args.redundancy:.3g}")
    write_json(args, run, first, last, "assignment", dict(zip(labels, assignment)))
    return 0


def plan_units(args, run, first, last, seed, micro_s, numel, labels):
    """--plan on a run with unit commitments: every unit of --steps (each micro-batch, fold node and
    update) to --redundancy distinct auditors, balanced by the estimated seconds of each: a
    micro-batch the probe's (micro_s, scaled to this run's model); a fold node and the update
    from this machine's hashing rate (they hash 3 and about 7 vectors of numel floats)."""
    rate = unitaudit.hash_rate()
    seconds = {"micro_batch": micro_s, "fold": 3 * 4 * numel / rate, "update": 7 * 4 * numel / rate}
    costs = receipts.unit_costs(run.chain, first, last, seconds.get)
    assignment = receipts.plan(costs, len(labels), args.redundancy, seed)
    print(f"plan: the {len(costs)} units of steps {first}..{last} of {args.run_dir} (every micro-batch, fold node "
          f"and update) for {len(labels)} auditors, each unit audited by {args.redundancy} of them, seed {seed}"
          + (" (drawn now: keep it private)" if args.seed is None else ""))
    print(f"unit cost here, estimated: a micro-batch {micro_s:.3g} s, a fold node {seconds['fold']:.3g} s, the "
          f"update {seconds['update']:.3g} s (hashing {rate / 1e9:.2f} GB/s)")
    print("auditor  units  est. hours  assigned units")
    for a, items in zip(labels, assignment):
        hours = sum(costs[i] for i in items) / 3600
        print(f"{a:>7s}  {len(items):5d}  {hours:10.2g}  {receipts.describe(items)}")
    print(f"a lie in a unit goes undetected only if all {args.redundancy} of its auditors are absent or "
          f"dishonest: with each so with probability f = {args.absent} independently, "
          f"f^{args.redundancy} = {args.absent ** args.redundancy:.3g}")
    write_json(args, run, first, last, "assignment", {a: [f"{s}:{u}" for s, u in items]
                                                      for a, items in zip(labels, assignment)})
    return 0


# ---- anchors
def anchors_command(args):
    run = published.open_run(args.run_dir)
    anchors = receipts.read_anchors(args.anchors)
    if os.path.realpath(args.anchors) == os.path.realpath(os.path.join(run.dir, receipts.ANCHORS)):
        print("note: this is the run's own anchors.jsonl; anchors pin the chain only as copies "
              "published outside the run")
    found = receipts.first_contradiction(run.chain, anchors)
    if found:
        print(f"MISMATCH at step {found[0]}: {found[1]}")
        return 1
    latest = max(anchors, key=lambda a: a["step"])
    publisher = receipts.publisher_of(run.chain)
    signed = (f"each signed by the publisher key the genesis names, {signing.fingerprint(publisher)}" if publisher
              else "unsigned: the genesis names no publisher key, so whoever copied them decided what they say")
    print(f"ANCHORED: the chain agrees with all {len(anchors)} anchors of {args.anchors} (latest: step "
          f"{latest['step']}, anchored at {latest['utc']}; {signed})")
    return 0

# ----------------------------------------------------------------------------- the command line
# The options that name a file (or, for the publisher's --out, a directory) the audit writes:
# each is checked before any work (rundir.prepare_output: outside the run, its folder made or refused).
OUTPUT_OPTIONS = ("trace", "receipt", "out")
DIRECTORY_OUT = ("materialize", "reveal_unit")       # the modes whose --out is a directory
COMMANDS = {"step": unit_command, "range": replay_command, "all": replay_command,
            "check_receipts": check_receipts_command, "coverage": coverage_command,
            "reveal_salts": reveal_command, "plan": plan_command, "anchors": anchors_command,
            "materialize": unitaudit.materialize_command, "reveal_unit": unitaudit.reveal_command}


def main(argv=None):
    ap = parser()
    try:
        args = ap.parse_args(argv)
        mode = ap.mode(args)
        if (args.receipt is None) != (args.key is None):
            raise UsageError("--receipt FILE and --key KEYFILE go together (a receipt is signed)")
        if args.threads < 0:
            raise UsageError(f"--threads {args.threads}: must be >= 0 (0: measured)")
        if args.redundancy < 1:
            raise UsageError(f"--redundancy {args.redundancy}: each step needs at least 1 auditor")
        if not args.timeout > 0:
            raise UsageError(f"--timeout {args.timeout}: seconds, more than 0")
        if mode in DIRECTORY_OUT and not args.out:
            raise UsageError(f"--{mode} needs --out DIR (a directory outside the run)")
        byterange.configure(args.cache, args.timeout)
        # before any replay: the key signs, and every output's folder exists (or is refused)
        args.signer = signing.Signer(args.key, "--key") if args.key else None
        for option in OUTPUT_OPTIONS:
            if getattr(args, option):
                rundir.prepare_output(args.run_dir, getattr(args, option), "--" + option,
                                      directory=option == "out" and mode in DIRECTORY_OUT)
        if args.cache or any(byterange.is_url(getattr(args, k, None)) for k in ("run_dir", "data_dir")):
            rundir.prepare_output(args.run_dir, byterange.cache_root(), "--cache", directory=True)
        code = COMMANDS[mode](args)
        if fetched := published.summary():
            print(fetched)
        return code
    except DataMismatch as e:       # a bundle chunk is not what the run published
        print(f"MISMATCH: {e}")
        return 1
    except (UsageError, DataError, hashchain.HashChainError, repops.RepOpsBuildError) as e:
        print(f"audit.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:      # Ctrl-C, or SIGTERM (stop_on_sigterm): no verdict
        what, code = stopped_by(e)
        print(f"audit.py: stopped ({what}) before its verdict; no receipt was written; the same command "
              "runs the audit again", file=sys.stderr)
        return code
    except (MemoryError, RuntimeError) as e:   # never exit 1: that is MISMATCH
        if not (line := out_of_memory(e, "audit this run")):
            raise
        print(f"audit.py: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    stop_on_sigterm()                   # SIGTERM unwinds as Ctrl-C does: main's one line, exit 143
    sys.exit(main())
