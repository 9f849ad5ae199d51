"""Hugging Face import, export and tokenizers, end to end, with no network.

A tiny random LlamaForCausalLM (grouped-query attention) and a byte-level BPE trained here with
`tokenizers` on the test corpus's text are saved as a model folder; the corpus is prepared with
that tokenizer (streaming = whole-text encoding); train.py fine-tunes it a few steps with
--init_from; audit.py replays every step (MATCH); export.py writes a folder that transformers
loads, whose logits equal ours within float32 tolerance and whose greedy tokens equal ours, also
past seq_len with transformers' default generation settings (no warning: max_position_embeddings
is the source's), with bos/eos set to the tokenizer's <|endoftext|>; importing the export gives
back the exported parameters bit for bit. A native run's export gets max(seq_len, 2048)
positions; a changed copy of the source's config.json is refused.
"""
import hashlib
import json
import os
import random
import shutil

import numpy as np
import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"      # before transformers is imported: never the network

import audit as audit_py  # noqa: E402
import data  # noqa: E402
import export  # noqa: E402
import hfllama  # noqa: E402
import tokenizer  # noqa: E402
import numpy_replay  # noqa: E402
import prepare  # noqa: E402
import sample  # noqa: E402
import repops  # noqa: E402
import rundir  # noqa: E402
import train  # noqa: E402
from config import Config, UsageError  # noqa: E402
from data import TokenData  # noqa: E402
from model import param_shapes  # noqa: E402
from tokenizer import get_tokenizer  # noqa: E402
from tiny import ROOT, WORDS, assert_one_line_error, audit, chain_records, script  # noqa: E402
from tools import hf_tiny  # noqa: E402

transformers = pytest.importorskip("transformers")   # pinned in requirements.txt: CI has it
tokenizers = pytest.importorskip("tokenizers")

STEPS = 4
SHAPE = dict(layers=2, width=32, heads=4, kv_heads=2, hidden=64, context=32)   # GQA 2:1
RUN = ["--seq_len=16", "--micro_batch_size=2", "--micro_batches=2", f"--max_steps={STEPS}",
       "--checkpoint_every=2", "--eval_every=0", "--sample_tokens=0", "--warmup_steps=2"]


def corpus_text(seed=5, lines=500):
    rng = random.Random(seed)
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))).capitalize() + "."
                     for _ in range(lines))


def save_random_llama(folder, vocab, tied, seed=0):
    return hf_tiny.save_random_llama(folder, vocab, tied, seed, **SHAPE)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """(folder, text): a random untied GQA Llama and its tokenizer, and the corpus text."""
    base = tmp_path_factory.mktemp("hf")
    text = corpus_text()
    folder = str(base / "model")
    vocab = hf_tiny.train_tokenizer(text, folder)
    save_random_llama(folder, vocab, tied=False)
    (base / "corpus.txt").write_text(text)
    return base, folder


def prepare_with(base, folder, name="tokens"):
    return prepare.prepare([str(base / "corpus.txt")], str(base / name), tokenizer=f"hf:{folder}")


def logits_ours(model, ids):
    with torch.no_grad():
        return model.logits(torch.tensor([ids]))[0]


def greedy_ours(model, ids, n):
    ids = list(ids)
    for _ in range(n):
        ids.append(int(torch.argmax(logits_ours(model, ids)[-1])))
    return ids


def bits(t):
    return t.contiguous().view(torch.int32)


# ----------------------------------------------------------------------------- tokenizers
@pytest.mark.parametrize("pre", ["bytelevel", "metaspace"])
def test_streaming_preparation_equals_whole_text_encoding(source, tmp_path, monkeypatch, pre):
    base, _ = source
    text = (base / "corpus.txt").read_text()
    folder = str(tmp_path / "tok")
    hf_tiny.train_tokenizer(text, folder, pre=pre)
    enc = get_tokenizer(f"hf:{folder}")
    assert tokenizer.streaming_safe(enc) == (pre == "bytelevel")
    monkeypatch.setattr(prepare, "BLOCK", 97)      # many cuts (for the ByteLevel tokenizer)
    manifest, out = prepare.prepare([str(base / "corpus.txt")], str(tmp_path / "c"),
                                     tokenizer=f"hf:{folder}", val_fraction=0.1)
    stored = np.concatenate([np.fromfile(os.path.join(out, f), "<u2") for f in ("train.bin", "val.bin")])
    assert stored.tolist() == enc.encode(text)
    assert manifest["tokenizer"] == {"name": "hf", "vocab_size": enc.n_vocab,
                                     "files": {"tokenizer.json": enc.files["tokenizer.json"]}}
    copy = get_tokenizer("hf", out, manifest["tokenizer"]["files"])     # the corpus's own copy
    assert copy.decode(copy.encode("Thou fair lord.")) == "Thou fair lord."
    with open(os.path.join(out, "tokenizer", "tokenizer.json"), "a") as f:
        f.write(" ")
    with pytest.raises(Exception, match="not the ones the manifest records"):
        get_tokenizer("hf", out, manifest["tokenizer"]["files"])


def test_a_huge_tokenizer_file_is_refused_by_its_size(source, tmp_path):
    """A 1.5 GB tokenizer.json (sparse: no disk) is refused before a byte of it is read, under a
    1 GiB address-space limit: one line naming the limit, nothing created."""
    base, folder = source
    huge = tmp_path / "tok"
    huge.mkdir()
    with open(huge / "tokenizer.json", "wb") as f:
        f.truncate(1500 * 10 ** 6)
    proc = script("data.py", "--input", base / "corpus.txt", "--data_dir", tmp_path / "c", "--tokenizer",
                  f"hf:{huge}", memory=1 << 30)
    assert_one_line_error(proc, "data.py")
    assert f"larger than {tokenizer.MAX_TOKENIZER_FILE} bytes" in proc.stderr and not (tmp_path / "c").exists()


# ----------------------------------------------------------------------------- end to end
def test_finetune_audit_export_round_trip(source, tmp_path, capfd):
    base, folder = source
    _, corpus = prepare_with(base, folder)
    run, out = tmp_path / "run", tmp_path / "export"
    proc = script("train.py", f"--init_from={folder}", f"--run_dir={run}", f"--data_dir={corpus}", *RUN)
    assert proc.returncode == 0, proc.stderr
    genesis = chain_records(run)[0]
    assert genesis["init"]["format"] == "hf-llama"
    with open(os.path.join(folder, "model.safetensors"), "rb") as f:
        assert genesis["init"]["files"]["model.safetensors"] == hashlib.sha256(f.read()).hexdigest()
    assert genesis["config"]["n_kv_head"] == 2 and genesis["config"]["vocab_size"] == HF_vocab(folder)

    # the initial state is the source's weights, mapped: our step-0 logits are transformers'
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = get_tokenizer(f"hf:{folder}").encode("The king and the queen speak")[:10]   # + 6 <= seq_len
    start, _ = sample.load_model(str(run), 0)
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(logits_ours(start, ids), ref, rtol=1e-4, atol=1e-5)

    os.rename(folder, folder + ".away")     # the auditor has no source folder: checkpoint 0 is enough
    try:
        proc = audit(run, "--all")
    finally:
        os.rename(folder + ".away", folder)
    assert proc.returncode == 0 and "MATCH" in proc.stdout, proc.stdout + proc.stderr
    # the source check: the genesis parameters are the folder's weights mapped, bit for bit
    params = {n: p.detach().clone() for n, p in start.named_tensors().items()}
    assert hfllama.source_difference(folder, genesis["init"], params, start.cfg) is None
    params["layers.1.wqkv"][3, 0] = torch.nextafter(params["layers.1.wqkv"][3, 0], torch.tensor(1.0))
    assert "layers.1.wqkv differs" in hfllama.source_difference(folder, genesis["init"], params, start.cfg)

    assert (run / hfllama.SOURCE_CONFIG).read_bytes() == (base / "model" / "config.json").read_bytes()
    proc = script("export.py", "--run_dir", run, "--step", STEPS, "--to", "hf", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out)) == ["README.md", "config.json", "model.safetensors", "tokenizer.json"]
    card = (out / "README.md").read_text()
    assert chain_records(run)[STEPS]["state_hash"] in card and genesis["record_hash"] in card
    assert "its checkpoint 0" in card and "No training step was replayed" in card    # what was checked
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert type(exported).__name__ == "LlamaForCausalLM"
    ours, _ = sample.load_model(str(run), STEPS)
    with torch.no_grad():
        theirs = exported(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(logits_ours(ours, ids), theirs, rtol=1e-4, atol=1e-5)
    # the source's max_position_embeddings (32, not seq_len 16) and <|endoftext|> as bos and eos
    hf_cfg = json.loads((out / "config.json").read_text())
    endoftext = get_tokenizer(f"hf:{folder}").tok.token_to_id("<|endoftext|>")
    assert (hf_cfg["max_position_embeddings"], hf_cfg["bos_token_id"], hf_cfg["eos_token_id"]) == (32, endoftext, endoftext)
    assert "positions 0..15" in card and "32: the imported source's config.json" in card
    # transformers' default settings (20 new tokens) go past seq_len without a warning, and our
    # logits there (RoPE extended, as transformers computes it) give the same greedy tokens
    generated = exported.generate(torch.tensor([ids]), do_sample=False, eos_token_id=None,
                                  attention_mask=torch.ones(1, len(ids), dtype=torch.int64))
    assert len(generated[0]) == len(ids) + 20 > 16
    assert "maximum length" not in capfd.readouterr().err
    assert generated[0].tolist() == greedy_ours(ours, ids, 20)
    fast = transformers.AutoTokenizer.from_pretrained(str(out))
    assert fast.encode("The king", add_special_tokens=False) == get_tokenizer(f"hf:{folder}").encode("The king")

    # round trip: importing the export gives the exported parameters bit for bit
    cfg = hfllama.configure(Config(init_from=str(out)), set())
    state = train.TrainState(cfg, cfg.vocab_size)
    hfllama.load_into(state, str(out))
    for name, p in ours.named_tensors().items():
        assert torch.equal(bits(state.params[name]), bits(p)), name


def HF_vocab(folder):
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)["vocab_size"]


def test_tied_embeddings_import_train_export(source, tmp_path, capsys):
    """A tied model (one tensor tok_emb, no lm_head) trains, audits and exports as tied (the
    programs' main functions, in this process: the end-to-end test runs them as programs)."""
    base, folder = source
    tied = tmp_path / "tied"
    tied.mkdir()
    (tied / "tokenizer.json").write_bytes((base / "model" / "tokenizer.json").read_bytes())
    save_random_llama(str(tied), HF_vocab(folder), tied=True, seed=1)
    _, corpus = prepare_with(base, folder, "tokens_tied")
    run, out = tmp_path / "run", tmp_path / "export"
    assert train.main([f"--init_from={tied}", f"--run_dir={run}", f"--data_dir={corpus}", *RUN[:3],
                       "--max_steps=2", *RUN[4:]]) == 0
    records = chain_records(run)
    assert records[0]["config"]["tie_embeddings"] is True
    leaves = {s: rundir.load_checkpoint(rundir.checkpoint_path(run / "checkpoints", s))[1]["tensor_hashes"] for s in (0, 2)}
    assert "params.lm_head" not in leaves[2]
    assert leaves[2]["params.tok_emb"] != leaves[0]["params.tok_emb"]
    # a resume needs the same source: other weights of the same shape are refused
    other = tmp_path / "other"
    save_random_llama(str(other), HF_vocab(folder), tied=True, seed=2)
    args = [f"--run_dir={run}", f"--data_dir={corpus}", *RUN[:3], "--max_steps=2", *RUN[4:]]
    assert train.main([f"--init_from={tied}", *args]) == 0
    assert train.main([f"--init_from={other}", *args]) == 2
    assert "initialized from other weights" in capsys.readouterr().err
    assert audit_py.main(["--run_dir", str(run), "--all"]) == 0
    assert "its source files were not checked" in capsys.readouterr().out
    # with the source folder, the audit also checks that it is the run's source
    assert audit_py.main(["--run_dir", str(run), "--step", "1", "--init_from", str(tied)]) == 0
    assert audit_py.main(["--run_dir", str(run), "--step", "1", "--init_from", str(other)]) == 1
    assert "MISMATCH at step 0: the source folder" in capsys.readouterr().out
    # the NumPy replay written from SPEC.md (§17 the imported state, §18 the tied gradient) agrees
    said = []
    assert numpy_replay.replay(str(run), str(corpus), 2, str(ROOT), said.append), said
    assert export.main(["--run_dir", str(run), "--step", "2", "--to", "hf", "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    assert export.main(["--run_dir", str(run), "--step", "2", "--to", "hf", "--out", str(tmp_path / "again")]) == 0
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == \
        {f: (tmp_path / "again" / f).read_bytes() for f in os.listdir(tmp_path / "again")}   # byte for byte
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    ours, _ = sample.load_model(str(run), 2)
    ids = [5, 17, 33, 2, 90]
    with torch.no_grad():
        theirs = exported(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(logits_ours(ours, ids), theirs, rtol=1e-4, atol=1e-5)


def test_tie_sums_the_two_gradients_in_one_repops_add():
    w = torch.nn.Parameter(torch.randn(7, 4))
    x, idx, targets = torch.randn(5, 4), torch.tensor([[1, 3, 3, 6]]), torch.tensor([0, 2, 2, 5, 6])

    def loss(emb, head):
        return repops.add(repops.cross_entropy(repops.linear(x, head), targets),
                          repops.cross_entropy(repops.embedding(emb, idx).view(4, 4).contiguous(), idx.view(4) % 4))
    loss(*repops.tie(w)).backward()
    a, b = torch.nn.Parameter(w.detach().clone()), torch.nn.Parameter(w.detach().clone())
    loss(a, b).backward()
    assert torch.equal(bits(w.grad), bits(repops.ops.add(a.grad, b.grad)))


# ----------------------------------------------------------------------------- refusals
def one_line_error(capsys, code, prog):
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"{prog}: error:"), err
    return err[0]


def test_refusals_are_one_line(source, tmp_path, capsys):
    base, folder = source
    _, corpus = prepare_with(base, folder, "tokens_refusals")
    common = [f"--init_from={folder}", f"--data_dir={corpus}", *RUN]
    line = one_line_error(capsys, train.main([*common, "--n_layer=3", f"--run_dir={tmp_path / 'a'}"]), "train.py")
    assert "--n_layer=3 contradicts" in line and not (tmp_path / "a").exists()
    # the HF config's own value may be repeated; the rest is refused
    assert train.main([*common, "--n_layer=2", f"--run_dir={tmp_path / 'ok'}", "--max_steps=1"]) == 0
    hf = json.loads((base / "model" / "config.json").read_text())
    for key, value, what in (("attention_bias", True, "attention_bias"),
                             ("rope_parameters", {"rope_type": "llama3", "rope_theta": 5e5}, "llama3"),
                             ("model_type", "qwen2", "qwen2"), ("head_dim", 4, "head_dim"),
                             ("rms_norm_eps", "tiny", "malformed"), ("rope_parameters", [1], "malformed")):
        with pytest.raises(UsageError, match=what):
            hfllama.model_keys({**hf, key: value}, "x")
    assert hfllama.model_keys(hf, "x")["n_layer"] == 2
    with pytest.raises(UsageError, match="mlp.gate_proj.weight would be|has no place|missing"):
        hfllama.from_hf({"model.embed_tokens.weight": torch.zeros(3)}, Config(), {}, "x")
    params = {n: torch.zeros(s) for n, s in param_shapes(Config(vocab_size=8, n_kv_head=4)).items()}
    assert len(hfllama.to_hf(params, Config(vocab_size=8, n_kv_head=4))) == len(params) + 3 * 4   # q, k, v and gate, up split
    with pytest.raises(UsageError, match="parameter emb_norm has no place"):     # nothing is dropped
        hfllama.to_hf({**params, "emb_norm": torch.ones(128)}, Config(vocab_size=8, n_kv_head=4))

    line = one_line_error(capsys, data.main(["--input", str(base / "corpus.txt"), "--data_dir",
                                             str(tmp_path / "c"), "--tokenizer", f"hf:{tmp_path}"]), "data.py")
    assert "no tokenizer.json there" in line and not (tmp_path / "c").exists()
    run = tmp_path / "ok"
    one_line_error(capsys, export.main(["--run_dir", str(run), "--to", "hf", "--out", str(run / "inside")]), "export.py")
    drop = tmp_path / "drop"
    assert train.main([*common, f"--run_dir={drop}", "--max_steps=1", "--dropout=0.1"]) == 0
    capsys.readouterr()
    line = one_line_error(capsys, export.main(["--run_dir", str(drop), "--to", "hf", "--out", str(tmp_path / "out")]), "export.py")
    assert "dropout" in line and not (tmp_path / "out").exists()
    qk = tmp_path / "qk"
    assert train.main([*common, f"--run_dir={qk}", "--max_steps=1", "--qk_norm=true"]) == 0
    capsys.readouterr()
    line = one_line_error(capsys, export.main(["--run_dir", str(qk), "--to", "hf", "--out", str(tmp_path / "out")]), "export.py")
    assert "qk_norm" in line and not (tmp_path / "out").exists()
    # a changed copy of the source's config.json is refused; without one the card says so
    ok = tmp_path / "ok"
    config = ok / hfllama.SOURCE_CONFIG
    original = config.read_bytes()
    config.write_bytes(original.replace(b'"max_position_embeddings": 32', b'"max_position_embeddings": 4096'))
    line = one_line_error(capsys, export.main(["--run_dir", str(ok), "--to", "hf", "--out", str(tmp_path / "out")]),
                          "export.py")
    assert "source_config.json is not the source's config.json" in line and not (tmp_path / "out").exists()
    config.unlink()
    assert export.main(["--run_dir", str(ok), "--to", "hf", "--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["max_position_embeddings"] == 2048
    assert "keeps no source_config.json" in (tmp_path / "out" / "README.md").read_text()


def test_a_native_run_exports_2048_positions(reference, tmp_path, capfd):
    """A run trained here (byte tokenizer, seq_len 16): max_position_embeddings max(16, 2048), no
    <|endoftext|> to name, and transformers generates past seq_len without a warning. The byte
    tokenizer comes along in Hugging Face form (--to hf is the default): AutoTokenizer loads it,
    and it encodes and decodes any text as the corpus's tokenizer does (token = UTF-8 byte)."""
    out = tmp_path / "export"
    assert export.main(["--run_dir", str(reference), "--out", str(out)]) == 0
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    text = "The king, the Queen\n  and é ü 日本 \t!"
    assert hf_tok.encode(text, add_special_tokens=False) == get_tokenizer("bytes").encode(text) == list(text.encode())
    assert hf_tok.decode(list(text.encode())) == text
    hf_cfg = json.loads((out / "config.json").read_text())
    assert (hf_cfg["max_position_embeddings"], hf_cfg["bos_token_id"], hf_cfg["eos_token_id"]) == (2048, None, None)
    card = (out / "README.md").read_text()
    assert "max(seq_len 16, transformers' default 2048)" in card and "none (the tokenizer has no <|endoftext|>)" in card
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    ids = [84, 104, 101, 32, 107, 105, 110, 103]           # "The king"
    generated = exported.generate(torch.tensor([ids]), do_sample=False,
                                  attention_mask=torch.ones(1, len(ids), dtype=torch.int64))
    assert len(generated[0]) == len(ids) + 20 and "maximum length" not in capfd.readouterr().err
    ours, _ = sample.load_model(str(reference), None)
    assert generated[0].tolist() == greedy_ours(ours, ids, 20)


# ----------------------------------------------------------------------------- hostile source folders
HOSTILE = {
    "config.json a link to /dev/zero": lambda d: os.symlink("/dev/zero", d / "config.json"),
    "model.safetensors a FIFO": lambda d: os.mkfifo(d / "model.safetensors"),
    "config.json of 1 TiB (sparse)": lambda d: os.truncate(d / "config.json", 1 << 40),
    "model.safetensors of 1 TiB (sparse)": lambda d: os.truncate(d / "model.safetensors", 1 << 40),
    "an index naming 10^5 tensors": lambda d: (d / hfllama.INDEX).write_text(json.dumps(
        {"weight_map": {f"t{i}": "model.safetensors" for i in range(10 ** 5)}})),
    "a shard that is a directory": lambda d: ((d / hfllama.INDEX).write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "sub"}})), (d / "sub").mkdir()),
}


@pytest.fixture(scope="module")
def imported_run(source, tmp_path_factory):
    """A 1-step run imported from the source folder."""
    base, folder = source
    _, corpus = prepare_with(base, folder, "tokens_hostile")
    run = tmp_path_factory.mktemp("imported") / "run"
    assert train.main([f"--init_from={folder}", f"--run_dir={run}", f"--data_dir={corpus}", *RUN[:3],
                       "--max_steps=1", *RUN[4:]]) == 0
    return run, corpus


@pytest.mark.parametrize("what", HOSTILE)
def test_source_files_are_bounded_before_they_are_read(source, imported_run, tmp_path, what):
    """A source folder whose file is a device, a FIFO, far larger than the model can need, or an
    index naming more tensors than the model has: the audit's source check and the import
    refuse it with one line, at once (no hang, nothing hashed to the end), and create nothing."""
    _, folder = source
    run, corpus = imported_run
    hostile = tmp_path / "hostile"
    shutil.copytree(folder, hostile)
    for name in ("config.json", "model.safetensors"):
        if f"{name} a" in what:         # replaced by a link or a FIFO
            os.unlink(hostile / name)
    HOSTILE[what](hostile)
    proc = script("audit.py", "--run_dir", run, "--step", "1", "--init_from", hostile, timeout=60)
    assert_one_line_error(proc, "audit.py")
    proc = script("train.py", f"--init_from={hostile}", f"--run_dir={tmp_path / 'new'}", f"--data_dir={corpus}",
                  *RUN, timeout=60)
    assert_one_line_error(proc, "train.py")
    assert not (tmp_path / "new").exists()


# ----------------------------------------------------------------------------- hostile weights and configs
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_an_imported_weight_that_is_not_finite_is_refused(source, imported_run, tmp_path, capsys, bad):
    """A NaN or an infinity in any imported weight: refused at import, one line naming the
    tensor, nothing created (it would be the genesis, and the first step would stop on it)."""
    from safetensors.torch import load_file, save_file
    _, folder = source
    _, corpus = imported_run
    hostile = tmp_path / "hostile"
    shutil.copytree(folder, hostile)
    tensors = load_file(hostile / "model.safetensors")
    tensors["model.layers.1.mlp.down_proj.weight"][3, 5] = bad
    save_file(tensors, hostile / "model.safetensors", metadata={"format": "pt"})
    code = train.main([f"--init_from={hostile}", f"--run_dir={tmp_path / 'new'}", f"--data_dir={corpus}", *RUN])
    line = one_line_error(capsys, code, "train.py")
    assert "tensor model.layers.1.mlp.down_proj.weight holds a NaN or an infinity" in line, line
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("key, value, ours", [("num_hidden_layers", 10 ** 9, "n_layer"),
                                              ("vocab_size", 1 << 40, "vocab_size"),
                                              ("intermediate_size", 10 ** 12, "d_hidden")])
def test_an_imported_config_beyond_the_limits_is_refused_before_anything_is_read(source, imported_run, tmp_path,
                                                                                 key, value, ours):
    """config.json declaring a model no machine holds: refused by the config's limits
    (config.LIMITS) before a weight is read or anything allocated, one line, under an 8 GiB
    address-space limit."""
    _, folder = source
    _, corpus = imported_run
    hostile = tmp_path / "hostile"
    shutil.copytree(folder, hostile)
    hf = json.loads((hostile / "config.json").read_text())
    (hostile / "config.json").write_text(json.dumps({**hf, key: value}))
    proc = script("train.py", f"--init_from={hostile}", f"--run_dir={tmp_path / 'new'}", f"--data_dir={corpus}",
                  *RUN, memory=8 << 30)
    assert_one_line_error(proc, "train.py")
    assert f"--{ours}={value} is out of range" in proc.stderr and "config.LIMITS" in proc.stderr, proc.stderr
    assert not (tmp_path / "new").exists()
