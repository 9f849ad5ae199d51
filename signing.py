"""Signatures with the SSH keys people already hold: OpenSSH's `ssh-keygen -Y sign` and
`ssh-keygen -Y verify`, the scheme git uses for signed commits, run as a subprocess (bounded by a
timeout). Every signer and verifier in the project goes through this module: auditors' receipts
(namespace RECEIPT) and the publisher's anchors (namespace ANCHOR); a roster of auditors is an
allowed_signers file (read_roster).

    signer = Signer("keys/alice", "--key")          # checked now: the file exists and signs (UsageError)
    signer.public_key                               # "ssh-ed25519 AAAA..." (no comment)
    text = signer.sign(message, RECEIPT)            # an armored SSH signature (-----BEGIN SSH SIGNATURE-----)
    verify(message, text, signer.public_key, RECEIPT)   # None when it verifies, else why not (one line)
    parse_public_key("ssh-ed25519 AAAA... alice")   # ("ssh-ed25519 AAAA...", raw key blob); ValueError
    fingerprint(public_key)                         # "SHA256:..." as ssh-keygen -l prints it
    roster = read_roster("roster")                  # {public key: name}, one line per auditor

Why SSH signatures and not Ed25519 through a Python library: researchers already hold these keys
(git signs commits and tags with them, and every GitHub account publishes its SSH public keys at
https://github.com/NAME.keys), so an auditor's identity is one they already have; no package is
added; and the signature is OpenSSH's standard format (PROTOCOL.sshsig), which anyone checks with
`ssh-keygen -Y verify` alone, without this code. Every key type ssh-keygen signs with works
(KEY_TYPES: Ed25519, ECDSA, RSA, and the FIDO security-key types); a key in ssh-agent signs when
the key file given is its public key (or an encrypted private key the agent holds).

Versions: `-Y sign` and `-Y verify` exist since OpenSSH 8.1 (2019); they are the only verbs used
here (git asks for 8.2 because it also uses `-Y find-principals`: a roster is matched by its exact
public keys here instead). Debian 12 ships 9.2.

A key is checked when a command starts (Signer: it must sign a probe message under a namespace of
its own), so that a missing, encrypted or unusable key is one line and exit 2 before any replay.
ssh-keygen runs with standard input from /dev/null in a session of its own: it never waits on a
passphrase prompt. Errors: config.UsageError (one line).
"""
import base64
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

import hashchain
from config import UsageError

RECEIPT = "repops-receipt"          # the namespace of an auditor's receipt signature (SPEC §11.6)
ANCHOR = "repops-anchor"            # of the publisher's anchor signature (SPEC §11.7)
PROBE = "repops-key-check"          # of the probe that checks a key before any work (signs no published byte)
KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa",
             "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")
TIMEOUT = 60                        # seconds for one ssh-keygen call (a security key may wait for a touch)
MAX_ROSTER = 1 << 20                # a roster: ~100 bytes per auditor
NAME = re.compile(r"[A-Za-z0-9._@+-]{1,64}")     # a roster name: a literal allowed_signers principal
ARMOR = ("-----BEGIN SSH SIGNATURE-----", "-----END SSH SIGNATURE-----")
MAX_SIGNATURE = 1 << 16             # an armored signature: a few hundred bytes (RSA-4096: ~1 KB)


def _ssh_keygen():
    path = shutil.which("ssh-keygen")
    if path is None:
        raise UsageError("ssh-keygen is not installed: signing and checking signatures need OpenSSH 8.1 or "
                         "later (Debian: apt-get install openssh-client)")
    return path


def _run(argv, stdin=subprocess.DEVNULL, cwd=None):
    """(exit code, stderr text) of ssh-keygen with argv, stdin a file or /dev/null, no terminal."""
    try:
        proc = subprocess.run([_ssh_keygen(), *argv], stdin=stdin, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, cwd=cwd, timeout=TIMEOUT, start_new_session=True)
    except subprocess.TimeoutExpired:
        return None, f"ssh-keygen did not answer within {TIMEOUT} s"
    return proc.returncode, proc.stderr.decode("utf-8", "replace")


def _ssh_string(blob, at):
    """(bytes, next offset) of the SSH wire-format string at `at` (uint32 big-endian length)."""
    if at + 4 > len(blob):
        raise ValueError("truncated")
    n = int.from_bytes(blob[at:at + 4], "big")
    if at + 4 + n > len(blob):
        raise ValueError("truncated")
    return blob[at + 4:at + 4 + n], at + 4 + n


def parse_public_key(text):
    """(the key as "TYPE BASE64", its raw blob) of an OpenSSH public key line ("TYPE BASE64
    [COMMENT]"); ValueError unless TYPE is one of KEY_TYPES and BASE64 is a blob of that type."""
    parts = text.split() if isinstance(text, str) else []
    if len(parts) < 2 or parts[0] not in KEY_TYPES:
        raise ValueError(f"not an SSH public key (TYPE BASE64, TYPE one of {', '.join(KEY_TYPES)})")
    try:
        blob = base64.b64decode(parts[1], validate=True)
        kind, _ = _ssh_string(blob, 0)
    except ValueError:                      # binascii.Error is one
        raise ValueError("its BASE64 is not an SSH public key blob") from None
    if kind != parts[0].encode():
        raise ValueError(f"its blob is a {kind.decode('ascii', 'replace')[:40]} key, not {parts[0]}")
    return f"{parts[0]} {base64.b64encode(blob).decode()}", blob


def is_public_key(text):
    """True if `text` is a public key written as parse_public_key writes it ("TYPE BASE64")."""
    try:
        return parse_public_key(text)[0] == text
    except ValueError:
        return False


def fingerprint(public_key):
    """SHA256:<base64 of SHA-256 of the key blob, unpadded>, as ssh-keygen -l prints it."""
    blob = parse_public_key(public_key)[1]
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def signature_key(text):
    """The public key ("TYPE BASE64") inside an armored SSH signature (PROTOCOL.sshsig: "SSHSIG",
    version 1, then the signer's public key blob); ValueError if it is not one (armor is ASCII:
    a non-ASCII line break, which splitlines() honours and ssh-keygen does not, is none)."""
    lines = text.strip().splitlines() if isinstance(text, str) and text.isascii() else []
    if len(lines) < 3 or (lines[0], lines[-1]) != ARMOR:
        raise ValueError("not an armored SSH signature")
    try:
        raw = base64.b64decode("".join(lines[1:-1]), validate=True)
    except ValueError:                      # binascii.Error is one
        raise ValueError("not an armored SSH signature") from None
    if raw[:6] != b"SSHSIG" or raw[6:10] != (1).to_bytes(4, "big"):
        raise ValueError("not an SSH signature (SSHSIG, version 1)")
    blob, _ = _ssh_string(raw, 10)
    kind, _ = _ssh_string(blob, 0)
    return parse_public_key(f"{kind.decode('ascii', 'replace')} {base64.b64encode(blob).decode()}")[0]


def _why_not(stderr, path):
    """One line saying why ssh-keygen could not sign with the key file `path`."""
    text = stderr.lower()
    if "passphrase" in text:
        return "it is encrypted and no ssh-agent holds it (add it with ssh-add, or give an unencrypted key)"
    if "too open" in text:
        return f"its permissions are too open for ssh-keygen (chmod 600 {path})"
    if "no private key found" in text:
        return "it is a public key, and neither its private key beside it nor ssh-agent holds the private key"
    if "couldn't load" in text or "invalid format" in text:
        return "it is not an SSH key ssh-keygen can read"
    if "unknown option" in text or "illegal option" in text:
        return "this ssh-keygen cannot sign (OpenSSH 8.1 or later is needed)"
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("@")]
    return ("ssh-keygen: " + lines[-1][:200]) if lines else "ssh-keygen could not sign with it"


class Signer:
    """A key that signs: the key file (a private key, or the public key of one that ssh-agent
    holds) is checked when this is made, by signing a probe; `public_key` is the key the probe's
    signature names. UsageError (one line, naming `option`) if it does not exist or cannot sign."""

    def __init__(self, path, option="--key"):
        self.path, self.option = os.path.abspath(os.path.expanduser(str(path))), option
        shown = str(path) if str(path).isprintable() else ascii(str(path))
        if not os.path.isfile(self.path):
            raise UsageError(f"{option} {shown}: no such key file")
        self.shown = shown
        self.public_key = None
        self.public_key = signature_key(self.sign(b"repops: can this key sign?", PROBE))
        self.blob = parse_public_key(self.public_key)[1]

    def sign(self, message, namespace):
        """The armored signature (text) of `message` (bytes) under `namespace` by this key."""
        with tempfile.TemporaryDirectory(prefix="repops-sign-") as tmp:
            data = os.path.join(tmp, "message")
            with open(data, "wb") as f:
                f.write(message)
            code, stderr = _run(["-Y", "sign", "-f", self.path, "-n", namespace, data])
            sig = data + ".sig"
            if code != 0 or not os.path.isfile(sig):
                raise UsageError(f"{self.option} {self.shown} cannot sign: {_why_not(stderr, self.shown)}")
            text = hashchain.read_bytes(sig, "signature", MAX_SIGNATURE, UsageError).decode("ascii")
        if self.public_key is not None and signature_key(text) != self.public_key:
            raise UsageError(f"{self.option} {self.shown} changed while this command ran (it signs with another key now)")
        return text


def verify(message, signature, public_key, namespace):
    """None if `signature` (armored text) is a valid signature of `message` (bytes) under
    `namespace` by `public_key` ("TYPE BASE64"), else one line saying why not. ssh-keygen -Y verify
    against an allowed_signers file holding that one key."""
    try:
        key, _ = parse_public_key(public_key)
        if len(signature) > MAX_SIGNATURE or signature_key(signature) != key:
            return "its signature is not by its signer key"
    except (ValueError, TypeError) as e:
        return f"its signature or signer key is malformed ({e})"
    with tempfile.TemporaryDirectory(prefix="repops-verify-") as tmp:
        for name, text in (("allowed_signers", f"signer {key}\n"), ("sig", signature)):
            with open(os.path.join(tmp, name), "w", encoding="ascii") as f:
                f.write(text)
        with open(os.path.join(tmp, "message"), "wb") as f:
            f.write(message)
        with open(os.path.join(tmp, "message"), "rb") as f:
            code, stderr = _run(["-Y", "verify", "-f", "allowed_signers", "-I", "signer", "-n", namespace,
                                 "-s", "sig"], stdin=f, cwd=tmp)
    if code == 0:
        return None
    if code is None:
        return stderr
    return "its signature does not verify (the signed bytes were changed, or it was made for another purpose)"


def read_roster(path, option="--roster"):
    """{public key ("TYPE BASE64"): name} of a roster: an allowed_signers file (ssh-keygen(1),
    ALLOWED SIGNERS) of one line per auditor, "NAME TYPE BASE64 [COMMENT]", with no options; blank
    lines and lines starting with # are skipped. A name or a key listed twice is refused, so
    that one key counts once and one name is one key. UsageError (one line) if it is not one."""
    shown = str(path) if str(path).isprintable() else ascii(str(path))
    try:
        text = hashchain.read_bytes(path, "roster", MAX_ROSTER, UsageError).decode("ascii")
    except UnicodeDecodeError:
        raise UsageError(f"{option} {shown} is not an ASCII allowed_signers file") from None
    roster, names = {}, set()
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split()
        where = f"{option} {shown} line {n}"
        if len(parts) < 3 or not NAME.fullmatch(parts[0]):
            raise UsageError(f"{where}: expected NAME TYPE BASE64 [COMMENT], NAME 1..64 of A-Z a-z 0-9 . _ @ + -")
        if parts[1] not in KEY_TYPES:
            raise UsageError(f"{where}: {parts[1][:40]!r} is not a key type ({', '.join(KEY_TYPES)}); "
                             "a roster line holds no options")
        try:
            key, _ = parse_public_key(" ".join(parts[1:3]))
        except ValueError as e:
            raise UsageError(f"{where}: {e}") from None
        if parts[0] in names or key in roster:
            raise UsageError(f"{where}: the {'name ' + parts[0] if parts[0] in names else 'key'} is listed twice "
                             "(one line per auditor, one key each)")
        names.add(parts[0])
        roster[key] = parts[0]
    if not roster:
        raise UsageError(f"{option} {shown} lists no auditor (NAME TYPE BASE64 per line)")
    return roster
