"""kvattn: attention kernels for LLM inference, in Python and Triton.

The five public functions keep FlashInfer's signatures; what they compute is stated in
docs/semantics.md.

>>> import kvattn
>>> sorted(n for n in kvattn.__all__ if not n[0].isupper())[:3]
['append_paged_kv_cache', 'batch_invariant', 'cache']
"""

from . import cache, decode, formats, merge, mla, prefill, xqa  # xqa is callable: kvattn.xqa(...) == kvattn.xqa.xqa(...)
from . import distributed
from .cache import append_paged_kv_cache
from .decode import single_decode_with_kv_cache, xqa_batch_decode_with_kv_cache
from .formats import FP4Tensor
from .invariance import batch_invariant, is_batch_invariant, set_batch_invariant
from .merge import merge_state, merge_states
from .mla import xqa_batch_decode_with_kv_cache_mla
from .prefill import trtllm_batch_context_with_kv_cache
from ._version import __version__
from ._warmup import warmup
from ._workspace import workspace_size

__all__ = [
    "cache",
    "decode",
    "distributed",
    "formats",
    "merge",
    "mla",
    "prefill",
    "xqa",
    "xqa_batch_decode_with_kv_cache",
    "single_decode_with_kv_cache",
    "xqa_batch_decode_with_kv_cache_mla",
    "trtllm_batch_context_with_kv_cache",
    "merge_state",
    "merge_states",
    "FP4Tensor",
    "append_paged_kv_cache",
    "warmup",
    "workspace_size",
    "set_batch_invariant",
    "is_batch_invariant",
    "batch_invariant",
]
