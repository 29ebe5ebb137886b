"""MLA's combine launch: on Hopper a programmatic dependent launch of the split kernel (its launch and
prologue under the split's last programs, ``griddepcontrol.wait`` before its first load), as
decode's combine; elsewhere (other GPUs, Triton's interpreter) a plain launch. Planned on the CPU
from host facts, the GPU family faked."""

from __future__ import annotations

import pytest
import torch

from kvattn.ops.common.combine import balanced_combine_kernel, decode_combine_kernel
from kvattn.ops.mla import plan as mla_plan


def _plan(monkeypatch, family: str, *, batch: int, heads: int, interpreter: bool = False):
    monkeypatch.setattr(mla_plan, "arch", lambda device, interp: "interpreter" if interp else family)
    monkeypatch.setattr(mla_plan._device, "sm_count", lambda device: 132)
    pages, page = 4096, 64
    facts = mla_plan.MLAFacts(
        device=torch.device("cpu"), interpreter=interpreter, q_shape=(batch, heads, 576),
        q_stride=(heads * 576, 576, 1), q_dtype=torch.bfloat16, kv_shape=(pages, page, 576),
        kv_stride=(page * 576, 576, 1), kv_dtype=torch.bfloat16, table_stride=(512, 1),
        out_stride=(heads * 512, 512, 1), ws_numel=256 << 20, has_logit=False, has_out_scale=False,
        aligned4=False, aligned16=True, gluon_on=False, gluon_ws_on=False)
    return mla_plan._Plan(facts)


@pytest.mark.parametrize("batch,lengths,kernel", [(1, 4096, decode_combine_kernel), (8, 30000, balanced_combine_kernel)],
                         ids=["B1-Hq16-4096-uniform-split", "B8-Hq16-30000-balanced-split"])
def test_hopper_combine_is_a_dependent_launch(batch, lengths, kernel, monkeypatch):
    split, combine, *_ = _plan(monkeypatch, "sm90", batch=batch, heads=16).launches(lengths)
    assert combine is not None and combine.kernel is kernel, "the case must split the keys"
    assert combine.constexprs["USE_PDL"] and combine.options.get("launch_pdl") is True
    # (the split kernel is the primary: nothing of it changes)
    assert "launch_pdl" not in split.options


@pytest.mark.parametrize("family,interpreter", [("sm80", False), ("sm90", True)], ids=["ampere", "interpreter"])
def test_other_gpus_and_the_interpreter_launch_the_combine_plainly(family, interpreter, monkeypatch):
    split, combine, *_ = _plan(monkeypatch, family, batch=64, heads=16, interpreter=interpreter).launches(4096)
    assert combine is not None
    assert not combine.constexprs["USE_PDL"] and "launch_pdl" not in combine.options


@pytest.mark.parametrize("batch,heads,span,wide,few", [
    (64, 64, 4096, 4, 2),  # an equal grid row: 4096 combine programs, rounds of 4 at most
    (64, 16, 4096, 4, 2),  # 1024 programs, still more than 5 an SM
    (8, 16, 30000, 16, 16),  # 128 programs: the wide tile (16 partials a round) stays
], ids=["B64-Hq64-4096", "B64-Hq16-4096", "B8-Hq16-30000"])
def test_the_balanced_combine_keeps_its_tile_narrow_over_many_programs(batch, heads, span, wide, few, monkeypatch):
    """The wide tile's registers set every program's occupancy: a launch of more than 5 combine
    programs an SM merges at most 4 partials a round (``plan._WIDE_MERGE_PROGRAMS_PER_SM``)."""
    _, combine, *_ = _plan(monkeypatch, "sm90", batch=batch, heads=heads).launches(span)
    assert combine.kernel is balanced_combine_kernel
    assert (combine.constexprs["BLOCK_S"], combine.constexprs["BLOCK_S_FEW"]) == (wide, few)
    assert (batch * heads > mla_plan._WIDE_MERGE_PROGRAMS_PER_SM * 132) == (wide <= mla_plan._MANY_PROGRAMS_BLOCK_S)
