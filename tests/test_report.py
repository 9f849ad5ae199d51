"""Tests for report.py and svgchart.py: the page's content on a synthetic 81,000-step chain with
receipts and anchors (every step in the coverage strip, curves downsampled with their spikes
kept and clipped, not flattening the curve, a small file, fast), the refusals (output inside the
run, a broken chain, a contradicting anchor), what a verified chain is said to mean (a resealed
chain without anchors: the publisher's word, no step replayed), real tiny runs (validation loss
against the unigram baseline, throughput, two runs compared: where their chains part and the
commands that localize it), the axes' ticks, the strip of a 10-step run, and one render in
headless Chromium where one is installed."""
import json
import random
import re
import shutil
import time

import pytest

import hashchain
import receipts
import report
import svgchart
from tiny import (assert_one_line_error, chain_records, reseal, run_process, script, train,
                  write_chain as write_records)
from tools import synthetic_run
from tools.synthetic_run import BAD_STEP, ONE_AUDITOR, STEPS, TWO_AUDITORS, fake_hash



@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """(run, receipts dir, anchors file) of the 81,000-step synthetic run (tools/synthetic_run.py):
    steps 1..200 have two auditors' accepted receipts (signed, their keys in its roster), 201..300
    one, step 250 a reported MISMATCH, one proof that is not the step's; a train.log with a
    validation loss every 5,000 steps and a resume."""
    return synthetic_run.make(tmp_path_factory.mktemp("big"))


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
    assert report.main(["--run_dir", str(run), "--receipts", str(rdir), "--roster", str(rdir.parent / "roster"),
                        "--anchors", str(anchors), "--out", str(out)]) == 0
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
    # the curves: downsampled, the one-step loss spike kept but clipped at the axis edge and
    # labelled, so the loss axis spans the curve (about 4 to 5), not the spike
    for points in re.findall(r'<polyline [^>]*points="([^"]*)"', page):
        assert len(points.split()) <= 2 * svgchart.CURVE_POINTS
    loss_chart = page.split("<h3>Loss</h3>")[1].split("</svg>")[0]
    assert "99 at step 40,000" in loss_chart and loss_chart.count('class="spike"') == 2   # marker, label
    assert max(float(t.replace(",", "")) for t in re.findall(r'text-anchor="end">([0-9.,]+)</text>', loss_chart)) < 6
    # train.log: the validation loss against the baseline, as points, a line and a table; the
    # step timings, the resume's 9 s step clipped and labelled
    assert page.count("<circle") == 16 and "unigram baseline 3.324" in page
    assert page.count("<td>3.3240</td>") == 16 and "<td>5000</td><td>4.9864</td><td>3.3240</td><td>+1.6624</td>" in page
    assert "9000 ms at step 30,000" in page and re.search(r"<td>81000</td><td>6\d\d</td><td>6\d\d\d</td><td>15h", page)
    assert ("Replayed, by accepted receipts: steps 1-249,251-300 (299 of 81000 steps covered by accepted receipts, "
            "200 by at least 2 distinct roster keys); steps 301-81000 have none; <span class='bad'>a MISMATCH is "
            "reported at steps 250</span>.") in page
    # the costs, and the anchors
    assert re.search(r"<td>alice</td><td>200</td><td>600</td><td>500.0</td><td>102</td><td>200.0</td>", page)
    assert "ANCHORED" in page and page.count('class="anchor"') == 2
    assert "9 checkpoint files (steps 0,10000,20000," in page and page.count('class="ckpt"') == 9


def test_only_roster_keys_count(big, tmp_path):
    """A roster without bob: his accepted receipt and an unsigned copy of alice's are listed apart,
    and the strip counts alice's key alone."""
    run, rdir, _ = big
    mine = tmp_path / "r"
    mine.mkdir()
    for name in ("alice_5.json", "bob_5.json"):
        shutil.copy(rdir / name, mine / name)
    unsigned = json.loads((rdir / "alice_6.json").read_text())
    del unsigned["signature"]
    (mine / "alice_6.json").write_text(json.dumps(unsigned))
    roster = tmp_path / "roster"
    roster.write_text("".join(line + "\n" for line in (rdir.parent / "roster").read_text().splitlines()
                              if not line.startswith("bob ")))
    out = tmp_path / "r.html"
    assert report.main(["--run_dir", str(run), "--receipts", str(mine), "--roster", str(roster), "--out", str(out)]) == 0
    page = out.read_text()
    levels = strip_levels(page)
    assert levels[5] == "some" and levels[6] == "none", (levels[5], levels[6])
    apart = page.split("<h3>Not counted: unsigned, or signed by keys not in the roster</h3>")[1].split("</table>")[0]
    assert "bob_5.json" in apart and "a key not in the roster" in apart
    assert "alice_6.json" in apart and "<td>unsigned</td>" in apart
    assert "2 accepted, 0 rejected, 1 unsigned" in page and "1 counted" in page


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


def test_a_resealed_chain_without_anchors_is_the_publishers_word(tmp_path, capsys):
    """A forger edits a loss, reseals every link and drops the anchors: the chain verifies (exit
    0), and the page says what was checked and what that is worth: the links, no step replayed,
    the publisher's word, no receipt covering any step, nothing outside the run pinning it; it
    never says that the chain "verified", as if a step had been replayed."""
    run = tmp_path / "run"
    run.mkdir()
    synthetic_run.write_chain(run, 50, receipts.make_secret(run))
    records = chain_records(run)
    records[20]["loss"] = 0.001
    write_records(run, reseal(records, 20))
    out = tmp_path / "r.html"
    assert report.main(["--run_dir", str(run), "--out", str(out)]) == 0
    text = re.sub(r"<[^>]+>", "", out.read_text())
    assert not re.search(r"chain[^.]{0,40} verified", text), text[:300]
    for said in ("Checked before anything here was read: the links of the 51 records of the chain",
                 "Checking the links replays no step", "the publisher's word until audited",
                 "Replayed, by accepted receipts: no step", "0 of 50 steps covered by accepted receipts",
                 "No anchors: nothing published outside the run"):
        assert said in text, said


@pytest.fixture(scope="module")
def evaluated(corpus, tmp_path_factory):
    """A tiny run like the reference but with another lr, a validation loss every 10 steps."""
    return train(tmp_path_factory.mktemp("evaluated") / "run", corpus, "--lr=0.002", "--eval_every=10")


def test_real_run(reference, tmp_path):
    out = tmp_path / "report.html"
    proc = script("report.py", "--run_dir", reference, "--out", out)
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    assert "4 checkpoint files (steps 0,10,20,30)" in page
    assert "No receipts given" in page and page.count("<polyline") == 4        # loss, norm, lr, ms/step
    assert re.search(r"<td>[^<]*reference[^<]*</td><td>30</td><td>\d+</td><td>\d+</td>", page)   # throughput
    assert "<script" not in page and "http" not in page.replace("http-equiv", "")   # self-contained


def test_validation_against_the_unigram_baseline(evaluated, tmp_path):
    out = tmp_path / "report.html"
    assert report.main(["--run_dir", str(evaluated), "--log_y", "--out", str(out)]) == 0
    page = out.read_text()
    log = (evaluated / "train.log").read_text()
    baseline = float(re.search(r"unigram baseline ([0-9.]+) nats", log).group(1))
    vals = {int(s): float(v) for s, v in report.VAL_LINE.findall(log)}
    assert sorted(vals) == [10, 20, 30]
    assert f"unigram baseline {baseline:.3f}" in page and "stroke-dasharray" in page       # the line
    for step, v in vals.items():                                                      # the table
        assert f"<td>{step}</td><td>{v:.4f}</td><td>{baseline:.4f}</td><td>{v - baseline:+.4f}</td>" in page
    assert "Loss (log scale)" in page


def test_the_baseline_comes_from_the_corpus_when_the_log_lacks_it(evaluated, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(evaluated, run)
    log = (run / "train.log").read_text()
    (run / "train.log").write_text(re.sub(r"unigram baseline [0-9.]+ nats", "", log))
    assert report.main(["--run_dir", str(run), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "computed from" in page and re.search(r"unigram baseline \d\.\d{4} nats", page)
    (run / "config.json").write_text('{"data_dir": "/nowhere"}')
    assert report.main(["--run_dir", str(run), "--out", str(tmp_path / "r.html")]) == 0
    assert "no unigram baseline: train.log does not give it" in (tmp_path / "r.html").read_text()


def test_two_runs_compared(reference, evaluated, tmp_path):
    """The reference and a run with another lr: the same genesis state, so they part at step 1, as
    their configs say they must (no checkpoint of step 1 names the tensor: records hold state
    roots only): the page says that this is expected (no alarm, no trace commands), before the
    curves; one trust banner for both runs."""
    out = tmp_path / "compare.html"
    assert report.main(["--run_dir", str(reference), "--compare", str(evaluated), "--out", str(out)]) == 0
    page = out.read_text()
    assert "differ in config key lr" in page and "so their chains are expected to part: they part at step 1" in page
    assert "not named here: the records hold state roots only" in page
    assert "First difference" not in page and "optrace.py" not in page
    assert page.index("expected to part") < page.index("<h3>Loss</h3>")
    assert page.count("Checked before anything here was read") == 1 and "the chain of B: " in page
    assert re.search(r"<td>lr</td><td>0\.003</td><td>0\.002</td>", page)                 # the config diff, folded
    assert page.index("<details>") < page.index("<td>lr</td>")
    loss_chart = page.split("<h3>Loss</h3>")[1].split("</svg>")[0]
    assert loss_chart.count("<polyline") == 2                                            # overlaid
    # a run against itself: the same state at every step
    assert report.main(["--run_dir", str(reference), "--compare", str(reference), "--out", str(out)]) == 0
    assert "the same state at every common step" in out.read_text()


def test_runs_that_agree_on_everything_yet_part_get_the_trace_commands(reference, tmp_path):
    """The same genesis record, a state that differs from step 5 on (a forger's resealed chain,
    standing in for a machine that broke the contract): the page flags the first difference and
    gives the commands that name the first operator whose bits differ."""
    other = tmp_path / "other"
    shutil.copytree(reference, other)
    records = chain_records(other)
    for r in records[5:]:
        r["state_hash"] = fake_hash(f"state {r['step']}")
    write_records(other, reseal(records))
    out = tmp_path / "compare.html"
    assert report.main(["--run_dir", str(reference), "--compare", str(other), "--out", str(out)]) == 0
    page = out.read_text()
    assert "First difference: step 5." in page and "expected" not in page
    assert f"audit.py --run_dir {other} --step 5 --trace" in page and "optrace.py out/a_5.jsonl out/b_5.jsonl" in page


def test_robust_limits_clip_true_spikes_only():
    """A short curve is drawn whole, however it scatters (a 10-step run's step times on a busy
    machine: 18 to 3,000 ms); a long one clips its few true spikes, never a scatter of many."""
    times = [3000, 18, 25, 1600, 1620, 1580, 1640, 40, 1610, 1590]
    lo, hi = svgchart.robust_limits([svgchart.Series("ms", "#000", list(range(1, 11)), times)], log=False)
    assert lo <= 18 and hi >= 3000
    assert 'class="spike"' not in svgchart.chart("ms", [svgchart.Series("ms", "#000", list(range(1, 11)), times)], (1, 10))
    rng = random.Random(3)
    flat = [1.0 + 0.01 * rng.random() for _ in range(1000)]
    flat[500] = 50.0                                                     # one spike: clipped
    lo, hi = svgchart.robust_limits([svgchart.Series("x", "#000", list(range(1000)), flat)], log=False)
    assert hi < 2
    scatter = [1.0 + (30 * rng.random() if s % 3 == 0 else 0.01 * rng.random()) for s in range(1000)]
    lo, hi = svgchart.robust_limits([svgchart.Series("x", "#000", list(range(1000)), scatter)], log=False)
    clipped = sum(v > hi for v in scatter)
    assert clipped <= 10, clipped                                        # at most 1% of the points


def test_spike_labels_do_not_overlap():
    """Two clipped spikes 25 steps apart on a 300-step chart (the default run's step times on a
    busy machine): their labels, each about 130 px wide, stand one under the other."""
    times = [200.0 + (s % 7) for s in range(1, 301)]
    times[27], times[52] = 1717.0, 2147.0
    page = svgchart.chart("ms", [svgchart.Series("ms", "#000", list(range(1, 301)), times)], (1, 300), unit=" ms")
    labels = re.findall(r'<text class="spike" x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)</text>', page)
    assert sorted(t for _, _, t in labels) == ["1717 ms at step 28", "2147 ms at step 53"], labels
    (x1, y1, _), (x2, y2, _) = labels
    assert y1 != y2 or abs(float(x1) - float(x2)) > 7 * 18, labels


def test_axes_have_nice_ticks():
    assert svgchart.nice_ticks(0.00131, 0.00209) == [0.0014, 0.0016, 0.0018, 0.002]
    assert svgchart.nice_ticks(1, 81000, 6) == [k * 10000.0 for k in range(1, 9)]
    assert svgchart.log_ticks(1.7, 99) == [2, 5, 10, 20, 50]
    assert [svgchart.tick_label(t) for t in (0.0016, 2.5, 20000.0, 3e-5, 0)] == ["0.0016", "2.5", "20,000", "3e-5", "0"]
    page = svgchart.chart("x", [svgchart.Series("a", "#000", [1, 2, 3], [0.001575, 0.0016, 0.00165])], (1, 3))
    labels = re.findall(r'text-anchor="end">([0-9.,e-]+)</text>', page)
    assert len(labels) >= 3 and "0.001575" not in labels                                  # not min/mid/max


def test_a_short_run_has_wide_cells_and_a_redundancy_of_one_reads_right(big, tmp_path):
    """10 steps: cells 40 pixels wide, numbered; --redundancy 1: no "1..0 roster keys" class."""
    levels = ["full"] * 3 + ["none"] * 7
    strip = svgchart.strip(levels, report.COLOURS, [5])
    assert re.findall(r'data-steps="(\d+-\d+)" x="\d+" y="\d+" width="(\d+)"', strip) == [("1-3", "119"), ("4-10", "279")]
    assert ">10</text>" in strip
    run, rdir, _ = big
    out = tmp_path / "r.html"
    assert report.main(["--run_dir", str(run), "--receipts", str(rdir), "--roster", str(rdir.parent / "roster"),
                        "--redundancy", "1", "--out", str(out)]) == 0
    page = out.read_text()
    assert "1..0" not in page and "&gt;= 1 roster key (" in page


@pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")),
                    reason="no headless Chromium installed (apt-get install chromium) to render the page")
def test_renders_in_headless_chromium(big_report, reference, evaluated, tmp_path):
    """The big run's page renders; on a real run's page and on a compare page the first chart
    starts within the first screen (1150 x 900), below one trust banner, the hashes and the config
    folded below the curves (Chromium lays the pages out; a probe script, added to a copy of each
    page, reads the first chart's position into the title)."""
    out, _ = big_report
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    png = tmp_path / "report.png"
    run_process([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={png}",
                 "--window-size=1150,2400", out.as_uri()], capture_output=True, timeout=300)
    assert png.exists() and png.stat().st_size > 10_000
    probe = ("<script>document.title = 'top=' + Math.round(document.querySelector('svg.chart')"
             ".getBoundingClientRect().top)</script></body>")
    for name, args in (("single", []), ("compare", ["--compare", str(evaluated)])):
        page = tmp_path / f"{name}.html"
        assert report.main(["--run_dir", str(reference), *args, "--out", str(page)]) == 0
        probed = tmp_path / f"{name}_probed.html"
        probed.write_text(page.read_text().replace("</body>", probe))
        dom = run_process([browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1150,900",
                           "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=300).stdout
        top = int(re.search(r"<title>top=(\d+)</title>", dom).group(1))
        assert top < 900, (name, top)
