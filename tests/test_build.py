"""The kernel build refuses clearly: a missing compiler is one line on stderr, never a traceback."""
import os
import sys

import pytest

from tiny import run_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("prog", ["train.py", "audit.py", "sample.py"])
def test_missing_compiler_is_one_clear_line(reference, corpus, tmp_path, prog):
    """With a corpus and a run present, the first kernel use is the build: without a compiler
    each tool prints one line, exits 2, and (train.py) creates no run directory."""
    env = dict(os.environ, CXX="no-such-compiler")
    args = {"train.py": [f"--run_dir={tmp_path / 'run'}", f"--data_dir={corpus}", "--max_steps=1"],
            "audit.py": ["--run_dir", str(reference), "--step", "1"],
            "sample.py": ["--run_dir", str(reference), "--tokens", "3"]}[prog]
    proc = run_process([sys.executable, prog, *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:"), proc.stderr
    assert "C++17 compiler" in lines[0] and "apt-get install g++" in lines[0], proc.stderr
    assert not (tmp_path / "run").exists()


def test_build_flags_switch_contraction_off():
    """The build that was loaded (its build.ninja, what the compiler was given), not the flag list."""
    import repops
    name = "repops_cuda" if repops.HAS_CUDA else "repops_cpu"
    with open(os.path.join(ROOT, "build", f"{name}_{repops._cpu_isa_tag()}", "build.ninja")) as f:
        rules = dict(line.split(" = ", 1) for line in f.read().splitlines() if " = " in line)
    cpu = rules["cflags"].split()
    assert "-ffp-contract=off" in cpu and "-fno-fast-math" in cpu, rules["cflags"]
    assert not any(f in ("-ffast-math", "-Ofast", "-ffp-contract=fast") for f in cpu), rules["cflags"]
    if repops.HAS_CUDA:
        cuda = rules["cuda_cflags"].split()
        assert "--fmad=false" in cuda and "-ftz=true" in cuda and "--use_fast_math" not in cuda, rules["cuda_cflags"]


def test_a_stopped_build_leaves_no_lock_that_hangs_the_next(tmp_path, capsys):
    """torch's build lock (the file `lock` in the build directory), left behind by a build that
    was killed, is removed under repops.build_lock instead of hanging the next build. Checked on
    a directory of its own: the shared build directory is in use by the suite's other processes."""
    import repops
    (tmp_path / "lock").write_text("")
    with repops.build_lock(str(tmp_path)):
        assert not (tmp_path / "lock").exists()
    assert capsys.readouterr().err == f"repops: removed {tmp_path / 'lock'}, left by a kernel build that was stopped\n"
    with repops.build_lock(str(tmp_path)):          # nothing left behind: nothing to say
        pass
    assert capsys.readouterr().err == ""


def test_the_kernel_build_holds_the_build_lock():
    """repops.load() builds (or checks the build) inside build_lock on its build directory."""
    import repops
    name = "repops_cuda" if repops.HAS_CUDA else "repops_cpu"
    spy = ("import contextlib, repops\n"
           "real, seen = repops.build_lock, []\n"
           "@contextlib.contextmanager\n"
           "def spied(d):\n"
           "    with real(d):\n"
           "        seen.append(d)\n"
           "        yield\n"
           "repops.build_lock = spied\n"
           "repops.load()\n"
           "print(seen)\n")
    proc = run_process([sys.executable, "-c", spy], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == repr([os.path.join(ROOT, "build", f"{name}_{repops._cpu_isa_tag()}")]), proc.stdout
