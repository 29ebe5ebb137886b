"""Triton 3.6's specialisation of a launch argument: what the fast launch path's key
(:mod:`.fast_launch`) holds of each argument, and where Triton would specialise otherwise
(:class:`Unspecializable`: such a launch is left to Triton).

Triton 3.6 picks a compiled kernel by the current device, the options and the
specialisation of every argument (``native_specialize_impl`` with specialisation and alignment
on, the defaults of unannotated parameters):

* tensor: its dtype and whether ``data_ptr() % 16 == 0``;
* int: ``== 1`` (passed as a constexpr); otherwise whether it is divisible by 16, and its type:
  i32 in [-2^31, 2^31), else i64 below 2^63, else u64 below 2^64 (beyond: an OverflowError);
* float: fp32 whatever the value; bool: u1; None: a constexpr;
* tuple: each member's, as an argument of its own (Triton passes the members as parameters);
* tensor descriptor (Triton's or Gluon's): its base's dtype, block shape and (Gluon) layout
  (:func:`.tma_descriptors.descriptor_spec`; the launcher encodes the rest per launch);
* constexpr parameters: their values;

plus the options (``num_warps``, ``num_stages``, ``launch_pdl``, ...), the kernel's ``debug``
flag and the ``debug``/``instrumentation_mode`` knobs. The key holds each of these facts, or finer
ones (a finer key only costs one more trip through ``kernel[grid]``): constexprs and options are
compared with their types, so ``True`` and ``1`` differ where Triton's own lookup conflates them.
A parameter marked ``do_not_specialize``/``do_not_specialize_on_alignment`` or annotated with a
type is specialised otherwise; :class:`~.fast_launch.Launch` leaves such kernels to Triton.
"""

from __future__ import annotations

from typing import Any

import torch

_INT32 = 1 << 31
_INT64 = 1 << 63
_UINT64 = 1 << 64
_ONE = ("constexpr", 1)
_U1 = ("u1",)
_FP32 = ("fp32",)
_NONE = ("constexpr", None)
_TUPLE = "tuple"


class Unspecializable(TypeError):
    """An argument whose specialisation the fast path does not model: Triton launches it."""


def int_spec(value: int) -> tuple:
    """Triton 3.6's specialisation of an int argument: ``("constexpr", 1)`` or ``(type, % 16 == 0)``."""
    if type(value) is not int:
        raise Unspecializable(f"expected an int, got {type(value).__name__}")
    if value == 1:
        return _ONE
    if -_INT32 <= value < _INT32:
        kind = "i32"
    elif -_INT64 <= value < _INT64:
        kind = "i64"
    elif _INT64 <= value < _UINT64:
        kind = "u64"
    else:
        raise Unspecializable(f"integer {value} does not fit 64 bits")
    return kind, value & 15 == 0


def arg_spec(value: Any) -> tuple:
    """Triton 3.6's specialisation of one non-constexpr argument (see the module docstring)."""
    kind = type(value)
    if kind is int:
        return int_spec(value)
    if kind is bool:
        return _U1
    if kind is float:
        return _FP32
    if value is None:
        return _NONE
    if isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() & 15 == 0
    if kind is tuple:
        return _TUPLE, tuple(map(arg_spec, value))
    raise Unspecializable(f"no specialisation rule for {kind.__name__}")
