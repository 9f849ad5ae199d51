"""TreeFold: the deterministic tree reduction of micro-batch gradients (DESIGN §5).

A step's gradient is the balanced binary tree over g_0 .. g_{N-1} in index order, e.g. for
N = 4: (g0 + g1) + (g2 + g3). Every addition is a RepOps add, so the bits depend only on N:

    fold = LocalFold()
    for m in my_micro_batches:          # a contiguous, power-of-two block of indices
        fold.push(flat_gradient(m))     # holds at most floor(log2 N) + 1 buffers
    subtree = fold.result()
    total = allreduce_tree(subtree)     # recursive doubling across ranks: same tree, all ranks

    simulate_ranks(leaf, n_micro, world)   # one device plays all ranks (audit, tests)

Rank r of R owns micro-batches [r*N/R, (r+1)*N/R); its local fold is the subtree over that
block, and recursive doubling (partner r ^ 1, then r ^ 2, ...) joins neighbouring subtrees in
exactly the order of the single-device tree. The communication backend only moves bytes.
"""
import torch
import torch.distributed as dist

import repops


class TopologyError(ValueError):
    """The number of ranks does not divide the step's micro-batches as a power of two."""


def check_topology(n_micro, world):
    def pow2(x):
        return x > 0 and x & (x - 1) == 0

    if not pow2(n_micro):
        raise TopologyError(f"micro_batches must be a power of two, got {n_micro}")
    if not pow2(world) or n_micro % world:
        # List the allowed sizes exactly: a fixed "1, 2, 4, ..." would name 4 for n_micro < 4.
        allowed = ", ".join(str(1 << k) for k in range(n_micro.bit_length()))
        raise TopologyError(
            f"world size {world} is not supported: it must be a power of two that divides "
            f"micro_batches={n_micro} ({allowed})")


def owned_micro_batches(n_micro, world, rank):
    per = n_micro // world
    return range(rank * per, (rank + 1) * per)


class LocalFold:
    """Binary-carry stack: push leaves in index order; equal-level neighbours merge at once."""

    def __init__(self):
        self.stack = []          # [(level, tensor)], levels strictly decreasing
        self.peak_buffers = 0    # the most tensors held at once (tests check the log bound)

    def push(self, leaf):
        self.peak_buffers = max(self.peak_buffers, len(self.stack) + 1)  # the stack + this leaf
        level, acc = 0, leaf
        while self.stack and self.stack[-1][0] == level:
            _, left = self.stack.pop()
            acc = repops.ops.add(left, acc)   # left subtree first: index order
            level += 1
        self.stack.append((level, acc))

    def result(self):
        if len(self.stack) != 1:
            raise ValueError(f"fold of a non-power-of-two count of leaves ({len(self.stack)} subtrees left)")
        return self.stack[0][1]


def fold_leaves(leaves):
    """The balanced tree sum of an iterable of a power-of-two number of leaves."""
    fold = LocalFold()
    for leaf in leaves:
        fold.push(leaf)
    return fold.result()


def allreduce_tree(subtree, group=None):
    """Sum the ranks' subtrees with recursive doubling; every rank gets identical bits.

    Round d pairs rank r with r ^ d: both exchange buffers and compute lower + higher with one
    RepOps add. A dead peer surfaces as an exception from the backend (bounded by the process
    group's timeout), never as a hang.
    """
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    acc = subtree.contiguous()
    d = 1
    while d < world:
        partner = rank ^ d
        other = torch.empty_like(acc)
        peer = dist.get_global_rank(group, partner) if group is not None else partner
        # One batched exchange: NCCL would deadlock on two blocking sends; gloo accepts it too.
        for r in dist.batch_isend_irecv([dist.P2POp(dist.isend, acc, peer, group),
                                         dist.P2POp(dist.irecv, other, peer, group)]):
            r.wait()
        acc = repops.ops.add(acc, other) if rank < partner else repops.ops.add(other, acc)
        d *= 2
    return acc


def simulate_ranks(leaf, n_micro, world):
    """Single-device replay of `world` ranks: each folds its block, then recursive doubling.

    `leaf(m)` returns micro-batch m's flat gradient. Returns what every rank would hold.
    """
    check_topology(n_micro, world)
    held = [fold_leaves(leaf(m) for m in owned_micro_batches(n_micro, world, r)) for r in range(world)]
    d = 1
    while d < world:
        held = [repops.ops.add(held[min(r, r ^ d)], held[max(r, r ^ d)]) for r in range(world)]
        d *= 2
    return held[0]
