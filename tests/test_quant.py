"""Native int8 training (quant.py, --quant=int8) is as reproducible and auditable as fp32.

    .venv/bin/python -m pytest tests/test_quant.py -q -x

On a tiny int8 run: the audit replays every step to MATCH; a run stopped and resumed writes the
same chain bytes; the step sizes and their Adam moments (only the learned ones have moments) are
in the state; after every step each weight step size equals the re-pin rule recomputed by the
NumPy reference from the checkpointed weights; a bit flipped in a step size makes the audit name
that tensor; the int8 linear's gradients are the STE and LSQ formulas; the dead-tensor check
stops a run whose gradient path is cut and --dead_tensor_steps=0 turns it off; the config
refuses what the int8 path cannot do. (torchrun R = 1/2/4 with --quant=int8:
tests/test_distributed.py; the op guard with --quant=int8: tests/test_guard.py.)
"""
import math

import numpy as np
import pytest
import torch

import config
import data
import deadcheck
import rundir
import quant
import reference as ref
import repops
import train
from test_tamper import flip_bit
from tiny import (STEPS, TINY, assert_one_line_error, audit, chain_records, copy_run, mismatch_lines,
                  script, train as train_run, train_args)

INT8 = ["--quant=int8"]


@pytest.fixture(scope="module")
def int8_run(corpus, tmp_path_factory):
    return train_run(tmp_path_factory.mktemp("int8") / "run", corpus, *INT8)


def tiny_state(corpus, *extra):
    cfg = config.parse_config([*TINY, f"--data_dir={corpus}", *extra])
    tokens = data.TokenData(corpus, cfg.seed)
    return cfg, tokens, train.TrainState(cfg, tokens.vocab_size)


def test_audit_of_an_int8_run_matches(int8_run):
    proc = audit(int8_run, "--all")
    assert proc.returncode == 0 and "MATCH" in proc.stdout and not mismatch_lines(proc), proc.stdout + proc.stderr
    genesis = chain_records(int8_run)[0]
    assert genesis["config"]["quant"] == "int8" and genesis["config"]["lsq_repin"] is True
    assert "dead_tensor_steps" not in genesis["config"]          # bookkeeping


def test_resume_gives_the_same_chain(int8_run, corpus, tmp_path):
    """Cut the run back to 13 steps and its checkpoints to those <= 10: train.py resumes from
    step 10, re-derives 11..13 equal to their records and writes the rest byte for byte."""
    run = copy_run(int8_run, tmp_path / "run")
    lines = (run / "chain.jsonl").read_bytes().splitlines(keepends=True)
    (run / "chain.jsonl").write_bytes(b"".join(lines[:14]))
    for step, path in rundir.list_checkpoints(run / "checkpoints"):
        if step > 10:
            path.unlink()
    train_run(run, corpus, *INT8)
    assert "resume: from step 10" in (run / "train.log").read_text()
    assert (run / "chain.jsonl").read_bytes() == (int8_run / "chain.jsonl").read_bytes()


def test_resume_with_another_quant_setting_is_refused(int8_run, corpus, tmp_path):
    run = copy_run(int8_run, tmp_path / "run")
    proc = script("train.py", *train_args(run, corpus, "--quant=int8", "--lsq_repin=0"), f"--max_steps={STEPS + 2}")
    assert_one_line_error(proc, "train.py")
    assert "lsq_repin" in proc.stderr


def test_step_sizes_and_their_moments_are_state(corpus):
    names = {"wqkv": 96, "wo": 32, "w_gate_up": 128, "w_down": 32}     # out rows in TINY
    for repin in (True, False):
        _, _, state = tiny_state(corpus, *INT8, f"--lsq_repin={int(repin)}")
        t = state.tensors()
        for i in range(2):
            for lin, rows in names.items():
                sx, sw = f"layers.{i}.{lin}_sx", f"layers.{i}.{lin}_sw"
                assert t["params." + sx].shape == (1,) and t["params." + sw].shape == (rows,)
                assert float(t["params." + sx][0]) > 0 and bool((t["params." + sw] > 0).all())
                assert "adam_m." + sx in t and "adam_v." + sx in t
                assert ("adam_m." + sw in t) == (not repin) and ("adam_v." + sw in t) == (not repin)
    _, _, fp32 = tiny_state(corpus)
    assert not [n for n in fp32.tensors() if n.endswith(("_sx", "_sw"))]


def test_weight_step_sizes_are_repinned_every_step(int8_run):
    """Every checkpoint (the genesis one included) holds s_w = the NumPy reference's re-pin rule
    of its own weights, bit for bit; the activation step sizes have moved away from their init."""
    ckpts = rundir.list_checkpoints(int8_run / "checkpoints")
    assert len(ckpts) >= 3
    for step, path in ckpts:
        tensors, _ = rundir.load_checkpoint(path)
        for name in [n for n in tensors if n.startswith("params.") and n.endswith("_sw")]:
            w = tensors[name[:-3]].numpy()
            assert np.array_equal(tensors[name].numpy().view(np.uint32),
                                  ref.lsq_init(w, w.shape[0]).view(np.uint32)), (step, name)
    first, last = (rundir.load_checkpoint(ckpts[i][1])[0] for i in (0, -1))
    assert not torch.equal(first["params.layers.0.wo_sx"], last["params.layers.0.wo_sx"])


def test_tampered_step_size_is_named_by_the_audit(int8_run, tmp_path):
    run = copy_run(int8_run, tmp_path / "run")
    flip_bit(rundir.checkpoint_path(run / "checkpoints", STEPS), "params.layers.1.w_down_sw")
    proc = audit(run, "--step", str(STEPS))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert any("params.layers.1.w_down_sw" in line for line in mismatch_lines(proc)), proc.stdout


def test_int8_linear_gradients_are_ste_and_lsq():
    """Autograd through quant.linear against the formulas, computed independently in float64."""
    rng = np.random.default_rng(3)
    x = torch.tensor(rng.standard_normal((6, 40)).astype(np.float32), requires_grad=True)
    w = torch.tensor((rng.standard_normal((9, 40)) * 0.05).astype(np.float32), requires_grad=True)
    sx = torch.nn.Parameter(torch.tensor([0.02]))                 # clips the large |x|
    sw = torch.nn.Parameter(torch.empty(9))
    repops.ops.lsq_init_(w.detach(), sw.data)
    y = quant.linear(x, w, sx, sw)
    gy = torch.tensor(rng.standard_normal((6, 9)).astype(np.float32))
    gx, gw, gsx, gsw = torch.autograd.grad(y, (x, w, sx, sw), gy)
    X, W, G = (t.detach().numpy().astype(np.float64) for t in (x, w, gy))
    s_x, s_w = float(sx.detach()), sw.detach().numpy().astype(np.float64)[:, None]
    vx, vw = X / s_x, W / s_w
    xh, wh = np.clip(np.round(vx), -127, 127) * s_x, np.clip(np.round(vw), -127, 127) * s_w
    np.testing.assert_allclose(y.detach().numpy(), xh @ wh.T, rtol=1e-5, atol=1e-6)
    inx, inw = (vx > -127) & (vx < 127), (vw > -127) & (vw < 127)
    assert inx.sum() < inx.size                                    # some activations clip
    np.testing.assert_allclose(gx.numpy(), np.where(inx, G @ wh, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gw.numpy(), np.where(inw, G.T @ xh, 0), rtol=1e-5, atol=1e-6)
    term = lambda v: np.where((v > -127) & (v < 127), np.round(v) - v, np.clip(np.round(v), -127, 127))  # noqa: E731
    want_sx = ((G @ wh) * term(vx)).sum() / math.sqrt(X.size * 127)
    want_sw = ((G.T @ xh) * term(vw)).sum(1) / math.sqrt(40 * 127)
    np.testing.assert_allclose(gsx.numpy(), [want_sx], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gsw.numpy(), want_sw, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- dead tensors
def cut_mlp_path(state):
    """A zero w_gate_up: the MLP's output is exactly 0, so mlp_norm, w_gate_up and w_down get
    exactly zero gradients (swiglu(0) = 0, and its backward multiplies by the zero up half)
    forever; mlp_norm comes first in the flat-gradient order."""
    with torch.no_grad():
        state.params["layers.0.w_gate_up"].zero_()


def test_dead_tensor_check_stops_the_run(corpus):
    cfg, tokens, state = tiny_state(corpus, "--dead_tensor_steps=3")
    cut_mlp_path(state)
    for _ in range(2):
        train.train_step(state, tokens, cfg)
    with pytest.raises(deadcheck.DeadTensorError, match=r"step 3: the gradient of layers\.0\.mlp_norm has been "
                       r"exactly zero in every element for 3 consecutive steps"):
        train.train_step(state, tokens, cfg)
    assert state.step == 2                                         # the refused step wrote nothing


def test_dead_tensor_check_off_and_counting_only_consecutive_steps(corpus):
    cfg, tokens, state = tiny_state(corpus, "--dead_tensor_steps=0")
    cut_mlp_path(state)
    for _ in range(4):
        train.train_step(state, tokens, cfg)
    dead = deadcheck.DeadTensors(["a"], 2)
    for g in (0.0, 1.0, 0.0, -0.0):                                 # -0.0 is zero too
        flags = dead.nonzero_flags({"a": torch.full((3,), g)})
        assert flags.dtype == torch.float32 and flags.tolist() == [float(g != 0.0)]
        try:
            dead.observe(1, flags.tolist())
        except deadcheck.DeadTensorError:
            assert g == -0.0
            break
    else:
        pytest.fail("two consecutive all-zero gradients did not stop the run")
    assert dead.nonzero_flags({"a": torch.tensor([0.0, float("nan")])}).tolist() == [1.0]   # NaN is not zero


def test_dead_tensor_stops_train_py_with_exit_1(corpus, tmp_path):
    """Through train.py: with --init_std=1e-30 every product of two block weights flushes to
    zero (FTZ), so the attention and MLP weights get exactly zero gradients from step 1 on; the
    run stops at step 2 with exit code 1 and names the tensor."""
    proc = script("train.py", *train_args(tmp_path / "run", corpus, "--init_std=1e-30", "--dead_tensor_steps=2"))
    assert proc.returncode == 1 and "dead tensor" in proc.stderr and "layers." in proc.stderr, proc.stderr


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize("flags,key", [(["--quant=int4"], "quant"),
                                       (["--quant=int8", "--d_hidden=200000"], "d_hidden"),
                                       (["--dead_tensor_steps=-1"], "dead_tensor_steps")])
def test_config_refuses(flags, key):
    with pytest.raises(config.UsageError, match=f"--{key}="):
        config.validate(config.parse_config(flags))
