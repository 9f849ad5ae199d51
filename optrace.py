"""Per-operator trace of one training step, to diff between two machines.

When two machines disagree on a step, the trace names the first RepOps operator whose output
bits differ. On machine A and on machine B (same run directory, e.g. copied over):

    python audit.py --step 17 --trace a.jsonl      # on machine A
    python audit.py --step 17 --trace b.jsonl      # on machine B
    python optrace.py a.jsonl b.jsonl              # anywhere, with both files

It prints "traces identical (N ops)" (exit 0) or the first operator whose output differs,
with the last operator that still matched (exit 1); unreadable files or traces of different
steps give one error line (exit 2). A trace is JSON lines: a header (step, the chain record's
state hash, code digest, machine), then one entry per repops::* operator the step executed
(forward, backward, TreeFold, clipping, AdamW): index, operator, input shapes (scalars by
value) and, per output (for in-place operators: each mutated argument), dtype, shape and the
SHA-256 of its contiguous little-endian CPU bytes, NaNs canonicalized to 0x7FC00000 (contract
§7: NaN payloads differ between CPUs and are not a reproducibility failure).

In-process: `with OpTrace() as t: train.train_step(...)`, then `write(path, t.entries, meta)`
(audit.traced does exactly that for `audit.py --trace`).
"""
import hashlib
import json
import platform
import sys

from config import CommandLine


def parser():
    ap = CommandLine("optrace.py", "The first operator at which two traces of one step differ (write them with "
                     "audit.py --step N --trace FILE).")
    ap.add_argument("traces", nargs=2, metavar="TRACE", help="the two traces, A.jsonl and B.jsonl")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import torch  # noqa: E402  (below the command line's first answer, above)
from torch.utils._python_dispatch import TorchDispatchMode

import hashchain
import repops


FORMAT = "repops-optrace-v1"
MAX_TRACE = 1 << 30        # bytes: a line per operator of one step


class TraceError(Exception):
    """A trace file that cannot be read or compared: one line, exit code 2."""


def tensor_digest(t):
    """{dtype, shape, sha256} of a tensor's contiguous CPU bytes, NaNs canonicalized."""
    t = t.detach().cpu().contiguous()
    if t.is_floating_point():
        nan = torch.isnan(t)
        if bool(nan.any()):
            ints = {torch.float32: (torch.int32, 0x7FC00000), torch.float64: (torch.int64, 0x7FF8 << 48),
                    torch.float16: (torch.int16, 0x7E00), torch.bfloat16: (torch.int16, 0x7FC0)}
            kind, bits = ints[t.dtype]
            t = t.view(kind).clone()
            t[nan] = bits
    data = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
            "sha256": hashlib.sha256(data).hexdigest()}


def _describe(arg):
    if isinstance(arg, torch.Tensor):
        return list(arg.shape)
    if isinstance(arg, (list, tuple)):
        return [_describe(a) for a in arg]
    return arg if arg is None or isinstance(arg, (bool, int, float, str)) else repr(arg)


class OpTrace(TorchDispatchMode):
    """Records every repops::* operator dispatched while active (other operators pass through).
    Attention runs as its composed operators meanwhile (repops.COMPOSED_ATTENTION: the CPU's
    one-op attention gives their bits), so that every backend's trace lists the same operators."""

    def __init__(self):
        super().__init__()
        self.entries = []

    def __enter__(self):
        self.composed, repops.COMPOSED_ATTENTION = repops.COMPOSED_ATTENTION, True
        return super().__enter__()

    def __exit__(self, *exc):
        repops.COMPOSED_ATTENTION = self.composed
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.name()
        if name.startswith("repops::"):
            results = list(out) if isinstance(out, (tuple, list)) else [out]
            # In-place operators (adamw_ returns nothing): their outputs are the mutated args.
            schema = func._schema.arguments
            results += [a for s, a in zip(schema, args) if s.alias_info is not None
                        and s.alias_info.is_write and not any(a is r for r in results)]
            self.entries.append({
                "i": len(self.entries), "op": name,
                "inputs": [_describe(a) for a in args] + [{k: _describe(v)} for k, v in kwargs.items()],
                "outputs": [tensor_digest(r) for r in results if isinstance(r, torch.Tensor)]})
        return out


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    desc = {"machine": platform.machine(), "cpu": cpu, "torch": torch.__version__}
    if torch.cuda.is_available():
        desc["gpu"] = torch.cuda.get_device_name()
    return desc


def write(path, entries, meta):
    """JSON lines: a header ({format, machine, **meta: step, state_hash, code_digest}), entries."""
    header = {"format": FORMAT, **meta, "machine": machine(), "ops": len(entries)}
    hashchain.write_atomically(path, ((json.dumps(line, separators=(",", ":")) + "\n").encode()
                                      for line in [header, *entries]))


def read(path):
    """(header, entries) of a trace file; TraceError if it is not one."""
    try:
        text = hashchain.read_bytes(path, "trace", MAX_TRACE, TraceError).decode("utf-8")
        lines = [hashchain.strict_json(line) for line in text.splitlines() if line.strip()]
    except UnicodeDecodeError as e:
        raise TraceError(f"cannot read {path}: {e}") from None
    except ValueError as e:
        raise TraceError(f"{path} is not a trace (not JSON lines: {e})") from None
    if not lines or not isinstance(lines[0], dict) or lines[0].get("format") != FORMAT:
        raise TraceError(f"{path} is not a trace (no {FORMAT} header)")
    entries = lines[1:]
    for n, e in enumerate(entries):
        if not (isinstance(e, dict) and e.get("i") == n and isinstance(e.get("op"), str)
                and isinstance(e.get("outputs"), list)):
            raise TraceError(f"{path} is not a trace (entry {n} is malformed)")
    if lines[0].get("ops") != len(entries):
        raise TraceError(f"{path} is truncated ({len(entries)} of {lines[0].get('ops')} operators)")
    return lines[0], entries


def diff(path_a, path_b):
    """The first difference between two traces of the same step, or None.

    Returns {index, op, output (k, or None when the operators or their inputs differ), a, b,
    previous (the last matching entry, or None)}. TraceError if the traces are of different
    steps or runs (comparing them would say nothing)."""
    (ha, ea), (hb, eb) = read(path_a), read(path_b)
    for key in ("step", "state_hash"):
        if ha.get(key) != hb.get(key):
            raise TraceError(f"the traces are of different steps: {key} {ha.get(key)} in {path_a}, "
                             f"{hb.get(key)} in {path_b}")
    for i in range(max(len(ea), len(eb))):
        a, b = (ea[i] if i < len(ea) else None), (eb[i] if i < len(eb) else None)
        found = {"index": i, "op": (a or b)["op"], "output": None, "a": a, "b": b,
                 "previous": ea[i - 1] if i else None}
        if a is None or b is None or a["op"] != b["op"] or a.get("inputs") != b.get("inputs") \
                or len(a["outputs"]) != len(b["outputs"]):
            return found
        for k, (oa, ob) in enumerate(zip(a["outputs"], b["outputs"])):
            if oa != ob:
                return {**found, "output": k}
    return None


def _entry(e):
    return f"op #{e['i']} {e['op']} (inputs {e.get('inputs')})" if e else "nothing (the trace ended)"


def main(argv=None):
    try:
        argv = parser().parse_args(argv).traces
        found = diff(*argv)
        (ha, ea), (hb, _) = read(argv[0]), read(argv[1])
    except TraceError as e:
        print(f"optrace.py: error: {e}", file=sys.stderr)
        return 2
    if ha.get("code_digest") != hb.get("code_digest"):
        print("note: the traces were recorded with different code (code digest)")
    if found is None:
        print(f"traces identical ({len(ea)} ops)")
        return 0
    for tag, path, h in (("A", argv[0], ha), ("B", argv[1], hb)):
        print(f"{tag}: {path} on " + ", ".join(f"{k} {v}" for k, v in (h.get("machine") or {}).items()))
    k, a, b = found["output"], found["a"], found["b"]
    if k is not None:
        o = a["outputs"][k]
        print(f"first difference at op #{found['index']} {found['op']} output {k} "
              f"(shape {o['shape']}, {o['dtype']}): A {o['sha256']}, B {b['outputs'][k]['sha256']}")
    else:
        print(f"first difference at op #{found['index']}: the operators differ\n"
              f"  A ran {_entry(a)}\n  B ran {_entry(b)}")
    prev = found["previous"]
    print(f"previous matching op: {_entry(prev)}" if prev else "it is the step's first operator")
    return 1


if __name__ == "__main__":
    sys.exit(main())
