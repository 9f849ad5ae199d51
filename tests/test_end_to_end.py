"""End to end: train, audit, SIGKILL and resume, tampering, bad input, sampling.

Everything runs the real command-line programs (train.py, audit.py, sample.py) as
subprocesses on a tiny model and a corpus generated here. The reference run is trained once
per module; the tests that modify a run work on copies of it.
"""
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import data
import checkpoint
import hashchain
from tiny import (CKPT_EVERY, MICRO_BATCH_SIZE, MICRO_BATCHES, ROOT, SEQ_LEN, STEPS, TIMEOUT,
                  assert_one_line_error, audit, chain_records, copy_run, mismatch_lines, reseal,
                  script, share_secret, train, train_args, write_chain)

SEED = 1337   # Config's seed


def checkpoint_files(run):
    return {p.name: p.read_bytes() for p in sorted((run / "checkpoints").iterdir())}


def assert_same_chain(run, reference):
    """Byte-identical chain files; else say which record differs first, and in what."""
    mine, theirs = chain_records(run), chain_records(reference)
    for a, b in zip(mine, theirs):
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        assert not keys, f"step {a['step']} differs from the reference in {keys}"
    assert len(mine) == len(theirs)
    assert (run / "chain.jsonl").read_bytes() == (reference / "chain.jsonl").read_bytes()


# ----------------------------------------------------------------------------- training and audit
def test_reference_run_has_every_step_and_checkpoint(reference):
    records = chain_records(reference)
    assert [r["step"] for r in records] == list(range(STEPS + 1))
    assert records[0]["kind"] == "genesis"
    assert sorted(checkpoint_files(reference)) == [
        checkpoint.checkpoint_path("", s).name for s in range(0, STEPS + 1, CKPT_EVERY)]


@pytest.mark.parametrize("hash_async", ["off", "on"])
def test_independent_runs_are_byte_identical(corpus, reference, tmp_path, hash_async):
    # Another process, directory, thread count and hashing schedule (bookkeeping, not in the
    # chain), the same secret (it keys the commitments): the same bytes, checkpoints included
    # (with the hash overlapping the next step they are written from the hashed host copy).
    run = train(share_secret(reference, tmp_path / "elsewhere"), corpus, "--threads=1",
                f"--hash_async={hash_async}")
    assert_same_chain(run, reference)
    assert checkpoint_files(run) == checkpoint_files(reference)


@pytest.mark.parametrize("args", [["--step", "1"], ["--step", "15"], ["--step", "30"], ["--all"]],
                         ids=["step1", "step15", "step30", "all"])
def test_audit_matches(reference, args):
    proc = audit(reference, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MATCH" in proc.stdout and not mismatch_lines(proc), proc.stdout
    assert "audit cost:" in proc.stdout


# ----------------------------------------------------------------------------- SIGKILL and resume
def _state(pid):
    """The one-letter process state from /proc (T: stopped)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="hardware: needs Linux /proc (not on a Mac)")
@pytest.mark.parametrize("hash_async", ["off", "on"])
def test_sigkill_at_random_moments_then_resume_gives_the_same_chain(corpus, reference, tmp_path, hash_async):
    run = share_secret(reference, tmp_path / "run")     # the reference's chain bytes need its secret
    ckpt_dir, chain = run / "checkpoints", run / "chain.jsonl"
    rng = random.Random(20260601)

    def steps_in_chain():
        return chain.read_bytes().count(b"\n") - 1 if chain.exists() else -1

    def checkpoint_being_written():
        """(temp path, step) of a checkpoint write in progress for a step >= 10, or None."""
        for name in (os.listdir(ckpt_dir) if ckpt_dir.is_dir() else []):
            m = re.match(r"\.step_(\d+)\.safetensors\.tmp-", name)
            if m and int(m.group(1)) >= CKPT_EVERY:
                return ckpt_dir / name, int(m.group(1))
        return None

    # Kill 1 lands somewhere in the first moments of the run (genesis record, checkpoint 0,
    # the first steps); 2 and 4 in the middle of a step; 3 inside a checkpoint write.
    early_delay = rng.uniform(0.0, 0.05)
    # (step_b leaves the trainer several steps: with --hash_async a record appears a step late)
    step_a, step_b = rng.randint(3, CKPT_EVERY - 1), rng.randint(2 * CKPT_EVERY + 2, STEPS - 5)
    kills = [("early", early_delay), ("step", step_a), ("checkpoint", None), ("step", step_b)]
    torn_checkpoint = None
    for kind, arg in kills:
        proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"),
                                 *train_args(run, corpus, f"--hash_async={hash_async}")],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        fired, t0 = False, time.monotonic()
        try:
            while not fired and proc.poll() is None and time.monotonic() - t0 < TIMEOUT:
                if kind == "early" and chain.exists():
                    time.sleep(arg)
                    fired = True
                elif kind == "step" and steps_in_chain() >= arg:
                    time.sleep(rng.uniform(0.0, 0.02))     # somewhere in the following step
                    fired = True
                elif kind == "checkpoint" and (found := checkpoint_being_written()):
                    # Freeze the writer, and kill it only if the temporary file is still there:
                    # then the kill certainly lands between the file's creation and its rename.
                    os.kill(proc.pid, signal.SIGSTOP)
                    while _state(proc.pid) not in "TtZ":      # Z: it exited meanwhile
                        pass
                    if found[0].exists():
                        torn_checkpoint, fired = found, True
                    else:
                        os.kill(proc.pid, signal.SIGCONT)
                else:
                    time.sleep(0.0002)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stderr = proc.stderr.read().decode()
        proc.stderr.close()
        assert fired and proc.returncode == -signal.SIGKILL, \
            f"the {kind} kill did not land (rc {proc.returncode}): {stderr}"
        if kind == "checkpoint":
            # A torn file under the checkpoint's real name (as a non-atomic writer would leave
            # it): the restart must reject it, not load it.
            path, step = torn_checkpoint
            checkpoint.checkpoint_path(ckpt_dir, step).write_bytes(path.read_bytes()[:path.stat().st_size // 2])
        if kind == "step" and arg == step_a:
            # A chain line torn mid-write: the restart must drop it, not read it.
            with open(chain, "ab") as f:
                f.write(b'{"batch_digest":"ab55')

    train(run, corpus, f"--hash_async={hash_async}")   # the last restart runs to the end
    log = (run / "train.log").read_text()
    assert "skipping checkpoint" in log and "dropped a torn last line" in log, log
    # The torn checkpoint was moved aside as evidence, not overwritten by the re-derived one.
    assert (run / "rejected" / checkpoint.checkpoint_path("", torn_checkpoint[1]).name).exists()
    assert_same_chain(run, reference)
    files = checkpoint_files(run)    # no temporary file left behind either
    assert files == checkpoint_files(reference)
    records = chain_records(run)
    for step, path in checkpoint.list_checkpoints(ckpt_dir):
        tensors, meta = checkpoint.load_checkpoint(path)
        assert meta["step"] == step
        hashchain.verify_state(tensors, records[step]["state_hash"], records[step]["tensor_hashes"])


# ----------------------------------------------------------------------------- tampering
def test_bit_flip_in_checkpoint_tensor_is_named(reference, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    path = checkpoint.checkpoint_path(run / "checkpoints", 10)
    raw = bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    begin, end = json.loads(raw[8:8 + n])["params.layers.1.wo"]["data_offsets"]
    raw[8 + n + (begin + end) // 2] ^= 0x10
    path.write_bytes(raw)
    proc = audit(run, "--step", "15")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    first = mismatch_lines(proc)[0]
    assert first.startswith("MISMATCH at step 10:") and "params.layers.1.wo" in first, proc.stdout


def test_changed_token_is_found_at_the_first_step_that_reads_it(corpus, reference, tmp_path):
    # Which token positions each step reads: the rows' offsets (the stream is keyed by the
    # manifest's published split SHA-256, not the file).
    stream = data.TokenData(str(corpus), SEED)
    seen, target = set(), None
    for step in range(1, STEPS + 1):
        read = {p for m in range(MICRO_BATCHES)
                for _, o in stream.rows("train", step, m, MICRO_BATCH_SIZE, SEQ_LEN)
                for p in range(o, o + SEQ_LEN + 1)}
        if step > CKPT_EVERY and target is None and read - seen:   # past a checkpoint
            target = step, min(read - seen)
        seen |= read
    assert target, "no step reads a token that no earlier step read"
    step, position = target
    tampered = shutil.copytree(corpus, tmp_path / "tokens")
    dtype = data.DTYPES[stream.manifest["dtype"]]
    tokens = np.fromfile(tampered / "train.bin", dtype=dtype)
    tokens[position] = (tokens[position] + 1) % 256
    tokens.tofile(tampered / "train.bin")
    # The token file disagrees with its manifest: the first step that reads the changed chunk
    # is a mismatch, and the replay stops there.
    per_chunk = stream.manifest["splits"]["train"]["chunks"]["bytes"] // stream.dtype.itemsize
    reads_chunk = next(s for s in range(1, STEPS + 1) if any(
        o // per_chunk <= position // per_chunk <= (o + SEQ_LEN) // per_chunk
        for m in range(MICRO_BATCHES) for _, o in stream.rows("train", s, m, MICRO_BATCH_SIZE, SEQ_LEN)))
    proc = audit(reference, "--all", corpus=tampered)
    lines = mismatch_lines(proc)
    assert proc.returncode == 1 and len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].startswith(f"MISMATCH at step {reads_chunk}:") and "does not match its leaf" in lines[0], proc.stdout
    # The leaves and chunk root recomputed too (split SHA-256 kept): another corpus by name
    # (step 0), and the changed token is found at the first step whose windows hold it.
    raw, manifest = tokens.tobytes(), json.loads((tampered / "manifest.json").read_text())
    size = manifest["splits"]["train"]["chunks"]["bytes"]
    leaves = [hashlib.sha256(raw[i:i + size]).digest() for i in range(0, len(raw), size)]
    (tampered / "train.leaves").write_bytes(b"".join(leaves))
    manifest["splits"]["train"]["chunks"]["root"] = hashchain.merkle_root([x.hex() for x in leaves])
    (tampered / "manifest.json").write_text(json.dumps(manifest))
    proc = audit(reference, "--all", corpus=tampered)
    lines = mismatch_lines(proc)
    assert proc.returncode == 1 and len(lines) == 2, proc.stdout + proc.stderr
    assert lines[0].startswith("MISMATCH at step 0:") and "data_" in lines[0], proc.stdout
    assert lines[1].startswith(f"MISMATCH at step {step}:") and "batch" in lines[1], proc.stdout


def test_changed_hyperparameter_in_a_resealed_chain(reference, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    records = chain_records(run)
    records[0]["config"]["lr"] = 2e-3            # the run used 3e-3
    write_chain(run, reseal(records))            # re-seal every link, as a forger would
    resealed = hashchain.Chain(run / "chain.jsonl")
    resealed.load(repair=False)
    resealed.verify()                            # the forgery is a well-formed chain
    for args in (["--step", "1"], ["--all"]):
        proc = audit(run, *args)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        lines = mismatch_lines(proc)             # config.json still says 3e-3; step 1 replays
        assert lines[0].startswith("MISMATCH at step 0:") and "lr" in lines[0], proc.stdout
        assert lines[1].startswith("MISMATCH at step 1:"), proc.stdout
    # A forger who also edits config.json is caught by the replay alone.
    cfg = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**cfg, "lr": 2e-3}))
    proc = audit(run, "--step", "1")
    lines = mismatch_lines(proc)
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("MISMATCH at step 1:"), proc.stdout


def test_edited_record_breaks_the_chain_at_that_step(reference, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    records = chain_records(run)
    records[17]["loss"] += 0.25                  # not resealed
    write_chain(run, records)
    for args in (["--all"], ["--step", "17"], ["--step", "20"]):
        proc = audit(run, *args)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        lines = mismatch_lines(proc)
        assert len(lines) == 1 and lines[0].startswith("MISMATCH at step 17:"), proc.stdout
        assert "edited" in lines[0]


# ----------------------------------------------------------------------------- bad input
def test_audit_missing_run_dir(tmp_path):
    assert_one_line_error(audit(tmp_path / "nowhere", "--step", "1"), "audit.py")


def test_audit_step_beyond_the_chain(reference):
    assert_one_line_error(audit(reference, "--step", str(STEPS + 1)), "audit.py")


def test_audit_truncated_checkpoint(reference, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    path = checkpoint.checkpoint_path(run / "checkpoints", 10)    # the one --step 15 starts from
    os.truncate(path, path.stat().st_size // 2)
    assert_one_line_error(audit(run, "--step", "15"), "audit.py")


def test_audit_garbage_chain_line(reference, tmp_path):
    run = copy_run(reference, tmp_path / "run")
    lines = (run / "chain.jsonl").read_text().splitlines(keepends=True)
    lines[STEPS // 2 + 1] = "garbage\n"         # the record of step 16
    (run / "chain.jsonl").write_text("".join(lines))
    # A break inside the audited range; or before the final checkpoint, which every audit
    # checks (the model people download cannot be vouched for behind a break).
    for args in (["--all"], ["--step", "20"], ["--step", "1"]):
        proc = audit(run, *args)
        lines = mismatch_lines(proc)
        assert proc.returncode == 1 and len(lines) == 1, proc.stdout + proc.stderr
        assert lines[0].startswith(f"MISMATCH at step {STEPS // 2 + 1}:") and "not valid JSON" in lines[0]


# ----------------------------------------------------------------------------- sampling
def test_sample_is_a_function_of_prompt_and_seed(reference):
    def sample(seed):
        proc = script("sample.py", "--run_dir", reference, "--prompt", "The king", "--tokens", "40",
                      "--seed", seed)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    first = sample(3)
    assert first.startswith("The king") and len(first) > len("The king") + 20
    assert sample(3) == first
    assert sample(4) != first
