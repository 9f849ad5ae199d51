"""What the contract's guard (guard.py) costs a default-model run: its probe, its checked first step,
and a sample's decode under it, against the same work without it.

    python -m tools.guard_cost                              # the default config, data/shakespeare
    python -m tools.guard_cost --steps 6 --threads 1 --clock cpu

Times, in one process on the same state, taking turns so that a shared machine's load falls on
both sides alike: a default step as every step after the first runs (no mode), the first step
of a process (the step under guard.ContractMode, checked), and the probe (train.probe: one
forward and backward on one sequence under the mode with anomaly mode). Prints the medians, the
overhead of the first step and the probe as fractions of a step, and both amortized over a run
of --run_steps steps (the default 300). Then sample.py's check before a decode (sample.check: the
probe on the prompt, two tokens decoded under the mode) against a decode of --tokens tokens, and
that decode with and without the mode (a stock model decodes under it). --clock cpu: this process's CPU time (all its threads), which other
jobs on the machine do not inflate. The figures and their machine are in
docs/changing-the-model.md. Not a test: speed is measured here, never asserted.
"""
import statistics
import time

from config import CommandLine


def parser():
    ap = CommandLine("python -m tools.guard_cost", "Time the contract's guard against a default step: the probe, "
                     "the checked first step, a sample's decode.")
    ap.add_argument("--data_dir", metavar="DIR", default="data/shakespeare", help="a prepared corpus (default %(default)s)")
    ap.add_argument("--steps", type=int, default=5, help="turns of each kind; medians are printed (default %(default)s)")
    ap.add_argument("--run_steps", type=int, default=300, help="the run the overhead is amortized over (default %(default)s)")
    ap.add_argument("--tokens", type=int, default=100, help="tokens of the timed decode (default %(default)s)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default 0: torch's)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall clock, or this process's CPU "
                    "time (default %(default)s)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import torch  # noqa: E402  (below the command line's first answer, above)

import config  # noqa: E402
import data  # noqa: E402
import sample  # noqa: E402
import train  # noqa: E402


def main(argv=None):
    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    cfg = config.parse_config([f"--data_dir={args.data_dir}"])
    tokens = data.TokenData(cfg.data_dir, cfg.seed)
    cfg = config.resolve(cfg, tokens.vocab_size)
    state = train.TrainState(cfg, tokens.vocab_size)
    train.train_step(state, tokens, cfg)                    # warm-up (the process's checked step)
    times = {"step": [], "first step": [], "probe": []}
    for _ in range(args.steps):
        for kind in times:
            t0 = clock()
            if kind == "probe":
                mapped = train.probe(state, tokens, cfg, state.step + 1)
                assert not mapped, f"the default model maps stock operators: {dict(mapped)}"
            else:
                state.guard.first_step = None if kind == "first step" else 0    # checked, or not
                train.train_step(state, tokens, cfg)
            times[kind].append(clock() - t0)
    step, first, probe = (statistics.median(times[k]) for k in ("step", "first step", "probe"))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.clock} clock, medians of {args.steps}")
    print(f"default step                {step * 1e3:8.1f} ms")
    print(f"first step (under the mode) {first * 1e3:8.1f} ms   overhead {100 * (first - step) / step:5.1f}% of a step")
    print(f"probe                       {probe * 1e3:8.1f} ms   {100 * probe / step:5.1f}% of a step")
    once = max(first - step, 0.0) + probe
    print(f"per process: {once * 1e3:.1f} ms = {100 * once / step:.1f}% of a step; amortized over {args.run_steps} "
          f"steps {100 * once / (step * args.run_steps):.3f}% of a step")
    decode = {"check": [], "decode": [], "decode under the mode": []}
    for _ in range(args.steps):
        for kind in decode:
            t0 = clock()
            if kind == "check":
                sample.check(state, [10], 1, 0.8)
            else:
                with state.guard.inference(always=kind != "decode"):
                    state.model.generate([10], args.tokens, seed=1)
            decode[kind].append(clock() - t0)
    check, plain, guarded = (statistics.median(decode[k]) for k in decode)
    print(f"decode of {args.tokens} tokens {plain * 1e3:.0f} ms; sample.py's check before it {check * 1e3:.0f} ms "
          f"({100 * check / plain:.0f}%); the decode under the mode {guarded * 1e3:.0f} ms "
          f"(+{100 * (guarded - plain) / plain:.0f}%)")


if __name__ == "__main__":
    main()
