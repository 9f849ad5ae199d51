"""Publish a run: write its public copy, which a static file server or a Hugging Face repository
serves as it is, and from whose address anyone audits it.

    python publish.py --run_dir runs/x --out public/x                  # the run and its corpus
    python publish.py --run_dir runs/x --out public/x --corpus data/x  # the corpus, where it is now
    python publish.py --run_dir runs/x --out public/x --no_corpus      # the corpus is published elsewhere

    rsync -a public/x/ host:/var/www/runs/x/              # a static host: https://host/runs/x
    aws s3 sync public/x s3://bucket/runs/x               # an object store
    hf upload --repo-type dataset org/x public/x .        # Hugging Face: hf://datasets/org/x
    python audit.py --run_dir https://host/runs/x --step 120 --micro_batch 3

The copy (SPEC.md §22, published.py) holds the run directory's files but its secret, its lock
and rejected/: the chain's complete lines (a run still training is published up to its last
whole record), chain.offsets, anchors.jsonl, config.json, train.log, the checkpoints of steps
in the chain, the unit lists, an imported run's source_config.json and, unless --no_corpus, the
corpus under corpus/ (a prepared corpus or a mix; its manifest digest must be the genesis
record's). publication.json, the index, is written last: every file with its size and SHA-256,
the genesis record's hash (`run`), the last step and its record's hash (`head`). Checkpoints and
token files are hard-linked where --out is on the same file system (they never change), else
copied; every other file is written anew, through hashchain.write_atomically (a temporary file
of a random name, then a rename). Publishing
again into the same --out brings the copy up to date; an --out that holds another run's copy is
refused. Before anything is written: the chain is verified, and each checkpoint's header is
proven against its record (its tensors are the auditors' to check).

Readers never write into a run: --out must lie outside it, and is checked (and created) before
any work (rundir.prepare_output). Bad input is one line
`publish.py: error: ...`, exit 2.
"""
import hashlib
import json
import os
import sys

from config import CommandLine, UsageError


def parser():
    ap = CommandLine("publish.py", "Write a run's public copy (for a static file server or a Hugging Face "
                     "repository), from which audit.py --run_dir URL audits it.")
    ap.add_argument("--run_dir", metavar="DIR", default="runs/default", help="the run (only read) (default %(default)s)")
    ap.add_argument("--out", metavar="DIR", required=True, help="the public copy to write or update, outside the run "
                    "(required)")
    ap.add_argument("--corpus", metavar="DIR", help="the run's corpus (default: the data_dir its config.json names)")
    ap.add_argument("--no_corpus", action="store_true", help="leave the corpus out (auditors then name it with "
                    "--data_dir: a local copy, a bundle or its URL)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import byterange  # noqa: E402  (below the command line's first answer, above)
import hashchain  # noqa: E402
import prepare  # noqa: E402
import published  # noqa: E402
import receipts  # noqa: E402
import rundir  # noqa: E402
import units  # noqa: E402

LINKED = ("checkpoints/", "corpus/")       # files that never change: hard-linked where possible
TEXT_FILES = (receipts.ANCHORS, "config.json", "train.log", "source_config.json")


def corpus_files(path, genesis):
    """{name under corpus/: source path} of the run's prepared corpus (or mix) at `path`, whose
    manifest digest must be the genesis record's."""
    manifest = prepare.read_json(os.path.join(path, prepare.MANIFEST), "corpus")
    if prepare.manifest_digest(manifest) != genesis.get("data_manifest"):
        raise UsageError(f"{path} is not the run's corpus: its manifest digest is not the genesis record's "
                         "data_manifest (give it with --corpus DIR, or --no_corpus)")
    if os.path.lexists(os.path.join(path, prepare.BUNDLE)):
        raise UsageError(f"{path} is a bundle, not the run's corpus: publish the corpus (or --no_corpus)")
    return _corpus_files(path, manifest, "")


def _corpus_files(path, manifest, prefix):
    found = {prefix + prepare.MANIFEST: os.path.join(path, prepare.MANIFEST)}
    for entry in manifest.get("mix", []):
        sub = os.path.join(path, entry["name"])
        found.update(_corpus_files(sub, prepare.read_json(os.path.join(sub, prepare.MANIFEST), "corpus"),
                                   f"{prefix}{entry['name']}/"))
    for split, rec in manifest.get("splits", {}).items():
        for name in (rec["file"], f"{split}.leaves"):
            found[prefix + name] = os.path.join(path, name)
    return found


def plan(run, corpus):
    """{name in the copy: its source path, or the bytes to write} of the run's public copy (the
    chain: the lines of its verified records); every checkpoint header proven against its
    record first."""
    chain = run.chain
    chain.verify()
    raw = hashchain.read_bytes(chain.path, "chain", hashchain.MAX_CHAIN_BYTES, UsageError)
    lines = b"".join(line + b"\n" for line in raw.split(b"\n")[:len(chain)])   # the records verified
    files = {published.CHAIN: lines, published.OFFSETS: published.offsets(lines)}
    for name in TEXT_FILES:
        if (run.dir / name).is_file():
            files[name] = hashchain.read_bytes(run.dir / name, name, 1 << 30, UsageError)
    for step, path in run.checkpoints():
        if step >= len(chain):
            continue                            # its record is not written yet
        record = chain.records[step]
        with byterange.LocalFile(path, "checkpoint", rundir.CheckpointError) as f:
            rundir.read_header(f, path, lambda meta: rundir.proven_leaves(meta, record, path))
        files[f"checkpoints/{path.name}"] = path
    for step in range(1, len(chain)):
        path = units.list_path(run.dir, step)
        if path.is_file():
            files[units.list_name(step)] = path
    for name, path in (corpus or {}).items():
        files[f"{published.CORPUS}/{name}"] = path
    return files


def write(out, name, source):
    """Put one file of the copy in place: new bytes, or a file hard-linked (LINKED, where it can
    be) or copied; written through hashchain.write_atomically (a link: made under a random
    temporary name, then renamed); returns (size, SHA-256 hex)."""
    dest = os.path.join(out, name)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    if isinstance(source, bytes):
        hashchain.write_atomically(dest, source)
        return len(source), hashlib.sha256(source).hexdigest()
    digest, size = hashlib.sha256(), 0
    linked = name.startswith(LINKED) and os.path.exists(dest) and os.path.samefile(dest, source)
    if name.startswith(LINKED) and not linked:
        tmp = os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.tmp-{os.urandom(6).hex()}")
        try:
            os.link(source, tmp)                # never through a planted file: link() does not follow
            os.replace(tmp, dest)
            linked = True
        except OSError:                         # another file system: copied below
            if os.path.lexists(tmp):
                os.unlink(tmp)

    def copy(into=None):
        nonlocal size
        with hashchain.open_regular(source, "a file of the run", UsageError) as src:
            while block := src.read(1 << 24):
                digest.update(block)
                size += len(block)
                if into is not None:
                    hashchain.write_all(into, block)
    if linked:
        copy()
    else:
        hashchain.write_atomically(dest, copy)
    return size, digest.hexdigest()


def publish(run_dir, out, corpus_dir=None, no_corpus=False):
    """Write or update the public copy of run_dir in `out`; returns (index, its SHA-256 hex)."""
    rundir.prepare_output(run_dir, out, "--out", directory=True)
    run = rundir.Run(run_dir)
    genesis = run.genesis
    if genesis.get("spec") != hashchain.SPEC:
        raise UsageError(f"{run_dir} was made under SPEC v{genesis.get('spec')}; this code publishes SPEC "
                         f"v{hashchain.SPEC} runs")
    old = os.path.join(out, published.INDEX)
    if os.path.exists(old):
        previous = byterange.directory(out)
        if published.read_index(previous)["run"] != genesis["record_hash"]:
            raise UsageError(f"{out} holds the public copy of another run: publish into another --out")
    corpus = None if no_corpus else corpus_files(corpus_dir or run.recorded_data_dir(), genesis)
    files = plan(run, corpus)
    os.makedirs(out, exist_ok=True)
    entries = {}
    for name, source in sorted(files.items()):
        size, sha = write(out, name, source)
        entries[name] = {"size": size, "sha256": sha}
    last = len(run.chain) - 1
    index = {"format": published.INDEX_FORMAT, "run": genesis["record_hash"], "steps": last,
             "head": run.chain.records[last]["record_hash"], "corpus": None if no_corpus else published.CORPUS,
             "files": entries}
    raw = (json.dumps(index, sort_keys=True, separators=(",", ":")) + "\n").encode()
    write(out, published.INDEX, raw)
    return index, hashlib.sha256(raw).hexdigest()


def main(argv=None):
    ap = parser()
    try:
        args = ap.parse_args(argv)
        if args.corpus and args.no_corpus:
            raise UsageError("--corpus DIR and --no_corpus: one or the other")
        index, sha = publish(args.run_dir, args.out, args.corpus, args.no_corpus)
    except (UsageError, hashchain.HashChainError, prepare.DataError) as e:
        print(f"publish.py: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"publish.py: error: cannot write {args.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    files = index["files"]
    print(f"published steps 0..{index['steps']} of {args.run_dir} to {args.out}: {len(files) + 1} files, "
          f"{sum(e['size'] for e in files.values()):,} bytes"
          + (f" (the corpus {sum(e['size'] for n, e in files.items() if n.startswith('corpus/')):,})"
             if index["corpus"] else ", without the corpus"))
    print(f"{published.INDEX}: SHA-256 {sha}, head record {index['head']}")
    print(f"serve {args.out} as it is: rsync -a {args.out}/ HOST:/var/www/RUN/ (https://HOST/RUN), or "
          f"hf upload --repo-type dataset ORG/RUN {args.out} . (hf://datasets/ORG/RUN); then "
          f"python audit.py --run_dir URL --step {max(index['steps'], 1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
