"""Dead tensors: stop a run whose parameter has had an exactly-zero gradient for too long.

    dead = DeadTensors(names, limit=100)     # names in flat-gradient order; limit 0: off
    flags = dead.nonzero_flags(grads)        # {name: grad_view} -> [P] float32 on their device
    dead.observe(step, flags.tolist())       # raises DeadTensorError naming the tensor

A parameter whose whole gradient is zero (every element +0.0 or -0.0) for `limit` consecutive
steps no longer learns (a quantizer step size that rounds everything to zero, a path cut by a
zero weight), and nothing else would say so. The check compares the step's gradient with zero
where it lies (comparisons, no arithmetic on the training path; on a GPU no gradient crosses to
the host: train.py reads the P flags in the step's one host read, with the loss and the norm).
It is bookkeeping, not decisive: it decides whether the run goes on, never a step's bits, so its
counters are not in the state hash; a resumed run (or an audit replay) counts again from its
checkpoint.
"""
import torch


class DeadTensorError(Exception):
    """A parameter's gradient was exactly zero for `limit` consecutive steps."""


class DeadTensors:
    def __init__(self, names, limit):
        self.limit = limit
        self.zero_steps = dict.fromkeys(names, 0)   # consecutive all-zero steps so far

    def nonzero_flags(self, grads):
        """grads: {name: this step's gradient} in names order -> [P] float32 on their device, 1.0
        where some element is not +-0.0 (NaN counts as nonzero); None when the check is off."""
        if not self.limit:
            return None
        return torch.stack([g.any() for g in grads.values()]).to(torch.float32)   # no bool copy of g

    def observe(self, step, nonzero):
        """nonzero: nonzero_flags(...) as host values, in names order."""
        if not self.limit:
            return
        for name, live in zip(self.zero_steps, nonzero):
            self.zero_steps[name] = 0 if live else self.zero_steps[name] + 1
            if self.zero_steps[name] >= self.limit:
                raise DeadTensorError(
                    f"step {step}: the gradient of {name} has been exactly zero in every element for "
                    f"{self.limit} consecutive steps (dead tensor: it cannot learn); the step is refused. "
                    "Check its init, lr and quantizer step sizes, or pass --dead_tensor_steps=0 to go on")
