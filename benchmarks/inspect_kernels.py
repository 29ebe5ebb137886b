"""What Triton built for the decode kernels: registers, spills, shared memory, and counts of
chosen PTX / SASS patterns, per compiled specialisation.

Runs one decode call per shape (and config variant, see ``tune_decode.VARIANTS``), then walks
the kernels' compile caches. Usage (on the device, from the repository root)::

    PYTHONPATH=src python benchmarks/inspect_kernels.py --variants default,stream128 \
        --ptx "evict_first" --ptx "cp.async" --sass "LDS.U8"
"""

from __future__ import annotations

import argparse
import re

if __package__ in (None, ""):  # run as a script
    import _paths  # noqa: F401

import torch  # noqa: E402

from benchmarks import problems  # noqa: E402
from benchmarks.tune_decode import SHAPES, VARIANTS  # noqa: E402

_INTERESTING = ("BLOCK_N", "KV_FORMAT", "ROPE", "USE_DOT", "GROUP", "PAGE_SIZE")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="default")
    ap.add_argument("--filter", action="append", default=[])
    ap.add_argument("--ptx", action="append", default=[], help="regex counted in the PTX")
    ap.add_argument("--sass", action="append", default=[], help="regex counted in the SASS")
    args = ap.parse_args(argv)

    from kvattn.ops.decode import configs as decode_configs
    from kvattn.ops.decode.kernels import SPLIT_TUPLES, decode_split_kernel

    device = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    for shape in SHAPES:
        if args.filter and not any(f in shape.id for f in args.filter):
            continue
        prob = problems.build(shape, device, l2_bytes=l2, workspace_mib=128)
        for name in args.variants.split(","):
            with decode_configs.override(**VARIANTS[name]):
                prob.sets[0].kvattn()
        torch.cuda.synchronize()
        del prob
    for dev_cache in decode_split_kernel.device_caches.values():
        for kernel in dev_cache[0].values():
            if hasattr(kernel, "result"):
                kernel = kernel.result()
            named = {}
            for key, val in getattr(kernel.src, "constants", {}).items():
                index = key[0] if isinstance(key, tuple) else key
                pname = decode_split_kernel.arg_names[index] if isinstance(index, int) else str(index)
                members = SPLIT_TUPLES.get(pname) if isinstance(val, tuple) else None
                if members is not None:  # a constexpr tuple: its members by their names
                    named.update((m, v) for m, v in zip(members, val) if m in _INTERESTING)
                elif pname in _INTERESTING:
                    named[pname] = val
            md = kernel.metadata
            line = (f"regs {kernel.n_regs:3d} spills {kernel.n_spills:3d} smem {md.shared:6d} "
                    f"warps {md.num_warps} stages {md.num_stages} {named}")
            for pat in args.ptx:
                line += f" | ptx {pat!r}: {len(re.findall(pat, kernel.asm['ptx']))}"
            if args.sass:
                sass = kernel.asm["sass"]  # disassembled on first access
                for pat in args.sass:
                    line += f" | sass {pat!r}: {len(re.findall(pat, sass))}"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
