"""A second implementation of a run, written from SPEC.md and kernels/README.md alone.

    python tests/numpy_replay.py --run_dir runs/x --data_dir data/x --steps 3 --code_root .

replays the genesis state and steps 1..N of a run in NumPy and compares every byte it can
derive with the run's files: the genesis record and each step record (line for line of
chain.jsonl), and the checkpoint files of those steps. grad_commit needs the run's secret
(run_dir/secret); without it the replay takes each grad_commit from the published record and
checks everything else, the record hashes included. It prints "MATCH ..." or
"MISMATCH at step S: ..." per item and exits 0 when all match, 1 otherwise, 2 on bad input.

It imports nothing from the project: the standard library, NumPy and its own first half,
numpy_contract.py (the arithmetic contract). Section numbers (§N) are SPEC.md's; `contract §N`
is kernels/README.md's. Every float operation is one NumPy operation with the contract's
flushes, so it is slow: it is the reference an auditor reads, not a trainer.
"""
import argparse
import hashlib
import hmac
import json
import math
import os
import sys

import numpy as np

import numpy_contract as C

F32 = np.float32
INIT, DROPOUT, DATA = 1, 2, 3                       # Philox purpose tags (contract §6)
QP, CALIBRATION_STREAM, CALIBRATION_ROWS = 127, 0x15C0, 4
LINEARS = ("wqkv", "wo", "w_gate_up", "w_down")
VAL_COUNTER = 0x80000000


# ------------------------------------------------------------------ §11 hashes, §12 JSON
def leaf(name, arr):
    """§11.1: SHA-256 of the domain, name, dtype, shape and little-endian bytes of a tensor."""
    dtype = {np.dtype(np.float32): "float32", np.dtype(np.int64): "int64"}[arr.dtype]
    head = b"repops-tensor-v1\0" + name.encode() + b"\0" + dtype.encode() + b"\0" + \
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


def sealed(record, prev):
    """§11.5: the record with prev and its record_hash, as its chain line (§12.4)."""
    record = dict(record, prev=prev)
    record["record_hash"] = hashlib.sha256(canonical_json(record).encode()).hexdigest()
    return record


# ------------------------------------------------------------------ §3 the state, §4 init
def param_shapes(cfg):
    d, h, V, H, Hkv = cfg["d_model"], cfg["d_hidden"], cfg["vocab_size"], cfg["n_head"], cfg["n_kv_head"]
    Dh = d // H
    shapes = {"tok_emb": (V, d), "norm": (d,)} | ({} if cfg.get("tie_embeddings") else {"lm_head": (V, d)})
    for i in range(cfg["n_layer"]):
        shapes.update({f"layers.{i}.attn_norm": (d,), f"layers.{i}.wqkv": ((H + 2 * Hkv) * Dh, d),
                       f"layers.{i}.wo": (d, d), f"layers.{i}.mlp_norm": (d,),
                       f"layers.{i}.w_gate_up": (2 * h, d), f"layers.{i}.w_down": (d, h)})
    if cfg["quant"] == "int8":
        for i in range(cfg["n_layer"]):
            for lin in LINEARS:
                shapes[f"layers.{i}.{lin}_sx"] = (1,)
                shapes[f"layers.{i}.{lin}_sw"] = (shapes[f"layers.{i}.{lin}"][0],)
    return dict(sorted(shapes.items()))


def trained(cfg, name):
    return not (name.endswith("_sw") and cfg["lsq_repin"])


def init_params(cfg):
    """§4: norms 1.0, matrices Philox normals * f32(std), then the int8 step sizes (§8.3)."""
    params = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith("norm"):
            params[name] = np.ones(shape, F32)
        elif name.endswith(("_sx", "_sw")):
            params[name] = np.zeros(shape, F32)                          # set below (§8.3)
        else:
            std = cfg["init_std"]
            if name.endswith(("wo", "w_down")):
                std = std / math.sqrt(2 * cfg["n_layer"])
            stream = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
            z = C.normal(cfg["seed"], 0, stream, INIT, math.prod(shape))
            params[name] = C.mul(z, C.f32(std)).reshape(shape)
    if cfg["quant"] == "int8":
        repin(cfg, params)
        ids = C.philox_words(cfg["seed"], 0, CALIBRATION_STREAM, INIT, CALIBRATION_ROWS * cfg["seq_len"])
        ids = (ids.astype(np.int64) % cfg["vocab_size"]).reshape(CALIBRATION_ROWS, -1)
        forward(cfg, params, ids, None, calibrate=True)
    return params


def repin(cfg, params):
    """§8.3: s_w[row] = the LSQ rule over the row of its weight."""
    for i in range(cfg["n_layer"]):
        for lin in LINEARS:
            w = params[f"layers.{i}.{lin}"]
            params[f"layers.{i}.{lin}_sw"] = C.lsq_init(w, w.shape[0])


def full_state(cfg, params, m, v, step):
    state = {"step": np.array([step], np.int64)}
    for name in params:
        state["params." + name] = params[name]
        if trained(cfg, name):
            state["adam_m." + name], state["adam_v." + name] = m[name], v[name]
    return state


# ------------------------------------------------------------------ §5 the data
class Corpus:
    """A prepared corpus (§5.1), its token files checked against the manifest; not a mix."""

    def __init__(self, data_dir, seed):
        self.seed = seed
        with open(os.path.join(data_dir, "manifest.json")) as f:
            self.manifest = json.load(f)
        if "mix" in self.manifest:
            raise ValueError(f"{data_dir} is a mix (SPEC §5.3), which this replay does not implement")
        named = dict(self.manifest, splits={s: {k: v for k, v in r.items() if k != "chunks"}
                                            for s, r in self.manifest["splits"].items()})
        self.digest = hashlib.sha256(json.dumps(named, sort_keys=True, separators=(",", ":"))
                                     .encode()).hexdigest()                       # §5.1
        dtype = {"uint16": "<u2", "uint32": "<u4"}[self.manifest["dtype"]]
        self.tokens = {}
        for split, rec in self.manifest["splits"].items():
            raw = open(os.path.join(data_dir, rec["file"]), "rb").read()
            size = rec["chunks"]["bytes"]
            chunks = [hashlib.sha256(raw[i:i + size]).hexdigest() for i in range(0, len(raw), size)]
            if hashlib.sha256(raw).hexdigest() != rec["sha256"] or merkle_root(chunks) != rec["chunks"]["root"]:
                raise ValueError(f"split {split}: the token file does not match its manifest")
            self.tokens[split] = np.frombuffer(raw, dtype).astype(np.int64)

    def window(self, split, step, micro, B, T):
        """§5.2: int64 [B, T + 1], row j from offset (w[2j] | w[2j+1] << 32) mod (n - T)."""
        sha = self.manifest["splits"][split]["sha256"]
        key = seed_xor(self.seed, sha)
        c2 = micro if split == "train" else VAL_COUNTER + micro
        w = C.philox_words(key, step, c2, DATA, 2 * B).astype(np.uint64)
        tokens = self.tokens[split]
        offsets = (w[0::2] | (w[1::2] << np.uint64(32))) % np.uint64(len(tokens) - T)
        return np.stack([tokens[o:o + T + 1] for o in offsets.tolist()])


def seed_xor(seed, sha_hex):
    return seed ^ int.from_bytes(bytes.fromhex(sha_hex)[:8], "little")


# ------------------------------------------------------------------ §6-§8 the model
def linear(a, w, q, tape):
    """y = a @ w^T (§6 lin), fp32 or through int8 (§8.1) when q = (sx, sw, calibrate)."""
    if q is None:
        tape.append((a, w, None))
        return C.matmul(a, w.T)
    sx, sw, calibrate = q
    if calibrate:
        sx[...] = C.lsq_init(a, 1)
    qa, qw = C.int8_quantize(a, sx), C.int8_quantize(w, sw)
    tape.append((a, w, (sx, sw, qa, qw)))
    return C.int8_linear(qa, qw, sx, sw)


def linear_backward(g, saved):
    """(ga, gw, g_sx, g_sw) of linear (§6.1, §8.2)."""
    a, w, q = saved
    if q is None:
        return C.matmul(g, w), C.matmul(g.T, a), None, None
    sx, sw, qa, qw = q
    ah, wh = C.int8_dequantize(qa, sx), C.int8_dequantize(qw, sw)
    gah, gwh = C.matmul(g, wh), C.matmul(g.T, ah)
    ga, row_sums = C.lsq_backward(a, np.repeat(sx, a.shape[0]), gah, 1.0)
    g_sx = C.mul(C.csum(row_sums), C.f32(1.0 / math.sqrt(a.size * QP))).reshape(1)
    gw, g_sw = C.lsq_backward(w, sw, gwh, C.f32(1.0 / math.sqrt(w.shape[1] * QP)))
    return ga, gw, g_sx, g_sw


def dropout(cfg, x, rng, site):
    """§7: Philox dropout of a residual branch; rng = (step, micro) or None (no dropout)."""
    if rng is None or cfg["dropout"] == 0.0:
        return x
    step, micro = rng
    return C.dropout(x, cfg["dropout"], cfg["seed"], step, ((micro << 16) | site) & 0xFFFFFFFF)


def dims(cfg):
    H, Hkv = cfg["n_head"], cfg["n_kv_head"]
    return H, Hkv, H // Hkv, cfg["d_model"] // H


def attention(cfg, qkv, B, T, cos, sin):
    """§6: GQA attention of qkv [R, (H + 2 Hkv) Dh]; (o [R, H Dh], what the backward needs)."""
    H, Hkv, G, Dh = dims(cfg)
    qkv = qkv.reshape(B, T, H + 2 * Hkv, Dh)
    q = C.rope(qkv[:, :, :H], cos, sin)
    k = C.rope(qkv[:, :, H:H + Hkv], cos, sin)
    v = qkv[:, :, H + Hkv:]
    q = q.transpose(0, 2, 1, 3).reshape(B * Hkv, G * T, Dh)          # row g*T + t of group j
    k, v = (t.transpose(0, 2, 1, 3).reshape(B * Hkv, T, Dh) for t in (k, v))
    scale = 1.0 / math.sqrt(Dh)
    p = C.causal_softmax(C.matmul(q, k.transpose(0, 2, 1)).reshape(B * H, T, T), scale)
    p = p.reshape(B * Hkv, G * T, T)
    o = C.matmul(p, v).reshape(B, H, T, Dh).transpose(0, 2, 1, 3).reshape(B * T, H * Dh)
    return o, (q, k, v, p, scale)


def attention_backward(cfg, go, saved, B, T, cos, sin):
    H, Hkv, G, Dh = dims(cfg)
    q, k, v, p, scale = saved
    go = go.reshape(B, T, H, Dh).transpose(0, 2, 1, 3).reshape(B * Hkv, G * T, Dh)
    gp = C.matmul(go, v.transpose(0, 2, 1))
    gv = C.matmul(p.transpose(0, 2, 1), go)                        # sum over the group's G*T rows
    gs = C.causal_softmax_backward(gp.reshape(B * H, T, T), p.reshape(B * H, T, T), scale)
    gs = gs.reshape(B * Hkv, G * T, T)
    gq, gk = C.matmul(gs, k), C.matmul(gs.transpose(0, 2, 1), q)
    gq = gq.reshape(B, H, T, Dh).transpose(0, 2, 1, 3)
    gk, gv = (t.reshape(B, Hkv, T, Dh).transpose(0, 2, 1, 3) for t in (gk, gv))
    gq, gk = C.rope(gq, cos, sin, backward=True), C.rope(gk, cos, sin, backward=True)
    return np.concatenate([gq, gk, gv], axis=2).reshape(B * T, -1)


def forward(cfg, params, x, rng, calibrate=False, y=None):
    """§6: (loss, tape) of token ids x [B, T] (targets y); calibrate: §8.3, up to hf."""
    B, T = x.shape
    eps, H = C.f32(cfg["norm_eps"]), cfg["n_head"]
    cos, sin = C.rope_tables(T, cfg["d_model"] // H, C.f32(cfg["rope_theta"]))
    int8 = cfg["quant"] == "int8"
    e = C.embedding(params["tok_emb"], x.reshape(-1))
    tape = {"x": x, "blocks": [], "cos": cos, "sin": sin}
    for i in range(cfg["n_layer"]):
        P = {n: params[f"layers.{i}.{n}"] for n in ("attn_norm", "wqkv", "wo", "mlp_norm", "w_gate_up", "w_down")}
        q = {n: (params[f"layers.{i}.{n}_sx"], params[f"layers.{i}.{n}_sw"], calibrate) if int8 else None
             for n in LINEARS}
        lin = []
        blk = {"e1": e}
        a, blk["rstd1"] = C.rmsnorm(e, P["attn_norm"], eps)
        o, blk["att"] = attention(cfg, linear(a, P["wqkv"], q["wqkv"], lin), B, T, cos, sin)
        e = C.add(e, dropout(cfg, linear(o, P["wo"], q["wo"], lin), rng, 2 * i))
        blk["e2"] = e
        a, blk["rstd2"] = C.rmsnorm(e, P["mlp_norm"], eps)
        u = linear(a, P["w_gate_up"], q["w_gate_up"], lin)
        f = linear(C.swiglu(u), P["w_down"], q["w_down"], lin)
        e = C.add(e, dropout(cfg, f, rng, 2 * i + 1))
        blk.update(u=u, lin=lin, P=P)
        tape["blocks"].append(blk)
    hf, tape["rstd_f"] = C.rmsnorm(e, params["norm"], eps)
    if calibrate:
        return None, None
    head = params["tok_emb" if cfg.get("tie_embeddings") else "lm_head"]   # §6: tied, tok_emb
    tape["e_f"], tape["head"] = e, (hf, head, None)
    z = C.matmul(hf, head.T)
    loss, tape["lse"] = C.cross_entropy(z, y.reshape(-1), C.f32(cfg["zloss"]))
    tape["z"], tape["y"] = z, y.reshape(-1)
    return loss, tape


def backward(cfg, params, tape, rng):
    """§6.1: {parameter: gradient} of the loss (upstream 1.0)."""
    grads = {}
    B, T = tape["x"].shape
    gz = C.cross_entropy_backward(1.0, tape["z"], tape["y"], tape["lse"], C.f32(cfg["zloss"]))
    ghf, g_head, _, _ = linear_backward(gz, tape["head"])
    ge, grads["norm"] = C.rmsnorm_backward(ghf, tape["e_f"], params["norm"], tape["rstd_f"])
    for i in reversed(range(cfg["n_layer"])):
        blk, name = tape["blocks"][i], f"layers.{i}."
        l_qkv, l_o, l_gu, l_down = blk["lin"]
        gf = dropout(cfg, ge, rng, 2 * i + 1)
        gs, *g_down = linear_backward(gf, l_down)
        gu = C.swiglu_backward(gs, blk["u"])
        ga, *g_gu = linear_backward(gu, l_gu)
        gn, grads[name + "mlp_norm"] = C.rmsnorm_backward(ga, blk["e2"], blk["P"]["mlp_norm"], blk["rstd2"])
        ge = C.add(ge, gn)                                           # rmsnorm_fork: g_res + g_norm
        go, *g_o = linear_backward(dropout(cfg, ge, rng, 2 * i), l_o)
        gqkv = attention_backward(cfg, go, blk["att"], B, T, tape["cos"], tape["sin"])
        ga, *g_qkv = linear_backward(gqkv, l_qkv)
        gn, grads[name + "attn_norm"] = C.rmsnorm_backward(ga, blk["e1"], blk["P"]["attn_norm"], blk["rstd1"])
        ge = C.add(ge, gn)
        for lin, (gw, g_sx, g_sw) in zip(LINEARS, (g_qkv, g_o, g_gu, g_down)):
            grads[name + lin] = gw
            if g_sx is not None:
                grads[name + lin + "_sx"], grads[name + lin + "_sw"] = g_sx, g_sw
    grads["tok_emb"] = C.embedding_backward(ge, tape["x"].reshape(-1), params["tok_emb"].shape[0])
    if cfg.get("tie_embeddings"):                                    # §6.1: one add (contract §8 tie)
        grads["tok_emb"] = C.add(grads["tok_emb"], g_head)
    else:
        grads["lm_head"] = g_head
    return grads


# ------------------------------------------------------------------ §9 the step, §10 schedule
def lr_at(cfg, s):
    if s <= cfg["warmup_steps"]:
        return cfg["lr"] * s / cfg["warmup_steps"]
    span = max(cfg["max_steps"] - cfg["warmup_steps"], 1)
    return cfg["lr"] - (cfg["lr"] - cfg["min_lr"]) * min((s - cfg["warmup_steps"]) / span, 1.0)


def powi(x, n):
    result = 1.0
    while n:
        if n & 1:
            result *= x
        x *= x
        n >>= 1
    return result


def tree_sum(bufs):
    """Contract §4.4: the left-complete tree."""
    if len(bufs) == 1:
        return bufs[0]
    p = 1 << ((len(bufs) - 1).bit_length() - 1)
    return C.add(tree_sum(bufs[:p]), tree_sum(bufs[p:]))


def train_step(cfg, corpus, params, m, v, s):
    """§9: advance (params, m, v) to step s in place; returns (record fields, grad_root)."""
    names = [n for n in sorted(params) if trained(cfg, n)]          # canonical order (§3)
    B, T, N = cfg["micro_batch_size"], cfg["seq_len"], cfg["micro_batches"]
    bufs = []
    for micro in range(N):
        w = corpus.window("train", s, micro, B, T)
        loss, tape = forward(cfg, params, w[:, :-1], (s, micro), y=w[:, 1:])
        grads = backward(cfg, params, tape, (s, micro))
        bufs.append(np.concatenate([grads[n].reshape(-1) for n in names] + [loss.reshape(1)]))
    mean = C.mul(tree_sum(bufs), C.f32(1.0 / N))
    loss = mean[-1]
    grad, norm = C.clip_grad(mean[:-1], cfg["grad_clip"])
    lr = lr_at(cfg, s)
    b1, b2, wd = cfg["beta1"], cfg["beta2"], cfg["weight_decay"]
    offset = 0
    for n in names:
        p = params[n]
        g = grad[offset:offset + p.size].reshape(p.shape)
        offset += p.size
        decay = C.f32(1.0 - lr * (wd if p.ndim >= 2 else 0.0))
        params[n], m[n], v[n] = C.adamw_(p, g, m[n], v[n], C.f32(lr), C.f32(b1), C.f32(b2), C.f32(1.0 - b1),
                                         C.f32(1.0 - b2), C.f32(cfg["adam_eps"]), decay,
                                         C.f32(1.0 / (1.0 - powi(b1, s))), C.f32(1.0 / (1.0 - powi(b2, s))))
    if cfg["quant"] == "int8" and cfg["lsq_repin"]:
        repin(cfg, params)
    digest = hashlib.sha256(b"".join(corpus.window("train", s, micro, B, T).astype("<i4").tobytes()
                                     for micro in range(N))).hexdigest()
    fields = {"kind": "step", "step": s, "batch_digest": digest,
              "loss": float(loss), "loss_bits": f32_bits(loss), "grad_norm": float(norm),
              "grad_norm_bits": f32_bits(norm), "lr": float(C.f32(lr)), "lr_bits": f32_bits(lr)}
    return fields, leaf("grad", grad)


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


def checkpoint_params(path):
    """§4.1: the parameters {name: array} of a checkpoint file (§13), for an imported run's
    genesis state; the record comparison then checks them against the genesis record."""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header, base = json.loads(raw[8:8 + n]), 8 + n
    return {name[len("params."):]: np.frombuffer(raw[base + e["data_offsets"][0]:base + e["data_offsets"][1]],
                                                 "<f4").reshape(e["shape"]).astype(F32)
            for name, e in header.items() if name.startswith("params.")}


def code_digest(root):
    """§14: the build flags, then (path, SHA-256 of the file) of the files that decide the math."""
    arch = os.environ.get("REPOPS_CPU_ARCH", "") or "native"
    flags = f"-O3 -std=c++17 -ffp-contract=off -fno-fast-math -march={arch} -fopenmp"
    files = ["model.py", "repops.py", "treefold.py", "offload.py", "train.py", "data.py", "hashchain.py",
             "checkpoint.py", "quant.py"]
    kinds = {"kernels/cpu": (".cpp", ".h", ".cuh"), "kernels/cuda": (".cu", ".cpp", ".h", ".cuh"),
             "kernels/common": (".h", ".cuh")}
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
    splits = corpus.manifest["splits"]
    return {"kind": "genesis", "step": 0, "config": cfg, "code_digest": code_digest(code_root),
            "data_manifest": corpus.digest, "data_splits": {k: r["sha256"] for k, r in splits.items()},
            "data_chunks": {k: r["chunks"] for k, r in splits.items()},
            "tokenizer": corpus.manifest["tokenizer"], "vocab_size": corpus.manifest["tokenizer"]["vocab_size"]}


def replay(run_dir, data_dir, steps, code_root, say):
    """Replay genesis and steps 1..steps of run_dir; say(line) for each verdict. True if all match."""
    lines = open(os.path.join(run_dir, "chain.jsonl"), "rb").read().splitlines()
    if not 0 <= steps < len(lines):
        raise ValueError(f"the chain holds steps 0..{len(lines) - 1}, not {steps}")
    cfg = json.loads(lines[0])["config"]
    corpus = Corpus(data_dir, cfg["seed"])
    secret_path = os.path.join(run_dir, "secret")
    secret = open(secret_path, "rb").read() if os.path.exists(secret_path) else None
    if secret is None:
        say("note: no secret in the run directory: grad_commit is taken from the published records")
    init = json.loads(lines[0]).get("init")         # §4.1: an imported state is checkpoint 0's
    params = checkpoint_params(os.path.join(run_dir, "checkpoints", "step_00000000.safetensors")) \
        if init else init_params(cfg)
    m = {n: np.zeros_like(p) for n, p in params.items() if trained(cfg, n)}
    v = {n: np.zeros_like(p) for n, p in params.items() if trained(cfg, n)}
    ok, prev = True, "0" * 64
    for s in range(steps + 1):
        if s == 0:
            fields = dict(genesis_fields(cfg, corpus, code_root), **({"init": init} if init else {}))
        else:
            fields, grad_root = train_step(cfg, corpus, params, m, v, s)
            if secret is not None:                                      # §11.6
                salt = hmac.new(secret, s.to_bytes(8, "big"), hashlib.sha256).digest()
                fields["grad_commit"] = hashlib.sha256(salt + bytes.fromhex(grad_root)).hexdigest()
            else:
                fields["grad_commit"] = json.loads(lines[s]).get("grad_commit")
        state = full_state(cfg, params, m, v, s)
        root, leaves = state_hash(state)
        record = sealed(dict(fields, state_hash=root, tensor_hashes=leaves), prev)
        prev = record["record_hash"]
        if canonical_json(record).encode() == lines[s]:
            say(f"MATCH step {s}: record {record['record_hash']}")
        else:
            ok = False
            published = json.loads(lines[s])
            diff = sorted(k for k in set(record) | set(published) if record.get(k) != published.get(k))
            say(f"MISMATCH at step {s}: the record differs in {', '.join(diff) or 'its bytes'}")
        ckpt = os.path.join(run_dir, "checkpoints", f"step_{s:08d}.safetensors")
        if os.path.exists(ckpt):
            if open(ckpt, "rb").read() == checkpoint_bytes(state, root, leaves, s):
                say(f"MATCH step {s}: checkpoint {os.path.basename(ckpt)}")
            else:
                ok = False
                say(f"MISMATCH at step {s}: checkpoint {os.path.basename(ckpt)} differs")
    return ok


def main(argv):
    ap = argparse.ArgumentParser(prog="numpy_replay.py", description=__doc__.splitlines()[0])
    ap.add_argument("--run_dir", required=True)
    ap.add_argument("--data_dir", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--code_root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = ap.parse_args(argv)
    try:
        ok = replay(args.run_dir, args.data_dir, args.steps, args.code_root, lambda line: print(line, flush=True))
    except (OSError, ValueError, KeyError) as e:
        print(f"numpy_replay.py: error: {e}", file=sys.stderr)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
