"""The command line a user expects: -h/--help on every tool, train.py's help listing every
config key (default, comment, group, decisive mark), and both spellings of multi-word options
(underscores primary, hyphens kept as aliases). In-process, so it takes a second or two."""
import dataclasses
import re
import sys

import pytest

import audit
import config
import export
import optrace
import prepare
import report
import sample
import train
from tools import bench, lsq_drift


def help_of(main, argv, capsys):
    """stdout of a main() given argv; an argparse --help exits 0."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    assert rc in (0, None)
    return capsys.readouterr().out


@pytest.mark.parametrize("flag", ["-h", "--help"])
@pytest.mark.parametrize("tool", ["audit", "sample", "prepare", "report", "optrace", "lsq_drift", "bench", "export"])
def test_every_tool_answers_help(tool, flag, capsys, monkeypatch):
    if tool == "bench":
        monkeypatch.setattr(sys, "argv", ["bench.py", flag])
        out = help_of(lambda argv: bench.main(), [], capsys)
    else:
        main = {"audit": audit.main, "sample": sample.main, "prepare": prepare.main, "export": export.main,
                "report": report.main, "optrace": optrace.main, "lsq_drift": lsq_drift.main}[tool]
        out = help_of(main, [flag], capsys)
    assert out.startswith("usage:") and len(out.splitlines()) > 3


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_train_help_lists_every_config_key(flag, capsys):
    out = help_of(train.main, ["--max_steps=5", flag], capsys)
    assert out.startswith("usage: train.py")
    defaults = dataclasses.asdict(config.Config())
    keys = re.findall(r"^([* ]) --(\w+)=(\S*)", out, re.M)
    assert [k for _, k, _ in keys] == list(config.FIELDS)               # every key, in config.py's order
    for mark, key, default in keys:
        assert default == str(defaults[key])
        assert (mark == "*") == (key not in config.BOOKKEEPING)          # decisive keys marked
    body = out.split("\n\n", 2)[2]                                      # after the usage paragraphs
    groups = [line for line in body.splitlines() if line and line[0].isalpha()]
    assert groups[:3] == ["run", "model", "batch: a step is micro_batches (N >= 1; the ranks R must divide "
                          "it) x micro_batch_size sequences"]
    flat = " ".join(out.split())                                        # the comments, rewrapped
    assert "grouped-query attention" in flat and "Bookkeeping for the same reason" in flat


def test_audit_spellings_are_aliases():
    for primary, alias, value in (("--check_receipts", "--check-receipts", "r/"),
                                  ("--reveal_salts", "--reveal-salts", "1:4"),
                                  ("--run_dir", "--run", "runs/x"), ("--data_dir", "--data", "d/")):
        a = audit.parse_args([primary, value] + (["--all"] if primary in ("--run_dir", "--data_dir") else []))
        b = audit.parse_args([alias, value] + (["--all"] if primary in ("--run_dir", "--data_dir") else []))
        assert a == b and value in vars(a).values()


def test_prepare_spellings_are_aliases(tmp_path):
    source = tmp_path / "a.txt"
    source.write_text("to be or not to be, that is the question\n" * 200)
    manifests = []
    for val, chunk in (("--val_fraction", "--chunk_bytes"), ("--val-fraction", "--chunk-bytes")):
        out = tmp_path / val
        assert prepare.main(["--input", str(source), "--data_dir", str(out), val, "0.25", chunk, "256"]) == 0
        manifests.append((out / "manifest.json").read_text())
    assert manifests[0] == manifests[1] and '"bytes": 256' in manifests[0]


def test_train_keys_take_either_spelling():
    assert config.parse_config(["--max-steps=7", "--checkpoint-every", "3"]) == \
        config.parse_config(["--max_steps=7", "--checkpoint_every", "3"])
