"""Generate text from a checkpoint; the same prompt and seed give the same text on every machine.

    python sample.py                                        # latest checkpoint of runs/default
    python sample.py --run_dir runs/x --step 100 --prompt "ROMEO:" --tokens 300 --seed 7
    python sample.py --device mps                           # on an Apple GPU (or cuda): same text

The checkpoint is loaded only after the chain up to its step and the checkpoint itself verify
against the published records. Sampling is Gumbel-max with Philox noise, all in RepOps
(model.Llama.generate). It only reads the run directory. Exit code 2 on bad input.
"""
import math
import sys

from config import CommandLine, UsageError


def parser():
    ap = CommandLine("sample.py", "Generate text from a verified checkpoint; the same prompt and seed give the "
                     "same text on every machine.")
    ap.add_argument("--run_dir", metavar="DIR", default="runs/default", help="the run (only read) (default %(default)s)")
    ap.add_argument("--step", type=int, metavar="N", help="the checkpoint's step (default: the latest in the chain)")
    ap.add_argument("--prompt", default="\n", help="the text the sample continues (default: a newline)")
    ap.add_argument("--tokens", type=int, default=300, metavar="N", help="tokens to generate (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="the Philox seed of the sampling noise (default %(default)s)")
    ap.add_argument("--temperature", type=float, default=0.8, metavar="T",
                    help="the softmax temperature, > 0 (default %(default)s)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"),
                    help="where the model runs; every device gives the same text (default %(default)s)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import torch  # noqa: E402  (below the command line's first answer, above)

import hashchain
import repops
import rundir
from data import DataError
from tokenizer import TokenizerError, get_tokenizer
from train import TrainState


def load_model(run_dir, step, device="cpu"):
    """(model on `device`, tokenizer) at the checkpoint of `step` (default: the latest one in the chain)."""
    run = rundir.Run(run_dir)
    step, tensors = run.checkpoint_for_reader(step)
    state = TrainState(run.cfg, run.vocab_size, device)
    state.load(tensors)
    tokenizer = run.genesis.get("tokenizer")
    if not isinstance(tokenizer, dict) or not isinstance(tokenizer.get("name"), str):
        raise UsageError(f"{run.chain.path}: the genesis record names no tokenizer")
    return state.model, get_tokenizer(tokenizer["name"], run.recorded_data_dir(), tokenizer.get("files"))


MAX_TOKENS = 1 << 20       # --tokens: a sample, not a corpus


def main(argv=None):
    try:
        args = parser().parse_args(argv)
        if not (0 <= args.tokens <= MAX_TOKENS and 0 < args.temperature < math.inf and 0 <= args.seed < 1 << 64):
            raise UsageError(f"--tokens must be in 0..{MAX_TOKENS}, --temperature a finite number > 0 "
                             "and --seed in [0, 2^64)")
        if args.device == "cuda" and not torch.cuda.is_available():
            raise UsageError("--device cuda: this machine has no CUDA GPU that torch can use")
        if args.device == "mps" and not torch.backends.mps.is_available():
            raise UsageError("--device mps: this machine has no Apple GPU (MPS) that torch can use")
        model, enc = load_model(args.run_dir, args.step, args.device)
        ids = model.generate(enc.encode(args.prompt), args.tokens, args.seed, args.temperature)
    except (UsageError, DataError, TokenizerError, hashchain.HashChainError, repops.RepOpsBuildError) as e:
        print(f"sample.py: error: {e}", file=sys.stderr)
        return 2
    print(enc.decode(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
