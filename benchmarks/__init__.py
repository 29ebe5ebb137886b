"""kvattn's benchmark harness: shape registry, one command (``run.py``), JSON out, a plot."""
