"""The thread count of the training steps (threads.py): --threads N fixes it; --threads 0 starts
on the load average's guess (as sample.py's count) and then keeps whichever of torch's default
count and one thread a step measures faster, comparing again now and then, and gives torch its
count back at the end. A step whose time depends on the thread count stands in for a step on a
busy machine (the real figures: docs/performance.md, "Threads")."""
import time

import pytest
import torch

import threads


@pytest.fixture
def two_threads(monkeypatch):
    """torch's default is 2 threads and the machine looks quiet, whatever this machine is."""
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    yield
    torch.set_num_threads(saved)


def step_taking(seconds_on):
    """A step that sleeps seconds_on[torch's current thread count] and reports that count."""
    def step():
        count = torch.get_num_threads()
        time.sleep(seconds_on[count])
        return count
    return step


def test_threads_for_is_the_load_averages_guess():
    assert threads.threads_for(0, 2, load=0.3) == 2          # a quiet machine: torch's default
    assert threads.threads_for(0, 2, load=5.0) == 1          # other jobs hold the cores
    assert threads.threads_for(3, 2, load=5.0) == 3          # asked for


def test_a_busy_machine_gets_one_thread(two_threads):
    """Two threads 40x slower than one (as measured on a busy 2-core machine): the third step
    tries one thread, which is kept; FIRST_GAP steps later two threads are tried once more, and
    lose; the change is said once."""
    said = []
    chooser = threads.Chooser(say=said.append)
    counts = [chooser.run(step_taking({2: 0.04, 1: 0.001})) for _ in range(14)]
    assert counts == [2, 2] + [1] * threads.FIRST_GAP + [1, 2, 1, 1]
    assert len(said) == 1 and said[0].startswith("threads: 1 from now on")
    chooser.restore()
    assert torch.get_num_threads() == 2


def test_a_quiet_machine_keeps_the_default_and_compares_again_later(two_threads):
    """Two threads faster: the probe on one thread loses and the default stays; the next probe
    comes FIRST_GAP * 2 steps later, and when the machine has got busy meanwhile it switches."""
    chooser = threads.Chooser()
    costs = {2: 0.002, 1: 0.006}
    counts = [chooser.run(step_taking(costs)) for _ in range(3)]
    assert counts == [2, 2, 1] and chooser.current == 2
    costs[2] = 0.05                                            # the machine got busy
    counts = [chooser.run(step_taking(costs)) for _ in range(2 * threads.FIRST_GAP + 1)]
    assert set(counts[:-1]) == {2} and counts[-1] == 1 and chooser.current == 1


def test_a_small_difference_changes_nothing(two_threads):
    chooser = threads.Chooser()
    counts = [chooser.run(step_taking({2: 0.010, 1: 0.009})) for _ in range(6)]
    assert counts == [2, 2, 1, 2, 2, 2]                         # 1.1x is within REQUIRED (1.25x)


def test_a_given_count_is_kept(two_threads):
    chooser = threads.Chooser(requested=2)
    assert [chooser.run(step_taking({2: 0.02, 1: 0.001})) for _ in range(6)] == [2] * 6
    busy = threads.Chooser(measure=False)                      # a rank of torchrun, a GPU run
    assert [busy.run(step_taking({2: 0.02, 1: 0.001})) for _ in range(4)] == [2] * 4
