"""The REPOPS_STRICT=1 rule of tests/conftest.py, checked on generated test files.

    python -m pytest tests/test_conftest.py -q

Six small test files, each skipping in one of the ways pytest allows (a module-level
importorskip, a module-level skip with and without a hardware reason, a module skipif mark, a
test's skipif mark with a hardware reason) and one that passes, run by pytest in a subprocess
with this project's hooks, with and without REPOPS_STRICT=1: under the flag every skip whose
reason does not start with "hardware: " fails, at collection as at run time; without it they stay
skips.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tiny import TIMEOUT

HERE = Path(__file__).resolve().parent

FILES = {
    "test_importorskip.py": """
        import pytest
        pytest.importorskip("repops_no_such_module")
        def test_never_runs(): pass
    """,
    "test_module_skip_tool.py": """
        import pytest
        pytest.skip("no riscv64 cross compiler", allow_module_level=True)
        def test_never_runs(): pass
    """,
    "test_module_skip_hardware.py": """
        import pytest
        pytest.skip("hardware: no Apple GPU here", allow_module_level=True)
        def test_never_runs(): pass
    """,
    "test_skipif_tool.py": """
        import pytest
        pytestmark = pytest.mark.skipif(True, reason="qemu-user is not installed")
        def test_marked(): pass
    """,
    "test_skipif_hardware.py": """
        import pytest
        @pytest.mark.skipif(True, reason="hardware: no CUDA GPU on this machine")
        def test_marked(): pass
    """,
    "test_runs.py": """
        def test_passes(): pass
    """,
}
# The generated folder's conftest.py takes this project's hooks (under another module name:
# pytest imports the generated one as "conftest").
CONFTEST = f"""
import importlib.util
_spec = importlib.util.spec_from_file_location("repops_conftest", {str(HERE / "conftest.py")!r})
_rules = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_rules)
globals().update({{name: hook for name, hook in vars(_rules).items() if name.startswith("pytest_")}})
"""


def outcomes(tmp_path, strict):
    """{file: outcome} of one pytest run over the generated files, and its exit code."""
    for name, text in FILES.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    (tmp_path / "conftest.py").write_text(CONFTEST)
    env = {k: v for k, v in os.environ.items() if k != "REPOPS_STRICT"}
    env["COLUMNS"] = "1000"                                # whole reasons in the short summary
    if strict:
        env["REPOPS_STRICT"] = "1"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    found = {}
    for line in proc.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "SKIPPED", "ERROR"):
            name = next(n for n in FILES if n in rest)
            assert name not in found, proc.stdout
            found[name] = (word, rest)
    return found, proc


def test_strict_fails_every_skip_without_a_hardware_reason(tmp_path):
    found, proc = outcomes(tmp_path, strict=True)
    # a skipif mark fails in the test's setup: pytest reports that as an ERROR
    assert {n: w for n, (w, _) in found.items()} == {
        "test_importorskip.py": "FAILED", "test_module_skip_tool.py": "FAILED", "test_skipif_tool.py": "ERROR",
        "test_module_skip_hardware.py": "SKIPPED", "test_skipif_hardware.py": "SKIPPED", "test_runs.py": "PASSED",
    }, proc.stdout + proc.stderr
    assert proc.returncode == 1
    assert "::skipped_at_collection" in found["test_importorskip.py"][1]
    assert "repops_no_such_module" in found["test_importorskip.py"][1]
    assert "no riscv64 cross compiler" in found["test_module_skip_tool.py"][1]
    assert "qemu-user is not installed" in found["test_skipif_tool.py"][1]


def test_without_the_flag_skips_stay_skips(tmp_path):
    found, proc = outcomes(tmp_path, strict=False)
    assert {n: w for n, (w, _) in found.items()} == {n: "PASSED" if n == "test_runs.py" else "SKIPPED" for n in FILES}, \
        proc.stdout + proc.stderr
    assert proc.returncode == 0
