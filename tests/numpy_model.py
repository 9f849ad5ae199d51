"""The state and the model of SPEC.md in NumPy: the second half of the NumPy replay's arithmetic.

    import numpy_model as M
    params = M.init_params(cfg)                 # cfg: the genesis record's config (a dict)
    loss, tape = M.forward(cfg, params, x, rng=(step, micro), y=y)   # x, y int64 [B, T]
    grads = M.backward(cfg, params, tape, rng=(step, micro))         # {parameter: gradient}

SPEC §3-§4 (the state's parameters and their init) and §6-§8 (the forward pass as contract
operators, its backward, dropout, the int8 path and int8 P·V), every float operation through
numpy_contract.py (int8 P·V: numpy_int8_pv.py). Like the rest of the replay it imports nothing
from the project.
"""
import hashlib
import math

import numpy as np

import numpy_contract as C
import numpy_exact as E
import numpy_int8_pv as PV

F32 = np.float32
INIT = 1                                            # Philox purpose tag (contract §6)
QP, CALIBRATION_STREAM, CALIBRATION_ROWS = 127, 0x15C0, 4
LINEARS = ("wqkv", "wo", "w_gate_up", "w_down")


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


# ------------------------------------------------------------------ §6-§8 the model
def matmul_of(cfg):
    """The matrix product of every lin and attention product: the contract's §4.1 matmul, or
    with matmul = "exact" its exact integer matmul §11 (SPEC §19)."""
    return E.exact_matmul if cfg.get("matmul", "fp32") == "exact" else C.matmul


def linear(a, w, q, tape, mm=C.matmul):
    """y = a @ w^T (§6 lin; mm: matmul_of(cfg)), or through int8 (§8.1) when q = (sx, sw, calibrate)."""
    if q is None:
        tape.append((a, w, None))
        return mm(a, w.T)
    sx, sw, calibrate = q
    if calibrate:
        sx[...] = C.lsq_init(a, 1)
    qa, qw = C.int8_quantize(a, sx), C.int8_quantize(w, sw)
    tape.append((a, w, (sx, sw, qa, qw)))
    return C.int8_linear(qa, qw, sx, sw)


def linear_backward(g, saved, mm=C.matmul):
    """(ga, gw, g_sx, g_sw) of linear (§6.1, §8.2)."""
    a, w, q = saved
    if q is None:
        return mm(g, w), mm(g.T, a), None, None
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
    mm = matmul_of(cfg)
    p = C.causal_softmax(mm(q, k.transpose(0, 2, 1)).reshape(B * H, T, T), scale)
    p = p.reshape(B * Hkv, G * T, T)
    o = PV.int8_pv_full(p, v) if cfg.get("int8_pv") else mm(p, v)        # §8.4 int8 P·V
    o = o.reshape(B, H, T, Dh).transpose(0, 2, 1, 3).reshape(B * T, H * Dh)
    return o, (q, k, v, p, scale)


def attention_backward(cfg, go, saved, B, T, cos, sin):
    H, Hkv, G, Dh = dims(cfg)
    q, k, v, p, scale = saved
    go = go.reshape(B, T, H, Dh).transpose(0, 2, 1, 3).reshape(B * Hkv, G * T, Dh)
    mm = matmul_of(cfg)
    if cfg.get("int8_pv"):                                         # §8.4: the dequantized Ph, Vh
        gp, gv = PV.int8_pv_full_backward(go, p, v)
    else:
        gp = mm(go, v.transpose(0, 2, 1))
        gv = mm(p.transpose(0, 2, 1), go)                          # sum over the group's G*T rows
    gs = C.causal_softmax_backward(gp.reshape(B * H, T, T), p.reshape(B * H, T, T), scale)
    gs = gs.reshape(B * Hkv, G * T, T)
    gq, gk = mm(gs, k), mm(gs.transpose(0, 2, 1), q)
    gq = gq.reshape(B, H, T, Dh).transpose(0, 2, 1, 3)
    gk, gv = (t.reshape(B, Hkv, T, Dh).transpose(0, 2, 1, 3) for t in (gk, gv))
    gq, gk = C.rope(gq, cos, sin, backward=True), C.rope(gk, cos, sin, backward=True)
    return np.concatenate([gq, gk, gv], axis=2).reshape(B * T, -1)


def forward(cfg, params, x, rng, calibrate=False, y=None):
    """§6: (loss, tape) of token ids x [B, T] (targets y); calibrate: §8.3, up to hf."""
    B, T = x.shape
    eps, H = C.f32(cfg["norm_eps"]), cfg["n_head"]
    cos, sin = C.rope_tables(cfg["seq_len"], cfg["d_model"] // H, C.f32(cfg["rope_theta"]))
    int8, mm = cfg["quant"] == "int8", matmul_of(cfg)
    e = C.embedding(params["tok_emb"], x.reshape(-1))
    tape = {"x": x, "blocks": [], "cos": cos, "sin": sin}
    for i in range(cfg["n_layer"]):
        layer = {n: params[f"layers.{i}.{n}"] for n in ("attn_norm", "wqkv", "wo", "mlp_norm", "w_gate_up", "w_down")}
        q = {n: (params[f"layers.{i}.{n}_sx"], params[f"layers.{i}.{n}_sw"], calibrate) if int8 else None
             for n in LINEARS}
        lin = []
        blk = {"e1": e}
        a, blk["rstd1"] = C.rmsnorm(e, layer["attn_norm"], eps)
        o, blk["att"] = attention(cfg, linear(a, layer["wqkv"], q["wqkv"], lin, mm), B, T, cos, sin)
        e = C.add(e, dropout(cfg, linear(o, layer["wo"], q["wo"], lin, mm), rng, 2 * i))
        blk["e2"] = e
        a, blk["rstd2"] = C.rmsnorm(e, layer["mlp_norm"], eps)
        u = linear(a, layer["w_gate_up"], q["w_gate_up"], lin, mm)
        f = linear(C.swiglu(u), layer["w_down"], q["w_down"], lin, mm)
        e = C.add(e, dropout(cfg, f, rng, 2 * i + 1))
        blk.update(u=u, lin=lin, layer=layer)
        tape["blocks"].append(blk)
    hf, tape["rstd_f"] = C.rmsnorm(e, params["norm"], eps)
    if calibrate:
        return None, None
    head = params["tok_emb" if cfg.get("tie_embeddings") else "lm_head"]   # §18: tied, tok_emb
    tape["e_f"], tape["head"] = e, (hf, head, None)
    z = mm(hf, head.T)
    loss, tape["lse"] = C.cross_entropy(z, y.reshape(-1), C.f32(cfg["zloss"]))
    tape["z"], tape["y"] = z, y.reshape(-1)
    return loss, tape


def backward(cfg, params, tape, rng):
    """§6.1: {parameter: gradient} of the loss (upstream 1.0). tape["witness"]: the gradient at
    the residual stream after block 0 (§20.3), as the backward passes it."""
    grads = {}
    B, T = tape["x"].shape
    mm = matmul_of(cfg)
    gz = C.cross_entropy_backward(1.0, tape["z"], tape["y"], tape["lse"], C.f32(cfg["zloss"]))
    ghf, g_head, _, _ = linear_backward(gz, tape["head"], mm)
    ge, grads["norm"] = C.rmsnorm_backward(ghf, tape["e_f"], params["norm"], tape["rstd_f"])
    for i in reversed(range(cfg["n_layer"])):
        if i == 0:
            tape["witness"] = ge                                     # [R, d]: block 0's output's gradient
        blk, name = tape["blocks"][i], f"layers.{i}."
        l_qkv, l_o, l_gu, l_down = blk["lin"]
        gf = dropout(cfg, ge, rng, 2 * i + 1)
        gs, *g_down = linear_backward(gf, l_down, mm)
        gu = C.swiglu_backward(gs, blk["u"])
        ga, *g_gu = linear_backward(gu, l_gu, mm)
        gn, grads[name + "mlp_norm"] = C.rmsnorm_backward(ga, blk["e2"], blk["layer"]["mlp_norm"], blk["rstd2"])
        ge = C.add(ge, gn)                                           # rmsnorm_fork: g_res + g_norm
        go, *g_o = linear_backward(dropout(cfg, ge, rng, 2 * i), l_o, mm)
        gqkv = attention_backward(cfg, go, blk["att"], B, T, tape["cos"], tape["sin"])
        ga, *g_qkv = linear_backward(gqkv, l_qkv, mm)
        gn, grads[name + "attn_norm"] = C.rmsnorm_backward(ga, blk["e1"], blk["layer"]["attn_norm"], blk["rstd1"])
        ge = C.add(ge, gn)
        for lin, (gw, g_sx, g_sw) in zip(LINEARS, (g_qkv, g_o, g_gu, g_down)):
            grads[name + lin] = gw
            if g_sx is not None:
                grads[name + lin + "_sx"], grads[name + lin + "_sw"] = g_sx, g_sw
    grads["tok_emb"] = C.embedding_backward(ge, tape["x"].reshape(-1), params["tok_emb"].shape[0])
    if cfg.get("tie_embeddings"):                                    # §18: one add (contract §8 tie)
        grads["tok_emb"] = C.add(grads["tok_emb"], g_head)
    else:
        grads["lm_head"] = g_head
    return grads
