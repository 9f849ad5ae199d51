"""The exact matmul on CUDA (kernels/cuda/exact.cu, contract §11): CUDA = CPU bits, then its speed.

    python -m tools.exact_cuda              # on a CUDA machine (.ci/gpu's `exact` stage; ~30-60 s, H200)
    python -m tools.exact_cuda --quick      # the bit check on the small cases only, then 1024^3 timed
    python -m tools.exact_cuda --quick --device cpu   # a dry run of the check's logic, no GPU

Verify: torch.ops.repops.exact_matmul on the GPU against the CPU kernel (kernels/cpu/exact.cpp) on
tools/matmul_versions.py's quick cases (odd sizes, K = 0 and 1, transposed views, step-2 slices,
batches, specials, flushing products), the default model's forward and backward products, and
4096^3 and 8192^3. On the large ones the CPU computes a spread of rows (every tile edge): an output
row of §11 depends only on its row of A (its scale included) and on B, so the CPU's A[rows] @ B is
the exact reference for those rows. One line per case; MISMATCH where a bit differs.
Speed: median time of 4096^3 and 8192^3 as TFLOP/s-equivalent (2 M N K / time) next to cuBLAS
fp32 (TF32 off) and RepOps fp32 (repops.ops.matmul, the selected version). The EXACT lines are what
.ci/gpu's summary collects. Exit status 1 on any mismatch.
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


def verify(all_cases, device):
    """Labels of the cases where the GPU's bits differ from the CPU's."""
    bad = []
    for label, a, b in all_cases:
        t0 = time.perf_counter()
        rows = MV.check_rows(a.shape[-2]) if MV.macs(a, b) > MV.FULL_CHECK_MACS / 8 else None
        want = repops.ops.exact_matmul(a[..., rows, :] if rows else a, b)
        got = repops.ops.exact_matmul(MV.on(a, device), MV.on(b, device))
        ok = MV.same_bits((got[..., rows, :] if rows else got).cpu(), want)
        if not ok:
            bad.append(label)
        scope = f"{len(rows)} rows" if rows else "all"
        print(f"EXACT check {label:26s} {str(tuple(a.shape)) + ' @ ' + str(tuple(b.shape)):30s} "
              f"{'ok' if ok else 'MISMATCH'} ({scope} vs CPU; {time.perf_counter() - t0:.1f} s)", flush=True)
    return bad


def timing(sizes):
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"EXACT speed {'n^3':>6s} {'exact':>8s} {'cuBLAS':>8s} {'RepOps':>8s} {'exact/cuBLAS':>13s} "
          f"{'exact/RepOps':>13s}   TFLOP/s(-equivalent), fp32; cuBLAS with TF32 off")
    for n in sizes:
        a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
        flops = 2 * n ** 3
        ex = flops / gpu_time(lambda: repops.ops.exact_matmul(a, b), 3) / 1e12
        cb = flops / gpu_time(lambda: a @ b, 3) / 1e12
        rp = flops / gpu_time(lambda: repops.ops.matmul(a, b), 3) / 1e12
        print(f"EXACT speed {n:6d} {ex:8.2f} {cb:8.2f} {rp:8.2f} {ex / cb:13.2f} {ex / rp:13.2f}", flush=True)


def main(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device")
    repops.load()
    if args.device == "cuda":
        print(f"GPU {torch.cuda.get_device_name()}", flush=True)
    bad = verify(cases(args.quick), args.device)
    print(f"EXACT SUMMARY: {'CUDA = CPU bits on every case' if not bad else 'MISMATCH on ' + ', '.join(bad)}",
          flush=True)
    if args.device == "cuda":
        timing((1024,) if args.quick else (4096, 8192))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
