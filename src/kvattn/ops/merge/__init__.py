"""The merge family: exact merges of attention states ``(o, lse)`` (``kvattn.merge``; kernels.py,
plan.py, op.py)."""
