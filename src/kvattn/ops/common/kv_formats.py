"""The kernels' ``KV_FORMAT`` constexpr: how a kernel reads a cache's elements.

The codes come from the format table (:mod:`kvattn._formats`), which is the one place that says
which cache dtype reads how; the launchers pick a code with :func:`kvattn._formats.kernel_code`.
"""

from __future__ import annotations

import triton
import triton.language as tl


# Cache element formats (the KV_FORMAT constexpr).
KV_HALF: tl.constexpr = tl.constexpr(0)  # float16 / bfloat16


KV_FP8: tl.constexpr = tl.constexpr(1)  # float8_e4m3fn raw values


KV_NVFP4: tl.constexpr = tl.constexpr(2)  # uint8, two e2m1 codes a byte, e4m3 scale per 16 elements


# fp8 again, read as 32-bit words and converted to float16 in registers (GPU only: inline PTX; the
# launcher picks it when every row of the cache is 4-byte aligned). See load_kv_tile.
KV_FP8_WORDS: tl.constexpr = tl.constexpr(3)


# NVFP4 again, its codes and block scales read as 32-bit words and converted in registers (GPU
# only: inline PTX; the launcher picks it when every row of codes and of scales is 4-byte aligned,
# D a multiple of 64, and the GPU converts fp8 pairs). See load_kv_tile.
KV_NVFP4_WORDS: tl.constexpr = tl.constexpr(4)


@triton.constexpr_function
def is_nvfp4(kv_format):
    """Whether a KV_FORMAT is NVFP4, read byte by byte (KV_NVFP4) or as words (KV_NVFP4_WORDS)."""
    return kv_format in (KV_NVFP4.value, KV_NVFP4_WORDS.value)
