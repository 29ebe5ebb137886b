"""Triton kernel families, one package each (decode/, prefill/, mla/, append/, merge/), and their
shared pieces (common/); the launch machinery they run on is :mod:`kvattn.runtime`.

Importing this package imports no family: :data:`kvattn.runtime.backend.TRITON_OPS` names the module of
each op's entry point, imported on first use.
"""
