"""The MLA program's ends A/B: the query staged by ``cp.async`` against its staging through
registers, the output rows through shared memory against straight from the accumulator, and the
epilogue's stores off (GPU; kvattn only, CUDA-graph replay, L2 flushed, as
``benchmarks/tune_mla.py`` times).

Variants (``benchmarks/tune_mla.py``): ``default`` (the library), ``ws_nostore`` (a floor: no
output written), and the ``before`` form of a change under test where its patch adds one
(``ws_syncstore``: lab/probes/mla_final_rows_staged.patch). The query-staging A/B this probe first
ran used ``ws_syncquery``, the staging through registers, removed once measured (at 9ad49b8;
lab/notes/mla-program-ends.md). Shapes: the one-wave batches of
``mla_program_cost.py`` at 2 and 16 tiles (the per-program cost; ``--cost``), then the registry's
and the sweep's MLA rows (``--rows``).

    PYTHONPATH=src python3 lab/probes/mla_query_staging.py [--rep 60] [--cost V,..] [--rows V,..]
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
    ap.add_argument("--cost", default="default,ws_nostore")
    ap.add_argument("--rows", default="default,ws_nostore")
    args = ap.parse_args()
    cost = [Shape("mla", batch, tiles * 64, num_qo_heads=heads, num_kv_heads=1, head_dim=576, page_size=64,
                  kv_dtype="bfloat16", q_dtype="bfloat16") for heads, batch in LAYOUTS for tiles in args.tiles]
    print("== one-wave batches (program cost)", flush=True)
    tune_mla.main(["--variants", args.cost, "--rep", args.rep], grid=cost)
    print("== MLA grid", flush=True)
    tune_mla.main(["--variants", args.rows, "--rep", args.rep])
    print("== sweep MLA rows", flush=True)
    tune_mla.main(["--sweep", "--variants", args.rows, "--rep", args.rep])


if __name__ == "__main__":
    main()
