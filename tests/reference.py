"""The NumPy reference of every kernel: the arithmetic contract in NumPy, which lives in
tests/numpy_contract.py (the first half of the NumPy replay, its one home) and is re-exported
here for the kernel tests.

    import reference as ref
    ref.rmsnorm(x, w, eps)        # the same function as numpy_contract.rmsnorm
"""
from numpy_contract import *  # noqa: F401,F403  (every public name of the contract)
from numpy_contract import _sincos  # noqa: F401  (test_kernels checks the shared sin/cos core)
from numpy_window import *  # noqa: F401,F403  (the window attention kernels, §8)
from numpy_exact import *  # noqa: F401,F403  (the exact matmul, §11)
from numpy_int8_pv import *  # noqa: F401,F403  (int8 P·V, §10)
