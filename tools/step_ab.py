"""The whole training step of this checkout against another git revision's: two processes, one
per tree, taking turns, so that a shared machine's load falls on both alike. Process CPU time.

    python -m tools.step_ab --against 7bff9fd                    # default model, one thread
    python -m tools.step_ab --against HEAD --rounds 12 --steps 3
    python -m tools.step_ab --against main -- --matmul=exact     # train.py keys after --, both sides
    python -m tools.step_ab --against HEAD --kernels --rounds 9  # the step's elementwise kernels

The other revision is checked out (`git archive`) into a temporary folder, which builds its own
kernels on first import (a few minutes). Each process builds the model of the same config (the
defaults, then the keys after --), takes one step to warm up, then in every round runs --steps
steps when told to and reports their median CPU time; the two alternate, round after round, and
then hash their states (hashchain.state_hash): the same steps from the same init, so the hashes
are equal unless the two revisions give different bits (STATES DIFFER, exit 1). Prints each
round's ms per step and their ratio (this / other), then the median, the spread and the best
rounds. Not a test: run it alone. Needs git.

--kernels: instead of steps, the step's kernels that are neither a plain matmul nor the optimizer,
each at the config's shapes on fixed random inputs (KERNELS below: the causal softmax and its
backward, swiglu, rmsnorm, the residual add, the LSQ backward, and the CPU's fused attention and
its backward where the revision has them), --calls calls of each per round (their mean
CPU time); per kernel the best round of each side and the median of the rounds' ratios; then
a hash of each kernel's outputs on each side (BITS DIFFER naming the kernels, exit 1). Where a change to a kernel
is a few percent of a step, the step's figure cannot show it on a shared host; this can.
"""
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile

from config import CommandLine, UsageError, parse_config

PROG = "python -m tools.step_ab"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run in each tree (its own train.py, config.py, kernels): reads "N" lines from stdin, answers
# with the median CPU seconds of N steps; "hash" answers the state hash and ends.
WORKER = r"""
import statistics, sys, time
sys.path.insert(0, ".")
threads, data_dir, keys = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
import torch
if threads:
    torch.set_num_threads(threads)
import config, hashchain, train
from data import TokenData
cfg = config.parse_config(["--data_dir", data_dir, *keys])
data = TokenData(cfg.data_dir, cfg.seed)
state = train.TrainState(cfg, data.vocab_size)
train.train_step(state, data, cfg)
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "hash":
        print(hashchain.state_hash(state.tensors())[0], flush=True)
        break
    times = []
    for _ in range(int(line)):
        t0 = time.process_time()
        train.train_step(state, data, cfg)
        times.append(time.process_time() - t0)
    print(statistics.median(times), flush=True)
"""


# The --kernels worker: the same protocol, "ready" followed by the kernels' names, "N" answered with
# each kernel's mean CPU seconds over N calls, "hash" with the sha256 of each kernel's outputs.
KERNEL_WORKER = r"""
import hashlib, sys, time
sys.path.insert(0, ".")
threads, keys = int(sys.argv[1]), sys.argv[3:]
import torch
if threads:
    torch.set_num_threads(threads)
import config, repops
cfg = config.parse_config(keys)
ops = repops.ops
B, T, d, H, h = cfg.micro_batch_size, cfg.seq_len, cfg.d_model, cfg.n_head, cfg.d_hidden
rows, gen = B * T, torch.Generator().manual_seed(0)
rand = lambda *shape: torch.randn(*shape, generator=gen)
s, gp, u, gu, x, w, gy = rand(B * H, T, T), rand(B * H, T, T), rand(rows, 2 * h), rand(rows, h), \
    rand(rows, d), rand(d), rand(rows, d)
p, (_, rstd), sx = ops.causal_softmax(s, 0.125), ops.rmsnorm(x, w, 1e-5), \
    torch.rand(rows, generator=gen) * 0.05 + 0.01
KERNELS = {"causal_softmax": lambda: ops.causal_softmax(s, 0.125),
           "causal_softmax_backward": lambda: ops.causal_softmax_backward(gp, p, 0.125),
           "swiglu": lambda: ops.swiglu(u), "swiglu_backward": lambda: ops.swiglu_backward(gu, u),
           "rmsnorm": lambda: ops.rmsnorm(x, w, 1e-5), "rmsnorm_backward": lambda: ops.rmsnorm_backward(gy, x, w, rstd),
           "add": lambda: ops.add(x, gy), "lsq_backward": lambda: ops.lsq_backward(x, sx, gy, 0.01)}
if hasattr(torch.ops.repops, "causal_attention"):   # the CPU's fused attention, its matmuls inside
    Hkv = cfg.n_kv_head or H
    q, go, k, v = rand(B * Hkv, H // Hkv * T, d // H), rand(B * Hkv, H // Hkv * T, d // H), \
        rand(B * Hkv, T, d // H), rand(B * Hkv, T, d // H)
    pa = ops.causal_attention(q, k, v, 0.125)[1]
    KERNELS.update({"causal_attention": lambda: ops.causal_attention(q, k, v, 0.125),
                    "causal_attention_backward": lambda: ops.causal_attention_backward(go, q, k, v, pa, 0.125)})
for f in KERNELS.values():
    f()
print("ready", *KERNELS, flush=True)
for line in sys.stdin:
    if line.strip() == "hash":
        digests = []
        for f in KERNELS.values():
            out, digest = f(), hashlib.sha256()
            for t in out if isinstance(out, (tuple, list)) else (out,):
                digest.update(t.contiguous().numpy().tobytes())
            digests.append(digest.hexdigest())
        print(*digests, flush=True)
        break
    n, seconds = int(line), []
    for f in KERNELS.values():
        t0 = time.process_time()
        for _ in range(n):
            f()
        seconds.append(str((time.process_time() - t0) / n))
    print(" ".join(seconds), flush=True)
"""


def parser():
    ap = CommandLine(PROG, "The training step of this checkout against another git revision's, two processes "
                     "taking turns, process CPU time.")
    ap.add_argument("--against", metavar="REV", default="HEAD",
                    help="the git revision whose tree is the other side (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=8, metavar="N", help="alternating rounds (default %(default)s)")
    ap.add_argument("--steps", type=int, default=5, metavar="N",
                    help="steps per process and round; the round's figure is their median (default %(default)s)")
    ap.add_argument("--threads", type=int, default=1, metavar="N",
                    help="torch.set_num_threads in both processes; 0 leaves torch's default (default %(default)s)")
    ap.add_argument("--kernels", action="store_true",
                    help="time the step's elementwise kernels one by one instead of whole steps")
    ap.add_argument("--calls", type=int, default=20, metavar="N",
                    help="with --kernels: calls of each kernel per process and round (default %(default)s)")
    ap.add_argument("--data_dir", default="data/shakespeare",
                    help="the prepared corpus (python data.py), relative to this checkout (default %(default)s)")
    ap.add_argument("keys", nargs="*", metavar="-- --key=value",
                    help="train.py config keys for both sides, after -- (default: the default model)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before anything is built


def fail(message):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


def checkout(rev, into):
    """rev's tree under `into` (git archive: no worktree to clean up)."""
    archive = os.path.join(into, "tree.tar")
    shown = subprocess.run(["git", "archive", "--format=tar", "-o", archive, rev], cwd=ROOT,
                           capture_output=True, text=True)
    if shown.returncode != 0:
        fail(f"git archive {rev}: {(shown.stderr.strip().splitlines() or ['failed'])[0]}")
    tree = os.path.join(into, "tree")
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    os.remove(archive)
    return tree


class Side:
    """One tree's worker process."""

    def __init__(self, name, tree, args, data_dir):
        self.name = name
        worker = KERNEL_WORKER if args.kernels else WORKER
        self.proc = subprocess.Popen([sys.executable, "-c", worker, str(args.threads), data_dir, *args.keys],
                                     cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self.answer().split()[1:]          # "ready": built, one step (each kernel) run

    def answer(self):
        line = self.proc.stdout.readline()
        if not line:
            fail(f"the {self.name} side stopped (its error is above)")
        return line.strip()

    def ask(self, text):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return self.answer()


def main():
    args = parser().parse_args()
    if args.rounds < 1 or args.steps < 1 or args.calls < 1 or args.threads < 0:
        fail("--rounds, --steps and --calls must be at least 1, --threads at least 0")
    data_dir = os.path.abspath(os.path.join(ROOT, args.data_dir))
    if not os.path.isdir(data_dir):
        fail(f"no prepared corpus at {data_dir} (python data.py)")
    try:
        parse_config(args.keys)                         # this side's keys; the other's may differ
    except UsageError as e:
        fail(str(e))
    with tempfile.TemporaryDirectory(prefix="step-ab-") as tmp:
        other_tree = checkout(args.against, tmp)
        print(f"this checkout against {args.against}: {args.steps} steps per round, {args.rounds} rounds, "
              f"{args.threads or 'default'} thread(s), config {' '.join(args.keys) or 'default'}; "
              f"building the other side's kernels if needed", flush=True)
        this, other = Side("this", ROOT, args, data_dir), Side(args.against, other_tree, args, data_dir)
        if args.kernels:
            return compare_kernels(args, this, other)
        ratios, ms = [], {this: [], other: []}
        print(f"{'round':>5s} {'this ms':>9s} {'other ms':>9s} {'this/other':>10s}")
        for r in range(args.rounds):
            for side in (this, other) if r % 2 == 0 else (other, this):   # who goes first alternates too
                ms[side].append(1e3 * float(side.ask(str(args.steps))))
            ratios.append(ms[this][-1] / ms[other][-1])
            print(f"{r + 1:5d} {ms[this][-1]:9.1f} {ms[other][-1]:9.1f} {ratios[-1]:10.3f}", flush=True)
        hashes = {side: side.ask("hash") for side in (this, other)}
        for side in (this, other):
            side.proc.wait()
    print(f"this / other: median {statistics.median(ratios):.3f}, rounds {min(ratios):.3f}-{max(ratios):.3f}; "
          f"best rounds {min(ms[this]):.1f} / {min(ms[other]):.1f} ms = {min(ms[this]) / min(ms[other]):.3f}")
    if hashes[this] != hashes[other]:
        print(f"STATES DIFFER after {1 + args.rounds * args.steps} steps: this {hashes[this][:16]}, "
              f"{args.against} {hashes[other][:16]}")
        sys.exit(1)
    print(f"states equal after {1 + args.rounds * args.steps} steps: {hashes[this][:16]}")


def compare_kernels(args, this, other):
    """--kernels: the rounds, then per kernel the best rounds and the median ratio, and the bits."""
    us = {this: [], other: []}                          # per round: each kernel's us per call
    for r in range(args.rounds):
        for side in (this, other) if r % 2 == 0 else (other, this):
            us[side].append([1e6 * float(v) for v in side.ask(str(args.calls)).split()])
        print(f"round {r + 1} of {args.rounds}", flush=True)
    hashes = {side: side.ask("hash").split() for side in (this, other)}
    for side in (this, other):
        side.proc.wait()
    if this.ready != other.ready:
        fail(f"the two sides time different kernels: {' '.join(this.ready)} against {' '.join(other.ready)}")
    print(f"{'kernel':24s} {'this us':>9s} {'other us':>9s} {'best':>7s} {'median':>7s}")
    for k, name in enumerate(this.ready):
        mine, theirs = [rnd[k] for rnd in us[this]], [rnd[k] for rnd in us[other]]
        ratio = statistics.median(a / b for a, b in zip(mine, theirs))
        print(f"{name:24s} {min(mine):9.1f} {min(theirs):9.1f} {min(mine) / min(theirs):7.3f} {ratio:7.3f}")
    print("(this / other: time ratios, below 1 is faster)")
    differ = [name for name, a, b in zip(this.ready, hashes[this], hashes[other]) if a != b]
    if differ:
        print(f"BITS DIFFER: the outputs of {', '.join(differ)} differ from {args.against}'s")
        sys.exit(1)
    print("bits equal: every kernel's outputs hash the same on both sides")


if __name__ == "__main__":
    main()
