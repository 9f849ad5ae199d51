"""A run directory: its files, the checkpoint file format, its one writer, and opening it to
train, audit or sample.

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
    run = Run("runs/default", writer=True) # the lock holder: repairs a torn chain tail, writes
    run.save_checkpoint(tensors, record, leaves)   # checkpoints/step_<record step>.safetensors, atomically
    check_outside("runs/default", "r.json", "--receipt")   # UsageError if r.json is the run's
    prepare_output("runs/default", "out/r/x.json", "--receipt")   # that, and out/r/ created now

    save_checkpoint(path, tensors, {"step": 100, "state_hash": root, "tensor_hashes": leaves})
    tensors, meta = load_checkpoint(path)              # strict; mmap=True maps each tensor when read
    leaves = proven_leaves(meta, record, path)         # the header's leaves, hashed to the record's root
    tensors = proved_tensors(f, record, path, keep)    # some tensors of a file (byterange), each checked
    for step, path in list_checkpoints("runs/x/checkpoints"): ...

Readers (audit.py, sample.py, export.py, report.py, data.py --bundle) never create, rename or
delete anything in a run; the files they write (traces, receipts, revealed salts, bundles) must
lie outside it and must not be a file of the run under another name (check_outside). The
secret and anchors.jsonl are written by the trainer only (receipts.py). The trainer holds an
flock on `lock` while it lives; the kernel drops it when the process dies, however it dies, so
no pid or host bookkeeping decides who may write.

A checkpoint file is safetensors-compatible, written atomically and loaded without pickle (our
own reader and writer; the tensor bytes are hashchain's canonical bytes): 8 bytes (little-endian
header length n), n bytes of JSON header ({"__metadata__": {"repops": the meta as JSON}, and per
tensor {"dtype", "shape", "data_offsets"}}, name-sorted, space-padded to 8 bytes), then the
tensors' canonical little-endian bytes in name order (SPEC.md §13). It is read as hostile input:
a regular file only, strict JSON, every offset and size checked against the file; every error
is a CheckpointError (a hashchain.HashChainError) with a one-line message.

A record holds a state's Merkle root only (state_hash, SPEC §11.3), never its leaves: a
checkpoint's header lists every tensor's leaf (`tensor_hashes`), and hashing them to the
record's root is their proof (proven_leaves); then each tensor is checked against its proven
leaf, so one tensor of a file (a micro-batch audit needs the parameters only) is checked without
reading the others. The header is read through a byterange file (byterange.py), local or remote
alike (published.py reads a published run's checkpoints by ranges with these functions).
"""
import dataclasses
import datetime
import fcntl
import functools
import json
import math
import os
import re
import socket
from pathlib import Path

import numpy as np
import torch

import byterange
import config
import hashchain
import offload
from config import UsageError
from hashchain import (ST_DTYPES, ST_NAMES, HashChainError, canonical_tensor, is_int, kill_point,
                       open_regular, strict_json, write_atomically)


# ----------------------------------------------------------------------------- checkpoint files
class CheckpointError(HashChainError):
    """A checkpoint file is missing, malformed, truncated or inconsistent."""


_MAX_HEADER = 100 * 1024 * 1024  # the limit the safetensors reference reader uses
_CKPT_RE = re.compile(r"^step_(\d{8,})\.safetensors$")
HEX64 = re.compile(r"[0-9a-f]{64}")          # a leaf of a checkpoint header's tensor_hashes
# A file being written is ".<name>.tmp-<random>" until its rename (hashchain.write_atomically).
# Only the trainer holding the run's lock removes leftovers (remove_temp_files) in the run
# directory, checkpoints/ and units/: under the lock no other writer exists, so every hidden
# ".*.tmp*" file there is one, whoever named it (a pid, an older version); readers ignore them.
_TMP_RE = re.compile(r"^\..+\.tmp")
# Header dimensions beyond this cannot describe a real file and would overflow numpy's shapes.
_MAX_DIM = 1 << 48


def checkpoint_path(ckpt_dir, step):
    return Path(ckpt_dir) / f"step_{step:08d}.safetensors"


def remove_temp_files(directory):
    """Delete leftover temp files in `directory`. Only the writer that holds the run's lock may call
    this: no one else can be writing one."""
    for entry in os.scandir(directory):
        if _TMP_RE.match(entry.name) and entry.is_file(follow_symlinks=False):
            os.unlink(entry.path)


def save_checkpoint(path, tensors, meta):
    """Write tensors + metadata atomically through hashchain.write_atomically (a random temp name
    opened with O_EXCL | O_NOFOLLOW, fsync, rename): a crash leaves either no file or a complete
    one, and no planted link is followed. REPOPS_SLOW_WRITE slows the bytes for the SIGKILL test."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if "__metadata__" in tensors:
        raise CheckpointError(f"checkpoint {path}: '__metadata__' cannot be a tensor name")
    header = {"__metadata__": {"repops": json.dumps(meta, sort_keys=True)}}
    offset = 0
    for name in sorted(tensors):
        _, st_dtype, shape, data = canonical_tensor(name, tensors[name])
        header[name] = {"dtype": st_dtype, "shape": shape,
                        "data_offsets": [offset, offset + data.nbytes]}
        offset += data.nbytes
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * (-len(hbytes) % 8)  # safetensors allows space padding; keeps data aligned

    def pieces():
        yield len(hbytes).to_bytes(8, "little") + hbytes
        for name in sorted(tensors):   # fetched again: one tensor held at a time (offload.py)
            yield memoryview(canonical_tensor(name, tensors[name])[3])

    write_atomically(path, pieces())
    kill_point(f"rename:{path.name}")   # REPOPS_KILL_AT: the SIGKILL tests' moment


def read_header(f, where, check=None):
    """(data start, [(begin, stop, name, entry)] in file order, meta) of the checkpoint file `f`
    (a byterange file, local or remote), its header strictly validated against f.size; CheckpointError
    otherwise. check(meta), if given, runs before a remote header's bytes are kept in the cache."""
    def bad(what):
        return CheckpointError(f"checkpoint {where} {what}")

    size = f.size
    if size < 8:
        raise bad(f"is truncated: expected at least 8 bytes, found {size}")
    n = int.from_bytes(f.read(0, 8, lambda raw: None), "little")
    if n > _MAX_HEADER:
        raise bad(f"has an implausible header length {n} (garbage at the start of the file?)")
    if 8 + n > size:
        raise bad(f"is truncated: header needs {8 + n} bytes, found {size}")
    parsed = []

    def parse(raw):
        parsed[:] = _parse_header(bytes(raw), n, size, bad)
        if check:
            check(parsed[1])
    f.read(8, n, parse)
    return 8 + n, parsed[0], parsed[1]


def _parse_header(raw, n, size, bad):
    """(entries in file order, meta) of the n header bytes of a checkpoint file of `size` bytes."""
    try:
        header = strict_json(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise bad(f"has a header that is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise bad("has a header that is not a JSON object")

    md = header.pop("__metadata__", None)
    if not isinstance(md, dict) or not isinstance(md.get("repops"), str):
        raise bad("has no '__metadata__.repops' entry")
    try:
        meta = strict_json(md["repops"])
    except ValueError as e:
        raise bad(f"has metadata that is not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise bad("has metadata that is not a JSON object")

    entries = []
    for name, e in header.items():
        if (not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}
                or e["dtype"] not in ST_DTYPES
                or not isinstance(e["shape"], list)
                or not all(is_int(d) and 0 <= d <= _MAX_DIM for d in e["shape"])
                or not isinstance(e["data_offsets"], list) or len(e["data_offsets"]) != 2
                or not all(is_int(o) for o in e["data_offsets"])):
            raise bad(f"has a malformed header entry for tensor {name!r}")
        entries.append((e["data_offsets"][0], e["data_offsets"][1], name, e))
    entries.sort()

    end = 0
    for begin, stop, name, e in entries:
        if begin != end:
            raise bad(f"has non-contiguous data offsets at tensor {name!r}: begins at "
                      f"{begin}, expected {end}")
        want = ST_DTYPES[e["dtype"]].itemsize * math.prod(e["shape"])  # exact, no overflow
        if stop - begin != want:
            raise bad(f"has inconsistent tensor {name!r}: {e['dtype']} {e['shape']} needs "
                      f"{want} bytes, offsets span {stop - begin}")
        end = stop
    expected = 8 + n + end
    if size < expected:
        raise bad(f"is truncated: expected {expected} bytes, found {size}")
    if size > expected:
        raise bad(f"has trailing data: expected {expected} bytes, found {size}")
    return entries, meta


def load_checkpoint(path, mmap=False):
    """(tensors, meta) from a checkpoint, strictly validated; never executes code. With mmap,
    tensors is a Mapping that maps each tensor from the file when it is read (copy-on-write;
    nothing is read before): memory for one tensor at a time, for states larger than memory."""
    path = Path(path)
    with byterange.LocalFile(path, "checkpoint", CheckpointError) as lf:
        start, entries, meta = read_header(lf, path)
        if mmap:
            where = {name: (start + begin, e) for begin, _, name, e in entries}
            return offload.LazyTensors(sorted(where), lambda name: _mapped(path, *where[name])), meta
        # Read each tensor straight into its own freshly allocated (aligned) buffer: one copy,
        # no second in-memory image of the file.
        f = lf.file
        f.seek(start)
        tensors = {}
        for begin, stop, name, e in entries:
            arr = np.empty(e["shape"], dtype=ST_DTYPES[e["dtype"]])
            buf = memoryview(arr.reshape(-1).view(np.uint8))
            got = 0
            while got < len(buf):
                k = f.readinto(buf[got:])
                if not k:
                    raise CheckpointError(f"checkpoint {path} is truncated: file shrank while reading "
                                          f"tensor {name!r}")
                got += k
            tensors[name] = torch.from_numpy(arr.astype(arr.dtype.newbyteorder("="), copy=False))
    return {name: tensors[name] for name in sorted(tensors)}, meta


META_KEYS = {"step", "state_hash", "tensor_hashes"}


def proven_leaves(meta, record, where):
    """{name: leaf} of a state file's header (a checkpoint's, or the publisher's state file), proven:
    its metadata is {"step", "state_hash", "tensor_hashes"} with the record's step and state hash,
    and its leaves, in name order, hash to that state hash (SPEC §11.2, §13). StateMismatch
    otherwise: the record holds the root only, so these leaves are the only ones a tensor of
    that state is checked against."""
    expected = {"step": record.get("step"), "state_hash": record.get("state_hash")}
    keys = sorted(set(meta) ^ META_KEYS) + sorted(k for k in expected if meta.get(k) != expected[k])
    if keys:
        raise hashchain.StateMismatch(f"checkpoint {where}: metadata field {keys[0]!r} differs from the chain record")
    leaves = meta["tensor_hashes"]
    if not isinstance(leaves, dict) or not all(isinstance(v, str) and HEX64.fullmatch(v) for v in leaves.values()):
        raise hashchain.StateMismatch(f"checkpoint {where}: its header's tensor_hashes are not SHA-256 hashes "
                                      "(64 lowercase hex digits each)")
    if hashchain.merkle_root([leaves[n] for n in sorted(leaves)]) != record["state_hash"]:
        raise hashchain.StateMismatch(f"checkpoint {where}: its header's tensor_hashes do not hash to step "
                                      f"{record['step']}'s state hash (the header was edited)")
    return {n: leaves[n] for n in sorted(leaves)}


def proved_tensors(f, record, where, keep=None):
    """{name: tensor} of the tensors of the state whose names keep(name) accepts (None: all) of
    the state file `f` (a byterange file:
    a checkpoint or a publisher's state file, local or remote) of the state that `record` (a
    chain record) names: its header's leaves proven against the record's state hash, then each
    tensor checked against its leaf before it is returned (a remote tensor is fetched only
    then). StateMismatch names the first tensor that is missing or differs. Each tensor is
    mapped copy-on-write from its file (a remote one from its cached piece), not read into
    memory: a state larger than memory is served one page at a time."""
    proven = {}
    start, entries, _ = read_header(f, where, lambda meta: proven.update(proven_leaves(meta, record, where)))
    at = {name: (start + begin, stop - begin, e) for begin, stop, name, e in entries}
    for name in sorted(set(at) - set(proven))[:1]:
        raise hashchain.StateMismatch(f"checkpoint {where}: tensor {name!r} is not in the state of step "
                                      f"{record['step']}", name)
    names = sorted(n for n in proven if keep is None or keep(n))
    for name in names:
        if name not in at:
            raise hashchain.StateMismatch(f"checkpoint {where}: tensor {name!r} is missing", name)

    def check(name):
        e = at[name][2]

        def leaf_matches(raw):
            if hashchain.leaf_of_bytes(name, ST_NAMES[e["dtype"]], e["shape"], raw) != proven[name]:
                raise hashchain.StateMismatch(f"checkpoint {where}: tensor {name!r} differs from its leaf, "
                                              f"which the header proves against step {record['step']}'s "
                                              "state hash", name)
        return leaf_matches
    views = f.views([(at[n][0], at[n][1], check(n)) for n in names])
    tensors = {}
    for name, raw in zip(names, views):
        e = at[name][2]
        arr = raw.view(ST_DTYPES[e["dtype"]]).reshape(e["shape"])
        tensors[name] = torch.from_numpy(arr.astype(arr.dtype.newbyteorder("="), copy=False))
    return tensors


def state_difference(mine, published, step, against):
    """The finding of a state (leaves `mine`) whose hash is not step `step`'s: names the first
    differing tensor where the published leaves are known (`published`: a checkpoint's proven
    leaves, Run.published_leaves), else says why it cannot; `against` names the state checked
    ("the replay", "the update")."""
    if published is None:
        return (f"field state_hash: the state hash differs from {against} (the record holds the state's "
                f"root only, and no checkpoint of step {step} gives its leaves to name the tensor)")
    bad = [n for n in sorted(set(mine) | set(published)) if mine.get(n) != published.get(n)]
    what = (f"tensor {bad[0]}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")) if bad else "the state hash"
    return f"field state_hash: {what} differs from {against}"


def _mapped(path, offset, entry):
    """One checkpoint tensor mapped copy-on-write from the file (load_checkpoint(mmap=True))."""
    dtype = ST_DTYPES[entry["dtype"]]
    if math.prod(entry["shape"]) == 0:
        arr = np.empty(entry["shape"], dtype=dtype)
    else:
        arr = np.memmap(path, dtype=dtype, mode="c", offset=offset, shape=tuple(entry["shape"]))
    return torch.from_numpy(arr.astype(arr.dtype.newbyteorder("="), copy=False))


def list_checkpoints(ckpt_dir):
    """[(step, path)] of the checkpoint files in ckpt_dir, sorted by step (reads only)."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), ckpt_dir / m.group(0))
             for m in map(_CKPT_RE.match, os.listdir(ckpt_dir)) if m]
    return sorted(found)


# ----------------------------------------------------------------------------- the run directory
MAX_CONFIG_JSON = 1 << 20


def checkpoint_dir(run_dir):
    return Path(run_dir) / "checkpoints"


def hold_lock(run_dir):
    """Create the run directory (and checkpoints/), take its exclusive lock for this process's
    lifetime, then remove leftover temp files (of checkpoints, anchors, unit lists), which no one
    else can be writing;
    returns the open lock file. A second trainer gets UsageError naming the holder."""
    try:
        os.makedirs(checkpoint_dir(run_dir), exist_ok=True)
        f = open(Path(run_dir) / "lock", "a+")
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
    for directory in (run_dir, checkpoint_dir(run_dir), Path(run_dir) / "units"):
        if os.path.isdir(directory):        # a killed writer's temp files (hashchain.write_atomically)
            remove_temp_files(directory)
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


def prepare_output(run_dir, path, option, directory=False):
    """Check an output path before any work, so that no replay is thrown away at its end, and
    create the folder it goes in (with directory: the folder it is). UsageError, one line, if it
    lies in the run (check_outside), is a folder where a file goes or anything but a folder where
    a folder goes, or its folder cannot be created or written in (a probe file created with
    O_CREAT | O_EXCL | O_NOFOLLOW under a random name, then removed). An existing file is
    replaced, never written through: every output goes through hashchain.write_atomically.
    Without the run directory nothing is created (the command reports the missing run); a
    published run's address (byterange.is_url) is never one of the outputs' folders."""
    check_outside(run_dir, path, option)
    if not byterange.is_url(str(run_dir)) and not os.path.isdir(run_dir):
        return
    shown = str(path) if str(path).isprintable() else ascii(str(path))
    folder = str(path) if directory else (os.path.dirname(str(path)) or ".")
    if directory and os.path.lexists(path) and not os.path.isdir(path):
        raise UsageError(f"{option} {shown} exists and is not a directory: name a directory to write into")
    if not directory and os.path.isdir(path):
        raise UsageError(f"{option} {shown} is a directory: name the file to write")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{option} {shown}: cannot create the folder {folder}: {e.strerror}") from None
    probe = os.path.join(folder, f".repops-probe-{os.urandom(6).hex()}")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"{option} {shown}: cannot write in {folder}: {e.strerror}") from None


def started_run(run_dir):
    """The Run of run_dir (a reader) when its chain holds a genesis record, else None: no run yet,
    or a first line a killed trainer left torn (the trainer repairs it)."""
    if not os.path.isfile(os.path.join(run_dir, "chain.jsonl")):
        return None
    try:
        run = Run(run_dir)
        run.genesis
    except (UsageError, HashChainError):
        return None
    return run


class Run:
    """A run directory opened for reading, or by its writer. `chain` is loaded, not yet verified
    (readers decide how far to verify it); `cfg` and `genesis` come from the genesis record.
    writer=True is the trainer that holds the lock (hold_lock): it repairs a torn chain tail on
    opening, and writes and rejects checkpoints; a reader never changes anything."""

    walk_notes = ()      # a published run's anchors its walks did not use (published.RemoteRun)

    def __init__(self, run_dir, writer=False):
        self.dir = Path(run_dir)
        self.writer = writer
        if not self.dir.is_dir():
            raise UsageError(f"no run directory {run_dir}")
        path = self.dir / "chain.jsonl"
        if not path.exists():
            raise UsageError(f"no chain in {run_dir} (chain.jsonl missing: train first)")
        self.chain = hashchain.Chain(path)
        self.chain.load(repair=writer)

    @property
    def genesis(self):
        """Line 0 (its fields are checked by whoever relies on them: the audit, one by one)."""
        if not self.chain.records:
            if self.chain.broken:
                raise self.chain.broken
            raise UsageError(f"{self.chain.path} has no genesis record")
        return self.chain.records[0]

    def check_versions(self, contract):
        """A run made under another version of SPEC.md (the genesis `spec`; none: v2, or v1 where
        `contract` is missing too) or of the arithmetic contract (`contract`; none: v1) cannot be
        resumed, replayed, sampled, exported or reported by this code, which implements
        hashchain.SPEC and contract `contract`. A version that is not a positive integer (SPEC
        §12.2) names no version at all."""
        genesis = self.genesis
        for field in ("spec", "contract"):
            made = genesis.get(field, 1)
            if not isinstance(made, int) or isinstance(made, bool) or made < 1:
                shown = json.dumps(made)
                what = "a SPEC" if field == "spec" else "an arithmetic contract"
                raise UsageError(f"{self.chain.path}: the genesis record's {field} "
                                 f"{shown if len(shown) <= 40 else shown[:37] + '...'} is not {what} "
                                 "version (a positive integer, SPEC §12.2)")
        made_contract = genesis.get("contract", 1)
        made_spec = genesis.get("spec", 2 if "contract" in genesis else 1)
        if (made_spec, made_contract) != (hashchain.SPEC, contract):
            raise UsageError(f"this run was made under SPEC v{made_spec} and arithmetic contract "
                             f"v{made_contract}; this code implements SPEC v{hashchain.SPEC} and contract "
                             f"v{contract} (SPEC.md, Versions)")

    @property
    def cfg(self):
        """The run's Config: the genesis record's decisive fields, bookkeeping defaults; every
        value in range (config.validate, its LIMITS first), so that no reader builds a model
        from a record that no machine holds."""
        if "config" not in self.genesis:
            raise UsageError(f"{self.chain.path}: the genesis record has no config")
        where = f"{self.chain.path}: genesis config"
        cfg = config.from_record(self.genesis["config"], where)
        try:
            config.validate(cfg, recorded=True)
        except UsageError as e:
            raise UsageError(f"{where}: {e}") from None
        return cfg

    @property
    def vocab_size(self):
        vocab = self.genesis.get("vocab_size")
        if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
            raise UsageError(f"{self.chain.path}: the genesis record has no valid vocab_size")
        return vocab

    def replay_config(self, device, recompute=None, offload=None):
        """The run's config as a replay on this machine runs it (audit.py, unitaudit.py): the
        genesis record's decisive keys; recompute and offload, which change memory and never
        bits, as the trainer chose them (config.json) unless given; no dead-tensor alarm (the
        trainer's, deadcheck.py: not part of what is checked); the device checked
        (config.validate). Its defaults (config.resolve) are the caller's to make explicit, for
        the vocab it trusts: the corpus's (the audit) or the genesis record's (a unit audit)."""
        memory = {k: self.recorded(k, bool, False) if v is None else v
                  for k, v in (("recompute", recompute), ("offload", offload))}
        cfg = dataclasses.replace(self.cfg, device=device, dead_tensor_steps=0, **memory)
        config.validate(cfg, recorded=True)
        return cfg

    def checkpoints(self):
        """[(step, path)] of the checkpoint files, sorted by step."""
        return list_checkpoints(checkpoint_dir(self.dir))

    def record_of(self, step, path):
        """The verified chain record of `step`, whose state the file `path` claims to hold."""
        self.chain.verify(upto=step)
        if step >= len(self.chain):
            raise hashchain.StateMismatch(f"checkpoint {path}: step {step} has no record in the chain")
        return self.chain.records[step]

    def verified_checkpoint(self, step, path, mmap=False):
        """The tensors of the checkpoint of `step`, after verifying the chain up to that step,
        the metadata against the record, its leaves against the record's state hash
        (proven_leaves) and the tensors against those leaves. HashChainError (StateMismatch for
        a file that does not match, naming the first differing tensor) otherwise. mmap: see
        load_checkpoint."""
        record = self.record_of(step, path)
        tensors, meta = load_checkpoint(path, mmap)
        hashchain.verify_state(tensors, record["state_hash"], proven_leaves(meta, record, path))
        return tensors

    def vouch_checkpoint(self, step, path):
        """Check a checkpoint the audit vouches for but does not start from (verified_checkpoint);
        returns a note on what was not checked, or None (a local file is checked whole)."""
        self.verified_checkpoint(step, path, mmap=True)
        return None

    def published_leaves(self, step):
        """{name: leaf} of the state after `step` as the run published it, or None: the leaves of
        its checkpoint's header, proven against the record's state hash (a record holds the root
        only). They name the first tensor of a replayed state that differs."""
        path = dict(self.checkpoints()).get(step)
        if path is None or step >= len(self.chain):
            return None
        try:
            record = self.record_of(step, path)
            with self.open_file(path) as f:
                return proven_leaves(read_header(f, path)[2], record, path)
        except HashChainError:
            return None

    def open_file(self, path):
        """A byterange file of the run's file `path` (a checkpoint), for read_header and proved_tensors."""
        return byterange.LocalFile(path, "checkpoint", CheckpointError)

    def file(self, name, check=None):
        """The local path of the run's file `name` (units/step_<s>.json), or None if the run has
        none; check(bytes) is for a published run's copy (it is cached only when it checks)."""
        path = self.dir / name
        return path if path.exists() else None

    def size(self, path):
        """Bytes of the run's file `path` that an audit reads (a published run's reads are
        counted by byterange: 0 here)."""
        return os.path.getsize(path)

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
            except (hashchain.StateMismatch, CheckpointError) as e:
                on_bad(step, path, e)
        return 0, None

    def save_checkpoint(self, tensors, record, leaves):
        """Write the checkpoint of the state `tensors`, whose leaves are `leaves` and whose record
        (genesis or step) is `record`: checkpoints/step_<step>.safetensors, atomically (the writer
        only). Its header holds the leaves, which hash to the record's state hash (proven_leaves)."""
        assert self.writer, "only the run's writer writes checkpoints"
        step = record["step"]
        save_checkpoint(checkpoint_path(checkpoint_dir(self.dir), step), tensors,
                        {"step": step, "state_hash": record["state_hash"], "tensor_hashes": leaves})

    def reject_checkpoint(self, path):
        """Move a checkpoint that failed verification to rejected/ (never overwrite or delete it:
        it is evidence); returns the new path (the writer only)."""
        assert self.writer, "only the run's writer moves checkpoints"
        dest_dir = self.dir / "rejected"
        dest_dir.mkdir(exist_ok=True)
        dest, n = dest_dir / Path(path).name, 1
        while dest.exists():
            dest, n = dest_dir / f"{Path(path).name}.{n}", n + 1
        os.rename(path, dest)
        return dest

    def config_json_bytes(self):
        """(where, the bytes of config.json, at most MAX_CONFIG_JSON + 1 of them), or None when
        the run has none."""
        path = self.dir / "config.json"
        if not path.exists():
            return None
        with hashchain.open_regular(path, "config") as f:
            return path, f.read(MAX_CONFIG_JSON + 1)

    @functools.cached_property
    def _config_json(self):
        """(config.json as a dict, or None when it is missing; the error that makes it unusable,
        or None), read once: config.json is for people, the genesis record is what counts."""
        try:
            found = self.config_json_bytes()
            if found is None:
                return None, None
            path, raw = found
            if len(raw) > MAX_CONFIG_JSON:
                raise ValueError("larger than 1 MiB")
            recorded = hashchain.strict_json(raw.decode("utf-8"))
            if not isinstance(recorded, dict):
                raise ValueError("not a JSON object")
        except (UnicodeDecodeError, ValueError) as e:
            return None, UsageError(f"{path} is not a config file: {e}")
        except hashchain.HashChainError as e:
            return None, e
        return recorded, None

    def config_json_differences(self):
        """Decisive keys on which config.json disagrees with the genesis record ([] if equal or
        absent); UsageError (HashChainError) if it is there but not a config file."""
        recorded, error = self._config_json
        if error:
            raise error
        decisive = {k: v for k, v in (recorded or {}).items() if k not in config.BOOKKEEPING}
        return config.differences(decisive, self.genesis.get("config", {})) if recorded is not None else []

    def recorded(self, key, kind, default):
        """A bookkeeping value as config.json records it (where the data lives, whether the
        trainer recomputed activations): not part of what is audited; `default` when
        config.json is missing, unreadable or has no such value of type `kind`."""
        value = (self._config_json[0] or {}).get(key)
        return value if isinstance(value, kind) and value != "" else default

    def resumed_config(self, argv, given):
        """(config, note) of a resume of this run from the command line `argv` (whose keys are
        `given`, config.given_keys): the genesis record's decisive keys, which decide; config.json's
        bookkeeping keys (where the data lives, how often to checkpoint, ...), which are for people
        and may be overridden; then argv's keys. A decisive key given with another value than the
        run's is refused, naming both. note: why config.json's keys were not used, or None."""
        recorded, error = self._config_json
        note = (None if recorded is not None else f"{self.dir}/config.json "
                + (f"is unreadable ({error})" if error else "is missing")
                + "; its bookkeeping keys (data_dir, checkpoint_every, ...) take their defaults")
        defaults = config.Config()
        bookkeeping = {k: self.recorded(k, config.FIELDS[k], getattr(defaults, k))
                       for k in config.BOOKKEEPING - {"run_dir"}}
        run_cfg = dataclasses.replace(self.cfg, run_dir=str(self.dir), **bookkeeping)
        cfg = dataclasses.replace(config.parse_config(argv, run_cfg), run_dir=run_cfg.run_dir)
        for key in sorted(given - config.BOOKKEEPING):
            mine, theirs = getattr(cfg, key), getattr(run_cfg, key)
            if mine != theirs and not (key in ("n_kv_head", "vocab_size") and mine == 0):   # 0: the resolved default
                more = (f"; to train on from its end, start a new run from it: --run_dir=NEW --init_from={self.dir}"
                        if key == "max_steps" else "; leave it out, or start another --run_dir")
                raise UsageError(f"--{key}={config.spelled(mine)} differs from the run's {config.spelled(theirs)} "
                                 f"({self.dir}'s genesis record): a run resumes with its own config{more}")
        return cfg, note

    def recorded_data_dir(self):
        """The corpus the run was trained on, as config.json names it."""
        return self.recorded("data_dir", str, config.Config.data_dir)
