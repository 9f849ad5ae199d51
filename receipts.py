"""Audits that cannot be faked and that add up: receipts, a coverage plan, anchored chain heads.

The chain's per-step hashes are public, so an "auditor" could report MATCH without replaying
anything. Three pieces close that and the two other holes (no plan, no anchor):

    # 1. Commit, then reveal. The trainer (the run's lock holder) makes the run's secret once;
    #    the genesis record holds secret_commit(secret); every step record carries
    #    step_commit = SHA-256(salt_s || grad_root_s || result_root_s), where
    #    salt_s = HMAC-SHA256(secret, step as 8 bytes big-endian), grad_root_s is
    #    hashchain.tensor_leaf("grad", the step's final gradient: folded, scaled, clipped) and
    #    result_root_s = hashchain.keyed_state_root(grad_root_s, the post-step state): the
    #    step's whole result (update and re-pin included), salted with what only a replay knows.
    secret = make_secret("runs/x")                      # trainer only: 32 random bytes, mode 0600
    secret = read_secret("runs/x", "why it is needed")  # UsageError if missing or malformed
    secret_commit(secret)                               # the genesis record's secret_commit
    commit(salt(secret, 17), grad_root, result_root)    # the record's step_commit
    write_receipt("alice/step_17.json", receipt)        # audit.py --step 17 --receipt FILE
    results = check_receipts("receipts/", chain, salts) # [Result]: accepted/rejected/malformed/unchecked
    unit_receipt(genesis, record, "micro_batch:3", proof, auditor, ...)   # v3: one unit (below)
    check_receipts("receipts/", chain, salts, unit_list, fold_keyed)     # v3 receipts need these
    reveal(secret, run_id(genesis), 1, 40)              # salts of steps 1..40, for anyone to check with

    # 2. A plan for K auditors, each step replayed by C of them; what accepted receipts cover.
    costs = replay_costs(1, 40, checkpoint_steps)      # {step: steps an audit of it replays}
    assignment = plan(costs, auditors=8, redundancy=2, seed=42)
    counts = coverage(accepted_results, 1, 40)          # {step: distinct auditors}
    covered(results, chain, 1, 40)                      # {step: {unit: {auditors}}}, by unit
    plan(unit_costs(chain, 1, 40, seconds), 8, 2, 42)   # a plan of units: [[(step, unit), ...], ...]
    ranges([1, 2, 3, 7])                                # "1-3,7"

    # 3. Anchors: chain heads published outside the run (the trainer writes run_dir/anchors.jsonl
    #    every anchor_every steps; the publisher copies it out: a git tag, a transparency log).
    append_anchor("runs/x", step, record_hash)
    first_contradiction(chain, read_anchors("anchors.jsonl"))   # None, or (step, message)

Only a replay produces grad_root and result_root: they appear nowhere in the chain, and
step_commit hides them behind a salt that only the secret's holder can compute. A receipt
(format repops-receipt-v2) opens the commitment only if the auditor computed the step's gradient
and its post-step state bit for bit (the state's public hash does not give its keyed root), and
it names the record hash of the step it audited, so a chain rewritten later rejects it.
A run made with unit commitments (units.py) is audited unit by unit: one micro-batch, one fold
node, the update, or the whole step, each with a receipt of format repops-receipt-v3 (SPEC
§20.7) that names its unit and holds what only that audit computes:
- micro_batch:M: `witness`, W_m, which opens the step's commitment c_m with the salt
  salt_{s,m} = HMAC-SHA256(salt_s, "unit" || M); nothing revealed by a publisher gives it;
- fold:LO:SIZE: `keyed`, the node's chunked digest under a key bound to the run, the node and
  the auditor's name (units.fold_key): made from the node's value, which whoever revealed its
  children re-derives (fold_keyed);
- update: `state_hash`, `grad_root`, `result_root`, which open step_commit as a v2 receipt's do;
- step: those three and `witnesses`, every W_m of the step: a whole-step receipt stays a proof
  of the whole replay even after a dispute has revealed S (from which the update alone gives
  grad_root and result_root).
Each kind of run refuses the other's format. A step is covered when every one of its units is.
Auditor names are 1..64 printable characters; whatever a receipt holds is printed escaped
(shown). The publisher checks receipts with the secret; revealing the salts of a range lets anyone check those receipts
later. Bad input raises config.UsageError (one line); a malformed receipt is reported as such
by check_receipts, not raised.
"""
import bisect
import dataclasses
import datetime
import hashlib
import hmac
import json
import os
import re
import resource
import secrets
import time
from pathlib import Path

import config
import hashchain
import units
from config import UsageError

SECRET = "secret"                  # in the run directory; never published
SECRET_BYTES = 32
ANCHORS = "anchors.jsonl"          # in the run directory; meant to be copied out of it
RECEIPT_FORMAT = "repops-receipt-v2"   # v2: result_root and record_hash (v1 proved the gradient only)
UNIT_RECEIPT_FORMAT = "repops-receipt-v3"   # v3: one unit of a run with unit commitments (units.py)
SALTS_FORMAT = "repops-salts-v1"
SECRET_COMMIT = b"repops-secret-commit-v1"
MAX_FILE = 1 << 20                 # a receipt or salts file is a few KB
MAX_ANCHORS = 64 << 20             # an anchors file: ~120 bytes per anchored step
MAX_AUDITOR = 64                   # characters of an auditor's name
MAX_AUDITORS = 1 << 20             # --plan --auditors: a plan lists every auditor
HEX64 = re.compile(r"[0-9a-f]{64}")


def is_hex64(value):
    return isinstance(value, str) and HEX64.fullmatch(value) is not None


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _read_json_file(path, what, error, limit=MAX_FILE):
    """The UTF-8 text of a regular file no larger than `limit`; `error` on any problem."""
    try:
        return hashchain.read_bytes(path, what, limit, error).decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{what} {path} is not UTF-8 text") from None


def shown(text):
    """`text` safe to print on one line: as it is if printable, else escaped (ascii()), so no
    name, path or finding can add a line (a forged "accepted") to what a command prints."""
    text = str(text)
    return text if text.isprintable() else ascii(text)


def auditor_problem(name):
    """Why `name` is not an auditor's name (None if it is one): 1..MAX_AUDITOR printable
    characters, no leading or trailing space."""
    if not isinstance(name, str) or not name.strip():
        return "an auditor's name must not be empty"
    if len(name) > MAX_AUDITOR or not name.isprintable() or name != name.strip():
        return (f"an auditor's name is 1..{MAX_AUDITOR} printable characters without leading or "
                "trailing spaces")
    return None


# ----------------------------------------------------------------------------- 1. secret, commitments
def make_secret(run_dir):
    """The trainer's secret for a run whose chain is still empty: kept if run_dir/secret already
    holds one (a publisher may provide it, e.g. to give two runs the same chain bytes), otherwise
    32 random bytes written atomically with mode 0600. Returns it."""
    path = Path(run_dir) / SECRET
    if not path.exists():
        tmp = path.with_name(".secret.tmp")
        tmp.unlink(missing_ok=True)          # O_EXCL below: the mode applies to a new file only
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(SECRET_BYTES))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)                # a kill leaves no secret or a whole one
        hashchain.fsync_dir(path.parent)     # durable before the genesis record that needs it
    return read_secret(run_dir, "")


def read_secret(run_dir, hint):
    """The run's secret; UsageError (ending with `hint`) if it is missing or not 32 bytes."""
    path = Path(run_dir) / SECRET
    if not path.exists():
        raise UsageError(f"{path} is missing: {hint}")
    with hashchain.open_regular(path, "secret", UsageError) as f:
        secret = f.read(SECRET_BYTES + 1)
    if len(secret) != SECRET_BYTES:
        raise UsageError(f"{path} is not a run secret ({SECRET_BYTES} bytes)")
    return secret


def salt(secret, step):
    """salt_s = HMAC-SHA256(secret, step as 8 bytes big-endian), 32 bytes."""
    return hmac.new(secret, step.to_bytes(8, "big"), hashlib.sha256).digest()


def commit(salt_bytes, grad_root, result_root):
    """step_commit = SHA-256(salt || grad_root || result_root), each as raw 32 bytes; hex."""
    return hashlib.sha256(salt_bytes + bytes.fromhex(grad_root) + bytes.fromhex(result_root)).hexdigest()


def secret_commit(secret):
    """The genesis record's commitment to the run's secret: HMAC-SHA256(secret, SECRET_COMMIT),
    hex. It reveals nothing of the secret, and a resume with another secret is refused by it."""
    return hmac.new(secret, SECRET_COMMIT, hashlib.sha256).hexdigest()


def run_id(genesis):
    """A run's identity: its genesis record's hash (every later record links back to it)."""
    return genesis["record_hash"]


# ----------------------------------------------------------------------------- receipts
# Every field a receipt has, and its type (HEX: 64 hex digits): a whole step's of a run without
# unit commitments (v2), and a unit's of a run with them (v3: the common fields and its proof).
HEX = "hex64"
RECEIPT_FIELDS = {"format": str, "run": HEX, "step": int, "record_hash": HEX, "state_hash": HEX,
                  "grad_root": HEX, "result_root": HEX, "auditor": str, "machine": dict,
                  "cost": dict, "code_digest": HEX, "data_manifest": HEX, "verdict": str,
                  "findings": list}
UNIT_FIELDS = {"format": str, "run": HEX, "step": int, "unit": str, "record_hash": HEX, "auditor": str,
               "machine": dict, "cost": dict, "code_digest": HEX, "data_manifest": HEX, "verdict": str,
               "findings": list}
PROOFS = {"micro_batch": {"witness": HEX}, "fold": {"keyed": HEX},
          "update": {"state_hash": HEX, "grad_root": HEX, "result_root": HEX},
          "step": {"state_hash": HEX, "grad_root": HEX, "result_root": HEX, "witnesses": list}}


class Malformed(Exception):
    """A file that is not a receipt (reported by check_receipts, never raised to the CLI)."""


def unit_kind(unit):
    """micro_batch, fold, update or step: what a unit's receipt proves (PROOFS)."""
    return unit if unit in ("step", "update") else unit.partition(":")[0]


def unit_receipt(genesis, record, unit, proof, auditor, machine, cost, code_digest, data_manifest, findings):
    """A v3 receipt of `unit` of the step of `record` (the fields of PROOFS[unit_kind(unit)] from proof)."""
    return {"format": UNIT_RECEIPT_FORMAT, "run": run_id(genesis), "step": record["step"], "unit": unit,
            "record_hash": record["record_hash"], **proof, "auditor": auditor, "machine": machine,
            "cost": cost, "code_digest": code_digest, "data_manifest": data_manifest,
            "verdict": "MISMATCH" if findings else "MATCH", "findings": list(findings)}


def close_audit(t0, bytes_read, receipt_path, make_receipt, stopped, written, windows=True, **cost):
    """The end of an audit command (a whole-step replay, a unit): its cost (seconds since t0,
    peak memory, bytes read, and the `cost` keys given) printed as the "audit cost:" line, and
    with receipt_path the receipt make_receipt(cost) gives (None: `stopped` says why none)
    written there, `written` naming it. Returns the cost."""
    cost = {"seconds": round(time.perf_counter() - t0, 3), **cost,
            "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), "bytes_read": bytes_read}
    print(f"audit cost: {cost['seconds']:.1f} s, peak memory {cost['peak_mib']} MiB, read {bytes_read / 1e6:.1f} MB"
          + (" (+ token windows)" if windows else ""))
    if receipt_path:
        receipt = make_receipt(cost)
        if receipt is None:
            print(f"receipt: none written, {stopped}")
        else:
            write_receipt(receipt_path, receipt)
            print(f"receipt: {written} ({receipt['verdict']}) by {receipt['auditor']} written to {receipt_path}")
    return cost


def write_receipt(path, receipt):
    try:
        with open(path, "w") as f:
            f.write(json.dumps(receipt, indent=1, sort_keys=True) + "\n")
    except OSError as e:
        raise UsageError(f"cannot write the receipt {path}: {e.strerror}") from None


def read_receipt(path):
    """The receipt in `path`, v2 or v3, every field type-checked; Malformed otherwise."""
    try:
        receipt = hashchain.strict_json(_read_json_file(path, "receipt", Malformed))
    except ValueError as e:
        raise Malformed(f"not valid JSON ({e})") from None
    if not isinstance(receipt, dict):
        raise Malformed("not a JSON object")
    fields, of_unit = RECEIPT_FIELDS, ""
    if receipt.get("format") == UNIT_RECEIPT_FORMAT:
        unit = receipt.get("unit")
        if not isinstance(unit, str) or not (unit in ("step", "update") or units.UNIT.fullmatch(unit)):
            raise Malformed("field unit must be step, update, micro_batch:M or fold:LO:SIZE")
        fields, of_unit = dict(UNIT_FIELDS, **PROOFS[unit_kind(unit)]), f" (unit {unit})"
    if set(receipt) != set(fields):
        odd = sorted(set(receipt) ^ set(fields))
        raise Malformed(f"field {odd[0]} is {'unknown' if odd[0] in receipt else 'missing'}{of_unit}")
    for key, kind in fields.items():
        value = receipt[key]
        ok = is_hex64(value) if kind == HEX else _is_int(value) if kind is int else isinstance(value, kind)
        if not ok:
            raise Malformed(f"field {key} must be {'64 hex digits' if kind == HEX else kind.__name__}")
    if receipt["format"] not in (RECEIPT_FORMAT, UNIT_RECEIPT_FORMAT):
        raise Malformed(f"format is not {RECEIPT_FORMAT}")
    if receipt["step"] < 1 or receipt["verdict"] not in ("MATCH", "MISMATCH"):
        raise Malformed("step must be >= 1, verdict MATCH or MISMATCH")
    if auditor_problem(receipt["auditor"]):
        raise Malformed(f"field auditor: {auditor_problem(receipt['auditor'])}")
    if not all(isinstance(f, str) for f in receipt["findings"]):
        raise Malformed("findings must be a list of strings")
    if not all(is_hex64(w) for w in receipt.get("witnesses", [])):
        raise Malformed("field witnesses must be a list of 64 hex digits")
    return receipt


@dataclasses.dataclass
class Result:
    path: str
    status: str                 # accepted, rejected, malformed, unchecked (no salt revealed)
    reason: str = ""
    receipt: dict = None


def genesis_config(chain):
    return config.from_record(chain.records[0].get("config", {}), "genesis config")


def judge(receipt, chain, salt_of, unit_list=None, fold_keyed=None):
    """(status, reason) of a well-formed receipt against the verified chain. salt_of(step): the
    step's salt, or None where it is not known (unchecked). A run with unit commitments takes
    v3 receipts only, a run without them v2 only; for those, unit_list(step) is the step's unit
    list checked against its units_root ({unit: entry}) or None, and fold_keyed(step, unit,
    auditor) the keyed digest of that fold node as whoever holds its children makes it, or None."""
    cfg, unit = genesis_config(chain), receipt.get("unit", "step")
    if cfg.unit_commits != (receipt["format"] == UNIT_RECEIPT_FORMAT):
        return "rejected", (f"a {RECEIPT_FORMAT} proves no micro-batch witness, and this run commits to "
                            f"its units: its receipts are {UNIT_RECEIPT_FORMAT}" if cfg.unit_commits else
                            f"this run has no unit commitments: its receipts are {RECEIPT_FORMAT}")
    step, genesis = receipt["step"], chain.records[0]
    if receipt["run"] != run_id(genesis):
        return "rejected", f"a receipt for another run ({receipt['run'][:12]})"
    if step >= len(chain):
        return "rejected", f"step {step} is not in the chain"
    record, n = chain.records[step], config.micro_batches_at(cfg, step)
    if unit not in ("step", "update") and unit not in units.names(n):
        return "rejected", f"{unit} is not a unit of step {step}"
    reasons = []
    if receipt["record_hash"] != record["record_hash"]:
        reasons.append("it audited another record of this step (the chain was rewritten, or it is "
                       "a receipt for another chain)")
    for key in ("code_digest", "data_manifest"):
        if receipt[key] != genesis.get(key):
            reasons.append(f"it was replayed with another {key}")
    if receipt["verdict"] != "MATCH":
        reasons.append("the auditor reports " + shown((receipt["findings"] or ["MISMATCH"])[0])[:200])
    kind = unit_kind(unit)

    def unchecked(why):                      # what is decided without a salt, a unit list or a reveal
        return ("rejected", "; ".join(reasons)) if reasons else ("unchecked", why)
    if kind == "fold":
        keyed = fold_keyed and fold_keyed(step, unit, receipt["auditor"])
        if keyed is None:
            return unchecked(f"the children of {unit} of step {step} are not at hand (--revealed DIR)")
        if keyed != receipt["keyed"]:
            reasons.append("its keyed digest is not the node's (the sum was not formed from its children?)")
        return ("rejected", "; ".join(reasons)) if reasons else ("accepted", "")
    step_salt = salt_of(step)
    if step_salt is None:
        return unchecked(f"no salt revealed for step {step}")
    if kind in ("update", "step"):
        if commit(step_salt, receipt["grad_root"], receipt["result_root"]) != record.get("step_commit"):
            reasons.append("its grad_root and result_root do not open the step's commitment (echoed, "
                           "or another gradient or post-step state: a replay that skipped the update?)")
        if receipt["state_hash"] != record.get("state_hash"):
            reasons.append("its state hash differs from the chain's")
    if cfg.unit_commits and kind in ("micro_batch", "step"):
        entries = unit_list and unit_list(step)
        if entries is None:
            return unchecked(f"no unit list of step {step} checks against its units_root")
        micro = [int(unit.partition(":")[2])] if kind == "micro_batch" else range(n)
        witnesses = [receipt["witness"]] if kind == "micro_batch" else receipt["witnesses"]
        if len(witnesses) != len(micro) or not all(
                units.witness_commit(units.unit_salt(step_salt, m), bytes.fromhex(w)).hex()
                == entries[f"micro_batch:{m}"]["commit"] for m, w in zip(micro, witnesses)):
            reasons.append("its witness does not open the micro-batch's commitment c_m (copied, or the "
                           "micro-batch's replay was skipped)" if kind == "micro_batch" else
                           "its witnesses do not open the micro-batches' commitments (the micro-batches "
                           "were not all replayed)")
    return ("rejected", "; ".join(reasons)) if reasons else ("accepted", "")


def receipt_files(directory):
    """Every *.json under `directory` (sorted, symlinked directories not followed)."""
    if not os.path.isdir(directory):
        raise UsageError(f"no receipt directory {directory}")
    found = sorted(os.path.join(d, name) for d, _, names in os.walk(directory)
                   for name in names if name.endswith(".json"))
    if not found:
        raise UsageError(f"no receipts (*.json) under {directory}")
    return found


def check_receipts(directory, chain, salt_of, unit_list=None, fold_keyed=None):
    """[Result] for every receipt file under `directory` against the verified chain (judge)."""
    results = []
    for path in receipt_files(directory):
        try:
            receipt = read_receipt(path)
        except Malformed as e:
            results.append(Result(path, "malformed", str(e)))
            continue
        results.append(Result(path, *judge(receipt, chain, salt_of, unit_list, fold_keyed), receipt))
    return results


# ----------------------------------------------------------------------------- reveal
def reveal(secret, run, first, last):
    """The salts of steps first..last as a JSON-ready object: with them anyone can check those
    steps' receipts (grad_root still stays hidden in the commitment)."""
    return {"format": SALTS_FORMAT, "run": run,
            "salts": {str(s): salt(secret, s).hex() for s in range(first, last + 1)}}


def read_salts(path, run):
    """{step: salt bytes} from a file reveal() wrote for this run; UsageError otherwise."""
    try:
        doc = hashchain.strict_json(_read_json_file(path, "salts file", UsageError))
    except ValueError as e:
        raise UsageError(f"salts file {path} is not valid JSON ({e})") from None
    if not (isinstance(doc, dict) and doc.get("format") == SALTS_FORMAT and isinstance(doc.get("salts"), dict)
            and all(re.fullmatch(r"[1-9][0-9]*", k) and is_hex64(v) for k, v in doc["salts"].items())):
        raise UsageError(f"{path} is not a salts file ({SALTS_FORMAT}: step -> 64 hex digits)")
    if doc.get("run") != run:
        raise UsageError(f"{path} reveals the salts of another run")
    return {int(k): bytes.fromhex(v) for k, v in doc["salts"].items()}


def salt_lookup(run_dir, genesis, salts_path=None, required=True):
    """salt_of(step) for check_receipts: from revealed salts (salts_path; None where a step's
    salt is not revealed) or else from the run's secret (the publisher). UsageError if neither,
    unless not `required` (a replay checks step_commit where it can): then None for every step."""
    if salts_path:
        return read_salts(salts_path, run_id(genesis)).get
    if not required and not (Path(run_dir) / SECRET).exists():
        return lambda step: None
    secret = read_secret(run_dir, "checking receipts needs the publisher's secret "
                         "(or --salts FILE with revealed salts)")
    return lambda step: salt(secret, step)


def replay_keys(run_dir, genesis, salts_path=None):
    """(salt_of, secret) of a replay (audit.py): salt_of(step) from revealed salts (salts_path)
    or the run's secret, None where neither gives it (the replay then leaves step_commit
    unchecked); secret: the run's, where this is the publisher's run directory, else None."""
    secret = read_secret(run_dir, "") if (Path(run_dir) / SECRET).exists() else None
    return salt_lookup(run_dir, genesis, salts_path, required=False), secret


# ----------------------------------------------------------------------------- 2. plan, coverage
def replay_costs(first, last, checkpoint_steps, step_work=None):
    """{step: how many steps an audit of it replays}: audit.py starts from the latest
    checkpoint before the step (the genesis state, step 0, when there is none). With
    step_work(s) (e.g. step s's micro-batch count, which micro-batch phases vary), the sum of
    step_work over those steps instead."""
    ckpts = sorted(set(checkpoint_steps) | {0})
    if step_work is None:
        return {s: s - ckpts[bisect.bisect_right(ckpts, s - 1) - 1] for s in range(first, last + 1)}
    return {s: sum(step_work(k) for k in range(ckpts[bisect.bisect_right(ckpts, s - 1) - 1] + 1, s + 1))
            for s in range(first, last + 1)}


def _key(seed, *parts):
    """A pseudo-random sort key that only the seed's holder can predict (SHA-256, no RNG state)."""
    return hashlib.sha256(json.dumps([seed, *parts]).encode()).digest()


def plan(costs, auditors, redundancy, seed):
    """[sorted steps of auditor 0, of auditor 1, ...]: every step of `costs` goes to `redundancy`
    distinct auditors. Greedy by cost: the most expensive steps first (in seed order within a
    cost), each to the least-loaded auditors (ties in seed order), so no auditor's total cost
    exceeds another's by more than one step's cost. Deterministic given the seed."""
    if not (1 <= auditors <= MAX_AUDITORS and 1 <= redundancy <= MAX_AUDITORS):
        raise UsageError(f"--auditors {auditors} --redundancy {redundancy}: both must be in "
                         f"1..{MAX_AUDITORS}")
    if redundancy > auditors:
        raise UsageError(f"--redundancy {redundancy} needs at least {redundancy} distinct auditors, "
                         f"--auditors is {auditors}")
    load, steps = [0] * auditors, [[] for _ in range(auditors)]
    for step in sorted(costs, key=lambda s: (-costs[s], _key(seed, "step", s))):
        for a in sorted(range(auditors), key=lambda a: (load[a], _key(seed, "auditor", step, a)))[:redundancy]:
            load[a] += costs[step]
            steps[a].append(step)
    return [sorted(s) for s in steps]


def replay_hours(replayed_steps, probe_seconds, probe_work, run_work):
    """Estimated hours to replay `replayed_steps` steps of a run, from one step of a probe model
    timed on this machine. A step's time scales with its work W = P x T (parameters x tokens per
    step: its matmuls are about 6 P T flops), so

        hours = replayed_steps x probe_seconds x W_run / W_probe / 3600

    (an audit's fixed work, verifying the chain and the checkpoints, is not counted)."""
    return replayed_steps * probe_seconds * run_work / probe_work / 3600


def coverage(results, first, last):
    """{step: distinct auditors with an accepted receipt for it}, for steps first..last."""
    auditors = {s: set() for s in range(first, last + 1)}
    for r in results:
        if r.status == "accepted" and r.receipt["step"] in auditors:
            auditors[r.receipt["step"]].add(r.receipt["auditor"])
    return {s: len(a) for s, a in auditors.items()}


def step_units(chain, step):
    """The units an audit of `step` covers: every unit of units.all_units with unit commitments,
    else the step itself."""
    cfg = genesis_config(chain)
    return units.all_units(config.micro_batches_at(cfg, step)) if cfg.unit_commits else ["step"]


def covered(results, chain, first, last):
    """{step: {unit: {auditors with an accepted receipt covering it}}} for steps first..last; a
    whole-step receipt covers every unit of its step."""
    out = {s: {u: set() for u in step_units(chain, s)} for s in range(first, last + 1)}
    for r in results:
        if r.status != "accepted" or r.receipt["step"] not in out:
            continue
        unit = r.receipt.get("unit", "step")
        for u in (out[r.receipt["step"]] if unit == "step" else [unit]):
            out[r.receipt["step"]][u].add(r.receipt["auditor"])
    return out


def unit_costs(chain, first, last, seconds):
    """{(step, unit): estimated seconds} of every unit of steps first..last (plan's costs);
    seconds(kind) is a unit's cost by unit_kind (micro_batch, fold, update)."""
    return {(s, u): seconds(unit_kind(u)) for s in range(first, last + 1) for u in step_units(chain, s)}


def describe(items):
    """Compact text of sorted (step, unit) items: "12: micro_batch 0-2, fold 0:2 0:4, update; 13: ..."."""
    by_step = {}
    for step, unit in items:
        by_step.setdefault(step, []).append(unit)
    parts = []
    for step, names in sorted(by_step.items()):
        micro = sorted(int(u.partition(":")[2]) for u in names if u.startswith("micro_batch:"))
        folds = sorted((tuple(map(int, u.split(":")[1:])) for u in names if u.startswith("fold:")))
        text = ([f"micro_batch {ranges(micro)}"] if micro else []) + \
               ([("fold " + " ".join(f"{lo}:{size}" for lo, size in folds))] if folds else []) + \
               [u for u in names if u in ("update", "step")]
        parts.append(f"{step}: {', '.join(text)}")
    return "; ".join(parts) or "none"


def ranges(steps):
    """Compact ranges of sorted integers: [1, 2, 3, 7] -> "1-3,7"."""
    parts, steps = [], sorted(steps)
    i = 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        parts.append(str(steps[i]) if i == j else f"{steps[i]}-{steps[j]}")
        i = j + 1
    return ",".join(parts) or "none"


# ----------------------------------------------------------------------------- 3. anchors
def _anchor(line):
    """The anchor a line holds, or None (not JSON, not an anchor)."""
    try:
        a = hashchain.strict_json(line)
    except ValueError:
        return None
    ok = (isinstance(a, dict) and set(a) == {"step", "record_hash", "utc"} and _is_int(a["step"])
          and a["step"] >= 0 and is_hex64(a["record_hash"]) and isinstance(a["utc"], str))
    return a if ok else None


def append_anchor(run_dir, step, record_hash):
    """Add {step, record_hash, utc} to run_dir/anchors.jsonl unless that step is anchored
    already (a resume re-derives anchored steps). The file is rewritten atomically: a kill
    leaves the old file or the new one, never a torn line. Only the lock holder calls this.
    Lines that are not anchors (a blank or torn tail, garbage) are dropped, as the chain drops a
    torn tail: nothing in this bookkeeping file can stop the run (its copies, published outside
    the run, are what count). A path that is not a regular file is bad input (UsageError)."""
    path = Path(run_dir) / ANCHORS
    raw = hashchain.read_bytes(path, "anchors file", MAX_ANCHORS, UsageError) if path.exists() else b""
    text = raw.decode("utf-8", "replace")     # a line that is not UTF-8 is not an anchor: dropped
    anchors = [a for a in map(_anchor, text.splitlines()) if a is not None]
    if any(a["step"] == step for a in anchors):
        return
    lines = [json.dumps(a, sort_keys=True, separators=(",", ":")) + "\n" for a in anchors]
    utc = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    anchor = {"step": step, "record_hash": record_hash, "utc": utc}
    lines.append(json.dumps(anchor, sort_keys=True, separators=(",", ":")) + "\n")
    tmp = path.with_name(f".{ANCHORS}.tmp")
    with open(tmp, "w") as f:
        hashchain.write_all(f, "".join(lines))   # REPOPS_SLOW_WRITE: slowed for the SIGKILL test
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    hashchain.fsync_dir(path.parent)


def read_anchors(path):
    """[{step, record_hash, utc}] from an anchors file; UsageError if it is not one."""
    return parse_anchors(_read_json_file(path, "anchors file", UsageError, MAX_ANCHORS), path)


def parse_anchors(text, path):
    """read_anchors of the text of the anchors file `path` (a published run's, fetched)."""
    anchors = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue                   # a blank line (a copy's trailing newline) holds nothing
        a = _anchor(line)
        if a is None:
            raise UsageError(f"{shown(path)} line {n} is not an anchor (JSON: step, record_hash, utc)")
        anchors.append(a)
    if not anchors:
        raise UsageError(f"{path} holds no anchors")
    return anchors


def first_contradiction(chain, anchors):
    """(step, message) of the first anchor (in step order) that the chain contradicts, or None.
    The chain's links are verified up to the last anchored step: a broken link or a record whose
    hash does not match its contents contradicts every anchor from its step on."""
    try:
        chain.verify(upto=max(a["step"] for a in anchors))
        broken = None
    except hashchain.ChainError as e:
        broken = e
    for a in sorted(anchors, key=lambda a: a["step"]):
        step, where = a["step"], f"anchored at {a['utc']} with record hash {a['record_hash'][:16]}"
        if broken and step >= broken.line - 1:
            return broken.line - 1, f"{broken.message} (the anchor of step {step}: {where})"
        if step >= len(chain):
            return step, f"{where}, but the chain ends at step {len(chain) - 1} (history cut after anchoring)"
        if chain.records[step]["record_hash"] != a["record_hash"]:
            return step, (f"{where}, the chain holds {chain.records[step]['record_hash'][:16]} "
                          "(history rewritten after anchoring)")
    return None
