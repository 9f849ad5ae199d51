"""TreeFold (treefold.py): the left-complete tree for any N, on any number of ranks dividing N.

- Fold over all N leaves equals the explicit left-complete tree (left child: the largest power
  of two below n) built with repops.ops.add, bit for bit, for N = 1..64 and the reference run's
  192, 288 and 576, on leaves for which other orders give other bits (so the comparison can
  fail); N = 4 and N = 6 are also written out;
- the one-device fold holds floor(log2 N) + 1 buffers at most (its own counter for N = 1..64,
  and a weakref count of the live tensors), and simulate_ranks holds no more whatever R;
- simulate_ranks gives the same bits for every R dividing N (N <= 64, every divisor of 288,
  and N = 192, 288, 576 on R = 48: the reference run's shapes);
- a rank's frontier partitions its block into nodes of the tree, at most 2 log2(N/R) + 2 of
  them, and is what its Fold hands on; blocks that are not subtrees (N = 12 on R = 4) included;
- allreduce under torchrun (gloo, R = 3 and 4, aligned and unaligned blocks, buffers shorter
  than R): every rank ends with the one-device fold's bytes, and the bytes each rank sends,
  counted at torch.distributed, equal bytes_sent (2 (R - 1) / R of the buffer when blocks are
  subtrees, against log2 R buffers for recursive doubling);
- check_topology refuses N < 1 and any R not dividing N with one message listing the valid R.
"""
import hashlib
import json
import math
import os
import sys
import types
import weakref

import pytest
import torch

import repops
import treefold
from treefold_ranks import leaf as ranks_leaf
from tiny import run_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 2048
OPEN1B = [192, 288, 576]     # micro-batches per step of the reference run, on 48 ranks


def bits(t):
    return t.contiguous().view(torch.int32)


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def make_leaves(count, size, seed):
    """float32 vectors spanning many binades, with cancellation: rounding order matters."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        mant = torch.randn(size, generator=g, dtype=torch.float32)
        exp = torch.randint(-24, 25, (size,), generator=g).to(torch.float32)
        out.append(mant * torch.pow(2.0, exp))
    return out


@pytest.fixture(scope="module")
def leaves():
    return make_leaves(64, SIZE, 20240501)


@pytest.fixture(scope="module")
def many_leaves():
    return make_leaves(max(OPEN1B), 64, 20240502)


def explicit_tree(xs):
    """The left-complete tree over xs in index order, written out recursively."""
    if len(xs) == 1:
        return xs[0]
    left = 1 << ((len(xs) - 1).bit_length() - 1)      # the largest power of two below len(xs)
    return repops.ops.add(explicit_tree(xs[:left]), explicit_tree(xs[left:]))


def left_to_right(xs):
    acc = xs[0]
    for x in xs[1:]:
        acc = repops.ops.add(acc, x)
    return acc


def balanced_halves(xs):
    """Another tree: split at the middle. Equals the left-complete tree for powers of two only."""
    if len(xs) == 1:
        return xs[0]
    mid = len(xs) // 2
    return repops.ops.add(balanced_halves(xs[:mid]), balanced_halves(xs[mid:]))


def fold(xs):
    f = treefold.Fold(len(xs))
    for x in xs:
        f.push(x)
    return f.result()


# ----------------------------------------------------------------------------- one device
@pytest.mark.parametrize("n", range(1, 65))
def test_fold_is_the_left_complete_tree(leaves, n):
    xs = leaves[:n]
    tree = explicit_tree(xs)
    assert same_bits(fold(xs), tree)
    if n >= 4:
        # The data are chosen so that another order rounds differently: the check above is not
        # vacuous, a fold that summed left to right (or in any other tree) would fail it.
        assert not same_bits(left_to_right(xs), tree)
        assert not same_bits(explicit_tree(xs[1:] + xs[:1]), tree)  # the tree, leaves rotated
    if n in (6, 12, 24):
        assert not same_bits(balanced_halves(xs), tree)             # a different shape


@pytest.mark.parametrize("n", OPEN1B)
def test_fold_reference_run_shapes(many_leaves, n):
    xs = many_leaves[:n]
    assert same_bits(fold(xs), explicit_tree(xs))
    assert not same_bits(balanced_halves(xs), explicit_tree(xs))


def test_the_check_can_fail(leaves):
    """A deliberately wrong fold (sequential sum) is caught by the same comparison."""
    xs = leaves[:8]
    with pytest.raises(AssertionError):
        assert same_bits(left_to_right(xs), fold(xs))


def test_fold_written_out(leaves):
    g0, g1, g2, g3, g4, g5 = leaves[:6]
    add = repops.ops.add
    assert same_bits(fold([g0, g1, g2, g3]), add(add(g0, g1), add(g2, g3)))
    assert same_bits(fold([g0, g1, g2, g3, g4, g5]), add(add(add(g0, g1), add(g2, g3)), add(g4, g5)))
    assert same_bits(fold([g0, g1, g2]), add(add(g0, g1), g2))


@pytest.mark.parametrize("n", range(1, 65))
def test_fold_peak_buffers(n):
    f = treefold.Fold(n)
    for m in range(n):
        f.push(torch.full((4,), float(m)))
    assert f.peak_buffers == math.floor(math.log2(n)) + 1


def measure_live(monkeypatch, run, n):
    """Run run(leaf) with leaf(m) a fresh [SIZE] tensor; count the gradient tensors actually
    alive (weakrefs), not a fold's own counter: (most alive when a leaf is made, most alive
    while an add runs, the result)."""
    refs = []

    def live():
        return sum(r() is not None for r in refs)

    at_leaf, during_add = [0], [0]

    def add(a, b):
        out = repops.ops.add(a, b)
        refs.append(weakref.ref(out))
        during_add[0] = max(during_add[0], live())
        return out

    def leaf(m):
        t = torch.full((SIZE,), float(m))
        refs.append(weakref.ref(t))
        at_leaf[0] = max(at_leaf[0], live())
        return t

    monkeypatch.setattr(treefold, "repops", types.SimpleNamespace(ops=types.SimpleNamespace(add=add)))
    result = run(leaf)
    assert float(result[0]) == n * (n - 1) / 2
    del result
    assert live() == 0
    return at_leaf[0], during_add[0]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 31, 32, 48, 64])
def test_live_buffers_measured(monkeypatch, n):
    """Between operations (when a leaf is made) at most floor(log2 N) + 1 tensors are alive,
    and the peak equals that bound. While one add runs, its output exists next to its two
    inputs, so the transient peak is one more: the add's result buffer, not a held gradient.
    simulate_ranks, whatever R, holds exactly as many: the replay of an R-rank run needs no
    more memory than the one-device fold."""
    bound = math.floor(math.log2(n)) + 1
    transient = bound + 1 if n > 1 else 0   # 0: a single leaf needs no add

    def one_device(leaf):
        f = treefold.Fold(n)
        for m in f.leaves:
            f.push(leaf(m))
        return f.result()

    assert measure_live(monkeypatch, one_device, n) == (bound, transient)
    for world in divisors(n):
        got = measure_live(monkeypatch, lambda leaf: treefold.simulate_ranks(leaf, n, world), n)
        assert got == (bound, transient), f"R={world}"


# ----------------------------------------------------------------------------- ranks
@pytest.mark.parametrize("n", range(1, 65))
def test_simulate_ranks_is_topology_invariant(leaves, n):
    ref = fold(leaves[:n])
    for world in divisors(n):
        assert same_bits(treefold.simulate_ranks(lambda m: leaves[m], n, world), ref), f"N={n} R={world}"


@pytest.mark.parametrize("n,worlds", [(192, [48]), (288, divisors(288)), (576, [48])])
def test_simulate_ranks_reference_run_shapes(many_leaves, n, worlds):
    ref = explicit_tree(many_leaves[:n])
    for world in worlds:
        assert same_bits(treefold.simulate_ranks(lambda m: many_leaves[m], n, world), ref), f"R={world}"


def is_node(n, lo, size):
    """Whether leaves [lo, lo + size) form a node of the explicit left-complete tree."""
    if (lo, size) == (0, n):
        return True
    start, count = 0, n
    while count > 1:
        left = 1 << ((count - 1).bit_length() - 1)
        for child in ((start, left), (start + left, count - left)):
            if child == (lo, size):
                return True
        start, count = (start, left) if lo < start + left else (start + left, count - left)
    return False


@pytest.mark.parametrize("n", list(range(1, 65)) + OPEN1B)
def test_frontier_partitions_the_block_into_nodes(n):
    for world in divisors(n):
        for rank in range(world):
            block = treefold.block(n, world, rank)
            nodes = treefold.frontier(n, block)
            assert [i for lo, size in nodes for i in range(lo, lo + size)] == list(block)
            assert all(is_node(n, lo, size) for lo, size in nodes)
            # largest: no two neighbours are the children of one node
            assert not any(is_node(n, a, s + t) and treefold.split(s + t) == s
                           for (a, s), (_, t) in zip(nodes, nodes[1:]))
            assert len(nodes) <= 2 * math.log2(n // world) + 2
            # the Fold of that rank hands on exactly these nodes, in this order
            emitted = []
            f = treefold.Fold(n, world, rank, emit=lambda lo, size, t: emitted.append((lo, size)))
            for m in f.leaves:
                f.push(torch.zeros(1))
            assert emitted == nodes


def test_frontier_unaligned_written_out():
    assert [treefold.frontier(12, treefold.block(12, 4, r)) for r in range(4)] == [
        [(0, 2), (2, 1)], [(3, 1), (4, 2)], [(6, 2), (8, 1)], [(9, 1), (10, 2)]]
    assert treefold.frontier(14, range(7, 14)) == [(7, 1), (8, 6)]   # [8, 14): 4 + 2, a node
    assert treefold.frontier(288, treefold.block(288, 48, 1)) == [(6, 2), (8, 4)]


def test_block_partition():
    for n in (1, 6, 12, 288):
        for world in divisors(n):
            assert [m for r in range(world) for m in treefold.block(n, world, r)] == list(range(n))


def test_push_refuses_leaves_outside_the_block_and_non_nodes():
    f = treefold.Fold(12, 4, 1)
    for _ in f.leaves:
        f.push(torch.zeros(1))
    with pytest.raises(ValueError, match="go past"):
        f.push(torch.zeros(1))
    g = treefold.Fold(12)
    g.push(torch.zeros(1))
    with pytest.raises(ValueError, match="not a node"):
        g.push(torch.zeros(1), size=2)               # [1, 3) straddles [0, 2) and [2, 4)


def test_result_of_an_incomplete_fold_raises():
    f = treefold.Fold(6)
    for m in range(5):
        f.push(torch.zeros(1))
    with pytest.raises(ValueError, match="not complete"):
        f.result()
    with pytest.raises(ValueError, match="not complete"):
        treefold.Fold(6, 3, 0).result()


# ----------------------------------------------------------------------------- topology
@pytest.mark.parametrize("n", [0, -4])
def test_check_topology_refuses_bad_micro_batches(n):
    with pytest.raises(treefold.TopologyError, match=f"micro_batches must be at least 1, got {n}"):
        treefold.check_topology(n, 1)


@pytest.mark.parametrize("n,world", [(4, 0), (4, -2), (4, 3), (8, 6), (16, 5), (4, 8), (2, 4),
                                     (1, 2), (12, 5), (12, 8), (288, 7), (288, 64)])
def test_check_topology_refuses_bad_world(n, world):
    with pytest.raises(treefold.TopologyError) as e:
        treefold.check_topology(n, world)
    msg = str(e.value)
    assert f"world size {world} is not supported: it must divide micro_batches={n}" in msg
    assert msg.endswith(f"({', '.join(map(str, divisors(n)))})"), msg
    assert "\n" not in msg


def test_check_topology_accepts_every_divisor():
    for n in list(range(1, 65)) + OPEN1B:
        for world in divisors(n):
            treefold.check_topology(n, world)


def test_simulate_ranks_checks_topology(leaves):
    with pytest.raises(treefold.TopologyError):
        treefold.simulate_ranks(lambda m: leaves[m], 6, 4)
    with pytest.raises(treefold.TopologyError):
        treefold.simulate_ranks(lambda m: leaves[m], 4, 3)


# ----------------------------------------------------------------------------- all-reduce
def test_bytes_sent_formula():
    numel = 1001                                      # not divisible by R: chunks of 251, padded
    assert treefold.bytes_sent(4, 4, 0, numel) == 4 * 251 * 3 * 2            # k = 1: 2 q
    assert treefold.bytes_sent(12, 4, 1, numel) == 4 * 251 * 3 * 3           # [3, 6): k = 2
    assert treefold.bytes_sent(288, 48, 0, 48 * 1000) == 4 * 1000 * 47 * 3   # blocks of 6: k = 2
    assert treefold.bytes_sent(192, 48, 5, 48 * 1000) == 4 * 1000 * 47 * 2   # blocks of 4: k = 1


CASES = {4: ["4:1000", "4:1001", "8:1001", "12:1001", "20:1001", "12:3", "4:1"],
         3: ["3:999", "3:1001", "6:1001", "18:1001", "6:2"]}


@pytest.mark.parametrize("world", sorted(CASES))
def test_allreduce_under_torchrun(tmp_path, world):
    """Real processes, gloo: each rank's result has the one-device fold's bytes; counted bytes
    sent equal bytes_sent. Cases: aligned blocks (4 on 4, 8 on 4, 3 on 3, 6 on 3), blocks that
    are not subtrees (12 and 20 on 4, 18 on 3), and buffers shorter than R (padding only)."""
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    launcher = [exe] if os.path.exists(exe) else [sys.executable, "-m", "torch.distributed.run"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = run_process(launcher + ["--standalone", f"--nproc_per_node={world}",
                                   os.path.join(ROOT, "tests", "treefold_ranks.py"), str(tmp_path),
                                   *CASES[world]],
                       env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(line) for r in range(world) for line in (tmp_path / f"rank{r}.jsonl").read_text().splitlines()]
    assert len(lines) == world * len(CASES[world])
    for rec in lines:
        n, numel = rec["n"], rec["numel"]
        ref = fold([ranks_leaf(n, m, numel) for m in range(n)])
        assert rec["sha256"] == hashlib.sha256(ref.numpy().tobytes()).hexdigest(), rec
        assert rec["bytes_sent"] == treefold.bytes_sent(n, world, rec["rank"], numel), rec
        if n == world and numel % world == 0:
            assert rec["bytes_sent"] == 2 * 4 * numel * (world - 1) // world
