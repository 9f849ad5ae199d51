"""A synthetic run for report.py: an 81,000-step chain shaped like train.py's (no tensors behind
it), its train.log, signed receipts of three auditors (keys made with ssh-keygen, a roster of
them) and two anchors. tests/test_report.py reads it; docs/report.png is its report.

    python -m tools.synthetic_run --out out/synth          # out/synth/{run, receipts, keys, roster, anchors.jsonl}
    python report.py --run_dir out/synth/run --receipts out/synth/receipts --roster out/synth/roster --anchors out/synth/anchors.jsonl --out out/synth/report.html
    chromium --headless --no-sandbox --screenshot=docs/report.png --window-size=1120,2600 out/synth/report.html

The run: loss falling linearly from 5 with a one-step spike to 99 at step SPIKE, a gradient norm
decaying to 0.3, a linear lr; a validation loss every VAL_EVERY steps, the unigram baseline,
and step timings of about 650 ms with a resume at RESUMED (its first step includes start-up).
Steps 1..200 have two auditors' accepted receipts, 201..300 one, step BAD_STEP a receipt that
reports a MISMATCH, and one receipt's proof is not the step's (rejected). A checkpoint file
(empty: the report only lists them) every 10,000 steps; anchors at steps 1,000 and 50,000.
"""
import hashlib
import json
import os
from pathlib import Path

from config import CommandLine, duration

STEPS = 81_000
TWO_AUDITORS, ONE_AUDITOR, BAD_STEP, SPIKE = range(1, 201), range(201, 301), 250, 40_000
VAL_EVERY, RESUMED, BASELINE = 5_000, 30_000, 3.324


def parser():
    ap = CommandLine("python -m tools.synthetic_run", "Write a synthetic run for report.py: an 81,000-step chain "
                     "shaped like train.py's, its train.log, receipts of three auditors and two anchors.")
    ap.add_argument("--out", metavar="DIR", required=True,
                    help="a new folder: run/, receipts/ and anchors.jsonl are written in it (required)")
    ap.add_argument("--steps", type=int, default=STEPS, help="steps in the chain (default %(default)s)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import subprocess  # noqa: E402

import hashchain  # noqa: E402  (below the command line's first answer, above)
import receipts  # noqa: E402
import repops  # noqa: E402
import signing  # noqa: E402


def fake_hash(*parts):
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def loss_at(s, n_steps):
    return 99.0 if s == SPIKE else 5.0 - s / n_steps


def write_chain(run, n_steps, secret):
    """A sealed chain of n_steps step records shaped like train.py's; returns the genesis record."""
    genesis = {"kind": "genesis", "step": 0, "spec": hashchain.SPEC, "contract": repops.CONTRACT,
               "config": {"seed": 1337, "n_layer": 4, "lr": 0.003},
               "code_digest": fake_hash("code"), "data_manifest": fake_hash("data"),
               "tokenizer": {"name": "bytes", "vocab_size": 256}, "vocab_size": 256,
               "state_hash": fake_hash("state", 0)}
    sealed = hashchain.seal(genesis, hashchain.GENESIS_PREV)
    lines, prev = [json.dumps(sealed, sort_keys=True, separators=(",", ":"))], sealed["record_hash"]
    for s in range(1, n_steps + 1):
        rec = {
            "kind": "step", "step": s, "run": sealed["record_hash"], "state_hash": fake_hash("state", s),
            "batch_digest": fake_hash("batch", s), "loss": loss_at(s, n_steps),
            "grad_norm": 0.3 + 2.0 * (1 - s / n_steps) ** 4 + (s % 7) / 100, "lr": 0.003 * (1 - s / (n_steps + 1)),
            "step_commit": receipts.step_commit(receipts.salt(secret, s), fake_hash("result", s))}
        rec = hashchain.seal(rec, prev)
        prev = rec["record_hash"]
        lines.append(json.dumps(rec, sort_keys=True, separators=(",", ":")))
    (Path(run) / "chain.jsonl").write_text("\n".join(lines) + "\n")
    return genesis


def write_log(run, n_steps):
    """train.log as train.py writes it: the first line with the baseline, a line per step, a
    validation loss every VAL_EVERY steps, and a resume at RESUMED."""
    lines = [f"model 0.92M params | 4096 tokens/step | 1 rank(s) x 4 micro-batches | unigram baseline {BASELINE} nats"]
    for s in range(1, n_steps + 1):
        if s == RESUMED:
            lines.append(f"resume: from step {s - 1} ({s - 1} steps in the chain)")
        ms = 9000.0 if s == RESUMED else 650.0 + 40 * ((s * 7919) % 13) / 13
        lines.append(f"step {s:5d}/{n_steps} | loss {loss_at(s, n_steps):.4f} | lr 3.00e-03 | norm 1.000 | {ms:6.0f} ms | "
                     f"{4096 / ms * 1000:7.0f} tok/s | ETA {duration((n_steps - s) * ms / 1000)} | "
                     f"state {fake_hash('state', s)[:12]}")
        if s % VAL_EVERY == 0:
            lines.append(f"step {s:5d} | val loss {5.05 - s / n_steps - 0.5 * (s / n_steps) ** 2:.4f}")
    (Path(run) / "train.log").write_text("\n".join(lines) + "\n")


def receipt(chain, step, signer, result_root=None, findings=()):
    """A whole step's receipt by signer (signing.Signer), signed: its proof of the step's fake
    result_root (or of `result_root`: a proof that is not the step's)."""
    run = receipts.run_id(chain.records[0])
    proof = {"result": receipts.result_proof(run, step, False, signer.blob, result_root or fake_hash("result", step))}
    made = receipts.make_receipt(chain.records[0], chain.records[step], "step", proof, signer.public_key, {},
                                 {"seconds": 2.5, "steps_replayed": 3, "peak_mib": 100 + step % 3, "bytes_read": 10**6},
                                 fake_hash("code"), fake_hash("data"), findings)
    return receipts.sign_receipt(made, signer)


def make_keys(base, names):
    """{name: signing.Signer} of fresh Ed25519 keys (ssh-keygen, no passphrase) under base/keys, and
    base/roster naming them (an allowed_signers file)."""
    keys = Path(base) / "keys"
    keys.mkdir()
    signers = {}
    for name in names:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(keys / name)],
                       check=True, stdin=subprocess.DEVNULL)
        signers[name] = signing.Signer(keys / name)
    (Path(base) / "roster").write_text("".join(f"{n} {s.public_key}\n" for n, s in signers.items()))
    return signers


def make(base, n_steps=STEPS):
    """(run, receipts dir, anchors file) of the synthetic run under `base` (created), with
    base/roster and the auditors' keys in base/keys."""
    base = Path(base)
    run = base / "run"
    os.makedirs(run / "checkpoints")
    secret = receipts.make_secret(run)
    write_chain(run, n_steps, secret)
    write_log(run, n_steps)
    for s in range(0, n_steps + 1, 10_000):
        (run / "checkpoints" / f"step_{s:08d}.safetensors").touch()
    chain = hashchain.Chain(run / "chain.jsonl")
    chain.load(repair=False)
    signers = make_keys(base, ("alice", "bob", "carol", "mallory"))
    rdir = base / "receipts"
    rdir.mkdir()
    todo = [(s, a) for s in TWO_AUDITORS for a in ("alice", "bob")] + [(s, "carol") for s in ONE_AUDITOR]
    for s, a in todo:
        findings = [f"MISMATCH at step {BAD_STEP}: field loss differs"] if (s, a) == (BAD_STEP, "carol") else []
        receipts.write_receipt(rdir / f"{a}_{s}.json", receipt(chain, s, signers[a], findings=findings))
    receipts.write_receipt(rdir / "echo_400.json", receipt(chain, 400, signers["mallory"], fake_hash("echo")))
    anchors = base / "anchors.jsonl"
    anchors.write_text("".join(json.dumps({"step": s, "record_hash": chain.records[s]["record_hash"],
                                           "utc": "2026-12-01T00:00:00Z"}) + "\n" for s in (1000, 50_000)))
    return run, rdir, anchors


def main(argv=None):
    args = parser().parse_args(argv)
    run, rdir, anchors = make(args.out, args.steps)
    print(f"{run}: {args.steps} steps; receipts in {rdir}; anchors {anchors}")


if __name__ == "__main__":
    main()
