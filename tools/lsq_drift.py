"""Print the LSQ drift table of int8 runs: how far the weight step sizes are from the re-pin rule.

    python -m tools.lsq_drift --run_dir runs/drift0 runs/drift1   # any number of runs

For every checkpoint of each run (train with --checkpoint_every=25 for a row per 25 steps) it
prints the step, mean over every row of every block linear of s_w * sqrt(Qp) / (2 mean|w_row|)
(1.0 exactly when s_w follows the re-pin rule; plain LSQ drifts away from it), and the gradient
norm and loss of that step from the chain. Analysis only, in float64 NumPy: not training math.
"""
import json
import math
from pathlib import Path

from config import CommandLine


def parser():
    ap = CommandLine("python -m tools.lsq_drift", "The LSQ drift table of int8 runs: how far the weight step "
                     "sizes are from the re-pin rule, checkpoint by checkpoint.")
    ap.add_argument("--run_dir", nargs="+", metavar="DIR", required=True,
                    help="the int8 runs, one column group each (required)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import numpy as np  # noqa: E402  (below the command line's first answer, above)

import rundir
import quant


def rows(run):
    """[(step, drift, grad_norm, loss)] of the run's checkpoints (step 0: no norm or loss)."""
    run = Path(run)
    records = [json.loads(line) for line in (run / "chain.jsonl").read_text().splitlines()]
    out = []
    for step, path in rundir.list_checkpoints(run / "checkpoints"):
        tensors, _ = rundir.load_checkpoint(path)
        ratios = []
        for name in (n for n in tensors if n.startswith("params.") and n.endswith("_sw")):
            w = tensors[name[:-3]].numpy().astype(np.float64)
            s = tensors[name].numpy().astype(np.float64)
            ratios.append(s * math.sqrt(quant.QP) / (2 * np.abs(w).mean(axis=1)))
        if not ratios:
            raise SystemExit(f"{run} has no weight step sizes (not a --quant=int8 run)")
        rec = records[step] if step < len(records) else {}
        out.append((step, float(np.concatenate(ratios).mean()), rec.get("grad_norm"), rec.get("loss")))
    return out


def main(argv=None):
    runs = parser().parse_args(argv).run_dir
    tables = {run: {r[0]: r[1:] for r in rows(run)} for run in runs}
    steps = sorted(set().union(*tables.values()))
    labels = [Path(r).name for r in runs]
    print("| step | " + " | ".join(f"{l}: s_w ratio | {l}: grad norm | {l}: loss" for l in labels) + " |")
    print("|---:|" + "---:|---:|---:|" * len(runs))
    for step in steps:
        cells = []
        for run in runs:
            drift, norm, loss = tables[run].get(step, (None, None, None))
            cells += ["-" if drift is None else f"{drift:.4f}", "-" if norm is None else f"{norm:.3f}",
                      "-" if loss is None else f"{loss:.4f}"]
        print(f"| {step} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
