"""The maintained benchmarks: each module is one, run from the repository's root as a module,

    python -m bench.kernels --help

with what they share (loading a model, side-by-side timing, the measurement protocols they state, a
tuning run through the CLI, argument parsing) in :mod:`bench.harness`. Each states its variants explicitly
and writes its raw results under ``bench/results/``; ``tests/test_benchmarks.py`` runs every one on a
tiny model. ``dynatune bench`` runs the library's own (replay, live, calibration: ``dynatune/bench/``)."""
