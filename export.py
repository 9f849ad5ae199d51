"""Export a verified checkpoint as a Hugging Face LlamaForCausalLM folder.

    python export.py --run_dir runs/default --step 300 --out out/default-300
    python export.py --run_dir runs/ft --out out/ft     # the latest checkpoint in the chain

    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained("out/default-300")   # a LlamaForCausalLM

OUT gets config.json, model.safetensors (the parameters only, never the Adam moments, with HF
names: hfllama.py's mapping, fused matrices split, RoPE rows permuted), the tokenizer files (the
corpus's copy of a Hugging Face tokenizer; the byte tokenizer in Hugging Face form,
tokenizer.bytes_in_hf_form; none for a tiktoken encoding, which has no Hugging Face form here:
GPT-2's own on the Hub, AutoTokenizer.from_pretrained("gpt2"), gives the same ids as "gpt2"),
and README.md, a model card naming the run, step, state hash, genesis record hash and
code digest, what was checked, how to audit it, and the context it was trained on. config.json's
max_position_embeddings is the imported source's for an imported run, else max(seq_len, 2048)
(hfllama.max_positions says why); bos_token_id and eos_token_id are the tokenizer's
<|endoftext|> where it has one (GPT-2's encodings, most BPEs), else null (the byte tokenizer).
Export vouches only for what an audit would:
before writing, it verifies the chain's links up to the step and the checkpoint against its
record (as sample.py does), and runs the audit's genesis check (audit.Audit.check_genesis: the
genesis record against one recomputed from its config, this code and the corpus's manifest, so
it needs the corpus or a bundle of it, --data_dir), then loads the checkpoint into the state of
the genesis config's model (names, shapes, dtypes). Anything the audit would report at genesis
is refused with one line (exit 2); no step is replayed (the card says so). Export is a reader:
it writes nothing in the run directory, and OUT (new, or an empty directory) must lie outside
it; the folder appears complete or not at all (written beside it, then renamed).

What LlamaForCausalLM cannot represent is refused with one line (exit 2): --quant=int8 (W8A8
quantizes the activations too, so exported dequantized weights would not give the run's
logits), residual dropout (no HF Llama field; the exported model would train differently),
a sliding attention window, QK-norm and the embedding norm (the OPEN-1B recipe's options).
"""
import json
import os
import shutil
import sys
import tempfile

from config import CommandLine, UsageError, out_of_memory

ENDOFTEXT = "<|endoftext|>"


def parser():
    ap = CommandLine("export.py", "Export a verified checkpoint of a run as a Hugging Face LlamaForCausalLM folder.")
    ap.add_argument("--run_dir", metavar="DIR", default="runs/default", help="the run (only read) (default %(default)s)")
    ap.add_argument("--step", type=int, metavar="N", help="the checkpoint's step (default: the latest in the chain)")
    ap.add_argument("--to", default="hf", choices=("hf",), help="the format: hf, a Hugging Face Llama, the only one "
                    "(default %(default)s)")
    ap.add_argument("--out", metavar="DIR", required=True,
                    help="the folder to write: new or empty, outside the run (required)")
    ap.add_argument("--data_dir", metavar="DIR",
                    help="the run's corpus, or a bundle of it: its manifest, for the genesis check, and its "
                    "tokenizer files (default: the data_dir the run's config.json names)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import hashchain  # noqa: E402  (below the command line's first answer, above)
import hfllama
from audit import Audit
import repops
import rundir
import signing
from data import DataError
from tokenizer import TokenizerError, bytes_in_hf_form, get_tokenizer
from train import code_digest


def publisher_said(publisher):
    """The model card's line on the key that signed the run: the public key the genesis record names
    (the audit's genesis check has refused one that is not a key), with its fingerprint."""
    if publisher is None:
        return "none: the genesis record names no publisher key, so the run's anchors are unsigned"
    return f"`{publisher}` ({signing.fingerprint(publisher)}), named by the genesis record"


CARD = """# {name}: step {step} of an auditable RepOps run

Exported by `python export.py --run_dir {run} --step {step} --out OUT` from a checkpoint that verified
against the run's hash chain.

| | |
|---|---|
| run | `{run}` |
| step | {step} |
| state hash (step {step}) | `{state_hash}` |
| genesis record hash | `{genesis_hash}` |
| publisher key (signs the run's anchors) | {publisher} |
| code digest | `{code_digest}` |
| model | LlamaForCausalLM, {n_layer} layers, width {d_model}, {n_head} heads ({n_kv_head} key/value), vocab {vocab_size}, tied embeddings: {tie} |
| tokenizer | {tokenizer} |
| bos / eos token id | {special} |

## Context

The model was trained on windows of {seq_len} tokens at positions 0..{last}.
`max_position_embeddings` is {positions}: {positions_why}; it is not a trained length.
transformers' `generate` gives each token its absolute position, so past {seq_len} tokens (prompt
and generated) the model sees positions it never trained on. The run's own sampler
(`python sample.py --run_dir {run}`) keeps the last {seq_len} tokens at positions 0..{last}
instead (a sliding context); the two agree while prompt and generated tokens fit in {seq_len}.

## What was checked, and what was not

Before writing this folder, export.py verified the chain's links from the genesis record to step
{step}; the genesis record against one recomputed from its config, this code (the code digest
above) and the corpus's manifest `{data_manifest}`{imported}; and this checkpoint's tensors against
the step-{step} record, as the state of the genesis config's model. No training step was replayed:
that steps 1..{step} produce this state is what `audit.py --all` checks (below).

## How to audit it

With the run directory and the RepOps code at the code digest above:

    python audit.py --run_dir {run} --all          # every step replays to its record: MATCH
    python export.py --run_dir {run} --step {step} --out OUT2   # the same export, byte for byte

The parameters in model.safetensors are the checkpoint's, moved and never recomputed
(hfllama.py), so importing this folder (`train.py --init_from=THIS_FOLDER`) gives back the
tensors whose hashes the step-{step} record holds.
"""


def endoftext_id(enc):
    """The id of <|endoftext|> in the tokenizer `enc`, or None where it has no such token."""
    if hasattr(enc, "tok"):                       # a Hugging Face tokenizer (tokenizer.HFTokenizer)
        return enc.tok.token_to_id(ENDOFTEXT)
    try:
        return enc.encode_single_token(ENDOFTEXT)   # a tiktoken encoding
    except KeyError:
        return None


def export(run_dir, step, out, data_dir=None):
    """Write the HF folder of `run_dir`'s checkpoint at `step` (None: the latest) to `out`."""
    from safetensors.torch import save_file
    rundir.check_outside(run_dir, out, "OUT")
    if os.path.lexists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise UsageError(f"OUT {out} exists and is not an empty directory")
    # the run, its contract and genesis config, the corpus's manifest: as an audit opens them
    audit = Audit(run_dir, data_dir)
    run, cfg = audit.run, audit.cfg
    if cfg.quant != "none":
        raise UsageError("a --quant=int8 run cannot be represented: its linears quantize the "
                         "activations too (W8A8), which LlamaForCausalLM cannot express")
    if cfg.dropout:
        raise UsageError(f"a run with --dropout={cfg.dropout} cannot be represented: the HF Llama "
                         "has no residual dropout")
    extra = [k for k, on in (("attn_window", cfg.attn_window > 0), ("qk_norm", cfg.qk_norm),
                             ("emb_norm", cfg.emb_norm)) if on]
    if extra:
        raise UsageError(f"a run with --{extra[0]}={getattr(cfg, extra[0])} cannot be represented: "
                         "LlamaForCausalLM has no sliding window, QK-norm or embedding norm")
    step, tensors = run.checkpoint_for_reader(step)     # the chain's links to it, it against its record
    # what the audit checks at genesis (an imported run: from its checkpoint 0), or a refusal
    state = audit.check_genesis(audit.checkpoints().get(0))
    if audit.findings:
        found, message = min(audit.findings, key=lambda f: f[0])
        raise UsageError(f"the audit finds MISMATCH at step {found}: {message}; export vouches only for "
                         f"what an audit would (python audit.py --run_dir {run_dir} --step 1)")
    state.load(tensors)                         # StateMismatch unless the genesis config's state
    del tensors
    params = {n: p.detach() for n, p in state.params.items()}
    tok = run.genesis.get("tokenizer") or {}
    enc, files = None, {}
    if tok.get("name") == "hf":   # the corpus's copy, checked against the manifest's SHA-256s
        enc = get_tokenizer("hf", audit.data.path, tok.get("files"))
        files = enc.contents
    elif isinstance(tok.get("name"), str):
        try:
            enc = get_tokenizer(tok["name"])
        except TokenizerError:    # a tiktoken encoding not downloaded on this machine
            enc = None
    if tok.get("name") == "bytes":
        files = bytes_in_hf_form()
    special = endoftext_id(enc) if enc is not None else None
    special = special if special is not None and special < cfg.vocab_size else None
    special_said = (f"{special} ({ENDOFTEXT})" if special is not None else f"none (the tokenizer has no {ENDOFTEXT})"
                    if enc is not None else f"not set: the tokenizer {tok.get('name')!r} cannot be loaded here")
    positions, positions_why = hfllama.max_positions(run.dir, run.genesis, cfg)
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".export-", dir=parent)
    try:
        save_file(hfllama.to_hf(params, cfg), os.path.join(tmp, "model.safetensors"),
                  metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(hfllama.hf_config(cfg, positions, special, special), f, indent=2)
            f.write("\n")
        for name, raw in sorted(files.items()):
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(raw)
        with open(os.path.join(tmp, "README.md"), "w") as f:
            f.write(CARD.format(
                name=os.path.basename(os.path.normpath(run_dir)), run=run_dir, step=step,
                state_hash=run.chain.records[step]["state_hash"],
                genesis_hash=run.genesis["record_hash"], code_digest=code_digest(),
                publisher=publisher_said(run.genesis.get("publisher")),
                n_layer=cfg.n_layer, d_model=cfg.d_model, n_head=cfg.n_head,
                n_kv_head=cfg.n_kv_head, vocab_size=cfg.vocab_size, tie=cfg.tie_embeddings,
                data_manifest=run.genesis.get("data_manifest"),
                imported=" and, the run being imported, its checkpoint 0 (the source folder itself was not "
                         "checked: `audit.py --step 1 --init_from DIR` checks it)" if "init" in run.genesis else "",
                tokenizer=("the corpus's byte tokenizer (token = byte), in Hugging Face form: "
                           "`AutoTokenizer.from_pretrained(OUT)` loads it" if tok.get("name") == "bytes" else
                           "files included (Hugging Face tokenizers)" if files else
                           f"{tok.get('name')!r}, a tiktoken encoding, which has no Hugging Face form here: none "
                           "included"),
                special=special_said, seq_len=cfg.seq_len, last=cfg.seq_len - 1,
                positions=positions, positions_why=positions_why))
        if os.path.isdir(out):
            os.rmdir(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return step


def main(argv=None):
    try:
        args = parser().parse_args(argv)
        step = export(args.run_dir, args.step, args.out, args.data_dir)
    except (UsageError, DataError, TokenizerError, hashchain.HashChainError, repops.RepOpsBuildError) as e:
        print(f"export.py: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"export.py: error: cannot write {args.out}: {e}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as e:
        if not (line := out_of_memory(e, "export this run")):
            raise
        print(f"export.py: error: {line}", file=sys.stderr)
        return 2
    print(f"exported step {step} of {args.run_dir} to {args.out} (LlamaForCausalLM)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
