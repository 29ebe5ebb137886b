"""The workspace a launch's split-KV partials and in-kernel merge counters live in (decode and MLA).

None of these waits for the device; they allocate only where a call brings no workspace (or, in a
CUDA-graph capture, once a device's chunk of zeroed counters is used up).
"""

from __future__ import annotations

import torch

from .._inputs import cached_aliases

ALIGN = 16  # bytes: the workspace's views start on its first 16-byte boundary
# From there, the workspace's first COUNTER_BYTES are the int32 arrival counters of the decode
# kernels' in-kernel merge (zero at rest: the workspace is zeroed before first use and every
# launch leaves its counters at zero); the split partials follow them. Launches of more items than
# MAX_COUNTERS merge in a second launch instead.
COUNTER_BYTES = 16384
MAX_COUNTERS = COUNTER_BYTES // 4


def scratch_start(workspace: torch.Tensor) -> int:
    """Byte offset in ``workspace`` of the scratch past the counters (split partials, staged pages)."""
    return (-workspace.data_ptr()) % ALIGN + COUNTER_BYTES


def _partials_views(workspace: torch.Tensor, numel_o: int, numel_lse: int):
    start = scratch_start(workspace)
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


# Partials of launches without a workspace (single decode), kept per (device, stream) like the
# counters above (calls on one stream run in order, so they may share them), grown when a call needs
# more. Recorded calls (kvattn.runtime.callcache) hold their address: growing one forgets every recording.
_STREAM_PARTIALS: dict[tuple, torch.Tensor] = {}
KEPT_CHANGED: list = []  # called when a kept buffer is replaced (kvattn.runtime.callcache forgets its recordings)


def split_partials(needed: bool, workspace, numel_o: int, numel_lse: int, out: torch.Tensor):
    """Float32 ``(part_o [numel_o], part_lse [numel_lse])`` for a launch's split-KV partials: views
    of ``workspace``, or without one of the buffer kept for the current stream (allocated inside
    a CUDA-graph capture: the graph's own). Not ``needed`` (one split: the kernels write no
    partial): ``out`` stands in for both, never written through them."""
    if not needed:
        return out, out
    if workspace is not None:
        return partials_from_workspace(workspace, numel_o, numel_lse)
    device = out.device
    total = numel_o + numel_lse
    if capturing(device):
        return (torch.empty(numel_o, dtype=torch.float32, device=device),
                torch.empty(numel_lse, dtype=torch.float32, device=device))
    stream = torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else 0
    kept = _STREAM_PARTIALS.get((device, stream))
    if kept is None or kept.numel() < total:
        kept = _STREAM_PARTIALS[device, stream] = torch.empty(max(total, 2 * kept.numel() if kept is not None else 0),
                                                              dtype=torch.float32, device=device)
        for changed in KEPT_CHANGED:
            changed()
    return kept[:numel_o], kept[numel_o:total]


def kept_buffers() -> list[torch.Tensor]:
    """The buffers kept per stream (counters and partials of launches without a workspace)."""
    return [*_STREAM_COUNTERS.values(), *_STREAM_PARTIALS.values()]


def partials_fit(ws_numel: int | None, per_split: int, default: int) -> int:
    """How many splits' partials (``per_split`` float32 values each) a workspace of ``ws_numel``
    bytes holds after its counters; ``default`` without a workspace (the partials are then
    allocated)."""
    if ws_numel is None:
        return default
    return max(0, ws_numel - ALIGN - COUNTER_BYTES) // (4 * per_split)
