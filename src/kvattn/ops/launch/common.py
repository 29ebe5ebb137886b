"""Host-side pieces the decode, MLA and prefill launchers share.

None of them waits for the device or allocates (but the copy of a non-contiguous lengths tensor),
so launches stay capturable in CUDA graphs.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

from ... import _device
from ..._formats_table import BY_DTYPE, BY_NAME
from ..._inputs import cached_aliases

_CURRENT_DEVICE = contextlib.nullcontext()  # (reusable: it holds no state)
MAX_PLANS = 1024  # distinct call shapes a launcher keeps plans for; past this its cache starts over
ALIGN = 16  # bytes: the workspace's views start on its first 16-byte boundary
# From there, the workspace's first COUNTER_BYTES are the int32 arrival counters of the decode
# kernels' in-kernel merge (zero at rest: the workspace is zeroed before first use and every
# launch leaves its counters at zero); the split partials follow them. Launches of more items than
# MAX_COUNTERS merge in a second launch instead.
COUNTER_BYTES = 16384
MAX_COUNTERS = COUNTER_BYTES // 4


def arch(device: torch.device, interpreter: bool) -> str:
    """Which config table a launch reads: ``"interpreter"``, ``"sm90"`` (Hopper) or ``"default"``."""
    if interpreter:
        return "interpreter"
    return "sm90" if _device.is_hopper(device) else "default"


def words_allowed(device: torch.device, interpreter: bool, aligned: bool) -> bool:
    """Whether a launch may read a words format (``kv_format_code``'s ``words_ok``): compiled
    kernels (the interpreter cannot run their inline PTX), base pointers 4-byte aligned
    (``aligned``), and a GPU that converts fp8 pairs in one instruction (sm_89+)."""
    return aligned and not interpreter and _device.has_fp8_convert(device)


def words_aligned(k: torch.Tensor, v: torch.Tensor, k_sf, v_sf) -> bool:
    """Whether the cache has a words format (the format table's ``words_code``) and the base
    pointers of what it reads are 4-byte aligned: K and V, and a block-scaled format's scales
    (``words_allowed``'s ``aligned``)."""
    fmt = BY_DTYPE.get(k.dtype)
    if fmt is None or fmt.words_code is None:
        return False
    scales = ()
    if fmt.scale_block:
        if k_sf is None or v_sf is None:
            return False
        scales = (k_sf, v_sf)
    return all(t.data_ptr() % 4 == 0 for t in (k, v, *scales))


def kv_format_code(kv_format: str, words_ok: bool, strides: tuple, head_dim: int, sf_strides: tuple = ()) -> int:
    """The kernels' KV_FORMAT for a launch over a ``kv_format`` cache: its words code where
    ``words_ok`` (:func:`words_allowed`) and every word load is aligned (``KVFormat.code``),
    otherwise element by element. (A function of this module so that tools and tests can
    intercept the choice.)"""
    return BY_NAME[kv_format].code(words_ok, strides, head_dim, sf_strides)


def entry(op, impl):
    """``op`` (a ``torch.library.custom_op``) while ``torch.compile`` traces, which needs the
    registered op; else the plain ``impl`` it wraps. Eager calls skip the dispatcher: a mutating
    custom op costs tens of microseconds of Python per call (argument defaults, autograd and
    in-place bookkeeping), more than a whole decode kernel at small batch. Both run the same
    launcher."""
    return op if torch.compiler.is_compiling() else impl


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2`` for ``n >= 1`` (that one is a constexpr_function: microseconds
    of host time a call in Triton 3.6)."""
    return 1 << (n - 1).bit_length()


def _partials_views(workspace: torch.Tensor, numel_o: int, numel_lse: int):
    start = (-workspace.data_ptr()) % ALIGN + COUNTER_BYTES
    ws = workspace[start : start + 4 * (numel_o + numel_lse)].view(torch.float32)
    return ws[:numel_o], ws[numel_o:]


def partials_from_workspace(workspace: torch.Tensor, numel_o: int, numel_lse: int):
    """Float32 ``(part_o [numel_o], part_lse [numel_lse])`` of split-KV partials in ``workspace``,
    after its counters; kept per workspace tensor (three views cost microseconds a call)."""
    return cached_aliases(workspace, ("partials",), _partials_views, numel_o, numel_lse)


def _counters_view(workspace: torch.Tensor) -> torch.Tensor:
    start = (-workspace.data_ptr()) % ALIGN
    return workspace[start : start + COUNTER_BYTES].view(torch.int32)


# Counters of launches without a workspace (single decode), zeroed once and left at zero by every
# launch: one set per (device, stream) for eager calls, so calls on one stream (which run in
# order) share them and concurrent streams do not; and for calls captured in a CUDA graph, a slice
# of a zeroed chunk of their own (graphs may replay concurrently), cut from a chunk made by an
# eager call. A capture with no chunk left zeroes fresh counters inside the graph (a memset node).
_STREAM_COUNTERS: dict[tuple, torch.Tensor] = {}
_CAPTURE_CHUNKS: dict[torch.device, list] = {}  # device -> [zeroed int32 chunk, next free index]
CAPTURE_CHUNK = 1 << 16  # counters a device keeps for captured calls


def capturing(device: torch.device) -> bool:
    """Whether the current stream of ``device`` is capturing a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def launch_counters(workspace, device: torch.device, count: int) -> torch.Tensor:
    """``count`` (<= MAX_COUNTERS) int32 counters at zero for a launch's in-kernel merge: the
    workspace's, or (without one) kept per stream as described above. Allocates only the first
    time a device or stream is seen, or in a CUDA-graph capture once the chunk is used up."""
    if workspace is not None:
        return cached_aliases(workspace, ("counters",), _counters_view)
    if capturing(device):
        chunk = _CAPTURE_CHUNKS.get(device)
        count = -(-count // 32) * 32
        if chunk is None or chunk[1] + count > chunk[0].numel():
            return torch.zeros(count, dtype=torch.int32, device=device)
        start = chunk[1]
        chunk[1] += count
        return chunk[0][start : start + count]
    stream = torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else 0
    counters = _STREAM_COUNTERS.get((device, stream))
    if counters is None:
        counters = _STREAM_COUNTERS[device, stream] = torch.zeros(MAX_COUNTERS, dtype=torch.int32, device=device)
        if device.type == "cuda" and device not in _CAPTURE_CHUNKS:
            _CAPTURE_CHUNKS[device] = [torch.zeros(CAPTURE_CHUNK, dtype=torch.int32, device=device), 0]
    return counters


def split_partials(needed: bool, workspace, numel_o: int, numel_lse: int, out: torch.Tensor):
    """Float32 ``(part_o [numel_o], part_lse [numel_lse])`` for a launch's split-KV partials: views
    of ``workspace``, or allocated on ``out``'s device when the call has none. Not ``needed`` (one
    split: the kernels write no partial): ``out`` stands in for both, never written through them."""
    if not needed:
        return out, out
    if workspace is not None:
        return partials_from_workspace(workspace, numel_o, numel_lse)
    return (torch.empty(numel_o, dtype=torch.float32, device=out.device),
            torch.empty(numel_lse, dtype=torch.float32, device=out.device))


def partials_fit(ws_numel: int | None, per_split: int, default: int) -> int:
    """How many splits' partials (``per_split`` float32 values each) a workspace of ``ws_numel``
    bytes holds after its counters; ``default`` without a workspace (the partials are then
    allocated)."""
    if ws_numel is None:
        return default
    return max(0, ws_numel - ALIGN - COUNTER_BYTES) // (4 * per_split)


def device_guard(device: int):
    """The tensors' GPU made current for the launch (Triton launches on the current device, and a
    multi-GPU caller's tensors may live on another one); ``device`` is ``tensor.get_device()``
    (-1 on the CPU: nothing to switch)."""
    if device >= 0 and device != torch.cuda.current_device():
        return torch.cuda.device(device)
    return _CURRENT_DEVICE


def int32_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """``[B]`` lengths as the kernels read them: contiguous (length b at ``ptr + b``) int32 (uint32
    lengths below 2^31 have the same bits)."""
    if not lengths.is_contiguous():
        lengths = lengths.contiguous()
    if lengths.dtype == torch.uint32:
        lengths = lengths.view(torch.int32)
    return lengths


def cached_plan(plans: dict, facts: tuple, build: Callable[[tuple], object], overridden: bool):
    """``plans[facts]``, built by ``build(facts)`` on a miss; plans made while a tuning override
    is active (``overridden``) are not kept, since they depend on more than the facts."""
    if overridden:
        return build(facts)
    plan = plans.get(facts)
    if plan is None:
        if len(plans) >= MAX_PLANS:
            plans.clear()
        plan = plans[facts] = build(facts)
    return plan


def config_override(state: dict, cache_clear: Callable[[], None]):
    """A ``with``-block override of a config table's fields: ``override(**fields)`` updates
    ``state`` (the family's module-level override dict) for the block, clearing the family's
    config cache on entry and exit."""

    @contextlib.contextmanager
    def override(**fields) -> Iterator[None]:
        old = dict(state)
        state.update(fields)
        cache_clear()
        try:
            yield
        finally:
            state.clear()
            state.update(old)
            cache_clear()

    return override
