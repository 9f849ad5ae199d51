"""The kernel build refuses clearly: a missing compiler is one line on stderr, never a traceback."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("prog", ["train.py", "audit.py", "sample.py"])
def test_missing_compiler_is_one_clear_line(reference, corpus, tmp_path, prog):
    """With a corpus and a run present, the first kernel use is the build: without a compiler
    each tool prints one line, exits 2, and (train.py) creates no run directory."""
    env = dict(os.environ, CXX="no-such-compiler")
    args = {"train.py": [f"--run_dir={tmp_path / 'run'}", f"--data_dir={corpus}", "--max_steps=1"],
            "audit.py": ["--run_dir", str(reference), "--step", "1"],
            "sample.py": ["--run_dir", str(reference), "--tokens", "3"]}[prog]
    proc = subprocess.run([sys.executable, prog, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:"), proc.stderr
    assert "C++17 compiler" in lines[0] and "apt-get install g++" in lines[0], proc.stderr
    assert not (tmp_path / "run").exists()


def test_build_flags_switch_contraction_off():
    import repops
    assert "-ffp-contract=off" in repops.CPU_FLAGS and "--fmad=false" in repops.CUDA_FLAGS
    assert not any("fast-math" in f and not f.startswith("-fno") for f in repops.CPU_FLAGS)
