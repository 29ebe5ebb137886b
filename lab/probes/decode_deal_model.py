"""A list-scheduling model of one decode launch on an H200 (CPU, no GPU): the programs' work in the
order the launch hands it out, onto 132 SMs x programs-an-SM slots, a slot taking the next piece
when its last one ends.

- Uniform launch: programs in pid order (request-major, split-minor: the block scheduler's order),
  each one request's ``split_bounds`` piece; a combine launch, where there is one, after the last.
- Balanced launch (``common.balance``): the grid is one wave; program ``p`` runs unit ``p``, then
  takes the next undealt unit (units in request order, each request's ``n_b`` pieces of
  ``split_bounds``). A request's last unit to finish merges its ``n_b`` partials in
  ``ceil(n_b / MERGE_BLOCK_S)`` rounds before its program takes another unit.

A piece of ``k`` keys costs ``o + k * c`` us (``c``: us a key a program, ``o``: a piece's fixed
cost: the plan, the query and page ids, the pipeline's fill); a merge round ``r`` us; the launch
``t0`` us (start, the last program's end, the graph's launch). FlashInfer's tensor-core decode
(``PrefillSplitQOKVIndptr``: the smallest KV chunk, in pages and at least 128 keys, whose chunks
number at most 2 x 132 / Hkv) is laid out the same way: static, one CTA a chunk, two an SM.

    PYTHONPATH=src python3 lab/probes/decode_deal_model.py             # the fit, and the launches beside it
    PYTHONPATH=src python3 lab/probes/decode_deal_model.py --what-if   # sw07 / sw12 under each fit
"""

from __future__ import annotations

import heapq
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

SM_COUNT = 132


from benchmarks.timeline import pieces, unit_counts  # noqa: E402  (the host's mirror of common.balance)


def balanced(lens, *, counts, slots, block_n, merge_block_s, c, o, r, t0, order=None):
    """Makespan (us) of a balanced launch: units dealt in request order (or ``order``, a request
    permutation) over ``slots`` programs."""
    units = []
    for b in (order if order is not None else range(len(lens))):
        units += [(b, k) for k in pieces(lens[b], counts[b], block_n)]
    left = {b: counts[b] for b in range(len(lens))}
    free = [(0.0, p) for p in range(slots)]
    heapq.heapify(free)
    end = 0.0
    for b, k in units:
        t, p = heapq.heappop(free)
        t += o + k * c
        left[b] -= 1
        if left[b] == 0 and counts[b] > 1:
            t += r * -(-counts[b] // merge_block_s)
        end = max(end, t)
        heapq.heappush(free, (t, p))
    return end + t0


def uniform(lens, *, splits, slots, block_n, c, o, r, t0, merge_rounds, combine_us):
    """Makespan (us) of a uniform launch: programs in pid order, a merge in the last split or a
    combine launch after the last program."""
    progs = [(b, k) for b in range(len(lens)) for k in pieces(lens[b], splits, block_n)]
    left = {b: splits for b in range(len(lens))}
    free = [(0.0, p) for p in range(slots)]
    end = 0.0
    for b, k in progs:
        t, p = heapq.heappop(free)
        t += o + k * c
        left[b] -= 1
        if left[b] == 0 and splits > 1 and merge_rounds:
            t += r * merge_rounds
        end = max(end, t)
        heapq.heappush(free, (t, p))
    return end + t0 + (combine_us if splits > 1 and not merge_rounds else 0.0)


def flashinfer(lens, *, page, num_kv_heads=1, c, o, t0, merge_us):
    """FlashInfer 0.7.2's tensor-core decode plan: the chunk (pages) by binary search, one CTA a
    (request, chunk), 2 x 132 slots, static; a merge kernel after."""
    pages = [max(-(-n // page), 1) for n in lens]
    lo, hi, most = max(128 // page, 1), max(pages), 2 * SM_COUNT // num_kv_heads
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(-(-p // mid) for p in pages) > most:
            lo = mid + 1
        else:
            hi = mid
    chunk = lo * page
    ctas = [k for n in lens for k in pieces(n, max(-(-n // chunk), 1), 1)]
    # two CTAs an SM share its rate (c is a one-program-an-SM rate): an SM's keys at c
    sm = [0.0] * SM_COUNT
    for i, k in enumerate(ctas):
        sm[i % SM_COUNT] += o + k * c
    return max(sm) + t0 + merge_us, chunk, len(ctas)


# ---------------------------------------------------------------------------------------------
# calibration: the launches of sw12 and sw07 measured on an H200 (lab/notes/decode-ragged-batches.md,
# lab/notes/decode.md "Decode: filling the last wave"; graph us), long tiles (128 keys, 8 warps, one
# program an SM), 8/1 heads, D 128, bf16
# ---------------------------------------------------------------------------------------------
def _lens(label):
    from benchmarks import sweep

    (s,) = [s for s in sweep.SWEEP if s.label == label]
    return s.seq_lens()


def measured_launches():
    """``(name, measured us, page, f(c, o, r, t0) -> modelled us)``."""
    sw12, sw07 = _lens("sw12"), _lens("sw07")
    n = 128

    def bal(lens, cap, slots, target=4 * SM_COUNT):
        counts, _ = unit_counts(lens, splits=1, target=target, cap=cap, min_chunk=512, block_n=n)
        return lambda c, o, r, t0: balanced(lens, counts=counts, slots=slots, block_n=n, merge_block_s=4, c=c, o=o,
                                            r=r, t0=t0)

    def uni(lens, splits, rounds, combine=0.0):
        return lambda c, o, r, t0: uniform(lens, splits=splits, slots=SM_COUNT, block_n=n, c=c, o=o, r=r, t0=t0,
                                           merge_rounds=rounds, combine_us=combine)

    return [
        ("sw12 uniform 2 splits, merged", 367.1, 64, uni(sw12, 2, 1)),
        ("sw12 uniform 14 splits + combine", 80.6, 64, uni(sw12, 14, 0, 2.5)),
        ("sw12 deal cap 16 over 90", 77.8, 64, bal(sw12, 16, 90)),
        ("sw12 deal cap 32 over 132", 67.1, 64, bal(sw12, 32, SM_COUNT)),
        ("sw07 uniform 6 splits, merged", 272.5, 16, uni(sw07, 6, 2)),
        ("sw07 deal cap 16 over 132", 219.0, 16, bal(sw07, 16, SM_COUNT)),
        ("sw07 deal cap 32 over 132", 187.3, 16, bal(sw07, 32, SM_COUNT)),
    ]


def calibrate():
    rows = measured_launches()
    best = None
    for c64 in [x / 1000 for x in range(12, 19)]:  # us a key: 512 B / (26-43 GB/s)
        for c16 in [x / 1000 for x in range(14, 22)]:
            for o in (1.0, 2.0, 3.0, 4.0, 6.0, 8.0):
                for r in (0.5, 1.0, 2.0, 3.0):
                    for t0 in (4.0, 8.0, 12.0, 16.0):
                        err = 0.0
                        for _, us, page, f in rows:
                            m = f(c64 if page == 64 else c16, o, r, t0)
                            err += (m / us - 1) ** 2
                        if best is None or err < best[0]:
                            best = (err, c64, c16, o, r, t0)
    return best


# Three parameter sets that fit the seven launches within 3-5 % rms (c64, c16, o, r, t0):
# lab/notes/decode-ragged-batches.md "One KV head: the merge rounds at the end of the deal".
FITS = {"F1": (0.013, 0.017, 4.0, 3.0, 16.0), "F2": (0.013, 0.018, 4.0, 1.0, 16.0), "F3": (0.014, 0.018, 6.0, 3.0, 8.0)}


def what_if():
    """sw07 and sw12 under each fit: the launch as planned (cap 32, 4 partials a merge round), the
    merge at 8 and 16 a round, caps 64 / 128, the longest request dealt first; FlashInfer's plan."""
    for row, page in (("sw07", 16), ("sw12", 64)):
        lens = _lens(row)
        first = sorted(range(len(lens)), key=lambda b: -lens[b])
        for name, (c64, c16, o, r, t0) in FITS.items():
            c = c64 if page == 64 else c16
            out = []
            for label, cap, mbs, order in (("now", 32, 4, None), ("merge 8", 32, 8, None), ("merge 16", 32, 16, None),
                                           ("cap 64", 64, 4, None), ("cap 128", 128, 4, None),
                                           ("longest first", 32, 4, first)):
                counts, chunk = unit_counts(lens, splits=1, target=4 * SM_COUNT, cap=cap, min_chunk=512, block_n=128)
                t = balanced(lens, counts=counts, slots=SM_COUNT, block_n=128, merge_block_s=mbs, c=c, o=o, r=r,
                             t0=t0, order=order)
                out.append(f"{label} {t:.1f} ({sum(counts)} units of {chunk})")
            fi = flashinfer(lens, page=page, c=c, o=o, t0=t0, merge_us=2.5)
            print(f"{row} {name}: " + "; ".join(out) + f"; FlashInfer {fi[0]:.1f} ({fi[2]} CTAs of {fi[1]})")


if __name__ == "__main__":
    if "--what-if" in sys.argv:
        what_if()
        sys.exit()
    err, c64, c16, o, r, t0 = calibrate()
    print(f"fit: c(p64) {c64 * 1000:.0f} ns/key ({512 / c64 / 1000:.1f} GB/s a program), c(p16) {c16 * 1000:.0f} "
          f"ns/key ({512 / c16 / 1000:.1f} GB/s), o {o} us a piece, r {r} us a merge round, t0 {t0} us; "
          f"rms {100 * (err / 7) ** 0.5:.1f} %")
    for name, us, page, f in measured_launches():
        print(f"  {name:<36} measured {us:6.1f}  model {f(c64 if page == 64 else c16, o, r, t0):6.1f}")
