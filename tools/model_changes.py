"""The model changes of docs/changing-the-model.md, as a researcher makes them, for the benchmark
and the tests: examples/edits/<name>.diff applied to model.py (what `git apply` does), and
examples/nanogpt_model.py, a whole model in place of model.py.

    import tools.model_changes as MC
    MC.CHANGES                                  # the diffs' names: gelu_mlp, layernorm, gated_attention
    text = MC.model_source("gelu_mlp")          # model.py with examples/edits/gelu_mlp.diff applied
    text = MC.model_source("nanogpt")           # examples/nanogpt_model.py
    with MC.model_in_place("layernorm"):        # train.py's TrainState builds that model meanwhile
        state = train.TrainState(cfg, vocab_size)
    MC.apply_diff(text, diff)                   # ValueError unless every hunk applies exactly once

In this process model_in_place loads the source as a module beside the repository's own model.py
(train.py's code digest still hashes the file on disk): for measurements and in-process checks.
A run that is published, or audited, needs the change in model.py itself, as the tests'
temporary copies of the repository have it (tests/test_changed_models.py).
"""
import contextlib
import re
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EDITS = ROOT / "examples" / "edits"
CHANGES = ("gelu_mlp", "layernorm", "gated_attention")
FOREIGN = "nanogpt"
HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")


def diff_text(name):
    return (EDITS / f"{name}.diff").read_text()


def apply_diff(text, diff):
    """text with the unified diff `diff` (one file's: ---/+++ headers, then hunks) applied. Each
    hunk's old lines (context and '-') must occur exactly once in text; they become its new lines
    (context and '+'). ValueError otherwise: the diff was made for another model.py."""
    hunks, current = [], None
    for line in diff.splitlines(keepends=True):
        if HUNK.match(line):
            current = ([], [])
            hunks.append(current)
        elif current is not None and line[:1] in (" ", "-", "+"):
            if line[0] != "+":
                current[0].append(line[1:])
            if line[0] != "-":
                current[1].append(line[1:])
        elif current is not None and line.strip():
            raise ValueError(f"not a line of a unified diff hunk: {line!r}")
    if not hunks:
        raise ValueError("no hunk in the diff")
    for old, new in hunks:
        old, new = "".join(old), "".join(new)
        if text.count(old) != 1:
            raise ValueError(f"a hunk's lines occur {text.count(old)} times in model.py, not once:\n{old}")
        text = text.replace(old, new)
    return text


def model_source(name):
    """The source of model.py after the change `name` (a diff of CHANGES, or FOREIGN)."""
    if name == FOREIGN:
        return (ROOT / "examples" / "nanogpt_model.py").read_text()
    return apply_diff((ROOT / "model.py").read_text(), diff_text(name))


def load_model_module(name):
    """The changed model.py as a module of its own (named model_<name>), the repository's untouched."""
    module = types.ModuleType(f"model_{name}")
    module.__file__ = str(ROOT / "examples" / f"model_{name}.py")
    sys.modules[module.__name__] = module          # dataclasses look their module up
    exec(compile(model_source(name), module.__file__, "exec"), module.__dict__)
    return module


@contextlib.contextmanager
def model_in_place(name):
    """train.py's model is the changed one inside the block (None: the repository's model.py)."""
    import train
    saved = train.Llama, train.ModelConfig, train.param_shapes
    if name is not None:
        module = load_model_module(name)
        train.Llama, train.ModelConfig, train.param_shapes = module.Llama, module.ModelConfig, module.param_shapes
    try:
        yield
    finally:
        train.Llama, train.ModelConfig, train.param_shapes = saved
