"""The Metal kernels on a real Apple GPU (torch's MPS device): the GPU tests of test_cuda.py and
test_cuda_int8.py (and test_window.py's CPU = CUDA check of the window kernels), run on "mps",
plus cross audits. Every test here skips without MPS, saying "needs Apple MPS"; on a Mac,
.ci/mac runs this file (docs/metal.md).

    python -m pytest tests/test_mps.py -q

Ported, not copied: tests/test_cuda.py and tests/test_cuda_int8.py are loaded a second time as
the modules test_cuda_on_mps / test_cuda_int8_on_mps with their device under test (DEV) set to
"mps" and their GPU mark skipping without MPS, and their GPU tests are collected here: every op
on MPS tensors gives the CPU op's bits (random, awkward-size and adversarial inputs, the int8
GEMM and LSQ), the self-test's golden digests, a training run on MPS whose chain and checkpoints
are byte-identical to the CPU run's (float and --quant=int8). Left out, as CUDA-only: the nvcc,
PTX and binding compile checks, CUDA-graph stream capture and torchrun with NCCL. Added: cross audits (a run trained on
MPS replayed on the CPU, and one trained on the CPU replayed on MPS) and sampling on MPS.
"""
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from tiny import run_process

ROOT = Path(__file__).resolve().parent.parent
NO_MPS = "hardware: needs Apple MPS (an Apple GPU)"
needs_mps = pytest.mark.skipif(not torch.backends.mps.is_available(), reason=NO_MPS)


def _port(name, path, replacements):
    """Load tests/<path> again as module `name` with each line matching a (regex, new line)
    replaced (each must match once): the same tests on another device, no second copy of them."""
    src = path.read_text()
    for pattern, new in replacements:
        src, n = re.subn(pattern, new, src, flags=re.M)
        assert n == 1, f"{path.name}: {pattern!r} matched {n} times: update tests/test_mps.py"
    mod = types.ModuleType(name)
    mod.__file__ = str(path)
    sys.modules[name] = mod
    exec(compile(src, str(path), "exec"), mod.__dict__)
    return mod


_cuda = _port("test_cuda_on_mps", ROOT / "tests" / "test_cuda.py", [
    (r'^DEV = "cuda".*$', 'DEV = "mps"'),
    (r"^needs_gpu = pytest\.mark\.skipif\(not torch\.cuda\.is_available\(\).*$",
     f"needs_gpu = pytest.mark.skipif(not torch.backends.mps.is_available(), reason={NO_MPS!r})")])
_int8 = _port("test_cuda_int8_on_mps", ROOT / "tests" / "test_cuda_int8.py", [
    (r"^from test_cuda import (.*)$", r"from test_cuda_on_mps import \1")])
_window = _port("test_window_on_mps", ROOT / "tests" / "test_window.py", [
    (r"^@pytest\.mark\.skipif\(not torch\.cuda\.is_available\(\).*$",
     f"@pytest.mark.skipif(not torch.backends.mps.is_available(), reason={NO_MPS!r})"),
    (r"^def test_window_kernels_cpu_equals_cuda\(", "def test_window_kernels_cpu_equals_mps("),
    (r"^(\s+gpu = .*)\.cuda\(\)(.*)$", r'\1.to("mps")\2'),
    (r"^(\s+)assert gpu\.is_cuda$", r"\1assert gpu.is_mps")])

CUDA_ONLY = {"test_kernels_launch_on_the_current_stream", "test_torchrun_nccl_two_ranks_equals_cpu_chain"}
FIXTURES = {"ops", "cpu_digests", "corpus", "cpu_chain", "cpu_int8_chain"}
for _mod in (_cuda, _int8, _window):
    for _name, _obj in vars(_mod).items():
        gpu_test = _name.startswith("test_") and _name not in CUDA_ONLY and any(
            m.name == "skipif" and "MPS" in str(m.kwargs.get("reason", "")) for m in getattr(_obj, "pytestmark", []))
        if gpu_test or (_name in FIXTURES and _name not in globals()):
            globals()[_name] = _obj

_train, RUN_FLAGS = _cuda._train, _cuda.RUN_FLAGS


def _audit(run_dir, device, step):
    r = run_process([sys.executable, str(ROOT / "audit.py"), f"--run_dir={run_dir}", f"--step={step}",
                     f"--device={device}"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def mps_run(corpus, tmp_path_factory):  # noqa: F811 - the ported fixture
    work = tmp_path_factory.mktemp("mps_run")
    _train(work, corpus, "--device=mps")
    return work / "run"


@needs_mps
@pytest.mark.parametrize("step", [1, 5])
def test_mps_run_audits_on_the_cpu(mps_run, step):
    assert "MATCH" in _audit(mps_run, "cpu", step)


@needs_mps
@pytest.mark.parametrize("step", [1, 5])
def test_cpu_run_audits_on_mps(corpus, tmp_path, step):  # noqa: F811
    _train(tmp_path, corpus, "--threads=1")
    assert "MATCH" in _audit(tmp_path / "run", "mps", step)


@needs_mps
def test_sampling_on_mps_gives_the_cpu_text(mps_run):
    def sample(device):
        r = run_process([sys.executable, str(ROOT / "sample.py"), f"--run_dir={mps_run}", "--tokens=40", "--seed=3",
                         f"--device={device}"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        return r.stdout
    assert sample("mps") == sample("cpu")


@needs_mps
def test_compile_shader_compiles_with_fast_math_off():
    """repops_mps.COMPILER_PROBE on this Mac's compile_shader: no __FAST_MATH__, NaN != NaN, and
    a * (b * 2^24) not reassociated (the product flush depends on it); .ci/mac prints the same line."""
    import repops_mps
    print(repops_mps.check_fast_math_off())


def test_mps_is_refused_with_one_line_where_absent(corpus, tmp_path):  # noqa: F811
    """Without MPS (every CI machine): --device mps is one line and exit 2, no traceback."""
    if torch.backends.mps.is_available():
        pytest.skip("hardware: this machine has MPS, so --device mps is accepted here")
    for script, args in (("train.py", [f"--data_dir={corpus}", f"--run_dir={tmp_path / 'run'}", "--max_steps=1"]),
                         ("sample.py", [f"--run_dir={tmp_path / 'run'}"])):
        r = run_process([sys.executable, str(ROOT / script), "--device=mps", *args], capture_output=True, text=True,
                        timeout=300)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "error:" in r.stderr, (script, r.stderr)
        assert "MPS" in r.stderr or "mps" in r.stderr
    assert not (tmp_path / "run").exists()
