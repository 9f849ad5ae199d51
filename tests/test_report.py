"""Tests for report.py: the page's content on a synthetic 81,000-step chain with receipts and
anchors (every step in the coverage strip, curves downsampled with their spikes kept, a small
file, fast), the refusals (output inside the run, a broken chain, a contradicting anchor), a
real tiny run, and one render in headless Chromium where one is installed."""
import hashlib
import json
import re
import shutil
import subprocess
import time

import pytest

import hashchain
import receipts
import report
from tiny import assert_one_line_error, script

STEPS = 81_000
TWO_AUDITORS, ONE_AUDITOR, BAD_STEP, SPIKE = range(1, 201), range(201, 301), 250, 40_000


def fake_hash(*parts):
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def write_chain(run, n_steps, secret):
    """A sealed chain of n_steps step records shaped like train.py's (no tensors behind it)."""
    genesis = {"kind": "genesis", "step": 0, "config": {"seed": 1337, "n_layer": 4, "lr": 0.003},
               "code_digest": fake_hash("code"), "data_manifest": fake_hash("data"),
               "tokenizer": {"name": "bytes", "vocab_size": 256}, "vocab_size": 256,
               "state_hash": fake_hash("state", 0), "tensor_hashes": {}}
    lines, prev = [], hashchain.GENESIS_PREV
    for s in range(n_steps + 1):
        rec = genesis if s == 0 else {
            "kind": "step", "step": s, "state_hash": fake_hash("state", s), "tensor_hashes": {},
            "batch_digest": fake_hash("batch", s), "loss": 99.0 if s == SPIKE else 5.0 - s / n_steps,
            "grad_norm": 0.3 + 2.0 * (1 - s / n_steps) ** 4 + (s % 7) / 100, "lr": 0.003 * (1 - s / (n_steps + 1)),
            "step_commit": receipts.commit(receipts.salt(secret, s), fake_hash("grad", s), fake_hash("result", s))}
        rec = hashchain.seal(rec, prev)
        prev = rec["record_hash"]
        lines.append(json.dumps(rec, sort_keys=True, separators=(",", ":")))
    (run / "chain.jsonl").write_text("\n".join(lines) + "\n")
    return genesis


def receipt(chain, step, auditor, grad_root=None, findings=()):
    return {"format": receipts.RECEIPT_FORMAT, "run": receipts.run_id(chain.records[0]), "step": step,
            "record_hash": chain.records[step]["record_hash"], "state_hash": fake_hash("state", step),
            "grad_root": grad_root or fake_hash("grad", step), "result_root": fake_hash("result", step),
            "auditor": auditor, "machine": {}, "cost": {"seconds": 2.5, "steps_replayed": 3,
                                                        "peak_mib": 100 + step % 3, "bytes_read": 10**6},
            "code_digest": fake_hash("code"), "data_manifest": fake_hash("data"),
            "verdict": "MISMATCH" if findings else "MATCH", "findings": list(findings)}


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """(run, receipts dir, anchors file) of an 81,000-step synthetic run: steps 1..200 have two
    auditors' accepted receipts, 201..300 one, step 250 a reported MISMATCH, one echo."""
    base = tmp_path_factory.mktemp("big")
    run = base / "run"
    run.mkdir()
    secret = receipts.make_secret(run)
    write_chain(run, STEPS, secret)
    (run / "checkpoints").mkdir()                # listed by name only: the report never reads them
    for s in range(0, STEPS + 1, 10_000):
        (run / "checkpoints" / f"step_{s:08d}.safetensors").touch()
    chain = hashchain.Chain(run / "chain.jsonl")
    chain.load(repair=False)
    rdir = base / "receipts"
    rdir.mkdir()
    todo = [(s, a) for s in TWO_AUDITORS for a in ("alice", "bob")] + [(s, "carol") for s in ONE_AUDITOR]
    for s, a in todo:
        findings = [f"MISMATCH at step {BAD_STEP}: field loss differs"] if (s, a) == (BAD_STEP, "carol") else []
        receipts.write_receipt(rdir / f"{a}_{s}.json", receipt(chain, s, a, findings=findings))
    receipts.write_receipt(rdir / "echo_400.json", receipt(chain, 400, "mallory", fake_hash("echo")))
    anchors = base / "anchors.jsonl"
    anchors.write_text("".join(json.dumps({"step": s, "record_hash": chain.records[s]["record_hash"],
                                           "utc": "2026-12-01T00:00:00Z"}) + "\n" for s in (1000, 50_000)))
    return run, rdir, anchors


def strip_levels(page):
    """{step: level} reconstructed from the strip's rects (each says which steps it covers)."""
    levels = {}
    for cls, a, b in re.findall(r'<rect class="(\w+)" data-steps="(\d+)-(\d+)"', page):
        for s in range(int(a), int(b) + 1):
            assert s not in levels, f"step {s} drawn twice"
            levels[s] = cls
    return levels


@pytest.fixture(scope="module")
def big_report(big, tmp_path_factory):
    """(page file, CPU seconds) of the big run's report with its receipts and anchors."""
    run, rdir, anchors = big
    out = tmp_path_factory.mktemp("big_report") / "report.html"
    t0 = time.process_time()        # CPU seconds: a shared machine's load does not inflate them
    assert report.main(["--run_dir", str(run), "--receipts", str(rdir), "--anchors", str(anchors), "--out", str(out)]) == 0
    return out, time.process_time() - t0


def test_big_run_report(big, big_report):
    run, _, _ = big
    out, seconds = big_report
    page = out.read_text()
    assert seconds < 60 and len(page) < 1_500_000, (seconds, len(page))
    chain = hashchain.Chain(run / "chain.jsonl")
    chain.load(repair=False)
    # the header facts
    for fact in (chain.records[0]["record_hash"], chain.head, fake_hash("code"), fake_hash("data"),
                 chain.records[-1]["state_hash"], "n_layer"):
        assert fact in page
    # every step in the strip, exactly as the receipts say (never downsampled)
    expected = {s: "mismatch" if s == BAD_STEP else "full" if s in TWO_AUDITORS else
                "some" if s in ONE_AUDITOR else "none" for s in range(1, STEPS + 1)}
    assert strip_levels(page) == expected
    # the echo and the MISMATCH receipt are rejected: listed, not counted as coverage
    assert "499 accepted, 2 rejected" in page and "echo_400.json" in page
    # the curves: downsampled, the one-step loss spike kept
    for points in re.findall(r'<polyline [^>]*points="([^"]*)"', page):
        assert len(points.split()) <= 2 * report.CURVE_POINTS
    assert ">99<" in page                                        # the loss axis reaches the spike
    # the costs, and the anchors
    assert re.search(r"<td>alice</td><td>200</td><td>600</td><td>500.0</td><td>102</td><td>200.0</td>", page)
    assert "ANCHORED" in page and page.count('class="anchor"') == 2
    assert "9 checkpoint files (steps 0,10000,20000," in page and page.count('class="ckpt"') == 9


def test_contradicting_anchor_is_a_mismatch(big, tmp_path, capsys):
    run, _, _ = big
    anchors = tmp_path / "anchors.jsonl"
    anchors.write_text(json.dumps({"step": 7, "record_hash": "0" * 64, "utc": "2026-12-01T00:00:00Z"}) + "\n")
    assert report.main(["--run_dir", str(run), "--anchors", str(anchors), "--out", str(tmp_path / "r.html")]) == 1
    assert "MISMATCH at step 7" in capsys.readouterr().out
    page = (tmp_path / "r.html").read_text()
    assert "MISMATCH at step 7" in page and strip_levels(page) == {}     # no receipts: no strip


def test_refusals(big, tmp_path):
    run, rdir, _ = big
    assert_one_line_error(script("report.py", "--run_dir", run, "--out", run / "report.html"), "report.py")
    assert not (run / "report.html").exists()
    assert_one_line_error(script("report.py", "--run_dir", tmp_path / "nowhere", "--out", tmp_path / "r.html"), "report.py")
    public = tmp_path / "public"                 # a published copy: no secret, no salts
    public.mkdir()
    shutil.copy(run / "chain.jsonl", public / "chain.jsonl")
    assert_one_line_error(script("report.py", "--run_dir", public, "--receipts", rdir, "--out", tmp_path / "r.html"), "report.py")
    lines = (public / "chain.jsonl").read_bytes().split(b"\n")
    lines[5] = lines[5].replace(b'"kind":"step"', b'"kind":"steP"')
    (public / "chain.jsonl").write_bytes(b"\n".join(lines))
    proc = script("report.py", "--run_dir", public, "--out", tmp_path / "tampered.html")
    assert proc.returncode == 1 and proc.stdout.startswith("MISMATCH at step 5:"), proc.stdout + proc.stderr
    assert not (tmp_path / "tampered.html").exists()


def test_real_run(reference, tmp_path):
    out = tmp_path / "report.html"
    proc = script("report.py", "--run_dir", reference, "--out", out)
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    assert "4 checkpoint files (steps 0,10,20,30)" in page
    assert "No receipts given" in page and page.count("<polyline") == 3
    assert "<script" not in page and "http" not in page.replace("http-equiv", "")   # self-contained


@pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")),
                    reason="no headless Chromium installed (apt-get install chromium) to render the page")
def test_renders_in_headless_chromium(big_report, tmp_path):
    out, _ = big_report
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    png = tmp_path / "report.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={png}",
                    "--window-size=1150,2400", out.as_uri()], capture_output=True, timeout=300)
    assert png.exists() and png.stat().st_size > 10_000
