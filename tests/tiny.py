"""Shared by the tests that train: the tiny model's flags, a generated corpus, the project's
programs run as subprocesses on tiny runs, and the one way a test starts a process.

    from tiny import TINY, make_corpus, train, audit
    corpus = make_corpus(tmp_dir, seed=7, lines=600)      # data dir with manifest.json
    run = train(tmp_dir / "run", corpus)                  # STEPS steps, a checkpoint every 10
    proc = audit(run, "--all")                            # CompletedProcess
    key = make_key(tmp_dir, "alice")                      # an SSH key that signs receipts (ssh-keygen)
    proc = run_process([exe, "arg"], capture_output=True, text=True, timeout=60)  # subprocess.run
    proc = start_process([sys.executable, "train.py", ...])   # subprocess.Popen; stop_process(proc)

Every process a test starts goes through start_process (run_process and script use it): it runs
in its own session, hence its own process group (start_new_session), so a Ctrl-C at the
terminal reaches pytest alone. stop_process stops the process, its group and every process below
it (a compiler's children; torchrun's ranks, which torchrun starts in sessions of their own):
SIGINT, two seconds of grace, SIGKILL; then it reaps the process. run_process stops its process
when the wait ends for any reason (done, timeout, interrupt); the autouse fixture in
tests/conftest.py stops every process a test left running when the test ends, and conftest turns
SIGTERM into KeyboardInterrupt, so an interrupted or terminated pytest tears its fixtures down,
leaves no child behind and prints its summary (tests/test_interrupt.py).

tests/conftest.py provides the `corpus` and `reference` (an uninterrupted run) fixtures.
"""
import json
import os
import random
import resource
import shutil
import signal
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


_STARTED = set()       # Popen objects started by start_process and not yet stopped


def start_process(argv, **kwargs):
    """subprocess.Popen(argv, **kwargs) in a new session and process group, registered so that
    stop_all (after every test) kills it and everything it started."""
    proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
    _STARTED.add(proc)
    return proc


def descendants(pid):
    """The pids of every live process below `pid`, by /proc's parent links ([] without /proc)."""
    children = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):     # not a process, or it exited meanwhile
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        out += below
        todo += below
    return out


def stop_process(proc, grace=2.0):
    """Stop proc and every process below it, and reap proc. Still running, they get SIGINT first
    (a Python program unwinds: a kernel build it holds releases its lock in build/, which a
    SIGKILL would leave behind for every later run to wait on) and `grace` seconds to exit; then
    SIGKILL goes to proc's process group (after proc exited: the children it left there) and to
    every process below it in a group of its own (torchrun starts each rank in a new session)."""
    below = descendants(proc.pid) if proc.poll() is None else []
    if proc.poll() is None:
        _signal_all(proc.pid, below, signal.SIGINT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    _signal_all(proc.pid, below, signal.SIGKILL)
    proc.wait()
    _STARTED.discard(proc)


def _signal_all(leader, pids, sig):
    """Send sig to the process group of `leader` and to each of `pids`; gone ones are skipped."""
    for send, target in [(os.killpg, leader)] + [(os.kill, pid) for pid in pids]:
        try:
            send(target, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_all():
    """Stop every process a test started and left (tests/conftest.py calls it after each test)."""
    for proc in list(_STARTED):
        stop_process(proc)


def run_process(argv, *, input=None, capture_output=False, timeout=None, check=False, **kwargs):
    """subprocess.run(argv, ...) through start_process: whether the wait ends with the process's
    exit, a timeout (subprocess.TimeoutExpired) or an interrupt, its process group is stopped
    before this returns or raises."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    proc = start_process(argv, **kwargs)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    finally:
        stop_process(proc)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        result.check_returncode()
    return result


def launch_env():
    """The environment for a torchrun or train.py child: one OpenMP thread, unbuffered output,
    and no rank variables inherited from a parent launch."""
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(k, None)
    return e


def other_kernels_env():
    """launch_env() with the CPU kernel versions a CPU does not choose by default where it has a
    choice (repops.py: the 256-bit matmul tile, the SIMD int8 GEMM instead of AMX-INT8). Every
    version gives the same bits, so a run under it must give the same chain; the R = 2 runs of
    the chain tests use it."""
    return dict(launch_env(), REPOPS_CPU_MATMUL="256", REPOPS_CPU_INT8="vnni")


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


def script(name, *args, env=None, timeout=TIMEOUT, memory=None):
    """Run one of the project's programs to completion; `memory` (bytes) limits its address
    space (RLIMIT_AS, as `ulimit -v` does on shared clusters)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    return run_process([sys.executable, str(ROOT / name), *map(str, args)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=timeout,
                       preexec_fn=limit if memory else None)


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


# A public key (an Ed25519 blob of zeros, SPEC §15.7's `signer`) for receipts that tests judge
# without a signature (receipts.judge checks proofs; check_receipts also checks signatures).
ZERO_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"


def make_key(base, name, passphrase=""):
    """A fresh Ed25519 key `base/name` (and name.pub), made by ssh-keygen with `passphrase`."""
    path = Path(base) / name
    run_process(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", name, "-f", str(path)],
                check=True, stdin=subprocess.DEVNULL, timeout=60)
    return path


def write_roster(path, keys, names):
    """An allowed_signers roster at `path`: one line "NAME TYPE BASE64" per name, from keys[name].pub."""
    lines = [f"{name} {' '.join((Path(str(keys[name]) + '.pub')).read_text().split()[:2])}\n" for name in names]
    Path(path).write_text("".join(lines))
    return Path(path)


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
    """Re-seal every link from record `start` on, as a forger who edited it would: a step
    record that named the genesis (`run`, SPEC §12.3) names the resealed genesis."""
    out = list(records[:start])
    prev = out[-1]["record_hash"] if out else hashchain.GENESIS_PREV
    for rec in records[start:]:
        body = {k: v for k, v in rec.items() if k not in ("prev", "record_hash")}
        if out and body.get("run") == records[0]["record_hash"]:
            body["run"] = out[0]["record_hash"]
        rec = hashchain.seal(body, prev)
        out.append(rec)
        prev = rec["record_hash"]
    return out
