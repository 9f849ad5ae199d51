"""The pieces of a step and their commitments (SPEC.md §20): what `units_root` binds.

A step with N micro-batches is N micro-batch gradients g_m (flat float32 [P + 1]: the gradient,
then the loss), the internal nodes of their left-complete tree (treefold.py; the root, over all
N, is S, the sum before the mean) and the update (clip, AdamW, re-pin: from S and the state).
Each piece is checked alone by the unit audits (unitaudit.py); this module fixes their names,
their public digests and the record's one root over them:

    names(4)            # ['micro_batch:0', ..., 'micro_batch:3', 'fold:0:2', 'fold:2:2', 'fold:0:4']
    uid(12, "fold:0:2")                         # b"12/fold:0:2": bound into every hash of the piece
    digest(uid(12, "fold:0:2"), tensor)         # its chunked digest (32 bytes), chunks in parallel
    chunk_hash(uid, k, data) / combine(uid, n_elements, chunk_hashes)   # the same in two halves
    unit_salt(salt_s, m); seal_witness(unit_salt, witness_digest)       # c_m of micro-batch m (sealed W_m)
    signer_key(run, uid, signer_blob); bound(run, uid, signer_blob, value)   # a receipt's proofs
    leaf(uid, digest, loss_bits, commit)        # a unit's leaf; root(leaves): units_root
    write_list(path, step, entries) / read_list(path) / check_list(entries, step, n, units_root)

Chunked digests: the flat float32 tensor is cut into chunks of CHUNK elements (the last one
shorter); each chunk is hashed with the piece's id and its index bound in (hashlib releases the
GIL, so chunks hash in parallel on hashchain.HASH_POOL), and the chunk hashes are combined by
§11.2's Merkle tree together with the length. A rank of a run on R ranks holds whole chunks of
the upper tree nodes (treefold.allreduce aligns its slices to CHUNK), so every rank hashes its
own chunks and the digests are the same bytes for any R.

The micro-batch units carry c_m = W_m sealed with salt_{s,m} (hashchain.seal_value), a witness
digest W_m that only a replay of the micro-batch computes (the gradient of the loss with respect
to the residual stream after block 0, captured during the backward: StepUnits.witness;
docs/auditing.md argues that no revealed piece gives its bits). A receipt never shows W_m: it
holds bound(run, uid, signer, W_m), which only whoever knows W_m computes for a given key, and
the salt's holder checks by opening c_m (receipts.py). A fold node's receipt holds the node's
digest keyed by signer_key(run, uid, signer), made from the node's value.

The trainer writes each step's unit list beside the chain (run_dir/units/step_<s>.json, the
list of (unit, digest, loss_bits, commit)); readers check it against the record's units_root
before they use any of it (check_list). Errors: UnitsError (one line).

The trainer's side, a step's pieces hashed while it runs (train.train_step makes one StepUnits
per step):

    pieces = StepUnits(step, n, numel, world, rank)
    grad = micro_batch_gradient(..., witness=pieces.witness(m))   # W_m from the backward
    pieces.leaf(m, grad)                                 # g_m's digest, started now
    Fold(n, world, rank, observe=pieces.node)            # each internal node's, as it is formed
    allreduce(fold, align=CHUNK, observe=pieces.row)     # the upper nodes', chunk by chunk
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
"""
import hashlib
import hmac
import json
import re
from pathlib import Path

import collections
from concurrent.futures import Future

import numpy as np
import torch
import torch.distributed as dist

import hashchain
import treefold

CHUNK = 1 << 18                          # elements (float32) per chunk of a unit's digest: 1 MiB
LIST_FORMAT = "repops-units-v2"            # v2: commit is the sealed witness digest
MAX_LIST = 64 << 20                      # a unit list: ~200 bytes per unit
UNIT = re.compile(r"micro_batch:(0|[1-9][0-9]*)|fold:(0|[1-9][0-9]*):([1-9][0-9]*)|update")
LOSS_BITS = re.compile(r"0x[0-9a-f]{8}")


class UnitsError(hashchain.HashChainError):
    """A unit name, a unit list or a unit's tensor that is not what the step commits to."""


# ----------------------------------------------------------------------------- names and order
def split(size):
    """The left child's share of a node over size >= 2 leaves (treefold.split, contract §4.4)."""
    return 1 << ((size - 1).bit_length() - 1)


def fold_nodes(n):
    """[(lo, size)] of the internal nodes (size >= 2) of the n-leaf tree, in post-order: the
    order a one-device fold forms them (children before their parent, left before right)."""
    out = []

    def visit(lo, size):
        if size > 1:
            left = split(size)
            visit(lo, left)
            visit(lo + left, size - left)
            out.append((lo, size))

    visit(0, n)
    return out


def node_name(lo, size):
    """The unit that holds the value of the tree node over leaves [lo, lo + size)."""
    return f"micro_batch:{lo}" if size == 1 else f"fold:{lo}:{size}"


def names(n):
    """The 2n - 1 units of a step with n micro-batches that units_root binds, in its order."""
    return [f"micro_batch:{m}" for m in range(n)] + [node_name(lo, size) for lo, size in fold_nodes(n)]


def parse(name, n):
    """("micro_batch", m) | ("fold", lo, size) | ("update",) of a unit of an n-micro-batch step;
    UnitsError if it is not one."""
    match = UNIT.fullmatch(name) if isinstance(name, str) else None
    if match is None:
        raise UnitsError(f"{name!r} is not a unit (micro_batch:M, fold:LO:SIZE or update)")
    if name == "update":
        return ("update",)
    if match.group(1) is not None:
        m = int(match.group(1))
        if m >= n:
            raise UnitsError(f"micro-batch {m} is not in the step (it has {n}: 0..{n - 1})")
        return ("micro_batch", m)
    lo, size = int(match.group(2)), int(match.group(3))
    if (lo, size) not in fold_nodes(n):
        raise UnitsError(f"fold:{lo}:{size} is not a fold node of the {n}-micro-batch tree "
                         f"(they are {', '.join(f'{a}:{b}' for a, b in fold_nodes(n)) or 'none'})")
    return ("fold", lo, size)


def children(lo, size):
    """The unit names of the two children of the fold node over [lo, lo + size)."""
    left = split(size)
    return node_name(lo, left), node_name(lo + left, size - left)


def root_name(n):
    """The unit whose value is S, the update's input: the tree's root (micro_batch:0 for n = 1)."""
    return node_name(0, n)


def all_units(n):
    """Every unit an audit of the step covers: the 2n - 1 of units_root, then the update."""
    return names(n) + ["update"]


def uid(step, name):
    """The id bound into every hash of a piece of step `step`: ASCII "<step>/<name>"."""
    return f"{step}/{name}".encode("ascii")


def witness_uid(step, m):
    return f"{step}/witness:{m}".encode("ascii")


# ----------------------------------------------------------------------------- digests
def flat_bytes(t):
    """The little-endian float32 elements of a CPU tensor (or array), flat, as a numpy view."""
    a = t.detach().contiguous().numpy() if hasattr(t, "detach") else np.ascontiguousarray(t)
    if a.dtype != np.float32:
        raise UnitsError(f"a unit's tensor is float32, got {a.dtype}")
    return a.reshape(-1).astype("<f4", copy=False)


def chunk_hash(piece, k, elements, key=None):
    """SHA-256 of chunk k (a float32 array of at most CHUNK elements) of piece `piece` (its uid):
    "repops-chunk-v1" 0x00 uid 0x00 k (8 bytes LE) data; keyed: "repops-keyed-chunk-v1" 0x00 key ..."""
    h = hashlib.sha256(b"repops-chunk-v1\0" if key is None else b"repops-keyed-chunk-v1\0" + key)
    h.update(piece + b"\0" + k.to_bytes(8, "little"))
    h.update(memoryview(elements).cast("B"))
    return h.digest()


def combine(piece, n_elements, chunk_hashes):
    """The digest of a piece from its chunk hashes (raw, in chunk order): SHA-256 of
    "repops-digest-v1" 0x00 uid 0x00 n_elements (8 bytes LE) and their Merkle root (§11.2)."""
    fold = hashchain.MerkleFold()
    for c in chunk_hashes:
        fold.push(c)
    return hashlib.sha256(b"repops-digest-v1\0" + piece + b"\0" + n_elements.to_bytes(8, "little")
                          + bytes.fromhex(fold.root())).digest()


def n_chunks(n_elements):
    return -(-n_elements // CHUNK)


def digest(piece, t, key=None):
    """The chunked digest (32 bytes) of a float32 tensor, its chunks hashed on HASH_POOL's
    threads. Call it from outside the pool (it waits for the pool's work)."""
    a = flat_bytes(t)
    if a.size == 0:
        raise UnitsError("a unit's tensor has no elements")
    hashes = hashchain.HASH_POOL.map(lambda k: chunk_hash(piece, k, a[k * CHUNK:(k + 1) * CHUNK], key),
                                     range(n_chunks(a.size)))
    return combine(piece, a.size, list(hashes))


def loss_bits(t):
    """"0x%08x" of the float32 bits of a unit tensor's last element (its loss, or the sum of them)."""
    return "0x%08x" % int(flat_bytes(t)[-1:].view("<u4")[0])


# ----------------------------------------------------------------------------- commitments
def unit_salt(step_salt, m):
    """salt_{s,m} = HMAC-SHA256(salt_s, "unit" || m as 8 bytes big-endian): revealing a step's
    salt reveals its micro-batches' salts, and no other step's."""
    return hmac.new(step_salt, b"unit" + m.to_bytes(8, "big"), hashlib.sha256).digest()


def seal_witness(salt, witness):
    """c_m = W_m (32 bytes) sealed with salt_{s,m} (hashchain.seal_value); the same call opens it."""
    return hashchain.seal_value(salt, witness)


def signer_key(run_id, piece, signer):
    """K = SHA-256("repops-signer-key-v1" 0x00, the run id (the genesis record hash, raw 32 bytes),
    the piece's uid, 0x00, the signer's public key blob): the key of every proof a receipt of
    that piece holds, so a proof made for one key, run and piece is no proof for any other."""
    return hashlib.sha256(b"repops-signer-key-v1\0" + bytes.fromhex(run_id) + piece + b"\0" + signer).digest()


def bound(run_id, piece, signer, value):
    """A receipt's proof of a 32-byte value: HMAC-SHA256(signer_key(run_id, piece, signer), value),
    hex. Checking it takes the value; showing it gives the value to no one."""
    return hmac.new(signer_key(run_id, piece, signer), value, hashlib.sha256).hexdigest()


def leaf(piece, digest_bytes, bits, commit=None):
    """A unit's leaf (raw): SHA-256 of "repops-unit-v1" 0x00 uid 0x00, its digest, its loss bits
    (4 bytes, little-endian) and, for a micro-batch, its commitment c_m."""
    return hashlib.sha256(b"repops-unit-v1\0" + piece + b"\0" + digest_bytes
                          + int(bits, 16).to_bytes(4, "little") + (commit or b"")).digest()


def root(leaves):
    """units_root (hex): §11.2's Merkle root of the unit leaves in names() order."""
    return hashchain.merkle_root([x.hex() for x in leaves])


def entry_leaf(step, entry):
    return leaf(uid(step, entry["unit"]), bytes.fromhex(entry["digest"]), entry["loss_bits"],
                bytes.fromhex(entry["commit"]) if "commit" in entry else None)


def proof(step, entries, name):
    """(index, Merkle proof) of unit `name` in the step's list (hashchain.merkle_proofs)."""
    index = [e["unit"] for e in entries].index(name)
    leaves = b"".join(entry_leaf(step, e) for e in entries)
    return index, hashchain.merkle_proofs(leaves, [index])[index]


# ----------------------------------------------------------------------------- the unit list
def list_name(step):
    """The unit list's name in a run directory (and in its published copy)."""
    return f"units/step_{step:08d}.json"


def list_path(run_dir, step):
    return Path(run_dir) / list_name(step)


def list_bytes(step, entries):
    """The canonical JSON of a step's unit list, and a final newline."""
    doc = {"format": LIST_FORMAT, "step": step, "units": entries}
    return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()


def write_list(path, step, entries):
    """Write a step's unit list through hashchain.write_atomically (no planted link is followed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    hashchain.write_atomically(path, list_bytes(step, entries))


def read_list(path, step):
    """The entries of the unit list in `path` for step `step`; UnitsError if it is not one."""
    return parse_list(hashchain.read_bytes(path, "unit list", MAX_LIST, UnitsError), path, step)


def parse_list(raw, path, step):
    """read_list of the bytes `raw` of the unit list `path` (named in errors)."""
    try:
        doc = hashchain.strict_json(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise UnitsError(f"unit list {path} is not valid JSON ({e})") from None
    if not (isinstance(doc, dict) and set(doc) == {"format", "step", "units"} and doc["format"] == LIST_FORMAT
            and doc["step"] == step and isinstance(doc["units"], list)):
        raise UnitsError(f"{path} is not the unit list of step {step} ({LIST_FORMAT})")
    for e in doc["units"]:
        micro = isinstance(e, dict) and str(e.get("unit", "")).startswith("micro_batch:")
        keys = {"unit", "digest", "loss_bits"} | ({"commit"} if micro else set())
        if not (isinstance(e, dict) and set(e) == keys and isinstance(e["unit"], str)
                and all(is_hex64(e[k]) for k in keys & {"digest", "commit"})
                and isinstance(e["loss_bits"], str) and LOSS_BITS.fullmatch(e["loss_bits"])):
            raise UnitsError(f"{path}: an entry is not a unit (unit, digest, loss_bits and, for a "
                             f"micro-batch, commit): {hashchain.clipped(json.dumps(e), 200)}")
    return doc["units"]


def is_hex64(value):
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) is not None


def check_list(entries, step, n, units_root):
    """UnitsError unless `entries` are the step's 2n - 1 units in order and their leaves hash
    to the record's units_root."""
    if [e["unit"] for e in entries] != names(n):
        raise UnitsError(f"the unit list of step {step} does not list the step's {2 * n - 1} units in order")
    got = root([entry_leaf(step, e) for e in entries])
    if got != units_root:
        raise UnitsError(f"the unit list of step {step} hashes to {got}, not to the record's "
                         f"units_root {json.dumps(units_root)}")
    return {e["unit"]: e for e in entries}


# ----------------------------------------------------------------------------- the publisher's files
def state_file(directory, step, params_only=False):
    """A state revealed by the publisher: the state after `step` in SPEC §13's file layout, all
    its tensors (state_<s>) or only its params.* ones (params_<s>), checked tensor by tensor
    against that step's record."""
    return Path(directory) / f"{'params' if params_only else 'state'}_{step:08d}.safetensors"


def unit_file(directory, step, name):
    """A revealed unit tensor: one float32 tensor [P + 1] named by the unit (SPEC §13's layout)."""
    return Path(directory) / f"step_{step:08d}.{name.replace(':', '_')}.safetensors"


def list_file(directory, step):
    """The unit list of `step` handed out with revealed pieces (list_bytes, as the trainer's)."""
    return Path(directory) / f"step_{step:08d}.units.json"


# ----------------------------------------------------------------------------- the trainer's side
IN_FLIGHT = 2          # device tensors whose host copies may wait for their hash at once


class Pending:
    """A digest being computed: its chunk hashes (Futures) and its loss bits."""

    def __init__(self, piece, t, sync, events=None):
        host, event = _host(t)
        self.n_elements = host.numel()
        if sync:
            self.digest = digest(piece, host)
            self.bits = loss_bits(host)
            self.futures = None
            return
        a = flat_bytes(host) if event is None else None

        def chunk(k):
            arr = a if a is not None else _ready(host, event)
            return chunk_hash(piece, k, arr[k * CHUNK:(k + 1) * CHUNK])

        def last():
            return loss_bits(host if event is None else _ready(host, event))

        self.piece = piece
        self.futures = [hashchain.HASH_POOL.submit(chunk, k) for k in range(n_chunks(self.n_elements))]
        self.bits_future = hashchain.HASH_POOL.submit(last)
        if events is not None and event is not None:
            events.append(self)

    def result(self):
        """(digest, loss bits) once every chunk is hashed."""
        if self.futures is not None:
            self.digest = combine(self.piece, self.n_elements, [f.result() for f in self.futures])
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
    return flat_bytes(host)


def local_nodes(n, leaves):
    """The internal nodes a rank's Fold forms: those inside its block `leaves`, post-order."""
    return [(lo, size) for lo, size in fold_nodes(n) if leaves.start <= lo and lo + size <= leaves.stop]


def upper_nodes(n, world):
    """The internal nodes no rank's block contains: formed chunk by chunk in allreduce."""
    inside = {node for r in range(world) for node in local_nodes(n, treefold.block(n, world, r))}
    return [node for node in fold_nodes(n) if node not in inside]


def owned_chunks(numel, q, rank):
    """The chunk indices of rank `rank`'s slice [rank * q, (rank + 1) * q) of a flat buffer."""
    per = q // CHUNK
    return range(min(rank * per, n_chunks(numel)), min((rank + 1) * per, n_chunks(numel)))


class StepUnits:
    def __init__(self, step, n, numel, world=1, rank=0, sync=False):
        self.step, self.n, self.numel = step, n, numel
        self.world, self.rank, self.sync = world, rank, sync
        self.block = treefold.block(n, world, rank)
        self.q = treefold.slice_size(numel, world, CHUNK)   # allreduce's slice, aligned
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
            self.witnesses[m] = self._pending(witness_uid(self.step, m), grad)
        return hook

    def leaf(self, m, grad):
        """Micro-batch m's gradient g_m (flat [P + 1])."""
        self.pending[f"micro_batch:{m}"] = self._pending(uid(self.step, f"micro_batch:{m}"), grad)

    def node(self, lo, size, t):
        """An internal node formed whole by this rank's Fold (treefold.Fold's observe)."""
        name = node_name(lo, size)
        self.pending[name] = self._pending(uid(self.step, name), t)

    def row(self, lo, size, row, start):
        """This rank's slice [start, start + q) of the upper node (lo, size) (allreduce's observe):
        the chunks it holds whole, and the loss when it holds the last element."""
        piece = uid(self.step, node_name(lo, size))
        host, event = _host(row)
        a = flat_bytes(host) if event is None else None

        def chunk(k):
            arr = a if a is not None else _ready(host, event)
            return chunk_hash(piece, k, arr[k * CHUNK - start:min((k + 1) * CHUNK, self.numel) - start])

        def last():
            arr = a if a is not None else _ready(host, event)
            return loss_bits(arr[self.numel - 1 - start:self.numel - start])

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
                            for name in names(self.n)]
        entries = [dict(e) for e in self.entries]
        if salt is None:
            return None, entries
        for m in range(self.n):
            entries[m]["commit"] = seal_witness(unit_salt(salt, m), self.witness_digests[m]).hex()
        return root([entry_leaf(self.step, e) for e in entries]), entries

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
            name = node_name(lo, size)
            hashes = chunk_hashes[(lo, size)]
            found[name] = (combine(uid(self.step, name), self.numel,
                                         [hashes[k] for k in range(n_chunks(self.numel))]),
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
            d, bits = whole[node_name(lo, size)]
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
            pieces[node_name(lo, size)] = (d, _hex_bits(bits))
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
