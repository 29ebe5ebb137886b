"""Triton kernel families. Importing this package registers their torch ops."""

from .decode import op as _decode  # noqa: F401  (batch_decode, single_decode)
from .prefill import op as _prefill  # noqa: F401  (context)
from .mla import op as _mla  # noqa: F401  (mla_decode)
