"""Triton kernel families, one package each (decode/, prefill/, mla/, append/), their shared
``@triton.jit`` pieces (common/) and launch machinery (launch/).

Importing this package imports no family: :data:`kvattn.runtime.backend.TRITON_OPS` names the module of
each op's entry point, imported on first use.
"""
