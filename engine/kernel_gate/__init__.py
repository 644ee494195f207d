"""The compile gate: every planned Triton launch built for its GPU targets, checked for compile
errors, register spills and shared memory (``benchmarks/kernel_gate.py``, ``make test``)."""
