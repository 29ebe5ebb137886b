"""The KV-cache append kernel family (``kvattn.cache.append_paged_kv_cache`` on CUDA).

``kernels`` holds the Triton kernel, ``launch`` sizes and launches it, ``op`` registers it as
``torch.ops.kvattn.append_paged_kv``.
"""

from ... import _backend
from .op import append  # noqa: F401

_backend.TRITON_OPS.add("append_paged_kv")
