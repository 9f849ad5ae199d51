"""Shared by the tests that train: the tiny model's flags and a generated corpus.

    from tiny import TINY, make_corpus
    corpus = make_corpus(tmp_dir, seed=7, lines=600)      # data dir with manifest.json
    subprocess.run([python, "train.py", f"--data_dir={corpus}", *TINY, ...])
"""
import random
from pathlib import Path

import dataprep

# seconds per step stay in the tens of milliseconds on 2 cores
TINY = ["--n_layer=2", "--d_model=32", "--n_head=2", "--d_hidden=64", "--seq_len=16",
        "--micro_batch_size=2", "--micro_batches=4"]
SEQ_LEN, MICRO_BATCH_SIZE, MICRO_BATCHES = 16, 2, 4   # as in TINY

WORDS = ("the king queen sword night day love death crown fair lord lady house war peace "
         "gold blood heart hand eye sea storm fool wise old young sweet bitter speak hear "
         "come go stay fly fall rise thou thee my our their never ever now").split()


def make_corpus(base, seed=7, lines=600, chunk_bytes=dataprep.CHUNK_BYTES):
    """Seeded random sentences under `base`, prepared with the byte tokenizer."""
    base = Path(base)
    rng = random.Random(seed)
    text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))).capitalize() + "."
                     for _ in range(lines))
    (base / "source.txt").write_text(text)
    _, out = dataprep.prepare(inputs=[str(base / "source.txt")], out_dir=str(base / "tokens"),
                              chunk_bytes=chunk_bytes)
    return Path(out)
