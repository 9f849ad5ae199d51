"""How many CPU threads the training steps run on: measured, not guessed.

    chooser = threads.Chooser(requested=0)          # --threads 0: measure; N > 0: N threads
    for step in ...:
        fields = chooser.run(lambda: train_step(state, data, cfg))

Every thread count gives the same bits (contract §2), so the choice is about speed alone. On a
machine whose cores other jobs hold, a step on torch's default count (one thread per core) can be
hundreds of times slower than on one thread: each of a step's hundreds of parallel regions waits
for a time slice on the busy core (docs/performance.md, "Threads"). The load average cannot tell
(it counts this process's own threads, and lags by a minute), so the steps themselves decide:
with --threads 0 the first step runs on torch's default count, the second is timed on it and the
third on one thread, and the faster of the two is kept, unless it is less than REQUIRED times
faster (one sample each: a small difference is noise). The comparison is made again after
FIRST_GAP steps, then after twice as many each time the choice stays (up to MAX_GAP), so a load
that comes or goes is followed at the cost of one step on the other count now and then.
train.py (one rank on the CPU) and the audit's replays use it; a rank of a multi-rank run keeps
its count (torchrun gives each one OMP_NUM_THREADS=1), and so does a GPU run.
"""
import time

import torch

REQUIRED = 1.25      # the other count is kept only when its step is this many times faster
FIRST_GAP = 8        # steps between the first comparison and the next
MAX_GAP = 512        # the longest gap between two comparisons


class Chooser:
    """Runs steps (run) on the thread count it chooses; `say(line)` is told each change."""

    def __init__(self, requested=0, measure=True, say=None):
        self.default = torch.get_num_threads()
        self.say = say
        self.counts = [self.default, 1] if measure and not requested and self.default > 1 else []
        self.current = requested or self.default
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
