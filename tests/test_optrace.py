"""optrace.py: per-operator traces of one step, and the diff that names the first differing op.

A tiny model is trained for 3 steps (train.py as a subprocess); audit.py --step 2 --trace
records the replay of step 2. Two recordings of the same step must be identical, and one made
with a deliberately perturbed kernel (one bit of one TreeFold add flipped, in-process) must be
named by the diff as the first difference.
"""
import contextlib
import json
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import audit
import optrace as trace
from tiny import TINY, make_corpus, run_process

ROOT = Path(__file__).resolve().parent.parent
STEP = 2


def script(name, *args):
    return run_process([sys.executable, str(ROOT / name), *map(str, args)], cwd=ROOT,
                       capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("trace")
    corpus = make_corpus(base, seed=5)
    proc = script("train.py", f"--run_dir={base / 'run'}", f"--data_dir={corpus}", *TINY, "--max_steps=3",
                  "--eval_every=0", "--sample_tokens=0")
    assert proc.returncode == 0, proc.stderr
    return base, base / "run"


@pytest.fixture(scope="module")
def audit_trace(run):
    """The trace of step STEP recorded by `audit.py --step STEP --trace`."""
    base, run_dir = run
    path = base / "audit_a.jsonl"
    proc = script("audit.py", "--run_dir", run_dir, "--step", STEP, "--trace", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MATCH" in proc.stdout and f"written to {path}" in proc.stdout, proc.stdout
    return path


class FlipOneBit(TorchDispatchMode):
    """A broken kernel: the first repops::add with `numel` outputs gets its last bit flipped."""

    def __init__(self, numel):
        super().__init__()
        self.numel, self.done = numel, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.name() == "repops::add" and out.numel() == self.numel and not self.done:
            out.view(-1).view(torch.int32)[0] ^= 1
            self.done = True
        return out


def record_in_process(run, path, perturb=False):
    """Replay step STEP in this process (audit.Audit's state) and trace it to path."""
    base, run_dir = run
    a = audit.Audit(str(run_dir))

    @contextlib.contextmanager
    def around(step):
        # The perturbing mode sits below OpTrace, so the trace sees the perturbed kernel's output.
        if step < STEP:
            yield
            return
        with FlipOneBit(sum(p.numel() for p in a.state.params.values()) + 1) if perturb else contextlib.nullcontext():
            with audit.traced(str(path), step, a.run.chain.records[step]):
                yield
    a.replay(STEP, STEP, around)
    return path


def test_trace_covers_the_whole_step(audit_trace):
    header, entries = trace.read(audit_trace)
    assert header["step"] == STEP and header["ops"] == len(entries) > 0
    assert {"machine", "cpu", "torch"} <= set(header["machine"]) and len(header["code_digest"]) == 64
    ops = {e["op"] for e in entries}
    assert all(op.startswith("repops::") for op in ops)
    # forward, backward, TreeFold, clipping and the optimizer
    assert {"repops::matmul", "repops::cross_entropy_backward", "repops::add", "repops::clip_grad",
            "repops::adamw_"} <= ops, ops
    # attention as its composed operators, as every backend lists them (not the CPU's one op)
    assert {"repops::causal_softmax", "repops::causal_softmax_backward"} <= ops, ops
    assert not {"repops::causal_attention", "repops::causal_attention_backward"} & ops, ops
    adamw = next(e for e in entries if e["op"] == "repops::adamw_")
    assert len(adamw["outputs"]) == 3          # in place: p, m and v after the update


def test_two_audits_give_identical_traces(run, audit_trace):
    base, run_dir = run
    path = base / "audit_b.jsonl"
    proc = script("audit.py", "--run_dir", run_dir, "--step", STEP, "--trace", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert trace.diff(audit_trace, path) is None
    proc = script("optrace.py", audit_trace, path)
    n = len(trace.read(path)[1])
    assert proc.returncode == 0 and proc.stdout.strip() == f"traces identical ({n} ops)", proc.stdout


def test_in_process_recording_matches_audit(run, audit_trace):
    path = record_in_process(run, run[0] / "inproc.jsonl")
    assert trace.diff(audit_trace, path) is None


def test_perturbed_kernel_is_named(run, audit_trace):
    path = record_in_process(run, run[0] / "perturbed.jsonl", perturb=True)
    found = trace.diff(audit_trace, path)
    _, entries = trace.read(audit_trace)
    n_grad = next(e["inputs"][0][0] for e in entries if e["op"] == "repops::clip_grad")
    first_fold_add = next(e["i"] for e in entries if e["op"] == "repops::add"
                          and e["outputs"][0]["shape"] == [n_grad + 1])      # gradients + loss
    assert (found["index"], found["op"], found["output"]) == (first_fold_add, "repops::add", 0), found
    assert found["previous"] == entries[first_fold_add - 1]
    proc = script("optrace.py", audit_trace, path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"first difference at op #{first_fold_add} repops::add output 0 (shape " in proc.stdout
    assert f"previous matching op: op #{first_fold_add - 1} {entries[first_fold_add - 1]['op']}" in proc.stdout


def test_nan_payloads_hash_alike():
    a = torch.tensor([1.0, float("nan"), 2.0])
    b = a.clone()
    b.view(torch.int32)[1] = 0x7FC00123            # another quiet NaN payload
    c = a.clone()
    c.view(torch.int32)[1] = 0xFFC00000 - (1 << 32)  # negative NaN
    assert trace.tensor_digest(a) == trace.tensor_digest(b) == trace.tensor_digest(c)
    assert trace.tensor_digest(a) != trace.tensor_digest(torch.tensor([1.0, 0.0, 2.0]))


def one_error_line(proc):
    lines = proc.stderr.strip().splitlines()
    return proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("optrace.py: error:")


def test_cli_bad_files(run, audit_trace, tmp_path):
    assert one_error_line(script("optrace.py", audit_trace, tmp_path / "missing.jsonl"))
    (tmp_path / "text.jsonl").write_text("not json\n")
    assert one_error_line(script("optrace.py", tmp_path / "text.jsonl", audit_trace))
    (tmp_path / "empty.jsonl").write_text("")
    assert one_error_line(script("optrace.py", audit_trace, tmp_path / "empty.jsonl"))
    lines = Path(audit_trace).read_text().splitlines()
    (tmp_path / "cut.jsonl").write_text("\n".join(lines[:-3]) + "\n")     # truncated
    assert one_error_line(script("optrace.py", audit_trace, tmp_path / "cut.jsonl"))
    header = json.loads(lines[0])
    (tmp_path / "other.jsonl").write_text("\n".join([json.dumps({**header, "step": 3})] + lines[1:]) + "\n")
    proc = script("optrace.py", audit_trace, tmp_path / "other.jsonl")
    assert one_error_line(proc) and "different steps" in proc.stderr, proc.stderr
    proc = script("optrace.py", audit_trace)                           # one trace: argparse refuses
    assert one_error_line(proc) and "TRACE" in proc.stderr, proc.stderr


def test_audit_trace_needs_a_single_step(run, tmp_path):
    proc = script("audit.py", "--run_dir", run[1], "--range", "1:2", "--trace", tmp_path / "x.jsonl")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--step" in lines[0], proc.stderr
    assert not (tmp_path / "x.jsonl").exists()
