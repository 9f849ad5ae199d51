"""Whole runs with --matmul=exact (SPEC §19, contract §11): every model matmul is the exact one.

    python -m pytest tests/test_exact_run.py -q

- chains and checkpoints byte-identical for R = 1, 2, 4 ranks (torchrun, gloo);
- the run differs from the fp32 run of the same config (the option is decisive), and its genesis
  config holds `matmul`, the fp32 run's does not (its genesis bytes are unchanged);
- audit MATCH of a replayed step; a forged state hash, or a genesis that claims fp32, is a
  MISMATCH;
- the independent NumPy replay reproduces the exact run's records;
- the combinations without an exact kernel are refused with one line.
"""
import json
import os
import subprocess
import sys

import pytest

from config import UsageError, parse_config, validate
from tiny import (TINY, assert_one_line_error, chain_records, copy_run, launch_env as env, make_corpus,
                  mismatch_lines, reseal, script, share_secret, write_chain)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "train.py")
STEPS = 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), seed=11, lines=1500)


def args(corpus, *extra):
    return ["--run_dir=run", f"--data_dir={corpus}", *TINY, f"--max_steps={STEPS}", "--checkpoint_every=2",
            "--eval_every=0", "--sample_tokens=0", "--threads=1", "--dist_timeout=30", *extra]


def launcher(world):
    if world == 1:
        return [sys.executable, TRAIN]
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    base = [exe] if os.path.exists(exe) else [sys.executable, "-m", "torch.distributed.run"]
    return base + ["--standalone", f"--nproc_per_node={world}", TRAIN]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    """{1, 2, 4: an exact run with that many ranks, "fp32": the same config in fp32}."""
    base = tmp_path_factory.mktemp("exact")
    out = {}
    for key, world, extra in ((1, 1, ["--matmul=exact"]), (2, 2, ["--matmul=exact"]), (4, 4, ["--matmul=exact"]),
                              ("fp32", 1, [])):
        cwd = base / f"r{key}"
        if key != 1:
            share_secret(out[1], cwd / "run")
        cwd.mkdir(exist_ok=True)
        proc = subprocess.run(launcher(world) + args(corpus, *extra), cwd=cwd, env=env(), capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        out[key] = cwd / "run"
    return out


def test_chains_and_checkpoints_identical_for_1_2_4_ranks(runs):
    chain = (runs[1] / "chain.jsonl").read_bytes()
    assert len(chain.splitlines()) == STEPS + 1
    for world in (2, 4):
        assert (runs[world] / "chain.jsonl").read_bytes() == chain, f"R = {world}"
        for ckpt in sorted((runs[1] / "checkpoints").iterdir()):
            assert (runs[world] / "checkpoints" / ckpt.name).read_bytes() == ckpt.read_bytes(), (world, ckpt.name)


def test_exact_is_decisive_and_fp32_genesis_unchanged(runs):
    exact, fp32 = chain_records(runs[1]), chain_records(runs["fp32"])
    assert exact[0]["config"]["matmul"] == "exact" and "matmul" not in fp32[0]["config"]
    assert exact[0]["state_hash"] == fp32[0]["state_hash"]           # the same init
    assert all(e["state_hash"] != f["state_hash"] for e, f in zip(exact[1:], fp32[1:]))
    assert abs(exact[-1]["loss"] - fp32[-1]["loss"]) < 0.05          # and it trains the same way


def test_audit_match(runs, corpus):
    proc = script("audit.py", "--run_dir", runs[2], "--step", 3, "--data_dir", corpus)
    assert proc.returncode == 0 and "MATCH: steps 3..3" in proc.stdout, proc.stdout + proc.stderr


def test_forgeries_are_mismatches(runs, corpus, tmp_path):
    records = chain_records(runs[1])
    run = copy_run(runs[1], tmp_path / "state")
    forged = json.loads(json.dumps(records))
    h = forged[3]["state_hash"]
    forged[3]["state_hash"] = ("0" if h[0] != "0" else "1") + h[1:]
    write_chain(run, reseal(forged, 3))
    proc = script("audit.py", "--run_dir", run, "--step", 3, "--data_dir", corpus)
    assert proc.returncode == 1 and mismatch_lines(proc)[0].startswith("MISMATCH at step 3:"), proc.stdout
    # a genesis that claims the fp32 matmul for a run computed with the exact one
    run = copy_run(runs[1], tmp_path / "claim")
    forged = json.loads(json.dumps(records))
    del forged[0]["config"]["matmul"]
    write_chain(run, reseal(forged, 0))
    proc = script("audit.py", "--run_dir", run, "--step", 1, "--data_dir", corpus)
    assert proc.returncode == 1 and mismatch_lines(proc), proc.stdout + proc.stderr


@pytest.mark.parametrize("flags", [["--matmul=exact", "--quant=int8"], ["--matmul=exact", "--attn_window=4"],
                                   ["--matmul=exact", "--device=mps"], ["--matmul=bf16"]])
def test_combinations_without_a_kernel_are_refused(flags):
    with pytest.raises(UsageError, match="matmul"):
        validate(parse_config(flags))


def test_refusal_is_one_line_and_creates_nothing(corpus, tmp_path):
    proc = script("train.py", f"--run_dir={tmp_path / 'run'}", f"--data_dir={corpus}", "--matmul=exact",
                  "--attn_window=4")
    assert_one_line_error(proc, "train.py")
    assert not (tmp_path / "run").exists()


def test_numpy_replay_reproduces_the_exact_run(runs, corpus):
    """The independent NumPy replay (tests/numpy_replay.py with tests/numpy_exact.py; no project
    import) recomputes the exact run's first two steps from the genesis: the same records."""
    env_ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "numpy_replay.py"), "--run_dir", str(runs[1]),
                           "--data_dir", str(corpus), "--steps", "2", "--code_root", ROOT],
                          cwd=runs[1].parent, env=env_, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [line for line in proc.stdout.splitlines() if line.startswith("MATCH") and ": record " in line]
    assert len(records) == 3, proc.stdout
