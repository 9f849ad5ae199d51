"""Shared by tests/test_units.py and tests/test_attacks.py: tiny runs with unit commitments,
trained in this process, the publisher's reveals and the audit of every unit of a step.

    run = train_in_process(tmp / "run", corpus)           # tiny, --unit_commits=1, N = 3, 8 steps
    audits = audit_every_unit(run, 6, corpus, tmp / "pub")   # {unit: UnitAudit}, each MATCH or not
    receipt = audits["micro_batch:1"].receipt(public_key, {}, {}, train.code_digest())   # unsigned
    by_command = audit_every_unit_by_command(run, 6, corpus, tmp / "pub", tmp / "receipts", keys, ["alice", "bob"])

The publisher reveals each unit's inputs into its own folder (unitaudit.Publisher.reveal);
a dishonest trainer's reveals come from the same code run under the same monkeypatch that
tampered with its training.
"""
import contextlib
import io
import subprocess

import pytest

import audit as audit_py
import train
import unitaudit
import units
from tiny import script, train_args

UNITS = ["--unit_commits=1", "--micro_batches=3", "--max_steps=8", "--checkpoint_every=4"]
STEP = 6                          # audited: after checkpoint 4, so its state comes from a reveal


def train_in_process(run, corpus, *extra):
    """Train the tiny unit run in `run` with train.main; returns run."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = train.main([str(a) for a in train_args(run, corpus, *UNITS, *extra)])
    assert code == 0, err.getvalue()
    return run


def unit_dir(base, unit):
    return base / unit.replace(":", "_")


def reveal_every_unit(run, step, corpus, base):
    """The publisher's reveal of every unit of `step`, each into base/<unit>."""
    pub = unitaudit.Publisher(run, str(corpus))
    n = len(units.read_list(units.list_path(run, step), step)) // 2 + 1
    for unit in units.all_units(n):
        pub.reveal(step, unit, unit_dir(base, unit))
    return n


def audit_every_unit(run, step, corpus, base, reveal=True):
    """{unit: UnitAudit} of every unit of `step`, each from the publisher's reveal in base/<unit>."""
    n = reveal_every_unit(run, step, corpus, base) if reveal else \
        len(units.read_list(units.list_path(run, step), step)) // 2 + 1
    out = {}
    for unit in units.all_units(n):
        a = unitaudit.UnitAudit(str(run), step, str(corpus))
        kind, *args = units.parse(unit, n)
        if kind == "micro_batch":
            a.micro_batch(args[0], directory=unit_dir(base, unit))
        elif kind == "fold":
            a.fold(*args, unit_dir(base, unit))
        else:
            a.update(unit_dir(base, unit))
        out[unit] = a
    return out


def audit(run, *args, corpus=None, in_process=False):
    """audit.py on `run` as a user runs it, in a child process (given minutes: the child starts
    torch and the kernels, a minute and more on a machine loaded by other jobs), or with
    in_process its main() here (the same command line without the start); a CompletedProcess."""
    argv = ["--run_dir", run, *args, *(["--data_dir", corpus] if corpus else [])]
    if not in_process:
        return script("audit.py", *argv, timeout=900)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = audit_py.main([str(a) for a in argv])
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def unit_options(unit):
    """The audit.py options that name a unit: --micro_batch M, --fold_node LO:SIZE or --update."""
    kind, _, rest = unit.partition(":")
    return {"micro_batch": ["--micro_batch", rest], "fold": ["--fold_node", rest], "update": ["--update"]}[kind]


def audit_every_unit_by_command(run, step, corpus, pub, receipts_dir, keys, auditors, in_process=False):
    """Every unit of `step` through the command line: `audit.py --reveal_unit` (the publisher,
    audit.main in this process) into `pub`, then `audit.py --step S --micro_batch M | --fold_node
    LO:SIZE | --update --revealed pub` with its receipt in receipts_dir, the i-th unit signed by
    keys[auditors[i % len(auditors)]] (child processes, or audit.main in this process with
    in_process). Returns {unit: (auditor, the audit's CompletedProcess)}."""
    n = len(units.read_list(units.list_path(run, step), step)) // 2 + 1
    receipts_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for i, unit in enumerate(units.all_units(n)):
        proc = audit(run, "--reveal_unit", f"{step}:{unit}", "--out", pub, corpus=corpus, in_process=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        auditor = auditors[i % len(auditors)]
        out[unit] = auditor, audit(run, "--step", step, *unit_options(unit), "--revealed", pub, "--receipt",
                                   receipts_dir / f"{unit.replace(':', '_')}.json", "--key", keys[auditor],
                                   corpus=corpus, in_process=in_process)
    return out


def mismatches(audits):
    """{unit: findings} of the units that do not MATCH."""
    return {u: a.findings for u, a in audits.items() if a.findings}


@contextlib.contextmanager
def patched(*patches):
    """monkeypatch.setattr for each (object, name, value), undone at the end."""
    mp = pytest.MonkeyPatch()
    for obj, name, value in patches:
        mp.setattr(obj, name, value)
    try:
        yield
    finally:
        mp.undo()
