"""The MLA query staged by ``cp.async`` against its staging through registers, and the epilogue's
stores off (GPU; kvattn only, CUDA-graph replay, L2 flushed, as ``benchmarks/tune_mla.py`` times).

Variants (``benchmarks/tune_mla.py``): ``default`` (the library: one ``cp.async`` group),
``ws_syncquery`` (the staging before: a load then a store a 64-column piece), ``ws_nostore`` (a
floor: no output written). Shapes: the one-wave batches of ``mla_program_cost.py`` at 2 and 16
tiles (the per-program cost), then the registry's MLA rows and the sweep's MLA rows (default
against ws_syncquery only).

    PYTHONPATH=src python3 lab/probes/mla_query_staging.py [--rep 60]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
from benchmarks import tune_mla  # noqa: E402
from benchmarks.shapes import Shape  # noqa: E402

LAYOUTS = ((16, 132), (64, 132), (128, 66))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rep", default="60")
    ap.add_argument("--tiles", type=int, nargs="+", default=[2, 16])
    args = ap.parse_args()
    cost = [Shape("mla", batch, tiles * 64, num_qo_heads=heads, num_kv_heads=1, head_dim=576, page_size=64,
                  kv_dtype="bfloat16", q_dtype="bfloat16") for heads, batch in LAYOUTS for tiles in args.tiles]
    print("== one-wave batches (program cost)", flush=True)
    tune_mla.main(["--variants", "default,ws_syncquery,ws_nostore", "--rep", args.rep], grid=cost)
    print("== MLA grid", flush=True)
    tune_mla.main(["--variants", "default,ws_syncquery", "--rep", args.rep])
    print("== sweep MLA rows", flush=True)
    tune_mla.main(["--sweep", "--variants", "default,ws_syncquery", "--rep", args.rep])


if __name__ == "__main__":
    main()
