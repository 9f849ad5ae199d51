"""The command line: one convention on every command (config.CommandLine; train.py's keys are the
Config block). Every command answers --help with every option and what it does, without
importing torch; the run is named by --run_dir; one spelling (underscores), no aliases; modes
refuse the options of other modes, from the groups --help shows; bad input is one line.

The commands are found, not listed: every top-level module and every tools/ module with a
`__main__` block is one."""
import dataclasses
import json
import os
import re
import sys
from pathlib import Path

import pytest

import audit
import config
import train
from tiny import ROOT, run_process

COMMANDS = sorted(
    [p.name for p in Path(ROOT).glob("*.py") if 'if __name__ == "__main__"' in p.read_text()]
    + ["tools." + p.stem for p in (Path(ROOT) / "tools").glob("*.py") if 'if __name__ == "__main__"' in p.read_text()])
# Commands that take a run: named by --run_dir in each (data.py's with --bundle).
RUN_COMMANDS = ["train.py", "audit.py", "data.py", "sample.py", "export.py", "report.py", "tools.lsq_drift"]

# Runs a command with --help in a fresh interpreter, as `python X.py` / `python -m tools.X` would,
# and reports its exit status and whether torch got imported.
PROBE = """
import json, runpy, sys
target = sys.argv[1]
sys.argv = [target, "--help"]
try:
    if target.endswith(".py"):
        runpy.run_path(target, run_name="__main__")
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as e:
    code = e.code
sys.stderr.write("\\nPROBE " + json.dumps({"exit": code, "torch": "torch" in sys.modules}))
"""


def run_help(command):
    proc = run_process([sys.executable, "-c", PROBE, command], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    probe = json.loads(proc.stderr.rpartition("PROBE ")[2])
    return proc.stdout, probe


def command_module(command):
    """The imported module of a command (its parser())."""
    import importlib
    return importlib.import_module(command.removesuffix(".py"))


def test_the_commands_are_the_ones_documented():
    assert set(RUN_COMMANDS) <= set(COMMANDS)
    assert {"train.py", "audit.py", "data.py", "sample.py", "export.py", "report.py", "optrace.py",
            "tools.bench", "tools.window_bench", "tools.lsq_drift"} <= set(COMMANDS), COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_help_answers_without_torch(command):
    out, probe = run_help(command)
    assert probe == {"exit": 0, "torch": False}, (command, probe, out[-500:])
    assert out.startswith("usage:"), out[:200]


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "train.py"])
def test_help_says_what_each_option_does(command):
    """Every option of the command's parser has a help text, and --help prints it (and the
    description, whole: it ends a sentence)."""
    parser = command_module(command).parser()
    assert isinstance(parser, config.CommandLine)
    assert parser.description.rstrip().endswith((".", ")")), parser.description
    out, _ = run_help(command)
    flat = " ".join(out.split())
    assert " ".join(parser.description.split()) in flat
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.help and action.help.strip(), f"{command}: {action.dest} has no help"
        shown = action.option_strings[0] if action.option_strings else action.metavar or action.dest
        assert shown in out, f"{command}: {shown} missing from --help"
        text = action.help % dict(vars(action), prog=parser.prog) if "%(" in action.help else action.help
        assert " ".join(text.split()) in flat, f"{command}: the help of {shown} is not printed whole"


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_train_help_lists_every_config_key(flag, capsys):
    rc = train.main(["--max_steps=5", flag])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("usage: train.py")
    defaults = dataclasses.asdict(config.Config())
    keys = re.findall(r"^([* ]) --(\w+)=(\S*)(.*)$", out, re.M)
    assert [k for _, k, _, _ in keys] == list(config.FIELDS)               # every key, in config.py's order
    for mark, key, default, text in keys:
        assert default == str(defaults[key])
        assert (mark == "*") == (key not in config.BOOKKEEPING)          # decisive keys marked
        assert text.strip(), f"--{key} says nothing about what it does"
    body = out.split("\n\n", 2)[2]                                      # after the usage paragraphs
    groups = [line for line in body.splitlines() if line and line[0].isalpha()]
    assert groups[:3] == ["run", "model", "batch: a step is micro_batches (N >= 1; the ranks R must divide "
                          "it) x micro_batch_size sequences"]
    flat = " ".join(out.split())                                        # the comments, rewrapped
    assert "grouped-query attention" in flat and "Bookkeeping for the same reason" in flat


@pytest.mark.parametrize("command", RUN_COMMANDS)
def test_the_run_is_named_by_run_dir(command):
    if command == "train.py":
        assert config.parse_config(["--run_dir", "runs/x"]).run_dir == "runs/x"
        return
    parser = command_module(command).parser()
    dests = {s: a.dest for a in parser._actions for s in a.option_strings}
    assert dests.get("--run_dir") == "run_dir"
    assert not [a.dest for a in parser._actions if not a.option_strings and "run" in a.dest], \
        f"{command} takes a run positionally"


# (command, a line with an alias or a retired spelling): each is refused, one line, exit 2.
ALIASES = [
    ("audit.py", ["--run", "runs/x", "--all"]), ("audit.py", ["--run-dir", "runs/x", "--all"]),
    ("audit.py", ["--data", "d/", "--all"]), ("audit.py", ["--data-dir", "d/", "--all"]),
    ("audit.py", ["--check-receipts", "r/"]), ("audit.py", ["--reveal-salts", "1:4"]),
    ("audit.py", ["--run_d", "runs/x", "--all"]),                   # no abbreviations either
    ("data.py", ["--out", "d/"]), ("data.py", ["--val-fraction", "0.2"]), ("data.py", ["--chunk-bytes", "256"]),
    ("data.py", ["--data-dir", "d/"]),
    ("sample.py", ["--run", "runs/x"]), ("export.py", ["runs/x", "--to", "hf", "--out", "o/"]),
    ("report.py", ["runs/x", "--out", "r.html"]), ("report.py", ["--run_dir", "runs/x", "-o", "r.html"]),
    ("tools.lsq_drift", ["runs/x"]), ("tools.hf_tiny", ["models/x"]),
]


@pytest.mark.parametrize("command, argv", ALIASES)
def test_aliases_are_refused(command, argv, capsys):
    with pytest.raises(SystemExit) as e:
        command_module(command).parser().parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(command_module(command).parser().prog + ": error:"), err


@pytest.mark.parametrize("command, argv, named", [
    ("audit.py", ["--stpe", "5"], "unrecognized option --stpe (did you mean --step?)"),       # not the missing mode
    ("audit.py", ["--step", "x", "--recipt", "r.json"], "unrecognized option --recipt (did you mean --receipt?)"),
    ("sample.py", ["--temprature", "0"], "unrecognized option --temprature (did you mean --temperature?)"),
    ("report.py", ["--out", "r.html", "--compre", "runs/b"], "unrecognized option --compre (did you mean --compare?)"),
])
def test_an_unknown_option_is_named_first_with_the_closest_known_one(command, argv, named, capsys):
    with pytest.raises(SystemExit) as e:
        command_module(command).parser().parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"{command}: error: {named}") and len(err.splitlines()) == 1, err


def test_an_unknown_train_key_is_named_first_with_the_closest_key():
    for argv in (["--max_step=3"], ["--lr=x", "--max_step", "3"], ["--preset=nope", "--max_step=3"]):
        with pytest.raises(config.UsageError, match=re.escape("unknown config key --max_step (did you mean --max_steps?)")):
            config.parse_config(argv)


def test_train_keys_take_one_spelling():
    assert config.parse_config(["--max_steps=7", "--checkpoint_every", "3"]).max_steps == 7
    for argv in (["--max-steps=7"], ["--checkpoint-every", "3"]):
        with pytest.raises(config.UsageError, match="unknown config key"):
            config.parse_config(argv)


@pytest.mark.parametrize("argv, named", [
    (["--step", "3", "--redundancy", "2"], "--redundancy goes with --plan or --coverage"),
    (["--range", "1:2", "--trace", "t.jsonl"], "--trace goes with --step"),
    (["--plan", "--auditors", "3", "--key", "k"], "--key goes with --step"),
    (["--step", "3", "--roster", "r"], "--roster goes with --check_receipts or --coverage or --plan"),
    (["--check_receipts", "r/", "--out", "s.json"], "--out goes with --reveal_salts"),
    (["--anchors", "a.jsonl", "--device", "cpu"], "--device goes with --step or --range or --all or --plan"),
])
def test_audit_options_belong_to_their_modes(argv, named):
    """The refusal is derived from the argument groups --help shows: each group's title names
    the modes whose options it holds."""
    with pytest.raises(config.UsageError, match=re.escape(named)):
        audit.parser().parse_args(argv)
    parser = audit.parser()
    for group in parser.mode_groups:
        titled = {m for m in re.findall(r"--(\w+)", group.group.title)}
        assert titled == set(group.modes), (group.group.title, group.modes)
    assert parser.parse_args(["--plan", "--auditors", "3"]).redundancy == 2      # defaults live in argparse
    assert parser.parse_args(["--step", "3"]).redundancy == 2


def test_data_options_belong_to_their_modes(capsys):
    import data
    for argv, named in ((["--mix", "a=1", "--tokenizer", "gpt2"], "--tokenizer goes with no mode flag or --input"),
                        (["--input", "a.txt", "--step", "3"], "--step goes with --bundle")):
        with pytest.raises(config.UsageError, match=re.escape(named)):
            data.parser().parse_args(argv)
        assert data.main(argv) == 2
        assert capsys.readouterr().err == f"data.py: error: {named}\n"


@pytest.mark.parametrize("argv", [["--operands", "0"], ["--fresh", "0"], ["--rounds", "0"]])
def test_matmul_loop_counts_are_positive(argv):
    """tools.matmul_loop refuses a count below 1 in one line, before it builds anything."""
    proc = run_process([sys.executable, "-m", "tools.matmul_loop", *argv], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "python -m tools.matmul_loop: error: --rounds, --fresh and --operands must be at least 1"], proc.stderr
