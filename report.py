"""A run's story as one self-contained HTML file; or two runs side by side.

    python report.py --out report.html                # the run runs/default
    python report.py --run_dir runs/x --receipts receipts/ --roster roster --anchors anchors.jsonl --out report.html
    python report.py --run_dir out/public --receipts receipts/ --roster roster --salts s.json --redundancy 2 --out report.html
    python report.py --run_dir runs/a --compare runs/b --out compare.html   # where two runs part
    python report.py --log_y --out report.html                             # loss and norm on log axes
    python report.py --run_dir https://host/runs/x --out report.html       # a published run (publish.py)

The report reads a run only after verifying its chain (as sample.py does): a broken chain is
"MISMATCH at step S: ..." and exit 1, and no report is written. A verified chain is consistent,
not true: verifying its links replays no step, so the page says first what was checked (the
links), which steps accepted receipts say were replayed, and what pins the chain from outside
the run (anchors), once, at the top; every other figure in it is the publisher's word until
audited. Then, curves first:
- loss, gradient norm and learning rate per step (the chain's values) with the checkpoints as
  ticks; the validation loss (train.log: not in the chain, it says so) against the unigram
  baseline (the loss of predicting every token by its frequency in the validation split; from
  train.log's first line, else computed from the run's corpus, else the page says why not), as
  points, a dashed line and a table;
- throughput from train.log: ms per step and tokens/s per step, their medians and the total;
- the checkpoint files (listed, not verified: `audit.py` verifies them);
- with --receipts: a strip of every step coloured by the distinct keys of --roster (an
  allowed_signers file) whose receipts were accepted for it (none, 1 .. C-1, >= C = --redundancy)
  and red where a receipt or an anchor reports a MISMATCH at that step; the rejected receipts,
  and apart, never counted, the unsigned ones and those signed by keys not in the roster; the
  audit costs the receipts report, per signer. A run with unit commitments is covered unit by
  unit (receipts.covered): a step is as covered as its least covered provable unit, and the
  page gives the fraction of the units covered and the steps whose units are covered only in
  part (an update whose post-step state is public is provable by no receipt: left out);
- the anchors (--anchors FILE, default the run's own anchors.jsonl) and whether the chain agrees;
- folded last: the hashes (genesis and head record hashes, state hashes, code digest, data
  manifest, tokenizer, publisher key) and the decisive config, all from the chain.
With --compare B: first the step where the two chains part, with the first tensor whose hash
differs there. Runs whose genesis records differ (a config key, the code, the corpus, the
initial state's source) part by design, and the page says that this is expected; runs that
agree on all of it and part anyway did not reproduce, and the page gives the commands that name
the first operator that differs (`audit.py --step S --trace` on each run, then `optrace.py`).
Then both runs' curves overlaid, and, folded, the differences of their genesis records.
Receipts are checked as `audit.py --check_receipts` checks them: with the run's secret, or with
revealed salts (--salts). Charts (svgchart.py) have 1-2-5 ticks and robust y limits (a true
spike, a few points at most, is clipped at the edge and labelled with its value, never allowed
to flatten the curve; a short run is drawn whole). The output
is one file, inline SVG and CSS, no script, no network; it must lie outside the run directories
(readers never write in them). Bad input: one line `report.py: error: ...`, exit 2.
A run may be the http(s):// or hf:// address of its published copy (published.py): the report
then fetches the whole chain (it draws every step) and train.log, checked as a local chain is.

The drawing lives in svgchart.py.
"""
import html
import json
import os
import re
import sys

import byterange
from config import CommandLine, UsageError, differences, duration, out_of_memory, python_command


def parser():
    ap = CommandLine("report.py", "A run's story as one self-contained HTML file; or two runs side by side.")
    ap.add_argument("--run_dir", metavar="DIR", default="runs/default", help="the run (only read): a directory, or "
                    "the http(s):// or hf:// address of its published copy (default %(default)s)")
    ap.add_argument("--out", required=True, metavar="FILE", help="the HTML file to write, outside the runs (required)")
    ap.add_argument("--compare", metavar="DIR", help="a second run to set beside it: curves overlaid, the genesis "
                    "differences, the first step whose state differs (default: none)")
    ap.add_argument("--receipts", metavar="DIR", help="receipts (*.json) to draw the audit coverage from")
    ap.add_argument("--roster", metavar="ROSTER", help="with --receipts: the auditors' keys (an allowed_signers file, "
                    "NAME TYPE BASE64 per line); only their accepted receipts are counted (default: none counted)")
    ap.add_argument("--salts", metavar="FILE", help="with --receipts: check them with revealed salts, not the run's secret")
    ap.add_argument("--revealed", metavar="DIR", help="with --receipts: the children the publisher revealed for "
                    "fold-node audits, with which their receipts are checked")
    ap.add_argument("--anchors", metavar="FILE", help="anchors obtained outside the run (default: the run's anchors.jsonl)")
    ap.add_argument("--redundancy", type=int, default=2, metavar="C",
                    help="distinct roster keys per step for full coverage (default %(default)s)")
    ap.add_argument("--log_y", action="store_true", help="loss and gradient norm on log axes (default: linear)")
    ap.add_argument("--cache", metavar="DIR", help="with a run's URL: where fetched and checked bytes are kept "
                    "(default $XDG_CACHE_HOME/repops, else ~/.cache/repops)")
    ap.add_argument("--timeout", type=float, default=byterange.TIMEOUT, metavar="S",
                    help="with a run's URL: seconds a connection or a read may wait (default %(default)s)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import hashchain  # noqa: E402  (below the command line's first answer, above)
import published  # noqa: E402
import receipts  # noqa: E402
import repops  # noqa: E402
import rundir  # noqa: E402
import signing  # noqa: E402
import svgchart  # noqa: E402
import unitaudit  # noqa: E402
from svgchart import Series  # noqa: E402

MISMATCH_AT = re.compile(r"MISMATCH at step (\d+)")
# train.log's lines (train.py): a step (optionally "step i/N"), a validation loss, the first line
VAL_LINE = re.compile(r"step\s+(\d+)(?:/\d+)? \| val loss ([0-9.eE+-]+|nan|inf)")
STEP_LINE = re.compile(r"step\s+(\d+)(?:/\d+)? \| loss [^|]*\|[^|]*\|[^|]*\|\s*([0-9.]+) ms \|\s*([0-9.]+) tok/s")
BASELINE_LINE = re.compile(r"unigram baseline ([0-9.]+) nats")
COLOURS = {"none": "#d8dee4", "some": "#8fd19e", "full": "#1a7f37", "mismatch": "#cf222e"}
RUN_COLOURS = ("#0969da", "#bf3989")      # run A, run B
VAL_COLOURS = ("#bf8700", "#8250df")
BASELINE_COLOUR = "#57606a"
MAX_LOG = 1 << 30              # train.log: ~120 bytes per step


# ----------------------------------------------------------------------------- reading
class Log:
    """What train.log says (the last value per step: a resume repeats steps). Empty without one."""

    def __init__(self, run_dir):
        self.val, self.ms, self.tokens_per_s, self.baseline = {}, {}, {}, None
        try:
            text = byterange.directory(run_dir).read_file("train.log", "train.log", MAX_LOG,
                                                          hashchain.HashChainError).decode("utf-8", "replace")
        except hashchain.HashChainError:
            self.found = False
            return
        self.found = True
        self.val = {int(m.group(1)): float(m.group(2)) for m in VAL_LINE.finditer(text)}
        for m in STEP_LINE.finditer(text):
            self.ms[int(m.group(1))], self.tokens_per_s[int(m.group(1))] = float(m.group(2)), float(m.group(3))
        baselines = BASELINE_LINE.findall(text)
        self.baseline = float(baselines[-1]) if baselines else None


def unigram_baseline(run, log):
    """(nats, where it came from) of the run's unigram baseline, or (None, why there is none)."""
    if log.baseline is not None:
        return log.baseline, "train.log"
    data_dir = run.recorded_data_dir()
    try:
        from data import DataError, TokenData   # imports torch: only when train.log lacks it
        tokens = TokenData(data_dir, run.cfg.seed)
        if tokens.digest != run.genesis.get("data_manifest"):
            return None, f"train.log does not give it, and {data_dir} is not the run's corpus (its manifest differs)"
        return tokens.unigram_entropy("val"), f"computed from {data_dir} (the run's corpus)"
    except (UsageError, DataError, OSError, ValueError, KeyError) as e:
        return None, f"train.log does not give it, and the run's corpus ({data_dir}) cannot be read here: {e}"


def coverage_levels(results, n_steps, redundancy, extra_mismatches=(), covered=None):
    """[level] for steps 1..n_steps (index 0 is step 1): "mismatch" where a well-formed receipt
    reports a MISMATCH at that step (or an anchor does: extra_mismatches), else "full" with
    >= redundancy distinct roster keys with counted receipts, "some" with fewer, "none" with none.
    With `covered` (receipts.covered: a run with unit commitments) a step counts the keys of its
    least covered provable unit, and is "some" as soon as one of its units has one."""
    if covered is not None:
        least = {s: min(len(a) for a in u.values()) for s, u in covered.items()}
        touched = {s for s, u in covered.items() if any(u.values())}
    else:
        least = receipts.coverage(results, 1, n_steps) if n_steps else {}
        touched = {s for s, n in least.items() if n}
    bad = set(extra_mismatches)
    for r in results:
        if r.receipt and r.receipt["verdict"] != "MATCH":
            bad.update(int(m.group(1)) for f in r.receipt["findings"] for m in [MISMATCH_AT.match(f)] if m)
    return ["mismatch" if s in bad else "full" if least[s] >= redundancy else "some" if s in touched else "none"
            for s in range(1, n_steps + 1)]


def unit_coverage(covered, redundancy):
    """HTML of a run with unit commitments: the fraction of its units covered, and the steps
    whose units are covered only in part (the first 50)."""
    all_units = [a for u in covered.values() for a in u.values()]
    some, full = sum(1 for a in all_units if a), sum(len(a) >= redundancy for a in all_units)
    out = [f"<p>Units (each micro-batch, fold node and update; a step is as covered as its least covered "
           f"unit): {some} of {len(all_units)} with an accepted receipt ({100 * some / len(all_units):.1f}%), "
           f"{full} with &gt;= {redundancy} ({100 * full / len(all_units):.1f}%).</p>"]
    part = [(s, sum(len(a) >= redundancy for a in u.values()), len(u),
             receipts.describe([(s, k) for k, a in u.items() if len(a) < redundancy]).partition(": ")[2])
            for s, u in covered.items() if any(u.values()) and min(map(len, u.values())) < redundancy]
    if part:
        out.append(table(("step covered in part", f"units with >= {redundancy}", "of", "units short"), part[:50]))
    return out


def audit_costs(results):
    """{signer: {receipts, steps_replayed, seconds, peak_mib, bytes_read}} summed over the
    well-formed receipts (peak_mib: the largest; a signer is its roster name, else its key's
    fingerprint); numbers a receipt lacks count as 0."""
    out = {}
    for r in results:
        if not r.receipt:
            continue
        cost, row = r.receipt["cost"], out.setdefault(r.who(), dict.fromkeys(
            ("receipts", "steps_replayed", "seconds", "peak_mib", "bytes_read"), 0))
        number = {k: v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0
                  for k, v in ((k, cost.get(k)) for k in row)}
        row["receipts"] += 1
        for key in ("steps_replayed", "seconds", "bytes_read"):
            row[key] += number[key]
        row["peak_mib"] = max(row["peak_mib"], number["peak_mib"])
    return out


def curve(records, key):
    """(steps, values) of a number the step records hold."""
    pairs = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))
             and not isinstance(r.get(key), bool)]
    return [s for s, _ in pairs], [float(v) for _, v in pairs]


def first_difference(a, b):
    """Where two runs' verified chains part: None if every step both hold has the same state
    hash, else (step, [record fields that differ], first tensor whose hash differs, or None
    where the two runs do not both have a checkpoint of that step, whose header gives its
    leaves: a record holds the state's root only). Step 0: their genesis states differ. prev,
    record_hash, run and step_commit are left out (a record's links, its run and its
    secret-keyed commitment differ between any two runs)."""
    skip = {"prev", "record_hash", "run", "step_commit", "secret_commit"}
    for step in range(min(len(a.chain.records), len(b.chain.records))):
        ra, rb = a.chain.records[step], b.chain.records[step]
        if ra.get("state_hash") == rb.get("state_hash"):
            continue
        fields = sorted(k for k in (set(ra) | set(rb)) - skip if ra.get(k) != rb.get(k))
        ta, tb = a.published_leaves(step), b.published_leaves(step)
        tensor = None if ta is None or tb is None else \
            next((n for n in sorted(set(ta) | set(tb)) if ta.get(n) != tb.get(n)), None)
        return step, fields, tensor
    return None


# ----------------------------------------------------------------------------- drawing helpers
def table(header, rows):
    cells = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{cells}</tr>{body}</table>"


def fmt(v, digits=4):
    return "-" if v is None else f"{v:.{digits}f}"


def median(values):
    v = sorted(values)
    return None if not v else v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:24px;max-width:1100px;color:#1f2328}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #d0d7de}h3{font-size:15px;margin-bottom:2px}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #d0d7de;padding:2px 8px;text-align:left}
code,td{font-family:ui-monospace,monospace;font-size:12px}svg text{font:11px sans-serif;fill:#57606a}
line.grid{stroke:#eaeef2;stroke-width:1}line.ckpt{stroke:#8250df;stroke-width:1}text.spike{font-weight:bold}
.note{color:#57606a}.bad{color:#cf222e;font-weight:bold}
.word{border-left:4px solid #bf8700;background:#fff8c5;padding:8px 12px;margin:12px 0}
pre{background:#f6f8fa;padding:8px;font-size:12px}"""


# ----------------------------------------------------------------------------- the page
class Side:
    """One run as the page shows it: its verified chain, records, train.log and baseline."""

    def __init__(self, run, label):
        self.run, self.label = run, label
        self.records = run.chain.records[1:]
        self.n = len(self.records)
        self.log = Log(run.dir)
        self.baseline, self.baseline_source = unigram_baseline(run, self.log)


def trust(sides, levels, redundancy, anchors, anchors_file, contradiction):
    """The one paragraph that says what was checked and what backs the figures: each chain's links
    (checked, no step replayed), the steps that accepted receipts say were replayed (levels:
    coverage_levels, None without receipts), the anchors (and the file they came from, None for
    the run's own anchors.jsonl) and the first anchor contradiction; receipts and anchors are the
    first run's (sides[0])."""
    chains = " and ".join(f"the {s.n + 1} records of the chain{f' of {html.escape(s.label)}' if len(sides) > 1 else ''}"
                          for s in sides)
    n = sides[0].n
    parts = [f"Checked before anything here was read: the links of {chains} "
             "(each record's hash, and the previous record's hash it names). <b>Checking the links replays no "
             "step</b>: the losses, norms and hashes below are <b>the publisher's word until audited</b> "
             "(<code>audit.py --step S</code> replays a step)."
             + (f" Receipts and anchors are {html.escape(sides[0].label)}'s." if len(sides) > 1 else "")]
    if levels is None:
        parts.append(f"Replayed, by accepted receipts: no step (no --receipts DIR given; 0 of {n} steps "
                     "covered by accepted receipts).")
    else:
        covered, full = sum(lv in ("some", "full") for lv in levels), levels.count("full")
        steps = {lv: receipts.ranges([s for s, x in enumerate(levels, 1) if x in lvs])
                 for lv, lvs in (("replayed", ("some", "full")), ("none", ("none",)), ("mismatch", ("mismatch",)))}
        replayed = f"steps {steps['replayed']}" if covered else "no step"
        parts.append(f"Replayed, by accepted receipts: {replayed} ({covered} of {n} steps covered "
                     f"by accepted receipts, {full} by at least {redundancy} distinct roster key{'s' if redundancy > 1 else ''})"
                     + (f"; steps {steps['none']} have none" if "none" in levels else "")
                     + (f"; <span class='bad'>a MISMATCH is reported at steps {steps['mismatch']}</span>"
                        if "mismatch" in levels else "") + ".")
    if contradiction:
        parts.append(f"<span class='bad'>An anchor contradicts the chain at step {contradiction[0]}.</span>")
    elif not anchors:
        parts.append("No anchors: nothing published outside the run pins this chain's history.")
    elif anchors_file:
        parts.append(f"The chain agrees with the {len(anchors)} anchors of <code>{html.escape(anchors_file)}</code>, "
                     "which pin its history if they were obtained from outside the run.")
    else:
        parts.append(f"The only anchors are the run's own anchors.jsonl ({len(anchors)}): a publisher who rewrote "
                     "the chain would have rewritten them too; anchors pin a chain when obtained from outside "
                     "the run (--anchors FILE).")
    return "<div class='word'>" + " ".join(parts) + "</div>"


def header_facts(side):
    g, records = side.run.genesis, side.records
    return [("run directory", str(side.run.dir)), ("steps in the chain", f"1..{side.n}" if side.n else "none"),
            ("genesis record hash", g["record_hash"]), ("head record hash", side.run.chain.head),
            ("genesis state hash", g.get("state_hash")),
            ("final state hash", records[-1].get("state_hash") if records else "-"),
            ("code digest", g.get("code_digest")), ("data manifest", g.get("data_manifest")),
            ("tokenizer", f"{(g.get('tokenizer') or {}).get('name')} (vocab {g.get('vocab_size')})"),
            ("publisher key (signs the anchors)", signing.fingerprint(g["publisher"]) if signing.is_public_key(
                g.get("publisher")) else "none: the anchors are unsigned")]


def curves_section(sides, args):
    """Loss (with validation and baseline), gradient norm, learning rate; one colour per run."""
    a = sides[0]
    n = max(s.n for s in sides)
    ckpts = [s for s, _ in a.run.checkpoints()]
    two = len(sides) > 1

    def name(side, what):
        return f"{what} ({side.label})" if two else what

    loss, hlines = [], []
    for i, side in enumerate(sides):
        loss.append(Series(name(side, "train loss (chain)"), RUN_COLOURS[i], *curve(side.records, "loss")))
        if side.log.val:
            val = sorted(side.log.val.items())
            loss.append(Series(name(side, "validation loss (train.log, not in the chain)"), VAL_COLOURS[i],
                               [s for s, _ in val], [v for _, v in val], dots=True))
    baselines = {side.baseline for side in sides if side.baseline is not None}
    for i, b in enumerate(sorted(baselines)):
        hlines.append((f"unigram baseline {b:.3f}" + (f" ({sides[i].label})" if len(baselines) > 1 else ""),
                       BASELINE_COLOUR, b))
    out = ["<h2>Training curves</h2>",
           svgchart.chart("Loss" + (" (log scale)" if args.log_y else ""), loss, (1, n), ckpts, args.log_y, hlines),
           svgchart.chart("Gradient norm (before clipping)" + (" (log scale)" if args.log_y else ""),
                          [Series(name(s, "grad norm"), RUN_COLOURS[i], *curve(s.records, "grad_norm"))
                           for i, s in enumerate(sides)], (1, n), log=args.log_y),
           svgchart.chart("Learning rate", [Series(name(s, "lr"), RUN_COLOURS[i], *curve(s.records, "lr"))
                                            for i, s in enumerate(sides)], (1, n))]
    if n > 2 * svgchart.CURVE_POINTS:
        out.append(f"<p class='note'>{n} steps: each curve is drawn in {svgchart.CURVE_POINTS} buckets of "
                   "steps, the band a bucket's range (min to max), the line its median. Checkpoints are the "
                   "ticks under the loss axis.</p>")
    return out


def validation_section(sides):
    out = ["<h2>Validation loss against the unigram baseline</h2>"]
    for side in sides:
        if side.baseline is None:
            out.append(f"<p class='note'>{html.escape(side.label)}: no unigram baseline: "
                       f"{html.escape(side.baseline_source)}.</p>")
        else:
            out.append(f"<p>{html.escape(side.label)}: unigram baseline {side.baseline:.4f} nats "
                       f"({html.escape(side.baseline_source)}): the loss of predicting every token by its "
                       "frequency in the validation split; a model below it has learnt more than the "
                       "token frequencies.</p>")
    steps = sorted(set().union(*(s.log.val for s in sides)))
    if not steps:
        out.append("<p class='note'>No validation loss in train.log (--eval_every, or no train.log: "
                   "train.log is written by the trainer and is not in the chain).</p>")
        return out
    if len(sides) == 1:
        side = sides[0]
        rows = [(s, fmt(side.log.val[s]), fmt(side.baseline),
                 "-" if side.baseline is None else f"{side.log.val[s] - side.baseline:+.4f}") for s in steps]
        out.append(table(("step", "validation loss", "unigram baseline", "difference"), rows))
    else:
        rows = [(s, *(fmt(side.log.val.get(s)) for side in sides),
                 "-" if None in (sides[0].log.val.get(s), sides[1].log.val.get(s))
                 else f"{sides[1].log.val[s] - sides[0].log.val[s]:+.4f}") for s in steps]
        out.append(table(("step", *(f"validation loss ({s.label})" for s in sides), "B - A"), rows))
    out.append("<p class='note'>From train.log, which the trainer writes and the chain does not hold.</p>")
    return out


def throughput_section(sides):
    out = ["<h2>Throughput (train.log)</h2>"]
    timed = [s for s in sides if s.log.ms]
    if not timed:
        return out + ["<p class='note'>No step timings: the run has no train.log.</p>"]
    n = max(s.n for s in sides)
    two = len(sides) > 1
    out.append(svgchart.chart("Milliseconds per step", [
        Series(f"ms/step ({s.label})" if two else "ms/step", RUN_COLOURS[i], *zip(*sorted(s.log.ms.items())))
        for i, s in enumerate(sides) if s.log.ms], (1, n), unit=" ms"))
    rows = [(s.label, len(s.log.ms), fmt(median(s.log.ms.values()), 0), fmt(median(s.log.tokens_per_s.values()), 0),
             duration(sum(s.log.ms.values()) / 1000)) for s in timed]
    out.append(table(("run", "steps timed", "median ms/step", "median tokens/s", "total"), rows))
    out.append("<p class='note'>As the trainer measured them (wall clock, between published steps; the "
               "first step after a start or resume includes its start-up).</p>")
    return out


def genesis_differences(sides):
    """(decisive config keys, other genesis fields) on which two runs' genesis records differ:
    what makes their chains part by design."""
    ga, gb = (s.run.genesis for s in sides)
    keys = differences(ga.get("config") or {}, gb.get("config") or {})
    other = sorted(k for k in set(ga) | set(gb) if k not in ("config", "record_hash", "prev", "state_hash",
                                                             "secret_commit") and ga.get(k) != gb.get(k))
    return keys, other


def compare_facts(sides):
    """The two runs' facts and the genesis differences, for the folded section below the curves."""
    a, b = sides
    ga, gb = a.run.genesis, b.run.genesis
    keys, other = genesis_differences(sides)
    out = [table(("fact", a.label, b.label), [(k, va, vb) for (k, va), (_, vb) in zip(header_facts(a), header_facts(b))]),
           "<h3>Decisive config: the keys that differ</h3>",
           table(("key", a.label, b.label), [(k, (ga.get("config") or {}).get(k, "(default)"),
                                             (gb.get("config") or {}).get(k, "(default)")) for k in keys])
           if keys else "<p>The same decisive config.</p>"]
    if other:
        out.append("<h3>Other genesis fields that differ</h3>")
        out.append(table(("field", a.label, b.label), [(k, json.dumps(ga.get(k)), json.dumps(gb.get(k))) for k in other]))
    return out


def parting_section(sides):
    """Where two chains part, and whether that is expected: runs whose genesis records differ
    (a config key, the code, the corpus, the initial state) part by design, and the page says so;
    runs that agree on all of it and still part did not reproduce, and the page gives the
    commands that name the first operator whose bits differ."""
    a, b = sides
    out = ["<h2>Where the chains part</h2>"]
    keys, other = genesis_differences(sides)
    diff = first_difference(a.run, b.run)
    common = min(a.n, b.n)
    if diff is None:
        out.append(f"<p>Every step both chains hold (0..{common}) has the same state hash: the runs are the "
                   "same state at every common step" + (f"; {html.escape(a.label if a.n > b.n else b.label)} "
                                                        f"goes on to step {max(a.n, b.n)}" if a.n != b.n else "")
                   + ".</p>")
        return out
    step, fields, tensor = diff
    where = (f"tensor <code>{html.escape(tensor)}</code>" if tensor else
             f"not named here: the records hold state roots only, and the runs do not both have a checkpoint of step "
             f"{step}, whose header lists every tensor's hash")
    parted = (f"the records of step {step} differ in {', '.join(html.escape(f) for f in fields)}; the first tensor "
              f"whose hash differs is {where}")
    if keys or other:
        named = ([f"config key{'s' * (len(keys) > 1)} {', '.join(keys)}"] if keys else []) + other
        out.append(f"<p>The runs' genesis records differ in {html.escape(' and '.join(named))} (the table below), "
                   f"so their chains are expected to part: they part at step {step} ({parted}).</p>")
        return out
    out.append(f"<p class='bad'>First difference: step {step}.</p><p>The genesis records agree on the config, the "
               f"code, the corpus and where the initial state came from, yet {parted}.</p>")
    if step == 0:
        out.append("<p>The same config, code and corpus gave two initial states: the initialisation did not "
                   f"reproduce on one of the machines. <code>{python_command()} audit.py --step 1</code> on each run "
                   "recomputes its genesis state and names the first tensor that differs.</p>")
        return out
    python = python_command()
    cmds = (f"{python} audit.py --run_dir {a.run.dir} --step {step} --trace out/a_{step}.jsonl\n"
            f"{python} audit.py --run_dir {b.run.dir} --step {step} --trace out/b_{step}.jsonl\n"
            f"{python} optrace.py out/a_{step}.jsonl out/b_{step}.jsonl")
    out.append(f"<p>Both runs hold the same state after step {step - 1}, so step {step} computed differently. "
               f"Each run replays step {step} with a trace of every operator; optrace.py then names the first "
               "operator whose output bits differ (and the last that matched): the kernel that broke the "
               "contract on one of the machines.</p>"
               f"<pre>{html.escape(cmds)}</pre>")
    return out


def audit_section(args, results, levels, anchors, covered):
    out = ["<h2>Audit coverage</h2>"]
    if results is None:
        return out + ["<p class='note'>No receipts given (--receipts DIR).</p>"]
    counts = {s: sum(r.status == s for r in results) for s in ("accepted", "rejected", "unsigned", "malformed",
                                                                   "unchecked")}
    counted = sum(r.counted for r in results)
    tally = {k: levels.count(k) for k in COLOURS}
    c = args.redundancy
    key = [f"<span style='color:{COLOURS['none']}'>&#9632;</span> no accepted receipt ({tally['none']})"]
    if c > 1:
        some = "1 roster key" if c == 2 else f"1..{c - 1} roster keys"
        key.append(f"<span style='color:{COLOURS['some']}'>&#9632;</span> {some} ({tally['some']})")
    key += [f"<span style='color:{COLOURS['full']}'>&#9632;</span> &gt;= {c} roster key{'s' if c > 1 else ''} "
            f"({tally['full']})",
            f"<span style='color:{COLOURS['mismatch']}'>&#9632;</span> MISMATCH ({tally['mismatch']})",
            "&#9474; black tick: anchored step"]
    roster = (f"{counted} counted (accepted and signed by a key of the roster <code>{html.escape(args.roster)}</code>)"
              if args.roster else "none counted: no --roster names the auditors' keys")
    out += [f"<p>Receipts under <code>{html.escape(args.receipts)}</code>: "
            + ", ".join(f"{v} {k}" for k, v in counts.items()) + f"; {roster}. Every step is drawn, one cell each.</p>"
            f"<p>{' '.join(key)}</p>", svgchart.strip(levels, COLOURS, [a["step"] for a in anchors])]
    if covered is not None:
        out += unit_coverage(covered, args.redundancy)
    bad = [r for r in results if r.status in ("rejected", "malformed")]
    if bad:
        out.append(table(("receipt", "status", "reason"), [(r.path, r.status, r.reason) for r in bad[:50]]))
    apart = [(r.path, "unsigned", r.reason) if r.status == "unsigned" else
             (r.path, "accepted, not counted", f"signed by {signing.fingerprint(r.receipt['signer'])}, a key not in the roster")
             for r in results if r.status == "unsigned" or (r.status == "accepted" and not r.counted)]
    if apart:
        out.append("<h3>Not counted: unsigned, or signed by keys not in the roster</h3>")
        out.append(table(("receipt", "status", "why"), apart[:50]))
    costs = audit_costs(results)
    out.append("<h3>Audit costs (as the receipts report them)</h3>")
    rows = [(a, c_["receipts"], c_["steps_replayed"], f"{c_['seconds']:.1f}", c_["peak_mib"],
             f"{c_['bytes_read'] / 1e6:.1f}") for a, c_ in sorted(costs.items())]
    total = [sum(c_[k] for c_ in costs.values()) for k in ("receipts", "steps_replayed", "seconds", "bytes_read")]
    rows.append(("all", total[0], total[1], f"{total[2]:.1f}",
                 max((c_["peak_mib"] for c_ in costs.values()), default=0), f"{total[3] / 1e6:.1f}"))
    out.append(table(("auditor", "receipts", "steps replayed", "seconds", "peak MiB", "MB read"), rows))
    return out


def render(sides, args, results, anchors, contradiction):
    a = sides[0]
    # a run with unit commitments is covered unit by unit (receipts.covered)
    covered = (receipts.covered(results, a.run.chain, 1, a.n, unitaudit.public_states(a.run, args.revealed))
               if results is not None and a.run.cfg.unit_commits and a.n else None)
    levels = None if results is None else coverage_levels(results, a.n, args.redundancy,
                                                           [contradiction[0]] if contradiction else [], covered)
    title = f"Run report: {a.run.dir}" + (f" compared with {sides[1].run.dir}" if len(sides) > 1 else "")
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
           trust(sides, levels, args.redundancy, anchors, args.anchors, contradiction)]
    if len(sides) > 1:         # receipts and anchors are checked for run A; B's chain is only verified
        out += parting_section(sides)
    out += curves_section(sides, args) + validation_section(sides) + throughput_section(sides)

    out.append("<h2>Checkpoints</h2>")
    ckpts = [s for s, _ in a.run.checkpoints()]
    in_chain = [s for s in ckpts if s <= a.n]
    out.append(f"<p>{len(ckpts)} checkpoint files (steps {receipts.ranges(ckpts)}); "
               f"{len(ckpts) - len(in_chain)} beyond the chain. Listed, not verified here: "
               "<code>audit.py</code> verifies them against the chain. Ticks under the loss axis.</p>")
    out += audit_section(args, results, levels, anchors, covered)

    out.append("<h2>Anchors</h2>")
    if not anchors:
        out.append("<p class='note'>No anchors (--anchors FILE; the run has no anchors.jsonl).</p>")
    else:
        verdict = (f"<p class='bad'>MISMATCH at step {contradiction[0]}: {html.escape(contradiction[1])}</p>"
                   if contradiction else f"<p>ANCHORED: the chain agrees with all {len(anchors)} anchors of "
                   f"<code>{html.escape(args.anchors_used)}</code>.</p>")
        out += [verdict, table(("step", "record hash", "anchored at (UTC)"),
                               [(x["step"], x["record_hash"], x["utc"]) for x in sorted(anchors, key=lambda x: x["step"])])]
    # the hashes and the config, folded: what a reader looks up, below what they look at
    facts = (compare_facts(sides) if len(sides) > 1 else
             [table(("fact", "value"), header_facts(a)), "<h3>Decisive config (genesis record)</h3>",
              table(("key", "value"), sorted((a.run.genesis.get("config") or {}).items()))])
    out += ["<h2>Hashes and config</h2><details><summary>The genesis and head record hashes, the state hashes, the "
            "code digest, the data manifest" + (" and the genesis differences of the two runs" if len(sides) > 1 else
                                                " and the decisive config") + " (click to open)</summary>",
            *facts, "</details>", "</body></html>\n"]
    return "".join(out)


# ----------------------------------------------------------------------------- command line
def main(argv=None):
    try:
        args = parser().parse_args(argv)
        for d in [args.run_dir] + ([args.compare] if args.compare else []):
            rundir.prepare_output(d, args.out, "--out")
        if args.redundancy < 1:
            raise UsageError(f"--redundancy {args.redundancy}: each step needs at least 1 auditor")
        if not args.timeout > 0:
            raise UsageError(f"--timeout {args.timeout}: seconds, more than 0")
        byterange.configure(args.cache, args.timeout)
        for option in ("salts", "revealed", "roster"):
            if getattr(args, option) and not args.receipts:
                raise UsageError(f"--{option} goes with --receipts")
        sides = []
        for d, label in ((args.run_dir, "A"), (args.compare, "B")):
            if d is None:
                continue
            run = published.open_run(d)
            try:
                run.chain.verify()
            except hashchain.ChainError as e:
                print(f"MISMATCH at step {e.line - 1}: {e.message}" + (f" (in {d})" if args.compare else ""))
                return 1
            run.check_versions(repops.CONTRACT)     # a well-formed chain of another contract: not ours to report
            sides.append(Side(run, f"{label}: {d}" if args.compare else d))
        run = sides[0].run
        own = byterange.directory(run.dir)
        args.anchors_used = args.anchors or (own.show(receipts.ANCHORS) if own.exists(receipts.ANCHORS) else None)
        anchors = receipts.read_anchors(args.anchors) if args.anchors else published.published_anchors(own)
        contradiction = receipts.first_contradiction(run.chain, anchors) if anchors else None
        results = None
        if args.receipts:
            salt_of = receipts.salt_lookup(run.dir, run.genesis, args.salts)
            roster = signing.read_roster(args.roster) if args.roster else None
            results = receipts.check_receipts(args.receipts, run.chain, salt_of, *unitaudit.judging(run, args.revealed),
                                              roster)
        page = render(sides, args, results, anchors, contradiction)
        hashchain.write_atomically(args.out, page.encode("utf-8"))
    except (UsageError, hashchain.HashChainError) as e:
        print(f"report.py: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"report.py: error: cannot write {args.out}: {e.strerror}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as e:
        if not (line := out_of_memory(e, "report this run")):
            raise
        print(f"report.py: error: {line}", file=sys.stderr)
        return 2
    print(f"report: {len(run.chain) - 1} steps of {args.run_dir}" + (f" and {args.compare}" if args.compare else "")
          + f" written to {args.out}" + (f" (MISMATCH at step {contradiction[0]} against the anchors)" if contradiction else ""))
    return 1 if contradiction else 0


if __name__ == "__main__":
    sys.exit(main())
