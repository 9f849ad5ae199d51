"""What the unit commitments cost the trainer (docs/publishing.md, "Unit commitments: the trainer's side").

    python -m tools.unit_costs [--preset NAME] [--steps 20] [--data_dir data/shakespeare]

Trains the same steps three times in this process, from the same initial state: unit_commits
off, on (the pieces hashed in the step's thread, the CPU default) and on with --hash_async=on
(hashed beside the step, as on a GPU), alternating step by step (so a change in the machine's
load hits each alike), and prints per step the wall time and this process's CPU time of what
the trainer does
for a step: train_step, the state hash with its result_root (snapshot.hash_state) and the
record (train.step_record, which with units collects every digest and makes units_root), and
that both runs reach the same state hashes; then the hashing work alone (the digests of one
step's 2N - 1 pieces and N witnesses, on HASH_POOL's threads, as the trainer computes them), in
CPU time. The load average is printed before and after.
"""
import dataclasses
import os
import statistics
import time

from config import CommandLine, Config


def parser():
    ap = CommandLine("python -m tools.unit_costs", "What the unit commitments cost the trainer on this "
                     "machine: wall and CPU time per step, off, on and on overlapped.")
    ap.add_argument("--preset", default="", metavar="NAME", help="a config preset, e.g. open1b-mini "
                    "(default: the default model)")
    ap.add_argument("--data_dir", metavar="DIR", default=Config.data_dir, help="the corpus (default %(default)s)")
    ap.add_argument("--steps", type=int, default=20, metavar="N", help="steps of each run (default %(default)s)")
    ap.add_argument("--threads", type=int, default=0, metavar="N", help="torch threads (default 0: torch's)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import torch  # noqa: E402  (below the command line's first answer, above)

import config  # noqa: E402
import data  # noqa: E402
import receipts  # noqa: E402
import snapshot  # noqa: E402
import train  # noqa: E402
import units  # noqa: E402
from config import micro_batches_at  # noqa: E402


def one_step(state, corpus, cfg, salt):
    """The trainer's work for one step, without writing files; returns the state hash."""
    fields = train.train_step(state, corpus, cfg)
    hashed = snapshot.hash_state(state.step, state.tensors(), fields["grad_root"])
    record = train.step_record(state.step, hashed.root, corpus, cfg, fields, "0" * 64,
                               result_root=hashed.result_root, salt=salt)
    return record["state_hash"]


def main(argv=None):
    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    base = config.parse_config(([f"--preset={args.preset}"] if args.preset else []) + [f"--data_dir={args.data_dir}"])
    base = dataclasses.replace(base, offload=False, recompute=base.recompute)
    corpus = data.TokenData(base.data_dir, base.seed)
    base = config.resolve(base, corpus.vocab_size)
    salt = receipts.salt(bytes(32), 1)
    variants = {"off": {"unit_commits": False}, "on": {"unit_commits": True}, "on, overlapped": {"unit_commits": True, "hash_async": "on"}}
    runs = {v: (dataclasses.replace(base, **k), train.TrainState(base, corpus.vocab_size)) for v, k in variants.items()}
    wall, cpu, hashes = ({v: [] for v in variants} for _ in range(3))
    print(f"model: {args.preset or 'default'}, {runs['off'][1].n_params():,} parameters, "
          f"{base.micro_batches} micro-batches x {base.micro_batch_size * base.seq_len} tokens, "
          f"{torch.get_num_threads()} threads; load average before {os.getloadavg()[0]:.2f}")
    one_step(runs["on"][1], corpus, runs["on"][0], salt)          # warm-up (kernels, pools)
    runs["on"] = (runs["on"][0], train.TrainState(base, corpus.vocab_size))
    names = list(variants)
    for step in range(args.steps):
        for v in names[step % 3:] + names[:step % 3]:       # who goes first rotates too
            cfg, state = runs[v]
            w0, c0 = time.perf_counter(), time.process_time()
            hashes[v].append(one_step(state, corpus, cfg, salt))
            wall[v].append(time.perf_counter() - w0)
            cpu[v].append(time.process_time() - c0)
    assert hashes["off"] == hashes["on"] == hashes["on, overlapped"], "unit commitments changed a state hash"
    print(f"state hashes equal with and without unit commitments over {args.steps} steps")
    for what, times in (("wall", wall), ("CPU", cpu)):
        off = statistics.median(times["off"])
        line = f"{what:4s} s/step (median of {args.steps}): off {off:.4f}"
        for v in names[1:]:
            paired = statistics.median(b - a for a, b in zip(times["off"], times[v]))
            line += f"; {v} {statistics.median(times[v]):.4f}, paired overhead {paired:+.4f} s ({100 * paired / off:+.1f}%)"
        print(line)
    n, numel = micro_batches_at(base, args.steps), runs["on"][1].flat_numel()   # the last step's N
    piece, witness = torch.ones(numel), torch.ones(base.micro_batch_size * base.seq_len * base.d_model)
    c0 = time.process_time()
    for _ in range(args.steps):
        for name in units.names(n):
            units.digest(units.uid(1, name), piece)
        for m in range(n):
            units.digest(units.witness_uid(1, m), witness)
    work = (time.process_time() - c0) / args.steps
    print(f"the hashing work alone: {2 * n - 1} digests of {numel:,} floats and {n} of {witness.numel():,}: "
          f"{work * 1000:.1f} ms CPU per step ({100 * work / statistics.median(cpu['off']):.1f}% of the "
          f"step's CPU time without units)")
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
