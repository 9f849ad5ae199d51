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
    unit_salt(salt_s, m); witness_commit(unit_salt, witness_digest)     # c_m of micro-batch m
    leaf(uid, digest, loss_bits, commit)        # a unit's leaf; root(leaves): units_root
    write_list(path, step, entries) / read_list(path) / check_list(entries, step, n, units_root)

Chunked digests: the flat float32 tensor is cut into chunks of CHUNK elements (the last one
shorter); each chunk is hashed with the piece's id and its index bound in (hashlib releases the
GIL, so chunks hash in parallel on hashchain.HASH_POOL), and the chunk hashes are combined by
§11.2's Merkle tree together with the length. A rank of a run on R ranks holds whole chunks of
the upper tree nodes (treefold.allreduce aligns its slices to CHUNK), so every rank hashes its
own chunks and the digests are the same bytes for any R.

The micro-batch units carry a commitment c_m = SHA-256(salt_{s,m} || W_m) to a witness digest
W_m that only a replay of the micro-batch computes and that is never revealed (the gradient of
the loss with respect to the residual stream after block 0, captured during the backward, see
unitstep.py): its receipt reveals W_m, which opens c_m with the step's salt (receipts.py).

The trainer writes each step's unit list beside the chain (run_dir/units/step_<s>.json, the
list of (unit, digest, loss_bits, commit)); readers check it against the record's units_root
before they use any of it (check_list). Errors: UnitsError (one line).
"""
import hashlib
import hmac
import json
import os
import re
from pathlib import Path

import numpy as np

import hashchain

CHUNK = 1 << 18                          # elements (float32) per chunk of a unit's digest: 1 MiB
LIST_FORMAT = "repops-units-v1"
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


def witness_commit(salt, witness):
    """c_m = SHA-256(salt_{s,m} || W_m), both raw 32 bytes."""
    return hashlib.sha256(salt + witness).digest()


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
def list_path(run_dir, step):
    return Path(run_dir) / "units" / f"step_{step:08d}.json"


def list_bytes(step, entries):
    """The canonical JSON of a step's unit list, and a final newline."""
    doc = {"format": LIST_FORMAT, "step": step, "units": entries}
    return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()


def write_list(path, step, entries):
    """Write a step's unit list atomically (a temp file, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(list_bytes(step, entries))
    os.replace(tmp, path)


def read_list(path, step):
    """The entries of the unit list in `path` for step `step`; UnitsError if it is not one."""
    doc = hashchain.read_json(path, "unit list", MAX_LIST, UnitsError)
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
                             f"micro-batch, commit): {json.dumps(e)[:80]}")
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
        raise UnitsError(f"the unit list of step {step} hashes to {got[:16]}, not to the record's "
                         f"units_root {str(units_root)[:16]}")
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


def fold_key(run_id, piece, auditor):
    """The key of a fold-node receipt's keyed digest: SHA-256 of "repops-fold-key-v1" 0x00, the
    run id (the genesis record hash, raw 32 bytes), the node's uid, 0x00 and the auditor's name
    (UTF-8). Only whoever holds the node's value (its children, summed) can make the digest."""
    return hashlib.sha256(b"repops-fold-key-v1\0" + bytes.fromhex(run_id) + piece + b"\0"
                          + auditor.encode("utf-8")).digest()
