"""The fast path's call into Triton's C launcher (``c_launcher.launcher``) for Triton 3.6 and 3.7:
launchers built the way each version's ``CudaLauncher.__init__`` builds them (its own
``wrap_handle_tensordesc`` around a stand-in for the compiled C entry point), so that what the fast
path hands the C entry is compared with what Triton's own ``CudaLauncher`` path hands it.

Tensor descriptors: the fast path expands them itself and keeps each expansion (the encoded
``CUtensorMap``) per descriptor; every fact the encoding reads changes the key (a new pointer,
shape, stride, padding, tf32 rounding each encode afresh); launchers of other shapes, and other
Tritons, take Triton's path.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
import triton

from kvattn.runtime import c_launcher, tma_descriptors

from .test_fast_launch import FAST_PATH_TRITON

pytestmark = FAST_PATH_TRITON

V36 = triton.__version__.startswith("3.6")


class Encoder:
    """A stand-in for Triton's ``fill_tma_descriptor`` (3.6) / ``fill_tma_descriptor_tiled`` (3.7):
    an encoding that shows every input, and a count of the encodings."""

    def __init__(self, monkeypatch):
        self.count = 0

        def fill(ptr, swizzle, elem_size, elem_type, block_size, shape, strides, padding):
            self.count += 1
            return ("tensormap", ptr, swizzle, elem_size, elem_type, tuple(block_size), tuple(shape), tuple(strides),
                    padding)

        # (3.7: tritons_launcher sets the shared C entry point, utils.launch)
        self.utils = types.SimpleNamespace(fill_tma_descriptor=fill, fill_tma_descriptor_tiled=fill, launch=None)
        monkeypatch.setattr(triton.runtime.driver, "_active", types.SimpleNamespace(utils=self.utils))


def meta_of(block) -> dict:
    return {"swizzle": 3, "elem_size": 2, "elem_type": 10, "block_size": list(block), "fp4_padded": False}


def tritons_launcher(signature: dict, tensordesc_meta, calls: list, *, scratch: int = 0):
    """A ``CudaLauncher`` as the running Triton's ``__init__`` makes it for a kernel of ``signature``
    (parameter -> type, constexprs included), over a C entry point that records its arguments
    (3.7: the driver's shared one, an :class:`Encoder` must be active)."""
    from triton.backends.nvidia import driver as nvidia

    def c_launch(*args):
        calls.append(args)

    if not hasattr(nvidia, "_BASE_ARGS_FORMAT"):
        triton.runtime.driver.active.utils.launch = c_launch

    run = object.__new__(nvidia.CudaLauncher)
    run.num_ctas = 1
    run.global_scratch_size, run.global_scratch_align = scratch, 1
    run.profile_scratch_size, run.profile_scratch_align = 0, 1
    run.launch_cooperative_grid, run.launch_pdl = False, True
    run.launch = nvidia.wrap_handle_tensordesc(c_launch, dict(enumerate(signature.values())), tensordesc_meta)
    if not hasattr(nvidia, "_BASE_ARGS_FORMAT"):  # 3.7: the shared C entry takes these (built from the GPU's driver)
        run.arg_annotations, run.kernel_signature = ("annotations",), b"signature"
    return run


def compiled_with(run):
    compiled = types.SimpleNamespace(function=0xF00, packed_metadata=(4, 1, 0))
    compiled.run = run
    return compiled


def c_params(args: tuple) -> tuple:
    """The kernel parameters a C launch got (3.6: after the 13 leading arguments; 3.7: its last)."""
    return tuple(args[13:]) if V36 else tuple(args[15])


def c_head(args: tuple) -> tuple:
    return tuple(args[:13]) if V36 else tuple(args[:15])


def seen(values) -> tuple:
    """Tensors as their data pointers (Triton's path hands the C entry the tensor, which it reads so)."""
    return tuple(v.data_ptr() if isinstance(v, torch.Tensor) else v for v in values)


SIGNATURE = {"x": "*fp16", "desc": "tensordesc<fp16[16, 64]>", "n": "i32", "BLOCK": "constexpr"}


def launch_both(run, params: tuple, calls: list):
    """``(fast path's C arguments, Triton's own)`` of one launch of ``params`` (grid 2x1x1, stream 7)."""
    launch, fixed = c_launcher.launcher(compiled_with(run))
    launch(2, 1, 1, 7, *fixed, *params)
    fast = calls.pop()
    run(2, 1, 1, 7, 0xF00, (4, 1, 0), None, None, None, *params)  # CompiledKernel.__getitem__'s call
    ours = calls.pop()
    return fast, ours


def desc(t, shape=(64, 64), strides=(64, 1), block=(16, 64), padding="zero", **kw):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(t, list(shape), list(strides), list(block), padding, **kw)


@pytest.mark.parametrize("with_meta", [True, False], ids=["tma", "pointer-lowered"])
def test_descriptor_launches_hand_the_c_entry_what_tritons_wrapper_does(with_meta, monkeypatch):
    """The fast path calls the C entry point itself, with each descriptor expanded as Triton's
    ``make_tensordesc_arg`` expands it (encoded map, shape, strides; or, for a kernel that takes
    the descriptor as a pointer, the base's address and the geometry)."""
    enc = Encoder(monkeypatch)
    calls = []
    run = tritons_launcher(SIGNATURE, [meta_of((16, 64))] if with_meta else None, calls)
    t = torch.zeros(64 * 64, dtype=torch.float16)
    launch, _ = c_launcher.launcher(compiled_with(run))
    assert launch is not run and getattr(launch, "__code__", None) is not run.launch.__code__
    params = (t, desc(t.view(64, 64)), 64, 32)
    fast, ours = launch_both(run, params, calls)
    assert c_head(fast) == c_head(ours)
    assert seen(c_params(fast)) == seen(c_params(ours))
    assert c_params(fast)[1][:2] == ("tensormap", t.data_ptr()) if with_meta else c_params(fast)[1] == t.data_ptr()
    assert enc.count == (2 if with_meta else 0)  # (one each: the fast path's, Triton's)


def test_an_encoded_descriptor_is_kept_per_pointer_and_geometry(monkeypatch):
    """The same descriptor launched again reuses its encoding; a new base pointer, shape, stride
    or padding each encode afresh (and reach the C entry as Triton's path hands them)."""
    enc = Encoder(monkeypatch)
    calls = []
    run = tritons_launcher(SIGNATURE, [meta_of((16, 64))], calls)
    launch, fixed = c_launcher.launcher(compiled_with(run))
    pool = torch.zeros(4 * 64 * 128, dtype=torch.float16)
    x = torch.zeros(8, dtype=torch.float16)

    def fast_launch_of(d):
        before = enc.count
        launch(2, 1, 1, 7, *fixed, x, d, 64, 32)
        got = calls.pop()
        run(2, 1, 1, 7, 0xF00, (4, 1, 0), None, None, None, x, d, 64, 32)
        assert seen(c_params(got)) == seen(c_params(calls.pop())), "not what Triton's wrapper hands the C entry"
        return enc.count - before - 1, c_params(got)[1]  # (less Triton's own encoding)

    base = desc(pool)
    assert fast_launch_of(base)[0] == 1
    again, first = fast_launch_of(desc(pool))  # an equal descriptor, another object
    assert again == 0
    fresh = {
        "pointer": desc(pool[64 * 128:]),
        "shape": desc(pool, shape=(32, 64)),
        "stride": desc(pool, strides=(128, 1)),
        "padding": desc(pool, padding="nan"),
    }
    for name, d in fresh.items():
        encoded, got = fast_launch_of(d)
        assert encoded == 1, f"a new {name} reused an encoding"
        assert got != first
        assert fast_launch_of(d)[0] == 0, f"the same {name} encoded twice"
    assert fast_launch_of(desc(pool))[0] == 0  # the first one is still kept


@pytest.mark.skipif(V36, reason="3.7's descriptors carry round_f32_to_tf32 (3.6's have none)")
def test_tf32_rounding_is_in_the_descriptor_key(monkeypatch):
    enc = Encoder(monkeypatch)
    calls = []
    signature = {"x": "*fp32", "desc": "tensordesc<fp32[16, 32]>", "n": "i32", "BLOCK": "constexpr"}
    run = tritons_launcher(signature, [dict(meta_of((16, 32)), elem_size=4, elem_type=7)], calls)
    pool = torch.zeros(64 * 64)
    plain, rounded = desc(pool, block=(16, 32)), desc(pool, block=(16, 32), round_f32_to_tf32=True)
    fast_plain, _ = launch_both(run, (pool, plain, 64, 32), calls)
    fast_rounded, ours = launch_both(run, (pool, rounded, 64, 32), calls)
    assert enc.count == 4
    assert seen(c_params(fast_rounded)) == seen(c_params(ours)) and c_params(fast_rounded) != c_params(fast_plain)


def test_the_descriptor_cache_is_bounded(monkeypatch):
    enc = Encoder(monkeypatch)
    calls = []
    run = tritons_launcher(SIGNATURE, [meta_of((16, 64))], calls)
    launch, fixed = c_launcher.launcher(compiled_with(run))
    pool = torch.zeros(1 << 16, dtype=torch.float16)
    limit = tma_descriptors.DescriptorSlot.LIMIT
    for i in range(3 * limit):
        launch(1, 1, 1, 0, *fixed, pool, desc(pool[64 * i:]), 1, 1)
    ((_, slot),) = launch.descriptor_slots
    assert 0 < len(slot.seen) <= limit and enc.count == 3 * limit


def test_two_descriptors_expand_in_place(monkeypatch):
    """Two descriptor parameters with a plain one between them: each expands where it stands."""
    Encoder(monkeypatch)
    calls = []
    signature = {"a": "tensordesc<fp16[16, 64]>", "n": "i32", "b": "tensordesc<fp16[32, 64]>", "o": "*fp16",
                 "BLOCK": "constexpr"}
    run = tritons_launcher(signature, [meta_of((16, 64)), meta_of((32, 64))], calls)
    k, v = torch.zeros(64 * 64, dtype=torch.float16), torch.zeros(64 * 64, dtype=torch.float16)
    fast, ours = launch_both(run, (desc(k), 5, desc(v, block=(32, 64)), k, 16), calls)
    assert seen(c_params(fast)) == seen(c_params(ours))
    assert len(c_params(fast)) == 2 * 5 + 3


def test_plain_kernels_call_the_c_entry_with_their_parameters(monkeypatch):
    """No descriptor: the C entry point directly (3.6: its format; 3.7: the parameters as one
    sequence after the annotations), as Triton's ``CudaLauncher.__call__`` calls it."""
    Encoder(monkeypatch)
    calls = []
    signature = {"x": "*fp16", "n": "i32", "BLOCK": "constexpr"}
    run = tritons_launcher(signature, None, calls)
    assert run.launch.__name__ == "c_launch"  # (Triton wraps only descriptor kernels)
    x = torch.zeros(8, dtype=torch.float16)
    fast, ours = launch_both(run, (x.data_ptr(), 3, 32), calls)
    assert fast == ours


@pytest.mark.parametrize("change", ["scratch", "other-wrapper", "other-triton", "unknown-module"])
def test_launchers_of_other_shapes_take_tritons_run(change, monkeypatch):
    """A launcher the fast path was not verified against (scratch memory to allocate, a wrapper that
    is not Triton's own, another Triton release, another driver module) is called through
    ``CompiledKernel.run``'s path, which handles it."""
    Encoder(monkeypatch)
    calls = []
    run = tritons_launcher(SIGNATURE, [meta_of((16, 64))], calls, scratch=64 if change == "scratch" else 0)
    if change == "other-wrapper":
        inner = run.launch
        run.launch = lambda *args: inner(*args)
    elif change == "other-triton":
        monkeypatch.setattr(triton, "__version__", "3.9.0")
    elif change == "unknown-module":
        monkeypatch.setitem(sys.modules, type(run).__module__, types.ModuleType("elsewhere"))
    compiled = compiled_with(run)
    launch, fixed = c_launcher.launcher(compiled)
    if change == "other-wrapper" and V36:  # 3.6's C format, behind an unknown wrapper: called as before
        assert launch is run.launch
        return
    assert launch is run and fixed == (0xF00, (4, 1, 0), None, None, None)
