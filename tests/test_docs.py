"""README.md and docs/*.md work as written: every fenced block marked runnable (info string
"sh runnable") runs line by line from the repository root and exits 0; every relative link
resolves to a file (and its #anchor to a heading there); every path in backticks names a file
that exists (a `tests/x.py::name` also names a definition in it).

To mark a block, open it with ```` ```sh runnable ````; keep such blocks to the tiny config
(this test's whole budget is about a minute). What they write must lie under TOUR (git-ignored
directories), which the test removes before and after.
"""
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from tiny import run_process

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "SPEC.md", ROOT / "kernels" / "README.md", ROOT / "dev" / "cuda" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]
TOUR = [ROOT / "runs" / "tour", ROOT / "runs" / "tour-more", ROOT / "data" / "tour", ROOT / "out" / "tour"]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"(?<!`)`([^`\s]+)`(?!`)")
# A backticked token is taken for a repository path when it has a slash or is a .py/.md file,
# and is not a place a command writes or an example name.
PATHLIKE = re.compile(r"^(?:[\w.-]+/)*[\w.-]+(?:\.(?:py|md|h|cpp|cu|cuh|png|txt|sh)|/)(?:::\w+)?$")
NOT_REPO = ("runs/", "data/", "out/", "/", "~", "text/", "receipts/", "published/", "alice/", "r.json")


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


def test_runnable_commands_run():
    for path in TOUR:
        shutil.rmtree(path, ignore_errors=True)
    try:
        for doc, line in runnable_lines():
            argv = shlex.split(line)
            if argv[0] in (".venv/bin/python", "python"):
                argv[0] = sys.executable
            proc = run_process(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, f"{doc}: {line}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        assert (ROOT / "out" / "tour" / "report.html").exists()
    finally:
        for path in TOUR:
            shutil.rmtree(path, ignore_errors=True)


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
