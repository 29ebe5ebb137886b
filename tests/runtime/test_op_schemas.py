"""The registered torch ops' schemas: what every supported torch can dispatch.

torch 2.11's in-place bookkeeping for a custom op (ADInplaceOrView) looks up each mutated argument
by its position among the boxed arguments, from which trailing arguments equal to their default are
dropped: a mutated argument with a default, left at it, made every ``torch.compile`` of batch
decode, MLA and prefill fail there with an IndexError (torch 2.13 looks it up safely). So no
mutated argument may have a default; the declarations (``kvattn.runtime.opdecl``) give the schemas
none at all, their entries passing every argument.
"""

from __future__ import annotations

import pytest
import torch

import kvattn  # noqa: F401  (registers the ops)

# the ops that write into their arguments (single_decode returns new tensors)
OPS = ["batch_decode", "single_decode_into", "mla_decode", "context", "merge_states",
       "append_paged_kv", "ragged_pack", "ragged_unpack"]


@pytest.mark.parametrize("name", OPS)
def test_no_mutated_argument_has_a_default(name):
    import kvattn.ops.append.op, kvattn.ops.decode.op, kvattn.ops.merge.op, kvattn.ops.mla.op  # noqa: E401,F401
    import kvattn.ops.decode.ragged, kvattn.ops.prefill.op  # noqa: E401,F401

    schema = getattr(torch.ops.kvattn, name).default._schema
    mutated = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert mutated, schema
    assert [a.name for a in mutated if a.has_default_value()] == []
    assert [a.name for a in schema.arguments if a.has_default_value()] == []


def test_every_registered_op_is_listed():
    import kvattn.ops.append.op, kvattn.ops.decode.op, kvattn.ops.merge.op, kvattn.ops.mla.op  # noqa: E401,F401
    import kvattn.ops.decode.ragged, kvattn.ops.prefill.op  # noqa: E401,F401

    registered = {name for name in dir(torch.ops.kvattn) if isinstance(getattr(torch.ops.kvattn, name, None),
                                                                      torch._ops.OpOverloadPacket)}
    assert registered == set(OPS) | {"single_decode"}
