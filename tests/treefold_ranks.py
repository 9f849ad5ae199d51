"""One rank of TreeFold's all-reduce on generated leaves, counting the bytes it sends.

    torchrun --standalone --nproc_per_node=4 tests/treefold_ranks.py OUT_DIR N:NUMEL [N:NUMEL ...]

For each case, rank r folds its block of N leaves (`leaf(n, m, numel)`, the same on every
process), runs treefold.allreduce and appends a line to OUT_DIR/rank<r>.jsonl:
{"n", "numel", "rank", "sha256" of the result's bytes, "bytes_sent"}. The bytes are counted
from what the all-reduce hands to torch.distributed: the isend tensors of its batched
point-to-point exchange, and its all_gather input once for each of the R - 1 other ranks.
tests/test_treefold.py launches it and compares with a one-device fold.
"""
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import treefold  # noqa: E402


def leaf(n, m, numel):
    """Leaf m of an n-leaf case: [numel] float32 over many binades, so the tree shape shows in the bits."""
    g = torch.Generator().manual_seed(1000 * n + m)
    mant = torch.randn(numel, generator=g, dtype=torch.float32)
    return mant * torch.pow(2.0, torch.randint(-24, 25, (numel,), generator=g).to(torch.float32))


def main(out_dir, cases):
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    sent = [0]
    batch_isend_irecv, all_gather = dist.batch_isend_irecv, dist.all_gather

    def counting_batch(ops):
        sent[0] += sum(op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is dist.isend)
        return batch_isend_irecv(ops)

    def counting_gather(outputs, tensor, *args, **kwargs):
        sent[0] += tensor.numel() * tensor.element_size() * (world - 1)
        return all_gather(outputs, tensor, *args, **kwargs)

    dist.batch_isend_irecv, dist.all_gather = counting_batch, counting_gather
    with open(os.path.join(out_dir, f"rank{rank}.jsonl"), "w") as f:
        for case in cases:
            n, numel = map(int, case.split(":"))
            fold = treefold.Fold(n, world, rank)
            for m in fold.leaves:
                fold.push(leaf(n, m, numel))
            sent[0] = 0
            total = treefold.allreduce(fold)
            digest = hashlib.sha256(total.contiguous().numpy().tobytes()).hexdigest()
            f.write(json.dumps({"n": n, "numel": numel, "rank": rank, "sha256": digest,
                                "bytes_sent": sent[0]}) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
