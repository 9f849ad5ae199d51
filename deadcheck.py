"""Dead tensors: stop a run whose parameter has had an exactly-zero gradient for too long.

    dead = DeadTensors(names, limit=100)     # names in flat-gradient order; limit 0: off
    dead.observe(step, {name: grad_view})    # raises DeadTensorError naming the tensor

A parameter whose whole gradient is zero (every element +0.0 or -0.0) for `limit` consecutive
steps no longer learns (a quantizer step size that rounds everything to zero, a path cut by a
zero weight), and nothing else would say so. The check reads the step's folded gradient on the
host (a comparison, no arithmetic on the training path) and is bookkeeping, not decisive: it
decides whether the run goes on, never a step's bits, so its counters are not in the state
hash; a resumed run (or an audit replay) counts again from its checkpoint.
"""
import numpy as np


class DeadTensorError(Exception):
    """A parameter's gradient was exactly zero for `limit` consecutive steps."""


class DeadTensors:
    def __init__(self, names, limit):
        self.limit = limit
        self.zero_steps = dict.fromkeys(names, 0)   # consecutive all-zero steps so far

    def observe(self, step, grads):
        """grads: {name: this step's gradient of the parameter (any device)}."""
        if not self.limit:
            return
        for name, g in grads.items():
            zero = not np.any(g.detach().cpu().numpy())
            self.zero_steps[name] = self.zero_steps[name] + 1 if zero else 0
            if self.zero_steps[name] >= self.limit:
                raise DeadTensorError(
                    f"step {step}: the gradient of {name} has been exactly zero in every element for "
                    f"{self.limit} consecutive steps (dead tensor: it cannot learn); the step is refused. "
                    "Check its init, lr and quantizer step sizes, or pass --dead_tensor_steps=0 to go on")
