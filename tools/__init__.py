"""Tools and experiments beside the system: benchmarks, the torch baseline model, analyses.

Run them from the repository root as modules, e.g. `python -m tools.bench`; nothing in the
system's modules imports from here.
"""
