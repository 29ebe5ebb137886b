"""The call cache's hit path (kvattn.runtime.callcache: ``CallCache.hot``, ``_hot_entry``): the
entries a function's argument types last replayed are checked first, by one C++ check of the
tensors' metadata (kvattn.runtime.native_checks) and a comparison of everything else the key
holds. Any change the key would see must fail that check (the call then builds its key, and
misses or finds its own entry); without the native checks calls replay through the key alone."""

from __future__ import annotations

import pytest
import torch

from kvattn.runtime import callcache as _callcache, native_checks

from .test_call_cache import CHANGES, cache_of, fresh, ordinary, replayed, setup
from .test_fast_launch import FAST_PATH_TRITON


# ---------------------------------------------------------------------------------------------
# the check alone
# ---------------------------------------------------------------------------------------------
def hot_of(args: tuple, switches=("s",), override=None) -> tuple:
    """``CallCache.hot``'s value for calls of ``args``' types, with one candidate recorded from
    ``args`` (a stand-in entry)."""
    types = tuple(map(type, args))
    tensors_of, others_of = _callcache._signature(types)
    tensors = tensors_of(args)
    check = native_checks.tensor_guard(tensors)
    assert check is not None, "this PyTorch's tensor guard failed its self-test"
    bits = tuple(t.data_ptr() & 15 for t in tensors)
    return tensors_of, others_of, (("entry", check, others_of(args), switches, override, bits),)


def base_args():
    q = torch.randn(4, 8, 16, dtype=torch.float16)
    return q, torch.zeros(4, 64, dtype=torch.int32), 128, 0.5, "NHD", None


HOT_CHANGES = {
    "shape": lambda a: (a[0][:2], *a[1:]),
    "strides": lambda a: (a[0].transpose(0, 1).contiguous().transpose(0, 1), *a[1:]),
    "dtype": lambda a: (a[0].float(), *a[1:]),
    "int32 as uint32": lambda a: (a[0], a[1].to(torch.uint32), *a[2:]),
    "device": lambda a: (torch.empty(a[0].shape, dtype=a[0].dtype, device="meta"), *a[1:]),
    "8 bytes off alignment": lambda a: (torch.empty(a[0].numel() + 4, dtype=a[0].dtype)[4:].view(a[0].shape), *a[1:]),
    "an int scalar": lambda a: (*a[:2], 129, *a[3:]),
    "a float scalar": lambda a: (*a[:3], 0.25, *a[4:]),
    "a string": lambda a: (*a[:4], "HND", a[5]),
    "a subclass": lambda a: (torch.nn.Parameter(a[0], requires_grad=False), *a[1:]),
    "requires_grad": lambda a: (a[0].clone().requires_grad_(), *a[1:]),  # (not in the key: a stricter check)
}


def test_the_check_finds_equal_metadata_at_new_addresses():
    args = base_args()
    hot = hot_of(args)
    for _ in range(3):
        again = fresh(args)
        found = _callcache._hot_entry(hot, again, ("s",))
        assert found is not None and found[0] == "entry"
        assert found[1] == [again[0].data_ptr(), again[1].data_ptr()]


@pytest.mark.parametrize("change", list(HOT_CHANGES))
def test_the_check_fails_on_each_change(change):
    args = base_args()
    hot = hot_of(args)
    changed = HOT_CHANGES[change](fresh(args))
    if tuple(map(type, changed)) != tuple(map(type, args)):
        assert change == "a subclass"  # (another types key: never this candidate)
        return
    assert _callcache._hot_entry(hot, changed, ("s",)) is None


def test_the_check_fails_on_a_conjugate_view_switches_and_the_override():
    z = torch.randn(4, dtype=torch.complex64)
    hot = hot_of((z, 1))
    assert _callcache._hot_entry(hot, (z.clone(), 1), ("s",)) is not None
    assert _callcache._hot_entry(hot, (z.clone().conj(), 1), ("s",)) is None
    assert _callcache._hot_entry(hot, (z.clone(), 1), ("t",)) is None  # a switch's raw value
    args = base_args()
    hot = hot_of(args, override=None)
    saved = _callcache._OVERRIDES[0]
    try:
        _callcache._OVERRIDES[0] = True  # kvattn.set_batch_invariant(True)
        assert _callcache._hot_entry(hot, fresh(args), ("s",)) is None
    finally:
        _callcache._OVERRIDES[0] = saved


def test_equal_scalars_of_other_types_are_other_hot_slots():
    """True == 1 == 1.0 compare equal: the hot entries are kept per argument types, as the key
    holds every argument's type."""
    q = torch.zeros(2, 3)
    slots = {tuple(map(type, (q, v))) for v in (1, True, 1.0)}
    assert len(slots) == 3


def test_the_guard_verifies_itself_and_dict_versions_move():
    a = torch.zeros(2, 3)
    check = native_checks.tensor_guard([a])
    assert check(torch.ones(2, 3)) and not check(torch.ones(3, 2)) and not check(torch.ones(2, 3).double())
    version = native_checks.dict_version()
    assert version is not None
    d = {}
    before = version(d)
    d["x"] = 1
    assert version(d) != before


def test_a_guard_made_in_inference_mode_fails_outside_it():
    """The guard compares dispatch keys under the thread-local state it was made in: a stricter
    check (the call then builds its key), never a looser one."""
    with torch.inference_mode():
        check = native_checks.tensor_guard([torch.zeros(2, 3)])
        assert check(torch.ones(2, 3))
    assert not check(torch.ones(2, 3))


# ---------------------------------------------------------------------------------------------
# through the public functions (the faked GPU of test_fast_launch)
# ---------------------------------------------------------------------------------------------
@FAST_PATH_TRITON
@pytest.mark.parametrize("change", list(CHANGES))
def test_after_a_replay_each_change_misses_and_launches_as_the_ordinary_call(change, monkeypatch):
    """As test_call_cache's test of the same name, with the entry already checked first (a replay
    before the change)."""
    fake, fn, args, kwargs = setup(monkeypatch, "batch")
    cache = cache_of(fn)
    _ = replayed(fake, fn, args, kwargs)
    assert cache.hot, "a replay makes its entry the first checked"
    args2, kwargs2 = CHANGES[change](args, kwargs)
    expected = ordinary(fake, monkeypatch, fn, args2, kwargs2)
    hits = cache.hits
    fn(*args2, **kwargs2)
    assert cache.hits == hits
    assert fake.launches() == expected
    _, launches = replayed(fake, fn, args, kwargs)  # the first signature still replays
    assert launches == ordinary(fake, monkeypatch, fn, args, kwargs)


@FAST_PATH_TRITON
def test_forms_of_equal_types_alternate_from_the_hot_entries(monkeypatch):
    """return_lse True and False with the same argument types (the LSE allocated): both entries
    stay among the first checked, each call replays and launches as the ordinary call does."""
    fake, fn, args, kwargs = setup(monkeypatch, "batch")
    cache = cache_of(fn)
    with_lse = dict(kwargs, return_lse=True)
    for _ in range(3):
        fn(*args, **with_lse)
    fake.launches()
    for _ in range(3):
        for kw in (kwargs, with_lse):
            got, launches = replayed(fake, fn, args, kw)
            assert isinstance(got, tuple) == ("return_lse" in kw)
            given = dict(kw, lse=got[1]) if isinstance(got, tuple) else kw  # (the LSE the replay made)
            assert launches == ordinary(fake, monkeypatch, fn, args, given)
    (candidates,) = [h[2] for h in cache.hot.values()]
    assert len(candidates) == 2


@FAST_PATH_TRITON
def test_without_the_native_checks_calls_replay_through_the_key(monkeypatch):
    monkeypatch.setattr(native_checks, "_guard_class", None)  # (as where TensorGuards is missing)
    fake, fn, args, kwargs = setup(monkeypatch, "batch")
    cache = cache_of(fn)
    for _ in range(3):
        args, kwargs = fresh(args), {k: fresh(v) for k, v in kwargs.items()}
        _, launches = replayed(fake, fn, args, kwargs)
        assert launches == ordinary(fake, monkeypatch, fn, args, kwargs)
    assert not cache.hot


@FAST_PATH_TRITON
def test_a_switch_set_after_a_replay_is_read(monkeypatch):
    """The switches are read again once os.environ changed (its dict version): KVATTN_CALL_CACHE=0
    right after a replay runs the ordinary call; an unrelated variable changes nothing."""
    fake, fn, args, kwargs = setup(monkeypatch, "batch")
    cache = cache_of(fn)
    _ = replayed(fake, fn, args, kwargs)
    monkeypatch.setenv("KVATTN_HOT_TEST_UNRELATED", "1")
    _ = replayed(fake, fn, args, kwargs)
    monkeypatch.setenv("KVATTN_CALL_CACHE", "0")
    hits = cache.hits
    fn(*args, **kwargs)
    assert cache.hits == hits
    monkeypatch.setenv("KVATTN_CALL_CACHE", "1")
    _ = replayed(fake, fn, args, kwargs)


@FAST_PATH_TRITON
def test_a_kernel_global_changed_after_a_replay_stops_it(monkeypatch):
    """A global the kernel read at compile time changed in its module (the module dict's version
    moves): neither the replay nor the fast path launches, and Triton's own path refuses the
    launch; set back, the call replays again. (The faked kernels read their globals through
    interpreter helpers here: the global is one of this test's.)"""
    fake, fn, args, kwargs = setup(monkeypatch, "batch")
    cache = cache_of(fn)
    (entry,) = cache.entries.values()
    launch = entry.launches[0]
    module_globals = {"SOME_CONSTANT": 3}
    monkeypatch.setattr(launch.kernel, "used_global_vals", {("SOME_CONSTANT", id(module_globals)): (3, module_globals)})
    launch._remember_globals()
    for _ in range(2):  # (the first compares the values, the next the dict's version)
        _ = replayed(fake, fn, args, kwargs)
    module_globals["SOME_CONSTANT"] = 4
    hits = cache.hits
    with pytest.raises(RuntimeError, match="SOME_CONSTANT has changed"):
        fn(*args, **kwargs)
    assert cache.hits == hits and not fake.launches()
    module_globals["SOME_CONSTANT"] = 3
    _, launches = replayed(fake, fn, args, kwargs)
    assert launches and launches == ordinary(fake, monkeypatch, fn, args, kwargs)


@FAST_PATH_TRITON
def test_forgetting_the_recordings_empties_the_hot_entries(monkeypatch):
    fake, fn, args, kwargs = setup(monkeypatch, "batch")
    cache = cache_of(fn)
    _ = replayed(fake, fn, args, kwargs)
    assert cache.hot
    _callcache.clear()
    assert not cache.hot and not cache.entries


# ---------------------------------------------------------------------------------------------
# tuple arguments (K and V as a tuple): the tensors in the key's order, the tuple's length
# ---------------------------------------------------------------------------------------------
def nested_hot_of(args: tuple) -> tuple:
    types = tuple(map(type, args))
    _callcache._flatten(args)  # (the signature, as a call's key makes it)
    tensors_of, others_of = _callcache._hot_pickers(types)
    tensors = tensors_of(args)
    assert tensors == _callcache._tensors(args)
    check = native_checks.tensor_guard(tensors)
    bits = tuple(t.data_ptr() & 15 for t in tensors)
    return tensors_of, others_of, (("entry", check, others_of(args), ("s",), None, bits),)


def kv_args():
    q = torch.randn(2, 8, 64, dtype=torch.float16)
    k, v = (torch.randn(5, 2, 16, 64, dtype=torch.float16) for _ in range(2))
    return q, (k, v), 16, None


NESTED_CHANGES = {
    "v strides": lambda a: (a[0], (a[1][0], torch.randn(5, 16, 2, 64, dtype=torch.float16).transpose(1, 2)), *a[2:]),
    "v dtype": lambda a: (a[0], (a[1][0], a[1][1].bfloat16()), *a[2:]),
    "k and v swapped shapes": lambda a: (a[0], (a[1][0][:4], a[1][1]), *a[2:]),
    "three items": lambda a: (a[0], (*a[1], a[1][1]), *a[2:]),
    "an int item": lambda a: (a[0], (a[1][0], 3), *a[2:]),
    "a scalar": lambda a: (*a[:2], 32, None),
}


def test_tuple_arguments_find_their_entry_at_new_addresses():
    args = kv_args()
    hot = nested_hot_of(args)
    again = fresh(args)
    found = _callcache._hot_entry(hot, again, ("s",))
    assert found is not None and found[1] == [t.data_ptr() for t in _callcache._tensors(again)]


@pytest.mark.parametrize("change", list(NESTED_CHANGES))
def test_tuple_arguments_fail_the_check_on_each_change(change):
    args = kv_args()
    hot = nested_hot_of(args)
    assert _callcache._hot_entry(hot, NESTED_CHANGES[change](fresh(args)), ("s",)) is None


@FAST_PATH_TRITON
@pytest.mark.parametrize("name", ["batch-HND-tuple", "prefill-gluon-hopper"])
def test_calls_with_a_tuple_argument_replay_from_the_hot_entries(name, monkeypatch):
    fake, fn, args, kwargs = setup(monkeypatch, name)
    cache = cache_of(fn)
    if name.startswith("prefill"):  # (K and V of its HND cache as a tuple)
        args = (args[0], (args[1][:, 0].contiguous(), args[1][:, 1].contiguous()), *args[2:])
        fn(*args, **kwargs)
        fn(*args, **kwargs)
        fake.launches()
    assert isinstance(args[1], tuple)
    _ = replayed(fake, fn, args, kwargs)
    assert any(tuple in types for types in cache.hot)
    for _ in range(2):
        args, kwargs = fresh(args), {k: fresh(v) for k, v in kwargs.items()}
        _, launches = replayed(fake, fn, args, kwargs)
        assert launches == ordinary(fake, monkeypatch, fn, args, kwargs)
