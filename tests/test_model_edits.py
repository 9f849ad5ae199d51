"""A user's edit of model.py, through the real commands, in a temporary copy of the repository.

1. The issue's one-line edit (SwiGLU replaced by a stock GELU MLP, `F.gelu(g) * up`) trains under
   the contract: the same chain on 1 and 2 threads, and the audit says MATCH; a run of the same
   edit made with torch's own kernels (the guard bypassed: foreign bits) is never MATCH.
2. An operator the contract does not map (torch.cumsum) is refused by train.py at the probe
   (one line naming model.py's line, exit 2, no run directory), and by audit.py and sample.py on
   a run made before the edit.
3. The default model: the guard changes no byte of its chain and adds no record field.
4. A model that runs a refused operator only in a later step (a code path the probe and the
   trainer's checked first step do not take) trains, unchecked; the audit, which runs every step it
   replays under the mode, refuses it, never MATCH.
5. A stock model's evaluation and end-of-run sample (under the mode) are checked before the run
   directory: an operator only they run is refused there, not after records are published.
"""
import contextlib
import re
import shutil
import sys

import pytest

import torch

import audit
import guard
import model
import train
from tiny import ROOT, TIMEOUT, TINY, assert_one_line_error, chain_records, run_process, share_secret

SWIGLU = '        m = repops.swiglu(self._linear(layer, "w_gate_up", h).view(B * T, -1))\n'
GELU = ('        g, up = self._linear(layer, "w_gate_up", h).view(B * T, -1).chunk(2, dim=-1)\n'
        '        m = torch.nn.functional.gelu(g) * up\n')
CUMSUM = '        m = torch.cumsum(repops.swiglu(self._linear(layer, "w_gate_up", h).view(B * T, -1)), dim=-1)\n'
STEPS = 4
# Runs train.py with the contract's guard bypassed: stock operators run torch's own kernels.
UNGUARDED = ("import contextlib, sys, guard; nothing = lambda *a, **k: contextlib.nullcontext(); "
             "guard.Guard.step = guard.Guard.construction = nothing; guard.Guard.probe = lambda *a, **k: {}; "
             "import train; sys.exit(train.main(sys.argv[1:]))")


def copy_repository(dest):
    """The modules and kernels of this checkout in dest (a user's clone), its kernels built."""
    dest.mkdir()
    for path in ROOT.glob("*.py"):
        shutil.copy(path, dest)
    shutil.copytree(ROOT / "kernels", dest / "kernels")
    build = run_process([sys.executable, "-c", "import repops; repops.load()"], cwd=dest, capture_output=True,
                        text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    return dest


def edit(repo, old, new):
    model = repo / "model.py"
    text = model.read_text()
    assert text.count(old) == 1
    model.write_text(text.replace(old, new))
    return text[:text.index(old)].count("\n") + 1          # the line the edit starts at


def command(repo, name, *args, code=None):
    argv = [sys.executable, *(["-c", code] if code else [str(repo / name)]), *map(str, args)]
    return run_process(argv, cwd=repo, capture_output=True, text=True, timeout=TIMEOUT)


def train_args(run, corpus, *extra):
    return [f"--run_dir={run}", f"--data_dir={corpus}", *TINY, f"--max_steps={STEPS}", "--checkpoint_every=2",
            "--eval_every=0", "--sample_tokens=0", *extra]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return copy_repository(tmp_path_factory.mktemp("clone") / "repo")


@pytest.fixture(scope="module")
def before_the_edit(repo, corpus, tmp_path_factory):
    """A run of the unedited copy (the default model), made before the edits below."""
    run = tmp_path_factory.mktemp("before") / "run"
    proc = command(repo, "train.py", *train_args(run, corpus))
    assert proc.returncode == 0, proc.stderr
    return run


@pytest.fixture(scope="module")
def gelu_runs(repo, corpus, before_the_edit, tmp_path_factory):
    """The GELU edit's runs under one secret: on 1 thread, on 2, and on 1 with the guard bypassed
    (foreign bits); and the audit of the last step of the first and of step 1 of the foreign one,
    made while the edit is in place (the edit is undone afterwards)."""
    edit(repo, SWIGLU, GELU)
    try:
        base = tmp_path_factory.mktemp("gelu")
        one, two, foreign = base / "one", base / "two", base / "foreign"
        proc = command(repo, "train.py", *train_args(one, corpus, "--threads=1", "--eval_every=2", "--sample_tokens=8"))
        assert proc.returncode == 0 and "val loss" in proc.stdout and "sample:" in proc.stdout, proc.stderr
        proc = command(repo, "train.py", *train_args(share_secret(one, two), corpus, "--threads=2"))
        assert proc.returncode == 0, proc.stderr
        proc = command(repo, "train.py", *train_args(share_secret(one, foreign), corpus, "--threads=1"), code=UNGUARDED)
        assert proc.returncode == 0, proc.stderr
        audits = command(repo, "audit.py", "--run_dir", one, "--step", STEPS), \
            command(repo, "audit.py", "--run_dir", foreign, "--step", 1)
    finally:
        edit(repo, GELU, SWIGLU)
    return (one, two, foreign), audits


def test_the_gelu_edit_trains_under_the_contract_and_audits(gelu_runs):
    (one, two, foreign), (audit, foreign_audit) = gelu_runs
    assert (one / "chain.jsonl").read_bytes() == (two / "chain.jsonl").read_bytes()
    assert audit.returncode == 0 and re.search(r"^MATCH: ", audit.stdout, re.M), audit.stdout + audit.stderr
    states = [r["state_hash"] for r in chain_records(foreign)]
    assert states[0] == chain_records(one)[0]["state_hash"]        # the same initial state
    assert states[1] != chain_records(one)[1]["state_hash"]         # torch's kernels: other bits
    assert foreign_audit.returncode == 1, foreign_audit.stdout + foreign_audit.stderr
    assert "MISMATCH at step 1: field state_hash" in foreign_audit.stdout, foreign_audit.stdout


def test_an_unmapped_operator_is_refused_by_every_command(repo, corpus, before_the_edit, tmp_path):
    line = edit(repo, SWIGLU, CUMSUM)
    try:
        refusal = (f"model.py:{line} runs aten::cumsum outside the contract; {guard.INSTEAD['other']} "
                   "(docs/changing-the-model.md)")
        run = tmp_path / "new"
        proc = command(repo, "train.py", *train_args(run, corpus))
        assert_one_line_error(proc, "train.py")
        assert proc.stderr.strip() == f"train.py: error: {refusal}"
        assert not run.exists(), "the refusal comes before the run directory"
        # A run made by this very code with the guard bypassed (torch's cumsum: foreign bits) has
        # this code's digest, so its audit reaches the probe; the sampler reads any run.
        unchecked = tmp_path / "unchecked"
        proc = command(repo, "train.py", *train_args(unchecked, corpus), code=UNGUARDED)
        assert proc.returncode == 0, proc.stderr
        runs = (unchecked, before_the_edit)
        files = [sorted(p.name for p in r.rglob("*")) for r in runs]
        for name, args in (("audit.py", ["--run_dir", unchecked, "--step", 2]),
                           ("sample.py", ["--run_dir", before_the_edit, "--tokens", 5])):
            proc = command(repo, name, *args)
            assert_one_line_error(proc, name)
            assert proc.stderr.strip() == f"{name}: error: {refusal}" and not proc.stdout, proc.stdout
        assert [sorted(p.name for p in r.rglob("*")) for r in runs] == files
    finally:
        edit(repo, CUMSUM, SWIGLU)


def test_the_guard_changes_nothing_of_the_default_model(corpus, tmp_path, monkeypatch):
    """The default model's chain with the guard (its probe, its construction, its checked first
    step) and with the guard bypassed: the same bytes, so the same state hashes and record fields."""
    guarded = tmp_path / "guarded"
    assert train.main(train_args(guarded, corpus)) == 0
    nothing = lambda *a, **k: contextlib.nullcontext()     # noqa: E731
    monkeypatch.setattr(guard.Guard, "step", nothing)
    monkeypatch.setattr(guard.Guard, "construction", nothing)
    monkeypatch.setattr(guard.Guard, "probe", lambda *a, **k: {})
    bare = share_secret(guarded, tmp_path / "bare")
    assert train.main(train_args(bare, corpus)) == 0
    assert (guarded / "chain.jsonl").read_bytes() == (bare / "chain.jsonl").read_bytes()


def test_the_audit_checks_every_step_it_replays(corpus, tmp_path, monkeypatch, capsys):
    """torch.clamp on the loss from step 4 on: the trainer checks its first step only (a pure
    model), so steps 2-4 run torch's own kernels. audit.py --step 4 replays steps 3 and 4 from
    checkpoint 2: step 4 is not the first it replays, and it is refused all the same (exit 2,
    the refusal line), not vouched for as MATCH on a machine that reproduces torch's bits."""
    plain = model.Llama.forward

    def forward(self, idx, targets, zloss=0.0, rng=None):
        loss = plain(self, idx, targets, zloss, rng)
        return torch.clamp(loss, max=1e9) if rng is not None and rng[0] >= STEPS else loss
    monkeypatch.setattr(model.Llama, "forward", forward)
    run = tmp_path / "run"
    assert train.main(train_args(run, corpus)) == 0
    capsys.readouterr()
    code = audit.main(["--run_dir", str(run), "--step", str(STEPS)])
    out, err = capsys.readouterr()
    assert code == 2 and not re.search(r"^MATCH", out, re.M), out + err
    assert re.fullmatch(r"audit\.py: error: tests/test_model_edits\.py:\d+ runs aten::clamp outside the contract; .*\n",
                        err), err


def test_a_stock_model_is_checked_where_it_evaluates_and_samples(repo, corpus, tmp_path):
    """A stock model's evaluation and end-of-run sample run under the mode (guard.Guard.inference):
    an operator only they refuse (F.dropout without the training flag: no step keys its mask)
    stops train.py before the run directory, not at the first evaluation after records are out."""
    unkeyed = GELU + "        m = torch.nn.functional.dropout(m, 0.1)\n"      # training=True, also in eval
    line = edit(repo, SWIGLU, unkeyed)
    try:
        for name, extra in (("evaluates", ["--eval_every=2"]), ("samples", ["--sample_tokens=8"])):
            run = tmp_path / name
            proc = command(repo, "train.py", *train_args(run, corpus, *extra))
            assert_one_line_error(proc, "train.py")
            assert proc.stderr.startswith(f"train.py: error: model.py:{line + 2} runs aten::bernoulli_.float "
                                          "with no step to key its mask outside the contract"), proc.stderr
            assert not run.exists(), f"refused after the run started ({name}): {sorted(run.rglob('*'))}"
    finally:
        edit(repo, unkeyed, SWIGLU)
