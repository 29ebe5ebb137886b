"""The host path's shortcuts: memoised environment switches and int specialisations, cached
aliases, and the one-expression tests of common valid arguments that run before the detailed
checks (they must accept nothing the detailed checks reject, and change no error)."""

from __future__ import annotations

import pytest
import torch

from kvattn.runtime import env as _env
from kvattn import _inputs
from kvattn._inputs import check_tensor
from kvattn._inputs import check_out
from kvattn._inputs.paged import _split_kv
from kvattn.formats import FP8_DTYPE
from kvattn.runtime import arg_specs, fast_launch


# ---------------------------------------------------------------------------------------------
# environment switches
# ---------------------------------------------------------------------------------------------
def test_switches_follow_every_change(monkeypatch):
    for i in range(3 * _env._MAX_MEMO):  # past the memo's bound
        monkeypatch.setenv("KVATTN_DEBUG", f"{' ' * (i % 7)}{'on' if i % 2 else 'off'}{' ' * (i // 7)}")
        assert _env.debug_checks() is bool(i % 2)
    monkeypatch.delenv("KVATTN_DEBUG")
    assert _env.debug_checks() is None  # (unset: the tensors' device decides)
    monkeypatch.setenv("KVATTN_FAST_LAUNCH", "off")
    assert _env.fast_launch() is False
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert _env.triton_interpret() is True
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert _env.triton_interpret() is False


def test_a_bad_backend_raises_on_every_call(monkeypatch):
    monkeypatch.setenv("KVATTN_BACKEND", "cuda")
    for _ in range(2):  # not memoised
        with pytest.raises(ValueError, match="^KVATTN_BACKEND:"):
            _env.backend_override()
    monkeypatch.setenv("KVATTN_BACKEND", " Triton ")
    assert _env.backend_override() == "triton"


def test_switches_keep_their_names():
    for name in ("backend_override", "debug_checks", "fast_launch", "triton_interpret"):
        fn = getattr(_env, name)
        assert fn.__name__ == name and fn.__doc__


# ---------------------------------------------------------------------------------------------
# int specialisations
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ints", [(1, 16), (17, -1), (2**31, 0), (2**63 + 16,), ()])
def test_int_specs_memo_gives_int_spec(ints):
    for _ in range(2):  # computed, then memoised
        assert fast_launch._int_specs(ints) == tuple(map(arg_specs.int_spec, ints))


@pytest.mark.parametrize("equal", [(True, 16), (1.0, 16), (1, 16.0)])
def test_int_specs_memo_counts_exact_ints_only(equal):
    """``(True, 16) == (1, 16)`` as dict keys: a memoised entry must not answer for them."""
    fast_launch._int_specs((1, 16))
    with pytest.raises(arg_specs.Unspecializable):
        fast_launch._int_specs(equal)


# ---------------------------------------------------------------------------------------------
# cached aliases
# ---------------------------------------------------------------------------------------------
def test_no_cached_alias_once_the_base_requires_grad():
    base = torch.randn(4, 2, 16, 2, 8)
    k, _ = _split_kv(base, "kv_cache", "HND")
    assert _split_kv(base, "kv_cache", "HND")[0] is k
    base.requires_grad_(True)
    k2, _ = _split_kv(base, "kv_cache", "HND")
    assert k2 is not k and k2.requires_grad  # a view tracked by autograd, not the cached alias


def test_cached_alias_follows_new_storage_of_the_same_tensor():
    base = torch.randn(4, 2, 16, 2, 8)
    k, _ = _split_kv(base, "kv_cache", "HND")
    base.set_(torch.randn(4, 2, 16, 2, 8))  # same object, same shape, other memory
    k2, _ = _split_kv(base, "kv_cache", "HND")
    assert k2.data_ptr() == base.data_ptr() != k.data_ptr()


# ---------------------------------------------------------------------------------------------
# one-expression tests of common arguments vs the detailed checks
# ---------------------------------------------------------------------------------------------
class Sub(torch.Tensor):
    """A tensor subclass: never passes the quick tests (they take exact torch.Tensor only), so it
    shows what the detailed checks alone say about the same tensor."""


def _outcome(fn, x):
    try:
        fn(x)
    except Exception as exc:  # (the detailed checks may raise any error; both paths must raise the same)
        return type(exc), str(exc).replace("Sub", "Tensor")
    return None


def _variants(shape, dtype):
    t = torch.zeros(shape, dtype=dtype)
    wide = torch.zeros(*shape[:-1], 2 * shape[-1], dtype=dtype)
    return [
        t, t.to(torch.float32), t.to(torch.int32), t.to(torch.uint8), t.to(torch.uint32), t.to(FP8_DTYPE),
        wide[..., ::2], wide[..., :1], torch.zeros((*shape[:-1], 1), dtype=dtype)[..., :1].expand(*shape[:-1], 1),
        t[:1], t.unsqueeze(0), t.reshape(-1), t[(0,) * (len(shape) - 1)], torch.zeros((), dtype=dtype),
        torch.empty(shape, dtype=dtype, device="meta"), t.transpose(0, -1), t.view(-1).view(shape),
    ]


CHECKS = [
    pytest.param(lambda x: check_out(x, "out", (3, 4, 8), (torch.bfloat16, FP8_DTYPE), torch.device("cpu")),
                 (3, 4, 8), torch.bfloat16, id="check_out"),
    pytest.param(lambda x: _inputs.check_seq_lens(x, "seq_lens", 3, torch.device("cpu")), (3,), torch.int32,
                 id="check_seq_lens"),
    pytest.param(lambda x: _inputs.check_seq_lens(x, "seq_lens", 3, torch.device("cpu")), (3, 1), torch.uint32,
                 id="check_seq_lens-2d"),
    pytest.param(lambda x: _inputs.check_workspace(x, "workspace", torch.device("cpu")),
                 (_inputs.MIN_WORKSPACE_BYTES,), torch.uint8, id="check_workspace"),
    pytest.param(lambda x: check_tensor(x, "kv_cache", dtypes=(torch.float16, FP8_DTYPE), device=torch.device("cpu"),
                                        contiguous_last=True),
                 (5, 16, 2, 8), torch.float16, id="check_tensor-pages"),
    pytest.param(lambda x: check_tensor(x, "q", dtypes=(torch.bfloat16,), ndim=3, device=torch.device("cpu"),
                                        contiguous_last=True),
                 (3, 4, 8), torch.bfloat16, id="check_tensor-query"),
    pytest.param(lambda x: check_tensor(x, "q", dtypes=(torch.bfloat16,), ndim=2, contiguous_last=True), (4, 8),
                 torch.bfloat16, id="check_tensor-any-device"),
    pytest.param(lambda x: check_tensor(x, "cache", dtypes=(torch.bfloat16,), ndim=(2, 4), contiguous_last=True),
                 (4, 8), torch.bfloat16, id="check_tensor-ranks"),
]


@pytest.mark.parametrize("check, shape, dtype", CHECKS)
def test_quick_tests_accept_only_what_the_detailed_checks_accept(check, shape, dtype):
    accepted = 0
    for x in _variants(shape, dtype):
        expected = _outcome(check, x.as_subclass(Sub))  # the detailed checks only
        assert _outcome(check, x) == expected, (x.shape, x.stride(), x.dtype, x.device)
        accepted += expected is None
    assert accepted >= 1  # the variants hold a valid one


def test_checks_return_what_they_returned_before():
    lens = torch.zeros(3, 1, dtype=torch.int32)
    assert _inputs.check_seq_lens(lens, "seq_lens", 3, torch.device("cpu")).shape == (3,)
    flat = torch.zeros(3, dtype=torch.int32)
    assert _inputs.check_seq_lens(flat, "seq_lens", 3, torch.device("cpu")) is flat
    out = torch.zeros(3, 4, 8, dtype=torch.bfloat16)
    assert check_out(out, "out", (3, 4, 8), (torch.bfloat16,), torch.device("cpu")) is out


def test_scale_one_is_shared_and_immutable():
    one = _inputs.to_scale(1.0, "bmm2_scale", torch.device("cpu"))
    assert one is _inputs.to_scale(1.0, "bmm2_scale", torch.device("cpu")) and one == _inputs.Scale(1.0)
    with pytest.raises(AttributeError):
        one.factor = 2.0
    assert _inputs.to_scale(-0.0, "bmm1_scale", torch.device("cpu")).factor == 0.0
    assert str(_inputs.to_scale(-0.0, "bmm1_scale", torch.device("cpu")).factor) == "-0.0"
