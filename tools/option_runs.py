"""The recipe options on the default model: validation loss and step cost, each option on and off.

    python -m tools.option_runs                    # every run below, 300 steps each, then the table
    python -m tools.option_runs --only base,qk     # some of them
    python -m tools.option_runs --table            # the table of the runs already in runs/options/
    python -m tools.option_runs --threads=1        # one torch thread per run (a shared machine)

Each run is `python train.py` with the default config plus its options, in runs/options/<name>
(a finished run is not run again). The table gives the validation loss at steps 100/200/300, the
median wall time of a step, the CPU seconds per step (user + system of the trainer, which the
load of a shared machine inflates less than the wall time), and the state hash at the last step.
The options on the default model (seq_len 128): a window of 32 keys (a quarter of the context;
`full_attn_every=0`, so layers 0-2 are windowed and the last is full), and micro-batch phases
4 then 8 per step from step 150. The exact rows are the same runs with `--matmul=exact`
(contract §11; docs/exact-matmul.md).
"""
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from config import CommandLine


def parser():
    ap = CommandLine("python -m tools.option_runs", "The recipe options on the default model, each on and "
                     "off: validation loss, step time and CPU seconds per step, and the final state.")
    ap.add_argument("--only", default="", metavar="NAME,...", help="comma-separated run names (default: all)")
    ap.add_argument("--table", action="store_true", help="only print the table of the runs already finished")
    ap.add_argument("--threads", type=int, default=0, metavar="N",
                    help="train.py --threads of each run (bookkeeping: the same bits) (default %(default)s)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

  # noqa: E402  (below the command line's first answer, above)


ROOT = Path(__file__).resolve().parent.parent
WINDOW = ["--attn_window=32"]
ALL = WINDOW + ["--qk_norm=1", "--emb_norm=1", "--lr_schedule=cosine", "--rope_theta=5e5"]
RUNS = {   # name: options on top of the default config
    "base": [],
    "window": WINDOW,
    "qk": ["--qk_norm=1"],
    "emb": ["--emb_norm=1"],
    "cosine": ["--lr_schedule=cosine"],
    "phases": ["--micro_batches=4@0,8@150"],
    "all": ALL,
    "int8": ["--quant=int8"],
    "int8_window": ["--quant=int8"] + WINDOW,
    "int8_qk": ["--quant=int8", "--qk_norm=1"],
    "int8_emb": ["--quant=int8", "--emb_norm=1"],
    "int8_pv": ["--quant=int8", "--int8_pv=1"],
    "int8_all": ["--quant=int8"] + ALL,
    "int8_all_pv": ["--quant=int8", "--int8_pv=1"] + ALL,
    "exact": ["--matmul=exact"],
    "exact_window": ["--matmul=exact"] + WINDOW,
    "exact_all": ["--matmul=exact"] + ALL,
}
STEP = re.compile(r"^step\s+(\d+) \| loss .*\|\s+(\d+) ms \|.*\| state ([0-9a-f]{12})")
VAL = re.compile(r"^step\s+(\d+) \| val loss ([0-9.]+)")


def run(name, python, threads):
    run_dir = ROOT / "runs" / "options" / name
    if (run_dir / "cpu_seconds").exists():
        return
    args = [python, "train.py", f"--run_dir={run_dir}", "--sample_tokens=0", f"--threads={threads}", *RUNS[name]]
    print("$", " ".join(args[1:]), flush=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(args, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    (run_dir / "cpu_seconds").write_text(f"{cpu:.1f} {time.perf_counter() - t0:.1f}\n")


def row(name):
    run_dir = ROOT / "runs" / "options" / name
    log = (run_dir / "train.log").read_text().splitlines()
    val = {int(m[1]): m[2] for m in map(VAL.match, log) if m}
    steps = [m for m in map(STEP.match, log) if m]
    cpu, wall = map(float, (run_dir / "cpu_seconds").read_text().split())
    median_ms = statistics.median(int(m[2]) for m in steps)
    return (f"| {name} | `{' '.join(RUNS[name]) or '(defaults)'}` | {val.get(100, '-')} | "
            f"{val.get(200, '-')} | {val.get(300, '-')} | {median_ms:.0f} | "
            f"{cpu / len(steps):.2f} | `{steps[-1][3]}` |")


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    names = args.only.split(",") if args.only else list(RUNS)
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        p.error(f"unknown run {unknown[0]!r} (runs: {', '.join(RUNS)})")
    if not args.table:
        for name in names:
            run(name, sys.executable, args.threads)
    print("| run | options | val @100 | @200 | @300 | median ms/step | CPU s/step | state @300 |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        if (ROOT / "runs" / "options" / name / "cpu_seconds").exists():
            print(row(name))


if __name__ == "__main__":
    main()
