"""Scale arguments as :class:`Scale`: a host float times an optional one-element device tensor, so
every backend applies exactly two scales (a logit multiplier and an output multiplier)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .checks import check_tensor


class Scale(NamedTuple):
    """``factor * tensor[0]`` (``tensor`` None means 1): a host float and an optional device value.

    Kernels take ``factor`` as an argument and read ``tensor`` on the device, so neither form makes
    the host wait. (A named tuple: immutable, and made in half the time of a frozen dataclass.)
    """

    factor: float = 1.0
    tensor: torch.Tensor | None = None

    def times(self, other: "Scale | float") -> "Scale":
        if not isinstance(other, Scale):
            other = float(other)
            return self if other == 1.0 else Scale(self.factor * other, self.tensor)  # x * 1.0 == x
        if self.tensor is not None and other.tensor is not None:
            # Two device factors: their product is one more tiny device op (no sync).
            return Scale(self.factor * other.factor, (self.tensor.reshape(1) * other.tensor.reshape(1)))
        return Scale(self.factor * other.factor, self.tensor if self.tensor is not None else other.tensor)

    def value(self) -> torch.Tensor | float:
        """For the reference backend: a float, or a 0-d float32 tensor."""
        if self.tensor is None:
            return self.factor
        return self.tensor.reshape(()).to(torch.float32) * self.factor


_UNIT = Scale(1.0)


def to_scale(value, name: str, device, *, allow_none_as: float | None = None) -> Scale:
    if type(value) is float and math.isfinite(value):  # the common case, first
        return _UNIT if value == 1.0 else Scale(value)
    if value is None:
        if allow_none_as is None:
            raise TypeError(f"{name}: expected a float or a one-element float32 tensor, got None")
        return Scale(float(allow_none_as))
    if isinstance(value, torch.Tensor):
        check_tensor(value, name, dtypes=(torch.float32,))
        if value.numel() != 1:
            raise ValueError(f"{name}: expected a one-element tensor, got shape {list(value.shape)}")
        if value.device != device:
            raise ValueError(f"{name}: expected a tensor on {device} (the query's device), got one on {value.device}")
        return Scale(1.0, value if value.dim() == 1 else value.reshape(1))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a float or a one-element float32 tensor, got {type(value).__name__}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{name}: expected a finite value, got {value}")
    return Scale(float(value))
