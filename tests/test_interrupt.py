"""A test run stops cleanly: Ctrl-C (SIGINT to pytest's process group, as a terminal sends it) or
SIGTERM (to pytest alone, as `kill` or a CI timeout sends it) ends pytest within seconds with its
summary, and the process a test started (tiny.start_process: its own process group) is gone.

Each case runs pytest on tests/interrupted.py (a test that waits for a ten-minute child) as a
child of this test, signals it once the child is running, and watches both.
"""
import os
import re
import signal
import sys
import time

import pytest

from tiny import ROOT, launch_env, start_process, stop_process

STOP_WITHIN = 10     # seconds from the signal to pytest's exit, on a loaded 2-core machine


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig, to_group", [(signal.SIGINT, True), (signal.SIGTERM, False)], ids=["ctrl_c", "sigterm"])
def test_an_interrupted_run_stops_with_its_summary_and_no_child(tmp_path, sig, to_group):
    pidfile = tmp_path / "child.pid"
    inner = start_process([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "tests" / "interrupted.py")], cwd=ROOT,
                          env=dict(launch_env(), REPOPS_INTERRUPT_PIDFILE=str(pidfile)),
                          # as at a terminal: a launcher in the background (nohup, `cmd &`) hands
                          # its children SIGINT ignored, and Python then never raises KeyboardInterrupt
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                          stdout=open(tmp_path / "out.txt", "w"), stderr=open(tmp_path / "err.txt", "w"))
    try:
        t0 = time.monotonic()
        while not pidfile.exists():
            assert inner.poll() is None, (tmp_path / "out.txt").read_text() + (tmp_path / "err.txt").read_text()
            assert time.monotonic() - t0 < 300, "the inner test did not start its child"
            time.sleep(0.05)
        child = int(pidfile.read_text())
        assert group_alive(child)
        (os.killpg if to_group else os.kill)(inner.pid, sig)
        signalled = time.monotonic()
        rc = inner.wait(timeout=60)
        took = time.monotonic() - signalled
    finally:
        stop_process(inner)
    out = (tmp_path / "out.txt").read_text()
    assert took < STOP_WITHIN, f"pytest took {took:.1f} s to stop after {sig.name}:\n{out}"
    assert rc == pytest.ExitCode.INTERRUPTED, (rc, out)
    assert "KeyboardInterrupt" in out and re.search(r"^(no tests ran|\d+ \w+).* in \d+\.\d+s", out, re.M), out
    t0 = time.monotonic()
    while group_alive(child) and time.monotonic() - t0 < 5:     # init reaps the orphan's zombie
        time.sleep(0.05)
    assert not group_alive(child), f"the test's child (process group {child}) outlived pytest"
