"""KV-cache append (``kvattn.cache.append_paged_kv_cache``): Triton kernel against the reference.

Every case fills a cache with random bytes, writes a random set of new tokens (random requests,
positions, permuted pages, some tokens aimed outside the table / the pool / the batch) through the
Triton kernel and through the reference, and compares the two caches byte for byte: the written
slots must agree exactly (the quantisers are bit-exact ports) and every other byte must be left as
it was. The reference itself is checked against the read side: what it writes is what the
attention functions' gather reads back (dequantised within the format's rounding).

On a CPU machine the kernel runs in Triton's interpreter (float16/float32 rows, small shapes).
"""

from __future__ import annotations

import zlib

import pytest
import torch

import kvattn
from kvattn._formats_table import BY_NAME
from kvattn._inputs.paged import _split_kv
from kvattn.formats import FP8_DTYPE
from kvattn.reference.core import gather_tokens

from ..oracle import ON_GPU, run_both

DEV = "cuda" if ON_GPU else "cpu"
SRC_DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if ON_GPU else [])


def random_cache(num_pages, page, heads, head_dim, kv_format, layout, form, src_dtype, gen):
    """A cache of random bytes (and its NVFP4 scales) in the requested form, on DEV."""
    fmt = BY_NAME.get(kv_format)  # "half": the rows' dtype
    stored = fmt.stored_dim(head_dim) if fmt else head_dim
    dtype = fmt.dtype if fmt else src_dtype
    page_shape = (page, heads, stored) if layout == "NHD" else (heads, page, stored)
    planes = 1 if form == "shared" else 2

    def raw(shape, dt):
        nbytes = torch.Size(shape).numel() * torch.empty(0, dtype=dt).element_size()
        bits = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
        if dt in (torch.float16, torch.bfloat16, torch.float32):  # finite random values
            return torch.randn(shape, generator=gen).to(dt).to(DEV)
        if dt == FP8_DTYPE:
            bits = bits & 0x77  # finite e4m3 bytes
        return bits.view(dt).reshape(shape).to(DEV)

    data = raw((num_pages, planes, *page_shape), dtype)
    sf = None
    if fmt and fmt.scale_block:
        sf_shape = page_shape[:-1] + (head_dim // fmt.scale_block,)
        sf = raw((num_pages, planes, *sf_shape), fmt.scale_dtype)
    if form == "tuple":
        data = (data[:, 0].clone(), data[:, 1].clone())
        sf = (sf[:, 0].clone(), sf[:, 1].clone()) if sf is not None else None
    return data, sf


def clone_cache(c):
    if c is None:
        return None
    return tuple(t.clone() for t in c) if isinstance(c, tuple) else c.clone()


def as_bytes(c):
    ts = c if isinstance(c, tuple) else (c,)
    return torch.cat([t.contiguous().view(torch.uint8).reshape(-1).cpu() for t in ts])


def random_tokens(batch, width, page, num_pages, n, gen, bad=True):
    """``(tables, batch_indices, positions)`` with distinct target slots; with ``bad`` a few tokens
    point outside the batch, the table or the pool (they must be dropped)."""
    perm = torch.randperm(num_pages, generator=gen)
    tables = perm[: batch * width].view(batch, width).to(torch.int32)
    if bad:
        tables[0, -1] = num_pages + 3  # a page id past the pool
        tables[-1, -1] = -7
    slots = torch.randperm(batch * width * page, generator=gen)[:n]
    b = (slots // (width * page)).to(torch.int32)
    p = (slots % (width * page)).to(torch.int32)
    if bad and n >= 4:
        b[0] = batch  # past the batch
        b[1] = -1  # padding
        p[2] = width * page  # past the table
        p[3] = -1
    return tables.to(DEV), b.to(DEV), p.to(DEV)


def append_both(monkeypatch, key, value, cache, sf, tables, b, p, layout, k_scale, v_scale):
    """``((cache, sf) written by Triton, (cache, sf) written by the reference)``, each into a copy."""
    def call():
        c, s = clone_cache(cache), clone_cache(sf)
        kvattn.append_paged_kv_cache(key, value, c, tables, b, p, kv_layout=layout, k_scale=k_scale,
                                     v_scale=v_scale, kv_cache_sf=s)
        return c, s

    return run_both(call, monkeypatch)


CASES = [
    # (kv_format, layout, form, heads, head_dim, page)
    ("half", "NHD", "stacked", 2, 64, 16),
    ("half", "HND", "tuple", 3, 128, 8),
    ("half", "NHD", "shared", 1, 64, 4),
    ("fp8", "NHD", "stacked", 2, 64, 16),
    ("fp8", "HND", "tuple", 4, 64, 16),
    ("nvfp4", "NHD", "stacked", 2, 64, 16),
    ("nvfp4", "HND", "tuple", 2, 128, 8),
    ("half", "NHD", "tuple", 2, 48, 16),  # head_dim off a power of two: masked columns
]


@pytest.mark.parametrize("src_dtype", SRC_DTYPES, ids=str)
@pytest.mark.parametrize("kv_format,layout,form,heads,head_dim,page", CASES)
@pytest.mark.parametrize("tensor_scale", [False, True])
def test_triton_matches_reference(monkeypatch, src_dtype, kv_format, layout, form, heads, head_dim, page,
                                  tensor_scale):
    if kv_format == "half" and tensor_scale:
        pytest.skip("scales only act on quantised caches")
    gen = torch.Generator().manual_seed(zlib.crc32(repr((kv_format, layout, form, head_dim, src_dtype, tensor_scale)).encode()))
    batch, width, num_pages, n = 3, 3, 12, 11
    cache, sf = random_cache(num_pages, page, heads, head_dim, kv_format, layout, form, src_dtype, gen)
    key = (torch.randn(n, heads, head_dim, generator=gen) * 3).to(src_dtype).to(DEV)
    # In every row: values too small for e4m3 (signed zeros), a subnormal, and values past its range.
    key[:, 0, :6] = torch.tensor([-1e-4, 1e-4, -0.0, -3e-3, 1e4, -1e4]).to(src_dtype)
    value = None if form == "shared" else (torch.randn(n, heads, head_dim, generator=gen) * 3).to(src_dtype).to(DEV)
    tables, b, p = random_tokens(batch, width, page, num_pages, n, gen)
    k_scale, v_scale = (0.75, 1.5)
    if tensor_scale:
        k_scale = torch.tensor([0.75], device=DEV)
        v_scale = torch.tensor([2.5], device=DEV)
    (tri_c, tri_s), (ref_c, ref_s) = append_both(monkeypatch, key, value, cache, sf, tables, b, p, layout,
                                                 k_scale, v_scale)
    assert torch.equal(as_bytes(tri_c), as_bytes(ref_c))
    if sf is not None:
        assert torch.equal(as_bytes(tri_s), as_bytes(ref_s))
    # Something was written, and only where valid tokens point.
    assert not torch.equal(as_bytes(ref_c), as_bytes(cache))


@pytest.mark.parametrize("kv_format", ["half", "fp8", "nvfp4"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_reference_round_trip(kv_format, layout):
    """What the append writes is what the attention functions' gather reads back."""
    gen = torch.Generator().manual_seed(7)
    heads, head_dim, page, batch, width = 2, 64, 8, 2, 4
    cache, sf = random_cache(batch * width + 2, page, heads, head_dim, kv_format, layout, "stacked",
                             torch.float16, gen)
    cache, sf = cache.cpu(), (sf.cpu() if sf is not None else None)
    lens = torch.tensor([13, 25], dtype=torch.int32)
    cum = torch.tensor([0, 13, 38], dtype=torch.int32)
    tables = torch.randperm(batch * width + 2, generator=gen)[: batch * width].view(batch, width).to(torch.int32)
    key = torch.randn(38, heads, head_dim, generator=gen).half()
    value = torch.randn(38, heads, head_dim, generator=gen).half()
    b, p = kvattn.cache.batch_indices_positions(cum, lens, 38)
    scale = 0.5
    kvattn.append_paged_kv_cache(key, value, cache, tables, b, p, kv_layout=layout, k_scale=scale, v_scale=scale,
                                 kv_cache_sf=sf)
    kp, vp = _split_kv(cache, "c", layout)
    ksf, vsf = _split_kv(sf, "s", layout) if sf is not None else (None, None)
    tol = {"half": 0.0, "fp8": 0.07, "nvfp4": 0.35}[kv_format]
    for r in range(batch):
        rows = slice(int(cum[r]), int(cum[r + 1]))
        for pages, s, src in ((kp, ksf, key), (vp, vsf, value)):
            got = gather_tokens(pages, s, tables[r], int(lens[r]))
            if kv_format != "half":
                got = got * scale
            err = (got - src[rows].float()).abs() / src[rows].float().abs().clamp_min(1.0)
            assert float(err.max()) <= tol, (kv_format, float(err.max()))


def test_dropped_tokens_write_nothing(monkeypatch, triton_backend):
    """Only out-of-range tokens: the cache is left exactly as it was."""
    gen = torch.Generator().manual_seed(3)
    cache, _ = random_cache(4, 16, 2, 64, "half", "NHD", "stacked", torch.float16, gen)
    before = cache.clone()
    tables = torch.tensor([[0, 1], [2, 9]], dtype=torch.int32, device=DEV)  # 9: past the pool
    b = torch.tensor([2, -1, 0, 1, 1], dtype=torch.int32, device=DEV)
    p = torch.tensor([0, 0, 32, 16, -5], dtype=torch.int32, device=DEV)  # (1, 16) -> page id 9
    key = torch.randn(5, 2, 64, generator=gen).half().to(DEV)
    kvattn.append_paged_kv_cache(key, key.clone(), cache, tables, b, p)
    assert torch.equal(cache.view(torch.uint8), before.view(torch.uint8))


def test_batch_indices_positions():
    cum = torch.tensor([0, 3, 3, 5], dtype=torch.int32)
    lens = torch.tensor([10, 4, 2], dtype=torch.int32)
    b, p = kvattn.cache.batch_indices_positions(cum, lens, 7)
    assert b.tolist() == [0, 0, 0, 2, 2, 3, 3]
    assert p.tolist() == [7, 8, 9, 0, 1, -1, -1]
    b, p = kvattn.cache.batch_indices_positions(torch.zeros(1, dtype=torch.int64), lens[:0], 2)
    assert b.tolist() == [0, 0] and p.tolist() == [-1, -1]


def _base_args():
    key = torch.randn(3, 2, 64, dtype=torch.float16)
    cache = torch.zeros(4, 2, 16, 2, 64, dtype=torch.float16)
    tables = torch.zeros(2, 2, dtype=torch.int32)
    idx = torch.zeros(3, dtype=torch.int32)
    return dict(key=key, value=key.clone(), kv_cache=cache, block_tables=tables, batch_indices=idx, positions=idx)


@pytest.mark.parametrize("change,err,match", [
    (dict(key=torch.randn(3, 2, 64, dtype=torch.float64)), TypeError, "^key:"),
    (dict(key=torch.randn(3, 128, dtype=torch.float16)), ValueError, "^key:"),
    (dict(value=torch.randn(3, 2, 64, dtype=torch.bfloat16)), TypeError, "^value:"),
    (dict(value=torch.randn(4, 2, 64, dtype=torch.float16)), ValueError, "^value:"),
    (dict(value=None), ValueError, "^value:"),
    (dict(kv_cache=torch.zeros(4, 2, 16, 3, 64, dtype=torch.float16)), ValueError, "^kv_cache:"),
    (dict(kv_cache=torch.zeros(4, 2, 2, 16, 64, dtype=torch.float16)), ValueError,
     "^kv_cache: expected pages of 2 heads.*is kv_layout='HND' meant"),
    (dict(kv_cache=torch.zeros(4, 2, 16, 2, 64, dtype=torch.bfloat16)), TypeError, "^kv_cache:"),
    (dict(kv_cache=torch.zeros(4, 1, 16, 2, 64, dtype=torch.float16)), ValueError, "^value:"),
    (dict(block_tables=torch.zeros(2, 2, dtype=torch.int64)), TypeError, "^block_tables:"),
    (dict(batch_indices=torch.zeros(4, dtype=torch.int32)), ValueError, "^batch_indices:"),
    (dict(positions=torch.zeros(3, dtype=torch.float32)), TypeError, "^positions:"),
    (dict(kv_layout="NDH"), ValueError, "^kv_layout:"),
    (dict(kv_cache_sf=torch.zeros(4, 2, 16, 2, 4, dtype=FP8_DTYPE)), ValueError, "^kv_cache_sf:"),
    (dict(kv_cache=torch.zeros(4, 2, 16, 2, 32, dtype=torch.uint8)), ValueError, "^kv_cache_sf:"),
    (dict(kv_cache=torch.zeros(4, 2, 16, 2, 32, dtype=torch.uint8),
          kv_cache_sf=torch.zeros(4, 2, 16, 2, 2, dtype=FP8_DTYPE)), ValueError, "^kv_cache_sf:"),
    (dict(key=torch.randn(3, 2, 40, dtype=torch.float16), value=torch.randn(3, 2, 40, dtype=torch.float16),
          kv_cache=torch.zeros(4, 2, 16, 2, 20, dtype=torch.uint8),
          kv_cache_sf=torch.zeros(4, 2, 16, 2, 2, dtype=FP8_DTYPE)), ValueError, "^kv_cache: NVFP4 needs head_dim"),
    (dict(k_scale="x"), TypeError, "^k_scale:"),
    (dict(v_scale=torch.ones(2)), ValueError, "^v_scale:"),
])
def test_validation(change, err, match):
    args = _base_args()
    args.update(change)
    with pytest.raises(err, match=match):
        kvattn.append_paged_kv_cache(**args)


def test_batch_indices_positions_validation():
    with pytest.raises(ValueError, match="^seq_lens:"):
        kvattn.cache.batch_indices_positions(torch.tensor([0, 1]), torch.tensor([1, 2]), 1)
    with pytest.raises(ValueError, match="^num_tokens:"):
        kvattn.cache.batch_indices_positions(torch.tensor([0, 1]), torch.tensor([1]), -1)
    with pytest.raises(TypeError, match="^cum_seq_lens_q:"):
        kvattn.cache.batch_indices_positions(torch.tensor([0.0, 1.0]), torch.tensor([1]), 1)


def test_compiled_append_matches_eager(monkeypatch, triton_backend):
    """The registered operator (fake impl, mutated pages) traces under torch.compile."""
    backend = "inductor" if ON_GPU else "aot_eager"
    gen = torch.Generator().manual_seed(11)
    cache, _ = random_cache(6, 8, 2, 64, "fp8", "NHD", "stacked", torch.float16, gen)
    tables = torch.arange(6, dtype=torch.int32, device=DEV).view(2, 3)
    key = torch.randn(5, 2, 64, generator=gen).half().to(DEV)
    value = torch.randn(5, 2, 64, generator=gen).half().to(DEV)
    b = torch.tensor([0, 0, 1, 1, 1], dtype=torch.int32, device=DEV)
    p = torch.tensor([3, 4, 0, 1, 2], dtype=torch.int32, device=DEV)

    def step(c):
        kvattn.append_paged_kv_cache(key, value, c, tables, b, p, k_scale=0.5, v_scale=0.25)
        return c

    eager = step(cache.clone())
    torch._dynamo.reset()
    compiled = torch.compile(step, backend=backend, fullgraph=True)(cache.clone())
    assert torch.equal(compiled.view(torch.uint8), eager.view(torch.uint8))


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_cuda_graph_replay_with_new_tokens():
    """Captured once, replayed with new rows, positions and tables written in place."""
    gen = torch.Generator().manual_seed(5)
    heads, d, page, pages = 4, 128, 16, 32
    cache = torch.zeros(pages, 2, page, heads, d, dtype=torch.bfloat16, device="cuda")
    tables = torch.zeros(4, 8, dtype=torch.int32, device="cuda")
    key = torch.zeros(4, heads, d, dtype=torch.bfloat16, device="cuda")
    value = torch.zeros_like(key)
    b = torch.zeros(4, dtype=torch.int32, device="cuda")
    p = torch.zeros(4, dtype=torch.int32, device="cuda")
    kvattn.append_paged_kv_cache(key, value, cache, tables, b, p)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kvattn.append_paged_kv_cache(key, value, cache, tables, b, p)
    for step in range(3):
        tables.copy_(torch.randperm(pages, generator=gen)[:32].view(4, 8).to(torch.int32))
        key.copy_(torch.randn(4, heads, d, generator=gen).to(torch.bfloat16))
        value.copy_(torch.randn(4, heads, d, generator=gen).to(torch.bfloat16))
        b.copy_(torch.tensor([0, 1, 2, 3], dtype=torch.int32))
        p.copy_(torch.randint(0, 128, (4,), generator=gen).to(torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        for i in range(4):
            pg = int(tables[i, int(p[i]) // page])
            assert torch.equal(cache[pg, 0, int(p[i]) % page], key[i])
            assert torch.equal(cache[pg, 1, int(p[i]) % page], value[i])


@pytest.mark.codegen
@pytest.mark.parametrize("kv_format,cache_ptr", [("half", "*bf16"), ("fp8", "*u8"), ("nvfp4", "*u8")])
@pytest.mark.parametrize("head_dim,heads", [(128, 8), (256, 4)])
def test_compiles_for_sm90_without_spills(kv_format, cache_ptr, head_dim, heads):
    """The kernel compiles for Hopper (no GPU needed) with every cache format, and keeps its tile in
    registers (no local-memory stack)."""
    from kvattn.ops.append import plan as launch
    from kvattn.ops.common import KV_FP8, KV_HALF, KV_NVFP4

    from ..sm90 import compile_sm90

    block_d = head_dim
    block_h = max(1, min(heads, launch.TILE_ELEMENTS // block_d))
    code = {"half": KV_HALF, "fp8": KV_FP8, "nvfp4": KV_NVFP4}[kv_format].value
    res = compile_sm90(
        "kvattn.ops.append.kernels.append_kv_kernel",
        dict(NUM_HEADS=heads, HEAD_DIM=head_dim, PAGE_SIZE=16, BLOCK_H=block_h, BLOCK_D=block_d, KV_FORMAT=code,
             HAS_V=True, K_SCALE_TENSOR=True, V_SCALE_TENSOR=False),
        ptrs={"k_ptr": cache_ptr, "v_ptr": cache_ptr, "k_sf_ptr": "*u8", "v_sf_ptr": "*u8", "table_ptr": "*i32",
              "batch_ptr": "*i32", "pos_ptr": "*i32", "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32"},
        floats=("k_scale_factor", "v_scale_factor"),
    )
    assert "st.global" in res["ptx"]
    if "stack" in res:
        assert res["stack"] == 0
