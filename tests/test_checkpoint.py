"""Tests for the checkpoint files of rundir.py: bit-exact round trip, listing, atomic writes under SIGKILL, and
hostile files (FIFOs, truncation, garbage headers, bad offsets) refused with one-line errors."""

import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import rundir
import hashchain as hc
from test_hashchain import sample_state

REPO = Path(__file__).resolve().parent.parent


def test_checkpoint_round_trip_bit_exact(tmp_path):
    s = sample_state()
    s["nan"] = torch.tensor([float("nan"), -0.0, float("inf")])
    root, leaves = hc.state_hash(s)
    path = rundir.checkpoint_path(tmp_path / "ck", 10)
    meta = {"step": 10, "state_hash": root, "tensor_hashes": leaves}
    rundir.save_checkpoint(path, s, meta)
    t, m = rundir.load_checkpoint(path)
    assert m == meta
    assert list(t) == sorted(s)
    for k in s:
        assert t[k].dtype == s[k].dtype and t[k].shape == s[k].shape
        assert (t[k].reshape(-1).view(torch.uint8).tolist()
                == s[k].reshape(-1).view(torch.uint8).tolist())
    hc.verify_state(t, root, leaves)
    # The header is standard safetensors: length, JSON, data in name order.
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    assert json.loads(header["__metadata__"]["repops"]) == meta
    assert header["wte"] == {"dtype": "F32", "shape": [7, 5],
                             "data_offsets": header["wte"]["data_offsets"]}
    assert len(raw) == 8 + n + max(v["data_offsets"][1] for k, v in header.items()
                                   if k != "__metadata__")


def test_list_checkpoints_reads_only_and_temp_cleanup_is_explicit(tmp_path):
    d = tmp_path / "ck"
    for step in (200, 3, 100):
        rundir.save_checkpoint(rundir.checkpoint_path(d, step), {"x": torch.ones(1)}, {"step": step})
    temp = d / ".step_00000300.safetensors.tmp-0123456789ab"
    temp.write_bytes(b"partial")
    (d / "notes.txt").write_text("ignored")
    assert rundir.list_checkpoints(d) == [(3, rundir.checkpoint_path(d, 3)),
                                      (100, rundir.checkpoint_path(d, 100)),
                                      (200, rundir.checkpoint_path(d, 200))]
    assert temp.exists()        # listing (what readers do) never deletes anything
    rundir.remove_temp_files(d)     # what the lock-holding trainer does
    assert not temp.exists() and (d / "notes.txt").exists()
    assert rundir.list_checkpoints(tmp_path / "missing") == []


def test_fifo_and_directory_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "step_00000001.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(rundir.CheckpointError, match="not a regular file"):
        rundir.load_checkpoint(fifo)          # opening a FIFO for reading would block forever
    chain_dir = tmp_path / "chain.jsonl"
    chain_dir.mkdir()
    with pytest.raises(hc.HashChainError, match="not a regular file"):
        hc.Chain(chain_dir).load(repair=False)


def test_huge_shape_in_header_is_malformed_not_a_crash(tmp_path):
    path = tmp_path / "c.safetensors"
    header = json.dumps({"__metadata__": {"repops": "{}"},
                         "x": {"dtype": "F32", "shape": [2 ** 63, 0], "data_offsets": [0, 0]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(rundir.CheckpointError, match="malformed header entry"):
        rundir.load_checkpoint(path)
    deep = b"[" * 100_000 + b"]" * 100_000
    path.write_bytes(len(deep).to_bytes(8, "little") + deep)
    with pytest.raises(rundir.CheckpointError, match="not valid JSON"):
        rundir.load_checkpoint(path)


# Saves two precomputed states alternately, so nearly all of its time is spent inside
# save_checkpoint and a random kill usually lands mid-write.
WRITER = """
import sys, torch, rundir, hashchain as hc
path = sys.argv[1]
states = []
for i in range(2):
    t = {"a": torch.full((1_500_000 + i,), float(i)), "b": torch.arange(1_000_000) + i}
    root, leaves = hc.state_hash(t)
    states.append((t, {"step": i, "state_hash": root, "tensor_hashes": leaves}))
print("ready", flush=True)
while True:
    for t, meta in states:
        rundir.save_checkpoint(path, t, meta)
"""


def test_sigkill_during_save_leaves_no_partial_file(tmp_path):
    rng = random.Random(1234)
    d = tmp_path / "ck"
    path = rundir.checkpoint_path(d, 10)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for _ in range(6):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], env=env,
                             stdout=subprocess.PIPE)
        assert p.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.0, 0.3))
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        listed = rundir.list_checkpoints(d)          # a killed write's temp file is never listed
        rundir.remove_temp_files(d)                  # and the next lock holder removes it
        assert [f.name for f in d.iterdir()] == ([path.name] if path.exists() else [])
        if path.exists():
            assert listed == [(10, path)]
            t, meta = rundir.load_checkpoint(path)
            hc.verify_state(t, meta["state_hash"], meta["tensor_hashes"])
            assert t["a"][0].item() == meta["step"]


def _saved(tmp_path):
    s = {"a": torch.arange(4, dtype=torch.float32), "b": torch.arange(5, dtype=torch.int64),
         "c": torch.ones(3)}
    root, leaves = hc.state_hash(s)
    path = rundir.checkpoint_path(tmp_path, 10)
    rundir.save_checkpoint(path, s, {"step": 10, "state_hash": root, "tensor_hashes": leaves})
    return path


def _write_raw(path, header, data):
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def test_truncated_checkpoint(tmp_path):
    path = _saved(tmp_path)
    full = path.read_bytes()
    path.write_bytes(full[:-5])
    with pytest.raises(rundir.CheckpointError) as e:
        rundir.load_checkpoint(path)
    msg = str(e.value)
    assert str(path) in msg and "truncated" in msg
    assert f"expected {len(full)} bytes, found {len(full) - 5}" in msg and "\n" not in msg
    path.write_bytes(full[:20])  # cut inside the header
    with pytest.raises(rundir.CheckpointError, match="truncated"):
        rundir.load_checkpoint(path)
    path.write_bytes(full + b"x")
    with pytest.raises(rundir.CheckpointError, match="trailing data"):
        rundir.load_checkpoint(path)


def test_garbage_header(tmp_path):
    path = _saved(tmp_path)
    full = path.read_bytes()
    path.write_bytes(os.urandom(64) + full[64:])
    with pytest.raises(rundir.CheckpointError, match="header length|truncated|not valid JSON"):
        rundir.load_checkpoint(path)
    n = struct.unpack("<Q", full[:8])[0]
    path.write_bytes(full[:8] + b"{" * n + full[8 + n:])
    with pytest.raises(rundir.CheckpointError, match="not valid JSON") as e:
        rundir.load_checkpoint(path)
    assert str(path) in str(e.value)
    with pytest.raises(rundir.CheckpointError, match="cannot be opened"):
        rundir.load_checkpoint(tmp_path / "nope.safetensors")


def test_bad_offsets_dtype_shape(tmp_path):
    path = tmp_path / "bad.safetensors"
    md = {"repops": json.dumps({"step": 1})}
    def entry(dtype, shape, begin, end):
        return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
    _write_raw(path, {"__metadata__": md, "a": entry("F32", [2], 0, 8),
                      "b": entry("F32", [2], 12, 20)}, bytes(20))
    with pytest.raises(rundir.CheckpointError, match="non-contiguous data offsets at tensor 'b'"):
        rundir.load_checkpoint(path)
    _write_raw(path, {"__metadata__": md, "a": entry("F32", [3], 0, 8)}, bytes(8))
    with pytest.raises(rundir.CheckpointError, match="inconsistent tensor 'a'"):
        rundir.load_checkpoint(path)
    _write_raw(path, {"__metadata__": md, "a": entry("F64", [1], 0, 8)}, bytes(8))
    with pytest.raises(rundir.CheckpointError, match="malformed header entry for tensor 'a'"):
        rundir.load_checkpoint(path)
    _write_raw(path, {"a": entry("F32", [1], 0, 4)}, bytes(4))
    with pytest.raises(rundir.CheckpointError, match="__metadata__"):
        rundir.load_checkpoint(path)
    _write_raw(path, {"__metadata__": md, "a": entry("U8", [4], 0, 4)}, bytes(4))
    t, meta = rundir.load_checkpoint(path)  # and a well-formed hand-written file does load
    assert meta == {"step": 1} and t["a"].tolist() == [0, 0, 0, 0]


def test_bit_flip_names_tensor(tmp_path):
    path = _saved(tmp_path)
    raw = bytearray(path.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    begin = json.loads(raw[8:8 + n])["b"]["data_offsets"][0]
    raw[8 + n + begin + 9] ^= 0x10
    path.write_bytes(bytes(raw))
    t, meta = rundir.load_checkpoint(path)
    with pytest.raises(hc.StateMismatch) as e:
        hc.verify_state(t, meta["state_hash"], meta["tensor_hashes"])
    assert e.value.tensor == "b" and "'b'" in e.value.message
    with pytest.raises(hc.StateMismatch) as e:
        hc.verify_state(t, meta["state_hash"], None)
    assert e.value.tensor is None and meta["state_hash"] in str(e.value)
    del t["b"]
    with pytest.raises(hc.StateMismatch) as e:
        hc.verify_state(t, meta["state_hash"], meta["tensor_hashes"])
    assert e.value.tensor == "b" and "missing" in str(e.value)
