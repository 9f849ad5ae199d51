"""Bad input and a run directory that cannot be corrupted.

- train.py validates the whole config first: each bad value gives one line `train.py: error:`,
  exit 2, and creates nothing.
- Non-finite values never reach the chain: a step whose update leaves a non-finite moment is
  refused (in-process), and the chain writer refuses NaN (tests/test_hashchain.py).
- Hostile files (FIFO, directory, deep JSON, overflowing shapes, a genesis without config or
  with a string seed) give one line and exit 2 in audit.py and sample.py, never a hang.
- One writer per run: a second train.py on the same run exits 2 naming the holder.
- Readers only read: audit.py (every mode) and sample.py leave the run directory byte for byte
  as it was, and never create its secret.
- The protocol's bad input (receipts that are not JSON or have wrong types, a receipt directory
  that does not exist, a missing secret, bad --plan arguments, an option of another mode, an
  output file inside the run, a malformed anchors or salts file) gives one line and exit 2.
- A resume with another corpus is refused; a checkpoint that fails verification is moved to
  rejected/, never overwritten.
"""
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

import audit as audit_module
import config
import hashchain
import receipts
import rundir
import train
from tiny import (ROOT, STEPS, TINY, ZERO_KEY, assert_one_line_error, audit, chain_records, copy_run, make_corpus,
                  mismatch_lines, reseal, run_process, script, start_process, stop_process, train as train_run,
                  train_args, write_chain, write_roster)


@pytest.mark.parametrize("arg", [
    "--lr=nan", "--lr=inf", "--lr=0", "--seq_len=0", "--micro_batch_size=0", "--n_head=0",
    "--d_model=30", "--seed=-1", "--threads=-2", "--beta2=1.0", "--beta1=-0.1", "--dropout=1",
    "--grad_clip=-1", "--max_steps=0", "--micro_batches=0", "--checkpoint_every=0", "--device=tpu",
    "--anchor_every=-1", "--hash_async=maybe",
    "--weight_decay=1000", "--norm_eps=nan", "--no_such_key=1", "--n_layer=two",
])
def test_train_refuses_bad_config_before_creating_anything(corpus, tmp_path, arg):
    """One line naming the key (--key=value, --key expects ..., unknown config key --key)."""
    proc = script("train.py", *train_args(tmp_path / "run", corpus), "--max_steps=1", arg)
    assert_one_line_error(proc, "train.py")
    key = arg.partition("=")[0]
    assert f"{key}=" in proc.stderr or f"{key} " in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def test_the_bad_config_commands_run_with_good_values(corpus, tmp_path):
    """Positive control of the test above: its command line without the bad value trains."""
    proc = script("train.py", *train_args(tmp_path / "run", corpus), "--max_steps=1")
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in chain_records(tmp_path / "run")] == [0, 1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="hardware: this machine has a CUDA GPU")
def test_train_refuses_cuda_without_a_gpu(corpus, tmp_path):
    proc = script("train.py", f"--run_dir={tmp_path / 'run'}", f"--data_dir={corpus}", *TINY, "--device=cuda")
    assert_one_line_error(proc, "train.py")
    assert "no CUDA GPU" in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="hardware: this machine has a CUDA GPU")
@pytest.mark.parametrize("mode", [["--step", "1"], ["--plan", "--auditors", "2"]], ids=["step", "plan"])
def test_audit_refuses_cuda_without_a_gpu(reference, mode):
    proc = script("audit.py", "--run_dir", reference, *mode, "--device", "cuda")
    assert_one_line_error(proc, "audit.py")
    assert "no CUDA GPU" in proc.stderr


def test_train_refuses_world_size_that_does_not_divide(corpus, tmp_path):
    proc = script("train.py", f"--run_dir={tmp_path / 'run'}", f"--data_dir={corpus}", *TINY,
                  env={**os.environ, "WORLD_SIZE": "3", "RANK": "0"})
    assert_one_line_error(proc, "train.py")
    assert not (tmp_path / "run").exists()


def test_train_run_dir_under_a_regular_file(corpus, tmp_path):
    (tmp_path / "file").write_text("x")
    proc = script("train.py", *train_args(tmp_path / "file" / "run", corpus))
    assert_one_line_error(proc, "train.py")


@pytest.mark.parametrize("hash_async", ["off", "on"])
def test_a_non_finite_update_is_refused_and_not_published(corpus, tmp_path, monkeypatch, hash_async):
    """The state is checked where it is hashed (snapshot.py): with the hash overlapping the next
    step too, the step that went non-finite is refused and the chain ends before it."""
    real_step = train.train_step

    def poisoned_step(state, *args, **kwargs):
        fields = real_step(state, *args, **kwargs)
        if state.step == 3:
            state.v["layers.0.wo"][0, 0] = float("inf")   # as an overflowing update would
        return fields

    monkeypatch.setattr(train, "train_step", poisoned_step)
    run = tmp_path / "run"
    cfg = config.parse_config([*train_args(run, corpus), "--max_steps=6", f"--hash_async={hash_async}"])
    with pytest.raises(train.StepRefused, match=r"step 3: .* adam_v\.layers\.0\.wo"):
        train.run(cfg, 0, 1)
    assert [r["step"] for r in chain_records(run)] == [0, 1, 2]


# ----------------------------------------------------------------------------- hostile files
def _fifo(path):
    path.unlink()
    os.mkfifo(path)


CKPT10 = r"checkpoint \S+/checkpoints/step_00000010\.safetensors"
HOSTILE = {  # damage -> what the one line must say (it names the file and what is wrong with it)
    "chain_fifo": r"chain \S+/chain\.jsonl is not a regular file",
    "chain_dir": r"chain \S+/chain\.jsonl is not a regular file",
    "checkpoint_fifo": CKPT10 + " is not a regular file",
    "checkpoint_deep_header": CKPT10 + r" has a header that is not valid JSON \(JSON nested too deeply\)",
    "checkpoint_huge_shape": CKPT10 + " has a malformed header entry for tensor 'x'",
    "genesis_without_config": r"\S+/chain\.jsonl: the genesis record has no config",
    "genesis_string_seed": r"\S+/chain\.jsonl: genesis config: seed must be int, got '1337'",
    "config_json_fifo": r"config \S+/config\.json is not a regular file",
    "none": None,            # positive control: the undamaged copy audits
}


@pytest.mark.parametrize("damage", HOSTILE)
def test_audit_hostile_files_one_line_exit_2(reference, corpus, tmp_path, damage):
    run = copy_run(reference, tmp_path / "run")
    ckpt = rundir.checkpoint_path(run / "checkpoints", 10)
    records = chain_records(run)
    if damage == "chain_fifo":
        _fifo(run / "chain.jsonl")
    elif damage == "chain_dir":
        (run / "chain.jsonl").unlink()
        (run / "chain.jsonl").mkdir()
    elif damage == "checkpoint_fifo":
        _fifo(ckpt)
    elif damage == "checkpoint_deep_header":
        deep = b"[" * 200_000 + b"]" * 200_000
        ckpt.write_bytes(len(deep).to_bytes(8, "little") + deep)
    elif damage == "checkpoint_huge_shape":
        header = json.dumps({"__metadata__": {"repops": "{}"},
                             "x": {"dtype": "F32", "shape": [2 ** 62, 0], "data_offsets": [0, 0]}}).encode()
        ckpt.write_bytes(len(header).to_bytes(8, "little") + header)
    elif damage == "genesis_without_config":
        records[0].pop("config")
        write_chain(run, records)
    elif damage == "genesis_string_seed":
        records[0]["config"]["seed"] = "1337"
        write_chain(run, records)
    elif damage == "config_json_fifo":
        _fifo(run / "config.json")
    proc = audit(run, "--step", "15", corpus=corpus)
    if HOSTILE[damage] is None:
        assert proc.returncode == 0 and "MATCH" in proc.stdout, proc.stdout + proc.stderr
        return
    assert_one_line_error(proc, "audit.py")
    assert re.fullmatch("audit.py: error: " + HOSTILE[damage], proc.stderr.strip()), proc.stderr


def test_deeply_nested_chain_line_is_a_break_not_a_crash(reference, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    lines = (run / "chain.jsonl").read_text().splitlines(keepends=True)
    lines[5] = '{"x":' + "[" * 100_000 + "]" * 100_000 + "}\n"
    (run / "chain.jsonl").write_text("".join(lines))
    proc = audit(run, "--all")
    assert proc.returncode == 1 and "MISMATCH at step 5:" in proc.stdout and "nested" in proc.stdout
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------- one writer, readers read
def snapshot(run):
    return {str(p.relative_to(run)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in sorted(run.rglob("*"))}


def test_audit_and_sample_never_write_to_the_run(reference, keys, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    (run / "checkpoints" / ".step_00000040.safetensors.tmp-0123456789ab").write_bytes(b"partial")
    lines = (run / "chain.jsonl").read_bytes()
    (run / "chain.jsonl").write_bytes(lines + b'{"torn')     # a torn tail: readers leave it
    before = snapshot(run)
    assert audit(run, "--all").returncode == 0
    assert audit(run, "--step", "12", "--receipt", tmp_path / "r" / "12.json", "--key", keys["alice"]).returncode == 0
    roster = write_roster(tmp_path / "roster", keys, ["alice"])
    for args in (["--check_receipts", tmp_path / "r"], ["--coverage", tmp_path / "r", "--redundancy", "1",
                 "--steps", "12:12", "--roster", roster], ["--reveal_salts", "1:3"],
                 ["--plan", "--auditors", "3", "--seed", "1"]):
        proc = audit(run, *args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert script("sample.py", "--run_dir", run, "--tokens", "5").returncode == 0
    assert snapshot(run) == before


def test_readers_never_create_the_secret(reference, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    (run / "secret").unlink()                    # a published copy of the run
    assert audit(run, "--step", "3").returncode == 0
    assert script("sample.py", "--run_dir", run, "--tokens", "5").returncode == 0
    assert not (run / "secret").exists()


def _receipt(run, **changes):
    """A well-formed receipt of step 3 of `run` (not a true one, unsigned), with `changes`."""
    genesis = json.loads((run / "chain.jsonl").read_text().splitlines()[0])
    return json.dumps({"format": receipts.RECEIPT_FORMAT, "run": genesis["record_hash"], "step": 3, "unit": "step",
                       "record_hash": "0" * 64, "result": "0" * 64, "signer": ZERO_KEY, "machine": {},
                       "cost": {}, "code_digest": "0" * 64, "data_manifest": "0" * 64,
                       "verdict": "MATCH", "findings": [], **changes})


@pytest.mark.parametrize("case", [
    "receipt_dir_missing", "receipt_dir_empty", "receipt_not_json", "receipt_wrong_type",
    "receipt_unknown_field", "receipt_old_format", "secret_missing_check", "secret_missing_reveal",
    "reveal_beyond_chain", "salts_not_json", "plan_without_auditors", "plan_zero_auditors",
    "plan_redundancy_above_auditors", "plan_steps_backwards", "plan_steps_beyond_chain",
    "plan_absent_not_a_fraction", "plan_with_an_audit_option", "receipt_without_key", "receipt_with_range",
    "receipt_inside_the_run", "receipt_folder_under_a_file", "receipt_is_a_folder", "coverage_without_roster",
    "roster_not_a_roster", "anchors_not_anchors",
    "anchors_empty", "step_zero",
])
def test_protocol_bad_input_one_line_exit_2(reference, keys, tmp_path, capsys, case):
    """In-process (audit.main): one `audit.py: error:` line on stderr and exit 2, nothing else
    on stderr; a malformed receipt is also listed on stdout, with the others."""
    run = copy_run(reference, tmp_path / "run")
    receipts_dir = tmp_path / "r"
    receipts_dir.mkdir()
    (tmp_path / "anchors.jsonl").write_text("")
    if case == "receipt_dir_missing":
        args = ["--check_receipts", tmp_path / "nowhere"]
    elif case == "receipt_dir_empty":
        args = ["--check_receipts", receipts_dir]
    elif case.startswith("receipt_") and case.endswith(("json", "type", "field", "format")):
        text = {"receipt_not_json": "{", "receipt_wrong_type": _receipt(run, step="3"),
                "receipt_unknown_field": _receipt(run, extra=1),
                "receipt_old_format": _receipt(run, format="repops-receipt-v3")}[case]
        (receipts_dir / "x.json").write_text(text)
        args = ["--check_receipts", receipts_dir]
    elif case.startswith("secret_missing"):
        (run / "secret").unlink()
        (receipts_dir / "x.json").write_text(_receipt(run))
        args = ["--check_receipts", receipts_dir] if case.endswith("check") else ["--reveal_salts", "1:2"]
    elif case == "reveal_beyond_chain":
        args = ["--reveal_salts", "1:99"]
    elif case == "salts_not_json":
        (receipts_dir / "x.json").write_text(_receipt(run))
        (tmp_path / "salts.json").write_text("salts")
        args = ["--check_receipts", receipts_dir, "--salts", tmp_path / "salts.json"]
    elif case.startswith("plan_"):
        args = ["--plan", *{"plan_without_auditors": [], "plan_zero_auditors": ["--auditors", "0"],
                            "plan_redundancy_above_auditors": ["--auditors", "2", "--redundancy", "3"],
                            "plan_steps_backwards": ["--auditors", "3", "--steps", "5:2"],
                            "plan_steps_beyond_chain": ["--auditors", "3", "--steps", "1:99"],
                            "plan_absent_not_a_fraction": ["--auditors", "3", "--absent", "1.5"],
                            "plan_with_an_audit_option": ["--auditors", "3", "--key", keys["alice"]]}[case]]
    elif case == "receipt_without_key":
        args = ["--step", "3", "--receipt", tmp_path / "x.json"]
    elif case == "receipt_with_range":
        args = ["--range", "1:2", "--receipt", tmp_path / "x.json", "--key", keys["alice"]]
    elif case == "receipt_inside_the_run":
        args = ["--step", "3", "--receipt", run / "x.json", "--key", keys["alice"]]
    elif case == "receipt_folder_under_a_file":     # refused before the replay, not after it
        (tmp_path / "file").write_text("")
        args = ["--step", "3", "--receipt", tmp_path / "file" / "r" / "x.json", "--key", keys["alice"]]
    elif case == "receipt_is_a_folder":
        (tmp_path / "x.json").mkdir()
        args = ["--step", "3", "--receipt", tmp_path / "x.json", "--key", keys["alice"]]
    elif case in ("coverage_without_roster", "roster_not_a_roster"):
        (receipts_dir / "x.json").write_text(_receipt(run))
        (tmp_path / "roster").write_text("alice ssh-ed25519 not-base64\n")
        args = ["--coverage", receipts_dir] + (["--roster", tmp_path / "roster"] if case == "roster_not_a_roster" else [])
    elif case == "step_zero":
        args = ["--step", "0"]
    else:
        if case == "anchors_not_anchors":
            (tmp_path / "anchors.jsonl").write_text('{"step": 1}\n')
        args = ["--anchors", tmp_path / "anchors.jsonl"]
    before = snapshot(run)
    rc = audit_module.main(["--run_dir", str(run), *map(str, args)])
    out, err = capsys.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1 and err.startswith("audit.py: error:"), (rc, out, err)
    if case in ("receipt_not_json", "receipt_wrong_type", "receipt_unknown_field", "receipt_old_format"):
        assert out.startswith(f"malformed {receipts_dir / 'x.json'}: ") and "1 malformed" in out, out
    if case == "receipt_old_format":
        assert "this code reads repops-receipt-v4 receipts only" in out, out
    if case.startswith("receipt_"):
        assert "MATCH" not in out and "audit cost" not in out, out        # nothing was replayed
    assert snapshot(run) == before and (case == "receipt_is_a_folder" or not (tmp_path / "x.json").exists())


def test_second_trainer_on_the_same_run_is_refused(corpus, tmp_path):
    run = tmp_path / "run"
    first = start_process([sys.executable, str(ROOT / "train.py"),
                           *train_args(run, corpus, "--max_steps=100000")],
                          cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        t0 = time.monotonic()
        while not (run / "chain.jsonl").exists() or (run / "chain.jsonl").stat().st_size == 0:
            assert first.poll() is None and time.monotonic() - t0 < 120, first.stderr.read()
            time.sleep(0.05)
        proc = script("train.py", *train_args(run, corpus, "--max_steps=100000"))
        assert_one_line_error(proc, "train.py")
        assert f"in use by train.py pid {first.pid}" in proc.stderr
    finally:
        stop_process(first)
        first.stderr.close()
    # The kernel released the killed holder's lock; the chain was never interleaved.
    rundir.hold_lock(run).close()
    records = chain_records(run)
    assert [r["step"] for r in records] == list(range(len(records)))


def test_resume_with_another_corpus_is_refused(reference, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    (tmp_path / "other").mkdir()
    other = make_corpus(tmp_path / "other", seed=8, lines=600)
    before = snapshot(run)
    proc = script("train.py", *train_args(run, other))
    assert_one_line_error(proc, "train.py")
    assert "resume with the same data" in proc.stderr
    after = snapshot(run)
    assert {k: v for k, v in after.items() if k != "lock"} == {k: v for k, v in before.items() if k != "lock"}


def test_resume_moves_a_bad_checkpoint_aside_and_rederives_it(reference, corpus, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    path = rundir.checkpoint_path(run / "checkpoints", STEPS)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x01                              # the last byte of the last tensor
    path.write_bytes(raw)
    train_run(run, corpus)                       # resumes from step 20, re-derives 21..30
    assert (run / "rejected" / path.name).read_bytes() == bytes(raw)
    assert path.read_bytes() == rundir.checkpoint_path(reference / "checkpoints", STEPS).read_bytes()
    assert "moved to" in (run / "train.log").read_text()


def test_resume_with_other_code_is_refused(reference, corpus, tmp_path, monkeypatch, capsys):
    """train.py resumes only with the code that started the run (its code digest, in the genesis
    record): with any other, one line, exit 2, and the run directory as it was. In-process, with
    code_digest() standing in for changed code (test_code_digest_covers_the_sources shows that
    a changed source changes it); the positive control resumes the same copy with this code."""
    run = copy_run(reference, tmp_path / "run")
    before = snapshot(run)
    real_digest = train.code_digest()
    monkeypatch.setattr(train, "code_digest", lambda: "0" * 64)
    assert train.main(train_args(run, corpus)) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"train.py: error: {run} was started by different code: its genesis code_digest is {real_digest}, "
        f"this code's is {'0' * 64}; resume it with that code, or start a new --run_dir"]
    after = snapshot(run)
    assert {k: v for k, v in after.items() if k != "lock"} == {k: v for k, v in before.items() if k != "lock"}
    proc = script("train.py", *train_args(run, corpus))          # the run is complete: nothing to do
    assert proc.returncode == 0 and "resume: from step" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert chain_records(run)[0]["code_digest"] == real_digest and len(chain_records(run)) == STEPS + 1


def test_code_digest_covers_the_sources(tmp_path):
    """The digest a copy of the code computes is this code's; editing a Python source or a kernel
    source (a comment is enough) changes it. (Importing train builds nothing.)"""
    import shutil
    for name in os.listdir(ROOT):
        if name.endswith(".py"):
            shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels")

    def digest():
        proc = run_process([sys.executable, "-c", "import train; print(train.code_digest())"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    digests = [digest()]
    assert digests[0] == train.code_digest()
    for rel in ("model.py", "kernels/cpu/matmul.cpp"):
        with open(tmp_path / rel, "a") as f:
            f.write("\n// \n" if rel.endswith(".cpp") else "\n# \n")
        digests.append(digest())
    assert len(set(digests)) == 3, digests


# ----------------------------------------------------------------------------- sizes, and memory
GiB = 1 << 30


@pytest.mark.parametrize("args", [
    ["--n_layer=1000000000"], ["--vocab_size=1099511627776"], ["--d_model=131072", "--n_head=4"],
    ["--d_hidden=1000000000000"], ["--seq_len=4294967296"], ["--micro_batch_size=10000000"],
    ["--micro_batches=4@0,2000000000@1"], ["--attn_window=" + "1" + "0" * 30], ["--max_steps=" + "1" + "0" * 30],
    ["--micro_batches=4@0,8@" + "1" + "0" * 30],
])
def test_out_of_range_sizes_are_refused_before_anything_is_allocated(corpus, tmp_path, args):
    """Every integer key has an upper bound (config.LIMITS: the model's dimensions, a phase's N
    and S, every count within int32), checked with the config: one line naming the key and the
    limit, exit 2, nothing created, under an 8 GiB address-space limit (the machine's memory is
    never at stake)."""
    proc = script("train.py", *train_args(tmp_path / "run", corpus), "--max_steps=1", *args,
                  memory=8 * GiB)
    assert_one_line_error(proc, "train.py")
    key = args[0].partition("=")[0].replace("micro_batches", "micro_batch_phases")
    assert "config.LIMITS" in proc.stderr and key in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_model_this_machine_cannot_hold_is_refused_before_it_is_allocated(corpus, tmp_path):
    """Within the limits, but not within this process's memory (here, an 8 GiB address-space
    limit): the state's size is checked before any of it is allocated (train.check_memory),
    one line, exit 2, nothing created."""
    proc = script("train.py", *train_args(tmp_path / "run", corpus), "--max_steps=1", "--vocab_size=16777216",
                  "--d_model=65536", memory=8 * GiB)
    assert_one_line_error(proc, "train.py")
    assert "not enough memory for this model on this machine" in proc.stderr, proc.stderr
    assert "GiB, and this process can hold 8.0 GiB" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_genesis_config_beyond_the_limits_is_refused_by_every_reader(reference, tmp_path):
    """A resealed genesis record declaring 10^9 layers: audit, sample and export refuse it with
    one line before they build anything (rundir.Run.cfg validates)."""
    run = copy_run(reference, tmp_path / "run")
    records = chain_records(run)
    records[0]["config"]["n_layer"] = 10 ** 9
    write_chain(run, reseal(records))
    for proc, prog in ((script("audit.py", "--run_dir", run, "--step", "1", memory=8 * GiB), "audit.py"),
                       (script("sample.py", "--run_dir", run, "--tokens", "5", memory=8 * GiB),
                        "sample.py"),
                       (script("export.py", "--run_dir", run, "--to", "hf", "--out", tmp_path / "out",
                               memory=8 * GiB), "export.py")):
        assert_one_line_error(proc, prog)
        assert "genesis config: --n_layer=1000000000 is out of range" in proc.stderr, proc.stderr


def test_a_resealed_genesis_with_a_phase_past_max_steps_is_found_at_step_0(reference, tmp_path):
    """The phase that no step takes, added to a genesis and resealed: every step still replays,
    but the published config is not the one that trained, so the audit says so at step 0."""
    run = copy_run(reference, tmp_path / "run")
    records = chain_records(run)
    records[0]["config"]["micro_batch_phases"] = f"8@{STEPS + 5}"
    write_chain(run, reseal(records))
    proc = audit(run, "--step", "1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (f"MISMATCH at step 0: genesis config: phase 8@{STEPS + 5} starts at or after max_steps {STEPS}: no step "
            "of the run takes it (a phase N@S serves steps S+1 on)") in mismatch_lines(proc), proc.stdout


def test_the_readers_run_under_an_address_space_limit(reference, tmp_path):
    """Under `ulimit -v` 12 GiB (shared clusters), audit.py and report.py read a tiny run: the
    chain is read for what it holds, never for its 16 GiB maximum."""
    proc = script("audit.py", "--run_dir", reference, "--step", "1", memory=12 * GiB)
    assert proc.returncode == 0 and "MATCH" in proc.stdout, proc.stdout + proc.stderr
    proc = script("report.py", "--run_dir", reference, "--out", tmp_path / "r.html", memory=12 * GiB)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError(
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
    "allocate 70368744177664 bytes. Error code 12 (Cannot allocate memory)")])
def test_running_out_of_memory_is_one_line_exit_2_in_every_command(reference, corpus, tmp_path, monkeypatch,
                                                                   capsys, error):
    """Never exit 1 (the audit's MISMATCH code) and never a traceback: in-process, with the
    chain's reader running out of memory."""
    import data
    import export
    import report
    import sample

    def no_memory(*args, **kwargs):
        raise error
    monkeypatch.setattr(hashchain.Chain, "load", no_memory)
    out = str(tmp_path / "out")
    for main, argv, prog in ((audit_module.main, ["--step", "1"], "audit.py"),
                             (report.main, ["--out", out], "report.py"),
                             (sample.main, ["--tokens", "5"], "sample.py"),
                             (export.main, ["--to", "hf", "--out", out], "export.py"),
                             (data.main, ["--bundle", "--step", "1", "--data_dir", out], "data.py"),
                             (train.main, train_args(tmp_path / "new", corpus), "train.py")):
        rc = main(["--run_dir", str(reference), *argv] if prog != "train.py" else argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and err[0].startswith(f"{prog}: error: not enough memory to "), (prog, rc, err)
