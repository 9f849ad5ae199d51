"""The audit cannot be fooled: every field of every record, every checkpoint file it vouches for.

- Every field of the genesis record and of a step record (every config key, every tensor hash
  leaf, every split) is changed in turn and the chain re-sealed, as a forger would: the audit
  must report a mismatch at that step that names the field (but code_digest and data_manifest:
  other code or another corpus is the auditor's input, exit 2). Runs in-process (audit.Audit) on
  copies of one tiny run, so each case costs one replayed step. step_commit and secret_commit,
  which only the run's secret (or the step's revealed salt) opens, are named by the audit in the
  publisher's run directory, which holds the secret; without it the audit checks their format,
  and the receipt check rejects a receipt of the forged step (a resume, for secret_commit:
  tests/test_attacks.py).
- Checkpoints: a bit flipped in the final checkpoint, in a middle one the replay does not start
  from, or the checkpoint's own metadata edited: found, exit 1.
- A forger who changes a config key in the genesis record and in config.json alike: the
  replay of steps 21-25 (after warmup, lr decaying) finds every decisive key there or at
  genesis; lsq_repin, inert in an fp32 run, must replay to MATCH.
- A deleted record, a duplicate JSON key, an injected field: a break or mismatch at that step.
- sample.py refuses a checkpoint whose chain link is broken.
- export.py vouches only for what an audit would: a genesis config forged with the recipe's
  options turned off, and a tensor added to the final checkpoint and its record, are refused.
"""
import json
import shutil

import pytest

import audit
import rundir
import hashchain
import receipts
from tiny import (STEPS, ZERO_KEY, assert_one_line_error, audit as audit_cli, chain_records, copy_run, make_corpus,
                  mismatch_lines, reseal, script, train_args, write_chain)

STEP = 11             # a step record to tamper with: replayed from the checkpoint at step 10


def tampered(value, key=None):
    """A different value of the same JSON type that still makes a valid config."""
    if key == "n_kv_head":                       # must still divide n_head
        return value // 2 if value > 1 else 2
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 if value else 1
    if isinstance(value, float):
        return value / 2 if value else 0.5
    if isinstance(value, str):
        if value in ("none", "int8"):      # --quant: a string with two valid values
            return "int8" if value == "none" else "none"
        if value in ("linear", "cosine"):  # --lr_schedule: likewise
            return "cosine" if value == "linear" else "linear"
        if key == "micro_batch_phases":    # N@S phases ("" is none): 7 micro-batches from step 21 on,
            return "7@20"                  # inside the steps the consistent-forgery test replays
        return value[:-1] + ("0" if value[-1:] != "0" else "1")
    raise TypeError(value)


@pytest.fixture(scope="module")
def records(reference):
    return chain_records(reference)


def field_paths(record, prefix=()):
    """Every leaf field of a record as a path: ("loss",), ("config", "lr"),
    ("data_chunks", "train", "root")."""
    for key, value in sorted(record.items()):
        if not prefix and key in ("prev", "record_hash"):
            continue
        if isinstance(value, dict):
            yield from field_paths(value, prefix + (key,))
        else:
            yield prefix + (key,)


def run_audit(run, step):
    return sorted(replayed(run, step).findings, key=lambda f: f[0])


def replayed(run, step):
    a = audit.Audit(str(run))
    a.replay(step, step)
    return a


def receipt_check(a, step):
    """(status, reason) the publisher's receipt check (with the run's secret) gives a receipt of
    audit `a`'s replay of `step`."""
    secret = receipts.read_secret(a.run.dir, "")
    return receipts.judge(a.receipt(step, ZERO_KEY, {}), a.run.chain, lambda s: receipts.salt(secret, s))


@pytest.fixture(scope="module")
def workdir(reference, tmp_path_factory):
    return copy_run(reference, tmp_path_factory.mktemp("tamper") / "run")


def test_every_field_of_genesis_and_step_records_is_checked(reference, records, workdir):
    """Exit 1 at the step, naming the field, for each field changed and the chain re-sealed.

    The step record's step_commit commits to the step's gradient and result with the run's
    secret, the genesis record's secret_commit to the secret: the audit here holds the secret (the
    publisher's run directory), so it names them too. Without the secret a well-formed forged
    commitment leaves the audit silent (it cannot know): then the publisher's receipt check must
    reject the receipt of that very replay, which it accepts on the true chain; one that is not 64
    hex digits the audit's format check names."""
    original = (reference / "chain.jsonl").read_text()
    assert receipt_check(replayed(workdir, STEP), STEP)[0] == "accepted"
    missed, checked = [], 0
    for step, audited in ((0, 1), (STEP, STEP)):
        for path in field_paths(records[step]):
            if path in (("contract",), ("spec",), ("code_digest",), ("data_manifest",)):
                continue        # refused before any replay, as the auditor's input (the tests below)
            commitment = path in (("step_commit",), ("secret_commit",))
            for malformed in ((False, True) if commitment else (False,)):
                forged = json.loads(json.dumps(records))
                target = forged[step]
                for key in path[:-1]:
                    target = target[key]
                target[path[-1]] = "not hex" if malformed else tampered(target[path[-1]], path[-1])
                write_chain(workdir, reseal(forged))
                a = replayed(workdir, audited)
                findings = sorted(a.findings, key=lambda f: f[0])
                name = path[1] if len(path) > 1 else path[0]    # the key a report must name
                caught = (findings and findings[0][0] == step
                          and any(name in msg for s, msg in findings if s == step))
                if commitment and not malformed:              # the same chain audited without the secret
                    secret = (workdir / receipts.SECRET).read_bytes()
                    (workdir / receipts.SECRET).unlink()
                    blind = replayed(workdir, audited)
                    (workdir / receipts.SECRET).write_bytes(secret)
                    caught = caught and not blind.findings and (step == 0 or receipt_check(blind, step)[0] == "rejected")
                if not caught:
                    missed.append((step, ".".join(path), malformed, findings[:2]))
                checked += 1
    (workdir / "chain.jsonl").write_text(original)
    assert checked > 40, checked                 # config keys, tensor leaves, record fields
    assert not missed, missed


@pytest.mark.parametrize("edit,expect", [
    (lambda g: g.pop("contract"), "this run was made under SPEC v7 and arithmetic contract v1; this code implements SPEC v7 and contract v2"),
    (lambda g: g.update(contract=3), "this run was made under SPEC v7 and arithmetic contract v3; this code implements SPEC v7 and contract v2"),
    (lambda g: g.update(contract="2"), 'the genesis record\'s contract "2" is not an arithmetic contract version'),
    (lambda g: g.update(contract=True), "the genesis record's contract true is not an arithmetic contract version"),
    (lambda g: g.pop("spec"), "this run was made under SPEC v2 and arithmetic contract v2; this code implements SPEC v7 and contract v2"),
    (lambda g: [g.pop("spec"), g.pop("contract")], "this run was made under SPEC v1 and arithmetic contract v1"),
    (lambda g: g.update(spec=6), "this run was made under SPEC v6 and arithmetic contract v2"),
    (lambda g: g.update(spec=8), "this run was made under SPEC v8 and arithmetic contract v2"),
    (lambda g: g.update(spec="7"), 'the genesis record\'s spec "7" is not a SPEC version'),
], ids=["contract_v1_without_the_field", "contract_v3", "contract_the_string_2", "contract_true", "spec_v2_without_the_field",
        "v1_without_either", "spec_v6", "spec_v8", "spec_the_string_7"])
def test_a_run_of_another_version_is_refused(reference, records, corpus, tmp_path, edit, expect):
    """The genesis record's `contract` (SPEC §12.2): a run made under another arithmetic contract
    (no field: v1, whose flat sums differ) or another SPEC version (`spec`; no field: v2), or whose
    `contract` or `spec` is no version at all (a string, a boolean), is refused with one line, exit 2, by every program that opens it: audit.py,
    train.py's resume, sample.py, export.py and report.py -- not a MISMATCH: its steps are not
    this code's to replay, its weights not this code's to vouch for. Nothing is written."""
    forged = json.loads(json.dumps(records))
    edit(forged[0])
    run = copy_run(reference, tmp_path / "run")
    sealed = reseal(forged)
    write_chain(run, sealed)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    for prog, args in [("audit.py", ["--run_dir", run, "--step", "1"]),
                       ("sample.py", ["--run_dir", run, "--tokens", "4"]),
                       ("export.py", ["--run_dir", run, "--to", "hf", "--out", tmp_path / "hf"]),
                       ("report.py", ["--run_dir", run, "--out", tmp_path / "report.html"]),
                       ("train.py", train_args(run, corpus, f"--max_steps={STEPS + 1}"))]:
        proc = script(prog, *args)
        assert_one_line_error(proc, prog)
        assert expect in proc.stderr, (prog, proc.stderr)
    assert not (tmp_path / "hf").exists() and not (tmp_path / "report.html").exists()
    assert chain_records(run) == sealed                  # nothing written
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


@pytest.mark.parametrize("field", ["code_digest", "data_manifest"])
def test_other_code_or_another_corpus_is_the_auditors_input(reference, records, corpus, tmp_path, field):
    """A genesis record that names other code (code_digest) or another corpus (data_manifest)
    than the auditor's is bad input, exit 2, one line in train.py's words with both digests in
    full: the audit cannot judge a run with inputs that are not the run's, so it is no MISMATCH.
    The same holds for a true record and the auditor's wrong corpus (--data_dir), and train.py's
    resume says the same."""
    forged = json.loads(json.dumps(records))
    forged[0][field] = "ab" * 32
    run = copy_run(reference, tmp_path / "run")
    write_chain(run, reseal(forged))
    proc = audit_cli(run, "--step", "1")
    assert_one_line_error(proc, "audit.py")
    words = "was started by different code" if field == "code_digest" else "was trained on corpus"
    assert words in proc.stderr and "ab" * 32 in proc.stderr and records[0][field] in proc.stderr, proc.stderr
    if field == "data_manifest":
        (tmp_path / "other").mkdir()
        other = make_corpus(tmp_path / "other", seed=8, lines=300)
        proc = audit_cli(reference, "--step", "1", corpus=other)
        assert_one_line_error(proc, "audit.py")
        assert words in proc.stderr and "--data_dir" in proc.stderr, proc.stderr
        resumed = script("train.py", f"--run_dir={copy_run(reference, tmp_path / 'resumed')}", f"--data_dir={other}")
        assert_one_line_error(resumed, "train.py")
        assert words in resumed.stderr, resumed.stderr


@pytest.mark.parametrize("edit,expect", [
    (lambda r: r.update(injected=1), "field injected is not part of"),
    (lambda r: r.pop("loss"), "field loss is missing"),
    (lambda r: r.update(loss=r["loss"] + 1e-9), "field loss differs"),
], ids=["injected_field", "missing_field", "float_changed_slightly"])
def test_injected_missing_and_changed_fields(records, workdir, edit, expect):
    forged = json.loads(json.dumps(records))
    edit(forged[STEP])
    write_chain(workdir, reseal(forged))
    findings = run_audit(workdir, STEP)
    assert findings and findings[0][0] == STEP and expect in findings[0][1], findings


def test_link_fields_prev_and_record_hash(records, workdir):
    for field in ("prev", "record_hash"):
        forged = json.loads(json.dumps(records))
        forged[STEP][field] = tampered(forged[STEP][field])
        if field == "prev":                      # sealed over the wrong link: its own hash holds
            body = {k: v for k, v in forged[STEP].items() if k not in ("prev", "record_hash")}
            forged[STEP] = hashchain.seal(body, forged[STEP]["prev"])
        write_chain(workdir, forged)
        findings = run_audit(workdir, STEP)
        assert findings and findings[0][0] == STEP, findings
        assert ("record hash" if field == "record_hash" else "prev") in findings[0][1], findings


def test_duplicate_key_is_a_break_without_any_reseal(reference, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    lines = (run / "chain.jsonl").read_text().splitlines(keepends=True)
    lines[STEP] = lines[STEP].replace('{', '{"loss":0.01,', 1)     # json.loads keeps the last one
    (run / "chain.jsonl").write_text("".join(lines))
    proc = audit_cli(run, "--all")
    assert proc.returncode == 1 and mismatch_lines(proc)[0].startswith(f"MISMATCH at step {STEP}:"), proc.stdout
    assert "duplicate key 'loss'" in proc.stdout


def test_deleted_record_is_a_break_at_that_step(records, reference, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    write_chain(run, records[:STEP] + records[STEP + 1:])
    for args in (["--step", str(STEPS)], ["--all"]):
        proc = audit_cli(run, *args)
        lines = mismatch_lines(proc)
        assert proc.returncode == 1 and lines[0].startswith(f"MISMATCH at step {STEP}:"), proc.stdout
    write_chain(run, reseal(records[:STEP] + records[STEP + 1:], STEP))   # hidden by a reseal
    proc = audit_cli(run, "--all")
    assert proc.returncode == 1 and mismatch_lines(proc)[0].startswith(f"MISMATCH at step {STEP}:")
    assert "expected step" in proc.stdout


def flip_bit(path, tensor="params.lm_head"):
    raw = bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    begin, end = json.loads(raw[8:8 + n])[tensor]["data_offsets"]
    raw[8 + n + (begin + end) // 2] ^= 0x01
    path.write_bytes(raw)


@pytest.mark.parametrize("ckpt_step,args", [
    (STEPS, ["--step", "20"]),             # the final checkpoint: what people download
    (STEPS, ["--all"]),
    (20, ["--all"]),                       # a middle one the replay passes through
    (20, ["--step", "25"]),                # the one --step 25 starts from
], ids=["final_step20", "final_all", "middle_all", "start_step25"])
def test_bit_flip_in_any_checked_checkpoint(reference, tmp_path, ckpt_step, args):
    run = copy_run(reference, tmp_path / "run")
    flip_bit(rundir.checkpoint_path(run / "checkpoints", ckpt_step))
    proc = audit_cli(run, *args)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert any(line.startswith(f"MISMATCH at step {ckpt_step}:") and "params.lm_head" in line
               for line in mismatch_lines(proc)), proc.stdout


def test_edited_checkpoint_metadata(reference, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    path = rundir.checkpoint_path(run / "checkpoints", STEPS)
    tensors, meta = rundir.load_checkpoint(path)
    rundir.save_checkpoint(path, tensors, {**meta, "note": "edited"})
    proc = audit_cli(run, "--step", "1")         # every audit checks the run's latest checkpoint
    assert proc.returncode == 1 and "metadata field 'note'" in proc.stdout, proc.stdout


@pytest.mark.parametrize("leaf", ["not a hash", "00"])
def test_a_header_leaf_that_is_not_a_hash(reference, tmp_path, leaf):
    """A checkpoint header whose tensor_hashes entry is not 64 lowercase hex digits (a forger's
    edit; records hold the root only, so the header's leaves are what tensors are checked
    against): MISMATCH at that checkpoint's step, exit 1, never a traceback."""
    run = copy_run(reference, tmp_path / "run")
    path = rundir.checkpoint_path(run / "checkpoints", STEPS)
    tensors, meta = rundir.load_checkpoint(path)
    name = sorted(meta["tensor_hashes"])[0]
    rundir.save_checkpoint(path, tensors, {**meta, "tensor_hashes": {**meta["tensor_hashes"], name: leaf}})
    proc = audit_cli(run, "--step", "1")         # every audit checks the run's latest checkpoint
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert any(line.startswith(f"MISMATCH at step {STEPS}:") and "tensor_hashes" in line
               for line in mismatch_lines(proc)), proc.stdout


def test_sample_refuses_a_checkpoint_behind_a_broken_link(records, reference, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    records[5]["loss"] += 1.0                    # an edited record before the final checkpoint
    write_chain(run, records)
    proc = script("sample.py", "--run_dir", run, "--tokens", "5")
    assert_one_line_error(proc, "sample.py")
    assert "step 5" in proc.stderr


def test_config_json_that_disagrees_is_reported(reference, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    cfg = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**cfg, "beta2": 0.99}))
    proc = audit_cli(run, "--step", "1")
    assert proc.returncode == 1 and "config.json disagrees with the genesis record on beta2" in proc.stdout
    shutil.rmtree(run)


AFTER_WARMUP = (21, 25)     # replayed from checkpoint 20: past warmup (20 steps), lr decaying to min_lr
# Keys that act on no bit of this run (an fp32 run has no step sizes to re-pin): the forgery
# changes nothing, and the replay must say MATCH, which shows the key is inert, not missed.
INERT = {"lsq_repin": "only int8 runs have weight step sizes to re-pin",
         "full_attn_every": "it picks the full layers among windowed ones; this run has no window (attn_window 0)"}


def test_config_forgery_with_a_consistent_config_json(reference, records, tmp_path):
    """A forger who changes a genesis config key, writes config.json to agree and reseals the
    chain: the genesis check cannot see it (config.json and the record agree), so the replay of
    a step where the key acts must (steps 21-25: after warmup, while the lr decays, so warmup_steps,
    max_steps and min_lr act; the model's keys already change the initial state)."""
    run = copy_run(reference, tmp_path / "run")
    config_json = json.loads((run / "config.json").read_text())
    missed, inert_found = [], []
    for key, value in sorted(records[0]["config"].items()):
        forged = json.loads(json.dumps(records))
        forged[0]["config"][key] = tampered(value, key)
        write_chain(run, reseal(forged))
        (run / "config.json").write_text(json.dumps({**config_json, key: forged[0]["config"][key]}, indent=2))
        a = audit.Audit(str(run))
        assert not any("config.json" in m for _, m in a.findings)
        a.replay(*AFTER_WARMUP)
        findings = sorted(a.findings, key=lambda f: f[0])
        if key in INERT:
            if findings:
                inert_found.append((key, findings[:1]))
        elif not findings or findings[0][0] > AFTER_WARMUP[1]:
            missed.append(key)
    assert not missed, f"a consistent forgery of these keys passed the audit of steps {AFTER_WARMUP}: {missed}"
    assert not inert_found, inert_found


RECIPE_OPTIONS = {"attn_window": 5, "full_attn_every": 2, "qk_norm": True, "emb_norm": True}


def test_export_refuses_a_forgery_the_audit_finds_at_genesis(corpus, tmp_path):
    """A recipe run whose genesis config has the four recipe options turned off (and config.json
    to agree), the chain resealed: the chain's links and the final checkpoint against its record
    still verify, but the audit finds the forgery at step 0, so export must refuse it rather than
    write a plain LlamaForCausalLM without the checkpoint's params.emb_norm."""
    run, out = tmp_path / "run", tmp_path / "out"
    options = [f"--{k}={str(v).lower()}" for k, v in RECIPE_OPTIONS.items()]
    proc = script("train.py", *train_args(run, corpus, "--max_steps=4", *options))
    assert proc.returncode == 0, proc.stderr
    records = chain_records(run)
    assert "params.emb_norm" in rundir.load_checkpoint(rundir.checkpoint_path(run / "checkpoints", 4))[1]["tensor_hashes"]
    records[0]["config"].update({k: type(v)() for k, v in RECIPE_OPTIONS.items()})
    write_chain(run, reseal(records))
    config_json = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config_json, **records[0]["config"]}, indent=2))
    proc = audit_cli(run, "--step", "1")
    assert proc.returncode == 1 and mismatch_lines(proc)[0].startswith("MISMATCH at step 0: genesis record"), proc.stdout
    proc = script("export.py", "--run_dir", run, "--step", "4", "--to", "hf", "--out", out)
    assert_one_line_error(proc, "export.py")
    assert "genesis record" in proc.stderr and "audit.py" in proc.stderr, proc.stderr
    assert not out.exists()


def test_export_loads_the_checkpoint_into_the_state_of_the_genesis_config(reference, records, tmp_path):
    """A tensor the genesis config's model does not have (params.emb_norm), added to the final
    checkpoint and its record, the chain resealed: the genesis check passes (only a replay of
    step 30 finds the record), but the checkpoint is not the state of the genesis config's
    model, so export refuses it instead of dropping the tensor."""
    run, out = copy_run(reference, tmp_path / "run"), tmp_path / "out"
    path = rundir.checkpoint_path(run / "checkpoints", STEPS)
    tensors, _ = rundir.load_checkpoint(path)
    tensors["params.emb_norm"] = tensors["params.norm"].clone()
    root, leaves = hashchain.state_hash(tensors)
    forged = json.loads(json.dumps(records))
    forged[STEPS].update(state_hash=root)
    rundir.save_checkpoint(path, tensors, {"step": STEPS, "state_hash": root, "tensor_hashes": leaves})
    write_chain(run, reseal(forged))
    proc = script("export.py", "--run_dir", run, "--to", "hf", "--out", out)
    assert_one_line_error(proc, "export.py")
    assert "params.emb_norm does not fit the state of the run's config" in proc.stderr, proc.stderr
    assert not out.exists()
