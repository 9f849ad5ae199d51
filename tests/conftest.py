"""Shared fixtures, and the rule that makes CI fail where a skip would hide a missing tool.

    REPOPS_STRICT=1 python -m pytest tests/ -q -n auto --maxprocesses 4 --dist loadfile   # what .ci/run does

Skips: a test skips only where this machine cannot run the check at all: no CUDA GPU, no Mac,
a CPU without the instruction set a build needs. Such a skip says so by starting its reason with
HARDWARE ("hardware: "), in pytest.skip(...) and in skipif(reason=...) alike:

    pytest.skip("hardware: no CUDA GPU on this machine")
    @pytest.mark.skipif(not torch.cuda.is_available(), reason="hardware: no CUDA GPU on this machine")

Every other skip (a compiler, qemu-user or nvcc that is not installed) is a tool that CI installs,
so under REPOPS_STRICT=1 it is reported as a failure with its reason; without the flag it stays a
skip, so a developer's machine without the cross tools still runs the rest. Write new skips the
same way: no helper to import, only the reason's prefix. The rule holds wherever the skip
happens: in a test, a fixture or a skipif mark (pytest_runtest_makereport below), and at
collection, where a module-level `pytest.importorskip(...)` or `pytest.skip(...,
allow_module_level=True)` skips a whole file (pytest_make_collect_report: under the flag the
module collects one test, `<file>::skipped_at_collection`, that fails with the reason).
tests/test_conftest.py checks the rule on generated test files.
"""
import os
import signal
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (os.path.dirname(_HERE), _HERE):  # repo root (repops) and tests/ (reference)
    if _p not in sys.path:
        sys.path.insert(0, _p)

import repops  # noqa: E402  (the path above makes it importable)

# Importing repops builds nothing; many tests call torch.ops.repops.* directly, so build and
# load the kernels once, up front (a failed build then fails the run with its one-line reason).
repops.load()



def _terminate(signum, frame):
    """SIGTERM ends the run as Ctrl-C does: pytest tears the fixtures down (the processes the
    tests started are stopped, tiny.stop_all) and prints its summary, instead of dying at once
    and leaving them running."""
    raise KeyboardInterrupt(f"terminated by signal {signum}")


signal.signal(signal.SIGTERM, _terminate)


@pytest.fixture(autouse=True)
def _stop_started_processes():
    """After every test, interrupted or not: no process it started (tiny.start_process) survives."""
    yield
    from tiny import stop_all
    stop_all()


def pytest_sessionfinish(session):
    from tiny import stop_all     # what a module- or session-scoped fixture left, too
    stop_all()


HARDWARE = "hardware: "
STRICT = os.environ.get("REPOPS_STRICT", "") == "1"


def skip_reason(report):
    """The reason of a skipped test report (pytest keeps it as (path, line, 'Skipped: why'))."""
    text = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return text.removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under REPOPS_STRICT=1, a skip whose reason does not start with HARDWARE fails."""
    report = (yield).get_result()
    if STRICT and report.skipped and not hasattr(report, "wasxfail"):
        reason = skip_reason(report)
        if not reason.startswith(HARDWARE):
            report.outcome = "failed"
            report.longrepr = f"REPOPS_STRICT=1: this check must run here, but it skipped: {reason}"


class SkippedAtCollection(pytest.Item):
    """Under REPOPS_STRICT=1, what a module that skipped at collection without a hardware reason
    collects instead of nothing: one test that fails with that reason."""

    def __init__(self, *, reason, **kwargs):
        super().__init__(**kwargs)
        self.reason = reason

    def runtest(self):
        pytest.fail(f"REPOPS_STRICT=1: this module must run here, but it skipped at collection: {self.reason}",
                    pytrace=False)

    def reportinfo(self):
        return self.path, None, self.name


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """Under REPOPS_STRICT=1, a module skipped at collection with a reason that does not start with
    HARDWARE collects one failing test (SkippedAtCollection) instead of being skipped."""
    report = (yield).get_result()
    if STRICT and report.skipped and isinstance(collector, pytest.Module):
        reason = skip_reason(report)
        if not reason.startswith(HARDWARE):
            report.outcome, report.longrepr = "passed", None
            report.result = [SkippedAtCollection.from_parent(collector, name="skipped_at_collection", reason=reason)]


@pytest.fixture(params=["vnni", "amx"])
def int8_path(request):
    """Runs a test once per int8 GEMM path of this CPU (repops.select_cpu): the build's SIMD path
    (VNNI on AVX-512 VNNI CPUs, kernels/cpu/int8.cpp) and AMX-INT8 (int8_amx.cpp), which skips
    with a hardware reason where the CPU or Linux gives no AMX. The default is restored after."""
    try:
        repops.select_cpu(int8=request.param)
    except RuntimeError as e:
        pytest.skip(f"{HARDWARE}{str(e).strip().splitlines()[0]}")
    yield request.param
    repops.select_cpu()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A generated corpus, prepared by data.py (one per test module that asks for it)."""
    from tiny import make_corpus
    return make_corpus(tmp_path_factory.mktemp("corpus"), seed=7, lines=600)


@pytest.fixture(scope="session")
def keys(tmp_path_factory):
    """{name: path of a fresh Ed25519 private key (ssh-keygen, no passphrase)} for the auditors
    and the publisher the tests sign as (tiny.make_key; tiny.write_roster names them)."""
    from tiny import make_key
    base = tmp_path_factory.mktemp("keys")
    return {name: make_key(base, name) for name in ("alice", "bob", "carol", "dave", "erin", "mallory", "publisher")}


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """An uninterrupted tiny run (tiny.STEPS steps, checkpoints every tiny.CKPT_EVERY)."""
    from tiny import train
    return train(tmp_path_factory.mktemp("reference") / "run", corpus)
