"""Host time of one eager call of each public function at a small shape, beside a one-launch
floor and PyTorch's SDPA, with the call cache (kvattn.runtime.callcache) on and off.

Each call is made with the GPU idle (a synchronise before it, outside the timed part), ``out`` and
the workspace given; the median of ``--calls`` calls (fewer: ``--seconds``) is reported (and the
90th percentile). The floor is ``torch.add(a, b, out=c)`` on 1024 elements (one launch through
PyTorch's C++ dispatcher); SDPA is ``torch.nn.functional.scaled_dot_product_attention`` of a batch-1 decode
step over 4096 keys (32 heads, D 128, bf16), each on the same machine in the same run.

Before the timings, every function's replay is checked against its ordinary call: the same bits
from the same inputs, and from copies at new addresses (``replay``: "same bits", or what
differs). ``--cold`` first times each function's first call in a fresh Triton cache directory
(compile and load: the cold start ``kvattn.warmup`` moves to start-up).

The forms table (``--forms-only`` prints it alone, in well under a minute with the kernels
compiled: ``--form-calls`` rounds) times every call form of each function, in the same run:
its output given (``out``) or allocated by kvattn (``no out``), with the LSE given, allocated
(``lse``) or not asked for, over pages of 16 and 64 tokens and a bf16 and an fp8 cache (single
decode: contiguous K/V, no pages; MLA also at 128 heads, the Gluon kernel on Hopper). One round
calls every form of every row once (in an order shuffled every round, ``--seed``; ``--no-shuffle``
keeps the table's order), beside each row's bare launch, the bare allocations of its allocating
forms and ``torch.add``: the host's drift falls on every cell alike, so rows compare with each
other as well as the forms of a row (lab/notes/host-path.md). Each cell is the median host time
(us) and its ratio to the same call with everything given; ``*`` marks a form whose timed calls
were not all replayed. ``launch`` is the row's ``out`` call's launches alone: each compiled
kernel's launcher called with the argument tuple the replay prepared for that call (``-`` where
the call is not replayed); ``own`` = ``out`` - ``launch``, what kvattn adds to the launch.
``bits`` says whether each allocating form returned the bits of the same call with everything
given. A last line times single decode over a length that grows every call (a key never seen
twice: never recorded, the ordinary call plus the key).

``--seconds`` (default 30; 0: none) bounds the run: each phase takes a share of what is left,
each timing stops early once its share is spent (never under 20 calls or rounds), and rows whose
first calls (compiles) are still to make once the budget is spent are skipped (``skipped``).
Rows are printed as they are timed (the forms table once its rounds end).

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
import random
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


class Budget:
    """A run's wall-clock budget (``--seconds``; None: no limit). Each phase takes a share of what
    is left when it starts, each timing in it a deadline spread over what the phase has left, and
    a timing never stops under its minimum of calls (``profile_host.MIN_CALLS``, ``MIN_ROUNDS``).
    A first call that compiles cannot be cut: once the budget is spent, rows whose first calls are
    still to make are skipped. (``--breakdown`` ran past a 60 s limit on the H200 host with
    nothing printed, its calls fixed in number and compiles in between; lab/notes/host-path.md.)"""

    def __init__(self, seconds: float | None):
        self.end = None if not seconds else time.perf_counter() + seconds

    def spent(self) -> bool:
        return self.end is not None and time.perf_counter() >= self.end

    def share(self, fraction: float) -> float | None:
        """The deadline of a phase given ``fraction`` of what is left."""
        if self.end is None:
            return None
        now = time.perf_counter()
        return now + fraction * max(0.0, self.end - now)


def spread(deadline: float | None, items: int) -> float | None:
    """The deadline of the next of ``items`` timings sharing ``deadline`` evenly."""
    if deadline is None:
        return None
    now = time.perf_counter()
    return now + max(0.0, deadline - now) / max(1, items)


MIN_ROUNDS = 20  # rounds a deadline never cuts


def interleaved_times(fns: dict, calls: int, *, deadline: float | None = None, seed: int | None = None,
                      before: dict | None = None, warmup: int = 20) -> dict:
    """``{name: (median us, p90 us, cache hits, timed calls)}`` of ``calls`` rounds (fewer where
    ``time.perf_counter()`` passes ``deadline``, never under ``MIN_ROUNDS``), a round one call of
    each function, each with the GPU idle. ``seed``: each round's order shuffled (None: the order
    of ``fns``). ``before[name]``: called before that function's call, outside the timed window.

    Timed in a block of its own, a function takes the host's drift with it: neighbouring rows of
    one table differed by up to 1.4x in the same form, and rows whose calls run the same code by
    up to 1.9x when each row's forms were timed in turn but rows one after another
    (lab/notes/host-path.md). One round over everything puts the drift on all of them alike, so
    both the ratios within a row and the rows against each other keep only what the calls cost;
    a shuffled order puts each call after every other alike, not always after the same
    neighbour."""
    before = before or {}
    names = list(fns)
    rng = random.Random(seed) if seed is not None else None
    times = {name: [] for name in names}
    hits = dict.fromkeys(names, 0)

    def one_round(timed: bool) -> float:
        order = names
        if rng is not None:
            order = names[:]
            rng.shuffle(order)
        t1 = 0.0
        for name in order:
            prep = before.get(name)
            if prep is not None:
                prep()
            _sync()
            got = _cache_hits()
            t0 = time.perf_counter()
            fns[name]()
            t1 = time.perf_counter()
            if timed:
                hits[name] += _cache_hits() - got
                times[name].append(t1 - t0)
        return t1

    for _ in range(warmup):
        one_round(False)
    least = min(calls, MIN_ROUNDS)
    for i in range(calls):
        t1 = one_round(True)
        if deadline is not None and i + 1 >= least and t1 > deadline:
            break
    _sync()
    return {name: (*median_p90(ts), hits[name], len(ts)) for name, ts in times.items()}


def replayed_launches(fn):
    """``(cache, launches)`` of ``fn``'s call replayed from the call cache: the function's
    ``CallCache`` and ``[(launcher, its whole argument tuple), ...]`` of its recorded launches as a
    replay of this call prepares them (``launch_replay.replay_launches``: Triton's C launch entry
    point, or kvattn's thin wrapper that expands kept descriptor encodings); ``launches`` None
    where the call is not replayed, both None where ``fn`` makes no single call into the cache."""
    try:
        from kvattn.runtime import callcache as _callcache
        from kvattn.runtime import launch_replay
    except ImportError:  # a kvattn without the call cache (to compare with)
        return None, None
    with _calls_into_the_cache() as seen:
        fn()
    if len(seen) != 1:
        return None, None
    cache, args = seen[0]
    try:
        key, ptrs = _callcache._flatten(args)
    except (_callcache.Bypass, RuntimeError):
        return cache, None
    entry = cache.entries.get(key)
    if entry is None or not launch_replay.replay(entry, ptrs):
        return cache, None
    active = launch_replay.driver.active
    stream = active.get_current_stream(active.get_current_device())
    return cache, launch_replay.replay_launches(entry, ptrs, stream)


def launcher_calls(launches: list):
    """A function making ``launches`` (``replayed_launches``) through their launchers alone."""
    if len(launches) == 1:
        (launch, args), = launches
        return lambda: launch(*args)

    def launch_all():
        for launch, args in launches:
            launch(*args)

    return launch_all


def time_forms(rows: list, calls: int, fake: bool, *, budget: Budget | None = None, share: float = 1.0,
               seed: int | None = 0) -> tuple[list[dict], dict]:
    """Each row's forms timed (median / p90 us), their ratios to the same call with everything
    given, whether every timed call was replayed, whether each form gave the baseline's bits, and
    the row's launch floor: its ``out`` call's launches through their launchers alone, with the
    arguments the replay prepared (``launch``, None where the call is not replayed) and what the
    call costs beyond them (``own``). Every (row, form), the floors, the forms' bare allocations
    and ``torch.add`` are timed in the same rounds (``interleaved_times``). Returns the rows and
    the rounds' facts."""
    out_rows, fns, before, prepared, caches = [], {}, {}, [], {}
    t0 = time.perf_counter()
    for i, (function, page, kv_name, call, out, lse) in enumerate(rows):
        row = {"function": function, "page": page, "kv": kv_name, "forms": {}}
        out_rows.append(row)
        if budget is not None and budget.spent():
            row["error"] = "skipped: --seconds spent before its first calls (they compile)"
            continue
        forms = [f for f in FORMS if not (function == "xqa" and f.startswith("no out"))]
        row_fns = {form: (lambda kw=_form_kwargs(form, out, lse), call=call: call(**kw)) for form in forms}
        first = time.perf_counter()
        try:
            for fn in row_fns.values():
                for _ in range(3):  # compiled, seen, recorded
                    fn()
            cache, launches = replayed_launches(row_fns["out"])
        except (TypeError, ValueError, RuntimeError) as exc:  # a form this build does not take
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
            continue
        row["first_calls_s"] = time.perf_counter() - first
        if row["first_calls_s"] > 1.0:  # (a compile: where a slow run's time went, as it goes)
            print(f"  first calls of {function} {page or '-'} {kv_name}: {row['first_calls_s']:.1f} s",
                  file=sys.stderr, flush=True)
        for form, fn in row_fns.items():
            fns[i, form] = fn
        bufs = {"out": out, "lse": lse}
        for form in forms:
            if form in ALLOCS:
                fns[i, "alloc " + form] = lambda bufs=tuple(bufs[n] for n in ALLOCS[form]): [
                    torch.empty_like(t) for t in bufs]
        if launches:
            fns[i, "launch"] = launcher_calls(launches)
            row["launches"] = len(launches)
        if cache is not None:
            # Each row sees the function's hot entries as if it were the only shape called:
            # rows of one function interleaved would otherwise hold more same-typed keys (4 rows x
            # `out` / `lse`) than the hit path keeps (callcache.MAX_HOT), and every call would
            # take the full key, which a serving loop calling one shape never does.
            caches.setdefault(id(cache), (cache, cache.hot))
            row_hot = {}
            for form in forms:
                before[i, form] = lambda cache=cache, hot=row_hot: setattr(cache, "hot", hot)
        prepared.append((i, row, forms, row_fns))
    first_s = time.perf_counter() - t0
    a = torch.randn(1024, device=rows[0][4].device) if rows else torch.randn(1024)
    b, c = torch.randn_like(a), torch.empty_like(a)
    fns["torch.add"] = lambda: torch.add(a, b, out=c)
    t1 = time.perf_counter()
    try:
        timed = interleaved_times(fns, calls, deadline=None if budget is None else budget.share(share), seed=seed,
                                  before=before)
    finally:
        for cache, hot in caches.values():
            cache.hot = hot
    meta = {"rounds": min(n for *_, n in timed.values()), "calls_a_round": len(fns),
            "order": "fixed" if seed is None else f"shuffled, seed {seed}", "first_calls_s": first_s,
            "rounds_s": time.perf_counter() - t1, "torch_add": timed["torch.add"][:2]}
    for i, row, forms, row_fns in prepared:
        for form in forms:
            median, p90, hits, n = timed[i, form]
            row["forms"][form] = {"median": median, "p90": p90, "replayed": hits == n}
            if form in ALLOCS:
                row["forms"][form]["alloc"] = timed[i, "alloc " + form][0]
        floor = timed.get((i, "launch"))
        row["launch"] = None if floor is None else {"median": floor[0], "p90": floor[1]}
        row["own"] = None if floor is None else row["forms"]["out"]["median"] - floor[0]
        for form, got in row["forms"].items():
            base = row["forms"][BASELINE[form]]["median"]
            got["ratio"] = got["median"] / base
            # (net of the bare allocations: what the form costs kvattn's host path beyond them)
            got["net_ratio"] = (got["median"] - got.get("alloc", 0.0)) / base
        if fake:
            continue
        results = {}
        for form, fn in row_fns.items():
            got = fn()
            if row["function"] == "xqa":  # (it writes into its given output, and returns the LSE or None)
                got = (rows[i][4], got)
            results[form] = _bits_of(got).clone()
        row["bits"] = all(torch.equal(results[f], results[BASELINE[f]]) for f in forms)
    return out_rows, meta


def print_forms(rows: list, floor_us: float, meta: dict | None = None) -> None:
    if meta is None:
        print(f"\nhost time a call by form, median us (x the same call with everything given; * not all replayed); "
              f"torch.add floor {floor_us:.1f}")
    else:
        print(f"\nhost time a call by form, median us (x the same call with everything given; * not all replayed); "
              f"every row's forms, bare launch and allocations and torch.add called once a round, "
              f"{meta['rounds']} rounds of {meta['calls_a_round']} calls, order {meta['order']}; "
              f"torch.add {meta['torch_add'][0]:.1f} in the same rounds ({floor_us:.1f} alone)")
        print("launch: the row's `out` call's launches alone (the compiled kernels' launchers with the arguments "
              "the replay prepared; - where not replayed); own: out - launch, kvattn's share")
    print(f"{'function':16s} {'page':>4s} {'kv':4s} {'out':>6s} {'launch':>6s} {'own':>6s} "
          + " ".join(f"{f:>13s}" for f in FORMS[1:]) + "  bits")
    for row in rows:
        head = f"{row['function']:16s} {row['page'] or '-':>4} {row['kv']:4s} "
        if "error" in row:
            print(head + row["error"])
            continue
        base = row["forms"]["out"]
        floor = row.get("launch")
        cells = [f"{base['median']:5.1f}{' ' if base['replayed'] else '*'}",
                 f"{floor['median']:6.1f}" if floor else f"{'-':>6s}",
                 f"{row['own']:6.1f}" if floor else f"{'-':>6s}"]
        for form in FORMS[1:]:
            got = row["forms"].get(form)
            if got is None:
                cells.append(f"{'-':>13s}")
                continue
            mark = " " if got["replayed"] else "*"
            ratio = "" if BASELINE[form] == form else f" {got['ratio']:4.2f}x"
            cells.append(f"{got['median']:6.1f}{ratio}{mark}".rjust(13))
        bits = {True: "same", False: "DIFFER"}.get(row.get("bits"), "-")
        print(head + " ".join(cells) + f"  {bits}", flush=True)
    timed = [row for row in rows if "error" not in row]
    nets = [(got["net_ratio"], got["alloc"], row["function"], row["page"], row["kv"], form)
            for row in timed for form, got in row["forms"].items() if "alloc" in got]
    if nets:
        net, alloc, function, page, kv, form = max(nets)
        print(f"net of their bare allocations (torch.empty_like, timed in the same rounds): the forms that "
              f"allocate at most {net:.2f}x their baseline ({function} {page or '-'} {kv} {form}: "
              f"{alloc:.1f} us of allocation)")
    floors = [row for row in timed if row.get("launch")]
    if floors:
        outs = [row["forms"]["out"]["median"] for row in timed]
        print(f"with out {min(outs):.1f}-{max(outs):.1f} us over the rows; their bare launches "
              f"{min(r['launch']['median'] for r in floors):.1f}-{max(r['launch']['median'] for r in floors):.1f}; "
              f"kvattn's own share {min(r['own'] for r in floors):.1f}-{max(r['own'] for r in floors):.1f}")


def growing_single(device: torch.device, calls: int, deadline: float | None = None) -> dict:
    """Single decode over a length that grows every call (a key never seen twice), with and without
    ``out``, and with the cache off: what a call the cache cannot serve costs."""
    import kvattn

    hq, hkv, d = 32, 8, 128
    q = torch.randn(hq, d, device=device).to(torch.bfloat16)
    k, v = (torch.randn(4096 + calls + 40, hkv, d, device=device).to(torch.bfloat16) for _ in range(2))
    o = torch.empty_like(q)
    got = {}
    modes = (("out", "1", {"out": o}), ("no out", "1", {}), ("out, cache off", "0", {"out": o}))
    for j, (name, mode, kw) in enumerate(modes):
        os.environ["KVATTN_CALL_CACHE"] = mode
        length = [4096]

        def call(kw=kw):
            length[0] += 1
            kvattn.decode.single_decode_with_kv_cache(q, k[: length[0]], v[: length[0]], **kw)

        got[name] = host_times(call, calls, spread(deadline, len(modes) - j))[0]
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


def breakdown(fn, calls: int, deadline: float | None = None) -> dict | None:
    """Medians (us, GPU idle before each) of the parts of ``fn``'s replayed call: ``whole`` (the
    call), ``key`` (the hit's check of its key, ``_callcache._hot_entry``), ``replay``
    (``launch_replay.replay`` of the recorded launches), ``launcher`` (each launch's launcher
    alone, arguments prebuilt: Triton's C entry point, or kvattn's thin wrapper around it that
    expands the kept descriptors); ``rest`` = whole - key - replay (the public function, argument
    tuple, switches, result); ``full_key`` (``_callcache._flatten``: the key of a call the check
    does not find). None where the call is not replayed. ``deadline``: shared by its timings."""
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
    parts = [("whole", fn),
             ("key", lambda: _callcache._hot_entry(cache.hot.get(tuple(map(type, args))), args, switches)),
             ("full_key", lambda: _callcache._flatten(args)),
             ("replay", lambda: launch_replay.replay(entry, ptrs))]
    parts += [("launcher", lambda launch=launch, a=a: launch(*a)) for launch, a in launches]
    got = {"launcher": [], "launches": len(launches)}
    for j, (name, part) in enumerate(parts):
        t = host_times(part, calls, spread(deadline, len(parts) - j))[0]
        if name == "launcher":
            got["launcher"].append(t)
        else:
            got[name] = t
    got["rest"] = got["whole"] - got["key"] - got["replay"]
    return got


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1000, help="timed calls of each timing (at most: see --seconds)")
    ap.add_argument("--fake-gpu", action="store_true", help="CPU tensors, Triton's GPU side faked (any machine)")
    ap.add_argument("--cold", action="store_true", help="time each function's first call in a fresh Triton cache")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--breakdown", action="store_true",
                    help="also split each replayed call: key, replay of its launches, each launcher alone")
    ap.add_argument("--forms-only", action="store_true", help="the forms table alone (and the torch.add floor)")
    ap.add_argument("--form-calls", type=int, default=200, help="rounds of the forms table (at most: see --seconds)")
    ap.add_argument("--seconds", type=float, default=30.0,
                    help="wall-clock budget of the run after --cold's first calls (0: none): the timings stop "
                         "early (never under 20 calls), rows not compiled yet once it is spent are skipped")
    ap.add_argument("--seed", type=int, default=0, help="the forms table's order, shuffled every round")
    ap.add_argument("--no-shuffle", action="store_true", help="the forms table's rounds in a fixed order")
    args = ap.parse_args(argv)
    # Each row as it is timed, also into a file: a run cut by its time limit shows how far it got.
    sys.stdout.reconfigure(line_buffering=True)
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

    started = time.perf_counter()
    budget = Budget(args.seconds)
    doc = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (faked GPU)",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "triton": triton.__version__, "calls": args.calls, "seconds": args.seconds,
           "rows": []}
    a = torch.randn(1024, device=device)
    b, c = torch.randn_like(a), torch.empty_like(a)
    doc["floor_us"] = host_times(lambda: torch.add(a, b, out=c), args.calls, budget.share(0.02))
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
            print(f"cold start {name:28s} {doc['cold_start_s'][name]:6.2f} s")
        budget = Budget(args.seconds)  # (the cold start is what it times, not part of the budget)
    os.environ["KVATTN_CALL_CACHE"] = "1"
    t0 = time.perf_counter()
    # The forms table's rounds get most of what the whole run has; the rest after them.
    doc["forms"], doc["forms_rounds"] = time_forms(form_cases(device), args.form_calls, args.fake_gpu, budget=budget,
                                                   share=0.8 if args.forms_only else 0.35,
                                                   seed=None if args.no_shuffle else args.seed)
    print_forms(doc["forms"], doc["floor_us"][0], doc["forms_rounds"])
    doc["growing_single"] = g = growing_single(device, args.form_calls,
                                               budget.share(1.0 if args.forms_only else 0.15))
    meta = doc["forms_rounds"]
    print(f"single decode, a new length every call (never replayed): out {g['out']:.1f}, no out {g['no out']:.1f}, "
          f"out with the cache off {g['out, cache off']:.1f} us   (forms: {time.perf_counter() - t0:.0f} s, "
          f"of it first calls {meta['first_calls_s']:.0f} s, rounds {meta['rounds_s']:.0f} s)")
    if args.forms_only:
        _finish(doc, args, started)
        return 0
    doc["replay"] = {}
    for name, (fn, copies) in calls.items():
        if budget.spent():  # (their first calls compile)
            doc["replay"][name] = "skipped: --seconds spent"
            continue
        doc["replay"][name] = check_replay(fn, copies, args.fake_gpu)

    sq = torch.randn(1, 32, 1, 128, device=device, dtype=torch.bfloat16)
    sk, sv = (torch.randn(1, 32, 4096, 128, device=device, dtype=torch.bfloat16) for _ in range(2))
    sdpa = torch.nn.functional.scaled_dot_product_attention

    print(f"\n{'function':28s} {'cache on':>16s} {'cache off':>16s}   replay (median / p90 us)")
    rows = [(name, fn, name, {}) for name, (fn, _) in calls.items()]
    # The Gluon kernels' rows (Hopper, a TMA descriptor a call, rebuilt by the replay) beside the
    # same calls on the Triton kernels (prefill's with TMA descriptors of its own on Hopper).
    for name in ("MLA 1x4096 (h128)", "prefill 1x16 over 4096 p64"):
        rows.append((name + " GLUON=0", calls[name][0], name, {"KVATTN_GLUON": "0"}))
    deadline = budget.share(0.5)
    for j, (name, fn, check, env) in enumerate(rows):
        if budget.spent() or doc["replay"][check].startswith("skipped"):
            print(f"{name:28s} skipped: --seconds spent")
            doc["rows"].append({"function": name, "env": env, "skipped": True})
            continue
        os.environ.update(env)
        row = {"function": name, "env": env}
        for mode in ("1", "0"):
            os.environ["KVATTN_CALL_CACHE"] = mode
            row["cache_on" if mode == "1" else "cache_off"] = host_times(
                fn, args.calls, spread(deadline, 2 * (len(rows) - j) - (mode == "0")))
        os.environ["KVATTN_CALL_CACHE"] = "1"
        row["replay"] = doc["replay"][check] if not env else check_replay(fn, calls[check][1], args.fake_gpu)
        for key in env:
            del os.environ[key]
        doc["rows"].append(row)
        on, off = row["cache_on"], row["cache_off"]
        print(f"{name:28s} {on[0]:7.1f} / {on[1]:6.1f} {off[0]:7.1f} / {off[1]:6.1f}   {row['replay']}")
    doc["sdpa_us"] = host_times(lambda: sdpa(sq, sk, sv), args.calls, budget.share(0.1))
    print(f"{'torch.add floor (1 launch)':28s} {doc['floor_us'][0]:7.1f} / {doc['floor_us'][1]:6.1f}")
    print(f"{'SDPA decode 1x4096':28s} {doc['sdpa_us'][0]:7.1f} / {doc['sdpa_us'][1]:6.1f}")
    if args.breakdown:
        doc["breakdown"] = {}
        print(f"\nreplayed call, medians in us (GPU idle before each); torch.add floor {doc['floor_us'][0]:.1f}")
        print(f"{'function':28s} {'whole':>6s} {'key':>6s} {'replay':>6s} {'rest':>6s} {'full key':>8s}   "
              f"launcher alone, per launch")
        timed = [row["function"] for row in doc["rows"] if not row.get("skipped")]
        deadline = budget.share(1.0)
        for j, (name, fn, _, env) in enumerate(r for r in rows if r[0] in timed):
            os.environ.update(env)
            got = breakdown(fn, args.calls, spread(deadline, len(timed) - j))
            for key in env:
                del os.environ[key]
            doc["breakdown"][name] = got
            if got is None:
                print(f"{name:28s} not replayed")
                continue
            launchers = " + ".join(f"{t:.1f}" for t in got["launcher"])
            print(f"{name:28s} {got['whole']:6.1f} {got['key']:6.1f} {got['replay']:6.1f} {got['rest']:6.1f} "
                  f"{got['full_key']:8.1f}   {launchers}")
    _finish(doc, args, started)
    return 0


def _finish(doc: dict, args, started: float) -> None:
    doc["run_s"] = time.perf_counter() - started
    print(f"(timed part of the run: {doc['run_s']:.0f} s; --seconds {args.seconds:g})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
