"""What checked token reads and result_root cost (docs/auditing.md, "What checking costs";
docs/publishing.md, "What the commitments cost the trainer").

    python -m tools.audit_costs [--data_dir data/shakespeare] [--steps 200]

Prints CPU time (not wall time: the numbers hold on a shared machine) per default step for its
token reads through the checked reader (cached, and with no cache) and as raw slices of the
token file; that the default run's windows are identical either way; the whole-file verify()
an audit no longer does; one 64 KiB chunk's SHA-256; a tensor leaf and a keyed leaf over
256 MiB; and the default model's state hash with and without its result_root.
"""
import hashlib
import os
import time
from concurrent.futures import Future

from config import CommandLine, Config


def parser():
    ap = CommandLine("python -m tools.audit_costs", "What checked token reads and result_root cost on this "
                     "machine, in CPU time per default step.")
    ap.add_argument("--data_dir", metavar="DIR", default=Config.data_dir,
                    help="the corpus whose reads are timed (default %(default)s)")
    ap.add_argument("--steps", type=int, default=200, metavar="N",
                    help="how many default steps' token reads are timed (default %(default)s)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import numpy as np  # noqa: E402  (below the command line's first answer, above)
import torch

import config
import data
import hashchain
import snapshot
import train


def cpu_ms(fn, repeats):
    t0 = time.process_time()
    for i in range(repeats):
        fn(i)
    return (time.process_time() - t0) / repeats * 1000


def main(argv=None):
    args = parser().parse_args(argv)
    cfg = config.Config()
    B, T, N = cfg.micro_batch_size, cfg.seq_len, cfg.micro_batches
    corpus = data.TokenData(args.data_dir, cfg.seed)
    raw = np.memmap(os.path.join(args.data_dir, corpus.manifest["splits"]["train"]["file"]),
                    dtype=corpus.dtype, mode="r")

    def checked(s):                 # a step reads its windows twice: micro-batches, batch digest
        for _ in range(2):
            for m in range(N):
                corpus.window("train", s + 1, m, B, T)

    def unchecked(s):
        for _ in range(2):
            for m in range(N):
                rows = corpus.rows("train", s + 1, m, B, T)
                np.stack([raw[o:o + T + 1] for _, o in rows]).astype(np.int64)

    t0 = time.process_time()
    corpus.check_leaves()
    print(f"leaves files against the chunk roots: {(time.process_time() - t0) * 1000:.1f} ms CPU")
    for name, fn in (("raw slices, unchecked", unchecked), ("checked, cached", checked)) * 2:
        print(f"a default step's token reads ({2 * N * B} windows of {T + 1}), {name}: "
              f"{cpu_ms(fn, args.steps):.2f} ms CPU")
    cached, data.CACHED_CHUNKS = data.CACHED_CHUNKS, 0
    cold = data.TokenData(args.data_dir, cfg.seed)
    print(f"... checked, no cache: {cpu_ms(lambda s: [cold.window('train', s + 1, m, B, T) for m in range(N) for _ in range(2)], 100):.2f} ms CPU")
    data.CACHED_CHUNKS = cached

    same = all(np.array_equal(corpus.window("train", s, m, B, T).numpy(), np.stack(
        [raw[o:o + T + 1] for _, o in corpus.rows("train", s, m, B, T)]).astype(np.int64))
        for s in range(1, cfg.max_steps + 1) for m in range(N))
    print(f"the default run's {cfg.max_steps * N} micro-batch windows, checked vs raw: "
          f"{'identical' if same else 'DIFFERENT'}; manifest digest {corpus.digest}")

    t0, c0 = time.perf_counter(), time.process_time()
    corpus.verify()
    print(f"verify() of the corpus ({raw.nbytes / 1e6:.1f} MB train): {time.perf_counter() - t0:.3f} s wall, "
          f"{time.process_time() - c0:.3f} s CPU")
    chunk = os.urandom(65536)
    print(f"SHA-256 of a 64 KiB chunk: {cpu_ms(lambda _: hashlib.sha256(chunk).digest(), 2000) * 1000:.0f} us CPU")

    big, key = torch.randn(1 << 26), hashlib.sha256(b"key").digest()
    for label, k in (("tensor leaf", None), ("keyed leaf", key)):
        ms = cpu_ms(lambda _: hashchain.tensor_leaf("x", big, k), 3)
        print(f"{label}, one thread, 256 MiB: {ms / 1000:.3f} s CPU ({0.268 / (ms / 1000):.2f} GB/s)")
    state = train.TrainState(config.resolve(cfg, 256), 256)
    size = sum(t.numel() * t.element_size() for t in state.tensors().values())
    future = Future()
    future.set_result(key.hex())
    for label, kw in (("state hash", {}), ("state hash + result_root", {"key": future})) * 2:
        print(f"{label}, default model ({size / 1e6:.1f} MB): "
              f"{cpu_ms(lambda _: snapshot.hash_state(1, state.tensors(), **kw), 20):.1f} ms CPU")


if __name__ == "__main__":
    main()
