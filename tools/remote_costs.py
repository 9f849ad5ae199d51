"""What auditing a published run costs: bytes fetched and wall time, and the chain's size
(docs/auditing.md, "What an audit fetches").

    python -m tools.remote_costs --run_dir runs/mini --step 16 --micro_batch 1
    python -m tools.remote_costs --run_dir runs/default --step 201 --whole        # a whole step
    python -m tools.remote_costs --sizes runs/default runs/mini     # records, chains, a unit's fetch

The first form publishes the run (publish.py, the corpus included) into a temporary folder,
serves it with nginx on a loopback port, and runs `audit.py --step S --micro_batch M` (or the
whole step, --whole) as a child process three times: on the public copy on disk (an auditor's download), then over HTTP with an
empty cache, then over HTTP again (the cache full). It prints each one's verdict, wall time and
what it fetched, against the size of the run's copy.

--sizes prints, for each run given and for --preset=open1b at its 80,957 steps (computed from the
model's tensor list, no run needed): the tensor count, a step record's bytes under SPEC v7 (its
fields are fixed: measured on the run's chain; open1b: open1b-mini's record, whose fields are
the same), what SPEC v6's tensor_hashes added to it (one entry per tensor, measured on a
checkpoint's header, computed for open1b), the chain at N steps both ways, and what a
micro-batch audit fetches: the records of its walk (at most anchor_every + 1 of them and the
genesis), the checkpoint's header, the parameters, the unit list and the step's token windows.
"""
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from config import CommandLine


def parser():
    ap = CommandLine("python -m tools.remote_costs", "Bytes fetched and wall time of a micro-batch audit over "
                     "loopback HTTP, and the chain's size by steps and tensors.")
    ap.add_argument("--run_dir", metavar="DIR", help="the run to publish and audit")
    ap.add_argument("--step", type=int, metavar="S", help="the step whose micro-batch is audited (its state before "
                    "must be a checkpoint)")
    ap.add_argument("--micro_batch", type=int, default=0, metavar="M", help="the micro-batch (default %(default)s)")
    ap.add_argument("--whole", action="store_true", help="audit the whole step instead of a micro-batch")
    ap.add_argument("--data_dir", metavar="DIR", help="the run's corpus (default: the one its config.json names)")
    ap.add_argument("--sizes", nargs="*", metavar="RUN", help="the size table for these runs (and open1b, computed)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import config  # noqa: E402  (below the command line's first answer, above)
import model  # noqa: E402
import prepare  # noqa: E402
import rundir  # noqa: E402
import train  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPEN1B_STEPS = 80957


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_nginx(root, work):
    """nginx serving `root` on a loopback port, as one process; (process, base URL)."""
    port = free_port()
    temp = "\n".join(f"  {k}_temp_path {work}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    conf = os.path.join(work, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log {work}/error.log;\n"
                f"pid {work}/nginx.pid;\nevents {{ worker_connections 64; }}\nhttp {{\n  access_log off;\n{temp}\n"
                f"  default_type application/octet-stream;\n  server {{ listen 127.0.0.1:{port}; root {root}; }}\n}}\n")
    proc = subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-p", work, "-e", f"{work}/error.log", "-c", conf])
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("nginx did not start")


def timed_audit(run, step, micro, *extra):
    """(wall seconds, the output's verdict line, its cost line, its fetched line) of one audit.py
    child (micro None: the whole step)."""
    t0 = time.monotonic()
    unit = [] if micro is None else ["--micro_batch", str(micro)]
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "audit.py"), "--run_dir", run, "--step", str(step),
                           *unit, *extra], capture_output=True, text=True, cwd=ROOT)
    seconds = time.monotonic() - t0
    lines = proc.stdout.splitlines()
    verdict = next((x for x in lines if x.startswith(("MATCH", "MISMATCH"))), proc.stderr.strip())
    cost = next((x for x in lines if x.startswith("audit cost:")), "")
    fetched = next((x for x in lines if x.startswith("fetched from")), "")
    return seconds, verdict, cost, fetched


def audit_table(args):
    work = tempfile.mkdtemp(prefix="remote_costs")
    try:
        pub = os.path.join(work, "served", "run")
        cmd = [sys.executable, os.path.join(ROOT, "publish.py"), "--run_dir", args.run_dir, "--out", pub]
        subprocess.run(cmd + (["--corpus", args.data_dir] if args.data_dir else []), check=True, cwd=ROOT)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(pub) for f in fs)
        ckpt = os.path.getsize(os.path.join(pub, "checkpoints", f"step_{args.step - 1:08d}.safetensors"))
        print(f"the public copy: {size:,} bytes (checkpoint {args.step - 1}: {ckpt:,})")
        nginx, base = start_nginx(os.path.join(work, "served"), work)
        try:
            cache = os.path.join(work, "cache")
            rows = [("disk (the public copy)", pub, ["--data_dir", os.path.join(pub, "corpus")]),
                    ("HTTP, empty cache", f"{base}/run", ["--cache", cache]),
                    ("HTTP, the cache full", f"{base}/run", ["--cache", cache])]
            for label, run, extra in rows:
                seconds, verdict, cost, fetched = timed_audit(run, args.step, None if args.whole else args.micro_batch,
                                                              *extra)
                got = re.search(r": ([0-9,]+) bytes in (\d+) requests, ([0-9,]+) bytes from the cache", fetched)
                n = int(got[1].replace(",", "")) if got else 0
                what = (f"fetched {n:,} bytes ({n / size:.2%} of the copy) in {got[2]} requests, {got[3]} from "
                        "the cache") if got else "read from disk"
                print(f"{label}: {seconds:.1f} s wall; {verdict[:90]}; {cost}; {what}")
        finally:
            nginx.kill()
            nginx.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ----------------------------------------------------------------------------- sizes
def state_names(cfg, vocab):
    """The state's tensor names (SPEC §3) and the parameters' element count, without a model."""
    shapes = model.param_shapes(train.model_config(cfg, vocab))
    trained = list(shapes)             # fp32: every parameter is trained (int8 re-pinned step sizes are not)
    names = ["step"] + [f"params.{n}" for n in shapes] + [f"{k}.{n}" for k in ("adam_m", "adam_v") for n in trained]
    return names, sum(math.prod(s) for n, s in shapes.items())


def v6_entries(names):
    """Bytes SPEC v6's tensor_hashes added to a record: one `"name":"<64 hex>"` per tensor."""
    return len(json.dumps({n: "0" * 64 for n in names}, separators=(",", ":"))) + len(',"tensor_hashes":')


def record_bytes(run):
    lines = open(os.path.join(run, "chain.jsonl"), "rb").read().splitlines()
    return len(lines[0]) + 1, max(len(x) + 1 for x in lines[1:]), len(lines) - 1


def unit_fetch(cfg, vocab, record, genesis, names, params, anchor_every, chunk=prepare.CHUNK_BYTES):
    """Bytes a micro-batch audit fetches, by kind (the walk's worst case: anchor_every + 1 records)."""
    header = 8 + len(json.dumps({n: {"dtype": "F32", "shape": [1, 1], "data_offsets": [0, 0]} for n in names}))
    header += v6_entries(names) + 100
    n = config.micro_batches_at(cfg, 1)
    token = 2 if vocab <= 65536 else 4
    window = (cfg.seq_len + 1) * token * cfg.micro_batch_size
    chunks = n * (1 + (window - 1) / chunk)                 # each window touches 1 + (W - 1)/C chunks on average
    return {"records": genesis + (anchor_every + 1) * (record + 16), "checkpoint header": header,
            "parameters": 4 * params, "unit list": (2 * n - 1) * 190 if cfg.unit_commits else 0,
            "token chunks": int(chunks * chunk)}


def size_table(runs):
    rows = []
    for run in runs:
        r = rundir.Run(run)
        cfg = config.resolve(r.cfg, r.vocab_size)
        names, params = state_names(cfg, r.vocab_size)
        header = rundir.load_checkpoint(r.checkpoints()[-1][1], mmap=True)[1]["tensor_hashes"]
        assert sorted(header) == sorted(names), "the state's names are the checkpoint's"
        genesis, record, steps = record_bytes(run)
        rows.append((run, cfg, r.vocab_size, names, params, genesis, record, steps))
    mini = next((row for row in rows if row[1].unit_commits), None)
    if mini:                                   # open1b: open1b-mini's record (the same fields), its tensors
        cfg = config.resolve(config.parse_config(["--preset=open1b"]), 128256)
        names, params = state_names(cfg, 128256)
        rows.append(("--preset=open1b (computed)", cfg, 128256, names, params, mini[5], mini[6], OPEN1B_STEPS))
    for run, cfg, vocab, names, params, genesis, record, steps in rows:
        v6 = v6_entries(names)
        fetch = unit_fetch(cfg, vocab, record, genesis, names, params, cfg.anchor_every)
        total = sum(fetch.values())
        print(f"{run}: {len(names)} tensors, {params:,} parameters; a step record {record} bytes (v6: +{v6:,} "
              f"= {record + v6:,}); the chain at {steps:,} steps {genesis + steps * record:,} bytes "
              f"(v6: {genesis + v6 + steps * (record + v6):,}); a micro-batch audit fetches {total:,} bytes: "
              + ", ".join(f"{k} {v:,}" for k, v in fetch.items()))


def main(argv=None):
    args = parser().parse_args(argv)
    if args.sizes is not None:
        size_table(args.sizes)
    if args.run_dir:
        audit_table(args)


if __name__ == "__main__":
    main()
