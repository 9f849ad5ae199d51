"""Receipts of a run with unit commitments (repops-receipt-v3), and what receipts cover, unit by unit.

    receipt = make(genesis, record, "micro_batch:3", proof, auditor, machine, cost, code, data, findings)
    receipts.write_receipt(path, receipt)                   # as v2's: sorted keys, indent 1
    read(path)                                              # a v2 or v3 receipt, type-checked
    results = check(directory, chain, salt_of, unit_list, fold_keyed)   # [receipts.Result]
    covered(results, chain, first, last)                    # {step: {unit: {auditors}}}

A run made with unit_commits (units.py) is audited unit by unit: one micro-batch, one fold
node, the update, or the whole step. Each audit's receipt (SPEC §11.6) names its unit and holds
what only that audit computes:
- micro_batch:M: `witness`, W_m, which opens the step's commitment c_m with the salt
  salt_{s,m} = HMAC-SHA256(salt_s, "unit" || M); nothing revealed by a publisher gives it;
- fold:LO:SIZE: `keyed`, the node's chunked digest under a key bound to the run, the node and
  the auditor's name (units.fold_key): made from the node's value, which whoever revealed its
  children re-derives (fold_keyed);
- update: `state_hash`, `grad_root`, `result_root`, which open step_commit as a v2 receipt's do;
- step: those three and `witnesses`, every W_m of the step: a whole-step receipt stays a proof
  of the whole replay even after a dispute has revealed S (from which the update alone gives
  grad_root and result_root).
A run without unit commitments keeps repops-receipt-v2 (receipts.py), judged as before; each
kind of run refuses the other's format.
"""
import config
import hashchain
import receipts
import units
from config import micro_batches_at

FORMAT = "repops-receipt-v3"
HEX = receipts.HEX
COMMON = {"format": str, "run": HEX, "step": int, "unit": str, "record_hash": HEX, "auditor": str,
          "machine": dict, "cost": dict, "code_digest": HEX, "data_manifest": HEX, "verdict": str,
          "findings": list}
PROOFS = {"micro_batch": {"witness": HEX}, "fold": {"keyed": HEX},
          "update": {"state_hash": HEX, "grad_root": HEX, "result_root": HEX},
          "step": {"state_hash": HEX, "grad_root": HEX, "result_root": HEX, "witnesses": list}}


def kind(unit):
    return unit if unit in ("step", "update") else unit.partition(":")[0]


def make(genesis, record, unit, proof, auditor, machine, cost, code_digest, data_manifest, findings):
    """A v3 receipt of `unit` of the step of `record` (fields in PROOFS[kind(unit)] from proof)."""
    return {"format": FORMAT, "run": receipts.run_id(genesis), "step": record["step"], "unit": unit,
            "record_hash": record["record_hash"], **proof, "auditor": auditor, "machine": machine,
            "cost": cost, "code_digest": code_digest, "data_manifest": data_manifest,
            "verdict": "MISMATCH" if findings else "MATCH", "findings": list(findings)}


def read(path):
    """The receipt in `path`: repops-receipt-v2 (receipts.read_receipt) or v3, every field
    type-checked; receipts.Malformed otherwise."""
    doc = hashchain.read_json(path, "receipt", receipts.MAX_FILE, receipts.Malformed)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return receipts.read_receipt(path)
    unit = doc.get("unit")
    if not isinstance(unit, str) or not (unit in ("step", "update") or units.UNIT.fullmatch(unit)):
        raise receipts.Malformed("field unit must be step, update, micro_batch:M or fold:LO:SIZE")
    fields = dict(COMMON, **PROOFS[kind(unit)])
    if set(doc) != set(fields):
        odd = sorted(set(doc) ^ set(fields))
        raise receipts.Malformed(f"field {odd[0]} is {'unknown' if odd[0] in doc else 'missing'} (unit {unit})")
    for key, want in fields.items():
        value = doc[key]
        ok = (receipts.is_hex64(value) if want == HEX else hashchain.is_int(value) if want is int
              else isinstance(value, want))
        if not ok:
            raise receipts.Malformed(f"field {key} must be {'64 hex digits' if want == HEX else want.__name__}")
    if doc["step"] < 1 or doc["verdict"] not in ("MATCH", "MISMATCH"):
        raise receipts.Malformed("step must be >= 1, verdict MATCH or MISMATCH")
    if receipts.auditor_problem(doc["auditor"]):
        raise receipts.Malformed(f"field auditor: {receipts.auditor_problem(doc['auditor'])}")
    if not all(isinstance(f, str) for f in doc["findings"]):
        raise receipts.Malformed("findings must be a list of strings")
    if "witnesses" in doc and not all(receipts.is_hex64(w) for w in doc["witnesses"]):
        raise receipts.Malformed("field witnesses must be a list of 64 hex digits")
    return doc


def has_units(chain):
    return config.from_record(chain.records[0].get("config", {}), "genesis config").unit_commits


def judge(receipt, chain, salt_of, unit_list, fold_keyed):
    """(status, reason) of a well-formed receipt against the verified chain. salt_of(step): the
    step's salt or None; unit_list(step): the step's unit list checked against its units_root
    ({unit: entry}) or None; fold_keyed(step, unit, auditor): the keyed digest of that node as
    whoever holds its children makes it, or None."""
    with_units = has_units(chain)
    if receipt["format"] != FORMAT:
        if with_units:
            return "rejected", ("a repops-receipt-v2 proves no micro-batch witness, and this run commits to "
                                f"its units: its receipts are {FORMAT}")
        return receipts.judge(receipt, chain, salt_of)
    if not with_units:
        return "rejected", f"this run has no unit commitments: its receipts are {receipts.RECEIPT_FORMAT}"
    step, genesis, unit = receipt["step"], chain.records[0], receipt["unit"]
    if receipt["run"] != receipts.run_id(genesis):
        return "rejected", f"a receipt for another run ({receipt['run'][:12]})"
    if step >= len(chain):
        return "rejected", f"step {step} is not in the chain"
    record, n = chain.records[step], micro_batches_at(config.from_record(genesis["config"], "genesis"), step)
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
        reasons.append("the auditor reports " + receipts.shown((receipt["findings"] or ["MISMATCH"])[0])[:200])
    if reasons:                              # decided without a salt, a unit list or a reveal
        return "rejected", "; ".join(reasons)
    if kind(unit) == "fold":
        keyed = fold_keyed(step, unit, receipt["auditor"])
        if keyed is None:
            return "unchecked", f"the children of {unit} of step {step} are not at hand (--revealed DIR)"
        if keyed != receipt["keyed"]:
            return "rejected", "its keyed digest is not the node's (the sum was not formed from its children?)"
        return "accepted", ""
    salt = salt_of(step)
    if salt is None:
        return "unchecked", f"no salt revealed for step {step}"
    if kind(unit) in ("update", "step"):
        if receipts.commit(salt, receipt["grad_root"], receipt["result_root"]) != record.get("step_commit"):
            reasons.append("its grad_root and result_root do not open the step's commitment (echoed, "
                           "or another gradient or post-step state: a replay that skipped the update?)")
        if receipt["state_hash"] != record.get("state_hash"):
            reasons.append("its state hash differs from the chain's")
    if kind(unit) in ("micro_batch", "step"):
        entries = unit_list(step)
        if entries is None:
            return "unchecked", f"no unit list of step {step} checks against its units_root"
        micro = [int(unit.partition(":")[2])] if kind(unit) == "micro_batch" else range(n)
        witnesses = [receipt["witness"]] if kind(unit) == "micro_batch" else receipt["witnesses"]
        if len(witnesses) != len(micro) or not all(
                units.witness_commit(units.unit_salt(salt, m), bytes.fromhex(w)).hex()
                == entries[f"micro_batch:{m}"]["commit"] for m, w in zip(micro, witnesses)):
            reasons.append("its witness does not open the micro-batch's commitment c_m (copied, or the "
                           "micro-batch's replay was skipped)" if kind(unit) == "micro_batch" else
                           "its witnesses do not open the micro-batches' commitments (the micro-batches "
                           "were not all replayed)")
    return ("rejected", "; ".join(reasons)) if reasons else ("accepted", "")


def check(directory, chain, salt_of, unit_list, fold_keyed):
    """[receipts.Result] for every receipt file under `directory` against the verified chain."""
    results = []
    for path in receipts.receipt_files(directory):
        try:
            receipt = read(path)
        except receipts.Malformed as e:
            results.append(receipts.Result(path, "malformed", str(e)))
            continue
        results.append(receipts.Result(path, *judge(receipt, chain, salt_of, unit_list, fold_keyed), receipt))
    return results


def step_units(chain, step):
    """The units an audit of `step` covers: every unit of units.all_units with unit commitments,
    else the step itself."""
    genesis = config.from_record(chain.records[0]["config"], "genesis")
    return units.all_units(micro_batches_at(genesis, step)) if genesis.unit_commits else ["step"]


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


# ----------------------------------------------------------------------------- plans by unit
def unit_costs(chain, first, last, seconds):
    """{(step, unit): estimated seconds} of every unit of steps first..last; seconds(kind) is a
    unit's cost by kind (micro_batch, fold, update)."""
    return {(s, u): seconds(kind(u)) for s in range(first, last + 1) for u in step_units(chain, s)}


def describe(items):
    """Compact text of sorted (step, unit) items: "12: micro_batch 0-2, fold 0:2 0:4, update; 13: ..."."""
    by_step = {}
    for step, unit in items:
        by_step.setdefault(step, []).append(unit)
    parts = []
    for step, names in sorted(by_step.items()):
        micro = sorted(int(u.partition(":")[2]) for u in names if u.startswith("micro_batch:"))
        folds = sorted((tuple(map(int, u.split(":")[1:])) for u in names if u.startswith("fold:")))
        text = ([f"micro_batch {receipts.ranges(micro)}"] if micro else []) + \
               ([("fold " + " ".join(f"{lo}:{size}" for lo, size in folds))] if folds else []) + \
               [u for u in names if u in ("update", "step")]
        parts.append(f"{step}: {', '.join(text)}")
    return "; ".join(parts) or "none"
