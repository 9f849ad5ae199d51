"""A run's story as one self-contained HTML file: curves, checkpoints, audit coverage, anchors.

    python report.py --out report.html                # the run runs/default
    python report.py --run_dir runs/x --receipts receipts/ --anchors anchors.jsonl --out report.html
    python report.py --run_dir out/public --receipts receipts/ --salts s.json --redundancy 2 --out report.html

The report reads the run only after verifying its chain (as sample.py does): a broken chain is
"MISMATCH at step S: ..." and exit 1, and no report is written. It then shows
- the header facts: genesis and head record hashes, state hash, code digest, data manifest,
  tokenizer and the decisive config (all from the chain);
- loss, gradient norm and learning rate per step (the chain's values), and the validation loss
  from train.log where the run has one (train.log is not in the chain: it says so);
- the checkpoint files (listed, not verified: `audit.py` verifies them);
- with --receipts: a strip of every step coloured by the distinct auditors whose receipts were
  accepted for it (0, 1 ... C-1, >= C = --redundancy) and red where a receipt or an anchor
  reports a MISMATCH at that step; the audit costs the receipts report, per auditor. A run
  with unit commitments is covered unit by unit (receipts.covered): a step is as covered as
  its least covered unit, and the page gives the fraction of the units covered and the steps
  whose units are covered only in part;
- the anchors (--anchors FILE, default the run's own anchors.jsonl) and whether the chain agrees.
Receipts are checked as `audit.py --check_receipts` checks them: with the run's secret, or with
revealed salts (--salts). Curves are downsampled (the min and max of each bucket, so spikes
stay); the coverage strip never is: rows of STRIP_ROW steps, one pixel per step, drawn as runs
of equal colour, so 81,000 steps stay a few hundred KB. The output is one file, inline SVG and
CSS, no script, no network; it must lie outside the run directory (readers never write in it).
Bad input: one line `report.py: error: ...`, exit 2.
"""
import html
import os
import re
import sys

from config import CommandLine, UsageError


def parser():
    ap = CommandLine("report.py", "A run's story as one self-contained HTML file: curves, checkpoints, audit "
                     "coverage, anchors.")
    ap.add_argument("--run_dir", metavar="DIR", default="runs/default", help="the run (only read) (default %(default)s)")
    ap.add_argument("--out", required=True, metavar="FILE", help="the HTML file to write, outside the run (required)")
    ap.add_argument("--receipts", metavar="DIR", help="receipts (*.json) to draw the audit coverage from")
    ap.add_argument("--salts", metavar="FILE", help="with --receipts: check them with revealed salts, not the run's secret")
    ap.add_argument("--revealed", metavar="DIR", help="with --receipts: the children the publisher revealed for "
                    "fold-node audits, with which their receipts are checked")
    ap.add_argument("--anchors", metavar="FILE", help="anchors obtained outside the run (default: the run's anchors.jsonl)")
    ap.add_argument("--redundancy", type=int, default=2, metavar="C",
                    help="distinct auditors per step for full coverage (default %(default)s)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import hashchain  # noqa: E402  (below the command line's first answer, above)
import receipts  # noqa: E402
import rundir  # noqa: E402
import unitaudit  # noqa: E402


CURVE_POINTS = 1000      # buckets per curve (each gives its min and max)
STRIP_ROW = 1000         # steps per row of the coverage strip, one pixel each
CHART_W, CHART_H = 900, 180
MISMATCH_AT = re.compile(r"MISMATCH at step (\d+)")
VAL_LINE = re.compile(r"step\s+(\d+) \| val loss ([0-9.eE+-]+|nan|inf)")
COLOURS = {"none": "#d8dee4", "some": "#8fd19e", "full": "#1a7f37", "mismatch": "#cf222e"}


# ----------------------------------------------------------------------------- reading
def read_val_losses(run_dir):
    """{step: validation loss} from train.log (the last value per step: a resume repeats
    steps); {} without a train.log."""
    path = os.path.join(run_dir, "train.log")
    try:
        with hashchain.open_regular(path, "train.log") as f:
            text = f.read().decode("utf-8", "replace")
    except hashchain.HashChainError:
        return {}
    return {int(m.group(1)): float(m.group(2)) for m in VAL_LINE.finditer(text)}


def coverage_levels(results, n_steps, redundancy, extra_mismatches=(), covered=None):
    """[level] for steps 1..n_steps (index 0 is step 1): "mismatch" where a well-formed receipt
    reports a MISMATCH at that step (or an anchor does: extra_mismatches), else "full" with
    >= redundancy distinct accepted auditors, "some" with fewer, "none" with none. With
    `covered` (receipts.covered: a run with unit commitments) a step counts the auditors of
    its least covered unit, and is "some" as soon as one of its units has an auditor."""
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
    """{auditor: {receipts, steps_replayed, seconds, peak_mib, bytes_read}} summed over the
    well-formed receipts (peak_mib: the largest); numbers a receipt lacks count as 0."""
    out = {}
    for r in results:
        if not r.receipt:
            continue
        cost, row = r.receipt["cost"], out.setdefault(r.receipt["auditor"], dict.fromkeys(
            ("receipts", "steps_replayed", "seconds", "peak_mib", "bytes_read"), 0))
        number = {k: v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0
                  for k, v in ((k, cost.get(k)) for k in row)}
        row["receipts"] += 1
        for key in ("steps_replayed", "seconds", "bytes_read"):
            row[key] += number[key]
        row["peak_mib"] = max(row["peak_mib"], number["peak_mib"])
    return out


# ----------------------------------------------------------------------------- drawing
def downsample(steps, values, buckets=CURVE_POINTS):
    """(steps, values) with at most 2 * buckets points: each bucket's min and max, in step
    order. Fewer points than that are returned as they are."""
    if len(steps) <= 2 * buckets:
        return steps, values
    out_s, out_v, size = [], [], len(steps) / buckets
    for b in range(buckets):
        lo, hi = int(b * size), int((b + 1) * size)
        part = range(lo, hi)
        i, j = min(part, key=values.__getitem__), max(part, key=values.__getitem__)
        for k in sorted({i, j}):
            out_s.append(steps[k])
            out_v.append(values[k])
    return out_s, out_v


def chart(title, series, n_steps, marks=()):
    """An inline SVG line chart. series: [(label, colour, steps, values, dots)]; marks: steps
    drawn as ticks under the axis (checkpoints)."""
    values = [v for _, _, _, vs, _ in series for v in vs]
    if not values:
        return f"<p>{html.escape(title)}: no values.</p>"
    lo, hi = min(values), max(values)
    hi = hi if hi > lo else lo + 1
    pad_l, pad_b = 60, 24
    w, h = CHART_W - pad_l - 10, CHART_H - pad_b - 10

    def x(step):
        return pad_l + w * (step - 1) / max(1, n_steps - 1)

    def y(v):
        return 10 + h * (hi - v) / (hi - lo)

    parts = [f'<svg class="chart" width="{CHART_W}" height="{CHART_H}" role="img" '
             f'aria-label="{html.escape(title)}">',
             f'<rect x="{pad_l}" y="10" width="{w}" height="{h}" fill="#fff" stroke="#bbb"/>']
    for v in (lo, (lo + hi) / 2, hi):
        parts.append(f'<text x="{pad_l - 4}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.4g}</text>')
    for step, anchor in ((1, "start"), (n_steps, "end")):
        parts.append(f'<text x="{x(step):.1f}" y="{CHART_H - 6}" text-anchor="{anchor}">step {step}</text>')
    for step in marks:
        parts.append(f'<line class="ckpt" x1="{x(step):.1f}" x2="{x(step):.1f}" y1="{10 + h}" '
                     f'y2="{14 + h}"/>')
    legend = []
    for label, colour, steps, vs, dots in series:
        points = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in zip(steps, vs))
        if dots:
            parts += [f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="3" fill="{colour}"/>'
                      for s, v in zip(steps, vs)]
        else:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.2" points="{points}"/>')
        legend.append(f'<span style="color:{colour}">&#9632;</span> {html.escape(label)}')
    parts.append("</svg>")
    return f"<h3>{html.escape(title)}</h3><div>{' &nbsp; '.join(legend)}</div>" + "".join(parts)


def strip(levels, anchors=()):
    """The coverage strip: rows of STRIP_ROW steps, one pixel per step, each run of equal
    level one rect whose data-steps says which steps it covers (first-last); anchored steps
    get a black tick."""
    row_h, pad_l = 12, 52
    n_rows = -(-len(levels) // STRIP_ROW)
    parts = [f'<svg class="strip" width="{pad_l + STRIP_ROW + 10}" height="{n_rows * row_h + 4}">']
    for r in range(n_rows):
        first = r * STRIP_ROW + 1
        y = r * row_h + 2
        parts.append(f'<text x="{pad_l - 4}" y="{y + 9}" text-anchor="end">{first}</text>')
        row = levels[r * STRIP_ROW:(r + 1) * STRIP_ROW]
        i = 0
        while i < len(row):
            j = i
            while j + 1 < len(row) and row[j + 1] == row[i]:
                j += 1
            parts.append(f'<rect class="{row[i]}" data-steps="{first + i}-{first + j}" x="{pad_l + i}" '
                         f'y="{y}" width="{j - i + 1}" height="{row_h - 3}" fill="{COLOURS[row[i]]}"/>')
            i = j + 1
    for step in anchors:
        if 1 <= step <= len(levels):
            r, c = divmod(step - 1, STRIP_ROW)
            parts.append(f'<rect class="anchor" x="{pad_l + c}" y="{r * row_h}" width="1" '
                         f'height="{row_h - 1}" fill="#000"/>')
    parts.append("</svg>")
    return "".join(parts)


def table(header, rows):
    cells = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{cells}</tr>{body}</table>"


# ----------------------------------------------------------------------------- the page
STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:24px;max-width:1100px;color:#1f2328}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #d0d7de}h3{font-size:15px}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #d0d7de;padding:2px 8px;text-align:left}
code,td{font-family:ui-monospace,monospace;font-size:12px}svg text{font:11px sans-serif;fill:#57606a}
line.ckpt{stroke:#8250df;stroke-width:1}.note{color:#57606a}.bad{color:#cf222e;font-weight:bold}"""


def render(run, args, val_losses, results, anchors, contradiction):
    chain, genesis = run.chain, run.genesis
    records = chain.records[1:]
    n = len(records)
    ckpts = [s for s, _ in run.checkpoints()]
    facts = [("run directory", str(run.dir)), ("steps in the chain", f"1..{n}" if n else "none"),
             ("genesis record hash", genesis["record_hash"]), ("head record hash", chain.head),
             ("genesis state hash", genesis.get("state_hash")),
             ("final state hash", records[-1].get("state_hash") if records else "-"),
             ("code digest", genesis.get("code_digest")), ("data manifest", genesis.get("data_manifest")),
             ("tokenizer", f"{(genesis.get('tokenizer') or {}).get('name')} (vocab {genesis.get('vocab_size')})")]
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Run report: {html.escape(str(run.dir))}"
           f"</title><style>{STYLE}</style></head><body>",
           f"<h1>Run report: {html.escape(str(run.dir))}</h1>",
           f"<p class='note'>The chain verified: {n + 1} records, every link and record hash "
           "checked, before anything here was read.</p>",
           "<h2>Header</h2>", table(("fact", "value"), facts),
           "<h3>Decisive config (genesis record)</h3>",
           table(("key", "value"), sorted((genesis.get("config") or {}).items()))]

    def curve(key):
        pairs = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        return downsample([s for s, _ in pairs], [v for _, v in pairs])

    out.append("<h2>Training curves</h2>")
    val = sorted(val_losses.items())
    loss_series = [("train loss (chain)", "#0969da", *curve("loss"), False)]
    if val:
        loss_series.append(("validation loss (train.log, not in the chain)", "#bf8700",
                            [s for s, _ in val], [v for _, v in val], True))
    out.append(chart("Loss", loss_series, n, ckpts))
    out.append(chart("Gradient norm (before clipping)", [("grad norm", "#8250df", *curve("grad_norm"), False)], n))
    out.append(chart("Learning rate", [("lr", "#1a7f37", *curve("lr"), False)], n))
    if n > 2 * CURVE_POINTS:
        out.append(f"<p class='note'>{n} steps: each curve shows the min and max of {CURVE_POINTS} "
                   "buckets of steps.</p>")

    out.append("<h2>Checkpoints</h2>")
    in_chain = [s for s in ckpts if s <= n]
    out.append(f"<p>{len(ckpts)} checkpoint files (steps {receipts.ranges(ckpts)}); "
               f"{len(ckpts) - len(in_chain)} beyond the chain. Listed, not verified here: "
               "<code>audit.py</code> verifies them against the chain. Ticks under the loss axis.</p>")

    out.append("<h2>Audit coverage</h2>")
    anchor_steps = [a["step"] for a in anchors]
    if results is None:
        out.append("<p class='note'>No receipts given (--receipts DIR).</p>")
    else:
        counts = {s: sum(r.status == s for r in results) for s in ("accepted", "rejected", "malformed", "unchecked")}
        covered = receipts.covered(results, run.chain, 1, n) if run.cfg.unit_commits and n else None
        levels = coverage_levels(results, n, args.redundancy, [contradiction[0]] if contradiction else [], covered)
        tally = {k: levels.count(k) for k in COLOURS}
        some = "1 auditor" if args.redundancy == 2 else f"1..{args.redundancy - 1} auditors"
        key = (f"<span style='color:{COLOURS['none']}'>&#9632;</span> no accepted receipt ({tally['none']}) "
               f"<span style='color:{COLOURS['some']}'>&#9632;</span> {some} ({tally['some']}) "
               f"<span style='color:{COLOURS['full']}'>&#9632;</span> &gt;= {args.redundancy} ({tally['full']}) "
               f"<span style='color:{COLOURS['mismatch']}'>&#9632;</span> MISMATCH ({tally['mismatch']}) "
               "&#9474; black tick: anchored step")
        out += [f"<p>Receipts under <code>{html.escape(args.receipts)}</code>: "
                + ", ".join(f"{v} {k}" for k, v in counts.items()) + ". Every step is drawn, "
                f"{STRIP_ROW} per row.</p><p>{key}</p>", strip(levels, anchor_steps)]
        if covered is not None:
            out += unit_coverage(covered, args.redundancy)
        bad = [r for r in results if r.status in ("rejected", "malformed")]
        if bad:
            out.append(table(("receipt", "status", "reason"), [(r.path, r.status, r.reason) for r in bad[:50]]))
        costs = audit_costs(results)
        out.append("<h3>Audit costs (as the receipts report them)</h3>")
        rows = [(a, c["receipts"], c["steps_replayed"], f"{c['seconds']:.1f}", c["peak_mib"],
                 f"{c['bytes_read'] / 1e6:.1f}") for a, c in sorted(costs.items())]
        total = [sum(c[k] for c in costs.values()) for k in ("receipts", "steps_replayed", "seconds", "bytes_read")]
        rows.append(("all", total[0], total[1], f"{total[2]:.1f}", max((c["peak_mib"] for c in costs.values()),
                                                                       default=0), f"{total[3] / 1e6:.1f}"))
        out.append(table(("auditor", "receipts", "steps replayed", "seconds", "peak MiB", "MB read"), rows))

    out.append("<h2>Anchors</h2>")
    if not anchors:
        out.append("<p class='note'>No anchors (--anchors FILE; the run has no anchors.jsonl).</p>")
    else:
        verdict = (f"<p class='bad'>MISMATCH at step {contradiction[0]}: {html.escape(contradiction[1])}</p>"
                   if contradiction else f"<p>ANCHORED: the chain agrees with all {len(anchors)} anchors of "
                   f"<code>{html.escape(args.anchors_used)}</code>.</p>")
        out += [verdict, table(("step", "record hash", "anchored at (UTC)"),
                               [(a["step"], a["record_hash"], a["utc"]) for a in sorted(anchors, key=lambda a: a["step"])])]
    out.append("</body></html>\n")
    return "".join(out)


# ----------------------------------------------------------------------------- command line
def main(argv=None):
    try:
        args = parser().parse_args(argv)
        rundir.check_outside(args.run_dir, args.out, "--out")
        if args.redundancy < 1:
            raise UsageError(f"--redundancy {args.redundancy}: each step needs at least 1 auditor")
        for option in ("salts", "revealed"):
            if getattr(args, option) and not args.receipts:
                raise UsageError(f"--{option} goes with --receipts")
        run = rundir.Run(args.run_dir)
        try:
            run.chain.verify()
        except hashchain.ChainError as e:
            print(f"MISMATCH at step {e.line - 1}: {e.message}")
            return 1
        own = run.dir / receipts.ANCHORS
        args.anchors_used = args.anchors or (str(own) if own.exists() else None)
        anchors = receipts.read_anchors(args.anchors_used) if args.anchors_used else []
        contradiction = receipts.first_contradiction(run.chain, anchors) if anchors else None
        results = None
        if args.receipts:
            salt_of = receipts.salt_lookup(run.dir, run.genesis, args.salts)
            results = receipts.check_receipts(args.receipts, run.chain, salt_of, *unitaudit.judging(run, args.revealed))
        page = render(run, args, read_val_losses(run.dir), results, anchors, contradiction)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(page)
    except (UsageError, hashchain.HashChainError) as e:
        print(f"report.py: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"report.py: error: cannot write {args.out}: {e.strerror}", file=sys.stderr)
        return 2
    print(f"report: {len(run.chain) - 1} steps of {args.run_dir} written to {args.out}"
          + (f" (MISMATCH at step {contradiction[0]} against the anchors)" if contradiction else ""))
    return 1 if contradiction else 0


if __name__ == "__main__":
    sys.exit(main())
