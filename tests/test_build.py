"""The kernel build refuses clearly: a missing compiler is one line on stderr, never a traceback."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_missing_compiler_is_one_clear_line():
    env = dict(os.environ, CXX="no-such-compiler")
    proc = subprocess.run([sys.executable, "train.py", "--max_steps=1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0
    assert len(lines) == 1 and "C++17 compiler" in lines[0] and "apt-get install g++" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_build_flags_switch_contraction_off():
    import repops
    assert "-ffp-contract=off" in repops.CPU_FLAGS and "--fmad=false" in repops.CUDA_FLAGS
    assert not any("fast-math" in f and not f.startswith("-fno") for f in repops.CPU_FLAGS)
