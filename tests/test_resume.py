"""Resuming, continuing and stopping a run, with the real commands on the tiny model.

- `train.py --run_dir=DIR` alone resumes a non-default run with its own config (the genesis
  record's decisive keys, config.json's bookkeeping): the chain it finishes is the uninterrupted
  run's, byte for byte. A decisive flag with another value is refused naming both values; a
  bookkeeping flag may differ; a missing config.json is a note, not a refusal; a finished run
  says that it is finished and how to train on.
- `--init_from=RUN[@STEP]` starts a child run from the parent's verified state (SPEC §21): its
  genesis names the parent, its initial tensors are the parent's but the step, it audits MATCH
  without the parent (saying the lineage was not checked) and with it (`--init_from RUN`), a
  forged lineage is a MISMATCH at step 0, a run that is not the parent is the auditor's input
  (exit 2), and the child resumes by its run directory with the parent gone.
- Ctrl-C and SIGTERM stop train.py with one line (the last step in the chain, the chain and
  checkpoints intact, the command that resumes), exit 130 / 143, the chain verifying.
"""
import json
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

import rundir
from tiny import (ROOT, TINY, assert_one_line_error, audit, chain_records, launch_env, mismatch_lines, reseal,
                  script, start_process, stop_process, train, write_chain)

KEYS = ["--lr=0.002", "--warmup_steps=4", "--dropout=0.1", "--checkpoint_every=5", "--eval_every=0",
        "--sample_tokens=0"]                      # a non-default run: decisive and bookkeeping keys


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory):
    """A finished 30-step tiny run with non-default keys."""
    return train(tmp_path_factory.mktemp("resume") / "run", corpus, *KEYS)


def cut(run, dest, step):
    """A copy of `run` as a trainer killed after publishing step `step` would leave it."""
    shutil.copytree(run, dest)
    lines = (dest / "chain.jsonl").read_text().splitlines(keepends=True)
    (dest / "chain.jsonl").write_text("".join(lines[:step + 1]))
    for s, path in rundir.list_checkpoints(dest / "checkpoints"):
        if s > step:
            path.unlink()
    return dest


def test_the_run_directory_alone_resumes_with_the_runs_own_config(run, corpus, tmp_path):
    cut_run = cut(run, tmp_path / "cut", 17)
    proc = script("train.py", f"--run_dir={cut_run}", "--checkpoint_every=7")    # bookkeeping may differ
    assert proc.returncode == 0, proc.stderr
    assert "resume: from step 15" in proc.stdout
    assert (cut_run / "chain.jsonl").read_bytes() == (run / "chain.jsonl").read_bytes()
    # a decisive key with another value: refused, both values named, nothing written
    before = (cut_run / "chain.jsonl").read_bytes()
    proc = script("train.py", f"--run_dir={cut_run}", "--lr=0.001")
    assert_one_line_error(proc, "train.py")
    assert f"--lr=0.001 differs from the run's 0.002 ({cut_run}'s genesis record)" in proc.stderr
    proc = script("train.py", f"--run_dir={cut_run}", "--max_steps=40")
    assert_one_line_error(proc, "train.py")
    assert "--max_steps=40 differs from the run's 30" in proc.stderr and f"--init_from={cut_run}" in proc.stderr
    assert (cut_run / "chain.jsonl").read_bytes() == before
    # the finished run says so, and how to train on
    proc = script("train.py", f"--run_dir={cut_run}")
    assert proc.returncode == 0 and f"{cut_run} is finished: its chain holds all 30 steps" in proc.stdout, proc.stdout
    assert f"--init_from={cut_run}" in proc.stdout


def test_without_config_json_the_bookkeeping_keys_take_their_defaults(run, corpus, tmp_path):
    cut_run = cut(run, tmp_path / "cut", 27)
    (cut_run / "config.json").unlink()
    proc = script("train.py", f"--run_dir={cut_run}", f"--data_dir={corpus}")
    assert proc.returncode == 0, proc.stderr
    assert f"train.py: note: {cut_run}/config.json is missing; its bookkeeping keys" in proc.stdout
    assert (cut_run / "chain.jsonl").read_bytes() == (run / "chain.jsonl").read_bytes()


@pytest.fixture(scope="module")
def child(run, tmp_path_factory):
    """A run started from step 20 of `run` with another lr, 6 steps."""
    child = tmp_path_factory.mktemp("child") / "run"
    proc = script("train.py", f"--run_dir={child}", f"--init_from={run}@20", "--max_steps=6", "--lr=0.001",
                  "--warmup_steps=0", "--seed=5")
    assert proc.returncode == 0, proc.stderr
    return child


def test_a_child_names_its_parent_and_starts_from_its_state(run, child):
    parent, genesis = chain_records(run), chain_records(child)[0]
    assert genesis["parent"] == {"run": parent[0]["record_hash"], "step": 20,
                                 "record_hash": parent[20]["record_hash"], "state_hash": parent[20]["state_hash"]}
    leaves = [rundir.load_checkpoint(rundir.checkpoint_path(r / "checkpoints", s), mmap=True)[1]["tensor_hashes"]
              for r, s in ((child, 0), (run, 20))]             # records hold state roots: the headers' leaves
    mine, theirs = leaves
    assert set(mine) == set(theirs) and {n for n in mine if mine[n] != theirs[n]} == {"step"}
    assert genesis["config"]["lr"] == 0.001 and genesis["config"]["dropout"] == 0.1     # the parent's, but lr
    assert json.loads((child / "config.json").read_text())["checkpoint_every"] == 5     # its bookkeeping too


def test_a_child_audits_with_and_without_its_lineage(run, child, tmp_path):
    proc = audit(child, "--step", "2")
    assert proc.returncode == 0 and "MATCH: steps 2..2" in proc.stdout, proc.stdout + proc.stderr
    assert "the lineage was not checked" in proc.stdout
    proc = audit(child, "--step", "6", "--init_from", run)
    assert proc.returncode == 0 and "MATCH: steps 6..6" in proc.stdout, proc.stdout + proc.stderr
    match = next(line for line in proc.stdout.splitlines() if line.startswith("MATCH:"))
    assert "not checked" not in proc.stdout and match.endswith(f"; the lineage checked: it starts from step 20 of {run}")
    # a run that is not the parent: the auditor's input
    proc = audit(child, "--step", "1", "--init_from", child)
    assert_one_line_error(proc, "audit.py")
    assert "is not this run's parent" in proc.stderr
    # a forged lineage: the genesis names another state of the parent, resealed
    forged = shutil.copytree(child, tmp_path / "forged")
    records = chain_records(forged)
    records[0]["parent"]["state_hash"] = chain_records(run)[19]["state_hash"]
    write_chain(forged, reseal(records))
    proc = audit(forged, "--step", "1", "--init_from", run)
    assert proc.returncode == 1 and mismatch_lines(proc)[0].startswith("MISMATCH at step 0: lineage: genesis field "
                                                                       "parent.state_hash"), proc.stdout


def test_a_child_resumes_without_its_parent(run, child, tmp_path):
    parent = shutil.copytree(run, tmp_path / "parent")
    orphan = tmp_path / "orphan"
    proc = script("train.py", f"--run_dir={orphan}", f"--init_from={parent}", "--max_steps=6", "--warmup_steps=0")
    assert proc.returncode == 0, proc.stderr
    assert chain_records(orphan)[0]["parent"]["step"] == 30          # the parent's latest checkpoint
    shutil.rmtree(parent)
    whole = (orphan / "chain.jsonl").read_bytes()
    cut_orphan = cut(orphan, tmp_path / "cut", 3)
    proc = script("train.py", f"--run_dir={cut_orphan}")
    assert proc.returncode == 0, proc.stderr
    assert (cut_orphan / "chain.jsonl").read_bytes() == whole


@pytest.mark.parametrize("args, named", [
    (["--d_model=64"], "--d_model=64 differs from the parent's 32"),
    (["--init_from={run}@7"], "has no checkpoint of step 7 (it has 0,5,10,15,20,25,30)"),
    (["--run_dir={run}"], "holds a run that did not start from --init_from"),
    (["--init_from={run}x"], "x: no such directory (a parent run's directory"),     # a typo, not an HF folder
])
def test_a_child_is_refused_what_would_not_continue_the_parent(run, tmp_path, args, named):
    argv = [f"--run_dir={tmp_path / 'c'}", f"--init_from={run}", *(a.format(run=run) for a in args)]
    proc = script("train.py", *argv)
    assert_one_line_error(proc, "train.py")
    assert named in proc.stderr, proc.stderr
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("sig, code, said", [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")])
def test_ctrl_c_and_sigterm_stop_with_one_line_that_says_how_to_resume(corpus, tmp_path, sig, code, said):
    target = tmp_path / "run"
    proc = start_process([sys.executable, str(ROOT / "train.py"), f"--run_dir={target}", f"--data_dir={corpus}",
                          *TINY, "--max_steps=100000", "--checkpoint_every=5", "--eval_every=0", "--threads=1"],
                         cwd=ROOT, env=launch_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))   # as at a terminal
    chain = target / "chain.jsonl"
    try:
        t0 = time.monotonic()
        while not chain.exists() or chain.read_bytes().count(b"\n") < 8:     # 7 steps published
            assert proc.poll() is None and time.monotonic() - t0 < 120, proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
        err = proc.stderr.read().decode()
    finally:
        stop_process(proc)
        proc.stderr.close()
    run = rundir.Run(target)
    run.chain.verify()
    last = len(run.chain) - 1
    ckpt = max(s for s, _ in run.checkpoints() if s <= last)
    assert rc == code and len(err.splitlines()) == 1, (rc, err)
    assert re.fullmatch(rf"train.py: stopped \({said}\) after step {last}; the chain and checkpoints are intact "
                        rf"\(the latest checkpoint is step {ckpt}\); `\S*python\S* train.py "
                        rf"--run_dir={re.escape(str(target))}` resumes it\n", err), err
