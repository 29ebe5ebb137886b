"""Arguments by name from the public function to the kernel: the host-fact records are built from
locals of their fields' names, in field order, and a call's values reach the kernel parameters of
the names each launch gives them."""

from __future__ import annotations

import ast
import inspect

import pytest
import torch

import kvattn
from kvattn.ops.append import plan as append_launch
from kvattn.ops.decode import plan as decode_launch
from kvattn.runtime import fast_launch
from kvattn.ops.decode import ragged as ragged_launch
from kvattn.ops.merge import plan as merge_launch
from kvattn.ops.mla import plan as mla_launch
from kvattn.ops.prefill import plan as prefill_launch
from kvattn.ops.prefill import staging as staging_launch
from kvattn.testing import make_paged_kv


@pytest.mark.parametrize("module,record", [
    (decode_launch, "DecodeFacts"), (mla_launch, "MLAFacts"), (append_launch, "AppendFacts"),
    (prefill_launch, "PrefillFacts"), (staging_launch, "StageFacts"), (merge_launch, "MergeFacts"),
    (merge_launch, "LocalLengthsFacts"), (ragged_launch, "PackFacts"), (ragged_launch, "UnpackFacts"),
], ids=["decode", "mla", "append", "prefill", "staging", "merge", "local-lengths", "ragged-pack", "ragged-unpack"])
def test_facts_are_built_from_locals_named_as_their_fields(module, record):
    """The record is built positionally (keyword construction costs host time), so its order is
    checked here: every element of ``Record._make((...))`` is a local named as its field."""
    fields = getattr(module, record)._fields
    tree = ast.parse(inspect.getsource(module))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "_make" and isinstance(n.func.value, ast.Name) and n.func.value.id == record]
    assert len(calls) == 1
    (values,) = calls[0].args
    names = [e.id if isinstance(e, ast.Name) else ast.unparse(e) for e in values.elts]
    assert names == list(fields)


def test_window_left_reaches_the_kernel_parameter_of_its_name(monkeypatch, kernel_device):
    """Follow ``window_left`` from the public function: it is the call's int of that name, which
    the split launch gives the kernel parameter ``window_left``."""
    if kernel_device.type == "cpu":
        monkeypatch.setenv("KVATTN_BACKEND", "triton")
    seen = []
    real = fast_launch.Launch.__call__

    def record(launch, call):
        seen.append((launch, call))
        return real(launch, call)

    monkeypatch.setattr(fast_launch.Launch, "__call__", record)
    case = make_paged_kv([40, 7], num_kv_heads=1, head_dim=64, page_size=16, dtype=torch.float16, seed=1,
                         device=kernel_device)
    q = torch.randn(2, 2, 64, dtype=torch.float16, device=kernel_device)
    ws = torch.zeros(1 << 20, dtype=torch.uint8, device=kernel_device)
    kvattn.decode.xqa_batch_decode_with_kv_cache(q, case.kv_cache, ws, case.block_tables, case.seq_lens, 40,
                                                 bmm1_scale=0.125, window_left=5)
    split = [(launch, call) for launch, call in seen if launch.kernel.fn.__name__ == "decode_split_kernel"]
    assert split
    launch, call = split[0]
    assert launch.per_call["window_left"] == "window_left"
    assert launch.argument("window_left", call) == 5
    assert launch.argument("logit_factor", call) == pytest.approx(0.125)
    assert launch.constexprs["HAS_WINDOW"] is True
