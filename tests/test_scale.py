"""Open-1B's shape in CI (docs/scale.md): --preset=open1b-mini, a few steps on 2 cores.

- the open1b preset has the reference shape (1.61B parameters, counted from the issue's
  formula here), any key overrides it, and an unknown preset is one error line;
- grouped-query attention: the chain is byte-identical for R = 1 and R = 2 (torchrun), the
  audit prints MATCH, and the dispatch guard (tests/test_guard.py) sees only RepOps and data
  movement in a step with GQA, recomputation and dropout;
- the gradient of the attention with shared key/value heads agrees with a float64 PyTorch
  reference that repeats the heads (accuracy, with a tolerance);
- per-block recomputation and offloading, each on and off and both on (the open1b preset's
  combination), write the same chain and checkpoint bytes, and an audit with both on matches;
- a vocab larger than the corpus's trains and audits; a smaller one is refused (exit 2).
"""
import math
import subprocess
import sys

import pytest
import torch

import config
import data
import rundir
import train
from model import Llama, ModelConfig, param_shapes
from test_distributed import env, torchrun_cmd
from test_guard import OpRecorder, report, violations
from tiny import assert_one_line_error, make_corpus, script, share_secret

STEPS, CKPT_EVERY = 2, 1
MINI = ["--preset=open1b-mini", "--seq_len=32", f"--max_steps={STEPS}", f"--checkpoint_every={CKPT_EVERY}",
        "--warmup_steps=1", "--eval_every=0", "--sample_tokens=0", "--threads=1", "--dropout=0.1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("scale"), seed=5, lines=1500)


def run_train(cwd, corpus, *extra, world=1):
    cwd.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(train.__file__)] if world == 1 else torchrun_cmd(world)
    proc = subprocess.run(cmd + ["--run_dir=run", f"--data_dir={corpus}", *MINI, *extra], cwd=cwd,
                          env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return cwd / "run"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    """{name: run dir}: R = 1, R = 2, R = 1 with recomputation off and offloading on, and R = 1
    with both on (the open1b preset's combination), all under R = 1's secret."""
    base = tmp_path_factory.mktemp("runs")
    out = {"r1": run_train(base / "r1", corpus)}
    share_secret(out["r1"], base / "r2" / "run")
    out["r2"] = run_train(base / "r2", corpus, world=2)
    share_secret(out["r1"], base / "memory" / "run")
    out["memory"] = run_train(base / "memory", corpus, "--recompute=0", "--offload=1")
    share_secret(out["r1"], base / "both" / "run")
    out["both"] = run_train(base / "both", corpus, "--recompute=1", "--offload=1")
    return out


def test_open1b_preset_is_the_reference_shape():
    cfg = config.resolve(config.parse_config(["--preset=open1b"]), 50257)
    assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.n_kv_head, cfg.d_hidden, cfg.vocab_size,
            cfg.seq_len) == (24, 2048, 16, 4, 5632, 128256, 4096)
    assert cfg.d_model // cfg.n_head == 128 and cfg.recompute
    L, d, V, Dh, hid = 24, 2048, 128256, 128, 5632
    per_layer = (16 + 2 * 4) * Dh * d + d * d + 2 * hid * d + d * hid + 2 * d
    expected = 2 * V * d + L * per_layer + d + d          # final norm, emb_norm
    counted = sum(math.prod(s) for s in param_shapes(train.model_config(cfg, 50257)).values())
    assert counted == expected and round(counted / 1e9, 2) == 1.61


def test_preset_keys_can_be_overridden_in_any_order():
    a = config.parse_config(["--seq_len=1024", "--preset=open1b", "--n_kv_head=8"])
    assert (a.seq_len, a.n_kv_head, a.n_layer) == (1024, 8, 24)
    mini = config.resolve(config.parse_config(["--preset=open1b-mini"]), 256)
    assert mini.d_model // mini.n_head == 128 and mini.n_head == 4 * mini.n_kv_head
    assert mini.d_hidden == round(2.75 * mini.d_model)


def test_unknown_preset_and_bad_n_kv_head_are_one_line(corpus, tmp_path):
    for bad in ("--preset=open2b", "--n_kv_head=3"):
        proc = script("train.py", bad, f"--run_dir={tmp_path / 'x'}", f"--data_dir={corpus}")
        assert_one_line_error(proc, "train.py")
        assert not (tmp_path / "x").exists()


def test_default_n_kv_head_keeps_the_fused_qkv_shape():
    model = Llama(ModelConfig(n_layer=1, d_model=32, n_head=4, d_hidden=64), seed=1)
    gqa = Llama(ModelConfig(n_layer=1, d_model=32, n_head=4, n_kv_head=2, d_hidden=64), seed=1)
    assert model.layers[0].wqkv.shape == (96, 32) and gqa.layers[0].wqkv.shape == (64, 32)


def test_gqa_chain_identical_across_world_sizes_and_audit_matches(runs):
    ref = (runs["r1"] / "chain.jsonl").read_bytes()
    assert len(ref.splitlines()) == STEPS + 1
    assert (runs["r2"] / "chain.jsonl").read_bytes() == ref
    proc = script("audit.py", "--run_dir", runs["r2"], "--step", STEPS)
    assert proc.returncode == 0 and "MATCH" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("other", ["memory", "both"])
def test_recomputation_and_offloading_do_not_change_the_bits(runs, other):
    # r1 recomputes and keeps its state in memory; "memory" does neither (its moments and a
    # waiting gradient live in temp files); "both" recomputes and offloads (the open1b preset)
    assert (runs[other] / "chain.jsonl").read_bytes() == (runs["r1"] / "chain.jsonl").read_bytes()
    ckpts = [sorted(p.name for p in (runs[k] / "checkpoints").iterdir()) for k in ("r1", other)]
    assert ckpts[0] == ckpts[1] and len(ckpts[0]) == STEPS + 1
    for name in ckpts[0]:
        assert (runs["r1"] / "checkpoints" / name).read_bytes() == \
            (runs[other] / "checkpoints" / name).read_bytes()


@pytest.mark.parametrize("recompute", ["off", "on"])
def test_offloaded_audit_matches(runs, recompute):
    proc = script("audit.py", "--run_dir", runs["both" if recompute == "on" else "r1"], "--step", STEPS,
                  "--offload", "on", "--recompute", recompute)
    assert proc.returncode == 0 and "MATCH" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("offload", [0, 1])
def test_guard_sees_only_repops_with_gqa_and_recompute(corpus, offload):
    cfg = config.parse_config([*MINI, f"--data_dir={corpus}", f"--offload={offload}"])
    tokens = data.TokenData(corpus, cfg.seed)
    state = train.TrainState(config.resolve(cfg, tokens.vocab_size), tokens.vocab_size)
    assert cfg.recompute and cfg.n_kv_head < cfg.n_head
    with OpRecorder() as rec:
        train.train_step(state, tokens, cfg)
    assert {"repops::matmul", "repops::dropout", "repops::adamw_"} <= set(rec.counts), report(rec.counts)
    assert not violations(rec.counts), f"work outside RepOps: {violations(rec.counts)}\n" + report(rec.counts)


def reference_attention(model, layer, h):
    """float64 PyTorch attention with each key/value head repeated for its query heads."""
    B, T, d = h.shape
    H, Hkv = model.cfg.n_head, model.n_kv_head
    Dh, G = d // H, H // Hkv
    qkv = (h.double() @ layer.wqkv.double().T).view(B, T, H + 2 * Hkv, Dh)
    q, k, v = qkv.split([H, Hkv, Hkv], dim=2)
    cos, sin = model.rope_cos[:T].double()[None, :, None], model.rope_sin[:T].double()[None, :, None]

    def rope(x):                                   # interleaved pairs (x[2i], x[2i+1])
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)

    q, k = rope(q), rope(k)
    k, v = (t.repeat_interleave(G, dim=2) for t in (k, v))     # query head j*G+g uses kv head j
    s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(Dh)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.einsum("bhts,bshd->bthd", torch.softmax(s, -1), v).reshape(B, T, d)
    return o @ layer.wo.double().T


@pytest.mark.parametrize("n_kv_head", [1, 2, 4])
def test_gqa_gradient_matches_float64_reference(n_kv_head):
    model = Llama(ModelConfig(n_layer=1, d_model=64, n_head=4, n_kv_head=n_kv_head, d_hidden=64,
                              seq_len=16, init_std=0.2), seed=11)
    layer = model.layers[0]
    gen = torch.Generator().manual_seed(n_kv_head)
    h = torch.randn(2, 16, 64, generator=gen).requires_grad_()
    g_out = torch.randn(2, 16, 64, generator=gen)
    out = model._attention(0, layer, h, 2, 16)
    grads = torch.autograd.grad(out, [h, layer.wqkv, layer.wo], g_out)
    h64 = h.detach().double().requires_grad_()
    ref = reference_attention(model, layer, h64)
    ref_grads = torch.autograd.grad(ref, [h64, layer.wqkv, layer.wo], g_out.double())
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    for name, g, r in zip(("h", "wqkv", "wo"), grads, ref_grads):
        # float32 rounding: errors relative to the gradient's largest entry
        torch.testing.assert_close(g.double(), r.double(), rtol=1e-4, atol=1e-5 * float(r.abs().max()),
                                   msg=f"d/d{name}")


def test_padded_vocab_trains_and_audits(tmp_path, corpus):
    run = run_train(tmp_path / "padded", corpus, "--vocab_size=300")
    genesis = (run / "chain.jsonl").read_text().splitlines()[0]
    assert '"vocab_size":300' in genesis.replace(" ", "")
    proc = script("audit.py", "--run_dir", run, "--step", STEPS)
    assert proc.returncode == 0 and "MATCH" in proc.stdout, proc.stdout + proc.stderr
    tensors, _ = rundir.load_checkpoint(run / "checkpoints" / f"step_{STEPS:08d}.safetensors")
    assert tensors["params.tok_emb"].shape == (300, 512) and tensors["params.lm_head"].shape == (300, 512)


def test_vocab_smaller_than_the_corpus_is_refused(tmp_path, corpus):
    proc = script("train.py", f"--run_dir={tmp_path / 'small'}", f"--data_dir={corpus}", *MINI, "--vocab_size=200")
    assert_one_line_error(proc, "train.py")
    assert "vocab" in proc.stderr and not (tmp_path / "small").exists()
