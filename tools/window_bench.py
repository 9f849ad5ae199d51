"""Sliding-window attention against the full causal path: time and memory as T grows.

    python -m tools.window_bench            # W = 64, 4 heads of 32, T = 256 .. 2048, one thread

For each T: forward + backward of one attention (best of 2) and the bytes autograd saves for the
backward, for matmul + causal_softmax + matmul (O(T^2)) and repops.window_attention (O(T W)).
"""
import math
import time

from config import CommandLine


def parser():
    ap = CommandLine("python -m tools.window_bench", "Sliding-window attention against the full causal path: "
                     "time and memory of one attention's forward and backward as T grows, on one thread.")
    ap.add_argument("--window", type=int, default=64, metavar="W", help="the window's keys (default %(default)s)")
    ap.add_argument("--head_dim", type=int, default=32, help="the head size (default %(default)s)")
    ap.add_argument("--heads", type=int, default=4, help="the heads (default %(default)s)")
    ap.add_argument("--lengths", default="256,512,1024,2048", metavar="T,...",
                    help="the sequence lengths T (default %(default)s)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import torch  # noqa: E402  (below the command line's first answer, above)

import repops


def full_attention(q, k, v, scale):
    return repops.matmul(repops.causal_softmax(repops.matmul(q, k.transpose(1, 2)), scale), v)


def measure(fn, q, k, v):
    """(best seconds of 2 forward + backward runs, MiB saved for backward by one run)."""
    saved, best = [], math.inf
    for _ in range(2):
        xs = [t.detach().requires_grad_(True) for t in (q, k, v)]
        t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * 4) or t, lambda t: t):
            out = fn(*xs)
        out.sum().backward()
        best = min(best, time.perf_counter() - t0)
    return best, sum(saved) / 2 / 2**20


def main(argv=None):
    args = parser().parse_args(argv)
    window, head_dim, heads = args.window, args.head_dim, args.heads
    lengths = [int(t) for t in args.lengths.split(",")]
    torch.set_num_threads(1)
    scale = 1.0 / math.sqrt(head_dim)
    print(f"| T | full causal | window {window} |\n|---|---|---|")
    for T in lengths:
        g = torch.Generator().manual_seed(T)
        q, k, v = (torch.randn(heads, T, head_dim, generator=g) for _ in range(3))
        cells = [measure(lambda q, k, v: full_attention(q, k, v, scale), q, k, v),
                 measure(lambda q, k, v: repops.window_attention(q, k, v, window, scale), q, k, v)]
        print(f"| {T} | " + " | ".join(f"{s * 1000:.0f} ms, {mib:.1f} MiB" for s, mib in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
