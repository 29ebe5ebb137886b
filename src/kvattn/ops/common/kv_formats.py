"""The kernels' ``KV_FORMAT`` constexpr: how a kernel reads a cache's elements.

The codes come from the format table (:mod:`kvattn._formats_table`), the one place that says which
cache dtype is read how; a launcher picks a launch's code with ``KVFormat.code``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..._formats_table import BY_NAME, FORMATS

# Element by element: float16 / bfloat16 as they are (one code: the pointer's dtype tells them
# apart), float8_e4m3fn raw values, NVFP4 (uint8: two e2m1 codes a byte, an e4m3 scale a 16
# elements).
KV_HALF: tl.constexpr = tl.constexpr(BY_NAME["float16"].kernel_code)
KV_FP8: tl.constexpr = tl.constexpr(BY_NAME["fp8"].kernel_code)
KV_NVFP4: tl.constexpr = tl.constexpr(BY_NAME["nvfp4"].kernel_code)
# fp8 again, read as 32-bit words and converted to float16 in registers (GPU only: inline PTX; the
# launcher picks it when every row of the cache is 4-byte aligned). See load_kv_tile.
KV_FP8_WORDS: tl.constexpr = tl.constexpr(BY_NAME["fp8"].words_code)
# NVFP4 again, its codes and block scales read as 32-bit words and converted in registers (GPU
# only: inline PTX; the launcher picks it when every row of codes and of scales is 4-byte aligned,
# D a multiple of 64, and the GPU converts fp8 pairs). See load_kv_tile.
KV_NVFP4_WORDS: tl.constexpr = tl.constexpr(BY_NAME["nvfp4"].words_code)


@triton.constexpr_function
def is_nvfp4(kv_format):
    """Whether a KV_FORMAT is NVFP4, read byte by byte (KV_NVFP4) or as words (KV_NVFP4_WORDS)."""
    return kv_format in (KV_NVFP4.value, KV_NVFP4_WORDS.value)


# KV_FORMAT code -> its format's row of the table (16-bit formats share a code and every fact here).
_BY_CODE = {code: f for f in FORMATS for code in (f.kernel_code, f.words_code) if code is not None}


@triton.constexpr_function
def has_block_scales(kv_format):
    """Whether a KV_FORMAT's cache comes with a tensor of block scales (NVFP4's e4m3 scales)."""
    return _BY_CODE[kv_format].scale_block > 0


@triton.constexpr_function
def element_bits(kv_format):
    """Stored bits of one logical element of a KV_FORMAT's cache (16, 8, 4)."""
    return _BY_CODE[kv_format].element_bits


@triton.constexpr_function
def storage_bytes(kv_format):
    """Bytes of one element of a KV_FORMAT's cache tensor (its dtype's size: strides count these)."""
    return _BY_CODE[kv_format].dtype.itemsize
