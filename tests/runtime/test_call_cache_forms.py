"""Every call form replayed (kvattn.runtime.callcache), over the faked GPU of test_fast_launch: calls
that let kvattn allocate their output and / or LSE are recorded with their allocations and
replayed with fresh ones of the same shape, strides, dtype and device; a replay hands the launcher
what the ordinary call hands it for the tensors it returned; a shape change misses and allocates
its own shape; a key is recorded the second time it is seen, so a key that never comes back is
never recorded."""

from __future__ import annotations

import pytest
import torch

import kvattn
from kvattn.runtime import callcache as _callcache
from kvattn.testing import make_paged_kv

from .test_call_cache import CASES, HOPPER, cache_of, fake_hopper, fresh, ordinary
from .test_fast_launch import FAST_PATH_TRITON, FakeGPU

pytestmark = FAST_PATH_TRITON


def paged_case(page=16, fmt=None, lens=(700, 40, 2500)):
    """Batch decode over ``page``-token pages (a float16 query; ``fmt`` the cache's format)."""
    case = make_paged_kv(list(lens), num_kv_heads=2, head_dim=128, page_size=page, dtype=torch.float16,
                         kv_format=fmt, nan_fill=False)
    q = torch.randn(len(lens), 16, 128).to(torch.float16)
    args = (q, case.kv_cache, torch.zeros(1 << 22, dtype=torch.uint8), case.block_tables, case.seq_lens,
            max(lens), 0.125, 1.0)
    return kvattn.decode.xqa_batch_decode_with_kv_cache, args, dict(out=torch.empty_like(q))


BUILDERS = {
    "batch-p16": paged_case,
    "batch-p64": lambda: paged_case(page=64),
    "batch-p16-fp8": lambda: paged_case(fmt="fp8"),
    "batch-p64-fp8": lambda: paged_case(page=64, fmt="fp8"),
    "xqa": CASES["xqa"],
    "single": CASES["single"],
    "mla-p16": CASES["mla"],
    "mla-gluon-ws-hopper": CASES["mla-gluon-ws-hopper"],
    "prefill-p16": CASES["prefill-p16-window-sinks"],
    "prefill-p64": CASES["prefill"],
    "prefill-gluon-hopper": CASES["prefill-gluon-hopper"],
}
# What each form leaves to kvattn: "out" the output (not xqa's: it has no optional output), "lse"
# the LSE; "lse-given" allocates the output and writes a given LSE.
FORMS = ("out", "lse", "out+lse", "lse-given")
GRID = [(name, form) for name in BUILDERS for form in FORMS if not (name == "xqa" and form != "lse")]


def _start(monkeypatch, name):
    fake = FakeGPU(monkeypatch)
    monkeypatch.setenv("KVATTN_CALL_CACHE", "1")
    if name in HOPPER:
        fake_hopper(monkeypatch)
    return fake


def _form(fn, args, kwargs, form):
    """``kwargs`` for ``form``; ``lse-given``'s LSE shaped as the one the call allocates."""
    kw = {k: v for k, v in kwargs.items() if k not in ("return_lse", "lse")}
    if fn is not kvattn.xqa.xqa and form != "lse":
        kw["out"] = None
    if "lse" in form:
        kw["return_lse"], kw["lse"] = True, None
    if form == "lse-given":
        kw["lse"] = torch.empty_like(_parts(fn, fn(*args, **kw), kw)[1])
    return kw


def _parts(fn, got, kw):
    """``(out, lse)`` of a call's result (None where the call returns none)."""
    if fn is kvattn.xqa.xqa:
        return None, got
    return got if kw.get("return_lse") else (got, None)


def _geometry(t):
    return None if t is None else (tuple(t.shape), t.stride(), t.dtype, t.device)


def _record(fake, fn, args, kw):
    fn(*args, **kw)  # compiles; the key is seen
    fn(*args, **kw)  # recorded
    fake.launches()


@pytest.mark.parametrize("name, form", GRID, ids=[f"{n}-{f}" for n, f in GRID])
def test_allocating_forms_are_replayed_with_fresh_allocations(name, form, monkeypatch):
    fake = _start(monkeypatch, name)
    fn, args, kwargs = BUILDERS[name]()
    cache = cache_of(fn)
    args = fresh(args)
    kw = _form(fn, args, {k: fresh(v) for k, v in kwargs.items()}, form)
    _record(fake, fn, args, kw)
    (entry,) = cache.entries.values()
    assert len(entry.allocs) == (form != "lse") + (form in ("lse", "out+lse"))
    monkeypatch.setenv("KVATTN_CALL_CACHE", "0")
    want = _parts(fn, fn(*args, **kw), kw)  # the ordinary call's allocations
    monkeypatch.setenv("KVATTN_CALL_CACHE", "1")
    fake.launches()
    seen, alive = [], []  # (every result kept alive: no later allocation reuses its memory)
    for _ in range(2):  # new memory under every argument, each time
        args, kw = fresh(args), {k: fresh(v) for k, v in kw.items()}
        hits = cache.hits
        got = fn(*args, **kw)
        assert cache.hits == hits + 1, "the call was not replayed"
        launches = fake.launches()
        out, lse = parts = _parts(fn, got, kw)
        assert list(map(_geometry, parts)) == list(map(_geometry, want))
        if kw.get("lse") is not None:
            assert lse is kw["lse"]
        if kw.get("out") is not None:
            assert out is kw["out"]
        fresh_ones = [t for t in parts if t is not None and not any(t is a for a in (*args, *kw.values()))]
        assert fresh_ones and all(t.data_ptr() not in seen for t in fresh_ones)
        seen += [t.data_ptr() for t in fresh_ones]
        # The ordinary call into the tensors the replay returned launches exactly what the replay did.
        given = dict(kw, lse=lse) if lse is not None else dict(kw)
        if fn is not kvattn.xqa.xqa:
            given["out"] = out
        assert launches and launches == ordinary(fake, monkeypatch, fn, args, given)
        alive.append(parts)


@pytest.mark.parametrize("name", ["batch-p16", "prefill-p64", "mla-p16"])
def test_a_shape_change_allocates_its_own_shape(name, monkeypatch):
    """Two batch sizes recorded one after the other: each replay allocates its own output shape
    (no stale entry), and launches as the ordinary call does."""
    fake = _start(monkeypatch, name)
    fn, args, kwargs = BUILDERS[name]()
    kw = _form(fn, args, kwargs, "out+lse")
    if name.startswith("batch"):
        small = (args[0][:2], args[1], args[2], args[3][:2], args[4][:2], *args[5:])
    elif name.startswith("prefill"):  # the first request alone
        cum_q, cum_kv = args[10][:2], args[11][:2]
        small = (args[0][: int(cum_q[-1])], args[1], args[2], args[3][:1], args[4][:1], *args[5:9], 1, cum_q, cum_kv)
    else:  # MLA: the first two requests
        small = (args[0][:2], args[1], args[2], *args[3:6], args[6][:2], args[7][:2], args[8])
    cache = cache_of(fn)
    for call in (args, small):
        _record(fake, fn, call, kw)
    assert len(cache.entries) == 2
    for call in (args, small, args):
        hits = cache.hits
        out, lse = fn(*call, **kw)
        assert cache.hits == hits + 1
        rows = call[0].shape[0]
        assert out.shape[0] == rows and lse.shape[0] == rows
        launches = fake.launches()
        assert launches == ordinary(fake, monkeypatch, fn, call, dict(kw, out=out, lse=lse))


def test_a_key_is_recorded_when_it_comes_back(monkeypatch):
    """Recording costs more than the call: a key seen once is not recorded, and a single decode whose
    length changes every call records nothing (its calls cost the key and the ordinary call)."""
    fake = _start(monkeypatch, "single")
    recorded = []

    class Counting(_callcache.Record):
        def __init__(self):
            super().__init__()
            recorded.append(self)

    monkeypatch.setattr(_callcache, "Record", Counting)
    fn = kvattn.decode.single_decode_with_kv_cache
    q = torch.randn(32, 128).to(torch.float16)
    k, v = (torch.randn(600, 8, 128).to(torch.float16) for _ in range(2))
    cache = cache_of(fn)
    hits = cache.hits
    for length in range(500, 520):
        fn(q, k[:length], v[:length])
    assert not recorded and not cache.entries and cache.hits == hits and len(cache.seen) == 20
    fn(q, k[:510], v[:510])  # seen before: recorded
    assert len(recorded) == 1 and len(cache.entries) == 1
    hits = cache.hits
    fn(q, k[:510], v[:510])
    assert cache.hits == hits + 1 and len(recorded) == 1


def test_an_allocation_of_another_alignment_is_not_replayed(monkeypatch):
    """The launches were recorded for the allocation's 16-byte alignment (compiled kernels specialise
    on it): a made allocation at another alignment sends the call the ordinary way."""
    fake = _start(monkeypatch, "batch-p16")
    fn, args, kwargs = BUILDERS["batch-p16"]()
    kw = _form(fn, args, kwargs, "out")
    _record(fake, fn, args, kw)
    (entry,) = cache_of(fn).entries.values()
    entry.alloc_bits = tuple(b + 8 for b in entry.alloc_bits)
    hits = cache_of(fn).hits
    out = fn(*args, **kw)
    assert cache_of(fn).hits == hits and out.shape == args[0].shape
    assert fake.launches() == ordinary(fake, monkeypatch, fn, args, dict(kw, out=out))


def test_a_result_that_is_a_view_of_an_allocation_is_not_recorded():
    t = torch.empty(4, 8)
    assert _callcache._returns(t, (), [t]) == 0
    assert _callcache._returns((None, t), (1,), [torch.empty(2), t]) == (None, 2)
    with pytest.raises(_callcache.Bypass):
        _callcache._returns(t[1:], (), [t])
    with pytest.raises(_callcache.Bypass):
        _callcache._returns(t.view(32), (), [t])


def test_a_kept_buffer_replaced_inside_a_recording_is_not_taken_for_an_allocation(monkeypatch):
    """Single decode's partials, kept per stream, made afresh inside the recorded call (grown, or a
    new stream's): that recording is dropped, and the next one reads the kept buffer as such (no
    allocation made on every replay)."""
    from kvattn.runtime import workspace

    fake = _start(monkeypatch, "single")
    fn, args, kwargs = BUILDERS["single"]()
    cache = cache_of(fn)
    fn(*args, **kwargs)  # compiles; seen
    monkeypatch.setattr(workspace, "_STREAM_PARTIALS", {})  # the partials made again in the next call
    fn(*args, **kwargs)
    assert not cache.entries
    fn(*args, **kwargs)  # recorded
    (entry,) = cache.entries.values()
    assert not entry.allocs and entry.constants
    hits = cache.hits
    fn(*args, **kwargs)
    assert cache.hits == hits + 1
    fake.launches()


def test_a_run_of_new_keys_skips_the_cache_then_probes_it_again(monkeypatch):
    """FRESH_RUN calls in a row each with a new key (a length that grows every call): the next
    SKIP_CALLS calls skip the cache (no key built, nothing seen or recorded, the ordinary call's
    launches), after which a key that comes back is recorded and replayed again."""
    fake = _start(monkeypatch, "single")
    monkeypatch.setattr(_callcache, "FRESH_RUN", 4)
    monkeypatch.setattr(_callcache, "SKIP_CALLS", 5)
    fn = kvattn.decode.single_decode_with_kv_cache
    q = torch.randn(32, 128).to(torch.float16)
    k, v = (torch.randn(600, 8, 128).to(torch.float16) for _ in range(2))
    cache = cache_of(fn)
    for length in range(500, 504):  # the run of new keys
        fn(q, k[:length], v[:length])
    assert cache.skip == 5 and len(cache.seen) == 4
    fake.launches()
    for _ in range(4):  # a repeated key: skipped, never seen, never recorded
        fn(q, k[:510], v[:510])
    fake.launches()
    fn(q, k[:510], v[:510])
    assert cache.skip == 0 and len(cache.seen) == 4 and not cache.entries
    # (the kernels and grids: a temporary's address depends on what the allocator holds then)
    kernels_and_grids = [launch[:2] for launch in fake.launches()]
    plain = ordinary(fake, monkeypatch, fn, (q, k[:510], v[:510]), {})
    assert kernels_and_grids == [launch[:2] for launch in plain]
    fn(q, k[:510], v[:510])  # the cache again: seen now
    assert len(cache.seen) == 5
    hits = cache.hits
    fn(q, k[:510], v[:510])  # recorded
    fn(q, k[:510], v[:510])
    assert cache.hits == hits + 1 and cache.fresh == 0
    fake.launches()


def test_only_the_allocations_the_launches_or_the_result_use_are_made_again(monkeypatch):
    """A call that allocates a tensor nothing reads: the replay makes only the output, and returns it
    where the ordinary call returned its own."""
    fake = _start(monkeypatch, "batch-p16")
    _, args, kwargs = BUILDERS["batch-p16"]()
    cache = _callcache.CallCache("synthetic")
    try:
        def call():
            torch.empty(7)  # allocated first, never read: the output is the second allocation
            out = torch.empty_like(args[0])
            kvattn.decode._batch_decode(*args, out=out)
            return None, out

        for _ in range(2):  # compiles (seen), then recorded
            cache.run(args, call)
        (entry,) = cache.entries.values()
        assert len(entry.allocs) == 1 and entry.returns == (None, len(args))
        fake.launches()
        hits = cache.hits
        none, out = cache.run(args, call)
        assert cache.hits == hits + 1 and none is None
        assert _geometry(out) == _geometry(args[0])
        launches = fake.launches()
        assert launches == ordinary(fake, monkeypatch, kvattn.decode.xqa_batch_decode_with_kv_cache, args,
                                    dict(kwargs, out=out))
    finally:
        _callcache._caches.remove(cache)
