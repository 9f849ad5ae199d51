"""How fast sample.py is: start-up, the cached decode, the sliding context, end to end.

    python -m tools.sample_bench --run_dir runs/default     # a trained run (the default model)
    python -m tools.sample_bench --run_dir runs/s --tokens 300 --repeats 3
    python -m tools.sample_bench --threads 1 --clock cpu     # CPU time: what a quiet machine's wall clock shows

For each thread count (1 and 2) it times, on the run's latest checkpoint, the default sample
(prompt "\\n", 300 tokens): generate() as sample.py runs it, split into the tokens decoded
against the KV cache (while the context grows to seq_len) and the tokens of a full context
(each a full forward over seq_len tokens, since every position moves when the context slides);
the same tokens with a full forward for every token (generate without a cache, the reference
of tests/test_sample.py); and the same full forwards in stock PyTorch (tools/torch_llama.py,
eager fp32, no cache), for the ratios. Then sample.py end to end as a program (python start-up,
imports, chain and checkpoint verification, sampling, printing; its CPU time with --clock cpu).
Medians of --repeats runs, wall clock (--clock cpu: this process's CPU time, all its threads,
which a shared machine's load does not inflate; with one thread it is the wall clock of a
quiet machine). The figures and their machine are in docs/sampling.md. Not a test: run it on a
quiet machine.
"""
import os
import statistics
import subprocess
import sys
import time

from config import CommandLine


def parser():
    ap = CommandLine("python -m tools.sample_bench", "Time sample.py on a trained run: start-up, the cached "
                     "decode, the sliding context, end to end, against a full forward per token and stock PyTorch.")
    ap.add_argument("--run_dir", metavar="DIR", default="runs/default", help="a trained run (default %(default)s)")
    ap.add_argument("--tokens", type=int, default=300, help="tokens per sample (default %(default)s, sample.py's)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per figure; the median is printed (default %(default)s)")
    ap.add_argument("--threads", default="1,2", help="thread counts to time, comma-separated (default %(default)s)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="what a figure measures: wall clock, "
                    "or this process's CPU time (default %(default)s)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import torch  # noqa: E402  (below the command line's first answer, above)

import optrace  # noqa: E402
import repops  # noqa: E402
import sample  # noqa: E402
from tools.torch_llama import TorchLlama  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


CLOCK = time.perf_counter    # --clock cpu: time.process_time


def median_seconds(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = CLOCK()
        fn()
        times.append(CLOCK() - t0)
    return statistics.median(times)


def program_seconds(cmd):
    """Wall clock of a program run to its end, or with --clock cpu its CPU time (its children's
    rusage: user + system)."""
    if CLOCK is time.perf_counter:
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        return time.perf_counter() - t0
    before = os.times()
    subprocess.run(cmd, check=True, capture_output=True)
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


@torch.no_grad()
def full_forward_per_token(logits_of, ids, n_tokens, seq_len, seed, temperature=0.8):
    """generate's tokens with `logits_of(context)` (a full forward) for every token."""
    ids = list(ids)
    for i in range(n_tokens):
        logits = logits_of(torch.tensor([ids[-seq_len:]]))[0, -1]
        u = repops.uniform(seed, i, 0, repops.PURPOSE_SAMPLE, logits.shape[0])
        gumbel = repops.ops.scale(repops.ops.log(repops.ops.scale(repops.ops.log(u), -1.0)), -1.0)
        score = repops.ops.add(repops.ops.scale(logits.contiguous(), repops.f32(1.0 / temperature)), gumbel)
        ids.append(int(torch.argmax(score)))
    return ids


class _State:     # what TorchLlama copies its weights from
    def __init__(self, model):
        self.model = model


def main(argv=None):
    args = parser().parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    t0 = CLOCK()
    model, enc = sample.load_model(args.run_dir, None)
    load = CLOCK() - t0
    cfg, prompt = model.cfg, enc.encode("\n")
    grow = min(args.tokens, cfg.seq_len - len(prompt))           # tokens decoded against the cache
    m = optrace.machine()
    print(f"machine: {m['cpu']} | torch {m['torch']} | {time.strftime('%Y-%m-%d')} | clock {args.clock} | "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"run {args.run_dir}: {cfg.n_layer} layers x {cfg.d_model}, seq_len {cfg.seq_len}, vocab {cfg.vocab_size}; "
          f"{args.tokens} tokens from a 1-token prompt: {grow} with the cache, {args.tokens - grow} with a full context")
    print(f"load_model (chain + checkpoint verified, model built): {load:.2f} s")
    stock = TorchLlama(_State(model)).eval()
    threads = torch.get_num_threads()
    print(f"\n{'threads':>7} | {'generate':>9} | {'cached ms/token':>15} | {'full-context ms/token':>21} | "
          f"{'no cache':>9} | {'stock torch, no cache':>21}")
    for n in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(n)
        ids = model.generate(prompt, args.tokens, seed=0)
        assert full_forward_per_token(model.logits, prompt, args.tokens, cfg.seq_len, 0) == ids
        total = median_seconds(lambda: model.generate(prompt, args.tokens, seed=0), args.repeats)
        cached = median_seconds(lambda: model.generate(prompt, grow, seed=0), args.repeats)
        slid = (total - cached) / max(1, args.tokens - grow)
        plain = median_seconds(lambda: full_forward_per_token(model.logits, prompt, args.tokens, cfg.seq_len, 0),
                               args.repeats)
        theirs = median_seconds(lambda: full_forward_per_token(stock.logits, prompt, args.tokens, cfg.seq_len, 0),
                                args.repeats)
        print(f"{n:>7} | {total:7.2f} s | {cached / max(1, grow) * 1000:15.2f} | {slid * 1000:21.2f} | "
              f"{plain:7.2f} s | {theirs:7.2f} s ({total / theirs:.2f}x)")
    torch.set_num_threads(threads)
    cmd = [sys.executable, os.path.join(ROOT, "sample.py"), "--run_dir", args.run_dir, "--tokens", str(args.tokens)]
    end_to_end = statistics.median(program_seconds(cmd) for _ in range(args.repeats))
    print(f"\nsample.py --tokens {args.tokens} end to end (its default threads): {end_to_end:.2f} s "
          f"({args.clock}); load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
