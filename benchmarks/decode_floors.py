"""Timing floors of the paged decode kernel, built from a patched copy of its source.

The library's kernel (``decode_split_kernel`` in ``src/kvattn/ops/decode/kernels.py``) has no
experiment switch. A floor is that module's source with one part of the work taken out by a
textual patch, loaded as a sibling module of the kernel (``kvattn.ops.decode.kernels_floor_<floor>``,
so its relative imports resolve) from a file in a temporary folder (Triton reads a kernel's source
from its file). The results are wrong (or approximate) by design: for timing only.

Numbers below: sm_90a compiles under Triton 3.6 of the fp8 plan of 16 query heads over 2 KV
heads, D 128, pages of 16, the sm90 main tile (128 keys, 4 warps, 3 stages), split with the
in-kernel merge (``tests/benchmarking/test_decode_floors.py`` pins them).

fp8 (e4m3) caches. The library converts every K / V value to float16 (words of 4 bytes, one
``cvt.rn.f16x2.e4m3x2`` a pair: 128 a 128-key tile) for ``mma.sync`` over float16 (16-row tile).
A product on e4m3 operands cannot stay on that tile: Triton 3.6 lowers an fp8 x fp8 ``tl.dot``
of 16 rows for sm_90a as ``mma.sync`` over float16 with the operands converted after their
shared-memory load (144 conversions, read with the ``fp8mma`` patches on 16 rows): it uses no
fp8 ``mma.sync`` (``m16n8k32 ... e4m3``, PTX since sm_89) there. Only wgmma takes e4m3 then, and
its tile has 64 rows (a KV head's 4-8 query rows padded to 64). So the fp8 floors run 64-row
tiles, against a reference on the same tiles:

* ``rows64`` (not a floor: the reference): the library's kernel with ``BLOCK_M`` at least 64,
  float16 wgmma (16 ``m64n128k16`` a tile), all 128 conversions; every format. Against the
  default it prices the padding itself (and 215 registers a thread, not 145).
* ``fp8mma_k`` (fp8 only): Q.K^T on e4m3 operands: the query cast to e4m3 once (saturated as the
  float16 operand is), K loaded as stored (``load_kv_tile``'s plain branch, an e4m3
  ``OUT_DTYPE``: the same cp.async pipeline and stages as the reference, no instruction for
  ``.to``), 4 ``m64n128k32.e4m3.e4m3`` wgmma a tile; V and P.V as the reference's (words, 64
  conversions, ``opaque``, float16 wgmma). Against ``rows64``: the cost of K's conversions.
* ``fp8mma`` (fp8 only): both products on e4m3 operands (``cdt`` e4m3: Q once, K and V as
  stored, P rounded to e4m3 by ``tile_pv`` before P.V): no fp8 -> float16 conversion left, 8
  e4m3 wgmma a tile. Not a clean floor of the V conversion: wgmma wants an e4m3 B operand
  K-major, and V is stored D-major, so Triton 3.6 loads the V tile into registers with plain
  (not cp.async, not pipelined) loads and stores it transposed into shared memory byte by byte
  (~128 ``st.shared.b8`` a thread a tile); it also needs 255 registers and 40 bytes of stack.
  The time of fp8 P.V with V in its natural layout, as Triton compiles it; outputs approximate
  (fp8 Q and P: ``tune_decode`` marks them off the table's output).

The fp8 floors are meant for the paged, non-RoPE, tensor-core path (the sweep's fp8 rows have 4
or 8 query heads a KV head); their other paths (RoPE, one query row on CUDA cores) were not examined.

The other floors, every format, on the plan's own tiles:

* ``nomerge``: the in-kernel merge of a split launch taken out (the barrier, the arrival count
  and the last program's merge of the partials: ``if MERGE:`` becomes ``if False:``); every
  split still writes its partial, and the plan still launches no combine kernel, so the outputs
  of split / balanced launches are wrong. One-split launches are unchanged (they merge nothing).
  The balanced launch's deal counter (``DEAL_SLOT``) is not part of the merge and stays.
* ``mergecount``: the arrival count of ``nomerge`` kept (barrier, ``atom.acq_rel`` a program, the
  last program's reset of the counter), only the last program's merge (loads of every split's
  partial, the rescale, the output store) taken out: ``nomerge`` vs ``mergecount`` vs the
  kernel splits the merge's cost into the count and the merging itself.
* ``noloads``: the K and V tiles are not loaded: each is a register tile of 1 where its token's
  page id is usable, 0 elsewhere (``where(ok, 1, 0)`` broadcast over D, in ``cdt``). The page-id
  loads stay (they feed ``ok``, hence the tiles), and so do both products (sm_90a PTX: the
  library kernel's ``mma.sync`` count, the compiler keeps them), the softmax, the partial /
  output stores and the merge: the kernel's non-memory time on the K / V bytes, fp8 caches
  without their conversions too. Covers the register-load path of every format (not the TMA path
  of contiguous 16-bit caches, nor the RoPE paths, which load K in halves: left as they are).

Each patch names the exact text it replaces, so an edit of the kernel that moves it fails here
loudly rather than timing the unpatched kernel. :func:`floor_kernel` returns the patched
``decode_split_kernel``; ``benchmarks/tune_decode.py``'s ``floor_*`` variants launch it in place
of the library's (``kvattn.ops.decode.plan.decode_split_kernel``), rows a floor does not apply to
(``fp8mma`` on a cache that is not fp8) reported as skipped.

On the device, from the repository root (three sweep rows: two fp8, one bf16 ragged)::

    PYTHONPATH=src python benchmarks/tune_decode.py --sweep --filter "sw36 ,sw49 ,sw07 " \\
        --variants default,floor_rows64,floor_fp8mma_k,floor_fp8mma,floor_nomerge,floor_mergecount,floor_noloads
"""

from __future__ import annotations

import functools

from benchmarks import patched_kernels

# Pieces of the fp8 floors. Triton 3.6 compiles an fp8 x fp8 tl.dot of the 16-row decode tile for
# sm_90a as mma.sync over float16 operands converted after their shared-memory load (no fp8
# mma.sync there): fp8 tensor-core products need wgmma, whose tile has 64 rows.
_FP8_CODES = ("    KV_HALF,\n", "    KV_FP8,\n    KV_FP8_WORDS,\n    KV_HALF,\n")
_ROWS64 = ("    BLOCK_M: tl.constexpr = SHAPE[5]\n",
           "    BLOCK_M: tl.constexpr = SHAPE[5] if SHAPE[5] >= 64 else 64  # floor: wgmma's 64-row tile\n")
_CDT = "    cdt = q_ptr.dtype.element_ty if KV_FORMAT == KV_HALF else tl.float16\n"
_IS_FP8 = "KV_FORMAT == KV_FP8 or KV_FORMAT == KV_FP8_WORDS"
_Q_F16 = "            q = float16_operand(q)\n"
_K_LOAD = "                k = load_kv_tile(k_src, k_sf_ptr, k_off, ksf_off, k_ok, 0, HEAD_DIM, KV_FORMAT, cdt,\n"

# floor -> [(text of the kernel's source, its replacement)]; each text must occur exactly once.
PATCHES = {
    # every product on e4m3 operands (Q once, K and V as stored, P), 64-row tiles
    "fp8mma": [
        _FP8_CODES, _ROWS64,
        (_CDT, _CDT + f"    if {_IS_FP8}:  # floor fp8mma: e4m3 operands\n        cdt = tl.float8e4nv\n"),
        # the query: saturated to float16's range as before, then to e4m3 (satfinite) once
        (_Q_F16, "            q = float16_operand(q).to(cdt)\n"),
    ],
    # Q.K^T on e4m3 operands (Q once, K as stored), P.V as the library's (V converted), 64-row tiles
    "fp8mma_k": [
        _FP8_CODES, _ROWS64,
        (_CDT, _CDT + f"    kdt = cdt\n    if {_IS_FP8}:  # floor fp8mma_k: e4m3 Q.K^T operands\n"
                      "        kdt = tl.float8e4nv\n"),
        (_Q_F16, "            q = float16_operand(q).to(kdt)\n"),
        (_K_LOAD, _K_LOAD.replace("KV_FORMAT, cdt,", "KV_FORMAT, kdt,")),
    ],
    # not a floor: the library's kernel on 64-row tiles (wgmma), the reference of the two above
    "rows64": [_ROWS64],
    "nomerge": [(
        "    if MERGE:\n"
        "        # The item's last split to finish merges all of them (no combine launch): each split\n",
        "    if False:  # floor nomerge: no count, no merge\n"
        "        # The item's last split to finish merges all of them (no combine launch): each split\n",
    )],
    "mergecount": [(
        "        if last:\n"
        "            tl.atomic_xchg(count_ptr, 0, sem=\"relaxed\", scope=\"gpu\")\n",
        "        if last:\n"
        "            tl.atomic_xchg(count_ptr, 0, sem=\"relaxed\", scope=\"gpu\")\n"
        "        if False:  # floor mergecount: the count and reset only\n",
    )],
    "noloads": [(
        "                k = load_kv_tile(k_src, k_sf_ptr, k_off, ksf_off, k_ok, 0, HEAD_DIM, KV_FORMAT, cdt,\n"
        "                                 EVICT_FIRST=KV_EVICT_FIRST, OFF_VALID=OFF_ROWS, REL_ROWS=PAGE_RUNS)\n",
        "                k = tl.broadcast_to(tl.where(k_ok, 1.0, 0.0).to(cdt)[:, None], (BLOCK_N, HEAD_DIM))\n",
    ), (
        "            v = load_kv_tile(v_src, v_sf_ptr, v_off, vsf_off, v_ok, 0, HEAD_DIM, KV_FORMAT, cdt, "
        "PV_OPERAND=True,\n"
        "                             EVICT_FIRST=KV_EVICT_FIRST, OFF_VALID=OFF_ROWS, REL_ROWS=PAGE_RUNS)\n",
        "            v = tl.broadcast_to(tl.where(v_ok, 1.0, 0.0).to(cdt)[:, None], (BLOCK_N, HEAD_DIM))\n",
    )],
}

# Every floor is a floor of the rows-in-M kernel (query rows in the products' M dim), the kernel
# they were first measured on: the plan's keys-in-M choice (KEYS_IN_M) is patched out of each.
_ROWS_IN_M = ("    KEYS_IN_M: tl.constexpr = SHAPE[8]\n",
              "    KEYS_IN_M: tl.constexpr = False  # floor: the rows-in-M kernel\n")
for _patches in PATCHES.values():
    _patches.append(_ROWS_IN_M)

# floor -> the cache formats (format table names) it applies to; absent: every format
APPLIES_TO = {"fp8mma": ("fp8",), "fp8mma_k": ("fp8",)}


def applies(floor: str, kv_format: str) -> bool:
    """Whether ``floor`` is a floor of a launch over a ``kv_format`` cache (a format table name:
    ``"bfloat16"``, ``"fp8"``, ``"nvfp4"``...)."""
    return kv_format in APPLIES_TO.get(floor, (kv_format,))


def patched_source(floor: str) -> str:
    """The kernel module's source with ``floor``'s patches applied (each anchor found exactly once)."""
    from kvattn.ops.decode import kernels

    return patched_kernels.patched_source(kernels, PATCHES[floor], floor, "benchmarks/decode_floors.py")


@functools.lru_cache(maxsize=None)
def floor_module(floor: str):
    """The patched kernel module of ``floor`` (one module per floor and process)."""
    from kvattn.ops.decode import kernels

    return patched_kernels.load_sibling(kernels, f"kernels_floor_{floor}", patched_source(floor))


def floor_kernel(floor: str):
    """``decode_split_kernel`` of the patched source of ``floor``."""
    return floor_module(floor).decode_split_kernel


__all__ = ["APPLIES_TO", "PATCHES", "applies", "floor_kernel", "floor_module", "patched_source"]


__getattr__ = patched_kernels.floor_attributes(PATCHES, floor_kernel)  # floor_kernel_<floor>
