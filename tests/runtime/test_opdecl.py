"""The op declarations (:mod:`kvattn.runtime.opdecl`): one ``Arg`` tuple makes a torch op's schema,
fake, eager entry and launcher call.

CPU tier: a toy op declared here (its own namespace, so the kvattn op list stays exact) runs
eagerly without the dispatcher and traced through its registered op; a declaration the launcher
does not match fails at import, naming the argument; every family's entry function hands each
value to the launcher keyword of its name (the entries are called positionally, so this is the
check of their order).
"""

from __future__ import annotations

import inspect
from typing import Optional

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kvattn._inputs import PagedKV, Scale
from kvattn.ops.append import op as append_op
from kvattn.ops.append.plan import launch_append
from kvattn.ops.decode import op as decode_op
from kvattn.ops.decode.plan import launch_decode
from kvattn.ops.merge import op as merge_op
from kvattn.ops.merge.plan import launch_merge
from kvattn.ops.mla import op as mla_op
from kvattn.ops.mla.plan import launch_mla
from kvattn.ops.prefill import op as prefill_op
from kvattn.ops.prefill.plan import launch_context
from kvattn.runtime.opdecl import Arg, OptTensor, Tensor, declare_op


def _scaled_copy(src, dst, *, factor: float = 1.0, extra=None) -> None:
    dst.copy_(src * factor if extra is None else src * factor + extra)


SCALED_COPY = declare_op(
    "kvattn_opdecl_test::scaled_copy", _scaled_copy,
    Arg("src", Tensor),
    Arg("dst", Tensor, mutated=True),
    Arg("factor", float, 1.0),
    Arg("extra", OptTensor, None),
)


# the same launcher, its scalars read from a Scale (the entry takes ``src, dst, scale``)
SOURCED_COPY = declare_op(
    "kvattn_opdecl_test::sourced_copy", _scaled_copy,
    Arg("src", Tensor),
    Arg("dst", Tensor, mutated=True),
    Arg("factor", float, source="scale.factor"),
    Arg("extra", OptTensor, source="scale.tensor"),
)


class _DispatchedOps(TorchDispatchMode):
    """The ops that went through the dispatcher while active."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_eager_entry_runs_the_launcher_without_the_dispatcher():
    src, dst = torch.randn(5), torch.full((5,), float("nan"))
    with _DispatchedOps() as seen:
        SCALED_COPY.entry(src, dst, 3.0)
    assert torch.equal(dst, src * 3.0)
    assert not any("scaled_copy" in name for name in seen.names), seen.names
    SCALED_COPY.entry(src=src, dst=dst)  # (by name; the declared default)
    assert torch.equal(dst, src)


def test_sourced_arguments_are_read_from_the_entrys_parameters():
    src, dst, extra = torch.randn(5), torch.full((5,), float("nan")), torch.randn(5)
    assert list(inspect.signature(SOURCED_COPY.entry).parameters) == ["src", "dst", "scale"]
    with _DispatchedOps() as seen:
        SOURCED_COPY.entry(src, dst, Scale(3.0, extra))
    assert torch.equal(dst, src * 3.0 + extra)
    assert not any("sourced_copy" in name for name in seen.names), seen.names
    schema = torch.ops.kvattn_opdecl_test.sourced_copy.default._schema  # (the flat arguments)
    assert [a.name for a in schema.arguments] == ["src", "dst", "factor", "extra"]


def _traced(step, *args):
    """``step(*args)`` under ``torch.compile(fullgraph=True)``, and the one FX graph it traced."""
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    got = torch.compile(step, backend=backend, fullgraph=True)(*args)
    (gm,) = graphs
    return got, gm


def test_traced_sourced_entry_calls_the_op_with_the_flat_arguments():
    def step(src, extra):
        dst = torch.empty_like(src)
        SOURCED_COPY.entry(src, dst, Scale(2.0, extra))
        return dst + 1

    src, extra = torch.randn(6), torch.randn(6)
    got, gm = _traced(step, src, extra)
    assert torch.equal(got, src * 2.0 + extra + 1)
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and "sourced_copy" in str(n.target)]
    assert len(calls) == 1 and len(calls[0].args) + len(calls[0].kwargs) == 4


def test_the_registered_op_runs_the_launcher():
    src, dst = torch.randn(4), torch.full((4,), float("nan"))
    torch.ops.kvattn_opdecl_test.scaled_copy(src, dst, 2.0, None)
    assert torch.equal(dst, src * 2.0)


def test_schema_has_the_declared_order_types_and_writes_and_no_defaults():
    schema = torch.ops.kvattn_opdecl_test.scaled_copy.default._schema
    assert [a.name for a in schema.arguments] == ["src", "dst", "factor", "extra"]
    assert [str(a.type) for a in schema.arguments] == ["Tensor", "Tensor", "float", "Optional[Tensor]"]
    assert [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write] == ["dst"]
    assert not any(a.has_default_value() for a in schema.arguments)


def test_traced_entry_calls_the_op_with_every_argument():
    def step(src, extra):
        dst = torch.empty_like(src)
        SCALED_COPY.entry(src, dst, extra=extra)  # (factor left to its declared default)
        return dst * 2

    src, extra = torch.randn(6), torch.randn(6)
    got, gm = _traced(step, src, extra)
    assert torch.equal(got, (src + extra) * 2)
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and "scaled_copy" in str(n.target)]
    assert len(calls) == 1
    assert len(calls[0].args) + len(calls[0].kwargs) == 4


def _launch_pair(a, b: int = 2) -> None:
    return None


@pytest.mark.parametrize("args,kwargs,message", [
    ((Arg("a", Tensor), Arg("c", int)), {}, "'c' is not a keyword of the launcher"),
    ((Arg("a", Tensor), Arg("b", int, 3)), {}, "'b' declared with default 3, the launcher's default is 2"),
    ((Arg("b", int),), {}, "required parameter 'a' is not declared"),
    ((Arg("a", Tensor), Arg("a", Tensor)), {}, "declared twice"),
    ((Arg("b", int, 2), Arg("a", Tensor)), {}, "without a default follows one with a default"),
    ((Arg("a", Tensor),), {"returns": Tensor}, "needs a fake"),
    ((Arg("a", Tensor), Arg("_opdecl_launch", int)), {}, "not a plain identifier"),
    ((Arg("a", Tensor), ("b", int)), {}, "expected Arg declarations"),
    ((Arg("a", Tensor, source="pair"),), {}, "expected a source 'parameter.attribute', got 'pair'"),
    ((Arg("a", Tensor, source="pair.a.b"),), {}, "expected a source 'parameter.attribute'"),
    ((Arg("a", Tensor), Arg("b", int, 2, source="pair.b")), {}, "has a source \\('pair.b'\\) and a default"),
    ((Arg("a", Tensor), Arg("b", int, source="a.b")), {}, "'a' is both a source's parameter and an argument"),
], ids=["unknown-name", "other-default", "launcher-required", "twice", "default-order", "returns-no-fake",
        "reserved-name", "not-an-arg", "source-without-attribute", "source-too-deep", "source-and-default",
        "source-root-is-an-argument"])
def test_a_declaration_the_launcher_does_not_match_is_refused(args, kwargs, message):
    with pytest.raises(TypeError, match=message):
        declare_op("kvattn_opdecl_test::refused", _launch_pair, *args, **kwargs)
    assert not hasattr(torch.ops.kvattn_opdecl_test, "refused")


# ---------------------------------------------------------------------------------------------
# every family: each value reaches the launcher keyword of its name
# ---------------------------------------------------------------------------------------------
class _Sentinels(dict):
    """A distinct object per name, made on first use."""

    def __missing__(self, name):
        value = self[name] = type(name, (), {"__repr__": lambda self: f"<{name}>"})()
        return value


def _recorded(monkeypatch, declared, launcher) -> list:
    """The arguments ``declared.entry`` hands its launcher, by the launcher's parameter names (the
    generated entry's globals are its namespace; the launcher is swapped there)."""
    calls = []
    signature = inspect.signature(launcher)

    def record(*args, **kwargs):
        calls.append(dict(signature.bind(*args, **kwargs).arguments))

    monkeypatch.setitem(declared.entry.__globals__, "_opdecl_launch", record)
    return calls


def _declared(calls, declared, s: _Sentinels, **fixed) -> None:
    assert len(calls) == 1
    got = calls[0]
    for a in declared.args:
        if a.name in s:
            assert got[a.name] is s[a.name], a.name
    for name, value in fixed.items():
        assert got[name] == value, name


def test_batch_decode_routes_by_name(monkeypatch):
    s = _Sentinels()
    calls = _recorded(monkeypatch, decode_op.BATCH_DECODE, launch_decode)
    kv = PagedKV(s["k"], s["v"], s["k_table"], s["v_table"], 64, 64, s["k_sf"], s["v_sf"])
    decode_op.batch_decode(  # (positionally, as the public modules call it)
        s["query"], kv, s["seq_lens"], s["mask"], s["sinks"], Scale(s["logit_factor"], s["logit_tensor"]),
        Scale(s["out_factor"], s["out_tensor"]), s["out"], s["workspace"], s["q_len"], s["max_seq_len"],
        s["window_left"], s["max_programs"], s["enable_pdl"], s["lse"], s["kv_start"],
    )
    assert set(s) == {a.name for a in decode_op.BATCH_DECODE.args}
    _declared(calls, decode_op.BATCH_DECODE, s, paged=True)


def test_batch_decode_defaults_reach_the_launcher(monkeypatch):
    s = _Sentinels()
    calls = _recorded(monkeypatch, decode_op.BATCH_DECODE, launch_decode)
    kv = PagedKV(s["k"], s["v"], s["k_table"], s["v_table"], 64, 64)
    decode_op.batch_decode(s["query"], kv, s["seq_lens"], None, None, Scale(0.5), Scale(), s["out"], s["workspace"],
                           1, 8, -1)
    (got,) = calls
    assert (got["enable_pdl"], got["max_programs"], got["lse"], got["kv_start"]) == (False, None, None, None)


def test_entries_take_the_sources_roots_in_declaration_order():
    """An entry's parameters: the arguments without a source and each source's root, where first
    declared (the public modules call them positionally in this order)."""
    def names(entry):
        return list(inspect.signature(entry).parameters)

    assert names(decode_op.batch_decode) == [
        "query", "kv", "seq_lens", "mask", "sinks", "logit_scale", "out_scale", "out", "workspace", "q_len",
        "max_seq_len", "window_left", "max_programs", "enable_pdl", "lse", "kv_start"]
    assert names(decode_op.single_decode_into) == [
        "query", "k", "v", "logit_scale", "out_scale", "rope", "alibi", "window_left", "soft_cap", "rope_scale",
        "rope_theta", "use_tensor_cores", "out", "lse"]
    assert names(mla_op.mla_decode) == [
        "query", "kv", "seq_lens", "logit_scale", "out_scale", "out", "workspace", "max_seq_len", "q_len", "lse"]
    assert names(prefill_op.context) == [
        "query", "kv", "seq_lens", "cum_seq_lens_q", "sinks", "logit_scale", "out_scale", "out", "out_sf",
        "workspace", "max_q_len", "max_kv_len", "window_left", "o_sf_scale", "sf_start", "skip_factor", "lse",
        "causal"]


def test_single_decode_into_routes_by_name(monkeypatch):
    s = _Sentinels()
    calls = _recorded(monkeypatch, decode_op.SINGLE_DECODE_INTO, launch_decode)
    decode_op.single_decode_into(
        s["query"], s["k"], s["v"], Scale(s["logit_factor"], s["logit_tensor"]),
        Scale(s["out_factor"], s["out_tensor"]), s["rope"], s["alibi"], s["window_left"], s["soft_cap"], s["rope_scale"], s["rope_theta"],
        s["use_tensor_cores"], s["out"], s["lse"],
    )
    assert set(s) == {a.name for a in decode_op.SINGLE_DECODE_INTO.args}
    _declared(calls, decode_op.SINGLE_DECODE_INTO, s, paged=False)


def test_mla_decode_routes_by_name(monkeypatch):
    s = _Sentinels()
    calls = _recorded(monkeypatch, mla_op.MLA_DECODE, launch_mla)
    kv = PagedKV(s["kv"], s["kv"], s["table"], s["table"], 576, 512)
    mla_op.mla_decode(s["query"], kv, s["seq_lens"], Scale(s["logit_factor"], s["logit_tensor"]),
                      Scale(s["out_factor"], s["out_tensor"]), s["out"], s["workspace"], s["max_seq_len"], s["q_len"],
                      s["lse"])
    assert set(s) == {a.name for a in mla_op.MLA_DECODE.args}
    _declared(calls, mla_op.MLA_DECODE, s)


def test_context_routes_by_name(monkeypatch):
    s = _Sentinels()
    calls = _recorded(monkeypatch, prefill_op.CONTEXT, launch_context)
    kv = PagedKV(s["k"], s["v"], s["k_table"], s["v_table"], 64, 64, s["k_sf"], s["v_sf"])
    prefill_op.context(
        s["query"], kv, s["seq_lens"], s["cum_seq_lens_q"], s["sinks"], Scale(s["logit_factor"], s["logit_tensor"]),
        Scale(s["out_factor"], s["out_tensor"]), s["out"], s["out_sf"], s["workspace"], s["max_q_len"],
        s["max_kv_len"], s["window_left"], s["o_sf_scale"], s["sf_start"], s["skip_factor"], s["lse"], s["causal"],
    )
    assert set(s) == {a.name for a in prefill_op.CONTEXT.args}
    _declared(calls, prefill_op.CONTEXT, s)


def test_append_routes_by_name(monkeypatch):
    s = _Sentinels()
    calls = _recorded(monkeypatch, append_op.APPEND_PAGED_KV, launch_append)
    kv = PagedKV(s["k"], s["v"], s["table"], s["table"], 64, 64, s["k_sf"], s["v_sf"])
    append_op.append_paged_kv(s["key"], s["value"], kv, s["batch_indices"], s["positions"],
                              k_scale=Scale(s["k_factor"], s["k_tensor"]), v_scale=Scale(s["v_factor"], s["v_tensor"]))
    assert set(s) == {a.name for a in append_op.APPEND_PAGED_KV.args}
    _declared(calls, append_op.APPEND_PAGED_KV, s)


def test_merge_routes_by_name(monkeypatch):
    s = _Sentinels()
    calls = _recorded(monkeypatch, merge_op.MERGE_STATES, launch_merge)
    merge_op.merge_states(*(s[a.name] for a in merge_op.MERGE_STATES.args))
    _declared(calls, merge_op.MERGE_STATES, s)


def test_optional_annotations_make_optional_schema_types():
    schema = torch.ops.kvattn.batch_decode.default._schema
    types = {a.name: str(a.type) for a in schema.arguments}
    assert types["max_programs"] == str(torch._C.OptionalType(torch._C.SymIntType.get()))
    assert types["kv_start"] == "Optional[Tensor]"
    assert Optional[torch.Tensor] == OptTensor
