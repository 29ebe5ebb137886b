"""The cache format table (``kvattn._formats_table``): one row a format, read by everything else."""

import pytest
import torch

from kvattn import _formats_table as table
from kvattn._formats_table import BY_DTYPE, BY_NAME, FORMATS, QUANTISED_DTYPES
from kvattn.formats import FP8_DTYPE


def test_one_format_a_name_and_a_dtype():
    assert len(BY_NAME) == len(BY_DTYPE) == len(FORMATS)
    assert table.NAMES == ("float16", "bfloat16", "fp8", "nvfp4")
    assert QUANTISED_DTYPES == (FP8_DTYPE, torch.uint8)


def test_kernel_codes_distinct_per_reading_path():
    """One code a way of reading: the 16-bit formats share theirs (the pointer's dtype tells them
    apart), every other element code and every words code is its own."""
    assert BY_NAME["float16"].kernel_code == BY_NAME["bfloat16"].kernel_code
    codes = [BY_NAME["float16"].kernel_code] + [f.kernel_code for f in FORMATS if f.element_bits < 16]
    codes += [f.words_code for f in FORMATS if f.words_code is not None]
    assert len(codes) == len(set(codes)) == 5


def test_kernel_constexprs_come_from_the_table():
    from kvattn.ops.common import kv_formats

    assert kv_formats.KV_HALF.value == BY_NAME["bfloat16"].kernel_code
    assert kv_formats.KV_FP8.value == BY_NAME["fp8"].kernel_code
    assert kv_formats.KV_NVFP4.value == BY_NAME["nvfp4"].kernel_code
    assert kv_formats.KV_FP8_WORDS.value == BY_NAME["fp8"].words_code
    assert kv_formats.KV_NVFP4_WORDS.value == BY_NAME["nvfp4"].words_code


@pytest.mark.parametrize("fmt,expected", [("bfloat16", 256), ("float16", 256), ("fp8", 128), ("nvfp4", 72)])
def test_kv_row_bytes_count_nvfp4_codes_and_scales(fmt, expected):
    """One token's D-128 vector for one head: NVFP4 is 64 bytes of codes and 8 of e4m3 scales."""
    assert BY_NAME[fmt].row_bytes(128) == expected


@pytest.mark.parametrize("fmt,stored", [("bfloat16", 128), ("fp8", 128), ("nvfp4", 64)])
def test_stored_dim(fmt, stored):
    assert BY_NAME[fmt].stored_dim(128) == stored


@pytest.mark.parametrize("fmt", table.NAMES)
def test_quantize_then_dequantize_round_trips_representable_values(fmt):
    """A format's ``quantize`` output has its dtype and stored dim; ``dequantize`` gives the values
    back where they are representable (small integers are, in every format)."""
    f = BY_NAME[fmt]
    x = torch.tensor([[0.0, 1.0, -2.0, 3.0, 4.0, -6.0, 0.5, 1.5] * 4])
    data, sf = f.quantize(x)
    assert data.dtype == f.dtype and data.shape[-1] == f.stored_dim(x.shape[-1])
    assert (sf is not None) == bool(f.scale_block)
    assert torch.equal(f.dequantize(data, sf), x)


def test_words_readable_needs_whole_words():
    fp8, nvfp4, bf16 = BY_NAME["fp8"], BY_NAME["nvfp4"], BY_NAME["bfloat16"]
    assert fp8.words_readable((4096, 1024, 128), 128)
    assert not fp8.words_readable((4096, 1024, 130), 130)
    assert not bf16.words_readable((4096, 1024, 128), 128)  # no words path
    assert nvfp4.words_readable((4096, 1024, 64), 128, (512, 128, 8))
    assert not nvfp4.words_readable((4096, 1024, 64), 128, (514, 128, 8))
    assert not nvfp4.words_readable((2048, 512, 16), 32, (128, 32, 2))  # half a word of scales a row
    assert fp8.code(False, (4096, 1024, 128), 128) == fp8.kernel_code
    assert fp8.code(True, (4096, 1024, 128), 128) == fp8.words_code
