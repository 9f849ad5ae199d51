"""Sampling with a KV cache (model.Llama.next_logits / generate, sample.py).

- The cached decode's logits equal the full forward's last row bit for bit, at every position
  of a context that grows to seq_len and then slides, on tiny models with each option (GQA,
  sliding window with QK-norm and embedding norm, tied embeddings, int8 linears); int8 P·V and
  the exact matmul, which have no cached form, run the full forward and equal it too.
- generate's tokens are those of a sampler that runs the full forward for every token (the
  reference below), for prompts shorter and longer than seq_len, on 1 and 2 threads;
  temperature 0 is greedy (the argmax of each token's logits, whatever the seed).
- sample.py refuses an option out of range with one line naming it.
(Every op of a decode is RepOps or a justified exception: tests/test_guard.py.)
"""
import pytest
import torch

import repops
import sample
from model import KVCache, Llama, ModelConfig

VOCAB, SEQ = 64, 16
BASE = dict(n_layer=2, d_model=32, n_head=4, d_hidden=64, seq_len=SEQ, vocab_size=VOCAB)
OPTIONS = {"plain": {}, "gqa": {"n_kv_head": 2},
           "recipe": {"n_kv_head": 1, "attn_window": 5, "qk_norm": True, "emb_norm": True},
           "tied": {"tie_embeddings": True}, "int8": {"quant": "int8"},
           "int8_pv": {"quant": "int8", "int8_pv": True, "attn_window": 5},   # no cached form
           "exact": {"matmul": "exact"}}                                       # no cached form


def bits(t):
    return t.contiguous().view(torch.int32)


def model_with(name, seed=3):
    return Llama(ModelConfig(**BASE, **OPTIONS[name]), seed=seed).eval()


def tokens(n, seed=0):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.no_grad()
def full_forward_logits(model, ids):
    """The logits of the token after ids, by the full forward over the last seq_len tokens."""
    return model.logits(torch.tensor([ids[-SEQ:]]))[0, -1]


@torch.no_grad()
def reference_generate(model, ids, n_tokens, seed, temperature=0.8):
    """generate's definition with a full forward per token (no cache)."""
    ids = list(ids)
    for i in range(n_tokens):
        logits = full_forward_logits(model, ids)
        u = repops.uniform(seed, i, 0, repops.PURPOSE_SAMPLE, VOCAB)
        gumbel = repops.ops.scale(repops.ops.log(repops.ops.scale(repops.ops.log(u), -1.0)), -1.0)
        ids.append(int(torch.argmax(repops.ops.add(repops.ops.scale(logits, repops.f32(1 / temperature)), gumbel))))
    return ids


@pytest.mark.parametrize("name", OPTIONS)
def test_cached_decode_equals_the_full_forward(name):
    model = model_with(name)
    assert model.cached_decode == (name not in ("int8_pv", "exact"))
    ids, cache, decoded = tokens(2 * SEQ + 5), None, 0
    for n in range(1, len(ids) + 1):          # grows to seq_len, then slides
        grew = cache is not None and cache.length == min(n, SEQ) - 1
        logits, cache = model.next_logits(ids[:n], cache)
        decoded += grew
        assert torch.equal(bits(logits), bits(full_forward_logits(model, ids[:n]))), f"{n} tokens"
    # the cache was used while the context grew, and only then (a slid context has none)
    assert decoded == (SEQ - 1 if model.cached_decode else 0) and cache is None


@pytest.mark.parametrize("name", ["plain", "recipe", "int8_pv"])
@pytest.mark.parametrize("prompt", [1, 7, SEQ + 3])
def test_generate_equals_a_full_forward_per_token(name, prompt):
    model = model_with(name, seed=5)
    ids = tokens(prompt, seed=prompt)
    assert model.generate(ids, 2 * SEQ, seed=11) == reference_generate(model, ids, 2 * SEQ, seed=11)


def test_temperature_zero_is_greedy():
    """--temperature 0: each token is the argmax of the logits (the full forward's), whatever the
    seed: greedy decoding, where the noise of any other temperature would change the tokens."""
    model = model_with("plain", seed=5)
    ids = tokens(3, seed=1)
    greedy = model.generate(ids, SEQ + 4, seed=11, temperature=0)
    assert greedy == model.generate(ids, SEQ + 4, seed=99, temperature=0)
    expected = list(ids)
    for _ in range(SEQ + 4):
        expected.append(int(torch.argmax(full_forward_logits(model, expected))))
    assert greedy == expected


def test_the_thread_count_changes_no_token():
    model = model_with("gqa")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = model.generate([3, 4], 40, seed=2)
        torch.set_num_threads(2)
        two = model.generate([3, 4], 40, seed=2)
    finally:
        torch.set_num_threads(threads)
    assert one == two


def test_a_cache_refuses_what_it_cannot_hold():
    model = model_with("plain")
    cache = KVCache(model)
    model.hidden(torch.tensor([tokens(SEQ - 1)]), cache=cache)
    with pytest.raises(ValueError, match="decodes one at a time"):
        model.hidden(torch.tensor([[1, 2]]), cache=cache)
    model.hidden(torch.tensor([[1]]), cache=cache)          # the last position fits
    with pytest.raises(ValueError, match="holds seq_len"):
        model.hidden(torch.tensor([[1]]), cache=cache)


def test_logits_beyond_seq_len_extend_rope():
    """logits of a context longer than seq_len (as transformers computes them on an export):
    no refusal, and the first seq_len positions keep their bits."""
    model = model_with("plain")
    ids = tokens(3 * SEQ)
    with torch.no_grad():
        long = model.logits(torch.tensor([ids]))
        short = model.logits(torch.tensor([ids[:SEQ]]))
    assert long.shape == (1, 3 * SEQ, VOCAB)
    assert torch.equal(bits(long[:, :SEQ]), bits(short))


@pytest.mark.parametrize("argv, named", [(["--tokens", "-5"], "--tokens -5: must be in 0..1048576"),
                                         (["--temperature", "-0.5"], "--temperature -0.5: must be a finite"),
                                         (["--seed", "-1"], "--seed -1: must be in [0, 2^64)"),
                                         (["--threads", "-1"], "--threads -1: must be >= 0"),
                                         (["--step", "-2"], "--step -2: must be >= 0")])
def test_sample_names_the_option_at_fault(argv, named, capsys):
    assert sample.main(["--run_dir", "nowhere", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"sample.py: error: {named}"), err

