"""Generate text from a checkpoint; the same prompt and seed give the same text on every machine.

    python sample.py                                        # latest checkpoint of runs/default
    python sample.py --run_dir runs/x --step 100 --prompt "ROMEO:" --tokens 300 --seed 7
    python sample.py --device mps                           # on an Apple GPU (or cuda): same text

The checkpoint is loaded only after the chain up to its step and the checkpoint itself verify
against the published records. Sampling is Gumbel-max with Philox noise, all in RepOps
(model.Llama.generate), so the tokens depend only on the checkpoint, the prompt, --seed,
--temperature and --tokens: not on the device, the thread count or the machine. --temperature 0
is greedy decoding: the most likely token each time, no noise (ties: the lowest id).

The context is the model's trained one: each token is predicted from the last seq_len tokens
(prompt and samples so far) at positions 0..seq_len-1, a sliding context, so a prompt longer
than seq_len keeps its last seq_len tokens. While the context is shorter than seq_len, a token
costs one decode step against a KV cache; once the context is full it slides by one token per
token, every position moves, and a token costs a full forward over seq_len tokens. Both give
the logits of the full forward over the context (model.py says when a zero's sign could
differ). Before the decode, the contract's guard checks the model (check: a probe and two tokens
decoded under guard.py's mode); a model outside the contract is refused with one line, before
any output, and a model written with stock operators decodes under the mode. transformers' generate on an exported model (export.py) keeps absolute positions
instead, up to max_position_embeddings: the two agree while prompt + samples fit in seq_len.
Speed, and the thread count on a busy machine: docs/sampling.md. It only reads the run directory.
Exit code 2 on bad input, with one line naming the option at fault.
"""
import os
import sys

from config import CommandLine, UsageError, out_of_memory

MAX_TOKENS = 1 << 20       # --tokens: a sample, not a corpus


def parser():
    ap = CommandLine("sample.py", "Generate text from a verified checkpoint; the same prompt and seed give the "
                     "same text on every machine.")
    ap.add_argument("--run_dir", metavar="DIR", default="runs/default", help="the run (only read) (default %(default)s)")
    ap.add_argument("--step", type=int, metavar="N", help="the checkpoint's step (default: the latest in the chain)")
    ap.add_argument("--prompt", default="\n", help="the text the sample continues; its last seq_len tokens are the "
                    "first context (default: a newline)")
    ap.add_argument("--tokens", type=int, default=300, metavar="N",
                    help=f"tokens to generate, 0..{MAX_TOKENS} (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="the Philox key of the sampling noise, in [0, 2^64) "
                    "(default %(default)s)")
    ap.add_argument("--temperature", type=float, default=0.8, metavar="T",
                    help="logits are divided by it before the Gumbel noise is added; a finite number >= 0, "
                    "0: greedy (the most likely token, no noise) (default %(default)s)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"),
                    help="where the model runs; every device gives the same text (default %(default)s)")
    ap.add_argument("--threads", type=int, default=0, metavar="N", help="CPU threads; the text is the same for any "
                    "number (default 0: torch's default, or 1 when the load average says other jobs hold the "
                    "cores; docs/sampling.md)")
    return ap


def check_args(args):
    """The first option out of range, as `--option value: rule` (None if all are in range)."""
    checks = (("--tokens", args.tokens, 0 <= args.tokens <= MAX_TOKENS, f"must be in 0..{MAX_TOKENS}"),
              ("--temperature", args.temperature, 0 <= args.temperature < float("inf"),
               "must be a finite number >= 0 (0: greedy)"),
              ("--seed", args.seed, 0 <= args.seed < 1 << 64, "must be in [0, 2^64)"),
              ("--threads", args.threads, args.threads >= 0, "must be >= 0 (0: automatic)"),
              ("--step", args.step, args.step is None or args.step >= 0, "must be >= 0"))
    return next((f"{flag} {value}: {rule}" for flag, value, ok, rule in checks if not ok), None)


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import torch  # noqa: E402  (below the command line's first answer, above)

import hashchain  # noqa: E402
import repops  # noqa: E402
import rundir  # noqa: E402
from threads import threads_for  # noqa: E402  (a decode step's count: the load's guess, docs/sampling.md)
from data import DataError  # noqa: E402
from tokenizer import TokenizerError, get_tokenizer  # noqa: E402
from train import TrainState  # noqa: E402


def load_state(run_dir, step, device="cpu"):
    """(TrainState on `device`, tokenizer) at the checkpoint of `step` (default: the latest one in
    the chain)."""
    run = rundir.Run(run_dir)
    run.check_versions(repops.CONTRACT)
    step, tensors = run.checkpoint_for_reader(step)
    state = TrainState(run.cfg, run.vocab_size, device)
    state.load(tensors)
    tokenizer = run.genesis.get("tokenizer")
    if not isinstance(tokenizer, dict) or not isinstance(tokenizer.get("name"), str):
        raise UsageError(f"{run.chain.path}: the genesis record names no tokenizer")
    return state, get_tokenizer(tokenizer["name"], run.recorded_data_dir(), tokenizer.get("files"))


def check(state, prompt, seed, temperature):
    """The contract's guard (guard.py) before the decode: the probe (one forward and backward on the
    prompt's tokens, repeated to seq_len), then two tokens decoded under the mode and discarded
    (the full forward and a cached decode step). guard.ContractError (the refusal line) before any
    output; a stock model (one whose operators the guard maps) then decodes under the mode."""
    seq_len = state.model.cfg.seq_len
    ids = list(prompt) or [0]
    ids = torch.tensor([(ids * (seq_len // len(ids) + 2))[:seq_len + 1]])
    state.model.train()
    state.guard.probe(lambda: state.model(ids[:, :-1], ids[:, 1:], rng=(1, 0)),
                      [state.params[n] for n in state.trained], step=1)
    with state.guard.inference(always=True):
        state.model.generate(prompt, 2, seed, temperature)


def load_model(run_dir, step, device="cpu"):
    """(model on `device`, tokenizer) at the checkpoint of `step` (default: the latest one in the chain)."""
    state, tokenizer = load_state(run_dir, step, device)
    return state.model, tokenizer


def main(argv=None):
    try:
        args = parser().parse_args(argv)
        bad = check_args(args)
        if bad:
            raise UsageError(bad)
        if args.device == "cuda" and not torch.cuda.is_available():
            raise UsageError("--device cuda: this machine has no CUDA GPU that torch can use")
        if args.device == "mps" and not torch.backends.mps.is_available():
            raise UsageError("--device mps: this machine has no Apple GPU (MPS) that torch can use")
        state, enc = load_state(args.run_dir, args.step, args.device)
        threads = torch.get_num_threads()
        torch.set_num_threads(threads_for(args.threads, threads, os.getloadavg()[0]))
        try:
            prompt = enc.encode(args.prompt)
            check(state, prompt, args.seed, args.temperature)
            with state.guard.inference():               # a stock model's operators mapped (guard.py)
                ids = state.model.generate(prompt, args.tokens, args.seed, args.temperature)
        finally:
            torch.set_num_threads(threads)      # main() also runs inside other programs and tests
    except (UsageError, DataError, TokenizerError, hashchain.HashChainError, repops.RepOpsBuildError) as e:
        print(f"sample.py: error: {e}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as e:
        if not (line := out_of_memory(e, "sample this run")):
            raise
        print(f"sample.py: error: {line}", file=sys.stderr)
        return 2
    print(enc.decode(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
