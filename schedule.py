"""The run's per-step schedules: the learning rate and the number of micro-batches of each step.

    from schedule import lr_at, micro_batches_at, phase_counts
    lr_at(cfg, 120)              # float64 learning rate of step 120 (1-based); adamw_ rounds it once
    micro_batches_at(cfg, 120)   # N of step 120: cfg.micro_batches, or its micro_batch_phases entry
    phase_counts(cfg)            # every N the run uses (the ranks must divide each one)

Both are decisive (in the genesis config) and are written as exactly specified arithmetic:

* lr_schedule "linear" (the default): linear warmup to lr over warmup_steps, then linear decay
  to min_lr at max_steps, float64 + - * / only (contract §1).
* lr_schedule "cosine": the same warmup, then lr(s) = min_lr + (lr - min_lr) * 0.5 * (1 + c)
  with c = cos(x) the contract's canonical float32 cos (§5.5, ops.cos on one value, the same
  bits on every machine), x = f32(pi * progress) (math.pi is the float64 nearest pi; one
  float64 product, rounded once to float32), progress = min((s - warmup) / (max_steps -
  warmup), 1); the rest in float64 + - * (math.cos is not used: it is not correctly rounded
  everywhere).
* micro-batch phases: micro_batch_phases "N1@S1,N2@S2,..." (S strictly increasing, S1 >= 1):
  steps 1..S1 take cfg.micro_batches, steps S1+1..S2 take N1, and so on. On the command line
  --micro_batches=192@0,288@S1,576@S2 sets both keys (micro_batches=192 and the rest).
"""
import math

import torch

import repops


class ScheduleError(ValueError):
    """A micro_batch_phases string that is not N@S,N@S,... with increasing S."""


def parse_phases(text):
    """[(N, S), ...] of a micro_batch_phases string ("" -> [])."""
    if text == "":
        return []
    phases = []
    for part in text.split(","):
        n, at, s = part.strip().partition("@")
        if not at or not n.isdigit() or not s.isdigit():
            raise ScheduleError(f"phase {part!r} is not N@S (N micro-batches from step S+1 on)")
        phases.append((int(n), int(s)))
    starts = [s for _, s in phases]
    if any(n < 1 for n, _ in phases) or starts[0] < 1 or any(b <= a for a, b in zip(starts, starts[1:])):
        raise ScheduleError(f"phases {text!r}: every N >= 1, and each S >= 1 and larger than the one before")
    return phases


def micro_batches_at(cfg, step):
    """N, the micro-batch count of step (1-based): the last phase whose start S is below step."""
    n = cfg.micro_batches
    for count, start in parse_phases(cfg.micro_batch_phases):
        if step > start:
            n = count
    return n


def phase_counts(cfg):
    """Every micro-batch count the run's steps use, in phase order."""
    return [cfg.micro_batches] + [n for n, _ in parse_phases(cfg.micro_batch_phases)]


def lr_at(cfg, step):
    """Learning rate of step (1-based), as the module docstring specifies."""
    if step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    span = max(cfg.max_steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    if cfg.lr_schedule == "cosine":
        c = repops.ops.cos(torch.tensor([repops.f32(math.pi * progress)], dtype=torch.float32)).tolist()[0]
        return cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1.0 + c)
    return cfg.lr - (cfg.lr - cfg.min_lr) * progress
