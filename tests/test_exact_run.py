"""Whole runs with --matmul=exact (SPEC §19, contract §11): every model matmul is the exact one.

    python -m pytest tests/test_exact_run.py -q

- chains and checkpoints byte-identical for R = 1, 2, 4 ranks (torchrun, gloo); the R = 2 run
  uses the other CPU kernel versions (tiny.other_kernels_env: the SIMD int8 GEMM for the residue
  GEMMs where AMX-INT8 is the default, the 256-bit matmul tile);
- the option is decisive: the genesis config holds `matmul` (an fp32 run's has no such key, so
  its genesis bytes are unchanged), and a genesis that claims fp32 for the exact run is a
  MISMATCH at its first step; audit MATCH of a replayed step;
- the independent NumPy replay reproduces the exact run's records;
- the combinations without an exact kernel are refused with one line.
"""
import os
import sys

import pytest

from config import UsageError, decisive_config, parse_config, validate
from tiny import (TINY, launcher, assert_one_line_error, chain_records, copy_run, launch_env as env, make_corpus,
                  mismatch_lines, other_kernels_env, reseal, run_process, script, share_secret, write_chain)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), seed=11, lines=1500)


def args(corpus, *extra):
    return ["--run_dir=run", f"--data_dir={corpus}", *TINY, f"--max_steps={STEPS}", "--checkpoint_every=2",
            "--eval_every=0", "--sample_tokens=0", "--threads=1", "--dist_timeout=30", *extra]



@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    """{R: an exact run with R ranks} for R = 1, 2, 4."""
    base = tmp_path_factory.mktemp("exact")
    out = {}
    for world in (1, 2, 4):
        cwd = base / f"r{world}"
        if world > 1:
            share_secret(out[1], cwd / "run")
        cwd.mkdir(exist_ok=True)
        proc = run_process(launcher(world) + args(corpus, "--matmul=exact"), cwd=cwd,
                           env=other_kernels_env() if world == 2 else env(),
                           capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        out[world] = cwd / "run"
    return out


def test_chains_and_checkpoints_identical_for_1_2_4_ranks(runs):
    chain = (runs[1] / "chain.jsonl").read_bytes()
    assert len(chain.splitlines()) == STEPS + 1
    for world in (2, 4):
        assert (runs[world] / "chain.jsonl").read_bytes() == chain, f"R = {world}"
        for ckpt in sorted((runs[1] / "checkpoints").iterdir()):
            assert (runs[world] / "checkpoints" / ckpt.name).read_bytes() == ckpt.read_bytes(), (world, ckpt.name)


def test_exact_is_decisive_and_fp32_genesis_unchanged(runs):
    assert chain_records(runs[1])[0]["config"]["matmul"] == "exact"
    assert "matmul" not in decisive_config(parse_config([]))         # fp32: the genesis bytes of before
    assert decisive_config(parse_config(["--matmul=exact"]))["matmul"] == "exact"


def test_audit_match(runs, corpus):
    proc = script("audit.py", "--run_dir", runs[2], "--step", 3, "--data_dir", corpus)
    assert proc.returncode == 0 and "MATCH: steps 3..3" in proc.stdout, proc.stdout + proc.stderr


def test_a_genesis_that_claims_fp32_is_a_mismatch(runs, corpus, tmp_path):
    """The forger resealed the whole chain after dropping `matmul` from the genesis config: the
    audit finds config.json disagreeing, and recomputes step 1 with the fp32 matmul: another state."""
    run = copy_run(runs[1], tmp_path / "claim")
    forged = chain_records(runs[1])
    del forged[0]["config"]["matmul"]
    write_chain(run, reseal(forged, 0))
    proc = script("audit.py", "--run_dir", run, "--step", 1, "--data_dir", corpus)
    lines = mismatch_lines(proc)
    assert proc.returncode == 1 and "matmul" in lines[0], proc.stdout     # the run dir's config.json says exact
    assert any(line.startswith("MISMATCH at step 1: field state_hash") for line in lines), proc.stdout


@pytest.mark.parametrize("flags", [["--matmul=exact", "--quant=int8"], ["--matmul=exact", "--attn_window=4", "--device=cuda"],
                                   ["--matmul=exact", "--device=mps"], ["--matmul=bf16"]])
def test_combinations_without_a_kernel_are_refused(flags):
    with pytest.raises(UsageError, match="matmul"):
        validate(parse_config(flags))


def test_refusal_is_one_line_and_creates_nothing(corpus, tmp_path):
    proc = script("train.py", f"--run_dir={tmp_path / 'run'}", f"--data_dir={corpus}", "--matmul=exact",
                  "--quant=int8")
    assert_one_line_error(proc, "train.py")
    assert not (tmp_path / "run").exists()


def test_numpy_replay_reproduces_the_exact_run(runs, corpus):
    """The independent NumPy replay (tests/numpy_replay.py with tests/numpy_exact.py; no project
    import) recomputes the exact run's first two steps from the genesis: the same records."""
    env_ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = run_process([sys.executable, os.path.join(ROOT, "tests", "numpy_replay.py"), "--run_dir", str(runs[1]),
                        "--data_dir", str(corpus), "--steps", "2", "--code_root", ROOT],
                       cwd=runs[1].parent, env=env_, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [line for line in proc.stdout.splitlines() if line.startswith("MATCH") and ": record " in line]
    assert len(records) == 3, proc.stdout
