"""The fast launch path (``kvattn.runtime.fast_launch``) and the cached launch plans of ``ops/decode/plan.py``.

CPU tier: the specialisation rules against Triton's own ``native_specialize_impl``, what changes a
launch key, launch plans, cached views, the environment switches, and the launcher's handling of
query/length shapes (kernels in the interpreter, where every launch is Triton's own).

GPU tier: after one call, an identical call never enters ``JITFunction.run``; over calls that vary
alignment, strides, lengths, dtypes and split counts the fast path launches the compiled kernel
Triton itself picks and writes the same bits as Triton's path; CUDA-graph capture and replay run
through it; a launch hook sends every launch back through Triton.
"""

from __future__ import annotations

import gc
import math
import types

import pytest
import torch
import triton
import triton.language as tl
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend
from triton.runtime.jit import JITFunction

import kvattn
from kvattn.runtime import env as _env
from kvattn._inputs import aliases as _aliases
from kvattn._inputs import checks as _checks
from kvattn._inputs.paged import _split_kv
from kvattn._formats_table import BY_NAME
from kvattn.formats import FP8_DTYPE
from kvattn.ops.append import plan as append_launch
from kvattn.ops.decode import configs as decode_configs
from kvattn.ops.decode import plan as decode_launch
from kvattn.runtime import arg_specs, fast_launch, launch_replay, tma_descriptors
from kvattn.runtime import common as launch_common
from kvattn.runtime import workspace as launch_workspace
from kvattn.ops.mla import plan as mla_launch
from kvattn.ops.prefill import plan as prefill_launch
from kvattn.testing import make_paged_kv, poison_

ON_GPU = torch.cuda.is_available()
GPU_ONLY = pytest.mark.skipif(not ON_GPU, reason="the fast path launches compiled kernels: GPU only")
# The fast path models one Triton's specialisation and launcher, so it is gated to the versions it
# was verified with; elsewhere every launch is Triton's own (test_unverified_tritons_take_tritons_path).
FAST_PATH_TRITON = pytest.mark.skipif(
    not fast_launch.TRITON_SUPPORTED,
    reason=f"the fast path is gated to Triton {' / '.join(fast_launch.FAST_LAUNCH_VERSIONS)} (verified there); "
           f"{triton.__version__} launches through kernel[grid]")


# ---------------------------------------------------------------------------------------------
# the specialisation rules
# ---------------------------------------------------------------------------------------------
def native(value):
    """Triton's own specialisation of an unannotated argument (specialise and align on)."""
    return native_specialize_impl(BaseBackend, value, False, True, True)


INTS = [0, 1, 2, 15, 16, 17, 32, 48, -1, -15, -16, -17, -(2**31), -(2**31) - 1, -(2**31) - 16,
        2**31 - 1, 2**31 - 16, 2**31, 2**31 + 1, 2**40, 2**63 - 1, 2**63 - 16, -(2**63), 2**63, 2**63 + 1,
        2**63 + 16, 2**64 - 1, 2**64 - 16]


def spec_values():
    buf = torch.zeros(64, dtype=torch.float16)
    return [*INTS, True, False, 0.0, 1.0, -2.5, None, buf, buf[1:], buf[8:], buf[3:], buf.view(torch.int16),
            buf.view(torch.int16)[1:], buf.float(), buf.float()[2:], buf.view(torch.uint8)[16:],
            # tuples: each member specialised as an argument of its own
            (16, 17), (32, 33), (16, 1), (17, 16), (16, 2**31), (16,), (16, 17, 0), (0.5, 16), (buf, 16), (buf[1:], 16)]


def test_arg_spec_partitions_values_as_triton_does():
    """Two arguments get the same arg_spec exactly when Triton specialises them alike."""
    values = spec_values()
    ours = [arg_specs.arg_spec(v) for v in values]
    theirs = [native(v) for v in values]
    for i, a in enumerate(values):
        for j, b in enumerate(values):
            assert (ours[i] == ours[j]) == (theirs[i] == theirs[j]), (a, b, ours[i], ours[j], theirs[i], theirs[j])


@pytest.mark.parametrize("value", [2**64, 2**70, -(2**63) - 1, -(2**70)])
def test_ints_beyond_64_bits_are_left_to_triton(value):
    with pytest.raises(OverflowError):
        native(value)
    with pytest.raises(arg_specs.Unspecializable):
        arg_specs.int_spec(value)


@pytest.mark.parametrize("value", [True, 1.0, None, "1"])
def test_int_spec_takes_ints_only(value):
    with pytest.raises(arg_specs.Unspecializable):
        arg_specs.int_spec(value)


# ---------------------------------------------------------------------------------------------
# what changes a key
# ---------------------------------------------------------------------------------------------
def _key(tensors=None, ints=(5,), device=0):
    tensors = tensors if tensors is not None else (_BUF[8:40],)
    return fast_launch.call_key(device, tuple(t.dtype for t in tensors), tuple(t.data_ptr() for t in tensors), ints)


_BUF = torch.zeros(256, dtype=torch.float16)


@FAST_PATH_TRITON
def test_equal_calls_give_equal_keys():
    assert _key() == _key()
    assert _key((_BUF[8:40],)) == _key((_BUF[16:20],))  # both 16-byte aligned, one dtype
    assert _key(ints=(32,)) == _key(ints=(48,))  # both i32, divisible by 16
    assert _key(ints=(17,)) == _key(ints=(33,))  # both i32, not divisible


@pytest.mark.parametrize("change", [
    pytest.param(lambda: _key((_BUF[9:40],)), id="pointer-offset-one-element"),
    pytest.param(lambda: _key((_BUF[8:40].view(torch.int16),)), id="dtype"),
    pytest.param(lambda: _key((_BUF[8:40], _BUF[8:40])), id="one-more-tensor"),
    pytest.param(lambda: _key(ints=(1,)), id="int-1"),
    pytest.param(lambda: _key(ints=(16,)), id="int-divisible-by-16"),
    pytest.param(lambda: _key(ints=(2**31 + 5,)), id="int64-range"),
    pytest.param(lambda: _key(ints=(2**63 + 5,)), id="uint64-range"),
    pytest.param(lambda: _key(ints=(5, 5)), id="one-more-int"),
    pytest.param(lambda: _key(device=1), id="device"),
])
@FAST_PATH_TRITON
def test_each_fact_changes_the_key(change):
    assert change() != _key()


@FAST_PATH_TRITON
def test_compile_knobs_change_the_key(monkeypatch):
    base = _key()
    monkeypatch.setattr(fast_launch.knobs.runtime, "debug", not fast_launch.knobs.runtime.debug)
    assert _key() != base
    monkeypatch.undo()
    monkeypatch.setattr(fast_launch.knobs.compilation, "instrumentation_mode", "consan")
    assert _key() != base


def _toy(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr, FLAG: tl.constexpr):
    pass


def _toy_interleaved(x_ptr, BLOCK: tl.constexpr, n):
    pass


def _toy_tuples(x_ptr, strides, n, SHAPE: tl.constexpr):
    pass


TOY_TUPLES = dict(strides=("stride_a", "stride_b"), SHAPE=("BLOCK", "FLAG"))


TOY = JITFunction(_toy)  # never compiled: only its parameters are read


TOY_LAYOUT = fast_launch.CallLayout(("x", "y"), (), ("scale",))


def _launch(kernel=TOY, n=64, constexprs=None, options=None, per_call=None, fixed=None):
    return fast_launch.Launch(
        kernel, (4,), layout=TOY_LAYOUT,
        per_call=dict(x_ptr="x", y_ptr="y", scale="scale") if per_call is None else per_call,
        fixed=dict(n=n) if fixed is None else fixed,
        constexprs=dict(BLOCK=32, FLAG=True) if constexprs is None else constexprs,
        options=dict(num_warps=4, num_stages=2) if options is None else options,
    )


def _static(**kw):
    return _launch(**kw).static_key()


@FAST_PATH_TRITON
def test_equal_launches_give_equal_static_keys():
    assert _static() is not None
    assert _static() == _static()
    assert _static(n=64) == _static(n=4096)  # both divisible by 16
    assert _static(options=dict(num_stages=2, num_warps=4)) == _static()  # keyword order


@pytest.mark.parametrize("change", [
    pytest.param(dict(n=1), id="int-1"),
    pytest.param(dict(n=65), id="int-not-divisible"),
    pytest.param(dict(n=2**31 + 64), id="int64"),
    pytest.param(dict(n=64.0), id="float-for-int"),
    pytest.param(dict(n=True), id="bool-for-int"),
    pytest.param(dict(constexprs=dict(BLOCK=64, FLAG=True)), id="constexpr-value"),
    pytest.param(dict(constexprs=dict(BLOCK=32, FLAG=1)), id="constexpr-type"),
    pytest.param(dict(options=dict(num_warps=8, num_stages=2)), id="num-warps"),
    pytest.param(dict(options=dict(num_warps=4, num_stages=3)), id="num-stages"),
    pytest.param(dict(options=dict(num_warps=4, num_stages=2, launch_pdl=True)), id="launch-pdl"),
    pytest.param(dict(per_call=dict(x_ptr="x", y_ptr="x", scale="scale")), id="pointer-sources"),
])
@FAST_PATH_TRITON
def test_each_bound_fact_changes_the_static_key(change):
    assert _static(**change) != _static()


@pytest.mark.parametrize("kw", [
    pytest.param(dict(kernel=JITFunction(_toy, do_not_specialize=["n"])), id="do-not-specialize"),
    pytest.param(dict(kernel=JITFunction(_toy, do_not_specialize_on_alignment=["x_ptr"])), id="no-align"),
    pytest.param(dict(n="64"), id="unknown-argument-type"),
])
def test_launches_outside_the_rules_are_left_to_triton(kw):
    assert _static(**kw) is None


def test_unverified_tritons_take_tritons_path(monkeypatch):
    """On a Triton the fast path was not verified with, no launch takes it: no static key, the
    path is off, a call gets no key, and a launch runs through ``kernel[grid]``."""
    monkeypatch.setattr(fast_launch, "TRITON_SUPPORTED", False)
    monkeypatch.setattr(fast_launch, "_on_gpu", lambda t: True)
    monkeypatch.setattr(fast_launch, "_device", types.SimpleNamespace(is_interpreter=lambda: False))
    launch = _launch()
    assert launch.static_key() is None and not launch.fast
    assert not fast_launch.fast_path_enabled()
    assert fast_launch.call_args((_BUF,), (3,)).key is None


@pytest.mark.parametrize("kw,message", [
    pytest.param(dict(constexprs=dict(BLOCK=32)), r"constexprs: expected \['BLOCK', 'FLAG'\]", id="constexpr-missing"),
    pytest.param(dict(fixed={}), r"no value for \['n'\]", id="argument-missing"),
    pytest.param(dict(fixed=dict(n=64, m=3)), r"not arguments of the kernel: \['m'\]", id="unknown-parameter"),
    pytest.param(dict(fixed=dict(n=64, scale=1.0)), r"given twice: \['scale'\]", id="given-twice"),
    pytest.param(dict(per_call=dict(x_ptr="x", y_ptr="z", scale="scale")), r"not in the call layout: \['z'\]",
                 id="unknown-call-value"),
])
def test_launches_name_every_parameter_once(kw, message):
    """Arguments go by the kernel's parameter names: one nobody gives, a name the kernel lacks or a
    value the call does not have fails when the launch is built, naming it."""
    with pytest.raises(TypeError, match=message):
        _launch(**kw)


def test_names_resolve_to_the_kernels_parameter_order():
    """Each parameter takes its named value wherever it sits, constexprs interleaved too."""
    call = fast_launch.CallArgs((_BUF[:8], _BUF[8:16]), (), (0.5,))
    launch = _launch(n=48)
    assert launch.argument("y_ptr", call) is call.tensors[1] and launch.argument("scale", call) == 0.5
    assert launch.argument("n", call) == 48 and launch.argument("FLAG", call) is True
    inter = fast_launch.Launch(JITFunction(_toy_interleaved), (1,), layout=TOY_LAYOUT, per_call=dict(x_ptr="y"),
                               fixed=dict(n=7), constexprs=dict(BLOCK=16), options={})
    assert (inter.static_key() is not None) == fast_launch.TRITON_SUPPORTED  # the fast path takes it too
    assert [inter.argument(n, call) for n in ("BLOCK", "n")] == [16, 7]
    assert inter.argument("x_ptr", call) is call.tensors[1]


def _tuple_launch(**kw):
    args = dict(layout=TOY_LAYOUT, per_call=dict(x_ptr="y"), fixed=dict(stride_a=64, stride_b=1, n=7),
                constexprs=dict(BLOCK=16, FLAG=True), options={}, tuples=TOY_TUPLES)
    return fast_launch.Launch(JITFunction(_toy_tuples), (1,), **{**args, **kw})


def test_tuple_parameters_are_named_by_their_members():
    """A tuple parameter takes the tuple of its members' values, each named as a parameter of its
    own (a constexpr tuple's among the constexprs); the launch keeps the members by name."""
    call = fast_launch.CallArgs((_BUF[:8], _BUF[8:16]), (), (0.5,))
    launch = _tuple_launch()
    assert launch.argument("strides", call) == (64, 1) and launch.argument("SHAPE", call) == (16, True)
    assert launch.argument("stride_b", call) == 1 and launch.argument("FLAG", call) is True
    assert launch.argument("n", call) == 7 and launch.argument("x_ptr", call) is call.tensors[1]
    assert launch.fixed["stride_a"] == 64 and launch.constexprs["BLOCK"] == 16
    assert (launch.static_key() is not None) == fast_launch.TRITON_SUPPORTED


@pytest.mark.parametrize("kw,message", [
    pytest.param(dict(fixed=dict(stride_a=64, n=7)), r"no value for \['stride_b'\]", id="member-missing"),
    pytest.param(dict(fixed=dict(strides=(64, 1), n=7)), r"not arguments of the kernel: \['strides'\]",
                 id="tuple-by-its-own-name"),
    pytest.param(dict(constexprs=dict(BLOCK=16)), r"constexprs: expected \['BLOCK', 'FLAG'\]",
                 id="constexpr-member-missing"),
    pytest.param(dict(per_call=dict(x_ptr="y", stride_a="scale"), fixed=dict(stride_b=1, n=7)),
                 r"tuple members take fixed values only: \['stride_a'\]", id="per-call-member"),
    pytest.param(dict(tuples=dict(TOY_TUPLES, other=("n",))), r"tuples of no parameter: \['other'\]",
                 id="unknown-tuple"),
])
def test_tuple_members_are_each_named_once(kw, message):
    with pytest.raises(TypeError, match=message):
        _tuple_launch(**kw)


@pytest.mark.parametrize("change", [
    pytest.param(dict(fixed=dict(stride_a=64, stride_b=2, n=7)), id="member-int-1"),
    pytest.param(dict(fixed=dict(stride_a=65, stride_b=1, n=7)), id="member-not-divisible"),
    pytest.param(dict(constexprs=dict(BLOCK=16, FLAG=1)), id="constexpr-member-type"),
    pytest.param(dict(tuples=dict(strides=("stride_b", "stride_a"), SHAPE=("BLOCK", "FLAG"))), id="member-order"),
])
@FAST_PATH_TRITON
def test_each_tuple_member_changes_the_static_key(change):
    assert _tuple_launch(**change).static_key() != _tuple_launch().static_key()


def test_descriptors_are_built_on_each_calls_tensor():
    """A launch's ``descriptors`` replace the named tensors of every call by TMA descriptors of the
    launch's geometry (Triton's, or Gluon's with a shared-memory layout), on that call's tensor; the
    call's key then names the descriptors too. A descriptor of a tensor the layout lacks fails when
    the launch is built."""
    from triton.experimental.gluon import language as gl

    rows = fast_launch.Descriptor("y", (4, 64), (64, 1), (2, 32))
    launch = fast_launch.Launch(TOY, (4,), layout=TOY_LAYOUT, per_call=dict(x_ptr="x", y_ptr="y", scale="scale"),
                                fixed=dict(n=8), constexprs=dict(BLOCK=32, FLAG=True), options={},
                                descriptors=(rows,))
    buf = torch.zeros(2, 512, dtype=torch.float16)
    for y in (buf[0], buf[1]):  # two calls, new memory under y
        call = fast_launch.CallArgs((_BUF[:8], y), (), (0.5,))
        desc = launch.argument("y_ptr", call)
        assert desc.base is y and (list(desc.shape), list(desc.strides), list(desc.block_shape)) == (
            [4, 64], [64, 1], [2, 32])
        assert launch.argument("x_ptr", call) is call.tensors[0]  # (the other tensors as they were)
        assert launch.described(call).tensors[1] is not y and call.tensors[1] is y  # (the call is left alone)
    layout = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
    gluon = rows._replace(layout=layout).make(buf[0])
    assert gluon.layout == layout and list(gluon.block_shape) == [2, 32]
    plain = _launch()
    call = fast_launch.CallArgs((_BUF[:8], _BUF[8:16]), (), (0.5,))
    assert plain.described(call) is call  # (no descriptors: the call itself)
    with pytest.raises(TypeError, match=r"not in the call layout: \['z'\]"):
        fast_launch.Launch(TOY, (4,), layout=TOY_LAYOUT, per_call=dict(x_ptr="x", y_ptr="y", scale="scale"),
                           fixed=dict(n=8), constexprs=dict(BLOCK=32, FLAG=True), options={},
                           descriptors=(rows._replace(tensor="z"),))


def test_interpreter_takes_tritons_path():
    """On the CPU tier the kernels are interpreted: no fast path, every launch is Triton's."""
    if ON_GPU:
        pytest.skip("the GPU tier compiles the kernels")
    assert not fast_launch.fast_path_enabled()
    assert fast_launch.call_args((_BUF,), (3,)).key is None


# ---------------------------------------------------------------------------------------------
# the switches
# ---------------------------------------------------------------------------------------------
def test_environment_switches_follow_changes(monkeypatch):
    monkeypatch.setenv("KVATTN_FAST_LAUNCH", "0")
    assert not _env.fast_launch() and not fast_launch.fast_path_enabled()
    monkeypatch.setenv("KVATTN_FAST_LAUNCH", "1")
    assert _env.fast_launch()
    monkeypatch.delenv("KVATTN_FAST_LAUNCH")
    assert _env.fast_launch()
    monkeypatch.setenv("KVATTN_DEBUG", " Yes ")
    assert _env.debug_checks()
    monkeypatch.setenv("KVATTN_BACKEND", "Reference")
    assert _env.backend_override() == "reference"
    monkeypatch.setenv("KVATTN_BACKEND", "cuda")
    with pytest.raises(ValueError, match="^KVATTN_BACKEND:"):
        _env.backend_override()
    monkeypatch.delenv("KVATTN_BACKEND")
    assert _env.backend_override() is None


# ---------------------------------------------------------------------------------------------
# launcher plumbing
# ---------------------------------------------------------------------------------------------
def test_query_shapes_map_to_rows_as_views_would():
    q = torch.zeros(3, 1, 8, 64)
    assert decode_launch._as_rows(q.shape, q.stride()) == (tuple(q[:, 0].shape), q[:, 0].stride())
    q = torch.zeros(8, 64)[:, :32]
    assert decode_launch._as_rows(q.shape, q.stride()) == (tuple(q.unsqueeze(0).shape), q.unsqueeze(0).stride())
    q = torch.zeros(5, 8, 64)
    assert decode_launch._as_rows(q.shape, q.stride()) == (tuple(q.shape), q.stride())


def test_integer_helpers_match_triton():
    import triton

    for n in range(1, 5000):
        assert launch_common.next_power_of_2(n) == triton.next_power_of_2(n)
        assert launch_common.cdiv(n, 7) == triton.cdiv(n, 7)


def test_cached_aliases_follow_the_base_tensor():
    base = torch.randn(4, 2, 16, 2, 8)
    k, v = _split_kv(base, "kv_cache", "HND")
    assert _split_kv(base, "kv_cache", "HND")[0] is k
    assert k._base is None  # an alias of the memory, not a view holding on to ``base``
    assert torch.equal(k, base[:, 0].transpose(1, 2)) and torch.equal(v, base[:, 1].transpose(1, 2))
    base[0, 1, 0, 0, 0] = 123.0
    assert v[0, 0, 0, 0] == 123.0  # the same memory
    assert _split_kv(base, "kv_cache", "NHD")[0] is not k  # another layout, another entry
    assert _split_kv(base, "kv_cache", "HND")[0] is k
    with torch.inference_mode():
        assert _split_kv(base, "kv_cache", "HND")[0] is not k
    base.as_strided_((4, 2, 16, 2, 4), base.stride())  # metadata changed in place
    k2, _ = _split_kv(base, "kv_cache", "HND")
    assert k2 is not k and k2.shape == (4, 2, 16, 4)
    ident = id(base)
    assert any(key[0] == ident for key in _aliases._ALIASES)
    del base
    gc.collect()
    assert not any(key[0] == ident for key in _aliases._ALIASES)  # entries go with their tensor


def test_no_aliases_for_tensors_that_require_grad():
    base = torch.randn(4, 2, 16, 2, 8, requires_grad=True)
    k, _ = _split_kv(base, "kv_cache", "NHD")
    assert k._base is base and _split_kv(base, "kv_cache", "NHD")[0] is not k


def test_workspace_partials_do_not_keep_the_workspace():
    ws = torch.zeros(1 << 16, dtype=torch.uint8)[3:]  # not 16-byte aligned
    part_o, part_lse = launch_workspace.partials_from_workspace(ws, 100, 20)
    assert launch_workspace.partials_from_workspace(ws, 100, 20)[0] is part_o
    assert part_o.data_ptr() % 16 == 0 and part_lse.data_ptr() == part_o.data_ptr() + 400
    assert part_o.dtype == part_lse.dtype == torch.float32 and part_o.numel() == 100 and part_lse.numel() == 20
    ref = __import__("weakref").ref(ws)
    del ws, part_o, part_lse
    gc.collect()
    assert ref() is None


def _paged_call(device, *, lens=(37, 70), hkv=2, group=4, d=64, page=16, dtype=torch.float16, seed=0):
    case = make_paged_kv(list(lens), num_kv_heads=hkv, head_dim=d, page_size=page, dtype=dtype, device=device,
                         seed=seed, nan_fill=False)
    q = torch.randn(len(lens), hkv * group, d, generator=torch.Generator().manual_seed(seed)).to(device, dtype)
    ws = torch.zeros(1 << 22, dtype=torch.uint8, device=device)
    return q, case, ws


def test_plans_are_cached_by_host_facts(kernel_device, triton_backend):
    q, case, ws = _paged_call(kernel_device)

    def call(max_len, query=q):
        return kvattn.decode.xqa_batch_decode_with_kv_cache(query, case.kv_cache, ws, case.block_tables,
                                                            case.seq_lens, max_len, bmm1_scale=0.125)

    decode_launch._PLANS.clear()
    call(96)
    assert len(decode_launch._PLANS) == 1
    call(96)
    call(80)  # another bound, same facts: the split count is worked out from the plan
    assert len(decode_launch._PLANS) == 1
    call(96, q.clone()[:, :4])  # other strides and head count: another plan
    assert len(decode_launch._PLANS) == 2
    with decode_configs.override(min_chunk=32):
        call(96)
    assert len(decode_launch._PLANS) == 2  # plans under an override are not kept


@pytest.mark.parametrize("api", ["xqa", "batch"])
def test_strided_seq_lens_are_read_right(api, kernel_device, triton_backend, monkeypatch):
    """Lengths that are a column of a wider tensor (the kernels read seq_lens_ptr + b)."""
    q, case, ws = _paged_call(kernel_device, lens=(37, 70, 5))
    wide = torch.stack([case.seq_lens, torch.full_like(case.seq_lens, 999)], dim=1)
    lens = wide.to(torch.uint32)[:, :1] if api == "xqa" else wide[:, 0]
    assert not lens.is_contiguous()
    outs = []
    for backend in ("triton", "reference"):
        monkeypatch.setenv("KVATTN_BACKEND", backend)
        if api == "xqa":
            k, v = case.kv_cache[:, 0], case.kv_cache[:, 1]
            out = torch.empty_like(q).unsqueeze(1)
            kvattn.xqa.xqa(q.unsqueeze(1), k, v, case.block_tables, lens, out, ws,
                           torch.zeros(8, dtype=torch.uint32, device=kernel_device), num_kv_heads=2, page_size=16)
            outs.append(out[:, 0])
        else:
            outs.append(kvattn.decode.xqa_batch_decode_with_kv_cache(q, case.kv_cache, ws, case.block_tables, lens,
                                                                     96, bmm1_scale=0.125))
    got, ref = (o.float().cpu() for o in outs)
    assert torch.allclose(got, ref, atol=1e-2, rtol=1e-2), float((got - ref).abs().max())


# ---------------------------------------------------------------------------------------------
# the variants: public calls that vary alignment, strides, lengths, dtypes and split counts
# ---------------------------------------------------------------------------------------------
def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).reshape(-1)


def offset_copy(t: torch.Tensor, elements: int = 1) -> torch.Tensor:
    """``t``'s values in a buffer that starts ``elements`` elements past an allocation."""
    buf = torch.empty(t.numel() + elements, dtype=t.dtype, device=t.device)
    view = buf[elements:].view(t.shape)
    view.copy_(t)
    return view


def batch_variant(*, lens=(700, 40, 2500, 1), dtype=torch.bfloat16, fmt=None, layout="NHD", form="stacked",
                  page=16, q_len=1, mask=False, sinks=False, window=-1, tensor_scales=False, fp8_out=False,
                  uint32=False, ws_bytes=64 << 20, max_len=None, q_of=None, out_of=None, kv_of=None, seed=0,
                  lse=False, f32_out=False, kv_start=None):
    """A builder ``device -> call`` of one xqa_batch_decode_with_kv_cache call (fresh output); with
    ``lse`` also its LSE, ``kv_start`` (a per-request first key) through the private entry."""

    def build(device):
        case = make_paged_kv(list(lens), num_kv_heads=2, head_dim=128, page_size=page, dtype=dtype, kv_format=fmt,
                             layout=layout, form=form, device=device, seed=seed, nan_fill=False)
        g = torch.Generator().manual_seed(seed + 7)
        q = torch.randn(len(lens) * q_len, 16, 128, generator=g).to(device, dtype)
        q = q_of(q) if q_of else q
        words = 2 * ((q_len + 31) // 32)
        mask_t = (torch.randint(0, 1 << 16, (len(lens), q_len, words), generator=g, dtype=torch.int32)
                  .to(torch.uint16).to(device)) if mask else None
        sinks_t = torch.randn(16, generator=g).to(device) if sinks else None
        bmm1, bmm2 = 1.0 / math.sqrt(128), 1.0
        if tensor_scales:
            bmm1, bmm2 = (torch.tensor([x], dtype=torch.float32, device=device) for x in (bmm1, bmm2))
        seq_lens = case.seq_lens.to(torch.uint32) if uint32 else case.seq_lens
        kv = kv_of(case.kv_cache) if kv_of else case.kv_cache
        ws = torch.zeros(ws_bytes, dtype=torch.uint8, device=device)
        bound = case.block_tables.shape[1] * page if max_len is None else max_len

        starts = torch.tensor(kv_start, dtype=torch.int32, device=device) if kv_start is not None else None

        def call():
            out_dtype = FP8_DTYPE if fp8_out else (torch.float32 if f32_out else dtype)
            out = poison_(torch.empty(q.shape, dtype=out_dtype, device=device))
            out = out_of(out) if out_of else out
            got = kvattn.decode._batch_decode(
                q, kv, ws, case.block_tables, seq_lens, bound, bmm1_scale=bmm1, bmm2_scale=bmm2, window_left=window,
                out=out, sinks=sinks_t, kv_layout=layout, q_len_per_req=q_len, mask=mask_t,
                kv_cache_sf=case.kv_cache_sf, return_lse=lse, kv_start=starts)
            return torch.cat([bits(out), bits(got[1])]) if lse else bits(out)

        return call

    return build


def xqa_variant(*, lens=(700, 40, 2500), sm_count=None, lens_of=None, q_of=None):
    def build(device):
        case = make_paged_kv(list(lens), num_kv_heads=2, head_dim=128, page_size=32, dtype=torch.float16,
                             device=device, nan_fill=False)
        q = torch.randn(len(lens), 1, 16, 128, generator=torch.Generator().manual_seed(3)).to(device, torch.float16)
        q = q_of(q) if q_of else q
        k, v = (case.kv_cache[:, i].reshape(-1, 128) for i in (0, 1))
        seq_lens = case.seq_lens.view(-1, 1).to(torch.uint32)
        seq_lens = lens_of(seq_lens) if lens_of else seq_lens
        ws = torch.zeros(64 << 20, dtype=torch.uint8, device=device)
        sem = torch.zeros(8, dtype=torch.uint32, device=device)

        def call():
            out = poison_(torch.empty(q.shape, dtype=q.dtype, device=device))
            kvattn.xqa.xqa(q, k, v, case.block_tables, seq_lens, out, ws, sem, 2, 32, sm_count=sm_count)
            return bits(out)

        return call

    return build


def single_variant(*, length, dtype=torch.float16, layout="NHD", kv_fp8=False, hkv=8, **kw):
    def build(device):
        g = torch.Generator().manual_seed(length)
        q = torch.randn(32, 128, generator=g).to(device, dtype)
        shape = (length, hkv, 128) if layout == "NHD" else (hkv, length, 128)
        k, v = (torch.randn(*shape, generator=g).to(device, FP8_DTYPE if kv_fp8 else dtype) for _ in range(2))

        def call():
            out, lse = kvattn.decode.single_decode_with_kv_cache(q, k, v, kv_layout=layout, return_lse=True, **kw)
            return torch.cat([bits(out), bits(lse)])

        return call

    return build


def mla_variant(*, lens=(700, 40, 0, 2500), hq=16, lse=True):
    """MLA decode (the Triton kernel) with its LSE (requests of up to 256 keys take one split)."""
    def build(device):
        case = make_paged_kv(list(lens), num_kv_heads=1, head_dim=576, page_size=16, dtype=torch.bfloat16,
                             form="shared", device=device, nan_fill=False)
        cache = case.kv_cache[:, 0, :, 0]
        q = torch.randn(len(lens), 1, hq, 576, generator=torch.Generator().manual_seed(5)).to(device, torch.bfloat16)
        ws = torch.zeros(64 << 20, dtype=torch.uint8, device=device)

        def call():
            out = poison_(torch.empty(len(lens), hq, 512, dtype=torch.float32, device=device))
            got = kvattn.mla.xqa_batch_decode_with_kv_cache_mla(q, cache, ws, 128, 512, 64, case.block_tables,
                                                               case.seq_lens, max(lens), out=out, bmm1_scale=0.07,
                                                               return_lse=lse)
            return torch.cat([bits(out), bits(got[1])]) if lse else bits(out)

        return call

    return build


def append_variant(*, fmt=None, dtype=torch.bfloat16, layout="NHD", form="stacked", tensor_scales=False,
                   key_of=None, index_dtype=torch.int32):
    """A builder ``device -> call`` of one append_paged_kv_cache call (into a fresh copy of the cache)."""

    def build(device):
        case = make_paged_kv([40, 7, 100], num_kv_heads=2, head_dim=128, page_size=16, dtype=dtype, kv_format=fmt,
                             layout=layout, form=form, device=device, nan_fill=False)
        g = torch.Generator().manual_seed(5)
        key = torch.randn(9, 2, 128, generator=g).to(device, dtype)
        key = key_of(key) if key_of else key
        value = None if form == "shared" else torch.randn(9, 2, 128, generator=g).to(device, dtype)
        b = torch.tensor([0, 0, 1, 2, 2, 2, 1, 0, 3], dtype=index_dtype, device=device)  # (3: past the batch)
        p = torch.tensor([38, 39, 6, 97, 98, 99, 5, 37, 0], dtype=index_dtype, device=device)
        k_scale, v_scale = 0.5, 2.0
        if tensor_scales:
            k_scale, v_scale = (torch.tensor([x], dtype=torch.float32, device=device) for x in (k_scale, v_scale))

        def copy(c):
            return None if c is None else tuple(t.clone() for t in c) if isinstance(c, tuple) else c.clone()

        def call():
            cache, sf = copy(case.kv_cache), copy(case.kv_cache_sf)
            kvattn.append_paged_kv_cache(key, value, cache, case.block_tables, b, p, kv_layout=layout,
                                         k_scale=k_scale, v_scale=v_scale, kv_cache_sf=sf)
            written = [t for c in (cache, sf) if c is not None for t in (c if isinstance(c, tuple) else (c,))]
            return torch.cat([bits(t) for t in written])

        return call

    return build


def _strided_query(q):
    return torch.cat([q, q], dim=1)[:, : q.shape[1]]


def _strided_out(o):
    return torch.empty(o.shape[0], 2 * o.shape[1], o.shape[2], dtype=o.dtype, device=o.device)[:, ::2]


def _strided_lens(t):
    wide = torch.cat([t.view(torch.int32)] * 2, dim=1).view(t.dtype)  # (few ops take uint32 on CUDA)
    return wide[:, :1]


VARIANTS = [
    pytest.param(batch_variant(), id="bf16-NHD"),
    pytest.param(batch_variant(dtype=torch.float16, layout="HND", form="tuple", page=32), id="fp16-HND-tuple"),
    pytest.param(batch_variant(form="shared", page=64), id="shared-page64"),
    pytest.param(batch_variant(q_of=offset_copy), id="query-offset"),
    pytest.param(batch_variant(q_of=_strided_query), id="query-strided"),
    pytest.param(batch_variant(out_of=offset_copy), id="out-offset"),
    pytest.param(batch_variant(out_of=_strided_out), id="out-strided"),
    pytest.param(batch_variant(kv_of=offset_copy), id="kv-offset"),
    pytest.param(batch_variant(lens=(30, 64, 1), max_len=64), id="one-split"),
    pytest.param(batch_variant(ws_bytes=300_000), id="small-workspace"),
    pytest.param(batch_variant(fmt="fp8", fp8_out=True, tensor_scales=True), id="fp8-cache-fp8-out"),
    pytest.param(batch_variant(fmt="nvfp4", form="tuple"), id="nvfp4"),
    pytest.param(batch_variant(q_len=3, mask=True, sinks=True), id="spec-q3-mask-sinks"),
    pytest.param(batch_variant(window=100, uint32=True), id="window-uint32"),
    pytest.param(batch_variant(lens=(33000,), max_len=33000), id="long"),
    pytest.param(batch_variant(lse=True, f32_out=True, sinks=True), id="lse-f32-out"),
    pytest.param(batch_variant(lse=True, lens=(30, 64, 1), max_len=64), id="lse-one-split"),
    pytest.param(batch_variant(lse=True, kv_start=(100, 0, 2000, 1)), id="kv-start-lse"),
    pytest.param(mla_variant(), id="mla-lse-splits"),
    pytest.param(mla_variant(lens=(200, 3, 0)), id="mla-lse-one-split"),
    pytest.param(mla_variant(lse=False), id="mla-splits"),
    pytest.param(xqa_variant(), id="xqa"),
    pytest.param(xqa_variant(sm_count=3), id="xqa-persistent"),
    pytest.param(xqa_variant(lens_of=_strided_lens), id="xqa-strided-lens"),
    pytest.param(xqa_variant(q_of=offset_copy), id="xqa-query-offset"),
    # single decode: fixed_len == 1, divisible by 16, neither; one split and many
    *[pytest.param(single_variant(length=n), id=f"single-L{n}") for n in (1, 16, 17, 300, 4096, 40000)],
    pytest.param(single_variant(length=4096, pos_encoding_mode="ROPE_LLAMA", rope_theta=5e5), id="single-rope"),
    pytest.param(single_variant(length=3000, pos_encoding_mode="ALIBI", logits_soft_cap=30.0, window_left=999),
                 id="single-alibi-softcap-window"),
    pytest.param(single_variant(length=2049, dtype=torch.bfloat16, layout="HND", use_tensor_cores=True),
                 id="single-tc-bf16-HND"),
    pytest.param(single_variant(length=5000, kv_fp8=True, k_scale=0.5, v_scale=2.0), id="single-fp8"),
    # RoPE with one query head a KV head: RoPE's streaming tiles (eager: cp.async, TMA in graphs)
    *[pytest.param(single_variant(length=n, hkv=32, dtype=dt, layout=lay, pos_encoding_mode="ROPE_LLAMA"),
                   id=f"single-rope-mha-{lay}-L{n}") for n, dt, lay in
      ((4096, torch.bfloat16, "NHD"), (999, torch.float16, "HND"))],
    # KV-cache append: formats, layouts, forms (a K-only cache), scale tensors, strided rows, int64 indices
    pytest.param(append_variant(), id="append-bf16-NHD"),
    pytest.param(append_variant(fmt="fp8", layout="HND", form="tuple", tensor_scales=True), id="append-fp8-HND"),
    pytest.param(append_variant(fmt="nvfp4", index_dtype=torch.int64), id="append-nvfp4-int64"),
    pytest.param(append_variant(dtype=torch.float16, form="shared", key_of=_strided_query), id="append-shared-strided"),
]


# ---------------------------------------------------------------------------------------------
# any machine: the fast path against Triton's, with the GPU side faked
# ---------------------------------------------------------------------------------------------
def _as_seen(arg):
    """A launcher argument as the GPU would see it: a tensor's data pointer; a tensor descriptor's
    base pointer and every field Triton's launcher encodes (and its specialisation's block shape)."""
    if isinstance(arg, torch.Tensor):
        return arg.data_ptr()
    if tma_descriptors.descriptor_base(arg) is not None:
        return ("descriptor", arg.base.data_ptr(), tuple(arg.shape), tuple(arg.strides), tuple(arg.block_shape),
                getattr(arg, "layout", None), arg.padding, getattr(arg, "round_f32_to_tf32", False))
    return arg


class FakeGPU:
    """The decode and append kernels as compiled-mode ``JITFunction`` s over a faked GPU: Triton's own
    ``JITFunction.run`` binds, specialises and keys every launch for real, ``_do_compile`` makes
    one fake compiled kernel per Triton cache key, and every launcher call is recorded."""

    def __init__(self, monkeypatch):
        import triton.runtime.jit as jit
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import CompiledKernel

        class FakeCompiled(CompiledKernel):
            def __del__(self):  # nothing was loaded, so nothing to unload (Triton's reads attributes a fake lacks)
                pass

        self.calls: list[tuple] = []  # (compiled kernel, launcher arguments)
        self.compiled: list = []
        active = types.SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: 7,
                                       get_current_target=lambda: GPUTarget("cuda", 90, 32))
        fake_driver = types.SimpleNamespace(active=active)

        def do_compile(kernel, key, signature, device, constexprs, options, attrs, warmup):
            compiled = object.__new__(FakeCompiled)
            compiled.hash, compiled.name, compiled.src, compiled.module = key, kernel.__name__, None, 1
            compiled.function, compiled.packed_metadata = 100 + len(self.compiled), (4, 1, 0)
            compiled._run = lambda *args: self.calls.append((compiled, args))
            kernel.device_caches[device][0][key] = compiled
            try:
                kernel.cache_key  # noqa: B018  (fills used_global_vals, as a compile does)
            except RuntimeError:  # helpers decorated under the interpreter: no globals to check
                pass
            self.compiled.append(compiled)
            return compiled

        monkeypatch.setattr(jit, "driver", fake_driver)
        monkeypatch.setattr(jit.JITFunction, "_do_compile", do_compile)
        monkeypatch.setattr(fast_launch, "driver", fake_driver, raising=False)
        monkeypatch.setattr(launch_replay, "driver", fake_driver, raising=False)  # (replays: test_call_cache)
        monkeypatch.setattr(fast_launch, "_on_gpu", lambda t: True)  # CPU tensors stand in for GPU ones
        monkeypatch.setattr(fast_launch, "_device", types.SimpleNamespace(is_interpreter=lambda: False))
        # Device values checked as on a GPU (only when asked): on these CPU tensors the checks would
        # run by default, and their ops would keep calls from being recorded.
        monkeypatch.setenv("KVATTN_DEBUG", "0")
        for name in ("decode_split_kernel", "decode_combine_kernel"):
            monkeypatch.setattr(decode_launch, name, JITFunction(getattr(decode_launch, name).fn))
        monkeypatch.setattr(append_launch, "append_kv_kernel", JITFunction(append_launch.append_kv_kernel.fn))
        monkeypatch.setattr(decode_launch, "_PLANS", {})  # no plan of these kernels outlives the test
        for name in ("mla_split_kernel", "decode_combine_kernel", "balanced_combine_kernel"):  # MLA's (Triton kernel)
            monkeypatch.setattr(mla_launch, name, JITFunction(getattr(mla_launch, name).fn))
        monkeypatch.setattr(mla_launch, "_PLANS", {})
        monkeypatch.setattr(append_launch, "_PLANS", {})
        monkeypatch.setattr(prefill_launch, "context_kernel", JITFunction(prefill_launch.context_kernel.fn))
        if prefill_launch.gluon_ws is not None:  # the Gluon kernels: new objects, so no compiled kernel of
            # another test's fake is found in their caches
            from triton.experimental.gluon._runtime import GluonJITFunction

            ws = prefill_launch.gluon_ws
            monkeypatch.setattr(ws, "prefill_ws_kernel", GluonJITFunction(ws.prefill_ws_kernel.fn))
            for name in ("mla_gluon_kernel", "mla_gluon_ws_kernel"):
                monkeypatch.setattr(mla_launch, name, GluonJITFunction(getattr(mla_launch, name).fn))
        monkeypatch.setattr(fast_launch, "_SHARED", {})
        monkeypatch.setattr(prefill_launch, "_PLANS", {})
        monkeypatch.setenv("TRITON_INTERPRET", "1")  # kvattn: CPU tensors may take the Triton backend
        monkeypatch.setenv("KVATTN_BACKEND", "triton")
        # ... but the kernels are compiled ones: bfloat16 caches are fine (no interpreter arithmetic)
        monkeypatch.setattr(_checks, "_kernels_interpreted", lambda: False)
        # Every call through its launches (these tests look at them); the replays of recorded calls
        # have tests of their own (test_call_cache.py).
        monkeypatch.setenv("KVATTN_CALL_CACHE", "0")

    def launches(self) -> list[tuple]:
        """Since the last call: (compiled kernel, grid, stream, function, metadata, kernel arguments
        with tensors as their data pointers) per launch."""
        out = []
        for compiled, args in self.calls:
            kernel_args = tuple(map(_as_seen, args[9:]))
            out.append((compiled, args[:3], args[3], args[4], args[5], kernel_args))
        self.calls = []
        return out


@FAST_PATH_TRITON
@pytest.mark.parametrize("build", VARIANTS)
def test_fast_path_passes_tritons_kernel_and_arguments(build, monkeypatch):
    """Over a faked GPU, every launch of a call's second run goes through the fast path and then,
    with the same arguments, through Triton's own path: the same compiled kernel (one per Triton
    cache key), grid, stream, function, metadata and arguments."""
    fake = FakeGPU(monkeypatch)
    call = build(torch.device("cpu"))
    call()  # first calls of these launches: through Triton, cached
    fake.launches()
    runs = []
    run, launch = JITFunction.run, fast_launch.Launch.__call__

    def fast_then_triton(lau, args):
        launch(lau, args)
        assert not runs, "an identical second call went through JITFunction.run"
        fast = fake.launches()
        launch(lau, fast_launch.CallArgs(args.tensors, args.ints, args.floats))  # no key: Triton's path
        assert runs
        runs.clear()
        triton_path = fake.launches()
        assert len(fast) == len(triton_path) == 1
        assert fast[0][0] is triton_path[0][0], "another compiled kernel than Triton picks"
        assert fast[0][1:] == triton_path[0][1:]
        pairs.append(lau)

    pairs = []
    monkeypatch.setattr(JITFunction, "run", lambda *a, **k: runs.append(1) or run(*a, **k))
    monkeypatch.setattr(fast_launch.Launch, "__call__", fast_then_triton)
    call()
    assert pairs


@FAST_PATH_TRITON
def test_fast_path_takes_each_calls_pointers(monkeypatch):
    """Nothing keeps a data pointer across calls: a new query and output at new addresses, and new
    memory under the same query object, reach the launcher; and they take the fast path."""
    fake = FakeGPU(monkeypatch)
    q, case, ws = _paged_call(torch.device("cpu"), lens=(700, 40))
    runs = []
    run = JITFunction.run
    monkeypatch.setattr(JITFunction, "run", lambda *a, **k: runs.append(1) or run(*a, **k))

    def call(query, out):
        kvattn.decode.xqa_batch_decode_with_kv_cache(query, case.kv_cache, ws, case.block_tables, case.seq_lens,
                                                     704, bmm1_scale=0.125, out=out)
        return [args for *_, args in fake.launches()]

    def pointers(launches):
        return {a for args in launches for a in args}

    out = torch.empty_like(q)
    call(q, out)  # through Triton, cached
    runs.clear()
    old_q = q.data_ptr()
    first = call(q, out)
    assert old_q in pointers(first) and out.data_ptr() in first[-1]
    q2, out2 = q.clone(), torch.empty_like(out)
    second = call(q2, out2)
    assert q2.data_ptr() in pointers(second) and out2.data_ptr() in second[-1]
    assert not {old_q, out.data_ptr()} & pointers(second)
    old_storage = q.untyped_storage()  # (kept alive: its address is not reused)
    q.set_(q.clone())  # the same tensor object over other memory
    third = call(q, out)
    assert q.data_ptr() in pointers(third) and not {old_q, q2.data_ptr()} & pointers(third)
    assert not runs, "a call went through JITFunction.run"
    del old_storage


# ---------------------------------------------------------------------------------------------
# GPU: the fast path against Triton's
# ---------------------------------------------------------------------------------------------
class Spy:
    """Counts ``JITFunction.run`` calls and records the compiled kernel of every Launch call."""

    def __init__(self, monkeypatch):
        self.runs = 0
        self.kernels: list[str] = []
        run, launch = JITFunction.run, fast_launch.Launch.__call__

        def counting_run(kernel, *args, **kwargs):
            self.runs += 1
            return run(kernel, *args, **kwargs)

        def recording_launch(lau, *args, **kwargs):
            launch(lau, *args, **kwargs)
            self.kernels.append(lau.last.hash)

        monkeypatch.setattr(JITFunction, "run", counting_run)
        monkeypatch.setattr(fast_launch.Launch, "__call__", recording_launch)
        monkeypatch.setenv("KVATTN_CALL_CACHE", "0")  # (a replayed call skips Launch.__call__)

    def reset(self):
        self.runs = 0
        self.kernels = []


@FAST_PATH_TRITON
@GPU_ONLY
@pytest.mark.parametrize("build", VARIANTS)
def test_fast_path_launches_tritons_kernel_with_the_same_bits(build, triton_backend, monkeypatch):
    call = build(torch.device("cuda"))
    call()  # compiles, and warms up kernels a capture of the call would launch (RoPE's TMA tiles)
    spy = Spy(monkeypatch)
    monkeypatch.setenv("KVATTN_FAST_LAUNCH", "0")
    expected = call()
    triton_kernels = list(spy.kernels)
    assert spy.runs == len(triton_kernels) > 0
    monkeypatch.setenv("KVATTN_FAST_LAUNCH", "1")
    call()  # the first call of these launches may go through Triton, and is cached
    spy.reset()
    got = call()
    assert spy.runs == 0, "an identical second call went through JITFunction.run"
    assert spy.kernels == triton_kernels, "the fast path launched another compiled kernel than Triton picks"
    assert torch.equal(got, expected)


@FAST_PATH_TRITON
@GPU_ONLY
def test_launch_hooks_send_launches_back_to_triton(triton_backend, monkeypatch):
    import triton

    call = single_variant(length=300)(torch.device("cuda"))
    call()
    seen = []
    hook = seen.append
    triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        spy = Spy(monkeypatch)
        call()
        assert spy.runs > 0 and len(seen) == spy.runs
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    spy.reset()
    call()
    assert spy.runs == 0


@FAST_PATH_TRITON
@GPU_ONLY
@pytest.mark.parametrize("q_len", [1, 3], ids=lambda n: f"Q{n}")
def test_cuda_graph_capture_and_replay_through_the_fast_path(q_len, triton_backend, monkeypatch):
    device = torch.device("cuda")
    lens, width = [700, 40, 2500, 0], 200
    case = make_paged_kv(lens, num_kv_heads=2, head_dim=128, page_size=16, dtype=torch.bfloat16, device=device,
                         pages_per_seq=width, extra_pages=600, nan_fill=False)
    q = torch.randn(len(lens) * q_len, 8, 128, device=device, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    ws = torch.zeros(64 << 20, dtype=torch.uint8, device=device)
    seq_lens, tables = case.seq_lens.clone(), case.block_tables.clone()

    def call(into=out):
        kvattn.decode.xqa_batch_decode_with_kv_cache(q, case.kv_cache, ws, tables, seq_lens, width * 16,
                                                     bmm1_scale=0.1, out=into, q_len_per_req=q_len)

    call()
    call()
    torch.cuda.synchronize()
    spy = Spy(monkeypatch)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    assert spy.runs == 0, "the capture went through JITFunction.run"

    # A new step: other lengths and other (valid) page ids, written in place; then replay.
    seq_lens.copy_(torch.tensor([1500, 0, 3199, 64], dtype=torch.int32, device=device))
    tables.copy_(torch.randint(0, case.kv_cache.shape[0], tables.shape, dtype=torch.int32, device=device))
    graph.replay()
    torch.cuda.synchronize()
    monkeypatch.setenv("KVATTN_FAST_LAUNCH", "0")
    expected = torch.empty_like(q)
    call(expected)
    torch.cuda.synchronize()
    assert torch.equal(bits(out), bits(expected))


@pytest.mark.parametrize(
    "kv_format,words_ok,strides,head_dim,sf_strides,expected",
    [
        ("fp8", True, (4096, 1024, 128, 4096, 1024, 128), 128, (), BY_NAME["fp8"].words_code),
        ("fp8", False, (4096, 1024, 128, 4096, 1024, 128), 128, (), 1),  # a base pointer off by 1-3 bytes
        ("fp8", True, (4098, 1026, 128, 4096, 1024, 128), 128, (), 1),  # a stride not a multiple of 4
        ("fp8", True, (4096, 1024, 130, 4096, 1024, 130), 130, (), 1),  # a row not a whole number of words
        ("bfloat16", True, (4096, 1024, 128, 4096, 1024, 128), 128, (), 0),
        ("nvfp4", True, (4096, 1024, 64, 4096, 1024, 64), 128, (512, 128, 8, 512, 128, 8),
         BY_NAME["nvfp4"].words_code),
        ("nvfp4", False, (4096, 1024, 64, 4096, 1024, 64), 128, (512, 128, 8, 512, 128, 8), 2),  # a base off by 1-3
        ("nvfp4", True, (4096, 1024, 64, 4096, 1024, 64), 128, (514, 128, 8, 512, 128, 8), 2),  # a scale stride
        ("nvfp4", True, (2048, 512, 16, 2048, 512, 16), 32, (128, 32, 2, 128, 32, 2), 2),  # D 32: half a word of scales
    ],
    ids=["fp8-aligned", "fp8-misaligned-base", "fp8-odd-stride", "fp8-odd-row", "bf16", "nvfp4-aligned",
         "nvfp4-misaligned-base", "nvfp4-odd-scale-stride", "nvfp4-D32"],
)
def test_word_paths_only_for_aligned_rows(kv_format, words_ok, strides, head_dim, sf_strides, expected):
    assert launch_common.kv_format_code(kv_format, words_ok, strides, head_dim, sf_strides) == expected


@pytest.mark.parametrize("capability,interpreter,aligned,expected", [
    ((9, 0), False, True, True), ((8, 9), False, True, True), ((8, 0), False, True, False),
    ((9, 0), True, True, False), ((9, 0), False, False, False),
], ids=["H100", "sm89", "A100-no-fp8-cvt", "interpreter", "misaligned"])
def test_words_formats_need_fp8_convert_and_compiled_kernels(capability, interpreter, aligned, expected, monkeypatch):
    """The words formats' inline PTX converts fp8 pairs with ``cvt.rn.f16x2.e4m3x2`` (sm_89+):
    older GPUs, like the interpreter, take the byte paths."""
    monkeypatch.setattr(launch_common._device, "capability", lambda device: capability)
    assert launch_common.words_allowed(torch.device("cuda", 0), interpreter, aligned) == expected


def test_nvfp4_words_need_the_codes_and_scales_aligned():
    """NVFP4 reads codes and block scales as words: all four base pointers must be 4-byte aligned
    (fp8 checks K and V only)."""
    buf = torch.zeros(4096, dtype=torch.uint8)
    k, v, k_sf, v_sf = buf[0:1024], buf[1024:2048], buf[2048:2560], buf[2560:3072]
    assert launch_common.words_aligned(k, v, k_sf, v_sf)
    for i, off in enumerate((buf[1:1025], buf[1025:2049], buf[2049:2561], buf[2561:3073])):
        args = [k, v, k_sf, v_sf]
        args[i] = off
        assert not launch_common.words_aligned(*args)
    f8 = torch.zeros(4096, dtype=torch.uint8).view(FP8_DTYPE)
    assert launch_common.words_aligned(f8[:1024], f8[1024:2048], None, None)
    assert not launch_common.words_aligned(f8[1:1025], f8[1024:2048], None, None)
    assert not launch_common.words_aligned(buf[:1024], buf[1024:2048], None, None)  # uint8 without scales


@pytest.mark.parametrize("length,stream", [(4096, True), (12800, True), (12801, False), (16384, False)],
                         ids=["L4096", "L12800-at-limit", "L12801", "L16384"])
def test_small_split_launches_take_the_streaming_tiles_on_sm90(length, stream, monkeypatch):
    """Single decode, 32 heads of 128 on a faked H100 (132 SMs, 50 MB of L2): up to 4 L2 sizes of
    K/V (12800 tokens) the launch runs the unpipelined, evict_first tiles; longer ones the one-row
    contiguous tiles (unpipelined too, without the hint)."""
    _fake_h100(monkeypatch)
    q = torch.empty(32, 128, dtype=torch.bfloat16)
    k = torch.empty(length, 32, 128, dtype=torch.bfloat16)
    kvattn.decode.single_decode_with_kv_cache(q, k, torch.empty_like(k))
    (plan,) = decode_launch._PLANS.values()
    cfg = plan.config_for(length)
    assert (cfg.evict_first, cfg.num_stages == 1) == (stream, True)
    if not stream:  # past the streaming spans: the one-row contiguous tiles, 16 splits a head
        assert (cfg.block_n, cfg.num_warps) == (64, 4)
        split = plan.launches(length)[0]
        assert split.grid[0] == 32 * 16 and split.constexprs["MERGE"]


@pytest.mark.parametrize("case", ["gqa", "rope", "paged"])
def test_long_spans_keep_the_long_tiles_where_contig_is_unmeasured(case, monkeypatch):
    """The one-row contiguous tiles were measured for single decode with one query head a KV head:
    GQA single decode, RoPE and paged caches keep the long pipelined tiles past the streaming spans."""
    _fake_h100(monkeypatch)
    length = 131072
    if case == "paged":
        pages, hkv, d = 8 * 8192 // 16, 8, 128
        kv = torch.empty(pages, 2, 16, hkv, d, dtype=torch.bfloat16)
        table = torch.arange(pages, dtype=torch.int32).view(8, -1)
        length = 8192
        kvattn.decode.xqa_batch_decode_with_kv_cache(
            torch.empty(8, 32, d, dtype=torch.bfloat16), kv, torch.zeros(4 << 20, dtype=torch.uint8), table,
            torch.full((8,), length, dtype=torch.int32), length)
    else:
        hkv = 8 if case == "gqa" else 32
        q = torch.empty(32, 128, dtype=torch.bfloat16)
        k = torch.empty(length, hkv, 128, dtype=torch.bfloat16)
        mode = "ROPE_LLAMA" if case == "rope" else "NONE"
        kvattn.decode.single_decode_with_kv_cache(q, k, torch.empty_like(k), pos_encoding_mode=mode)
    (plan,) = decode_launch._PLANS.values()
    assert plan.cfg_contig is None
    cfg = plan.config_for(length)
    assert cfg.num_stages > 1 and not cfg.evict_first


def _fake_h100(monkeypatch) -> FakeGPU:
    fake = FakeGPU(monkeypatch)
    monkeypatch.setattr(decode_launch, "arch", lambda device, interpreter: "sm90")
    monkeypatch.setattr(decode_launch._device, "sm_count", lambda device: 132)
    monkeypatch.setattr(decode_launch._device, "l2_bytes", lambda device: 50 << 20)
    return fake


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "KVATTN_FUSED_MERGE=0"])
@pytest.mark.parametrize("length,mode", [(4096, "NONE"), (4096, "ROPE_LLAMA"), (32768, "NONE"),
                                         (32768, "ROPE_LLAMA"), (131072, "NONE")], ids=lambda v: str(v))
def test_single_decode_merges_in_its_split_kernel(length, mode, fused, monkeypatch):
    """Single decode, 32 heads of 128 on a faked H100: one launch, each head's last split program
    merging the partials within MAX_MERGE_ROUNDS rounds over its one query row; with
    ``KVATTN_FUSED_MERGE=0`` the combine launch follows the split launch."""
    fake = _fake_h100(monkeypatch)
    monkeypatch.setenv("KVATTN_FUSED_MERGE", "1" if fused else "0")
    q = torch.empty(32, 128, dtype=torch.bfloat16)
    k = torch.empty(length, 32, 128, dtype=torch.bfloat16)
    kvattn.decode.single_decode_with_kv_cache(q, k, torch.empty_like(k), pos_encoding_mode=mode)
    (plan,) = decode_launch._PLANS.values()
    split, combine, _, _, merged = plan.launches(length)
    assert len(fake.launches()) == (1 if fused else 2)
    assert merged == fused and (combine is None) == fused and split.constexprs["MERGE"] == fused
    splits = split.grid[0] // 32
    assert splits > 1
    if fused:
        assert split.constexprs["MERGE_ROWS"] == 1  # the one query row, not its tensor-core tile's 16
        assert -(-splits // split.constexprs["MERGE_BLOCK_S"]) <= decode_launch.MAX_MERGE_ROUNDS


def test_many_splits_keep_the_combine_launch(monkeypatch):
    """Batch decode 1 x 32768 (8 KV heads, 33 splits each) on a faked H100: the in-kernel merge
    would take 5 rounds, so the combine launch merges (measured faster on an H100)."""
    fake = _fake_h100(monkeypatch)
    pages, hkv, d = 32768 // 16, 8, 128
    kv = torch.empty(pages, 2, 16, hkv, d, dtype=torch.bfloat16)
    table = torch.arange(pages, dtype=torch.int32)[None]
    kvattn.decode.xqa_batch_decode_with_kv_cache(
        torch.empty(1, 32, d, dtype=torch.bfloat16), kv, torch.zeros(4 << 20, dtype=torch.uint8), table,
        torch.tensor([32768], dtype=torch.int32), 32768)
    (plan,) = decode_launch._PLANS.values()
    split, combine, _, _, merged = plan.launches(32768)
    assert split.grid[0] // 8 == 33 and not merged and combine is not None and not split.constexprs["MERGE"]
    assert len(fake.launches()) == 2


# ---------------------------------------------------------------------------------------------
# TMA reads of contiguous caches (single decode's RoPE streaming tiles)
# ---------------------------------------------------------------------------------------------
def test_descriptor_specialisation_is_dtype_and_block_shape():
    """What lets a TMA launch keep its tensors' key (``with_descriptors``): Triton specialises a
    tensor descriptor on its dtype and block shape only, not on its base, shape or strides."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    t = torch.zeros(64, 4, 128, dtype=torch.bfloat16)
    seen = {native(TensorDescriptor(base, shape, [128, 512, 1], [1, 32, 64]))
            for base, shape in ((t, [4, 64, 128]), (t[1:], [4, 63, 128]), (t[3:], [4, 20, 128]))}
    assert seen == {("tensordesc<bf16[1, 32, 64]>", None)}
    assert native(TensorDescriptor(t, [4, 64, 128], [128, 512, 1], [1, 32, 128]))[0] != seen.pop()[0]


def test_with_descriptors_replaces_tensors_and_pointers_and_keys_the_specialisation():
    """The descriptors take the tensors' places (pointers too); the key is the call's key and each
    descriptor's specialisation (descriptor_spec): equal for descriptors Triton specialises alike
    (another base, shape), another for another block shape, dtype or Gluon layout."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    a, b, c = (torch.zeros(64, 64, dtype=torch.float16) for _ in range(3))

    def desc(t=b, shape=(64, 64), block=(16, 64)):
        return TensorDescriptor(t, list(shape), [64, 1], list(block))

    d1, d2 = desc(), desc(c)
    for ptrs in (None, (1, 2, 3)):
        call = fast_launch.CallArgs((a, b, c), (5,), (0.5,), ptrs, 9 if ptrs else None, 7)
        got = fast_launch.with_descriptors(call, {1: d1, 2: d2})
        assert got.tensors == (a, d1, d2) and got.ints == (5,) and got.floats == (0.5,)
        assert got.ptrs == (None if ptrs is None else (1, d1, d2))
        assert got.stream == call.stream and call.tensors == (a, b, c)
        assert (got.key is None) == (ptrs is None)
    # (the call's own key negative: the keys with descriptors are ids counted from 1, which may
    # reach any positive number in a long pytest run)
    call = fast_launch.CallArgs((a, b, c), (), (), (1, 2, 3), -9, 7)
    key = fast_launch.with_descriptors(call, {1: d1}).key
    assert key != -9
    assert fast_launch.with_descriptors(call, {1: desc(c, shape=(32, 64))}).key == key  # base, shape: not specialised
    others = [desc(block=(32, 64)), desc(b.view(torch.bfloat16)), desc(b.float(), block=(16, 32))]
    assert len({key, *(fast_launch.with_descriptors(call, {1: d}).key for d in others)}) == 4
    assert fast_launch.with_descriptors(call, {2: d1}).key != key  # another position
    assert fast_launch.with_descriptors(fast_launch.CallArgs((a, b, c), (), (), (1, 2, 3), 10, 7), {1: d1}).key != key


@pytest.mark.skipif(not fast_launch.TRITON_SUPPORTED, reason="the Triton versions whose launchers are modelled")
def test_descriptor_spec_follows_tritons_specialisation():
    """descriptor_spec tells apart exactly what Triton's own specialisation tells apart (Triton's
    and Gluon's descriptors: dtype, block shape, Gluon layout), and nothing it leaves out changes it
    (base, its alignment past 16 bytes, shape, strides, padding)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    from triton.tools.tensor_descriptor import TensorDescriptor

    t = torch.zeros(8192, dtype=torch.float16)
    row128 = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    row64 = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
    descs = [
        TensorDescriptor(t, [64, 64], [64, 1], [16, 64]), TensorDescriptor(t[8:], [63, 64], [64, 1], [16, 64]),
        TensorDescriptor(t[64:], [64, 64], [128, 1], [16, 64], padding="nan"),
        TensorDescriptor(t, [64, 64], [64, 1], [32, 64]), TensorDescriptor(t.view(torch.bfloat16), [64, 64], [64, 1], [16, 64]),
        GluonDescriptor(t, [64, 64], [64, 1], [16, 64], row128), GluonDescriptor(t[8:], [32, 64], [64, 1], [16, 64], row128),
        GluonDescriptor(t, [64, 64], [64, 1], [16, 64], row64), GluonDescriptor(t, [64, 64], [64, 1], [32, 64], row128),
    ]
    for x in descs:
        for y in descs:
            same = native(x) == native(y)
            assert same == (tma_descriptors.descriptor_spec(x) == tma_descriptors.descriptor_spec(y)), (x, y)


def test_replay_descriptors_carry_what_the_launchers_read():
    """A descriptor rebuilt on a new pointer (a recorded call's replay) has the recorded geometry and
    the new base, which reads as that pointer (data_ptr(), and as an int where the launcher takes
    the base as a pointer)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    t = torch.zeros(64, 64, dtype=torch.float16)
    d = TensorDescriptor(t, [64, 64], [64, 1], [16, 64], padding="nan")
    assert tma_descriptors.descriptor_base(d) == t.data_ptr()
    assert tma_descriptors.descriptor_base(t) is None and tma_descriptors.descriptor_base(5) is None
    r = tma_descriptors.descriptor_template(d)(1 << 40)
    assert r.base == 1 << 40 and r.base.data_ptr() == 1 << 40 and type(r.base.data_ptr()) is int
    assert (r.shape, r.strides, r.block_shape, r.padding, r.round_f32_to_tf32) == ((64, 64), (64, 1), (16, 64),
                                                                                  "nan", False)


def tma_readable(**kw):
    args = dict(paged=False, compiled=True, kv_format="bfloat16", aligned16=True, strides=(4096, 128, 4096, 128),
                rope=True, rope_query=True, graph_capture=True)
    args.update(kw)
    return decode_launch.tma_readable(**args)


@pytest.mark.parametrize(
    "overrides,expected",
    [({}, True), (dict(rope=False, rope_query=False), True), (dict(kv_format="float16"), True),
     (dict(strides=(128, 4096 * 32, 128, 4096 * 32)), True), (dict(paged=True), False), (dict(compiled=False), False),
     (dict(kv_format="fp8"), False), (dict(aligned16=False), False), (dict(strides=(4100, 128, 4096, 128)), False),
     (dict(strides=(4096, 128, 4096, 132)), False), (dict(rope_query=False), False),
     (dict(graph_capture=False), False)],
    ids=["rope-one-row", "none", "fp16", "HND", "paged", "no-tma-or-interpreter", "fp8", "base-unaligned",
         "k-stride-unaligned", "v-stride-unaligned", "rope-key-rotation", "eager"],
)
def test_tma_reads_only_where_tma_rules_hold(overrides, expected):
    """TMA's rules, and CUDA-graph capture only (a descriptor costs an eager call more host time
    than it saves GPU time)."""
    assert tma_readable(**overrides) is expected


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("rope_query", [False, True], ids=["whole-rows", "rope-halves"])
def test_tma_descriptors_view_the_cache_as_heads_tokens_dims(layout, rope_query):
    """``[L, Hkv, D]`` views of either layout as ``[Hkv, L, D]`` with their own strides; K's box is
    half a row under RoPE (the one-row kernel reads K's rotation halves apart)."""
    length, hkv, d = 100, 4, 128
    base = torch.zeros(length, hkv, d) if layout == "NHD" else torch.zeros(hkv, length, d).transpose(0, 1)
    k_desc, v_desc = decode_launch.tma_descriptors(base, base, 32, rope_query)
    for desc, width in ((k_desc, d // 2 if rope_query else d), (v_desc, d)):
        assert desc.base is base and list(desc.shape) == [hkv, length, d]
        assert list(desc.strides) == [base.stride(1), base.stride(0), 1]
        assert list(desc.block_shape) == [1, 32, width]


def test_rope_single_decode_streams_by_tma_within_the_streaming_spans(monkeypatch):
    """Single decode RoPE, 32 heads of 128 on a faked H100: spans within the streaming bytes take
    RoPE's tiles by TMA with the hint, longer ones RoPE's table; the kernel reads by TMA only on
    a GPU with TMA and in graph capture (the faked GPU runs the interpreter, eagerly: none here)."""
    _fake_h100(monkeypatch)
    q = torch.empty(32, 128, dtype=torch.bfloat16)
    k = torch.empty(4096, 32, 128, dtype=torch.bfloat16)
    kvattn.decode.single_decode_with_kv_cache(q, k, torch.empty_like(k), pos_encoding_mode="ROPE_LLAMA")
    (plan,) = decode_launch._PLANS.values()
    assert plan.stream_span == 12800 and plan.cfg_contig is None
    assert plan.config_for(4096).tma and plan.config_for(12800).evict_first
    assert not plan.config_for(12801).tma and not plan.config_for(12801).evict_first
    assert not plan.tma_ok and not plan.launches(4096)[0].constexprs["KV_TMA"]
