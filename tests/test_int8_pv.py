"""int8 P·V inside attention (`--quant=int8 --int8_pv=1`, contract §10 "int8 P·V").

    python -m pytest tests/test_int8_pv.py -q

1. The kernels against the NumPy reference (tests/numpy_int8_pv.py) bit for bit: the block step
   rule (all-zero and flushed blocks take 1.0), the full layers' P·V (the §10 int8 linear on
   qV^T, qP) and the windowed layers' int8 band mix, on softmax probabilities (exact zeros above
   the diagonal), values with +-large entries and all-zero blocks, T not a multiple of anything,
   GQA groups 1-3, windows narrower and wider than T; the int32 sum exact at the largest K.
2. The float-shadow backward bit for bit (gP = gO Vh^T, gV = Ph^T gO; band_scores and band_mix_t
   for bands), a window >= T gives the bits of the full int8 path, accuracy vs float64 torch.
3. Whole runs (tiny model, a windowed layer 0 and the full last layer): chains byte-identical for
   R = 1, 2 and 4 (R = 2 under the other CPU kernel versions, tiny.other_kernels_env: the SIMD int8
   GEMM where AMX-INT8 is the default), audit MATCH, a forged int8_pv MISMATCH; the default path unchanged; the config
   rules (one-line errors); the per-head dead-tensor check stops a run whose head's P rounds to 0.
"""
import json
import math
import re

import numpy as np
import pytest
import torch

import config
import quant
import reference as R
import repops
import test_kernels as TK
import train
from model import Llama, ModelConfig
from tiny import (TINY, launcher, assert_one_line_error, audit, chain_records, copy_run, launch_env, make_corpus, mismatch_lines,
                  other_kernels_env, reseal, run_process, script, share_secret, write_chain)

assert_bits, T, N = TK.assert_bits, TK.T, TK.N
ops = torch.ops.repops


def causal_p(rng, batch, G, Tn, scale=3.0):
    s = T((rng.standard_normal((batch * G, Tn, Tn)) * scale).astype(np.float32))
    return N(ops.causal_softmax(s, 1.0)).reshape(batch, G * Tn, Tn)


def band_p(rng, batch, G, Tn, W, scale=3.0):
    s = T((rng.standard_normal((batch * G, Tn, W)) * scale).astype(np.float32))
    return N(ops.window_softmax(s, 1.0)).reshape(batch, G * Tn, W)


def values(rng, batch, Tn, D, kind):
    v = rng.standard_normal((batch, Tn, D)).astype(np.float32)
    if kind == "large":                 # +-large entries: one outlier sets the block's step
        v[:, ::3, 0] = np.float32(3e37)
        v[:, 1::5, -1] = np.float32(-1e30)
    if kind == "zero_block":            # block 0 all +0.0 (step 1.0), another all -0.0
        v[0] = 0.0
        if batch > 1:
            v[1] = np.float32(-0.0)
    if kind == "tiny":                  # FTZ territory: max * recip(127) flushes, step 1.0
        v = (v * 1e-37).astype(np.float32)
    return v


# ------------------------------------------------------------------------------ 1. kernels
@pytest.mark.parametrize("kind", ["normal", "adv", "zeros", "tiny", "large"])
def test_step_rule_bits(kind):
    rng = np.random.default_rng(5)
    x = {"normal": rng.standard_normal((9, 37)), "adv": TK.adversarial(rng, (9, 37), nonfinite=False),
         "zeros": np.zeros((3, 5)), "tiny": rng.standard_normal((4, 70)) * 1e-37,
         "large": rng.uniform(-3e38, 3e38, (4, 70))}[kind].astype(np.float32)
    s = ops.int8_absmax_step(T(x))
    assert_bits(s, R.int8_absmax_step(x), kind)
    assert bool((s > 0).all())
    if kind in ("zeros", "tiny"):
        assert N(s).tolist() == [1.0] * x.shape[0]            # no division by zero: every code 0
        assert not ops.int8_quantize(T(x), s).any()


@pytest.mark.parametrize("batch,G,Tn,D", [(1, 1, 1, 4), (2, 1, 13, 8), (3, 3, 7, 6), (2, 2, 33, 5)])
@pytest.mark.parametrize("kind", ["normal", "large", "zero_block"])
def test_full_pv_bits(batch, G, Tn, D, kind, int8_path):
    rng = np.random.default_rng(batch * 101 + G * 7 + Tn)
    p, v = causal_p(rng, batch, G, Tn), values(rng, batch, Tn, D, kind)
    o = quant.matmul_pv(T(p), T(v))
    assert_bits(o, R.int8_pv_full(p, v), f"int8 P·V {kind}")
    if kind == "zero_block":
        assert not o[0].any()


@pytest.mark.parametrize("batch,G,Tn,D,W", [(1, 1, 1, 4, 1), (2, 1, 9, 8, 4), (1, 3, 37, 6, 8),
                                            (2, 2, 5, 3, 5), (1, 1, 40, 5, 33), (2, 2, 11, 4, 1)])
@pytest.mark.parametrize("kind", ["normal", "large", "zero_block", "tiny"])
def test_band_pv_bits(batch, G, Tn, D, W, kind):
    rng = np.random.default_rng(batch * 7919 + G * 131 + Tn * 17 + W)
    p, v = band_p(rng, batch, G, Tn, W), values(rng, batch, Tn, D, kind)
    assert_bits(quant.band_mix(T(p), T(v)), R.int8_pv_band(p, v), f"int8 band mix {kind}")


def test_int32_sum_exact_at_the_largest_k(int8_path):
    # K = 133144 keys, every code +127 (or alternating signs): the sum 133144 * 127^2 lies just
    # below 2^31; a float32 or a saturating sum would not give these bits.
    K = (2**31 - 1) // (127 * 127)
    assert K == 133144
    p = np.ones((1, 2, K), dtype=np.float32)
    p[0, 1, ::2] = np.float32(0.5)                       # codes 64 at the even keys of row 1
    for sign in (1.0, -1.0):
        v = np.full((1, K, 3), sign, dtype=np.float32)
        v[0, ::2, 1] = -sign
        o = quant.matmul_pv(T(p), T(v))
        assert_bits(o, R.int8_pv_full(p, v), "largest K")
        step = R.mul(np.float32(1.0), R.recip(np.float32(127.0)))     # both blocks' max is 1.0
        assert N(o)[0, 0, 0] == R.mul(np.float32(sign * K * 127 * 127), R.mul(step, step))
    band = torch.zeros((1, 1, K + 1), dtype=torch.int8)
    with pytest.raises(RuntimeError, match="W <= 133144"):
        ops.int8_band_mix(band, torch.zeros((1, 1, 2), dtype=torch.int8), torch.ones(1), torch.ones(1))


def test_band_sum_exact_on_a_long_window():
    # every valid term +127 * +-127 over 2048 keys: the int32 sums, not float ones
    Tn = W = 2048
    qp = torch.full((1, Tn, W), 127, dtype=torch.int8)
    qv = torch.full((1, Tn, 2), 127, dtype=torch.int8)
    qv[0, 1::2, 1] = -127
    o = ops.int8_band_mix(qp, qv, torch.ones(Tn), torch.ones(1))
    t = np.arange(Tn)
    assert N(o)[0, :, 0].tolist() == ((t + 1) * 127 * 127).astype(np.float32).tolist()
    assert N(o)[0, :, 1].tolist() == (((t + 2) // 2 - (t + 1) // 2) * 127 * 127).astype(np.float32).tolist()


# ------------------------------------------------------------------------------ 2. backward, accuracy
def _grads(fn, p, v, g):
    pt, vt = T(p).requires_grad_(), T(v).requires_grad_()
    o = fn(pt, vt)
    o.backward(T(g))
    return o, pt.grad, vt.grad


@pytest.mark.parametrize("batch,G,Tn,D", [(2, 1, 13, 8), (1, 3, 7, 6)])
def test_full_backward_is_the_float_shadow(batch, G, Tn, D):
    rng = np.random.default_rng(G * 3 + Tn)
    p, v = causal_p(rng, batch, G, Tn), values(rng, batch, Tn, D, "normal")
    g = rng.standard_normal((batch, G * Tn, D)).astype(np.float32)
    _, gp, gv = _grads(quant.matmul_pv, p, v, g)
    egp, egv = R.int8_pv_full_backward(g, p, v)
    assert_bits(gp, egp, "gP = gO Vh^T")
    assert_bits(gv, egv, "gV = Ph^T gO")


@pytest.mark.parametrize("batch,G,Tn,D,W", [(2, 1, 9, 8, 4), (1, 3, 37, 6, 8)])
def test_band_backward_is_the_float_shadow(batch, G, Tn, D, W):
    rng = np.random.default_rng(G * 5 + Tn + W)
    p, v = band_p(rng, batch, G, Tn, W), values(rng, batch, Tn, D, "normal")
    g = rng.standard_normal((batch, G * Tn, D)).astype(np.float32)
    _, gp, gv = _grads(quant.band_mix, p, v, g)
    egp, egv = R.int8_pv_band_backward(g, p, v)
    assert_bits(gp, egp, "gP = band_scores(gO, Vh)")
    assert_bits(gv, egv, "gV = band_mix_t(Ph, gO)")


def _attention(q, k, v, window, int8):
    """Full (window None) or windowed attention through int8 P·V, as model.py composes it."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    if window:
        return repops.window_attention(q, k, v, window, scale, mix=quant.band_mix if int8 else None)
    batch, M, Tn = q.shape[0], q.shape[1], k.shape[1]
    s = repops.matmul(q, k.transpose(1, 2)).view(batch * M // Tn, Tn, Tn)
    p = repops.causal_softmax(s, scale).view(batch, M, Tn)
    return (quant.matmul_pv if int8 else repops.matmul)(p, v)


@pytest.mark.parametrize("G,W", [(1, 9), (2, 40)])
def test_window_at_least_t_gives_the_full_int8_bits(G, W):
    rng = np.random.default_rng(G + W)
    Tn, D = 9, 8
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((2, G * Tn, D), (2, Tn, D), (2, Tn, D)))
    g = rng.standard_normal((2, G * Tn, D)).astype(np.float32)
    out = []
    for window in (None, W):
        ts = [T(x).requires_grad_() for x in (q, k, v)]
        o = _attention(*ts, window, int8=True)
        o.backward(T(g))
        out.append([o] + [t.grad for t in ts])
    for name, a, b in zip(("o", "gq", "gk", "gv"), *out):
        assert_bits(a, N(b), name)


@pytest.mark.parametrize("window", [None, 6])
def test_accuracy_against_float64_attention(window):
    rng = np.random.default_rng(11)
    Tn, D = 32, 16
    q, k, v = (rng.standard_normal((3, Tn, D)).astype(np.float32) for _ in range(3))
    o = N(_attention(T(q), T(k), T(v), window, int8=True)).astype(np.float64)
    s = np.einsum("btd,bjd->btj", q.astype(np.float64), k.astype(np.float64)) / math.sqrt(D)
    t, j = np.arange(Tn)[:, None], np.arange(Tn)[None, :]
    mask = (j <= t) & (j > t - (window or Tn))
    s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ref = p @ v.astype(np.float64)
    err = np.abs(o - ref).max() / np.abs(ref).max()
    assert err < 2e-2, err                 # two 8-bit operands: about 1% of the output's range
    assert err > 1e-6                      # it really went through int8


# ------------------------------------------------------------------------------ 3. runs
STEPS = 4
# layer 0 windowed (W = 5 < T = 16), layer 1 (the last) full: both forms of int8 P·V in one run
PV = [*TINY, "--quant=int8", "--int8_pv=1", "--attn_window=5", f"--max_steps={STEPS}", "--checkpoint_every=2",
      "--eval_every=0", "--sample_tokens=0", "--threads=1", "--dist_timeout=30"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), seed=7, lines=1500)



@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    base = tmp_path_factory.mktemp("pv")
    out = {}
    for world in (1, 2, 4):
        run = base / f"r{world}" / "run"
        if world > 1:
            share_secret(out[1], run)
        run.parent.mkdir(exist_ok=True)
        proc = run_process(launcher(world) + [f"--run_dir={run}", f"--data_dir={corpus}", *PV],
                           env=other_kernels_env() if world == 2 else launch_env(),
                           capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        out[world] = run
    return out


def test_chains_identical_for_1_2_and_4_ranks(runs):
    chain = (runs[1] / "chain.jsonl").read_bytes()
    genesis = json.loads(chain.splitlines()[0])["config"]
    assert genesis["int8_pv"] is True and genesis["quant"] == "int8" and genesis["attn_window"] == 5
    for world in (2, 4):
        assert (runs[world] / "chain.jsonl").read_bytes() == chain, f"R = {world}"
        for ckpt in sorted((runs[1] / "checkpoints").iterdir()):
            assert (runs[world] / "checkpoints" / ckpt.name).read_bytes() == ckpt.read_bytes(), (world, ckpt.name)


def test_audit_match_and_a_forged_int8_pv_is_a_mismatch(runs, corpus, tmp_path):
    proc = audit(runs[1], "--step", 3, corpus=corpus)
    assert proc.returncode == 0 and "MATCH: steps 3..3" in proc.stdout, proc.stdout + proc.stderr
    run = copy_run(runs[1], tmp_path / "run")
    records = chain_records(run)
    del records[0]["config"]["int8_pv"]                     # the genesis of a run without it
    write_chain(run, reseal(records))
    cfg = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**cfg, "int8_pv": False}, indent=2))
    proc = audit(run, "--step", 3, corpus=corpus)
    assert proc.returncode == 1 and mismatch_lines(proc), proc.stdout + proc.stderr
    # the genesis state (the calibration forward runs int8 P·V: its s_x differ) and the step
    lines = mismatch_lines(proc)
    assert lines[0].startswith("MISMATCH at step 0: genesis record") and "_sx" in lines[0], proc.stdout
    assert any(line.startswith("MISMATCH at step 3: field state_hash") for line in lines), proc.stdout


@pytest.mark.parametrize("mode", ["none", "int8"])
def test_the_default_path_is_unchanged(mode, monkeypatch):
    """int8_pv off (the default) never reaches quant.matmul_pv or quant.band_mix, and the genesis config has no int8_pv
    key, so runs without it keep their bits and genesis bytes (a run with it differs already at
    its genesis state: the forged-int8_pv audit above)."""
    def refuse(*args):
        raise AssertionError("int8 P·V used with int8_pv off")

    monkeypatch.setattr(quant, "matmul_pv", refuse)
    monkeypatch.setattr(quant, "band_mix", refuse)
    for window in (0, 5):
        model = Llama(ModelConfig(n_layer=2, d_model=32, n_head=2, d_hidden=64, seq_len=16, quant=mode,
                                  attn_window=window), seed=1)
        idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
        model(idx, idx).backward()
    assert "int8_pv" not in config.decisive_config(config.Config(quant=mode))
    assert config.decisive_config(config.Config(quant="int8", int8_pv=True))["int8_pv"] is True


def test_int8_pv_needs_quant_int8_one_line_error(corpus, tmp_path):
    proc = script("train.py", f"--run_dir={tmp_path / 'run'}", f"--data_dir={corpus}", "--int8_pv=1")
    assert_one_line_error(proc, "train.py")
    assert "--int8_pv=True and --quant='none'" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags,named", [(["--seq_len=133145"], "--seq_len=133145"),
                                         (["--device=mps"], "--int8_pv=True and --device='mps'")])
def test_config_rules(flags, named):
    cfg = config.parse_config(["--quant=int8", "--int8_pv=1", *flags])
    with pytest.raises(config.UsageError, match=re.escape(named)):
        config.validate(cfg)


def test_a_head_whose_probabilities_round_to_zero_stops_the_run(corpus, tmp_path, monkeypatch, capsys):
    """A step size so large that every probability of key/value head 0 rounds to 0: that head's
    output is 0, so its value rows of wqkv and its columns of wo get exactly zero gradients
    while both tensors as a whole still learn. The per-head check stops the run (one line)."""
    real = quant.quantize_blocks

    def head0_rounds_to_zero(x2):
        q, s = real(x2)
        if bool((x2 >= 0).all()) and x2.shape[1] == 16:      # the full layer's P rows (V has signs)
            dead = (torch.arange(x2.shape[0]) // 16) % 2 == 0  # block b = batch * Hkv + j: head j = 0
            s = torch.where(dead, torch.tensor(1e30), s)     # a constant: no arithmetic (guard.py)
            q = repops.ops.int8_quantize(x2, s)
        return q, s

    monkeypatch.setattr(quant, "quantize_blocks", head0_rounds_to_zero)
    argv = [f"--run_dir={tmp_path / 'run'}", f"--data_dir={corpus}", *TINY, "--quant=int8", "--int8_pv=1",
            "--max_steps=6", "--dead_tensor_steps=3", "--eval_every=0", "--sample_tokens=0"]
    assert train.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train.py: error (rank 0): step 3: the gradient of layers."), err
    assert "(value head 0)" in err[0] or "(query head 0)" in err[0], err[0]
    assert "wqkv rows" in err[0] or "wo columns" in err[0], err[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="hardware: no CUDA GPU on this machine (CPU = CUDA bits)")
@pytest.mark.parametrize("batch,G,Tn,D,W", [(2, 1, 9, 8, 4), (1, 3, 37, 6, 8), (2, 2, 33, 16, 40)])
def test_cpu_equals_cuda(batch, G, Tn, D, W):
    rng = np.random.default_rng(G + Tn + W)
    v = values(rng, batch, Tn, D, "large")
    g = rng.standard_normal((batch, G * Tn, D)).astype(np.float32)
    for fn, p in ((quant.matmul_pv, causal_p(rng, batch, G, Tn)), (quant.band_mix, band_p(rng, batch, G, Tn, W))):
        cpu = _grads(fn, p, v, g)
        pt, vt = T(p).cuda().requires_grad_(), T(v).cuda().requires_grad_()
        o = fn(pt, vt)
        o.backward(T(g).cuda())
        for name, a, b in zip(("o", "gP", "gV"), cpu, (o, pt.grad, vt.grad)):
            assert b.is_cuda
            assert_bits(b, N(a), f"{fn.__name__} {name}")
    x = TK.adversarial(rng, (7, 50), nonfinite=False)
    assert_bits(ops.int8_absmax_step(T(x).cuda()), N(ops.int8_absmax_step(T(x))), "step rule")
