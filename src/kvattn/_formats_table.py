"""The cache formats kvattn reads, one row each: the one place that says what a format is.

Every other module reads this table: validation (which cache dtypes are accepted, the stored last
dim), the launchers (the kernels' ``KV_FORMAT`` code, whether the cache may be read as 32-bit
words, bytes a token), the config tables (:attr:`KVFormat.config_key`), the plain-PyTorch
reference (:attr:`KVFormat.dequantize`) and the test caches (:attr:`KVFormat.quantize`).
``docs/extending.md`` says what else a new format needs (a branch of the kernels' dequant piece,
``ops/common/dequant.py``; the float64 oracle's decoder; tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .formats import FP8_DTYPE, NVFP4_BLOCK, dequantize_nvfp4, quantize_fp8, quantize_nvfp4


def _as_float32(data: torch.Tensor, scales: Optional[torch.Tensor]) -> torch.Tensor:
    return data.to(torch.float32)


def _to(dtype: torch.dtype) -> Callable:
    def quantize(values: torch.Tensor):
        return values.to(dtype), None

    return quantize


def _fp8(values: torch.Tensor):
    return quantize_fp8(values), None


@dataclass(frozen=True)
class KVFormat:
    """One cache format.

    Attributes
    ----------
    name : str
        What the API and the tools call it (``PagedKV.kv_format``, ``make_paged_kv(kv_format=...)``).
    dtype : torch.dtype
        The cache tensor's dtype; one format a dtype.
    element_bits : int
        Stored bits of one logical element (a cache row holds ``head_dim * element_bits / 8`` bytes).
    scale_block : int
        Logical elements that share one block scale (a separate ``kv_cache_sf`` tensor); 0: no
        block scales.
    scale_dtype : torch.dtype or None
        The block scales' dtype (NVFP4: float8_e4m3fn).
    kernel_code : int
        The kernels' ``KV_FORMAT`` when they read the cache element by element
        (``ops/common/kv_formats.py`` names the codes; ``ops/common/dequant.py`` reads each).
    words_code : int or None
        The ``KV_FORMAT`` of reading the same cache as aligned 32-bit words converted in registers
        (inline PTX, compiled kernels only), or None when the format has no such path.
    config_key : str
        The key of the format in the kernel families' config tables (formats with the same key
        share measured entries and the register / shared-memory estimates).
    quantize : callable
        ``values float32 [..., D] -> (data [..., D * element_bits / 8 / itemsize], block scales or
        None)``: how test and benchmark caches are made from float values.
    dequantize : callable
        ``(data, block scales or None) -> float32 [..., D]``: the values the kernels must see (raw
        fp8 values: the caller's scale arguments fold any fp8 scale).
    """

    name: str
    dtype: torch.dtype
    element_bits: int
    scale_block: int
    scale_dtype: Optional[torch.dtype]
    kernel_code: int
    words_code: Optional[int]
    config_key: str
    quantize: Callable
    dequantize: Callable

    def stored_dim(self, head_dim: int) -> int:
        """The cache's last dim for ``head_dim`` logical elements (NVFP4: two a byte)."""
        return head_dim * self.element_bits // (8 * self.dtype.itemsize)

    def row_bytes(self, head_dim: int) -> float:
        """Cache bytes of one token's ``head_dim`` vector of one head, block scales included."""
        scales = head_dim / self.scale_block if self.scale_block else 0
        return head_dim * self.element_bits / 8 + scales

    def words_readable(self, strides: tuple, head_dim: int, sf_strides: tuple = ()) -> bool:
        """Whether every 32-bit word load of the words path is aligned, given 4-byte aligned base
        pointers: the cache's ``strides`` (elements) and a row's bytes multiples of 4, and so for
        the block scales' ``sf_strides`` (one byte each) and a row of ``head_dim / scale_block``
        scales."""
        if self.words_code is None:
            return False
        item = self.dtype.itemsize
        if not all(s * item % 4 == 0 for s in strides) or (head_dim * self.element_bits // 8) % 4:
            return False
        if self.scale_block:
            return all(s % 4 == 0 for s in sf_strides) and (head_dim // self.scale_block) % 4 == 0
        return True

    def code(self, words_ok: bool, strides: tuple, head_dim: int, sf_strides: tuple = ()) -> int:
        """The kernels' ``KV_FORMAT`` for a launch: the words path where the launch allows it
        (``words_ok``: compiled, 4-byte aligned bases, a GPU that converts fp8 pairs) and
        :meth:`words_readable` holds, else element by element."""
        if words_ok and self.words_readable(strides, head_dim, sf_strides):
            return self.words_code
        return self.kernel_code


_HALF = dict(element_bits=16, scale_block=0, scale_dtype=None, kernel_code=0, words_code=None, config_key="half",
             dequantize=_as_float32)
FORMATS: tuple[KVFormat, ...] = (
    KVFormat("float16", torch.float16, quantize=_to(torch.float16), **_HALF),
    KVFormat("bfloat16", torch.bfloat16, quantize=_to(torch.bfloat16), **_HALF),
    # float8_e4m3fn values; the words path converts two a 32-bit half in one instruction (sm_89+).
    KVFormat("fp8", FP8_DTYPE, element_bits=8, scale_block=0, scale_dtype=None, kernel_code=1, words_code=3,
             config_key="fp8", quantize=_fp8, dequantize=_as_float32),
    # Two e2m1 codes a byte (element 2i in the low nibble) and an e4m3 scale a 16 elements
    # (kvattn.formats); the words path reads eight codes and four scales a load.
    KVFormat("nvfp4", torch.uint8, element_bits=4, scale_block=NVFP4_BLOCK, scale_dtype=FP8_DTYPE, kernel_code=2,
             words_code=4, config_key="nvfp4", quantize=quantize_nvfp4, dequantize=dequantize_nvfp4),
)

BY_NAME: dict[str, KVFormat] = {f.name: f for f in FORMATS}
BY_DTYPE: dict[torch.dtype, KVFormat] = {f.dtype: f for f in FORMATS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
DTYPES: tuple[torch.dtype, ...] = tuple(BY_DTYPE)
# Formats stored in fewer than 16 bits: the kernels dequantise them to float16 operands, and the
# decode and prefill entry points accept them with any 16-bit query.
QUANTISED_DTYPES: tuple[torch.dtype, ...] = tuple(f.dtype for f in FORMATS if f.element_bits < 16)
