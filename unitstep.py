"""The trainer's side of the unit commitments (units.py): a step's pieces hashed while it runs.

    pieces = StepUnits(step, n, numel, world, rank)     # one per step, made by train.train_step
    grad = micro_batch_gradient(..., witness=pieces.witness(m))   # W_m from the backward
    pieces.leaf(m, grad)                                 # g_m's digest, started now
    Fold(n, world, rank, observe=pieces.node)            # each internal node's, as it is formed
    allreduce(fold, align=units.CHUNK, observe=pieces.row)   # the upper nodes', chunk by chunk
    root, entries = pieces.finish(salt_s)                # units_root and the step's unit list

Every digest is started when its tensor exists and is computed on hashchain.HASH_POOL's
threads while the step goes on (its chunks in parallel; hashlib releases the GIL), the way
snapshot.LeafLater hashes grad_root. finish() collects them where the record is written; on R
ranks it exchanges what each rank hashed (its micro-batches' digests and witnesses, the nodes
inside its block, its chunks of the nodes above: 32 bytes a chunk), so every rank assembles
the same list. A CUDA tensor is copied to pinned host memory on a side stream first (at most
IN_FLIGHT such copies at once). sync=True hashes each piece before the call returns (its chunks
still in parallel, on every core while the step waits): the trainer's choice on the CPU, where
hashing beside the step would take the cores the step's kernels run on (as the state hash,
train.hash_overlaps), and with --offload, whose fold adds into its buffers in place.

The witness of micro-batch m is the gradient of the loss with respect to the residual stream
after block 0 ([B, T, d]; with one block, the final norm's input): the backward computes it on
the way down to block 0, it needs the whole forward and the backward through every later block,
and no revealed piece gives its bits (docs/auditing.md argues it). Its digest W_m is committed
as c_m = SHA-256(salt_{s,m} || W_m) and is revealed only in receipts.
"""
import collections
from concurrent.futures import Future

import torch
import torch.distributed as dist

import hashchain
import treefold
import units

IN_FLIGHT = 2          # device tensors whose host copies may wait for their hash at once


class Pending:
    """A digest being computed: its chunk hashes (Futures) and its loss bits."""

    def __init__(self, piece, t, sync, events=None):
        host, event = _host(t)
        self.n_elements = host.numel()
        if sync:
            self.digest = units.digest(piece, host)
            self.bits = units.loss_bits(host)
            self.futures = None
            return
        a = units.flat_bytes(host) if event is None else None

        def chunk(k):
            arr = a if a is not None else _ready(host, event)
            return units.chunk_hash(piece, k, arr[k * units.CHUNK:(k + 1) * units.CHUNK])

        def last():
            return units.loss_bits(host if event is None else _ready(host, event))

        self.piece = piece
        self.futures = [hashchain.HASH_POOL.submit(chunk, k) for k in range(units.n_chunks(self.n_elements))]
        self.bits_future = hashchain.HASH_POOL.submit(last)
        if events is not None and event is not None:
            events.append(self)

    def result(self):
        """(digest, loss bits) once every chunk is hashed."""
        if self.futures is not None:
            self.digest = units.combine(self.piece, self.n_elements, [f.result() for f in self.futures])
            self.bits = self.bits_future.result()
            self.futures = None
        return self.digest, self.bits


def _host(t):
    """(a host tensor with t's values, the CUDA event after which it holds them, or None)."""
    t = t.detach()
    if not t.is_cuda:
        return t, None
    buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(t.device))
    stream = _streams.setdefault(t.device, torch.cuda.Stream(t.device))
    with torch.cuda.stream(stream):
        stream.wait_event(ready)
        buf.copy_(t, non_blocking=True)
    t.record_stream(stream)              # t's memory is not reused before the copy has read it
    done = torch.cuda.Event()
    done.record(stream)
    return buf, done


_streams = {}


def _ready(host, event):
    event.synchronize()
    return units.flat_bytes(host)


def local_nodes(n, leaves):
    """The internal nodes a rank's Fold forms: those inside its block `leaves`, post-order."""
    return [(lo, size) for lo, size in units.fold_nodes(n) if leaves.start <= lo and lo + size <= leaves.stop]


def upper_nodes(n, world):
    """The internal nodes no rank's block contains: formed chunk by chunk in allreduce."""
    inside = {node for r in range(world) for node in local_nodes(n, treefold.block(n, world, r))}
    return [node for node in units.fold_nodes(n) if node not in inside]


def owned_chunks(numel, q, rank):
    """The chunk indices of rank `rank`'s slice [rank * q, (rank + 1) * q) of a flat buffer."""
    per = q // units.CHUNK
    return range(min(rank * per, units.n_chunks(numel)), min((rank + 1) * per, units.n_chunks(numel)))


class StepUnits:
    def __init__(self, step, n, numel, world=1, rank=0, sync=False):
        self.step, self.n, self.numel = step, n, numel
        self.world, self.rank, self.sync = world, rank, sync
        self.block = treefold.block(n, world, rank)
        self.q = treefold.slice_size(numel, world, units.CHUNK)   # allreduce's slice, aligned
        self.pending = {}                 # unit name -> Pending (this rank's whole pieces)
        self.witnesses = {}               # m -> Pending
        self.rows = {}                    # (lo, size) of an upper node -> {chunk k: Future}, loss bits
        self.device_copies = collections.deque()
        self.entries = None               # the unit list, after finish()
        self.witness_digests = None       # [W_m] for m = 0..n-1, after finish()

    def _pending(self, piece, t):
        while len(self.device_copies) >= IN_FLIGHT:
            self.device_copies.popleft().result()
        return Pending(piece, t, self.sync, self.device_copies)

    def witness(self, m):
        """The tensor hook that hashes micro-batch m's witness when the backward produces it."""
        def hook(grad):
            if m in self.witnesses:
                raise RuntimeError(f"micro-batch {m}: the witness was produced twice")
            self.witnesses[m] = self._pending(units.witness_uid(self.step, m), grad)
        return hook

    def leaf(self, m, grad):
        """Micro-batch m's gradient g_m (flat [P + 1])."""
        self.pending[f"micro_batch:{m}"] = self._pending(units.uid(self.step, f"micro_batch:{m}"), grad)

    def node(self, lo, size, t):
        """An internal node formed whole by this rank's Fold (treefold.Fold's observe)."""
        name = units.node_name(lo, size)
        self.pending[name] = self._pending(units.uid(self.step, name), t)

    def row(self, lo, size, row, start):
        """This rank's slice [start, start + q) of the upper node (lo, size) (allreduce's observe):
        the chunks it holds whole, and the loss when it holds the last element."""
        piece = units.uid(self.step, units.node_name(lo, size))
        host, event = _host(row)
        a = units.flat_bytes(host) if event is None else None

        def chunk(k):
            arr = a if a is not None else _ready(host, event)
            return units.chunk_hash(piece, k, arr[k * units.CHUNK - start:min((k + 1) * units.CHUNK, self.numel) - start])

        def last():
            arr = a if a is not None else _ready(host, event)
            return units.loss_bits(arr[self.numel - 1 - start:self.numel - start])

        submit = (lambda fn, *args: _done(fn(*args))) if self.sync else hashchain.HASH_POOL.submit
        chunks = {k: submit(chunk, k) for k in owned_chunks(self.numel, self.q, self.rank)}
        bits = submit(last) if start <= self.numel - 1 < start + self.q else None
        self.rows[(lo, size)] = (chunks, bits)

    # ------------------------------------------------------------------------- the unit list
    def finish(self, salt=None):
        """(units_root, entries) of the step: every digest collected (on R ranks, exchanged).
        Without the step's salt (a replay without the secret) no commitment c_m can be made:
        units_root is None and the entries have no "commit"; witness_digests holds the W_m."""
        if self.entries is None:
            found = self._collect()
            self.witness_digests = [found["witness"][m] for m in range(self.n)]
            self.entries = [{"unit": name, "digest": found[name][0].hex(), "loss_bits": found[name][1]}
                            for name in units.names(self.n)]
        entries = [dict(e) for e in self.entries]
        if salt is None:
            return None, entries
        for m in range(self.n):
            entries[m]["commit"] = units.witness_commit(units.unit_salt(salt, m), self.witness_digests[m]).hex()
        return units.root([units.entry_leaf(self.step, e) for e in entries]), entries

    def _mine(self):
        """{name: (digest, bits)} of this rank's whole pieces and {m: W_m} of its witnesses."""
        missing = [m for m in self.block if m not in self.witnesses]
        if missing:
            raise RuntimeError(f"micro-batch {missing[0]}: no witness was captured (the model's "
                               "backward did not reach block 0's output)")
        return ({name: p.result() for name, p in self.pending.items()},
                {m: p.result()[0] for m, p in self.witnesses.items()})

    def _collect(self):
        """{unit name: (digest, bits)} of every unit and {m: W_m} of every witness."""
        whole, witness = self._mine()
        if self.world == 1:
            return dict(whole, witness=witness)
        # Each rank's payload has a layout every rank can compute (_layout), so one all_gather
        # of equal-size byte strings gives everyone everything.
        found, chunk_hashes, loss = {}, {}, {}
        for r, raw in enumerate(self._exchange(self._payload(whole, witness))):
            pieces, witnesses, rows = self._unpack(r, raw)
            found.update(pieces)
            witness.update(witnesses)
            for node, (hashes, bits) in rows.items():
                chunk_hashes.setdefault(node, {}).update(hashes)
                if bits is not None:
                    loss[node] = bits
        for lo, size in upper_nodes(self.n, self.world):
            name = units.node_name(lo, size)
            hashes = chunk_hashes[(lo, size)]
            found[name] = (units.combine(units.uid(self.step, name), self.numel,
                                         [hashes[k] for k in range(units.n_chunks(self.numel))]),
                           loss[(lo, size)])
        return dict(found, witness=witness)

    def _layout(self, r):
        """(micro-batches, whole nodes, [(upper node, chunk indices, holds the loss)]) of rank r."""
        leaves = treefold.block(self.n, self.world, r)
        q, last = self.q, self.numel - 1
        uppers = [(node, owned_chunks(self.numel, q, r), r * q <= last < (r + 1) * q)
                  for node in upper_nodes(self.n, self.world)]
        return leaves, local_nodes(self.n, leaves), uppers

    def _size(self, r):
        leaves, nodes, uppers = self._layout(r)
        return 68 * len(leaves) + 36 * len(nodes) + sum(32 * len(chunks) + 4 * holds for _, chunks, holds in uppers)

    def _payload(self, whole, witness):
        """This rank's bytes: per micro-batch digest, loss bits (4, LE) and W_m; per whole node
        digest and loss bits; per upper node its chunk hashes (and the loss bits if it holds them)."""
        leaves, nodes, uppers = self._layout(self.rank)
        out = bytearray()
        for m in leaves:
            d, bits = whole[f"micro_batch:{m}"]
            out += d + _bits(bits) + witness[m]
        for lo, size in nodes:
            d, bits = whole[units.node_name(lo, size)]
            out += d + _bits(bits)
        for node, chunks, holds_loss in uppers:
            hashes, bits = self.rows[node]
            out += b"".join(hashes[k].result() for k in chunks)
            out += _bits(bits.result()) if holds_loss else b""
        return bytes(out)

    def _unpack(self, r, raw):
        """({name: (digest, bits)}, {m: W_m}, {upper node: ({k: chunk hash}, bits or None)})."""
        leaves, nodes, uppers = self._layout(r)
        pieces, witnesses, rows, at = {}, {}, {}, 0

        def take(k):
            nonlocal at
            at += k
            return raw[at - k:at]

        for m in leaves:
            d, bits, w = take(32), take(4), take(32)
            pieces[f"micro_batch:{m}"], witnesses[m] = (d, _hex_bits(bits)), w
        for lo, size in nodes:
            d, bits = take(32), take(4)
            pieces[units.node_name(lo, size)] = (d, _hex_bits(bits))
        for node, chunks, holds_loss in uppers:
            hashes = {k: take(32) for k in chunks}
            rows[node] = (hashes, _hex_bits(take(4)) if holds_loss else None)
        return pieces, witnesses, rows

    def _exchange(self, payload):
        """Every rank's payload: an all_gather of equal-size byte tensors (padded with zeros)."""
        size = max(self._size(r) for r in range(self.world))
        mine = torch.zeros(size, dtype=torch.uint8)
        if payload:
            mine[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        gathered = [torch.empty(size, dtype=torch.uint8) for _ in range(self.world)]
        dist.all_gather(gathered, mine)
        return [g.numpy().tobytes() for g in gathered]


def _bits(text):
    return int(text, 16).to_bytes(4, "little")


def _hex_bits(raw):
    return "0x%08x" % int.from_bytes(raw, "little")


def _done(value):
    f = Future()
    f.set_result(value)
    return f
