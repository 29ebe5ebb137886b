r"""Run one decode benchmark shape a few times, for Nsight Compute to profile its kernels.

Builds the shape's inputs once (``problems.build``), then calls one implementation on them:
kvattn, or one of FlashInfer's kernels of the shape (``--impl fi:NAME``, NAME a variant of
``peers_flashinfer.variants``: ``fi-fa2-tc``, ``fi-fa2``, ``fi-xqa``, ...; the ``fi-`` may be left
out). ``--warmup`` calls first (compiles, module loads, FlashInfer's plan), then ``--calls`` calls
inside the NVTX push/pop range :data:`NVTX_RANGE`, then a synchronise; exit status 0.

The shape is any decode, speculative-decode or single-decode id of the benchmark registry,
exactly: the grid's and the sweep's rows (selected as ``benchmarks/run.py`` selects them) and
``tune_decode.SHAPES``. ``--list`` prints these ids, ``SHAPE --list-impls`` the implementations
the shape has (no GPU needed for either).

Usage (on the device, from the repository root)::

    # the profiled calls' kernels only (the warm-up calls are outside the range), L2 flushed
    # before each profiled kernel (ncu's default --cache-control all):
    PYTHONPATH=src ncu --nvtx --nvtx-include "ncu_profile/" --section SpeedOfLight \
        python benchmarks/ncu_decode.py "decode bf16 64x8192 p64 HND"
    # one launch by name and count (2 warm-up calls + 2 calls: the 3rd split launch):
    ncu --kernel-name regex:decode_split --launch-skip 2 --launch-count 1 --section SpeedOfLight \
        python benchmarks/ncu_decode.py "decode fp8 64x8192 p16 NHD"
    # FlashInfer's tensor-core decode on the same inputs (FlashInfer staged in .peers):
    source .peers/flashinfer/activate.sh && PYTHONPATH=src:$PYTHONPATH ncu --nvtx \
        --nvtx-include "ncu_profile/" python benchmarks/ncu_decode.py "decode bf16 64x8192 p64 HND" \
        --impl fi:fi-fa2-tc
    python benchmarks/ncu_decode.py --list-impls "decode bf16 64x8192 p64 HND"

``lab/probes/ncu_decode_compare.py`` runs ncu this way over several shapes and implementations.
FlashInfer is imported only for an ``fi:`` implementation.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

if __package__ in (None, ""):  # run as a script
    import _paths  # noqa: F401

import torch  # noqa: E402

from benchmarks.shapes import Shape  # noqa: E402

NVTX_RANGE = "ncu_profile"
DECODE_SUITES = ("decode", "spec_decode", "single_decode")
WORKSPACE_MIB = 128


def registry() -> list[Shape]:
    """The decode shapes an id may name: the grid's and the sweep's (as ``benchmarks/run.py``
    selects them: ``shapes.select`` on the grid, ``sweep.select`` on the sweep), then
    ``tune_decode.SHAPES`` not already among them; each id once."""
    from benchmarks import shapes, sweep
    from benchmarks.tune_decode import SHAPES

    grid = shapes.select(shapes.GRID, suites=list(DECODE_SUITES))
    rows = [s for s in sweep.select(sweep.SWEEP) if s.suite in DECODE_SUITES]
    out: dict[str, Shape] = {}
    for s in [*grid, *rows, *(s for s in SHAPES if s.suite in DECODE_SUITES)]:
        out.setdefault(s.id, s)  # the grid's definition first (tune_decode repeats some ids)
    return list(out.values())


def find_shape(shape_id: str) -> Shape:
    """The registry's shape of exactly this id; ``SystemExit`` naming near ids otherwise."""
    shapes = registry()
    for s in shapes:
        if s.id == shape_id:
            return s
    near = [s.id for s in shapes if shape_id.lower() in s.id.lower()][:20]
    hint = ("; ids containing it:\n  " + "\n  ".join(near)) if near else " (--list prints every id)"
    raise SystemExit(f"ncu_decode: no decode shape {shape_id!r} in the registry{hint}")


def impls(shape: Shape) -> list[str]:
    """``--impl`` values for this shape: ``kvattn``, then ``fi:NAME`` per FlashInfer kernel that
    ``peers_flashinfer.variants`` yields for it (its list needs no FlashInfer import)."""
    from benchmarks import peers_flashinfer

    return ["kvattn"] + [f"fi:{name}" for name, _ in peers_flashinfer.kernels(shape)[0]]


def parse_impl(text: str, shape: Shape) -> str | None:
    """``None`` for kvattn, else the FlashInfer variant name (``fi:xqa`` and ``fi:fi-xqa`` alike)."""
    if text == "kvattn":
        return None
    if not text.startswith("fi:"):
        raise SystemExit(f"ncu_decode: --impl is kvattn or fi:NAME, got {text!r}")
    name = text[3:] if text[3:].startswith("fi-") else "fi-" + text[3:]
    have = impls(shape)
    if f"fi:{name}" not in have:
        raise SystemExit(f"ncu_decode: {text!r} is not an implementation of {shape.id!r}; it has: {', '.join(have)}")
    return name


def call_of(shape: Shape, fi_name: str | None) -> Callable[[], object]:
    """The call to profile on input set 0 of a freshly built problem (FlashInfer's plan made)."""
    from benchmarks import problems

    device = torch.device("cuda")
    prob = problems.build(shape, device, l2_bytes=torch.cuda.get_device_properties(device).L2_cache_size,
                          workspace_mib=WORKSPACE_MIB)
    if fi_name is None:
        return prob.sets[0].kvattn
    from benchmarks import peers_flashinfer

    build = dict(peers_flashinfer.variants(prob))[fi_name]
    return build().fns[0]  # imports flashinfer; NotAvailable when it is missing or refuses the shape


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shape", nargs="?", help="a decode shape id of the registry (exact)")
    p.add_argument("--impl", default="kvattn", help="kvattn (default) or fi:NAME (--list-impls)")
    p.add_argument("--warmup", type=int, default=2, help="calls before the NVTX range (default 2)")
    p.add_argument("--calls", type=int, default=2, help="calls inside the NVTX range (default 2)")
    p.add_argument("--list", action="store_true", help="print the registry's decode shape ids and exit")
    p.add_argument("--list-impls", action="store_true", help="print the shape's --impl values and exit")
    args = p.parse_args(argv)
    if args.list:
        print("\n".join(s.id for s in registry()))
        return 0
    if not args.shape:
        p.error("a shape id is needed (--list prints them)")
    shape = find_shape(args.shape)
    if args.list_impls:
        print("\n".join(impls(shape)))
        return 0
    if args.warmup < 0 or args.calls < 1:
        p.error("--warmup must be >= 0 and --calls >= 1")
    fi_name = parse_impl(args.impl, shape)
    try:
        fn = call_of(shape, fi_name)
    except Exception as exc:  # noqa: BLE001 - NotAvailable or a refusal: the caller records the reason
        print(f"ncu_decode: {args.impl} not available on {shape.id}: {type(exc).__name__}: {exc}"[:800],
              file=sys.stderr)
        return 2
    for _ in range(args.warmup):
        fn()
    torch.cuda.synchronize()
    # ncu --nvtx-include "ncu_profile/" profiles only what this range launches: no compile, plan
    # or warm-up kernel, and no input-filling kernel of problems.build.
    torch.cuda.nvtx.range_push(NVTX_RANGE)
    for _ in range(args.calls):
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(f"ncu_decode: {args.impl} on {shape.id}: {args.warmup} warm-up calls, {args.calls} in NVTX range "
          f"{NVTX_RANGE!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
