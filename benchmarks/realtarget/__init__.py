"""``benchmarks/real_target.py``, one module per stage family (its docstring says what
each stage does)."""
