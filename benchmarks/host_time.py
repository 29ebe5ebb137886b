"""Host time of one eager call of each public function at a small shape, beside a one-launch
floor and PyTorch's SDPA, with the call cache (kvattn.runtime.callcache) on and off.

Each call is made with the GPU idle (a synchronise before it, outside the timed part), ``out`` and
the workspace given; the median of ``--calls`` calls is reported (and the 90th percentile). The
floor is ``torch.add(a, b, out=c)`` on 1024 elements (one launch through PyTorch's C++
dispatcher); SDPA is ``torch.nn.functional.scaled_dot_product_attention`` of a batch-1 decode
step over 4096 keys (32 heads, D 128, bf16), each on the same machine in the same run.

Before the timings, every function's replay is checked against its ordinary call: the same bits
from the same inputs, and from copies at new addresses (``replay``: "same bits", or what
differs). ``--cold`` first times each function's first call in a fresh Triton cache directory
(compile and load: the cold start ``kvattn.warmup`` moves to start-up).

The forms table (``--forms-only`` prints it alone, in well under a minute with the kernels
compiled: ``--form-calls`` calls a form) times every call form of each function, in the same run:
its output given (``out``) or allocated by kvattn (``no out``), with the LSE given, allocated
(``lse``) or not asked for, over pages of 16 and 64 tokens and a bf16 and an fp8 cache (single
decode: contiguous K/V, no pages; MLA also at 128 heads, the Gluon kernel on Hopper), a row's
forms called in turn so that the host's drift falls on all of them alike. Each cell is
the median host time (us) and its ratio to the same call with everything given; ``*`` marks a form
whose timed calls were not all replayed. ``bits`` says whether each allocating form returned the
bits of the same call with everything given. A last line times single decode over a length that
grows every call (a key never seen twice: never recorded, the ordinary call plus the key).

Usage (on the GPU machine, from the repository root; about 2 minutes with --cold)::

    PYTHONPATH=src python benchmarks/host_time.py --forms-only          # the forms table alone
    PYTHONPATH=src python benchmarks/host_time.py --cold --json host_time.json
    PYTHONPATH=src python benchmarks/host_time.py --breakdown --calls 300 --json host_time.json
    PYTHONPATH=src python benchmarks/host_time.py --fake-gpu       # any machine: Python only

``--breakdown`` then splits each replayed call (medians, GPU idle before each): the whole call,
its key check alone (``callcache._hot_entry``: the entry a hit replays found without building
the key), the replay of its recorded launches alone (``launch_replay.replay``), and each
launch's launcher alone with its arguments prebuilt (Triton's C launch entry point, or the thin
wrapper that hands it kept descriptor encodings); ``rest`` is the whole less key check and replay
(the public function, the switches, the argument types). ``full key`` is the key a call the
check does not find builds (``callcache._flatten``: a new entry, or one not checked first).

``--fake-gpu`` (see ``profile_host.py``) fakes Triton's GPU side: CPU tensors, launchers that do
nothing; it measures kvattn's Python around the launches on this machine's CPU (no kernel runs,
so no bit check).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script
    import _paths  # noqa: F401

import torch  # noqa: E402

from benchmarks.profile_host import _sync, host_times, median_p90  # noqa: E402



def cases(device: torch.device) -> dict:
    """name -> (call, output tensors, a function making the same call on copies at new addresses)."""
    import kvattn

    bf16, g = torch.bfloat16, torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape, dtype=bf16):
        return torch.randn(*shape, generator=g).to(device, dtype)

    hq, hkv, d, page, length = 32, 8, 128, 16, 4096
    pages = length // page
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=device)
    table = torch.randperm(pages, generator=g).to(device, torch.int32).view(1, pages)
    lens = torch.tensor([length], dtype=torch.int32, device=device)
    out = {}

    q, kv = rnd(1, hq, d), rnd(pages, 2, page, hkv, d)
    o = torch.empty_like(q)

    def decode(q=q, kv=kv, o=o, ws=ws, table=table, lens=lens):
        kvattn.decode.xqa_batch_decode_with_kv_cache(q, kv, ws, table, lens, length, bmm1_scale=d ** -0.5, out=o)
        return o

    out["batch decode 1x4096"] = (decode, lambda: (q.clone(), kv.clone(), torch.empty_like(o), torch.zeros_like(ws),
                                                  table.clone(), lens.clone()))

    xq, k, v = rnd(1, 1, hq, d), rnd(pages * page * hkv, d), rnd(pages * page * hkv, d)
    xo, sem, xlens = torch.empty_like(xq), torch.zeros(8, dtype=torch.uint32, device=device), lens.view(1, 1)

    def xqa(xq=xq, k=k, v=v, table=table, xlens=xlens, xo=xo, ws=ws):
        kvattn.xqa.xqa(xq, k, v, table, xlens, xo, ws, sem, hkv, page)
        return xo

    out["xqa 1x4096"] = (xqa, lambda: (xq.clone(), k.clone(), v.clone(), table.clone(), xlens.clone(),
                                       torch.empty_like(xo), torch.zeros_like(ws)))

    sq, sk, sv = rnd(hq, d), rnd(length, hkv, d), rnd(length, hkv, d)
    so = torch.empty_like(sq)

    def single(sq=sq, sk=sk, sv=sv, so=so):
        kvattn.decode.single_decode_with_kv_cache(sq, sk, sv, out=so)
        return so

    out["single decode 4096"] = (single, lambda: (sq.clone(), sk.clone(), sv.clone(), torch.empty_like(so)))

    mcache = rnd(length // 64, 64, 576)
    mtable = torch.arange(length // 64, dtype=torch.int32, device=device).view(1, -1)

    def mla_case(heads):
        mq, mo = rnd(1, 1, heads, 576), torch.empty(1, heads, 512, dtype=bf16, device=device)

        def mla(mq=mq, mcache=mcache, ws=ws, mtable=mtable, lens=lens, mo=mo):
            kvattn.mla.xqa_batch_decode_with_kv_cache_mla(mq, mcache, ws, 128, 512, 64, mtable, lens, length, out=mo,
                                                         bmm1_scale=192 ** -0.5)
            return mo

        return mla, lambda: (mq.clone(), mcache.clone(), torch.zeros_like(ws), mtable.clone(), lens.clone(),
                             torch.empty_like(mo))

    out["MLA 1x4096 (h16)"] = mla_case(16)
    # 128 heads over pages of 64 tokens: on Hopper the warp-specialised Gluon kernel (a TMA descriptor a call)
    out["MLA 1x4096 (h128)"] = mla_case(128)

    ql = 16
    pq = rnd(ql, hq, d)
    po = torch.empty_like(pq)
    cum_q = torch.tensor([0, ql], dtype=torch.int32, device=device)
    cum_kv = torch.tensor([0, length], dtype=torch.int32, device=device)

    def prefill_case(ppage):
        pkv = rnd(length // ppage, 2, hkv, ppage, d)  # HND, prefill's default
        ptable = torch.randperm(length // ppage, generator=g).to(device, torch.int32).view(1, -1)

        def prefill(pq=pq, pkv=pkv, ws=ws, ptable=ptable, lens=lens, po=po):
            kvattn.prefill.trtllm_batch_context_with_kv_cache(pq, pkv, ws, ptable, lens, ql, length, d ** -0.5, 1.0,
                                                              1, cum_q, cum_kv, out=po)
            return po

        return prefill, lambda: (pq.clone(), pkv.clone(), torch.zeros_like(ws), ptable.clone(), lens.clone(),
                                 torch.empty_like(po))

    out["prefill 1x16 over 4096"] = prefill_case(page)
    # pages of 64 tokens: on Hopper the warp-specialised Gluon kernel
    out["prefill 1x16 over 4096 p64"] = prefill_case(64)
    return out


# ---------------------------------------------------------------------------------------------
# every call form
# ---------------------------------------------------------------------------------------------
FORMS = ("out", "no out", "out+lse", "lse", "no out+lse")
# What each form gives: out (the output), lse (the LSE); "out+lse" gives both, "lse" gives the
# output and lets kvattn allocate the LSE, "no out+lse" gives neither. The same call with
# everything given, each form's baseline:
BASELINE = {"out": "out", "no out": "out", "out+lse": "out+lse", "lse": "out+lse", "no out+lse": "out+lse"}
# The tensors a form leaves kvattn to allocate (the bound: a form costs at most its
# allocations more than its baseline); their bare torch.empty_like is timed in the same rounds.
ALLOCS = {"no out": ("out",), "lse": ("lse",), "no out+lse": ("out", "lse")}


def _form_kwargs(form: str, out, lse) -> dict:
    kw = {"out": None if form.startswith("no out") else out}
    if "lse" in form:
        kw["return_lse"] = True
        kw["lse"] = lse if form == "out+lse" else None
    return kw


def form_cases(device: torch.device) -> list:
    """``[(function, page, kv dtype, call(**form kwargs), out, lse), ...]``: one call of each function
    at a small shape, with prebuilt inputs, its output and LSE buffers."""
    import kvattn

    bf16, fp8, g = torch.bfloat16, torch.float8_e4m3fn, torch.Generator(device="cpu").manual_seed(1)

    def rnd(*shape, dtype=bf16):
        return torch.randn(*shape, generator=g).to(device).to(dtype)

    hq, hkv, d, length = 32, 8, 128, 4096
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=device)
    lens = torch.tensor([length], dtype=torch.int32, device=device)
    rows = []
    for page in (16, 64):
        pages = length // page
        table = torch.randperm(pages, generator=g).to(device, torch.int32).view(1, pages)
        for kv_name, kv_dtype in (("bf16", bf16), ("fp8", fp8)):
            q = rnd(1, hq, d)
            kv = rnd(pages, 2, page, hkv, d, dtype=kv_dtype)

            def decode(q=q, kv=kv, table=table, **kw):
                return kvattn.decode.xqa_batch_decode_with_kv_cache(q, kv, ws, table, lens, length,
                                                                    bmm1_scale=d ** -0.5, **kw)

            rows.append(("batch decode", page, kv_name, decode, torch.empty_like(q),
                         torch.empty(1, hq, dtype=torch.float32, device=device)))

            xq = rnd(1, 1, hq, d)
            k, v = (rnd(pages * page * hkv, d, dtype=kv_dtype) for _ in range(2))
            sem, xlens = torch.zeros(8, dtype=torch.uint32, device=device), lens.view(1, 1)

            def xqa(xq=xq, k=k, v=v, table=table, sem=sem, page=page, out=None, **kw):
                # (xqa writes into a given output only: "no out" forms are not its)
                return kvattn.xqa.xqa(xq, k, v, table, xlens, out, ws, sem, hkv, page, **kw)

            rows.append(("xqa", page, kv_name, xqa, torch.empty_like(xq),
                         torch.empty(1, 1, hq, dtype=torch.float32, device=device)))

            ql = 16
            pq = rnd(ql, hq, d)
            pkv = rnd(pages, 2, hkv, page, d, dtype=kv_dtype)  # HND, prefill's default
            cum_q = torch.tensor([0, ql], dtype=torch.int32, device=device)
            cum_kv = torch.tensor([0, length], dtype=torch.int32, device=device)

            def prefill(pq=pq, pkv=pkv, table=table, cum_q=cum_q, cum_kv=cum_kv, **kw):
                return kvattn.prefill.trtllm_batch_context_with_kv_cache(
                    pq, pkv, ws, table, lens, ql, length, d ** -0.5, 1.0, 1, cum_q, cum_kv, **kw)

            rows.append(("prefill 16 rows", page, kv_name, prefill, torch.empty_like(pq),
                         torch.empty(ql, hq, dtype=torch.float32, device=device)))

            for heads in (16, 128) if page == 64 else (16,):
                mq = rnd(1, 1, heads, 576)
                mcache = rnd(pages, page, 576, dtype=kv_dtype)

                def mla(mq=mq, mcache=mcache, table=table, **kw):
                    return kvattn.mla.xqa_batch_decode_with_kv_cache_mla(mq, mcache, ws, 128, 512, 64, table, lens,
                                                                         length, bmm1_scale=192 ** -0.5, **kw)

                rows.append((f"MLA h{heads}", page, kv_name, mla,
                             torch.empty(1, heads, 512, dtype=bf16, device=device),
                             torch.empty(1, heads, dtype=torch.float32, device=device)))
    for kv_name, kv_dtype in (("bf16", bf16), ("fp8", fp8)):
        sq = rnd(hq, d)
        sk, sv = (rnd(length, hkv, d, dtype=kv_dtype) for _ in range(2))

        def single(sq=sq, sk=sk, sv=sv, **kw):
            return kvattn.decode.single_decode_with_kv_cache(sq, sk, sv, **kw)

        rows.append(("single decode", None, kv_name, single, torch.empty_like(sq),
                     torch.empty(hq, dtype=torch.float32, device=device)))
    order = ["batch decode", "xqa", "single decode", "MLA h16", "MLA h128", "prefill 16 rows"]
    rows.sort(key=lambda r: (order.index(r[0]), r[1] or 0, r[2]))
    return rows


def _bits_of(result) -> torch.Tensor:
    parts = result if isinstance(result, tuple) else (result,)
    return torch.cat([t.reshape(-1).view(torch.uint8) for t in parts if t is not None])


def interleaved_times(fns: dict, calls: int) -> dict:
    """``{name: (median us, p90 us, cache hits)}`` of ``calls`` single calls of each function, made
    in turn (one call of each, then the next round), each with the GPU idle. A form timed in a block
    of its own took the host's drift with it: neighbouring rows of one table differed by up to 1.4x
    in the same form (lab/notes/host-path.md); in turn, every form of a row shares the drift, and
    their ratios keep only what the forms cost."""
    for fn in fns.values():
        for _ in range(20):
            fn()
    times = {name: [] for name in fns}
    hits = dict.fromkeys(fns, 0)
    for _ in range(calls):
        for name, fn in fns.items():
            _sync()
            before = _cache_hits()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            hits[name] += _cache_hits() - before
            times[name].append(t1 - t0)
    _sync()
    return {name: (*median_p90(ts), hits[name]) for name, ts in times.items()}


def time_forms(rows: list, calls: int, fake: bool) -> list[dict]:
    """Each row's forms timed (median / p90 us), their ratios to the same call with everything
    given, whether every timed call was replayed, and whether each form gave the baseline's bits."""
    out_rows = []
    for function, page, kv_name, call, out, lse in rows:
        row = {"function": function, "page": page, "kv": kv_name, "forms": {}}
        forms = [f for f in FORMS if not (function == "xqa" and f.startswith("no out"))]
        try:
            fns = {form: (lambda kw=_form_kwargs(form, out, lse): call(**kw)) for form in forms}
            for fn in fns.values():
                for _ in range(3):  # compiled, seen, recorded
                    fn()
            bufs = {"out": out, "lse": lse}
            allocs = {f"alloc {form}": (lambda names=ALLOCS[form]: [torch.empty_like(bufs[n]) for n in names])
                      for form in forms if form in ALLOCS}
            timed = interleaved_times({**fns, **allocs}, calls)
            for form in forms:
                median, p90, hits = timed[form]
                row["forms"][form] = {"median": median, "p90": p90, "replayed": hits == calls}
                if form in ALLOCS:
                    row["forms"][form]["alloc"] = timed[f"alloc {form}"][0]
            results = {}
            for form, fn in fns.items():
                got = fn()
                if function == "xqa":  # (it writes into its given output, and returns the LSE or None)
                    got = (out, got)
                results[form] = None if fake else _bits_of(got).clone()
        except (TypeError, ValueError, RuntimeError) as exc:  # a form this build does not take
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
            out_rows.append(row)
            continue
        for form, got in row["forms"].items():
            base = row["forms"][BASELINE[form]]["median"]
            got["ratio"] = got["median"] / base
            # (net of the bare allocations: what the form costs kvattn's host path beyond them)
            got["net_ratio"] = (got["median"] - got.get("alloc", 0.0)) / base
        if not fake:
            row["bits"] = all(torch.equal(results[f], results[BASELINE[f]]) for f in forms)
        out_rows.append(row)
    return out_rows


def print_forms(rows: list, floor_us: float) -> None:
    print(f"\nhost time a call by form, median us (x the same call with everything given; * not all replayed); "
          f"torch.add floor {floor_us:.1f}")
    print(f"{'function':16s} {'page':>4s} {'kv':4s} " + " ".join(f"{f:>13s}" for f in FORMS) + "  bits")
    for row in rows:
        head = f"{row['function']:16s} {row['page'] or '-':>4} {row['kv']:4s} "
        if "error" in row:
            print(head + row["error"])
            continue
        cells = []
        for form in FORMS:
            got = row["forms"].get(form)
            if got is None:
                cells.append(f"{'-':>13s}")
                continue
            mark = " " if got["replayed"] else "*"
            ratio = "" if BASELINE[form] == form else f" {got['ratio']:4.2f}x"
            cells.append(f"{got['median']:6.1f}{ratio}{mark}".rjust(13))
        bits = {True: "same", False: "DIFFER"}.get(row.get("bits"), "-")
        print(head + " ".join(cells) + f"  {bits}", flush=True)
    nets = [(got["net_ratio"], got["alloc"], row["function"], row["page"], row["kv"], form)
            for row in rows if "error" not in row for form, got in row["forms"].items() if "alloc" in got]
    if nets:
        net, alloc, function, page, kv, form = max(nets)
        print(f"net of their bare allocations (torch.empty_like, timed in the same rounds): the forms that "
              f"allocate at most {net:.2f}x their baseline ({function} {page or '-'} {kv} {form}: "
              f"{alloc:.1f} us of allocation)")


def growing_single(device: torch.device, calls: int) -> dict:
    """Single decode over a length that grows every call (a key never seen twice), with and without
    ``out``, and with the cache off: what a call the cache cannot serve costs."""
    import kvattn

    hq, hkv, d = 32, 8, 128
    q = torch.randn(hq, d, device=device).to(torch.bfloat16)
    k, v = (torch.randn(4096 + calls + 40, hkv, d, device=device).to(torch.bfloat16) for _ in range(2))
    o = torch.empty_like(q)
    got = {}
    for name, mode, kw in (("out", "1", {"out": o}), ("no out", "1", {}), ("out, cache off", "0", {"out": o})):
        os.environ["KVATTN_CALL_CACHE"] = mode
        length = [4096]

        def call(kw=kw):
            length[0] += 1
            kvattn.decode.single_decode_with_kv_cache(q, k[: length[0]], v[: length[0]], **kw)

        got[name] = host_times(call, calls)[0]
    os.environ["KVATTN_CALL_CACHE"] = "1"
    return got


def _cache_hits() -> int:
    try:
        from kvattn.runtime import callcache as _callcache
    except ImportError:  # a kvattn without the call cache (to compare with)
        return 0
    return sum(c.hits for c in _callcache._caches)


def check_replay(fn, copies, fake: bool) -> str:
    """Whether the replayed call gives the ordinary call's bits, on the same inputs and on copies."""
    os.environ["KVATTN_CALL_CACHE"] = "0"
    want = fn().clone()
    os.environ["KVATTN_CALL_CACHE"] = "1"
    for _ in range(3):
        fn()
    hits = _cache_hits()
    got = fn().clone()
    replayed = _cache_hits() > hits
    args = copies()
    got_copy = fn(*args).clone()
    if fake:
        return "replayed" if replayed else "not replayed"
    same = torch.equal(got.view(torch.uint8), want.view(torch.uint8)) and torch.equal(
        got_copy.view(torch.uint8), want.view(torch.uint8))
    return ("same bits" if same else "BITS DIFFER") + ("" if replayed else " (not replayed)")


@contextlib.contextmanager
def _calls_into_the_cache():
    """``[(CallCache, args), ...]``: every ``CallCache.run`` inside the block, with the call's arguments."""
    from kvattn.runtime import callcache as _callcache

    seen, run = [], _callcache.CallCache.run

    def spy(cache, args, call):
        seen.append((cache, args))
        return run(cache, args, call)

    _callcache.CallCache.run = spy
    try:
        yield seen
    finally:
        _callcache.CallCache.run = run


def breakdown(fn, calls: int) -> dict | None:
    """Medians (us, GPU idle before each) of the parts of ``fn``'s replayed call: ``whole`` (the
    call), ``key`` (the hit's check of its key, ``_callcache._hot_entry``), ``replay``
    (``launch_replay.replay`` of the recorded launches), ``launcher`` (each launch's launcher
    alone, arguments prebuilt: Triton's C entry point, or kvattn's thin wrapper around it that
    expands the kept descriptors); ``rest`` = whole - key - replay (the public function, argument
    tuple, switches, result); ``full_key`` (``_callcache._flatten``: the key of a call the check
    does not find). None where the call is not replayed."""
    from kvattn.runtime import callcache as _callcache
    from kvattn.runtime import launch_replay

    os.environ["KVATTN_CALL_CACHE"] = "1"
    for _ in range(3):
        fn()
    with _calls_into_the_cache() as seen:
        fn()
    if len(seen) != 1:
        return None
    cache, args = seen[0]
    key, ptrs = _callcache._flatten(args)
    entry = cache.entries.get(key)
    if entry is None or not launch_replay.replay(entry, ptrs):
        return None
    active = launch_replay.driver.active
    stream = active.get_current_stream(active.get_current_device())
    launches = launch_replay.replay_launches(entry, ptrs, stream)
    switches = _callcache._switches()[1]
    hot = cache.hot.get(tuple(map(type, args)))
    if hot is None or _callcache._hot_entry(hot, args, switches) is None:
        return None
    got = {
        "whole": host_times(fn, calls)[0],
        "key": host_times(lambda: _callcache._hot_entry(cache.hot.get(tuple(map(type, args))), args, switches),
                          calls)[0],
        "full_key": host_times(lambda: _callcache._flatten(args), calls)[0],
        "replay": host_times(lambda: launch_replay.replay(entry, ptrs), calls)[0],
        "launcher": [host_times(lambda launch=launch, a=a: launch(*a), calls)[0] for launch, a in launches],
        "launches": len(launches),
    }
    got["rest"] = got["whole"] - got["key"] - got["replay"]
    return got


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--fake-gpu", action="store_true", help="CPU tensors, Triton's GPU side faked (any machine)")
    ap.add_argument("--cold", action="store_true", help="time each function's first call in a fresh Triton cache")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--breakdown", action="store_true",
                    help="also split each replayed call: key, replay of its launches, each launcher alone")
    ap.add_argument("--forms-only", action="store_true", help="the forms table alone (and the torch.add floor)")
    ap.add_argument("--form-calls", type=int, default=200, help="timed calls of each form")
    args = ap.parse_args(argv)
    if args.cold and not args.fake_gpu:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="kvattn-cold-")  # before Triton is imported
    if args.fake_gpu:
        from benchmarks.profile_host import fake_gpu
        from kvattn.ops.mla import plan  # noqa: F401  (compiled-mode kernels: before fake_gpu sets TRITON_INTERPRET)
        from kvattn.ops.prefill import plan as _prefill  # noqa: F401  (the same)

        fake_gpu()
        device = torch.device("cpu")
    else:
        device = torch.device("cuda")
    import kvattn  # noqa: F401  (after the Triton cache is chosen)
    import triton

    doc = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (faked GPU)",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "triton": triton.__version__, "calls": args.calls, "rows": []}
    a = torch.randn(1024, device=device)
    b, c = torch.randn_like(a), torch.empty_like(a)
    doc["floor_us"] = host_times(lambda: torch.add(a, b, out=c), args.calls)
    print(f"{doc['device']}, torch {doc['torch']}, triton {doc['triton']}, {doc['date']}")
    calls = None if args.forms_only else cases(device)
    if args.cold:  # (first: the forms table compiles most kernels)
        doc["cold_start_s"] = {}
        for name, (fn, _) in calls.items():
            _sync()
            t0 = time.perf_counter()
            fn()
            _sync()
            doc["cold_start_s"][name] = time.perf_counter() - t0
            print(f"cold start {name:28s} {doc['cold_start_s'][name]:6.2f} s", flush=True)
    os.environ["KVATTN_CALL_CACHE"] = "1"
    t0 = time.perf_counter()
    doc["forms"] = time_forms(form_cases(device), args.form_calls, args.fake_gpu)
    print_forms(doc["forms"], doc["floor_us"][0])
    doc["growing_single"] = g = growing_single(device, args.form_calls)
    print(f"single decode, a new length every call (never replayed): out {g['out']:.1f}, no out {g['no out']:.1f}, "
          f"out with the cache off {g['out, cache off']:.1f} us   (forms: {time.perf_counter() - t0:.0f} s)")
    if args.forms_only:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
        return 0
    doc["replay"] = {name: check_replay(fn, copies, args.fake_gpu) for name, (fn, copies) in calls.items()}

    sq = torch.randn(1, 32, 1, 128, device=device, dtype=torch.bfloat16)
    sk, sv = (torch.randn(1, 32, 4096, 128, device=device, dtype=torch.bfloat16) for _ in range(2))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    doc["sdpa_us"] = host_times(lambda: sdpa(sq, sk, sv), args.calls)

    print(f"\n{'function':28s} {'cache on':>16s} {'cache off':>16s}   replay (median / p90 us)")
    rows = [(name, fn, name, {}) for name, (fn, _) in calls.items()]
    # The Gluon kernels' rows (Hopper, a TMA descriptor a call, rebuilt by the replay) beside the
    # same calls on the Triton kernels (prefill's with TMA descriptors of its own on Hopper).
    for name in ("MLA 1x4096 (h128)", "prefill 1x16 over 4096 p64"):
        rows.append((name + " GLUON=0", calls[name][0], name, {"KVATTN_GLUON": "0"}))
    for name, fn, check, env in rows:
        os.environ.update(env)
        row = {"function": name, "env": env}
        for mode in ("1", "0"):
            os.environ["KVATTN_CALL_CACHE"] = mode
            row["cache_on" if mode == "1" else "cache_off"] = host_times(fn, args.calls)
        os.environ["KVATTN_CALL_CACHE"] = "1"
        row["replay"] = doc["replay"][check] if not env else check_replay(fn, calls[check][1], args.fake_gpu)
        for key in env:
            del os.environ[key]
        doc["rows"].append(row)
        on, off = row["cache_on"], row["cache_off"]
        print(f"{name:28s} {on[0]:7.1f} / {on[1]:6.1f} {off[0]:7.1f} / {off[1]:6.1f}   {row['replay']}", flush=True)
    print(f"{'torch.add floor (1 launch)':28s} {doc['floor_us'][0]:7.1f} / {doc['floor_us'][1]:6.1f}")
    print(f"{'SDPA decode 1x4096':28s} {doc['sdpa_us'][0]:7.1f} / {doc['sdpa_us'][1]:6.1f}")
    if args.breakdown:
        doc["breakdown"] = {}
        print(f"\nreplayed call, medians in us (GPU idle before each); torch.add floor {doc['floor_us'][0]:.1f}")
        print(f"{'function':28s} {'whole':>6s} {'key':>6s} {'replay':>6s} {'rest':>6s} {'full key':>8s}   "
              f"launcher alone, per launch")
        for name, fn, _, env in rows:
            os.environ.update(env)
            got = breakdown(fn, args.calls)
            for key in env:
                del os.environ[key]
            doc["breakdown"][name] = got
            if got is None:
                print(f"{name:28s} not replayed")
                continue
            launchers = " + ".join(f"{t:.1f}" for t in got["launcher"])
            print(f"{name:28s} {got['whole']:6.1f} {got['key']:6.1f} {got['replay']:6.1f} {got['rest']:6.1f} "
                  f"{got['full_key']:8.1f}   {launchers}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
