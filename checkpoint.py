"""Checkpoints: safetensors-compatible files of the training state, written atomically, loaded
without pickle (our own reader and writer; the tensor bytes are hashchain's canonical bytes).

    import checkpoint
    path = checkpoint.checkpoint_path("runs/x/checkpoints", 100)   # .../step_00000100.safetensors
    checkpoint.save_checkpoint(path, tensors, {"step": 100, "state_hash": root,
                                               "tensor_hashes": leaves})
    tensors, meta = checkpoint.load_checkpoint(path)
    tensors, meta = checkpoint.load_checkpoint(path, mmap=True)   # each tensor mapped when read
    hashchain.verify_state(tensors, meta["state_hash"], meta["tensor_hashes"])
    for step, path in checkpoint.list_checkpoints("runs/x/checkpoints"): ...

A file is 8 bytes (little-endian header length n), n bytes of JSON header ({"__metadata__":
{"repops": the meta as JSON}, and per tensor {"dtype", "shape", "data_offsets"}}, name-sorted,
space-padded to 8 bytes), then the tensors' canonical little-endian bytes in name order. It is
read as hostile input: a regular file only, strict JSON, every offset and size checked against
the file; every error is a CheckpointError (a hashchain.HashChainError) with a one-line message.
"""

import json
import math
import os
import re
import secrets
from pathlib import Path

import numpy as np
import torch

import offload
from hashchain import (ST_DTYPES, HashChainError, canonical_tensor, fsync_dir, is_int, kill_point,
                       open_regular, strict_json, write_all)


class CheckpointError(HashChainError):
    """A checkpoint file is missing, malformed, truncated or inconsistent."""


_MAX_HEADER = 100 * 1024 * 1024  # the limit the safetensors reference reader uses
_CKPT_RE = re.compile(r"^step_(\d{8,})\.safetensors$")
# A checkpoint being written is ".step_N.safetensors.tmp-<random>" until its rename. Only the
# trainer holding the run's lock removes leftovers (remove_temp_files): under the lock no other
# writer exists, so every hidden ".*.tmp*" file is one, whoever named it (a pid, an older
# version); readers ignore them.
_TMP_RE = re.compile(r"^\..+\.tmp")
# Header dimensions beyond this cannot describe a real file and would overflow numpy's shapes.
_MAX_DIM = 1 << 48


def checkpoint_path(ckpt_dir, step):
    return Path(ckpt_dir) / f"step_{step:08d}.safetensors"


def remove_temp_files(directory):
    """Delete leftover checkpoint temp files. Only the writer that holds the run's lock may call
    this: no one else can be writing one."""
    for entry in os.scandir(directory):
        if _TMP_RE.match(entry.name) and entry.is_file(follow_symlinks=False):
            os.unlink(entry.path)


def save_checkpoint(path, tensors, meta):
    """Write tensors + metadata atomically: a crash leaves either no file or a complete one
    (the bytes go to a temp file, through hashchain.write_all: REPOPS_SLOW_WRITE slows them for
    the SIGKILL test; then fsync and rename)."""
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

    tmp = path.parent / f".{path.name}.tmp-{secrets.token_hex(6)}"
    try:
        with open(tmp, "wb") as f:
            write_all(f, len(hbytes).to_bytes(8, "little") + hbytes)
            for name in sorted(tensors):   # fetched again: one tensor held at a time (offload.py)
                write_all(f, memoryview(canonical_tensor(name, tensors[name])[3]))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)  # make the rename itself durable
    kill_point(f"rename:{path.name}")   # REPOPS_KILL_AT: the SIGKILL tests' moment


def load_checkpoint(path, mmap=False):
    """(tensors, meta) from a checkpoint, strictly validated; never executes code. With mmap,
    tensors is a Mapping that maps each tensor from the file when it is read (copy-on-write;
    nothing is read before): memory for one tensor at a time, for states larger than memory."""
    path = Path(path)

    def bad(what):
        return CheckpointError(f"checkpoint {path} {what}")

    with open_regular(path, "checkpoint", CheckpointError) as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise bad(f"is truncated: expected at least 8 bytes, found {size}")
        n = int.from_bytes(f.read(8), "little")
        if n > _MAX_HEADER:
            raise bad(f"has an implausible header length {n} (garbage at the start of the file?)")
        if 8 + n > size:
            raise bad(f"is truncated: header needs {8 + n} bytes, found {size}")
        try:
            header = strict_json(f.read(n).decode("utf-8"))
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

        if mmap:
            where = {name: (8 + n + begin, e) for begin, _, name, e in entries}
            return offload.LazyTensors(sorted(where), lambda name: _mapped(path, *where[name])), meta
        # Read each tensor straight into its own freshly allocated (aligned) buffer: one copy,
        # no second in-memory image of the file.
        tensors = {}
        for begin, stop, name, e in entries:
            arr = np.empty(e["shape"], dtype=ST_DTYPES[e["dtype"]])
            buf = memoryview(arr.reshape(-1).view(np.uint8))
            got = 0
            while got < len(buf):
                k = f.readinto(buf[got:])
                if not k:
                    raise bad(f"is truncated: file shrank while reading tensor {name!r}")
                got += k
            tensors[name] = torch.from_numpy(arr.astype(arr.dtype.newbyteorder("="), copy=False))
    return {name: tensors[name] for name in sorted(tensors)}, meta


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
