"""The exact matmul's windowed attention (contract §11 "Band products"): window attention with
matmul = "exact" in O(T * W).

    python -m pytest tests/test_exact_window.py -q

1. Each band product (exact_band_scores, exact_band_mix, exact_band_mix_t; kernels/cpu/exact.cpp)
   equals the NumPy reference bit for bit (tests/numpy_exact.py: the §11 product of the full
   operands written out with zeros outside the window, then cut to the band), on plain,
   adversarial (specials, FTZ territory) and non-finite inputs, windows narrower and wider than
   the sequence, GQA groups of 1 and 3, and blocks of the kernel's tiling (T > 64).
2. The definition's consequence: the scales are the full operands' (a value far outside every
   window still decides a column's scale). W >= T = exact full attention (forward and every
   gradient), accuracy against float64 and O(T * W) memory are tests/test_window.py's, run with
   exact=True there.
3. The model: --matmul=exact with --attn_window trains; the run's chain is the same for R = 1
   and 2; audit.py replays it to MATCH. The config refuses it on CUDA with one line (no CUDA band
   kernels).
"""

import numpy as np
import pytest
import torch

import reference as R
import repops  # noqa: F401  (loads the kernels behind torch.ops.repops)
import test_kernels as TK
from numpy_exact import _band_to_full
from tiny import (TINY, assert_one_line_error, audit, chain_records, launch_env, launcher, script,
                  share_secret, run_process)

assert_bits, T, N = TK.assert_bits, TK.T, TK.N
ops = torch.ops.repops


def _inputs(rng, shape, kind):
    if kind == "adv":
        return TK.adversarial(rng, shape, frac=0.1, nonfinite=False)
    if kind == "nonfinite":
        return TK.adversarial(rng, shape, frac=0.02)
    if kind == "tiny":
        return TK.tiny(rng, shape)
    return rng.standard_normal(shape).astype(np.float32)


def _band(rng, batch, M, Tn, W, kind):
    """A band as window_softmax leaves it: +0.0 in the columns before key 0."""
    p = _inputs(rng, (batch, M, W), kind)
    t = np.arange(M) % Tn
    p[:, np.arange(W)[None, :] < (W - 1 - t)[:, None]] = 0.0
    return p


@pytest.mark.parametrize("batch,G,Tn,D,W", [(1, 1, 1, 4, 1), (2, 1, 9, 8, 4), (1, 3, 37, 6, 8),
                                            (2, 2, 5, 3, 7), (1, 1, 40, 5, 33), (1, 2, 150, 8, 70)])
@pytest.mark.parametrize("kind", ["normal", "adv", "tiny", "nonfinite"])
def test_exact_band_products_bits(batch, G, Tn, D, W, kind):
    rng = np.random.default_rng([batch, G, Tn, D, W, len(kind)])
    a = _inputs(rng, (batch, G * Tn, D), kind)
    b = _inputs(rng, (batch, Tn, D), kind)
    p = _band(rng, batch, G * Tn, Tn, W, kind)
    assert_bits(ops.exact_band_scores(T(a), T(b), W), R.exact_band_scores(a, b, W), f"exact_band_scores {kind}")
    assert_bits(ops.exact_band_mix(T(p), T(b)), R.exact_band_mix(p, b), f"exact_band_mix {kind}")
    assert_bits(ops.exact_band_mix_t(T(p), T(a), Tn), R.exact_band_mix_t(p, a, Tn), f"exact_band_mix_t {kind}")


def test_scales_are_the_full_operands():
    """A value of b no window of the block reaches still sets its column's scale: the result is
    the full product's, not the product of the window's rows alone."""
    rng = np.random.default_rng(1)
    Tn, D, W = 130, 4, 3
    p = _band(rng, 1, Tn, Tn, W, "normal")
    b = rng.standard_normal((1, Tn, D)).astype(np.float32)
    b[0, Tn - 1, :] = 3e4                         # only the last rows' windows reach it
    got = N(ops.exact_band_mix(T(p), T(b)))
    assert_bits(got, R.exact_band_mix(p, b), "full scales")
    own = R.exact_matmul(_band_to_full(p, Tn)[:, :2, :2], b[:, :2, :])   # rows 0-1 against their own keys
    assert not np.array_equal(got[:, :2].view(np.uint32), own.view(np.uint32)), \
        "rows 0-1 were computed with their own keys' scales, not the whole columns'"


# ------------------------------------------------------------------ the model
WINDOWED = ["--matmul=exact", "--attn_window=8", "--full_attn_every=2", "--n_layer=3", "--n_kv_head=1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    """{R: an exact windowed run with R ranks} for R = 1, 2 (layers 0 windowed, 1 and 2 full)."""
    base = tmp_path_factory.mktemp("exact_window")
    out = {}
    for world in (1, 2):
        cwd = base / f"r{world}"
        if world > 1:
            share_secret(out[1], cwd / "run")
        cwd.mkdir(exist_ok=True)
        args = ["--run_dir=run", f"--data_dir={corpus}", *TINY, "--max_steps=3", "--checkpoint_every=1",
                "--eval_every=0", "--sample_tokens=0", "--threads=1", "--dist_timeout=30", *WINDOWED]
        proc = run_process(launcher(world) + args, cwd=cwd, env=launch_env(), capture_output=True, text=True,
                           timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        out[world] = cwd / "run"
    return out


def test_exact_window_chains_identical_for_1_2_ranks(runs):
    chain = (runs[1] / "chain.jsonl").read_bytes()
    assert len(chain.splitlines()) == 4
    assert (runs[2] / "chain.jsonl").read_bytes() == chain
    config = chain_records(runs[1])[0]["config"]
    assert config["matmul"] == "exact" and config["attn_window"] == 8


def test_exact_window_audit_match(runs, corpus):
    proc = audit(runs[2], "--step", 2, corpus=corpus)
    assert proc.returncode == 0 and "MATCH: steps 2..2" in proc.stdout, proc.stdout + proc.stderr


def test_exact_window_refused_on_cuda(tmp_path):
    proc = script("train.py", f"--run_dir={tmp_path / 'run'}", "--matmul=exact", "--attn_window=8", "--device=cuda",
                  env=launch_env())
    assert_one_line_error(proc, "train.py")
    assert "--attn_window=8" in proc.stderr and "CPU kernels only" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()
