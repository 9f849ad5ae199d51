"""Dead tensors: stop a run whose parameter has had an exactly-zero gradient for too long.

    dead = DeadTensors(names, limit=100, heads=(H, Hkv, Dh))   # names in flat-gradient order; limit 0: off
    flags = dead.nonzero_flags(grads)        # {name: grad_view} -> [units] float32 on their device
    dead.observe(step, flags.tolist())       # raises DeadTensorError naming the tensor (or head)

A parameter whose whole gradient is zero (every element +0.0 or -0.0) for `limit` consecutive
steps no longer learns (a quantizer step size that rounds everything to zero, a path cut by a
zero weight), and nothing else would say so. The check compares the step's gradient with zero
where it lies (comparisons, no arithmetic on the training path; on a GPU no gradient crosses to
the host: train.py reads the P flags in the step's one host read, with the loss and the norm).
The attention projections are checked per head as well (heads = (H, Hkv, Dh)): each query, key
and value head's Dh rows of `layers.i.wqkv` and each query head's Dh columns of `layers.i.wo`
are units of their own. A head whose attention output is cut (int8 P·V whose probabilities all
round to zero: O = 0 for that head, so its value rows and its wo columns get zero gradients)
leaves the rest of the tensor learning, so the whole-tensor test alone would never fire.
It is bookkeeping, not decisive: it decides whether the run goes on, never a step's bits, so its
counters are not in the state hash; a resumed run (or an audit replay) counts again from its
checkpoint.
"""
import torch


class DeadTensorError(Exception):
    """A parameter's gradient was exactly zero for `limit` consecutive steps."""


class DeadTensors:
    def __init__(self, names, limit, heads=None):
        self.limit = limit
        self.units = []                  # (label, tensor name, index of its slice or None)
        for name in names:
            self.units.append((name, name, None))
            self.units += head_units(name, heads) if heads else []
        self.zero_steps = {label: 0 for label, _, _ in self.units}   # consecutive all-zero steps so far

    def nonzero_flags(self, grads):
        """grads: {name: this step's gradient} -> [units] float32 on their device, 1.0 where some
        element of the unit is not +-0.0 (NaN counts as nonzero); None when the check is off."""
        if not self.limit:
            return None
        return torch.stack([(grads[n] if idx is None else grads[n][idx]).any()   # no bool copy of g
                            for _, n, idx in self.units]).to(torch.float32)

    def observe(self, step, nonzero):
        """nonzero: nonzero_flags(...) as host values, in units order."""
        if not self.limit:
            return
        for name, live in zip(self.zero_steps, nonzero):       # a unit's label
            self.zero_steps[name] = 0 if live else self.zero_steps[name] + 1
            if self.zero_steps[name] >= self.limit:
                raise DeadTensorError(
                    f"step {step}: the gradient of {name} has been exactly zero in every element for "
                    f"{self.limit} consecutive steps (dead tensor: it cannot learn); the step is refused. "
                    "Check its init, lr and quantizer step sizes, or pass --dead_tensor_steps=0 to go on")


def head_units(name, heads):
    """The per-head units of an attention projection: [(label, name, index)]; [] for others."""
    H, Hkv, Dh = heads
    if name.endswith(".wqkv"):           # rows: H query heads, Hkv key heads, Hkv value heads
        kinds = [("query", i) for i in range(H)] + [("key", i) for i in range(Hkv)] + [("value", i) for i in range(Hkv)]
        return [(f"{name} rows {r * Dh}..{r * Dh + Dh - 1} ({kind} head {i})", name, (slice(r * Dh, r * Dh + Dh),))
                for r, (kind, i) in enumerate(kinds)]
    if name.endswith(".wo"):             # columns: the output of query head h
        return [(f"{name} columns {h * Dh}..{h * Dh + Dh - 1} (query head {h})", name,
                 (slice(None), slice(h * Dh, h * Dh + Dh))) for h in range(H)]
    return []
