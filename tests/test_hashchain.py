"""Tests for hashchain.py: state hashing and the chain file (checkpoints: test_checkpoint.py)."""

import hashlib
import json
import struct

import pytest
import torch

import rundir
import hashchain as hc


def sample_state():
    g = torch.Generator().manual_seed(0)
    return {
        "wte": torch.randn(7, 5, generator=g),
        "opt.m.wte": torch.randn(7, 5, generator=g),
        "step": torch.tensor(42, dtype=torch.int64),
        "qstate": torch.arange(6, dtype=torch.int32).reshape(2, 3),
        "bytes": torch.tensor([0, 1, 255], dtype=torch.uint8),
        "empty": torch.zeros(0, 3),
    }


# --- state hash ------------------------------------------------------------------------------

def test_leaf_changes_on_bit_name_dtype_shape():
    t = torch.tensor([1.0, 2.0, 3.0, 4.0])
    base = hc.tensor_leaf("w", t)
    flipped = t.clone()
    flipped.view(torch.int32)[2] ^= 1  # lowest mantissa bit of one element
    assert hc.tensor_leaf("w", flipped) != base
    assert hc.tensor_leaf("w2", t) != base
    assert hc.tensor_leaf("w", t.view(torch.int32)) != base  # same bytes, other dtype
    assert hc.tensor_leaf("w", t.reshape(2, 2)) != base      # same bytes, other shape
    assert hc.tensor_leaf("w", t.clone()) == base


def test_leaf_of_noncontiguous_equals_contiguous():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert hc.tensor_leaf("x", t.t()) == hc.tensor_leaf("x", t.t().contiguous())


def test_unsupported_dtype_refused():
    with pytest.raises(hc.HashChainError, match="float64"):
        hc.tensor_leaf("x", torch.zeros(2, dtype=torch.float64))


def test_root_independent_of_insertion_order():
    s = sample_state()
    reversed_s = dict(reversed(list(s.items())))
    root, leaves = hc.state_hash(s)
    root2, leaves2 = hc.state_hash(reversed_s)
    assert root == root2 and leaves == leaves2
    assert list(leaves) == sorted(s)


def _ref_leaf(name, dtype, shape, payload):
    return hashlib.sha256(b"repops-tensor-v1\0" + name.encode() + b"\0" + dtype.encode() + b"\0"
                          + json.dumps(shape).replace(" ", "").encode() + b"\0"
                          + payload).hexdigest()


def _ref_root(leaves):
    # Recursive formulation (largest power of two on the left) of the same tree, so this is not
    # a transcription of the iterative code under test.
    nodes = [hashlib.sha256(b"\x00" + bytes.fromhex(x)).digest() for x in leaves]

    def build(ns):
        if len(ns) == 1:
            return ns[0]
        k = 1
        while k * 2 < len(ns):
            k *= 2
        return hashlib.sha256(b"\x01" + build(ns[:k]) + build(ns[k:])).digest()
    return build(nodes).hex() if nodes else hashlib.sha256(b"").hexdigest()


def test_golden_leaf_and_merkle():
    state = {
        "b": torch.tensor([1.5, -2.0, 0.25]),
        "a": torch.tensor([[1, 2], [3, -4]], dtype=torch.int64),
        "c": torch.tensor(7, dtype=torch.int32),
        "d": torch.tensor([9, 8, 7], dtype=torch.uint8),
        "e": torch.tensor([[0.1]]),
    }
    want = {
        "a": _ref_leaf("a", "int64", [2, 2], struct.pack("<4q", 1, 2, 3, -4)),
        "b": _ref_leaf("b", "float32", [3], struct.pack("<3f", 1.5, -2.0, 0.25)),
        "c": _ref_leaf("c", "int32", [], struct.pack("<i", 7)),
        "d": _ref_leaf("d", "uint8", [3], bytes([9, 8, 7])),
        "e": _ref_leaf("e", "float32", [1, 1], struct.pack("<f", 0.1)),
    }
    root, leaves = hc.state_hash(state)
    assert leaves == want
    assert root == _ref_root([want[k] for k in sorted(want)])
    for n in range(1, 8):  # odd promotion at several levels
        xs = [hashlib.sha256(bytes([i])).hexdigest() for i in range(n)]
        assert hc.merkle_root(xs) == _ref_root(xs)
    assert hc.merkle_root([]) == \
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_merkle_proofs():
    for n in range(1, 34):   # promoted odd nodes at every level somewhere in this range
        raw = [hashlib.sha256(bytes([i, n])).digest() for i in range(n)]
        xs = [x.hex() for x in raw]
        root = _ref_root(xs)
        assert hc.merkle_root(xs) == root
        proofs = hc.merkle_proofs(b"".join(raw), range(n))
        for i in range(n):
            assert hc.merkle_root_from_proof(raw[i], i, n, proofs[i]) == root
            if n > 1:        # another leaf, position or sibling implies another root
                assert hc.merkle_root_from_proof(raw[(i + 1) % n], i, n, proofs[i]) != root
                assert hc.merkle_root_from_proof(raw[i], (i + 1) % n, n, proofs[(i + 1) % n]) != root
                bad = list(proofs[i])
                bad[0] = hashlib.sha256(bad[0].encode()).hexdigest()
                assert hc.merkle_root_from_proof(raw[i], i, n, bad) != root
    raw = [hashlib.sha256(bytes([i])).digest() for i in range(5)]
    proof = hc.merkle_proofs(b"".join(raw), [2])[2]
    for bad in (proof[:-1], proof + [proof[0]], ["zz" * 32] + proof[1:], [proof[0][:10]] + proof[1:]):
        with pytest.raises(ValueError):
            hc.merkle_root_from_proof(raw[2], 2, 5, bad)
    with pytest.raises(ValueError):
        hc.merkle_root_from_proof(raw[2], 5, 5, proof)


# --- chain -----------------------------------------------------------------------------------

def test_chain_writer_refuses_non_finite_numbers(tmp_path):
    c = hc.Chain(tmp_path / "chain.jsonl")
    c.load()
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(hc.HashChainError, match="non-finite"):
            c.append({"step": 0, "loss": bad})
    assert not (tmp_path / "chain.jsonl").exists() or (tmp_path / "chain.jsonl").read_bytes() == b""


def test_f32_bits():
    assert hc.f32_bits(1.0) == "0x3f800000"
    assert hc.f32_bits(-0.0) == "0x80000000"
    x = torch.tensor(0.1).item()  # a float32 value held in a Python float
    assert hc.bits_f32(hc.f32_bits(x)) == x
    assert hc.f32_bits(x) == "0x%08x" % struct.unpack("<I", struct.pack("<f", x))[0]
    with pytest.raises(hc.HashChainError):
        hc.bits_f32("3f800000")


def make_chain(path, n=10):
    c = hc.Chain(path)
    c.load()
    c.append({"step": 0, "config": {"lr": 3e-4}, "state_hash": "ab" * 32})
    for k in range(1, n):
        c.append({"step": k, "run": c.records[0]["record_hash"], "loss": 2.5 / k, "loss_bits": hc.f32_bits(2.5 / k)})
    return c


def test_record_hash_and_seal():
    r = hc.seal({"step": 0, "x": [1, 2]}, hc.GENESIS_PREV)
    body = json.dumps({"prev": "0" * 64, "step": 0, "x": [1, 2]}, separators=(",", ":"))
    assert r["record_hash"] == hashlib.sha256(body.encode()).hexdigest()
    assert hc.record_hash(r) == r["record_hash"]


def test_chain_round_trip(tmp_path):
    path = tmp_path / "chain.jsonl"
    c = make_chain(path)
    c.verify()
    d = hc.Chain(path)
    assert d.load() is None
    assert d.records == c.records and len(d) == 10 and d.head == c.head
    assert d.records[0]["prev"] == hc.GENESIS_PREV
    assert d.records[5]["prev"] == d.records[4]["record_hash"]
    d.verify()
    with pytest.raises(hc.ChainError, match="expected step 10"):
        d.append({"step": 12})


def test_torn_last_line_repaired(tmp_path):
    path = tmp_path / "chain.jsonl"
    make_chain(path, 4)
    good = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b'{"step":4,"loss":1.2')
    c = hc.Chain(path)
    assert c.load(repair=False) is not None
    assert path.read_bytes() == good + b'{"step":4,"loss":1.2'  # a reader may leave it alone
    note = c.load()
    assert "torn" in note and c.note == note
    assert path.read_bytes() == good and len(c) == 4
    c.append({"step": 4, "run": c.records[0]["record_hash"]})
    assert hc.Chain(path).load() is None
    c.verify()


def test_slow_write_hook_changes_timing_not_bytes(tmp_path, monkeypatch):
    # REPOPS_SLOW_WRITE (the SIGKILL test's hook): the same chain and checkpoint bytes, sent in
    # SLOW_WRITE_PIECES flushed pieces; a piece is on disk while the writer sleeps.
    make_chain(tmp_path / "plain.jsonl")
    rundir.save_checkpoint(tmp_path / "plain.safetensors", sample_state(), {"step": 3})
    monkeypatch.setenv(hc.SLOW_WRITE_ENV, "0.0001")
    seen = []
    monkeypatch.setattr(hc.time, "sleep", lambda s: seen.append(s))
    make_chain(tmp_path / "slow.jsonl")
    assert len(seen) == 10 * (hc.SLOW_WRITE_PIECES - 1)          # 10 records, 7 sleeps each
    rundir.save_checkpoint(tmp_path / "slow.safetensors", sample_state(), {"step": 3})
    assert (tmp_path / "slow.jsonl").read_bytes() == (tmp_path / "plain.jsonl").read_bytes()
    assert (tmp_path / "slow.safetensors").read_bytes() == (tmp_path / "plain.safetensors").read_bytes()

    path = tmp_path / "pieces.txt"
    with open(path, "w") as f:                       # text, as the anchors file is written
        def peek(_):
            seen.append(path.read_text())            # what a reader sees during the sleep
        monkeypatch.setattr(hc.time, "sleep", peek)
        seen.clear()
        hc.write_all(f, "abcdefghijklmnop\n")
    assert seen == ["abcdefghijklmnop"[:2 * i] for i in range(1, 8)]
    assert path.read_text() == "abcdefghijklmnop\n"


def _broken_at(path):
    c = hc.Chain(path)
    c.load(repair=False)
    with pytest.raises(hc.ChainError) as e:
        c.verify()
    return c, e.value


def test_garbage_line(tmp_path):
    path = tmp_path / "chain.jsonl"
    make_chain(path, 5)
    lines = path.read_bytes().split(b"\n")
    lines[3] = b"not json at all"
    path.write_bytes(b"\n".join(lines))
    c, e = _broken_at(path)
    assert e.line == 4 and "line 4" in str(e)
    assert len(c) == 3 and c.lines == 5         # the records before the break are kept
    with pytest.raises(hc.ChainError):
        c.append({"step": 3})                   # a broken chain is never extended
    c.verify(upto=2)                            # the prefix is sound
    lines[3] = b'{"step": 3}'
    path.write_bytes(b"\n".join(lines))
    assert "line 4 (step 3): not a chain record" in str(_broken_at(path)[1])


@pytest.mark.parametrize("line,why", [
    (b'{"step":3,"loss":NaN,"prev":"","record_hash":""}', "NaN"),
    (b'{"step":3,"loss":Infinity,"prev":"","record_hash":""}', "Infinity"),
    (b'{"step":3,"loss":1,"loss":2,"prev":"","record_hash":""}', "duplicate key 'loss'"),
    (b'{"step":3,"x":' + b"[" * 50_000 + b"]" * 50_000 + b',"prev":"","record_hash":""}', "nested too deeply"),
], ids=["nan", "infinity", "duplicate_key", "deep_nesting"])
def test_non_standard_json_is_a_break_at_that_line(tmp_path, line, why):
    path = tmp_path / "chain.jsonl"
    make_chain(path, 5)
    lines = path.read_bytes().split(b"\n")
    lines[3] = line
    path.write_bytes(b"\n".join(lines))
    _, e = _broken_at(path)
    assert e.line == 4 and why in str(e)


def _rewrite(path, fn):
    lines = path.read_text().splitlines()
    path.write_text("".join(line + "\n" for line in fn(lines)))
    c = hc.Chain(path)
    c.load()
    with pytest.raises(hc.ChainError) as e:
        c.verify()
    return e.value


def test_edited_record_named(tmp_path):
    path = tmp_path / "chain.jsonl"
    make_chain(path)

    def edit(lines):
        rec = json.loads(lines[6])
        rec["loss"] = rec["loss"] * 0.5
        lines[6] = json.dumps(rec)
        return lines
    e = _rewrite(path, edit)
    assert e.line == 7
    assert str(e) == (f"{path} line 7 (step 6): record hash does not match its contents "
                      "(edited?)")


def test_reordered_and_missing_records(tmp_path):
    path = tmp_path / "chain.jsonl"
    make_chain(path)
    original = path.read_text()
    e = _rewrite(path, lambda ls: ls[:3] + [ls[4], ls[3]] + ls[5:])
    assert e.line == 4
    path.write_text(original)
    e = _rewrite(path, lambda ls: ls[:5] + ls[6:])
    assert e.line == 6 and "missing" in str(e)
    path.write_text(original)

    def resealed_gap(lines):  # a deletion hidden by re-sealing the rest: step numbers give it away
        recs = [json.loads(x) for x in lines[:5] + lines[6:]]
        for i in range(5, len(recs)):
            recs[i] = hc.seal(recs[i], recs[i - 1]["record_hash"])
        return [json.dumps(r) for r in recs]
    e = _rewrite(path, resealed_gap)
    assert e.line == 6 and "expected step 5" in str(e)


def test_a_record_of_another_run_breaks_the_chain(tmp_path):
    """SPEC §12.4: every step record names its run (the genesis record's hash). A record whose
    `run` is another's, resealed with every record after it so that every hash and link holds,
    breaks the chain at its step: a local verification and a walk from an anchor agree."""
    path = tmp_path / "chain.jsonl"
    make_chain(path)

    def other_run(lines):
        recs = [json.loads(x) for x in lines]
        recs[4]["run"] = "cd" * 32
        for i in range(4, len(recs)):
            recs[i] = hc.seal({k: v for k, v in recs[i].items() if k not in ("prev", "record_hash")},
                              recs[i - 1]["record_hash"])
        return [json.dumps(r) for r in recs]
    e = _rewrite(path, other_run)
    assert e.line == 5 and "its run is not this chain's genesis record hash" in str(e)
