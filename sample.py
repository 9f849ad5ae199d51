"""Generate text from a checkpoint; the same prompt and seed give the same text on every machine.

    python sample.py                                  # latest checkpoint of runs/default
    python sample.py --run runs/x --step 100 --prompt "ROMEO:" --tokens 300 --seed 7

Sampling is Gumbel-max: token = argmax(logits / temperature + g) with g = -log(-log(u)) and u
from Philox (purpose SAMPLE, counter = generated position), all in RepOps; argmax is exact.
"""
import argparse
import sys

import torch

import repops


@torch.no_grad()
def generate(model, tokenizer_name, prompt, n_tokens, seed, temperature=0.8):
    from data import get_tokenizer
    enc = get_tokenizer(tokenizer_name)
    ids = enc.encode(prompt) or [0]
    model.eval()
    vocab = model.cfg.vocab_size
    for i in range(n_tokens):
        ctx = torch.tensor([ids[-model.cfg.seq_len:]], dtype=torch.int64)
        logits = model.logits(ctx)[0, -1].contiguous()                     # [vocab]
        u = repops.uniform(seed, i, 0, repops.PURPOSE_SAMPLE, vocab)
        gumbel = repops.ops.scale(repops.log(repops.ops.scale(repops.log(u), -1.0)), -1.0)
        score = repops.ops.add(repops.ops.scale(logits, repops.f32(1.0 / temperature)), gumbel)
        ids.append(int(torch.argmax(score)))
    return enc.decode(ids)


def main(argv):
    import hashchain
    from train import Config, TrainState, UsageError, load_verified_checkpoint, checkpoint_dir
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default=Config.run_dir)
    ap.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    ap.add_argument("--prompt", default="\n")
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.8)
    args = ap.parse_args(argv)
    try:
        chain = hashchain.Chain(f"{args.run}/chain.jsonl")
        chain.load(repair=False)
        if not chain.records:
            raise UsageError(f"no chain at {args.run} (train first)")
        ckpts = dict(hashchain.list_checkpoints(checkpoint_dir(args.run)))
        step = args.step if args.step is not None else max((s for s in ckpts if s < len(chain)), default=None)
        if step not in ckpts or step >= len(chain):
            raise UsageError(f"no checkpoint for step {step} in {args.run} (have {sorted(ckpts)})")
        genesis = chain.records[0]
        cfg = Config(**genesis["config"])
        state = TrainState(cfg, genesis["vocab_size"])
        state.load(load_verified_checkpoint(ckpts[step], chain.records[step]))
    except (UsageError, hashchain.HashChainError) as e:
        print(f"sample.py: error: {e}", file=sys.stderr)
        return 2
    print(generate(state.model, genesis["tokenizer"]["name"], args.prompt, args.tokens, args.seed,
                   args.temperature))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
