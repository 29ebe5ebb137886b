"""Where an MLA program's time goes, phase by phase (GPU only; the MLA analogue of the decode
timelines of ``benchmarks/timeline.py``): the warp-specialised kernel's 16-bit form with
timestamps at its phases, beside the library's kernel timed by graph replay.

The program-cost line (``mla_program_cost.py``) put a one-wave program's fixed cost at 18.5 / 26.6
/ 24.2 us at 16 / 64 / 128 heads against FlashInfer's 15.9 / 19.1 / 16.6, a tile costing the same;
the floors (``benchmarks/mla_ws_floors.py``) each remove one part and time the rest. This probe
reads the parts' times directly: a copy of ``kernels_gluon_ws.py`` (built like the floors, by exact
text replacements loaded as a sibling module) whose programs each write, per stamp, the global
timer (``%globaltimer``, ns, one clock for the whole GPU) and the SM's cycle counter
(``%clock64``), plus the SM id, into 32 int64 words a program placed past the query's rows (the
query is a view of the first half of a buffer twice its size, so the stamps land in memory no
program reads). The stamps:

* ``entry``: the kernel's first line; ``planned``: after ``split_work`` (the program's unit);
* copy warp: ``copy_start`` (its partition's first line), ``rows_ready`` (the first pair's page ids
  loaded; pages of 64+ only);
* left warpgroup: ``query`` (the query staged and released), ``first_tile`` (the first score tile
  back: its copies landed and its products done), ``loop_end``, ``synced`` (its row sums exchanged
  with the other warpgroup's: the wait for the right's last products), ``stored`` (after its output rows);
* ``exit``: the kernel's last line (after every partition joined).

Each phase is printed as the median and the maximum over programs (and calls) of its time since
the program's own ``entry``, and ``entry`` itself against the launch's first ``entry`` (how long
the last programs wait to start). The stamps' own cost (a few global stores a program) is seen
in the launch's span against the library kernel's graph time beside it; the outputs of both
kernels are compared bitwise (the stamps must not change a result).

    PYTHONPATH=src python3 lab/probes/mla_phase_times.py [--json out.json] [--calls 20]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from unittest import mock

if __package__ in (None, ""):
    import _paths  # noqa: F401  (the repository root and src/ on sys.path)

STAMPS = ("entry", "planned", "copy_start", "rows_ready", "query", "first_tile", "loop_end", "synced", "stored",
          "exit")
SMID = 15  # the slot of the SM id (words 2 * SMID, past the stamps')
WORDS = 32  # int64 words a program: (global ns, cycles) a stamp

_HELPER = '''

@gluon.jit
def _stamp(q_ptr, batch, stride_q_b, K: gl.constexpr, dep):
    """(probe) the global timer and the SM's cycle counter to the program's slot K past the query,
    read once the int32 ``dep`` is available (an operand the reads take and do not use)."""
    t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dep], dtype=gl.int64, is_pure=False, pack=1)
    c = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [dep], dtype=gl.int64, is_pure=False, pack=1)
    base = (q_ptr + batch.to(gl.int64) * stride_q_b).to(gl.pointer_type(gl.int64), bitcast=True)
    slot = base + gl.program_id(0).to(gl.int64) * WORDS + 2 * K
    gl.store(slot, t)
    gl.store(slot + 1, c)
    if K == 0:
        sm = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [dep], dtype=gl.int32, is_pure=False, pack=1)
        gl.store(base + gl.program_id(0).to(gl.int64) * WORDS + 2 * SMID, sm.to(gl.int64))


@gluon.jit
def _copy_partition('''

_COPY_CALL = ("(_copy_partition, (kv_desc, ckv_smem, kpe_smem, bars, table_row, stride_t_p, start, end, num_pairs,\n"
              "                               num_pages, total_rows, CKV_DIM, PAGE_SIZE, BLOCK_N)),")

# (text, replacement, copies of the text in the kernel's source)
PATCHES = [
    ("\n\n@gluon.jit\ndef _copy_partition(", _HELPER.replace("WORDS", str(WORDS)).replace("SMID", str(SMID)), 1),
    ("def _copy_partition(kv_desc, ckv_smem, kpe_smem, bars, table_row, stride_t_p, start, end, num_pairs, num_pages,\n"
     "                    total_rows, CKV_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr):\n",
     "def _copy_partition(kv_desc, ckv_smem, kpe_smem, bars, table_row, stride_t_p, start, end, num_pairs, num_pages,\n"
     "                    total_rows, CKV_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr,\n"
     "                    q_ptr, batch, stride_q_b):\n", 1),
    ('    take :func:`_copy_pages`."""\n    if PAGE_SIZE < BLOCK_N:\n',
     '    take :func:`_copy_pages`."""\n    _stamp(q_ptr, batch, stride_q_b, 2, 0)\n    if PAGE_SIZE < BLOCK_N:\n', 1),
    ("        row_b = _tile_row(table_row, stride_t_p, start + BLOCK_N, end, num_pages, total_rows, PAGE_SIZE)\n"
     "        for i in range(num_pairs):\n",
     "        row_b = _tile_row(table_row, stride_t_p, start + BLOCK_N, end, num_pages, total_rows, PAGE_SIZE)\n"
     "        _stamp(q_ptr, batch, stride_q_b, 3, (row_a + row_b).to(gl.int32))\n"
     "        for i in range(num_pairs):\n", 1),
    (_COPY_CALL, _COPY_CALL[:-3] + ", q_ptr, batch, stride_q_b)),", 2),
    ("                KPE_DIM, BLOCK_H, ld_layout)\n    mbarrier.arrive(bars.index(BAR_Q), count=1)\n",
     "                KPE_DIM, BLOCK_H, ld_layout)\n    mbarrier.arrive(bars.index(BAR_Q), count=1)\n"
     "    _stamp(q_ptr, batch, stride_q_b, 4, 0)\n", 1),
    ("        s = _scores(qn_smem, qr_smem, z, ckv_a, kpe_smem.index(z), bars, 0, ph, bars.index(BAR_SA), False, True,\n"
     "                    HALF, s_layout)\n",
     "        s = _scores(qn_smem, qr_smem, z, ckv_a, kpe_smem.index(z), bars, 0, ph, bars.index(BAR_SA), False, True,\n"
     "                    HALF, s_layout)\n"
     "        if i == 0:\n            _stamp(q_ptr, batch, stride_q_b, 5, 0)\n", 1),
    ("        mbarrier.arrive(bars.index(EMPTY_L + 1), count=1)\n\n"
     "    _finish(o, m_i, l_i, x_smem, bars, out_ptr, part_o_ptr, part_lse_ptr, out_scale_ptr, b, hb, split, batch,\n"
     "            num_heads, num_splits, stride_o_b, stride_o_h, out_factor, X_MA, X_MB, 0, HALF, CKV_DIM, BLOCK_H, OUT_PTR,\n"
     "            True, x_layout, o_layout, BALANCED,\n"
     "            qn_smem.index(0).slice(0, HALF, dim=1))\n",
     "        mbarrier.arrive(bars.index(EMPTY_L + 1), count=1)\n\n"
     "    _stamp(q_ptr, batch, stride_q_b, 6, 0)\n"
     "    _finish(o, m_i, l_i, x_smem, bars, out_ptr, part_o_ptr, part_lse_ptr, out_scale_ptr, b, hb, split, batch,\n"
     "            num_heads, num_splits, stride_o_b, stride_o_h, out_factor, X_MA, X_MB, 0, HALF, CKV_DIM, BLOCK_H, OUT_PTR,\n"
     "            True, x_layout, o_layout, BALANCED,\n"
     "            qn_smem.index(0).slice(0, HALF, dim=1), q_ptr, batch, stride_q_b)\n"
     "    _stamp(q_ptr, batch, stride_q_b, 8, 0)\n", 1),
    ("    b, hb, split, start, end, num_tiles = split_work(",
     "    _stamp(q_ptr, batch, stride_q_b, 0, 0)\n    b, hb, split, start, end, num_tiles = split_work(", 1),
    ("    num_pairs = (num_tiles + 1) // 2\n",
     "    num_pairs = (num_tiles + 1) // 2\n    _stamp(q_ptr, batch, stride_q_b, 1, end.to(gl.int32))\n", 1),
    ("                                BALANCED)),\n"
     "            " + _COPY_CALL[:-3] + ", q_ptr, batch, stride_q_b)),\n"
     "        ], [NUM_WARPS, 1], [RIGHT_REGS, COPY_REGS])\n",
     "                                BALANCED)),\n"
     "            " + _COPY_CALL[:-3] + ", q_ptr, batch, stride_q_b)),\n"
     "        ], [NUM_WARPS, 1], [RIGHT_REGS, COPY_REGS])\n"
     "        _stamp(q_ptr, batch, stride_q_b, 9, 0)\n", 1),
    # synced: the left's row sums exchanged with the right's (what the end waits for besides its stores)
    ("            BALANCED: gl.constexpr, stage):\n",
     "            BALANCED: gl.constexpr, stage, q_ptr=None, batch_q=None, stride_q_b=None):\n", 1),
    ("    l_other = _read_rows(x_smem, X_OTHER, x_layout)\n",
     "    l_other = _read_rows(x_smem, X_OTHER, x_layout)\n"
     "    if COL0 == 0:\n        _stamp(q_ptr, batch_q, stride_q_b, 7, 0)\n", 1),
]


def stamped_source() -> str:
    """``kernels_gluon_ws.py`` with the stamps (each text replaced in exactly its expected copies:
    an edit of the kernel that moves one fails here)."""
    from benchmarks import patched_kernels
    from kvattn.ops.mla import kernels_gluon_ws

    return patched_kernels.patched_source(kernels_gluon_ws, PATCHES, "stamps", "lab/probes/mla_phase_times.py")


_KERNEL = None


def stamped_kernel():
    """The stamped ``mla_gluon_ws_kernel`` (its module loaded once, as a sibling of the library's)."""
    global _KERNEL
    if _KERNEL is None:
        from benchmarks import patched_kernels
        from kvattn.ops.mla import kernels_gluon_ws

        _KERNEL = patched_kernels.load_sibling(kernels_gluon_ws, "_kernels_gluon_ws_stamped",
                                               stamped_source()).mla_gluon_ws_kernel
    return _KERNEL


def __getattr__(name: str):  # ``tests/ops/sm90.py`` names a kernel as "module.attribute"
    if name == "mla_gluon_ws_kernel_stamped":
        return stamped_kernel()
    raise AttributeError(name)


def _case(heads: int, lens: list, device):
    import torch

    from kvattn.testing import make_paged_kv

    case = make_paged_kv(lens, num_kv_heads=1, head_dim=576, page_size=64, dtype=torch.bfloat16, form="shared",
                         device=device, nan_fill=False)
    cache = case.kv_cache[:, 0, :, 0]
    g = torch.Generator().manual_seed(7)
    buf = torch.randn(2 * len(lens), 1, heads, 576, generator=g).to(device, torch.bfloat16)
    return case, cache, buf


def _call(q, cache, case, lens, ws, out):
    import kvattn

    return kvattn.mla.xqa_batch_decode_with_kv_cache_mla(q, cache, ws, 128, 512, 64, case.block_tables,
                                                        case.seq_lens, max(lens), out=out, bmm1_scale=0.07)


def _graph_us(fn, reps: int = 50) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(reps):
        graph.replay()
    t1.record()
    torch.cuda.synchronize()
    return t0.elapsed_time(t1) * 1000 / reps


def _forget_launches() -> None:
    """Drop the MLA plans and every recorded call: a call replayed from its record keeps the
    kernel it was recorded with, so without this the stamped kernel never runs."""
    from kvattn.ops.mla import plan as mla_launch
    from kvattn.runtime import callcache

    mla_launch._PLANS.clear()
    callcache.clear()


def measure(heads: int, lens: list, calls: int) -> dict:
    import torch

    from kvattn.ops.mla import plan as mla_launch

    dev = torch.device("cuda")
    case, cache, buf = _case(heads, lens, dev)
    b = len(lens)
    q = buf[:b]
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device=dev)
    out_lib = torch.empty(b, heads, 512, dtype=torch.bfloat16, device=dev)
    out_st = torch.empty_like(out_lib)
    lib_us = _graph_us(lambda: _call(q, cache, case, lens, ws, out_lib))
    _forget_launches()
    with mock.patch.object(mla_launch, "mla_gluon_ws_kernel", stamped_kernel()):
        words = buf[b:].reshape(-1).view(torch.int64)
        stamped_us = _graph_us(lambda: _call(q, cache, case, lens, ws, out_st))
        per_call = []
        for _ in range(calls):
            words.fill_(-1)
            _call(q, cache, case, lens, ws, out_st)
            torch.cuda.synchronize()
            per_call.append(words.clone())
    _forget_launches()
    same = bool(torch.equal(out_lib.view(torch.int16), out_st.view(torch.int16)))
    return dict(heads=heads, batch=b, lens=sorted(set(lens)), library_graph_us=lib_us, stamped_graph_us=stamped_us,
                same_output=same, **analyse(per_call))


def analyse(per_call: list) -> dict:
    """Each call's words (int64, ``WORDS`` a program from program 0, -1 where unwritten) summed up
    in microseconds: per stamp its time since the program's ``entry`` (median, maximum)."""
    phases = {name: [] for name in STAMPS}
    starts, spans, sms, progs = [], [], set(), 0
    for w in per_call:
        progs = int((w[0::WORDS] >= 0).sum())  # programs that wrote their entry
        if progs == 0:
            raise RuntimeError("no program wrote a stamp: the stamped kernel did not run")
        t = w[: progs * WORDS].view(progs, WORDS).cpu()
        entry = t[:, 0]
        first = int(entry.min())
        starts += [(int(e) - first) / 1000 for e in entry]
        spans.append((int(t[:, 2 * STAMPS.index("exit")].max()) - first) / 1000)
        sms |= set(int(s) for s in t[:, 2 * SMID])
        for k, name in enumerate(STAMPS):
            ok = t[:, 2 * k] >= 0
            phases[name] += [(int(a) - int(e)) / 1000 for a, e in zip(t[ok, 2 * k], entry[ok])]
    return dict(programs=progs, sms=len(sms), span_us=statistics.median(spans),
                start_skew_us=(statistics.median(starts), max(starts)),
                phases_us={name: (statistics.median(v), max(v)) if v else None for name, v in phases.items()})


LAYOUTS = [  # (heads, lens): one-wave one-split batches (the program-cost probe's), then split launches
    (16, [128] * 132), (16, [512] * 132), (16, [2048] * 132),
    (64, [128] * 132), (64, [512] * 132), (64, [2048] * 132),
    (128, [128] * 66), (128, [2048] * 66),
    (16, [4096] * 64), (64, [4096] * 64),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    rows = []
    for heads, lens in LAYOUTS:
        r = measure(heads, lens, args.calls)
        rows.append(r)
        ph = "  ".join(f"{k} {v[0]:.2f}/{v[1]:.2f}" for k, v in r["phases_us"].items() if v)
        print(f"Hq{heads} {len(lens)}x{lens[0]}: library {r['library_graph_us']:.1f} us, stamped "
              f"{r['stamped_graph_us']:.1f}, span {r['span_us']:.1f}, start skew {r['start_skew_us'][0]:.2f}/"
              f"{r['start_skew_us'][1]:.2f}, programs {r['programs']} on {r['sms']} SMs, same output "
              f"{r['same_output']}\n    {ph}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
