"""Receipts, the coverage plan and anchors (receipts.py, signing.py and audit.py's protocol options).

- step_commit is what receipts.py says it is: recomputed here with hmac and hashlib from the
  secret file, the replayed step's clipped gradient bytes and its post-step state's bytes (its
  keyed root, sealed with the step's salt), it equals the published one; secret_commit too.
- Signed receipts (ssh-keygen -Y sign): a roster names the keys that count; a receipt by a key
  not in it, an unsigned one and one altered after signing are shown apart and never counted;
  --coverage needs a roster; a key that does not exist, is encrypted without an agent or is no
  key is one line and exit 2 before any replay, and the receipt's folder is made before it.
- A signed publisher: the genesis record names its key, every anchor is signed by it and
  verifies; a forged anchor, one re-signed by another key and an unsigned one are each reported
  at their step; a resume without the key, or with another, is refused; export's model card
  names the key.
- The secret: 32 bytes, mode 0600, kept by a resume; a resume under another secret is refused
  by the genesis record's secret_commit; a chain without its secret is not resumed.
- A receipt from a real replay on another thread count (and on CUDA, where there is one) is
  accepted; an echo receipt built from the public chain alone is rejected; revealed salts let
  anyone check the receipts of their steps on a copy of the run without the secret.
- The plan: every step to C distinct auditors, balanced in replay cost, a function of the seed;
  the command prints hours per auditor and f^C; with a roster, its auditors by name.
- A crowd: 8 auditors on a 40-step run whose step 17 was trained on injected tokens (its
  published batch digest still names the true ones), two of the auditors echoing: the injected
  step is found, its receipts and the echoes are rejected, and coverage counts what is left.
- Anchors: written every anchor_every steps; a history rewritten or cut after anchoring is
  reported at the first anchor it contradicts.
"""
import hashlib
import hmac
import json
import os
import re
import stat

import pytest
import torch

import audit
import data
import hashchain
import receipts
import repops
import rundir
import signing
import train
from tiny import (CKPT_EVERY, assert_one_line_error, audit as audit_cli, chain_records, copy_run, make_key,
                  mismatch_lines, reseal, script, train as train_run, train_args, write_chain, write_roster)

STEPS = 40
ANCHOR_EVERY = 10
RUN_FLAGS = (f"--max_steps={STEPS}", f"--anchor_every={ANCHOR_EVERY}")
INJECTED = 17                      # the crowd's tampered step


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """In-process training and audits on one thread: a tiny model's kernels gain nothing from
    more, and on a busy machine OpenMP's waiting makes them many times slower."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def run40(corpus, tmp_path_factory):
    """A 40-step tiny run on 2 threads, checkpoints every 10 steps, anchors every 10."""
    return train_run(tmp_path_factory.mktemp("run40") / "run", corpus, *RUN_FLAGS, "--threads=2")


def secret_of(run):
    return (run / "secret").read_bytes()


def publisher_check(run):
    """salt_of for receipts.check_receipts with the run's secret (what --check_receipts does)."""
    secret = receipts.read_secret(run, "")
    return lambda step: receipts.salt(secret, step)


def echo_receipt(run, step, key):
    """What an auditor who replays nothing can write, signed with `key`: every field from the
    public chain, and as its proof the one of the closest public value, the step's state hash."""
    records = chain_records(run)
    genesis, record = records[0], records[step]
    signer = signing.Signer(key)
    proof = receipts.result_proof(genesis["record_hash"], step, False, signer.blob, record["state_hash"])
    return receipts.sign_receipt(receipts.make_receipt(genesis, record, "step", {"result": proof}, signer.public_key,
                                                       {}, {}, genesis["code_digest"], genesis["data_manifest"], []),
                                 signer)


def signed(audit_, step, key):
    """audit_'s receipt of replayed `step`, signed with `key` (None: the replay stopped before it)."""
    signer = signing.Signer(key)
    receipt = audit_.receipt(step, signer.public_key, {})
    return receipt and receipts.sign_receipt(receipt, signer)


# ----------------------------------------------------------------------------- 1. commitments
def keyed_root(key, state):
    """The Merkle root of SHA-256("repops-keyed-tensor-v1\0" key name\0 dtype\0 shape\0 bytes)
    over the state's tensors in name order (merkle_root's tree: the documented one)."""
    leaves = []
    for name, t in sorted(state.tensors().items()):
        arr = t.numpy()
        dtype = {"float32": "<f4", "int64": "<i8"}[str(arr.dtype)]
        shape = "[" + ",".join(map(str, arr.shape)) + "]"
        leaves.append(hashlib.sha256(b"repops-keyed-tensor-v1\0" + key + f"{name}\0{arr.dtype}\0{shape}\0".encode()
                                     + arr.astype(dtype).tobytes()).hexdigest())
    return hashchain.merkle_root(leaves)


def test_step_commit_opens_with_the_documented_bytes(run40, monkeypatch):
    """result_root XOR HMAC-SHA256(salt, "repops-seal-v1"), salt = HMAC-SHA256(secret, step as 8
    bytes big-endian), result_root the post-step state's keyed root under grad_root, the tensor
    leaf of the clipped flat gradient; secret_commit = HMAC-SHA256(secret, "repops-secret-commit-v1"):
    computed here without receipts.py."""
    step = CKPT_EVERY + 1
    opened = rundir.Run(run40)
    cfg = opened.cfg
    tokens = data.TokenData(opened.recorded_data_dir(), cfg.seed)
    state = train.TrainState(cfg, tokens.vocab_size)
    state.load(opened.verified_checkpoint(step - 1, rundir.checkpoint_path(run40 / "checkpoints", step - 1)))
    clipped, clip = [], repops.clip_grad
    monkeypatch.setattr(repops, "clip_grad", lambda g, m: clipped.append(clip(g, m)) or clipped[-1])
    fields = train.train_step(state, tokens, cfg)
    grad = clipped[0][0]
    leaf = hashlib.sha256(b"repops-tensor-v1\0grad\0float32\0" + f"[{grad.numel()}]".encode() + b"\0"
                          + grad.numpy().astype("<f4").tobytes()).hexdigest()
    salt = hmac.new(secret_of(run40), step.to_bytes(8, "big"), hashlib.sha256).digest()
    assert fields["grad_root"].result() == leaf
    result = keyed_root(bytes.fromhex(leaf), state)
    assert result == hashchain.keyed_state_root(leaf, state.tensors())
    records = chain_records(run40)
    pad = hmac.new(salt, b"repops-seal-v1", hashlib.sha256).digest()
    assert records[step]["step_commit"] == bytes(a ^ b for a, b in zip(bytes.fromhex(result), pad)).hex()
    assert records[0]["secret_commit"] == hmac.new(secret_of(run40), b"repops-secret-commit-v1", hashlib.sha256).hexdigest()
    assert "grad_root" not in (run40 / "chain.jsonl").read_text()       # never published


def test_secret_is_private_kept_and_required(run40, corpus, tmp_path):
    run = copy_run(run40, tmp_path / "run")
    assert len(secret_of(run)) == 32 and stat.S_IMODE(os.stat(run40 / "secret").st_mode) == 0o600
    chain = (run / "chain.jsonl").read_bytes()
    final = rundir.checkpoint_path(run / "checkpoints", STEPS)

    final.unlink()                                   # resume from step 30: re-derives 31..40
    train_run(run, corpus, *RUN_FLAGS)
    assert (run / "chain.jsonl").read_bytes() == chain and secret_of(run) == secret_of(run40)

    final.unlink()
    (run / "secret").write_bytes(bytes(32))          # another secret: refused by the genesis record
    proc = script("train.py", *train_args(run, corpus, *RUN_FLAGS))
    assert_one_line_error(proc, "train.py")
    assert "is not the secret the run's genesis record commits to" in proc.stderr and \
        (run / "chain.jsonl").read_bytes() == chain

    (run / "secret").unlink()                        # no secret: refused before any step
    proc = script("train.py", *train_args(run, corpus, *RUN_FLAGS))
    assert_one_line_error(proc, "train.py")
    assert "secret is missing" in proc.stderr and (run / "chain.jsonl").read_bytes() == chain


# ----------------------------------------------------------------------------- receipts
def test_real_replay_on_another_thread_count_is_accepted_and_an_echo_is_rejected(run40, keys, tmp_path):
    out = tmp_path / "receipts"
    step = 23
    proc = script("audit.py", "--run_dir", run40, "--step", step, "--receipt", out / "carol" / "s23.json",
                  "--key", keys["carol"], env={**os.environ, "OMP_NUM_THREADS": "1"})   # trained on 2; folder made
    fingerprint = signing.fingerprint(signing.Signer(keys["carol"]).public_key)
    assert proc.returncode == 0 and f"receipt: step 23 (MATCH) signed by {fingerprint}" in proc.stdout, \
        proc.stdout + proc.stderr
    roster = write_roster(tmp_path / "roster", keys, ["carol", "mallory"])
    proc = audit_cli(run40, "--check_receipts", out, "--roster", roster)
    assert proc.returncode == 0 and proc.stdout.startswith(f"accepted  {out / 'carol' / 's23.json'}: step 23 by carol")

    (out / "mallory").mkdir()
    receipts.write_receipt(out / "mallory" / "s23.json", echo_receipt(run40, step, keys["mallory"]))
    proc = audit_cli(run40, "--check_receipts", out, "--roster", roster)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"rejected  {out / 'mallory' / 's23.json'}: step 23 by mallory: its result proof is not the step's" in proc.stdout
    assert "1 accepted, 1 rejected, 0 malformed" in proc.stdout


def test_a_rejected_findings_hashes_are_shown_whole(run40, keys, tmp_path):
    """A MISMATCH receipt's finding, as --check_receipts prints it: a long one is cut at a space
    before a word, never inside a hash (a checkpoint's finding names a path and two hashes)."""
    genesis, record = chain_records(run40)[0], chain_records(run40)[23]
    signer = signing.Signer(keys["carol"])
    found, expected = hashlib.sha256(b"found").hexdigest(), hashlib.sha256(b"expected").hexdigest()
    finding = (f"MISMATCH at step 20: checkpoint {run40}/checkpoints/step_00000020.safetensors does not match "
               f"the chain: tensor 'params.tok_emb' differs: hash {found}, expected {expected}" + " and more" * 40)
    proof = receipts.result_proof(genesis["record_hash"], 23, False, signer.blob, record["state_hash"])
    receipt = receipts.make_receipt(genesis, record, "step", {"result": proof}, signer.public_key, {}, {},
                                    genesis["code_digest"], genesis["data_manifest"], [finding])
    (tmp_path / "r").mkdir()
    receipts.write_receipt(tmp_path / "r" / "s23.json", receipts.sign_receipt(receipt, signer))
    proc = audit_cli(run40, "--check_receipts", tmp_path / "r")
    line = proc.stdout.splitlines()[0]
    assert proc.returncode == 1 and line.startswith("rejected") and "the auditor reports MISMATCH at step 20" in line, line
    assert found in line and expected in line and re.search(r"(and|more) \.\.\.; its result proof", line), line
    assert all(len(h) == 64 for h in re.findall(r"[0-9a-f]{16,}", line)), line


@pytest.mark.skipif(not torch.cuda.is_available(), reason="hardware: needs a CUDA GPU")
def test_real_replay_on_cuda_is_accepted(run40, keys, tmp_path):
    proc = audit_cli(run40, "--step", "12", "--device", "cuda", "--receipt", tmp_path / "r" / "s12.json",
                     "--key", keys["erin"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = audit_cli(run40, "--check_receipts", tmp_path / "r")
    assert proc.returncode == 0 and "accepted" in proc.stdout, proc.stdout


def test_revealed_salts_let_anyone_check(run40, keys, tmp_path):
    a = audit.Audit(str(run40))
    a.replay(25, 25)
    (tmp_path / "r").mkdir()
    receipts.write_receipt(tmp_path / "r" / "honest.json", signed(a, 25, keys["dave"]))
    receipts.write_receipt(tmp_path / "r" / "echo.json", echo_receipt(run40, 26, keys["erin"]))
    receipts.write_receipt(tmp_path / "r" / "later.json", echo_receipt(run40, 35, keys["erin"]))
    proc = audit_cli(run40, "--reveal_salts", "21:30", "--out", tmp_path / "salts.json")
    assert proc.returncode == 0, proc.stderr
    public = copy_run(run40, tmp_path / "public")
    (public / "secret").unlink()                     # what everyone else has
    proc = audit_cli(public, "--check_receipts", tmp_path / "r", "--salts", tmp_path / "salts.json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    status = {line.split()[1].rstrip(":"): line.split()[0] for line in proc.stdout.splitlines()[:-1]}
    assert status == {str(tmp_path / "r" / "honest.json"): "accepted", str(tmp_path / "r" / "echo.json"): "rejected",
                      str(tmp_path / "r" / "later.json"): "unchecked"}, proc.stdout
    assert_one_line_error(audit_cli(public, "--check_receipts", tmp_path / "r"), "audit.py")   # no secret


# ----------------------------------------------------------------------------- 2. plan, coverage
def test_plan_covers_every_step_c_times_balanced_and_keyed_by_the_seed():
    costs = receipts.replay_costs(1, STEPS, range(0, STEPS + 1, CKPT_EVERY))
    assert costs[1] == 1 and costs[10] == 10 and costs[11] == 1 and costs[40] == 10
    for auditors, c in ((8, 2), (3, 3), (5, 1)):
        plan = receipts.plan(costs, auditors, c, seed=11)
        assert plan == receipts.plan(costs, auditors, c, seed=11)
        for step in costs:
            assert sum(step in steps for steps in plan) == c            # c distinct auditors
        loads = [sum(costs[s] for s in steps) for steps in plan]
        assert max(loads) - min(loads) <= max(costs.values()), loads
    assert receipts.plan(costs, 8, 2, seed=12) != receipts.plan(costs, 8, 2, seed=11)
    with pytest.raises(receipts.UsageError, match="at least 3 distinct auditors"):
        receipts.plan(costs, 2, 3, seed=1)


def test_plan_command_prints_hours_and_the_chance_of_missing_a_step(run40):
    proc = audit_cli(run40, "--plan", "--auditors", "4", "--redundancy", "2", "--seed", "5", "--absent", "0.5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"plan: steps 1..{STEPS} of {run40} for 4 auditors, each step replayed by 2 of them, seed 5"
    assert lines[1].startswith("replay cost: a probe step (") and " s here; a step of this run (" in lines[1]
    rows = [line.split() for line in lines[3:7]]
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4] and all(float(r[3]) > 0 for r in rows)
    assigned = []
    for r in rows:
        for part in r[4].split(","):
            a, _, b = part.partition("-")
            assigned += range(int(a), int(b or a) + 1)
    assert sorted(assigned) == sorted(list(range(1, STEPS + 1)) * 2)
    assert lines[-1].endswith("f = 0.5 independently, f^2 = 0.25")


# ----------------------------------------------------------------------------- the crowd
@pytest.fixture(scope="module")
def injected_run(corpus, tmp_path_factory):
    """The run40 config trained in-process with other tokens fed to step INJECTED than its
    published batch digest names (the windows stay the true ones): injected data."""
    run = tmp_path_factory.mktemp("injected") / "run"
    cfg = train.parse_config(train_args(run, corpus, *RUN_FLAGS))
    true_batch = data.TokenData.micro_batch

    def injected(self, split, step, *args):
        x, y = true_batch(self, split, step, *args)
        return (x.flip(-1).contiguous(), y.flip(-1).contiguous()) if (split, step) == ("train", INJECTED) else (x, y)

    mp = pytest.MonkeyPatch()
    mp.setattr(data.TokenData, "micro_batch", injected)
    try:
        train.run(cfg, 0, 1)
    finally:
        mp.undo()
    return run


def test_injection_changes_the_state_and_the_secret_does_not(injected_run, run40):
    mine, honest = chain_records(injected_run), chain_records(run40)
    assert [r["state_hash"] for r in mine[:INJECTED]] == [r["state_hash"] for r in honest[:INJECTED]]
    assert all(a["step_commit"] != b["step_commit"] for a, b in zip(mine[1:INJECTED], honest[1:INJECTED]))
    assert mine[INJECTED]["state_hash"] != honest[INJECTED]["state_hash"]
    assert mine[INJECTED]["batch_digest"] == honest[INJECTED]["batch_digest"]


def test_crowd_finds_the_injected_step_and_rejects_the_echoes(injected_run, tmp_path):
    auditors, redundancy, echoing = 8, 2, ("auditor1", "auditor2")
    costs = receipts.replay_costs(1, STEPS, [s for s, _ in rundir.Run(injected_run).checkpoints()])
    plan = receipts.plan(costs, auditors, redundancy, seed=2026)
    names = [f"auditor{k}" for k in range(1, auditors + 1)]
    keys = {name: make_key(tmp_path, name) for name in names}
    roster = write_roster(tmp_path / "roster", keys, names)
    assert any(INJECTED in steps for name, steps in zip(names, plan) if name not in echoing)
    found, written = {}, {}
    for name, steps in zip(names, plan):
        (tmp_path / "receipts" / name).mkdir(parents=True)
        for step in steps:
            if name in echoing:
                receipt = echo_receipt(injected_run, step, keys[name])
            else:
                a = audit.Audit(str(injected_run))
                a.replay(step, step)
                found[step] = sorted({s for s, _ in a.findings})
                receipt = signed(a, step, keys[name])
            if receipt is not None:
                receipts.write_receipt(tmp_path / "receipts" / name / f"step_{step}.json", receipt)
                written[f"{name}/step_{step}.json"] = (name, step)
    # Every honest audit that replays the injected step reports it, and only those report anything.
    passing = range(INJECTED, (INJECTED // CKPT_EVERY + 1) * CKPT_EVERY + 1)
    assert found and all(f == ([INJECTED] if s in passing else []) for s, f in found.items()), found

    proc = audit_cli(injected_run, "--check_receipts", tmp_path / "receipts", "--roster", roster)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    status = {os.path.relpath(line.split()[1].rstrip(":"), tmp_path / "receipts"): line
              for line in proc.stdout.splitlines()[:-1]}
    assert sorted(status) == sorted(written)
    for path, (name, step) in written.items():
        line = status[path]
        if name in echoing or step == INJECTED:
            assert line.startswith("rejected") and "its result proof is not the step's result" in line, line
        else:
            assert line.startswith("accepted"), line
    assert any(step == INJECTED and f"reports MISMATCH at step {INJECTED}" in status[p] for p, (_, step) in written.items())

    proc = audit_cli(injected_run, "--coverage", tmp_path / "receipts", "--roster", roster)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    honest = [set(steps) for name, steps in zip(names, plan) if name not in echoing]
    count = {s: sum(s in h for h in honest) * (s not in passing) for s in range(1, STEPS + 1)}
    for need in (1, redundancy):
        steps = [s for s, n in count.items() if n >= need]
        assert (f"steps 1..{STEPS} with >= {need} accepted receipt{'s' * (need > 1)} from distinct roster keys: "
                f"{len(steps)}/{STEPS} ({100 * len(steps) / STEPS:.1f}%): {receipts.ranges(steps)}") in proc.stdout


# ----------------------------------------------------------------------------- 3. anchors
def test_anchors_every_anchor_every_steps_and_a_rewritten_history(run40, tmp_path):
    anchors = [json.loads(line) for line in (run40 / "anchors.jsonl").read_text().splitlines()]
    records = chain_records(run40)
    assert [(a["step"], a["record_hash"]) for a in anchors] == [
        (s, records[s]["record_hash"]) for s in range(ANCHOR_EVERY, STEPS + 1, ANCHOR_EVERY)]
    published = tmp_path / "anchors.jsonl"           # the copy published outside the run
    published.write_bytes((run40 / "anchors.jsonl").read_bytes())
    proc = audit_cli(run40, "--anchors", published)
    assert proc.returncode == 0 and proc.stdout.startswith("ANCHORED: the chain agrees with all 4 anchors")

    rewritten = copy_run(run40, tmp_path / "rewritten")
    forged = json.loads(json.dumps(records))
    forged[25]["loss"] += 1.0                        # an edit after step 20's anchor, re-sealed
    write_chain(rewritten, reseal(forged))
    proc = audit_cli(rewritten, "--anchors", published)
    lines = mismatch_lines(proc)
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("MISMATCH at step 30:"), proc.stdout
    assert "history rewritten after anchoring" in lines[0]

    write_chain(rewritten, records[:36])             # steps 36..40 removed
    proc = audit_cli(rewritten, "--anchors", published)
    assert proc.returncode == 1 and "MISMATCH at step 40:" in proc.stdout and "chain ends at step 35" in proc.stdout


# ----------------------------------------------------------------------------- 4. keys
def test_coverage_counts_roster_keys_and_shows_the_rest_apart(run40, keys, tmp_path):
    """Alice (in the roster) and Bob (not) replay step 25: one key counts. A copy of Alice's
    receipt without its signature, and one whose cost was edited after signing, are unsigned;
    --coverage lists them, a malformed file and Bob's key apart, counts none of them, and needs
    a roster."""
    a = audit.Audit(str(run40))
    a.replay(25, 25)
    r = tmp_path / "r"
    r.mkdir()
    alice = signed(a, 25, keys["alice"])
    receipts.write_receipt(r / "alice.json", alice)
    receipts.write_receipt(r / "bob.json", signed(a, 25, keys["bob"]))
    receipts.write_receipt(r / "stripped.json", {k: v for k, v in alice.items() if k != "signature"})
    receipts.write_receipt(r / "edited.json", {**alice, "cost": {"seconds": 1}})
    roster = write_roster(tmp_path / "roster", keys, ["alice", "carol"])
    proc = audit_cli(run40, "--check_receipts", r, "--roster", roster)
    status = {os.path.basename(line.split()[1].rstrip(":")): line for line in proc.stdout.splitlines()[:-1]}
    bob = signing.fingerprint(signing.Signer(keys["bob"]).public_key)
    assert status["alice.json"].startswith("accepted") and status["alice.json"].endswith("step 25 by alice")
    assert status["bob.json"].startswith("accepted") and f"by key {bob} (not in the roster)" in status["bob.json"]
    assert status["stripped.json"].startswith("unsigned") and "it has no signature" in status["stripped.json"]
    assert status["edited.json"].startswith("unsigned") and "does not verify" in status["edited.json"]
    assert proc.returncode == 1 and "2 accepted, 0 rejected, 2 unsigned, 0 malformed (1 accepted by keys not in the " \
        "roster)" in proc.stdout, proc.stdout
    (r / "junk.json").write_text("{")                # a submitter's junk file does not stop the count
    proc = audit_cli(run40, "--coverage", r, "--roster", roster, "--steps", "21:30", "--redundancy", 1)
    assert proc.returncode == 1 and proc.stderr == "", proc.stdout + proc.stderr       # 9 of 10 steps uncovered
    assert "not counted, malformed (not a repops-receipt-v4 receipt): 1 receipt(s): " in proc.stdout, proc.stdout
    assert "steps 21..30 with >= 1 accepted receipt from distinct roster keys: 1/10 (10.0%): 25" in proc.stdout, proc.stdout
    assert f"not counted, key {bob} is not in the roster: 1 accepted receipt(s), steps 25" in proc.stdout
    assert "not counted, unsigned (no valid signature): 2 receipt(s)" in proc.stdout
    assert_one_line_error(audit_cli(run40, "--coverage", r), "audit.py")              # no roster: nothing to count


def public_only(key):
    """key's public key file alone (its private key removed): only an agent could sign with it."""
    key.unlink()
    return key.with_suffix(".pub")


@pytest.mark.parametrize("case", ["missing", "encrypted", "not_a_key", "public_only"])
def test_a_key_that_cannot_sign_is_refused_before_the_replay(run40, tmp_path, case):
    """--key that does not exist, is encrypted with no agent, is not a key, or is a public key no
    agent holds: one line, exit 2, before any replay (no MATCH line) and before any output folder."""
    key = {"missing": lambda: tmp_path / "nope",
           "encrypted": lambda: make_key(tmp_path, "enc", passphrase="secret words"),
           "not_a_key": lambda: (tmp_path / "junk").write_text("not a key\n") and tmp_path / "junk",
           "public_only": lambda: public_only(make_key(tmp_path, "pub"))}[case]()
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}       # no agent
    proc = script("audit.py", "--run_dir", run40, "--step", 3, "--receipt", tmp_path / "out" / "r.json",
                  "--key", key, env=env)
    assert_one_line_error(proc, "audit.py")
    assert "--key" in proc.stderr and proc.stdout == "" and not (tmp_path / "out").exists(), proc.stderr
    if case == "encrypted":
        assert "encrypted and no ssh-agent holds it" in proc.stderr


def test_a_plan_assigns_steps_to_roster_keys(run40, keys, tmp_path):
    roster = write_roster(tmp_path / "roster", keys, ["alice", "bob", "carol"])
    proc = audit_cli(run40, "--plan", "--roster", roster, "--redundancy", "2", "--seed", "5", "--steps", "31:40")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("auditors (the roster's keys): alice SHA256:") and ", bob SHA256:" in lines[0]
    assert [line.split()[0] for line in lines[4:7]] == ["alice", "bob", "carol"], lines
    assert_one_line_error(audit_cli(run40, "--plan", "--roster", roster, "--auditors", "3"), "audit.py")


# ----------------------------------------------------------------------------- 5. a signed publisher
@pytest.fixture(scope="module")
def signed_run(corpus, keys, tmp_path_factory):
    """A 12-step tiny run whose genesis names the publisher's key: anchors at 4, 8, 12, signed."""
    run = tmp_path_factory.mktemp("signed") / "run"
    code = train.main([str(a) for a in train_args(run, corpus, "--max_steps=12", "--anchor_every=4",
                                                  f"--publisher_key={keys['publisher']}")])
    assert code == 0
    return run


def test_signed_anchors_verify_and_forged_or_resigned_ones_are_reported(signed_run, keys, tmp_path):
    genesis = chain_records(signed_run)[0]
    publisher = signing.Signer(keys["publisher"])
    assert genesis["publisher"] == publisher.public_key
    lines = (signed_run / "anchors.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [4, 8, 12]
    published = tmp_path / "anchors.jsonl"
    published.write_text("\n".join(lines) + "\n")
    proc = audit_cli(signed_run, "--anchors", published)
    assert proc.returncode == 0 and f"each signed by the publisher key the genesis names, " \
        f"{signing.fingerprint(publisher.public_key)}" in proc.stdout, proc.stdout + proc.stderr
    other_hash = chain_records(signed_run)[3]["record_hash"]
    mallory = signing.Signer(keys["mallory"])

    def resigned(anchor, signer):
        body = {k: v for k, v in anchor.items() if k != "signature"}
        return {**body, "signature": signer.sign(receipts.anchor_signed_bytes(body), signing.ANCHOR)}

    second = json.loads(lines[1])
    for name, forged in (("forged", {**second, "record_hash": other_hash}),                  # signature kept
                         ("resigned", resigned({**second, "record_hash": other_hash}, mallory)),
                         ("unsigned", {k: second[k] for k in ("record_hash", "step", "utc")}),
                         # its armor broken by a line separator Python splits on and ssh-keygen does not
                         ("non-ASCII", {**second, "signature": second["signature"].replace("\n", "\u2028", 1)})):
        published.write_text("\n".join([lines[0], json.dumps(forged), lines[2]]) + "\n")
        found = mismatch_lines(audit_cli(signed_run, "--anchors", published))
        assert len(found) == 1 and found[0].startswith("MISMATCH at step 8:"), (name, found)
        assert ("unsigned" if name == "unsigned" else "not signed by the publisher key") in found[0], (name, found)


def test_a_publisher_key_that_cannot_sign_creates_no_run(corpus, tmp_path, capsys):
    """train.py --publisher_key that does not exist or is encrypted with no agent: one line, exit
    2, and no run directory (the key signs a probe before anything is created)."""
    encrypted = make_key(tmp_path, "enc", passphrase="secret words")
    for key in (tmp_path / "nope", encrypted):
        run = tmp_path / f"run_{key.name}"
        assert train.main([str(a) for a in train_args(run, corpus, "--max_steps=2", f"--publisher_key={key}")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("train.py: error: --publisher_key") and not run.exists(), err


def test_a_signed_run_resumes_only_with_its_key_and_its_card_names_it(signed_run, corpus, keys, tmp_path):
    """A resume without the genesis's publisher key (none given, and config.json, whose bookkeeping
    a resume reads, names none) or with another key is refused, one line; `train.py --run_dir=RUN`
    alone resumes with the key config.json names and signs the anchors again with it."""
    run = copy_run(signed_run, tmp_path / "run")
    write_chain(run, chain_records(run)[:11])
    for step, path in rundir.Run(run).checkpoints():
        if step > 8:
            path.unlink()
    recorded = (run / "config.json").read_text()
    (run / "config.json").write_text(json.dumps({**json.loads(recorded), "publisher_key": ""}))
    for key in (None, keys["mallory"]):
        proc = script("train.py", *train_args(run, corpus, "--max_steps=12", "--anchor_every=4",
                                              *([f"--publisher_key={key}"] if key else [])))
        assert_one_line_error(proc, "train.py")
        assert "names the publisher key" in proc.stderr and "--publisher_key" in proc.stderr, proc.stderr
    (run / "config.json").write_text(recorded)
    anchors = (run / "anchors.jsonl").read_text().splitlines()
    (run / "anchors.jsonl").write_text("\n".join(anchors[:2]) + "\n")          # steps 4 and 8
    proc = script("train.py", f"--run_dir={run}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [json.loads(line)["step"] for line in (run / "anchors.jsonl").read_text().splitlines()] == [4, 8, 12]
    proc = audit_cli(run, "--anchors", run / "anchors.jsonl")
    assert proc.returncode == 0 and "each signed by the publisher key the genesis names" in proc.stdout, proc.stdout
    out = tmp_path / "hf"
    proc = script("export.py", "--run_dir", signed_run, "--step", 12, "--to", "hf", "--out", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    card = (out / "README.md").read_text()
    assert signing.fingerprint(signing.Signer(keys["publisher"]).public_key) in card and "publisher key" in card
