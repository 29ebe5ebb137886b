"""Shared pieces of the validation tests: valid baseline arguments and tensor mutators.

Each validation test starts from a valid call, changes one argument and expects one exception type
whose message starts with the argument's name (``"argname: ..."``).
"""

from __future__ import annotations

import pytest
import torch

from kvattn.testing import make_paged_kv

BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn


def meta(t: torch.Tensor) -> torch.Tensor:
    """The same tensor on the "meta" device (a device other than the query's)."""
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def strided_last(t: torch.Tensor) -> torch.Tensor:
    """Same shape and values, stride 2 in the last dim."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


def paged(lens=(5, 20), *, hkv=2, d=64, page=16, kv_format="bfloat16", layout="NHD", form="stacked", **kw):
    return make_paged_kv(list(lens), num_kv_heads=hkv, head_dim=d, page_size=page, dtype=BF16, kv_format=kv_format,
                         layout=layout, form=form, nan_fill=False, **kw)


def expect(func, kwargs, exc, name):
    """Call ``func(**kwargs)`` and check the exception type and that the message names ``name``."""
    with pytest.raises(exc, match=f"^{name}:"):
        func(**kwargs)


def case(id_, mutate, exc, name):
    """One pytest param: ``mutate(kwargs) -> None`` edits a valid call's arguments in place."""
    return pytest.param(mutate, exc, name, id=id_)


def set_args(**changes):
    """A ``mutate`` for :func:`case`: replace arguments (a callable value gets the kwargs first)."""

    def mutate(kw):
        for k, v in changes.items():
            kw[k] = v(kw) if callable(v) else v

    return mutate
