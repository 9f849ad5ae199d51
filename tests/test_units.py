"""Unit commitments and unit audits (units.py, unitaudit.py, receipts.py's receipts of units;
docs/auditing.md "Audit units").

- The format: the units of a step and their order, the chunked digest (chunk hashes with the
  piece's id and index, combined with the length) also when its chunks are hashed on different
  ranks, the unit list and its check against units_root.
- The option adds commitments only: a run with --unit_commits has the state hashes and
  checkpoints of the run without it (the records gain units_root, the run a units/ folder);
  hashing beside the step (--hash_async=on), --offload and --recompute (hashed in place, the
  witness behind activation checkpointing) give the same unit list.
- Every unit of a step (each micro-batch, each fold node, the update), audited from the
  publisher's reveals, gives MATCH, and its signed receipt is accepted and counted for its roster
  key; a micro-batch receipt cannot be made from the chain and every revealed piece.
- R = 1 and R = 2 runs (torchrun) of a config whose pieces span 3 chunks write byte-identical
  chains and unit lists, and the units of one step audited on each run all MATCH.

The attacks (a tampered micro-batch, fold node or update, a resealed units_root, a lazy receipt,
revealed tensors that do not match the chain) are in tests/test_attacks.py.
"""
import hashlib
import json
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

import config
import hashchain
import model
import receipts
import rundir
import signing
import train
import treefold
import unitaudit
import units
from tiny import ZERO_KEY, chain_records, launch_env, launcher, script, share_secret, train_args, write_roster
from unit_runs import STEP, audit, audit_every_unit, audit_every_unit_by_command, train_in_process, unit_dir


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


# ----------------------------------------------------------------------------- the format
def test_the_units_of_a_step_and_their_order():
    assert units.names(1) == ["micro_batch:0"]
    assert units.names(3) == ["micro_batch:0", "micro_batch:1", "micro_batch:2", "fold:0:2", "fold:0:3"]
    assert units.names(6)[6:] == ["fold:0:2", "fold:2:2", "fold:0:4", "fold:4:2", "fold:0:6"]
    for n in range(1, 40):
        assert len(units.names(n)) == 2 * n - 1 and units.all_units(n)[-1] == "update"
        assert units.root_name(n) == (units.names(n)[-1] if n > 1 else "micro_batch:0")
        for lo, size in units.fold_nodes(n):      # each node's children are units formed before it
            left, right = units.children(lo, size)
            order = units.names(n)
            assert max(order.index(left), order.index(right)) < order.index(f"fold:{lo}:{size}")
    assert units.parse("fold:0:2", 3) == ("fold", 0, 2) and units.parse("update", 3) == ("update",)
    for bad in ("micro_batch:3", "fold:1:2", "fold:0:1", "micro_batch:01", "step", "fold:0:2 "):
        with pytest.raises(units.UnitsError):
            units.parse(bad, 3)


def test_the_chunked_digest_is_its_documented_bytes(monkeypatch):
    monkeypatch.setattr(units, "CHUNK", 4)
    t = torch.arange(10, dtype=torch.float32)
    piece = units.uid(7, "fold:0:2")
    assert piece == b"7/fold:0:2"
    chunks = [hashlib.sha256(b"repops-chunk-v1\0" + piece + b"\0" + k.to_bytes(8, "little")
                             + t[4 * k:4 * k + 4].numpy().astype("<f4").tobytes()).digest() for k in range(3)]
    node = lambda leaf: hashlib.sha256(b"\0" + leaf).digest()          # noqa: E731  (SPEC §11.2)
    inner = hashlib.sha256(b"\1" + node(chunks[0]) + node(chunks[1])).digest()
    merkle = hashlib.sha256(b"\1" + inner + node(chunks[2])).digest()
    expected = hashlib.sha256(b"repops-digest-v1\0" + piece + b"\0" + (10).to_bytes(8, "little") + merkle).digest()
    assert units.digest(piece, t) == expected
    assert units.digest(piece, t, key=bytes(32)) != expected             # keyed: other bytes
    assert units.digest(units.uid(8, "fold:0:2"), t) != expected          # the id is bound in
    assert units.loss_bits(t) == "0x41100000"                             # 9.0, the last element


def test_a_digest_hashed_chunk_by_chunk_on_ranks_is_the_whole_ones(monkeypatch):
    """allreduce's slices, aligned to the chunk, hashed by their ranks (StepUnits.row) and
    exchanged, give the digest of the whole tensor, for every R."""
    monkeypatch.setattr(units, "CHUNK", 4)
    t = torch.arange(23, dtype=torch.float32)
    piece = units.uid(1, "fold:0:4")
    for world in (1, 2, 3, 4, 6):
        q = treefold.slice_size(t.numel(), world, units.CHUNK)
        assert q % units.CHUNK == 0
        hashes = {}
        for rank in range(world):
            row = torch.zeros(q)
            part = t[rank * q:(rank + 1) * q]
            row[:part.numel()] = part
            for k in units.owned_chunks(t.numel(), q, rank):
                hashes[k] = units.chunk_hash(piece, k, row[k * 4 - rank * q:min(k * 4 + 4, 23) - rank * q].numpy())
        assert units.combine(piece, 23, [hashes[k] for k in range(6)]) == units.digest(piece, t), world


def test_a_unit_list_is_checked_against_units_root(tmp_path):
    entries = [{"unit": u, "digest": hashlib.sha256(u.encode()).hexdigest(), "loss_bits": "0x3f800000"}
               for u in units.names(3)]
    for m in range(3):
        entries[m]["commit"] = hashlib.sha256(b"c%d" % m).hexdigest()
    root = units.root([units.entry_leaf(5, e) for e in entries])
    units.write_list(tmp_path / "l.json", 5, entries)
    assert (tmp_path / "l.json").read_bytes() == units.list_bytes(5, entries)
    assert units.check_list(units.read_list(tmp_path / "l.json", 5), 5, 3, root)["fold:0:3"] == entries[-1]
    with pytest.raises(units.UnitsError, match="not the unit list of step 6"):
        units.read_list(tmp_path / "l.json", 6)
    for change in ("digest", "loss_bits", "commit", "order"):
        forged = json.loads(json.dumps(entries))
        if change == "order":
            forged[0], forged[1] = forged[1], forged[0]
        elif change == "loss_bits":
            forged[1]["loss_bits"] = "0x3f800001"
        else:
            forged[1][change] = "0" * 64
        with pytest.raises(units.UnitsError):
            units.check_list(forged, 5, 3, root)
    bad = json.loads(json.dumps(entries))
    bad[3]["loss_bits"] = "1.0"                  # an entry that is not a unit: named with its digest whole
    with pytest.raises(units.UnitsError, match=f'"digest": "{bad[3]["digest"]}", "loss_bits": "1.0", "unit": "fold:0:2"}}$'):
        units.parse_list(units.list_bytes(5, bad), "l.json", 5)
    index, proof = units.proof(5, entries, "micro_batch:2")
    leaf = units.entry_leaf(5, entries[2])
    assert hashchain.merkle_root_from_proof(leaf, index, 5, proof) == root


def test_the_option_is_left_out_of_the_genesis_when_off():
    assert "unit_commits" not in config.decisive_config(config.Config())
    assert config.decisive_config(config.Config(unit_commits=True))["unit_commits"] is True
    assert config.from_record({}, "x").unit_commits is False


# ----------------------------------------------------------------------------- a run with units
@pytest.fixture(scope="module")
def unit_run(corpus, tmp_path_factory):
    return train_in_process(tmp_path_factory.mktemp("units") / "run", corpus)


def test_units_add_commitments_only(unit_run, corpus, tmp_path):
    off = tmp_path / "off"
    out = train.main([str(a) for a in train_args(off, corpus, "--micro_batches=3", "--max_steps=8",
                                                  "--checkpoint_every=4")])
    assert out == 0
    on_records, off_records = chain_records(unit_run), chain_records(off)
    assert [r["state_hash"] for r in on_records] == [r["state_hash"] for r in off_records]
    assert all("units_root" in r for r in on_records[1:]) and not any("units_root" in r for r in off_records)
    assert not (off / "units").exists() and len(list((unit_run / "units").iterdir())) == 8
    for (s, a), (_, b) in zip(rundir.Run(unit_run).checkpoints(), rundir.Run(off).checkpoints()):
        assert a.read_bytes() == b.read_bytes(), s
    for s in range(1, 9):
        entries = units.read_list(units.list_path(unit_run, s), s)
        units.check_list(entries, s, 3, on_records[s]["units_root"])


@pytest.mark.parametrize("flags", [["--hash_async=on"], ["--offload=1", "--recompute=1"]])
def test_overlap_offload_and_recompute_give_the_same_unit_list(unit_run, corpus, tmp_path, flags):
    """Hashed beside the step (--hash_async=on, as on a GPU) or in place with --offload and
    --recompute (the witness taken behind activation checkpointing): the same unit list."""
    other = share_secret(unit_run, tmp_path / "run")
    train_in_process(other, corpus, *flags, "--max_steps=2")
    for s in (1, 2):
        assert units.list_path(other, s).read_bytes() == units.list_path(unit_run, s).read_bytes()


@pytest.fixture(scope="module")
def audits(unit_run, corpus, tmp_path_factory):
    """{unit: UnitAudit} of every unit of STEP, from the publisher's reveals."""
    base = tmp_path_factory.mktemp("revealed")
    return base, audit_every_unit(unit_run, STEP, corpus, base)


def publisher_salts(run):
    secret = receipts.read_secret(run, "")
    return lambda step: receipts.salt(secret, step)


def unit_lists(run):
    records = chain_records(run)
    return lambda s: units.check_list(units.read_list(units.list_path(run, s), s), s, 3, records[s]["units_root"])


def test_every_unit_of_a_step_matches_and_its_receipt_is_accepted(unit_run, audits, keys, tmp_path):
    base, found = audits
    assert sorted(found) == sorted(units.all_units(3))
    assert {u: a.findings for u, a in found.items() if a.findings} == {}
    code, alice = train.code_digest(), signing.Signer(keys["alice"])
    signed = tmp_path / "r"
    signed.mkdir()
    for unit, a in found.items():
        receipts.write_receipt(signed / f"{unit.replace(':', '_')}.json",
                               receipts.sign_receipt(a.receipt(alice.public_key, {}, {}, code), alice))
    chain = rundir.Run(unit_run).chain

    def fold_keyed(step, unit, signer):
        kind, lo, size = units.parse(unit, 3)
        a = unitaudit.UnitAudit(str(unit_run), step)
        a.fold(lo, size, unit_dir(base, unit))
        return None if a.findings else a.keyed(signer)

    roster = signing.read_roster(write_roster(tmp_path / "roster", keys, ["alice"]))
    results = receipts.check_receipts(signed, chain, publisher_salts(unit_run), unit_lists(unit_run), fold_keyed, roster)
    assert [(r.receipt["unit"], r.status, r.name) for r in results] == \
        [(u, "accepted", "alice") for u in sorted(units.all_units(3), key=lambda u: u.replace(":", "_"))]
    covered = receipts.covered(results, chain, STEP, STEP)
    assert all(covered[STEP][u] == {alice.public_key} for u in units.all_units(3))


def test_a_micro_batch_receipt_cannot_be_made_from_the_chain_and_the_revealed_pieces(unit_run, audits, tmp_path):
    """Every value a lazy auditor holds after every reveal of the step (the unit list and its
    c_m, g_m and every node, the states), as the witness proof or as the value a proof is made of,
    fails; the replay's proof is accepted."""
    base, found = audits
    g1, _ = rundir.load_checkpoint(units.unit_file(unit_dir(base, "fold:0:2"), STEP, "micro_batch:1"))
    entry = unit_lists(unit_run)(STEP)["micro_batch:1"]
    record = chain_records(unit_run)[STEP]
    candidates = [entry["commit"], entry["digest"], record["units_root"], record["state_hash"], record["step_commit"],
                  units.digest(units.witness_uid(STEP, 1), g1["micro_batch:1"]).hex(),
                  hashlib.sha256(g1["micro_batch:1"].numpy().tobytes()).hexdigest()]
    honest = found["micro_batch:1"].receipt(ZERO_KEY, {}, {}, train.code_digest())
    chain = rundir.Run(unit_run).chain
    judge = lambda r: receipts.judge(r, chain, publisher_salts(unit_run), unit_lists(unit_run),  # noqa: E731
                                     lambda *_: None)
    assert judge(honest) == ("accepted", "")
    run, blob = receipts.run_id(chain.records[0]), signing.parse_public_key(ZERO_KEY)[1]
    for value in candidates:
        for witness in (value, receipts.witness_proof(run, STEP, 1, blob, bytes.fromhex(value))):
            status, reason = judge({**honest, "witness": witness})
            assert status == "rejected" and "does not open the micro-batch's commitment" in reason, value


# ----------------------------------------------------------------------------- the command line
STATUSES = ("accepted", "rejected", "malformed", "unchecked")


def accepted_by_check_receipts(run, receipts_dir, pub, roster, in_process=False):
    """audit.py --check_receipts on receipts_dir (fold nodes' children in pub, signers named by
    roster): the sorted [(unit, auditor)] of the receipts it accepts, after asserting it accepts
    every one (exit 0)."""
    proc = audit(run, "--check_receipts", receipts_dir, "--revealed", pub, "--roster", roster, in_process=in_process)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.split()[0] in STATUSES]
    assert lines and all(line.startswith("accepted") for line in lines), proc.stdout
    return sorted(re.match(r".*: step \d+, (\S+) by (\S+)", line).groups() for line in lines)


def test_every_unit_through_the_command_line(unit_run, corpus, keys, tmp_path):
    """audit.py end to end: the publisher's --reveal_unit (in this process) and --materialize; each
    unit's audit in a child process, MATCH with its receipt; --check_receipts accepts them all;
    --coverage and report.py count units."""
    pub, signed = tmp_path / "pub", tmp_path / "receipts"
    found = audit_every_unit_by_command(unit_run, STEP, corpus, pub, signed, keys, ["alice", "bob"])
    assert sorted(found) == sorted(units.all_units(3))
    roster = write_roster(tmp_path / "roster", keys, ["alice", "bob", "carol"])
    for unit, (auditor, proc) in found.items():
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.startswith(f"MATCH: {unitaudit.label(unit)} of step {STEP} of {unit_run} replays"), proc.stdout
        fingerprint = signing.fingerprint(signing.Signer(keys[auditor]).public_key)
        assert f"receipt: step {STEP}, {unit} (MATCH) signed by {fingerprint} written" in proc.stdout
    state = tmp_path / "state"                  # the parameters alone, from --materialize, given with --state
    proc = audit(unit_run, "--materialize", STEP - 1, "--params_only", "--out", state, corpus=corpus)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in state.iterdir()] == [units.state_file(state, STEP - 1, params_only=True).name]
    proc = audit(unit_run, "--step", STEP, "--micro_batch", 2, "--state", units.state_file(state, STEP - 1, True),
                 "--receipt", signed / "carol.json", "--key", keys["carol"], corpus=corpus)
    assert proc.returncode == 0 and proc.stdout.startswith("MATCH: micro-batch 2"), proc.stdout + proc.stderr
    assert accepted_by_check_receipts(unit_run, signed, pub, roster) == [
        ("fold:0:2", "bob"), ("fold:0:3", "alice"), ("micro_batch:0", "alice"), ("micro_batch:1", "bob"),
        ("micro_batch:2", "alice"), ("micro_batch:2", "carol"), ("update", "bob")]
    proc = audit(unit_run, "--coverage", signed, "--revealed", pub, "--roster", roster, "--steps", f"{STEP}:{STEP}",
                 "--redundancy", 1, in_process=True)
    assert proc.returncode == 0 and "6/6 (100.0%); steps all of whose units have them: 1/1" in proc.stdout, proc.stdout
    proc = audit(unit_run, "--coverage", signed, "--revealed", pub, "--roster", roster, "--steps", f"{STEP}:{STEP}",
                 "--redundancy", 2, in_process=True)
    assert proc.returncode == 1 and "1/6 (16.7%)" in proc.stdout, proc.stdout
    page = tmp_path / "report.html"
    proc = script("report.py", "--run_dir", unit_run, "--out", page, "--receipts", signed, "--revealed", pub,
                  "--roster", roster, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = page.read_text()
    # 8 steps of 6 units, less the updates of steps 4 and 8 (checkpoints) and 5 (its state revealed)
    assert "6 of 45 with an accepted receipt (13.3%), 1 with &gt;= 2 (2.2%)" in text, text
    assert f"<td>{STEP}</td><td>1</td><td>6</td><td>micro_batch 0-1, fold 0:2 0:3, update</td>" in text


def test_a_plan_shares_every_unit_among_the_auditors(unit_run, corpus):
    """--plan on a run with unit commitments: each unit of the steps (every micro-batch, fold node
    and the update) goes to --redundancy distinct auditors."""
    proc = audit(unit_run, "--plan", "--auditors", 4, "--redundancy", 2, "--seed", 5, "--steps", "5:6", corpus=corpus)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == (f"plan: the 12 units of steps 5..6 of {unit_run} (every micro-batch, fold node and update) "
                        "for 4 auditors, each unit audited by 2 of them, seed 5")
    rows = [line.split(None, 3) for line in lines[3:7]]
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4] and sum(int(r[1]) for r in rows) == 24, lines
    assigned = [(int(step), part) for r in rows for chunk in r[3].split("; ")
                for step, _, names in [chunk.partition(": ")] for part in names.split(", ")]
    assert sorted({s for s, _ in assigned}) == [5, 6] and any(part == "update" for _, part in assigned), assigned
    chain = rundir.Run(unit_run).chain
    costs = receipts.unit_costs(chain, 5, 6, {"micro_batch": 3.0, "fold": 1.0, "update": 2.0}.get)
    plan = receipts.plan(costs, 4, 2, seed=5)
    assert all(sum(u in units_ for units_ in plan) == 2 for u in costs) and len(costs) == 12


# ----------------------------------------------------------------------------- R = 1 and R = 2
WIDE = ["--n_layer=2", "--d_model=128", "--n_head=2", "--d_hidden=512"]   # 590k floats: 3 chunks


def train_ranks(corpus, base, n, worlds, steps):
    """{R: run} of the WIDE config with unit commitments on each R of `worlds` (R = 1 plain
    python, the others torchrun, under R = 1's secret), n micro-batches, a checkpoint every step."""
    runs = {}
    for world in worlds:
        run = base / f"r{world}" / "run"
        if world > 1:
            share_secret(runs[1], run)
        args = train_args(run, corpus, *WIDE, "--unit_commits=1", f"--micro_batches={n}", f"--max_steps={steps}",
                          "--checkpoint_every=1", "--threads=1")
        proc = subprocess.run(launcher(world) + [str(a) for a in args], env=launch_env(), capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        runs[world] = run
    return runs


def test_units_are_the_same_on_one_and_two_ranks_and_audit_on_both(corpus, keys, tmp_path):
    runs = train_ranks(corpus, tmp_path, 4, (1, 2), 2)
    cfg = rundir.Run(runs[1]).cfg
    numel = sum(int(np.prod(s)) for s in model.param_shapes(train.model_config(cfg, 256)).values()) + 1
    assert units.n_chunks(numel) == 3            # the upper nodes' chunks are hashed on both ranks
    assert (runs[1] / "chain.jsonl").read_bytes() == (runs[2] / "chain.jsonl").read_bytes()
    for s in (1, 2):
        assert units.list_path(runs[1], s).read_bytes() == units.list_path(runs[2], s).read_bytes()
    witnesses = {}                  # each unit of step 2 through audit.py, by the same keys on each run
    roster = write_roster(tmp_path / "roster", keys, ["alice", "bob"])
    for world, run in runs.items():
        pub, signed = tmp_path / f"pub{world}", tmp_path / f"receipts{world}"
        found = audit_every_unit_by_command(run, 2, corpus, pub, signed, keys, ["alice", "bob"], in_process=True)
        assert {u: p.stdout for u, (_, p) in found.items() if p.returncode or not p.stdout.startswith("MATCH")} == {}
        accepted = accepted_by_check_receipts(run, signed, pub, roster, in_process=True)
        assert accepted == sorted((u, auditor) for u, (auditor, _) in found.items()), world
        witnesses[world] = [json.loads((signed / f"micro_batch_{m}.json").read_text())["witness"] for m in range(4)]
    assert witnesses[1] == witnesses[2]


def test_units_are_the_same_when_blocks_are_not_subtrees(corpus, tmp_path):
    """N = 12 on R = 4: blocks of 3 micro-batches, each rank hands on two partial sums, and the
    nodes above them (fold:2:2, which spans two ranks, up to fold:0:12) are completed chunk by chunk."""
    runs = train_ranks(corpus, tmp_path, 12, (1, 4), 1)
    assert units.list_path(runs[1], 1).read_bytes() == units.list_path(runs[4], 1).read_bytes()
    assert (runs[1] / "chain.jsonl").read_bytes() == (runs[4] / "chain.jsonl").read_bytes()
    assert units.upper_nodes(12, 4) == [(2, 2), (0, 4), (4, 4), (0, 8), (8, 2), (8, 4), (0, 12)]


def test_the_publisher_makes_a_lost_unit_list_again(unit_run, corpus, tmp_path):
    """A run that lost units/step_<s>.json: the publisher's reveal replays the step with the
    run's secret and writes the same list (checked against units_root)."""
    run = tmp_path / "run"
    shutil.copytree(unit_run, run)
    original = units.list_path(run, STEP).read_bytes()
    units.list_path(run, STEP).unlink()
    unitaudit.Publisher(run, str(corpus)).reveal(STEP, "micro_batch:0", tmp_path / "pub")
    assert units.list_file(tmp_path / "pub", STEP).read_bytes() == original
    assert not units.list_path(run, STEP).exists()          # readers never write into the run
