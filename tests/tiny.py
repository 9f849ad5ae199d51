"""Shared by the tests that train: the tiny model's flags, a generated corpus, and the
project's programs run as subprocesses on tiny runs.

    from tiny import TINY, make_corpus, train, audit
    corpus = make_corpus(tmp_dir, seed=7, lines=600)      # data dir with manifest.json
    run = train(tmp_dir / "run", corpus)                  # STEPS steps, a checkpoint every 10
    proc = audit(run, "--all")                            # CompletedProcess

tests/conftest.py provides the `corpus` and `reference` (an uninterrupted run) fixtures.
"""
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import hashchain
import prepare

ROOT = Path(__file__).resolve().parent.parent
STEPS = 30
CKPT_EVERY = 10
TIMEOUT = 180   # seconds for one subprocess; only a hang gets near it

# seconds per step stay in the tens of milliseconds on 2 cores
TINY = ["--n_layer=2", "--d_model=32", "--n_head=2", "--d_hidden=64", "--seq_len=16",
        "--micro_batch_size=2", "--micro_batches=4"]
SEQ_LEN, MICRO_BATCH_SIZE, MICRO_BATCHES = 16, 2, 4   # as in TINY

WORDS = ("the king queen sword night day love death crown fair lord lady house war peace "
         "gold blood heart hand eye sea storm fool wise old young sweet bitter speak hear "
         "come go stay fly fall rise thou thee my our their never ever now").split()


def launch_env():
    """The environment for a torchrun or train.py child: one OpenMP thread, unbuffered output,
    and no rank variables inherited from a parent launch."""
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(k, None)
    return e


def launcher(world):
    """The command that starts train.py on `world` ranks: plain python for one, torchrun otherwise."""
    train_py = str(ROOT / "train.py")
    if world == 1:
        return [sys.executable, train_py]
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    base = [exe] if os.path.exists(exe) else [sys.executable, "-m", "torch.distributed.run"]
    return base + ["--standalone", f"--nproc_per_node={world}", train_py]


def make_corpus(base, seed=7, lines=600, chunk_bytes=prepare.CHUNK_BYTES):
    """Seeded random sentences under `base`, prepared with the byte tokenizer."""
    base = Path(base)
    rng = random.Random(seed)
    text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))).capitalize() + "."
                     for _ in range(lines))
    (base / "source.txt").write_text(text)
    _, out = prepare.prepare(inputs=[str(base / "source.txt")], out_dir=str(base / "tokens"),
                              chunk_bytes=chunk_bytes)
    return Path(out)


def script(name, *args, env=None, timeout=TIMEOUT):
    """Run one of the project's programs to completion."""
    return subprocess.run([sys.executable, str(ROOT / name), *map(str, args)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def train_args(run, corpus, *extra):
    return [f"--run_dir={run}", f"--data_dir={corpus}", *TINY, f"--max_steps={STEPS}",
            f"--checkpoint_every={CKPT_EVERY}", "--eval_every=0", "--sample_tokens=0", *extra]


def train(run, corpus, *extra):
    """Train the tiny model to the end in run; returns run."""
    proc = script("train.py", *train_args(run, corpus, *extra))
    assert proc.returncode == 0, proc.stderr
    return run


def audit(run, *args, corpus=None):
    return script("audit.py", "--run_dir", run, *args, *(["--data_dir", corpus] if corpus else []))


def mismatch_lines(proc):
    return [line for line in proc.stdout.splitlines() if line.startswith("MISMATCH")]


def assert_one_line_error(proc, prog):
    """Exit code 2 and exactly one stderr line, prog's error line, with no traceback."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:"), proc.stderr


def copy_run(run, dest):
    shutil.copytree(run, dest)
    return dest


def share_secret(run, dest):
    """Give the run directory `dest` (created here) the secret of `run`, before training in it:
    two runs write the same chain bytes only under one secret (it keys every step_commit)."""
    Path(dest).mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(run) / "secret", Path(dest) / "secret")
    return dest


def chain_records(run):
    return [json.loads(line) for line in (run / "chain.jsonl").read_text().splitlines()]


def write_chain(run, records):
    """Write records one per line in the chain's canonical JSON, as a forger would."""
    lines = [json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in records]
    (run / "chain.jsonl").write_text("".join(lines))


def reseal(records, start=0):
    """Re-seal every link from record `start` on, as a forger who edited it would."""
    out = list(records[:start])
    prev = out[-1]["record_hash"] if out else hashchain.GENESIS_PREV
    for rec in records[start:]:
        rec = hashchain.seal({k: v for k, v in rec.items() if k not in ("prev", "record_hash")}, prev)
        out.append(rec)
        prev = rec["record_hash"]
    return out
