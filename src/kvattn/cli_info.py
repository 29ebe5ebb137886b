"""``kvattn info``: versions, the device, the environment switches, what serves each function and
which version-gated fast paths are on. Registered and dispatched by :mod:`kvattn.cli`."""

from __future__ import annotations

import os
import warnings

import torch

from .runtime import backend as _backend, device as _device, env as _env, versions as _versions
from ._console import FUNCTIONS
from ._version import __version__


def describe_device(device: torch.device) -> str:
    if device.type != "cuda":
        visible = "no CUDA device" if not torch.cuda.is_available() else "a CUDA device is present but not chosen"
        return f"cpu ({visible})"
    p = torch.cuda.get_device_properties(device)
    return (f"{device} ({p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
            f"{p.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda})")


def _debug_meaning() -> str:
    forced = _env.debug_checks()
    if forced is None:
        return "on for CPU tensors, off for CUDA tensors (there the checks would wait for the GPU)"
    return "on (device-value checks; on CUDA tensors they synchronise)" if forced else "off (no device-value checks)"


# (name, what it does now, whether it only acts on compiled GPU launches)
_SWITCHES = (
    ("KVATTN_BACKEND", lambda: _env.backend_override() or "unset: Triton for CUDA tensors, reference for CPU tensors",
     False),
    ("KVATTN_BATCH_INVARIANT", lambda: "on (outputs independent of the batch)" if _env.batch_invariant() else "off",
     False),
    ("KVATTN_DEBUG", _debug_meaning, False),
    ("KVATTN_CALL_CACHE", lambda: "on" if _env.call_cache() else "off (every eager call validated and planned afresh)",
     True),
    ("KVATTN_FAST_LAUNCH", lambda: "on" if _env.fast_launch() else "off", True),
    ("KVATTN_FUSED_MERGE", lambda: "on" if _env.fused_merge() else "off (a second launch merges the splits)", True),
    ("KVATTN_GLUON", lambda: "on" if _versions.gluon_on() else "off (Triton kernels where a Gluon one exists)", True),
    ("KVATTN_GLUON_WS", lambda: "on" if _env.gluon_ws() else "off (MLA's Gluon kernel without warp specialisation)",
     True),
    ("TRITON_INTERPRET", lambda: "on (Triton's interpreter runs the kernels)" if _env.triton_interpret() else "off",
     False),
)

_KERNELS = {
    "batch_decode": "Triton: split-KV paged decode",
    "single_decode": "Triton: split-KV decode over contiguous K/V",
    "mla_decode": "Triton: split-KV latent decode",
    "context": "Triton: causal prefill (pages of 64+ tokens by TMA on Hopper)",
}


def _served_by(op: str, device: torch.device, fast_paths: dict[str, str]) -> str:
    try:
        triton_runs = _backend.use_triton(op, device)
    except RuntimeError as exc:
        return f"error: {exc}"
    if not triton_runs:
        return "reference (plain PyTorch)"
    text = _KERNELS[op]
    if device.type != "cuda":
        return text + ", in Triton's interpreter"
    gluon = _device.is_hopper(device) and _versions.gluon_on() and fast_paths.get("gluon", "").startswith("on")
    if op == "mla_decode" and gluon:
        text += "; Gluon kernel for 16-bit caches with 64+ heads and pages of 64+ tokens"
        if _env.gluon_ws():
            text += (" (warp-specialised; also fewer heads over 16-bit caches, padded to 64 rows, and an fp8 query "
                     "over fp8 caches with 17+ heads, or fewer where a program holds 1024+ keys on an H200)")
    elif op == "context" and gluon:
        text += ("; a warp-specialised Gluon kernel for 16-bit and fp8 caches with pages of 8+ tokens, "
                 "NVFP4 / fp8 caches and pages under 64 tokens staged once a call into the workspace where "
                 "they fit (fp8 / NVFP4 outputs and skip-softmax keep the Triton kernel)")
    return text


def _fast_paths() -> dict[str, str]:
    try:
        from .runtime import versions as _versions
    except ImportError:
        return {}
    fn = getattr(_versions, "fast_paths", None)
    if fn is None:
        return {}
    try:
        return dict(fn())
    except Exception as exc:  # noqa: BLE001 - info reports, it does not fail
        return {"(error)": f"{type(exc).__name__}: {exc}"}


def info(device: torch.device) -> int:
    try:
        import triton

        from .runtime.versions import support

        triton_version = triton.__version__
        if device.type == "cuda":
            triton_line = f"{triton_version} ({support(triton_version)})"
        else:  # (what kvattn verified elsewhere is no fact about this machine)
            triton_line = f"{triton_version} (no GPU here: used only by the interpreter, --interpret / TRITON_INTERPRET=1)"
    except ImportError:
        triton_version = triton_line = "not installed (every function runs the reference)"
    try:
        import numpy

        numpy_version = numpy.__version__
    except ImportError:
        numpy_version = "not installed"
    import platform

    import kvattn

    print(f"kvattn {__version__} ({os.path.dirname(kvattn.__file__)})")
    print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}), "
          f"triton {triton_line}, numpy {numpy_version}")
    print(f"device: {describe_device(device)}")
    print("switches:")
    width = max(len(name) for name, _, _ in _SWITCHES)
    for name, meaning, gpu_only in _SWITCHES:
        raw = os.environ.get(name)
        text = meaning()  # (check_switches has refused bad values)
        if gpu_only and device.type != "cuda":
            text = f"{text} (no effect here: it acts on compiled GPU launches)"
        print(f"  {name:<{width}s} {'unset' if raw is None else repr(raw):<10s} {text}")
    paths = _fast_paths() if device.type == "cuda" else {}
    print(f"functions on {device}:")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for short, public, op in FUNCTIONS:
            print(f"  {public:<51s} {_served_by(op, device, paths)}")
    if device.type != "cuda":
        print(f"fast paths: none apply on {device} (fast launch, PTX hints and the Gluon kernels serve compiled "
              "launches on a GPU)")
        return 0
    print(f"fast paths (Triton {triton_version}):" + ("" if paths else " not reported by this kvattn"))
    for name, state in paths.items():
        print(f"  {name:<12s} {state}")
    return 0
