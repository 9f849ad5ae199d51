"""The CUDA kernel versions, checked bit for bit against the CPU backend, then timed (docs/cuda-speed.md).

    python -m tools.matmul_versions             # fp32 matmul versions, then the int8 GEMM paths (~1-2 min, H200)
    python -m tools.matmul_versions --fp32      # only the fp32 matmul versions
    python -m tools.matmul_versions --int8      # only the int8 proof: cuBLASLt = our mma.sync GEMM = CPU
    python -m tools.matmul_versions --clip      # only the gradient-norm versions (clip_grad_v)
    python -m tools.matmul_versions --quick     # fewer and smaller cases (a smoke run)
    python -m tools.matmul_versions --fp32 --versions 1,3   # some versions (one crashed the process)

fp32 (contract §4.1): every version of repops.ops.matmul_v (1: kernels/cuda/matmul.cu, 2, 3 and
4: kernels/cuda/matmul_tiled.cu; 4 picks 2 or 3 by size) against the CPU kernel on odd sizes,
K = 0 and K = 1, transposed views and step-2 slices, batch broadcast, the attention products,
the forward and both backward products of the default, 27.5M and 1.23B models, and 4096^3 and
8192^3. Where the CPU would take
long, the check uses a spread of rows (every tile edge included): an output row depends only on its
row of A and on B, so the CPU's rows A[rows] @ B are the exact reference; the whole product is
then compared between versions. Then each version is timed against cuBLAS fp32 (TF32 off).

int8 (contract §10): torch._int_mm (cuBLASLt) through repops.ops.int8_matmul_v(path=1), our
mma.sync GEMM (path=0) and the CPU kernel on +-127 at the largest K the binding allows, random
grids at the model's shapes, shapes cuBLASLt cannot take (path 1 falls back), and -128 with the
grid check off where K * 128^2 < 2^31; int8_linear (the dequantizing epilogue) the same way.

clip_grad (contract §4.5's chunked sum, §8 clip_grad): versions 1 (kernels/cuda/optim.cu) and
2 (dev/cuda/flat_sum.cu, built with REPOPS_CUDA_DEV=1) of repops.ops.clip_grad_v against the CPU op (the norm and the clipped gradient)
on lengths around 32, 2048 and the chunk L = 32768 (a short last chunk), specials and flushing
squares, misaligned starts, 27.5M and 100M
terms; then timed at 27.5M and at the 1.23B model's 1.23e9 (the two versions compared there).

The last lines (SUMMARY, PROMOTE) say which versions verified, which is fastest, and what to promote
under the rule: only a version that verified on every case here, and the fastest of those by the
geometric mean of its speed over the timed shapes, becomes the default (repops.py's
REPOPS_CUDA_MATMUL / REPOPS_CUDA_INT8 / REPOPS_CUDA_CLIP defaults); no other. Exit status 1 when any version or path
differed from the CPU anywhere (it must stay opt-in), 0 otherwise.
"""
import math
import statistics
import sys
import time

from config import CommandLine


def parser():
    ap = CommandLine("python -m tools.matmul_versions", "The CUDA kernel versions (kernels/cuda/ and dev/cuda/) "
                     "checked bit for bit against the CPU backend, then timed; needs a CUDA GPU.")
    ap.add_argument("--fp32", action="store_true", help="only the fp32 matmul versions (default: every section)")
    ap.add_argument("--int8", action="store_true", help="only the int8 GEMM paths (default: every section)")
    ap.add_argument("--clip", action="store_true", help="only the gradient-norm versions (default: every section)")
    ap.add_argument("--quick", action="store_true", help="fewer and smaller cases (a smoke run)")
    ap.add_argument("--versions", default="all", metavar="V,...",
                    help="the fp32 versions to check, e.g. 1,3 after one crashed the process (default: every "
                         "version built: 1-4, with REPOPS_CUDA_DEV=1 1-6)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import numpy as np  # noqa: E402  (below the command line's first answer, above)
import torch

import config
import repops
from tools.bench_cuda import SHAPES_1B, SHAPES_27M, gpu_time
from tools.torch_llama import model_shapes

VERSIONS = tuple(int(v) for v in repops.CUDA_MATMUL_VERSIONS)   # the fp32 matmul versions built (matmul_v)

CLIP_VERSIONS = (1, 2)
INT8_PATHS = {0: "mma", 1: "cublaslt"}
MAX_INT8_K = 133144          # the binding's bound: K * 127^2 < 2^31
FULL_CHECK_MACS = 2e9        # above this many multiply-adds the CPU reference takes sampled rows
SPECIALS = np.array([0.0, -0.0, 1e-40, -1e-40, 1.2e-38, 3e38, -3e38, 1e30, -1e30, np.inf, -np.inf, np.nan],
                    np.float32)
VOCAB = 256                  # the byte tokenizer's vocabulary (data/shakespeare)


def awkward(rng, shape, frac=0.02):
    """Normal values with a fraction of signed zeros, subnormals, huge values, infinities, NaNs."""
    x = rng.standard_normal(shape).astype(np.float32)
    mask = rng.random(shape) < frac
    x[mask] = rng.choice(SPECIALS, size=int(mask.sum()))
    return torch.from_numpy(x)


def same_bits(got, want):
    """Bitwise equality of two float32 tensors on the CPU; every NaN equals every NaN (§7)."""
    g, w = got.contiguous().view(torch.int32), want.contiguous().view(torch.int32)
    return bool(((g == w) | (torch.isnan(got) & torch.isnan(want))).all())


def check_rows(m):
    """Row indices that cover every tile edge of 64 and 128 near the start and the end, and a spread."""
    edge = {0, 1, m // 2, m - 2, m - 1}
    for tile in (64, 128):               # both sides of the first and the last tile boundary
        for start in (tile, (m - 1) // tile * tile):
            edge |= {start - 1, start}
    spread = np.linspace(0, m - 1, 24).astype(int).tolist()
    return sorted(i for i in edge | set(spread) if 0 <= i < m)


# ----------------------------------------------------------------------------- fp32 cases
def fp32_cases(quick):
    """[(label, a, b)] CPU tensors (any strides), each product a @ b (2-D or batched)."""
    rng = np.random.default_rng(25)
    r = lambda *s: awkward(rng, s)  # noqa: E731
    cases = [(f"{M}x{K}x{N}", r(M, K), r(K, N)) for M, K, N in
             [(1, 1, 1), (7, 1, 129), (33, 1, 7), (7, 0, 33), (1, 300, 1), (129, 300, 65), (130, 17, 257),
              (255, 129, 127), (64, 64, 64), (128, 128, 128), (129, 129, 129), (3, 4099, 5), (1000, 77, 513)]]
    for ta in (False, True):
        for tb in (False, True):
            for M, K, N in ((130, 300, 257), (129, 64, 128)):
                a = r(K, M).t() if ta else r(M, K)
                b = r(N, K).t() if tb else r(K, N)
                cases.append((f"{M}x{K}x{N} a{'T' if ta else ''} b{'T' if tb else ''}", a, b))
    cases += [("step-2 slices", r(260, 600)[::2, ::2], r(600, 258)[::2, 1::2]),
              ("3d @ 3d", r(3, 129, 65), r(3, 65, 130)), ("3d @ 2d (broadcast)", r(2, 129, 64), r(64, 257)),
              ("2d @ 3d (broadcast)", r(70, 19).t(), r(3, 70, 33)),
              ("3d transposed", r(3, 33, 7).transpose(1, 2), r(3, 129, 33).transpose(1, 2)),
              ("tiny (products flush)", torch.from_numpy((rng.standard_normal((65, 129)) * 1e-19).astype(np.float32)),
               torch.from_numpy((rng.standard_normal((129, 66)) * 1e-19).astype(np.float32)))]
    if quick:
        return cases
    # attention of the 27.5M model (q [B*H, T, Dh] @ k^T, p @ v) and its backward products
    q, k, p = r(64, 512, 64), r(64, 512, 64), r(64, 512, 512)
    cases += [("attn q @ k^T (go @ v^T)", q, k.transpose(1, 2)), ("attn p @ v (gs @ k)", p, k),
              ("attn p^T @ go (gs^T @ q)", p.transpose(1, 2), q)]
    for name, cfg_shapes in (("default", {}), ("27.5M", SHAPES_27M), ("1.23B", SHAPES_1B)):
        cfg = config.Config(**cfg_shapes)
        rows = cfg.micro_batch_size * cfg.seq_len
        for w, (out_f, in_f) in model_shapes(cfg, VOCAB).items():
            x, wt, gy = r(rows, in_f), r(out_f, in_f), r(rows, out_f)
            cases += [(f"{name} {w} x@W^T", x, wt.t()), (f"{name} {w} gy@W", gy, wt),
                      (f"{name} {w} gy^T@x", gy.t(), x)]
    cases += [(f"{n}^3", r(n, n), r(n, n)) for n in (4096, 8192)]
    return cases


def macs(a, b):
    batch = max(a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1)
    return batch * a.shape[-2] * a.shape[-1] * b.shape[-1]


def on(t, device):
    """t on `device` as the same view (strides, offset) of a copy of its whole storage."""
    storage = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage()).to(device)
    return storage.as_strided(t.shape, t.stride(), t.storage_offset())


def fp32_reference(a, b):
    """(row indices or None for all, the CPU's product of those rows)."""
    if macs(a, b) <= FULL_CHECK_MACS:
        return None, repops.ops.matmul(a, b)
    rows = check_rows(a.shape[-2])
    return rows, repops.ops.matmul(a[..., rows, :], b)


def verify_fp32(cases, versions, device, run=None):
    """{version: [labels of the cases where it differs from the CPU]}; prints one line per case.
    run(version, a, b) computes the product on `device` (default: repops.ops.matmul_v)."""
    run = run or (lambda v, a, b: repops.ops.matmul_v(a, b, v))
    bad = {v: [] for v in versions}
    for label, a, b in cases:
        t0 = time.perf_counter()
        rows, want = fp32_reference(a, b)
        ad, bd = on(a, device), on(b, device)
        first, verdict = None, []
        for v in versions:
            got = run(v, ad, bd)
            ok = same_bits(got[..., rows, :].cpu() if rows else got.cpu(), want)
            if first is None:
                first = got
            elif ok:                                     # the whole product, against the first version's
                ok = same_bits(got.cpu(), first.cpu()) if rows else ok
            if not ok:
                bad[v].append(label)
            verdict.append(f"v{v} {'ok' if ok else 'MISMATCH'}")
        scope = f"{len(rows)} rows vs CPU, all vs v{versions[0]}" if rows else "all vs CPU"
        print(f"  {label:28s} {str(tuple(a.shape)) + ' @ ' + str(tuple(b.shape)):34s} {', '.join(verdict):34s} "
              f"({scope}; {time.perf_counter() - t0:.1f} s)", flush=True)
    return bad


def time_fp32(versions, quick):
    """{version: [TFLOP/s per timed product]}; prints the table with cuBLAS fp32 (TF32 off). The
    model's products in the layouts training uses: x @ W^T (B k-major), gy @ W, gy^T @ x (A m-major)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    shapes = []
    for name, cfg_shapes in (("27.5M", SHAPES_27M), ("1.23B", SHAPES_1B)):
        cfg = config.Config(**cfg_shapes)
        rows = cfg.micro_batch_size * cfg.seq_len
        for w, (out_f, in_f) in model_shapes(cfg, VOCAB).items():
            shapes += [(f"{name} {w} x@W^T", (rows, in_f, out_f), "fwd"), (f"{name} {w} gy@W", (rows, out_f, in_f), "nn"),
                       (f"{name} {w} gy^T@x", (out_f, rows, in_f), "tn")]
    shapes += [(f"{n}^3", (n, n, n), "fwd") for n in ((1024,) if quick else (4096, 8192))]
    print(f"\n{'product (M x K x N)':40s} " + " ".join(f"{'v' + str(v):>7s}" for v in versions)
          + f" {'cuBLAS':>7s} {'best/cuBLAS':>11s}   TFLOP/s, fp32; cuBLAS with TF32 off")
    speeds = {v: [] for v in versions}
    for label, (M, K, N), layout in shapes:
        a = torch.randn(K, M, device="cuda").t() if layout == "tn" else torch.randn(M, K, device="cuda")
        b = torch.randn(N, K, device="cuda").t() if layout == "fwd" else torch.randn(K, N, device="cuda")
        flops = 2 * M * K * N
        row = {v: flops / gpu_time(lambda: repops.ops.matmul_v(a, b, v), 5) / 1e12 for v in versions}
        ref = flops / gpu_time(lambda: a @ b, 5) / 1e12
        for v in versions:
            speeds[v].append(row[v])
        print(f"{label + f' {M}x{K}x{N}':40s} " + " ".join(f"{row[v]:7.2f}" for v in versions)
              + f" {ref:7.2f} {max(row.values()) / ref:11.2f}", flush=True)
    return speeds


def geomean(xs):
    return math.exp(statistics.mean(map(math.log, xs)))


def promote(bad, speeds, current, env):
    """The promote rule: the fastest version (geometric mean) among those with no mismatch."""
    verified = [v for v in speeds if not bad[v]]
    means = {v: geomean(speeds[v]) for v in speeds}
    for v in speeds:
        state = "verified" if not bad[v] else f"MISMATCH in {len(bad[v])} cases ({', '.join(bad[v][:3])}...)"
        print(f"SUMMARY {env}={v}: {state}; geometric mean {means[v]:.2f} over the timed shapes")
    if not verified:
        print(f"PROMOTE: nothing (no version verified); keep {env}={current}")
        return
    best = max(verified, key=lambda v: means[v])
    if best == current:
        print(f"PROMOTE: {env}={best} (already the default)")
        return
    than = f"{means[best] / means[current]:.2f}x {env}={current}" if current in means else f"{env}={current} not run"
    print(f"PROMOTE: {env}={best} ({than}); make it the default only after tests/test_cuda.py passes with it")


# ----------------------------------------------------------------------------- int8
def int8_cases(quick):
    """[(label, a, b, check_grid)] int8 CPU tensors a [M, K], b [N, K]."""
    rng = np.random.default_rng(10)
    grid = lambda *s: torch.from_numpy(rng.integers(-127, 128, s, dtype=np.int8))  # noqa: E731
    K = 4096 if quick else MAX_INT8_K
    plus = torch.full((32, K), 127, dtype=torch.int8)
    signs = torch.from_numpy(np.where(rng.random((64, K)) < 0.5, -127, 127).astype(np.int8))
    alt = torch.from_numpy(np.where(np.arange(K) % 2 == 0, 127, -127).astype(np.int8)).expand(24, K).contiguous()
    cases = [(f"+127 x +-127, K = {K}", plus, torch.cat([plus, -plus, signs[:16]]), True),
             (f"random +-127, K = {K}", signs[:40], signs[24:], True),
             (f"alternating +-127, K = {K}", alt, torch.cat([alt, -alt]), True),
             ("random grid 129 x 256 x 1000", grid(129, 1000), grid(256, 1000), True),
             ("fallback M = 16", grid(16, 512), grid(64, 512), True),
             ("fallback K = 33", grid(40, 33), grid(64, 33), True),
             ("fallback N = 7", grid(40, 64), grid(7, 64), True)]
    neg = torch.full((24, 4096), -128, dtype=torch.int8)
    cases.append(("-128 (grid check off), K = 4096", torch.cat([neg, grid(8, 4096)]), torch.cat([neg, grid(16, 4096)]),
                  False))
    if not quick:
        cfg = config.Config(**SHAPES_27M)
        rows = cfg.micro_batch_size * cfg.seq_len
        for w, (out_f, in_f) in model_shapes(cfg, VOCAB).items():
            cases.append((f"27.5M {w} {rows}x{out_f}x{in_f}", grid(rows, in_f), grid(out_f, in_f), True))
    return cases


def verify_int8(cases, device):
    """Labels of the cases where some path differs; int8_matmul and int8_linear, every path vs CPU."""
    bad = []
    rng = np.random.default_rng(11)
    for label, a, b, check in cases:
        sx = torch.tensor([0.0123], dtype=torch.float32)
        sw = torch.from_numpy((rng.random(b.shape[0]) * 0.01 + 1e-4).astype(np.float32))
        want = repops.ops.int8_matmul(a, b, check)
        want_y = repops.ops.int8_linear(a, b, sx, sw, check)
        ad, bd, sxd, swd = a.to(device), b.to(device), sx.to(device), sw.to(device)
        verdict = []
        for path, name in INT8_PATHS.items():
            got = repops.ops.int8_matmul_v(ad, bd, check, path).cpu()
            got_y = repops.ops.int8_linear_v(ad, bd, sxd, swd, check, path).cpu()
            ok = torch.equal(got, want) and same_bits(got_y, want_y)
            verdict.append(f"{name} {'ok' if ok else 'MISMATCH'}")
            if not ok:
                bad.append(f"{label} ({name})")
        print(f"  {label:36s} {tuple(a.shape)} . {tuple(b.shape)}^T  {', '.join(verdict)} (int32 and linear vs CPU)",
              flush=True)
    return bad


def time_int8(quick):
    cfg = config.Config(**SHAPES_27M)
    rows = cfg.micro_batch_size * cfg.seq_len
    shapes = [(f"27.5M {w}", (rows, o, i)) for w, (o, i) in model_shapes(cfg, VOCAB).items()]
    shapes += [(f"{n}^3", (n, n, n)) for n in ((1024,) if quick else (4096, 8192))]
    print(f"\n{'int8 x [M, K] . W [N, K]^T':30s} {'mma':>8s} {'cuBLASLt':>8s} {'ratio':>6s}   T op/s of int8_linear_v "
          "(GEMM + dequantizing epilogue); ratio = cuBLASLt / mma")
    speeds = {p: [] for p in INT8_PATHS}
    for label, (M, N, K) in shapes:
        a = torch.randint(-127, 128, (M, K), dtype=torch.int8, device="cuda")
        b = torch.randint(-127, 128, (N, K), dtype=torch.int8, device="cuda")
        sx, sw = torch.full((1,), 0.01, device="cuda"), torch.full((N,), 0.02, device="cuda")
        row = {p: 2 * M * N * K / gpu_time(lambda: repops.ops.int8_linear_v(a, b, sx, sw, False, p), 5) / 1e12
               for p in INT8_PATHS}
        for p in INT8_PATHS:
            speeds[p].append(row[p])
        print(f"{label + f' {M}x{N}x{K}':30s} {row[0]:8.1f} {row[1]:8.1f} {row[1] / row[0]:6.2f}", flush=True)
    return speeds


# ----------------------------------------------------------------------------- clip_grad
def verify_clip(device, quick):
    """{version: [labels where clip_grad_v differs from the CPU op]}; prints one line per case."""
    rng = np.random.default_rng(12)
    lengths = ([0, 1, 31, 32, 33, 2047, 2048, 2049, 32767, 32768, 32769, 65537, 65613, 98304, 1_000_003]
               + ([] if quick else [27_500_000, 100_000_000]))
    bad = {v: [] for v in CLIP_VERSIONS}
    for i, n in enumerate(lengths):
        kind = i % 3
        g = (torch.from_numpy(rng.standard_normal(n).astype(np.float32)) if kind == 0 else awkward(rng, (n,))
             if kind == 1 else torch.from_numpy((rng.standard_normal(n) * 1.1e-19).astype(np.float32)))
        want_out, want_norm = repops.ops.clip_grad(g, 1.0)
        storage = torch.zeros(n + 1)                     # odd lengths also start one float in
        storage[1:] = g
        gd = on(storage[1:] if i % 2 else g, device)
        verdict = []
        for v in CLIP_VERSIONS:
            out, norm = repops.ops.clip_grad_v(gd, 1.0, v)
            ok = same_bits(norm.cpu().reshape(1), want_norm.reshape(1)) and same_bits(out.cpu(), want_out)
            verdict.append(f"v{v} {'ok' if ok else 'MISMATCH'}")
            if not ok:
                bad[v].append(f"n={n}")
        print(f"  clip_grad n = {n:<12d} {['normal', 'specials', 'flushing squares'][kind]:17s} "
              f"{'offset 1' if i % 2 else 'aligned':9s} {', '.join(verdict)}", flush=True)
    return bad


def time_clip(quick):
    """{version: [G terms/s per timed length]}; at the largest length the versions' norms are compared."""
    print(f"\n{'clip_grad (norm + clip)':30s} " + " ".join(f"{'v' + str(v):>9s}" for v in CLIP_VERSIONS)
          + "   ms per call")
    speeds = {v: [] for v in CLIP_VERSIONS}
    for label, n in (("27.5M model", 27_500_000),) + ((("1.23B model", 1_230_000_000),) if not quick else ()):
        g = torch.randn(n, device="cuda")
        t = {v: gpu_time(lambda: repops.ops.clip_grad_v(g, 1.0, v), 3, warmup=1) for v in CLIP_VERSIONS}
        norms = [repops.ops.clip_grad_v(g, 1.0, v)[1].cpu() for v in CLIP_VERSIONS]
        same = all(same_bits(x.reshape(1), norms[0].reshape(1)) for x in norms)
        for v in CLIP_VERSIONS:
            speeds[v].append(n / t[v] / 1e9)
        print(f"{label + f' ({n:,})':30s} " + " ".join(f"{t[v] * 1e3:9.2f}" for v in CLIP_VERSIONS)
              + ("" if same else "   NORMS DIFFER BETWEEN VERSIONS"), flush=True)
        del g
    return speeds


def main(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    try:
        versions = VERSIONS if args.versions == "all" else tuple(int(v) for v in args.versions.split(","))
    except ValueError:
        versions = ()
    if not versions or not set(versions) <= set(VERSIONS):
        ap.error(f"--versions must be a comma-separated subset of {','.join(map(str, VERSIONS))}")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU that torch can use")
    every = not (args.fp32 or args.int8 or args.clip)   # no section named: all of them
    if (every or args.clip) and not repops.CUDA_DEV:
        ap.error("clip_grad version 2 is in dev/cuda: run with REPOPS_CUDA_DEV=1 (as .ci/gpu does), or name --fp32 / --int8")
    repops.load()
    props = torch.cuda.get_device_properties(0)
    print(f"GPU: {props.name}, {props.multi_processor_count} SMs | torch {torch.__version__} | CUDA {torch.version.cuda}"
          f" | {time.strftime('%Y-%m-%d %H:%M')} | defaults REPOPS_CUDA_MATMUL={repops.CUDA_MATMUL} "
          f"REPOPS_CUDA_INT8={repops.CUDA_INT8} REPOPS_CUDA_CLIP={repops.CUDA_CLIP}")
    failed = False
    if every or args.fp32:
        print("\nfp32 matmul versions against the CPU kernel (bit for bit, contract §4.1)")
        bad = verify_fp32(fp32_cases(args.quick), versions, "cuda")
        promote(bad, time_fp32(versions, args.quick), int(repops.CUDA_MATMUL), "REPOPS_CUDA_MATMUL")
        failed |= any(bad.values())
    if every or args.clip:
        print("\nclip_grad versions against the CPU op (the norm's canonical sum, contract §4.2)")
        bad = verify_clip("cuda", args.quick)
        promote(bad, time_clip(args.quick), int(repops.CUDA_CLIP), "REPOPS_CUDA_CLIP")
        failed |= any(bad.values())
    if every or args.int8:
        print("\nint8 GEMM paths against the CPU kernel (exact int32 sums, contract §10)")
        bad8 = verify_int8(int8_cases(args.quick), "cuda")
        speeds = time_int8(args.quick)
        bad = {p: [b for b in bad8 if b.endswith(f"({name})")] for p, name in INT8_PATHS.items()}
        promote({INT8_PATHS[p]: v for p, v in bad.items()}, {INT8_PATHS[p]: v for p, v in speeds.items()},
                repops.CUDA_INT8, "REPOPS_CUDA_INT8")
        failed |= bool(bad8)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
