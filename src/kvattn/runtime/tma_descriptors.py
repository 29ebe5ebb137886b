"""Tensor (TMA) descriptors on the fast launch path (:mod:`.fast_launch`).

What a :class:`~.fast_launch.Launch` builds on a call's tensor (:class:`Descriptor`), what Triton
specialises a descriptor argument on (:func:`descriptor_spec`), a recorded call's descriptors
rebuilt on new pointers (:class:`ReplayDescriptor`, :func:`descriptor_template`), and the expansion
of descriptor arguments for Triton's C launcher: its own per-launch wrapper recognised and taken
apart (:func:`tritons_descriptor_wrapper`, :func:`unwrap_descriptors`), each encoding kept per
pointer and geometry (:class:`DescriptorSlot`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import torch


def descriptor_spec(desc) -> tuple:
    """What Triton 3.6 and 3.7.1 specialise a tensor-descriptor argument on: its class (Triton's
    ``TensorDescriptor`` or Gluon's), its base's dtype, its block shape and (Gluon) its shared-memory
    layout; ``native_specialize_impl`` makes ``tensordesc<dtype[block]>`` (Gluon:
    ``tensordesc<dtype[block],layout>``) of these and of nothing else: neither the base's alignment
    (the descriptor's constructor requires 16 bytes), nor the shape, strides, padding or tf32
    rounding, which the launcher encodes per launch. ``test_fast_launch.py`` pins this against
    Triton's own specialisation."""
    return type(desc), desc.base.dtype, tuple(desc.block_shape), getattr(desc, "layout", None)



class _Base(int):
    """A descriptor's base as a bare data pointer: what Triton's launchers read of the base tensor
    (``data_ptr()`` to encode a TMA descriptor; the pointer itself where the kernel takes the base
    as a pointer: an int, which the C launcher reads without querying the driver)."""

    __slots__ = ()

    def data_ptr(self) -> int:
        return int(self)


@dataclasses.dataclass(slots=True)
class ReplayDescriptor:
    """A tensor descriptor rebuilt from a data pointer, with everything Triton's launcher reads of
    one (``base.data_ptr()``, ``shape``, ``strides``, ``padding``, and 3.7's
    ``round_f32_to_tf32``); ``block_shape`` and ``layout`` for tests and tools. Only launchers of
    compiled kernels take it (they specialised on the original: :func:`descriptor_spec`)."""

    base: _Base
    shape: tuple
    strides: tuple
    block_shape: tuple
    layout: Any
    padding: str
    round_f32_to_tf32: bool


class Descriptor(NamedTuple):
    """A tensor descriptor a :class:`~.fast_launch.Launch` builds on one of a call's tensors at every
    call: the tensor's name in the launch's :class:`~.fast_launch.CallLayout`, then the descriptor's
    geometry, fixed by the launch's host facts (elements). ``layout``: a Gluon shared-memory layout
    (Gluon's ``TensorDescriptor``), or None for Triton's."""

    tensor: str
    shape: tuple
    strides: tuple
    block_shape: tuple
    layout: Any = None

    def maker(self) -> Callable[[torch.Tensor], Any]:
        """``f(base)``: the descriptor of ``base`` (what the kernel parameter gets for a call), its
        class looked up once, here (fresh shape lists each call, as a caller building it would)."""
        shape, strides, block, layout = tuple(self.shape), tuple(self.strides), tuple(self.block_shape), self.layout
        if layout is None:
            from triton.tools.tensor_descriptor import TensorDescriptor

            return lambda base: TensorDescriptor(base, list(shape), list(strides), list(block))
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

        return lambda base: GluonDescriptor(base, list(shape), list(strides), list(block), layout)

    def make(self, base: torch.Tensor):
        """The descriptor of ``base``."""
        return self.maker()(base)


def descriptor_base(value) -> int | None:
    """The base pointer of a tensor descriptor passed as a per-call value, or None for anything
    else (a descriptor: an object with a ``base`` that has ``data_ptr()`` and a ``block_shape``)."""
    base = getattr(value, "base", None)
    if base is None or not hasattr(value, "block_shape") or not hasattr(base, "data_ptr"):
        return None
    return base.data_ptr()


def descriptor_template(desc) -> Callable[[int], ReplayDescriptor]:
    """``f(pointer)``: ``desc`` with its base at ``pointer`` (shape, strides, block shape, layout
    and padding as recorded: a recorded call's key holds every fact they follow from)."""
    fields = (tuple(desc.shape), tuple(desc.strides), tuple(desc.block_shape), getattr(desc, "layout", None),
              desc.padding, getattr(desc, "round_f32_to_tf32", False))
    return lambda ptr: ReplayDescriptor(_Base(ptr), *fields)



_WRAPPER_CODE: dict = {}  # driver module -> the code object of its wrap_handle_tensordesc's inner (or None)


def tritons_descriptor_wrapper(module):
    """The code object of the wrapper ``module.wrap_handle_tensordesc`` puts around a launcher of a
    kernel that takes tensor descriptors (made once, around a stand-in), or None."""
    if module in _WRAPPER_CODE:
        return _WRAPPER_CODE[module]
    code = None
    wrap = getattr(module, "wrap_handle_tensordesc", None)
    if wrap is not None and getattr(module, "make_tensordesc_arg", None) is not None:
        try:
            inner = wrap(len, {0: "tensordesc<fp16[16, 16]>"}, None)
        except Exception:  # pragma: no cover - another signature: no descriptor expansion here
            inner = None
        if inner is not len and set(getattr(getattr(inner, "__code__", None), "co_freevars", ())) == _WRAPPER_CELLS:
            code = inner.__code__
    _WRAPPER_CODE[module] = code
    return code


_WRAPPER_CELLS = {"launcher", "tensordesc_indices", "tensordesc_meta"}


def unwrap_descriptors(inner, module):
    """``(C launch, ((parameter index, DescriptorSlot), ...))`` from Triton's descriptor wrapper."""
    cells = dict(zip(inner.__code__.co_freevars, (c.cell_contents for c in inner.__closure__)))
    indices, metas = sorted(cells["tensordesc_indices"]), list(cells["tensordesc_meta"])
    if len(indices) != len(metas):
        return None
    encode = module.make_tensordesc_arg
    return cells["launcher"], tuple((i, DescriptorSlot(encode, meta)) for i, meta in zip(indices, metas))


class DescriptorSlot:
    """The expanded launcher arguments of one tensor-descriptor parameter of one compiled kernel,
    kept per descriptor: Triton's ``make_tensordesc_arg`` encodes a ``CUtensorMap`` on the host
    (``cuTensorMapEncodeTiled``) and lists it with the shape and strides, on every launch; a serving
    engine's cache keeps its address and geometry from call to call, so the encoding is reused.

    The key covers everything the expansion reads of a descriptor (both versions' ``make_tensordesc_arg``):
    the base's data pointer, shape, strides, padding and (3.7) ``round_f32_to_tf32``; and of the
    slot: the kernel's descriptor metadata (swizzle, element size and type, block size, fp4
    padding), fixed per compiled kernel and parameter, which is what a slot is. The block shape, the
    base's dtype and (Gluon) the layout fix that metadata; they are the descriptor's
    specialisation (:func:`descriptor_spec`), equal for every descriptor a compiled kernel is
    launched with, and the block shape is in the key besides. A new key encodes afresh. Reusing an
    encoded ``CUtensorMap`` across launches is what Triton does within one (the launch copies the
    parameter's bytes). A kernel that takes the descriptor as a pointer (no metadata: not lowered
    to TMA) gets the base's address as an int, which keeps no tensor alive.
    """

    __slots__ = ("encode", "meta", "seen")
    LIMIT = 32  # descriptors kept per slot; past this the slot starts over

    def __init__(self, encode, meta):
        self.encode, self.meta, self.seen = encode, meta, {}

    def expand(self, desc) -> tuple:
        ptr = desc.base.data_ptr()
        key = (ptr, tuple(desc.shape), tuple(desc.strides), desc.padding, getattr(desc, "round_f32_to_tf32", False),
               tuple(desc.block_shape))
        hit = self.seen.get(key)
        if hit is None:
            hit = list(self.encode(desc, self.meta))
            if self.meta is None:
                hit[0] = int(ptr)  # the base as a pointer
            hit = tuple(hit)
            if len(self.seen) >= self.LIMIT:
                self.seen.clear()
            self.seen[key] = hit
        return hit


def expand_descriptors(args: tuple, slots: tuple) -> list:
    """``args`` with the descriptor at each of ``slots``' positions replaced by its expansion
    (``slots`` last position first, so that the earlier positions stay put)."""
    args = list(args)
    for i, slot in slots:
        args[i:i + 1] = slot.expand(args[i])
    return args

