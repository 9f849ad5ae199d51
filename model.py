"""A Llama-style language model built only from RepOps (every float operation is reproducible).

Pre-norm RMSNorm, rotary position embeddings, causal multi-head attention, SwiGLU MLP, no
biases, untied input/output embeddings. Initialization is canonical: Philox normals keyed by
(seed, a hash of the parameter name), so every machine starts from the same bits.

    from model import ModelConfig, Llama
    model = Llama(ModelConfig(n_layer=2), seed=1337)
    loss = model(idx, targets)                      # idx, targets: int64 [B, T]
    logits = model.logits(idx)                      # [B, T, vocab]

The residual stream enters each block through repops.rmsnorm_fork, so a tensor feeds two
consumers without autograd ever adding gradients itself (contract §8 rmsnorm_fork); QKV and
gate/up projections are fused matrices for the same reason.
"""
import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn

import repops


@dataclass
class ModelConfig:
    vocab_size: int = 256      # byte-level tokenizer by default
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    d_hidden: int = 384        # SwiGLU hidden width
    seq_len: int = 128         # context length (RoPE tables are built for it)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    dropout: float = 0.0       # Philox dropout on each residual branch (0 disables)
    init_std: float = 0.02


def param_stream_id(name):
    """32-bit Philox stream id of a parameter: stable when other parameters are added."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


class Llama(nn.Module):
    def __init__(self, cfg: ModelConfig, seed: int):
        super().__init__()
        if cfg.d_model % cfg.n_head or (cfg.d_model // cfg.n_head) % 2:
            raise ValueError("d_model must split into n_head heads of even size")
        self.cfg = cfg
        self.seed = seed
        d, h, v = cfg.d_model, cfg.d_hidden, cfg.vocab_size
        shapes = {"tok_emb": (v, d), "norm": (d,), "lm_head": (v, d)}
        for i in range(cfg.n_layer):
            shapes.update({f"layers.{i}.attn_norm": (d,), f"layers.{i}.wqkv": (3 * d, d),
                           f"layers.{i}.wo": (d, d), f"layers.{i}.mlp_norm": (d,),
                           f"layers.{i}.w_gate_up": (2 * h, d), f"layers.{i}.w_down": (d, h)})
        # Parameters live in a ParameterDict keyed by dotted names ('.' is not allowed as a
        # ParameterDict key, so '/' stands in for it internally).
        self.params = nn.ParameterDict(
            {name.replace(".", "/"): nn.Parameter(self._init(name, shape)) for name, shape in sorted(shapes.items())})
        cos, sin = repops.rope_tables(cfg.seq_len, d // cfg.n_head, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def _init(self, name, shape):
        if name.endswith("norm"):
            return torch.ones(shape)
        std = self.cfg.init_std
        if name.endswith(("wo", "w_down")):  # residual projections, scaled as in GPT-2
            std = std / math.sqrt(2 * self.cfg.n_layer)
        z = repops.normal(self.seed, 0, param_stream_id(name), repops.PURPOSE_INIT, math.prod(shape))
        return repops.ops.scale(z, repops.f32(std)).view(shape)

    def named_tensors(self):
        """{dotted name: parameter} in sorted name order (the canonical parameter order)."""
        return {k.replace("/", "."): p for k, p in sorted(self.params.items())}

    def p(self, name):
        return self.params[name.replace(".", "/")]

    def _attention(self, i, h, B, T):
        cfg = self.cfg
        H, Dh = cfg.n_head, cfg.d_model // cfg.n_head
        qkv = repops.linear(h, self.p(f"layers.{i}.wqkv")).view(B, T, 3, H, Dh)
        q, k, v = qkv.unbind(2)                                   # each [B, T, H, Dh]
        q = repops.rope(q.contiguous(), self.rope_cos, self.rope_sin)
        k = repops.rope(k.contiguous(), self.rope_cos, self.rope_sin)
        # [B, T, H, Dh] -> [B*H, T, Dh] (data movement only)
        q, k, v = (t.permute(0, 2, 1, 3).reshape(B * H, T, Dh) for t in (q, k, v))
        s = repops.matmul(q, k.transpose(1, 2))                   # [B*H, T, T]
        p = repops.causal_softmax(s, 1.0 / math.sqrt(Dh))
        o = repops.matmul(p, v)                                   # [B*H, T, Dh]
        o = o.view(B, H, T, Dh).permute(0, 2, 1, 3).reshape(B, T, H * Dh)
        return repops.linear(o, self.p(f"layers.{i}.wo"))

    def _branch_dropout(self, x, rng, site):
        if not self.training or self.cfg.dropout == 0.0 or rng is None:
            return x
        step, micro = rng
        return repops.dropout(x, self.cfg.dropout, self.seed, step, (micro << 16) | site)

    def hidden(self, idx, rng=None):
        """Final normalized hidden states [B, T, d]. rng = (step, micro) keys dropout."""
        cfg = self.cfg
        B, T = idx.shape
        if T > cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds the model's seq_len {cfg.seq_len}")
        x = repops.embedding(self.p("tok_emb"), idx)              # [B, T, d]
        for i in range(cfg.n_layer):
            x, h = repops.rmsnorm_fork(x, self.p(f"layers.{i}.attn_norm"), cfg.norm_eps)
            x = repops.add(x, self._branch_dropout(self._attention(i, h, B, T), rng, 2 * i))
            x, h = repops.rmsnorm_fork(x, self.p(f"layers.{i}.mlp_norm"), cfg.norm_eps)
            m = repops.swiglu(repops.linear(h, self.p(f"layers.{i}.w_gate_up")).view(B * T, -1))
            m = repops.linear(m, self.p(f"layers.{i}.w_down")).view(B, T, -1)
            x = repops.add(x, self._branch_dropout(m, rng, 2 * i + 1))
        return repops.rmsnorm(x, self.p("norm"), cfg.norm_eps)

    def logits(self, idx):
        B, T = idx.shape
        return repops.linear(self.hidden(idx), self.p("lm_head")).view(B, T, -1)

    def forward(self, idx, targets, zloss=0.0, rng=None):
        """Mean cross-entropy (+ zloss * logsumexp^2) over all B*T positions."""
        B, T = idx.shape
        logits = repops.linear(self.hidden(idx, rng), self.p("lm_head")).view(B * T, -1)
        return repops.cross_entropy(logits, targets.reshape(-1), zloss)
