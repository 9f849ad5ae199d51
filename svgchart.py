"""Inline SVG for report.py: line charts with readable axes, and the audit coverage strip.

    import svgchart
    svgchart.nice_ticks(0.00131, 0.00209)      # [0.0014, 0.0016, 0.0018, 0.002]: 1-2-5 steps
    s = svgchart.Series("train loss", "#0969da", steps, values)
    svgchart.chart("Loss", [s], (1, n_steps), log=True, hlines=[("unigram", "#57606a", 3.32)])
    svgchart.strip(levels, colours, anchors)   # one cell per step, wide for few steps

Axes. Ticks sit at nice numbers: 1, 2 or 5 times a power of ten, 4 to 8 per axis (on a log axis
the 1-2-5 values of each decade, or nice linear ticks inside one decade), each labelled in its
shortest exact form, with light grid lines; steps get thousands separators.

Robust y limits. A curve's running median over RUN_MEDIAN steps follows its trend (the fast
early fall of a loss included) and ignores a spike of a few steps. The y axis covers that
running median and every value within SPIKE_SPAN times its span of it; a value beyond (a
spike) is drawn clipped at the axis edge with a triangle, and the largest few are labelled with
their value and step (one under another where two would overlap), so one bad step cannot
flatten the curve. Only true spikes are clipped: at most SPIKE_SHARE of a curve's points (the
furthest), so a curve that scatters widely (step times on a busy machine) is drawn whole, and
so is a curve of at most SHORT_CURVE points (a short run: every point is shown). A log axis
does the same on log values (values <= 0 cannot be drawn there: they are counted and said).

A curve of more than 2 * CURVE_POINTS points is drawn in CURVE_POINTS buckets of consecutive
steps: each bucket's range (min to max) as a light band, so a one-step spike stays, and its
median as the line. The coverage strip never is: one cell per step, cells
min(MAX_CELL, STRIP_WIDTH / steps) pixels wide (a 10-step run gets 40-pixel cells) and rows of
STRIP_WIDTH / cell steps (1,000 one-pixel steps per row for a long run); each run of equal
level is one rect whose data-steps says which steps it covers (first-last).
"""
import html
import math
from dataclasses import dataclass

import numpy as np

CURVE_POINTS = 1000      # buckets per curve (each gives its min and max)
RUN_MEDIAN = 21          # steps in the running median that sets the y limits
SPIKE_SPAN = 0.5         # values further than this times the running median's span are clipped
SPIKE_SHARE = 0.01       # ... but at most this share of a curve's points, the furthest
SHORT_CURVE = 50         # a curve of at most this many points is drawn whole
SPIKE_LABELS = 4         # clipped values labelled with value and step (the most extreme)
LABEL_CHAR_W, LABEL_ROW_H = 7, 13   # a spike label's width per character (11 px bold) and row height
CHART_W, CHART_H = 900, 200
PAD_L, PAD_R, PAD_T, PAD_B = 64, 16, 12, 30
STRIP_WIDTH = 1000       # pixels of cells per strip row
MAX_CELL = 40            # the widest cell (pixels), for runs of a few steps


@dataclass
class Series:
    label: str
    colour: str
    steps: list
    values: list
    dots: bool = False   # points (e.g. a validation loss every N steps) instead of a line
    dash: bool = False


# ----------------------------------------------------------------------------- ticks
def _nice_step(span, target=5):
    """The 1-2-5 step that puts about `target` ticks on `span`."""
    raw = span / target
    mag = 10.0 ** math.floor(math.log10(raw))
    return min((m * mag for m in (1, 2, 5, 10)), key=lambda s: abs(math.log(s / raw)))


def nice_ticks(lo, hi, target=5):
    """Ticks at multiples of a 1-2-5 step inside [lo, hi] (lo < hi)."""
    step = _nice_step(hi - lo, target)
    first = math.ceil(lo / step - 1e-9)
    return [round(k * step, 12) for k in range(first, int(math.floor(hi / step + 1e-9)) + 1)]


def log_ticks(lo, hi):
    """Ticks for a log axis on [lo, hi] (0 < lo < hi): the 1-2-5 values of each decade (only the
    powers of ten when that gives more than 8), or nice linear ticks inside a short range."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for mults in ((1, 2, 5), (1,)):
        ticks = [m * 10.0 ** e for e in range(a, b + 1) for m in mults if lo <= m * 10.0 ** e <= hi]
        if 3 <= len(ticks) <= 8 or (mults == (1,) and len(ticks) >= 2):
            return ticks
    return nice_ticks(lo, hi, 4)


def tick_label(value):
    """A tick's label: its shortest exact decimal form (0.0016, 2.5, 20,000), or 1e-5 style
    outside [1e-4, 1e6)."""
    if value == 0:
        return "0"
    if abs(value) >= 1e6 or abs(value) < 1e-4:
        return f"{value:.0e}".replace("e-0", "e-").replace("e+0", "e")
    decimals = next(d for d in range(10) if abs(round(value, d) - value) <= 1e-9 * abs(value))
    return f"{value:,.{decimals}f}"


# ----------------------------------------------------------------------------- limits and points
def running_median(values, width=RUN_MEDIAN):
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 3:
        return v
    w = min(width, len(v) - (1 - len(v) % 2)) // 2
    padded = np.pad(v, w, mode="edge")
    return np.median(np.lib.stride_tricks.sliding_window_view(padded, 2 * w + 1), axis=1)


def robust_limits(series, log):
    """(lo, hi) of the y axis for `series` (on log10 values when log): the running medians of
    the long line series and every value within SPIKE_SPAN of their span, and of the rest every
    value but the furthest SPIKE_SHARE; dots, hlines and short curves (SHORT_CURVE) count whole."""
    def tr(v):
        v = np.asarray(v, dtype=np.float64)
        v = v[np.isfinite(v) & ((v > 0) if log else True)]
        return np.log10(v) if log else v

    def whole(s):
        return s.dots or len(s.values) <= SHORT_CURVE
    smooth = [tr(s.values) if whole(s) else tr(running_median(s.values)) for s in series]
    smooth = np.concatenate([m for m in smooth if len(m)] or [np.zeros(0)])
    if not len(smooth):
        return None
    lo, hi = float(smooth.min()), float(smooth.max())
    margin = SPIKE_SPAN * max(hi - lo, 0.05 * max(abs(lo), abs(hi)), 1e-12)
    kept = []
    for s in series:
        raw = tr(s.values)
        beyond = np.maximum(np.maximum(lo - margin - raw, raw - hi - margin), 0)
        spikes = 0 if whole(s) else int(SPIKE_SHARE * len(raw))
        if np.count_nonzero(beyond) > spikes:   # more than a few: all but the furthest `spikes` are drawn
            beyond[np.argsort(beyond)[:len(raw) - spikes]] = 0
        kept.append(raw[beyond == 0])
    inside = np.concatenate(kept)
    lo, hi = min(lo, float(inside.min())), max(hi, float(inside.max()))
    # a flat curve: a tenth of a decade (log) or of its value (at least 0.1) either side
    pad = 0.04 * (hi - lo) if hi - lo > 1e-12 else (0.1 if log else 0.1 * max(abs(lo), 1.0))
    return (10 ** (lo - pad), 10 ** (hi + pad)) if log else (lo - pad, hi + pad)


def buckets(steps, values, n=CURVE_POINTS):
    """A long curve in n buckets of consecutive points: [(median's step, median, (step, min),
    (step, max))], the median's step being the bucket's middle one."""
    steps, values = np.asarray(steps), np.asarray(values, dtype=np.float64)
    edges = np.linspace(0, len(values), n + 1).astype(int)
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        v = values[a:b]
        i, j = int(np.argmin(v)), int(np.argmax(v))
        out.append((int(steps[(a + b) // 2]), float(np.median(v)), (int(steps[a + i]), float(v[i])),
                    (int(steps[a + j]), float(v[j]))))
    return out


# ----------------------------------------------------------------------------- the chart
def chart(title, series, x_range, marks=(), log=False, hlines=(), unit=""):
    """An inline SVG line chart. series: [Series]; x_range: (first, last) step; marks: steps
    ticked under the axis (checkpoints); hlines: [(label, colour, value)] dashed horizontal lines
    (a baseline); log: log y axis."""
    series = [s for s in series if s.values]
    limits = robust_limits(series + [Series(lb, c, [0], [v]) for lb, c, v in hlines], log)
    if limits is None:
        return f"<p>{html.escape(title)}: no values.</p>"
    lo, hi = limits
    x0, x1 = x_range
    x1 = x1 if x1 > x0 else x0 + 1
    w, h = CHART_W - PAD_L - PAD_R, CHART_H - PAD_T - PAD_B
    ty = (lambda v: math.log10(v)) if log else (lambda v: v)
    tlo, thi = ty(lo), ty(hi)

    def x(step):
        return PAD_L + w * (step - x0) / (x1 - x0)

    def y(v):
        return PAD_T + h * (thi - ty(v)) / (thi - tlo)

    parts = [f'<svg class="chart" width="{CHART_W}" height="{CHART_H}" role="img" aria-label="{html.escape(title)}">',
             f'<rect x="{PAD_L}" y="{PAD_T}" width="{w}" height="{h}" fill="#fff" stroke="#bbb"/>']
    yt = log_ticks(lo, hi) if log else nice_ticks(lo, hi)
    for v in yt:
        parts.append(f'<line class="grid" x1="{PAD_L}" x2="{PAD_L + w}" y1="{y(v):.1f}" y2="{y(v):.1f}"/>'
                     f'<text x="{PAD_L - 4}" y="{y(v) + 4:.1f}" text-anchor="end">{tick_label(v)}</text>')
    xt = [t for t in nice_ticks(x0, x1, 6) if t == int(t)]
    for t in xt:
        parts.append(f'<line class="grid" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{PAD_T}" y2="{PAD_T + h}"/>'
                     f'<text x="{x(t):.1f}" y="{CHART_H - 14}" text-anchor="middle">{int(t):,}</text>')
    parts.append(f'<text x="{PAD_L + w}" y="{CHART_H - 2}" text-anchor="end">step</text>')
    for step in marks:
        parts.append(f'<line class="ckpt" x1="{x(step):.1f}" x2="{x(step):.1f}" y1="{PAD_T + h}" y2="{PAD_T + h + 5}"/>')
    for label, colour, v in hlines:
        if lo <= v <= hi:
            parts.append(f'<line x1="{PAD_L}" x2="{PAD_L + w}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="{colour}" '
                         f'stroke-dasharray="6 4"/><text x="{PAD_L + w - 4}" y="{y(v) - 4:.1f}" text-anchor="end" '
                         f'style="fill:{colour}">{html.escape(label)}</text>')
    clipped, hidden = [], 0

    def at(step, v, colour):
        """(x, y) of a point, clipped into [lo, hi] (and noted when it is)."""
        if v > hi or v < lo:
            clipped.append((v, step, colour, v > hi))
        return x(step), y(min(max(v, lo), hi))

    for s in series:
        keep = [(st, v) for st, v in zip(s.steps, s.values) if math.isfinite(v) and not (log and v <= 0)]
        hidden += len(s.values) - len(keep)
        if not keep:
            continue
        dash = ' stroke-dasharray="5 3"' if s.dash else ""
        if s.dots:
            parts += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{s.colour}"/>'
                      for px, py in (at(st, v, s.colour) for st, v in keep)]
        elif len(keep) <= 2 * CURVE_POINTS:
            parts.append(f'<polyline fill="none" stroke="{s.colour}" stroke-width="1.2"{dash} points="'
                         + " ".join("%.1f,%.1f" % at(st, v, s.colour) for st, v in keep) + '"/>')
        else:      # each bucket's range as a light band, its median as the line
            bands = buckets(*zip(*keep))
            top = [at(*mx, s.colour) for _, _, _, mx in bands]
            bottom = [at(*mn, s.colour) for _, _, mn, _ in bands]
            parts.append(f'<polygon class="band" fill="{s.colour}" fill-opacity="0.22" stroke="none" points="'
                         + " ".join(f"{px:.1f},{py:.1f}" for px, py in top + bottom[::-1]) + '"/>')
            parts.append(f'<polyline fill="none" stroke="{s.colour}" stroke-width="1.2"{dash} points="'
                         + " ".join(f"{x(st):.1f},{y(min(max(m, lo), hi)):.1f}" for st, m, _, _ in bands) + '"/>')
    extreme = sorted(clipped, key=lambda c: -abs(ty(c[0]) - ty(hi if c[3] else lo)))   # furthest first
    for v, step, colour, above in clipped:
        py = PAD_T + (0 if above else h)
        tip = py - 6 if above else py + 6
        parts.append(f'<path class="spike" d="M{x(step) - 4:.1f},{py:.1f} L{x(step) + 4:.1f},{py:.1f} '
                     f'L{x(step):.1f},{tip:.1f} Z" fill="{colour}"/>')
    taken = []                      # (row, above, first x, last x) of the labels placed
    for v, step, colour, above in extreme[:SPIKE_LABELS]:
        text = f"{v:.4g}{unit} at step {step:,}"
        left, right = x(step) + 6, x(step) + 6 + LABEL_CHAR_W * len(text)
        row = next(r for r in range(SPIKE_LABELS) if not any(
            r == r2 and above == a2 and left < b2 and a1 < right for r2, a2, a1, b2 in taken))
        taken.append((row, above, left, right))     # a label that would overlap one goes a row further in
        py = PAD_T + (10 + LABEL_ROW_H * row if above else h - 4 - LABEL_ROW_H * row)
        parts.append(f'<text class="spike" x="{left:.1f}" y="{py:.1f}" style="fill:{colour}">{text}</text>')
    parts.append("</svg>")
    legend = [f'<span style="color:{s.colour}">&#9632;</span> {html.escape(s.label)}' for s in series]
    notes = []
    if clipped:
        notes.append(f"{len(clipped)} value{'s' if len(clipped) > 1 else ''} beyond the axis, drawn at its edge "
                     "(&#9650;; the largest labelled)")
    if hidden:
        notes.append(f"{hidden} value{'s' if hidden > 1 else ''} not drawn (not finite{', or <= 0 on a log axis' if log else ''})")
    note = f"<div class='note'>{'; '.join(notes)}.</div>" if notes else ""
    return f"<h3>{html.escape(title)}</h3><div>{' &nbsp; '.join(legend)}</div>" + "".join(parts) + note


# ----------------------------------------------------------------------------- the strip
def strip(levels, colours, anchors=()):
    """The coverage strip of steps 1..len(levels): one cell per step (level -> colours[level]),
    rows of whole cells, each run of equal level one rect with data-steps="first-last";
    anchored steps get a black tick above their cell."""
    n = len(levels)
    cell = max(1, min(MAX_CELL, STRIP_WIDTH // max(n, 1)))
    per_row = STRIP_WIDTH // cell
    row_h, pad_l = (22 if cell > 4 else 12), 60
    n_rows = -(-n // per_row)
    parts = [f'<svg class="strip" width="{pad_l + per_row * cell + 10}" '
             f'height="{n_rows * row_h + (18 if n_rows == 1 else 4)}">']
    for r in range(n_rows):
        first = r * per_row + 1
        y = r * row_h + 2
        parts.append(f'<text x="{pad_l - 4}" y="{y + row_h / 2 + 2:.0f}" text-anchor="end">{first:,}</text>')
        row = levels[r * per_row:(r + 1) * per_row]
        i = 0
        while i < len(row):
            j = i
            while j + 1 < len(row) and row[j + 1] == row[i]:
                j += 1
            gap = 1 if cell >= 6 else 0      # wide cells: a white line between steps
            parts.append(f'<rect class="{row[i]}" data-steps="{first + i}-{first + j}" x="{pad_l + i * cell}" '
                         f'y="{y}" width="{(j - i + 1) * cell - gap}" height="{row_h - 3}" fill="{colours[row[i]]}"/>')
            i = j + 1
    for step in anchors:
        if 1 <= step <= n:
            r, c = divmod(step - 1, per_row)
            parts.append(f'<rect class="anchor" x="{pad_l + c * cell + (cell - 1) // 2}" y="{r * row_h}" width="1" '
                         f'height="{row_h - 1}" fill="#000"/>')
    if n_rows == 1:                                       # one row: steps under the cells
        for t in [int(t) for t in nice_ticks(1, max(n, 2), 5) if t == int(t) and 1 <= t <= n]:
            parts.append(f'<text x="{pad_l + (t - 1) * cell + cell / 2:.1f}" y="{row_h + 14}" '
                         f'text-anchor="middle">{t:,}</text>')
    parts.append("</svg>")
    return "".join(parts)
