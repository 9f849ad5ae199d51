"""A second implementation of a run, written from SPEC.md and kernels/README.md alone.

    python tests/numpy_replay.py --run_dir runs/x --data_dir data/x --steps 3 --code_root .
    python tests/numpy_replay.py --run_dir runs/x --data_dir data/x --start 200 --steps 201

replays the genesis state and steps 1..N of a run in NumPy and compares every byte it can
derive with the run's files: the genesis record and each step record (line for line of
chain.jsonl), and the checkpoint files of those steps; with --start S it starts from the
checkpoint of step S (read by SPEC §13, checked against its record) instead of the genesis.
step_commit (and units_root, §20) needs the run's secret (run_dir/secret) or the step's revealed
salt (--salts FILE), secret_commit the secret; without them the replay takes that field from the
published record and checks everything else, the record hashes included.

    python tests/numpy_replay.py --run_dir runs/x --data_dir data/x --unit 6:1 [--receipt r.json]
    python tests/numpy_replay.py --run_dir runs/child --data_dir data/x --steps 2 --parent runs/x

replays micro-batch 1 of step 6 alone (§20: a unit commitments run, from the checkpoint of step
5) and checks its digest and loss bits against the step's unit list, the list's Merkle path to
the record's units_root, and with the secret or the salt its witness against c_m (§20.3: the
sealed W_m). With --receipt, a signed receipt of that micro-batch (§11.6, §20.7): its signature
(`ssh-keygen -Y verify`, the one program it runs), its fields against the chain, and its witness
proof against the one the replayed W_m gives for the receipt's signer key. A run started from a
parent run (§21) starts from its checkpoint 0; --parent DIR also checks its lineage against the
parent's chain.

    python tests/numpy_replay.py --published public/x

checks a run's public copy (§22): chain.offsets against chain.jsonl, and publication.json (its
run, steps and head against the chain, every file's size and SHA-256).
It prints "MATCH ..." or "MISMATCH at step S: ..." per item and exits 0 when all match, 1
otherwise, 2 on bad input.

Three files, one per document, import nothing from the project (the standard library and NumPy
only): numpy_contract.py (kernels/README.md, the arithmetic), numpy_model.py (SPEC §3-§4 and
§6-§8: the state, its init and the model) and this one (the data, the step, every hash and
file format, and the replay itself). Section numbers (§N) are SPEC.md's; `contract §N` is
kernels/README.md's. Every float operation is one NumPy operation with the contract's flushes,
so it is slow: it is the reference an auditor reads, not a trainer.
"""
import argparse
import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
import tempfile
from fractions import Fraction

import numpy as np

import numpy_contract as C
from numpy_model import backward, forward, full_state, init_params, repin, trained

SPEC = 7                                            # the version of SPEC.md written here (§12.2)
CONTRACT = 2                                        # the contract version written here (SPEC §12.2)
DATA = 3                                            # Philox purpose tag (contract §6)
VAL_COUNTER = 0x80000000


# ------------------------------------------------------------------ §11 hashes, §12 JSON
def leaf(name, arr, key=None):
    """§11.1: SHA-256 of the domain, name, dtype, shape and little-endian bytes of a tensor;
    with key (32 bytes) the keyed leaf (domain "repops-keyed-tensor-v1" 0x00 key)."""
    dtype = {np.dtype(np.float32): "float32", np.dtype(np.int64): "int64"}[arr.dtype]
    domain = b"repops-tensor-v1\0" if key is None else b"repops-keyed-tensor-v1\0" + key
    head = domain + name.encode() + b"\0" + dtype.encode() + b"\0" + \
        ("[" + ",".join(str(d) for d in arr.shape) + "]").encode() + b"\0"
    return hashlib.sha256(head + le_bytes(arr)).hexdigest()


def le_bytes(arr):
    return np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def merkle_root(leaves_hex):
    """§11.2: left subtree = the largest power of two of leaves strictly below n."""
    def node(lo, n):
        if n == 1:
            return hashlib.sha256(b"\x00" + bytes.fromhex(leaves_hex[lo])).digest()
        p = 1 << ((n - 1).bit_length() - 1)
        return hashlib.sha256(b"\x01" + node(lo, p) + node(lo + p, n - p)).digest()
    return node(0, len(leaves_hex)).hex() if leaves_hex else hashlib.sha256(b"").hexdigest()


def state_hash(state):
    """§11.3: (root, {name: leaf}) over the state's tensors in sorted name order."""
    leaves = {name: leaf(name, state[name]) for name in sorted(state)}
    return merkle_root(list(leaves.values())), leaves


def canonical_json(obj):
    """§12.1: sorted keys, no whitespace, ASCII escapes, shortest round-trip floats."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def f32_bits(x):
    return "0x%08x" % int(np.array(x, dtype=np.float32).view(np.uint32))


def seal(salt, x):
    """§11.6: x (32 bytes) XOR HMAC-SHA256(salt, "repops-seal-v1"); it also opens a seal."""
    pad = hmac.new(salt, b"repops-seal-v1", hashlib.sha256).digest()
    return bytes(a ^ b for a, b in zip(x, pad))


def sealed(record, prev):
    """§11.5: the record with prev and its record_hash, as its chain line (§12.4)."""
    record = dict(record, prev=prev)
    record["record_hash"] = hashlib.sha256(canonical_json(record).encode()).hexdigest()
    return record


# ------------------------------------------------------------------ §5 the data
def read_manifest(data_dir):
    """(manifest, its digest): SHA-256 of its whole canonical JSON, chunk records included (§5.1)."""
    with open(os.path.join(data_dir, "manifest.json")) as f:
        manifest = json.load(f)
    return manifest, hashlib.sha256(canonical_json(manifest).encode()).hexdigest()


def open_data(data_dir, seed):
    """A Corpus, or a Mix when the manifest lists sources."""
    return (Mix if "mix" in read_manifest(data_dir)[0] else Corpus)(data_dir, seed)


def train_or_val(split, micro):
    return micro if split == "train" else VAL_COUNTER + micro


class Corpus:
    """A prepared corpus (§5.1, §5.2), its token files checked against the manifest."""

    def __init__(self, data_dir, seed):
        self.seed = seed
        self.manifest, self.digest = read_manifest(data_dir)
        dtype = {"uint16": "<u2", "uint32": "<u4"}[self.manifest["dtype"]]
        self.tokens = {}
        for split, rec in self.manifest["splits"].items():
            raw = open(os.path.join(data_dir, rec["file"]), "rb").read()
            size = rec["chunks"]["bytes"]
            chunks = [hashlib.sha256(raw[i:i + size]).hexdigest() for i in range(0, len(raw), size)]
            if hashlib.sha256(raw).hexdigest() != rec["sha256"] or merkle_root(chunks) != rec["chunks"]["root"]:
                raise ValueError(f"split {split}: the token file does not match its manifest")
            self.tokens[split] = np.frombuffer(raw, dtype).astype(np.int64)

    def commitments(self):
        """The genesis record's data fields (§12.2)."""
        splits = self.manifest["splits"]
        return {"data_manifest": self.digest, "data_splits": {k: r["sha256"] for k, r in splits.items()},
                "data_chunks": {k: r["chunks"] for k, r in splits.items()}}

    def window(self, split, step, micro, B, T):
        """§5.2: int64 [B, T + 1], row j from offset (w[2j] | w[2j+1] << 32) mod (n - T)."""
        key = seed_xor(self.seed, self.manifest["splits"][split]["sha256"])
        w = C.philox_words(key, step, train_or_val(split, micro), DATA, 2 * B).astype(np.uint64)
        tokens = self.tokens[split]
        offsets = (w[0::2] | (w[1::2] << np.uint64(32))) % np.uint64(len(tokens) - T)
        return np.stack([tokens[o:o + T + 1] for o in offsets.tolist()])


class Mix:
    """A mix of prepared corpora (§5.3): row j from the source its Philox word draws."""

    def __init__(self, data_dir, seed):
        self.seed = seed
        self.manifest, self.digest = read_manifest(data_dir)
        entries = self.manifest["mix"]
        weights = [Fraction(e["weight"]) for e in entries]
        prefix = [sum(weights[:i + 1]) for i in range(len(weights))]
        self.thresholds = [int(p * 2**32 // prefix[-1]) for p in prefix]
        self.sources = [Corpus(os.path.join(data_dir, e["name"]), seed) for e in entries]
        if self.thresholds != [e["threshold"] for e in entries] or \
                [src.digest for src in self.sources] != [e["manifest"] for e in entries]:
            raise ValueError(f"{data_dir}: the mix's thresholds or sources are not its manifest's")

    def commitments(self):
        out = {"data_manifest": self.digest, "data_mix": self.manifest["mix"], "data_splits": {}, "data_chunks": {}}
        for e, src in zip(self.manifest["mix"], self.sources):
            for key in ("data_splits", "data_chunks"):
                out[key].update({f"{e['name']}/{k}": v for k, v in src.commitments()[key].items()})
        return out

    def window(self, split, step, micro, B, T):
        rows = [src.window(split, step, micro, B, T) for src in self.sources]
        u = C.philox_words(seed_xor(self.seed, self.digest), step, train_or_val(split, micro), DATA, B)
        drawn = [next(i for i, t in enumerate(self.thresholds) if w < t) for w in u.tolist()]
        return np.stack([rows[i][j] for j, i in enumerate(drawn)])


def seed_xor(seed, sha_hex):
    return seed ^ int.from_bytes(bytes.fromhex(sha_hex)[:8], "little")


# ------------------------------------------------------------------ §9 the step, §10 schedule
def lr_at(cfg, s):
    if s <= cfg["warmup_steps"]:
        return cfg["lr"] * s / cfg["warmup_steps"]
    span = max(cfg["max_steps"] - cfg["warmup_steps"], 1)
    return cfg["lr"] - (cfg["lr"] - cfg["min_lr"]) * min((s - cfg["warmup_steps"]) / span, 1.0)


def micro_batches_at(cfg, s):
    """§9.5: N(s) is N_k of the largest k with S_k < s in "N1@S1,N2@S2,..."; micro_batches for
    the steps s <= S1 that no phase has reached (the first phase starts after step S1)."""
    phases = [part.split("@") for part in cfg.get("micro_batch_phases", "").split(",") if part]
    begun = [k for k, (_, start) in enumerate(phases) if int(start) < s]
    return int(phases[max(begun)][0]) if begun else cfg["micro_batches"]


def weight_decay_factor(lr, wd):
    """§9.3: decay = f32(1 - lr * wd) with lr the binary64 lr(s) (not f32(lr(s))): one binary64
    multiply and subtract, rounded once."""
    return C.f32(1.0 - lr * wd)


def powi(x, n):
    result = 1.0
    while n:
        if n & 1:
            result *= x
        x *= x
        n >>= 1
    return result


def tree_sum(bufs, nodes=None, lo=0):
    """Contract §4.4: the left-complete tree; nodes[(lo, size)]: every internal node's value."""
    if len(bufs) == 1:
        return bufs[0]
    p = 1 << ((len(bufs) - 1).bit_length() - 1)
    total = C.add(tree_sum(bufs[:p], nodes, lo), tree_sum(bufs[p:], nodes, lo + p))
    if nodes is not None:
        nodes[(lo, len(bufs))] = total
    return total


def micro_batch(cfg, corpus, params, s, micro):
    """§9.1: (g_m, the witness of §20.3) of micro-batch `micro` of step s."""
    names = [n for n in sorted(params) if trained(cfg, n)]          # canonical order (§3)
    w = corpus.window("train", s, micro, cfg["micro_batch_size"], cfg["seq_len"])
    loss, tape = forward(cfg, params, w[:, :-1], (s, micro), y=w[:, 1:])
    grads = backward(cfg, params, tape, (s, micro))
    return np.concatenate([grads[n].reshape(-1) for n in names] + [loss.reshape(1)]), tape["witness"]


def train_step(cfg, corpus, params, m, v, s):
    """§9: advance (params, m, v) to step s in place; returns (record fields, grad_root, units:
    with unit_commits the unit list of §20.5 without its commitments, and the witness digests)."""
    names = [n for n in sorted(params) if trained(cfg, n)]          # canonical order (§3)
    B, T, N = cfg["micro_batch_size"], cfg["seq_len"], micro_batches_at(cfg, s)
    bufs, witnesses, nodes = [], [], {}
    for micro in range(N):
        g, witness = micro_batch(cfg, corpus, params, s, micro)
        bufs.append(g)
        if cfg.get("unit_commits"):
            witnesses.append(chunked_digest(f"{s}/witness:{micro}", witness))
    total = tree_sum(bufs, nodes)
    units = None
    if cfg.get("unit_commits"):
        values = dict({f"micro_batch:{k}": g for k, g in enumerate(bufs)},
                      **{f"fold:{lo}:{size}": x for (lo, size), x in nodes.items()})
        units = ([{"unit": u, "digest": chunked_digest(f"{s}/{u}", values[u]).hex(), "loss_bits": f32_bits(values[u][-1])}
                  for u in unit_names(N)], witnesses)
    del bufs, nodes
    mean = C.mul(total, C.f32(1.0 / N))
    loss = mean[-1]
    grad, norm = C.clip_grad(mean[:-1], cfg["grad_clip"])
    if not (np.isfinite(loss) and np.isfinite(norm)):
        raise ValueError(f"step {s}: the loss or gradient norm is not finite, a step the trainer refuses (§9.2)")
    lr = lr_at(cfg, s)
    b1, b2, wd = cfg["beta1"], cfg["beta2"], cfg["weight_decay"]
    offset = 0
    for n in names:
        p = params[n]
        g = grad[offset:offset + p.size].reshape(p.shape)
        offset += p.size
        decay = weight_decay_factor(lr, wd if p.ndim >= 2 else 0.0)
        params[n], m[n], v[n] = C.adamw_(p, g, m[n], v[n], C.f32(lr), C.f32(b1), C.f32(b2), C.f32(1.0 - b1),
                                         C.f32(1.0 - b2), C.f32(cfg["adam_eps"]), decay,
                                         C.f32(1.0 / (1.0 - powi(b1, s))), C.f32(1.0 / (1.0 - powi(b2, s))))
    if cfg["quant"] == "int8" and cfg["lsq_repin"]:
        repin(cfg, params)
    if not all(np.isfinite(t).all() for t in (*params.values(), *m.values(), *v.values())):
        raise ValueError(f"step {s}: the update leaves a non-finite value, a step the trainer refuses (§9.4)")
    digest = hashlib.sha256(b"".join(corpus.window("train", s, micro, B, T).astype("<i4").tobytes()
                                     for micro in range(N))).hexdigest()
    fields = {"kind": "step", "step": s, "batch_digest": digest,
              "loss": float(loss), "loss_bits": f32_bits(loss), "grad_norm": float(norm),
              "grad_norm_bits": f32_bits(norm), "lr": float(C.f32(lr)), "lr_bits": f32_bits(lr)}
    return fields, leaf("grad", grad), units


# ------------------------------------------------------------------ §20 unit commitments
CHUNK = 262144                                      # elements per chunk of a digest (§20.2)


def chunked_digest(uid, x, key=None):
    """§20.2: chunk hashes (uid and index bound in), their Merkle root with the length; raw."""
    x, uid = np.ascontiguousarray(x, dtype=np.float32).reshape(-1), uid.encode()
    domain = b"repops-chunk-v1\0" if key is None else b"repops-keyed-chunk-v1\0" + key
    hashes = [hashlib.sha256(domain + uid + b"\0" + k.to_bytes(8, "little")
                             + le_bytes(x[k * CHUNK:(k + 1) * CHUNK])).hexdigest()
              for k in range(-(-x.size // CHUNK))]
    return hashlib.sha256(b"repops-digest-v1\0" + uid + b"\0" + x.size.to_bytes(8, "little")
                          + bytes.fromhex(merkle_root(hashes))).digest()


def unit_names(n):
    """§20.1: micro_batch:0..n-1, then the fold nodes in post-order."""
    folds = []

    def visit(lo, size):
        if size > 1:
            p = 1 << ((size - 1).bit_length() - 1)
            visit(lo, p)
            visit(lo + p, size - p)
            folds.append(f"fold:{lo}:{size}")
    visit(0, n)
    return [f"micro_batch:{k}" for k in range(n)] + folds


def unit_salt(step_salt, micro):
    """§20.3: salt_{s,m} = HMAC-SHA256(salt_s, "unit" || m as 8 bytes big-endian)."""
    return hmac.new(step_salt, b"unit" + micro.to_bytes(8, "big"), hashlib.sha256).digest()


def unit_commit(step_salt, micro, witness):
    """§20.3: c_m = seal(salt_{s,m}, W_m); hex."""
    return seal(unit_salt(step_salt, micro), witness).hex()


def proof(run, uid, signer, x):
    """§11.6: HMAC-SHA256(K, x), K = SHA-256("repops-signer-key-v1" 0x00 run uid 0x00 signer); hex."""
    key = hashlib.sha256(b"repops-signer-key-v1\0" + bytes.fromhex(run) + uid.encode() + b"\0" + signer).digest()
    return hmac.new(key, x, hashlib.sha256).hexdigest()


def unit_leaf(step, entry):
    """§20.4: SHA-256("repops-unit-v1" 0x00 uid 0x00 digest, loss bits (4 bytes LE), c_m); hex."""
    return hashlib.sha256(b"repops-unit-v1\0" + f"{step}/{entry['unit']}".encode() + b"\0"
                          + bytes.fromhex(entry["digest"]) + int(entry["loss_bits"], 16).to_bytes(4, "little")
                          + bytes.fromhex(entry.get("commit", ""))).hexdigest()


def committed(step, units, step_salt):
    """The unit list with its commitments and units_root (§20.4) under the step's salt."""
    entries, witnesses = units
    entries = [dict(e, **({"commit": unit_commit(step_salt, k, witnesses[k])} if k < len(witnesses) else {}))
               for k, e in enumerate(entries)]
    return entries, merkle_root([unit_leaf(step, e) for e in entries])


def merkle_path(leaves_hex, index):
    """The sibling hashes from leaf `index` up (§11.2's tree), each with its side: [(hex, is_left)]."""
    def node(lo, n):
        if n == 1:
            return hashlib.sha256(b"\x00" + bytes.fromhex(leaves_hex[lo])).digest()
        p = 1 << ((n - 1).bit_length() - 1)
        return hashlib.sha256(b"\x01" + node(lo, p) + node(lo + p, n - p)).digest()
    path, lo, n = [], 0, len(leaves_hex)
    while n > 1:
        p = 1 << ((n - 1).bit_length() - 1)
        if index < lo + p:
            path.append((node(lo + p, n - p), False))
            n = p
        else:
            path.append((node(lo, p), True))
            lo, n = lo + p, n - p
    return list(reversed(path))


def root_from_path(leaf_hex, path):
    h = hashlib.sha256(b"\x00" + bytes.fromhex(leaf_hex)).digest()
    for sibling, is_left in path:
        h = hashlib.sha256(b"\x01" + (sibling + h if is_left else h + sibling)).digest()
    return h.hex()


# ------------------------------------------------------------------ §12-§14 files
def checkpoint_bytes(state, root, leaves, step):
    """§13: the safetensors file of a state."""
    meta = json.dumps({"step": step, "state_hash": root, "tensor_hashes": leaves}, sort_keys=True)
    header, offset = {"__metadata__": {"repops": meta}}, 0
    for name in sorted(state):
        n = state[name].nbytes
        header[name] = {"dtype": {"float32": "F32", "int64": "I64"}[state[name].dtype.name],
                        "shape": list(state[name].shape), "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return len(h).to_bytes(8, "little") + h + b"".join(le_bytes(state[n]) for n in sorted(state))


def code_digest(root, environ=os.environ):
    """§14: the build flags, then (path, SHA-256 of the file) of the files that decide the math;
    environ: the environment the digest is computed in (REPOPS_CPU_ARCH, REPOPS_CUDA_DEV)."""
    arch = environ.get("REPOPS_CPU_ARCH", "") or "native"
    flags = f"-O3 -std=c++17 -ffp-contract=off -fno-fast-math -march={arch} -fopenmp -falign-loops=64"
    files = ["model.py", "repops.py", "treefold.py", "offload.py", "train.py", "data.py", "hashchain.py",
             "rundir.py", "quant.py", "repops_mps.py", "config.py", "prepare.py", "units.py", "guard.py",
             "stockops.py"]
    kinds = {"kernels/cpu": (".cpp", ".h", ".cuh"), "kernels/cuda": (".cu", ".cpp", ".h", ".cuh"),
             "kernels/common": (".h", ".cuh"), "kernels/metal": (".metal", ".h")}
    if environ.get("REPOPS_CUDA_DEV", "") == "1":      # only where that build is made
        kinds["dev/cuda"] = (".cu", ".cpp", ".h", ".cuh")
    for folder, ends in kinds.items():
        files += [f"{folder}/{f}" for f in os.listdir(os.path.join(root, folder))
                  if f.endswith(ends) and f"{folder}/{f}" != "kernels/cpu/selftest.cpp"]
    h = hashlib.sha256(flags.encode())
    for rel in sorted(files):
        with open(os.path.join(root, rel), "rb") as f:
            h.update(rel.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def genesis_fields(cfg, corpus, code_root):
    """§12.2 without the state hash."""
    return {"kind": "genesis", "step": 0, "spec": SPEC, "contract": CONTRACT, "config": cfg,
            "code_digest": code_digest(code_root),
            **corpus.commitments(), "tokenizer": corpus.manifest["tokenizer"],
            "vocab_size": corpus.manifest["tokenizer"]["vocab_size"]}


def read_checkpoint(path):
    """§13: {name: array} of a checkpoint file (the header's dtypes, shapes and offsets)."""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__")
    dtypes = {"F32": "<f4", "I64": "<i8"}
    return {name: np.frombuffer(raw[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]],
                                dtypes[e["dtype"]]).reshape(e["shape"]).astype(dtypes[e["dtype"]][1:])
            for name, e in header.items()}


def checkpoint_path(run_dir, step):
    return os.path.join(run_dir, "checkpoints", f"step_{step:08d}.safetensors")


def salts_of(run_dir, salts_file):
    """step -> salt (§11.6) from the run's secret, else from a revealed salts file, else None;
    step 0 -> the secret's own commitment (secret_commit's bytes), known only from the secret."""
    secret_path = os.path.join(run_dir, "secret")
    if os.path.exists(secret_path):
        secret = open(secret_path, "rb").read()
        return lambda s: (hmac.new(secret, b"repops-secret-commit-v1", hashlib.sha256).digest() if s == 0
                          else hmac.new(secret, s.to_bytes(8, "big"), hashlib.sha256).digest())
    revealed = {}
    if salts_file:
        with open(salts_file) as f:
            revealed = {int(k): bytes.fromhex(v) for k, v in json.load(f)["salts"].items()}
    return revealed.get


def open_run(run_dir):
    """(chain lines, genesis config) of a run this replay implements."""
    lines = open(os.path.join(run_dir, "chain.jsonl"), "rb").read().splitlines()
    genesis = json.loads(lines[0])
    for field in ("spec", "contract"):                  # §12.2: positive integers
        made = genesis.get(field, 1)
        if type(made) is not int or made < 1:
            raise ValueError(f"the genesis record's {field} {json.dumps(made)[:40]} is not a version")
    made = (genesis.get("spec", 2 if "contract" in genesis else 1), genesis.get("contract", 1))
    if made != (SPEC, CONTRACT):                        # §12.2: no spec is v2 (or v1 without a contract)
        raise ValueError(f"this run was made under SPEC v{made[0]} and arithmetic contract v{made[1]}; "
                         f"this replay implements SPEC v{SPEC} and contract v{CONTRACT}")
    cfg = genesis["config"]
    # the OPEN-1B recipe options of SPEC §6.2 and §10 are not written here yet: refuse them
    recipe = {"attn_window": 0, "qk_norm": False, "emb_norm": False, "lr_schedule": "linear"}
    unsupported = [k for k, off in recipe.items() if cfg.get(k, off) != off]
    if unsupported:
        raise ValueError(f"this replay does not implement {', '.join(unsupported)} (SPEC §6.2, §10)")
    return lines, cfg


def split_state(state):
    """(params, adam_m, adam_v) of a state's tensors {name: array}, by their prefixes (§3)."""
    kinds = {"params": {}, "adam_m": {}, "adam_v": {}}
    for name, t in state.items():
        if name != "step":
            kind, _, p = name.partition(".")
            kinds[kind][p] = t
    return kinds["params"], kinds["adam_m"], kinds["adam_v"]


def start_state(run_dir, lines, cfg, start, say):
    """(params, m, v, prev record hash) of the genesis state (start 0) or of the checkpoint of
    step `start`, checked against its record."""
    if start == 0:
        genesis = json.loads(lines[0])
        if "parent" in genesis:          # §21: the parent's params and moments, from checkpoint 0
            params, m, v = split_state(read_checkpoint(checkpoint_path(run_dir, 0)))
            return params, m, v, "0" * 64
        init = genesis.get("init")       # §17: an imported state is checkpoint 0's
        params = ({n[len("params."):]: t for n, t in read_checkpoint(checkpoint_path(run_dir, 0)).items()
                   if n.startswith("params.")} if init else init_params(cfg))
        m = {n: np.zeros_like(p) for n, p in params.items() if trained(cfg, n)}
        v = {n: np.zeros_like(p) for n, p in params.items() if trained(cfg, n)}
        return params, m, v, "0" * 64
    state = read_checkpoint(checkpoint_path(run_dir, start))
    record = json.loads(lines[start])
    if state_hash(state)[0] != record["state_hash"]:                 # §13
        raise ValueError(f"the checkpoint of step {start} does not hash to its record")
    say(f"MATCH step {start}: checkpoint {os.path.basename(checkpoint_path(run_dir, start))} "
        "hashes to its record; the replay starts from it")
    return (*split_state(state), record["record_hash"])


def proven_leaves(path, root):
    """§13: {name: leaf hex} of the header of the state file `path` when its leaves, in name order,
    hash to `root` (the record's state hash: this proves them), else None."""
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    leaves = json.loads(header["__metadata__"]["repops"]).get("tensor_hashes") or {}
    return leaves if merkle_root([leaves[k] for k in sorted(leaves)]) == root else None


def check_lineage(genesis, run_dir, parent_dir):
    """§21's lineage: the parent's chain (its genesis hash is parent.run, its links verify up to
    parent.step, whose record holds parent.record_hash and parent.state_hash) and every leaf but
    step of the child's checkpoint 0 (proven by the genesis state hash) equal to the same leaf of
    the parent's checkpoint of parent.step (proven by parent.state_hash). Returns what is wrong,
    or None."""
    parent = genesis["parent"]
    lines = open(os.path.join(parent_dir, "chain.jsonl"), "rb").read().splitlines()
    records = [json.loads(line) for line in lines[:parent["step"] + 1]]
    if len(records) <= parent["step"]:
        return f"the parent's chain has no step {parent['step']}"
    prev = "0" * 64
    for k, (line, record) in enumerate(zip(lines, records)):       # §12.4, up to the step
        if record["step"] != k or record["prev"] != prev or (k and record.get("run") != records[0]["record_hash"]) \
                or canonical_json(sealed(
                {f: x for f, x in record.items() if f not in ("prev", "record_hash")}, prev)).encode() != line:
            return f"the parent's chain does not verify at step {k}"
        prev = record["record_hash"]
    record = records[parent["step"]]
    if records[0]["record_hash"] != parent["run"]:
        return "the parent's genesis record hash is not parent.run"
    if (record["record_hash"], record["state_hash"]) != (parent["record_hash"], parent["state_hash"]):
        return f"the parent's record of step {parent['step']} is not the one parent names"
    mine = proven_leaves(checkpoint_path(run_dir, 0), genesis["state_hash"])
    theirs = proven_leaves(checkpoint_path(parent_dir, parent["step"]), parent["state_hash"])
    if mine is None or theirs is None:
        return f"the leaves of the {'child' if mine is None else 'parent'}'s checkpoint do not hash to its record"
    mine, theirs = ({n: h for n, h in leaves.items() if n != "step"} for leaves in (mine, theirs))
    return None if mine == theirs else "the genesis tensors are not the parent's"


def replay(run_dir, data_dir, steps, code_root, say, start=0, salts_file=None, parent_dir=None):
    """Replay steps start+1..steps of run_dir from the genesis (start 0: recomputed from the
    config and checked too) or from the checkpoint of step `start`; say(line) for each verdict.
    True if all match. step_commit, units_root and secret_commit from the secret, else a salts
    file, else the record. parent_dir: a child run's parent (§21), whose lineage is checked."""
    lines, cfg = open_run(run_dir)
    if not 0 <= start <= steps < len(lines):
        raise ValueError(f"the chain holds steps 0..{len(lines) - 1}; cannot replay {start}..{steps}")
    run = json.loads(lines[0])["record_hash"]                 # §12.3: every step record names it
    corpus = open_data(data_dir, cfg["seed"])
    salt_of = salts_of(run_dir, salts_file)
    genesis = json.loads(lines[0])
    init, parent = genesis.get("init"), genesis.get("parent")
    params, m, v, prev = start_state(run_dir, lines, cfg, start, say)
    ok = True
    if parent_dir:
        problem = check_lineage(genesis, run_dir, parent_dir)
        say(f"MISMATCH at step 0: lineage: {problem}" if problem else
            f"MATCH step 0: lineage: the state after step {parent['step']} of the parent run {parent['run']}")
        ok = problem is None
    for s in range(start + (start > 0), steps + 1):
        units = None
        if s == 0:
            fields = dict(genesis_fields(cfg, corpus, code_root), **({"init": init} if init else {}),
                          **({"parent": parent} if parent else {}))
        else:
            fields, grad_root, units = train_step(cfg, corpus, params, m, v, s)
        state = full_state(cfg, params, m, v, s)
        root, leaves = state_hash(state)
        commitment, salt = ("secret_commit", None) if s == 0 else ("step_commit", salt_of(s))   # §11.6
        if s == 0 and salt_of(0) is not None:          # the secret itself is known
            fields[commitment] = salt_of(0).hex()
        elif salt is not None:
            key = bytes.fromhex(grad_root)
            result_root = merkle_root([leaf(n, state[n], key) for n in sorted(state)])
            fields[commitment] = seal(salt, bytes.fromhex(result_root)).hex()
            if units is not None:                       # §20.4
                fields["units_root"] = committed(s, units, salt)[1]
        else:
            say(f"note: step {s}: no secret{' and no salt' * (s > 0)}: {commitment}"
                f"{' and units_root are' if units is not None else ' is'} taken from the published record")
            fields[commitment] = json.loads(lines[s]).get(commitment)
            if units is not None:
                fields["units_root"] = json.loads(lines[s]).get("units_root")
        record = sealed(dict(fields, state_hash=root, **({"run": run} if s else {})), prev)
        prev = record["record_hash"]
        if canonical_json(record).encode() == lines[s]:
            say(f"MATCH step {s}: record {record['record_hash']}")
        else:
            ok = False
            published = json.loads(lines[s])
            diff = sorted(k for k in set(record) | set(published) if record.get(k) != published.get(k))
            say(f"MISMATCH at step {s}: the record differs in {', '.join(diff) or 'its bytes'}")
        ckpt = checkpoint_path(run_dir, s)
        if os.path.exists(ckpt):
            if open(ckpt, "rb").read() == checkpoint_bytes(state, root, leaves, s):
                say(f"MATCH step {s}: checkpoint {os.path.basename(ckpt)}")
            else:
                ok = False
                say(f"MISMATCH at step {s}: checkpoint {os.path.basename(ckpt)} differs")
    return ok


def replay_unit(run_dir, data_dir, step, micro, say, salts_file=None, receipt_file=None):
    """§20: micro-batch `micro` of step `step` alone, from the checkpoint of step - 1: its digest
    and loss bits against the step's unit list (run_dir/units/step_<s>.json, §20.5), the list's
    path from the unit's leaf to the record's units_root, and with the step's salt its witness
    against c_m; with receipt_file, that signed receipt (check_receipt). True if all match."""
    lines, cfg = open_run(run_dir)
    if not cfg.get("unit_commits"):
        raise ValueError("the run has no unit commitments (unit_commits, §20)")
    if not (1 <= step < len(lines) and 0 <= micro < micro_batches_at(cfg, step)):
        raise ValueError(f"micro-batch {micro} of step {step} is not in the run")
    params, _, _, _ = start_state(run_dir, lines, cfg, step - 1, say)
    g, witness = micro_batch(cfg, open_data(data_dir, cfg["seed"]), params, step, micro)
    mine = {"digest": chunked_digest(f"{step}/micro_batch:{micro}", g).hex(), "loss_bits": f32_bits(g[-1])}
    with open(os.path.join(run_dir, "units", f"step_{step:08d}.json")) as f:
        entries = json.load(f)["units"]
    leaves = [unit_leaf(step, e) for e in entries]
    units_root = json.loads(lines[step])["units_root"]
    checks = {"the unit list's names": [e["unit"] for e in entries] == unit_names(micro_batches_at(cfg, step)),
              "loss_bits": entries[micro]["loss_bits"] == mine["loss_bits"],
              "digest": entries[micro]["digest"] == mine["digest"],
              "the path to units_root": root_from_path(leaves[micro], merkle_path(leaves, micro)) == units_root}
    salt = salts_of(run_dir, salts_file)(step)
    witness = chunked_digest(f"{step}/witness:{micro}", witness)
    if salt is not None:
        checks["the witness against c_m"] = unit_commit(salt, micro, witness) == entries[micro]["commit"]
    else:
        say(f"note: step {step}: no secret and no salt: the witness is not checked against c_m")
    if receipt_file:
        checks.update(check_receipt(receipt_file, lines, step, micro, witness))
    for what, good in checks.items():
        say(f"{'MATCH' if good else 'MISMATCH at'} step {step}, micro-batch {micro}: {what}")
    say(f"witness W_{micro} = {witness.hex()}")
    return all(checks.values())


def chain_offsets(chain):
    """§22: the start of every line of chain.jsonl's bytes, then its size, 8 bytes LE each."""
    starts, at = [0], 0
    for line in chain.splitlines(keepends=True):
        at += len(line)
        starts.append(at)
    return b"".join(o.to_bytes(8, "little") for o in starts)


def check_publication(pub_dir, say):
    """§22: a public copy's chain.offsets and publication.json. True if both match."""
    chain = open(os.path.join(pub_dir, "chain.jsonl"), "rb").read()
    lines = chain.splitlines()
    index = json.loads(open(os.path.join(pub_dir, "publication.json"), "rb").read())
    checks = {"chain.offsets": open(os.path.join(pub_dir, "chain.offsets"), "rb").read() == chain_offsets(chain),
              "publication.json is canonical JSON": open(os.path.join(pub_dir, "publication.json"), "rb").read()
              == (canonical_json(index) + "\n").encode(),
              "its run, steps and head": (index["format"], index["run"], index["steps"], index["head"]) ==
              ("repops-publication-v1", json.loads(lines[0])["record_hash"], len(lines) - 1,
               json.loads(lines[-1])["record_hash"])}
    listed = set()
    for folder, _, names in os.walk(pub_dir):
        for name in names:
            rel = os.path.relpath(os.path.join(folder, name), pub_dir).replace(os.sep, "/")
            if rel != "publication.json":
                listed.add(rel)
                raw = open(os.path.join(folder, name), "rb").read()
                checks[rel] = index["files"].get(rel) == {"size": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    checks["the files listed are the copy's"] = set(index["files"]) == listed
    for what, good in checks.items():
        say(f"{'MATCH' if good else 'MISMATCH'}: {what}")
    return all(checks.values())


def check_receipt(path, lines, step, micro, witness):
    """§11.6, §20.7: {check: passed} of a signed receipt of micro-batch `micro` of `step`, given the
    replayed W_m (`witness`): its fields, its signature by its signer key (ssh-keygen -Y verify
    against an allowed_signers file of that key alone, namespace repops-receipt, over the
    canonical JSON of the receipt without `signature`), and its witness proof."""
    with open(path, encoding="utf-8") as f:
        receipt = json.load(f)
    genesis, record = json.loads(lines[0]), json.loads(lines[step])
    kind, b64 = receipt["signer"].split(" ")
    blob = base64.b64decode(b64, validate=True)
    fields = {"format": "repops-receipt-v4", "run": genesis["record_hash"], "step": step,
              "unit": f"micro_batch:{micro}", "record_hash": record["record_hash"],
              "code_digest": genesis["code_digest"], "data_manifest": genesis["data_manifest"], "verdict": "MATCH"}
    signed = canonical_json({k: v for k, v in receipt.items() if k != "signature"}).encode()
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "allowed_signers"), "w") as f:
            f.write(f"signer {kind} {b64}\n")
        with open(os.path.join(tmp, "sig"), "w") as f:
            f.write(receipt["signature"])
        verified = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", "allowed_signers", "-I", "signer", "-n",
                                   "repops-receipt", "-s", "sig"], input=signed, cwd=tmp, capture_output=True,
                                  timeout=60).returncode == 0
    return {"the receipt's fields": all(receipt.get(k) == v for k, v in fields.items()),
            "the receipt's signature by its signer key": verified,
            "the receipt's witness proof for its signer key":
                receipt.get("witness") == proof(genesis["record_hash"], f"{step}/micro_batch:{micro}", blob, witness)}


def main(argv):
    ap = argparse.ArgumentParser(prog="numpy_replay.py", description=__doc__.splitlines()[0])
    ap.add_argument("--published", help="only check this public copy of a run (§22)")
    ap.add_argument("--run_dir")
    ap.add_argument("--data_dir")
    ap.add_argument("--steps", type=int, default=3, help="the last step to replay")
    ap.add_argument("--start", type=int, default=0, help="a checkpointed step to start from (0: the genesis)")
    ap.add_argument("--salts", help="revealed salts (repops-salts-v1) when the run's secret is absent")
    ap.add_argument("--code_root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--unit", metavar="S:M", help="only micro-batch M of step S (§20), from the checkpoint of S - 1")
    ap.add_argument("--receipt", metavar="FILE", help="with --unit: a signed receipt of that micro-batch to check")
    ap.add_argument("--parent", metavar="DIR", help="a child run's parent run (§21): check the lineage too")
    args = ap.parse_args(argv)
    say = lambda line: print(line, flush=True)   # noqa: E731
    try:
        if args.published:
            return 0 if check_publication(args.published, say) else 1
        if not (args.run_dir and args.data_dir):
            raise ValueError("--run_dir and --data_dir are needed (or --published DIR)")
        if args.unit:
            step, _, micro = args.unit.partition(":")
            ok = replay_unit(args.run_dir, args.data_dir, int(step), int(micro), say, args.salts, args.receipt)
        else:
            ok = replay(args.run_dir, args.data_dir, args.steps, args.code_root, say, args.start, args.salts,
                        args.parent)
    except (OSError, ValueError, KeyError) as e:
        print(f"numpy_replay.py: error: {e}", file=sys.stderr)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
