"""Receipts, the coverage plan and anchors (receipts.py and audit.py's protocol options).

- step_commit is what receipts.py says it is: recomputed here with hmac and hashlib from the
  secret file, the replayed step's clipped gradient bytes and its post-step state's bytes, it
  equals the published one; the genesis record's secret_commit too.
- The secret: 32 bytes, mode 0600, kept by a resume; a resume under another secret is refused
  by the genesis record's secret_commit; a chain without its secret is not resumed.
- A receipt from a real replay on another thread count (and on CUDA, where there is one) is
  accepted; an echo receipt built from the public chain alone is rejected; revealed salts let
  anyone check the receipts of their steps on a copy of the run without the secret.
- The plan: every step to C distinct auditors, balanced in replay cost, a function of the seed;
  the command prints hours per auditor and f^C.
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
import stat

import pytest
import torch

import audit
import data
import hashchain
import receipts
import repops
import rundir
import train
from tiny import (CKPT_EVERY, assert_one_line_error, audit as audit_cli, chain_records, copy_run,
                  mismatch_lines, reseal, script, train as train_run, train_args, write_chain)

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


def echo_receipt(run, step, auditor):
    """What an auditor who replays nothing can write: every field from the public chain, and for
    grad_root and result_root the closest public values, the step's commitment and state hash."""
    records = chain_records(run)
    genesis, record = records[0], records[step]
    return {"format": receipts.RECEIPT_FORMAT, "run": genesis["record_hash"], "step": step,
            "record_hash": record["record_hash"], "state_hash": record["state_hash"],
            "grad_root": record["step_commit"], "result_root": record["state_hash"], "auditor": auditor,
            "machine": {}, "cost": {}, "code_digest": genesis["code_digest"],
            "data_manifest": genesis["data_manifest"], "verdict": "MATCH", "findings": []}


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
    """SHA-256(HMAC-SHA256(secret, step as 8 bytes big-endian) || grad_root || result_root),
    grad_root the tensor leaf of the clipped flat gradient, result_root the post-step state's
    keyed root under grad_root; secret_commit = HMAC-SHA256(secret, "repops-secret-commit-v1"):
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
    assert records[step]["step_commit"] == hashlib.sha256(salt + bytes.fromhex(leaf) + bytes.fromhex(result)).hexdigest()
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
def test_real_replay_on_another_thread_count_is_accepted_and_an_echo_is_rejected(run40, tmp_path):
    out = tmp_path / "receipts"
    (out / "carol").mkdir(parents=True)
    step = 23
    proc = script("audit.py", "--run_dir", run40, "--step", step, "--receipt", out / "carol" / "s23.json",
                  "--auditor", "carol", env={**os.environ, "OMP_NUM_THREADS": "1"})   # trained on 2
    assert proc.returncode == 0 and "receipt: step 23 (MATCH) by carol" in proc.stdout, proc.stdout + proc.stderr
    proc = audit_cli(run40, "--check_receipts", out)
    assert proc.returncode == 0 and proc.stdout.startswith(f"accepted  {out / 'carol' / 's23.json'}: step 23 by carol")

    (out / "mallory").mkdir()
    receipts.write_receipt(out / "mallory" / "s23.json", echo_receipt(run40, step, "mallory"))
    proc = audit_cli(run40, "--check_receipts", out)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"rejected  {out / 'mallory' / 's23.json'}: step 23 by mallory: its grad_root and result_root do not open" in proc.stdout
    assert "1 accepted, 1 rejected, 0 malformed" in proc.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="hardware: needs a CUDA GPU")
def test_real_replay_on_cuda_is_accepted(run40, tmp_path):
    (tmp_path / "r").mkdir()
    proc = audit_cli(run40, "--step", "12", "--device", "cuda", "--receipt", tmp_path / "r" / "s12.json",
                     "--auditor", "gpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = audit_cli(run40, "--check_receipts", tmp_path / "r")
    assert proc.returncode == 0 and "accepted" in proc.stdout, proc.stdout


def test_revealed_salts_let_anyone_check(run40, tmp_path):
    a = audit.Audit(str(run40))
    a.replay(25, 25)
    (tmp_path / "r").mkdir()
    receipts.write_receipt(tmp_path / "r" / "honest.json", a.receipt(25, "dave", {}))
    receipts.write_receipt(tmp_path / "r" / "echo.json", echo_receipt(run40, 26, "erin"))
    receipts.write_receipt(tmp_path / "r" / "later.json", echo_receipt(run40, 35, "erin"))
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
    assert any(INJECTED in steps for name, steps in zip(names, plan) if name not in echoing)
    found, written = {}, {}
    for name, steps in zip(names, plan):
        (tmp_path / "receipts" / name).mkdir(parents=True)
        for step in steps:
            if name in echoing:
                receipt = echo_receipt(injected_run, step, name)
            else:
                a = audit.Audit(str(injected_run))
                a.replay(step, step)
                found[step] = sorted({s for s, _ in a.findings})
                receipt = a.receipt(step, name, {})
            if receipt is not None:
                receipts.write_receipt(tmp_path / "receipts" / name / f"step_{step}.json", receipt)
                written[f"{name}/step_{step}.json"] = (name, step)
    # Every honest audit that replays the injected step reports it, and only those report anything.
    passing = range(INJECTED, (INJECTED // CKPT_EVERY + 1) * CKPT_EVERY + 1)
    assert found and all(f == ([INJECTED] if s in passing else []) for s, f in found.items()), found

    proc = audit_cli(injected_run, "--check_receipts", tmp_path / "receipts")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    status = {os.path.relpath(line.split()[1].rstrip(":"), tmp_path / "receipts"): line
              for line in proc.stdout.splitlines()[:-1]}
    assert sorted(status) == sorted(written)
    for path, (name, step) in written.items():
        line = status[path]
        if name in echoing or step == INJECTED:
            assert line.startswith("rejected") and "do not open the step's commitment" in line, line
        else:
            assert line.startswith("accepted"), line
    assert any(step == INJECTED and f"reports MISMATCH at step {INJECTED}" in status[p] for p, (_, step) in written.items())

    proc = audit_cli(injected_run, "--coverage", tmp_path / "receipts")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    honest = [set(steps) for name, steps in zip(names, plan) if name not in echoing]
    count = {s: sum(s in h for h in honest) * (s not in passing) for s in range(1, STEPS + 1)}
    for need in (1, redundancy):
        steps = [s for s, n in count.items() if n >= need]
        assert (f"steps 1..{STEPS} with >= {need} accepted receipt{'s' * (need > 1)} from distinct auditors: "
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
