"""The default model written in stock PyTorch: the benchmarks' baseline and the reference that
tests/test_torch_reference.py checks the RepOps model against.

    from tools.torch_llama import TorchLlama, torch_adamw, torch_step, model_shapes
    ref = TorchLlama(state)              # state: train.TrainState(cfg, vocab); same weights, copied
    ref = TorchLlama(state, dtype=torch.float64)   # the same model in float64 (the reference)
    loss = ref(x, y, cfg.zloss)          # x, y [B, T] token ids; mean cross-entropy + z-loss
    logits = ref.logits(x)               # [B, T, vocab]
    opt = torch_adamw(ref, cfg)          # torch AdamW, weight decay on matrices only (as train.py)
    loss = torch_step(ref, opt, data, cfg, step)   # one step: micro-batches, clip, lr schedule, AdamW
    lr_schedule(cfg, step)               # the learning rate of step (SPEC §10), this file's own

Stock torch operators only (MKL/oneDNN, cuBLAS, FMA allowed): the same shapes, wiring and
initial weights as model.py, not the same bits. Written from the model's definition (SPEC.md),
not from the project's code, and importing none of it: the weights are copied out of the state
into modules of its own, the learning-rate schedule and the micro-batch phases are its own
(SPEC §10, §9.5); grouped-query attention by repeating each key/value head for its G query
heads, the rotary tables from rope_theta in the model's dtype, and with quant="int8" each block
linear as the W8A8 straight-through estimator with LSQ step sizes (quant.py's docstring,
contract §10) by the usual autograd construction. Dropout is not modelled (the reference runs
dropout 0), nor the recipe options (attn_window, qk_norm, emb_norm).
"""
import math

import torch
import torch.nn.functional as F

QP = 127        # the int8 grid [-QP, QP] (contract §10)


def lr_schedule(cfg, step):
    """The learning rate of step (1-based), by SPEC §10: linear warmup to lr over warmup_steps,
    then linear (or cosine) decay to min_lr at max_steps; math.cos stands in for the contract's
    float32 cos (a difference far below the tests' tolerances)."""
    if step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    progress = min((step - cfg.warmup_steps) / max(cfg.max_steps - cfg.warmup_steps, 1), 1.0)
    if cfg.lr_schedule == "cosine":
        return cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.lr - (cfg.lr - cfg.min_lr) * progress


def micro_batch_count(cfg, step):
    """N(step) by SPEC §9.5: micro_batches until the first phase "N@S" of micro_batch_phases
    begins after step S; then that phase's N."""
    n = cfg.micro_batches
    for phase in filter(None, cfg.micro_batch_phases.split(",")):
        count, start = phase.split("@")
        if step > int(start):
            n = int(count)
    return n


def _copy_parameters(model, dtype):
    """A plain module tree holding a copy of `model`'s parameters in `dtype`, under the same names
    (layers.{i}.<name>, tok_emb, ...), each trained or not as there: the reference reads them by
    attribute and runs none of the model's code."""
    root = torch.nn.Module()
    root.layers = torch.nn.ModuleList()
    for name, p in model.named_parameters():
        *path, leaf = name.split(".")
        owner = root
        if path:                                  # ["layers", "i"]
            while len(root.layers) <= int(path[1]):
                root.layers.append(torch.nn.Module())
            owner = root.layers[int(path[1])]
        owner.register_parameter(leaf, torch.nn.Parameter(p.detach().to(dtype).clone(),
                                                          requires_grad=p.requires_grad))
    return root


def _grad_scaled(s, g):
    """s in the forward, s's gradient multiplied by g in the backward (LSQ's gradient scale)."""
    return (s - s * g).detach() + s * g


def _fake_quant(x, s, g):
    """s * clamp(round(x / s), -QP, QP) with the straight-through estimator: d/dx = 1 strictly
    inside the grid, 0 outside; d/ds = round(v) - v inside, +-QP outside (LSQ), times g."""
    s = _grad_scaled(s, g)
    v = torch.clamp(x / s, -QP, QP)
    return (v + (torch.round(v) - v).detach()) * s


def int8_linear(x, w, sx, sw):
    """x [..., K] @ w.T [K, N] through the int8 grid: per-tensor s_x [1], per-row s_w [N]."""
    gx, gw = 1.0 / math.sqrt(x.numel() * QP), 1.0 / math.sqrt(w.shape[1] * QP)   # n: elements per step size
    return _fake_quant(x, sx, gx) @ _fake_quant(w, sw[:, None], gw).t()


class TorchLlama(torch.nn.Module):
    """The same model in plain PyTorch (same shapes, same math, same initial weights) in `dtype`;
    sdpa: attention by F.scaled_dot_product_attention (the GPU baseline) instead of written out."""

    def __init__(self, state, sdpa=False, dtype=torch.float32):
        super().__init__()
        self.cfg, self.sdpa = state.model.cfg, sdpa
        self.m = _copy_parameters(state.model, dtype)   # the same parameters, read by attribute below
        cfg, dev = self.cfg, self.m.tok_emb.device
        Dh = cfg.d_model // cfg.n_head
        inv_freq = cfg.rope_theta ** (-torch.arange(0, Dh, 2, dtype=torch.float64, device=dev) / Dh)
        angle = torch.arange(cfg.seq_len, dtype=torch.float64, device=dev)[:, None] * inv_freq   # [T, Dh/2]
        self.cos, self.sin = angle.cos().to(dtype), angle.sin().to(dtype)

    def rmsnorm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps) * w

    def rope(self, x):                                   # x [B, T, H, Dh], interleaved pairs
        T = x.shape[1]
        c, s = self.cos[:T, None, :], self.sin[:T, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), -1).flatten(-2)

    def linear(self, layer, name, x):
        w = getattr(layer, name)
        if self.cfg.quant == "int8":
            return int8_linear(x, w, getattr(layer, name + "_sx"), getattr(layer, name + "_sw"))
        return x @ w.t()

    def attention(self, layer, h):                       # h [B, T, d]
        cfg = self.cfg
        B, T, _ = h.shape
        H, Dh = cfg.n_head, cfg.d_model // cfg.n_head
        Hkv = cfg.n_kv_head or H
        q, k, v = self.linear(layer, "wqkv", h).view(B, T, H + 2 * Hkv, Dh).split([H, Hkv, Hkv], 2)
        q, k = self.rope(q), self.rope(k)
        # query head j*G + g reads key/value head j: repeat each of the Hkv heads G times
        k, v = (t.repeat_interleave(H // Hkv, dim=2) for t in (k, v))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))            # [B, H, T, Dh]
        if self.sdpa:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            mask = torch.ones(T, T, dtype=torch.bool, device=h.device).tril()
            s = (q @ k.transpose(-1, -2)) / math.sqrt(Dh)
            o = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v
        return self.linear(layer, "wo", o.transpose(1, 2).reshape(B, T, -1))

    def logits(self, idx):
        m = self.m
        x = F.embedding(idx, m.tok_emb)
        for layer in m.layers:
            x = x + self.attention(layer, self.rmsnorm(x, layer.attn_norm))
            a, b = self.linear(layer, "w_gate_up", self.rmsnorm(x, layer.mlp_norm)).chunk(2, -1)
            x = x + self.linear(layer, "w_down", F.silu(a) * b)
        return self.rmsnorm(x, m.norm) @ m.lm_head.t()

    def forward(self, idx, targets, zloss):
        logits = self.logits(idx).flatten(0, 1)
        lse = torch.logsumexp(logits, -1)
        return F.cross_entropy(logits, targets.reshape(-1)) + zloss * (lse * lse).mean()


def torch_adamw(model, cfg):
    """torch AdamW over the trained parameters, weight decay on matrices only (as train.py)."""
    trained = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in trained if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in trained if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)


def torch_step(model, opt, data, cfg, step):
    """One training step (1-based): the mean loss of the step's micro-batches, clip, the lr of
    lr_schedule, AdamW, and with int8 + lsq_repin the re-pin of the weight step sizes after it.
    Returns the step's loss (the mean over its micro-batches, before the update) as a float."""
    opt.zero_grad(set_to_none=True)
    loss = 0.0
    n = micro_batch_count(cfg, step)
    for m in range(n):
        x, y = (t.to(model.m.tok_emb.device) for t in data.micro_batch("train", step, m, cfg.micro_batch_size,
                                                                         cfg.seq_len))
        micro_loss = model(x, y, cfg.zloss) / n
        micro_loss.backward()
        loss = loss + micro_loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    for group in opt.param_groups:
        group["lr"] = lr_schedule(cfg, step)
    opt.step()
    if cfg.quant == "int8" and cfg.lsq_repin:
        with torch.no_grad():
            for layer in model.m.layers:
                for name in ("wqkv", "wo", "w_gate_up", "w_down"):   # s_w = 2 mean|w_row| / sqrt(Qp)
                    getattr(layer, name + "_sw").copy_(2 * getattr(layer, name).abs().mean(1) / math.sqrt(QP))
    return float(loss)      # the step's one host sync, as train_step's


def model_shapes(cfg, vocab):
    """{weight: (out_features, in_features)} of the model's matrices."""
    d, h = cfg.d_model, cfg.d_hidden
    qkv = (cfg.n_head + 2 * (cfg.n_kv_head or cfg.n_head)) * (d // cfg.n_head)
    return {"wqkv": (qkv, d), "wo": (d, d), "w_gate_up": (2 * h, d), "w_down": (d, h), "lm_head": (vocab, d)}
