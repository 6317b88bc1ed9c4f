"""The trace evaluation of docs/evaluation.md: a Kueue + HAMi model that replays the Philly trace
with WDRF and Kueue's own policies. It is not part of the shipped package (the wheel and the
image carry `controller/` only); `bench/trace_eval.py` runs it and tests/unit/test_sim_* test it.
"""
