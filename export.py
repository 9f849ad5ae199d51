"""Export a verified checkpoint as a Hugging Face LlamaForCausalLM folder.

    python export.py --run_dir runs/default --step 300 --to hf --out out/default-300
    python export.py --run_dir runs/ft --to hf --out out/ft     # the latest checkpoint in the chain

    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained("out/default-300")   # a LlamaForCausalLM

OUT gets config.json, model.safetensors (the parameters only, never the Adam moments, with HF
names: hfllama.py's mapping, fused matrices split, RoPE rows permuted), the tokenizer files when
the corpus's tokenizer is a Hugging Face one (tokenizer.py; for "bytes" and tiktoken encodings there
is none), and README.md, a model card naming the run, step, state hash, genesis record hash and
code digest, and how to audit it. The checkpoint is exported only after the chain up to its step
and the checkpoint itself verify, as sample.py does. Export is a reader: it writes nothing in
the run directory, and OUT (new, or an empty directory) must lie outside it; the folder appears
complete or not at all (written beside it, then renamed).

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

from config import CommandLine, UsageError


def parser():
    ap = CommandLine("export.py", "Export a verified checkpoint of a run as a Hugging Face LlamaForCausalLM folder.")
    ap.add_argument("--run_dir", metavar="DIR", default="runs/default", help="the run (only read) (default %(default)s)")
    ap.add_argument("--step", type=int, metavar="N", help="the checkpoint's step (default: the latest in the chain)")
    ap.add_argument("--to", required=True, choices=("hf",), help="the format: hf, a Hugging Face Llama (required)")
    ap.add_argument("--out", metavar="DIR", required=True,
                    help="the folder to write: new or empty, outside the run (required)")
    ap.add_argument("--data_dir", metavar="DIR",
                    help="the run's corpus, for its tokenizer files (default: the data_dir its config.json names)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import hashchain  # noqa: E402  (below the command line's first answer, above)
import hfllama
import repops
import rundir
from data import DataError
from tokenizer import TokenizerError, get_tokenizer
from train import code_digest


CARD = """# {name}: step {step} of an auditable RepOps run

Exported by `python export.py --run_dir {run} --step {step} --to hf --out OUT` from a checkpoint that verified
against the run's hash chain.

| | |
|---|---|
| run | `{run}` |
| step | {step} |
| state hash (step {step}) | `{state_hash}` |
| genesis record hash | `{genesis_hash}` |
| code digest | `{code_digest}` |
| model | LlamaForCausalLM, {n_layer} layers, width {d_model}, {n_head} heads ({n_kv_head} key/value), vocab {vocab_size}, tied embeddings: {tie} |
| tokenizer | {tokenizer} |

## How to audit it

With the run directory and the RepOps code at the code digest above:

    python audit.py --run_dir {run} --all          # every step replays to its record: MATCH
    python export.py --run_dir {run} --step {step} --to hf --out OUT2   # the same export, byte for byte

The parameters in model.safetensors are the checkpoint's, moved and never recomputed
(hfllama.py), so importing this folder (`train.py --init_from=THIS_FOLDER`) gives back the
tensors whose hashes the step-{step} record holds.
"""


def export(run_dir, step, out, data_dir=None):
    """Write the HF folder of `run_dir`'s checkpoint at `step` (None: the latest) to `out`."""
    from safetensors.torch import save_file
    rundir.check_outside(run_dir, out, "OUT")
    if os.path.lexists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise UsageError(f"OUT {out} exists and is not an empty directory")
    run = rundir.Run(run_dir)
    cfg = run.cfg
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
    step, tensors = run.checkpoint_for_reader(step)
    params = {n[len("params."):]: t for n, t in tensors.items() if n.startswith("params.")}
    tok = run.genesis.get("tokenizer") or {}
    folder = None
    if tok.get("name") == "hf":   # check the corpus's copy against the manifest's SHA-256s
        folder = get_tokenizer("hf", data_dir or run.recorded_data_dir(), tok.get("files")).folder
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".export-", dir=parent)
    try:
        save_file(hfllama.to_hf(params, cfg), os.path.join(tmp, "model.safetensors"),
                  metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(hfllama.hf_config(cfg), f, indent=2)
            f.write("\n")
        for name in sorted(tok.get("files") or {}) if folder else ():
            shutil.copyfile(os.path.join(folder, name), os.path.join(tmp, name))
        with open(os.path.join(tmp, "README.md"), "w") as f:
            f.write(CARD.format(
                name=os.path.basename(os.path.normpath(run_dir)), run=run_dir, step=step,
                state_hash=run.chain.records[step]["state_hash"],
                genesis_hash=run.genesis["record_hash"], code_digest=code_digest(),
                n_layer=cfg.n_layer, d_model=cfg.d_model, n_head=cfg.n_head,
                n_kv_head=cfg.n_kv_head, vocab_size=cfg.vocab_size, tie=cfg.tie_embeddings,
                tokenizer="files included (Hugging Face tokenizers)" if folder else
                f"{tok.get('name')!r}, which has no Hugging Face form: none included"))
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
    print(f"exported step {step} of {args.run_dir} to {args.out} (LlamaForCausalLM)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
