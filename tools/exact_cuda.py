"""The exact matmul on CUDA (kernels/cuda/exact.cu, contract §11): CUDA = CPU bits, then its speed.

    python -m tools.exact_cuda              # on a CUDA machine (.ci/gpu's `exact` stage; ~30-60 s, H200)
    python -m tools.exact_cuda --quick      # the bit check on the small cases only, then 1024^3 timed
    python -m tools.exact_cuda --quick --device cpu   # a dry run of the check's logic, no GPU

Verify: torch.ops.repops.exact_matmul_v on the GPU, each residue-GEMM path built (mma: int8.cu's
GEMM; cublaslt: torch's cuBLASLt int8 GEMM, built with REPOPS_CUDA_DEV=1), against the CPU kernel
(kernels/cpu/exact.cpp) on
tools/matmul_versions.py's quick cases (odd sizes, K = 0 and 1, transposed views, step-2 slices,
batches, specials, flushing products), the default model's forward and backward products, and
4096^3 and 8192^3. On the large ones the CPU computes a spread of rows (every tile edge): an output
row of §11 depends only on its row of A (its scale included) and on B, so the CPU's A[rows] @ B is
the exact reference for those rows. One line per case; MISMATCH where a bit differs.
Speed: median time of 4096^3, 8192^3 and 16384^3 per path as TFLOP/s-equivalent (2 M N K / time)
next to cuBLAS fp32 (TF32 off) and RepOps fp32 (repops.ops.matmul, the selected version); the
paths' whole products are compared with each other there. Then SUMMARY and PROMOTE lines under
tools/matmul_versions.py's rule (the fastest path that verified everywhere; REPOPS_CUDA_EXACT_GEMM).
The EXACT, SUMMARY and PROMOTE lines are what .ci/gpu's summary collects. Exit status 1 on any
mismatch.
"""
import sys
import time

from config import CommandLine


def parser():
    ap = CommandLine("python -m tools.exact_cuda", "The exact matmul's CUDA kernels (contract §11) checked bit "
                     "for bit against the CPU kernel, then timed.")
    ap.add_argument("--quick", action="store_true", help="the small cases only, and 1024^3 timed")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cuda, or cpu: a dry run of the check (the CPU against itself), no timing "
                         "(default %(default)s)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import numpy as np  # noqa: E402  (below the command line's first answer, above)
import torch

import config
import repops
import tools.matmul_versions as MV
from tools.bench_cuda import gpu_time
from tools.torch_llama import model_shapes


def cases(quick):
    """[(label, a, b)] CPU tensors: the harness's quick cases, the default model's products, n^3."""
    out = list(MV.fp32_cases(quick=True))
    if quick:
        return out
    rng = np.random.default_rng(26)
    r = lambda *s: MV.awkward(rng, s)  # noqa: E731
    cfg = config.Config()
    rows = cfg.micro_batch_size * cfg.seq_len
    for w, (out_f, in_f) in model_shapes(cfg, MV.VOCAB).items():
        x, wt, gy = r(rows, in_f), r(out_f, in_f), r(rows, out_f)
        out += [(f"default {w} x@W^T", x, wt.t()), (f"default {w} gy@W", gy, wt), (f"default {w} gy^T@x", gy.t(), x)]
    return out + [(f"{n}^3", r(n, n), r(n, n)) for n in (4096, 8192)]


def product(a, b, path, device):
    """The exact matmul on the device by residue-GEMM path (exact_matmul_v, CUDA only); on the CPU
    (the dry run) the CPU op, whatever the path."""
    if device == "cpu":
        return repops.ops.exact_matmul(a, b)
    return repops.ops.exact_matmul_v(a, b, repops.CUDA_EXACT_GEMM_PATHS.index(path))


def verify(all_cases, paths, device):
    """{path: labels of the cases where the device's bits differ from the CPU's}."""
    bad = {p: [] for p in paths}
    for label, a, b in all_cases:
        t0 = time.perf_counter()
        rows = MV.check_rows(a.shape[-2]) if MV.macs(a, b) > MV.FULL_CHECK_MACS / 8 else None
        want = repops.ops.exact_matmul(a[..., rows, :] if rows else a, b)
        da, db, verdicts = MV.on(a, device), MV.on(b, device), []
        for p in paths:
            got = product(da, db, p, device)
            ok = MV.same_bits((got[..., rows, :] if rows else got).cpu(), want)
            if not ok:
                bad[p].append(label)
            verdicts.append(f"{p} {'ok' if ok else 'MISMATCH'}")
        scope = f"{len(rows)} rows" if rows else "all"
        print(f"EXACT check {label:26s} {str(tuple(a.shape)) + ' @ ' + str(tuple(b.shape)):30s} "
              f"{', '.join(verdicts)} ({scope} vs CPU; {time.perf_counter() - t0:.1f} s)", flush=True)
    return bad


def timing(sizes, paths):
    """{path: [TFLOP/s-equivalent per size]}; at each size the paths' whole products are compared
    with each other (the CPU checks rows up to 8192^3 in verify)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    speeds, differ = {p: [] for p in paths}, []
    print(f"EXACT speed {'n^3':>6s} " + " ".join(f"{p:>9s}" for p in paths) + f" {'cuBLAS':>8s} {'RepOps':>8s}"
          f" {'best/cuBLAS':>12s} {'best/RepOps':>12s}   TFLOP/s(-equivalent), fp32; cuBLAS with TF32 off")
    for n in sizes:
        a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
        flops = 2 * n ** 3
        for p in paths:
            speeds[p].append(flops / gpu_time(lambda: product(a, b, p, "cuda"), 3) / 1e12)
        outs = [product(a, b, p, "cuda") for p in paths]
        if not all(torch.equal(o.view(torch.int32), outs[0].view(torch.int32)) for o in outs):
            differ.append(f"{n}^3")
        del outs
        cb = flops / gpu_time(lambda: a @ b, 3) / 1e12
        rp = flops / gpu_time(lambda: repops.ops.matmul(a, b), 3) / 1e12
        best = max(speeds[p][-1] for p in paths)
        print(f"EXACT speed {n:6d} " + " ".join(f"{speeds[p][-1]:9.2f}" for p in paths)
              + f" {cb:8.2f} {rp:8.2f} {best / cb:12.2f} {best / rp:12.2f}", flush=True)
    if differ:
        print(f"EXACT MISMATCH between the residue-GEMM paths at {', '.join(differ)}", flush=True)
    return speeds, differ


def main(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device")
    repops.load()
    paths = repops.CUDA_EXACT_GEMM_PATHS if args.device == "cuda" else ("mma",)
    if args.device == "cuda":
        print(f"GPU {torch.cuda.get_device_name()} | residue GEMM paths {', '.join(paths)}"
              + ("" if len(paths) > 1 else " (cublaslt: REPOPS_CUDA_DEV=1)"), flush=True)
    bad = verify(cases(args.quick), paths, args.device)
    failed = any(bad.values())
    print("EXACT SUMMARY: " + ("CUDA = CPU bits on every case" if not failed else "; ".join(
        f"{p} MISMATCH on {', '.join(b)}" for p, b in bad.items() if b)), flush=True)
    if args.device == "cuda":
        speeds, differ = timing((1024,) if args.quick else (4096, 8192, 16384), paths)
        for p in paths:
            bad[p] += differ
        MV.promote(bad, speeds, repops.CUDA_EXACT_GEMM, "REPOPS_CUDA_EXACT_GEMM")
        failed |= bool(differ)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
