"""What the model changes of docs/changing-the-model.md cost under the contract, against fused RepOps
kernels and stock PyTorch, per operator and per training step, on this machine, in one run.

    python -m tools.change_costs                              # the default config, data/shakespeare
    python -m tools.change_costs --threads 1 --clock cpu --turns 5

Per operator (forward and backward, at the default config's shapes: micro_batch_size x seq_len
rows, d_model, d_hidden): each change's stock operator written as in the diff, run under the
contract (guard.ContractMode: the composition of RepOps kernels that contract §12 defines), and
with torch's own kernels (no mode: stock PyTorch, whose bits differ between machines); and, for
the fused kernels the changes replace (repops.swiglu, repops.rmsnorm), the same function written
with stock operators under the contract, the fused RepOps kernel and stock torch: what a fused
kernel buys over a composition. Per step (forward, backward, fold, clip, AdamW of the default
batch): the default model (fused RepOps kernels, no mode: a pure model's step after its first),
the same under the mode (a pure model's first step), and each change (examples/edits/*.diff) and
examples/nanogpt_model.py under the contract (a stock model: every step under the mode) and with
the mode off (its stock operators on torch's kernels: not reproducible, the speed it gives up).
Times are medians over --turns, the kinds taking turns so that a shared machine's load falls on
all alike; --clock cpu is this process's CPU time. Not a test: speed is measured, never asserted.
The figures and their machine are in docs/changing-the-model.md.
"""
import contextlib
import platform
import statistics
import time

from config import CommandLine


def parser():
    ap = CommandLine("python -m tools.change_costs", "Time the guide's model changes under the contract against "
                     "fused RepOps kernels and stock PyTorch, per operator and per step.")
    ap.add_argument("--data_dir", metavar="DIR", default="data/shakespeare",
                    help="a prepared corpus (default %(default)s)")
    ap.add_argument("--turns", type=int, default=5,
                    help="timed turns of each kind; medians are printed (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=20, help="calls per operator timing (default %(default)s)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default 0: torch's)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall clock, or this process's CPU "
                    "time (default %(default)s)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import torch  # noqa: E402  (below the command line's first answer, above)
import torch.nn.functional as F  # noqa: E402

import config  # noqa: E402
import data  # noqa: E402
import guard  # noqa: E402
import repops  # noqa: E402
import train  # noqa: E402
from tools import model_changes  # noqa: E402


def operator_cases(cfg):
    """(change, what, calls in a step, {way: fn}, inputs): fn(*inputs) -> an output to differentiate.
    Ways: 'contract' (stock code under the mode), 'fused' (a RepOps kernel), 'torch' (stock code,
    torch's kernels). Calls: a block's operator runs once per layer and micro-batch, a norm twice
    per layer and once more at the end."""
    rows, d, h = cfg.micro_batch_size * cfg.seq_len, cfg.d_model, cfg.d_hidden
    blocks, norms = cfg.n_layer * cfg.micro_batches, (2 * cfg.n_layer + 1) * cfg.micro_batches
    gen = torch.Generator().manual_seed(0)

    def rand(*shape, scale=1.0, shift=0.0):
        return torch.randn(*shape, generator=gen) * scale + shift
    eps = cfg.norm_eps
    gelu = lambda u: F.gelu(u)                                          # noqa: E731
    swiglu = lambda u: F.silu(u[:, :h]) * u[:, h:]                      # noqa: E731
    layer_norm = lambda x, w, b: F.layer_norm(x, (d,), w, b, eps)        # noqa: E731
    rmsnorm = lambda x, w: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w   # noqa: E731
    gate = lambda o, z: o * torch.sigmoid(z)                            # noqa: E731
    return [
        ("gelu_mlp", f"F.gelu(u), u [{rows}, {h}]", blocks, {"contract": gelu, "torch": gelu}, [rand(rows, h)]),
        ("gelu_mlp", f"  replaces SwiGLU, F.silu(g) * up, [{rows}, 2 x {h}]", blocks,
         {"contract": swiglu, "fused": repops.swiglu, "torch": swiglu}, [rand(rows, 2 * h)]),
        ("layernorm", f"F.layer_norm(x, (d,), w, b), x [{rows}, {d}]", norms,
         {"contract": layer_norm, "torch": layer_norm},
         [rand(rows, d), rand(d, scale=0.1, shift=1.0), rand(d, scale=0.1)]),
        ("layernorm", f"  replaces RMSNorm, x * rsqrt(mean(x * x) + eps) * w", norms,
         {"contract": rmsnorm, "fused": lambda x, w: repops.rmsnorm(x, w, eps), "torch": rmsnorm},
         [rand(rows, d), rand(d, scale=0.1, shift=1.0)]),
        ("gated_attention", f"o * torch.sigmoid(z), o, z [{rows}, {d}]", blocks, {"contract": gate, "torch": gate},
         [rand(rows, d), rand(rows, d)]),
    ]


def forward_backward(fn, inputs, mode):
    """One forward and backward of fn (gradients of every input, upstream gradient ones)."""
    xs = [x.detach().requires_grad_() for x in inputs]
    with mode or contextlib.nullcontext():
        y = fn(*xs)
        torch.autograd.grad(y, xs, torch.ones_like(y))


def time_operator(fn, inputs, way, repeats, clock):
    """Median seconds of one forward and backward over `repeats` calls, after a warm-up."""
    mode = (lambda: guard.ContractMode(seed=0)) if way == "contract" else (lambda: None)
    forward_backward(fn, inputs, mode())
    times = []
    for _ in range(repeats):
        t0 = clock()
        forward_backward(fn, inputs, mode())
        times.append(clock() - t0)
    return statistics.median(times)


def step_states(cfg, vocab_size, tokens):
    """{kind: TrainState}: the default model with and without the mode, and each changed model under
    the contract and with the mode off; every state built (and its stock init drawn) under the guard."""
    states = {}
    for name in (None, *model_changes.CHANGES, model_changes.FOREIGN):
        with model_changes.model_in_place(name):
            for mode in (True, False):
                state = train.TrainState(cfg, vocab_size)
                mapped = train.probe(state, tokens, cfg, 1)     # classifies it: pure or stock
                assert bool(mapped) == (name is not None), (name, dict(mapped))
                # a pure model's step runs under the mode only if it is the process's first (first_step);
                # a stock model's always, unless the guard is told it is pure (mode off: torch's kernels)
                state.guard.stock = bool(mapped) and mode
                state.guard.first_step = None if mode else 0
                states[(name or "default", mode)] = state
    return states


def step_once(state, tokens, cfg, mode):
    if mode and not state.guard.stock:
        state.guard.first_step = None               # the default model's checked first step, again
    train.train_step(state, tokens, cfg)


def main(argv=None):
    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    cfg = config.parse_config([f"--data_dir={args.data_dir}"])
    tokens = data.TokenData(cfg.data_dir, cfg.seed)
    cfg = config.resolve(cfg, tokens.vocab_size)
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, "
          f"{args.clock} clock; the default config (micro-batches of {cfg.micro_batch_size} x {cfg.seq_len} tokens, "
          f"d_model {cfg.d_model}, d_hidden {cfg.d_hidden})")

    print(f"\nper operator, forward and backward (ms, median of {args.repeats}); the ratios are against stock "
          "torch; per step: ms x the calls of a step (contract / torch)")
    print(f"{'change':16s} {'operator':52s} {'contract':>9s} {'fused':>7s} {'torch':>7s} {'contract':>9s} "
          f"{'fused':>6s} {'calls':>6s} {'per step':>13s}")
    for change, what, calls, ways, inputs in operator_cases(cfg):
        t = {way: time_operator(fn, inputs, way, args.repeats, clock) for way, fn in ways.items()}
        fused = f"{t['fused'] * 1e3:7.3f}" if "fused" in t else f"{'-':>7s}"
        fused_ratio = f"{t['fused'] / t['torch']:5.2f}x" if "fused" in t else f"{'':6s}"
        print(f"{change:16s} {what:52s} {t['contract'] * 1e3:9.3f} {fused} {t['torch'] * 1e3:7.3f} "
              f"{t['contract'] / t['torch']:8.2f}x {fused_ratio} {calls:6d} {t['contract'] * calls * 1e3:6.1f} / "
              f"{t['torch'] * calls * 1e3:4.1f}")

    states = step_states(cfg, tokens.vocab_size, tokens)
    for (name, mode), state in states.items():
        step_once(state, tokens, cfg, mode)                   # warm-up
    times = {kind: [] for kind in states}
    for _ in range(args.turns):
        for (name, mode), state in states.items():
            t0 = clock()
            step_once(state, tokens, cfg, mode)
            times[(name, mode)].append(clock() - t0)
    step = {kind: statistics.median(ts) for kind, ts in times.items()}
    base = step[("default", False)]
    tok = cfg.micro_batches * cfg.micro_batch_size * cfg.seq_len
    print(f"\nper training step ({tok} tokens: forward, backward, fold, clip, AdamW; ms, median of {args.turns})")
    print(f"{'model':16s} {'contract':>9s} {'mode off':>9s} {'contract / mode off':>20s} {'contract / default':>19s}")
    for name in ("default", *model_changes.CHANGES, model_changes.FOREIGN):
        on, off = step[(name, True)], step[(name, False)]
        print(f"{name:16s} {on * 1e3:9.1f} {off * 1e3:9.1f} {on / off:19.2f}x {on / base:18.2f}x")
    print("default: contract = its step under the mode (a process's first), mode off = every later step "
          "(fused RepOps kernels, the same bits); a changed model: mode off = its stock operators on torch's kernels")


if __name__ == "__main__":
    main()
