"""Canonical hashing of the training state, and the hash chain.

Two pieces, both plain files a third party can check with a few lines of any language
(checkpoint files, which hold the state, are rundir.py; SPEC.md §11-§13 specifies every byte):

    import hashchain as hc

    # 1. State hash: one SHA-256 leaf per tensor, combined in a Merkle tree (name-sorted),
    #    so a single tensor can be checked alone. The state's step is int64 of shape [1].
    root, leaves = hc.state_hash({"params.tok_emb": tok_emb, "step": torch.tensor([7], dtype=torch.int64)})
    hc.verify_state(tensors, root, leaves)   # raises StateMismatch naming the first bad tensor

    # 2. The chain: chain.jsonl, line 0 the genesis record (step 0), line k the record of step k.
    chain = hc.Chain("runs/x/chain.jsonl")
    chain.load()            # repairs a torn last line left by a killed writer (see chain.note)
    chain.append({"step": len(chain), "state_hash": root, "loss_bits": hc.f32_bits(loss)})
    chain.verify()          # raises ChainError naming the first broken line

Files are read as hostile input: only regular files (a FIFO or a device never blocks a reader),
strict JSON (no duplicate keys, no NaN or Infinity, bounded nesting and size). Every error
raised here derives from HashChainError and has a one-line message, so a CLI can catch
HashChainError and print str(e).

The canonical bytes of every published hash (leaf, Merkle, record, chain links), the one
bounded reader of the files an audit accepts and the one writer of the files the trainer, the
publisher and the auditors write (write_atomically) are in this one file, so a verifier reads every rule
that decides a hash in one place (SPEC.md §11-§12 follows its order). It loads without torch.
"""

import hashlib
import hmac
import json
import os
import re
import signal
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

GENESIS_PREV = "0" * 64
# The version of SPEC.md this code writes and reads: a run's genesis record names it (`spec`,
# SPEC §12.2), so a verifier reads the text that governs that run (SPEC's "Versions" lists what
# each version changed). Every change to a rule that decides a published byte bumps it.
SPEC = 7


class HashChainError(Exception):
    """Base of every error raised by this module."""


class StateMismatch(HashChainError):
    """A state does not hash to the expected root; `tensor` names the first differing tensor."""

    def __init__(self, message, tensor=None):
        super().__init__(message)
        self.message = message
        self.tensor = tensor


def open_regular(path, what="file", error=None):
    """Open `path` for binary reading only if it is a regular file (else `error`, by default
    HashChainError). O_NONBLOCK: opening a FIFO would otherwise wait forever for a writer."""
    error = error or HashChainError
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise error(f"{what} {path} cannot be opened: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise error(f"{what} {path} is not a regular file")
    return os.fdopen(fd, "rb")


def fsync_dir(directory):
    """Make the renames in `directory` durable (a file's fsync does not cover its name)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# write_all's test-only timing hook (tests/test_end_to_end.py's SIGKILL test sets it).
SLOW_WRITE_ENV = "REPOPS_SLOW_WRITE"
SLOW_WRITE_PIECES = 8


def write_all(f, data):
    """f.write(data): how the chain append, the checkpoint writer and the anchors file write.
    With the environment variable REPOPS_SLOW_WRITE=<seconds> (set only by the SIGKILL test
    for its trainer), data goes out in SLOW_WRITE_PIECES flushed pieces with a sleep of that
    many seconds between them, so a kill can land mid-write and the test can see it (a chain
    line without its newline, a part-written checkpoint temp file). Only the timing changes:
    the same bytes, in the same order, reach the file. Unset (always, outside the test), it is
    exactly f.write(data)."""
    delay = os.environ.get(SLOW_WRITE_ENV)
    if not delay:
        f.write(data)
        return
    bounds = [len(data) * i // SLOW_WRITE_PIECES for i in range(SLOW_WRITE_PIECES + 1)]
    for i, (begin, end) in enumerate(zip(bounds, bounds[1:])):
        if i:
            time.sleep(float(delay))
        f.write(data[begin:end])
        f.flush()


def write_atomically(path, data, mode=0o644, check=None):
    """Write `data` (bytes, an iterable of bytes-like pieces, each written as it comes, or a
    function that writes into the open file, seeking back and truncating as it needs) to `path`
    so that a crash leaves the old file or the new one, and no planted file is ever written
    through: the one writer of every file the trainer, the publisher and the auditors write
    (checkpoints, the secret, anchors, unit lists, receipts, salts, traces, reports, a public
    copy, an audit's cache of fetched bytes). The bytes go to a temp file in path's folder whose
    name holds 12 random hex digits (".<name>.tmp-<hex>"), created with O_CREAT | O_EXCL |
    O_NOFOLLOW: a link or file planted under any name is never opened, followed or truncated.
    Then write_all, fsync, check(temp path) if given (fetched bytes are verified before they are
    kept: it raises unless they are), the rename over `path` (which replaces a link there, never
    its target) and the folder's fsync. The temp file is removed on any error (OSError, or
    check's, reaches the caller)."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{os.urandom(6).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                for piece in ([data] if isinstance(data, (bytes, bytearray, memoryview)) else data):
                    write_all(f, piece)
            f.flush()
            os.fsync(f.fileno())
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)     # the rename itself durable


KILL_AT_ENV = "REPOPS_KILL_AT"


def kill_point(name):
    """A named moment between the trainer's durable writes: "append:<step>" right after a chain
    line is on disk, "rename:<file name>" right after a checkpoint's rename is. With the
    environment variable REPOPS_KILL_AT equal to that name (set only by the SIGKILL tests for
    their trainer) the process SIGKILLs itself there, so the test gets exactly what a kill -9 at
    that moment leaves. Unset (always, outside the tests), it does nothing."""
    if os.environ.get(KILL_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError(f"duplicate key {sorted(k for k in keys if keys.count(k) > 1)[0]!r}")
    return dict(pairs)


def _no_constant(name):
    raise ValueError(f"non-standard JSON value {name}")


def strict_json(text):
    """json.loads that refuses duplicate keys, NaN/Infinity and deep nesting (ValueError)."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def read_bytes(path, what, limit, error=None):
    """The bytes of `path`, a regular file of at most `limit` bytes (else `error`, by default
    HashChainError): the one way a file we accept is read whole (a FIFO or a device is refused
    without blocking; a huge file is refused before it fills memory)."""
    error = error or HashChainError
    with open_regular(path, what, error) as f:
        # read(n) allocates n bytes before it reads one: ask for the file's size (plus one byte,
        # to see a file that grew meanwhile), never for the limit
        size = os.fstat(f.fileno()).st_size
        raw = f.read(size + 1) if size <= limit else b""
    if size > limit or len(raw) > limit:
        raise error(f"{what} {path} is larger than {limit} bytes")
    return raw


def read_json(path, what, limit, error=None):
    """strict_json of a regular UTF-8 file of at most `limit` bytes; `error` (one line) otherwise."""
    error = error or HashChainError
    try:
        return strict_json(read_bytes(path, what, limit, error).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise error(f"{what} {path} is not valid JSON ({e})") from None


def clipped(text, limit):
    """`text` as a message shows it: whole up to `limit` characters, else cut at the last space
    before the limit and marked " ...", so that no hash (or number, or path) is cut in half."""
    if len(text) <= limit:
        return text
    cut = text[:limit + 1].rsplit(" ", 1)[0] if " " in text[:limit + 1] else text[:limit]
    return cut + " ..."


def is_int(x):
    """A JSON integer (bool is not one)."""
    return isinstance(x, int) and not isinstance(x, bool)


class ChainError(HashChainError):
    """The chain file is malformed or broken; `line` is the 1-based line number."""

    def __init__(self, line, message):
        super().__init__(message)
        self.line = line
        self.message = message


# ---------------------------------------------------------------------------------------------
# Canonical tensor bytes and the Merkle state hash

# torch dtype (as str(tensor.dtype): this module loads without torch, so that the commands that
# read chains answer --help at once) -> (name in the leaf hash, safetensors dtype, little-endian
# numpy dtype)
_DTYPES = {
    "torch.float32": ("float32", "F32", np.dtype("<f4")),
    "torch.int64": ("int64", "I64", np.dtype("<i8")),
    "torch.int32": ("int32", "I32", np.dtype("<i4")),
    "torch.uint8": ("uint8", "U8", np.dtype("u1")),
}
ST_DTYPES = {st: np_dt for _, st, np_dt in _DTYPES.values()}
ST_NAMES = {st: name for name, st, _ in _DTYPES.values()}      # safetensors dtype -> name in the leaf


def canonical_tensor(name, t):
    """(hash dtype name, safetensors dtype, shape list, flat uint8 view of the LE bytes)."""
    if not isinstance(name, str) or "\0" in name:
        # A NUL inside a name would make the leaf encoding ambiguous.
        raise HashChainError(f"tensor name {name!r} must be a string without NUL characters")
    if str(t.dtype) not in _DTYPES:
        raise HashChainError(
            f"tensor {name!r} has dtype {t.dtype}; only float32, int64, int32 and uint8 are "
            "hashed and checkpointed")
    dname, st_dtype, le = _DTYPES[str(t.dtype)]
    # For a contiguous CPU tensor every step below is a view, not a copy; astype only copies
    # (byte-swaps) on a big-endian host.
    arr = t.detach().cpu().contiguous().numpy().astype(le, copy=False)
    return dname, st_dtype, list(t.shape), arr.reshape(-1).view(np.uint8)


def tensor_leaf(name, t, key=None):
    """SHA-256 hex of one tensor's name, dtype, shape and little-endian bytes (SPEC.md §11.1).
    With `key` (32 bytes) the keyed leaf: the same bytes under another prefix that holds the
    key, which no one can compute without both the key and the tensor (keyed_state_root)."""
    dname, _, shape, data = canonical_tensor(name, t)
    return leaf_of_bytes(name, dname, shape, data, key)


def leaf_of_bytes(name, dname, shape, data, key=None):
    """tensor_leaf of the tensor `name` of dtype `dname` (float32, int64, int32, uint8) and shape
    `shape` whose canonical little-endian bytes are `data` (bytes or a uint8 array): a tensor in
    a checkpoint file is checked from its bytes, before any tensor is made of them."""
    h = hashlib.sha256(b"repops-tensor-v1\0" if key is None else b"repops-keyed-tensor-v1\0" + key)
    h.update(name.encode("utf-8") + b"\0" + dname.encode() + b"\0"
             + json.dumps(shape, separators=(",", ":")).encode() + b"\0")
    h.update(data)
    return h.hexdigest()


def _merkle_node(left, right):
    return hashlib.sha256(b"\x01" + left + right).digest()


class MerkleFold:
    """merkle_root's tree built leaf by leaf in O(log n) memory, for leaves too many to hold.

    Pairing each level left to right and promoting an odd last node gives the tree whose left
    subtree holds the largest power of two of leaves below n; a binary-carry stack of complete
    subtrees (merge the top two while their heights are equal), folded right to left at the
    end, builds exactly that tree.
    """

    def __init__(self):
        self.stack = []                  # (height, digest) of complete subtrees, left to right

    def push(self, leaf):
        """Add the next leaf hash (32 bytes)."""
        height, node = 0, hashlib.sha256(b"\x00" + leaf).digest()
        while self.stack and self.stack[-1][0] == height:
            node, height = _merkle_node(self.stack.pop()[1], node), height + 1
        self.stack.append((height, node))

    def root(self):
        """The root (hex) of the leaves pushed so far."""
        if not self.stack:
            return hashlib.sha256(b"").hexdigest()
        node = self.stack[-1][1]
        for _, left in reversed(self.stack[:-1]):
            node = _merkle_node(left, node)
        return node.hex()


def merkle_root(leaves):
    """Merkle root (hex) of leaf hashes (hex) given in name-sorted order.

    Leaves are hashed as sha256(0x00 + leaf) and internal nodes as sha256(0x01 + left + right),
    so a leaf can never be passed off as an internal node. An odd node is promoted unchanged.
    """
    fold = MerkleFold()
    for leaf in leaves:
        fold.push(bytes.fromhex(leaf))
    return fold.root()


def merkle_proofs(leaves, indices):
    """{index: proof} in merkle_root's tree over `leaves`, the concatenated 32-byte leaf hashes:
    a proof lists the sibling hashes (hex) from the leaf level up, skipping the levels where the
    node is the promoted odd one. Holds the tree level by level: 64 bytes per leaf."""
    level = b"".join(hashlib.sha256(b"\x00" + leaves[i:i + 32]).digest()
                     for i in range(0, len(leaves), 32))
    levels = [level]
    while len(level) > 32:
        pairs = b"".join(_merkle_node(level[i:i + 32], level[i + 32:i + 64])
                         for i in range(0, len(level) - 32, 64))
        level = pairs + (level[-32:] if len(level) // 32 % 2 else b"")
        levels.append(level)
    proofs = {}
    for index in indices:
        proof, i = [], index
        for level in levels[:-1]:
            if (i ^ 1) * 32 < len(level):
                proof.append(level[(i ^ 1) * 32:(i ^ 1) * 32 + 32].hex())
            i //= 2
        proofs[index] = proof
    return proofs


def merkle_root_from_proof(leaf, index, n_leaves, proof):
    """The root (hex) that a leaf hash (32 bytes) at `index` of `n_leaves` leaves and its proof
    (from merkle_proofs) imply. ValueError for a proof of the wrong length or that is not hex."""
    if not 0 <= index < n_leaves:
        raise ValueError(f"leaf index {index} is not in 0..{n_leaves - 1}")
    node = hashlib.sha256(b"\x00" + leaf).digest()
    siblings = iter(proof)
    i, width = index, n_leaves
    while width > 1:
        if i ^ 1 < width:
            sibling = bytes.fromhex(next(siblings, ""))
            if len(sibling) != 32:
                raise ValueError("proof too short or not a list of SHA-256 hashes")
            node = _merkle_node(sibling, node) if i & 1 else _merkle_node(node, sibling)
        i, width = i // 2, (width + 1) // 2
    if next(siblings, None) is not None:
        raise ValueError("proof too long")
    return node.hex()


# One thread per core: hashlib releases the GIL on large buffers, so leaves hash in parallel.
HASH_POOL = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1))


def map_tensors(fn, tensors):
    """{name: fn(name, tensor)} in sorted name order, computed in HASH_POOL's threads with the
    largest tensors started first (a big embedding started last would finish alone)."""
    by_size = sorted(tensors, key=lambda n: (-tensors[n].numel(), n))
    results = dict(zip(by_size, HASH_POOL.map(lambda n: fn(n, tensors[n]), by_size)))
    return {n: results[n] for n in sorted(tensors)}


def state_hash(tensors):
    """(root hex, {name: leaf hex}) of a dict of tensors, names sorted. Leaves are hashed in
    parallel threads; the result does not depend on it."""
    leaves = map_tensors(tensor_leaf, tensors)
    return merkle_root(list(leaves.values())), leaves


def keyed_state_root(key_hex, tensors):
    """The Merkle root (hex, merkle_root's tree, names sorted) of the keyed leaves of a state
    under key_hex (64 hex digits): a digest of the state's bytes salted with the key. A step's
    result_root is the one of its post-step state keyed by its grad_root (receipts.py)."""
    key = bytes.fromhex(key_hex)
    return merkle_root(list(map_tensors(lambda n, t: tensor_leaf(n, t, key), tensors).values()))


def seal_value(salt, value):
    """`value` (32 bytes) XOR HMAC-SHA256(salt, "repops-seal-v1"): a value published hidden, that
    the salt's holder (the publisher; anyone once the salt is revealed) reads back with this same
    function (SPEC §11.6): a step's step_commit seals its result_root, a unit list's commit a
    micro-batch's witness digest. Given the salt it names one value; without it, nothing of it."""
    pad = hmac.new(salt, b"repops-seal-v1", hashlib.sha256).digest()
    return bytes(a ^ b for a, b in zip(value, pad, strict=True))


def verify_state(tensors, expected_root, expected_leaves=None):
    """Raise StateMismatch unless `tensors` hash to `expected_root`.

    With `expected_leaves`, the error names the first differing tensor in sorted order.
    """
    root, leaves = state_hash(tensors)
    if root == expected_root:
        return
    if expected_leaves is None:
        raise StateMismatch(f"state hash {root} does not match expected {expected_root}")
    for name in sorted(set(leaves) | set(expected_leaves)):
        if name not in leaves:
            raise StateMismatch(f"tensor {name!r} is missing from the state", name)
        if name not in expected_leaves:
            raise StateMismatch(f"tensor {name!r} is not in the expected state", name)
        if leaves[name] != expected_leaves[name]:
            raise StateMismatch(f"tensor {name!r} differs: hash {leaves[name]}, expected "
                                f"{expected_leaves[name]}", name)
    raise StateMismatch(f"every tensor matches its expected hash but the root {root} does not "
                        f"match expected {expected_root} (expected hashes inconsistent)")


# ---------------------------------------------------------------------------------------------
# The hash chain

def canonical_json(obj):
    """The one serialization of records, anchors and signed receipts (SPEC §12.1). NaN and
    Infinity are not JSON: refused, never written."""
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                          allow_nan=False)
    except ValueError:
        raise HashChainError("refusing to write a non-finite number (NaN or Infinity) into "
                             "the chain") from None


def record_hash(record):
    """SHA-256 hex of the canonical JSON of a record without its own "record_hash" field."""
    body = {k: v for k, v in record.items() if k != "record_hash"}
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


def seal(record, prev_hash):
    """A copy of `record` linked to `prev_hash` and carrying its own record_hash."""
    out = dict(record)
    out["prev"] = prev_hash
    out["record_hash"] = record_hash(out)
    return out


def f32_bits(x):
    """"0x%08x" of the float32 bit pattern of x (the exact, platform-independent loss)."""
    return "0x%08x" % int(np.array(x, dtype=np.float32).view(np.uint32))


def bits_f32(s):
    """Inverse of f32_bits."""
    if not isinstance(s, str) or not re.fullmatch(r"0x[0-9a-f]{8}", s):
        raise HashChainError(f"{s!r} is not a float32 bit pattern like '0x3f800000'")
    return float(np.array(int(s, 16), dtype=np.uint32).view(np.float32))


# A record line longer than this is not a record (a step record is about 650 bytes, whatever
# the model: it holds the state's root, not a hash per tensor).
MAX_RECORD_BYTES = 16 * 1024 * 1024
# A chain file longer than this is not a chain (5 million default-model records; it is read whole).
MAX_CHAIN_BYTES = 16 << 30


class ChainFileError(HashChainError):
    """The chain file cannot be read as one (not a regular file, too large)."""


def parse_line(path, i, raw):
    """The record on line i (1-based: step i - 1) of the chain file `path`, from its bytes `raw`
    (without the newline); ChainError unless it is a well-formed record."""
    where = f"{path} line {i} (step {i - 1})"
    if len(raw) > MAX_RECORD_BYTES:
        raise ChainError(i, f"{where}: a line of {len(raw)} bytes is not a record")
    try:
        rec = strict_json(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ChainError(i, f"{where}: not valid JSON ({e})") from None
    if (not isinstance(rec, dict) or not is_int(rec.get("step"))
            or not isinstance(rec.get("prev"), str)
            or not isinstance(rec.get("record_hash"), str)):
        raise ChainError(i, f"{where}: not a chain record (needs integer 'step' and string "
                            "'prev' and 'record_hash')")
    return rec


class Chain:
    """The append-only chain file: one sealed JSON record per line, step k on line k+1.

    load() keeps the records up to the first line that is not a well-formed record and remembers
    that line as `broken` (a ChainError); verify() reports the first problem in line order, so a
    reader learns at which step the chain breaks, and a writer refuses to extend a broken chain.
    """

    def __init__(self, path):
        self.path = Path(path)
        self.records = []
        self.lines = 0            # complete lines in the file (records + the broken line and after)
        self.broken = None        # ChainError of the first malformed line, if any
        self.note = None          # set by load() when it found (and dropped) a torn last line
        self._tail_ok = False     # False until loaded with no torn tail left in the file

    def load(self, repair=True):
        """Read all records. A last line without "\\n" is a torn write from a killed writer: it
        is dropped and, with repair=True, cut from the file (repair=False leaves the file alone,
        for readers such as an audit that must not write to the run). Returns self.note."""
        self.records, self.broken, self.note = [], None, None
        data = read_bytes(self.path, "chain", MAX_CHAIN_BYTES, ChainFileError) if self.path.exists() else b""
        keep = data.rfind(b"\n") + 1
        if keep < len(data):
            self.note = (f"{self.path}: dropped a torn last line ({len(data) - keep} bytes) "
                         "left by an interrupted write")
            if repair:
                with open(self.path, "r+b") as f:
                    f.truncate(keep)
                    f.flush()
                    os.fsync(f.fileno())
        self._tail_ok = repair or keep == len(data)
        lines = data[:keep].split(b"\n")[:-1]
        self.lines = len(lines)
        for i, raw in enumerate(lines, start=1):
            try:
                self.records.append(self._parse(i, raw))
            except ChainError as e:
                self.broken = e
                break
        return self.note

    def _parse(self, i, raw):
        return parse_line(self.path, i, raw)

    @property
    def head(self):
        """record_hash of the last record (GENESIS_PREV for an empty chain)."""
        return self.records[-1]["record_hash"] if self.records else GENESIS_PREV

    def __len__(self):
        return len(self.records)

    def append(self, record):
        """Seal `record` (whose "step" must be len(self)) against the head and append it
        durably (one line through write_all; REPOPS_SLOW_WRITE slows it for the SIGKILL test).
        Returns the sealed record."""
        if not self._tail_ok:
            self.load()
        if self.broken:
            raise self.broken
        if record.get("step") != len(self.records):
            raise ChainError(len(self.records) + 1,
                             f"{self.path} line {len(self.records) + 1}: appending step "
                             f"{record.get('step')!r}, expected step {len(self.records)}")
        # Round-trip through JSON so the in-memory record equals what load() will read back.
        sealed = seal(json.loads(canonical_json(record)), self.head)
        line = (canonical_json(sealed) + "\n").encode("utf-8")
        with open(self.path, "ab") as f:
            write_all(f, line)
            f.flush()
            os.fsync(f.fileno())
        self.records.append(sealed)
        self.lines += 1
        kill_point(f"append:{sealed['step']}")   # REPOPS_KILL_AT: the SIGKILL tests' moment
        return sealed

    def verify(self, upto=None):
        """Raise ChainError at the first record (up to step `upto`, default all) whose hash, prev
        link, step number or run (a step record's `run`: the genesis record's hash) is wrong, or
        that is not a well-formed record."""
        last = len(self.records) - 1 if upto is None else min(upto, len(self.records) - 1)
        prev = GENESIS_PREV
        for i, rec in enumerate(self.records[:last + 1]):
            where = f"{self.path} line {i + 1} (step {i})"
            if record_hash(rec) != rec["record_hash"]:
                raise ChainError(i + 1, f"{where}: record hash does not match its contents "
                                        "(edited?)")
            if rec["prev"] != prev:
                raise ChainError(i + 1, f"{where}: prev does not match the previous record's "
                                        "hash (record missing, inserted or reordered?)")
            if rec["step"] != i:
                raise ChainError(i + 1, f"{where}: holds step {rec['step']}, expected step {i} "
                                        "(record missing, inserted or reordered?)")
            if i and rec.get("run") != self.records[0]["record_hash"]:     # SPEC §12.4: it names its run
                raise ChainError(i + 1, f"{where}: its run is not this chain's genesis record hash "
                                        "(a record of another run?)")
            prev = rec["record_hash"]
        if self.broken and (upto is None or self.broken.line - 1 <= upto):
            raise self.broken
