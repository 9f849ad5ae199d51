"""Audits that cannot be faked, that count keys, and that add up: receipts, a coverage plan,
signed anchors (SPEC.md §11.6-§11.8).

The chain's per-step hashes are public, so an "auditor" could report MATCH without replaying
anything; a name is any string; and chain heads copied out of a run say what the copier wants.
Three pieces close those holes:

    # 1. Seal, then reveal. The trainer (the run's lock holder) makes the run's secret once; the
    #    genesis record holds secret_commit(secret). salt_s = HMAC-SHA256(secret, s as 8 bytes
    #    big-endian); every step record holds step_commit, the step's result_root sealed with
    #    salt_s (hashchain.seal_value), where result_root = hashchain.keyed_state_root(grad_root,
    #    the post-step state) and grad_root = hashchain.tensor_leaf("grad", the step's final
    #    gradient): a digest of the step's whole result that only its replay computes.
    secret = make_secret("runs/x")                      # trainer only: 32 random bytes, mode 0600
    secret = read_secret("runs/x", "why it is needed")  # UsageError if missing or malformed
    secret_commit(secret)                               # the genesis record's secret_commit
    step_commit(salt(secret, 17), result_root)          # the record's step_commit

    # A receipt (repops-receipt-v4) names one unit of one step, its signer's SSH public key and a
    # proof of the unit's secret value bound to that key and to the run (units.bound), and is
    # signed with that key (signing.py). Proofs by unit: a whole step of a run without unit
    # commitments: result (of result_root); micro_batch:M: witness (of W_M); fold:LO:SIZE: keyed
    # (the node's digest under units.signer_key); update: result; a whole step of a run with unit
    # commitments: witnesses (every W_M's) and result, which cover its micro-batches and its
    # update, not its fold nodes (the update's input S may have been revealed: nothing in it shows
    # that the sums were formed).
    receipt = make_receipt(genesis, record, "step", {"result": result_proof(...)}, signer.public_key, ...)
    write_receipt("r/step_17.json", sign_receipt(receipt, signer))   # audit.py --receipt FILE --key KEY
    results = check_receipts("r/", chain, salt_of, unit_list, fold_keyed, roster)   # [Result]
    reveal(secret, run_id(genesis), 1, 40)              # salts of steps 1..40: after their receipts

    # 2. A plan for K auditors (a roster's keys), each unit audited by C of them; what counted
    #    receipts (accepted, signed by a roster key) cover.
    costs = replay_costs(1, 40, checkpoint_steps)      # {step: steps an audit of it replays}
    assignment = plan(costs, auditors=8, redundancy=2, seed=42)
    counts = coverage(results, 1, 40)                   # {step: distinct roster keys}
    covered(results, chain, 1, 40, public={10, 20})     # {step: {unit: {keys}}}, by unit
    ranges([1, 2, 3, 7])                                # "1-3,7"

    # 3. Anchors: chain heads published outside the run, signed by the publisher's key when the
    #    genesis names one (the trainer writes run_dir/anchors.jsonl every anchor_every steps).
    #    An anchor names its run through the record it pins (a step record names its run).
    append_anchor("runs/x", step, record_hash, signer)
    first_contradiction(chain, read_anchors("anchors.jsonl"))   # None, or (step, message)
    anchor_signature_problem(anchor, publisher)         # None when a walk may start from it

Who can check what. A receipt's proof is the HMAC of a value only the unit's work computes (a
step's result_root, a micro-batch's witness digest W_M) under a key made of the run, the unit and
the signer's public key: showing it gives the value to no one, so Bob cannot turn Alice's receipt
into his own (he needs the value: the work), and a receipt made for one run proves nothing for
another. The checker recomputes the proof from the value: the publisher opens the record's
seals with its secret; anyone can once the step's salts are revealed (--reveal_salts); a fold
node's proof is made from its children as the publisher revealed them. A reveal makes the
step's values public, after which anyone can make its proofs for any key: receipts come first,
reveals after (docs/publishing.md, "Reveals, and the protocol's order"). The signature says
which key made the receipt; only a roster (an allowed_signers file the coordinator writes) says
whose key it is.
Bad input raises config.UsageError (one line); a malformed receipt is reported as such by
check_receipts, not raised.
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
import signing
import units
from config import UsageError

SECRET = "secret"                  # in the run directory; never published
SECRET_BYTES = 32
ANCHORS = "anchors.jsonl"          # in the run directory; meant to be copied out of it
RECEIPT_FORMAT = "repops-receipt-v4"   # v4: signed, one unit, proofs bound to the signer and the run
SALTS_FORMAT = "repops-salts-v1"
SECRET_COMMIT = b"repops-secret-commit-v1"
MAX_FILE = 1 << 20                 # a receipt or salts file is a few KB
MAX_ANCHORS = 64 << 20             # an anchors file: ~120 bytes per anchored step (~700 signed)
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


# ----------------------------------------------------------------------------- 1. secret, seals
def make_secret(run_dir):
    """The trainer's secret for a run whose chain is still empty: kept if run_dir/secret already
    holds one (a publisher may provide it, e.g. to give two runs the same chain bytes), otherwise
    32 random bytes written with mode 0600 through hashchain.write_atomically. Returns it."""
    path = Path(run_dir) / SECRET
    if not path.exists():
        hashchain.write_atomically(path, secrets.token_bytes(SECRET_BYTES), mode=0o600)
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


def step_commit(salt_bytes, result_root):
    """The record's step_commit: result_root (hex) sealed with the step's salt, hex. The salt's
    holder reads result_root back from it (opened_result); no one else learns anything of it."""
    return hashchain.seal_value(salt_bytes, bytes.fromhex(result_root)).hex()


def opened_result(salt_bytes, commitment):
    """The result_root (raw 32 bytes) a record's step_commit seals, given the step's salt."""
    return hashchain.seal_value(salt_bytes, bytes.fromhex(commitment))


def secret_commit(secret):
    """The genesis record's commitment to the run's secret: HMAC-SHA256(secret, SECRET_COMMIT),
    hex. It reveals nothing of the secret, and a resume with another secret is refused by it."""
    return hmac.new(secret, SECRET_COMMIT, hashlib.sha256).hexdigest()


def run_id(genesis):
    """A run's identity: its genesis record's hash (every later record links back to it)."""
    return genesis["record_hash"]


# ----------------------------------------------------------------------------- receipts
# Every field a receipt has and its type (HEX: 64 hex digits); `signer` and `signature` may be
# missing (an unsigned receipt: listed, never counted), and so may a whole step's `witnesses`
# (a run without unit commitments has none).
HEX = "hex64"
FIELDS = {"format": str, "run": HEX, "step": int, "unit": str, "record_hash": HEX, "signer": str,
          "machine": dict, "cost": dict, "code_digest": HEX, "data_manifest": HEX, "verdict": str,
          "findings": list, "signature": str}
PROOFS = {"micro_batch": {"witness": HEX}, "fold": {"keyed": HEX}, "update": {"result": HEX},
          "step": {"result": HEX, "witnesses": list}}
OPTIONAL = {"signer", "signature", "witnesses"}


class Malformed(Exception):
    """A file that is not a receipt (reported by check_receipts, never raised to the CLI)."""


def unit_kind(unit):
    """micro_batch, fold, update or step: what a unit's receipt proves (PROOFS)."""
    return unit if unit in ("step", "update") else unit.partition(":")[0]


def result_proof(run, step, unit_commits, signer, result_root):
    """The proof of a step's result_root (hex) by the key blob `signer`: bound to the piece
    "<s>/update" in a run with unit commitments (the update's), "<s>/step" in one without."""
    piece = units.uid(step, "update" if unit_commits else "step")
    return units.bound(run, piece, signer, bytes.fromhex(result_root))


def witness_proof(run, step, m, signer, witness):
    """The proof of micro-batch m's witness digest W_m (raw 32 bytes) by the key blob `signer`."""
    return units.bound(run, units.uid(step, f"micro_batch:{m}"), signer, witness)


def make_receipt(genesis, record, unit, proof, signer, machine, cost, code_digest, data_manifest, findings):
    """A receipt of `unit` of the step of `record` by the public key `signer` ("TYPE BASE64"),
    unsigned (sign_receipt): the fields of PROOFS[unit_kind(unit)] from proof."""
    return {"format": RECEIPT_FORMAT, "run": run_id(genesis), "step": record["step"], "unit": unit,
            "record_hash": record["record_hash"], **proof, "signer": signer, "machine": machine,
            "cost": cost, "code_digest": code_digest, "data_manifest": data_manifest,
            "verdict": "MISMATCH" if findings else "MATCH", "findings": list(findings)}


def signed_bytes(receipt):
    """What a receipt's signature signs: the canonical JSON (SPEC §12.1) of the receipt without
    its `signature`, UTF-8."""
    return hashchain.canonical_json({k: v for k, v in receipt.items() if k != "signature"}).encode("utf-8")


def sign_receipt(receipt, signer):
    """`receipt` with its `signature` by signer (signing.Signer), namespace repops-receipt."""
    return {**receipt, "signature": signer.sign(signed_bytes(receipt), signing.RECEIPT)}


def close_audit(t0, bytes_read, receipt_path, make, stopped, written, signer=None, windows=True, **cost):
    """The end of an audit command (a whole-step replay, a unit): its cost (seconds since t0,
    peak memory, bytes read, and the `cost` keys given) printed as the "audit cost:" line, and
    with receipt_path the receipt make(cost) gives (None: `stopped` says why none) signed by
    signer (signing.Signer) and written there, `written` naming it. Returns the cost."""
    cost = {"seconds": round(time.perf_counter() - t0, 3), **cost,
            "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), "bytes_read": bytes_read}
    print(f"audit cost: {cost['seconds']:.1f} s, peak memory {cost['peak_mib']} MiB, read {bytes_read / 1e6:.1f} MB"
          + (" (+ token windows)" if windows else ""))
    if receipt_path:
        receipt = make(cost)
        if receipt is None:
            print(f"receipt: none written, {stopped}")
        else:
            write_receipt(receipt_path, sign_receipt(receipt, signer))
            print(f"receipt: {written} ({receipt['verdict']}) signed by {signing.fingerprint(signer.public_key)} "
                  f"written to {receipt_path}")
    return cost


def receipt_bytes(receipt):
    """A receipt file's bytes: JSON with sorted keys, indent 1 (", " never: "," then a newline),
    ": " after each key, non-ASCII escaped as \\uXXXX, and a final newline (SPEC §11.6)."""
    return (json.dumps(receipt, indent=1, sort_keys=True, ensure_ascii=True, allow_nan=False) + "\n").encode()


def write_receipt(path, receipt):
    try:
        hashchain.write_atomically(path, receipt_bytes(receipt))
    except OSError as e:
        raise UsageError(f"cannot write the receipt {path}: {e.strerror}") from None


def read_receipt(path):
    """The receipt in `path`, every field type-checked; Malformed otherwise (another format too:
    this code reads RECEIPT_FORMAT only)."""
    try:
        receipt = hashchain.strict_json(_read_json_file(path, "receipt", Malformed))
    except ValueError as e:
        raise Malformed(f"not valid JSON ({e})") from None
    if not isinstance(receipt, dict):
        raise Malformed("not a JSON object")
    if receipt.get("format") != RECEIPT_FORMAT:
        raise Malformed(f"format {shown(json.dumps(receipt.get('format')))[:40]}: this code reads "
                        f"{RECEIPT_FORMAT} receipts only (since SPEC v4: signed, bound to their signer and run)")
    unit = receipt.get("unit")
    if not isinstance(unit, str) or not (unit in ("step", "update") or units.UNIT.fullmatch(unit)):
        raise Malformed("field unit must be step, update, micro_batch:M or fold:LO:SIZE")
    fields = dict(FIELDS, **PROOFS[unit_kind(unit)])
    odd = sorted((set(receipt) - set(fields)) | (set(fields) - OPTIONAL - set(receipt)))
    if odd:
        raise Malformed(f"field {odd[0]} is {'unknown' if odd[0] in receipt else 'missing'} (unit {unit})")
    for key, kind in fields.items():
        if key not in receipt:
            continue
        value = receipt[key]
        ok = is_hex64(value) if kind == HEX else _is_int(value) if kind is int else isinstance(value, kind)
        if not ok:
            raise Malformed(f"field {key} must be {'64 hex digits' if kind == HEX else kind.__name__}")
    if receipt["step"] < 1 or receipt["verdict"] not in ("MATCH", "MISMATCH"):
        raise Malformed("step must be >= 1, verdict MATCH or MISMATCH")
    if not all(isinstance(f, str) for f in receipt["findings"]):
        raise Malformed("findings must be a list of strings")
    if not all(is_hex64(w) for w in receipt.get("witnesses", [])):
        raise Malformed("field witnesses must be a list of 64 hex digits")
    if "signer" in receipt:
        if not signing.is_public_key(receipt["signer"]):
            raise Malformed("field signer is not an SSH public key written TYPE BASE64")
    return receipt


@dataclasses.dataclass
class Result:
    path: str
    status: str                 # accepted, rejected, unsigned, malformed, unchecked (no salt revealed)
    reason: str = ""
    receipt: dict = None
    name: str = None            # the roster's name of the signer's key (None: no roster, or not in it)

    @property
    def counted(self):
        """Coverage counts it: accepted, and signed by a key of the roster."""
        return self.status == "accepted" and self.name is not None

    def who(self):
        """The signer as printed: the roster's name, or the key's fingerprint marked unknown."""
        if self.name is not None:
            return self.name
        if self.receipt and "signer" in self.receipt and self.status != "unsigned":
            return f"key {signing.fingerprint(self.receipt['signer'])} (not in the roster)"
        return "no valid signature"


def genesis_config(chain):
    return config.from_record(chain.records[0].get("config", {}), "genesis config")


def judge(receipt, chain, salt_of, unit_list=None, fold_keyed=None):
    """(status, reason) of a well-formed receipt against the verified chain, its signature aside
    (check_receipts checks it). salt_of(step): the step's salt, or None where it is not known
    (unchecked). With unit commitments, unit_list(step) is the step's unit list checked against
    its units_root ({unit: entry}) or None, and fold_keyed(step, unit, signer blob) the keyed
    digest of that fold node as whoever holds its children makes it, or None."""
    cfg, unit = genesis_config(chain), receipt["unit"]
    if "signer" not in receipt:
        return "unsigned", "it names no signer key: its proofs are bound to none"
    if not cfg.unit_commits and (unit != "step" or "witnesses" in receipt):
        return "rejected", "this run has no unit commitments: its one unit is the whole step (unit step, no witnesses)"
    if cfg.unit_commits and unit == "step" and "witnesses" not in receipt:
        return "rejected", ("this run commits to its units: a whole step's receipt holds every micro-batch's "
                            "proof (witnesses)")
    step, genesis = receipt["step"], chain.records[0]
    run, signer = run_id(genesis), signing.parse_public_key(receipt["signer"])[1]
    if receipt["run"] != run:
        return "rejected", f"a receipt for another run ({receipt['run']})"
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
        reasons.append("the auditor reports " + hashchain.clipped(shown((receipt["findings"] or ["MISMATCH"])[0]), 400))
    kind = unit_kind(unit)

    def unchecked(why):                      # what is decided without a salt, a unit list or a reveal
        return ("rejected", "; ".join(reasons)) if reasons else ("unchecked", why)
    if kind == "fold":
        keyed = fold_keyed and fold_keyed(step, unit, signer)
        if keyed is None:
            return unchecked(f"the children of {unit} of step {step} are not at hand (--revealed DIR)")
        if keyed != receipt["keyed"]:
            reasons.append("its keyed digest is not the node's under its signer key (copied, made for another "
                           "key or run, or the sum was not formed from the children)")
        return ("rejected", "; ".join(reasons)) if reasons else ("accepted", "")
    step_salt = salt_of(step)
    if step_salt is None:
        return unchecked(f"no salt revealed for step {step}")
    if "result" in receipt:
        if not is_hex64(record.get("step_commit")):
            reasons.append("the step's record holds no step_commit")
        elif result_proof(run, step, cfg.unit_commits, signer, opened_result(step_salt, record["step_commit"]).hex()) \
                != receipt["result"]:
            reasons.append("its result proof is not the step's result under its signer key (copied from another "
                           "receipt, made for another key or run, or the update was skipped)")
    if kind in ("micro_batch", "step") and cfg.unit_commits:
        entries = unit_list and unit_list(step)
        if entries is None:
            return unchecked(f"no unit list of step {step} checks against its units_root")
        micro = [int(unit.partition(":")[2])] if kind == "micro_batch" else range(n)
        proofs = [receipt["witness"]] if kind == "micro_batch" else receipt["witnesses"]
        opened = [hashchain.seal_value(units.unit_salt(step_salt, m), bytes.fromhex(entries[f"micro_batch:{m}"]["commit"]))
                  for m in micro]
        if len(proofs) != len(micro) or any(witness_proof(run, step, m, signer, w) != p
                                            for m, w, p in zip(micro, opened, proofs)):
            reasons.append("its witness proof does not open the micro-batch's commitment c_m under its signer key "
                           "(copied from another receipt, made for another key or run, or the replay was skipped)"
                           if kind == "micro_batch" else
                           "its witness proofs do not open the micro-batches' commitments under its signer key "
                           "(the micro-batches were not all replayed by this key)")
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


def check_receipts(directory, chain, salt_of, unit_list=None, fold_keyed=None, roster=None):
    """[Result] for every receipt file under `directory` against the verified chain: its
    signature (signing.verify under its own signer key: "unsigned" when it does not verify or is
    missing), then judge; with `roster` ({public key: name}, signing.read_roster) each signer's
    name, None for a key that is not in it."""
    results = []
    for path in receipt_files(directory):
        try:
            receipt = read_receipt(path)
        except Malformed as e:
            results.append(Result(path, "malformed", str(e)))
            continue
        why = ("it has no signature" if "signature" not in receipt else
               signing.verify(signed_bytes(receipt), receipt["signature"], receipt["signer"], signing.RECEIPT)
               if "signer" in receipt else "it names no signer key")
        if why:
            results.append(Result(path, "unsigned", why, receipt))
            continue
        status, reason = judge(receipt, chain, salt_of, unit_list, fold_keyed)
        results.append(Result(path, status, reason, receipt, (roster or {}).get(receipt["signer"])))
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
    """{step: distinct roster keys with a counted receipt (Result.counted) for it}, steps first..last."""
    keys = {s: set() for s in range(first, last + 1)}
    for r in results:
        if r.counted and r.receipt["step"] in keys:
            keys[r.receipt["step"]].add(r.receipt["signer"])
    return {s: len(k) for s, k in keys.items()}


def step_units(chain, step, public=()):
    """The units of `step` that receipts can prove: with unit commitments every unit of
    units.all_units, but the update of a step in `public` (its post-step state is public: any
    witness of the update follows from S and that state, docs/auditing.md), else the step itself."""
    cfg = genesis_config(chain)
    if not cfg.unit_commits:
        return ["step"]
    return [u for u in units.all_units(config.micro_batches_at(cfg, step)) if u != "update" or step not in public]


def covers(receipt):
    """The units a well-formed receipt proves: a whole step's with witnesses (a run with unit
    commitments) its micro-batches and its update, not its fold nodes; any other its one unit."""
    if receipt["unit"] == "step" and "witnesses" in receipt:
        return [f"micro_batch:{m}" for m in range(len(receipt["witnesses"]))] + ["update"]
    return [receipt["unit"]]


def covered(results, chain, first, last, public=()):
    """{step: {unit: {roster keys with a counted receipt covering it}}} for steps first..last,
    the units of step_units(chain, step, public)."""
    out = {s: {u: set() for u in step_units(chain, s, public)} for s in range(first, last + 1)}
    for r in results:
        if not r.counted or r.receipt["step"] not in out:
            continue
        for u in covers(r.receipt):
            if u in out[r.receipt["step"]]:
                out[r.receipt["step"]][u].add(r.receipt["signer"])
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
ANCHOR_FIELDS = {"record_hash", "step", "utc"}       # and, signed: signature


def _anchor(line):
    """The anchor a line holds, or None (not JSON, not an anchor): {record_hash, step, utc}, or
    signed: {record_hash, signature, step, utc}. It names no run: the record it pins does
    (a step record's `run`; the genesis record's hash is the run's id)."""
    try:
        a = hashchain.strict_json(line)
    except ValueError:
        return None
    signed = ANCHOR_FIELDS | {"signature"}
    ok = (isinstance(a, dict) and set(a) in (ANCHOR_FIELDS, signed) and _is_int(a["step"])
          and a["step"] >= 0 and is_hex64(a["record_hash"]) and isinstance(a["utc"], str)
          and (set(a) == ANCHOR_FIELDS or isinstance(a["signature"], str)))
    return a if ok else None


def anchor_signed_bytes(anchor):
    """What an anchor's signature signs: the canonical JSON of the anchor without `signature`."""
    return hashchain.canonical_json({k: v for k, v in anchor.items() if k != "signature"}).encode("utf-8")


def append_anchor(run_dir, step, record_hash, signer=None):
    """Add {step, record_hash, utc} to run_dir/anchors.jsonl unless that step is anchored
    already (a resume re-derives anchored steps); with signer (signing.Signer, the publisher's
    key the genesis names) the anchor also holds its signature, namespace repops-anchor (the
    record it pins names the run, so the signature binds the run too). The file is rewritten through
    hashchain.write_atomically: a kill leaves the old file or the new one, never a torn line. Only
    the lock holder calls this. Lines that are not anchors (a blank or torn tail, garbage) are
    dropped, as the chain drops a torn tail: nothing in this bookkeeping file can stop the run (its
    copies, published outside the run, are what count). A path that is not a regular file is bad
    input (UsageError)."""
    path = Path(run_dir) / ANCHORS
    raw = hashchain.read_bytes(path, "anchors file", MAX_ANCHORS, UsageError) if path.exists() else b""
    text = raw.decode("utf-8", "replace")     # a line that is not UTF-8 is not an anchor: dropped
    anchors = [a for a in map(_anchor, text.splitlines()) if a is not None]
    if any(a["step"] == step for a in anchors):
        return
    utc = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    anchor = {"step": step, "record_hash": record_hash, "utc": utc}
    if signer is not None:
        anchor["signature"] = signer.sign(anchor_signed_bytes(anchor), signing.ANCHOR)
    lines = [hashchain.canonical_json(a) + "\n" for a in anchors + [anchor]]
    hashchain.write_atomically(path, "".join(lines).encode("utf-8"))  # REPOPS_SLOW_WRITE: the SIGKILL test


def read_anchors(path):
    """[anchor] from an anchors file; UsageError if it is not one."""
    return parse_anchors(_read_json_file(path, "anchors file", UsageError, MAX_ANCHORS), path)


def parse_anchors(text, path):
    """read_anchors of the text of the anchors file `path` (a published run's, fetched)."""
    anchors = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue                   # a blank line (a copy's trailing newline) holds nothing
        a = _anchor(line)
        if a is None:
            raise UsageError(f"{shown(path)} line {n} is not an anchor (JSON: step, record_hash, utc; signed: "
                             "also signature)")
        anchors.append(a)
    if not anchors:
        raise UsageError(f"{path} holds no anchors")
    return anchors


def publisher_of(chain):
    """The publisher's public key the genesis record names ("TYPE BASE64"), or None."""
    return chain.records[0].get("publisher")


def anchor_signature_problem(anchor, publisher):
    """Why a run whose genesis names the publisher's key `publisher` ("TYPE BASE64", or None)
    cannot take `anchor` on its signature, or None: unsigned, or not signed by that key (forged,
    or signed by another). Without a publisher key there is nothing to verify (None): such an
    anchor pins the chain only as a copy obtained outside the publication."""
    if publisher is None:
        return None
    who = f"the publisher key the genesis names ({signing.fingerprint(publisher)})"
    if "signature" not in anchor:
        return f"unsigned, but anchors of this run are signed by {who}"
    if signing.verify(anchor_signed_bytes(anchor), anchor["signature"], publisher, signing.ANCHOR):
        return f"not signed by {who}: forged, or signed by another key"
    return None


def first_contradiction(chain, anchors):
    """(step, message) of the first anchor (in step order) that the chain contradicts, or None.
    The chain's links are verified up to the last anchored step: a broken link or a record whose
    hash does not match its contents contradicts every anchor from its step on. An anchor that
    pins another record hash than the chain's contradicts it (a rewritten history, or another
    run's anchor: the record it pins names that run); so, when the genesis names the publisher's
    key, does an anchor that is unsigned or whose signature that key did not make."""
    try:
        chain.verify(upto=max(a["step"] for a in anchors))
        broken = None
    except hashchain.ChainError as e:
        broken = e
    publisher = publisher_of(chain) if len(chain) else None
    if publisher is not None and not signing.is_public_key(publisher):
        return 0, "the genesis record's publisher is not an SSH public key (TYPE BASE64)"
    for a in sorted(anchors, key=lambda a: a["step"]):
        step, where = a["step"], f"anchored at {shown(a['utc'])[:40]} with record hash {a['record_hash']}"
        if broken and step >= broken.line - 1:
            return broken.line - 1, f"{broken.message} (the anchor of step {step}: {where})"
        if problem := anchor_signature_problem(a, publisher):
            return step, f"{where}: {problem}"
        if step >= len(chain):
            return step, f"{where}, but the chain ends at step {len(chain) - 1} (history cut after anchoring)"
        if chain.records[step]["record_hash"] != a["record_hash"]:
            return step, (f"{where}, the chain holds {chain.records[step]['record_hash']} "
                          "(history rewritten after anchoring, or an anchor of another run)")
    return None
