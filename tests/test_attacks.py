"""Attacks on the data, the receipts and the readers, as tests: each names what it forges and what refuses it.

    python -m pytest tests/test_attacks.py -q

- The corpus name binds every token: a token changed with its leaves and chunk root recomputed
  renames the corpus; a token file that disagrees with its manifest is a MISMATCH at the first
  step that reads it (audit), and a trainer refuses it with one line before that step's record.
- A receipt needs the whole step: one whose result proof is not of the post-step state's keyed
  root (an "auditor" who computed the gradient and skipped the update) is rejected; a receipt
  names the record it audited, so a chain rewritten and resealed later rejects it; a resume under
  another secret is refused with one line; every path and finding is printed escaped (no forged
  "accepted" line).
- Readers never write: every output option of audit.py, report.py and data.py --bundle, pointed into the
  run or at one of its files under another name (symlink, hard link), is refused with one line
  and the run's bytes are unchanged.
- Hostile input: token ids >= vocab, FIFOs and 100k-deep JSON as manifest, bundle index and
  anchors, Unicode digits as chunk keys, --plan --auditors 10^12 / 10^30, a blank or torn tail
  in the run's own anchors.jsonl, temp files of any name in checkpoints/, and a refusal that
  names the option given.

- Audit units (issue 35, a run with --unit_commits): data changed in one micro-batch of one
  step, a tampered fold node and a nudged update, each revealed as committed by the dishonest
  trainer, are reported by exactly the micro-batch, the fold node and the update that hold them,
  and every other unit gives MATCH; a units_root resealed after the fact rejects every earlier
  receipt of its step and its changed unit reports it; a lazy micro-batch receipt (the
  commitment or the digest copied) is rejected; a revealed child or state tensor that is not the
  chain's is refused by the audit it is handed to, before use.

- Round four (issue 61): a micro-batch receipt copied under another key (relabelled, re-signed)
  is refused and coverage counts one key for one replay; a receipt moved to another run with the
  same state before the step is refused; the update's shortcut from S and a public post-step
  state gives a receipt coverage does not count; a whole-step receipt assembled from micro-batch
  and update proofs covers no fold node; a link planted under a writer's temp name is never
  followed (--reveal_unit's unit list, python data.py's token files and manifest, train.py --init_from's source config); --materialize with an --out that is a file or cannot be
  written is one line and exit 2 before any replay.

Runs in-process on one tiny run (30 steps, as tests/conftest.py's `reference`), trained here,
and on tiny runs with unit commitments (tests/unit_runs.py).
"""
import contextlib
import hashlib
import io
import json
import os
import shutil
import signal

import numpy as np
import pytest
import torch

import audit
import config
import data
import optrace
import prepare
import hashchain
import hfllama
import receipts
import repops
import report
import rundir
import signing
import sample
import train
import treefold
import unitaudit
import units
from data import DataError, DataMismatch, TokenData
from tiny import TINY, ZERO_KEY, chain_records, copy_run, reseal, share_secret, train_args, write_chain, write_roster
from unit_runs import (STEP, audit_every_unit, mismatches, patched, reveal_every_unit, train_in_process,
                       unit_dir)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """In-process training and audits on one thread (a tiny model gains nothing from more)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """tests/conftest.py's uninterrupted tiny run (30 steps, a checkpoint every 10), trained in
    this process: no subprocess start, no timeout on a busy machine."""
    run = tmp_path_factory.mktemp("reference") / "run"
    code, _, err = call(train.main, train_args(run, corpus))
    assert code == 0, err
    return run


def call(main, argv):
    """(exit code, stdout, stderr) of a command's main(argv), run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def one_line_error(result, prog):
    code, _, err = result
    lines = err.strip().splitlines()
    return code == 2 and len(lines) == 1 and lines[0].startswith(f"{prog}: error:")


def snapshot(directory):
    """{relative path: SHA-256} of every file under directory (symlinks as their target name)."""
    out = {}
    for d, dirs, names in os.walk(directory):
        for name in dirs + names:
            p = os.path.join(d, name)
            rel = os.path.relpath(p, directory)
            if os.path.islink(p):
                out[rel] = "link:" + os.readlink(p)
            elif os.path.isfile(p):
                out[rel] = hashlib.sha256(open(p, "rb").read()).hexdigest()
            else:
                out[rel] = "dir"
    return out


def poisoned_copy(corpus, dest, recompute=False):
    """The corpus with one train token changed (every tiny step reads chunk 0, where it is); with
    recompute, the publisher's attack: leaves and chunk root recomputed, split SHA-256 kept."""
    shutil.copytree(corpus, dest)
    raw = bytearray((dest / "train.bin").read_bytes())
    raw[200] ^= 0x01
    (dest / "train.bin").write_bytes(bytes(raw))
    if recompute:
        manifest = json.loads((dest / "manifest.json").read_text())
        rec = manifest["splits"]["train"]
        leaves = [hashlib.sha256(raw[i:i + rec["chunks"]["bytes"]]).digest()
                  for i in range(0, len(raw), rec["chunks"]["bytes"])]
        (dest / "train.leaves").write_bytes(b"".join(leaves))
        rec["chunks"]["root"] = hashchain.merkle_root([leaf.hex() for leaf in leaves])
        (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


# ----------------------------------------------------------------------------- 1. the corpus name
def test_a_recomputed_chunk_root_renames_the_corpus(corpus, tmp_path):
    clean = TokenData(str(corpus), seed=0)
    forged = TokenData(str(poisoned_copy(corpus, tmp_path / "forged", recompute=True)), seed=0)
    assert forged.manifest["splits"]["train"]["sha256"] == clean.manifest["splits"]["train"]["sha256"]
    assert forged.digest != clean.digest            # the name people compare differs
    genesis = {**clean.commitments()}
    with pytest.raises(DataMismatch, match="data_manifest"):
        forged.check_run(genesis)


def test_a_token_file_that_disagrees_with_its_manifest_never_replays_to_match(reference, corpus, keys, tmp_path):
    bad = poisoned_copy(corpus, tmp_path / "bad")
    (tmp_path / "r").mkdir()
    code, out, _ = call(audit.main, ["--run_dir", reference, "--step", 13, "--data_dir", bad,
                                     "--receipt", tmp_path / "r" / "13.json", "--key", keys["alice"]])
    lines = out.splitlines()
    assert code == 1 and not any(line.startswith("MATCH") for line in lines), out
    first = next(line for line in lines if line.startswith("MISMATCH"))
    assert first.startswith("MISMATCH at step 11:") and "chunk 0" in first, out   # replayed from 10
    assert "receipt: none written, the replay stopped before step 13" in out   # no MATCH receipt


def test_a_trainer_refuses_a_token_file_that_disagrees_with_its_manifest(reference, corpus, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    write_chain(run, chain_records(run)[:24])        # killed at step 23: resume from checkpoint 20
    for step, path in rundir.Run(run).checkpoints():
        if step > 20:
            path.unlink()
    before = snapshot(run)
    result = call(train.main, train_args(run, poisoned_copy(corpus, tmp_path / "bad")))
    assert one_line_error(result, "train.py") and "does not match its leaf" in result[2], result
    kept = lambda files: {k: v for k, v in files.items() if k not in ("train.log", "lock")}  # noqa: E731
    assert kept(snapshot(run)) == kept(before)


# ----------------------------------------------------------------------------- 2. receipts
@pytest.fixture(scope="module")
def step13(reference):
    """The audit that replayed step 13 (from checkpoint 10): audit.Audit.receipt makes its receipts."""
    a = audit.Audit(str(reference))
    a.replay(13, 13)
    return a


@pytest.fixture(scope="module")
def honest(step13):
    """The honest receipt of step 13 by ZERO_KEY, unsigned (receipts.judge checks proofs;
    check_receipts, which checks signatures too, sees it unsigned)."""
    return step13.receipt(13, ZERO_KEY, {})


def publisher(run):
    secret = receipts.read_secret(run, "")
    return lambda step: receipts.salt(secret, step)


def judge(run, receipt):
    """(status, reason) of a receipt's proofs against the run's chain, checked with its secret."""
    chain = rundir.Run(run).chain
    chain.verify()
    return receipts.judge(receipt, chain, publisher(run))


def test_a_receipt_needs_the_update_not_only_the_gradient(reference, honest):
    assert judge(reference, honest) == ("accepted", "")
    # The lazy auditor: the gradient computed exactly (grad_root right), the update skipped. Its
    # best result_root is the pre-step state's keyed root under grad_root.
    before, after = audit.Audit(str(reference)), audit.Audit(str(reference))
    before.replay(12, 12)
    after.replay(13, 13)
    run, blob = receipts.run_id(before.run.genesis), signing.parse_public_key(ZERO_KEY)[1]
    lazy_root = hashchain.keyed_state_root(after.replayed[13][1], before.state.tensors())
    status, reason = judge(reference, {**honest, "result": receipts.result_proof(run, 13, False, blob, lazy_root)})
    assert status == "rejected" and "the update was skipped" in reason


def test_a_receipt_names_the_record_it_audited(reference, honest, tmp_path):
    run = copy_run(reference, tmp_path / "rewritten")
    records = chain_records(run)
    records[5]["loss"] += 1.0                        # history rewritten and resealed afterwards
    write_chain(run, reseal(records))
    status, reason = judge(run, honest)
    assert status == "rejected" and "another record of this step" in reason


def test_a_swapped_step_commit_is_a_mismatch_wherever_the_salt_is_known(reference, tmp_path):
    """Record 12's step_commit replaced by record 13's and the chain resealed: a replay of 11..13
    names it at step 12 in the publisher's run directory (the run's secret) and, elsewhere, with
    the revealed salts (--salts); without either it cannot, and its MATCH line says so."""
    salts = tmp_path / "salts.json"
    assert call(audit.main, ["--run_dir", reference, "--reveal_salts", "11:13", "--out", salts])[0] == 0
    code, out, err = call(audit.main, ["--run_dir", reference, "--range", "11:13"])
    assert code == 0 and out.startswith("MATCH: steps 11..13") and "; step_commit checked\n" in out, out + err
    run = copy_run(reference, tmp_path / "run")
    records = chain_records(run)
    records[12]["step_commit"] = records[13]["step_commit"]
    write_chain(run, reseal(records))
    secret = run / receipts.SECRET
    kept = secret.read_bytes()
    secret.unlink()
    code, out, err = call(audit.main, ["--run_dir", run, "--range", "11:13"])
    assert code == 0 and "; step_commit not checked: no secret or salt\n" in out, out + err
    assert step_12_mismatch(call(audit.main, ["--run_dir", run, "--range", "11:13", "--salts", salts]))
    secret.write_bytes(kept)
    assert step_12_mismatch(call(audit.main, ["--run_dir", run, "--range", "11:13"]))


def step_12_mismatch(result):
    """The audit's result exits 1 with MISMATCH lines at step 12 only, the first naming step_commit."""
    code, out, err = result
    found = [line for line in out.splitlines() if line.startswith("MISMATCH")]
    assert code == 1 and found and all(line.startswith("MISMATCH at step 12: ") for line in found), out + err
    return "step_commit" in found[0]


def test_a_resume_under_another_secret_is_refused(reference, corpus, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    write_chain(run, chain_records(run)[:21])        # killed right after checkpoint 20
    for step, path in rundir.Run(run).checkpoints():
        if step > 20:
            path.unlink()
    (run / "secret").write_bytes(bytes(32))
    before = snapshot(run)
    result = call(train.main, train_args(run, corpus))
    assert one_line_error(result, "train.py") and "secret_commit" in result[2], result
    assert snapshot(run)["chain.jsonl"] == before["chain.jsonl"]


@pytest.mark.parametrize("line", ["  ssh-ed25519 AAAA", "x" * 65 + " KEY", "al*ce KEY", "alice\x1b[2K KEY",
                                  'alice namespaces="git" KEY', "alice KEY\nalice KEY"])
def test_a_roster_name_is_checked(reference, keys, tmp_path, line):
    """Names come from the roster only: a name that is not 1..64 plain characters, a line with
    options, a name listed twice: one line, exit 2."""
    key = " ".join((keys["alice"].parent / "alice.pub").read_text().split()[:2])
    (tmp_path / "roster").write_text(line.replace("KEY", key) + "\n")
    (tmp_path / "r").mkdir()
    result = call(audit.main, ["--run_dir", reference, "--coverage", tmp_path / "r", "--roster", tmp_path / "roster"])
    assert one_line_error(result, "audit.py") and "--roster" in result[2], result


def test_names_paths_and_findings_are_printed_escaped(reference, step13, honest, keys, tmp_path):
    def by(name, **changes):
        signer = signing.Signer(keys[name])
        return json.dumps(receipts.sign_receipt({**step13.receipt(13, signer.public_key, {}), **changes}, signer))

    forged = tmp_path / "receipts"
    forged.mkdir()
    (forged / "a.json").write_text(json.dumps({**honest, "signer": "x\naccepted  /fake: step 3 by bob"}))
    (forged / "b.json").write_text(by("carol", verdict="MISMATCH", findings=["x\naccepted  /fake: step 4 by bob"]))
    (forged / "c\naccepted  fake.json").write_text(by("dave"))
    code, out, _ = call(audit.main, ["--run_dir", reference, "--check_receipts", forged])
    assert code == 2 and "/fake" in out, out
    assert [line.split()[0] for line in out.splitlines()] == ["malformed", "rejected", "accepted", "receipts"], out


# ----------------------------------------------------------------------------- 3. readers never write
def data_py(argv):
    return data.main(argv)


def output_cases(run, out, key):
    """(option given, argv) of every output path of every reading tool, aimed at the run."""
    chain, ckpt = run / "chain.jsonl", rundir.checkpoint_path(run / "checkpoints", 10)
    (out / "chain_link").symlink_to(chain)
    os.link(chain, out / "chain_hard")
    os.link(run / "train.log", out / "log_hard")
    (out / "run_link").symlink_to(run)
    step = ["--run_dir", run, "--step", 3]
    return [
        ("--trace", (audit.main, step + ["--trace", chain])),
        ("--trace", (audit.main, step + ["--trace", ckpt])),
        ("--trace", (audit.main, step + ["--trace", out / "chain_link"])),
        ("--trace", (audit.main, step + ["--trace", out / "chain_hard"])),
        ("--trace", (audit.main, step + ["--trace", out / "run_link" / "new.jsonl"])),
        ("--receipt", (audit.main, step + ["--receipt", run / "r.json", "--key", key])),
        ("--receipt", (audit.main, step + ["--receipt", out / "log_hard", "--key", key])),
        ("--out", (audit.main, ["--run_dir", run, "--reveal_salts", "1:2", "--out", run / "s.json"])),
        ("--out", (audit.main, ["--run_dir", run, "--reveal_salts", "1:2", "--out", out / "chain_hard"])),
        ("--out", (audit.main, ["--run_dir", run, "--materialize", 3, "--out", run / "pub"])),
        ("--out", (audit.main, ["--run_dir", run, "--reveal_unit", "3:update", "--out", out / "run_link" / "pub"])),
        ("--out", (report.main, ["--run_dir", run, "--out", run / "report.html"])),
        ("--out", (report.main, ["--run_dir", run, "--out", out / "log_hard"])),
        ("--data_dir", (data_py, ["--bundle", "--step", 3, "--run_dir", run, "--data_dir", run / "b"])),
        ("--data_dir", (data_py, ["--bundle", "--step", 3, "--run_dir", run,
                                        "--data_dir", out / "run_link" / "checkpoints" / "b"])),
    ]


def test_every_output_of_every_reader_is_refused_inside_the_run(reference, keys, tmp_path):
    # Every option that names a file audit.py writes is checked; the others name inputs.
    written = {a.dest for a in audit.parser()._actions if a.metavar in ("FILE", "PATH")} - \
        {"salts", "anchors", "state", "units"}
    assert written == set(audit.OUTPUT_OPTIONS)
    run = copy_run(reference, tmp_path / "run")
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(run)
    for option, (main, argv) in output_cases(run, out, keys["alice"]):
        result = call(main, argv)
        prog = {audit.main: "audit.py", report.main: "report.py"}.get(main, "data.py")
        assert one_line_error(result, prog) and option in result[2], (argv, result)
        assert snapshot(run) == before, argv


# ----------------------------------------------------------------------------- 4. hostile input
def test_a_token_id_beyond_the_vocabulary_is_one_line(corpus, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(corpus, bad)
    tokens = np.fromfile(bad / "train.bin", "<u2")
    tokens[::7] = 300                                # the byte tokenizer has 256 tokens
    prepared = prepare.ChunkHasher                  # recompute the manifest as a publisher would
    manifest = json.loads((bad / "manifest.json").read_text())
    rec = manifest["splits"]["train"]
    fold, leaves = hashchain.MerkleFold(), []
    hasher = prepared(rec["chunks"]["bytes"], lambda leaf: (leaves.append(leaf), fold.push(leaf)))
    hasher.update(tokens.tobytes())
    rec["sha256"], rec["chunks"]["root"] = hasher.finish(), fold.root()
    (bad / "train.bin").write_bytes(tokens.tobytes())
    (bad / "train.leaves").write_bytes(b"".join(leaves))
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="token id 300"):
        TokenData(str(bad), seed=0).window("train", 1, 0, 2, 16)
    result = call(train.main, train_args(tmp_path / "run", bad))
    assert one_line_error(result, "train.py") and "token id 300" in result[2], result


@contextlib.contextmanager
def no_hang(seconds=20):
    def hung(*_):
        raise AssertionError("hung")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def bundle(reference, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "b3"
    run = rundir.Run(reference)
    prepare.write_bundle(str(out), run, TokenData(run.recorded_data_dir(), run.cfg.seed), 3)
    return out


@pytest.mark.parametrize("what", ["fifo", "deep"])
def test_hostile_manifest_bundle_and_anchors(corpus, bundle, reference, tmp_path, what):
    def hostile(path):
        path.unlink(missing_ok=True)
        if what == "fifo":
            os.mkfifo(path)
        else:
            path.write_text("[" * 100000 + "]" * 100000)

    c, b = tmp_path / "c", tmp_path / "b"
    shutil.copytree(corpus, c)
    shutil.copytree(bundle, b)
    hostile(c / "manifest.json")
    hostile(b / "bundle.json")
    with no_hang():
        for d in (c, b):
            with pytest.raises(DataError):
                TokenData(str(d), seed=0)
        hostile(tmp_path / "anchors.jsonl")
        assert one_line_error(call(audit.main, ["--run_dir", reference, "--anchors", tmp_path / "anchors.jsonl"]),
                              "audit.py")
        run = tmp_path / "run"
        run.mkdir()
        hostile(run / "anchors.jsonl")
        if what == "fifo":                           # the trainer's own file: bad input, no hang
            with pytest.raises(config.UsageError, match="not a regular file"):
                receipts.append_anchor(run, 10, "a" * 64)
        else:                                        # garbage in it never stops the trainer
            receipts.append_anchor(run, 10, "a" * 64)
            assert [json.loads(line)["step"] for line in (run / "anchors.jsonl").read_text().splitlines()] == [10]


@pytest.mark.parametrize("key", ["\u00b2", "\u0661", "01", "-1"])
def test_a_bundle_chunk_key_must_be_ascii_digits(bundle, tmp_path, key):
    b = tmp_path / "b"
    shutil.copytree(bundle, b)
    index = json.loads((b / "bundle.json").read_text())
    proofs = index["chunks"]["train"]
    proofs[key] = proofs.pop("0")
    (b / "bundle.json").write_text(json.dumps(index))
    with pytest.raises(DataError, match="is not a chunk"):
        TokenData(str(b), seed=0)


@pytest.mark.parametrize("argv", [["--auditors", 10**12], ["--auditors", 10**30],
                                  ["--auditors", 4, "--redundancy", 10**30]])
def test_plan_sizes_are_range_checked(reference, argv):
    result = call(audit.main, ["--run_dir", reference, "--plan", *argv])
    assert one_line_error(result, "audit.py") and "--auditors" in result[2], result


def test_the_trainers_anchors_tolerate_a_blank_or_torn_tail(reference, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    text = (run / "anchors.jsonl").read_text() if (run / "anchors.jsonl").exists() else ""
    for tail in ("\n", "\n\n", '{"step": 2', "garbage\n", "\udcff\n"):
        (run / "anchors.jsonl").write_bytes((text + tail).encode("utf-8", "surrogateescape"))
        receipts.append_anchor(run, 40, "b" * 64)
        lines = (run / "anchors.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in lines][-1] == 40
        assert receipts.read_anchors(run / "anchors.jsonl")[-1]["step"] == 40


def test_a_starting_trainer_removes_every_temp_file(tmp_path):
    ckpts = rundir.checkpoint_dir(tmp_path / "run")
    ckpts.mkdir(parents=True)
    names = [".step_00000010.safetensors.tmp-1", ".step_00000010.safetensors.tmp-0123456789ab",
             ".step_00000020.safetensors.tmp123", "step_00000000.safetensors"]
    for name in names:
        (ckpts / name).write_bytes(b"x")
    lock = rundir.hold_lock(tmp_path / "run")
    lock.close()
    assert sorted(os.listdir(ckpts)) == ["step_00000000.safetensors"]


@pytest.mark.parametrize("arg, named", [("--lr=1e9", "--lr=1000000000.0"), ("--weight_decay=1e4", "--weight_decay=10000.0"),
                                        ("--n_head=3", "--n_head=3")])
def test_a_refusal_names_the_option_given(arg, named):
    cfg = config.parse_config(TINY + [arg])
    with pytest.raises(config.UsageError, match=named.replace(".", r"\.")):
        config.validate(cfg)


def test_a_trace_fifo_and_sample_sizes(reference, tmp_path):
    os.mkfifo(tmp_path / "trace.jsonl")
    with no_hang():
        result = call(optrace.main, [tmp_path / "trace.jsonl", tmp_path / "trace.jsonl"])
    assert one_line_error(result, "optrace.py") and "not a regular file" in result[2], result
    for argv in (["--tokens", 10**12], ["--temperature", "inf"]):
        assert one_line_error(call(sample.main, ["--run_dir", reference, *argv]), "sample.py")


# ----------------------------------------------------------------------------- 5. audit units
# A run with unit commitments (tests/unit_runs.py: N = 3, 8 steps, checkpoints 0, 4, 8) whose
# step STEP a dishonest trainer tampered with in one piece, revealing what it committed to:
# exactly the unit that holds the lie reports it, by name, and every other unit gives MATCH.


@pytest.fixture(scope="module")
def unit_run(corpus, tmp_path_factory):
    return train_in_process(tmp_path_factory.mktemp("units") / "run", corpus)


def dishonest(corpus, base, tampering):
    """Train the unit run under `tampering` (monkeypatches) and audit every unit of STEP from
    the reveals the trainer makes under the same tampering; {unit: findings} of the mismatches."""
    with patched(*tampering):
        run = train_in_process(base / "run", corpus)
        reveal_every_unit(run, STEP, corpus, base / "pub")
    return run, mismatches(audit_every_unit(run, STEP, corpus, base / "pub", reveal=False))


def test_data_changed_in_one_micro_batch_is_caught_by_that_micro_batch(corpus, keys, tmp_path):
    true_batch = TokenData.micro_batch

    def injected(self, split, step, micro, *args):
        x, y = true_batch(self, split, step, micro, *args)
        return (x.flip(-1).contiguous(), y.flip(-1).contiguous()) if (split, step, micro) == ("train", STEP, 1) else (x, y)

    run, found = dishonest(corpus, tmp_path, [(TokenData, "micro_batch", injected)])
    assert list(found) == ["micro_batch:1"] and found["micro_batch:1"][0].startswith("field loss differs"), found
    code, out, err = call(audit.main, ["--run_dir", run, "--data_dir", corpus, "--step", STEP, "--micro_batch", 1,
                                       "--revealed", unit_dir(tmp_path / "pub", "micro_batch:1"),
                                       "--receipt", tmp_path / "r.json", "--key", keys["alice"]])
    assert code == 1 and out.startswith(f"MISMATCH at step {STEP}, micro-batch 1: field loss differs"), out + err
    receipt = json.loads((tmp_path / "r.json").read_text())
    assert receipt["verdict"] == "MISMATCH" and receipt["findings"][0] == out.splitlines()[0], receipt


def test_a_tampered_fold_node_is_caught_by_that_fold_node(corpus, tmp_path):
    true_gradient, true_fold, seen = train.micro_batch_gradient, treefold.Fold, {}

    def gradient(state, data, cfg, step, micro, *args):
        seen["step"] = step
        return true_gradient(state, data, cfg, step, micro, *args)

    def tampering_fold(*args, observe=None, **kwargs):
        def nudged(lo, size, t):
            if (seen["step"], lo, size) == (STEP, 0, 2):
                t.view(-1)[5] = 0.125                    # one element of the sum, after the add
            if observe:
                observe(lo, size, t)
        return true_fold(*args, observe=nudged, **kwargs)

    _, found = dishonest(corpus, tmp_path, [(train, "micro_batch_gradient", gradient),
                                            (treefold, "Fold", tampering_fold)])
    assert list(found) == ["fold:0:2"] and found["fold:0:2"][0].startswith("field digest differs"), found


def test_a_nudged_update_is_caught_by_the_update(corpus, tmp_path):
    true_update = train.update

    def nudged(state, cfg, sums):
        fields = true_update(state, cfg, sums)
        if state.step == STEP:
            with torch.no_grad():
                state.params["norm"].view(-1)[0] = 0.5
        return fields

    _, found = dishonest(corpus, tmp_path, [(train, "update", nudged)])
    assert list(found) == ["update"] and found["update"][0].startswith("field state_hash: the state hash differs from the update"), found


def test_a_units_root_resealed_after_the_fact(unit_run, corpus, tmp_path):
    """A publisher who swaps a micro-batch's digest in step STEP's unit list and reseals
    units_root and the chain: every receipt of the step made before names another record; on
    the new chain the micro-batch's audit reports the digest, and the fold node above it cannot
    be served (no tensor the publisher can reveal matches the forged digest)."""
    before = audit_every_unit(unit_run, STEP, corpus, tmp_path / "pub")
    assert mismatches(before) == {}
    run = copy_run(unit_run, tmp_path / "run")
    entries = units.read_list(units.list_path(run, STEP), STEP)
    entries[1]["digest"] = entries[0]["digest"]
    units.write_list(units.list_path(run, STEP), STEP, entries)
    records = chain_records(run)
    records[STEP]["units_root"] = units.root([units.entry_leaf(STEP, e) for e in entries])
    write_chain(run, reseal(records))
    chain = rundir.Run(run).chain
    chain.verify()
    for unit, a in before.items():
        status, reason = receipts.judge(a.receipt(ZERO_KEY, {}, {}, train.code_digest()), chain,
                                        publisher(run), lambda s: None, lambda *_: None)
        assert status == "rejected" and "another record of this step" in reason, unit
    found = mismatches(audit_every_unit(run, STEP, corpus, tmp_path / "pub2"))
    assert sorted(found) == ["fold:0:2", "micro_batch:1"], found
    assert found["micro_batch:1"][0].startswith("field digest differs"), found
    assert found["fold:0:2"][0].startswith("the revealed micro_batch:1") and "does not match its commitment" in found["fold:0:2"][0]


def test_a_lazy_micro_batch_receipt_is_rejected(unit_run, corpus, tmp_path):
    """The commitment c_m or the public digest copied into a micro-batch receipt (or the proof of
    either for the auditor's key), no replay."""
    entry = units.read_list(units.list_path(unit_run, STEP), STEP)[2]
    chain = rundir.Run(unit_run).chain
    lists = lambda s: units.check_list(units.read_list(units.list_path(unit_run, s), s), s, 3,  # noqa: E731
                                       chain.records[s]["units_root"])
    run, blob = receipts.run_id(chain.records[0]), signing.parse_public_key(ZERO_KEY)[1]
    for copied in (entry["commit"], entry["digest"]):
        for witness in (copied, receipts.witness_proof(run, STEP, 2, blob, bytes.fromhex(copied))):
            lazy = receipts.make_receipt(chain.records[0], chain.records[STEP], "micro_batch:2", {"witness": witness},
                                         ZERO_KEY, {}, {}, train.code_digest(), chain.records[0]["data_manifest"], [])
            status, reason = receipts.judge(lazy, chain, publisher(unit_run), lists, lambda *_: None)
            assert status == "rejected" and "does not open the micro-batch's commitment" in reason


def test_revealed_tensors_that_do_not_match_the_chain(unit_run, corpus, keys, tmp_path):
    """A child revealed for a fold audit that is not the committed one, and a state tensor that is
    not the record's: each is caught before use by the audit it is handed to."""
    pub = unitaudit.Publisher(unit_run, str(corpus))
    for unit in ("fold:0:3", "micro_batch:0"):
        pub.reveal(STEP, unit, unit_dir(tmp_path, unit))
    child = units.unit_file(unit_dir(tmp_path, "fold:0:3"), STEP, "fold:0:2")
    tensors, meta = rundir.load_checkpoint(child)
    tensors["fold:0:2"][7] = 1.0
    rundir.save_checkpoint(child, tensors, meta)
    state = units.state_file(unit_dir(tmp_path, "micro_batch:0"), STEP - 1, params_only=True)
    tensors, meta = rundir.load_checkpoint(state)
    tensors["params.layers.1.wo"][0, 0] = 1.0
    rundir.save_checkpoint(state, tensors, meta)
    fold = unitaudit.UnitAudit(str(unit_run), STEP)
    fold.fold(0, 3, unit_dir(tmp_path, "fold:0:3"))
    assert [f.split(" (")[0] for f in fold.findings] == ["the revealed fold:0:2"] and \
        "does not match its commitment" in fold.findings[0]
    micro = unitaudit.UnitAudit(str(unit_run), STEP, str(corpus))
    micro.micro_batch(0, directory=unit_dir(tmp_path, "micro_batch:0"))
    assert len(micro.findings) == 1 and "tensor 'params.layers.1.wo' differs from its leaf" in micro.findings[0]
    assert micro.receipt(ZERO_KEY, {}, {}, train.code_digest()) is None
    for unit, option in (("fold:0:3", ["--fold_node", "0:3"]), ("micro_batch:0", ["--micro_batch", 0])):
        code, out, err = call(audit.main, ["--run_dir", unit_run, "--data_dir", corpus, "--step", STEP, *option,
                                           "--revealed", unit_dir(tmp_path, unit), "--receipt", tmp_path / "r.json",
                                           "--key", keys["alice"]])
        where = unitaudit.label(unit)
        assert code == 1 and out.startswith(f"MISMATCH at step {STEP}, {where}: the "), out + err
        assert f"receipt: none written, the audit of {where} stopped before its proof" in out, out
    assert not (tmp_path / "r.json").exists()


# ----------------------------------------------------------------------------- 6. round four (issue 61)
def signed_unit_receipt(run, unit, key, revealed, corpus):
    """The signed receipt (dict) of `unit` of step STEP of `run`, audited from `revealed` with `key`."""
    a = unitaudit.UnitAudit(str(run), STEP, str(corpus))
    kind, *where = units.parse(unit, 3)
    {"micro_batch": lambda: a.micro_batch(where[0], directory=revealed), "fold": lambda: a.fold(*where, revealed),
     "update": lambda: a.update(revealed)}[kind]()
    signer = signing.Signer(key)
    return receipts.sign_receipt(a.receipt(signer.public_key, {}, {}, train.code_digest()), signer)


def check_dir(run, receipts_dir, revealed=None, roster=None):
    """receipts.check_receipts of receipts_dir on `run` as audit.py does it (the run's secret)."""
    opened = rundir.Run(run)
    opened.chain.verify()
    return receipts.check_receipts(receipts_dir, opened.chain, publisher(run), *unitaudit.judging(opened, revealed),
                                   signing.read_roster(roster) if roster else None)


def test_a_copied_receipt_relabelled_is_refused_and_counts_once(unit_run, corpus, keys, tmp_path):
    """Alice's micro-batch receipt, copied by Bob: with his key as signer and her signature it is
    unsigned; re-signed by him, its proof (bound to her key) is refused. --coverage counts one key
    for the one replay (main: two auditor names for one replay)."""
    pub = tmp_path / "pub"
    unitaudit.Publisher(unit_run, str(corpus)).reveal(STEP, "micro_batch:1", pub)
    alice = signed_unit_receipt(unit_run, "micro_batch:1", keys["alice"], pub, corpus)
    bob = signing.Signer(keys["bob"])
    relabelled = {**alice, "signer": bob.public_key}
    resigned = receipts.sign_receipt({k: v for k, v in relabelled.items() if k != "signature"}, bob)
    rdir = tmp_path / "r"
    rdir.mkdir()
    for name, r in (("alice", alice), ("relabelled", relabelled), ("resigned", resigned)):
        receipts.write_receipt(rdir / f"{name}.json", r)
    roster = write_roster(tmp_path / "roster", keys, ["alice", "bob"])
    found = {os.path.basename(r.path): r for r in check_dir(unit_run, rdir, roster=roster)}
    assert found["alice.json"].counted and found["alice.json"].name == "alice"
    assert found["relabelled.json"].status == "unsigned", found["relabelled.json"]
    assert found["resigned.json"].status == "rejected" and "under its signer key" in found["resigned.json"].reason
    code, out, err = call(audit.main, ["--run_dir", unit_run, "--coverage", rdir, "--roster", roster,
                                       "--steps", f"{STEP}:{STEP}", "--redundancy", 2])
    assert code == 1 and "units with fewer than 2: 6: micro_batch 0-2, fold 0:2 0:3, update" in out, out + err
    covered = receipts.covered(list(found.values()), rundir.Run(unit_run).chain, STEP, STEP)
    assert covered[STEP]["micro_batch:1"] == {keys_line(keys, "alice")}


def keys_line(keys, name):
    return " ".join((keys[name].parent / f"{name}.pub").read_text().split()[:2])


def test_a_receipt_moved_to_another_run_is_refused(unit_run, corpus, keys, tmp_path):
    """A second run under the same secret whose state before STEP is the same (only max_steps
    differs, and both are in the warmup): Alice's micro-batch receipt relabelled for it (its run
    and record hash) and re-signed by her is refused there, its proof being bound to her run."""
    other = train_in_process(share_secret(unit_run, tmp_path / "other"), corpus, "--max_steps=9")
    mine, theirs = chain_records(unit_run), chain_records(other)
    assert mine[STEP - 1]["state_hash"] == theirs[STEP - 1]["state_hash"] and mine[0]["record_hash"] != theirs[0]["record_hash"]
    pub = tmp_path / "pub"
    unitaudit.Publisher(unit_run, str(corpus)).reveal(STEP, "micro_batch:0", pub)
    alice_receipt = signed_unit_receipt(unit_run, "micro_batch:0", keys["alice"], pub, corpus)
    alice = signing.Signer(keys["alice"])
    moved = {k: v for k, v in alice_receipt.items() if k != "signature"}
    moved.update(run=theirs[0]["record_hash"], record_hash=theirs[STEP]["record_hash"])
    rdir = tmp_path / "r"
    rdir.mkdir()
    receipts.write_receipt(rdir / "moved.json", receipts.sign_receipt(moved, alice))
    receipts.write_receipt(rdir / "original.json", alice_receipt)
    found = {os.path.basename(r.path): r for r in check_dir(other, rdir)}
    assert found["moved.json"].status == "rejected" and "made for another key or run" in found["moved.json"].reason
    assert found["original.json"].status == "rejected" and "another run" in found["original.json"].reason


def test_the_update_shortcut_from_a_public_checkpoint_is_not_counted(unit_run, corpus, keys, tmp_path):
    """At step 8, whose post-step state is a public checkpoint, the update's receipt can be made
    from the revealed S without running AdamW: mean, clip and the checkpoint's keyed root. It is
    accepted (no proof can tell it from an honest one), so coverage counts the update of such a
    step for no one and lists it apart; at STEP, whose state is not public, the update counts."""
    step = 8
    pub = tmp_path / "pub"
    unitaudit.Publisher(unit_run, str(corpus)).reveal(step, "update", pub)
    S = rundir.load_checkpoint(units.unit_file(pub, step, "fold:0:3"))[0]["fold:0:3"]
    mean = repops.ops.scale(S, repops.f32(1.0 / 3))
    grad, _ = repops.clip_grad(mean[:-1], rundir.Run(unit_run).cfg.grad_clip)
    after, _ = rundir.load_checkpoint(rundir.checkpoint_path(unit_run / "checkpoints", step))
    lazy_root = hashchain.keyed_state_root(hashchain.tensor_leaf("grad", grad), after)
    chain = rundir.Run(unit_run).chain
    mallory = signing.Signer(keys["mallory"])
    lazy = receipts.make_receipt(chain.records[0], chain.records[step], "update",
                                 {"result": receipts.result_proof(receipts.run_id(chain.records[0]), step, True,
                                                                  mallory.blob, lazy_root)},
                                 mallory.public_key, {}, {}, train.code_digest(), chain.records[0]["data_manifest"], [])
    rdir = tmp_path / "r"
    rdir.mkdir()
    receipts.write_receipt(rdir / "lazy_update.json", receipts.sign_receipt(lazy, mallory))
    roster = write_roster(tmp_path / "roster", keys, ["mallory"])
    [result] = check_dir(unit_run, rdir, roster=roster)
    assert result.status == "accepted" and result.counted            # byte for byte an honest proof
    public = unitaudit.public_states(rundir.Run(unit_run), pub)
    assert step in public and STEP not in public
    covered = receipts.covered([result], chain, STEP, step, public)
    assert "update" not in covered[step] and "update" in covered[STEP]
    code, out, err = call(audit.main, ["--run_dir", unit_run, "--coverage", rdir, "--roster", roster,
                                       "--steps", f"{STEP}:{step}", "--redundancy", 1])
    assert "updates not provable by a receipt (post-step state public: steps 8): not counted" in out, out + err


def test_an_assembled_step_receipt_covers_no_fold_node(unit_run, corpus, keys, tmp_path):
    """A whole-step receipt assembled from the three micro-batch proofs and the update's proof of
    one auditor, who formed no sum: accepted (its proofs are true), it covers the micro-batches and
    the update, and no fold node (main: every unit of the step, a lying fold node included)."""
    pub, alice = tmp_path / "pub", signing.Signer(keys["alice"])
    publisher_ = unitaudit.Publisher(unit_run, str(corpus))
    parts = {}
    for unit in ("micro_batch:0", "micro_batch:1", "micro_batch:2", "update"):
        publisher_.reveal(STEP, unit, unit_dir(pub, unit))
        parts[unit] = signed_unit_receipt(unit_run, unit, keys["alice"], unit_dir(pub, unit), corpus)
    chain = rundir.Run(unit_run).chain
    assembled = receipts.make_receipt(chain.records[0], chain.records[STEP], "step",
                                      {"witnesses": [parts[f"micro_batch:{m}"]["witness"] for m in range(3)],
                                       "result": parts["update"]["result"]}, alice.public_key, {}, {},
                                      train.code_digest(), chain.records[0]["data_manifest"], [])
    rdir = tmp_path / "r"
    rdir.mkdir()
    receipts.write_receipt(rdir / "step.json", receipts.sign_receipt(assembled, alice))
    [result] = check_dir(unit_run, rdir, roster=write_roster(tmp_path / "roster", keys, ["alice"]))
    assert result.status == "accepted" and result.counted, result
    covered = receipts.covered([result], chain, STEP, STEP)[STEP]
    assert {u for u, k in covered.items() if k} == {"micro_batch:0", "micro_batch:1", "micro_batch:2", "update"}
    assert covered["fold:0:2"] == covered["fold:0:3"] == set()


def test_a_link_planted_under_a_writers_temp_name_is_never_followed(unit_run, corpus, tmp_path, monkeypatch):
    """--reveal_unit S:U --out D wrote its unit list through the fixed temp name
    .step_<S>.units.json.tmp (open(): a link there was followed; main overwrote the run's
    chain.jsonl). Links planted under that name, and under the random name the writer will draw,
    leave the link's target untouched: the writer opens its temp file O_EXCL | O_NOFOLLOW."""
    run = copy_run(unit_run, tmp_path / "run")
    out = tmp_path / "out"
    out.mkdir()
    chain = (run / "chain.jsonl").read_bytes()
    (out / f".step_{STEP:08d}.units.json.tmp").symlink_to(run / "chain.jsonl")
    code, stdout, err = call(audit.main, ["--run_dir", run, "--data_dir", corpus, "--reveal_unit", f"{STEP}:micro_batch:0",
                                          "--out", out])
    assert code == 0, stdout + err
    assert (run / "chain.jsonl").read_bytes() == chain and units.list_file(out, STEP).is_file()
    victim = tmp_path / "victim"
    victim.write_bytes(b"kept")
    monkeypatch.setattr(os, "urandom", lambda n: bytes(n))         # the writer's next temp name, known
    target = out / "receipt.json"
    (out / f".{target.name}.tmp-{bytes(6).hex()}").symlink_to(victim)
    with pytest.raises(config.UsageError, match="cannot write the receipt"):
        receipts.write_receipt(target, {"format": "x"})
    assert victim.read_bytes() == b"kept" and not target.exists()


def test_a_link_planted_under_a_corpus_temp_name_is_never_followed(tmp_path, monkeypatch):
    """prepare (python data.py) wrote the token files, their leaves and the manifest through the
    fixed temp names <file>.tmp<pid> opened with open(): links planted under them were followed,
    and their targets overwritten with tokens. Now: links under the old names are left alone and
    the corpus is written; links under the random names the writers draw (made known here) are
    never opened, and the preparation stops without touching their targets."""
    text = tmp_path / "in.txt"
    text.write_text("the king and the queen\n" * 200)
    out = tmp_path / "corpus"
    out.mkdir()
    names = ("train.bin", "val.bin", "train.leaves", "val.leaves", "manifest.json")
    victims = {name: tmp_path / f"victim-{name}" for name in names}
    for name, victim in victims.items():
        victim.write_bytes(b"kept")
        (out / f"{name}.tmp{os.getpid()}").symlink_to(victim)
    prepare.prepare([str(text)], str(out))
    assert all(v.read_bytes() == b"kept" for v in victims.values())
    assert all((out / name).is_file() and not (out / name).is_symlink() for name in names)
    fresh = tmp_path / "fresh"
    monkeypatch.setattr(os, "urandom", lambda n: bytes(n))         # the writers' temp names, known
    for name, victim in victims.items():
        fresh.mkdir(exist_ok=True)
        planted = fresh / f".{name}.tmp-{bytes(6).hex()}"
        planted.symlink_to(victim)
        with pytest.raises(FileExistsError):
            prepare.prepare([str(text)], str(fresh))
        planted.unlink(missing_ok=True)
        assert victim.read_bytes() == b"kept", name
    assert not [p for p in fresh.iterdir() if p.name.startswith(".")]      # no temp file left behind


def test_a_link_planted_under_an_imports_temp_name_is_never_followed(tmp_path, monkeypatch):
    """train.py --init_from FOLDER kept the source's config.json through the fixed temp name
    source_config.json.tmp opened with open(): a link planted there in the run directory was
    followed (its target overwritten) and renamed into the run as source_config.json. Now it goes
    through hashchain.write_atomically."""
    folder, run = tmp_path / "model", tmp_path / "run"
    folder.mkdir()
    run.mkdir()
    raw = b'{"model_type": "llama"}\n'
    (folder / "config.json").write_bytes(raw)
    victim = tmp_path / "victim"
    victim.write_bytes(b"kept")
    (run / f"{hfllama.SOURCE_CONFIG}.tmp").symlink_to(victim)
    init = {"files": {"config.json": hashlib.sha256(raw).hexdigest()}}
    hfllama.keep_source_config(str(run), str(folder), init)
    kept = run / hfllama.SOURCE_CONFIG
    assert victim.read_bytes() == b"kept" and not kept.is_symlink() and kept.read_bytes() == raw
    monkeypatch.setattr(os, "urandom", lambda n: bytes(n))         # the writer's temp name, known
    kept.unlink()
    (run / f".{hfllama.SOURCE_CONFIG}.tmp-{bytes(6).hex()}").symlink_to(victim)
    with pytest.raises(FileExistsError):
        hfllama.keep_source_config(str(run), str(folder), init)
    assert victim.read_bytes() == b"kept" and not kept.exists()


@pytest.mark.parametrize("case", ["a_file", "under_a_file", "unwritable"])
def test_materialize_with_a_bad_out_is_one_line_before_any_replay(unit_run, tmp_path, case):
    """--materialize S --out F: F an existing file, a path under a file, or a folder that cannot be
    created: one line, exit 2 (main: a traceback and exit 1, MISMATCH's code), before any replay."""
    (tmp_path / "file").write_text("x")
    out = {"a_file": tmp_path / "file", "under_a_file": tmp_path / "file" / "pub",
           "unwritable": "/proc/repops/pub"}[case]
    replayed = []
    mp = pytest.MonkeyPatch()
    mp.setattr(unitaudit.Publisher, "state", lambda *a: replayed.append(a))
    try:
        result = call(audit.main, ["--run_dir", unit_run, "--materialize", STEP, "--out", out])
    finally:
        mp.undo()
    assert one_line_error(result, "audit.py") and "--out" in result[2] and not replayed, result
    assert (tmp_path / "file").read_text() == "x"
