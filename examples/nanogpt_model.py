"""A GPT-2 language model in the style of nanoGPT's model.py, written with stock PyTorch only.

Learned position embeddings, pre-norm blocks with LayerNorm (weight and bias), causal
self-attention written out (q @ k^T, a mask, F.softmax, @ v), a GELU MLP, biases on every
linear, dropout through nn.Dropout, initialization through nn.init. No RepOps call anywhere in the
model's math: in place of model.py it trains under the contract, because the contract's guard
(guard.py) runs each of these stock operators as RepOps kernels with the bits of contract §12
(docs/changing-the-model.md):

    cp examples/nanogpt_model.py model.py          # in your clone: this file is the model now
    python train.py --dropout=0.1                  # the same chain on every machine and rank count
    python audit.py --step 300                     # MATCH

It has the interface that train.py, audit.py and sample.py use (the guide lists it): ModelConfig
(its fields are config.py's keys of the same names), param_shapes(cfg), Llama(cfg, seed) (the name
train.py imports: this GPT), named_tensors(), forward(idx, targets, zloss, rng) -> the loss,
generate(ids, n_tokens, seed, temperature), the witness hook and n_kv_head. Options of the default
model that this one does not have (int8, windows, QK-norm, ...) are refused, not ignored.

Parameters (nanoGPT's names): transformer.wte.weight [vocab, d], transformer.wpe.weight [seq_len, d],
transformer.h.{i}.{ln_1, ln_2}.{weight, bias} [d], transformer.h.{i}.attn.c_attn.{weight [3d, d],
bias [3d]}, transformer.h.{i}.attn.c_proj.{weight [d, d], bias [d]}, transformer.h.{i}.mlp.c_fc.{weight
[h, d], bias [h]}, transformer.h.{i}.mlp.c_proj.{weight [d, h], bias [d]}, transformer.ln_f.{weight,
bias} [d], lm_head.weight [vocab, d] (none with tie_embeddings: wte is the output embedding too).
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import repops                     # generate's random numbers only: Philox, the same on every machine
from config import UsageError


@dataclass
class ModelConfig:
    vocab_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128            # nanoGPT's n_embd
    d_hidden: int = 384           # the MLP's width (GPT-2: 4 * d_model)
    seq_len: int = 128            # nanoGPT's block_size: positions 0..seq_len-1 are learned
    norm_eps: float = 1e-5
    dropout: float = 0.0
    init_std: float = 0.02
    tie_embeddings: bool = False  # nanoGPT ties wte and lm_head; here the run's config decides
    # the default model's options: this model has none of them, so they must stay off
    n_kv_head: int = 0
    quant: str = "none"
    int8_pv: bool = False
    attn_window: int = 0
    qk_norm: bool = False
    emb_norm: bool = False


def param_shapes(cfg):
    """{name: shape} of every parameter, without building the model (train.py sizes memory by it)."""
    d, h, v = cfg.d_model, cfg.d_hidden, cfg.vocab_size
    shapes = {"transformer.wte.weight": (v, d), "transformer.wpe.weight": (cfg.seq_len, d),
              "transformer.ln_f.weight": (d,), "transformer.ln_f.bias": (d,)}
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (v, d)
    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}."
        shapes.update({p + "ln_1.weight": (d,), p + "ln_1.bias": (d,), p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
                       p + "attn.c_attn.weight": (3 * d, d), p + "attn.c_attn.bias": (3 * d,),
                       p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
                       p + "mlp.c_fc.weight": (h, d), p + "mlp.c_fc.bias": (h,),
                       p + "mlp.c_proj.weight": (d, h), p + "mlp.c_proj.bias": (d,)})
    return shapes


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model)     # q, k, v of every head at once
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        # 1.0 on and below the diagonal: position t attends to positions 0..t
        causal = torch.tril(torch.ones(cfg.seq_len, cfg.seq_len)).view(1, 1, cfg.seq_len, cfg.seq_len)
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)     # [B, H, T, Dh]
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))     # [B, H, T, T]
        att = att.masked_fill(self.causal[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v                                                          # [B, H, T, Dh]
        y = y.transpose(1, 2).contiguous().view(B, T, C)                     # heads side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, cfg.d_hidden)
        self.gelu = nn.GELU()                      # the exact (erf) form, as GPT-2's
        self.c_proj = nn.Linear(cfg.d_hidden, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, seed: int):
        super().__init__()
        off = {"n_kv_head": (0, cfg.n_head), "quant": ("none",), "int8_pv": (False,), "attn_window": (0,),
               "qk_norm": (False,), "emb_norm": (False,)}
        unsupported = [name for name, values in off.items() if getattr(cfg, name) not in values]
        if unsupported:
            given = ", ".join(f"--{name}={getattr(cfg, name)}" for name in unsupported)
            raise UsageError(f"this model (GPT-2 in nanoGPT's style) has no {given}: an option of the Llama model")
        if cfg.d_model % cfg.n_head:
            raise UsageError("d_model must split into n_head heads")
        self.cfg, self.seed = cfg, seed
        self.n_kv_head = cfg.n_head                # multi-head attention: a key/value head per query head
        self.witness = None                        # train.py's hook on the residual stream after block 0
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.d_model),
            wpe=nn.Embedding(cfg.seq_len, cfg.d_model),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps),
        ))
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        # GPT-2's init: normal(0, init_std) weights, zero biases, the residual projections scaled
        # by 1/sqrt(2 n_layer). Under the guard every nn.init draw is a Philox draw (contract §12.7).
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=cfg.init_std / math.sqrt(2 * cfg.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.cfg.init_std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def named_tensors(self):
        """{name: parameter} in sorted name order (the flat gradient's and the state hash's order)."""
        return dict(sorted(self.named_parameters()))

    def logits(self, idx):
        """Logits [B, T, vocab] of every position of idx [B, T] (int64, on any device)."""
        device = self.transformer.wte.weight.device
        idx = idx.to(device)                       # host token ids, as train.py passes them
        B, T = idx.shape
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds the model's seq_len {self.cfg.seq_len}")
        pos = torch.arange(T, device=device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))   # [B, T, d]
        for i, block in enumerate(self.transformer.h):
            x = block(x)
            if i == 0 and self.witness is not None and x.requires_grad:
                x.register_hook(self.witness)      # reads the gradient, changes nothing
        return self.lm_head(self.transformer.ln_f(x))

    def forward(self, idx, targets, zloss=0.0, rng=None):
        """Mean cross-entropy (+ zloss * mean logsumexp^2) over all B*T positions. rng, (step,
        micro-batch), is the default model's key of its dropout; here the guard keys nn.Dropout's
        masks by the step and micro-batch it runs in (contract §12.7)."""
        logits = self.logits(idx)
        logits = logits.view(-1, logits.size(-1))                       # [B*T, vocab]
        loss = F.cross_entropy(logits, targets.to(logits.device).view(-1))
        if zloss:
            top = logits.detach().amax(dim=-1, keepdim=True)            # [B*T, 1]: a shift, not a variable
            lse = (logits - top).exp().sum(dim=-1, keepdim=True).log() + top
            loss = loss + zloss * lse.pow(2).mean()
        return loss

    @torch.no_grad()
    def generate(self, ids, n_tokens, seed, temperature=0.8):
        """Extend the token list `ids` by n_tokens samples; returns the whole list. Gumbel-max on the
        last position's logits (the context: the last seq_len tokens) with Philox uniforms keyed by
        (seed, the generated position), so that every machine picks the same tokens."""
        ids = list(ids) or [0]
        self.eval()
        device = self.transformer.wte.weight.device
        for i in range(n_tokens):
            logits = self.logits(torch.tensor([ids[-self.cfg.seq_len:]], device=device))[0, -1]   # [vocab]
            u = repops.uniform(seed, i, 0, repops.PURPOSE_SAMPLE, self.cfg.vocab_size).to(device)
            score = logits / temperature - torch.log(-torch.log(u))
            ids.append(int(torch.argmax(score.cpu())))
        return ids


Llama = GPT     # the name train.py, audit.py and sample.py import
