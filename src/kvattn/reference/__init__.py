"""Plain-PyTorch implementation of every kvattn function, written from docs/semantics.md for clarity.

It is the CPU backend and the oracle the Triton kernels are tested against. It loops over the
batch in Python and synchronises with the device freely: clarity, not speed.
"""

from .cache import append_paged_kv
from .core import attend, gather_tokens, store_output
from .decode import batch_decode, single_decode
from .merge import merge_states
from .mla import mla_decode
from .prefill import SKIP_SOFTMAX_TILE_M, SKIP_SOFTMAX_TILE_N, context

__all__ = [
    "append_paged_kv",
    "attend",
    "gather_tokens",
    "store_output",
    "batch_decode",
    "single_decode",
    "mla_decode",
    "merge_states",
    "context",
    "SKIP_SOFTMAX_TILE_M",
    "SKIP_SOFTMAX_TILE_N",
]
