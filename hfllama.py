"""Our Llama and Hugging Face's LlamaForCausalLM: configs and parameters mapped both ways, exactly.

    import hfllama
    cfg = hfllama.configure(cfg, given_keys)       # train.py --init_from=DIR: the model keys from DIR
    init = hfllama.load_into(state, cfg.init_from) # its weights as the initial parameters; the
                                                   # genesis record's "init" (file SHA-256s)
    hfllama.source_difference(folder, genesis, params, cfg)   # audit.py --init_from: is it the source?
    hfllama.keep_source_config(run_dir, folder, init)   # train.py: the source's config.json, kept
    hf = hfllama.to_hf(params, cfg)                # export.py: {HF name: tensor}
    hfllama.max_positions(run_dir, genesis, cfg)   # export.py: max_position_embeddings and why
    hfllama.hf_config(cfg, positions, bos, eos)    # export.py: config.json's fields

The mapping moves bits and never computes (a permutation of rows, a split, a concatenation),
so an export imports back to the same parameters bit for bit. Names (layer i):

    tok_emb                        model.embed_tokens.weight
    layers.i.attn_norm             model.layers.i.input_layernorm.weight
    layers.i.wqkv (rows q | k | v) model.layers.i.self_attn.{q,k,v}_proj.weight (RoPE rows permuted)
    layers.i.wo                    model.layers.i.self_attn.o_proj.weight
    layers.i.mlp_norm              model.layers.i.post_attention_layernorm.weight
    layers.i.w_gate_up (gate | up) model.layers.i.mlp.{gate,up}_proj.weight
    layers.i.w_down                model.layers.i.mlp.down_proj.weight
    norm, lm_head                  model.norm.weight, lm_head.weight (absent when tied)

RoPE: our kernel rotates interleaved pairs (row 2i, row 2i+1) of each head with frequency i;
HF's rotate_half pairs row i with row i + Dh/2. Each query and key head's rows are permuted:
HF row (half, i) = our row (i, half), i < Dh/2, half in {0, 1}. Values need no permutation.

A source folder holds config.json and model.safetensors (or model.safetensors.index.json and
its shards), float32, bfloat16 or float16 (each widened to float32 exactly). What our model
cannot express is refused with one line (UsageError): biases, another activation, a scaled RoPE,
a head size other than hidden / heads, a tensor we have no parameter for (old checkpoints'
rotary_emb.inv_freq buffers are skipped: they are not parameters), a shape that does not fit,
sizes beyond config.MODEL_LIMITS, a weight that is NaN or infinite.

The folder's files are bounded before they are read (source_files): each must be a regular file
(a symbolic link is followed to one; a device, a FIFO or a directory is refused), config.json
at most 1 MiB, the index at most 16 MiB naming at most as many tensors as the model has, and the
shards together at most what the model's tensors take in float32 plus their headers
(weights_limit: the model of config.json on import, of the genesis config in the audit's
source check), so nothing is hashed or mapped past what the model can need.
The `safetensors` library is imported only here, inside the functions that read or write.

max_position_embeddings of an export. An imported run keeps its source's value: train.py keeps
the source's config.json in the run directory, byte for byte, as SOURCE_CONFIG (its SHA-256 is
the genesis record's init.files["config.json"], which export checks before reading it). A run
trained here gets max(seq_len, NATIVE_MAX_POSITIONS): 2048 is transformers' LlamaConfig default,
the value an HF Llama config has when it says nothing, so `generate` with its default settings
neither warns nor stops early on a model with a short seq_len. Neither is a trained length:
the model was trained on positions 0..seq_len-1 only (our sampler keeps to them with a sliding
context; docs/finetune-hf.md says how transformers differs).
"""
import dataclasses
import hashlib
import json
import math
import os
import stat

import torch

import hashchain
from config import UsageError
from model import param_shapes

# HF config key -> our config key: the model's shape, taken from the source's config.json.
SHAPE_KEYS = {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
              "num_key_value_heads": "n_kv_head", "hidden_size": "d_model",
              "intermediate_size": "d_hidden", "vocab_size": "vocab_size",
              "rms_norm_eps": "norm_eps", "tie_word_embeddings": "tie_embeddings"}
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX = "model.safetensors.index.json"
NATIVE_MAX_POSITIONS = 2048             # transformers' LlamaConfig default (module docstring)
SOURCE_CONFIG = "source_config.json"    # in an imported run's directory: the source's config.json
MAX_CONFIG = 1 << 20            # config.json
MAX_INDEX = 16 << 20            # the shard index: about 100 bytes per tensor
SHARD_HEADER = 64 << 10         # a shard's safetensors header: its fixed part, then per tensor
TENSOR_HEADER = 4 << 10


def _read_config(folder):
    path = os.path.join(folder, "config.json")
    if not os.path.isdir(folder):           # a parent run's directory mistyped, most often
        raise UsageError(f"--init_from={folder}: no such directory (a parent run's directory, "
                         "optionally @STEP, or a Hugging Face model folder)")
    if not os.path.lexists(path):
        raise UsageError(f"--init_from={folder}: no config.json there (a Hugging Face model folder)")
    try:
        hf = json.loads(hashchain.read_bytes(path, "config.json", MAX_CONFIG, UsageError))
        if not isinstance(hf, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        raise UsageError(f"--init_from={folder}: cannot read config.json: {e}") from None
    return hf


def _rope_theta(hf, where):
    """RoPE's base from a transformers 5 (rope_parameters) or 4 (rope_theta, rope_scaling) config;
    a scaled RoPE (llama3, linear, dynamic, yarn, ...) is refused."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    kind = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if kind != "default":
        raise UsageError(f"{where}: RoPE type {kind!r} cannot be expressed (only unscaled RoPE)")
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def model_keys(hf, where):
    """{our config key: value} that the HF config dict `hf` decides; UsageError for what our
    model cannot express, or a malformed value."""
    try:
        return _model_keys(hf, where)
    except (TypeError, ValueError, AttributeError) as e:
        raise UsageError(f"{where}: malformed config.json ({type(e).__name__}: {e})") from None


def _model_keys(hf, where):
    if hf.get("model_type") != "llama":
        raise UsageError(f"{where}: model_type {hf.get('model_type')!r} is not 'llama'")
    for key, ok in (("attention_bias", False), ("mlp_bias", False), ("hidden_act", "silu")):
        if hf.get(key, ok) != ok:
            raise UsageError(f"{where}: {key}={hf[key]!r} cannot be expressed (our Llama has "
                             "no biases and a SiLU-gated MLP)")
    missing = [k for k in SHAPE_KEYS if k not in hf and k not in ("num_key_value_heads", "tie_word_embeddings")]
    if missing:
        raise UsageError(f"{where}: config.json lacks {', '.join(missing)}")
    keys = {ours: hf.get(theirs) for theirs, ours in SHAPE_KEYS.items()}
    keys["n_kv_head"] = keys["n_kv_head"] or keys["n_head"]
    keys["tie_embeddings"] = bool(keys["tie_embeddings"])
    keys["norm_eps"] = float(keys["norm_eps"])
    keys["rope_theta"] = _rope_theta(hf, where)
    head_dim = hf.get("head_dim") or keys["d_model"] // keys["n_head"]
    if head_dim * keys["n_head"] != keys["d_model"]:
        raise UsageError(f"{where}: head_dim {head_dim} x {keys['n_head']} heads is not "
                         f"hidden_size {keys['d_model']} (our heads split the width)")
    if not all(isinstance(keys[k], int) and not isinstance(keys[k], bool) and keys[k] > 0
               for k in ("n_layer", "n_head", "n_kv_head", "d_model", "d_hidden", "vocab_size")):
        raise UsageError(f"{where}: the model's sizes must be positive integers")
    return keys


def configure(cfg, given):
    """cfg with the model keys of cfg.init_from's config.json. A key the command line sets
    (`given`, config.given_keys) to another value is refused: the source decides it."""
    keys = model_keys(_read_config(cfg.init_from), f"--init_from={cfg.init_from}")
    clash = sorted(k for k in keys if k in given and getattr(cfg, k) != keys[k])
    if clash:
        k = clash[0]
        raise UsageError(f"--{k}={getattr(cfg, k)!r} contradicts {cfg.init_from}/config.json "
                         f"({keys[k]!r}): the imported model decides it; leave it out")
    if cfg.quant != "none":
        raise UsageError("--init_from with --quant=int8 is not supported (the step sizes would "
                         "be calibrated on another model's weights)")
    return dataclasses.replace(cfg, **keys)


def weights_limit(cfg, n_shards):
    """The most bytes `n_shards` safetensors files can need for the model of cfg: every tensor
    in float32 (a tied model may also save lm_head, and old checkpoints a rotary_emb.inv_freq of
    head_dim / 2 per layer), plus the headers."""
    elements = sum(math.prod(s) for s in param_shapes(cfg).values())
    elements += cfg.vocab_size * cfg.d_model * cfg.tie_embeddings + cfg.n_layer * cfg.d_model // cfg.n_head // 2
    return 4 * elements + n_shards * (8 + SHARD_HEADER) + TENSOR_HEADER * max_tensors(cfg)


def max_tensors(cfg):
    """The most tensors a source of cfg's model holds: 9 per layer (and an inv_freq buffer),
    the embedding, the final norm and lm_head."""
    return 3 + 10 * cfg.n_layer


def _regular_size(path, where):
    """The size of `path`, a regular file (a symbolic link is followed); UsageError otherwise."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise UsageError(f"{where}: {os.path.basename(path)} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{where}: {os.path.basename(path)} is not a regular file")
    return st.st_size


def source_files(folder, cfg):
    """({file name: size}, [shard name]) of a source folder for the model of cfg: config.json and
    model.safetensors, or config.json, the index and the shards it names; UsageError for a file
    that is not a regular file or is larger than the model can need (the module's docstring),
    before any of it is hashed or mapped."""
    where = f"--init_from={folder}"
    if os.path.lexists(os.path.join(folder, INDEX)):
        index = hashchain.read_json(os.path.join(folder, INDEX), f"{where}: {INDEX}", MAX_INDEX, UsageError)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise UsageError(f"{where}: {INDEX} has no weight_map of tensor names to shard files")
        if len(weight_map) > max_tensors(cfg):
            raise UsageError(f"{where}: {INDEX} names {len(weight_map)} tensors; the model has at most "
                             f"{max_tensors(cfg)}")
        shards = sorted(set(weight_map.values()))
        files = ["config.json", INDEX] + shards
    else:
        shards = ["model.safetensors"]
        files = ["config.json"] + shards
    if any(os.path.basename(s) != s or s in ("", ".", "..", "config.json", INDEX) for s in shards):
        raise UsageError(f"{where}: a shard name is not a weights file of the folder")
    sizes = {name: _regular_size(os.path.join(folder, name), where) for name in files}
    for name, limit in (("config.json", MAX_CONFIG), (INDEX, MAX_INDEX)):
        if sizes.get(name, 0) > limit:
            raise UsageError(f"{where}: {name} is larger than {limit} bytes")
    limit = weights_limit(cfg, len(shards))
    if sum(sizes[s] for s in shards) > limit:
        raise UsageError(f"{where}: the weights files hold {sum(sizes[s] for s in shards)} bytes; a "
                         f"{cfg.n_layer}-layer model of width {cfg.d_model} and vocab {cfg.vocab_size} "
                         f"needs at most {limit}")
    return sizes, shards


def _hashes(folder, sizes):
    """{file name: SHA-256 hex} of the files source_files sized, each read in blocks up to its
    size (UsageError if it is no regular file any more, or grew)."""
    where, out = f"--init_from={folder}", {}
    for name, size in sizes.items():
        h, total = hashlib.sha256(), 0
        with hashchain.open_regular(os.path.join(folder, name), f"{where}: {name}", UsageError) as f:
            while block := f.read(min(1 << 24, size + 1 - total)):
                total += len(block)
                if total > size:
                    raise UsageError(f"{where}: {name} grew past {size} bytes while it was read")
                h.update(block)
        out[name] = h.hexdigest()
    return out


def read_source(folder, cfg):
    """({HF name: float32 tensor}, {file name: SHA-256}) of a source folder for the model of
    cfg (source_files bounds its files first)."""
    sizes, shards = source_files(folder, cfg)
    hashes = _hashes(folder, sizes)
    return _load(folder, shards), hashes


def _load(folder, shards):
    """{HF name: float32 tensor} of the shards (bounded by source_files)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    tensors = {}
    try:
        for shard in shards:
            tensors.update(load_file(os.path.join(folder, shard)))
    except (OSError, ValueError, SafetensorError) as e:
        raise UsageError(f"--init_from={folder}: cannot read the weights: {e}") from None
    for name, t in tensors.items():
        if t.dtype not in FLOAT_DTYPES:
            raise UsageError(f"--init_from={folder}: tensor {name} is {t.dtype}, not float32, "
                             "bfloat16 or float16")
    return {n: t.to(torch.float32) for n, t in tensors.items()}


def _rope_rows(w, n_heads, head_dim, to_hf):
    """w [n_heads * head_dim, d] with each head's rows permuted from interleaved RoPE pairs to
    HF's half-split ones (to_hf) or back."""
    d = w.shape[1]
    if to_hf:   # ours: [head, i, half] -> HF: [head, half, i]
        return w.view(n_heads, head_dim // 2, 2, d).transpose(1, 2).reshape(n_heads * head_dim, d)
    return w.view(n_heads, 2, head_dim // 2, d).transpose(1, 2).reshape(n_heads * head_dim, d)


def _names(i):
    p = f"model.layers.{i}."
    return {"attn_norm": p + "input_layernorm.weight", "wo": p + "self_attn.o_proj.weight",
            "mlp_norm": p + "post_attention_layernorm.weight", "w_down": p + "mlp.down_proj.weight"}


def to_hf(params, cfg):
    """{HF name: tensor} of our parameters {name: tensor} under the resolved config cfg. A
    parameter the mapping has no place for is refused (UsageError): nothing is dropped."""
    H, Hkv, Dh = cfg.n_head, cfg.n_kv_head, cfg.d_model // cfg.n_head
    used = set()

    def take(name):
        used.add(name)
        return params[name]

    out = {"model.embed_tokens.weight": take("tok_emb"), "model.norm.weight": take("norm")}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = take("lm_head")
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        out.update({hf: take(f"layers.{i}.{ours}") for ours, hf in _names(i).items()})
        q, k, v = take(f"layers.{i}.wqkv").split([H * Dh, Hkv * Dh, Hkv * Dh])
        out[p + "self_attn.q_proj.weight"] = _rope_rows(q, H, Dh, True)
        out[p + "self_attn.k_proj.weight"] = _rope_rows(k, Hkv, Dh, True)
        out[p + "self_attn.v_proj.weight"] = v
        gate, up = take(f"layers.{i}.w_gate_up").split([cfg.d_hidden, cfg.d_hidden])
        out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = gate, up
    unmapped = sorted(set(params) - used)
    if unmapped:
        raise UsageError(f"parameter {unmapped[0]} has no place in a LlamaForCausalLM")
    return {n: t.contiguous() for n, t in sorted(out.items())}


def from_hf(hf, cfg, shapes, where):
    """{our name: tensor} from HF tensors `hf`; `shapes` {our name: shape} is the model's
    (model.param_shapes). UsageError for a tensor missing, left over, of the wrong shape, or
    holding a NaN or an infinity."""
    hf = {n: t for n, t in hf.items() if not n.endswith("rotary_emb.inv_freq")}
    H, Hkv, Dh = cfg.n_head, cfg.n_kv_head, cfg.d_model // cfg.n_head
    used = set()

    def take(name):
        if name not in hf:
            raise UsageError(f"{where}: tensor {name} is missing")
        if hf[name].is_floating_point() and not torch.isfinite(hf[name]).all():
            raise UsageError(f"{where}: tensor {name} holds a NaN or an infinity (an imported weight must be "
                             "finite: the first step would stop on it)")
        used.add(name)
        return hf[name]

    out = {"tok_emb": take("model.embed_tokens.weight"), "norm": take("model.norm.weight")}
    if not cfg.tie_embeddings:
        out["lm_head"] = take("lm_head.weight")
    elif "lm_head.weight" in hf:     # a tied model saved with both: they must be one tensor
        if not torch.equal(take("lm_head.weight"), out["tok_emb"]):
            raise UsageError(f"{where}: tie_word_embeddings is true but lm_head.weight differs "
                             "from model.embed_tokens.weight")
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        out.update({f"layers.{i}.{ours}": take(name) for ours, name in _names(i).items()})
        q, k, v = (take(p + f"self_attn.{x}_proj.weight") for x in "qkv")
        if (q.shape[0], k.shape[0], v.shape[0]) != (H * Dh, Hkv * Dh, Hkv * Dh):
            raise UsageError(f"{where}: layer {i}'s q/k/v projections have {q.shape[0]}, "
                             f"{k.shape[0]}, {v.shape[0]} rows, the config says {H * Dh}, "
                             f"{Hkv * Dh}, {Hkv * Dh}")
        out[f"layers.{i}.wqkv"] = torch.cat([_rope_rows(q, H, Dh, False), _rope_rows(k, Hkv, Dh, False), v])
        out[f"layers.{i}.w_gate_up"] = torch.cat([take(p + "mlp.gate_proj.weight"),
                                                 take(p + "mlp.up_proj.weight")])
    extra = sorted(set(hf) - used)
    if extra:
        raise UsageError(f"{where}: tensor {extra[0]} has no place in our Llama"
                         + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    for name, t in out.items():
        if tuple(t.shape) != tuple(shapes[name]):
            raise UsageError(f"{where}: {name} would be {list(t.shape)}, the config says "
                             f"{list(shapes[name])}")
    return {n: t.contiguous() for n, t in out.items()}


def load_into(state, folder):
    """Set the parameters of `state` (train.TrainState, moments zero) to the weights of the HF
    folder; returns the genesis record's "init" field: {"format": "hf-llama", "files": {name:
    SHA-256}} (the tensors that result are the genesis record's tensor hashes)."""
    tensors, hashes = read_source(folder, state.model.cfg)
    params = from_hf(tensors, state.model.cfg, param_shapes(state.model.cfg), f"--init_from={folder}")
    with torch.no_grad():
        for name, p in state.params.items():
            if name in params:          # (the quantizer's step sizes are refused in configure)
                p.copy_(params[name])
    return {"format": "hf-llama", "files": hashes}


def source_difference(folder, init, params, cfg):
    """None if `folder` is the source that a genesis record's `init` names and its weights map
    to `params` (the genesis parameters, {name: tensor}) bit for bit; else what differs. The
    files are bounded by the genesis config's model (source_files) and their names compared
    with the record's before any is hashed."""
    sizes, shards = source_files(folder, cfg)
    recorded = init.get("files") if isinstance(init.get("files"), dict) else {}
    hashes = _hashes(folder, sizes) if set(sizes) == set(recorded) else dict.fromkeys(sizes)
    if hashes != recorded:
        bad = sorted(k for k in set(hashes) | set(recorded) if hashes.get(k) != recorded.get(k))
        return f"the source folder {folder} is not the one the genesis record names ({bad[0]} differs)"
    mapped = from_hf(_load(folder, shards), cfg, param_shapes(cfg), folder)
    for name in sorted(mapped):
        if not torch.equal(mapped[name].view(torch.int32), params[name].contiguous().view(torch.int32)):
            return f"the source's weights do not map to the genesis parameters ({name} differs)"
    return None


def keep_source_config(run_dir, folder, init):
    """Copy the source's config.json into run_dir as SOURCE_CONFIG (atomically), after checking
    that its bytes are those whose SHA-256 the genesis record's `init` holds."""
    try:
        with open(os.path.join(folder, "config.json"), "rb") as f:
            raw = f.read(MAX_CONFIG + 1)
    except OSError as e:
        raise UsageError(f"--init_from={folder}: cannot read config.json: {e.strerror}") from None
    if hashlib.sha256(raw).hexdigest() != init["files"]["config.json"]:
        raise UsageError(f"--init_from={folder}: config.json changed while the source was read")
    hashchain.write_atomically(os.path.join(run_dir, SOURCE_CONFIG), raw)


def max_positions(run_dir, genesis, cfg):
    """(max_position_embeddings of the run's export, where it comes from). An import: its source's
    value, from SOURCE_CONFIG once its SHA-256 is the genesis record's (UsageError if it is not:
    the copy was changed); a run kept no copy: the native rule, saying so. A native run:
    max(seq_len, NATIVE_MAX_POSITIONS)."""
    native = max(cfg.seq_len, NATIVE_MAX_POSITIONS)
    rule = f"max(seq_len {cfg.seq_len}, transformers' default {NATIVE_MAX_POSITIONS})"
    init = genesis.get("init")
    if not init:
        return native, rule
    import hashchain
    path = os.path.join(run_dir, SOURCE_CONFIG)
    if not os.path.lexists(path):
        return native, rule + f" (the run keeps no {SOURCE_CONFIG}, so its source's value is unknown)"
    with hashchain.open_regular(path, SOURCE_CONFIG, UsageError) as f:
        raw = f.read(MAX_CONFIG + 1)
    if hashlib.sha256(raw).hexdigest() != (init.get("files") or {}).get("config.json"):
        raise UsageError(f"{path} is not the source's config.json that the genesis record names (SHA-256 differs)")
    value = json.loads(raw).get("max_position_embeddings")
    if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return native, rule + " (the source's config.json gives no max_position_embeddings)"
    return value, "the imported source's config.json"


def hf_config(cfg, positions, bos=None, eos=None):
    """config.json's fields for LlamaForCausalLM with the resolved config cfg's model;
    positions: max_position_embeddings; bos, eos: the tokenizer's token ids (None: none)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": cfg.d_model, "intermediate_size": cfg.d_hidden,
            "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
            "num_key_value_heads": cfg.n_kv_head, "head_dim": cfg.d_model // cfg.n_head,
            "hidden_act": "silu", "rms_norm_eps": cfg.norm_eps, "vocab_size": cfg.vocab_size,
            "max_position_embeddings": positions, "tie_word_embeddings": cfg.tie_embeddings,
            "rope_theta": cfg.rope_theta, "rope_scaling": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
            "initializer_range": cfg.init_std, "pretraining_tp": 1, "use_cache": True,
            "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": None,
            "torch_dtype": "float32", "dtype": "float32"}
