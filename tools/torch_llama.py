"""The default model written in plain PyTorch fp32: the baseline the benchmarks time RepOps against.

    from tools.torch_llama import TorchLlama, torch_step, model_shapes
    ref = TorchLlama(state)              # state: train.init_state(cfg, vocab); same weights, copied
    loss = ref(x, y, cfg.zloss)          # x, y [B, T] token ids; mean cross-entropy + z-loss
    torch_step(ref, opt, data, cfg, step)   # one step: micro-batches, clip, torch AdamW

Stock torch operators only (MKL/oneDNN, cuBLAS, FMA allowed): the same shapes, wiring and
initial weights as model.py, not the same bits.
"""
import copy
import math

import torch
import torch.nn.functional as F


class TorchLlama(torch.nn.Module):
    """The same model in plain PyTorch fp32 (same shapes, same math, same initial weights);
    sdpa: attention by F.scaled_dot_product_attention (the GPU baseline) instead of written out."""

    def __init__(self, state, sdpa=False):
        super().__init__()
        self.cfg, self.sdpa = state.model.cfg, sdpa
        self.m = copy.deepcopy(state.model)    # the same parameters, read by attribute below
        self.cos, self.sin = self.m.rope_cos, self.m.rope_sin

    def rmsnorm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps) * w

    def rope(self, x):                                   # x [B, T, H, Dh], interleaved pairs
        T = x.shape[1]
        c, s = self.cos[:T, None, :], self.sin[:T, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), -1).flatten(-2)

    def forward(self, idx, targets, zloss):
        cfg = self.cfg
        B, T = idx.shape
        H, Dh = cfg.n_head, cfg.d_model // cfg.n_head
        m = self.m
        mask = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
        x = F.embedding(idx, m.tok_emb)
        for layer in m.layers:
            h = self.rmsnorm(x, layer.attn_norm)
            q, k, v = (h @ layer.wqkv.t()).view(B, T, 3, H, Dh).unbind(2)
            q, k = self.rope(q), self.rope(k)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            if self.sdpa:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-1, -2)) / math.sqrt(Dh)
                o = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v
            o = o.transpose(1, 2).reshape(B, T, -1)
            x = x + o @ layer.wo.t()
            h = self.rmsnorm(x, layer.mlp_norm)
            a, b = (h @ layer.w_gate_up.t()).chunk(2, -1)
            x = x + (F.silu(a) * b) @ layer.w_down.t()
        logits = (self.rmsnorm(x, m.norm) @ m.lm_head.t()).view(B * T, -1)
        lse = torch.logsumexp(logits, -1)
        return F.cross_entropy(logits, targets.reshape(-1)) + zloss * (lse * lse).mean()


def torch_step(model, opt, data, cfg, step):
    opt.zero_grad(set_to_none=True)
    for m in range(cfg.micro_batches):
        x, y = (t.to(model.m.tok_emb.device) for t in data.micro_batch("train", step, m, cfg.micro_batch_size,
                                                                         cfg.seq_len))
        (model(x, y, cfg.zloss) / cfg.micro_batches).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()



def model_shapes(cfg, vocab):
    """{weight: (out_features, in_features)} of the model's matrices."""
    d, h = cfg.d_model, cfg.d_hidden
    return {"wqkv": (3 * d, d), "wo": (d, d), "w_gate_up": (2 * h, d), "w_down": (d, h), "lm_head": (vocab, d)}
