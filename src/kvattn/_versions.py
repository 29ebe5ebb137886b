"""Which Triton is installed and which of kvattn's version-specific paths it gets.

kvattn supports the Triton that each supported torch pins: 3.6 (torch 2.11) and 3.7 (3.7.1, torch
2.13), verified on an H100 with both; the CPU interpreter tier also runs the newest release. Some
paths rest on facts of one Triton version and are gated on it, each with a portable fallback that
computes the same result:

* ``fast_launch``: launch compiled kernels without ``JITFunction.run`` (host time of eager
  calls), from the specialisation and launcher rules of Triton 3.6 and 3.7; elsewhere every launch is a plain
  ``kernel[grid](...)``.
* ``ptx_hints``: an L2 evict-first policy on the TMA copies of marked kernels, through Triton's
  stages hook (3.6 and 3.7 protocols); elsewhere those copies run unhinted.
* ``gluon``: kernels written in Gluon (MLA decode on Hopper), through the names of
  :mod:`kvattn.ops.common.gluon_compat`; where Gluon does not import, the Triton kernels serve.

:func:`fast_paths` says which are active (``kvattn info`` prints it).
"""

from __future__ import annotations

import re

# Versions verified on the GPU, and the interpreter tier's newest; pyproject's range covers these.
GPU_VERIFIED = ("3.6", "3.7")


def parse(version: str) -> tuple[int, int, int]:
    """``"3.7.1"`` -> ``(3, 7, 1)``; pre-release and local tails are dropped."""
    nums = [int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3]]
    return tuple(nums + [0] * (3 - len(nums)))  # type: ignore[return-value]


def triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "not installed"
    return triton.__version__


def fast_paths() -> dict[str, str]:
    """``{path: "on (...)" | "off (...)"}`` for each version-gated path of the installed Triton."""
    version = triton_version()
    if version == "not installed":
        return {name: "off (no Triton: the reference backend serves every call)"
                for name in ("fast_launch", "ptx_hints", "gluon")}
    from .ops.launch import fast_launch, ptx_hints

    out = {}
    out["fast_launch"] = (f"on (Triton {version}: compiled launchers called directly)" if fast_launch.TRITON_SUPPORTED
                          else f"off (verified on Triton 3.6 / 3.7; {version} launches through kernel[grid])")
    out["ptx_hints"] = ("on (stages hook set only around kvattn's marked launches)" if ptx_hints.HOOK_SUPPORTED
                        else f"off (hook protocol verified on Triton 3.6 / 3.7; {version} copies run unhinted)")
    try:
        from .ops.common import gluon_compat  # noqa: F401
        out["gluon"] = f"on (Gluon kernels on Hopper; Triton {version})"
    except ImportError as exc:
        out["gluon"] = f"off (Gluon unavailable: {exc})"
    return out
