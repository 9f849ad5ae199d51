"""Bundles: `data.py --bundle --step N` cuts what `audit.py --step N` reads of a corpus, the audit
replays the step from the bundle alone, and every kind of tampering with a bundle is caught
(altered, truncated or swapped chunk, bad proof, forged root: exit 1; missing chunk: exit 2).

A tiny run is trained once per module on a corpus of 256-byte chunks, so that a bundle is a
small part of the corpus; the tests that tamper work on copies of its bundle.
"""
import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import hashchain
from data import TokenData
from prepare import make_mix
from tiny import MICRO_BATCH_SIZE, MICRO_BATCHES, SEQ_LEN, TINY, make_corpus, run_process

ROOT = Path(__file__).resolve().parent.parent
STEPS, CKPT_EVERY, STEP = 12, 4, 10    # auditing step 10 replays steps 9..10 from checkpoint 8
CHUNK = 256
SEED = 1337


def script(name, *args):
    return run_process([sys.executable, str(ROOT / name), *map(str, args)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)


def train(run, corpus, steps=STEPS):
    proc = script("train.py", f"--run_dir={run}", f"--data_dir={corpus}", *TINY,
                  f"--max_steps={steps}", f"--checkpoint_every={CKPT_EVERY}", "--eval_every=0",
                  "--sample_tokens=0")
    assert proc.returncode == 0, proc.stderr
    return run


def cut(run, out, step=STEP, *extra):
    return script("data.py", "--bundle", "--step", step, "--run_dir", run, "--data_dir", out,
                  *extra)


def audit(run, data_dir, step=STEP):
    return script("audit.py", "--step", step, "--run_dir", run, "--data_dir", data_dir)


def one_line(proc, code, stream, prefix):
    """Exit `code` and exactly one line on `stream`, starting with prefix; no traceback."""
    lines = getattr(proc, stream).strip().splitlines()
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith(prefix), (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), seed=7, lines=600, chunk_bytes=CHUNK)


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory):
    return train(tmp_path_factory.mktemp("run") / "run", corpus)


@pytest.fixture(scope="module")
def bundle(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundles") / "step10"
    proc = cut(run, out)
    assert proc.returncode == 0, proc.stderr
    assert f"bundle for steps {STEP - 1}..{STEP}" in proc.stdout
    return out


def chunk_files(bundle):
    return sorted(bundle.glob("train.*.chunk"))


# ----------------------------------------------------------------------------- round trip
def test_bundle_holds_what_the_step_reads(corpus, bundle):
    assert (bundle / "manifest.json").read_bytes() == (corpus / "manifest.json").read_bytes()
    assert not (bundle / "train.bin").exists()
    index = json.loads((bundle / "bundle.json").read_text())
    assert index["format"] == 1 and index["steps"] == [STEP - 1, STEP]
    n_chunks = -(-(corpus / "train.bin").stat().st_size // CHUNK)
    files = chunk_files(bundle)
    assert 0 < len(files) < n_chunks / 2 and len(files) == len(index["chunks"]["train"])
    full, sparse = TokenData(str(corpus), SEED), TokenData(str(bundle), SEED)
    raw = (corpus / "train.bin").read_bytes()
    for f in files:
        k = int(f.name.split(".")[1])
        assert f.read_bytes() == raw[k * CHUNK:(k + 1) * CHUNK]
    assert full.commitments() == sparse.commitments()
    for step in (STEP - 1, STEP):
        for m in range(MICRO_BATCHES):
            assert np.array_equal(sparse.window("train", step, m, MICRO_BATCH_SIZE, SEQ_LEN),
                                  full.window("train", step, m, MICRO_BATCH_SIZE, SEQ_LEN))


def test_audit_replays_the_step_from_the_bundle_alone(run, bundle, tmp_path):
    alone = shutil.copytree(run, tmp_path / "run")
    config = json.loads((alone / "config.json").read_text())
    config["data_dir"] = str(tmp_path / "no_corpus_here")
    (alone / "config.json").write_text(json.dumps(config))
    proc = audit(alone, bundle)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"MATCH: steps {STEP}..{STEP}" in proc.stdout


# ----------------------------------------------------------------------------- tampering
def _flip(path):
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))


def _forge_root(bundle, corpus):
    """Alter a chunk and re-derive, from the corpus's leaves, a root and proofs that fit it."""
    f = chunk_files(bundle)[0]
    _flip(f)
    k = int(f.name.split(".")[1])
    leaves = bytearray((corpus / "train.leaves").read_bytes())
    leaves[32 * k:32 * k + 32] = hashlib.sha256(f.read_bytes()).digest()
    index = json.loads((bundle / "bundle.json").read_text())
    index["chunks"]["train"] = {str(i): p for i, p in hashchain.merkle_proofs(
        bytes(leaves), [int(i) for i in index["chunks"]["train"]]).items()}
    (bundle / "bundle.json").write_text(json.dumps(index))
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["splits"]["train"]["chunks"]["root"] = hashchain.merkle_root(
        leaves[i:i + 32].hex() for i in range(0, len(leaves), 32))
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    assert TokenData(str(bundle), SEED)      # consistent in itself: only the run can tell


def _swap(bundle):
    a, b = chunk_files(bundle)[:2]
    ra, rb = a.read_bytes(), b.read_bytes()
    a.write_bytes(rb)
    b.write_bytes(ra)


def _bad_proof(bundle):
    index = json.loads((bundle / "bundle.json").read_text())
    proof = next(iter(index["chunks"]["train"].values()))
    proof[-1] = hashlib.sha256(proof[-1].encode()).hexdigest()
    (bundle / "bundle.json").write_text(json.dumps(index))


def _unlist(bundle):
    index = json.loads((bundle / "bundle.json").read_text())
    index["chunks"]["train"].pop(next(iter(index["chunks"]["train"])))
    (bundle / "bundle.json").write_text(json.dumps(index))


ROOT_MISMATCH = "does not match the manifest's chunk root"
def _directory(bundle):
    f = chunk_files(bundle)[0]
    f.unlink()
    f.mkdir()                      # a chunk path that is not a file


TAMPER = {
    "altered": (lambda b, c: _flip(chunk_files(b)[0]), 1, ROOT_MISMATCH),
    "truncated": (lambda b, c: chunk_files(b)[0].write_bytes(chunk_files(b)[0].read_bytes()[:-2]),
                  1, ROOT_MISMATCH),
    "swapped": (lambda b, c: _swap(b), 1, ROOT_MISMATCH),
    "bad_proof": (lambda b, c: _bad_proof(b), 1, ROOT_MISMATCH),
    # roots that fit the chunks but not the run: another corpus, the auditor's input (exit 2)
    "forged_root": (_forge_root, 2, "was trained on corpus"),
    "missing": (lambda b, c: chunk_files(b)[0].unlink(), 2, "is missing"),
    "unlisted": (lambda b, c: _unlist(b), 2, "does not hold chunk"),
    "directory": (lambda b, c: _directory(b), 2, "is not a regular file"),
    "garbled_index": (lambda b, c: (b / "bundle.json").write_text('{"format": 1, "steps": []}'),
                      2, "malformed bundle"),
}


@pytest.mark.parametrize("kind", TAMPER)
def test_tampered_bundle(run, corpus, bundle, tmp_path, kind):
    tamper, code, message = TAMPER[kind]
    copy = shutil.copytree(bundle, tmp_path / "bundle")
    tamper(copy, corpus)
    proc = audit(run, copy)
    line = one_line(proc, code, "stdout" if code == 1 else "stderr",
                    "MISMATCH: " if code == 1 else "audit.py: error: ")
    assert message in line, line


def test_bundle_serves_only_its_steps(run, bundle):
    # Step 6 replays steps 5..6 from checkpoint 4: windows the step-10 bundle was not cut for.
    line = one_line(audit(run, bundle, step=6), 2, "stderr", "audit.py: error: ")
    assert "does not hold chunk" in line and f"steps {STEP - 1}..{STEP}" in line


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("case", ["no_run", "step_0", "step_past_chain", "no_step", "exists",
                                  "from_bundle", "other_corpus"])
def test_bundle_cli_bad_input(run, bundle, tmp_path, case):
    out = tmp_path / "out"
    if case == "no_run":
        proc = cut(tmp_path / "nowhere", out)
    elif case == "step_0":
        proc = cut(run, out, 0)
    elif case == "step_past_chain":
        proc = cut(run, out, STEPS + 1)
    elif case == "no_step":
        proc = script("data.py", "--bundle", "--run_dir", run, "--data_dir", out)
    elif case == "exists":
        out.mkdir()
        proc = cut(run, out)
    elif case == "from_bundle":
        proc = cut(run, out, STEP, "--corpus", bundle)
    else:
        other = make_corpus(tmp_path, seed=8, lines=600, chunk_bytes=CHUNK)
        proc = cut(run, out, STEP, "--corpus", other)
    one_line(proc, 2, "stderr", "data.py: error: ")
    assert not out.exists() or not any(out.iterdir())
    assert not list(tmp_path.glob("out.tmp*"))


# ----------------------------------------------------------------------------- a mix
def test_mix_bundle_round_trip(tmp_path):
    mix = tmp_path / "mix"
    for name, seed in (("plays", 7), ("poems", 9)):
        (tmp_path / name).mkdir()
        shutil.copytree(make_corpus(tmp_path / name, seed=seed, lines=400, chunk_bytes=CHUNK),
                        mix / name)
    make_mix("plays=0.75,poems=0.25", str(mix))
    run = train(tmp_path / "run", mix, steps=6)
    out = tmp_path / "bundle"
    proc = cut(run, out, 6)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "plays", "poems"]
    assert chunk_files(out / "plays") and chunk_files(out / "poems")
    proc = audit(run, out, 6)
    assert proc.returncode == 0 and "MATCH: steps 6..6" in proc.stdout, proc.stdout + proc.stderr
    _flip(chunk_files(out / "poems")[0])
    assert "MISMATCH: bundle" in one_line(audit(run, out, 6), 1, "stdout", "MISMATCH: ")
