"""The canonical elementwise functions (contract §5) against stock PyTorch's, on this machine, in one run.

    python -m tools.unary_bench                    # 2^22 elements, torch's default threads
    python -m tools.unary_bench --threads 1 --n 1048576

For each op, repops.ops.<name> on a float32 CPU tensor against the PyTorch call it stands for
(torch.exp, torch.tanh, torch.erf, torch.sigmoid, F.gelu in both forms, and aten's gelu_backward
for the gradient factors, which it multiplies by an upstream gradient of ones): the best of
--repeats timed calls on the same input, ns per element, and the ratio RepOps / PyTorch. Inputs
are uniform in [-6, 6], where every branch of tanh and erf is taken. Not a test: run it on a quiet
machine.
"""
import platform
import time

from config import CommandLine


def parser():
    ap = CommandLine("python -m tools.unary_bench", "The canonical elementwise functions (contract §5) against "
                     "stock PyTorch's, on this machine, in one run: ns per element and their ratio.")
    ap.add_argument("--n", type=int, default=1 << 22, help="elements (default %(default)s)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads on both sides (default: torch's)")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per op (default %(default)s)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import torch  # noqa: E402  (below the command line's first answer, above)
import torch.nn.functional as F  # noqa: E402

import repops  # noqa: E402


def cases(x, ones):
    """(name, RepOps call, PyTorch call) for every elementwise op with a stock counterpart."""
    gelu_bw = torch.ops.aten.gelu_backward
    return [
        ("exp", lambda: repops.ops.exp(x), lambda: torch.exp(x)),
        ("tanh", lambda: repops.ops.tanh(x), lambda: torch.tanh(x)),
        ("erf", lambda: repops.ops.erf(x), lambda: torch.erf(x)),
        ("sigmoid", lambda: repops.ops.sigmoid(x), lambda: torch.sigmoid(x)),
        ("gelu", lambda: repops.ops.gelu(x), lambda: F.gelu(x)),
        ("gelu_tanh", lambda: repops.ops.gelu_tanh(x), lambda: F.gelu(x, approximate="tanh")),
        ("gelu_grad", lambda: repops.ops.gelu_grad(x), lambda: gelu_bw(ones, x)),
        ("gelu_tanh_grad", lambda: repops.ops.gelu_tanh_grad(x), lambda: gelu_bw(ones, x, approximate="tanh")),
    ]


def best(fn, repeats):
    fn()  # warm-up (and the kernels' build on first use)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv=None):
    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    x = torch.empty(args.n).uniform_(-6, 6, generator=torch.Generator().manual_seed(0))
    ones = torch.ones_like(x)
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {args.n} float32 elements, best of {args.repeats}")
    print(f"{'op':16s} {'RepOps ns/elt':>14s} {'torch ns/elt':>13s} {'ratio':>7s}")
    for name, ours, theirs in cases(x, ones):
        a, b = best(ours, args.repeats), best(theirs, args.repeats)
        print(f"{name:16s} {a / args.n * 1e9:14.3f} {b / args.n * 1e9:13.3f} {a / b:7.2f}")


if __name__ == "__main__":
    main()
