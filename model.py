"""A Llama-style language model built only from RepOps (every float operation is reproducible).

Pre-norm RMSNorm, rotary position embeddings, causal grouped-query attention (n_kv_head
key/value heads, each shared by n_head / n_kv_head query heads; n_kv_head = n_head is plain
multi-head attention), SwiGLU MLP, no biases, untied input/output embeddings (tie_embeddings:
one tensor tok_emb is both; its two gradient contributions meet in one RepOps add, repops.tie).
Initialization is canonical: Philox normals keyed by (seed, a hash of the parameter name), so
every machine starts from the same bits.

    from model import ModelConfig, Llama
    model = Llama(ModelConfig(n_layer=2), seed=1337)
    loss = model(idx, targets)                      # idx, targets: int64 [B, T]
    logits = model.logits(idx)                      # [B, T, vocab]
    ids = model.generate([10, 20], n_tokens=50, seed=7)   # the same tokens on every machine
    cache = KVCache(model); h = model.hidden(idx, cache=cache)   # keys and values kept: decode
    h = model.hidden(next_idx, cache=cache)         # next_idx [B, 1]: one position further

Parameters: tok_emb [vocab, d], (with emb_norm) emb_norm [d], layers.{i}.{attn_norm [d], wqkv [(H + 2 Hkv) Dh, d] (rows: H query
heads, Hkv key heads, Hkv value heads; [3d, d] when Hkv = H), wo [d, d], mlp_norm [d],
w_gate_up [2h, d], w_down [d, h]}, norm [d], lm_head [vocab, d] (none when tied; with
quant="int8" also each block linear's step sizes layers.{i}.<linear>_sx [1] and _sw [out], quant.py); `named_tensors()` lists them
by dotted name in sorted order, the canonical order of the flat gradient and the state hash.

The residual stream enters each block through repops.rmsnorm_fork, so a tensor feeds two
consumers without autograd ever adding gradients itself (contract §8 rmsnorm_fork); QKV and
gate/up projections are fused matrices for the same reason. A shared key/value head is never
copied per query head: the G query heads of a group are stacked as G*T rows of one matmul
against their key head, so the gradient of the key (and value) head sums the group's
contributions inside the matmul's canonical k-ordered sum (query head g, then position t;
contract §8 attention), never in autograd's accumulation.

matmul="exact" makes every matmul above (the linears with both backward products, lm_head,
QK^T and P V, or with a window its band products) the exact integer matmul of contract §11
(docs/exact-matmul.md).

Recipe options (all off by default; docs/open1b-recipe.md): attn_window W > 0 makes a layer
attend over its last W keys in O(T*W) (repops.window_attention; every full_attn_every-th layer
and the last stay full, `windowed`); qk_norm is a gain-free RMSNorm of each q and k head before
RoPE; emb_norm an RMSNorm (weight emb_norm [d]) of the embeddings before the first block.
int8_pv (with quant="int8") computes every layer's P·V, full and windowed, in int8 (quant.py).

With recompute, each block runs under activation checkpointing: backward re-runs the block's
forward (the same kernels on the same inputs, the same Philox dropout masks), so the bits are
unchanged and only one block's attention scores [B*H, T, T] are alive at a time.

Decoding with a KV cache (generate; docs/sampling.md). KVCache keeps each layer's keys and
values (after QK-norm and RoPE) of the positions seen so far; hidden(idx [B, 1], cache=cache)
then computes one position further: every linear, norm and MLP on its one row (each output row
of a §4.1 matmul and of a row norm is computed from that row alone), and attention of its query
row against the cached keys: the scores S = q K^T (§4.1, over Dh), the row's softmax with
causal_softmax's own formula (row_softmax below), and P V (§4.1 over the keys in increasing
order; a windowed layer over its last attn_window keys, the band's valid terms). These are the
sums and the order of the last row of the full forward, so the cached decode's hidden state
(and logits) equal the last row of `hidden(all positions)` bit for bit, with one exception that
contract §4.1 names: in the full forward an earlier row t of a full layer's P V also adds the
future keys' +0.0 * v terms after its last real one (j > t), and a +0.0 term turns a partial sum
that is exactly -0.0 (an add flushed to zero from below) into +0.0; the cache holds that row
as it was computed, as the last row, without them. An attention output that sums to exactly
-0.0 needs cancellation to below 2^-126; tests/test_sample.py checks the equality on every
position of models with each option. int8 P·V and the exact matmul have no cached form: their
P V takes scales over all the keys of the context (a block's absmax, §10; a column scale and
K's width, §11), so a row's output changes when keys are added; generate then runs the full
forward for every token.
"""
import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.utils.checkpoint

import quant
import repops


@dataclass
class ModelConfig:
    vocab_size: int = 256      # byte-level tokenizer by default
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int = 0         # 0: n_head (multi-head attention); must divide n_head
    d_model: int = 128
    d_hidden: int = 384        # SwiGLU hidden width
    seq_len: int = 128         # context length (RoPE tables are built for it)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    dropout: float = 0.0       # Philox dropout on each residual branch (0 disables)
    init_std: float = 0.02
    quant: str = "none"        # "int8": block linears are W8A8 with LSQ step sizes (quant.py)
    lsq_repin: bool = True     # int8: re-pin the weight step sizes after every step (else learn them)
    recompute: bool = False    # activation checkpointing per block (same bits, less memory)
    attn_window: int = 0       # > 0: sliding-window attention over the last attn_window keys
    full_attn_every: int = 0   # with a window: layers i with (i + 1) % this == 0 stay full (0: none)
    qk_norm: bool = False      # gain-free RMSNorm of each query and key head before RoPE
    emb_norm: bool = False     # RMSNorm (weight emb_norm [d]) of the token embeddings
    tie_embeddings: bool = False  # lm_head is tok_emb (no lm_head parameter)
    int8_pv: bool = False      # with quant="int8": attention's P·V in int8 (quant.py)
    matmul: str = "fp32"       # "exact": every matmul is the exact integer matmul (contract §11)


def param_stream_id(name):
    """32-bit Philox stream id of a parameter: stable when other parameters are added."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def param_shapes(cfg):
    """{dotted name: shape} of every parameter, without allocating any (e.g. to count them)."""
    d, h, v = cfg.d_model, cfg.d_hidden, cfg.vocab_size
    qkv = (cfg.n_head + 2 * (cfg.n_kv_head or cfg.n_head)) * (d // cfg.n_head)
    shapes = {"tok_emb": (v, d), "norm": (d,)} | ({} if cfg.tie_embeddings else {"lm_head": (v, d)})
    if cfg.emb_norm:
        shapes["emb_norm"] = (d,)
    for i in range(cfg.n_layer):
        shapes.update({f"layers.{i}.attn_norm": (d,), f"layers.{i}.wqkv": (qkv, d),
                       f"layers.{i}.wo": (d, d), f"layers.{i}.mlp_norm": (d,),
                       f"layers.{i}.w_gate_up": (2 * h, d), f"layers.{i}.w_down": (d, h)})
    return shapes


def windowed(cfg, i):
    """Does layer i (0-based) attend over a sliding window? Not with attn_window 0, never the
    last layer, and not the layers with (i + 1) % full_attn_every == 0 (every 5th: 4, 9, ...)."""
    every = cfg.full_attn_every
    return cfg.attn_window > 0 and i != cfg.n_layer - 1 and not (every and (i + 1) % every == 0)


def row_softmax(s, scale):
    """softmax(s * scale) over the last dim of s [..., n], every column a real term: causal_
    softmax's formula for its row t = n - 1 (contract §8), composed of RepOps kernels:
    z = s * scale; m = max(z); e = exp(z - m); P = e * recip(csum(e)). The max is torch.amax, a
    selection without arithmetic, which picks the contract's cmax value; between +0.0 and -0.0
    it may pick the other sign, which changes nothing: z - (+-0.0) = z for z != 0, and
    exp(+0.0) = exp(-0.0) = 1.0. z - m is z + (-m) (the same IEEE result, one rounding)."""
    z = repops.ops.scale(s.contiguous(), repops.f32(scale))
    neg_m = repops.ops.scale(torch.amax(z, dim=-1, keepdim=True), -1.0)    # exact negation
    e = repops.ops.exp(repops.ops.add(z, neg_m.expand_as(z)))
    inv = repops.ops.recip(repops.ops.csum(e)).unsqueeze(-1)
    return repops.ops.mul(e, inv.expand_as(e))


class KVCache:
    """Each layer's keys and values of the positions decoded so far (after QK-norm and RoPE):
    k[i], v[i] [B*Hkv, seq_len, Dh], positions 0..length-1 filled. Model.hidden(idx, cache=)
    appends idx's positions; a context longer than seq_len has no cache (its positions move)."""

    def __init__(self, model, batch=1):
        cfg = model.cfg
        shape = (batch * model.n_kv_head, cfg.seq_len, cfg.d_model // cfg.n_head)
        device = model.tok_emb.device
        self.k = [torch.empty(shape, device=device) for _ in range(cfg.n_layer)]
        self.v = [torch.empty(shape, device=device) for _ in range(cfg.n_layer)]
        self.length = 0

    def store(self, i, k, v):
        """Layer i's keys and values [B*Hkv, T, Dh] of the positions length..length+T-1."""
        end = self.length + k.shape[1]
        self.k[i][:, self.length:end].copy_(k)
        self.v[i][:, self.length:end].copy_(v)

    def keys(self, i, end):
        """Layer i's keys and values of positions 0..end-1 (views, [B*Hkv, end, Dh])."""
        return self.k[i][:, :end], self.v[i][:, :end]


class Llama(nn.Module):
    def __init__(self, cfg: ModelConfig, seed: int):
        super().__init__()
        if cfg.d_model % cfg.n_head or (cfg.d_model // cfg.n_head) % 2:
            raise ValueError("d_model must split into n_head heads of even size")
        if cfg.n_head % (cfg.n_kv_head or cfg.n_head):
            raise ValueError("n_kv_head must divide n_head")
        if cfg.matmul not in ("fp32", "exact") or (cfg.matmul == "exact" and cfg.quant != "none"):
            raise ValueError("matmul must be fp32 or exact, and exact has no int8 form")
        self.exact = cfg.matmul == "exact"
        self.cfg = cfg
        self.seed = seed
        self.n_kv_head = cfg.n_kv_head or cfg.n_head
        d = cfg.d_model
        shapes = param_shapes(cfg)
        self.tok_emb = nn.Parameter(self._init("tok_emb", shapes["tok_emb"]))
        if cfg.emb_norm:
            self.emb_norm = nn.Parameter(self._init("emb_norm", shapes["emb_norm"]))
        self.layers = nn.ModuleList()
        for i in range(cfg.n_layer):
            block = nn.Module()
            for name in ("attn_norm", "wqkv", "wo", "mlp_norm", "w_gate_up", "w_down"):
                full = f"layers.{i}.{name}"
                block.register_parameter(name, nn.Parameter(self._init(full, shapes[full])))
            self.layers.append(block)
        self.norm = nn.Parameter(self._init("norm", shapes["norm"]))
        if not cfg.tie_embeddings:
            self.lm_head = nn.Parameter(self._init("lm_head", shapes["lm_head"]))
        cos, sin = repops.rope_tables(cfg.seq_len, d // cfg.n_head, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # qk_norm's gain-free RMSNorm is rmsnorm with w = 1 (y = (x * rstd) * 1.0 is exact)
        self.register_buffer("unit_gain", torch.ones(d // cfg.n_head), persistent=False)
        self.calibrating = False
        # witness(grad): a tensor hook given the gradient of the loss with respect to the
        # residual stream after block 0 [B, T, d] (the unit commitments' witness, units.py)
        self.witness = None
        if cfg.quant == "int8":
            quant.attach(self)   # step sizes <linear>_sx, <linear>_sw; calibrates s_x

    def _init(self, name, shape):
        """Canonical init of parameter `name`: its bits depend only on (seed, name, shape)."""
        if name.endswith("norm"):
            return torch.ones(shape)
        std = self.cfg.init_std
        if name.endswith(("wo", "w_down")):  # residual projections, scaled as in GPT-2
            std = std / math.sqrt(2 * self.cfg.n_layer)
        z = repops.normal(self.seed, 0, param_stream_id(name), repops.PURPOSE_INIT, math.prod(shape))
        return repops.ops.scale(z, repops.f32(std)).view(shape)

    def named_tensors(self):
        """{dotted name: parameter} in sorted name order (the canonical parameter order)."""
        return dict(sorted(self.named_parameters()))

    def _linear(self, layer, name, x):
        """The block linear `name` of `layer` applied to x: fp32 RepOps, or int8 (quant.py)."""
        w = getattr(layer, name)
        if self.cfg.quant != "int8":       # "none" (config.validate refuses anything else)
            return repops.linear(x, w, self.exact)
        return quant.linear(x, w, getattr(layer, name + "_sx"), getattr(layer, name + "_sw"), self.calibrating)

    def _attention(self, i, layer, h, B, T, cache=None):
        cfg = self.cfg
        H, Hkv, Dh = cfg.n_head, self.n_kv_head, cfg.d_model // cfg.n_head
        G = H // Hkv                                              # query heads per key/value head
        pos = cache.length if cache is not None else 0            # the position of h's first row
        qkv = self._linear(layer, "wqkv", h).view(B, T, H + 2 * Hkv, Dh)
        # One split (its backward is one cat): autograd never adds the three gradients.
        q, k, v = qkv.split([H, Hkv, Hkv], dim=2)                 # [B, T, H | Hkv | Hkv, Dh]
        if cfg.qk_norm:                                           # per head: rows B*T*H of Dh
            q = repops.rmsnorm(q, self.unit_gain, cfg.norm_eps)
            k = repops.rmsnorm(k, self.unit_gain, cfg.norm_eps)
        cos, sin = self._rope_tables(pos, T)
        q = repops.rope(q, cos, sin)                              # heads-major: [B, H, T, Dh]
        k = repops.rope(k, cos, sin)                              # [B, Hkv, T, Dh]
        # Query head h = j*G + g belongs to key/value head j; the group's G heads become G*T rows
        # of one matmul against key head j (data movement only): q [B*Hkv, G*T, Dh], k, v [B*Hkv, T, Dh].
        q = q.view(B * Hkv, G * T, Dh)
        k = k.view(B * Hkv, T, Dh)
        v = v.permute(0, 2, 1, 3).reshape(B * Hkv, T, Dh)
        if cache is not None:
            cache.store(i, k, v)
        if pos:                                                   # one new query row (T = 1)
            first = max(0, pos + 1 - cfg.attn_window) if windowed(cfg, i) else 0   # a band's valid keys
            k, v = (t[:, first:] for t in cache.keys(i, pos + 1))
            p = row_softmax(repops.matmul(q, k.transpose(1, 2)), 1.0 / math.sqrt(Dh))   # [B*Hkv, G, keys]
            o = repops.matmul(p, v)                               # [B*Hkv, G, Dh]
        elif windowed(cfg, i):                                    # bands [B*Hkv, G*T, W]: O(T*W)
            o = repops.window_attention(q, k, v, cfg.attn_window, 1.0 / math.sqrt(Dh),
                                        mix=quant.band_mix if cfg.int8_pv else None, exact=self.exact)
        else:                                                     # scores [B*Hkv, G*T, T]
            o = repops.causal_attention(q, k, v, 1.0 / math.sqrt(Dh),  # [B*Hkv, G*T, Dh]
                                        mix=quant.matmul_pv if cfg.int8_pv else None, exact=self.exact)
        o = o.view(B, H, T, Dh).permute(0, 2, 1, 3).reshape(B, T, H * Dh)
        return self._linear(layer, "wo", o)

    def _rope_tables(self, pos, T):
        """RoPE's cos and sin rows of positions pos..pos+T-1 [T, Dh/2]. The tables are built for
        seq_len positions; logits of a longer context (positions never trained) get longer ones,
        whose first seq_len rows are the same bits (row t depends on t alone, contract §8 rope)."""
        if pos + T > self.rope_cos.shape[0]:
            cos, sin = repops.rope_tables(pos + T, self.cfg.d_model // self.cfg.n_head, self.cfg.rope_theta)
            self.rope_cos, self.rope_sin = cos.to(self.rope_cos.device), sin.to(self.rope_sin.device)
        return self.rope_cos[pos:pos + T], self.rope_sin[pos:pos + T]

    def _branch_dropout(self, x, rng, site):
        if not self.training or self.cfg.dropout == 0.0 or rng is None:
            return x
        step, micro = rng
        return repops.dropout(x, self.cfg.dropout, self.seed, step, (micro << 16) | site)

    def embeddings(self):
        """(input embedding, output embedding), both [vocab, d]: tok_emb and lm_head, or tok_emb
        twice through repops.tie when they are tied (used once each per forward)."""
        return repops.tie(self.tok_emb) if self.cfg.tie_embeddings else (self.tok_emb, self.lm_head)

    def hidden(self, idx, rng=None, emb=None, cache=None):
        """Final normalized hidden states [B, T, d]. rng = (step, micro) keys dropout; emb: the
        input embedding (default tok_emb). cache (KVCache, inference): idx's positions follow
        the cache's; its keys and values are stored, and with cache.length > 0 idx is one
        position ([B, 1]), decoded against the cached keys (module docstring)."""
        cfg = self.cfg
        B, T = idx.shape
        if cache is not None and (cache.length + T > cfg.seq_len or (cache.length and T != 1)):
            raise ValueError(f"a KV cache holds seq_len {cfg.seq_len} positions and decodes one at a time")
        x = repops.embedding(self.tok_emb if emb is None else emb, idx)   # [B, T, d]
        if cfg.emb_norm:
            x = repops.rmsnorm(x, self.emb_norm, cfg.norm_eps)
        for i, layer in enumerate(self.layers):
            if cfg.recompute and torch.is_grad_enabled():
                # Non-reentrant checkpointing re-runs _block in backward; no torch RNG is used.
                x = torch.utils.checkpoint.checkpoint(self._block, i, layer, x, rng,
                                                      use_reentrant=False, preserve_rng_state=False)
            else:
                x = self._block(i, layer, x, rng, cache)
            if i == 0 and self.witness is not None and x.requires_grad:
                x.register_hook(self.witness)      # reads the gradient, changes nothing
        if cache is not None:
            cache.length += T
        return repops.rmsnorm(x, self.norm, cfg.norm_eps)

    def _block(self, i, layer, x, rng, cache=None):
        """Transformer block i on the residual stream x [B, T, d]."""
        B, T, _ = x.shape
        x, h = repops.rmsnorm_fork(x, layer.attn_norm, self.cfg.norm_eps)
        x = repops.add(x, self._branch_dropout(self._attention(i, layer, h, B, T, cache), rng, 2 * i))
        x, h = repops.rmsnorm_fork(x, layer.mlp_norm, self.cfg.norm_eps)
        m = repops.swiglu(self._linear(layer, "w_gate_up", h).view(B * T, -1))
        m = self._linear(layer, "w_down", m).view(B, T, -1)
        return repops.add(x, self._branch_dropout(m, rng, 2 * i + 1))

    def logits(self, idx):
        """Logits [B, T, vocab] of every position of idx [B, T]. T may exceed seq_len (positions
        the model never trained on; RoPE is extended, as transformers' LlamaForCausalLM does)."""
        B, T = idx.shape
        emb, head = self.embeddings()
        return repops.linear(self.hidden(idx, emb=emb), head, self.exact).view(B, T, -1)

    def forward(self, idx, targets, zloss=0.0, rng=None):
        """Mean cross-entropy (+ zloss * logsumexp^2) over all B*T positions."""
        B, T = idx.shape
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds the model's seq_len {self.cfg.seq_len}")
        emb, head = self.embeddings()
        logits = repops.linear(self.hidden(idx, rng, emb), head, self.exact).view(B * T, -1)
        return repops.cross_entropy(logits, targets.reshape(-1), zloss)

    @property
    def cached_decode(self):
        """Does a KV cache give the full forward's bits? Not for int8 P·V or the exact matmul,
        whose P V depends on every key of the context (module docstring)."""
        return not (self.cfg.int8_pv or self.exact)

    @torch.no_grad()
    def next_logits(self, ids, cache=None):
        """(logits [vocab] of the token after the list `ids`, the cache to pass with ids + [next]).
        The context is the last seq_len tokens at positions 0..seq_len-1, as in training. While
        the context grows, one decode step against the cache; when it starts, or once it is full
        and slides (every position moves), one full forward over it (a cache is kept only while
        the context can still grow). Either way the logits are those of `logits(context)[-1]`
        (the module docstring says when a decode step could differ in the sign of a zero)."""
        L = self.cfg.seq_len
        ctx = list(ids[-L:]) or [0]
        if cache is not None and cache.length == len(ctx) - 1:
            new = ctx[-1:]                                   # the context grew by one token
        else:
            cache = KVCache(self) if self.cached_decode and len(ctx) < L else None
            new = ctx
        emb, head = self.embeddings()
        h = self.hidden(torch.tensor([new], dtype=torch.int64), emb=emb, cache=cache)
        return repops.linear(h[0, -1:], head, self.exact)[0], cache          # the last row only

    @torch.no_grad()
    def generate(self, ids, n_tokens, seed, temperature=0.8):
        """Extend the token list `ids` by n_tokens samples; returns the whole list. Gumbel-max:
        token = argmax(logits / temperature + g), g = -log(-log(u)), u from Philox (purpose
        SAMPLE, counter = generated position), all in RepOps, so every machine picks the same
        tokens; argmax is exact. temperature 0 is greedy: token = argmax(logits), no noise
        (the limit of Gumbel-max as the temperature falls to 0). The logits are next_logits' (a
        KV cache while the context grows, a full forward once it slides): the same tokens as a
        full forward per token."""
        ids = list(ids) or [0]
        self.eval()
        cache = None
        for i in range(n_tokens):
            logits, cache = self.next_logits(ids, cache)                      # [vocab]
            score = logits
            if temperature > 0:
                u = repops.uniform(seed, i, 0, repops.PURPOSE_SAMPLE, self.cfg.vocab_size).to(logits.device)
                gumbel = repops.ops.scale(repops.ops.log(repops.ops.scale(repops.ops.log(u), -1.0)), -1.0)
                score = repops.ops.add(repops.ops.scale(logits, repops.f32(1.0 / temperature)), gumbel)
            ids.append(int(torch.argmax(score.cpu())))   # on the host: one tie rule (the first) on every device
        return ids
