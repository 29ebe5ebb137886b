"""fp8 and NVFP4 helpers against hand-computed codes, bytes and offsets."""

import pytest
import torch

from kvattn import formats
from kvattn.formats import FP8_DTYPE, FP4Tensor

# ---------------------------------------------------------------------------------------------
# fp8 e4m3fn: bias 7, 3 mantissa bits, max 448 = 0 1111 110, no infinities
# ---------------------------------------------------------------------------------------------
FP8_CASES = [
    (1.0, 0x38),  # 0 0111 000
    (1.0625, 0x38),  # halfway 1.0 / 1.125: tie to even mantissa 000
    (1.1875, 0x3A),  # halfway 1.125 / 1.25: tie to even mantissa 010
    (0.1, 0x1D),  # 1.625 * 2^-4 = 0.1015625 is nearest: 0 0011 101
    (448.0, 0x7E),
    (500.0, 0x7E),  # saturates
    (1e6, 0x7E),
    (-1000.0, 0xFE),
    (2.0**-9, 0x01),  # smallest subnormal
    (2.0**-10, 0x00),  # half of it: tie to even (zero)
    (3 * 2.0**-10, 0x02),  # halfway 2^-9 / 2^-8: tie to even 0x02
    (-2.5, 0xC2),  # 1 1000 010
]


@pytest.mark.parametrize("value, byte", FP8_CASES, ids=[f"{v:g}" for v, _ in FP8_CASES])
def test_quantize_fp8_codes(value, byte):
    code = formats.quantize_fp8(torch.tensor([value]))
    assert code.dtype == FP8_DTYPE
    assert int(code.view(torch.uint8)[0]) == byte


def test_fp8_scale_divides_and_dequant_multiplies():
    code = formats.quantize_fp8(torch.tensor([3.0, 1000.0]), scale=2.0)
    assert code.view(torch.uint8).tolist() == [0x38 + 0x04, 0x7E]  # 1.5 = 0 0111 100; 500 -> 448
    assert formats.dequantize_fp8(code, 2.0).tolist() == [3.0, 896.0]
    tensor_scale = formats.dequantize_fp8(code, torch.tensor([0.5]))
    assert tensor_scale.tolist() == [0.75, 224.0]


# ---------------------------------------------------------------------------------------------
# e2m1: sign bit 3, index 0..7 into {0, 0.5, 1, 1.5, 2, 3, 4, 6}; ties to the even index
# ---------------------------------------------------------------------------------------------
E2M1_CASES = [
    (0.0, 0), (0.25, 0), (0.5, 1), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6),
    (6.0, 7), (7.0, 7), (100.0, 7), (-0.5, 9), (-3.0, 13), (-5.0, 14), (-6.5, 15), (0.3, 1), (4.9, 6),
    (5.1, 7),
]


@pytest.mark.parametrize("value, code", E2M1_CASES, ids=[f"{v:g}" for v, _ in E2M1_CASES])
def test_e2m1_encode(value, code):
    assert int(formats.e2m1_encode(torch.tensor([value]))[0]) == code


def test_e2m1_negative_tie_to_zero_decodes_to_zero():
    code = int(formats.e2m1_encode(torch.tensor([-0.25]))[0])
    assert code & 7 == 0
    assert formats.e2m1_decode(torch.tensor([code], dtype=torch.uint8)).abs().item() == 0


def test_e2m1_decode_all_codes():
    vals = formats.e2m1_decode(torch.arange(16, dtype=torch.uint8)).tolist()
    assert vals[:8] == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert vals[8:] == [-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def test_nibble_order():
    packed = formats.pack_nibbles(torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8))
    assert packed.tolist() == [[0x21, 0x0F]]  # element 2i low nibble, 2i+1 high nibble
    assert formats.unpack_nibbles(packed).tolist() == [[1, 2, 15, 0]]


def test_quantize_nvfp4_known_block_amax_6():
    x = torch.zeros(1, 16)
    x[0, :5] = torch.tensor([6.0, -3.0, 1.5, 0.75, 0.0])
    packed, sf = formats.quantize_nvfp4(x)
    assert sf.dtype == FP8_DTYPE and sf.shape == (1, 1)
    assert sf.float().item() == 1.0  # amax 6 / 6
    # codes 7, 13 (-3), 3 (1.5), 2 (0.75 ties to 1.0), 0
    assert packed[0, :3].tolist() == [0xD7, 0x23, 0x00]
    assert formats.dequantize_nvfp4(packed, sf)[0, :5].tolist() == [6.0, -3.0, 1.5, 1.0, 0.0]


def test_quantize_nvfp4_known_block_scale_rounding():
    # amax 1.8: sf = e4m3(0.3) = 1.25 * 2^-2 = 0.3125 (nearest); 1.8 / 0.3125 = 5.76 -> 6 -> 1.875
    # 0.5 / 0.3125 = 1.6 -> 1.5 (code 3) -> 0.46875
    x = torch.zeros(1, 32)
    x[0, 16], x[0, 17] = 1.8, 0.5
    x[0, 0] = 12.0  # first block: sf 2, 12 -> code 7; 5 -> 2.5 ties to 2 (code 4) -> 4.0
    x[0, 1] = 5.0
    packed, sf = formats.quantize_nvfp4(x)
    assert sf.float().tolist() == [[2.0, 0.3125]]
    assert packed[0, 0].item() == 0x47 and packed[0, 8].item() == 0x37
    deq = formats.dequantize_nvfp4(packed, sf)
    assert deq[0, [0, 1, 16, 17]].tolist() == [12.0, 4.0, 1.875, 0.46875]


def test_quantize_nvfp4_global_scale_and_zero_block():
    x = torch.zeros(2, 16)
    x[1, 3] = 24.0
    packed, sf = formats.quantize_nvfp4(x, global_scale=2.0)  # 12 after the global scale
    assert sf.float().tolist() == [[0.0], [2.0]]
    assert packed[0].tolist() == [0] * 8
    assert formats.dequantize_nvfp4(packed, sf, 2.0)[1, 3].item() == 24.0


def test_nvfp4_rejects_non_multiple_of_16():
    with pytest.raises(ValueError, match="^x:"):
        formats.quantize_nvfp4(torch.zeros(2, 24))


# ---------------------------------------------------------------------------------------------
# 128x4 swizzle (SPEC): offset = (m//128)(C/4)512 + (k//4)512 + (m%32)16 + ((m%128)//32)4 + k%4
# ---------------------------------------------------------------------------------------------
SWIZZLE_CASES = [  # (m, k, C, offset computed by hand)
    (0, 0, 8, 0),
    (1, 0, 8, 16),
    (32, 0, 8, 4),
    (0, 1, 8, 1),
    (0, 4, 8, 512),
    (127, 3, 8, 496 + 12 + 3),
    (128, 0, 8, 1024),
    (130, 5, 8, 1024 + 512 + 32 + 1),
    (200, 2, 4, 512 + 8 * 16 + 2 * 4 + 2),  # 200 % 32 = 8, (200 % 128) // 32 = 2
]


@pytest.mark.parametrize("m, k, cols, offset", SWIZZLE_CASES, ids=[f"m{m}-k{k}-C{c}" for m, k, c, _ in SWIZZLE_CASES])
def test_swizzled_scale_offset(m, k, cols, offset):
    assert int(formats.swizzled_scale_offset(torch.tensor(m), torch.tensor(k), cols)) == offset


def test_fp4tensor_empty_shapes():
    t = FP4Tensor.empty(130, 4, 64, "cpu", scale_start_index=3)
    assert t.data.shape == (130, 4, 32) and t.data.dtype == torch.uint8
    assert t.scale.shape == (256, 16) and t.scale.dtype == FP8_DTYPE
    assert t.original_shape == (130, 4, 64) and t.scale_start_index == 3


def test_fp4tensor_output_round_trip_by_hand():
    """Row 1, block 0 holds amax 3 with o_sf_scale 4: sf = e4m3(4 * 3 / 6) = 2; codes of y * 4 / 2."""
    y = torch.zeros(2, 1, 32)
    y[1, 0, 0], y[1, 0, 1] = 3.0, -0.75  # scaled: 6 -> 6 (code 7); -1.5 -> code 11
    y[0, 0, 16] = 0.1  # row 0 block 1: sf = e4m3(0.4 / 6) = e4m3(1.0667 * 2^-4) = 1.125 * 2^-4 = 0.0703125
    out = FP4Tensor.empty(2, 1, 32, "cpu", scale_start_index=1)
    formats.quantize_nvfp4_output(y, 4.0, out)
    flat = out.scale.view(torch.uint8).reshape(-1)
    # C = round_up(32 / 16, 4) = 4. Row 1 -> scale row 2: offset 2*16 = 32; row 0 block 1 -> row 1: 16 + 1.
    assert flat.view(FP8_DTYPE)[32].float().item() == 2.0
    assert flat.view(FP8_DTYPE)[17].float().item() == 0.0703125
    assert out.data[1, 0, 0].item() == 0xB7
    back = formats.dequantize_nvfp4_output(out, 4.0)
    assert back[1, 0, :2].tolist() == [3.0, -0.75]
    # 0.4 / 0.0703125 = 5.69 -> 6 (code 7) -> 6 * 0.0703125 / 4
    assert back[0, 0, 16].item() == 6 * 0.0703125 / 4


def test_dequantize_nvfp4_output_of_zero_rows():
    # Found by `kvattn fuzz` (prefill of an empty batch with out_dtype="nvfp4"): the dequantiser
    # inferred the scale columns from zero elements and raised.
    empty = FP4Tensor.empty(0, 2, 64, "cpu")
    out = formats.dequantize_nvfp4_output(empty)
    assert out.shape == (0, 2, 64) and out.dtype == torch.float32
