"""Which Triton is installed and which of kvattn's version-specific paths it gets.

kvattn supports the Triton that each supported torch pins: 3.6 (torch 2.11) and 3.7 (3.7.1, torch
2.13), verified on an H100 with both; the CPU interpreter tier also runs the newest release (3.9.0),
where only the interpreter and sm_90a compiles are tested. Some paths rest on facts of one Triton
version and are gated on it, each with a portable fallback that computes the same result (under
3.9 all three are off):

* ``fast_launch``: launch compiled kernels without ``JITFunction.run`` (host time of eager
  calls), from the specialisation and launcher rules of Triton 3.6 and 3.7; elsewhere every launch is a plain
  ``kernel[grid](...)``.
* ``ptx_hints``: an L2 evict-first policy on the TMA copies of marked kernels, through Triton's
  stages hook (3.6 and 3.7 protocols); elsewhere those copies run unhinted.
* ``gluon``: kernels written in Gluon (MLA decode and paged prefill on Hopper), through the names
  of :mod:`kvattn.ops.common.gluon_compat` (found by feature: 3.6's, 3.7's and 3.9's spellings);
  on by default with the GPU-verified releases only; elsewhere (or where Gluon does not import) the
  Triton kernels serve, unless ``KVATTN_GLUON=1``.

:func:`fast_paths` says which are active (``kvattn info`` prints it).
"""

from __future__ import annotations

import re

# Versions verified on the GPU; pyproject's range covers these and the interpreter tier's newest
# (INTERPRETER_TESTED: the CPU suite only, no GPU run).
GPU_VERIFIED = ("3.6", "3.7")
INTERPRETER_TESTED = ("3.9",)


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


def support(version: str | None = None) -> str:
    """How far kvattn is tested with Triton ``version`` (default: the installed one)."""
    version = triton_version() if version is None else version
    if version == "not installed":
        return "not installed"
    if version.startswith(GPU_VERIFIED):
        return "verified on the GPU"
    if version.startswith(INTERPRETER_TESTED):
        return "tested in the CPU interpreter only, not on a GPU"
    return "untested"


def gluon_verified(version: str | None = None) -> bool:
    """Whether kvattn's Gluon kernels were verified on a GPU with Triton ``version`` (default: the
    installed one): their default (``KVATTN_GLUON`` unset) is on only then."""
    version = triton_version() if version is None else version
    return version.startswith(GPU_VERIFIED)


def gluon_on() -> bool:
    """Whether launches may take a Gluon kernel where one exists: ``KVATTN_GLUON`` when set, else
    on with the GPU-verified Tritons only (Gluon's API and code generation move between releases)."""
    from . import env as _env

    flag = _env.gluon()
    return gluon_verified() if flag is None else flag


def fast_paths() -> dict[str, str]:
    """``{path: "on (...)" | "off (...)"}`` for each version-gated path of the installed Triton."""
    version = triton_version()
    if version == "not installed":
        return {name: "off (no Triton: the reference backend serves every call)"
                for name in ("fast_launch", "ptx_hints", "gluon")}
    from . import fast_launch, ptx_hints

    out = {}
    out["fast_launch"] = (f"on (Triton {version}: compiled launchers called directly)" if fast_launch.TRITON_SUPPORTED
                          else f"off (verified on Triton 3.6 / 3.7; {version} launches through kernel[grid])")
    out["ptx_hints"] = ("on (stages hook set only around kvattn's marked launches)" if ptx_hints.HOOK_SUPPORTED
                        else f"off (hook protocol verified on Triton 3.6 / 3.7; {version} copies run unhinted)")
    try:
        from ..ops.common import gluon_compat  # noqa: F401
    except ImportError as exc:
        out["gluon"] = f"off (Gluon unavailable: {exc})"
    else:
        if gluon_on():
            out["gluon"] = (f"on (Gluon kernels on Hopper; Triton {version})" if gluon_verified(version)
                            else f"on (KVATTN_GLUON=1; Triton {version} is not GPU-verified for them)")
        elif gluon_verified(version):
            out["gluon"] = "off (KVATTN_GLUON=0: the Triton kernels serve)"
        else:
            out["gluon"] = (f"off (Gluon kernels verified on Triton 3.6 / 3.7; {version} runs the Triton kernels; "
                            "KVATTN_GLUON=1 forces them)")
    return out
