"""Run by tests/test_interrupt.py as its own pytest session (the name does not match test_*.py, so
the suite never collects it): a test that starts a child which would sleep for ten minutes,
writes the child's pid to $REPOPS_INTERRUPT_PIDFILE, and waits for it."""
import os
import sys

from tiny import start_process


def test_waits_for_a_long_child():
    child = start_process([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["REPOPS_INTERRUPT_PIDFILE"] + ".tmp", "w") as f:
        f.write(str(child.pid))
    os.rename(os.environ["REPOPS_INTERRUPT_PIDFILE"] + ".tmp", os.environ["REPOPS_INTERRUPT_PIDFILE"])
    child.wait()
