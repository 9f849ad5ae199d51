"""TreeFold: the one fixed tree that sums a step's micro-batch gradients, on any number of ranks.

A step's gradient is the sum of its N micro-batch gradients g_0 .. g_{N-1} (flat float32
buffers) over the left-complete binary tree: a node over n > 1 consecutive leaves adds its
left child, the first p leaves with p the largest power of two below n, to its right child,
the other n - p leaves (contract §4.4). N = 4: (g0 + g1) + (g2 + g3); N = 6:
((g0 + g1) + (g2 + g3)) + (g4 + g5); N = 3: (g0 + g1) + g2. Every add is a RepOps add, so the
bits depend on N only, never on the ranks:

    fold = Fold(n)                          # one device (audit, R = 1)
    for m in fold.leaves:                   # 0 .. n-1, in index order
        fold.push(flat_gradient(m))         # holds at most floor(log2 n) + 1 buffers
    total = fold.result()

    fold = Fold(n, world, rank)             # rank r of R (R divides n)
    for m in fold.leaves:                   # its block [r*n/R, (r+1)*n/R)
        fold.push(flat_gradient(m))         # -> fold.frontier: the block's largest subtrees
    total = allreduce(fold)                 # reduce-scatter + all-gather: same bits, every rank

    simulate_ranks(leaf, n, world)          # one device plays all ranks (tests), O(log n) memory

    fold = Fold(n, spill=True)              # waiting left children go to temp files (offload.py)

    Fold(n, observe=f); allreduce(fold, align=A, observe=g)   # see every internal node formed

Fold is a binary-carry stack that knows the tree: a finished node that is a left child waits
on the stack, a right child is added to the left sibling on top of it, and a node that is one
of the largest subtrees inside the fold's leaves (its frontier) is handed on. Over all n leaves
this is the plain binary-carry stack with the leftover stack folded right to left at the end.
A rank's block need not be a subtree (n = 12 on R = 4 gives blocks of 3): the frontier of
[3, 6) is [3, 4) and [4, 6), and the all-reduce completes the tree above them exactly.

With spill, a left child waiting on the stack is written to a temp file and the sum with its
right sibling is formed in place in the right sibling's buffer, chunk by chunk (pushed tensors
then belong to the fold): a fold over flat gradients that do not fit in memory twice holds one
gradient in memory at a time. Each element gets the same add, so the bits are the same.

observe (the unit commitments, units.py): a Fold calls observe(lo, size, tensor) with every
internal node it forms by an add; allreduce calls observe(lo, size, row, start) with this rank's
slice [start, start + q) of every node it completes above the ranks' frontiers, and align makes
q a multiple of `align` elements (the padding past L grows; the sums do not change).
"""
import math

import torch.distributed as dist

import offload
import repops


class TopologyError(ValueError):
    """micro_batches is not positive, or the number of ranks does not divide it."""


def check_topology(n_micro, world):
    if n_micro < 1:
        raise TopologyError(f"micro_batches must be at least 1, got {n_micro}")
    if world < 1 or n_micro % world:
        small = [d for d in range(1, math.isqrt(n_micro) + 1) if n_micro % d == 0]
        allowed = sorted(set(small) | {n_micro // d for d in small})
        raise TopologyError(
            f"world size {world} is not supported: it must divide micro_batches={n_micro} "
            f"({', '.join(map(str, allowed))})")


def block(n_micro, world, rank):
    """Rank `rank`'s micro-batches: the contiguous range [rank*N/R, (rank+1)*N/R)."""
    per = n_micro // world
    return range(rank * per, (rank + 1) * per)


def split(size):
    """The left child's share of a node over size >= 2 leaves: the largest power of two below size."""
    return 1 << ((size - 1).bit_length() - 1)


def frontier(n, leaves):
    """The largest nodes of the n-leaf tree inside `leaves` (a range), in index order: [(lo, size)]."""
    out = []

    def visit(lo, size):
        if lo >= leaves.stop or lo + size <= leaves.start:
            return
        if leaves.start <= lo and lo + size <= leaves.stop:
            out.append((lo, size))
            return
        left = split(size)
        visit(lo, left)
        visit(lo + left, size - left)

    visit(0, n)
    return out


def parent(n, lo, size):
    """(lo, size, is_right_child) of the parent of the node over leaves [lo, lo + size)."""
    plo, psize = 0, n
    while psize > size:
        left = split(psize)
        if (lo, size) == (plo, left):
            return plo, psize, False
        if (lo, size) == (plo + left, psize - left):
            return plo, psize, True
        plo, psize = (plo, left) if lo < plo + left else (plo + left, psize - left)
    raise ValueError(f"leaves [{lo}, {lo + size}) are not a node of the {n}-leaf tree")


class Fold:
    """The tree over rank `rank`'s block of n leaves; push leaves (or whole nodes) in index order.

    Each finished frontier node goes to `emit(lo, size, tensor)`; by default it is appended to
    `self.frontier` (one tensor per node of `self.targets`)."""

    def __init__(self, n, world=1, rank=0, emit=None, spill=False, observe=None):
        check_topology(n, world)
        self.n = n
        self.leaves = block(n, world, rank)
        self.targets = frontier(n, self.leaves)   # [(lo, size)]: what this fold hands on
        self.frontier = []
        self.emit = emit
        self.spill = spill
        self.observe = observe     # observe(lo, size, tensor): each internal node formed here
        self.done = 0              # targets emitted so far
        self.next = self.leaves.start
        self.stack = []            # left children waiting for their right sibling, in index order
        self.peak_buffers = 0      # the most tensors held at once (tests check the log bound)

    def push(self, tensor, size=1):
        """The node over the next `size` leaves (a leaf: size 1), e.g. a rank's frontier sum."""
        lo = self.next
        if lo + size > self.leaves.stop:
            raise ValueError(f"leaves [{lo}, {lo + size}) go past this fold's leaves "
                             f"[{self.leaves.start}, {self.leaves.stop})")
        self.next = lo + size
        self.peak_buffers = max(self.peak_buffers, len(self.stack) + 1)   # the stack + this node
        while (lo, size) != self.targets[self.done]:
            # Strictly inside a frontier node, so the parent lies inside this fold's leaves.
            plo, psize, right = parent(self.n, lo, size)
            if not right:
                self.stack.append(offload.SpilledTensor(tensor) if self.spill else tensor)
                return
            left = self.stack.pop()                              # left subtree first: index order
            tensor = left.add_into(tensor) if self.spill else repops.ops.add(left, tensor)
            lo, size = plo, psize
            if self.observe:
                self.observe(lo, size, tensor)
        self.done += 1
        if self.emit:
            self.emit(lo, size, tensor)
        else:
            self.frontier.append(tensor)

    def result(self):
        """The sum over all n leaves (a fold over every leaf, all of them pushed)."""
        if self.leaves != range(self.n) or self.next != self.n:
            raise ValueError(f"the fold holds leaves [{self.leaves.start}, {self.next}) of "
                             f"{self.n}: the tree is not complete")
        return self.frontier[0]


def slice_size(numel, world, align=1):
    """q: the elements of a flat buffer of numel elements that each of `world` ranks completes in
    allreduce, ceil(numel / world) rounded up to a multiple of `align`."""
    q = -(-numel // world)
    return -(-q // align) * align


def allreduce(fold, align=1, observe=None):
    """Complete the tree across the ranks; every rank gets the same bits as a one-device fold.

    `fold` is this rank's finished Fold; its frontier holds k flat buffers [L]. Reduce-scatter:
    the buffers are cut into R chunks of q = slice_size(L, R, align) elements (zero-padded past
    L; q = ceil(L / R) when align is 1), and
    rank c receives chunk c of every rank's frontier ([k_s, q] from rank s; every k_s follows
    from n and R) and pushes them, in index order, into a Fold over all n leaves: the same tree
    for each element, whatever R. All-gather: each rank's finished chunk [q] goes to every rank.
    A rank sends 4 q (R - 1) (k + 1) bytes (bytes_sent); 2 L (R - 1) / R floats when k = 1.
    Batched point-to-point and all_gather exist on gloo and NCCL; a dead peer surfaces as an
    exception from the backend within the process group's timeout, never as a hang.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    if fold.next != fold.leaves.stop:
        raise ValueError("allreduce of a fold whose leaves are not all pushed")
    first = fold.frontier[0]
    numel = first.numel()
    q = slice_size(numel, world, align)
    targets = [frontier(fold.n, block(fold.n, world, r)) for r in range(world)]

    def chunk(c):
        """[k, q]: chunk c of each of this rank's frontier buffers, zeros past numel."""
        out = first.new_zeros(len(fold.frontier), q)
        lo, hi = min(c * q, numel), min((c + 1) * q, numel)
        for row, t in zip(out, fold.frontier):
            row[:hi - lo].copy_(t[lo:hi])
        return out

    received, ops = [], []
    for peer in range(world):
        if peer == rank:
            received.append(chunk(rank))
            continue
        received.append(first.new_empty(len(targets[peer]), q))
        # One batch: NCCL would deadlock on blocking sends to each other; gloo accepts it too.
        ops += [dist.P2POp(dist.isend, chunk(peer), peer), dist.P2POp(dist.irecv, received[-1], peer)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    start = rank * q
    total = Fold(fold.n, observe=observe and (lambda lo, size, row: observe(lo, size, row, start)))
    for peer in range(world):
        for (_, size), row in zip(targets[peer], received[peer]):
            total.push(row, size)
    gathered = first.new_empty(world, q)
    dist.all_gather(list(gathered.unbind(0)), total.result())
    return gathered.view(-1)[:numel]


def bytes_sent(n_micro, world, rank, numel):
    """Bytes rank `rank` hands to the backend in allreduce, for float32 buffers of numel elements:
    its k frontier chunks to each of the R - 1 others, then its finished chunk to each of them."""
    k = len(frontier(n_micro, block(n_micro, world, rank)))
    return 4 * -(-numel // world) * (world - 1) * (k + 1)


def simulate_ranks(leaf, n_micro, world):
    """One device plays `world` ranks; returns what every rank would hold after allreduce.

    `leaf(m)` returns micro-batch m's flat gradient. Each rank's Fold runs as on that rank, and
    each frontier sum goes straight into the completing Fold (what every chunk owner does), so
    the adds are the ranks' adds and at most floor(log2 N) + 1 buffers are held, whatever R.
    """
    total = Fold(n_micro)
    for rank in range(world):
        local = Fold(n_micro, world, rank, emit=lambda lo, size, t: total.push(t, size))
        for m in local.leaves:
            local.push(leaf(m))
    return total.result()
