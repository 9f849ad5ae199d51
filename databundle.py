"""Bundles: the part of a corpus that an audit of one step reads, each chunk with its proof.

    python data.py --bundle --step 201 --run_dir runs/default --data_dir data/bundle201
    python audit.py --step 201 --data_dir data/bundle201      # needs only the run and the bundle

write_bundle finds the steps that `audit.py --step N` replays (from the latest checkpoint
before N up to N), the token windows they read, and the chunks of train.bin that hold them. It
writes, for the corpus (for a mix: the mix's manifest, and for each source a subdirectory of
its name, like the mix itself):

    manifest.json            the corpus's manifest, byte for byte (its chunk roots inside)
    bundle.json              {"format": 1, "steps": [first, last],
                              "chunks": {"train": {"17": [sibling hashes, leaf level up], ...}}}
    train.000000017.chunk    the bytes of chunk 17 of train.bin

TokenData opens such a directory as a sparse corpus (open_split): it reads every chunk listed
and checks it against the manifest's chunk root with its proof before serving any token. An
altered, truncated or swapped chunk raises DataMismatch (an audit reports a mismatch, exit 1); a
listed chunk whose file is missing, or a window that needs a chunk the bundle does not list,
raises DataError (bad input, exit 2). The auditor checks the manifest itself against the run's
genesis record (TokenData.check_run), which holds the same chunk roots.
"""
import collections
import hashlib
import json
import os
import shutil

import hashchain
import rundir
from config import micro_batches_at
from data import BUNDLE, MANIFEST, DataError, DataMismatch, TokenData, chunk_file


def _write_corpus(corpus, out_dir, needed, steps):
    """Write the bundle of one corpus: its manifest, the needed chunks of train, bundle.json."""
    os.makedirs(out_dir, exist_ok=True)
    shutil.copyfile(os.path.join(corpus.path, MANIFEST), os.path.join(out_dir, MANIFEST))
    rec = corpus.manifest["splits"]["train"]
    chunk_bytes, size = rec["chunks"]["bytes"], rec["n_tokens"] * corpus.dtype.itemsize
    if corpus.leaves("train") != (rec["chunks"]["root"], -(-size // chunk_bytes)):
        raise DataError(f"{corpus.leaves_path('train')} does not match the manifest's chunk root: "
                        f"prepare the corpus again")
    with open(corpus.leaves_path("train"), "rb") as f:
        leaves = f.read()
    proofs = hashchain.merkle_proofs(leaves, sorted(needed))
    with open(os.path.join(corpus.path, rec["file"]), "rb") as f:
        for k in sorted(needed):
            f.seek(k * chunk_bytes)
            chunk = f.read(chunk_bytes)
            if hashlib.sha256(chunk).digest() != leaves[32 * k:32 * k + 32]:
                raise DataMismatch(f"chunk {k} of {f.name} does not match its hash in "
                                   f"{corpus.leaves_path('train')}: the corpus is corrupt")
            with open(os.path.join(out_dir, chunk_file("train", k)), "wb") as out:
                out.write(chunk)
    with open(os.path.join(out_dir, BUNDLE), "w") as f:
        json.dump({"format": 1, "steps": list(steps),
                   "chunks": {"train": {str(k): proofs[k] for k in sorted(needed)}}},
                  f, separators=(",", ":"))
    return len(needed), chunk_bytes, size


def write_bundle(out_dir, run_dir, step, corpus_dir=None):
    """Write the bundle for `audit.py --step step` of the run into out_dir (which must not exist);
    the corpus is the run's data_dir (its config.json) unless corpus_dir is given. Returns a
    one-line summary."""
    rundir.check_outside(run_dir, out_dir, "--data_dir")
    run = rundir.Run(run_dir)       # reads only: a bundle is cut from a run, never written into it
    run.chain.verify()
    if not 1 <= step < len(run.chain):
        raise DataError(f"step {step} is not in the chain (it holds steps 1..{len(run.chain) - 1})")
    genesis, cfg = run.genesis, run.cfg
    data = TokenData(corpus_dir or run.recorded_data_dir(), cfg.seed)
    if data.bundle:
        raise DataError(f"{data.path} is a bundle: cut bundles from the full corpus")
    data.check_run(genesis)
    # The audit replays from the latest checkpoint before `step`: it reads all those steps.
    first = max((s for s, _ in run.checkpoints() if s < step), default=0) + 1
    needed = collections.defaultdict(set)             # corpus -> chunk indices of train
    for s in range(first, step + 1):
        for m in range(micro_batches_at(cfg, s)):   # the step's phase
            for corpus, o in data.rows("train", s, m, cfg.micro_batch_size, cfg.seq_len):
                per = corpus.manifest["splits"]["train"]["chunks"]["bytes"] // corpus.dtype.itemsize
                needed[corpus].update(range(o // per, (o + cfg.seq_len) // per + 1))
    if os.path.exists(out_dir):
        raise DataError(f"{out_dir} already exists: choose another --data_dir")
    tmp = f"{os.path.normpath(out_dir)}.tmp{os.getpid()}"
    try:
        os.makedirs(tmp)
        parts = [(data, tmp)] if not data.sources else \
            [(src, os.path.join(tmp, name)) for name, src in data.sources.items()]
        if data.sources:
            shutil.copyfile(os.path.join(data.path, MANIFEST), os.path.join(tmp, MANIFEST))
        written = [_write_corpus(c, d, needed[c], (first, step)) for c, d in parts]
        os.rename(tmp, out_dir)        # whole or absent
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out_dir) for f in fs)
    return (f"{out_dir}: bundle for steps {first}..{step} of {run_dir}: "
            f"{sum(n for n, _, _ in written)} chunks of {written[0][1]} bytes, {total:,} bytes "
            f"in all (the train split{'s' if data.sources else ''}: "
            f"{sum(s for _, _, s in written):,} bytes)")
