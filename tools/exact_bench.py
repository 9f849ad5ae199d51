"""The exact matmul (contract §11) on this CPU: its accuracy on the default model's own products
and its speed against RepOps fp32 (§4.1) and torch.

    python -m tools.exact_bench                      # both sections (needs python data.py)
    python -m tools.exact_bench --accuracy --warm 20 # only accuracy, after 20 default steps
    python -m tools.exact_bench --speed --threads 1  # only speed (CPU time; --clock wall)
    REPOPS_CPU_ARCH=x86-64-v3 python -m tools.exact_bench --speed   # the AVX2 build (vpmaddwd)

Accuracy: trains the default config (train.py's, fp32) for --warm steps, then records the
operands of every matmul of one more step's first micro-batch (forward, both backward products,
attention) and computes each product three ways: float64 (the truth), the exact matmul and the
fp32-sequential matmul. Prints, per product type, the median and max elementwise relative error
of both against float64 (outputs whose float64 value is 0 are left out: a relative error there is
undefined) and the normwise error max|C - C64| / max|C64|.
Speed: median time of each product at the default model's shapes and at 1024^3, 2048^3 and
4096^3, exact vs RepOps fp32 vs torch fp32, with ratios; the first line names the kernels that ran
(the int8 GEMM of the residues: AMX-INT8 or the SIMD path, REPOPS_CPU_INT8). The rows marked
"causal" are attention's products as the exact step runs them, told their causal form
(exact_matmul_causal: the scores on and below the diagonal, P with +0.0 above it and its zeros
skipped); their fp32 and torch columns are the full products. Not a test: run it alone (nice 0).
"""
import os
import statistics
import time

from config import CommandLine


def parser():
    ap = CommandLine("python -m tools.exact_bench", "The exact matmul (contract §11) on this CPU: its accuracy on "
                     "the default model's own products, and its speed against RepOps fp32 and torch.")
    ap.add_argument("--accuracy", action="store_true", help="only the accuracy section (default: both)")
    ap.add_argument("--speed", action="store_true", help="only the speed section (default: both)")
    ap.add_argument("--warm", type=int, default=20, metavar="N",
                    help="default-config steps trained before the products are recorded (default %(default)s)")
    ap.add_argument("--threads", type=int, default=0, metavar="N",
                    help="torch threads (default %(default)s: torch's default)")
    ap.add_argument("--repeats", type=int, default=5, metavar="N", help="timed repeats of each product (default %(default)s)")
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="process CPU time, stable on a shared machine (all threads summed), or wall time "
                         "(default %(default)s)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import numpy as np  # noqa: E402  (below the command line's first answer, above)
import torch

import config
import data
import repops
import train


KINDS = ["linear fwd", "linear grad_x", "linear grad_W", "lm_head fwd", "lm_head grad_x", "lm_head grad_W",
         "attn QK^T", "attn PV", "attn bwd (4 products)"]


def record_step(warm):
    """[(kind, a, b)] of every matmul of the first micro-batch of step warm + 1."""
    cfg = config.parse_config(["--eval_every=0"])
    config.validate(cfg)
    tokens = data.TokenData(cfg.data_dir, cfg.seed)
    state = train.TrainState(cfg, tokens.vocab_size)
    for _ in range(warm):
        train.train_step(state, tokens, cfg)
    calls, phase = [], {"bwd": False}   # backward starts after the whole forward
    vocab = state.model.cfg.vocab_size
    real = repops.ops.matmul

    def kind(a, b):
        if a.dim() == 3:
            return "attn bwd (4 products)" if phase["bwd"] else ("attn QK^T" if b.stride(-2) == 1 else "attn PV")
        head = vocab in (a.shape[-1], b.shape[-1]) or vocab == a.shape[0]
        name = "lm_head" if head else "linear"
        if not phase["bwd"]:
            return name + " fwd"
        return name + (" grad_W" if a.stride(-2) == 1 else " grad_x")

    def rec(a, b):
        calls.append((kind(a, b), a.detach().clone().numpy(), b.detach().clone().numpy()))
        return real(a, b)

    orig_bwd = repops._MatMul.backward

    def bwd(ctx, g):
        phase["bwd"] = True
        return orig_bwd(ctx, g)

    repops._MatMul.backward = staticmethod(bwd)
    repops.ops.matmul = rec
    # attention as its composed ops (matmul, causal_softmax, matmul), so that its products are seen
    composed, repops.COMPOSED_ATTENTION = repops.COMPOSED_ATTENTION, True
    try:
        x, y = tokens.micro_batch("train", warm + 1, 0, cfg.micro_batch_size, cfg.seq_len)
        state.model(x, y, zloss=cfg.zloss).backward()
    finally:
        repops._MatMul.backward = staticmethod(orig_bwd)
        repops.ops.matmul = real
        repops.COMPOSED_ATTENTION = composed
    return calls


def accuracy(warm):
    calls = record_step(warm)
    err = {k: {"exact": [], "fp32": [], "nw_exact": 0.0, "nw_fp32": 0.0, "n": 0} for k in KINDS}
    for kind, a, b in calls:
        truth = np.matmul(a.astype(np.float64), b.astype(np.float64))
        ta, tb = torch.from_numpy(np.ascontiguousarray(a)), torch.from_numpy(np.ascontiguousarray(b))
        live = truth != 0
        scale = np.abs(truth).max() or 1.0
        for name, op in (("exact", repops.ops.exact_matmul), ("fp32", repops.ops.matmul)):
            c = op(ta, tb).numpy().astype(np.float64)
            e = np.abs(c - truth)
            err[kind][name].append((e[live] / np.abs(truth[live])).astype(np.float32))
            err[kind]["nw_" + name] = max(err[kind]["nw_" + name], e.max() / scale)
        err[kind]["n"] += 1
    print(f"accuracy: the default model after {warm} steps, one micro-batch's products, relative error vs float64")
    print(f"{'product':24} {'calls':>5} {'exact median':>13} {'fp32 median':>12} {'exact max':>10} {'fp32 max':>10}"
          f" {'exact normwise':>15} {'fp32 normwise':>14}")
    for kind in KINDS:
        r = err[kind]
        if not r["n"]:
            continue
        ex, fp = np.concatenate(r["exact"]), np.concatenate(r["fp32"])
        print(f"{kind:24} {r['n']:5d} {np.median(ex):13.2e} {np.median(fp):12.2e} {ex.max():10.2e} {fp.max():10.2e}"
              f" {r['nw_exact']:15.2e} {r['nw_fp32']:14.2e}")


def timed(fn, repeats, clock):
    fn()
    ts = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        ts.append(clock() - t0)
    return statistics.median(ts)


def speed(repeats, clock_name):
    clock = time.process_time if clock_name == "cpu" else time.perf_counter
    print(f"speed: {repops.ops.cpu_path()}; torch threads {torch.get_num_threads()}; median of {repeats}; "
          f"{clock_name} time; load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())}")
    R, d, h, V, T, Dh, BH = 1024, 128, 384, 256, 128, 32, 32
    shapes = [("qkv fwd [1024,128]x[128,384]", (R, d), (d, 3 * d)), ("down fwd [1024,384]x[384,128]", (R, h), (h, d)),
              ("gate_up grad_W [768,1024]x[1024,128]", (2 * h, R), (R, d)), ("lm_head fwd [1024,128]x[128,256]", (R, d), (d, V)),
              ("QK^T [32,128,32]x[32,32,128]", (BH, T, Dh), (BH, Dh, T)), ("PV [32,128,128]x[32,128,32]", (BH, T, T), (BH, T, Dh)),
              ("QK^T causal", (BH, T, Dh), (BH, Dh, T)), ("PV causal", (BH, T, T), (BH, T, Dh)),
              ("P^T gO causal", (BH, T, T), (BH, T, Dh)),
              ("1024^3", (1024, 1024), (1024, 1024)), ("2048^3", (2048, 2048), (2048, 2048)),
              ("4096^3", (4096, 4096), (4096, 4096))]
    print(f"{'shape':40} {'exact ms':>9} {'fp32 ms':>9} {'torch ms':>9} {'exact/fp32':>11} {'exact/torch':>12} {'exact GFLOP/s':>14}")
    g = torch.Generator().manual_seed(0)
    for name, sa, sb in shapes:
        a, b = torch.randn(*sa, generator=g), torch.randn(*sb, generator=g)
        # kernels/README.md §11 "Attention's products": forms 1-3 (0: the plain exact matmul)
        form = 0 if "causal" not in name else repops.SCORES if name.startswith("QK") else \
            repops.MIX if name.startswith("PV") else repops.MIX_T
        if form in (repops.MIX, repops.MIX_T):   # P, as causal_softmax leaves it; P^T for MIX_T
            a = torch.softmax(a.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")), -1)
            a = a.transpose(1, 2) if form == repops.MIX_T else a
        n = 2 * a.shape[-2] * a.shape[-1] * b.shape[-1] * (a.shape[0] if a.dim() == 3 else 1)
        # fewer repeats of the large products, but at least 3 (--repeats allowing): one sample is noise
        reps = min(repeats, max(3, int(2e10 / n)))
        te = timed(lambda: repops.ops.exact_matmul_causal(a, b, form) if form else repops.ops.exact_matmul(a, b),
                   reps, clock)
        tf = timed(lambda: repops.ops.matmul(a, b), reps, clock)
        tt = timed(lambda: torch.matmul(a, b), reps, clock)
        print(f"{name:40} {te * 1e3:9.2f} {tf * 1e3:9.2f} {tt * 1e3:9.2f} {te / tf:11.2f} {te / tt:12.2f} {n / te / 1e9:14.1f}")


def main(argv=None):
    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    both = not (args.accuracy or args.speed)
    if args.accuracy or both:
        accuracy(args.warm)
    if args.speed or both:
        speed(args.repeats, args.clock)


if __name__ == "__main__":
    main()
