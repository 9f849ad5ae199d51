"""A run directory: its files, its one writer, and opening it to train, audit or sample.

    runs/default/chain.jsonl        line 0: the genesis record; line k: the record of step k
    runs/default/checkpoints/       step_00000100.safetensors, ... (verified against the chain)
    runs/default/config.json        the resolved config (bookkeeping included), for people
    runs/default/train.log          what train.py printed
    runs/default/lock               the trainer's advisory lock (flock) and who holds it
    runs/default/rejected/          checkpoints that failed verification, kept as evidence
    runs/default/secret             the run's secret (32 bytes, mode 0600): never published
    runs/default/anchors.jsonl      chain heads every anchor_every steps, to copy out and publish
    runs/ft/source_config.json      an imported run's source config.json, byte for byte (hfllama.py)

    run = Run("runs/default")              # reads only: chain, genesis, config
    step, tensors = run.latest_checkpoint(upto=120, on_bad=print)   # chain verified up to it
    run.config_json_differences()          # config.json vs the genesis record

    lock = hold_lock("runs/default")       # the trainer, for its whole life; UsageError if held
    check_outside("runs/default", "r.json", "--receipt")   # UsageError if r.json is the run's
    first, last = chain_steps(run, "1:40")  # steps A:B of the chain (default all), refused if not in it

Readers (audit.py, sample.py, data.py --bundle) never create, rename or delete anything in a
run; the files they write (traces, receipts, revealed salts, bundles) must lie outside it and
must not be a file of the run under another name (check_outside). The secret and anchors.jsonl are written
by the trainer only (receipts.py). The trainer
holds an flock on `lock` while it lives; the kernel drops it when the process dies, however it
dies, so no pid or host bookkeeping decides who may write.
"""
import datetime
import fcntl
import os
import socket
from pathlib import Path

import checkpoint
import config
import hashchain
from config import UsageError

MAX_CONFIG_JSON = 1 << 20


def checkpoint_dir(run_dir):
    return Path(run_dir) / "checkpoints"


def hold_lock(run_dir):
    """Take the run's exclusive lock for this process's lifetime; returns the open lock file.
    A second trainer gets UsageError naming the holder."""
    path = Path(run_dir) / "lock"
    try:
        f = open(path, "a+")
    except OSError as e:
        raise UsageError(f"cannot write to the run directory {run_dir}: {e.strerror}") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read(200).strip() or "another process"
        f.close()
        raise UsageError(f"{run_dir} is in use by {holder}; one trainer per run directory") from None
    f.seek(0)
    f.truncate()
    f.write(f"train.py pid {os.getpid()} on {socket.gethostname()} since "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC\n")
    f.flush()
    return f


def _identity(path):
    st = os.stat(path)
    return st.st_dev, st.st_ino


def check_outside(run_dir, path, option):
    """UsageError if `path` (an output: a file, or a directory to create) lies inside the run
    directory or is one of its files under another name. Names are resolved (symbolic links),
    then compared by device and inode: the path and every directory above it against the run
    directory (a bind mount or another spelling of it), and an existing file against every file
    of the run (a hard link). Readers never write into a run."""
    if not os.path.isdir(run_dir):
        return                          # no run: the command itself reports it
    run = _identity(run_dir)
    target = os.path.realpath(path)
    inside, here = False, target
    while not inside:
        inside = os.path.exists(here) and _identity(here) == run
        if os.path.dirname(here) == here:
            break
        here = os.path.dirname(here)
    if not inside and os.path.isfile(target):
        mine = _identity(target)
        inside = any(_identity(os.path.join(d, name)) == mine
                     for d, _, names in os.walk(run_dir) for name in names
                     if os.path.isfile(os.path.join(d, name)))
    if inside:
        shown = path if str(path).isprintable() else ascii(str(path))
        raise UsageError(f"{option} {shown} is inside the run directory {run_dir} or is one of its "
                         "files under another name; readers never write into a run: choose a "
                         "path outside it")


def reject_checkpoint(run_dir, path):
    """Move a checkpoint that failed verification to rejected/ (never overwrite or delete it:
    it is evidence). Returns the new path. Only the lock holder calls this."""
    dest_dir = Path(run_dir) / "rejected"
    dest_dir.mkdir(exist_ok=True)
    dest, n = dest_dir / Path(path).name, 1
    while dest.exists():
        dest, n = dest_dir / f"{Path(path).name}.{n}", n + 1
    os.rename(path, dest)
    return dest


class Run:
    """A run directory opened for reading. `chain` is loaded, not yet verified (readers decide
    how far to verify it); `cfg` and `genesis` come from the genesis record."""

    def __init__(self, run_dir, repair=False):
        self.dir = Path(run_dir)
        if not self.dir.is_dir():
            raise UsageError(f"no run directory {run_dir}")
        path = self.dir / "chain.jsonl"
        if not path.exists():
            raise UsageError(f"no chain in {run_dir} (chain.jsonl missing: train first)")
        self.chain = hashchain.Chain(path)
        self.chain.load(repair=repair)

    @property
    def genesis(self):
        """Line 0 (its fields are checked by whoever relies on them: the audit, one by one)."""
        if not self.chain.records:
            if self.chain.broken:
                raise self.chain.broken
            raise UsageError(f"{self.chain.path} has no genesis record")
        return self.chain.records[0]

    def check_contract(self, implemented):
        """A run made under another arithmetic contract (the genesis `contract`; none: v1) cannot
        be resumed or replayed by this code, whose kernels implement contract `implemented`."""
        made = self.genesis.get("contract", 1)
        if made != implemented or isinstance(made, bool):
            raise UsageError(f"this run was made under arithmetic contract v{made}; this code implements "
                             f"v{implemented}")

    @property
    def cfg(self):
        """The run's Config: the genesis record's decisive fields, bookkeeping defaults."""
        if "config" not in self.genesis:
            raise UsageError(f"{self.chain.path}: the genesis record has no config")
        return config.from_record(self.genesis["config"], f"{self.chain.path}: genesis config")

    @property
    def vocab_size(self):
        vocab = self.genesis.get("vocab_size")
        if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
            raise UsageError(f"{self.chain.path}: the genesis record has no valid vocab_size")
        return vocab

    def checkpoints(self):
        """[(step, path)] of the checkpoint files, sorted by step."""
        return checkpoint.list_checkpoints(checkpoint_dir(self.dir))

    def verified_checkpoint(self, step, path, mmap=False):
        """The tensors of the checkpoint of `step`, after verifying the chain up to that step,
        the tensors against the record's Merkle leaves and the metadata against the record.
        HashChainError (StateMismatch for a file that does not match) otherwise. mmap: see
        checkpoint.load_checkpoint."""
        self.chain.verify(upto=step)
        if step >= len(self.chain):
            raise hashchain.StateMismatch(f"checkpoint {path}: step {step} has no record in the chain")
        record = self.chain.records[step]
        tensors, meta = checkpoint.load_checkpoint(path, mmap)
        hashchain.verify_state(tensors, record.get("state_hash"), record.get("tensor_hashes"))
        expected = {"step": step, "state_hash": record["state_hash"],
                    "tensor_hashes": record["tensor_hashes"]}
        if meta != expected:
            bad = sorted(k for k in set(meta) | set(expected) if meta.get(k) != expected.get(k))
            raise hashchain.StateMismatch(f"checkpoint {path}: metadata field {bad[0]!r} differs "
                                          "from the chain record")
        return tensors

    def checkpoint_for_reader(self, step):
        """(step, tensors) of a reader's checkpoint (sample.py, export.py): the one of `step`, or
        with None the latest whose step has a record, verified as verified_checkpoint does.
        UsageError when there is none."""
        ckpts = dict(self.checkpoints())
        if step is None:
            step = max((s for s in ckpts if s < self.chain.lines), default=None)
        if step not in ckpts:
            raise UsageError(f"no checkpoint for step {step} in {self.dir} (have {sorted(ckpts)})")
        return step, self.verified_checkpoint(step, ckpts[step])

    def latest_checkpoint(self, upto, on_bad, mmap=False):
        """(step, tensors) of the latest checkpoint at or before `upto` that verifies, or
        (0, None) if none does (the caller re-creates the genesis state). Each checkpoint that
        is malformed (CheckpointError) or does not match its record (StateMismatch) is passed to
        on_bad(step, path, error), which may raise, and skipped. A broken chain raises."""
        for step, path in reversed(self.checkpoints()):
            if step > upto:
                continue
            try:
                return step, self.verified_checkpoint(step, path, mmap)
            except (hashchain.StateMismatch, checkpoint.CheckpointError) as e:
                on_bad(step, path, e)
        return 0, None

    def config_json_differences(self):
        """Decisive keys on which config.json disagrees with the genesis record ([] if equal or
        absent). config.json is for people; the genesis record is what counts."""
        path = self.dir / "config.json"
        if not path.exists():
            return []
        try:
            with hashchain.open_regular(path, "config") as f:
                raw = f.read(MAX_CONFIG_JSON + 1)
            if len(raw) > MAX_CONFIG_JSON:
                raise ValueError("larger than 1 MiB")
            recorded = hashchain.strict_json(raw.decode("utf-8"))
            if not isinstance(recorded, dict):
                raise ValueError("not a JSON object")
        except (UnicodeDecodeError, ValueError) as e:
            raise UsageError(f"{path} is not a config file: {e}") from None
        decisive = {k: v for k, v in recorded.items() if k not in config.BOOKKEEPING}
        return config.differences(decisive, self.genesis.get("config", {}))

    def recorded(self, key, kind, default):
        """A bookkeeping value as config.json records it (where the data lives, whether the
        trainer recomputed activations): not part of what is audited; `default` when
        config.json is missing, unreadable or has no such value of type `kind`."""
        path = self.dir / "config.json"
        try:
            with hashchain.open_regular(path, "config") as f:
                value = hashchain.strict_json(f.read(MAX_CONFIG_JSON).decode("utf-8")).get(key)
        except (hashchain.HashChainError, UnicodeDecodeError, ValueError, AttributeError):
            value = None
        return value if isinstance(value, kind) and value != "" else default

    def recorded_data_dir(self):
        """The corpus the run was trained on, as config.json names it."""
        return self.recorded("data_dir", str, config.Config.data_dir)


# ----------------------------------------------------------------------------- step ranges
def parse_range(text, flag):
    """(first, last) of a command line's A:B step range (UsageError unless 1 <= A <= B)."""
    a, _, b = text.partition(":")
    try:
        first, last = int(a), int(b)
    except ValueError:
        raise UsageError(f"{flag} expects A:B, got {text!r}") from None
    if not 1 <= first <= last:
        raise UsageError(f"{flag} {text}: steps start at 1 and a range runs forward")
    return first, last


def chain_steps(run, steps, flag="--steps"):
    """(first, last) of `steps` (A:B, default: every step), refused unless in the chain."""
    run.chain.verify()
    last_step = len(run.chain) - 1
    first, last = parse_range(steps, flag) if steps else (1, last_step)
    if last > last_step:
        raise UsageError(f"{flag}: steps {first}..{last} are not in the chain (it holds steps 1..{last_step})")
    return first, last
