"""Tests for snapshot.py: the trainer's state hash, in place or overlapping the next step.

The end-to-end proof that overlapping changes no byte of the chain or the checkpoints, and that
a killed trainer never leaves a record whose state was not hashed, is in test_end_to_end.py
(both hash_async settings); a non-finite step's refusal is in test_bad_input.py.
"""
import torch

import hashchain
import snapshot


class FakeState:
    def __init__(self, tensors, step):
        self._tensors, self.step, self.copy_done = tensors, step, None

    def tensors(self):
        return self._tensors


def some_tensors(seed):
    g = torch.Generator().manual_seed(seed)
    return {"step": torch.tensor([seed], dtype=torch.int64), "params.a": torch.randn(300, 7, generator=g),
            "params.big": torch.randn(100_000, generator=g), "adam_v.a": torch.rand(300, 7, generator=g),
            "empty": torch.zeros(0)}


def test_hash_state_is_hashchains_state_hash():
    t = some_tensors(1)
    done = snapshot.hash_state(9, t)
    assert (done.root, done.leaves) == hashchain.state_hash(t)
    assert done.step == 9 and done.nonfinite == []


def test_non_finite_tensors_are_named():
    t = some_tensors(2)
    t["params.a"][3, 4] = float("nan")
    t["params.big"][99_999] = float("-inf")
    t["adam_v.a"][0, 0] = float("inf")
    assert snapshot.hash_state(1, t).nonfinite == ["adam_v.a", "params.a", "params.big"]


def test_overlapped_hash_is_of_the_state_at_submit():
    state = FakeState(some_tensors(3), 4)
    expected = hashchain.state_hash(state.tensors())
    hasher = snapshot.StateHasher(overlap=True)
    job = hasher.submit(state)
    for t in state.tensors().values():    # the next step's update, racing the hash
        t.zero_()
    done = job.result()
    assert (done.root, done.leaves) == expected and done.step == 4
    # what the trainer checkpoints is the hashed copy, not the live state
    assert hashchain.state_hash(done.tensors) == expected
    # the copy is reused for the next step's state
    state.step = 5
    assert hasher.submit(state).result().root == hashchain.state_hash(state.tensors())[0]


def test_in_place_hash_needs_no_copy():
    state = FakeState(some_tensors(4), 1)
    done = snapshot.StateHasher(overlap=False).submit(state).result()
    assert done.tensors is state.tensors()
    assert done.root == hashchain.state_hash(state.tensors())[0]
