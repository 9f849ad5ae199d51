"""Wall time of a training step on torch's default thread count and on one thread, on a quiet
machine and with other jobs holding the cores: the measurement behind threads.py's rule.

    python -m tools.thread_counts                               # the tour's tiny model and the default one
    python -m tools.thread_counts --busy 2 --steps 8            # 2 spinning processes hold the cores meanwhile
    python -m tools.thread_counts --only tiny -- --micro_batches=4   # train.py keys after --, for every model

For each model (tiny: the README tour's, default: train.py's defaults) one process builds the state,
takes a step to warm up, then in each of --rounds rounds times --steps steps on the default count
and --steps on one thread (wall clock: the time a user waits), and prints each count's median
ms per step and their ratio. With --busy K, K processes that spin on the CPU run while the steps
are timed (as other users' jobs do on a shared machine). The machine's own load adds to both;
the load average is printed with each round. Not a test: run it alone.
"""
import os
import statistics
import subprocess
import sys
import time

from config import CommandLine, UsageError, parse_config

PROG = "python -m tools.thread_counts"
MODELS = {"tiny": ["--n_layer=2", "--d_model=32", "--n_head=2", "--d_hidden=64", "--seq_len=16",
                   "--micro_batch_size=2", "--micro_batches=2"],
          "default": []}
SPIN = "while True: pass"


def parser():
    ap = CommandLine(PROG, "Step wall time on torch's default thread count against one thread, quiet or busy.")
    ap.add_argument("--data_dir", metavar="DIR", default="data/shakespeare", help="the corpus (default %(default)s)")
    ap.add_argument("--only", choices=tuple(MODELS), help="one model (default: both)")
    ap.add_argument("--steps", type=int, default=5, metavar="N", help="steps per count per round (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, metavar="R", help="rounds (default %(default)s)")
    ap.add_argument("--busy", type=int, default=0, metavar="K", help="spinning processes while timing (default 0)")
    return ap


def measure(keys, data_dir, steps, rounds):
    """{threads: [ms per step, each round's median]} of the model of `keys`."""
    import torch
    import train
    from data import TokenData
    cfg = parse_config(["--data_dir", data_dir, *keys])
    data = TokenData(cfg.data_dir, cfg.seed)
    state = train.TrainState(cfg, data.vocab_size)
    default = torch.get_num_threads()
    train.train_step(state, data, cfg)
    out = {default: [], 1: []}
    for r in range(rounds):
        for count in out:
            torch.set_num_threads(count)
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                train.train_step(state, data, cfg)
                times.append(time.perf_counter() - t0)
            out[count].append(1000 * statistics.median(times))
        print(f"  round {r + 1}: " + ", ".join(f"{c} thread{'s' * (c > 1)} {v[-1]:.1f} ms" for c, v in out.items())
              + f" (load average {os.getloadavg()[0]:.2f})", flush=True)
    torch.set_num_threads(default)
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    keys = argv[argv.index("--") + 1:] if "--" in argv else []
    try:
        args = parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
        if min(args.steps, args.rounds) < 1 or args.busy < 0:
            raise UsageError("--steps and --rounds must be >= 1, --busy >= 0")
        parse_config(keys)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.busy)]
    try:
        for name in [args.only] if args.only else MODELS:
            print(f"{name} model, {args.busy} spinning process(es), {os.cpu_count()} CPUs:", flush=True)
            result = measure(MODELS[name] + keys, args.data_dir, args.steps, args.rounds)
            (default, many), (_, one) = result.items()
            med_many, med_one = statistics.median(many), statistics.median(one)
            print(f"{name}: {default} threads {med_many:.1f} ms/step, 1 thread {med_one:.1f} ms/step: "
                  f"{default} threads take {med_many / med_one:.2f}x one thread's time", flush=True)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
