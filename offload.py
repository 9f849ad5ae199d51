"""State kept on disk and touched one tensor at a time, so a step of a model whose state does not
fit in memory (Open-1B: 6.4 GB of parameters, 12.9 GB of Adam moments) runs in bounded memory.

    moments = MomentStore(shapes)           # {name: shape}; an unlinked temp file, all zeros
    m = moments["layers.0.wo"]              # a float32 tensor mapped from the file
    repops.adamw_(p, g, m, v, ...)          # updates the file in place
    del m                                   # unmapped: its pages leave this process

    spill = SpilledTensor(t)                # t's bytes written to a temp file (no mapping)
    spill.add_into(right)                   # right = spill + right, chunk by chunk (RepOps add)

    lazy = LazyTensors(names, getter)       # a read-only Mapping whose values are made on access

A tensor mapped from a file counts in the process's resident memory only while it is mapped,
so each consumer (the AdamW loop, the state hash, the checkpoint writer) maps one tensor, uses
it and drops it: the peak is one tensor's pages, not the file. The files are anonymous
(unlinked at creation) under tempfile.gettempdir(): set TMPDIR to a disk with room for them.
None of this changes any bit: the same kernels run on the same values; only where the bytes
live between two operations changes.
"""
import math
import tempfile
from collections.abc import Mapping

import numpy as np
import torch

import repops

ALIGN = 4096                     # mmap offsets must be multiples of the page size
CHUNK = 1 << 22                  # elements per chunk when a spilled tensor is read back (16 MiB)


class MomentStore(Mapping):
    """{name: float32 tensor of `shapes[name]`} backed by one temp file, zeros at the start (a
    sparse file: creating it writes nothing). Every access maps the tensor anew; keep the result
    only as long as it is used."""

    def __init__(self, shapes, directory=None):
        self.shapes = dict(shapes)
        self.offsets, end = {}, 0
        for name, shape in self.shapes.items():
            self.offsets[name] = end
            end += -(-4 * math.prod(shape) // ALIGN) * ALIGN
        self.file = tempfile.TemporaryFile(dir=directory)
        self.file.truncate(max(end, ALIGN))

    def __getitem__(self, name):
        shape = self.shapes[name]
        if math.prod(shape) == 0:
            return torch.zeros(shape)
        arr = np.memmap(self.file, dtype=np.float32, mode="r+", offset=self.offsets[name], shape=shape)
        return torch.from_numpy(arr)

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self):
        return len(self.shapes)


class LazyTensors(Mapping):
    """A Mapping over `names` whose value for a name is getter(name), made at each access."""

    def __init__(self, names, getter):
        self.names = list(names)
        self.getter = getter

    def __getitem__(self, name):
        if name not in self.names:
            raise KeyError(name)
        return self.getter(name)

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)

    def __contains__(self, name):
        return name in self.names


class SpilledTensor:
    """A flat float32 CPU tensor written to a temp file with plain writes (never mapped, so it
    holds no resident memory), read back in chunks when it is added to its right sibling."""

    def __init__(self, tensor, directory=None):
        self.numel = tensor.numel()
        self.file = tempfile.TemporaryFile(dir=directory)
        self.file.write(memoryview(tensor.contiguous().numpy()).cast("B"))
        self.file.flush()

    def add_into(self, right):
        """right[i] = self[i] + right[i] in place (one RepOps add per element, left operand first:
        the same bits as repops.ops.add(self, right)); closes the file."""
        if right.numel() != self.numel or not right.is_contiguous():
            raise ValueError("a spilled tensor adds only into a contiguous tensor of its size")
        self.file.seek(0)
        flat, buf = right.view(-1), torch.empty(min(CHUNK, self.numel))
        for lo in range(0, self.numel, CHUNK):
            part = buf[:min(CHUNK, self.numel - lo)]
            self.file.readinto(memoryview(part.numpy()).cast("B"))
            flat[lo:lo + part.numel()].copy_(repops.ops.add(part, flat[lo:lo + part.numel()]))
        self.file.close()
        return right
