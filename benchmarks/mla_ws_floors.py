"""Timing floors of the warp-specialised MLA kernel, built from a patched copy of its source.

The library's kernel (``src/kvattn/ops/mla/kernels_gluon_ws.py``) has no experiment switch. A floor is
that source with one part of the work taken out by a textual patch, loaded as a sibling module
of the kernel (so its relative imports resolve) from a file in a temporary folder (Gluon reads a
kernel's source from its file). The results are wrong by design: for timing only.

* ``nocopies``: the copy warp signals each part full without copying (the buffers keep whatever
  they held): the time without the HBM reads. Both copy paths are patched: ``_copy_part`` (pages
  of 64+, one box a 64-column piece) and ``_copy_part_pages`` (pages of 16 / 32, one box a page);
  without the second, the floor at small pages would still copy everything. The signal needs no
  page id, so at small pages the floor also drops each page's row taken out of its lane (a lane
  reduction a page and part, feeding only the boxes' coordinates). The page-table reads stay in
  the source on both paths, but feed nothing once the boxes are gone, and the compiler drops
  them (sm_90a PTX: fewer ``ld.global``): the floor is the kernel less its copies (the copy warp
  still waits for each part free and signals it full), at every page size alike.
* ``nopv``: no P.V products (the accumulators pass through).
* ``noscores``: no score products (zero scores).
* ``noconvert``: the e4m3 form's values are not converted to float16 (P.V reads stale buffers).
* ``nostore``: the epilogue writes nothing (its stores behind a branch never taken, so the
  products they read stay): what a program's output rows cost at its end.
* ``syncstore`` (not a floor: the A/B of a change, right results): the final output rows written
  straight from the accumulator's layout, as before they went through a free buffer
  (``store_staged`` in ``src/kvattn/ops/mla/kernels_gluon.py``).

Each patch names the exact text it replaces, so an edit of the kernel that moves it fails here
loudly rather than timing the unpatched kernel. :func:`floor_kernel` returns the patched
``mla_gluon_ws_kernel``; ``benchmarks/tune_mla.py``'s ``ws_no*`` variants launch it in place of
the library's (``kvattn.ops.mla.plan.mla_gluon_ws_kernel``).

Timing a floor over pages of 16 (``tune_mla.py --sweep`` takes the sweep's MLA rows; the
registry's have pages of 64 only), e.g. sw77 (bf16, 128 heads, 5 ragged requests, pages of 16),
the kernel and its copy-less floor in one run, on the device from the repository root::

    PYTHONPATH=src python benchmarks/tune_mla.py --sweep --filter sw77 --variants default,ws_nocopies
"""

from __future__ import annotations

import functools

from benchmarks import patched_kernels

# floor -> [(text of the kernel's source, its replacement)]; each text must occur exactly once.
PATCHES = {
    "nocopies": [(
        "    mbarrier.expect(bar_full, BLOCK_N * COLS * dst.dtype.primitive_bitwidth // 8)\n"
        "    for c in gl.static_range(COLS // 64):\n"
        "        tma_load(kv_desc, [row, COL0 + c * 64], bar_full, dst.slice(c * 64, 64, dim=1))\n",
        "    mbarrier.arrive(bar_full, count=1)\n",
    ), (
        # pages of 16 / 32 (_copy_part_pages): the same signal in place of the expect and the
        # per-page boxes; the page's row taken out of its lane goes too (it feeds only the boxes)
        "    mbarrier.expect(bar_full, BLOCK_N * COLS * dst.dtype.primitive_bitwidth // 8)\n"
        "    for j in gl.static_range(BLOCK_N // PAGE_SIZE):\n"
        "        row = gl.sum(gl.where(offs == FIRST + j, rows, 0), 0)\n"
        "        part = dst.slice(j * PAGE_SIZE, PAGE_SIZE, dim=0)\n"
        "        for c in gl.static_range(COLS // 64):\n"
        "            tma_load(kv_desc, [row, COL0 + c * 64], bar_full, part.slice(c * 64, 64, dim=1))\n",
        "    mbarrier.arrive(bar_full, count=1)\n",
    )],
    "nopv": [
        ("    warpgroup_mma,\n", "    warpgroup_mma,\n    warpgroup_mma_init,\n"),
        ("    acc = warpgroup_mma(p, v, o, is_async=True)\n", "    acc = warpgroup_mma_init(o)\n"),
    ],
    "noscores": [
        ("    warpgroup_mma,\n", "    warpgroup_mma,\n    warpgroup_mma_init,\n"),
        ("    s = warpgroup_mma(qr_smem, kpe_buf.permute((1, 0)), gl.zeros([64, 64], gl.float32, s_layout),\n"
         "                      use_acc=False, is_async=True)\n",
         "    s = warpgroup_mma_init(gl.zeros([64, 64], gl.float32, s_layout))\n"),
        ("    s = warpgroup_mma(qn_smem.slice(0, HALF, dim=1), ckv_buf.slice(0, HALF, dim=1).permute((1, 0)), s,\n"
         "                      is_async=True)\n", ""),
        ("    s = warpgroup_mma(qn_smem.slice(HALF, HALF, dim=1), ckv_buf.slice(HALF, HALF, dim=1).permute((1, 0)), s,\n"
         "                      is_async=True)\n", ""),
    ],
    "nostore": [(
        "    store_rows(o, m_i, l_i + l_other,",
        "    if num_splits < 0:  # (never: the stores' operands stay live)\n        store_rows(o, m_i, l_i + l_other,",
    )],
    "syncstore": [("               STORE_LSE, o_layout, BALANCED, stage)\n",
                   "               STORE_LSE, o_layout, BALANCED, None)\n")],
    "noconvert": [(
        "    for c in gl.static_range(src.shape[1] // 64):\n"
        "        w = words_view(",
        "    for c in gl.static_range(0):\n"
        "        w = words_view(",
    )],
}


def patched_source(floor: str) -> str:
    """The kernel's source with ``floor``'s patches applied (each anchor found exactly once)."""
    from kvattn.ops.mla import kernels_gluon_ws as gluon_ws

    return patched_kernels.patched_source(gluon_ws, PATCHES[floor], floor, "benchmarks/mla_ws_floors.py")


@functools.lru_cache(maxsize=None)
def floor_kernel(floor: str):
    """``mla_gluon_ws_kernel`` of the patched source of ``floor`` (one module per floor and process)."""
    from kvattn.ops.mla import kernels_gluon_ws as gluon_ws

    return patched_kernels.load_sibling(gluon_ws, f"gluon_ws_floor_{floor}", patched_source(floor)).mla_gluon_ws_kernel


__all__ = ["PATCHES", "floor_kernel", "patched_source"]


__getattr__ = patched_kernels.floor_attributes(PATCHES, floor_kernel)  # floor_kernel_<floor>
