"""README.md and docs/*.md work as written: every fenced block marked runnable (info string
"sh runnable") runs line by line from the repository root and exits 0; every block marked as a
transcript (info string "text transcript") prints what it shows; every relative link resolves to
a file (and its #anchor to a heading there); every path in backticks names a file that exists (a
`tests/x.py::name` also names a definition in it).

To mark a block, open it with ```` ```sh runnable ```` or ```` ```text transcript ````; keep such
blocks to the tiny config (this test's whole budget is about a minute). What they write must lie
under TOUR (git-ignored directories), which the test removes before and after each document.

A transcript is a terminal session: a line `$ COMMAND` (continued over lines that end in a
backslash, or while a quote is open), then the lines it prints, stdout and stderr together. A
document's transcripts run in order, so a later command may read what an earlier one wrote. The
printed lines are compared with the shown ones after VOLATILE fields (times, rates, memory sizes)
are masked on both sides; a shown line `...` stands for any number of lines, and `...` inside a
line for any text (a record hash under a fresh secret, lines that are not the point). Exact
results (state hashes, manifest digests, sampled text, losses) are compared as printed, so a
transcript whose command now prints something else fails, with a diff of the two.
"""
import difflib
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiny import run_process

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "SPEC.md", ROOT / "kernels" / "README.md", ROOT / "dev" / "cuda" / "README.md",
        ROOT / "dev" / "LOG.md", *sorted((ROOT / "docs").glob("*.md"))]
TOUR = [ROOT / "runs" / "tour", ROOT / "runs" / "tour-more", ROOT / "data" / "tour", ROOT / "out" / "tour"]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"(?<!`)`([^`\s]+)`(?!`)")
# A backticked token is taken for a repository path when it has a slash or is a .py/.md file,
# and is not a place a command writes or an example name.
PATHLIKE = re.compile(r"^(?:[\w.-]+/)*[\w.-]+(?:\.(?:py|md|h|cpp|cu|cuh|png|txt|sh)|/)(?:::\w+)?$")
NOT_REPO = ("runs/", "data/", "out/", "/", "~", "text/", "receipts/", "published/", "alice/", "r.json")
# What a transcript's command prints that differs between runs and machines: a duration (13600 ms,
# 0.7s, 4m18s, 1h05m), a rate (10285 tok/s, 135 MB/s, 0.5M tokens/s), a memory size (252 MiB).
VOLATILE = re.compile(r"\b\d[\d.,]*(?:h\d+m|m\d+s|\s?(?:ms|s|min|[KMG]iB|[kMG]B(?:/s)?|M?\s?(?:tok|tokens)/s))(?![\w/])")


SOURCES = {}
for _p in [*ROOT.glob("*.py"), *(ROOT / "kernels").rglob("*"), *(ROOT / "dev").rglob("*"), *(ROOT / "tools").glob("*.py"), *(ROOT / "tests").glob("*.py")]:
    SOURCES.setdefault(_p.name, []).append(_p)


def slug(heading):
    """GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


def runnable_lines():
    lines = []
    for doc in DOCS:
        for info, body in FENCE.findall(doc.read_text()):
            if "runnable" in info.split():
                lines += [(doc.relative_to(ROOT), line) for line in body.splitlines()
                          if line.strip() and not line.lstrip().startswith("#")]
    return lines


def test_there_are_runnable_commands():
    assert len(runnable_lines()) >= 5


def clean_tour():
    for path in TOUR:
        shutil.rmtree(path, ignore_errors=True)


def test_runnable_commands_run():
    clean_tour()
    try:
        for doc, line in runnable_lines():
            argv = shlex.split(line)
            if argv[0] in (".venv/bin/python", "python"):
                argv[0] = sys.executable
            proc = run_process(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, f"{doc}: {line}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        assert (ROOT / "out" / "tour" / "report.html").exists()
    finally:
        clean_tour()


def transcripts(doc):
    """[(command, shown output lines)] of the doc's transcript blocks, in order."""
    out = []
    for info, body in FENCE.findall(doc.read_text()):
        if "transcript" not in info.split():
            continue
        lines = body.splitlines()
        while lines:
            assert lines[0].startswith("$ "), f"{doc.name}: a transcript line outside a command: {lines[0]!r}"
            command = lines.pop(0)[2:]
            while command.endswith("\\") or not shell_words(command):
                assert lines, f"{doc.name}: unfinished command {command!r}"
                command = command + "\n" + lines.pop(0)
            shown = []
            while lines and not lines[0].startswith("$ "):
                shown.append(lines.pop(0))
            out.append((command, shown))
    return out


def shell_words(command):
    """The command's words, as a POSIX shell splits them (a backslash-newline joins lines); []
    while a quote is still open."""
    try:
        return shlex.split(command.replace("\\\n", " "))
    except ValueError:
        return []


def masked(line):
    return VOLATILE.sub("#", line.rstrip())


def matches(shown, printed):
    """Whether the printed lines are what the shown ones say, VOLATILE fields masked; a shown
    line "..." stands for any lines, and "..." inside a line for any text."""
    pattern = "".join(r"(?:[^\n]*\n)*?" if line.strip() == "..." else
                      ".*?".join(map(re.escape, masked(line).split("..."))) + r"\n" for line in shown)
    return re.fullmatch(pattern, "".join(masked(line) + "\n" for line in printed)) is not None


def test_transcript_matcher_can_fail():
    shown = ["step 10 | loss 5.3577 | 8 ms | 8399 tok/s | ETA 0s | state f889ca8d61c7", "...",
             "MATCH: steps 5..5 (step 5: ...)"]
    printed = ["step 10 | loss 5.3577 | 14 ms | 4647 tok/s | ETA 1m02s | state f889ca8d61c7",
               "audit: steps up to 4 match", "MATCH: steps 5..5 (step 5: 984f723ff3b7)"]
    assert matches(shown, printed)
    assert matches(shown, [printed[0], printed[2]])                    # "..." may stand for no line
    assert not matches(shown, [printed[0].replace("f889", "f888"), *printed[1:]])   # a state hash
    assert not matches(shown, [printed[0].replace("5.3577", "5.3578"), *printed[1:]])   # a loss
    assert not matches(shown, printed[:2])                             # a line missing at the end
    assert not matches(shown, [*printed, "one more line"])


def test_there_are_transcripts():
    assert sum(len(transcripts(doc)) for doc in DOCS) >= 5


@pytest.mark.parametrize("doc", [d for d in DOCS if transcripts(d)], ids=lambda p: str(p.relative_to(ROOT)))
def test_transcripts_match_what_the_commands_print(doc):
    clean_tour()
    try:
        for command, shown in transcripts(doc):
            argv = shell_words(command)
            if argv[0] in (".venv/bin/python", "python"):
                argv[0] = sys.executable
            proc = run_process(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=300, env=dict(os.environ, PYTHONUNBUFFERED="1"))
            printed = proc.stdout.splitlines()
            if not matches(shown, printed):
                diff = "\n".join(difflib.unified_diff([masked(x) for x in shown], [masked(x) for x in printed],
                                                      "shown", "printed", lineterm=""))
                pytest.fail(f"{doc.name}: $ {command}\nprints something else than the transcript shows "
                            f"(volatile fields masked as #):\n{diff}")
    finally:
        clean_tour()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(doc):
    text = FENCE.sub("", doc.read_text())
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        assert path.exists(), f"{doc.name}: link to {target}: no such file"
        if anchor:
            assert anchor in anchors(path), f"{doc.name}: link to {target}: no such heading"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_paths_exist(doc):
    missing = []
    for token in CODE.findall(doc.read_text()):
        if not PATHLIKE.match(token) or token.startswith(NOT_REPO) or re.fullmatch(r"[\w.-]+/", token):
            continue            # a bare directory name (`checkpoints/`, `bin/`) is no repository path
        file, _, name = token.partition("::")
        # a bare file name may name a file deeper down (`contract.h` for kernels/cpu/contract.h)
        near = [ROOT / file, doc.parent / file] + ([] if "/" in file else SOURCES.get(file, []))
        path = next((p for p in near if p.exists()), None)
        if path is None:
            missing.append(token)
        elif name and not re.search(rf"^\s*(?:def|class) {name}\b", path.read_text(), re.M):
            missing.append(token)
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"
