"""Audits of a published run from its address (publish.py, published.py, byterange.py), against
real servers on loopback, each on an ephemeral port:

- nginx (Debian's package: .ci/run installs it), started here with a temporary config, serving
  the public copy, which honours ranges: a micro-batch, a fold node, the update and a whole
  step audited over HTTP give the verdicts and receipts of the local audit of the same run; a
  micro-batch audit fetches the records of its walk, the checkpoint's header and parameters and
  the corpus's chunks, nothing else, and a second unit of the step nothing it had fetched;
  report.py, --anchors and --check_receipts work from the address too, and a child run's lineage
  is checked against its parent's address;
- the run's anchors are signed (its genesis names the publisher's key): a walk starts only from
  an anchor whose signature verifies; a forged one on the server is not used (a note says so, and
  the audit still matches), and `--anchors` with it is a MISMATCH;
- a tampered byte on the server (a tensor, a record, a token chunk, a unit list) is MISMATCH
  naming the file, exit 1; a cached piece changed on disk is dropped and fetched again;
- Python's http.server, which ignores ranges, and a stdlib server that injects faults (a
  dropped connection, a truncated body, a slow answer, a body trickled in pieces, a 404, a refused
  connection): each is one line, exit 2, within a bounded time; a transient 503 is retried and
  the audit goes on;
- the publication itself: its index and chain.offsets checked by the NumPy replay (SPEC §22),
  no secret or lock in it, an --out inside the run or holding another run refused;
- a record does not grow with the tensor count (SPEC v7: its fields are fixed).
"""
import contextlib
import http.server
import json
import os
import shutil
import socket
import struct
import sys
import threading
import time
import urllib.request

import pytest

import byterange
import hashchain
import publish
import published
import rundir
import unitaudit
import units
import receipts
import signing
from tiny import (ROOT, TIMEOUT, assert_one_line_error, run_process, script, start_process, stop_process,
                  write_roster)
from unit_runs import audit, train_in_process

STEP = 5            # audited: its state before is checkpoint 4 (unit_runs: a checkpoint every 4 steps)
ANCHORS = "--anchor_every=3"      # anchors at 3 and 6: step 5 is reached from 6, step 7 from the head
SMALL = {published.INDEX, "anchors.jsonl", "config.json", "corpus/manifest.json"}   # fetched by every audit


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def unit_run(corpus, keys, tmp_path_factory):
    """The unit run, its genesis naming the publisher's key: its anchors are signed."""
    return train_in_process(tmp_path_factory.mktemp("remote") / "run", corpus, ANCHORS,
                            f"--publisher_key={keys['publisher']}")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The folder nginx serves (each test puts its copies under it)."""
    return tmp_path_factory.mktemp("served")


@pytest.fixture(scope="module")
def public(unit_run, corpus, served):
    code = publish.main(["--run_dir", str(unit_run), "--out", str(served / "run"), "--corpus", str(corpus)])
    assert code == 0
    return served / "run"


@pytest.fixture
def nginx(served, tmp_path_factory):
    """Debian's nginx on an ephemeral port, serving `served`: one process, started for each test
    (in 50 ms: tests/conftest.py stops every process a test started when the test ends)."""
    exe = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)
    if exe is None:
        pytest.skip("nginx is not installed (.ci/run installs Debian's nginx)")
    conf = tmp_path_factory.mktemp("nginx")
    for _ in range(5):
        port = free_port()
        temp = "\n".join(f"  {k}_temp_path {conf}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        (conf / "nginx.conf").write_text(
            f"daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log {conf}/error.log;\npid {conf}/nginx.pid;\n"
            f"events {{ worker_connections 64; }}\nhttp {{\n  access_log {conf}/access.log;\n{temp}\n"
            f"  default_type application/octet-stream;\n  server {{ listen 127.0.0.1:{port}; root {served}; }}\n}}\n")
        proc = start_process([exe, "-p", str(conf), "-e", str(conf / "error.log"), "-c", str(conf / "nginx.conf")], stderr=open(conf / "stderr", "w"))
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None:
                    break
                time.sleep(0.05)
        if proc.poll() is None:
            yield f"http://127.0.0.1:{port}"
            stop_process(proc)
            return
    pytest.fail(f"nginx did not start: {(conf / 'stderr').read_text()}")


class Handler(http.server.BaseHTTPRequestHandler):
    """Serves files under `root` with ranges, failing as the first path component says: /ok/...,
    /drop/... (closes without an answer), /truncate/... (half of a range's body), /slow/...
    (answers after SLOW seconds), /flaky/... (503 to the first request for each file), /trickle/...
    (a range's body in pieces of TRICKLE bytes, GAP seconds apart: each gap inside the timeout)."""
    root, seen = None, set()
    SLOW = 3.0
    TRICKLE, GAP = 16, 0.2

    def log_message(self, *args):
        pass

    def do_GET(self):
        mode, _, rest = self.path.lstrip("/").partition("/")
        path = os.path.join(self.root, rest)
        if mode == "drop":
            self.close_connection = True
            return
        if mode == "slow":
            time.sleep(self.SLOW)
        if mode == "flaky" and self.path not in self.seen:
            self.seen.add(self.path)
            self.send_error(503)
            return
        if not os.path.isfile(path):
            self.send_error(404)
            return
        data = open(path, "rb").read()
        wanted = self.headers.get("Range")
        if wanted:
            begin, end = (int(x) for x in wanted.removeprefix("bytes=").split("-"))
            body = data[begin:end + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {begin}-{end}/{len(data)}")
        else:
            body = data
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if mode == "trickle" and wanted:
            for at in range(0, len(body), self.TRICKLE):
                time.sleep(self.GAP)
                self.wfile.write(body[at:at + self.TRICKLE])
            return
        self.wfile.write(body[:len(body) // 2] if mode == "truncate" and wanted else body)


class Quiet(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass                        # a client that gave up (a timeout) is what these tests do


@contextlib.contextmanager
def stdlib_server(handler):
    server = Quiet(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def remote(url, *args, cache, timeout=None):
    """audit.py on the run at `url` (in this process), with its own cache."""
    extra = ["--cache", cache] + (["--timeout", timeout] if timeout else [])
    return audit(url, *args, *extra, in_process=True)


def verdicts(proc):
    return [line for line in proc.stdout.splitlines() if line.startswith(("MATCH", "MISMATCH"))]


def receipt(path):
    """A receipt without what differs between two audits of the same unit: what it cost, the
    machine, and the signature over them."""
    r = json.loads(path.read_text())
    return {k: v for k, v in r.items() if k not in ("cost", "machine", "signature")}


def reveal(unit_run, corpus, unit, out):
    unitaudit.Publisher(unit_run, str(corpus)).reveal(STEP, unit, out)
    return out


# ----------------------------------------------------------------------------- the same audits
UNITS = [("micro_batch:1", ["--micro_batch", "1"]), ("fold:0:2", ["--fold_node", "0:2"]),
         ("update", ["--update"]), ("step", [])]


@pytest.mark.parametrize("unit,options", UNITS, ids=[u for u, _ in UNITS])
def test_every_unit_over_http_gives_the_local_verdict_and_receipt(unit_run, corpus, public, nginx, keys, tmp_path,
                                                                  unit, options):
    """The unit's audit of the public copy on disk (an auditor's download: no secret) and at its
    address: the same MATCH lines and the same receipt (its cost and machine aside). The fold
    node's children and the update's S come from the publisher's reveal (a local folder); the
    update's state before the step is checkpoint 4, fetched by range; a whole step vouches for
    checkpoint 8 by its header."""
    pieces = ["--revealed", reveal(unit_run, corpus, unit, tmp_path / "pub")] if unit in ("fold:0:2", "update") else []
    if unit == "update":
        units.state_file(tmp_path / "pub", STEP - 1).unlink()      # the state from the run itself
    results = {}
    for where, run in (("local", public), ("http", f"{nginx}/run")):
        signed = tmp_path / f"{where}.json"
        common = ["--step", STEP, *options, *pieces, "--receipt", signed, "--key", keys["alice"]]
        proc = (audit(run, *common, corpus=public / "corpus", in_process=True) if where == "local" else
                remote(run, *common, cache=tmp_path / "cache"))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        results[where] = (verdicts(proc), receipt(signed), proc.stdout)
    (local, local_receipt, _), (http, http_receipt, out) = results["local"], results["http"]
    assert [line.replace(str(public), "RUN") for line in local] == \
        [line.replace(f"{nginx}/run", "RUN") for line in http], (local, http)
    assert local_receipt == http_receipt and http_receipt["verdict"] == "MATCH"
    assert f"fetched from {nginx}/run: " in out
    if unit == "step":
        assert "note: checkpoint 8 (checkpoints/step_00000008.safetensors): its header was checked" in out


def fetched(url):
    """{file name: bytes fetched} of the last audit, relative to the run's address."""
    stats = byterange.stats().get(url, {"files": {}})
    return {name.removeprefix(url + "/"): n for name, n in stats["files"].items()}


def test_a_micro_batch_fetches_what_it_needs_and_a_second_unit_nothing_twice(unit_run, public, nginx, tmp_path):
    """A micro-batch audit fetches the index, the anchors, config.json, records 0, 4 and 5-6 (step 5
    is reached from the anchor at 6; checkpoint 4's record from record 5), the step's unit list,
    checkpoint 4's header and parameters (no Adam moment), the corpus's manifest, leaves and
    chunks. Then the audit of
    another micro-batch of the step fetches the four small files every audit reads anew, and
    nothing else."""
    url = f"{nginx}/run"
    proc = remote(url, "--step", STEP, "--micro_batch", 0, cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = fetched(url)
    assert set(first) == SMALL | {"chain.offsets", "chain.jsonl", "units/step_00000005.json",
                                  "checkpoints/step_00000004.safetensors", "corpus/train.leaves", "corpus/train.bin"}, first
    run = published.open_run(url)
    with run.open_file("checkpoints/step_00000004.safetensors") as f:
        start, entries, meta = rundir.read_header(f, "checkpoint 4")
    params = sum(stop - begin for begin, stop, name, _ in entries if name.startswith("params."))
    assert first["checkpoints/step_00000004.safetensors"] == start + params < f.size
    lines = (public / "chain.jsonl").read_bytes().splitlines(keepends=True)
    assert first["chain.jsonl"] == sum(len(lines[s]) for s in (0, 4, 5, 6))
    run.chain.verify(upto=STEP)
    assert sorted(run.chain.known) == [0, 5, 6]               # from the anchor at 6, not from the genesis
    proc = remote(url, "--step", STEP, "--micro_batch", 2, cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert set(fetched(url)) == SMALL, fetched(url)
    assert byterange.stats()[url]["from_cache"] > 0


def test_a_cached_piece_that_no_longer_checks_is_fetched_again(unit_run, public, nginx, tmp_path):
    """A byte of the cached parameters of checkpoint 4 changed after an audit (a disk fault, a
    hand edit): the next audit drops the piece and fetches it again, to MATCH. The tensors that
    still checked from that piece, before the one that did not, were mapped from the dropped file
    (a traceback, exit 1)."""
    url, cache = f"{nginx}/run", tmp_path / "cache"
    proc = remote(url, "--step", STEP, "--micro_batch", 0, cache=cache)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the largest piece: the parameters, fetched as one run of tensors (then the header's)
    params = max(cache.rglob("step_00000004.safetensors.pieces/*"), key=lambda p: p.stat().st_size)
    raw = bytearray(params.read_bytes())
    raw[-5] ^= 1                                        # in the last tensor: those before it still check
    params.write_bytes(bytes(raw))
    proc = remote(url, "--step", STEP, "--micro_batch", 1, cache=cache)
    assert proc.returncode == 0 and verdicts(proc)[0].startswith("MATCH"), proc.stdout + proc.stderr
    assert fetched(url)["checkpoints/step_00000004.safetensors"] == len(raw)


def test_report_anchors_and_receipts_from_the_address(unit_run, public, nginx, keys, tmp_path):
    """report.py, --anchors (a copy of the run's anchors, as one obtained outside) and
    --check_receipts with revealed salts, each on the run's address."""
    import report
    url, cache = f"{nginx}/run", tmp_path / "cache"
    out = tmp_path / "report.html"
    assert report.main(["--run_dir", url, "--out", str(out), "--cache", str(cache)]) == 0
    assert "Run report: " in out.read_text()
    proc = remote(url, "--anchors", unit_run / "anchors.jsonl", cache=cache)
    assert proc.returncode == 0 and proc.stdout.startswith("ANCHORED: the chain agrees with all 2 anchors"), proc.stdout
    assert "each signed by the publisher key the genesis names" in proc.stdout, proc.stdout
    signed = tmp_path / "receipts"
    signed.mkdir()
    proc = remote(url, "--step", STEP, "--micro_batch", 2, "--receipt", signed / "r.json", "--key", keys["bob"], cache=cache)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    salts = tmp_path / "salts.json"
    assert audit(unit_run, "--reveal_salts", f"{STEP}:{STEP}", "--out", salts, in_process=True).returncode == 0
    roster = write_roster(tmp_path / "roster", keys, ["bob"])
    proc = remote(url, "--check_receipts", signed, "--salts", salts, "--roster", roster, cache=cache)
    assert proc.returncode == 0 and proc.stdout.startswith(f"accepted  {signed / 'r.json'}: step {STEP}, "
                                                           "micro_batch:2 by bob"), proc.stdout + proc.stderr


# ----------------------------------------------------------------------------- tampered bytes
def flip(path, offset):
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 1
    path.write_bytes(bytes(raw))


def tamper_tensor(copy):
    path = copy / "checkpoints" / "step_00000004.safetensors"
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    begin, end = json.loads(raw[8:8 + n])["params.norm"]["data_offsets"]
    flip(path, 8 + n + begin)


def tamper_record(copy):
    path = copy / "chain.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    flip(path, sum(len(line) for line in lines[:STEP]) + lines[STEP].index(b'"batch_digest":"') + 20)


def tamper_chunk(copy):
    flip(copy / "corpus" / "train.bin", 100)


def tamper_unit_list(copy):
    path = copy / units.list_name(STEP)
    doc = json.loads(path.read_text())
    doc["units"][0]["loss_bits"] = "0x3f800000"
    path.write_bytes(units.list_bytes(STEP, doc["units"]))


TAMPERED = {"tensor": (tamper_tensor, "the state of step 4: checkpoint {url}/checkpoints/step_00000004.safetensors: "
                                      "tensor 'params.norm' differs from its leaf"),
            "record": (tamper_record, "{url}/chain.jsonl line 6 (step 5): record hash does not match its contents"),
            "chunk": (tamper_chunk, "chunk 0 of {url}/corpus/train.bin does not match its leaf"),
            "unit_list": (tamper_unit_list, "field units_root: the unit list of step 5 hashes to")}


@pytest.mark.parametrize("what", sorted(TAMPERED))
def test_a_tampered_byte_on_the_server_is_a_mismatch(public, nginx, served, keys, tmp_path, what):
    """One byte changed in the copy (served under another name, so no cache holds it): the
    micro-batch audit reports MISMATCH at the step naming the file, exit 1, and no receipt."""
    edit, expect = TAMPERED[what]
    copy = served / f"tampered_{what}"
    shutil.copytree(public, copy)
    edit(copy)
    url = f"{nginx}/{copy.name}"
    proc = remote(url, "--step", STEP, "--micro_batch", 0, "--receipt", tmp_path / "r.json", "--key", keys["alice"],
                  cache=tmp_path / "cache")
    assert proc.returncode == 1 and not proc.stderr, proc.stdout + proc.stderr
    assert verdicts(proc)[0].startswith(f"MISMATCH at step {STEP}") and expect.format(url=url) in proc.stdout, proc.stdout
    assert not (tmp_path / "r.json").exists()


def test_offsets_claiming_a_line_longer_than_a_record_are_refused_before_fetching(public, nginx):
    """chain.offsets says where each line starts; a hostile host could claim a line of gigabytes
    (with an index that claims as large a chain). The walk refuses any line longer than a record
    can be (hashchain.MAX_RECORD_BYTES, the local reader's bound) before it fetches the chain's
    bytes; increasing offsets of lines within the bound pass."""
    chain = published.open_run(f"{nginx}/{public.name}").chain
    chain.size = 4 * hashchain.MAX_RECORD_BYTES
    check = chain._offsets_check(3, 4)
    check(struct.pack("<3Q", 100, 200, 300))
    with pytest.raises(hashchain.ChainError, match="longer than a record can be"):
        check(struct.pack("<3Q", 100, 200, 201 + hashchain.MAX_RECORD_BYTES))


# ----------------------------------------------------------------------------- signed anchors
def test_a_forged_anchor_on_the_server_is_not_used(unit_run, public, nginx, served, keys, tmp_path):
    """The copy's anchor of step 6 made to pin record 5's hash, its signature kept (forged) or
    made by another key: the walk to step 5 does not start from it (a note names it; the walk
    starts from the head, whose records check) and the micro-batch audit still matches; the same
    file given to --anchors is a MISMATCH at step 6, naming the signature."""
    records = [json.loads(line) for line in (public / "chain.jsonl").read_text().splitlines()]
    lines = (public / "anchors.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [3, 6] and all("signature" in json.loads(x) for x in lines)
    anchor = {**json.loads(lines[1]), "record_hash": records[5]["record_hash"]}
    body = {k: v for k, v in anchor.items() if k != "signature"}
    mallory = signing.Signer(keys["mallory"])
    resigned = {**body, "signature": mallory.sign(receipts.anchor_signed_bytes(body), signing.ANCHOR)}
    for name, forged in (("forged", anchor), ("resigned", resigned)):
        copy = served / f"anchor_{name}"
        shutil.copytree(public, copy)
        (copy / "anchors.jsonl").write_text("\n".join([lines[0], json.dumps(forged)]) + "\n")
        url = f"{nginx}/{copy.name}"
        proc = remote(url, "--step", STEP, "--micro_batch", 0, cache=tmp_path / name)
        assert proc.returncode == 0 and verdicts(proc)[0].startswith("MATCH: micro-batch 0"), proc.stdout + proc.stderr
        assert (f"note: the anchor of step 6 in {url}/anchors.jsonl was not used to reach records: not signed by "
                "the publisher key the genesis names") in proc.stdout, proc.stdout
        run = published.open_run(url)
        run.chain.verify(upto=STEP)
        assert sorted(run.chain.known) == [0, 5, 6, 7, 8]         # from the head: the forged anchor was not used
        proc = remote(url, "--anchors", copy / "anchors.jsonl", cache=tmp_path / name)
        found = [line for line in proc.stdout.splitlines() if line.startswith("MISMATCH")]
        assert proc.returncode == 1 and found[0].startswith("MISMATCH at step 6:") and "not signed by" in found[0], \
            proc.stdout


def test_a_childs_lineage_against_its_parents_address(unit_run, corpus, public, nginx, served, tmp_path):
    """A child of the unit run's step 4 audits with --init_from the parent's address: the
    lineage is checked from the published chain and checkpoint 4's header (no tensor fetched).
    A copy whose checkpoint 4 header lists another leaf is a lineage MISMATCH at step 0."""
    child = train_in_process(tmp_path / "child", corpus, f"--init_from={unit_run}@4", "--max_steps=1")
    url = f"{nginx}/run"
    proc = audit(child, "--step", 1, "--init_from", url, "--cache", tmp_path / "cache", in_process=True)
    assert proc.returncode == 0 and "MATCH: steps 1..1" in proc.stdout and "note:" not in proc.stdout, \
        proc.stdout + proc.stderr
    header = fetched(url)["checkpoints/step_00000004.safetensors"]
    with published.open_run(url).open_file("checkpoints/step_00000004.safetensors") as f:
        assert header == rundir.read_header(f, "checkpoint 4")[0]     # the header only
    copy = served / "parent_edited"
    shutil.copytree(public, copy)
    path = copy / "checkpoints" / "step_00000004.safetensors"
    raw = path.read_bytes()
    at = raw.index(b'params.norm\\": \\"') + len(b'params.norm\\": \\"')      # its leaf, inside the metadata
    path.write_bytes(raw[:at] + (b"0" if raw[at:at + 1] != b"0" else b"1") + raw[at + 1:])
    proc = audit(child, "--step", 1, "--init_from", f"{nginx}/{copy.name}", "--cache", tmp_path / "cache",
                 in_process=True)
    assert proc.returncode == 1 and proc.stdout.startswith("MISMATCH at step 0: lineage: the parent's checkpoint "
                                                           "of step 4"), proc.stdout + proc.stderr


# ----------------------------------------------------------------------------- network faults
def test_a_trickling_body_is_bounded_by_its_length(tmp_path):
    """A server that sends a range's body a few bytes at a time, each piece inside the timeout: the
    read stops once the request has taken the timeout plus its length at MIN_RATE, one FetchError
    after the tries, instead of waiting for the whole body (64 KiB here: 14 minutes a try)."""
    Handler.root = str(tmp_path)
    (tmp_path / "big.bin").write_bytes(os.urandom(64 << 10))
    byterange.configure(cache=tmp_path / "cache", timeout=1)
    outcome = []

    def read():
        try:
            byterange.directory(url).read_range("big.bin", 0, 64 << 10)
        except byterange.FetchError as e:
            outcome.append(str(e))
    try:
        with stdlib_server(Handler) as base:
            url = f"{base}/trickle"
            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            reader.join(timeout=20)       # 3 tries of about 1.2 s and 1.5 s of backoff
            assert not reader.is_alive(), "the read still waits for the trickle"
    finally:
        byterange.configure()
    assert outcome and "too slow" in outcome[0] and "(3 tries)" in outcome[0], outcome


def timed(url, tmp_path, *args):
    t0 = time.monotonic()
    proc = remote(url, "--step", STEP, "--micro_batch", 0, *args, cache=tmp_path / "cache", timeout=1)
    return proc, time.monotonic() - t0


@pytest.mark.parametrize("mode,expect", [
    ("drop", "cannot fetch {url}/publication.json: "),
    ("truncate", "cannot fetch {url}/chain.offsets bytes 0..15: the body ended after 8 of 16 bytes (truncated) (3 tries)"),
    ("slow", "cannot fetch {url}/publication.json: no answer within 1 s (timed out) (3 tries)"),
    ("missing", "no published run at {url}: {url}/publication.json is missing"),
], ids=["dropped_connection", "truncated_body", "slow_server", "not_found"])
def test_each_network_fault_is_one_line_and_bounded(public, served, tmp_path, mode, expect):
    Handler.root = str(served)
    with stdlib_server(Handler) as base:
        url = f"{base}/{mode}/{public.name}" if mode != "missing" else f"{base}/ok/nowhere"
        proc, seconds = timed(url, tmp_path)
    assert_one_line_error(proc, "audit.py")
    assert expect.format(url=url) in proc.stderr, proc.stderr
    assert seconds < 30, seconds                     # 3 tries of 1 s and 1.5 s of backoff, plus start-up


def test_a_refused_connection_and_a_server_that_ignores_ranges(public, served, tmp_path):
    url = f"http://127.0.0.1:{free_port()}/run"
    proc, seconds = timed(url, tmp_path)
    assert_one_line_error(proc, "audit.py")
    assert f"cannot fetch {url}/publication.json: connection refused (3 tries)" in proc.stderr and seconds < 30

    class Plain(http.server.SimpleHTTPRequestHandler):            # answers 200 to every GET, ranges ignored
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served), **kwargs)

        def log_message(self, *args):
            pass
    with stdlib_server(Plain) as base:
        proc, _ = timed(f"{base}/{public.name}", tmp_path)
    assert_one_line_error(proc, "audit.py")
    assert "the server ignores range requests (it answered 200 with the whole file)" in proc.stderr, proc.stderr


def test_a_transient_fault_is_retried(public, served, tmp_path):
    """503 to the first request for every file: each is retried once, and the audit matches."""
    Handler.root, Handler.seen = str(served), set()
    with stdlib_server(Handler) as base:
        proc, _ = timed(f"{base}/flaky/{public.name}", tmp_path)
    assert proc.returncode == 0 and verdicts(proc)[0].startswith("MATCH: micro-batch 0"), proc.stdout + proc.stderr


def test_hugging_face_addresses():
    assert byterange.hf_url("hf://datasets/org/run") == "https://huggingface.co/datasets/org/run/resolve/main"
    assert byterange.hf_url("hf://org/model@v1.0/runs/x") == "https://huggingface.co/org/model/resolve/v1.0/runs/x"
    assert byterange.hf_url("hf://datasets/org/run@refs%2Fpr%2F1") == \
        "https://huggingface.co/datasets/org/run/resolve/refs%2Fpr%2F1"
    with pytest.raises(byterange.FetchError):
        byterange.hf_url("hf://datasets/onlyone")


# ----------------------------------------------------------------------------- the publication
def test_the_public_copy(unit_run, corpus, public, tmp_path):
    """The index and chain.offsets as SPEC §22 states them (the NumPy replay checks them); no
    secret, lock or rejected checkpoint; publishing again changes nothing; an --out inside the
    run or holding another run's copy is refused with one line."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = run_process([sys.executable, str(ROOT / "tests" / "numpy_replay.py"), "--published", str(public)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0 and "MISMATCH" not in proc.stdout, proc.stdout + proc.stderr
    index = json.loads((public / published.INDEX).read_text())
    assert not {"secret", "lock"} & set(index["files"]) and "units/step_00000005.json" in index["files"]
    assert index["steps"] == 8 and index["corpus"] == "corpus"
    before = (public / published.INDEX).read_bytes()
    assert publish.main(["--run_dir", str(unit_run), "--out", str(public), "--corpus", str(corpus)]) == 0
    assert (public / published.INDEX).read_bytes() == before
    assert_one_line_error(script("publish.py", "--run_dir", unit_run, "--out", unit_run / "pub"), "publish.py")
    other = tmp_path / "other"
    shutil.copytree(public, other)
    doc = json.loads((other / published.INDEX).read_text())
    (other / published.INDEX).write_text(json.dumps({**doc, "run": "0" * 64}))
    proc = script("publish.py", "--run_dir", unit_run, "--out", other, "--no_corpus")
    assert_one_line_error(proc, "publish.py")
    assert "holds the public copy of another run" in proc.stderr


def test_a_record_does_not_grow_with_the_tensor_count(unit_run):
    """SPEC v7: a step record's fields are fixed (the state's root, never a hash per tensor)."""
    records = [json.loads(line) for line in (unit_run / "chain.jsonl").read_text().splitlines()]
    assert set(records[STEP]) == {"kind", "step", "run", "state_hash", "batch_digest", "loss", "loss_bits", "grad_norm",
                                  "grad_norm_bits", "lr", "lr_bits", "step_commit", "units_root", "prev", "record_hash"}
    assert all(r["run"] == records[0]["record_hash"] for r in records[1:]) and "tensor_hashes" not in records[0]
