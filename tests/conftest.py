import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (os.path.dirname(_HERE), _HERE):  # repo root (repops) and tests/ (reference)
    if _p not in sys.path:
        sys.path.insert(0, _p)

import repops  # noqa: E402  (the path above makes it importable)

# Importing repops builds nothing; many tests call torch.ops.repops.* directly, so build and
# load the kernels once, up front (a failed build then fails the run with its one-line reason).
repops.load()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A generated corpus, prepared by data.py (one per test module that asks for it)."""
    from tiny import make_corpus
    return make_corpus(tmp_path_factory.mktemp("corpus"), seed=7, lines=600)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """An uninterrupted tiny run (tiny.STEPS steps, checkpoints every tiny.CKPT_EVERY)."""
    from tiny import train
    return train(tmp_path_factory.mktemp("reference") / "run", corpus)
