"""Triton's compiled launcher called straight (:func:`launcher`): the C entry point of a Triton 3.6 /
3.7 ``CudaLauncher``, in the shapes read from those versions' ``backends/nvidia/driver.py``, with
tensor-descriptor arguments expanded here (:mod:`.tma_descriptors`); any other launcher through its
``run``. The fast launch path (:mod:`.fast_launch`) keeps what this returns per compiled kernel.
"""

from __future__ import annotations

import sys
from typing import Callable

import triton

from .tma_descriptors import expand_descriptors, tritons_descriptor_wrapper, unwrap_descriptors


def launcher(compiled) -> tuple[Callable, tuple]:
    """``(launch, fixed)``: ``launch(gx, gy, gz, stream, *fixed, *args)`` runs ``compiled``.

    That is ``compiled.run`` with the kernel's handle and metadata and no launch hooks, as
    ``CompiledKernel.__getitem__`` calls it; for the CUDA launcher of a kernel that needs no scratch
    memory, straight its C entry point (the Python ``__call__`` in between only allocates scratch),
    in the shape :func:`_c_launcher` verified; anything else takes ``run``.
    """
    run = compiled.run
    direct = _c_launcher(run, compiled) if type(run).__name__ == "CudaLauncher" else None
    if direct is not None:
        return direct
    return run, (compiled.function, compiled.packed_metadata, None, None, None)


def _c_launcher(run, compiled):
    """``(launch, fixed)`` calling the C entry point of a Triton 3.6 / 3.7 ``CudaLauncher``, or None
    where it is not in a shape read from those versions' ``backends/nvidia/driver.py``:

    * 3.6: ``run.launch`` is the launcher module's C ``launch``, format ``_BASE_ARGS_FORMAT``
      (grid x/y/z, stream, function, cooperative, pdl, global/profile scratch, kernel metadata,
      launch metadata, enter/exit hooks), then every kernel parameter (constexprs in place);
    * 3.7: ``run.launch`` is the driver's shared C ``launch``: those 13 arguments with the kernel
      metadata after pdl, then ``run.arg_annotations``, ``run.kernel_signature`` and the kernel
      parameters as one sequence;
    * either, for a kernel taking tensor descriptors: ``run.launch`` is Triton's own per-launch
      wrapper (``wrap_handle_tensordesc``'s ``inner``, recognised by its code object), which expands
      each descriptor (``make_tensordesc_arg``: the encoded ``CUtensorMap`` then shape and strides)
      around that C entry; its C entry and descriptor metadata are taken from it, and the
      expansion is done here through a :class:`DescriptorSlot` per descriptor parameter, which
      keeps the expanded arguments of the descriptors it has seen.
    """
    if run.global_scratch_size != 0 or run.profile_scratch_size != 0:
        return None
    module = sys.modules.get(type(run).__module__)
    if module is None:
        return None
    launch = run.launch
    slots = ()
    inner = tritons_descriptor_wrapper(module)
    if inner is not None and getattr(launch, "__code__", None) is inner:
        unwrapped = unwrap_descriptors(launch, module)
        if unwrapped is None:
            return None
        launch, slots = unwrapped
    if getattr(module, "_BASE_ARGS_FORMAT", None) == "iiiKKppOOOOOO" and triton.__version__.startswith("3.6"):
        fixed = (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                 compiled.packed_metadata, None, None, None)
        if not slots:
            return launch, fixed
        return _expanding_launch_36(launch, tuple((13 + i, slot) for i, slot in slots)), fixed
    if (triton.__version__.startswith("3.7") and not hasattr(module, "_BASE_ARGS_FORMAT")
            and hasattr(run, "arg_annotations") and hasattr(run, "kernel_signature")
            and launch is _drivers_launch()):
        head = (compiled.function, run.launch_cooperative_grid, run.launch_pdl, compiled.packed_metadata, None, None,
                None, None, None, run.arg_annotations, run.kernel_signature)
        return _launch_37(launch, head, slots), ()
    return None


def _drivers_launch():
    """Triton 3.7's shared C launch entry point (``driver.active.utils.launch``), or None."""
    try:
        return triton.runtime.driver.active.utils.launch
    except Exception:  # (no driver: nothing launches through it)
        return None



def _expanding_launch_36(c_launch, slots: tuple) -> Callable:
    """Triton 3.6's C ``launch`` with each descriptor argument (at ``slots``' positions of the
    whole argument list) replaced by its expansion."""
    slots = slots[::-1]

    def launch(*args):
        return c_launch(*expand_descriptors(args, slots))

    launch.descriptor_slots = slots  # (tests and tools)
    return launch


def _launch_37(c_launch, head: tuple, slots: tuple) -> Callable:
    """Triton 3.7's C ``launch`` taking ``(gx, gy, gz, stream, *params)``, the descriptor parameters
    (``slots``' positions) expanded."""
    function, coop, pdl, metadata, launch_metadata, enter, exit_, scratch, profile, annotations, signature = head
    if not slots:
        def launch(gx, gy, gz, stream, *args):
            return c_launch(gx, gy, gz, stream, function, coop, pdl, metadata, launch_metadata, enter, exit_,
                            scratch, profile, annotations, signature, args)

        return launch
    slots = slots[::-1]

    def launch_descriptors(gx, gy, gz, stream, *args):
        return c_launch(gx, gy, gz, stream, function, coop, pdl, metadata, launch_metadata, enter, exit_,
                        scratch, profile, annotations, signature, expand_descriptors(args, slots))

    launch_descriptors.descriptor_slots = slots  # (tests and tools)
    return launch_descriptors

