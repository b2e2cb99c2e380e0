"""The benchmarks behind ``dynatune bench``: recorded traces, their replay, the live scheduler benchmark, and
the belief calibration. Research code: nothing in a tuning run imports it."""
