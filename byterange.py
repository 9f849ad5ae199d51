"""Byte ranges of a directory's files, on local disk or on an HTTP(S) server, behind one interface.

    import byterange
    d = byterange.directory("runs/x")                      # a local directory, or:
    d = byterange.directory("https://host/pub/x")          # any static HTTP(S) server
    d = byterange.directory("hf://datasets/org/run@main")   # a Hugging Face repository (resolve URLs)
    f = d.open("checkpoints/step_00000010.safetensors", "checkpoint", CheckpointError, size=...)
    raw = f.read(offset, length, check)        # bytes; check(raw) raises unless they verify
    arr = f.view(offset, length, check)        # the same as a uint8 array (mapped from disk)
    raw = d.read_file("manifest.json", "corpus", limit, DataError)    # a whole small file
    d.exists("bundle.json"); d.join("corpus"); d.show("train.bin")   # a name as messages print it
    byterange.configure(cache="~/.cache/repops", timeout=30)         # the command's --cache, --timeout

A Directory reads local files as hashchain reads them (regular files only, bounded). A Site
reads over HTTP(S) with the standard library (urllib): every read of a part of a file is one
`Range: bytes=a-b` request (pieces of at most PIECE bytes) answered by `206 Partial Content`
with exactly that `Content-Range` and length. A server that ignores ranges (it answers `200`
with the whole file) is refused with one line: an audit fetches only what it needs, and reading
a 19 GB checkpoint to use 6 GB of it is not that. A whole small file (an index, anchors, a
manifest) is one plain GET, bounded by its limit.

No request can hang: every socket operation has the timeout (default TIMEOUT seconds), and a
whole request must finish within the timeout plus its length at MIN_RATE bytes per second (a
body is read as it arrives, one socket read at a time, so a server that trickles it is stopped
at that deadline; a whole file's length is its Content-Length, else its limit). A
transient fault (a refused or dropped connection, a timeout, a truncated body, a 5xx, 408 or
429 answer) is retried RETRIES times with backoff; a 404 or another 4xx, a server that ignores
ranges or answers another range, is not. Every failure is a FetchError (a
hashchain.HashChainError: the commands print it as one line and exit 2) naming the URL.

Fetched bytes go to a cache (default ~/.cache/repops, or $XDG_CACHE_HOME/repops), under the
server's host and path, one file per fetched range, written through hashchain.write_atomically
and kept (renamed into place) only after `check` accepted them: the next audit of the same step (another unit of it) reads them from there and
fetches nothing twice. Cached bytes are checked again whenever they are used; a cached piece
that no longer verifies (the publication changed) is dropped and fetched anew, and only fresh
bytes that do not verify are the caller's error (a MISMATCH). Reads with check=None are never
cached (a file that grows, such as an index or anchors): they are fetched into memory. A cache
that cannot be written is a FetchError naming it (the commands check --cache before any work). Nothing is ever written to the server:
a Site sends GET and HEAD requests only. `stats()` counts requests and bytes per site.

Hugging Face: `hf://[datasets/|spaces/]ORG/NAME[@REVISION][/PATH]` is the resolve URL
https://huggingface.co/[datasets/|spaces/]ORG/NAME/resolve/REVISION/PATH (REVISION a branch,
tag or commit, main by default; a slash in it written %2F), which serves ranges (a large file
redirects to a CDN that honours them); no package is needed. This module imports only hashchain,
NumPy and the standard library.
"""
import dataclasses
import hashlib
import http.client
import io
import os
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np

import hashchain
from hashchain import HashChainError

TIMEOUT = 30.0                 # seconds for a connection or any read to make progress
MIN_RATE = 256 << 10           # bytes per second a request must average, besides TIMEOUT
PIECE = 64 << 20               # the largest range one request asks for
RETRIES = 2                    # further tries after a transient fault
BACKOFF = 0.5                  # seconds before the first retry; doubled before each next one
BLOCK = 1 << 20                # bytes read from a response at a time
USER_AGENT = "repops-audit (Python urllib)"
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")   # one component of a file's name


class FetchError(HashChainError):
    """A file or range that could not be read (a network fault, a missing file, a server that
    ignores ranges); one line naming the URL."""


class NotFound(FetchError):
    """The server (or the disk) has no such file."""


@dataclasses.dataclass
class Settings:
    cache: str = None          # None: $XDG_CACHE_HOME/repops, else ~/.cache/repops
    timeout: float = TIMEOUT


SETTINGS = Settings()
_SITES = {}                    # base URL -> Site: one cache and one count per site and process


def configure(cache=None, timeout=None):
    """The command line's --cache and --timeout (None: the defaults), for the sites opened after."""
    SETTINGS.cache = None if cache is None else os.path.expanduser(cache)
    SETTINGS.timeout = TIMEOUT if timeout is None else float(timeout)
    _SITES.clear()


def cache_root():
    if SETTINGS.cache:
        return Path(SETTINGS.cache)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "repops"


def is_url(address):
    return isinstance(address, str) and address.startswith(("http://", "https://", "hf://"))


def hf_url(address):
    """The resolve URL of an hf:// address (module docstring)."""
    rest = address[len("hf://"):].strip("/")
    parts = rest.split("/")
    kind = [parts.pop(0)] if parts and parts[0] in ("datasets", "spaces") else []
    if len(parts) < 2 or not all(parts[:2]):
        raise FetchError(f"{address} is not a Hugging Face address (hf://[datasets/]ORG/NAME[@REVISION][/PATH])")
    org, name = parts[0], parts[1]
    name, _, revision = name.partition("@")
    revision = urllib.parse.quote(revision or "main", safe="%")     # refs/pr/1 is written refs%2Fpr%2F1
    return "/".join(["https://huggingface.co", *kind, org, name, "resolve", revision, *parts[2:]])


def directory(address):
    """The Directory (a local path) or Site (an http(s):// or hf:// URL) of `address`; an object
    that is one of them already is returned as it is."""
    if isinstance(address, (Directory, Site)):
        return address
    if not is_url(address):
        return Directory(address)
    url = (hf_url(address) if address.startswith("hf://") else address).rstrip("/")
    if url not in _SITES:
        _SITES[url] = Site(url)
    return _SITES[url]


def stats():
    """{base URL: {"requests", "fetched", "from_cache", "files": {URL: fetched bytes}}} of every
    site read in this process since configure()."""
    return {url: site.stats for url, site in _SITES.items() if site.stats["requests"] or site.stats["from_cache"]}


def _checked_name(name):
    parts = str(name).split("/")
    if not all(NAME.fullmatch(p) and p not in (".", "..") for p in parts):
        raise FetchError(f"{name!r} is not the name of a published file")
    return "/".join(parts)


# ----------------------------------------------------------------------------- local files
class Directory:
    """A local directory; its files are read as hashchain reads files (regular files only)."""

    def __init__(self, path):
        self.path = str(path)

    def __str__(self):
        return self.path

    def show(self, name):
        return os.path.join(self.path, name)

    def join(self, name):
        return Directory(os.path.join(self.path, name))

    def exists(self, name):
        return os.path.lexists(self.show(name))

    def open(self, name, what, error, size=None):
        return LocalFile(self.show(name), what, error)

    def read_file(self, name, what, limit, error):
        """The whole file, at most `limit` bytes (hashchain.read_bytes)."""
        return hashchain.read_bytes(self.show(name), what, limit, error)


class LocalFile:
    """A regular local file, read by ranges (os.pread); `check` is the caller's, as for a Site."""

    def __init__(self, path, what, error):
        self.path, self.error = path, error
        self.file = hashchain.open_regular(path, what, error)
        self.size = os.fstat(self.file.fileno()).st_size

    def close(self):
        self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def read(self, offset, length, check=None):
        raw = os.pread(self.file.fileno(), length, offset) if length else b""
        if len(raw) != length:
            raise self.error(f"{self.path} is truncated: needed bytes {offset}..{offset + length - 1}, "
                             f"it has {self.size}")
        if check:
            check(raw)
        return raw

    def views(self, items):
        """[view(offset, length, check) for each (offset, length, check)] (a Site's API)."""
        return [self.view(*item) for item in items]

    def view(self, offset, length, check=None):
        """uint8 [length] mapped copy-on-write from the file (nothing is read before it is used)."""
        if offset + length > self.size:
            raise self.error(f"{self.path} is truncated: needed bytes {offset}..{offset + length - 1}, "
                             f"it has {self.size}")
        arr = (np.memmap(self.path, dtype=np.uint8, mode="c", offset=offset, shape=(length,)) if length
               else np.zeros(0, np.uint8))
        if check:
            check(arr)
        return arr


# ----------------------------------------------------------------------------- HTTP(S)
class Site:
    """A directory on an HTTP(S) server (module docstring): ranged reads, retries, the cache.
    `known`, when set (published.py sets it from the publication's index), maps names to sizes:
    exists() and a file's size then need no request."""

    def __init__(self, url, known=None, stats=None):
        self.url = url
        parsed = urllib.parse.urlsplit(url)
        host = parsed.netloc.replace(":", "_")
        parts = [p for p in parsed.path.split("/") if p]
        if not NAME.fullmatch(host) or not all(NAME.fullmatch(p) for p in parts):
            parts = [hashlib.sha256(url.encode()).hexdigest()[:16]]      # an odd URL: a cache of its own
        self.cache = cache_root().joinpath(host or "host", *parts)
        self.known = known
        self.stats = stats or {"requests": 0, "fetched": 0, "from_cache": 0, "files": {}}

    def __str__(self):
        return self.url

    def show(self, name):
        return f"{self.url}/{name}"

    def join(self, name):
        name = _checked_name(name)
        known = None if self.known is None else {k[len(name) + 1:]: v for k, v in self.known.items()
                                                  if k.startswith(name + "/")}
        return Site(f"{self.url}/{name}", known, self.stats)

    def exists(self, name):
        name = _checked_name(name)
        if self.known is not None:
            return name in self.known
        try:
            self._request(name, "HEAD", None)
            return True
        except NotFound:
            return False

    def open(self, name, what, error, size=None):
        """The file `name`; its size from the publication's index (known), else `size`, else a
        HEAD request."""
        name = _checked_name(name)
        if self.known is not None:
            if name not in self.known:
                raise NotFound(f"{self.show(name)}: not in the publication's index")
            size = self.known[name]
        if size is None:
            size = self._request(name, "HEAD", None)
        return RemoteFile(self, name, size)

    def read_file(self, name, what, limit, error):
        """A whole file of at most `limit` bytes, one GET (never cached: such files may grow)."""
        return self._request(_checked_name(name), "GET", None, limit=limit)

    # --------------------------------------------------------------------- the cache
    def _piece(self, name, offset, length):
        return self.cache.joinpath(*name.split("/")).with_name(name.split("/")[-1] + ".pieces") / \
            f"{offset}-{length}"

    def _cached(self, name, offset, length):
        """The cached piece holding bytes offset..offset+length-1 of `name`: (path, start) or None."""
        exact = self._piece(name, offset, length)
        if exact.exists():
            return exact, 0
        folder = exact.parent
        if not folder.is_dir():
            return None
        for entry in os.listdir(folder):
            begin, _, size = entry.partition("-")
            if begin.isdigit() and size.isdigit() and int(begin) <= offset \
                    and offset + length <= int(begin) + int(size):
                return folder / entry, offset - int(begin)
        return None

    def fetch(self, name, offset, length, check, fresh=False):
        """(path, start) of a cached piece holding the verified bytes offset..offset+length-1 of
        `name`, fetched into the cache unless it holds them. check gets the bytes as a uint8 array
        (mapped) and raises unless they verify."""
        return self.fetch_many(name, [(offset, length, check)], fresh)[0]

    def read_range(self, name, offset, length):
        """The bytes offset..offset+length-1 of `name`, fetched into memory and never cached."""
        out = io.BytesIO()
        self._download(name, offset, length, out)
        return out.getvalue()

    def fetch_many(self, name, items, fresh=False):
        """fetch() of several ranges [(offset, length, check)] of `name` at once: the ranges the
        cache does not hold are fetched in one request per run of adjacent ones (a checkpoint's
        tensors lie back to back), and each run is kept as one piece once every range of it has
        checked. Returns [(path, start)] in the order of `items`."""
        found = [None if fresh else self._checked_piece(name, *item) for item in items]
        # a piece dropped by a later item's check also held items that checked before it: fetch them again
        found = [f if f is None or f[0].exists() else None for f in found]
        self.stats["from_cache"] += sum(items[i][1] for i, f in enumerate(found) if f is not None)
        todo = sorted((item[0], i) for i, item in enumerate(items) if found[i] is None)
        runs = []
        for offset, i in todo:
            if runs and runs[-1][-1][0] + items[runs[-1][-1][1]][1] == offset:
                runs[-1].append((offset, i))
            else:
                runs.append([(offset, i)])
        for run in runs:
            begin = run[0][0]
            length = run[-1][0] + items[run[-1][1]][1] - begin

            def verify(tmp, run=run, begin=begin):
                for offset, i in run:
                    items[i][2](_map(tmp, offset - begin, items[i][1]))
            path = self._piece(name, begin, length)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                hashchain.write_atomically(path, lambda out: self._download(name, begin, length, out),
                                           check=verify)
            except OSError as e:
                raise FetchError(f"cannot write the cache {path.parent}: {e.strerror or e} "
                                 "(--cache DIR names another)") from None
            for offset, i in run:
                found[i] = (path, offset - begin)
        return found

    def _checked_piece(self, name, offset, length, check):
        """The cached (path, start) of the range if its bytes still check, else None (a piece
        that no longer checks, the publication having changed, is dropped)."""
        found = self._cached(name, offset, length)
        if found is None:
            return None
        try:
            check(_map(found[0], found[1], length))
        except Exception:
            found[0].unlink(missing_ok=True)
            return None
        return found

    def _download(self, name, offset, length, out):
        """Write the bytes of the range to the file `out`, in requests of at most PIECE bytes."""
        for begin in range(offset, offset + length, PIECE):
            self._request(name, "GET", (begin, min(PIECE, offset + length - begin)), out=out)

    # --------------------------------------------------------------------- one request
    def _request(self, name, method, byte_range, out=None, limit=None):
        """One request, retried on transient faults. HEAD: the file's size. GET of a range:
        writes its bytes to `out`. GET of a whole file: its bytes (at most `limit`)."""
        url = self.show(urllib.parse.quote(name, safe="/"))
        shown = f"{self.show(name)}" + (f" bytes {byte_range[0]}..{sum(byte_range) - 1}" if byte_range else "")
        timeout = SETTINGS.timeout
        for attempt in range(RETRIES + 1):
            start = out.tell() if out else 0
            try:
                return self._once(url, shown, method, byte_range, out, limit, timeout)
            except _Transient as e:
                if attempt == RETRIES:
                    raise FetchError(f"cannot fetch {shown}: {e} ({RETRIES + 1} tries)") from None
                if out:
                    out.seek(start)
                    out.truncate()
                time.sleep(BACKOFF * 2 ** attempt)

    def _once(self, url, shown, method, byte_range, out, limit, timeout):
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if byte_range:
            headers["Range"] = f"bytes={byte_range[0]}-{sum(byte_range) - 1}"
        length = byte_range[1] if byte_range else None
        deadline = time.monotonic() + timeout + (length or limit or 0) / MIN_RATE
        self.stats["requests"] += 1
        try:
            response = urllib.request.urlopen(urllib.request.Request(url, headers=headers, method=method),
                                              timeout=timeout)
        except urllib.error.HTTPError as e:
            e.close()
            if e.code == 404 or e.code == 410:
                raise NotFound(f"{shown}: not found ({e.code})") from None
            if e.code >= 500 or e.code in (408, 429):
                raise _Transient(f"the server answered {e.code}") from None
            raise FetchError(f"cannot fetch {shown}: the server answered {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            raise _Transient(_why(e)) from None
        with response:
            try:
                if method == "HEAD":
                    size = response.headers.get("Content-Length")
                    if not (size and size.isdigit()):
                        raise FetchError(f"cannot fetch {shown}: the server gives no size (Content-Length)")
                    return int(size)
                if byte_range:
                    self._check_range(shown, response, byte_range)
                    return self._copy(shown, response, length, out, deadline)
                data = self._read_all(shown, response, limit, deadline)
                return data
            except (OSError, http.client.HTTPException) as e:
                raise _Transient(_why(e)) from None

    def _check_range(self, shown, response, byte_range):
        begin, length = byte_range
        if response.status == 200:
            raise FetchError(f"cannot fetch {shown}: the server ignores range requests (it answered 200 with "
                             "the whole file); serve the run from a server that honours them (nginx, an "
                             "object store, Hugging Face)")
        got = response.headers.get("Content-Range", "")
        match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", got.strip())
        if response.status != 206 or not match or (int(match[1]), int(match[2])) != (begin, begin + length - 1):
            raise FetchError(f"cannot fetch {shown}: the server answered {response.status} with "
                             f"Content-Range {got!r}, not the bytes asked for")
        size = response.headers.get("Content-Length")
        if size is not None and size != str(length):
            raise FetchError(f"cannot fetch {shown}: the server sends {size} bytes for a range of {length}")

    def _copy(self, shown, response, length, out, deadline):
        got = 0
        while got < length:
            block = response.read1(min(BLOCK, length - got))    # what one socket read gives: the deadline holds
            if not block:
                raise _Transient(f"the body ended after {got} of {length} bytes (truncated)")
            out.write(block)
            got += len(block)
            if time.monotonic() > deadline:
                raise _Transient(f"too slow: {got} of {length} bytes in the time allowed")
        self._count(shown, got)
        return got

    def _read_all(self, shown, response, limit, deadline):
        size = response.headers.get("Content-Length")
        if size is not None and size.isdigit() and int(size) < limit:   # the deadline of the length announced
            deadline -= (limit - int(size)) / MIN_RATE
        parts, got = [], 0
        while True:
            block = response.read1(BLOCK)
            if not block:
                break
            parts.append(block)
            got += len(block)
            if got > limit:
                raise FetchError(f"cannot fetch {shown}: larger than {limit} bytes")
            if time.monotonic() > deadline:
                raise _Transient(f"too slow: {got} bytes in the time allowed")
        if size is not None and size.isdigit() and int(size) != got:
            raise _Transient(f"the body ended after {got} of {size} bytes (truncated)")
        self._count(shown, got)
        return b"".join(parts)

    def _count(self, shown, got):
        self.stats["fetched"] += got
        url = shown.split(" bytes ")[0]
        self.stats["files"][url] = self.stats["files"].get(url, 0) + got


class RemoteFile:
    """A file of a Site read by ranges, each verified by the caller's check (LocalFile's API)."""

    def __init__(self, site, name, size):
        self.site, self.name, self.size = site, name, size
        self.path = site.show(name)

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def _bounds(self, offset, length):
        if offset < 0 or offset + length > self.size:
            raise FetchError(f"{self.path} has {self.size} bytes; bytes {offset}..{offset + length - 1} "
                             "were asked for")

    def read(self, offset, length, check=None, fresh=False):
        self._bounds(offset, length)
        if not length:
            return b""
        if check is None:
            return self.site.read_range(self.name, offset, length)
        path, start = self.site.fetch(self.name, offset, length, check, fresh)
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(length)

    def view(self, offset, length, check=None):
        """uint8 [length]: the verified bytes mapped from their cached piece."""
        self._bounds(offset, length)
        if not length:
            return np.zeros(0, np.uint8)
        if check is None:
            return np.frombuffer(self.read(offset, length), np.uint8)
        return _map(*self.site.fetch(self.name, offset, length, check), length)

    def views(self, items):
        """[view(offset, length, check) for each item], adjacent ranges fetched together
        (Site.fetch_many): a checkpoint's tensors in one request per run of them."""
        for offset, length, _ in items:
            self._bounds(offset, length)
        wanted = [(i, item) for i, item in enumerate(items) if item[1]]
        found = dict(zip((i for i, _ in wanted), self.site.fetch_many(self.name, [item for _, item in wanted])))
        return [_map(*found[i], items[i][1]) if i in found else np.zeros(0, np.uint8) for i in range(len(items))]


class _Transient(Exception):
    """A fault worth another try (FetchError once the tries are spent)."""


def _map(path, start, length):
    return np.memmap(path, dtype=np.uint8, mode="c", offset=start, shape=(length,))


def _why(error):
    """One phrase for a network error (a refused connection, a timeout, a reset)."""
    reason = getattr(error, "reason", error)
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return f"no answer within {SETTINGS.timeout:g} s (timed out)"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, http.client.IncompleteRead):
        return "the body ended early (truncated)"
    text = str(reason) or type(reason).__name__
    return text.splitlines()[0] if text else type(error).__name__
