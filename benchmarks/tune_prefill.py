"""Tune the prefill kernel: time launch-config variants on the prefill benchmark shapes.

A variant is ``BLOCK_M x BLOCK_N x warps x stages`` (``128x64w8s3``) and replaces the sm90 table's
entry of the shape's operand kind and head_dim for every call; ``tma128x64w4s3`` replaces the TMA
table's entry (16-bit and fp8 caches whose pages TMA can read), ``gather`` removes it (the
pointer-gather kernel); shapes and inputs come from the benchmark registry. Times are medians of CUDA-graph replays (``do_bench``, L2 flushed); the winners
go into ``src/kvattn/ops/prefill_configs.py``.

Usage (on the device, from the repository root)::

    PYTHONPATH=src python benchmarks/tune_prefill.py --filter "1x8192x8192" --variants default,128x128w8s3,128x64w8s3
"""

from __future__ import annotations

import contextlib
import dataclasses
import re

if __package__ in (None, ""):  # run as a script
    import _paths  # noqa: F401

from benchmarks import shapes, tuning  # noqa: E402

_VARIANT = re.compile(r"(tma)?(\d+)x(\d+)w(\d+)s(\d+)")


@contextlib.contextmanager
def _forced(key: tuple, name: str):
    from kvattn.ops.prefill import configs as prefill_configs
    from kvattn.ops.prefill import plan as prefill_plan

    table, tma = prefill_configs.TABLES["sm90"], prefill_configs.TMA_TABLES["sm90"]
    old, old_tma = table[key], tma.get(key)
    if name == "gather":
        tma.pop(key, None)
    elif name != "default":
        match = _VARIANT.fullmatch(name)
        cfg = prefill_configs.PrefillConfig(*map(int, match.groups()[1:]))
        if match.group(1):
            tma[key] = cfg
        else:
            tma.pop(key, None)  # a gather tile: the gather kernel
            table[key] = cfg
    plans = prefill_plan._PLANS  # plans hold the tables' entries as they were made: none outlives the variant
    plans.clear()
    try:
        yield
    finally:
        plans.clear()
        table[key] = old
        if old_tma is None:
            tma.pop(key, None)
        else:
            tma[key] = old_tma


def _table_key(shape) -> tuple:
    """The sm90 table entry a shape's calls use: (operand kind, head_dim)."""
    from kvattn._formats_table import BY_NAME

    if shape.q_dtype == "fp8" and shape.kv_dtype == "fp8":
        kind = "fp8qk"
    else:
        kind = BY_NAME[shape.kv_dtype].config_key
    return kind, shape.head_dim


def _grid(head_dim: int | None) -> list:
    """The prefill shapes, at ``head_dim`` if given (D256 with 16 query heads and 4 KV heads, as the
    recorded tuning ran it, lab/notes/prefill.md, Prefill: the same bytes a token as D128)."""
    grid = shapes._prefill_grid()
    if head_dim is None:
        return grid
    heads = {256: (16, 4)}.get(head_dim, (32, 8))
    return [dataclasses.replace(s, head_dim=head_dim, num_qo_heads=heads[0], num_kv_heads=heads[1]) for s in grid]


def main(argv=None) -> int:
    args = tuning.parse_args(__doc__, argv, extra=lambda ap: ap.add_argument(
        "--head-dim", type=int, default=None, help="run the shapes at this head_dim (64, 128 or 256)"))
    tuning.time_variants(_grid(args.head_dim), args,
                         lambda shape, name: lambda: _forced(_table_key(shape), name), workspace_mib=128)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
