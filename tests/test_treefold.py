"""TreeFold (treefold.py, DESIGN §5), in-process.

- fold_leaves equals the explicit balanced tree ((g0+g1)+(g2+g3)) built with repops.ops.add, bit
  for bit, for N = 1..64 (powers of two), on leaves for which a left-to-right sum gives other bits
  (so the comparison can fail);
- LocalFold holds floor(log2 N) + 1 buffers at most: its own counter and a weakref measurement
  of the live tensors;
- simulate_ranks gives the same bits for every world size R = 1, 2, 4, ..., N;
- check_topology refuses bad N and R with a message naming the allowed values; a fold of a
  non-power-of-two number of leaves raises.
"""
import math
import types
import weakref

import pytest
import torch

import repops
import treefold

POW2 = [1, 2, 4, 8, 16, 32, 64]
SIZE = 2048


def bits(t):
    return t.contiguous().view(torch.int32)


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


@pytest.fixture(scope="module")
def leaves():
    """64 float32 vectors spanning many binades, with cancellation: rounding order matters."""
    g = torch.Generator().manual_seed(20240501)
    out = []
    for _ in range(64):
        mant = torch.randn(SIZE, generator=g, dtype=torch.float32)
        exp = torch.randint(-24, 25, (SIZE,), generator=g).to(torch.float32)
        out.append(mant * torch.pow(2.0, exp))
    return out


def explicit_tree(xs):
    """The balanced tree over xs in index order, written out recursively."""
    if len(xs) == 1:
        return xs[0]
    mid = len(xs) // 2
    return repops.ops.add(explicit_tree(xs[:mid]), explicit_tree(xs[mid:]))


def left_to_right(xs):
    acc = xs[0]
    for x in xs[1:]:
        acc = repops.ops.add(acc, x)
    return acc


@pytest.mark.parametrize("n", POW2)
def test_fold_is_the_balanced_tree(leaves, n):
    xs = leaves[:n]
    tree = explicit_tree(xs)
    assert same_bits(treefold.fold_leaves(iter(xs)), tree)
    if n >= 4:
        # The data are chosen so that another order rounds differently: the check above is not
        # vacuous, a fold that summed left to right (or in any other tree) would fail it.
        assert not same_bits(left_to_right(xs), tree)
        assert not same_bits(explicit_tree(xs[1:] + xs[:1]), tree)  # the tree, leaves rotated


def test_the_check_can_fail(leaves):
    """A deliberately wrong fold (sequential sum) is caught by the same comparison."""
    xs = leaves[:8]
    with pytest.raises(AssertionError):
        assert same_bits(left_to_right(xs), treefold.fold_leaves(xs))


def test_fold_n4_written_out(leaves):
    g0, g1, g2, g3 = leaves[:4]
    add = repops.ops.add
    assert same_bits(treefold.fold_leaves([g0, g1, g2, g3]), add(add(g0, g1), add(g2, g3)))


@pytest.mark.parametrize("n", range(1, 65))
def test_local_fold_peak_buffers(n):
    fold = treefold.LocalFold()
    for m in range(n):
        fold.push(torch.full((4,), float(m)))
    assert fold.peak_buffers == math.floor(math.log2(n)) + 1


@pytest.mark.parametrize("n", POW2)
def test_local_fold_live_buffers_measured(monkeypatch, n):
    """Count the gradient tensors actually alive (weakrefs), not the fold's own counter.

    Between operations (when a leaf is handed to push) at most floor(log2 N) + 1 tensors are
    alive and the peak equals that bound. While one add runs, its output exists next to its
    two inputs, so the transient peak is one more: that is the add's result buffer, not a
    held gradient.
    """
    refs = []

    def live():
        return sum(r() is not None for r in refs)

    transient = [0]

    def add(a, b):
        out = repops.ops.add(a, b)
        refs.append(weakref.ref(out))
        transient[0] = max(transient[0], live())
        return out

    monkeypatch.setattr(treefold, "repops", types.SimpleNamespace(ops=types.SimpleNamespace(add=add)))
    fold = treefold.LocalFold()
    at_push = 0
    for m in range(n):
        leaf = torch.full((SIZE,), float(m))
        refs.append(weakref.ref(leaf))
        at_push = max(at_push, live())
        fold.push(leaf)
        del leaf
    result = fold.result()
    bound = math.floor(math.log2(n)) + 1
    assert at_push == bound == fold.peak_buffers
    assert transient[0] == (bound + 1 if n > 1 else 0)   # 0: a single leaf needs no add
    assert float(result[0]) == n * (n - 1) / 2
    del result, fold
    assert live() == 0


@pytest.mark.parametrize("n", POW2)
def test_simulate_ranks_is_topology_invariant(leaves, n):
    leaf = lambda m: leaves[m]  # noqa: E731
    ref = treefold.fold_leaves(leaves[:n])
    for r in POW2:
        if r > n:
            break
        assert same_bits(treefold.simulate_ranks(leaf, n, r), ref), f"N={n} R={r}"


def test_owned_micro_batches_partition():
    for n in POW2:
        for r in (w for w in POW2 if w <= n):
            blocks = [list(treefold.owned_micro_batches(n, r, k)) for k in range(r)]
            assert sum(blocks, []) == list(range(n))


@pytest.mark.parametrize("n", [0, -4, 3, 6, 12, 48])
def test_check_topology_refuses_bad_micro_batches(n):
    with pytest.raises(treefold.TopologyError, match="micro_batches must be a power of two"):
        treefold.check_topology(n, 1)


@pytest.mark.parametrize("n,world", [(4, 0), (4, -2), (4, 3), (8, 6), (16, 5), (4, 8), (2, 4),
                                     (1, 2), (64, 128)])
def test_check_topology_refuses_bad_world(n, world):
    with pytest.raises(treefold.TopologyError) as e:
        treefold.check_topology(n, world)
    msg = str(e.value)
    assert f"world size {world} is not supported" in msg
    allowed = ", ".join(str(w) for w in POW2 if w <= n)
    assert msg.endswith(f"micro_batches={n} ({allowed})"), msg


def test_check_topology_accepts_every_valid_world():
    for n in POW2:
        for world in (w for w in POW2 if w <= n):
            treefold.check_topology(n, world)


def test_simulate_ranks_checks_topology(leaves):
    with pytest.raises(treefold.TopologyError):
        treefold.simulate_ranks(lambda m: leaves[m], 6, 2)
    with pytest.raises(treefold.TopologyError):
        treefold.simulate_ranks(lambda m: leaves[m], 4, 3)


@pytest.mark.parametrize("n", [0, 3, 5, 6, 7, 12, 63])
def test_non_power_of_two_fold_raises(leaves, n):
    with pytest.raises(ValueError, match="non-power-of-two"):
        treefold.fold_leaves(leaves[:n])
