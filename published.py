"""A published run: the public copy of a run directory, and a run read from its address.

    run = published.open_run("https://host/runs/x")   # RemoteRun; a local path gives rundir.Run
    run = published.open_run("hf://datasets/org/run") # a Hugging Face repository (byterange.py)
    run.chain.records[120]          # fetched with the records up to the nearest anchor, linked
    run.verified_checkpoint(119, p) # header by range, then each tensor by range against its leaf
    run.published_leaves(119)       # the leaves its header proves against the record
    print(published.summary())      # what the sites were asked for, and what the cache gave

`publish.py` writes the public copy (SPEC.md §22): the run directory without its secret, lock
and rejected checkpoints, plus `chain.offsets` (where each line of chain.jsonl starts) and
`publication.json` (the index: the run's genesis record hash, its last step and that record's
hash, every file with its size and SHA-256, and where the corpus is), so that a static file
server or a Hugging Face repository serves it as it is:

    publication.json  chain.jsonl  chain.offsets  anchors.jsonl  config.json  train.log
    checkpoints/step_<s>.safetensors   units/step_<s>.json   corpus/ (manifest.json, <split>.bin,
    <split>.leaves; a mix: manifest.json and a folder per source)

A RemoteRun is rundir.Run's reader over such a copy at an http(s):// or hf:// address, fetching
only what an audit asks for, each byte checked before it is used:
- records: a SparseChain reaches record S from the nearest usable anchor at or after S (else from the
  chain's last record) by `prev` links, backwards: O(anchor_every) records, never the chain from
  the genesis. Every record on the way must hash to the link above it and name the run's genesis
  (`run`, SPEC §12.3); the genesis record must hash to the index's `run`. A break is a ChainError
  at that step (MISMATCH), as a broken local chain is. verify() without a step fetches it whole.
- checkpoints: the header by range, its leaves proven against the record's state hash, then only
  the tensors used, each against its leaf (rundir.read_header, proved_tensors). A checkpoint an
  audit vouches for but does not start from is checked by its header only (a note says so).
- unit lists, the corpus: a unit list whole against units_root; the corpus through data.py's
  TokenData on the copy's corpus/ folder (chunks by range against their leaves).

Which anchors a walk starts from: those of the copy's own anchors.jsonl (published_anchors)
that anchor_problem accepts (SPEC §11.7). When the genesis record names the publisher's key, an
anchor is used only if its signature verifies under that key (receipts.anchor_signature_problem,
checked when a walk first needs the anchor): whoever serves the copy cannot forge one, so a
record reached from it is the one the publisher signed. An unsigned or forged anchor of such a
run is not used, and the audit says so in a note (`audit.py --anchors` reports it as a
MISMATCH). Without a publisher key, an anchor served with the chain by the same host is worth
what the chain is worth: it makes the walk short, and it pins nothing. A record is then pinned
by an anchor obtained outside the publication (`audit.py --anchors FILE` compares the chain with
such a copy). An anchor names no run: the record it pins does (`run`), and every record on the
walk is checked to name the run. The publication index is bound to the chain (its `run` is the
genesis record's hash, its `head` the last record's); each file in it is bound by its content
(checkpoints by their state roots, the corpus by the genesis record's data commitments, unit
lists by units_root, chain lines by their links), except config.json, train.log and
anchors.jsonl, whose SHA-256s only protect their transfer.
"""
import re
import struct

import numpy as np

import byterange
import hashchain
import receipts
import rundir
import signing
from config import UsageError
from hashchain import ChainError, GENESIS_PREV

INDEX = "publication.json"
INDEX_FORMAT = "repops-publication-v1"
CHAIN = "chain.jsonl"
OFFSETS = "chain.offsets"
CORPUS = "corpus"
MAX_INDEX = 256 << 20          # publication.json: ~110 bytes per file (80,957 checkpoints: 9 MB)
HEX64 = re.compile(r"[0-9a-f]{64}")
CHECKPOINT = re.compile(r"checkpoints/step_(\d{8,})\.safetensors")


def open_run(address):
    """The run at `address`: a RemoteRun for an http(s):// or hf:// URL, else the local
    directory's rundir.Run (a reader)."""
    return RemoteRun(address) if byterange.is_url(address) else rundir.Run(address)


def offsets(chain_bytes):
    """chain.offsets of a chain file's bytes (complete lines): the byte offset of each line's
    start, then the file's size, each as 8 bytes little-endian (SPEC §22)."""
    ends = np.flatnonzero(np.frombuffer(chain_bytes, np.uint8) == 0x0A) + 1
    return np.concatenate([[0], ends]).astype("<u8").tobytes()


def delivered():
    """Bytes the sites of this process delivered to the audit (fetched, or from the cache)."""
    return sum(s["fetched"] + s["from_cache"] for s in byterange.stats().values())


def summary():
    """One line per site: requests, bytes fetched and from the cache (None: nothing remote)."""
    lines = [f"fetched from {url}: {s['fetched']:,} bytes in {s['requests']} requests, "
             f"{s['from_cache']:,} bytes from the cache {byterange.cache_root()}"
             for url, s in byterange.stats().items()]
    return "\n".join(lines) or None


# ----------------------------------------------------------------------------- the index
def read_index(site):
    """publication.json of a published run, every field checked (UsageError otherwise)."""
    where = site.show(INDEX)
    try:
        raw = site.read_file(INDEX, "publication index", MAX_INDEX, UsageError)
    except byterange.NotFound:
        raise UsageError(f"no published run at {site}: {where} is missing (publish a run with "
                         "python publish.py)") from None
    try:
        doc = hashchain.strict_json(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise UsageError(f"{where} is not valid JSON ({e})") from None
    ok = (isinstance(doc, dict) and set(doc) == {"format", "run", "steps", "head", "corpus", "files"}
          and doc["format"] == INDEX_FORMAT and all(isinstance(doc[k], str) and HEX64.fullmatch(doc[k])
                                                    for k in ("run", "head"))
          and hashchain.is_int(doc["steps"]) and doc["steps"] >= 0
          and (doc["corpus"] is None or isinstance(doc["corpus"], str)) and isinstance(doc["files"], dict)
          and all(isinstance(e, dict) and set(e) == {"size", "sha256"} and hashchain.is_int(e["size"])
                  and e["size"] >= 0 and isinstance(e["sha256"], str) and HEX64.fullmatch(e["sha256"])
                  for e in doc["files"].values()))
    if not ok:
        raise UsageError(f"{where} is not a publication index ({INDEX_FORMAT}: format, run, steps, head, "
                         "corpus, files {name: {size, sha256}})")
    for name in doc["files"]:
        byterange._checked_name(name)
    sizes = {n: e["size"] for n, e in doc["files"].items()}
    if sizes.get(OFFSETS) != 8 * (doc["steps"] + 2) or CHAIN not in sizes:
        raise UsageError(f"{where}: its {OFFSETS} does not index the {doc['steps'] + 1} lines of its {CHAIN}")
    return doc


def published_anchors(site):
    """The anchors of the copy's anchors.jsonl, [] without one. A walk takes one only once
    anchor_problem finds nothing wrong with it (module docstring)."""
    if not site.exists(receipts.ANCHORS):
        return []
    where = site.show(receipts.ANCHORS)
    raw = site.read_file(receipts.ANCHORS, "anchors file", receipts.MAX_ANCHORS, UsageError)
    try:
        return receipts.parse_anchors(raw.decode("utf-8"), where)
    except UnicodeDecodeError:
        raise UsageError(f"{where} is not UTF-8 text") from None


def anchor_problem(genesis):
    """problem(anchor): why a walk of the run of `genesis` (its verified genesis record) may not
    start from the anchor, or None. Where the genesis names the publisher's key, an anchor must
    be signed by it (receipts.anchor_signature_problem, SPEC §11.7)."""
    publisher = genesis.get("publisher")

    def problem(anchor):
        if publisher is not None and not signing.is_public_key(publisher):
            return "the genesis record's publisher is not an SSH public key"
        return receipts.anchor_signature_problem(anchor, publisher)
    return problem


# ----------------------------------------------------------------------------- the chain
class SparseChain:
    """chain.jsonl of a published run, read record by record (hashchain.Chain's reader API:
    records, lines, len, head, verify, path). A record is returned only once it is reached
    from a trusted hash by links (module docstring); `known` holds those, by step."""

    def __init__(self, site, index):
        self.site, self.path = site, site.show(CHAIN)
        self.lines = index["steps"] + 1
        self.run, self.head_hash = index["run"], index["head"]
        self.size = index["files"][CHAIN]["size"]
        self.anchored, self.checked, self.refused = {}, set(), []
        self.known = {}
        self.broken = self.note = None
        self.records = _Records(self)

    def anchor(self, anchors, problem, where):
        """Walks may start from these anchors (of the file `where`), each once problem(anchor)
        finds nothing wrong with it (anchor_problem: checked when a walk first needs it, so an
        audit verifies one signature, not every anchor's); those it refuses are left out, and
        self.refused says why."""
        self.anchored = {a["step"]: a for a in anchors if a["step"] < self.lines}
        self.problem, self.where = problem, where

    def _usable(self, step):
        """Is the anchor of `step` one a walk may start from? Checked once."""
        a = self.anchored[step]
        if step not in self.checked:
            if problem := self.problem(a):
                del self.anchored[step]
                self.refused.append(f"the anchor of step {step} in {self.where} was not used to reach "
                                    f"records: {problem}")
                return False
            self.checked.add(step)
        return True

    def __len__(self):
        return self.lines

    @property
    def head(self):
        return self.record(self.lines - 1)["record_hash"]

    def record(self, step):
        if step not in self.known:
            self.reach(step)
        return self.known[step]

    def verify(self, upto=None):
        """Reach record `upto` (ChainError at a break on the way); None: every record, from the
        genesis to the last, linked (the whole file is fetched)."""
        if upto is None:
            if len(self.known) < self.lines:
                self._walk(0, self.lines - 1, self.head_hash, "head")
            return
        self.reach(min(upto, self.lines - 1))

    def reach(self, step):
        """Fetch and check the records from `step` up to the nearest trusted point above it: a
        record reached before (its prev), an anchor at or after it, else the last record (the
        index's head); the genesis against the index's run."""
        if step in self.known:
            return
        if step == 0:
            self._walk(0, 0, self.run, "index")
            return
        self.reach(0)
        while True:
            tops = [(s, "known") for s in self.known if s > step] + [(s, "anchor") for s in self.anchored if s >= step]
            top, kind = min(tops, default=(self.lines - 1, "head"))
            if kind != "anchor" or self._usable(top):
                break
        if kind == "known":
            self._walk(step, top - 1, self.known[top]["prev"], "link")
        else:
            self._walk(step, top, self.anchored[top]["record_hash"] if kind == "anchor" else self.head_hash, kind)

    def _walk(self, first, last, trusted, kind):
        """Records first..last fetched and checked downwards from `trusted`, the hash that record
        `last` must have; once more with fresh bytes when cached ones do not check."""
        for fresh in (False, True):
            try:
                found = self._fetch(first, last, trusted, kind, fresh)
                break
            except ChainError:
                if fresh:
                    raise
        for i, rec in enumerate(found, start=first):
            self.known[i] = rec

    def _fetch(self, first, last, trusted, kind, fresh):
        n = last - first + 1
        with self.site.open(OFFSETS, "chain offsets", UsageError) as f:
            raw = f.read(8 * first, 8 * (n + 1), self._offsets_check(first, last), fresh)
        starts = struct.unpack(f"<{n + 1}Q", raw)
        found = []

        def check(data):
            found[:] = self._check(first, last, starts, bytes(data), trusted, kind)
        with self.site.open(CHAIN, "chain", UsageError) as f:
            f.read(starts[0], starts[-1] - starts[0], check, fresh)
        return found

    def _offsets_check(self, first, last):
        def check(raw):
            starts = struct.unpack(f"<{len(raw) // 8}Q", bytes(raw))
            if any(b <= a for a, b in zip(starts, starts[1:])) or starts[-1] > self.size:
                raise ChainError(first + 1, f"{self.site.show(OFFSETS)}: the offsets of lines {first + 1}.."
                                            f"{last + 2} are not increasing within {self.path}")
            # a line longer than a record can be (hashchain's bound for local reads too) is never fetched
            if any(b - a > hashchain.MAX_RECORD_BYTES for a, b in zip(starts, starts[1:])):
                raise ChainError(first + 1, f"{self.site.show(OFFSETS)}: a line among {first + 1}..{last + 1} "
                                            f"would be longer than a record can be ({hashchain.MAX_RECORD_BYTES} bytes)")
        return check

    def _check(self, first, last, starts, data, trusted, kind):
        """The records of lines first..last (their bytes `data`), each checked from the top down."""
        records = []
        for i in range(first, last + 1):
            line = data[starts[i - first] - starts[0]:starts[i - first + 1] - starts[0]]
            if not line.endswith(b"\n") or b"\n" in line[:-1]:
                raise ChainError(i + 1, f"{self.path} line {i + 1} (step {i}): not one line at the bytes "
                                        f"{OFFSETS} gives")
            records.append(hashchain.parse_line(self.path, i + 1, line[:-1]))
        for i in range(last, first - 1, -1):
            rec, where = records[i - first], f"{self.path} line {i + 1} (step {i})"
            if rec["step"] != i:
                raise ChainError(i + 1, f"{where}: holds step {rec['step']}, expected step {i} (record "
                                        "missing, inserted or reordered?)")
            if hashchain.record_hash(rec) != rec["record_hash"]:
                raise ChainError(i + 1, f"{where}: record hash does not match its contents (edited?)")
            if rec["record_hash"] != trusted:
                why = {"anchor": f"is not the anchored {trusted} (history rewritten after anchoring)",
                       "head": f"is not the last record's hash that {INDEX} names ({trusted})",
                       "index": f"is not the run that {INDEX} names ({trusted})"}.get(
                    kind if i == last else "link", f"is not the prev of step {i + 1} (record edited, "
                                                   "missing or inserted?)")
                raise ChainError(i + 1, f"{where}: its hash {rec['record_hash']} {why}")
            if i and rec.get("run") != self.run:
                raise ChainError(i + 1, f"{where}: its run is not the genesis record's hash {self.run} "
                                        "(a record of another run)")
            if i == 0 and (rec["prev"] != GENESIS_PREV or rec["record_hash"] != self.run):
                raise ChainError(1, f"{where}: not the genesis record of the run {INDEX} names "
                                    f"({self.run})")
            trusted = rec["prev"]
        return records


class _Records:
    """SparseChain.records: record k (fetched when first used), a slice (the whole chain)."""

    def __init__(self, chain):
        self.chain = chain

    def __len__(self):
        return self.chain.lines

    def __getitem__(self, k):
        if isinstance(k, slice):
            self.chain.verify()
            return [self.chain.known[i] for i in range(*k.indices(self.chain.lines))]
        k = k + self.chain.lines if k < 0 else k
        if not 0 <= k < self.chain.lines:
            raise IndexError(k)
        return self.chain.record(k)

    def __iter__(self):
        return iter(self[:])


# ----------------------------------------------------------------------------- the run
class RemoteRun(rundir.Run):
    """rundir.Run's reader over a published copy at an http(s):// or hf:// address (module
    docstring); `dir` is the address. It never writes: its sites send GET and HEAD only."""

    def __init__(self, address):
        self.site = byterange.directory(address)
        self.dir, self.writer = str(self.site), False
        self.index = read_index(self.site)
        self.site.known = {name: e["size"] for name, e in self.index["files"].items()}
        self.chain = SparseChain(self.site, self.index)
        self.chain.anchor(published_anchors(self.site), anchor_problem(self.chain.records[0]),
                          self.site.show(receipts.ANCHORS))
        self.walk_notes = self.chain.refused       # anchors not used (a forged one): the audit's notes

    def checkpoints(self):
        found = [(int(m.group(1)), name) for name in self.index["files"] if (m := CHECKPOINT.fullmatch(name))]
        return sorted(found)

    def open_file(self, path):
        return self.site.open(path, "checkpoint", rundir.CheckpointError)

    def verified_checkpoint(self, step, path, mmap=False):
        """The checkpoint's tensors, each fetched and checked against its proven leaf (rundir
        .proved_tensors); mapped from the cache whatever mmap says."""
        record = self.record_of(step, path)
        with self.open_file(path) as f:
            return rundir.proved_tensors(f, record, self.site.show(path))

    def vouch_checkpoint(self, step, path):
        record, where = self.record_of(step, path), self.site.show(path)
        with self.open_file(path) as f:
            rundir.read_header(f, where, lambda meta: rundir.proven_leaves(meta, record, where))
        return (f"checkpoint {step} ({path}): its header was checked against the chain, its tensors were "
                "not fetched (an audit of a local copy reads them whole)")

    def file(self, name, check=None):
        """The cached copy of the published file `name` once check(bytes) accepted it; None if
        the publication has no such file."""
        if name not in self.site.known:
            return None
        size = self.site.known[name]
        path, start = self.site.fetch(name, 0, size, check or (lambda raw: None))
        return path if start == 0 else None

    def size(self, path):
        return 0                    # counted by byterange (delivered)

    def config_json_bytes(self):
        if "config.json" not in self.site.known:
            return None
        return self.site.show("config.json"), self.site.read_file("config.json", "config", rundir.MAX_CONFIG_JSON + 1,
                                                                 UsageError)

    def recorded_data_dir(self):
        """The published copy's corpus (a byterange Site)."""
        if self.index["corpus"] is None:
            raise UsageError(f"{self.site.show(INDEX)}: the publication holds no corpus; give the run's "
                             "corpus with --data_dir (a local directory, a bundle, or its URL)")
        return self.site.join(self.index["corpus"])
