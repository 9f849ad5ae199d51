"""RepOps on a CUDA GPU against stock PyTorch on the same GPU, in one run: `python -m tools.bench --device cuda`.

    python -m tools.bench --device cuda                # ~3 minutes on an H200
    python -m tools.bench --device cuda --large        # also the 1.23B-parameter step and its hash
    python -m tools.bench --device cuda --profile      # also torch.profiler tables of one 27.5M step
    python -m tools.bench --device cuda --int8_only    # just the int8 section

Prints the GPU, then:
- matmul TFLOP/s at the default model's shapes, the 27.5M model's and large products: RepOps
  against torch fp32 with TF32 off (the ratio), and TF32 and bf16 for reference;
- the training step at the default config and at the 27.5M one (8 layers, d 512, 8 heads,
  hidden 1536, seq 512, 4 x 8 sequences = 16k tokens), and with --large at 1.23B (24 layers,
  d 2048, 16 heads, hidden 5632, seq 1024, 4 x 1 sequences): RepOps against the same model in
  torch fp32 (TF32 off) and under bf16 autocast, attention by scaled_dot_product_attention;
- the state hash: its time on its own, and what it adds to a step when it overlaps the next
  one (train.py's --hash_async, snapshot.py);
- the audit of one step on the GPU against a training step;
- --quant=int8 (contract §10): the int8 GEMM (mma.sync s8, exact int32 sums, plus the
  dequantizing epilogue) against RepOps' fp32 matmul, torch._int_mm and torch fp32 at the
  model's forward shapes and large squares, and the int8 training step against the fp32 one;
- the --matmul=exact training step (contract §11, exact.cu) against the fp32 one.
Times are medians of CUDA-event timings (host timers where the work is the host's). Needs a
prepared corpus (python data.py; carry data/ to a machine without network).
"""
import dataclasses
import os
import shutil
import statistics
import tempfile
import time

import torch

import audit
import config
import repops
import snapshot
import train
from tools.torch_llama import TorchLlama, model_shapes, torch_step

SHAPES_27M = dict(n_layer=8, d_model=512, n_head=8, d_hidden=1536, seq_len=512, micro_batch_size=8,
                  micro_batches=4)
SHAPES_1B = dict(n_layer=24, d_model=2048, n_head=16, d_hidden=5632, seq_len=1024, micro_batch_size=1,
                 micro_batches=4)
LARGE_PRODUCTS = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 2048, 2048)]   # M, K, N
DEVICE = "cuda"   # every tensor and run below is placed by this name


def gpu_time(fn, repeats, warmup=2):
    """Median seconds of fn() by CUDA events (the work fn enqueues, and any host waits in it)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def host_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def torch_matmul(a, b, kind):
    """a @ b in torch: fp32 with TF32 off or on, or bf16 operands."""
    torch.backends.cuda.matmul.allow_tf32 = kind == "tf32"
    if kind == "bf16":
        return a.bfloat16() @ b.bfloat16()
    return a @ b


def bench_matmul(products, repeats):
    print(f"\n{'product (M x K x N)':26s} {'RepOps':>8s} {'fp32':>8s} {'ratio':>6s} {'tf32':>8s} {'bf16':>8s}"
          "   TFLOP/s; ratio = RepOps / torch fp32 speed")
    for label, (M, K, N) in products:
        a, b = torch.randn(M, K, device=DEVICE), torch.randn(K, N, device=DEVICE)
        flops = 2 * M * K * N
        t_rep = gpu_time(lambda: repops.ops.matmul(a, b), repeats)
        t_ref = {kind: gpu_time(lambda: torch_matmul(a, b, kind), repeats) for kind in ("fp32", "tf32", "bf16")}
        print(f"{label:26s} {flops / t_rep / 1e12:8.2f} {flops / t_ref['fp32'] / 1e12:8.2f} "
              f"{t_ref['fp32'] / t_rep:6.2f} {flops / t_ref['tf32'] / 1e12:8.2f} {flops / t_ref['bf16'] / 1e12:8.2f}")
    torch.backends.cuda.matmul.allow_tf32 = False


def bench_int8(cfg, data, products, repeats):
    print(f"\n{'int8: x [M, K] @ W.T':26s} {'int8':>8s} {'RepOps':>8s} {'ratio':>6s} {'_int_mm':>8s} {'fp32':>8s}"
          "   T op/s (a multiply-add = 2 ops); int8 = int8_linear (GEMM + dequantizing epilogue); "
          "ratio = int8 / RepOps fp32 matmul speed")
    for label, (M, K, N) in products:
        x, w = torch.randn(M, K, device=DEVICE), torch.randn(N, K, device=DEVICE) * 0.02
        sx, sw = torch.empty(1, device=DEVICE), torch.empty(N, device=DEVICE)
        repops.ops.lsq_init_(x, sx)
        repops.ops.lsq_init_(w, sw)
        qx, qw = repops.ops.int8_quantize(x, sx), repops.ops.int8_quantize(w, sw)
        ops_n = 2 * M * K * N
        t_i8 = gpu_time(lambda: repops.ops.int8_linear(qx, qw, sx, sw, False), repeats)
        t_rep = gpu_time(lambda: repops.ops.matmul(x, w.t()), repeats)
        t_fp = gpu_time(lambda: x @ w.t(), repeats)
        try:                      # torch's int8 GEMM (cuBLASLt), where its shape rules allow
            t_mm = f"{ops_n / gpu_time(lambda: torch._int_mm(qx, qw.t()), repeats) / 1e12:8.2f}"
        except RuntimeError:
            t_mm = f"{'n/a':>8s}"
        print(f"{label:26s} {ops_n / t_i8 / 1e12:8.2f} {ops_n / t_rep / 1e12:8.2f} {t_rep / t_i8:6.2f} {t_mm} "
              f"{ops_n / t_fp / 1e12:8.2f}")
    tokens = cfg.micro_batches * cfg.micro_batch_size * cfg.seq_len
    times = {}
    for name, change in (("fp32", {}), ("--quant=int8", {"quant": "int8"}), ("--matmul=exact", {"matmul": "exact"})):
        qcfg = dataclasses.replace(cfg, **change)
        state = train.TrainState(qcfg, data.vocab_size, DEVICE)
        times[name] = gpu_time(lambda: train.train_step(state, data, qcfg), repeats, warmup=1)
    for name in ("--quant=int8", "--matmul=exact"):
        print(f"training step, {tokens} tokens: fp32 {times['fp32'] * 1e3:.1f} ms, {name} {times[name] * 1e3:.1f} ms; "
              f"{name.split('=')[1]} / fp32 step time: {times[name] / times['fp32']:.2f}x")


def profile_step(cfg, data, name):
    """torch.profiler tables of one training step (after a warm-up step): where GPU and host time go."""
    state = train.TrainState(cfg, data.vocab_size, DEVICE)
    train.train_step(state, data, cfg)
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        train.train_step(state, data, cfg)
        torch.cuda.synchronize()
    table = prof.key_averages()
    print(f"\nprofile of one step, {name}: by GPU time, then by host (self CPU) time")
    print(table.table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=40))
    print(table.table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=40))


def model_products(cfg, vocab, name):
    rows = cfg.micro_batch_size * cfg.seq_len
    return [(f"{name} {w} fwd", (rows, in_f, out_f)) for w, (out_f, in_f) in model_shapes(cfg, vocab).items()]


def overlapped_step(state, data, cfg, hasher, pending):
    """One step as train.py's loop runs it with --hash_async=on: the step, then the previous
    step's hash is collected, then this step's is started."""
    fields = train.train_step(state, data, cfg)
    if pending[0] is not None:
        pending[0].result()
    pending[0] = hasher.submit(state)
    return fields


def bench_step(cfg, data, repeats, name, workdir=None):
    state = train.TrainState(cfg, data.vocab_size, DEVICE)
    n_params = state.n_params()
    tokens = cfg.micro_batches * cfg.micro_batch_size * cfg.seq_len
    t_rep = gpu_time(lambda: train.train_step(state, data, cfg), repeats, warmup=1)
    baseline = TorchLlama(state, sdpa=True)
    opt = torch.optim.AdamW(baseline.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps,
                            weight_decay=cfg.weight_decay)
    steps = iter(range(1, 10 ** 6))
    t_fp32 = gpu_time(lambda: torch_step(baseline, opt, data, cfg, next(steps)), repeats, warmup=1)

    def bf16_step():
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            torch_step(baseline, opt, data, cfg, next(steps))
    t_bf16 = gpu_time(bf16_step, repeats, warmup=1)
    baseline = opt = None           # free the baseline's weights and moments before hashing
    torch.cuda.empty_cache()
    print(f"\ntraining step, {name}: {n_params / 1e6:.1f}M parameters, {tokens} tokens "
          f"(peak GPU memory so far {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB)")
    print(f"{'':22s} {'ms/step':>9s} {'tok/s':>10s} {'TFLOP/s':>8s}   (6 x params x tokens)")
    for label, t in (("RepOps", t_rep), ("torch fp32 (TF32 off)", t_fp32), ("torch bf16 autocast", t_bf16)):
        print(f"{label:22s} {t * 1e3:9.1f} {tokens / t:10.0f} {6 * n_params * tokens / t / 1e12:8.2f}")
    print(f"RepOps step time / torch fp32 step time: {t_rep / t_fp32:.2f}x")

    tensors = state.tensors()
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    t_hash = host_time(lambda: snapshot.hash_state(state.step, tensors), max(1, repeats // 2))
    hasher, pending = snapshot.StateHasher(overlap=True), [None]
    t_overlap = gpu_time(lambda: overlapped_step(state, data, cfg, hasher, pending), repeats, warmup=2)
    pending[0].result()
    print(f"state hash, {nbytes / 1e9:.2f} GB: {t_hash * 1e3:.0f} ms on its own "
          f"({nbytes / t_hash / 1e9:.2f} GB/s, copy included) = {100 * t_hash / t_rep:.1f}% of a step; "
          f"overlapping the next step it adds {(t_overlap - t_rep) * 1e3:.0f} ms = "
          f"{100 * (t_overlap - t_rep) / t_rep:.1f}% to a step")

    if workdir:
        run_dir = os.path.join(workdir, name.replace(" ", "_"))
        rcfg = dataclasses.replace(cfg, run_dir=run_dir, max_steps=1, sample_tokens=0, eval_every=0)
        train.run(rcfg, 0, 1)
        t_audit = host_time(lambda: audit.Audit(run_dir, device=DEVICE).replay(1, 1), 1)
        print(f"audit of one step on the GPU (verify chain + checkpoint, replay, compare): {t_audit:.2f} s "
              f"= {t_audit / t_rep:.1f}x a training step")


def main(args, data):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    print(f"GPU: {props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB | "
          f"torch {torch.__version__} | CUDA {torch.version.cuda} | {time.strftime('%Y-%m-%d')} | kernel versions "
          f"REPOPS_CUDA_MATMUL={repops.CUDA_MATMUL} REPOPS_CUDA_INT8={repops.CUDA_INT8} REPOPS_CUDA_CLIP={repops.CUDA_CLIP} "
          f"REPOPS_CUDA_EXACT_GEMM={repops.CUDA_EXACT_GEMM} "
          "(docs/cuda-speed.md)")
    repops.load()
    default = dataclasses.replace(config.Config(data_dir=args.data_dir), device=DEVICE)
    mid = dataclasses.replace(default, **SHAPES_27M)
    if not args.int8_only:
        bench_matmul(model_products(default, data.vocab_size, "default")
                     + model_products(mid, data.vocab_size, "27.5M")
                     + [(f"{M} x {K} x {N}", (M, K, N)) for M, K, N in LARGE_PRODUCTS], args.repeats)
    bench_int8(mid, data, model_products(mid, data.vocab_size, "27.5M")[:4]
               + [(f"{n} x {n} x {n}", (n, n, n)) for n in (4096, 8192)], args.repeats)
    if args.int8_only:
        return
    if args.profile:
        profile_step(mid, data, "27.5M fp32")
        profile_step(dataclasses.replace(mid, quant="int8"), data, "27.5M --quant=int8")
    workdir = tempfile.mkdtemp(prefix="repops-bench-cuda-")
    try:
        bench_step(default, data, args.repeats, "default", workdir)
        bench_step(mid, data, args.repeats, "27.5M", workdir)
        if args.large:
            bench_step(dataclasses.replace(default, **SHAPES_1B), data, 3, "1.23B")
    finally:
        shutil.rmtree(workdir)
