"""The results document both benchmark commands write: ``env`` (this machine and the versions),
``method`` or ``ceilings`` (how the numbers were taken), ``records`` (one per problem and
implementation, with ``status`` ``ok`` / ``not available`` / ``error`` / ``skipped`` and the times
``eager_us``, ``graph_us`` and ``us``, the headline). Written as indented JSON, atomically."""

from __future__ import annotations

import datetime
import platform

import torch

from .._console import write_json
from .._version import __version__

__all__ = ["environment", "headline_us", "write_json"]


def environment(device: torch.device) -> dict:
    """Date (UTC), device, versions (torch, Triton, CUDA, Python, kvattn) and, on a GPU, its SM
    count, L2 size and memory."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "triton": triton_version, "kvattn": __version__,
        "python": platform.python_version(), "cuda": torch.version.cuda,
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(sm_count=p.multi_processor_count, l2_bytes=getattr(p, "L2_cache_size", None),
                   memory_bytes=p.total_memory)
    return env


def headline_us(rec: dict) -> float | None:
    """The time a record is judged by: the CUDA-graph replay's where there is one, else the eager
    call's (on a CPU, or when the capture failed)."""
    return rec.get("graph_us") or rec.get("eager_us")
