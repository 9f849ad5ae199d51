"""Hugging Face import, export and tokenizers, end to end, with no network.

A tiny random LlamaForCausalLM (grouped-query attention) and a byte-level BPE trained here with
`tokenizers` on the test corpus's text are saved as a model folder; the corpus is prepared with
that tokenizer (streaming = whole-text encoding); train.py fine-tunes it a few steps with
--init_from; audit.py replays every step (MATCH); export.py writes a folder that transformers
loads, whose logits equal ours within float32 tolerance and whose greedy tokens equal ours; and
importing the export gives back the exported parameters bit for bit.
"""
import json
import os
import random

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
import train  # noqa: E402
from config import Config, UsageError  # noqa: E402
from data import TokenData  # noqa: E402
from tokenizer import get_tokenizer  # noqa: E402
from tiny import ROOT, WORDS, audit, chain_records, script  # noqa: E402
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
                                     "files": {"tokenizer.json": tokenizer.file_hashes(folder)["tokenizer.json"]}}
    copy = get_tokenizer("hf", out, manifest["tokenizer"]["files"])     # the corpus's own copy
    assert copy.decode(copy.encode("Thou fair lord.")) == "Thou fair lord."
    with open(os.path.join(out, "tokenizer", "tokenizer.json"), "a") as f:
        f.write(" ")
    with pytest.raises(Exception, match="not the ones the manifest records"):
        get_tokenizer("hf", out, manifest["tokenizer"]["files"])


# ----------------------------------------------------------------------------- end to end
def test_finetune_audit_export_round_trip(source, tmp_path):
    base, folder = source
    _, corpus = prepare_with(base, folder)
    run, out = tmp_path / "run", tmp_path / "export"
    proc = script("train.py", f"--init_from={folder}", f"--run_dir={run}", f"--data_dir={corpus}", *RUN)
    assert proc.returncode == 0, proc.stderr
    genesis = chain_records(run)[0]
    assert genesis["init"]["format"] == "hf-llama"
    assert genesis["init"]["files"]["model.safetensors"] == hfllama._sha256(os.path.join(folder, "model.safetensors"))
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

    proc = script("export.py", "--run_dir", run, "--step", STEPS, "--to", "hf", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out)) == ["README.md", "config.json", "model.safetensors", "tokenizer.json"]
    card = (out / "README.md").read_text()
    assert chain_records(run)[STEPS]["state_hash"] in card and genesis["record_hash"] in card
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert type(exported).__name__ == "LlamaForCausalLM"
    ours, _ = sample.load_model(str(run), STEPS)
    with torch.no_grad():
        theirs = exported(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(logits_ours(ours, ids), theirs, rtol=1e-4, atol=1e-5)
    generated = exported.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False,
                                  attention_mask=torch.ones(1, len(ids), dtype=torch.int64))
    assert generated[0].tolist() == greedy_ours(ours, ids, 6)
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
    assert "params.lm_head" not in records[2]["tensor_hashes"]
    assert records[1]["tensor_hashes"]["params.tok_emb"] != records[0]["tensor_hashes"]["params.tok_emb"]
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
