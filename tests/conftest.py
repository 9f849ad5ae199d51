import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (os.path.dirname(_HERE), _HERE):  # repo root (repops) and tests/ (reference)
    if _p not in sys.path:
        sys.path.insert(0, _p)
