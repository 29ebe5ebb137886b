"""Triton kernel families. Importing this package registers their torch ops."""

from . import decode  # noqa: F401  (batch_decode, single_decode)
from . import prefill  # noqa: F401  (context)
from . import mla  # noqa: F401  (mla_decode)
from .merge import op as _merge  # noqa: F401  (merge_states)
