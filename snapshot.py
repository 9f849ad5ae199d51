"""The state hash off the critical path: step N's state is copied to host memory and hashed (and
checked for NaN/Inf) by host threads while step N+1 computes.

    hasher = StateHasher(overlap=True)
    job = hasher.submit(state)            # starts the host copy (CUDA: on a side stream), returns
    fields = train.train_step(state, ...) # the next step; its AdamW update first waits for the
                                          # copy (TrainState.wait_for_snapshot), nothing else does
    done = job.result()                   # Hashed(step, root, leaves, tensors, nonfinite, result_root)
    job = hasher.submit(state, key)       # key: a Future of the step's grad_root; result_root is
                                          # then the state's keyed root (hashchain.keyed_state_root)

With overlap=False (the CPU default: there the hash would take cores from the step) submit
hashes state.tensors() in place, before it returns, with no copy. Either way the digests are
hashchain.state_hash's, byte for byte, and the trainer publishes a step's record only from a
finished job, so a crash never leaves a record whose state was not hashed. The host copy also
serves the step's checkpoint and the finiteness check, so the state crosses to the host once per
step, not once per use.

Memory: overlap keeps one host copy of the state (pinned for CUDA tensors), reused every step;
the trainer collects job N before it submits job N+1.

LeafLater does the same for one tensor's leaf hash, the step's gradient (its grad_root, which
the record commits to): train_step hands the gradient over and goes on; the digest is ready by
the time the record is written.

    leaf = LeafLater(overlap=True).submit("grad", grad)   # a Future of hashchain.tensor_leaf
"""
from collections import namedtuple
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

import hashchain

# tensors: the hashed host tensors, valid until the next submit; nonfinite: the sorted names of
# float tensors that hold a NaN or an infinity (the trainer refuses such a step); result_root:
# the state's keyed root under the key submitted (None without one).
Hashed = namedtuple("Hashed", "step root leaves tensors nonfinite result_root")


def _leaves_and_finite(name, t, key):
    host = t.detach().cpu()          # a no-op for host tensors; one copy for a device tensor
    a = host.numpy()
    # min and max propagate NaN and reach any infinity, with no temporary the size of the tensor
    finite = not host.is_floating_point() or a.size == 0 or bool(np.isfinite(a.min()) and np.isfinite(a.max()))
    keyed = None if key is None else hashchain.tensor_leaf(name, host, key)
    return hashchain.tensor_leaf(name, host), keyed, finite


def hash_state(step, tensors, key=None):
    """Hashed for a dict of tensors: leaf hashes (and keyed leaves under `key`, a Future of 64
    hex digits) and finiteness in one pass per tensor, tensors in parallel (map_tensors)."""
    key = None if key is None else bytes.fromhex(key.result())
    results = hashchain.map_tensors(lambda n, t: _leaves_and_finite(n, t, key), tensors)
    leaves = {n: leaf for n, (leaf, _, _) in results.items()}
    nonfinite = [n for n, (_, _, finite) in results.items() if not finite]
    result_root = None if key is None else hashchain.merkle_root([k for _, k, _ in results.values()])
    return Hashed(step, hashchain.merkle_root(list(leaves.values())), leaves, tensors, nonfinite,
                  result_root)


class StateHasher:
    def __init__(self, overlap):
        self.overlap = overlap
        self.buffers = None          # {name: host tensor}: the copy being hashed
        self.worker = ThreadPoolExecutor(max_workers=1) if overlap else None
        self.copy_stream = None

    def submit(self, state, key=None):
        """A Future of the Hashed state as it is now (state.step, state.tensors()); with `key` (a
        Future of 64 hex digits) its keyed root too, hashed in the same pass."""
        tensors = state.tensors()
        if not self.overlap:
            job = Future()
            job.set_result(hash_state(state.step, tensors, key))
            return job
        if self.buffers is None:
            self.buffers = {n: torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
                            for n, t in tensors.items()}
        copied = None
        if any(t.is_cuda for t in tensors.values()):
            # The copy runs on its own stream after everything enqueued so far (the update that
            # made this state); the compute stream goes on with the next step's forward and
            # backward, which only read the state, and waits for the copy before its update.
            device = next(t.device for t in tensors.values() if t.is_cuda)
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(device))
            self.copy_stream = self.copy_stream or torch.cuda.Stream(device)
            with torch.cuda.stream(self.copy_stream):
                self.copy_stream.wait_event(ready)
                for n, t in tensors.items():
                    self.buffers[n].copy_(t, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self.copy_stream)
            state.copy_done = copied
        else:
            for n, t in tensors.items():
                self.buffers[n].copy_(t)
        return self.worker.submit(self._hash, state.step, copied, key)

    def _hash(self, step, copied, key):
        if copied is not None:
            copied.synchronize()
        return hash_state(step, self.buffers, key)


class LeafLater:
    """hashchain.tensor_leaf(name, t) as a Future. With overlap, a CUDA tensor is copied to a
    pinned host buffer on a side stream after the work enqueued so far (the compute stream goes
    on) and hashed by a host thread; otherwise the digest is computed before submit returns.
    Two buffers alternate, because step N's digest is collected after step N+1 has submitted
    its own; a buffer is reused only once its previous digest is done."""

    def __init__(self, overlap):
        self.overlap = overlap
        self.slots = [[None, None], [None, None]]   # [pinned buffer, its pending Future]
        self.turn = 0
        self.stream = None
        self.worker = ThreadPoolExecutor(max_workers=1) if overlap else None

    def submit(self, name, t):
        if not (self.overlap and t.is_cuda):
            job = Future()
            job.set_result(hashchain.tensor_leaf(name, t))
            return job
        slot = self.slots[self.turn]
        self.turn ^= 1
        if slot[1] is not None:
            slot[1].result()                      # the buffer's previous digest has read it
        if slot[0] is None or slot[0].shape != t.shape or slot[0].dtype != t.dtype:
            slot[0] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(t.device))
        self.stream = self.stream or torch.cuda.Stream(t.device)
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(ready)
            slot[0].copy_(t, non_blocking=True)
        t.record_stream(self.stream)              # t's memory is not reused before the copy reads it
        copied = torch.cuda.Event()
        copied.record(self.stream)
        slot[1] = self.worker.submit(self._leaf, name, slot[0], copied)
        return slot[1]

    @staticmethod
    def _leaf(name, host, copied):
        copied.synchronize()
        return hashchain.tensor_leaf(name, host)
