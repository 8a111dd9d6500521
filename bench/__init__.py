"""``make bench``: performance scenarios measured against peers in the same run.

``python -m bench`` writes ``bench-results/bench.json`` and ``bench.md``. Each scenario returns
rows (``bench.report.scenario``) comparing a figure with a peer measured on the same machine and
input, so results are ratios, never absolute timings. This is a benchmark, not a test: it exits
non-zero only when a measurement is invalid (the pass did not find what was planted), not when
a performance goal is missed.
"""
