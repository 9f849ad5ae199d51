"""How many CPU threads the training steps run on: measured, not guessed.

    chooser = threads.Chooser(requested=0)          # --threads 0: measure; N > 0: N threads
    for step in ...:
        fields = chooser.run(lambda: train_step(state, data, cfg))
    chooser.restore()                               # torch's count as it was
    threads_for(0, torch.get_num_threads(), os.getloadavg()[0])   # sample.py's count: the load's guess

Every thread count gives the same bits (contract §2), so the choice is about speed alone. On a
machine whose cores other jobs hold, a step on torch's default count (one thread per core) can be
hundreds of times slower than on one thread: each of a step's hundreds of parallel regions waits
for a time slice on the busy core (docs/performance.md, "Threads"). The load average is a guess
(it counts this process's own threads, and lags by a minute): it picks the count the first steps
run on (threads_for, as sample.py picks its count), and then the steps themselves decide: the
first step warms up, the second is timed, the third runs on the other count (torch's default or
one), and the faster of the two is kept, unless it is less than REQUIRED times faster (one
sample each: a small difference is noise). The comparison is made again after
FIRST_GAP steps, then after twice as many each time the choice stays (up to MAX_GAP), so a load
that comes or goes is followed at the cost of one step on the other count now and then.
train.py (one rank on the CPU) and the audit's replays use it; a rank of a multi-rank run keeps
its count (torchrun gives each one OMP_NUM_THREADS=1), and so does a GPU run.
"""
import os
import time

import torch

REQUIRED = 1.25      # the other count is kept only when its step is this many times faster
FIRST_GAP = 8        # steps between the first comparison and the next
MAX_GAP = 512        # the longest gap between two comparisons


def threads_for(requested, default, load):
    """The thread count to start with: `requested`, or with 0 torch's `default` unless the
    1-minute load average `load` says other jobs hold the cores (>= default - 0.5): then 1.
    sample.py keeps it (a decode step is a few small kernels, docs/sampling.md); Chooser starts
    with it and measures."""
    return requested or (1 if load >= default - 0.5 else default)


class Chooser:
    """Runs steps (run) on the thread count it chooses; `say(line)` is told each change."""

    def __init__(self, requested=0, measure=True, say=None):
        self.default = self.before = torch.get_num_threads()
        self.say = say
        self.counts = [self.default, 1] if measure and not requested and self.default > 1 else []
        self.current = threads_for(requested, self.default, os.getloadavg()[0]) if self.counts else requested or self.default
        self.steps = 0                  # steps run so far
        self.probe_at = 2               # the step (0-based) that runs on the other count
        self.gap = FIRST_GAP
        self.last = None                # seconds of the latest step on the current count
        torch.set_num_threads(self.current)

    def run(self, step):
        """step() on the chosen count; returns its result."""
        probing = bool(self.counts) and self.steps == self.probe_at and self.last is not None
        other = next(c for c in self.counts if c != self.current) if probing else self.current
        torch.set_num_threads(other)
        t0 = time.perf_counter()
        try:
            result = step()
        finally:
            seconds = time.perf_counter() - t0
            torch.set_num_threads(self.current)
        self.steps += 1
        if not probing:
            self.last = seconds if self.steps > 1 else None     # the first step warms up: not compared
            return result
        if seconds * REQUIRED < self.last:
            if self.say:
                self.say(f"threads: {other} from now on (a step took {self.last * 1000:.0f} ms on {self.current}, "
                         f"{seconds * 1000:.0f} ms on {other}; --threads N fixes the count)")
            self.current, self.last, self.gap = other, seconds, FIRST_GAP
            torch.set_num_threads(other)
        else:
            self.gap = min(2 * self.gap, MAX_GAP)
        self.probe_at = self.steps + self.gap
        return result

    def restore(self):
        """torch's thread count as it was before this chooser (a replay inside a longer program)."""
        torch.set_num_threads(self.before)
