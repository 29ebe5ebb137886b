"""Calls replayed from their metadata (kvattn.runtime.callcache), over the faked GPU of test_fast_launch:
a replay hands the launcher exactly what the ordinary path hands it for the same tensors; any
change of metadata, scalar, switch or stream misses; errors, debug checks and config overrides are
never replayed. (Calls that allocate their output or LSE: test_call_cache_forms.py.)"""

from __future__ import annotations

import os
import types

import pytest
import torch

import kvattn
from kvattn.runtime import callcache as _callcache
from kvattn.formats import FP8_DTYPE
from kvattn.ops.decode import configs as decode_configs
from kvattn.runtime import fast_launch, launch_replay
from kvattn.testing import make_paged_kv

from .test_fast_launch import FAST_PATH_TRITON, FakeGPU, _as_seen

pytestmark = FAST_PATH_TRITON
CPU = torch.device("cpu")


def fresh(t):
    """``t``'s values at a new address (a clone, of a tuple's items too)."""
    if isinstance(t, (tuple, list)):
        return type(t)(fresh(x) for x in t)
    return t.clone() if isinstance(t, torch.Tensor) else t


def batch_case(*, form="stacked", layout="NHD", dtype=torch.float16, fmt=None, lens=(700, 40, 2500)):
    case = make_paged_kv(list(lens), num_kv_heads=2, head_dim=128, page_size=16, dtype=dtype, kv_format=fmt,
                         layout=layout, form=form, nan_fill=False)
    q = torch.randn(len(lens), 16, 128).to(dtype)
    args = (q, case.kv_cache, torch.zeros(1 << 22, dtype=torch.uint8), case.block_tables, case.seq_lens,
            max(lens), 0.125, 1.0)
    kwargs = dict(out=torch.empty_like(q), kv_layout=layout, kv_cache_sf=case.kv_cache_sf)
    return kvattn.decode.xqa_batch_decode_with_kv_cache, args, kwargs


def xqa_case():
    case = make_paged_kv([700, 40], num_kv_heads=2, head_dim=128, page_size=32, dtype=torch.float16, nan_fill=False)
    q = torch.randn(2, 1, 16, 128).to(torch.float16)
    k, v = (case.kv_cache[:, i].reshape(-1, 128).clone() for i in (0, 1))
    args = (q, k, v, case.block_tables, case.seq_lens.view(-1, 1).to(torch.uint32), torch.empty_like(q),
            torch.zeros(1 << 22, dtype=torch.uint8), torch.zeros(8, dtype=torch.uint32), 2, 32)
    return kvattn.xqa.xqa, args, {}


def single_case(length=4096, **kw):
    q = torch.randn(32, 128).to(torch.float16)
    k, v = (torch.randn(length, 8, 128).to(torch.float16) for _ in range(2))
    return kvattn.decode.single_decode_with_kv_cache, (q, k, v), dict(out=torch.empty_like(q), **kw)


def mla_case(hq=16, page=16):
    """MLA over ``page``-token pages; 64+ heads over pages of 64: a Hopper's Gluon kernels (with
    fake_hopper)."""
    case = make_paged_kv([700, 40, 2500], num_kv_heads=1, head_dim=576, page_size=page, dtype=torch.bfloat16,
                         form="shared", nan_fill=False)
    q = torch.randn(3, 1, hq, 576).to(torch.bfloat16)
    args = (q, case.kv_cache[:, 0, :, 0], torch.zeros(1 << 26, dtype=torch.uint8), 128, 512, 64,
            case.block_tables, case.seq_lens, 2500)
    return kvattn.mla.xqa_batch_decode_with_kv_cache_mla, args, dict(out=torch.empty(3, hq, 512), bmm1_scale=0.07)


def prefill_case(*, hq=8, hkv=2, page=64, lens=(300, 70), lq=(50, 70), dtype=torch.bfloat16, **kw):
    """Paged prefill over an HND cache (prefill's default) of ``page``-token pages, permuted."""
    pages_per_seq = -(-max(lens) // page)
    pool = len(lens) * pages_per_seq + 3
    kv = torch.randn(pool, 2, hkv, page, 128).to(dtype)
    tables = torch.randperm(pool)[: len(lens) * pages_per_seq].to(torch.int32).view(len(lens), -1)
    cum_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32)
    cum_kv = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(cum_q[-1]), hq, 128).to(dtype)
    args = (q, kv, torch.zeros(1 << 20, dtype=torch.uint8), tables, torch.tensor(lens, dtype=torch.int32), max(lq),
            max(lens), 128 ** -0.5, 1.0, len(lens), cum_q, cum_kv)
    return kvattn.prefill.trtllm_batch_context_with_kv_cache, args, dict(out=torch.empty_like(q), **kw)


def fake_hopper(monkeypatch):
    """The launchers plan for a Hopper GPU (over FakeGPU's CPU tensors): MLA's and prefill's Gluon
    kernels, and prefill's Triton kernel with TMA descriptors (KVATTN_GLUON=0), take the launches
    their GPU tests prove they take there."""
    from kvattn.runtime import common as launch_common
    from kvattn.ops.mla import plan as mla_launch
    from kvattn.ops.prefill import plan_gluon_ws as prefill_ws
    from kvattn.ops.prefill import plan as prefill_launch

    monkeypatch.setenv("KVATTN_GLUON", os.environ.get("KVATTN_GLUON", "1"))
    monkeypatch.setattr(mla_launch, "arch", lambda device, interpreter: "sm90")
    monkeypatch.setattr(prefill_launch, "arch", lambda device, interpreter: "sm90")
    monkeypatch.setattr(prefill_launch, "_env", types.SimpleNamespace(triton_interpret=lambda: False))
    monkeypatch.setattr(prefill_launch, "_device", types.SimpleNamespace(has_tma=lambda device: True,
                                                                         sm_count=lambda device: 132))
    monkeypatch.setattr(prefill_launch, "words_allowed", lambda *args: False)

    def plan(*, device, gluon_on, q_dtype, head_dim, k, v, out_dtype, skip, nvfp4_out, interpreter):
        # gluon_ws.plan less its "on a GPU" test
        if not prefill_ws.eligible(hopper=True, gluon_on=gluon_on, q_dtype=q_dtype, kv_dtype=k.dtype,
                                   out_dtype=out_dtype, head_dim=head_dim, page=k.shape[1], skip=skip,
                                   nvfp4_out=nvfp4_out):
            return None
        views = prefill_ws.tma_view(k, k.shape[1]), prefill_ws.tma_view(v, v.shape[1])
        return None if None in views else (prefill_ws.config_for(q_dtype, k.dtype, head_dim), *views)

    monkeypatch.setattr(prefill_ws, "plan", plan)
    monkeypatch.setattr(prefill_launch, "_PLANS", {})  # (plans made for the faked GPU stay in the test)
    assert launch_common.arch is not None


def _gluon_off(case):
    def build():
        os.environ["KVATTN_GLUON"] = "0"  # (setup's monkeypatch restores it: fake_hopper keeps a set value)
        return case()
    return build


CASES = {
    "batch": batch_case,
    "batch-HND-tuple": lambda: batch_case(form="tuple", layout="HND"),
    "batch-kv-views-of-one-tensor": lambda: batch_case(form="tuple"),
    "batch-fp8": lambda: batch_case(fmt="fp8"),
    "batch-nvfp4": lambda: batch_case(fmt="nvfp4", form="tuple"),
    "xqa": xqa_case,
    "single": single_case,
    "single-rope-lse": lambda: single_case(pos_encoding_mode="ROPE_LLAMA", return_lse=True,
                                           lse=torch.empty(32)),
    "mla": mla_case,
    "prefill": prefill_case,
    "prefill-p16-window-sinks": lambda: prefill_case(page=16, window_left=100, sinks=torch.randn(8)),
    "prefill-gluon-hopper": prefill_case,
    "prefill-tma-hopper": _gluon_off(prefill_case),
    "mla-gluon-ws-hopper": lambda: mla_case(hq=64, page=64),
    "mla-gluon-ws-p16-hopper": lambda: mla_case(hq=64, page=16),
}
HOPPER = {"prefill-gluon-hopper", "prefill-tma-hopper", "mla-gluon-ws-hopper",
          "mla-gluon-ws-p16-hopper"}  # (planned for a faked Hopper)


def cache_of(fn) -> _callcache.CallCache:
    return {c.name: c for c in _callcache._caches}[fn.__name__]


def ordinary(fake, monkeypatch, fn, args, kwargs):
    """The launcher arguments of the call the ordinary way (no replay)."""
    monkeypatch.setenv("KVATTN_CALL_CACHE", "0")
    fn(*args, **kwargs)
    monkeypatch.setenv("KVATTN_CALL_CACHE", "1")
    return fake.launches()


def replayed(fake, fn, args, kwargs):
    cache = cache_of(fn)
    hits = cache.hits
    got = fn(*args, **kwargs)
    assert cache.hits == hits + 1, "the call was not replayed"
    return got, fake.launches()


def setup(monkeypatch, name):
    fake = FakeGPU(monkeypatch)
    monkeypatch.setenv("KVATTN_CALL_CACHE", "1")
    monkeypatch.setenv("KVATTN_GLUON", os.environ.get("KVATTN_GLUON", "1"))  # (restored after the test)
    if name in HOPPER:
        fake_hopper(monkeypatch)
    fn, args, kwargs = CASES[name]()
    args, kwargs = fresh(args), {k: fresh(v) for k, v in kwargs.items()}  # (a clone may change strides)
    fn(*args, **kwargs)  # compiles (through Triton: not recorded)
    fn(*args, **kwargs)  # the fast path: recorded
    fake.launches()
    return fake, fn, args, kwargs


def kv_views_of_one_tensor(args):
    if isinstance(args[1], tuple):  # K and V as views of one [P, 2, ...] tensor, as some engines keep them
        k, v = args[1]
        both = torch.stack([k, v], dim=1)
        return (args[0], (both[:, 0], both[:, 1]), *args[2:])
    return args


@pytest.mark.parametrize("name", list(CASES))
def test_a_replay_hands_the_launcher_what_the_ordinary_call_does(name, monkeypatch):
    fake, fn, args, kwargs = setup(monkeypatch, name)
    if name == "batch-kv-views-of-one-tensor":
        args = kv_views_of_one_tensor(args)
        fn(*args, **kwargs)
        fn(*args, **kwargs)
        fake.launches()
    for _ in range(2):  # new memory under every tensor argument, each time
        args, kwargs = fresh(args), {k: fresh(v) for k, v in kwargs.items()}
        if name == "batch-kv-views-of-one-tensor":
            args = kv_views_of_one_tensor(args)
        expected = ordinary(fake, monkeypatch, fn, args, kwargs)
        got, launches = replayed(fake, fn, args, kwargs)
        assert launches == expected and launches
        if kwargs.get("out") is not None and got is not None:
            want = (kwargs["out"], kwargs["lse"]) if kwargs.get("return_lse") else kwargs["out"]
            assert got is want if not isinstance(got, tuple) else all(a is b for a, b in zip(got, want))


@pytest.mark.parametrize("name, kernel", [("prefill-gluon-hopper", "prefill_ws_kernel"),
                                          ("prefill-tma-hopper", "context_kernel"),
                                          ("mla-gluon-ws-hopper", "mla_gluon_ws_kernel"),
                                          ("mla-gluon-ws-p16-hopper", "mla_gluon_ws_kernel")])
def test_tma_descriptors_are_rebuilt_on_the_new_pointers(name, kernel, monkeypatch):
    """The launches that take TMA descriptors (a Hopper's, faked) are replayed: each descriptor has
    the recorded geometry and its base moves with the cache it describes (K and V of prefill's
    cache, MLA's latent rows); another block shape or layout is another key (test_fast_launch)."""
    fake, fn, args, kwargs = setup(monkeypatch, name)
    (entry,) = cache_of(fn).entries.values()
    assert len(entry.rebuild) == (1 if name.startswith("mla") else 2)
    for _ in range(2):
        args, kwargs = fresh(args), {k: fresh(v) for k, v in kwargs.items()}
        _, launches = replayed(fake, fn, args, kwargs)
        assert launches[0][0].name == kernel
        seen = [a for a in launches[0][5] if isinstance(a, tuple) and a[0] == "descriptor"]
        cache = args[1]
        bases = sorted(d[1] for d in seen)
        if name.startswith("mla"):
            assert bases == [cache.data_ptr()]
            # (the box: a page's rows over pages smaller than the 64-key tile)
            assert [d[4] for d in seen] == [(16, 64) if "p16" in name else (64, 64)]
        else:  # HND [P, 2, Hkv, page, D]: K at the cache's start, V one [Hkv, page, D] block on
            assert bases == [cache.data_ptr(), cache[:, 1].data_ptr()]
        assert launches == ordinary(fake, monkeypatch, fn, args, kwargs)


@pytest.mark.parametrize("name", ["prefill-gluon-hopper", "mla-gluon-ws-hopper"])
@pytest.mark.parametrize("switch", ["KVATTN_GLUON", "KVATTN_GLUON_WS", "KVATTN_FAST_LAUNCH", "KVATTN_CALL_CACHE"])
def test_switches_reach_replayed_descriptor_launches(name, switch, monkeypatch):
    """A switch changed after a Gluon launch was recorded: the call is not replayed, and launches
    as the ordinary call does (another kernel for KVATTN_GLUON=0); KVATTN_CALL_CACHE=0 records and
    replays nothing."""
    fake, fn, args, kwargs = setup(monkeypatch, name)
    cache = cache_of(fn)
    _, before = replayed(fake, fn, args, kwargs)
    monkeypatch.setenv(switch, "0")
    hits, entries = cache.hits, len(cache.entries)
    fn(*args, **kwargs)  # another key (the switch's raw value), or the cache off: not a replay
    assert cache.hits == hits
    now = fake.launches()
    if switch == "KVATTN_GLUON":
        assert now[0][0].name != before[0][0].name
    expected = ordinary(fake, monkeypatch, fn, args, kwargs)
    monkeypatch.setenv(switch, "0")  # (ordinary() set KVATTN_CALL_CACHE back to 1)
    assert now == expected
    for _ in range(3):
        fn(*args, **kwargs)
    if switch in ("KVATTN_FAST_LAUNCH", "KVATTN_CALL_CACHE"):  # nothing recorded, nothing replayed
        assert cache.hits == hits and len(cache.entries) == entries
    else:  # the new key's own entry
        assert cache.hits > hits and len(cache.entries) == entries + 1


CHANGES = {
    "batch": lambda a, k: ((a[0][:2], a[1], a[2], a[3][:2], a[4][:2], *a[5:]), dict(k, out=k["out"][:2])),
    "seq_lens dtype": lambda a, k: ((*a[:4], a[4].to(torch.uint32), *a[5:]), k),
    "out strides": lambda a, k: (a, dict(k, out=torch.empty(a[0].shape[0], 32, 128, dtype=a[0].dtype)[:, ::2])),
    "out float32": lambda a, k: (a, dict(k, out=k["out"].float())),
    "out 8 bytes off alignment": lambda a, k: (a, dict(k, out=torch.empty(k["out"].numel() + 4, dtype=a[0].dtype)[4:]
                                                         .view(k["out"].shape))),
    "bmm1_scale": lambda a, k: ((*a[:6], 0.25, a[7]), k),
    "bmm1_scale as a tensor": lambda a, k: ((*a[:6], torch.tensor([0.125]), a[7]), k),
    "max_seq_len": lambda a, k: ((*a[:5], 2000, *a[6:]), k),
    "window_left": lambda a, k: (a, dict(k, window_left=100)),
    "sinks": lambda a, k: (a, dict(k, sinks=torch.randn(16))),
    "enable_pdl": lambda a, k: (a, dict(k, enable_pdl=True)),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_each_change_misses_and_launches_as_the_ordinary_call(change, monkeypatch):
    fake, fn, args, kwargs = setup(monkeypatch, "batch")
    cache = cache_of(fn)
    args2, kwargs2 = CHANGES[change](args, kwargs)
    expected = ordinary(fake, monkeypatch, fn, args2, kwargs2)
    hits, entries = cache.hits, len(cache.entries)
    fn(*args2, **kwargs2)  # a miss: the ordinary way (a key seen the first time is not recorded)
    assert cache.hits == hits and len(cache.entries) == entries
    assert fake.launches() == expected
    fn(*args2, **kwargs2)  # seen before: the ordinary way, recorded
    assert cache.hits == hits and len(cache.entries) == entries + 1
    assert fake.launches() == expected
    _, launches = replayed(fake, fn, args2, kwargs2)
    assert launches == expected
    _, launches = replayed(fake, fn, args, kwargs)  # the first signature still replays
    assert launches == ordinary(fake, monkeypatch, fn, args, kwargs)


@pytest.mark.parametrize("switch", ["KVATTN_FUSED_MERGE", "KVATTN_FAST_LAUNCH", "KVATTN_BATCH_INVARIANT"])
def test_a_changed_switch_misses(switch, monkeypatch):
    fake, fn, args, kwargs = setup(monkeypatch, "batch")
    cache = cache_of(fn)
    monkeypatch.setenv(switch, "0")
    hits = cache.hits
    fn(*args, **kwargs)
    assert cache.hits == hits
    assert fake.launches() == ordinary(fake, monkeypatch, fn, args, kwargs)


def test_the_python_batch_invariant_override_misses(monkeypatch):
    """kvattn.set_batch_invariant changes no environment variable, and a replay recorded before
    it would launch the batch-dependent splits: the override is part of the key."""
    import kvattn

    fake, fn, args, kwargs = setup(monkeypatch, "batch")
    cache = cache_of(fn)
    monkeypatch.setattr(kvattn.runtime.env, "_BATCH_INVARIANT", kvattn.runtime.env._BATCH_INVARIANT)
    try:
        kvattn.set_batch_invariant(True)
        hits = cache.hits
        fn(*args, **kwargs)
        assert cache.hits == hits
        assert fake.launches() == ordinary(fake, monkeypatch, fn, args, kwargs)
    finally:
        kvattn.set_batch_invariant(None)


def test_every_switch_is_in_the_key():
    from kvattn.runtime import callcache as _callcache, env as _env

    assert set(_env.SWITCH_NAMES) <= set(_callcache._ENV_NAMES)
    assert "KVATTN_BATCH_INVARIANT" in _env.SWITCH_NAMES


@pytest.mark.parametrize("bad, error", [
    (lambda a, k: ((*a[:5], 10 ** 6, *a[6:]), k), "max_seq_len"),  # past the table's capacity
    (lambda a, k: ((*a[:3], a[3].long(), *a[4:]), k), "block_tables"),
    (lambda a, k: (a, dict(k, out=k["out"][:, :8])), "out"),
    (lambda a, k: (a, dict(k, q_len_per_req=True)), "q_len_per_req"),  # True == 1 as a key
    (lambda a, k: ((*a[:6], float("nan"), a[7]), k), "bmm1_scale"),
    (lambda a, k: (a, dict(k, kv_layout="nhd ")), "kv_layout"),
])
def test_bad_inputs_raise_after_good_calls_were_recorded(bad, error, monkeypatch):
    fake, fn, args, kwargs = setup(monkeypatch, "batch")
    cache = cache_of(fn)
    _ = replayed(fake, fn, args, kwargs)
    args2, kwargs2 = bad(args, kwargs)
    entries = dict(cache.entries)
    for _ in range(3):  # never cached as a success
        with pytest.raises((ValueError, TypeError), match=f"^{error}"):
            fn(*args2, **kwargs2)
    assert cache.entries == entries
    assert fake.launches() == []


def test_debug_checks_run_on_every_call(monkeypatch):
    fake, fn, args, kwargs = setup(monkeypatch, "batch")
    _ = replayed(fake, fn, args, kwargs)
    tables = args[3].clone()
    tables[0, 0] = 10 ** 6  # a page id past the cache: only the device-value checks see it
    bad = (*args[:3], tables, *args[4:])
    _ = replayed(fake, fn, bad, kwargs)  # (unchecked, as on a GPU by default: the same metadata)
    monkeypatch.setenv("KVATTN_DEBUG", "1")
    for _ in range(3):
        with pytest.raises(ValueError, match="^block_tables: request 0 page slot 0"):
            fn(*bad, **kwargs)
    fn(*args, **kwargs)
    fn(*args, **kwargs)
    monkeypatch.setenv("KVATTN_DEBUG", "0")
    fn(*args, **kwargs)
    debug = list(_callcache._ENV_NAMES).index("KVATTN_DEBUG")
    assert {os.fsdecode(key[1][debug]) for key in cache_of(fn).entries} == {"0"}  # none recorded with the checks on


def test_calls_that_run_a_device_op_are_not_replayed(monkeypatch):
    """Strided sinks are copied to a contiguous tensor on the device (an op the launches do not hold)."""
    fake, fn, args, kwargs = setup(monkeypatch, "batch")
    kwargs = dict(kwargs, sinks=torch.randn(32)[::2])
    cache = cache_of(fn)
    hits, entries, failed = cache.hits, len(cache.entries), set(cache.failures)
    for _ in range(4):
        fn(*args, **kwargs)
    assert cache.hits == hits and len(cache.entries) == entries
    # Recorded and refused MAX_TRIES times; the fourth call is no longer recorded.
    assert [n for k, n in cache.failures.items() if k not in failed] == [_callcache.MAX_TRIES]


def test_no_replay_under_a_config_override(monkeypatch):
    fake, fn, args, kwargs = setup(monkeypatch, "batch")
    cache = cache_of(fn)
    with decode_configs.override(max_splits=2):
        hits = cache.hits
        fn(*args, **kwargs)
        fn(*args, **kwargs)
        assert cache.hits == hits and not cache.entries
        under = fake.launches()
    assert under[0][5] != ordinary(fake, monkeypatch, fn, args, kwargs)[0][5]
    fn(*args, **kwargs)
    _ = replayed(fake, fn, args, kwargs)


def test_kept_counters_pin_an_entry_to_its_stream(monkeypatch):
    """Single decode keeps its merge counters per stream: on another stream a recorded call misses,
    and the launches read that stream's counters."""
    fake, fn, args, kwargs = setup(monkeypatch, "single")
    (entry,) = cache_of(fn).entries.values()
    assert entry.constants and entry.stream == 7
    _ = replayed(fake, fn, args, kwargs)
    fake_stream = fast_launch.driver.active
    monkeypatch.setattr(fake_stream, "get_current_stream", lambda device: 8)
    hits = cache_of(fn).hits
    fn(*args, **kwargs)
    assert cache_of(fn).hits == hits
    on_8 = fake.launches()
    assert on_8 == ordinary(fake, monkeypatch, fn, args, kwargs) and on_8[0][2] == 8


def test_a_recompiled_kernel_is_not_replayed(monkeypatch):
    """A launch whose compiled kernel is gone from the fast path's cache (Triton's path would
    launch it) sends the whole call the ordinary way."""
    fake, fn, args, kwargs = setup(monkeypatch, "batch")
    (entry,) = cache_of(fn).entries.values()
    for launch in entry.launches:
        launch._compiled.clear()
    hits = cache_of(fn).hits
    fn(*args, **kwargs)
    assert cache_of(fn).hits == hits
    assert fake.launches() == ordinary(fake, monkeypatch, fn, args, kwargs)


def test_a_nested_recording_spoils_the_outer_one():
    outer, inner = _callcache.Record(), _callcache.Record()
    with fast_launch.recording(outer), fast_launch.recording(inner):
        pass
    assert outer.spoiled and inner.spoiled is None


def test_keys_tell_types_apart():
    q = torch.zeros(2, 3)
    keys = {_callcache._flatten((q, v))[0] for v in (1, True, 1.0)}
    assert len(keys) == 3
    assert _callcache._flatten((q, (q, q)))[0] != _callcache._flatten((q, [q, q]))[0]
    assert _callcache._flatten((q, 1))[0] != _callcache._flatten((q.t(), 1))[0]
    with pytest.raises(_callcache.Bypass):
        _callcache._flatten((q, object()))


# ---------------------------------------------------------------------------------------------
# descriptor launches down to Triton's C entry point (its own descriptor wrapper, faked encoder)
# ---------------------------------------------------------------------------------------------
def c_level(monkeypatch, fake):
    """Every kernel FakeGPU compiles gets a launcher built as the running Triton builds it (its own
    ``wrap_handle_tensordesc`` for descriptor parameters, a TMA metadata entry each) over a C entry
    that records what it receives; returns that record and the encoder (test_c_launcher)."""
    import re

    import triton.runtime.jit as jit

    from .test_c_launcher import Encoder, meta_of, tritons_launcher

    enc, calls = Encoder(monkeypatch), []
    fake_compile = jit.JITFunction._do_compile

    def do_compile(kernel, key, signature, device, constexprs, options, attrs, warmup):
        compiled = fake_compile(kernel, key, signature, device, constexprs, options, attrs, warmup)
        blocks = [re.match(r"tensordesc<[^[]*\[([^]]*)\]", s) for s in signature.values()
                  if isinstance(s, str) and s.startswith("tensordesc")]
        metas = [meta_of([int(x) for x in m.group(1).split(",")]) for m in blocks] or None
        compiled._run = tritons_launcher(signature, metas, calls)
        return compiled

    monkeypatch.setattr(jit.JITFunction, "_do_compile", do_compile)
    return calls, enc


def c_seen(calls: list) -> list:
    """The recorded C launches since the last look, as the GPU would see them: grid, stream,
    function, metadata and the parameters (tensors as their data pointers)."""
    from .test_c_launcher import c_params

    v36 = len(calls[0]) > 16 if calls else True
    out = [(a[:3], a[3], a[4], a[9] if v36 else a[7],
            tuple(p.data_ptr() if isinstance(p, torch.Tensor) else p for p in c_params(a))) for a in calls]
    calls.clear()
    return out


@pytest.mark.parametrize("name", sorted(HOPPER))
def test_replayed_descriptor_launches_reach_the_c_entry_as_tritons_path_does(name, monkeypatch):
    """Over launchers of Triton's own shape: a replay, the ordinary fast path and Triton's own path
    (KVATTN_FAST_LAUNCH=0) hand the C entry the same arguments, descriptors encoded the same; a
    replay over the same memory encodes nothing again, over new memory once per descriptor."""
    fake = FakeGPU(monkeypatch)
    calls, enc = c_level(monkeypatch, fake)
    monkeypatch.setenv("KVATTN_CALL_CACHE", "1")
    monkeypatch.setenv("KVATTN_FAST_LAUNCH", "1")  # (switched below: its raw value is in the key)
    monkeypatch.setenv("KVATTN_GLUON", os.environ.get("KVATTN_GLUON", "1"))
    fake_hopper(monkeypatch)
    fn, args, kwargs = CASES[name]()
    args, kwargs = fresh(args), {k: fresh(v) for k, v in kwargs.items()}
    fn(*args, **kwargs)
    fn(*args, **kwargs)
    (entry,) = cache_of(fn).entries.values()
    descriptors = len(entry.rebuild)
    alive = [(args, kwargs)]  # every call's memory, so that no new tensor lands where an old one was
    for _ in range(2):
        args, kwargs = fresh(args), {k: fresh(v) for k, v in kwargs.items()}
        alive.append((args, kwargs))
        c_seen(calls)
        monkeypatch.setenv("KVATTN_FAST_LAUNCH", "0")
        fn(*args, **kwargs)
        tritons = c_seen(calls)
        monkeypatch.setenv("KVATTN_FAST_LAUNCH", "1")
        monkeypatch.setenv("KVATTN_CALL_CACHE", "0")
        fn(*args, **kwargs)
        fast = c_seen(calls)
        monkeypatch.setenv("KVATTN_CALL_CACHE", "1")
        before = enc.count
        replayed(fake, fn, args, kwargs)
        replay = c_seen(calls)
        assert replay == fast == tritons and any(isinstance(p, tuple) and p[0] == "tensormap" for p in replay[0][4])
        assert enc.count == before  # (the ordinary fast call encoded these descriptors already)
        before = enc.count
        replayed(fake, fn, args, kwargs)
        assert c_seen(calls) == replay and enc.count == before
    alive.append((args, kwargs))
    args, kwargs = fresh(args), {k: fresh(v) for k, v in kwargs.items()}
    before = enc.count
    replayed(fake, fn, args, kwargs)
    assert enc.count == before + descriptors


# ---------------------------------------------------------------------------------------------
# what a replayed call reads
# ---------------------------------------------------------------------------------------------
def test_a_replay_asks_is_compiling_once_and_parses_no_switch(monkeypatch):
    """A replayed call checks torch.compile once and parses no switch: their raw values are in the
    key (read once per call), KVATTN_CALL_CACHE's meaning is kept per raw values, and the fast
    path was on when the entry was recorded under the same values."""
    from kvattn.runtime import env as _env

    fake, fn, args, kwargs = setup(monkeypatch, "batch")
    replayed(fake, fn, args, kwargs)  # (KVATTN_CALL_CACHE's meaning for these values, kept)
    compiling = []
    monkeypatch.setattr(_callcache, "_is_compiling", lambda: compiling.append(1) or False)
    parsed = []
    for name in ("call_cache", "fast_launch", "triton_interpret", "debug_checks", "gluon"):
        monkeypatch.setattr(_env, name, lambda name=name: parsed.append(name))
    monkeypatch.setattr(fast_launch, "fast_path_enabled", lambda: pytest.fail("the fast path's switches parsed"))
    _, launches = replayed(fake, fn, args, kwargs)
    assert launches and compiling == [1] and parsed == []


@pytest.mark.parametrize("hook", ["launch_enter_hook", "launch_exit_hook"])
def test_a_launch_hook_set_after_recording_stops_the_replay(hook, monkeypatch):
    from triton import knobs

    fake, fn, args, kwargs = setup(monkeypatch, "batch")
    replayed(fake, fn, args, kwargs)
    monkeypatch.setattr(knobs.runtime, hook, lambda metadata: None)
    hits = cache_of(fn).hits
    fn(*args, **kwargs)
    assert cache_of(fn).hits == hits


def test_the_current_device_is_read_through_torchs_c_getter(monkeypatch):
    """Where Triton's driver reads the device with ``torch.cuda.current_device`` (its lazy-init
    check, then ``torch._C._cuda_getDevice``), a replay calls the C getter, which initialises
    itself; another current device than the recorded one is not replayed."""
    fake, fn, args, kwargs = setup(monkeypatch, "batch")
    monkeypatch.setattr(fast_launch.driver.active, "get_current_device", launch_replay._torch_current_device)
    device = [0]
    monkeypatch.setattr(launch_replay, "_cuda_get_device", lambda: device[0])
    replayed(fake, fn, args, kwargs)  # (torch.cuda.current_device itself fails here: no CUDA)
    device[0] = 1
    hits = cache_of(fn).hits
    fn(*args, **kwargs)
    assert cache_of(fn).hits == hits


@pytest.mark.parametrize("name", ["batch", "mla", "prefill-gluon-hopper"])
def test_replay_launches_are_the_replays_arguments(name, monkeypatch):
    """``replay_launches`` (tools time a launcher alone with it) builds each launcher call a replay
    makes, without launching."""
    fake, fn, args, kwargs = setup(monkeypatch, name)
    cache = cache_of(fn)
    seen, run = [], _callcache.CallCache.run
    monkeypatch.setattr(_callcache.CallCache, "run", lambda c, a, call: seen.append(a) or run(c, a, call))
    hits = cache.hits
    fn(*args, **kwargs)
    assert cache.hits == hits + 1
    want = [a for _, a in fake.calls]
    fake.calls.clear()
    key, ptrs = _callcache._flatten(seen[0])
    built = launch_replay.replay_launches(cache.entries[key], ptrs, 7)
    assert not fake.calls and len(built) == len(want)
    for (launcher, got), expected in zip(built, want):
        assert tuple(map(_as_seen, got)) == tuple(map(_as_seen, expected))
        launcher(*got)
    assert len(fake.calls) == len(want)
