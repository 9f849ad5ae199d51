"""Benchmark RepOps against stock PyTorch (fp32, eager) on this machine, in one run.

    python -m tools.bench                  # default model and batch of train.py
    python -m tools.bench --threads 1      # pin the thread count (both sides)
    python -m tools.bench --threads 1 --clock cpu   # CPU time: stable on a machine shared with others
    python -m tools.bench --repeats 10
    python -m tools.bench --device cuda    # on a GPU: tools/bench_cuda.py's tables (TFLOP/s, bf16, 27.5M)
    # both sides AVX2 only (RepOps kernels, torch's own kernels, MKL's matmul):
    REPOPS_CPU_ARCH=x86-64-v3 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 python -m tools.bench
    python -m tools.bench --int8_only      # just the int8 section (--quant=int8, contract §10)

Prints the machine, then tables of absolute figures and ratios (RepOps / PyTorch time):
matmul GFLOP/s at the model's shapes (forward and both backward products), one full training
step (forward, backward, fold, clip, AdamW) against the same model written in plain torch,
state hashing (GB/s and its share of a step), and auditing one step against training one.
The int8 section: the int8 GEMM (exact, int32 sums) against RepOps' fp32 matmul, torch._int_mm
where it runs and torch fp32, at the model's forward shapes and a large square, and one --quant=int8
training step against the fp32 one. Also the bytes each rank sends to sum a step's gradient across ranks, computed (not timed):
TreeFold's reduce-scatter + all-gather against the recursive doubling it replaced.
Needs a prepared corpus (python data.py). Not a test: run it on a quiet machine.
"""
import math
import os
import platform
import shutil
import statistics
import tempfile
import time

from config import CommandLine, Config


def parser():
    ap = CommandLine("python -m tools.bench", "RepOps against stock PyTorch (fp32, eager) on this machine, "
                     "in one run: kernels, matmul, the training step, int8.")
    ap.add_argument("--threads", type=int, default=0, metavar="N",
                    help="torch threads on both sides (default %(default)s: torch's default)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall time, or process CPU time, which other processes on a shared machine do not "
                         "inflate (use with --threads 1: idle worker threads spin and count too) (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=5, metavar="N", help="timed repeats of each case (default %(default)s)")
    ap.add_argument("--data_dir", metavar="DIR", default=Config.data_dir,
                    help="the corpus the training steps read (default %(default)s)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cpu, or cuda: tools/bench_cuda.py's tables (default %(default)s)")
    ap.add_argument("--large", action="store_true", help="with --device cuda: also the 1.23B-parameter step")
    ap.add_argument("--profile", action="store_true", help="with --device cuda: also profile one step of the 27.5M model")
    ap.add_argument("--int8_only", action="store_true", help="only the int8 section")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import torch  # noqa: E402  (below the command line's first answer, above)

import audit
import config
import hashchain
import optrace
import repops
import train
import treefold
from data import TokenData
from tools.torch_llama import TorchLlama, model_shapes, torch_step


CLOCK = time.perf_counter   # --clock cpu: time.process_time (all of this process's threads)


def timeit(fn, repeats, warmup=1):
    """Median time of fn() in seconds, on CLOCK."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = CLOCK()
        fn()
        times.append(CLOCK() - t0)
    return statistics.median(times)


def machine():
    m = optrace.machine()
    return f"{m['cpu']} | {torch.get_num_threads()} threads | torch {m['torch']} | python {platform.python_version()}"


# ----------------------------------------------------------------------------- sections
def bench_matmul(cfg, vocab, repeats):
    rows, shapes = cfg.micro_batch_size * cfg.seq_len, model_shapes(cfg, vocab)
    print(f"\nmatmul, fp32, rows = micro_batch_size x seq_len = {rows} (GFLOP/s; ratio = RepOps/torch speed)")
    print(f"{'weight':10s} {'product':22s} {'RepOps':>8s} {'torch':>8s} {'ratio':>6s}")
    ratios = []
    for name, (out_f, in_f) in shapes.items():
        x, w, gy = torch.randn(rows, in_f), torch.randn(out_f, in_f), torch.randn(rows, out_f)
        for label, a, b in (("fwd  x @ W.T", x, w.t()), ("bwd  gy @ W", gy, w), ("bwd  gy.T @ x", gy.t(), x)):
            flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
            t_rep = timeit(lambda: repops.ops.matmul(a, b), repeats)
            t_ref = timeit(lambda: torch.matmul(a, b), repeats)
            ratios.append(t_ref / t_rep)
            print(f"{name:10s} {label:22s} {flops / t_rep / 1e9:8.1f} {flops / t_ref / 1e9:8.1f} {t_ref / t_rep:6.2f}")
    print(f"geometric mean speed ratio RepOps/torch: {math.exp(statistics.mean(map(math.log, ratios))):.2f}")


def bench_step(cfg, data, repeats, workdir):
    state = train.TrainState(cfg, data.vocab_size)
    baseline = TorchLlama(state)
    opt = torch.optim.AdamW(baseline.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps,
                            weight_decay=cfg.weight_decay)
    steps = iter(range(1, 10 ** 6))
    t_rep = timeit(lambda: train.train_step(state, data, cfg), repeats)
    t_ref = timeit(lambda: torch_step(baseline, opt, data, cfg, next(steps)), repeats)
    tokens = cfg.micro_batches * cfg.micro_batch_size * cfg.seq_len
    print(f"\ntraining step ({tokens} tokens: forward, backward, fold/accumulate, clip, AdamW)")
    print(f"{'':10s} {'ms/step':>9s} {'tok/s':>9s}")
    print(f"{'RepOps':10s} {t_rep * 1e3:9.1f} {tokens / t_rep:9.0f}")
    print(f"{'torch':10s} {t_ref * 1e3:9.1f} {tokens / t_ref:9.0f}")
    print(f"RepOps step time / torch step time: {t_rep / t_ref:.2f}x")

    tensors = state.tensors()
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    t_hash = timeit(lambda: hashchain.state_hash(tensors), repeats)
    print(f"\nstate hashing: {nbytes / 1e6:.1f} MB in {t_hash * 1e3:.1f} ms = {nbytes / t_hash / 1e9:.2f} GB/s, "
          f"{100 * t_hash / (t_rep + t_hash):.1f}% of a step (step + hash)")

    # Audit one step: a run of 1 step with a checkpoint at 0, then audit.py's replay of step 1.
    run_dir = os.path.join(workdir, "run")
    rcfg = config.parse_config(["--run_dir", run_dir, "--max_steps", "1", "--sample_tokens", "0",
                               "--eval_every", "0"], base=cfg)
    train.run(rcfg, 0, 1)
    t_audit = timeit(lambda: audit.Audit(run_dir).replay(1, 1), 1, warmup=0)
    print(f"\naudit of one step (verify chain + checkpoint, replay, compare): {t_audit:.2f} s = "
          f"{t_audit / (t_rep + t_hash):.2f}x a training step")


def best_of(fns, repeats):
    """The fastest of `repeats` times of each fn on CLOCK (wall, or CPU time with --clock cpu),
    calls interleaved: on a shared machine the minimum is the run least disturbed by others, and
    interleaving gives each fn the same luck."""
    best = [math.inf] * len(fns)
    for f in fns:
        f()
    for _ in range(repeats):
        for i, f in enumerate(fns):
            t0 = CLOCK()
            f()
            best[i] = min(best[i], CLOCK() - t0)
    return best


def bench_int8(cfg, data, repeats):
    rows, d, h = cfg.micro_batch_size * cfg.seq_len, cfg.d_model, cfg.d_hidden
    shapes = [("wqkv", rows, 3 * d, d), ("wo", rows, d, d), ("w_gate_up", rows, 2 * h, d),
              ("w_down", rows, d, h), ("square", 2048, 2048, 2048)]
    print(f"\nint8 GEMM x [M, K] @ W.T, W [N, K] (G op/s, best of {repeats} interleaved, {CLOCK.__name__}; one multiply-add = "
          "2 ops); ratio = int8 GEMM speed / RepOps fp32 matmul speed; linear = quantize x and W + GEMM + "
          "dequantize (the whole int8 forward)")
    print(f"{'weight':10s} {'M x N x K':>16s} {'int8':>8s} {'linear':>8s} {'RepOps':>8s} {'_int_mm':>8s} "
          f"{'torch':>8s} {'ratio':>6s}")
    for name, M, N, K in shapes:
        x, w = torch.randn(M, K), torch.randn(N, K) * 0.02
        sx, sw = torch.empty(1), torch.empty(N)
        repops.ops.lsq_init_(x, sx)
        repops.ops.lsq_init_(w, sw)
        qx, qw = repops.ops.int8_quantize(x, sx), repops.ops.int8_quantize(w, sw)
        ops_n = 2 * M * N * K
        fns = [lambda: repops.ops.int8_matmul(qx, qw),
               lambda: repops.ops.int8_linear(repops.ops.int8_quantize(x, sx), repops.ops.int8_quantize(w, sw), sx, sw),
               lambda: repops.ops.matmul(x, w.t()), lambda: torch.matmul(x, w.t())]
        try:                                             # torch's int8 GEMM (oneDNN), where it runs
            torch._int_mm(qx, qw.t())
            fns.append(lambda: torch._int_mm(qx, qw.t()))
        except (RuntimeError, AttributeError):
            pass
        t = best_of(fns, repeats)
        mm = f"{ops_n / t[4] / 1e9:8.1f}" if len(t) > 4 else f"{'n/a':>8s}"
        print(f"{name:10s} {f'{M}x{N}x{K}':>16s} {ops_n / t[0] / 1e9:8.1f} {ops_n / t[1] / 1e9:8.1f} "
              f"{ops_n / t[2] / 1e9:8.1f} {mm} {ops_n / t[3] / 1e9:8.1f} {t[2] / t[0]:6.2f}")
    states, cfgs = {}, {}
    for quant in ("none", "int8"):
        cfgs[quant] = config.parse_config([f"--quant={quant}"], base=cfg)
        states[quant] = train.TrainState(cfgs[quant], data.vocab_size)
    t_fp, t_i8 = best_of([lambda: train.train_step(states["none"], data, cfgs["none"]),
                          lambda: train.train_step(states["int8"], data, cfgs["int8"])], repeats)
    tokens = cfg.micro_batches * cfg.micro_batch_size * cfg.seq_len
    print(f"training step, RepOps ({tokens} tokens, best of {repeats}): fp32 {t_fp * 1e3:.0f} ms, --quant=int8 "
          f"{t_i8 * 1e3:.0f} ms; int8 / fp32 step time: {t_i8 / t_fp:.2f}x")


def bench_traffic(cfg, vocab):
    """Bytes per rank per step of the gradient all-reduce, from the algorithms (not measured)."""
    numel = sum(p.numel() for p in train.TrainState(cfg, vocab).params.values()) + 1   # + the loss
    mb = 4 * numel / 1e6
    print(f"\nall-reduce, bytes sent per rank per step (computed, not timed); P = the flat gradient "
          f"and loss, {numel:,} float32 = {mb:.2f} MB")
    print(f"{'N':>5s} {'R':>4s}   {'recursive doubling':22s} reduce-scatter + all-gather (most of any rank)")
    for n, world in ((cfg.micro_batches, 4), (12, 4), (288, 48)):
        rounds = world.bit_length() - 1
        # Recursive doubling sends the whole buffer in each of its log2(R) rounds; it needs N and
        # R to be powers of two.
        pow2 = all(x & (x - 1) == 0 for x in (n, world))
        rd = f"{mb * rounds:6.2f} MB = {rounds:.2f} P" if pow2 else "not possible"
        rs = max(treefold.bytes_sent(n, world, r, numel) for r in range(world)) / 1e6
        print(f"{n:5d} {world:4d}   {rd:22s} {rs:6.2f} MB = {rs / mb:.2f} P")


def main(argv=None):
    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    cfg = config.Config(data_dir=args.data_dir)
    data = TokenData(cfg.data_dir, cfg.seed)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("bench.py: error: --device cuda needs a CUDA GPU that torch can use")
        from tools import bench_cuda    # its own module: GPU timing and baselines
        bench_cuda.main(args, data)
        return
    print("machine:", machine())
    # Which code ran: the RepOps build's ISA and matmul tile, and torch's own kernel ISA
    # (see the top of this file for running both sides as AVX2 code).
    print(f"RepOps kernels: -march={repops.CPU_ARCH}: {repops.ops.cpu_path()} | "
          f"torch CPU capability: {torch.backends.cpu.get_cpu_capability()} | clock: {args.clock}")
    bench_int8(cfg, data, args.repeats)
    if args.int8_only:
        return
    bench_traffic(cfg, data.vocab_size)
    bench_matmul(cfg, data.vocab_size, args.repeats)
    workdir = tempfile.mkdtemp(prefix="repops-bench-")
    try:
        bench_step(cfg, data, args.repeats, workdir)
    finally:
        shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
