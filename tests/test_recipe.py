"""The OPEN-1B recipe's options in whole runs: every promise across a micro-batch phase boundary.

    python -m pytest tests/test_recipe.py -q

One tiny config with every new option on (sliding window + a full last layer, gain-free
QK-norm, the embedding norm, warmup then cosine decay, micro-batch phases N = 4 for steps 1..3
and N = 8 from step 4 on):
- chains and checkpoints byte-identical for R = 1, 2, 4 (torchrun, gloo) across the boundary;
- audit MATCH of the step just before and just after the boundary, and the --bundle of the
  step after it (cut with each step's N) replays it alone;
- SIGKILL during a step after the boundary, then resume: the same chain bytes;
- a world size that divides the first phase's N but not a later one's is refused before any
  work, and bad phase strings are one-line errors;
- the schedule: the cosine is the contract's canonical cos (NumPy reference), warmup, min_lr at
  the end, the linear default unchanged; each step's N and the plan's per-step costs.
"""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import reference as R
import receipts
from config import UsageError, lr_at, micro_batches_at, parse_config, phase_counts, validate
from model import windowed
from tiny import TINY, assert_one_line_error, launch_env as env, launcher, make_corpus, script, share_secret

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "train.py")
STEPS = 6
RECIPE = [*TINY, "--micro_batches=4@0,8@3", "--attn_window=5", "--full_attn_every=0", "--qk_norm=true",
          "--emb_norm=true", "--lr_schedule=cosine", "--warmup_steps=2", "--rope_theta=500000"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), seed=7, lines=3000)


def args(corpus, *extra):
    return ["--run_dir=run", f"--data_dir={corpus}", *RECIPE, f"--max_steps={STEPS}", "--checkpoint_every=2",
            "--eval_every=0", "--sample_tokens=0", "--threads=1", "--dist_timeout=30", *extra]



@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    base = tmp_path_factory.mktemp("recipe")
    out = {}
    for world in (1, 2, 4):
        cwd = base / f"r{world}"
        if world > 1:
            share_secret(out[1], cwd / "run")
        cwd.mkdir(exist_ok=True)
        proc = subprocess.run(launcher(world) + args(corpus), cwd=cwd, env=env(), capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        out[world] = cwd / "run"
    return out


def test_chains_and_checkpoints_identical_for_1_2_4_ranks_across_a_phase_boundary(runs):
    chain = (runs[1] / "chain.jsonl").read_bytes()
    records = [json.loads(line) for line in chain.splitlines()]
    assert len(records) == STEPS + 1 and records[0]["config"]["micro_batch_phases"] == "8@3"
    for world in (2, 4):
        assert (runs[world] / "chain.jsonl").read_bytes() == chain, f"R = {world}"
        for ckpt in sorted((runs[1] / "checkpoints").iterdir()):
            assert (runs[world] / "checkpoints" / ckpt.name).read_bytes() == ckpt.read_bytes(), (world, ckpt.name)
    log = (runs[1] / "train.log").read_text()
    assert "step     3 |" in log and "| 4 rank(s)" not in log


def test_audit_match_on_both_sides_of_the_boundary(runs, corpus):
    for step in (3, 4):
        proc = script("audit.py", "--run_dir", runs[1], "--step", step, "--data_dir", corpus)
        assert proc.returncode == 0 and f"MATCH: steps {step}..{step}" in proc.stdout, proc.stdout + proc.stderr


def test_bundle_of_a_step_after_the_boundary(runs, tmp_path):
    out = tmp_path / "bundle"
    proc = script("data.py", "--bundle", "--step", 4, "--run_dir", runs[1], "--data_dir", out)
    assert proc.returncode == 0 and "bundle for steps 3..4" in proc.stdout, proc.stderr
    alone = shutil.copytree(runs[1], tmp_path / "run")
    config = json.loads((alone / "config.json").read_text())
    config["data_dir"] = str(tmp_path / "no_corpus_here")
    (alone / "config.json").write_text(json.dumps(config))
    proc = script("audit.py", "--run_dir", alone, "--step", 4, "--data_dir", out)
    assert proc.returncode == 0 and "MATCH: steps 4..4" in proc.stdout, proc.stdout + proc.stderr


def test_sigkill_after_the_boundary_then_resume(runs, corpus, tmp_path):
    cwd = tmp_path / "k"
    share_secret(runs[1], cwd / "run")
    chain = cwd / "run" / "chain.jsonl"
    proc = subprocess.Popen([sys.executable, TRAIN] + args(corpus), cwd=cwd, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < 300:
        if chain.exists() and chain.read_bytes().count(b"\n") - 1 >= 4:   # step 4 (N = 8) published
            break
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before the kill"
    done = subprocess.run([sys.executable, TRAIN] + args(corpus), cwd=cwd, env=env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    # from checkpoint 2 (steps 3, 4 re-derived across the boundary) or 4 (if it was written)
    assert re.search(r"resume: from step [24] ", done.stdout), done.stdout
    assert chain.read_bytes() == (runs[1] / "chain.jsonl").read_bytes()


def test_ranks_must_divide_every_phase_before_any_work(corpus, tmp_path):
    e = dict(env(), WORLD_SIZE="4", RANK="0")
    proc = subprocess.run([sys.executable, TRAIN, f"--run_dir={tmp_path / 'run'}", f"--data_dir={corpus}", *TINY,
                           "--micro_batches=4@0,6@3"], cwd=ROOT, env=e, capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc, "train.py")
    assert "world size 4" in proc.stderr and "micro_batches=6" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["4@1,8@3", "4@0", "4@0,8", "4@0,8@3,2@3", "4@0,0@5", "4@0,x@5"])
def test_bad_phases_are_refused(value):
    with pytest.raises(UsageError):
        validate(parse_config([f"--micro_batches={value}"]))


def test_a_bad_phase_is_one_line_and_creates_nothing(tmp_path):
    proc = script("train.py", f"--run_dir={tmp_path / 'run'}", "--micro_batches=4@0,8@3,2@3")
    assert_one_line_error(proc, "train.py")
    assert not (tmp_path / "run").exists()


def test_each_steps_micro_batches():
    cfg = parse_config(["--micro_batches=192@0,288@100,576@300"])
    validate(cfg)
    assert (cfg.micro_batches, cfg.micro_batch_phases) == (192, "288@100,576@300")
    assert [micro_batches_at(cfg, s) for s in (1, 100, 101, 300, 301, 10**6)] == [192, 192, 288, 288, 576, 576]
    assert phase_counts(cfg) == [192, 288, 576]
    assert micro_batches_at(parse_config(["--micro_batches=8"]), 5) == 8      # a plain N as before
    # the plan's cost of auditing a step: the micro-batches it replays (from the checkpoint before)
    assert receipts.replay_costs(99, 102, [100], lambda s: micro_batches_at(cfg, s)) == \
        {99: 99 * 192, 100: 100 * 192, 101: 288, 102: 576}
    assert receipts.replay_costs(99, 102, [100]) == {99: 99, 100: 100, 101: 1, 102: 2}


def test_cosine_schedule_is_the_canonical_cos():
    cfg = parse_config(["--lr_schedule=cosine", "--lr=4.5e-4", "--min_lr=4.5e-5", "--warmup_steps=10",
                        "--max_steps=110"])
    lrs = [lr_at(cfg, s) for s in range(1, 111)]
    assert lrs[:10] == [4.5e-4 * s / 10 for s in range(1, 11)]
    for s in (11, 37, 60, 93, 110):
        progress = min((s - 10) / 100, 1.0)
        c = float(R.cos(np.array([R.f32(math.pi * progress)], np.float32))[0])
        assert lr_at(cfg, s) == 4.5e-5 + (4.5e-4 - 4.5e-5) * 0.5 * (1.0 + c)
        assert abs(lr_at(cfg, s) - (4.5e-5 + 4.05e-4 * 0.5 * (1 + math.cos(math.pi * progress)))) < 1e-10
    assert all(b <= a for a, b in zip(lrs[9:], lrs[10:])) and abs(lrs[-1] - 4.5e-5) < 1e-12
    linear = parse_config(["--lr=4.5e-4", "--min_lr=4.5e-5", "--warmup_steps=10", "--max_steps=110"])
    assert lr_at(linear, 60) == 4.5e-4 - (4.5e-4 - 4.5e-5) * 0.5    # the default, unchanged


def test_schedule_keys_refused_out_of_range():
    for bad in (["--lr_schedule=exp"], ["--attn_window=-1"], ["--full_attn_every=-2"]):
        with pytest.raises(UsageError):
            validate(parse_config(bad))


def test_open1b_preset_is_the_reference_recipe():
    cfg = parse_config(["--preset=open1b"])
    validate(cfg)
    assert (cfg.attn_window, cfg.full_attn_every, cfg.qk_norm, cfg.emb_norm, cfg.rope_theta, cfg.zloss) == \
        (512, 5, True, True, 5e5, 1e-4)
    assert (cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.lr_schedule, cfg.grad_clip) == \
        (4.5e-4, 4.5e-5, 667, "cosine", 1.0)
    assert [i for i in range(cfg.n_layer) if not windowed(cfg, i)] == [4, 9, 14, 19, 23]
    # the reference's token phases: 3.1M / 4.7M / 9.4M tokens per step from 0 / 4B / 360B to 400B
    per_mb = cfg.micro_batch_size * cfg.seq_len
    tokens = [micro_batches_at(cfg, s) * per_mb for s in (1, 1272, 1273, 76718, 76719, cfg.max_steps)]
    assert tokens == [3145728, 3145728, 4718592, 4718592, 9437184, 9437184]
    assert 1271 * 3145728 < 4e9 <= 1272 * 3145728
    assert all(n % 48 == 0 for n in phase_counts(cfg))        # the reference's 48 ranks
    consumed = 1272 * 3145728 + (76718 - 1272) * 4718592
    assert consumed - 4718592 < 360e9 <= consumed
    assert consumed + (cfg.max_steps - 76718 - 1) * 9437184 < 400e9 <= consumed + (cfg.max_steps - 76718) * 9437184
