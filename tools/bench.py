"""Benchmark RepOps against stock PyTorch (fp32, eager) on this machine, in one run.

    python -m tools.bench                  # default model and batch of train.py
    python -m tools.bench --threads 1      # pin the thread count (both sides)
    python -m tools.bench --threads 1 --clock cpu   # CPU time: stable on a machine shared with others
    python -m tools.bench --repeats 10
    python -m tools.bench --device cuda    # on a GPU: tools/bench_cuda.py's tables (TFLOP/s, bf16, 27.5M)
    # both sides AVX2 only (RepOps kernels, torch's own kernels, MKL's matmul):
    REPOPS_CPU_ARCH=x86-64-v3 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 python -m tools.bench
    python -m tools.bench --int8_only      # just the int8 section (--quant=int8, contract §10)

Prints the machine and the kernels that ran (repops.ops.cpu_path(): the matmul's register tile
and vector width, the int8 GEMM's path, AMX-INT8 or VNNI), then tables of absolute figures and
ratios (RepOps / PyTorch time): matmul GFLOP/s at the model's shapes (forward and both backward
products), one full training step (forward, backward, fold, clip, AdamW) against the same model
written in plain torch, state hashing (GB/s and its share of a step), and auditing one step
against training one. The int8 section: the int8 GEMM (exact, int32 sums) on this CPU's default
path and on the SIMD path (VNNI on AVX-512 VNNI CPUs) against RepOps' fp32 matmul, torch._int_mm
where it runs and torch fp32, at the model's forward shapes and a large square; then one training
step with --quant=int8, --quant=int8 --int8_pv=1 and --matmul=exact against the fp32 one. Also the
bytes each rank sends to sum a step's gradient across ranks, computed (not timed): TreeFold's
reduce-scatter + all-gather against the recursive doubling it replaced.

The port limit. Contract §4.1 allows no fused multiply-add, so a matmul core does at most as many
multiply-add pairs per cycle as its vector ports issue one multiply and one add each: Intel cores
with AVX-512 (vmulps and vaddps share ports 0 and 5 at 512 bits) 16 pairs = 32 flop per cycle;
Intel with 256-bit vectors (ports 0 and 1, plus port 5 for adds, Golden Cove and later) 24; AMD
Zen 2-4 (two FMUL and two FADD pipes of 256 bits) 32; AMD Zen 5 where a pair loop measures 512-bit
pipes (server and desktop cores: the same four pipes at 512 bits) 64, else 32
(repops.ops.cpu_limits(), from kernels/cpu/matmul.cpp). The limit is that times the threads times the clock, which is measured,
not read from /proc/cpuinfo (a hypervisor reports the base clock there): a chain of dependent
integer multiplies (3 cycles each on every Intel and AMD core since 2008) timed on the thread's CPU
clock, with independent 512-bit multiplies beside it when the 512-bit tile runs, so any lower clock
for 512-bit instructions is included. The matmul table prints each product's fraction of it.
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
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{m['cpu']} | {torch.get_num_threads()} threads | torch {m['torch']} | python {platform.python_version()} "
            f"| load average {load} (1/5/15 min)")


# ----------------------------------------------------------------------------- sections
def port_limit():
    """(GFLOP/s the contract's matmul can reach on this process's threads, how it was computed);
    (None, why) where the core's limit is not known. See the module docstring."""
    flop_per_cycle, hz = repops.ops.cpu_limits()
    threads = torch.get_num_threads()
    if not flop_per_cycle or not hz:
        return None, "port limit: not known for this CPU"
    limit = flop_per_cycle * threads * hz / 1e9
    return limit, (f"port limit {limit:.0f} GFLOP/s = {flop_per_cycle:.0f} flop/cycle/core (unfused multiply + add) "
                   f"x {threads} threads x {hz / 1e9:.2f} GHz (measured)")


def geomean(xs):
    return math.exp(statistics.mean(map(math.log, xs)))


def bench_matmul(cfg, vocab, repeats):
    rows, shapes = cfg.micro_batch_size * cfg.seq_len, model_shapes(cfg, vocab)
    limit, how = port_limit()
    print(f"\nmatmul, fp32, rows = micro_batch_size x seq_len = {rows} (GFLOP/s; ratio = RepOps/torch speed; "
          f"port = RepOps / the port limit)\n{how}")
    print(f"{'weight':10s} {'product':22s} {'RepOps':>8s} {'torch':>8s} {'ratio':>6s} {'port':>5s}")
    ratios, ports = [], []
    shapes = [(name, dims) for name, dims in shapes.items()] + [("square", (2048, 2048))]
    for name, (out_f, in_f) in shapes:
        n = 2048 if name == "square" else rows
        x, w, gy = torch.randn(n, in_f), torch.randn(out_f, in_f), torch.randn(n, out_f)
        products = (("fwd  x @ W.T", x, w.t()),) if name == "square" else (
            ("fwd  x @ W.T", x, w.t()), ("bwd  gy @ W", gy, w), ("bwd  gy.T @ x", gy.t(), x))
        for label, a, b in products:
            flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
            t_rep = timeit(lambda: repops.ops.matmul(a, b), repeats)
            t_ref = timeit(lambda: torch.matmul(a, b), repeats)
            port = flops / t_rep / 1e9 / limit if limit else float("nan")
            if name != "square":
                ratios.append(t_ref / t_rep)
                ports.append(port)
            print(f"{name:10s} {label:22s} {flops / t_rep / 1e9:8.1f} {flops / t_ref / 1e9:8.1f} {t_ref / t_rep:6.2f} "
                  f"{port:5.2f}")
    print(f"geometric mean over the model's {len(ratios)} products: speed ratio RepOps/torch {geomean(ratios):.2f}, "
          f"port-limit fraction {geomean(ports) if limit else float('nan'):.2f}")


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


def best_of(fns, repeats, int8_paths=None):
    """The fastest of `repeats` times of each fn on CLOCK (wall, or CPU time with --clock cpu),
    calls interleaved: on a shared machine the minimum is the run least disturbed by others, and
    interleaving gives each fn the same luck. int8_paths[i]: the int8 GEMM path fn i runs under
    (repops.select_cpu, switched outside the timed call; None: the default)."""
    paths = int8_paths or [None] * len(fns)
    best = [math.inf] * len(fns)
    try:
        for r in range(repeats + 1):           # round 0 warms up
            for i, f in enumerate(fns):
                repops.select_cpu(int8=paths[i])
                t0 = CLOCK()
                f()
                t = CLOCK() - t0
                if r:
                    best[i] = min(best[i], t)
    finally:
        repops.select_cpu()
    return best


def bench_int8(cfg, data, repeats):
    rows, d, h = cfg.micro_batch_size * cfg.seq_len, cfg.d_model, cfg.d_hidden
    shapes = [("wqkv", rows, 3 * d, d), ("wo", rows, d, d), ("w_gate_up", rows, 2 * h, d),
              ("w_down", rows, d, h), ("square", 2048, 2048, 2048)]
    default = repops.ops.cpu_path().split("; ")[-1].removeprefix("int8 GEMM: ")
    repops.select_cpu(int8="vnni")
    simd = repops.ops.cpu_path().split("; ")[-1].removeprefix("int8 GEMM: ")
    repops.select_cpu()
    print(f"\nint8 GEMM x [M, K] @ W.T, W [N, K] (G op/s, best of {repeats} interleaved, {CLOCK.__name__}; one multiply-add = "
          "2 ops); int8 = this CPU's default path, simd = the SIMD path forced (REPOPS_CPU_INT8=vnni), x = int8 / simd; "
          "ratio = int8 GEMM speed / RepOps fp32 matmul speed; linear = quantize x and W + GEMM + dequantize "
          f"(the whole int8 forward)\nint8: {default}\nsimd: {simd}")
    print(f"{'weight':10s} {'M x N x K':>16s} {'int8':>8s} {'simd':>8s} {'x':>5s} {'linear':>8s} {'RepOps':>8s} "
          f"{'_int_mm':>8s} {'torch':>8s} {'ratio':>6s}")

    for name, M, N, K in shapes:
        x, w = torch.randn(M, K), torch.randn(N, K) * 0.02
        sx, sw = torch.empty(1), torch.empty(N)
        repops.ops.lsq_init_(x, sx)
        repops.ops.lsq_init_(w, sw)
        qx, qw = repops.ops.int8_quantize(x, sx), repops.ops.int8_quantize(w, sw)
        ops_n = 2 * M * N * K
        fns = [lambda: repops.ops.int8_matmul(qx, qw), lambda: repops.ops.int8_matmul(qx, qw),
               lambda: repops.ops.int8_linear(repops.ops.int8_quantize(x, sx), repops.ops.int8_quantize(w, sw), sx, sw),
               lambda: repops.ops.matmul(x, w.t()), lambda: torch.matmul(x, w.t())]
        try:                                             # torch's int8 GEMM (oneDNN), where it runs
            torch._int_mm(qx, qw.t())
            fns.append(lambda: torch._int_mm(qx, qw.t()))
        except (RuntimeError, AttributeError):
            pass
        t = best_of(fns, repeats, [None, "vnni"] + [None] * (len(fns) - 2))
        mm = f"{ops_n / t[5] / 1e9:8.1f}" if len(t) > 5 else f"{'n/a':>8s}"
        print(f"{name:10s} {f'{M}x{N}x{K}':>16s} {ops_n / t[0] / 1e9:8.1f} {ops_n / t[1] / 1e9:8.1f} {t[1] / t[0]:5.2f} "
              f"{ops_n / t[2] / 1e9:8.1f} {ops_n / t[3] / 1e9:8.1f} {mm} {ops_n / t[4] / 1e9:8.1f} {t[3] / t[0]:6.2f}")
    options = {"fp32": [], "--quant=int8": ["--quant=int8"], "--quant=int8 --int8_pv=1": ["--quant=int8", "--int8_pv=1"],
               "--matmul=exact": ["--matmul=exact"]}
    states, cfgs = {}, {}
    for label, flags in options.items():
        cfgs[label] = config.parse_config(flags, base=cfg)
        states[label] = train.TrainState(cfgs[label], data.vocab_size)
    times = best_of([lambda lab=label: train.train_step(states[lab], data, cfgs[lab]) for label in options], repeats)
    tokens = cfg.micro_batches * cfg.micro_batch_size * cfg.seq_len
    print(f"training step, RepOps ({tokens} tokens, best of {repeats} interleaved): "
          + ", ".join(f"{label} {t * 1e3:.0f} ms ({t / times[0]:.2f}x fp32)" for label, t in zip(options, times)))


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
